"""Calibration by measurement: microbenchmarks on the local JAX devices, fitted into a Machine.

``pcgopt calibrate --measure --out machine.json`` (or :func:`measure_machine`) times, on every
local device at once (so that devices sharing a host share it while they are measured, as they
do when a plan runs):

* **compute**: matrix products (``n x n`` by ``n x n``) and convolutions of several sizes; one
  least-squares line ``seconds = flops / peak + launch`` gives the peak FLOP/s (float32) and the
  launch overhead;
* **memory**: an elementwise pass over arrays of several sizes (read and write), ``seconds =
  bytes / bandwidth + launch``;
* **collectives**: AllReduce, AllGather, ReduceScatter and AllToAll at several message sizes in
  groups of every size that divides the devices (2, 4, ..., all), each group a mesh axis;
  ``seconds = a alpha + b beta`` with the cost model's own coefficients
  (:func:`pcgopt.extract.costmodel.calibrate.fit_alpha_beta`), fitted over all group sizes at
  once as one level's link.

The machine it returns is one level of ``N`` devices joined by that link, with a device spec of
the fitted rates and the host's memory divided among the devices. On this project's CPU machine
it calibrates ``N`` virtual CPU devices; on a GPU host the same call calibrates its GPUs (a
machine of several hosts needs one level per host boundary: measure on one host, then edit the
file's outer level, or fit a CSV of cluster timings with ``pcgopt.extract.costmodel.calibrate``).
Each timing is the median of ``repeats`` runs after one warm-up (compilation).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.calibrate import AlphaBeta, Measurement, fit_alpha_beta
from pcgopt.machine import DeviceSpec, Level, Machine

__all__ = ["MeasuredMachine", "measure_machine"]

#: Matrix sizes (``n`` of an ``n x n`` product) timed for the peak rate.
MATMUL_SIZES = (128, 256, 512, 768)
#: Elements per device of the elementwise passes timed for the memory bandwidth.
COPY_SIZES = (2**14, 2**16, 2**18, 2**20)
#: Bytes per device of the collectives' messages.
MESSAGE_SIZES = (2**12, 2**15, 2**18, 2**20)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class MeasuredMachine:
    """What :func:`measure_machine` measured and fitted: the ``machine``; ``compute``: rows of
    (FLOPs, seconds) per device; ``copies``: (bytes, seconds); ``collectives``: the
    :class:`~pcgopt.extract.costmodel.calibrate.Measurement` rows; ``link``: their fit."""

    machine: Machine
    compute: tuple[tuple[float, float], ...]
    copies: tuple[tuple[float, float], ...]
    collectives: tuple[Measurement, ...]
    link: AlphaBeta

    def summary(self) -> str:
        d = self.machine.device
        return (
            f"{self.machine.num_devices} x {d.name}: peak {d.peak_flops['f32'] / 1e9:.4g} "
            f"GFLOP/s, memory {d.memory_bandwidth_Bps / 1e9:.4g} GB/s, launch "
            f"{d.launch_overhead_s * 1e6:.3g} µs; link {self.link!r} (from "
            f"{len(self.compute)} compute, {len(self.copies)} memory and "
            f"{len(self.collectives)} collective timings)"
        )


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    run()  # compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        _block(out)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _block(out: Any) -> None:
    import jax

    jax.block_until_ready(out)


def _line(xs: Sequence[float], ys: Sequence[float], what: str) -> tuple[float, float]:
    """Least-squares ``y = slope x + intercept`` with both at least 0."""
    a = np.column_stack([np.asarray(xs, float), np.ones(len(xs))])
    (slope, intercept), *_ = np.linalg.lstsq(a, np.asarray(ys, float), rcond=None)
    if not slope > 0:
        raise PCGError(f"calibration: the {what} timings do not grow with their size: {ys}")
    return float(slope), max(0.0, float(intercept))


def measure_machine(
    *,
    devices: int | None = None,
    name: str = "measured",
    repeats: int = 5,
    say: Callable[[str], None] | None = None,
) -> MeasuredMachine:
    """Times the local JAX devices (the first ``devices`` of them; default all) and fits a
    machine (module docstring). JAX must already have them: on a CPU call
    :func:`pcgopt.lower.run.host_devices` before JAX loads."""
    try:
        import jax
        import jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
    except ImportError:
        raise PCGError("measuring needs JAX: pip install 'pcgopt[jax]'") from None
    from jax import shard_map

    say = say or (lambda _: None)
    have = jax.devices()
    count = len(have) if devices is None else devices
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise PCGError(f"devices must be a positive integer, got {devices!r}")
    if count > len(have):
        raise PCGError(
            f"{count} devices asked for, JAX has {len(have)} (on a CPU, set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={count} before JAX loads)"
        )
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise PCGError(f"repeats must be a positive integer, got {repeats!r}")
    flat = Mesh(np.array(have[:count]), ("d",))
    spread = NamedSharding(flat, PartitionSpec("d"))

    def on_every_device(fn: Callable[..., Any], *shapes: tuple[int, ...]) -> float:
        """Seconds of ``fn`` run on every device at once on its own blocks of ``shapes``."""
        args = [
            jax.device_put(jnp.ones((count * s[0], *s[1:]), jnp.float32), spread) for s in shapes
        ]
        mapped = jax.jit(
            shard_map(
                fn,
                mesh=flat,
                in_specs=tuple(PartitionSpec("d") for _ in shapes),
                out_specs=PartitionSpec("d"),
            )
        )
        return _median_seconds(lambda: mapped(*args), repeats)

    say(f"timing matrix products and convolutions on {count} devices at once")
    compute = []
    for n in MATMUL_SIZES:
        seconds = on_every_device(lambda a, b: a @ b, (n, n), (n, n))
        compute.append((2.0 * n**3, seconds))
    for channels, size in ((16, 32), (32, 32), (32, 64)):

        def conv(x: Any, w: Any, channels: int = channels, size: int = size) -> Any:
            x = x.reshape(1, channels, size, size)
            w = w.reshape(channels, channels, 3, 3)
            out = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME")
            return out.reshape(1, -1)

        seconds = on_every_device(conv, (1, channels * size * size), (1, channels * channels * 9))
        compute.append((2.0 * channels * channels * 9 * size * size, seconds))
    per_flop, launch = _line([f for f, _ in compute], [s for _, s in compute], "compute")

    say("timing elementwise passes (memory bandwidth)")
    copies = []
    for n in COPY_SIZES:
        seconds = on_every_device(lambda x: x * 2.0 + 1.0, (n,))
        copies.append((2.0 * 4 * n, seconds))  # read and write, 4 bytes each
    per_byte, _ = _line([b for b, _ in copies], [s for _, s in copies], "memory")

    say("timing collectives in groups of every size that divides the devices")
    rows = []
    for group in (p for p in range(2, count + 1) if count % p == 0):
        mesh = Mesh(np.array(have[:count]).reshape(count // group, group), ("g", "d"))
        for kind in COLLECTIVES:
            for nbytes in MESSAGE_SIZES:
                rows.append(
                    Measurement(
                        kind,
                        group,
                        nbytes,
                        _collective_seconds(
                            jax, jnp, shard_map, mesh, kind, group, nbytes, repeats
                        ),
                        level="device",
                    )
                )
    if not rows:
        raise PCGError("calibration: one device has no collectives to time; use 2 or more")
    link = fit_alpha_beta(rows)["device"]
    device = DeviceSpec(
        name=f"{have[0].platform} (measured)",
        peak_flops={"f32": 1.0 / per_flop},
        memory_bandwidth_Bps=1.0 / per_byte,
        memory_bytes=_host_memory() // count,
        launch_overhead_s=launch,
    )
    machine = Machine(
        levels=(Level("device", count, link.link("switched")),), device=device, name=name
    )
    return MeasuredMachine(machine, tuple(compute), tuple(copies), tuple(rows), link)


def _collective_seconds(
    jax: Any, jnp: Any, shard_map: Any, mesh: Any, kind: str, group: int, nbytes: int, repeats: int
) -> float:
    """One collective over the mesh's ``d`` axis (groups of ``group``), ``nbytes`` per device as
    :func:`~pcgopt.extract.costmodel.cost.flat_coefficients` counts them."""
    from jax.sharding import NamedSharding, PartitionSpec

    elements = max(group, nbytes // 4 // group * group)
    if kind == "all_reduce":
        fn = lambda x: jax.lax.psum(x, "d")  # noqa: E731
        block = elements
    elif kind == "all_gather":  # the message is the gathered output
        fn = lambda x: jax.lax.all_gather(x, "d", tiled=True)  # noqa: E731
        block = elements // group
    elif kind == "reduce_scatter":  # the message is the input
        fn = lambda x: jax.lax.psum_scatter(x, "d", tiled=True)  # noqa: E731
        block = elements
    else:  # each device's buffer
        fn = lambda x: jax.lax.all_to_all(x, "d", 0, 0, tiled=True)  # noqa: E731
        block = elements
    devices = mesh.devices.size
    spec = PartitionSpec(("g", "d"))
    x = jax.device_put(jnp.ones((devices * block,), jnp.float32), NamedSharding(mesh, spec))
    out_spec = spec
    mapped = jax.jit(shard_map(fn, mesh=mesh, in_specs=(spec,), out_specs=out_spec))
    return _median_seconds(lambda: mapped(x), repeats)


def _host_memory() -> int:
    """Bytes of the host's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30  # where the system does not say: a laptop's
