"""Pipeline parallelism: a model cut into stages of consecutive segments, each stage on its own
block of the machine with a plan of its own inside, micro-batches handed from stage to stage
(Unity section 5, "Pipeline parallelism"; AutoDDL section 5.4; the schedule and its cost are
:mod:`pcgopt.extract.costmodel.pipeline`'s).

**Stages.** The model is cut at the cuts graph splitting uses (:func:`pcgopt.segments.
split_segments`: about one transformer layer per segment); a stage is a run of consecutive segments.
The machine's stage unit is its outermost level with more than one unit (a node on a cluster); every
stage gets a block of whole units, consecutive ones (:func:`stage_blocks`): with ``S`` stages on
``N`` units, ``N/S`` each where ``S`` divides ``N``; otherwise ``N mod S`` blocks of ``q + 1`` units
and the rest of ``q = floor(N/S)``, the larger ones first or last (both tried), as balanced as whole
units allow; asked for (``blocks="free"``), also blocks the search chooses, as Alpa's
inter-operator pass chooses its submeshes (:class:`FreeBlocks`: any sizes of
:func:`free_block_sizes` that take all the units). Stage ``s`` hands its output to the next
stage over the link between them. A stage
reads its entry from the previous stage and sends back its gradient, so its entry needs a gradient
(``iteration_cost(..., grad_inputs=...)``: it arrives in the layout the stage reads it in, and its
gradient goes back so, summed over the copies of a replicated entry); what it hands on goes by the
transfer, not by gathering it (the collectives that bring a stage's exit to one device are not
charged to the stage): one micro-batch of the cut tensor crosses the stage level's link, each unit
of the smaller of the two blocks sending its share, ``latency + bytes / (units * bandwidth)``.
Micro-batches compute what the whole batch does only if no operator mixes samples, so a model with
training batch normalization is refused.

**Inside a stage.** Each stage runs one of the hand-written plans (:func:`stage_strategies`:
data parallelism, FSDP, Megatron at every tensor degree that divides the block, with and without
sequence parallelism) on its block, chosen per stage; asked for (``strategies=[...,
"layer-wise"]``), also the layer-wise search's: AutoDDL's coordinate descent over each dense
layer's SBP strategy, run once per distinct segment and block size (at most
:data:`LAYER_WISE_EVALUATIONS` assignments), a stage of several segments taking each one's
strategies; and asked for (``"e-graph"``), the e-graph's: every distinct segment saturated on
the block with the hand-written plans of the whole model on it as seeds, and extracted handing
its exit on unsplit (graph splitting's search without its layouts at the cuts,
:func:`~pcgopt.extract.search.splitting.segment_plans`, within :data:`EGRAPH_STAGE_BUDGET`),
once per block size; a stage of several segments joins theirs, a layout kept across a cut
costing nothing (:class:`~pcgopt.extract.search.splitting.SegmentPlans`). Extraction ranks a
segment's choices for the whole batch, not per micro-batch, so the hand-written plans stay
beside it. A segment's times are costed once per
distinct segment (equal up to names), strategy, block and micro-batch count by
:func:`~pcgopt.extract.costmodel.cost.iteration_cost` under the runtime's precision and ZeRO
stage with its tasks one after another, and a stage's are the sums of its segments'. The stage's
forward and backward per micro-batch are its compute and its collectives on activations, divided
by the micro-batch count (no overlap of the two: an upper bound); its synchronization is what
its iteration under the runtime (default PyTorch DDP's, which overlaps the gradient
synchronization with the last micro-batch's backward) adds to those: the synchronization left
exposed and the optimizer update, at least the update; plus, for a weight two stages read (a
tied embedding), an AllReduce of its gradient between them, not overlapped. Memory per device:
weights, gradients and optimizer state once (twice the weights under 2BW), and the activations
of the micro-batches it holds at once (:func:`~pcgopt.extract.costmodel.pipeline.in_flight`).

**Search.** For every stage count ``S`` up to the units and the segments, every order of its
blocks (:func:`stage_blocks`) and every micro-batch count ``M`` from :func:`micro_batch_counts`,
a dynamic program over cut points picks the cuts and each stage's strategy (among those its
block can run) that minimize the 1F1B closed form without the
synchronization (which runs once per iteration, not per micro-batch): ``sum_s (F_s + B_s + 2
P_s) + (M - 1) max_s (F_s + B_s)`` (for 2BW, ``M max_s (F_s + B_s)``), every stage fitting in
memory. The maximum is handled as Alpa's inter-operator pass does: for each bound ``T`` on a
stage's ``F + B``, the cheapest sum with every stage within ``T``, plus ``(M - 1) T``; the least
over ``T`` is the optimum. With free blocks the program's state also holds the units left,
and each stage picks its block size too; it prices a transfer over the sending block, the
full costing over the smaller of the two (only the :data:`FREE_BLOCKS_REFINED` best ``(S,
M)`` on balanced blocks get free ones). The candidates are then costed in full, every stage as
one PCG cut into the ``M`` micro-batches (Unity's Pipeline and Batch operators,
:func:`pcgopt.with_micro_batches`: :attr:`Stage.micro_batched`), by the event schedule with
its synchronizations (:func:`~pcgopt.extract.costmodel.pipeline.pipeline_time`), in the order
of their objectives, skipping those whose lower bound (the bottleneck stage's ``M (F + B)``
and, for 1F1B, the first micro-batch's way to it and the last one's back) is over the best cost
so far; the fastest that fits is returned. While candidates are costed the bound tightens
(each stage's exact ``F + B``, likeliest bottleneck first, then every stage's update and
tied-weight AllReduce after its last backward), and a candidate is given up as soon as it
reaches the best cost so far. A model
that micro-batches would change (an operator that mixes the samples of the batch:
:func:`pcgopt.scaled.micro_batch_difference`) is refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np

from pcgopt.divisors import divisors
from pcgopt.egraph import Budget
from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.cost import (
    OPTIMIZERS,
    CostBreakdown,
    collective_cost,
    iteration_cost,
)
from pcgopt.extract.costmodel.pipeline import (
    SCHEDULES,
    PipelineError,
    StageTimes,
    in_flight,
    one_f_one_b_estimate,
    pipeline_time,
)
from pcgopt.extract.costmodel.simulate import DDP, Runtime
from pcgopt.extract.strategies.baselines import batch_size, data_parallel, fsdp, megatron
from pcgopt.extract.strategies.layerwise import (
    LayerwiseResult,
    MatmulStrategy,
    coordinate_descent,
)
from pcgopt.extract.strategies.layerwise import lower as layer_wise_lower
from pcgopt.graph import PCG, TensorRef
from pcgopt.machine import Machine
from pcgopt.micro import with_micro_batches
from pcgopt.scaled import ScaleDownError, micro_batch_difference
from pcgopt.segments import Segment, canonical, is_parallel, segment_pcg, split_segments
from pcgopt.serialize import pcg_to_dict

if TYPE_CHECKING:
    from pcgopt.extract.search.splitting import SegmentPlans

__all__ = [
    "BLOCKS",
    "EGRAPH",
    "LAYER_WISE",
    "FreeBlocks",
    "PipelinePlan",
    "Stage",
    "free_block_sizes",
    "micro_batch_counts",
    "pipeline_search",
    "stage_blocks",
    "stage_machine",
    "stage_strategies",
]

StageStrategy = Callable[[PCG, Machine], PCG]

#: How the stages' blocks are chosen (:func:`pipeline_search`'s ``blocks``).
BLOCKS = ("balanced", "free")

#: The micro-batches per stage a time-limited search tries first (1F1B's bubble is then
#: (S - 1) / (M + S - 1), about a fifth).
TYPICAL_MICRO_BATCHES_PER_STAGE = 4

#: Parallel operators that add partial sums up: work of the stage, never of the transfer.
_SUMS = frozenset({"reduce", "all_reduce", "reduce_scatter"})


def _megatron(tensor_degree: int, sequence_parallel: bool) -> StageStrategy:
    # A segment without a dense layer to split (a loss head) is copied over the stage's
    # tensor-parallel devices, as Megatron-LM copies it.
    return partial(
        megatron,
        tensor_degree=tensor_degree,
        sequence_parallel=sequence_parallel,
        copies_if_unsplit=True,
    )


#: The stage plan the layer-wise search finds (AutoDDL's coordinate descent over each dense
#: layer's SBP strategy, :func:`~pcgopt.extract.strategies.layerwise.coordinate_descent`).
LAYER_WISE = "layer-wise"

#: The assignments the layer-wise search costs for one segment on one block, at most: a limit of
#: work, so the same plans come out however fast the machine is.
LAYER_WISE_EVALUATIONS = 64

#: The stage plan the e-graph finds: every distinct segment saturated and extracted on the
#: stage's block (:func:`~pcgopt.extract.search.splitting.segment_plans`), once per block size.
EGRAPH = "e-graph"

#: The e-graph stage plans' saturation limit, in work (the same plans however fast the machine
#: is; a time limit only stops it sooner): two iterations, the algebra from the first, at most
#: 50,000 e-nodes a distinct segment. BERT-Large's four distinct segments on 12 Summit GPUs:
#: 100,861 e-nodes, 16 s with the extraction.
EGRAPH_STAGE_BUDGET = Budget(
    iterations=2, enodes=50_000, seconds=math.inf, speculate=False, algebra_from=1
)


def _layer_wise(pcg: PCG, machine: Machine, optimizer: str = "adam") -> LayerwiseResult:
    return coordinate_descent(
        pcg, machine, restarts=1, optimizer=optimizer, max_evaluations=LAYER_WISE_EVALUATIONS
    )


def stage_strategies(
    devices: int, *, layer_wise: bool = False, egraph: bool = False
) -> dict[str, StageStrategy]:
    """The plans a stage of ``devices`` devices may run, by name: data parallelism, FSDP,
    Megatron (and Megatron-SP) at every tensor degree above 1 that divides ``devices`` (the
    rest of the block data parallel), with ``layer_wise`` the layer-wise search's
    (:data:`LAYER_WISE`), and with ``egraph`` the e-graph's (:data:`EGRAPH`).

    >>> list(stage_strategies(2, layer_wise=True, egraph=True))
    ['data parallel', 'fsdp', 'megatron t=2', 'megatron-sp t=2', 'layer-wise', 'e-graph']
    """
    found: dict[str, StageStrategy] = {"data parallel": data_parallel, "fsdp": fsdp}
    for t in divisors(devices):
        if t > 1:
            found[f"megatron t={t}"] = _megatron(t, False)
            found[f"megatron-sp t={t}"] = _megatron(t, True)
    if layer_wise:
        found[LAYER_WISE] = lambda pcg, machine: _layer_wise(pcg, machine).pcg
    if egraph:
        found[EGRAPH] = _egraph_plan
    return found


def _segment_plans(
    pcg: PCG,
    machine: Machine,
    segments: Sequence[Segment],
    optimizer: str = "adam",
    seconds: float = math.inf,
) -> SegmentPlans:
    """Every segment of ``pcg`` from the e-graph on ``machine`` (:data:`EGRAPH`), the
    hand-written plans of the whole model on it as seeds; within :data:`EGRAPH_STAGE_BUDGET`
    and ``seconds``."""
    # The search layer is above this one (its plan phase calls the pipeline search): loaded
    # only when an e-graph stage plan is asked for.
    from pcgopt.extract.search.splitting import segment_plans

    seeds = []
    for make in stage_strategies(machine.num_devices).values():
        try:
            seeds.append(make(pcg, machine))
        except PCGError:
            continue  # a plan this block cannot run seeds nothing
    finite = math.isfinite(seconds)
    return segment_plans(
        pcg,
        machine,
        segments,
        seeds=seeds,
        optimizer=optimizer,
        # Under a time limit, saturation gets most of it and leaves the rest to extract.
        saturate_s=0.7 * seconds if finite else math.inf,
        extract_s=0.3 * seconds if finite else 0.0,
        segment_budget=replace(EGRAPH_STAGE_BUDGET, seconds=0.7 * seconds)
        if finite
        else EGRAPH_STAGE_BUDGET,
    )


def _egraph_plan(pcg: PCG, machine: Machine) -> PCG:
    """``pcg`` on ``machine`` as the e-graph plans it (:data:`EGRAPH`), segment by segment."""
    segments = split_segments(pcg)
    return _segment_plans(pcg, machine, segments).span(0, len(segments))


def _stage_level(machine: Machine) -> tuple[int, object]:
    """The index and level stages are made of: the outermost with more than one unit."""
    for i, level in enumerate(machine.levels):
        if level.count > 1:
            return i, level
    raise PipelineError(f"machine {machine.name!r} has one device: there is nothing to pipeline")


def stage_machine(machine: Machine, units: int) -> Machine:
    """The block of ``units`` consecutive units of ``machine``'s stage level (module
    docstring), as a machine of its own.

    >>> stage_machine(Machine.preset("summit", nodes=8), 2).num_devices
    12
    """
    i, level = _stage_level(machine)
    if isinstance(units, bool) or not isinstance(units, Integral) or not 1 <= units <= level.count:
        raise PipelineError(
            f"a stage of {units!r} {level.name}(s): the machine has {level.count} "
            f"{level.name}s, so a stage takes 1 to {level.count} of them"
        )
    levels = (*machine.levels[:i], replace(level, count=units), *machine.levels[i + 1 :])
    return Machine(levels, machine.device, machine.name)


def stage_blocks(units: int, stages: int) -> tuple[tuple[int, ...], ...]:
    """The blocks of whole units the search gives ``stages`` stages on ``units`` units, each as
    the units of every stage in order (module docstring): equal where ``stages`` divides
    ``units``, else the larger blocks first or last.

    >>> stage_blocks(8, 4)
    ((2, 2, 2, 2),)
    >>> stage_blocks(8, 3)
    ((3, 3, 2), (2, 3, 3))
    """
    if not 1 <= stages <= units:
        raise PipelineError(f"{stages} stage(s) on {units} unit(s): each stage needs a unit")
    small, larger = divmod(units, stages)
    if larger == 0:
        return ((small,) * stages,)
    first = (small + 1,) * larger + (small,) * (stages - larger)
    return (first, first[::-1])


def micro_batch_counts(batch: int, stages: int, *, most: int | None = None) -> tuple[int, ...]:
    """The micro-batch counts tried for ``stages`` stages: ``stages`` times a power of two, and
    the powers of two from ``stages`` on (so that a batch of a power of two can be pipelined
    over any number of stages), dividing ``batch`` and up to ``most`` (default: the batch,
    micro-batches of one sample; with one stage, also 1: no accumulation).

    >>> micro_batch_counts(96, 3)
    (3, 4, 6, 8, 12, 16, 24, 32, 48, 96)
    """
    top = min(batch, batch if most is None else most)
    counts = set()
    for start in (stages, 1 << max(0, stages - 1).bit_length()):
        m = start
        while m <= top:
            if batch % m == 0:
                counts.add(m)
            m *= 2
    return tuple(sorted(counts))


@dataclass(frozen=True)
class _Part:
    """One segment under one strategy, block and micro-batch count: its share of a stage."""

    forward_s: float
    backward_s: float
    sync_s: float
    static_bytes: int  # weights, gradients and optimizer state, per device
    weight_bytes: int  # of which weights
    activation_bytes: int  # one micro-batch's, per device
    exit_s: float = 0.0  # the collectives bringing its exit to one device (the transfer's work)
    #: Its computation alone, per micro-batch: what a stage of it and its neighbours computes
    #: exactly (its collectives on the entry are a segment's own, not a stage's).
    compute_s: float = 0.0


_NO_PART = _Part(math.inf, math.inf, math.inf, 0, 0, 0, compute_s=math.inf)


def _exit_chain(plan: PCG) -> set[str]:
    """The parallel nodes that only bring an output to its returned layout: every consumer of
    theirs, down to the outputs, is one too, and they add nothing up (a gather or a dropped
    copy is the transfer's work; a sum of partial sums, Megatron's row-parallel AllReduce, is
    the stage's)."""
    consumers = plan.consumers()
    outputs = {r.node for r in plan.outputs}
    chain: set[str] = set()
    for n in reversed(plan.nodes):
        if not is_parallel(n) or n.op in _SUMS or plan.input_shapes(n.name)[0].is_partial:
            continue
        readers = {
            c
            for k in range(len(plan.output_shapes(n.name)))
            for c, _ in consumers.get(TensorRef(n.name, k), ())
        }
        if (n.name in outputs or readers) and readers <= chain:
            chain.add(n.name)
    return chain


def _part(cost: CostBreakdown, plan: PCG, micro: int, exit_chain: bool) -> _Part:
    skip = _exit_chain(plan) if exit_chain else set()
    forward = backward = sync = exit_s = 0.0
    for name, c in cost.per_node.items():
        forward += c.forward_s
        backward += c.backward_s
        sync += c.update_s
        if name in skip:
            exit_s += sum(collective.seconds for collective in c.collectives)
            continue
        for collective in c.collectives:
            if collective.purpose == "forward":
                forward += collective.seconds
            elif collective.purpose == "backward":
                backward += collective.seconds
            else:
                sync += collective.seconds
    memory = cost.memory
    return _Part(
        forward / micro,
        backward / micro,
        sync,
        memory.weights + memory.gradients + memory.optimizer_state,
        memory.weights,
        memory.activations,
        exit_s,
        (cost.forward_s + cost.backward_s) / micro,
    )


@dataclass(frozen=True)
class Stage:
    """One stage of a :class:`PipelinePlan`: segments ``first .. last`` of the model (its
    ``nodes``), on ``devices``, running ``strategy``; ``plan`` is its PCG (its entry an input,
    its exit an output), the plan of ``segment`` (its part of the model, :func:`pcgopt.segments.
    segment_pcg`); ``micro_batched`` is that plan cut into the pipeline's micro-batches (Unity's
    Pipeline after its inputs, Batch before what sums over the batch and before its outputs:
    :func:`pcgopt.with_micro_batches`), and ``cost`` its iteration."""

    index: int
    first: int
    last: int
    nodes: tuple[str, ...]
    devices: range
    strategy: str
    times: StageTimes
    memory_bytes: int
    plan: PCG = field(repr=False, compare=False)
    cost: CostBreakdown = field(repr=False, compare=False)
    segment: Segment = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    micro_batched: PCG = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    @property
    def entry(self) -> str | None:
        """The input of :attr:`plan` that the stage before hands on (None for the first)."""
        return (
            None if self.segment is None or self.segment.entry is None else self.segment.entry.node
        )

    def __repr__(self) -> str:
        return (
            f"Stage({self.index}: segments {self.first}-{self.last}, devices "
            f"{self.devices.start}-{self.devices.stop - 1}, {self.strategy}, {self.times})"
        )


@dataclass(frozen=True)
class PipelinePlan:
    """A pipelined plan: ``stages`` in order, ``micro_batches`` per iteration run by
    ``schedule`` (:data:`~pcgopt.extract.costmodel.pipeline.SCHEDULES`). ``time_s``: the
    iteration under the schedule; ``estimate_s``: the closed form the search ranked it by;
    ``memory_bytes``: the most any device holds; ``feasible``: whether that fits."""

    stages: tuple[Stage, ...]
    micro_batches: int
    schedule: str
    time_s: float
    estimate_s: float
    memory_bytes: int
    memory_capacity: int
    machine: str
    #: The model the stages cut, and the optimizer it was costed with (for running it).
    model: PCG = field(repr=False, compare=False, default=None)  # type: ignore[assignment]
    optimizer: str = "adam"

    @property
    def feasible(self) -> bool:
        return self.memory_bytes <= self.memory_capacity

    @property
    def bubble_s(self) -> float:
        """The iteration's time beyond the bottleneck stage's busy time and synchronization."""
        worst = max(s.times.busy_s for s in self.stages)
        return max(
            0.0, self.time_s - self.micro_batches * worst - max(s.times.sync_s for s in self.stages)
        )

    def to_dict(self) -> dict[str, Any]:
        """The schedule and every stage's place, plan and times, as JSON-ready values (each
        stage's PCG as :func:`pcgopt.serialize.pcg_to_dict` writes it, and the input of it that
        the stage before hands on, ``entry``): what :class:`pcgopt.lower.saved.SavedPipeline`
        reads back to run it."""
        return {
            "schedule": self.schedule,
            "micro_batches": self.micro_batches,
            "optimizer": self.optimizer,
            "time_s": self.time_s,
            "estimate_s": self.estimate_s,
            "memory_bytes": self.memory_bytes,
            "feasible": self.feasible,
            "stages": [
                {
                    "segments": [s.first, s.last],
                    "nodes": [s.nodes[0], s.nodes[-1]],
                    "devices": [s.devices.start, s.devices.stop],
                    "entry": s.entry,
                    "strategy": s.strategy,
                    "forward_s": s.times.forward_s,
                    "backward_s": s.times.backward_s,
                    "send_s": s.times.send_s,
                    "sync_s": s.times.sync_s,
                    "memory_bytes": s.memory_bytes,
                    "pcg": pcg_to_dict(s.plan),
                }
                for s in self.stages
            ],
        }

    def to_jax(self, devices: Any = None, **options: Any) -> Any:
        """The pipeline as programs on its stages' devices, run micro-batch by micro-batch
        (:func:`pcgopt.lower.pipelined.lower_pipeline`, which takes the same ``options``; needs
        ``pip install 'pcgopt[jax]'``)."""
        # pcgopt.lower is the layer above this one; it is loaded only when asked for.
        from pcgopt.lower.pipelined import lower_pipeline

        return lower_pipeline(self, devices, **options)

    def explain(self) -> str:
        """The stages, micro-batches and schedule, a line each."""
        gib = 2.0**30
        lines = [
            f"pipeline of {len(self.stages)} stage(s) on {self.machine}, {self.micro_batches} "
            f"micro-batches, schedule {self.schedule}: {self.time_s * 1e3:.2f} ms per iteration "
            f"(closed form {self.estimate_s * 1e3:.2f} ms, bubble {self.bubble_s * 1e3:.2f} ms), "
            f"{self.memory_bytes / gib:.2f} of {self.memory_capacity / gib:.2f} GiB"
            + ("" if self.feasible else " (does not fit)")
        ]
        if self.schedule == "2bw":
            lines.append(
                "  2BW: each micro-batch's backward uses the weights of its forward, one update "
                "old (not the input model's optimizer semantics)"
            )
        for s in self.stages:
            t = s.times
            lines.append(
                f"  stage {s.index}: segments {s.first}-{s.last} ({len(s.nodes)} nodes, "
                f"{s.nodes[0]} .. {s.nodes[-1]}) on devices {s.devices.start}-"
                f"{s.devices.stop - 1}, {s.strategy}: forward {t.forward_s * 1e3:.3f} ms, "
                f"backward {t.backward_s * 1e3:.3f} ms per micro-batch, send "
                f"{t.send_s * 1e3:.3f} ms, sync {t.sync_s * 1e3:.3f} ms; "
                f"{s.memory_bytes / gib:.2f} GiB"
            )
            if s.micro_batched is not None and self.micro_batches > 1:
                lines.append(f"    {_cut_words(s.micro_batched)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.explain()


def _cut_words(cut: PCG) -> str:
    """Where a stage's PCG is cut into micro-batches and gathered back, in words."""
    consumers = cut.consumers()
    outputs = {r.node for r in cut.outputs}
    piped = [n.inputs[0].node for n in cut.nodes if n.op == "pipeline"]
    before: list[str] = []
    for n in cut.nodes:
        if n.op == "batch":
            before += [c for c, _ in consumers.get(n.output(), ()) if cut.node(c).op != "batch"]
            before += ["the output"] if n.name in outputs else []
    return (
        f"Pipeline on {', '.join(piped) or 'nothing'}; Batch before "
        f"{', '.join(dict.fromkeys(before)) or 'nothing'}"
    )


class _OutOfTime(Exception):
    """The pipeline search's time limit passed while it was costing stage plans."""


class _Slower(Exception):
    """Cuts given up while being costed in full: their iteration takes at least ``bound``
    seconds, no less than the time they had to beat."""

    def __init__(self, bound: float):
        super().__init__(bound)
        self.bound = bound


class _Costs:
    """Segment costs, memoized by (segment up to names, strategy, stage units, micro-batches)."""

    def __init__(
        self,
        pcg: PCG,
        machine: Machine,
        segments: Sequence[Segment],
        optimizer: str,
        runtime: Runtime = DDP,
    ):
        self.pcg, self.machine, self.segments, self.optimizer = pcg, machine, segments, optimizer
        # The runtime's precision and ZeRO stage, its tasks one after another: a stage's times.
        self.runtime, self.in_sequence = runtime, replace(runtime, overlap=False, bucket_bytes=0)
        self.own = [segment_pcg(pcg, s) for s in segments]
        canonical_own = [canonical(own) for own in self.own]
        self.keys = [key for key, _ in canonical_own]
        self.backs = [back for _, back in canonical_own]
        # Each distinct segment's number: the memo tables' keys (a PCG as a key is compared
        # node by node on every lookup; BERT-Large on 8 Summit nodes: 4.1 of 21 s).
        first: dict[PCG, int] = {}
        self.ids = [first.setdefault(key, len(first)) for key in self.keys]
        # The layer-wise search's strategies per (segment up to names, units), by canonical
        # name: searched once per distinct segment, not per layer of a deep model.
        self.layer_wise: dict[tuple[int, int], Mapping[str, MatmulStrategy] | None] = {}
        # The e-graph's plans of every segment, per block size (None: none could be made).
        self.egraph: dict[int, SegmentPlans | None] = {}
        self.memo: dict[tuple, _Part] = {}
        # The parts costed, by the plan's nodes: a plan two strategies make is costed once.
        self.by_plan: dict[tuple, _Part] = {}
        self.plans: dict[tuple, PCG | None] = {}
        # No part is costed after this (perf_counter seconds): the search's time limit.
        self.deadline = math.inf
        # The plans a block of so many devices may run.
        self.by_devices: dict[int, dict[str, StageStrategy]] = {}

    def runs(self, devices: int) -> dict[str, StageStrategy]:
        """Every plan a block of ``devices`` devices may run (:func:`stage_strategies`)."""
        if devices not in self.by_devices:
            self.by_devices[devices] = stage_strategies(devices, layer_wise=True, egraph=True)
        return self.by_devices[devices]

    def allowed(self, units: int, asked: Sequence[str] | None) -> list[str]:
        """The stage plans a block of ``units`` may run, of those ``asked`` for (None: the
        default set, all but :data:`LAYER_WISE` and :data:`EGRAPH`, as :func:`pipeline_search`'s
        ``strategies`` says)."""
        found = self.runs(stage_machine(self.machine, units).num_devices)
        if asked is None:
            return [name for name in found if name not in (LAYER_WISE, EGRAPH)]
        return [name for name in found if name in asked]

    def part(self, index: int, strategy: str, units: int, micro: int) -> _Part:
        last = index == len(self.segments) - 1
        key = (self.ids[index], strategy, units, micro, last)
        if key not in self.memo:
            if time.perf_counter() > self.deadline:
                raise _OutOfTime
            # Two strategies may make the same plan (Megatron with and without sequence
            # parallelism on a convolutional segment): it is costed once.
            plan = self.plan(index, strategy, units)
            same = None if plan is None else (plan.nodes, units, micro, last)
            if same in self.by_plan:
                self.memo[key] = self.by_plan[same]
            else:
                self.memo[key] = self._part(index, strategy, units, micro)
                if same is not None:
                    self.by_plan[same] = self.memo[key]
        return self.memo[key]

    def plan(self, index: int, strategy: str, units: int) -> PCG | None:
        """Segment ``index`` under ``strategy`` on a block of ``units`` (None: it cannot be)."""
        key = (self.ids[index], strategy, units, index)
        if key not in self.plans:
            try:
                self.plans[key] = self.stage_plan(self.own[index], strategy, units, (index,))
            except PCGError:
                self.plans[key] = None
        return self.plans[key]

    def stage_plan(self, pcg: PCG, strategy: str, units: int, indices: Sequence[int]) -> PCG:
        """``pcg`` (segments ``indices``: one, or a stage's) under ``strategy`` on a block of
        ``units``. The layer-wise search's plan takes the strategies it found for each segment
        (searched once per distinct segment and block size)."""
        block = stage_machine(self.machine, units)
        if strategy == EGRAPH:
            return self.segment_plans(units).span(indices[0], indices[-1] + 1)
        if strategy != LAYER_WISE:
            return self.runs(block.num_devices)[strategy](pcg, block)
        picks: dict[str, MatmulStrategy] = {}
        for index in indices:
            key = (self.ids[index], units)
            if key not in self.layer_wise:
                if time.perf_counter() > self.deadline:
                    raise _OutOfTime
                try:
                    found = _layer_wise(self.keys[index], block, self.optimizer).strategies
                except PCGError:
                    found = None
                self.layer_wise[key] = found
            found = self.layer_wise[key]
            if found is None:
                raise PipelineError(f"segment {index}: the layer-wise search found no plan")
            back = self.backs[index]
            picks.update((back[name], s) for name, s in found.items())
        return layer_wise_lower(pcg, block, picks)

    def segment_plans(self, units: int) -> SegmentPlans:
        """The e-graph's plans of every segment on a block of ``units`` (searched once per
        block size, within the search's time limit). Raises :class:`PipelineError` if they
        could not be made."""
        if units not in self.egraph:
            left = self.deadline - time.perf_counter()
            if left <= 0:
                raise _OutOfTime
            block = stage_machine(self.machine, units)
            try:
                found: SegmentPlans | None = _segment_plans(
                    self.pcg, block, self.segments, self.optimizer, left
                )
            except PCGError:
                found = None
            self.egraph[units] = found
        found = self.egraph[units]
        if found is None:
            raise PipelineError(f"the e-graph found no stage plans on blocks of {units} unit(s)")
        return found

    def _part(self, index: int, strategy: str, units: int, micro: int) -> _Part:
        block = stage_machine(self.machine, units)
        seg = self.segments[index]
        plan = self.plan(index, strategy, units)
        if plan is None:
            return _NO_PART
        try:
            # The dynamic program's estimate: gradient accumulation over ``micro`` (the cost
            # model's, without cutting the PCG); a stage is costed cut (:func:`_assemble`).
            cost = self.cost(plan, block, seg, self.in_sequence, micro_batches=micro)
        except PCGError:
            return _NO_PART
        return _part(cost, plan, micro, seg.exit is not None)

    def cost(
        self,
        plan: PCG,
        block: Machine,
        segment: Segment,
        runtime: Runtime,
        micro_batches: int = 1,
    ) -> CostBreakdown:
        """``plan`` of ``segment`` (or of a stage's segments) on ``block`` under ``runtime``,
        its entry's gradient computed; ``micro_batches``: as :func:`iteration_cost`'s (1 for a
        plan cut into micro-batches itself: :func:`pcgopt.with_micro_batches`)."""
        return iteration_cost(
            plan,
            block,
            optimizer=self.optimizer,
            micro_batches=micro_batches,
            runtime=runtime,
            grad_inputs=() if segment.entry is None else (segment.entry.node,),
        )

    def send_s(self, index: int, units: int, micro: int) -> float:
        """Segment ``index``'s exit, one micro-batch of it, to the next stage's block."""
        seg = self.segments[index]
        if seg.exit is None:
            return 0.0
        _, level = _stage_level(self.machine)
        nbytes = self.pcg.shape(seg.exit).nbytes / micro
        return level.link.latency_s + nbytes / (units * level.link.bandwidth_Bps)


def _best_cuts(
    busy: np.ndarray, send: np.ndarray, stages: int, micro: int, schedule: str = "1f1b"
) -> tuple[float, list[tuple[int, int, int]]] | None:
    """The dynamic program (module docstring). ``busy[r][i, j]``: the least ``F + B`` of a stage of
    segments ``i .. j-1`` that is stage ``r`` from the end (1-based) and fits (inf if none);
    ``send[r, j]``: both transfers after segment ``j - 1`` when stage ``r`` ends there. The
    objective: 1F1B's closed form without the synchronization, or for ``"2bw"`` its steady state,
    ``M`` times the bottleneck (the sum only breaks ties). Returns the objective and the stages as
    ``(first, stop, r)``, or None when no cut fits."""
    n = busy.shape[1] - 1

    def solve(bound: float) -> tuple[float, list[tuple[int, int, int]]] | None:
        f = np.full((stages + 1, n + 1), math.inf)
        choice = np.zeros((stages + 1, n + 1), dtype=int)
        f[0, n] = 0.0
        for r in range(1, stages + 1):
            c = np.where(busy[r] <= bound, busy[r] + send[r][None, :], math.inf)
            total = c + f[r - 1][None, :]
            choice[r] = np.argmin(total, axis=1)
            f[r] = total[np.arange(n + 1), choice[r]]
        if not math.isfinite(f[stages, 0]):
            return None  # no cut keeps every stage within this bound
        cuts, i = [], 0
        for r in range(stages, 0, -1):
            j = int(choice[r, i])
            cuts.append((i, j, r))
            i = j
        return float(f[stages, 0]), cuts

    return _least_over_bounds(np.unique(busy[np.isfinite(busy)]), solve, micro, schedule)


def _objective_weights(schedule: str, micro: int) -> tuple[float, float]:
    """The dynamic program's objective as ``summed * sum + weight * bottleneck`` (module
    docstring): 1F1B's closed form, or 2BW's steady state (the sum only breaks ties)."""
    return (0.0, micro) if schedule == "2bw" else (1.0, micro - 1)


def _least_over_bounds(
    bounds: np.ndarray,
    solve: Callable[[float], tuple[float, Any] | None],
    micro: int,
    schedule: str,
) -> tuple[float, Any] | None:
    """Alpa's loop over the bound ``T`` on every stage's ``F + B`` (module docstring): the least
    ``summed * sum + weight * T`` over the sorted ``bounds``, where ``solve(T)`` gives the least
    sum with every stage within ``T`` and what achieves it (None: no stage set within ``T``).
    A larger bound allows more, so the least bound that can be met is found by bisection; the
    loop stops once ``weight * T`` alone reaches the best found. Returns the objective and what
    ``solve`` returned with it, or None."""
    summed, weight = _objective_weights(schedule, micro)
    loosest = solve(float(bounds[-1])) if len(bounds) else None
    if loosest is None:
        return None
    if weight == 0:  # the sum alone: the loosest bound allows every choice
        return summed * loosest[0], loosest[1]
    lo, hi = 0, len(bounds) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if solve(float(bounds[mid])) is None:
            lo = mid + 1
        else:
            hi = mid
    best: tuple[float, Any] | None = None
    for bound in bounds[lo:]:
        if best is not None and weight * bound >= best[0]:
            break  # every later bound costs more in its last term alone
        found = solve(float(bound))
        if found is None:
            continue
        value = summed * found[0] + weight * float(bound)
        if math.isfinite(value) and (best is None or value < best[0]):
            best = (float(value), found[1])
    return best


def _best_free_cuts(
    busy: np.ndarray,
    send: np.ndarray,
    sizes: Sequence[int],
    units: int,
    stages: int,
    micro: int,
    schedule: str = "1f1b",
) -> tuple[float, tuple[list[tuple[int, int, int]], list[int]]] | None:
    """:func:`_best_cuts` with each stage's block chosen too, as Alpa's inter-operator pass
    chooses its submeshes: ``busy[k][r][i, j]`` and ``send[k][r, j]`` as there for a block of
    ``sizes[k]`` units; the blocks take all ``units``. Returns the objective and the stages
    ``(first, stop, r)`` with their blocks in order, or None when none fits."""
    n = busy.shape[-1] - 1

    def solve(bound: float) -> tuple[float, tuple[list[tuple[int, int, int]], list[int]]] | None:
        # f[r][i, u]: the least sum of the last r stages, from segment i on, on u units.
        f = np.full((stages + 1, n + 1, units + 1), math.inf)
        f[0, n, 0] = 0.0
        pick_j = np.zeros((stages + 1, n + 1, units + 1), dtype=int)
        pick_k = np.zeros((stages + 1, n + 1, units + 1), dtype=int)
        for r in range(1, stages + 1):
            least = np.full((n + 1, units + 1), math.inf)
            for k, b in enumerate(sizes):
                if b > units:
                    continue  # no room for it
                c = np.where(busy[k, r] <= bound, busy[k, r] + send[k, r][None, :], math.inf)
                after = np.full((n + 1, units + 1), math.inf)  # after[j, u]: f[r-1][j, u - b]
                after[:, b:] = f[r - 1][:, : units + 1 - b]
                total = c[:, :, None] + after[None, :, :]  # [i, j, u]
                j = np.argmin(total, axis=1)
                value = np.take_along_axis(total, j[:, None, :], axis=1)[:, 0, :]
                better = value < least
                least = np.where(better, value, least)
                pick_j[r] = np.where(better, j, pick_j[r])
                pick_k[r] = np.where(better, k, pick_k[r])
            f[r] = least
        if not math.isfinite(f[stages, 0, units]):
            return None
        cuts, blocks, i, u = [], [], 0, units
        for r in range(stages, 0, -1):
            j, k = int(pick_j[r, i, u]), int(pick_k[r, i, u])
            cuts.append((i, j, r))
            blocks.append(int(sizes[k]))
            i, u = j, u - int(sizes[k])
        return float(f[stages, 0, units]), (cuts, blocks)

    return _least_over_bounds(np.unique(busy[np.isfinite(busy)]), solve, micro, schedule)


def pipeline_search(
    pcg: PCG,
    machine: Machine,
    *,
    stage_counts: Sequence[int] | None = None,
    micro_batches: Sequence[int] | None = None,
    schedule: str = "1f1b",
    optimizer: str = "adam",
    min_ops: int | None = None,
    strategies: Sequence[str] | None = None,
    runtime: Runtime = DDP,
    time_budget_s: float | None = None,
    min_stages: int = 1,
    faster_than_s: float | None = None,
    blocks: str = "balanced",
) -> PipelinePlan:
    """The fastest pipelined plan of ``pcg`` on ``machine`` that fits (module docstring), or,
    when none fits, the one that needs the least memory.

    ``stage_counts``: the stage counts tried (default: every count from ``min_stages`` up to the
    stage level's units and the segments; a count that does not divide the units gives blocks of two
    sizes, :func:`stage_blocks`); ``micro_batches``: the micro-batch counts tried (default:
    :func:`micro_batch_counts` per stage count); ``schedule``: ``"1f1b"`` (synchronous, the input
    model's semantics) or ``"2bw"``; ``min_ops``: the segments' least computing operators
    (:func:`~pcgopt.segments.split_segments`' default: about one transformer layer);
    ``strategies``: the stage plans allowed, by :func:`stage_strategies` name (default: all
    but :data:`LAYER_WISE`, the layer-wise search's plan, which costs a coordinate descent per
    distinct segment and block size, and :data:`EGRAPH`, the e-graph's, which costs a
    saturation per block size: name them to add them; a single name gives every stage that
    plan, as Megatron-LM's hand-set degrees do);
    ``runtime``: how a stage overlaps its synchronization with its last backward (module
    docstring; default PyTorch DDP's); ``time_budget_s``: stop trying stage and micro-batch
    counts (equal blocks first, and about four micro-batches per stage first) and costing
    stage plans and candidates
    once this much time has passed (None: no limit); what is found by then is returned (the
    best cuts found are always costed in full), and if no cuts were, a :class:`PipelineError`
    says the time ran out; ``min_stages``: the
    fewest stages tried when ``stage_counts`` is not given (2: pipelines only, not the plans
    as one stage); ``faster_than_s``: only plans that fit and take less than this many seconds
    per iteration are returned, and only those whose lower bound (the bottleneck stage's
    computation) is under it are costed in full (a caller with a plan that fits has no use for
    slower ones); ``blocks``: ``"balanced"`` (:func:`stage_blocks`) or ``"free"``: also let the
    dynamic program choose each stage's block, of any size :func:`free_block_sizes` allows,
    as Alpa's inter-operator pass does, for the :data:`FREE_BLOCKS_REFINED` best stage and
    micro-batch counts on balanced blocks (more plans costed: more block sizes; tried after
    the balanced ones).
    Raises :class:`~pcgopt.extract.costmodel.pipeline.PipelineError` when nothing can be
    scheduled (one device, no batch split that fits the counts), when no plan can be faster
    than ``faster_than_s``, or when micro-batches would change what the model computes
    (checked before the search when every stage count tried is above 1, else on the plan
    found)."""
    _check_options(schedule, optimizer, min_stages, time_budget_s, faster_than_s, strategies)
    # The time limit counts from the call: the micro-batch check and the segments' set-up
    # take seconds on a large model.
    deadline = math.inf if time_budget_s is None else time.perf_counter() + time_budget_s
    if blocks not in BLOCKS:
        raise PipelineError(f"blocks must be one of {', '.join(BLOCKS)}, got {blocks!r}")
    stage_counts = _positive_ints(stage_counts, "stage_counts")
    micro_batches = _positive_ints(micro_batches, "micro_batches")
    segments = split_segments(pcg) if min_ops is None else split_segments(pcg, min_ops)
    _, level = _stage_level(machine)
    counts = _stage_counts(level, len(segments), min_stages, stage_counts)
    if strategies is not None:
        _check_stage_plan_names(strategies, machine)
    # Every plan of several stages runs micro-batches: a model they would change is refused
    # before the search, not after it.
    checked = min(counts) > 1
    if checked:
        _check_micro_batches(pcg)
    batch = batch_size(pcg)
    tried = _candidates(counts, batch, micro_batches, level.count, free=blocks == "free")
    costs = _Costs(pcg, machine, segments, optimizer, runtime)
    costs.deadline = deadline
    beat = math.inf if faster_than_s is None else float(faster_than_s)
    capacity = machine.device.memory_bytes
    ranked, pruned = _ranked_cuts(costs, tried, strategies, schedule, capacity, beat)
    if ranked is None:
        raise PipelineError(
            f"the time limit ({time_budget_s:.3g} s) ran out before a pipelined plan was costed"
        )
    found, given_up = _costed_in_full(costs, ranked, schedule, deadline, beat)
    if (ranked or math.isfinite(pruned)) and faster_than_s is not None:
        found = _faster_than(found, ranked, beat, given_up, pruned)
    if not found:
        raise _nothing_costed(machine, strategies, counts, tried, batch)
    fitting = [p for p in found if p.feasible]
    chosen = (
        min(fitting, key=lambda p: p.time_s)
        if fitting
        else min(found, key=lambda p: p.memory_bytes)
    )
    if not checked and (chosen.micro_batches > 1 or len(chosen.stages) > 1):
        _check_micro_batches(pcg)
    return chosen


def _check_options(
    schedule: str,
    optimizer: str,
    min_stages: int,
    time_budget_s: float | None,
    faster_than_s: float | None,
    strategies: Sequence[str] | None,
) -> None:
    """Raises :class:`PipelineError` naming the first of :func:`pipeline_search`'s options
    that is not valid."""
    if schedule not in SCHEDULES:
        raise PipelineError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if optimizer not in OPTIMIZERS:
        raise PipelineError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if isinstance(min_stages, bool) or not isinstance(min_stages, Integral) or min_stages < 1:
        raise PipelineError(f"min_stages must be a positive integer, got {min_stages!r}")
    if time_budget_s is not None and not _is_seconds(time_budget_s, lambda t: 0 <= t < math.inf):
        raise PipelineError(
            f"time_budget_s must be a finite number of seconds >= 0 or None, got {time_budget_s!r}"
        )
    if faster_than_s is not None and not _is_seconds(faster_than_s, lambda t: t > 0):
        raise PipelineError(
            f"faster_than_s must be a number of seconds > 0 or None, got {faster_than_s!r}"
        )
    if strategies is not None and (isinstance(strategies, str) or not strategies):
        raise PipelineError(
            f"strategies must be a non-empty sequence of stage plan names, got {strategies!r}"
        )


def _stage_counts(
    level: Any, segments: int, min_stages: int, asked: Sequence[int] | None
) -> list[int]:
    """The stage counts to try: ``asked``, or every count from ``min_stages`` on; each at most
    the stage level's units and the ``segments`` (a clear error otherwise)."""
    most = min(level.count, segments)
    if asked is not None:
        bad = [s for s in asked if s > most]
        if bad:
            raise PipelineError(
                f"stage count(s) {bad} not possible: each stage takes at least one of the "
                f"{level.count} {level.name}s and one of the {segments} segment(s); "
                f"possible: 1 to {most}"
            )
        return list(asked)
    counts = list(range(min_stages, most + 1))
    if not counts:
        raise PipelineError(
            f"no stage count of at least {min_stages} is possible: each stage takes at least "
            f"one of the {level.count} {level.name}s and one of the {segments} "
            f"segment(s); possible: 1 to {most}"
        )
    return counts


def _check_stage_plan_names(strategies: Sequence[str], machine: Machine) -> None:
    """Raises :class:`PipelineError` naming the stage plans no block of ``machine`` runs."""
    _, level = _stage_level(machine)
    # Any block's: a stage of 3 of 8 nodes runs tensor degrees that do not divide 8.
    per_unit = machine.num_devices // level.count
    known = {
        name: None
        for units in range(1, level.count + 1)
        for name in stage_strategies(units * per_unit, layer_wise=True, egraph=True)
    }
    unknown = [name for name in strategies if name not in known]
    if unknown:
        raise PipelineError(f"unknown stage plan(s) {unknown}; on this machine: {', '.join(known)}")


def _candidates(
    counts: Sequence[int],
    batch: int,
    micro_batches: Sequence[int] | None,
    units: int,
    free: bool = False,
) -> list[tuple[int, int, tuple[int, ...] | FreeBlocks]]:
    """Every (stage count, micro-batch count, blocks) to search, the likeliest first (what a
    time limit reaches): equal blocks before blocks of two sizes, and those before blocks the
    search chooses (``free``: :class:`FreeBlocks` of every stage count above 1), every stage
    count at about :data:`TYPICAL_MICRO_BATCHES_PER_STAGE` micro-batches per stage (a bubble
    of about a fifth), then further from it."""
    tried: list[tuple[int, int, tuple[int, ...] | FreeBlocks]] = []
    for count in counts:
        orders: list[tuple[int, ...] | FreeBlocks] = list(stage_blocks(units, count))
        if free and count > 1:
            orders.append(FreeBlocks(count, free_block_sizes(units, count)))
        micros = micro_batch_counts(batch, count) if micro_batches is None else micro_batches
        tried += [(count, micro, blocks) for micro in micros for blocks in orders]

    def kind(blocks: tuple[int, ...] | FreeBlocks) -> int:
        return 2 if isinstance(blocks, FreeBlocks) else int(len(set(blocks)) > 1)

    tried.sort(
        key=lambda t: (
            kind(t[2]),
            abs(math.log2(t[1] / (TYPICAL_MICRO_BATCHES_PER_STAGE * t[0]))),
            t[0],
            t[1],
            () if isinstance(t[2], FreeBlocks) else t[2],
        )
    )
    return tried


def _nothing_costed(
    machine: Machine,
    strategies: Sequence[str] | None,
    counts: Sequence[int],
    tried: Sequence[tuple[int, int, tuple[int, ...] | FreeBlocks]],
    batch: int,
) -> PipelineError:
    """Why no candidate could be costed, naming the stage counts no micro-batch count fits."""
    allowed = "" if strategies is None else f" with stage plans {list(strategies)}"
    tried_counts = {t[0] for t in tried}
    unbatched = [c for c in counts if c not in tried_counts]
    why = (
        f"; no micro-batch count for {unbatched} stage(s) divides the batch of {batch} "
        "(the stages times a power of two, or a power of two from the stages on)"
        if unbatched
        else ""
    )
    return PipelineError(
        f"no pipelined plan of the model on {machine.name!r}{allowed}: no stage count, "
        "micro-batch count and stage plan could be costed (the batch must divide by the "
        "micro-batches and each stage's data-parallel degree, and a stage plan must fit its "
        f"block){why}"
    )


def _is_seconds(value: object, in_range: Callable[[float], bool]) -> bool:
    """Whether ``value`` is a number (not a bool) of seconds that ``in_range`` accepts."""
    return not isinstance(value, bool) and isinstance(value, Real) and in_range(float(value))


def _ranked_cuts(
    costs: _Costs,
    tried: Sequence[tuple[int, int, tuple[int, ...] | FreeBlocks]],
    strategies: Sequence[str] | None,
    schedule: str,
    capacity: int,
    beat: float = math.inf,
) -> tuple[list[tuple] | None, float]:
    """The best cuts (:func:`_search_one`) of each stage count, micro-batch count and blocks of
    ``tried`` (:func:`stage_blocks`), in their order, each with its blocks, micro-batches and
    stage plan names; those found before the costs' deadline, or None if it passed before any
    was. A stage count and blocks whose every pipeline takes at least ``beat`` seconds
    (:func:`_least_bottleneck`) are given up before their cuts are searched at any
    micro-batch count; also returned: the least bound of those given up (inf if none was)."""
    ranked: list[tuple] = []
    # The least objective of each (stage count, micro-batch count) on balanced blocks: free
    # blocks (tried last) refine only the FREE_BLOCKS_REFINED best of them.
    balanced: dict[tuple[int, int], float] = {}
    refined: set[tuple[int, int]] | None = None
    bottleneck: dict[tuple, float] = {}
    pruned = math.inf
    for count, micro, blocks in tried:
        free = isinstance(blocks, FreeBlocks)
        if free:
            if refined is None:
                best = sorted(balanced, key=balanced.__getitem__)[:FREE_BLOCKS_REFINED]
                refined = set(best)
            if (count, micro) not in refined:
                if len(refined) >= FREE_BLOCKS_REFINED:
                    continue
                refined.add((count, micro))  # too few balanced results: the likeliest next
        sizes = blocks.sizes if free else blocks
        names = list(dict.fromkeys(name for u in sizes for name in costs.allowed(u, strategies)))
        if not names:
            continue
        try:
            if math.isfinite(beat):
                if blocks not in bottleneck:
                    bottleneck[blocks] = _least_bottleneck(costs, names, blocks)
                if bottleneck[blocks] >= beat:
                    pruned = min(pruned, bottleneck[blocks])
                    continue
            found_cuts = _search_one(costs, names, blocks, micro, schedule, capacity)
        except _OutOfTime:
            return ranked or None, pruned
        if found_cuts is not None:
            objective, cuts, which, bound, chosen = found_cuts
            ranked.append((objective, cuts, which, bound, chosen, micro, names))
            if not free:
                key = (count, micro)
                balanced[key] = min(balanced.get(key, math.inf), objective)
    return ranked, pruned


def _costed_in_full(
    costs: _Costs, ranked: Sequence[tuple], schedule: str, deadline: float, beat: float
) -> tuple[list[PipelinePlan], float]:
    """The ranked cuts costed in full in the order of their estimates, each unless its lower
    bound (the bottleneck stage's work and the way to it and back) is already over the best
    full cost (or ``beat``), or reaches it while its stages are costed (:func:`_assemble`);
    the first is costed however late (one step), the others until ``deadline``. Also the
    least lower bound of those given up while costed (inf if none was)."""
    found: list[PipelinePlan] = []
    given_up = math.inf
    for _, cuts, which, bound, blocks, micro, names in sorted(ranked, key=lambda r: r[0]):
        best = min((p.time_s for p in found if p.feasible), default=beat)
        if bound >= best:
            continue
        if found and time.perf_counter() > deadline:
            break
        try:
            plan = _assemble(costs, names, cuts, blocks, micro, schedule, which, best)
        except _Slower as slower:
            given_up = min(given_up, slower.bound)
            continue
        if plan is not None:
            found.append(plan)
    return found, given_up


def _faster_than(
    found: list[PipelinePlan],
    ranked: Sequence[tuple],
    beat: float,
    given_up: float,
    pruned: float = math.inf,
) -> list[PipelinePlan]:
    """The plans of ``found`` that fit and take less than ``beat`` seconds; raises
    :class:`PipelineError`, saying why, if none does (``given_up``: the least lower bound of
    the cuts given up while costed in full; ``pruned``: of the stage counts and blocks given
    up before their cuts were searched, :func:`_least_bottleneck`)."""
    faster = [p for p in found if p.feasible and p.time_s < beat]
    if faster:
        return faster
    fastest = min((p.time_s for p in found if p.feasible), default=math.inf)
    if math.isfinite(fastest) and given_up >= fastest:
        why = f"the fastest takes {fastest * 1e3:.4g} ms"
    elif math.isfinite(fastest):
        why = (
            f"the fastest costed in full takes {fastest * 1e3:.4g} ms, the others at least "
            f"{given_up * 1e3:.4g} ms"
        )
    elif found:
        why = "none of those costed fits"
    elif math.isfinite(given_up):
        why = f"each one costed takes at least {given_up * 1e3:.4g} ms"
    elif all(r[3] >= beat for r in ranked):
        least = min([r[3] for r in ranked] + [pruned])
        why = f"the bottleneck stage's computation alone takes at least {least * 1e3:.4g} ms"
    else:
        why = "no stage plan of the cuts tried could be costed"
    raise PipelineError(
        f"no pipelined plan that fits is faster than {beat * 1e3:.4g} ms per iteration: {why}"
    )


def _positive_ints(values: Sequence[int] | None, what: str) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise PipelineError(f"{what} must be a non-empty sequence of integers, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, Integral) or v < 1:
            raise PipelineError(f"{what} must hold positive integers, got {v!r}")
    return [int(v) for v in values]


def _check_micro_batches(pcg: PCG) -> None:
    """Refuses a model that micro-batches would change (:func:`pcgopt.scaled.
    micro_batch_difference`)."""
    try:
        why = micro_batch_difference(pcg)
    except ScaleDownError as err:
        why = f"no instance small enough to check it could be split in two ({err})"
    if why is not None:
        raise PipelineError(f"the model cannot run as micro-batches: {why}")


@dataclass(frozen=True)
class FreeBlocks:
    """Blocks the search chooses itself (Alpa's submeshes): ``stages`` blocks of ``sizes``
    units each, taking all the stage level's units (:func:`free_block_sizes`)."""

    stages: int
    sizes: tuple[int, ...]

    def __repr__(self) -> str:
        return f"FreeBlocks({self.stages} stages of {', '.join(map(str, self.sizes))} units)"


#: With free blocks, the (stage count, micro-batch count) pairs whose blocks the dynamic program
#: chooses: the best of them on balanced blocks (its work grows with the units and the block
#: sizes: AutoDDL's deep Transformer on 64 nodes took minutes for all of them).
FREE_BLOCKS_REFINED = 4

#: Up to this many units, a free block may take any number of them (:func:`free_block_sizes`).
FREE_SIZES_ALL_UP_TO = 16


def free_block_sizes(units: int, stages: int) -> tuple[int, ...]:
    """The block sizes a stage may get when the search chooses the blocks (``blocks="free"``),
    for ``stages`` stages on ``units`` units: every size on up to :data:`FREE_SIZES_ALL_UP_TO`
    units; on more, the sizes balanced blocks of some stage count take (``floor(units / s)``
    and one more) and the powers of two, which keeps the dynamic program's work down. Each
    leaves a unit to every other stage.

    >>> free_block_sizes(8, 3)
    (1, 2, 3, 4, 5, 6)
    >>> free_block_sizes(64, 30)
    (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 21, 22, 32, 33)
    """
    most = units - stages + 1
    if units <= FREE_SIZES_ALL_UP_TO:
        return tuple(range(1, most + 1))
    sizes = {q + extra for s in range(1, units + 1) for q in (units // s,) for extra in (0, 1)}
    sizes |= {1 << k for k in range(units.bit_length())}
    return tuple(sorted(b for b in sizes if 1 <= b <= most))


def _spans(values: list[list[float]], n: int) -> np.ndarray:
    """``[k, i, j]``: strategy ``k``'s sum of ``values[k]`` over segments ``i .. j-1`` of ``n``
    (inf when j <= i)."""
    # Finite values and impossible segments (inf) summed apart: one impossible segment rules
    # out the spans that hold it, not every later one.
    array = np.asarray(values, dtype=float)
    impossible = ~np.isfinite(array)
    zeros = np.zeros((len(values), 1))
    ends = np.concatenate([zeros, np.cumsum(np.where(impossible, 0.0, array), axis=1)], 1)
    bad = np.concatenate([zeros, np.cumsum(impossible, axis=1)], axis=1)
    out = ends[:, None, :] - ends[:, :, None]
    held_bad = bad[:, None, :] - bad[:, :, None]
    upper = np.triu(np.ones((n + 1, n + 1), dtype=bool), k=1)
    return np.where(upper[None] & (held_bad == 0), out, math.inf)


def _part_rows(costs: _Costs, names: Sequence[str], units: int, micro: int) -> list[list[_Part]]:
    """Every segment's part under each of ``names`` on a block of ``units`` (:data:`_NO_PART`
    under a plan the block cannot run), a row per name."""
    runs = set(costs.allowed(units, names))
    n = len(costs.segments)
    return [
        [costs.part(i, name, units, micro) if name in runs else _NO_PART for i in range(n)]
        for name in names
    ]


def _least_bottleneck(
    costs: _Costs, names: Sequence[str], blocks: Sequence[int] | FreeBlocks
) -> float:
    """A lower bound of the iteration of every pipeline on ``blocks`` (any cuts, stage plans
    of ``names``, micro-batch count): the least, over the cuts, of the bottleneck stage's
    computation of the whole batch at once. ``M`` micro-batches each compute at least a
    ``1/M`` share of it (an operator's time grows no slower than its batch shrinks), one
    after the other on the stage's devices; memory is left out (it only rules plans out)."""
    n = len(costs.segments)
    free = isinstance(blocks, FreeBlocks)
    count = blocks.stages if free else len(blocks)
    sizes = blocks.sizes if free else tuple(dict.fromkeys(blocks))
    least: dict[int, np.ndarray] = {}
    for units in sizes:
        rows = [[p.compute_s for p in row] for row in _part_rows(costs, names, units, 1)]
        least[units] = np.min(_spans(rows, n), axis=0)
    if free:
        busy = np.stack([np.broadcast_to(least[b], (count + 1, n + 1, n + 1)) for b in sizes])
        found = _best_free_cuts(
            busy,
            np.zeros((len(sizes), count + 1, n + 1)),
            sizes,
            _stage_level(costs.machine)[1].count,
            count,
            1,
            "2bw",
        )
    else:
        busy = np.stack(
            [least[blocks[0]]] + [least[blocks[count - r]] for r in range(1, count + 1)]
        )
        found = _best_cuts(busy, np.zeros((count + 1, n + 1)), count, 1, "2bw")
    return math.inf if found is None else found[0]


def _search_one(
    costs: _Costs,
    names: Sequence[str],
    blocks: Sequence[int] | FreeBlocks,
    micro: int,
    schedule: str,
    capacity: int,
) -> tuple[float, list[tuple[int, int, int]], np.ndarray, float, tuple[int, ...]] | None:
    """The best cuts for stages on ``blocks`` (the units of each, in order, or
    :class:`FreeBlocks` for the search to choose) and ``micro`` micro-batches, each stage under
    one of ``names`` its block can run: the dynamic program's objective, the stages
    (:func:`_best_cuts`), each stage's strategy by ``[r, first, stop]`` (an index into
    ``names``), a lower bound of their time under the schedule, and the blocks."""
    n = len(costs.segments)
    free = isinstance(blocks, FreeBlocks)
    count = blocks.stages if free else len(blocks)
    sizes = blocks.sizes if free else tuple(dict.fromkeys(blocks))
    versions = 2 if schedule == "2bw" else 1

    spans = partial(_spans, n=n)

    # Per block size: every strategy's spans (a strategy the block cannot run is impossible).
    spanned: dict[int, tuple[np.ndarray, ...]] = {}
    for units in sizes:
        parts = _part_rows(costs, names, units, micro)
        spanned[units] = (
            spans([[p.forward_s + p.backward_s for p in row] for row in parts]),
            spans([[p.compute_s for p in row] for row in parts]),
            spans(
                [[p.static_bytes + (versions - 1) * p.weight_bytes for p in row] for row in parts]
            ),
            spans([[p.activation_bytes for p in row] for row in parts]),
        )

    def transfers(units_of: Callable[[int], int]) -> np.ndarray:
        """``[r, j]``: both transfers after segment j - 1 when stage r (from the end) ends
        there, over ``units_of(r)`` units."""
        send = np.zeros((count + 1, n + 1))
        for r in range(2, count + 1):
            units = units_of(r)
            for j in range(1, n):
                send[r, j] = 2 * costs.send_s(j - 1, units, micro)
        return send

    def least(units: int, limit: float) -> tuple[np.ndarray, np.ndarray]:
        """Per stage position r: the least ``F + B`` of each span on ``units`` that fits
        ``limit`` (inf if none), and the strategy that gives it."""
        busy = np.full((count + 1, n + 1, n + 1), math.inf)
        which = np.full((count + 1, n + 1, n + 1), -1, dtype=int)
        times, _, static, held = spanned[units]
        for r in range(1, count + 1):
            fits = static + min(r, micro) * held <= limit
            ranked = np.where(fits, times, math.inf)
            which[r] = np.argmin(ranked, axis=0)
            busy[r] = np.min(ranked, axis=0)
        return busy, which

    if free:
        # The dynamic program prices each transfer over the sending block (the plan is costed
        # over the smaller of the two): at most the transfer's time, so the bound stays one.
        sends = {b: transfers(lambda r, b=b: b) for b in sizes}
    else:
        # Over the smaller of its block and the next one's.
        fixed_send = transfers(lambda r: min(blocks[count - r], blocks[count - r + 1]))
    # The cuts that fit; when none does, the fastest regardless of memory (a plan that does
    # not fit), so that the caller can say what is missing.
    for limit in (capacity, math.inf):
        per_size = {b: least(b, limit) for b in sizes}
        if free:
            busy = np.stack([per_size[b][0] for b in sizes])
            send = np.stack([sends[b] for b in sizes])
            units = _stage_level(costs.machine)[1].count
            found = _best_free_cuts(busy, send, sizes, units, count, micro, schedule)
            best = None if found is None else (found[0], *found[1])
        else:
            busy = np.full((count + 1, n + 1, n + 1), math.inf)
            for r in range(1, count + 1):
                busy[r] = per_size[blocks[count - r]][0][r]
            found = _best_cuts(busy, fixed_send, count, micro, schedule)
            best = None if found is None else (found[0], found[1], list(blocks))
        if best is not None:
            break
    if best is None:
        return None
    objective, cuts, chosen_blocks = best
    chosen_blocks = tuple(chosen_blocks)
    which = np.full((count + 1, n + 1, n + 1), -1, dtype=int)
    for s, (i, j, r) in enumerate(cuts):
        which[r, i, j] = per_size[chosen_blocks[s]][1][r, i, j]
    # A lower bound of the schedule's time with these stages: the bottleneck stage's
    # computation, and (1F1B) the way of the first micro-batch to it and of the last one back
    # (computation alone: the segments' sums of their collectives are not the stage's).
    stage_busy = [
        float(spanned[chosen_blocks[s]][1][which[r, i, j], i, j])
        for s, (i, j, r) in enumerate(cuts)
    ]
    sends_each = [
        costs.send_s(j - 1, min(chosen_blocks[s], chosen_blocks[s + 1]), micro)
        if s < count - 1
        else 0.0
        for s, (_, j, _) in enumerate(cuts)
    ]
    if free:  # the objective with each transfer over the smaller block
        times = [float(per_size[chosen_blocks[s]][0][r, i, j]) for s, (i, j, r) in enumerate(cuts)]
        summed, weight = _objective_weights(schedule, micro)
        objective = summed * (sum(times) + 2 * sum(sends_each)) + weight * max(times)
    bound = _time_bound(stage_busy, sends_each, micro, schedule)
    return objective, cuts, which, bound, chosen_blocks


def _time_bound(
    busy: Sequence[float],
    sends: Sequence[float],
    micro: int,
    schedule: str,
    syncs: Sequence[float] | None = None,
    forwards: Sequence[float] | None = None,
) -> float:
    """A lower bound of the iteration of stages whose ``F + B`` per micro-batch is at least
    ``busy`` (``F`` at least ``forwards``, default 0), whose transfer to the next stage takes
    ``sends`` each way, and whose synchronization after their last backward takes at least
    ``syncs`` (default 0): under 2BW each stage's ``M`` micro-batches and synchronization;
    under 1F1B the first stage's last backward comes after the first micro-batch's way to any
    stage, that stage's ``M`` micro-batches and the last one's way back, and any stage's own
    synchronization after its ``M`` micro-batches and the first one's way to it."""
    syncs = [0.0] * len(busy) if syncs is None else syncs
    forwards = [0.0] * len(busy) if forwards is None else forwards
    if schedule == "2bw":
        return max(micro * b + sync for b, sync in zip(busy, syncs, strict=True))
    own = back = there_and_back = down = 0.0
    for b, send, sync, f in zip(busy, sends, syncs, forwards, strict=True):
        back = max(back, there_and_back + micro * b)
        own = max(own, down + micro * b + sync)
        there_and_back += b + 2 * send
        down += f + send
    return max(own, back + syncs[0])


def _tied_weights(
    costs: Sequence[CostBreakdown], devices: Sequence[range], machine: Machine
) -> list[float]:
    """The seconds each stage's synchronization gains from the weights several stages read (a
    tied embedding: the lookup in the first, the logits in the last), given each stage's
    ``costs`` and ``devices``. Each such stage has a copy; their gradients are summed across
    the stages once per iteration, as Megatron-LM does, by an AllReduce between the devices of
    the stages at the same rank, added to the synchronization of every stage that takes part."""
    holders: dict[str, list[int]] = {}
    for i, cost in enumerate(costs):
        for name, node in cost.per_node.items():
            if node.op == "weight" and node.weight_memory[1]:  # trainable: has a gradient
                holders.setdefault(name, []).append(i)
    extra = [0.0] * len(costs)
    for name, held in holders.items():
        if len(held) < 2:
            continue
        nbytes = max(costs[i].per_node[name].weight_memory[1] for i in held)
        # The devices at the same rank of each block (of the smallest block's ranks; a larger
        # block's others have summed theirs into those within their stage's sync).
        ranks = min(len(devices[i]) for i in held)
        groups = tuple(tuple(devices[i][d] for i in held) for d in range(ranks))
        seconds = collective_cost("all_reduce", groups, nbytes, machine).seconds
        for i in held:
            extra[i] += seconds
    return extra


def _assemble(
    costs: _Costs,
    names: Sequence[str],
    cuts: Sequence[tuple[int, int, int]],
    blocks: Sequence[int],
    micro: int,
    schedule: str,
    which: Sequence[np.ndarray],
    beat: float = math.inf,
) -> PipelinePlan | None:
    """The chosen cuts, each stage costed as one PCG; None if a stage plan cannot be built.

    The stages' forwards and backwards are costed first, the likeliest bottleneck first, with
    a lower bound of the iteration (:func:`_time_bound`) from what is known: a costed stage's
    ``F + B``, an uncosted one's computation. Once that bound reaches ``beat`` the cuts cannot
    win: :class:`_Slower` is raised before the rest (and every synchronization, a simulated
    iteration each) is costed."""
    machine, pcg = costs.machine, costs.pcg
    count = len(blocks)
    machines = [stage_machine(machine, u) for u in blocks]
    versions = 2 if schedule == "2bw" else 1
    chosen = [names[int(which[r][first, stop])] for first, stop, r in cuts]
    sends = [
        costs.send_s(stop - 1, min(blocks[s], blocks[s + 1]), micro) if s < count - 1 else 0.0
        for s, (_, stop, _) in enumerate(cuts)
    ]
    busy = [
        sum(costs.part(k, name, blocks[s], micro).compute_s for k in range(first, stop))
        for s, (name, (first, stop, _)) in enumerate(zip(chosen, cuts, strict=True))
    ]
    # Per stage: its segments merged, its plan, that plan cut into micro-batches, the cut
    # plan's cost with its tasks in sequence, and its part.
    built: dict[int, tuple[Segment, PCG, PCG, CostBreakdown, _Part]] = {}
    for s in sorted(range(count), key=lambda k: -busy[k]):
        first, stop, _ = cuts[s]
        segs = costs.segments[first:stop]
        merged = Segment(
            s, tuple(x for seg in segs for x in seg.nodes), segs[0].entry, segs[-1].exit
        )
        try:
            plan = costs.stage_plan(
                segment_pcg(pcg, merged), chosen[s], blocks[s], range(first, stop)
            )
            cut = with_micro_batches(plan, micro)
            cost = costs.cost(cut, machines[s], merged, costs.in_sequence)
        except PCGError:
            return None
        part = _part(cost, plan, micro, merged.exit is not None)
        built[s] = (merged, plan, cut, cost, part)
        busy[s] = part.forward_s + part.backward_s
        bound = _time_bound(busy, sends, micro, schedule)
        if bound >= beat:
            raise _Slower(bound)
    # Every stage synchronizes after its last backward for at least its update and its share
    # of the weights it shares with other stages.
    starts = np.cumsum([0] + [m.num_devices for m in machines]).tolist()
    devices = [range(starts[s], starts[s + 1]) for s in range(count)]
    tied = _tied_weights([built[s][3] for s in range(count)], devices, machine)
    least_sync = [built[s][3].update_s + tied[s] for s in range(count)]
    forwards = [built[s][4].forward_s for s in range(count)]
    bound = _time_bound(busy, sends, micro, schedule, least_sync, forwards)
    if bound >= beat:
        raise _Slower(bound)
    stages, times = [], []
    for s, (first, stop, _) in enumerate(cuts):
        merged, plan, cut, cost, part = built[s]
        try:
            run = costs.cost(cut, machines[s], merged, costs.runtime)
        except PCGError:
            return None
        # What the runtime's iteration adds to the micro-batches' forwards and backwards in
        # sequence (and to the exit's gathers, the transfer's work): its synchronization as it
        # overlaps it, and the update, which nothing overlaps.
        sync = max(run.update_s, run.total_s - micro * busy[s] - part.exit_s) + tied[s]
        t = StageTimes(part.forward_s, part.backward_s, sends[s], sync)
        held = in_flight(s, count, micro)
        memory = part.static_bytes + (versions - 1) * part.weight_bytes
        memory += held * part.activation_bytes
        times.append(t)
        stages.append(
            Stage(
                s,
                first,
                stop - 1,
                merged.nodes,
                devices[s],
                chosen[s],
                t,
                memory,
                plan,
                cost,
                merged,
                cut,
            )
        )
    return PipelinePlan(
        tuple(stages),
        micro,
        schedule,
        pipeline_time(times, micro, schedule),
        one_f_one_b_estimate(times, micro),
        max(s.memory_bytes for s in stages),
        machine.device.memory_bytes,
        f"{machine.name} ({machine.num_devices} x {machine.device.name})",
        pcg,
        costs.optimizer,
    )
