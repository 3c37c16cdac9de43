"""Running a plan's training steps on JAX and checking them, for ``pcgopt run`` and
``pcgopt optimize --run``.

:func:`host_devices` must run before JAX loads: on a CPU, JAX makes its virtual devices once,
from ``XLA_FLAGS=--xla_force_host_platform_device_count=N``. :func:`devices_needed` says how
many a plan needs without loading JAX (its widest tensor, or more when its splits need a
larger mesh: :mod:`pcgopt.lower.layout`). :func:`run_plan` lowers the plan, compares the first
step's loss and gradients with the unsharded model's, runs the steps, and reads the compiled
collectives.
"""

from __future__ import annotations

import gc
import os
import re
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcgopt.errors import PCGError
from pcgopt.graph import PCG
from pcgopt.lower.layout import DeviceGrid, LayoutError, assign_layouts

__all__ = ["RunReport", "devices_needed", "host_devices", "run_plan"]

_COUNT_FLAG = "--xla_force_host_platform_device_count"


def devices_needed(pcg: PCG, limit: int = 4096) -> int:
    """The fewest devices an SPMD program of ``pcg`` runs on: its widest tensor's shards, or
    the first multiple of that whose mesh serves the plan's splits (at most ``limit``)."""
    width = max(s.num_shards for n in pcg.nodes for s in pcg.output_shapes(n.name))
    for size in range(width, limit + 1, width):
        try:
            assign_layouts(pcg, DeviceGrid.flat(size))
            return size
        except LayoutError as err:
            if err.node is not None:
                raise
    raise LayoutError(f"no mesh of up to {limit} devices serves the plan")


def plan_devices(plan: Any) -> int:
    """The devices a plan runs on: :func:`devices_needed` of its graph, or, if its machine
    mapping runs branches on blocks of devices (a Plan, or a plan file's
    :class:`~pcgopt.lower.saved.SavedPlan`), the last device of those blocks if further; a
    pipeline's, the end of its last stage's block."""
    stages = getattr(plan, "stages", None)
    if stages is not None:
        return stages[-1].devices.stop
    pcg = plan if isinstance(plan, PCG) else plan.pcg
    needed = devices_needed(pcg)
    mapping = getattr(plan, "machine_mapping", None)
    for unit in getattr(mapping, "units", ()):
        needed = max(needed, unit.block.start + unit.block.size)
    return needed


def host_devices(count: int) -> None:
    """Asks JAX for ``count`` virtual CPU devices (``XLA_FLAGS``), which it reads when it loads.
    A device count already in ``XLA_FLAGS`` is raised if lower. If JAX is already loaded, a
    count it has not got is an error (it cannot add devices)."""
    if "jax" in sys.modules:
        import jax

        have = len(jax.devices())
        if have < count:
            raise PCGError(
                f"the plan needs {count} devices and JAX, already loaded, has {have}; set "
                f"XLA_FLAGS={_COUNT_FLAG}={count} before anything imports JAX"
            )
        return
    flags = os.environ.get("XLA_FLAGS", "")
    found = re.search(_COUNT_FLAG + r"=(\d+)", flags)
    if found and int(found.group(1)) >= count:
        return
    flags = re.sub(_COUNT_FLAG + r"=\d+", "", flags).strip()
    os.environ["XLA_FLAGS"] = f"{flags} {_COUNT_FLAG}={count}".strip()


