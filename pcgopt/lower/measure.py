"""Calibration by measurement: microbenchmarks on the local JAX devices, fitted into a Machine.

``pcgopt calibrate --measure --out machine.json`` (or :func:`measure_machine`) times, on every
local device at once (so that devices sharing a host share it while they are measured, as they
do when a plan runs):

* **compute**: matrix products (``n x n`` by ``n x n``) of several sizes, one least-squares
  line ``seconds = flops / peak + launch`` giving the peak FLOP/s (float32) and the launch
  overhead; convolutions of several sizes, whose best rate is reported beside the peak (the
  cost model's roofline has one rate per dtype);
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
Each operation runs as the step of a loop inside one program, once and ``1 + LOOP`` times; the
difference of the two programs' fastest times (of ``repeats`` runs each after one that
compiles), divided by ``LOOP``, is one step's time, without the program's dispatch (a training
step is one program of many kernels). Where noise hides the steps, the loop is made 4 times
longer once; then the measurement fails, saying so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.calibrate import (
    AlphaBeta,
    CalibrationError,
    Measurement,
    fit_alpha_beta,
)
from pcgopt.machine import DeviceSpec, Level, Machine

__all__ = ["MeasuredMachine", "measure_machine"]

#: Matrix sizes (``n`` of an ``n x n`` product) timed for the peak rate.
MATMUL_SIZES = (128, 256, 512, 768)
#: Convolutions timed beside them: (channels, image side), 3 x 3 kernels.
CONVOLUTIONS = ((16, 32), (32, 32), (32, 64))
#: ``measure_machine(quick=True)``'s smaller products and convolutions: a few seconds on a
#: CPU host instead of about fifteen, the peak fitted from smaller (more launch-bound) kernels.
QUICK_MATMUL_SIZES = (64, 128, 256)
QUICK_CONVOLUTIONS = ((8, 16), (16, 32))
#: Elements per device of the elementwise passes timed for the memory bandwidth.
COPY_SIZES = (2**14, 2**16, 2**18, 2**20)
#: Bytes per device of the collectives' messages.
MESSAGE_SIZES = (2**12, 2**15, 2**18, 2**20)
#: Steps in the longer of the two programs each timing compares.
LOOP = 8
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class MeasuredMachine:
    """What :func:`measure_machine` measured and fitted: the ``machine``; ``compute``: rows of
    (FLOPs, seconds) per device of the matrix products (the fit), ``convolutions`` the same of
    the convolutions; ``copies``: (bytes, seconds); ``collectives``: the
    :class:`~pcgopt.extract.costmodel.calibrate.Measurement` rows; ``link``: their fit."""

    machine: Machine
    compute: tuple[tuple[float, float], ...]
    convolutions: tuple[tuple[float, float], ...]
    copies: tuple[tuple[float, float], ...]
    collectives: tuple[Measurement, ...]
    link: AlphaBeta

    def summary(self) -> str:
        d = self.machine.device
        conv = max((f / s for f, s in self.convolutions if s > 0), default=0.0)
        return (
            f"{self.machine.num_devices} x {d.name}: peak {d.peak_flops['f32'] / 1e9:.4g} "
            f"GFLOP/s (matrix products; convolutions reach {conv / 1e9:.4g}), memory "
            f"{d.memory_bandwidth_Bps / 1e9:.4g} GB/s, launch {d.launch_overhead_s * 1e6:.3g} "
            f"µs; link {self.link!r} (from {len(self.compute) + len(self.convolutions)} "
            f"compute, {len(self.copies)} memory and {len(self.collectives)} collective timings)"
        )


def _fastest_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` timed runs, after one that compiles: the least disturbed by
    whatever else the host runs."""
    _block(run())  # compiles, and is done before the clock starts
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        _block(out)
        times.append(time.perf_counter() - start)
    return min(times)


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
    quick: bool = False,
    say: Callable[[str], None] | None = None,
) -> MeasuredMachine:
    """Times the local JAX devices (the first ``devices`` of them; default all) and fits a
    machine (module docstring). JAX must already have them: on a CPU call
    :func:`pcgopt.lower.run.host_devices` before JAX loads. ``quick``: time smaller matrix
    products and convolutions (:data:`QUICK_MATMUL_SIZES`), for a rougher peak in less time."""
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
    if count < 2:
        raise PCGError("calibration times collectives, which need 2 or more devices; got 1")
    flat = Mesh(np.array(have[:count]), ("d",))

    def per_step(step: Callable[[Any], Any], shape: tuple[int, ...], mesh: Any, spec: Any) -> float:
        """Seconds of one ``step`` (a function of a per-device block of ``shape`` to one of
        the same shape) run on every device at once: programs of 1 and 1 + LOOP steps in a
        loop, timed, and the difference divided by LOOP, so that the program's dispatch
        cancels out (a training step is one program of many kernels)."""
        devices = mesh.devices.size
        x = jax.device_put(
            jnp.ones((devices * shape[0], *shape[1:]), jnp.float32), NamedSharding(mesh, spec)
        )

        def program(k: int) -> Callable[[], Any]:
            # Untyped (check_vma=False): a summed value, the same on every device of a group,
            # is carried on as every device's own block.
            body = shard_map(
                lambda b: jax.lax.fori_loop(0, k, lambda _, v: step(v), b),
                mesh=mesh,
                in_specs=(spec,),
                out_specs=spec,
                check_vma=False,
            )
            run = jax.jit(body)
            return lambda: run(x)

        one = _fastest_seconds(program(1), repeats)
        for steps in (LOOP, 4 * LOOP):  # a longer loop where noise hides the steps
            seconds = (_fastest_seconds(program(1 + steps), repeats) - one) / steps
            if seconds > 0:
                return seconds
        raise PCGError(
            f"calibration: one step of a {shape} timing is lost in the host's noise (a program of "
            f"{1 + 4 * LOOP} steps ran no slower than one of 1); measure again with more --repeats "
            "or on a quieter host"
        )

    spec = PartitionSpec("d")
    say(f"timing matrix products and convolutions on {count} devices at once")
    compute = []
    for n in QUICK_MATMUL_SIZES if quick else MATMUL_SIZES:
        w = jnp.full((n, n), 1.0 / n, jnp.float32)
        compute.append((2.0 * n**3, per_step(lambda v, w=w: v @ w, (n, n), flat, spec)))
    convolutions = []
    for channels, size in QUICK_CONVOLUTIONS if quick else CONVOLUTIONS:
        kernel = jnp.full((channels, channels, 3, 3), 1.0 / (9 * channels), jnp.float32)

        def conv(v: Any, kernel: Any = kernel) -> Any:
            return jax.lax.conv_general_dilated(v, kernel, (1, 1), "SAME")

        flops = 2.0 * channels * channels * 9 * size * size
        convolutions.append((flops, per_step(conv, (1, channels, size, size), flat, spec)))
    # The peak is the matrix products' (the roofline's one rate); the convolutions' own rate is
    # reported beside it, for a device where they run slower.
    per_flop, launch = _line([f for f, _ in compute], [s for _, s in compute], "matmul")

    say("timing elementwise passes (memory bandwidth)")
    copies = []
    for n in COPY_SIZES:
        seconds = per_step(lambda v: v * 0.5 + 1.0, (n,), flat, spec)
        copies.append((2.0 * 4 * n, seconds))  # read and write, 4 bytes each
    per_byte, _ = _line([b for b, _ in copies], [s for _, s in copies], "memory")

    say("timing collectives in groups of every size that divides the devices")
    rows = []
    for group in (p for p in range(2, count + 1) if count % p == 0):
        mesh = Mesh(np.array(have[:count]).reshape(count // group, group), ("g", "d"))
        for kind in COLLECTIVES:
            for nbytes in MESSAGE_SIZES:
                step, block = _collective_step(jax, jnp, kind, group, nbytes)
                seconds = per_step(step, (block,), mesh, PartitionSpec(("g", "d")))
                rows.append(Measurement(kind, group, nbytes, seconds, level="device"))
    try:
        link = fit_alpha_beta(rows)["device"]
    except CalibrationError as e:
        raise PCGError(f"calibration: the collective timings cannot be fitted: {e}") from None
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
    return MeasuredMachine(
        machine, tuple(compute), tuple(convolutions), tuple(copies), tuple(rows), link
    )


def _collective_step(jax: Any, jnp: Any, kind: str, group: int, nbytes: int) -> tuple[Any, int]:
    """One collective over the mesh's ``d`` axis (groups of ``group``) as a loop step, and the
    per-device block it carries: ``nbytes`` per device as
    :func:`~pcgopt.extract.costmodel.cost.flat_coefficients` counts them. Each step keeps its
    values bounded and its block's size, with one elementwise pass counted in its time (more
    so where the link is memory, as between virtual CPU devices): AllReduce scales the sum
    back, AllGather slices its output, ReduceScatter tiles and scales its output; AllToAll
    needs none."""
    elements = max(group, nbytes // 4 // group * group)
    if kind == "all_reduce":
        return (lambda v: jax.lax.psum(v, "d") * (1.0 / group)), elements
    if kind == "all_gather":  # the message is the gathered output
        block = elements // group
        return (lambda v: jax.lax.all_gather(v, "d", tiled=True)[:block]), block
    if kind == "reduce_scatter":  # the message is the input

        def scatter(v: Any) -> Any:
            return jnp.tile(jax.lax.psum_scatter(v, "d", tiled=True), group) * (1.0 / group)

        return scatter, elements
    return (lambda v: jax.lax.all_to_all(v, "d", 0, 0, tiled=True)), elements  # each buffer


def _host_memory() -> int:
    """Bytes of the host's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30  # where the system does not say: a laptop's
