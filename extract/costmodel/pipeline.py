"""Pipeline parallelism's schedule: one training iteration of stages that hand micro-batches on
(Unity section 5, "Pipeline parallelism"; AutoDDL section 5.4).

A pipeline of ``S`` stages runs a mini-batch as ``M`` micro-batches. Stage ``s`` (0-based) runs
one micro-batch's forward in ``F_s`` seconds and its backward in ``B_s``; it sends a
micro-batch's activation to stage ``s + 1``, and receives its gradient back, in ``P_s`` seconds
each way (:attr:`StageTimes.send_s`), on a stream of its own: a transfer delays the receiver,
never the sender's computation. After its last backward a stage synchronizes its weights'
gradients within the stage and updates them in ``U_s`` seconds (:attr:`StageTimes.sync_s`).

Two schedules (:data:`SCHEDULES`):

* ``"1f1b"`` (the default), PipeDream-Flush's one-forward-one-backward (as DAPPLE and
  Megatron-LM run it): stage ``s`` first runs ``min(S - s - 1, M)`` forwards (the warm-up),
  then alternates one forward and one backward, then runs the backwards left. The iteration ends
  with a flush: every micro-batch of it uses the same weights, so it computes exactly what
  gradient accumulation over ``M`` micro-batches computes. Its time is the event schedule's
  (:func:`schedule_1f1b`). With equal stages (``F_s + B_s = t``) and free transfers it is
  ``(M + S - 1) t`` plus the last stage's ``U``: a bubble of ``(S - 1) t``, so ``M`` is never
  taken to be infinite. The stage search (:mod:`pcgopt.extract.strategies.pipeline`) ranks
  stage cuts with the closed form :func:`one_f_one_b_estimate`,
  ``sum_s (F_s + B_s) + 2 sum_s P_s + (M - 1) max_s (F_s + B_s) + max_s U_s``, exact for equal
  stages and free transfers. Stage ``s`` holds the activations of ``min(S - s, M)`` micro-batches
  at once (:func:`in_flight`), and one version of its weights.
* ``"2bw"``, PipeDream-2BW (the weight semantics Unity adopts): no flush; the next mini-batch's
  micro-batches enter while this one's finish, so after the first iteration there is no bubble.
  Each micro-batch's backward uses the weights its forward used, which are one update old: it
  is not the computation of the input model (the update is delayed by one mini-batch), so a
  plan says so. Every stage keeps two versions of its weights (double buffering); one gradient
  and one optimizer state. Time per iteration, in steady state:
  ``max_s (M max(F_s + B_s, P_s) + U_s)`` (the update not hidden behind the next mini-batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pcgopt.errors import PCGError

__all__ = [
    "SCHEDULES",
    "PipelineError",
    "ScheduledOp",
    "StageTimes",
    "in_flight",
    "one_f_one_b_estimate",
    "one_f_one_b_order",
    "pipeline_time",
    "schedule_1f1b",
    "two_bw_time",
]

#: The pipeline schedules the cost model knows (module docstring).
SCHEDULES = ("1f1b", "2bw")


class PipelineError(PCGError):
    """A pipeline that cannot be scheduled: no stages, a non-positive micro-batch count, an
    unknown schedule or a negative time."""


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One stage's times (module docstring): ``forward_s`` and ``backward_s`` for one
    micro-batch, compute and the stage's own collectives; ``send_s``, a micro-batch's activation
    to the next stage (and its gradient back; 0 for the last stage); ``sync_s``, the gradient
    synchronization and optimizer update once per mini-batch."""

    forward_s: float
    backward_s: float
    send_s: float = 0.0
    sync_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("forward_s", "backward_s", "send_s", "sync_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise PipelineError(f"StageTimes.{name} must be a finite time >= 0, got {value!r}")

    @property
    def busy_s(self) -> float:
        """Forward and backward of one micro-batch."""
        return self.forward_s + self.backward_s

    def __repr__(self) -> str:
        parts = f"F {self.forward_s * 1e3:.3g} ms, B {self.backward_s * 1e3:.3g} ms"
        if self.send_s:
            parts += f", send {self.send_s * 1e3:.3g} ms"
        if self.sync_s:
            parts += f", sync {self.sync_s * 1e3:.3g} ms"
        return f"StageTimes({parts})"


@dataclass(frozen=True, slots=True)
class ScheduledOp:
    """One forward (``"F"``) or backward (``"B"``) of micro-batch ``micro`` on stage ``stage``,
    from ``start_s`` to ``end_s``."""

    stage: int
    kind: str
    micro: int
    start_s: float
    end_s: float

    def __repr__(self) -> str:
        return (
            f"{self.kind}{self.micro}@{self.stage} "
            f"[{self.start_s * 1e3:.4g}, {self.end_s * 1e3:.4g}] ms"
        )


def _check(stages: Sequence[StageTimes], micro_batches: int) -> None:
    if not stages:
        raise PipelineError("a pipeline needs at least one stage")
    for i, s in enumerate(stages):
        if not isinstance(s, StageTimes):
            raise PipelineError(f"stages[{i}] must be a StageTimes, got {type(s).__name__}")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise PipelineError(f"micro_batches must be a positive integer, got {micro_batches!r}")


def _order(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s operations in 1F1B order (module docstring)."""
    warm = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warm)]
    forward, backward = warm, 0
    while backward < micro_batches:
        if forward < micro_batches:
            order.append(("F", forward))
            forward += 1
        order.append(("B", backward))
        backward += 1
    return order


def one_f_one_b_order(stages: int, micro_batches: int) -> tuple[tuple[int, str, int], ...]:
    """Every stage's operations in its 1F1B order, as ``(stage, "F" or "B", micro-batch)``,
    merged into one sequence in which each operation comes after those it waits for: the
    order in which a runtime that dispatches asynchronously issues them, so that each device
    runs its own in 1F1B order.

    >>> [f"{s}{k}{i}" for s, k, i in one_f_one_b_order(2, 2)]
    ['0F0', '0F1', '1F0', '1B0', '0B0', '1F1', '1B1', '0B1']
    """
    unit = [StageTimes(1.0, 2.0)] * stages  # any positive times give a valid merge
    return tuple((o.stage, o.kind, o.micro) for o in schedule_1f1b(unit, micro_batches))


def schedule_1f1b(stages: Sequence[StageTimes], micro_batches: int) -> tuple[ScheduledOp, ...]:
    """When every forward and backward of a 1F1B iteration runs (module docstring): each stage
    runs its operations in order, each as soon as the stage is free and its input has arrived
    (a forward: the previous stage's forward of that micro-batch plus the transfer; a backward:
    the next stage's backward plus the transfer, or on the last stage its own forward).

    >>> ops = schedule_1f1b([StageTimes(1.0, 2.0)] * 2, 2)
    >>> [f"{o.kind}{o.micro}" for o in ops if o.stage == 0]
    ['F0', 'F1', 'B0', 'B1']
    >>> max(o.end_s for o in ops)  # (M + S - 1) (F + B)
    9.0
    """
    _check(stages, micro_batches)
    count = len(stages)
    orders = [_order(s, count, micro_batches) for s in range(count)]
    done: dict[tuple[int, str, int], float] = {}
    position = [0] * count
    free = [0.0] * count
    out: list[ScheduledOp] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(count):
            while position[s] < len(orders[s]):
                kind, micro = orders[s][position[s]]
                if kind == "F":
                    ready = 0.0 if s == 0 else done.get((s - 1, "F", micro))
                    if ready is not None and s > 0:
                        ready += stages[s - 1].send_s
                elif s == count - 1:
                    ready = done.get((s, "F", micro))
                else:
                    ready = done.get((s + 1, "B", micro))
                    if ready is not None:
                        ready += stages[s].send_s
                if ready is None:
                    break
                start = max(free[s], ready)
                took = stages[s].forward_s if kind == "F" else stages[s].backward_s
                end = start + took
                done[(s, kind, micro)] = end
                free[s] = end
                out.append(ScheduledOp(s, kind, micro, start, end))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - the order above cannot deadlock
            raise PipelineError("the 1F1B schedule deadlocked")
    return tuple(sorted(out, key=lambda o: (o.start_s, o.stage)))


def pipeline_time(
    stages: Sequence[StageTimes], micro_batches: int, schedule: str = "1f1b"
) -> float:
    """One iteration's time under ``schedule`` (module docstring): for ``"1f1b"`` the event
    schedule's, each stage's gradient synchronization and update after its last backward; for
    ``"2bw"`` :func:`two_bw_time`."""
    _check(stages, micro_batches)
    if schedule == "2bw":
        return two_bw_time(stages, micro_batches)
    if schedule != "1f1b":
        raise PipelineError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    last = [0.0] * len(stages)
    for op in schedule_1f1b(stages, micro_batches):
        last[op.stage] = max(last[op.stage], op.end_s)
    return max(end + s.sync_s for end, s in zip(last, stages, strict=True))


def one_f_one_b_estimate(stages: Sequence[StageTimes], micro_batches: int) -> float:
    """The closed form the stage search ranks cuts by (module docstring): every stage's forward
    and backward once (the first micro-batch's way down and back), both transfers of every
    boundary, the bottleneck stage ``M - 1`` more times, and the slowest synchronization."""
    _check(stages, micro_batches)
    busy = [s.busy_s for s in stages]
    sends = sum(2 * s.send_s for s in stages[:-1])
    return sum(busy) + sends + (micro_batches - 1) * max(busy) + max(s.sync_s for s in stages)


def two_bw_time(stages: Sequence[StageTimes], micro_batches: int) -> float:
    """PipeDream-2BW's time per iteration in steady state (module docstring)."""
    _check(stages, micro_batches)
    return max(micro_batches * max(s.busy_s, s.send_s) + s.sync_s for s in stages)


def in_flight(stage: int, stages: int, micro_batches: int) -> int:
    """How many micro-batches' activations stage ``stage`` (0-based, of ``stages``) holds at
    once under 1F1B (and 2BW): its warm-up forwards plus the one in its steady state.

    >>> [in_flight(s, 4, 8) for s in range(4)]
    [4, 3, 2, 1]
    """
    if not 0 <= stage < stages:
        raise PipelineError(f"stage {stage} is not one of the {stages} stages")
    return min(stages - stage, micro_batches)