def _max_abs(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def _scale(b: Any) -> float:
    b = np.asarray(b, dtype=np.float64)
    return max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0


@dataclass
class RunReport:
    """What :func:`run_plan` ran and measured. ``losses``: per step; ``step_seconds``: wall
    time of each step (the first includes compiling it); ``loss_error``, ``grad_error``: max
    absolute difference of the first step's loss and of any weight's gradient from the
    unsharded model's (``*_relative``: divided by the larger of 1 and the reference's largest
    magnitude); ``peak_rss_bytes``: the process's peak resident memory (on a CPU every virtual
    device's buffers are in it)."""

    lowered: Any
    losses: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    loss_error: float = 0.0
    grad_error: float = 0.0
    loss_relative: float = 0.0
    grad_relative: float = 0.0
    reference: str = ""
    collectives: Any = None
    peak_rss_bytes: int = 0

    def summary(self, *, max_rows: int | None = 12) -> str:
        low = self.lowered
        axes = ", ".join(f"{n}={s}" for n, s in low.mesh.shape.items())
        pieces = getattr(low, "pieces", ())
        platform = low.mesh.devices.flat[0].platform.upper()
        if getattr(low, "stages", 0):
            where = (
                f"as a pipeline of {len(pieces)} stages on blocks of {low.mesh.size} {platform} "
                "devices, micro-batches issued in 1F1B order"
            )
        elif pieces:
            where = (
                f"in {len(pieces)} programs on blocks of {low.mesh.size} {platform} devices "
                "(the machine mapping's branches at once on disjoint devices)"
            )
        else:
            where = f"on a mesh of {low.mesh.size} {platform} devices ({axes})"
        lines = [
            f"ran {len(low.pcg.nodes)} nodes {where}; optimizer "
            f"{low.optimizer}, learning rate {low.learning_rate:g}, {low.micro_batches} "
            f"micro-batch{'es' if low.micro_batches > 1 else ''}"
            + (
                f", ZeRO-{low.zero_stage} (optimizer state split over each weight's copies)"
                if getattr(low, "zero_stage", 0)
                else ""
            ),
            f"first step against {self.reference}: loss |difference| {self.loss_error:.3g} "
            f"(relative {self.loss_relative:.3g}), gradients max |difference| "
            f"{self.grad_error:.3g} (relative {self.grad_relative:.3g}) over "
            f"{len(low.weight_names)} weights",
        ]
        if getattr(low, "note", ""):
            lines.append(f"note: {low.note}")
        for k, (loss, seconds) in enumerate(zip(self.losses, self.step_seconds, strict=True)):
            note = " (compiling and running)" if k == 0 else ""
            lines.append(f"  step {k + 1}: loss {loss:.6g}   {seconds * 1e3:.4g} ms{note}")
        if len(self.step_seconds) > 1:
            median = statistics.median(self.step_seconds[1:])
            lines.append(
                f"wall time per step {median * 1e3:.4g} ms (median of "
                f"{len(self.step_seconds) - 1} after the first); peak memory "
                f"{self.peak_rss_bytes / 2**20:.4g} MiB (process RSS)"
            )
        if self.collectives is not None and low.mesh.size == 1:
            lines.append("collectives: none (one device)")
        elif self.collectives is not None:
            lines.append(self.collectives.summary(max_rows=max_rows))
            lines.append(self._groups())
        return "\n".join(lines)

    def _groups(self) -> str:
        low = self.lowered
        checks = low.group_checks(self.collectives)
        agree = sum(c.agrees for c in checks)
        text = low.placement.summary() if low.placement is not None else "device groups:"
        return (
            f"{text}\n  compiled collectives read back with their node: {agree} of "
            f"{len(checks)} on the plan's groups"
        )

    def __str__(self) -> str:
        return self.summary()


def _check_sources(model: PCG, plan: PCG) -> None:
    """The model must have the plan's inputs and weights (names, sizes and dtypes)."""

    def sources(pcg: PCG) -> dict[str, str]:
        return {
            n.name: f"{pcg.shape(n.name).dtype.value}{list(pcg.shape(n.name).sizes)}"
            for n in pcg.nodes
            if n.op in ("input", "weight")
        }

    a, b = sources(model), sources(plan)
    if a != b:
        differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        shown = ", ".join(f"{k}: {a.get(k, 'absent')} vs {b.get(k, 'absent')}" for k in differ[:3])
        raise PCGError(
            f"the model's inputs and weights differ from the plan's ({len(differ)}: {shown}"
            + (", ..." if len(differ) > 3 else "")
            + "); give the model the plan was made from"
        )


def run_plan(
    plan_or_pcg: Any,
    *,
    model: PCG | None = None,
    devices: int | None = None,
    steps: int = 3,
    seed: int = 0,
    optimizer: str | None = None,
    micro_batches: int | None = None,
    learning_rate: float | None = None,
    collectives: bool = True,
    say: Callable[[str], None] | None = None,
) -> RunReport:
    """Lowers the plan (a Plan or a PCG) to JAX on ``devices`` devices (default: as many as it
    needs), compares the first step's loss and gradients, on random inputs and weights drawn
    from ``seed``, with ``model`` evaluated unsharded (default: the plan's own computation with
    its parallel operators left out), runs ``steps`` training steps, and compares the compiled
    collectives with the cost model's (``collectives``). ``say`` gets progress lines."""
    from pcgopt.lower.jax import DEFAULT_LEARNING_RATE, lower, reference_loss_and_grads

    say = say or (lambda _: None)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PCGError(f"steps must be a positive integer, got {steps!r}")
    say("lowering the plan to JAX")
    lowered = lower(
        plan_or_pcg,
        devices,
        optimizer=optimizer,
        micro_batches=micro_batches,
        learning_rate=learning_rate or DEFAULT_LEARNING_RATE,
    )
    report = RunReport(lowered)
    reference = model if model is not None else lowered.pcg
    _check_sources(reference, lowered.pcg)
    inputs, weights = lowered.random_sources(seed)
    report.reference = (
        "the input model evaluated unsharded (plain jax.numpy, one device)"
        if model is not None
        else "the plan's computation evaluated unsharded (plain jax.numpy, one device)"
    )
    say("first step against the unsharded model")
    loss, grads = lowered.loss_and_grads(inputs, weights)
    ref_loss, ref_grads = reference_loss_and_grads(
        reference, inputs, weights, micro_batches=lowered.micro_batches
    )
    report.loss_error = _max_abs(loss, ref_loss)
    report.loss_relative = report.loss_error / _scale(ref_loss)
    for name in lowered.weight_names:
        err = _max_abs(grads[name], ref_grads[name])
        report.grad_error = max(report.grad_error, err)
        report.grad_relative = max(report.grad_relative, err / _scale(ref_grads[name]))
    # A full-size model's gradients, twice, are as large as its weights: freed before training.
    del grads, ref_grads, loss, ref_loss
    lowered.release()
    gc.collect()
    state = lowered.init(weights)
    del weights
    for k in range(steps):
        say(f"training step {k + 1} of {steps}")
        start = time.perf_counter()
        state, loss = lowered.train_step(state, inputs)
        report.losses.append(float(loss))  # waits for the step
        report.step_seconds.append(time.perf_counter() - start)
    report.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if collectives:
        say("reading the compiled collectives")
        report.collectives = lowered.collectives()
    return report
