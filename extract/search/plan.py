"""The library call: :func:`saturate_and_extract` turns a PCG and a machine into a :class:`Plan`.

Phases, each timed in :attr:`Plan.stats`:

1. **layer-wise search**: AutoDDL's searches over per-layer SBP matmul strategies
   (:mod:`pcgopt.extract.strategies.layerwise`): coordinate descent (12% of the time budget), then
   Metropolis-Hastings from its result (6%); their plans, and any ``seeds`` given, seed the
   e-graph and are candidates;
2. **saturate**: the verified rules explore the equivalent PCGs in one e-graph
   (:func:`pcgopt.egraph.saturate`) within a share of the time budget, starting from the input
   and the seeds in the same e-class. A model with cuts is split first (graph splitting,
   Unity section 5.3, :mod:`pcgopt.extract.search.splitting`): each segment is saturated and
   extracted on its own, within the same shares, and the segments are stitched;
3. **extract**: the cheapest PCG the e-graph holds under the cost model, shared subgraphs counted
   once and the device memory respected (:mod:`pcgopt.extract.search.extraction`: exact ILP for
   small e-graphs, greedy plus local search otherwise). Where the mapping DP on elastic units
   (:func:`~pcgopt.extract.strategies.branches.elastic_views`) runs branches at once, a second
   extraction prices each e-node narrow enough for its branch's devices by its share of the
   machine (:func:`~pcgopt.extract.search.extraction.concurrent_costs`): the candidate
   "e-graph, branches at once", whose branches the mapping then runs side by side (not yet
   under graph splitting, whose segments are extracted in sequence). On a machine of several
   nodes a third extraction costs the e-graph on one node ("e-graph on one node": e-nodes
   wider than a node are out), for models where crossing nodes costs more than it gains.
   Extraction prices every collective on the closest devices, which no placement of a plan
   mixing degrees gives them all at once; so the first two are extracted again with
   placement in the loop (within the extraction phases' shares): the plan is placed and
   mapped, the e-graph priced again on that placement's device groups
   (:func:`~pcgopt.extract.strategies.placement.placement_groups`) and extracted again, and
   the plan of the least placed cost kept;
4. **baselines**: data parallelism, Megatron-style tensor parallelism and sequential optimization
   (:mod:`pcgopt.extract.strategies.baselines`), costed by the same model, and the branch-parallel
   plan (:func:`~pcgopt.extract.strategies.branches.branch_parallel`: data parallelism whose degree
   narrows where the mapping DP runs branches at once, then a descent over its dense layers'
   strategies under the mapping). The plan returned is the fastest that fits in memory among the
   extraction, the baselines, the layer-wise plans and the seeds, so it is never worse than any of
   them; :attr:`SearchStats.chosen` says which one won;
5. **placement and mapping**: every candidate's parallelism axes are placed on the machine
   hierarchy with P^2's parallelism matrices
   (:func:`pcgopt.extract.strategies.placement.place_plan`;
   reductions across levels priced with the best synthesized program; each distinct plan
   once, within its part of what is left of the time budget, at least one matrix each:
   :attr:`PlanPlacement.untried` counts the matrices a time limit skipped), then the
   machine-mapping DP (:func:`pcgopt.extract.search.mapping.map_machine`, Unity section 5.2) decides
   which independent branches run at once on disjoint devices, with one memo table for all
   candidates. Candidates are compared by this cost, a candidate that does not fit device
   memory with gradient accumulation over the fewest micro-batches that fit
   (:func:`mapped_cost`); :attr:`Plan.placement` holds the chosen matrix,
   :attr:`Plan.machine_mapping` the chosen mapping and :attr:`Plan.mapping` the device groups
   they imply;
6. **pipeline**: on a machine of several nodes, a model with cuts is also cut into pipeline
   stages (:func:`~pcgopt.extract.strategies.pipeline.pipeline_search`: stages on equal blocks
   of nodes, a plan per stage, micro-batches under the 1F1B schedule, 4% of the time budget);
   when that is faster than the plan (or fits where it does not), :attr:`Plan.pipeline` holds
   it, every stage checked as the plan is;
7. **check**: the plan is evaluated against the input on random inputs with the reference
   evaluator (:func:`pcgopt.equivalent`), and :class:`PlanCheckError` is raised if they differ.
   A model too large for the evaluator is checked on a smaller instance of both graphs
   (:func:`pcgopt.scaled.scaled_down`: every size that can shrink, shrunk consistently; a
   16-layer MLP of width 8192 becomes one of width 4), and the check is skipped, with a
   warning, only if even that is too large (an image shrinks only to what its windows fit).

The machine defaults to one 8-GPU DGX-H100 node. ``PCGOPT_MACHINE`` overrides it, either a preset
spec ``NAME[:NODES[:DEVICES_PER_NODE]]`` (e.g. ``summit:2``) or the path of a machine file
(JSON or YAML, :meth:`pcgopt.Machine.load`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pcgopt.egraph import Budget, EGraphData, saturate, warm_up_in_background
from pcgopt.egraph.saturate import ALGEBRA_ONSET_NEXT_GROWTH
from pcgopt.egraph.translate import legal_degrees
from pcgopt.errors import NotEquivalentError, PCGError
from pcgopt.evaluate import assert_equivalent
from pcgopt.extract.costmodel.cost import (
    CostBreakdown,
    CostError,
    accumulate_to_fit,
    iteration_cost,
)
from pcgopt.extract.costmodel.simulate import DDP, Runtime
from pcgopt.extract.search import report
from pcgopt.extract.search.extraction import (
    EXTRACTION_SECONDS_PER_ENODE,
    WHOLE_EXTRACTION_SECONDS_PER_ENODE,
    ENodeCosts,
    Extraction,
    ExtractionError,
    class_devices,
    concurrent_costs,
    enode_costs,
    extract_greedy,
    extract_ilp,
    repriced,
)
from pcgopt.extract.search.mapping import MachineMapping, MappingCache, map_machine
from pcgopt.extract.search.splitting import MIN_SEGMENT_OPS, split_search, split_segments
from pcgopt.extract.strategies.baselines import (
    BaselineError,
    data_parallel,
    fsdp,
    megatron,
    megatron_sp,
    sequential,
)
from pcgopt.extract.strategies.branches import ElasticViews, branch_parallel, elastic_views
from pcgopt.extract.strategies.layerwise import coordinate_descent, metropolis_hastings
from pcgopt.extract.strategies.pipeline import PipelineError, PipelinePlan, pipeline_search
from pcgopt.extract.strategies.placement import (
    PlanPlacement,
    batch_split_only,
    default_placement,
    place_plan,
    placement_groups,
)
from pcgopt.graph import PCG
from pcgopt.machine import Machine, MachineError
from pcgopt.names import model_names
from pcgopt.render import to_dot as pcg_to_dot
from pcgopt.rewrite import Rule
from pcgopt.scaled import CHECK_FLOPS_LIMIT, checkable_pair, micro_batch_difference
from pcgopt.segments import segment_pcg
from pcgopt.serialize import pcg_to_dict

__all__ = [
    "DEFAULT_MACHINE",
    "Plan",
    "PlanCheckError",
    "SearchStats",
    "default_machine",
    "machine_from_spec",
    "mapped_plan",
    "saturate_and_extract",
]

#: The machine planned for when none is given and ``PCGOPT_MACHINE`` is not set.
DEFAULT_MACHINE = "dgx-h100:1"

#: Needed e-nodes up to which the exact ILP extractor runs after the greedy one.
ILP_MAX_ENODES = 3_000


class PlanCheckError(PCGError):
    """The returned plan does not compute what the input PCG computes (a soundness bug)."""


def machine_from_spec(spec: str) -> Machine:
    """A machine from ``NAME[:NODES[:DEVICES_PER_NODE]]`` (a preset) or a machine file path.

    >>> machine_from_spec("summit:2").num_devices
    12
    """
    if not isinstance(spec, str) or not spec:
        raise MachineError(f"a machine spec must be a non-empty string, got {spec!r}")
    if Path(spec).suffix or os.sep in spec or "/" in spec or Path(spec).exists():
        return Machine.load(spec)  # a file: it says what is wrong with it, if anything
    name, *rest = spec.split(":")
    if len(rest) > 2:
        raise MachineError(
            f"machine spec {spec!r}: expected NAME[:NODES[:DEVICES_PER_NODE]], e.g. 'summit:2'"
        )
    try:
        numbers = [int(x) for x in rest]
    except ValueError:
        raise MachineError(
            f"machine spec {spec!r}: NODES and DEVICES_PER_NODE must be integers"
        ) from None
    nodes = numbers[0] if numbers else 1
    per_node = numbers[1] if len(numbers) > 1 else None
    return Machine.preset(name, nodes=nodes, devices_per_node=per_node)


def default_machine() -> Machine:
    """``PCGOPT_MACHINE`` if set (a preset spec or a machine file), else one DGX-H100 node."""
    spec = os.environ.get("PCGOPT_MACHINE", "").strip()
    if not spec:
        return machine_from_spec(DEFAULT_MACHINE)
    try:
        return machine_from_spec(spec)
    except MachineError as e:
        raise MachineError(f"PCGOPT_MACHINE={spec!r}: {e}") from None


@dataclass(frozen=True)
class SearchStats:
    """How the plan was found: e-graph size and why saturation stopped, the extraction, the cost
    of every candidate (seconds per iteration, None if it did not apply), which won, and the
    time of each phase."""

    num_enodes: int
    num_eclasses: int
    iterations: int
    stop_reason: str
    extraction: str
    candidates: Mapping[str, float | None]
    chosen: str
    phase_seconds: Mapping[str, float]
    peak_rss_bytes: int
    #: Segments the graph was split into (1: saturated whole); e-node and e-class counts are
    #: then the sums over the distinct segments (saturated together: the iterations are theirs).
    segments: int = 1
    #: The candidates that do not fit device memory (ranked after every one that does).
    infeasible: frozenset[str] = frozenset()
    #: The candidates left out because the time budget ran out before they were placed and
    #: mapped (their cost is None; they are placed fastest first, by their cost before it).
    unplaced: frozenset[str] = frozenset()

    @property
    def seconds(self) -> float:
        return sum(self.phase_seconds.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_enodes": self.num_enodes,
            "num_eclasses": self.num_eclasses,
            "iterations": self.iterations,
            "stop_reason": self.stop_reason,
            "extraction": self.extraction,
            "candidates": dict(self.candidates),
            "chosen": self.chosen,
            "phase_seconds": dict(self.phase_seconds),
            "peak_rss_bytes": self.peak_rss_bytes,
            "segments": self.segments,
            "infeasible": sorted(self.infeasible),
            "unplaced": sorted(self.unplaced),
        }


@dataclass(frozen=True)
class Plan:
    """An optimized PCG for a machine: the graph, where its collectives run (``mapping``: device
    groups of every parallel node), which branches run at once on which devices
    (``machine_mapping``), what an iteration costs, how it was found, and how it was checked."""

    pcg: PCG
    machine: Machine
    cost: CostBreakdown
    mapping: Mapping[str, tuple[tuple[int, ...], ...]]
    stats: SearchStats
    check: str
    input_cost: CostBreakdown = field(repr=False)
    placement: PlanPlacement | None = field(default=None, repr=False)
    machine_mapping: MachineMapping | None = field(default=None, repr=False)
    #: The input model's node names (the plan's layers are named after them; empty: the
    #: plan's own names).
    model_node_names: frozenset[str] = field(default=frozenset(), repr=False)
    #: A pipelined plan of the model that is faster than ``pcg`` (or fits where it does not):
    #: stages on blocks of nodes, each with its own plan, micro-batches under a schedule
    #: (:class:`~pcgopt.extract.strategies.pipeline.PipelinePlan`); None when none is, or with
    #: ``saturate_and_extract(pipeline=False)``. ``pcg``, ``cost`` and the JAX lowering stay
    #: those of the fastest plan that runs as one program: pipelined plans do not lower to JAX
    #: yet.
    pipeline: PipelinePlan | None = field(default=None, repr=False)

    @property
    def time_s(self) -> float:
        """The predicted iteration time of the fastest plan found: the pipeline's when there is
        one (:attr:`pipeline`), else ``cost.total_s``."""
        return self.cost.total_s if self.pipeline is None else self.pipeline.time_s

    @property
    def speedup(self) -> float:
        """Predicted speedup over the input PCG as given (usually on one device)."""
        return self.input_cost.total_s / self.cost.total_s if self.cost.total_s else 1.0

    def __repr__(self) -> str:
        return (
            f"Plan({len(self.pcg.nodes)} nodes on {self.machine.name} ({self.machine.num_devices}"
            f" devices): {self.cost.total_s * 1e3:.4g} ms/iteration, from {self.stats.chosen})"
        )

    def explain(self, *, max_rows: int | None = 40) -> str:
        """The plan for a person (:mod:`pcgopt.extract.search.report`): the time and the
        speedup over the best baseline, one row per layer (strategy in words and in SBP
        notation, devices, time, memory, collectives; alike layers share a row), the costliest
        ``max_rows`` nodes (None: all), how the plan was found, and a legend."""
        return report.explain(self, self._layer_names(), max_rows=max_rows)

    def layers(self) -> list[report.LayerRow]:
        """The plan's layers in order, as :meth:`explain`'s table shows them (alike
        consecutive layers in one row): each one's strategy, layout, devices, time, memory
        and collectives."""
        return report.layer_rows(self, self._layer_names())

    def save_device_map(self, path: str | Path) -> Path:
        """Draws which devices each layer runs on, and how (:mod:`pcgopt.extract.search.picture`),
        to ``path``: ``.svg`` or ``.png``. Needs matplotlib (``pip install 'pcgopt[plot]'``)."""
        from pcgopt.extract.search.picture import save_device_map

        return save_device_map(self, path)

    def save_timeline(self, path: str | Path) -> Path:
        """Draws when every task of one iteration runs (:meth:`CostBreakdown.timeline`: the
        simulated iteration's tasks, or, for a plan that runs branches at once, the machine
        mapping's units on their device blocks) as a Gantt chart to ``path``: ``.svg`` or
        ``.png``. Needs matplotlib (``pip install 'pcgopt[plot]'``)."""
        from pcgopt.extract.search.picture import save_timeline

        return save_timeline(self.cost.timeline(), path, report.headline(self)[0])

    def _layer_names(self) -> Iterable[str]:
        """The names the report finds layers in: the model's, else the plan's own."""
        return self.model_node_names or [n.name for n in self.pcg.nodes]

    def to_dict(self) -> dict[str, Any]:
        c = self.cost
        return {
            "machine": {"name": self.machine.name, "num_devices": self.machine.num_devices},
            "pcg": pcg_to_dict(self.pcg),
            "mapping": {k: [list(g) for g in v] for k, v in self.mapping.items()},
            "cost": {
                "total_s": c.total_s,
                "compute_s": c.compute_s,
                "comm_s": c.comm_s,
                "update_s": c.update_s,
                "optimizer": c.optimizer,
                "comm_bytes": c.comm_bytes,
                "comm_bytes_per_level": dict(c.comm_bytes_per_level),
                "memory_per_device": c.memory_per_device,
                "memory_capacity": c.memory_capacity,
                "feasible": c.feasible,
                "micro_batches": c.micro_batches,
                "overlap_s": c.overlap_s,
                "additive_s": c.additive_s,
                "exposed_comm_s": c.exposed_comm_s,
                "runtime": {
                    "overlap": c.runtime.overlap,
                    "bucket_bytes": c.runtime.bucket_bytes,
                    "precision": c.runtime.precision,
                    "zero_stage": c.runtime.zero_stage,
                },
            },
            "placement": None
            if self.placement is None
            else {
                "axes": list(self.placement.axes),
                "matrix": None
                if self.placement.matrix is None
                else self.placement.matrix.to_list(),
                "hierarchy": None
                if self.placement.matrix is None
                else list(self.placement.matrix.hierarchy),
                "reason": self.placement.reason,
                "matrices_tried": self.placement.considered,
                "matrices_untried": self.placement.untried,
            },
            "machine_mapping": None
            if self.machine_mapping is None
            else {
                "time_s": self.machine_mapping.time_s,
                "sequential_s": self.machine_mapping.sequential_s,
                "transfer_s": self.machine_mapping.transfer_s,
                "memory_per_device": self.machine_mapping.memory_per_device,
                "offsets": {k: v for k, v in self.machine_mapping.offsets.items() if v},
                # The schedule, so that a plan read back runs its branches as mapped
                # (pcgopt.lower.mapped): [nodes, first device, devices, start s, end s].
                "units": [
                    [list(u.nodes), u.block.start, u.block.size, u.start_s, u.end_s]
                    for u in self.machine_mapping.units
                ],
            },
            "pipeline": None if self.pipeline is None else self.pipeline.to_dict(),
            "input_total_s": self.input_cost.total_s,
            "stats": self.stats.to_dict(),
            "check": self.check,
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_dot(self, *, collapse: bool = True) -> str:
        """Graphviz DOT of the plan's PCG. ``collapse``: of each run of alike layers, the first
        is drawn and the others are one box (BERT-Large's 24 layers would make a picture tens
        of thousands of pixels tall)."""
        boxes = report.repeated_layer_boxes(self, self._layer_names()) if collapse else None
        return pcg_to_dot(self.pcg, boxes=boxes)

    def to_jax(self, devices: Any = None, **options: Any) -> Any:
        """This plan as a JAX program that runs training steps on ``devices``
        (:func:`pcgopt.lower.jax.lower`, which takes the same ``options``; needs
        ``pip install 'pcgopt[jax]'``)."""
        # pcgopt.lower is the layer above this one; it is loaded only when asked for.
        from pcgopt.lower.jax import lower

        return lower(self, devices, **options)


def mapped_plan(
    pcg: PCG,
    machine: Machine,
    *,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    found_by: str = "given",
) -> Plan:
    """``pcg`` as a Plan for ``machine``, placed and mapped as :func:`saturate_and_extract`
    costs a candidate (:func:`mapped_cost`), without searching or checking it (``found_by``:
    what its stats say made it)."""
    placed, mapping, cost = mapped_cost(pcg, machine, optimizer=optimizer, runtime=runtime)
    stats = SearchStats(0, 0, 0, "not searched", "none", {}, found_by, {}, 0)
    groups = mapping.device_groups({**default_placement(pcg), **placed.devices})
    return Plan(pcg, machine, cost, groups, stats, "not checked", cost, placed, mapping)


def _check(model: PCG, plan: PCG, limit: float) -> str:
    """Evaluates ``plan`` against ``model`` on random inputs; too large for the evaluator, both
    are scaled down together first (:func:`pcgopt.scaled.checkable_pair`). Raises
    :class:`PlanCheckError` if they differ; returns what was checked."""
    pair = checkable_pair(model, plan, flops_limit=limit)
    if pair.skipped is not None:
        message = f"skipped: {pair.skipped}"
        warnings.warn(f"saturate_and_extract: equivalence check {message}", stacklevel=3)
        return message
    try:
        assert_equivalent(*pair.pcgs)
    except NotEquivalentError as err:
        raise PlanCheckError(
            f"the optimized PCG does not compute what the input computes on 3 random inputs"
            f"{pair.where} ({err}); this is a bug in pcgopt, please report it with the model"
        ) from None
    return f"equivalent to the input on 3 random inputs{pair.where} (reference evaluator)"


def placed_cost(
    plan: PCG,
    machine: Machine,
    *,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    cost: CostBreakdown | None = None,
) -> tuple[PlanPlacement, CostBreakdown]:
    """How :func:`saturate_and_extract` costs a candidate plan (:func:`mapped_cost`), without
    the mapping itself. Benchmarks use it to cost baselines the way the optimizer does."""
    placed, _, final = mapped_cost(plan, machine, optimizer=optimizer, runtime=runtime, cost=cost)
    return placed, final


def mapped_cost(
    plan: PCG,
    machine: Machine,
    *,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    cost: CostBreakdown | None = None,
    cache: MappingCache | None = None,
    time_limit_s: float | None = None,
    placement: PlanPlacement | None = None,
) -> tuple[PlanPlacement, MachineMapping, CostBreakdown]:
    """How :func:`saturate_and_extract` costs a candidate plan: its axes placed on the hierarchy
    (:func:`~pcgopt.extract.strategies.placement.place_plan`), its independent branches mapped onto
    disjoint devices where that is faster (:func:`~pcgopt.extract.search.mapping.map_machine`, memo
    table ``cache``), then, if it still does not fit device memory, gradient accumulation over
    the fewest micro-batches that fit in the cost model's (unmapped, so conservative) memory
    (:func:`~pcgopt.extract.costmodel.cost.accumulate_to_fit`), mapped again. ``cost``: its
    default-placement cost, if known; ``time_limit_s``: the placement search's (see
    :func:`~pcgopt.extract.strategies.placement.place_plan`); ``placement``: the plan's
    placement already found (under another runtime), kept instead of searched again.

    The placement spreads a plan's axes over the machine, which can leave no room to run
    narrow branches beside each other. For a plan whose tensors are split along their batch
    dimension only (:func:`batch_split_only`: data parallelism at one or several degrees), the
    default placement (each collective's groups consecutive from its block's first device) is
    one a machine can have, so it is mapped too and the faster kept. For other plans (a
    tensor-parallel group inside a data-parallel one) the default puts every group on the
    closest devices at once, which no machine can; they keep P^2's placement."""
    if placement is not None:
        again = iteration_cost(
            plan, machine, optimizer=optimizer, runtime=runtime, devices=placement.devices or None
        )
        placed = replace(placement, cost=again, tried=())
    else:
        placed = place_plan(
            plan,
            machine,
            optimizer=optimizer,
            runtime=runtime,
            default_cost=cost,
            time_limit_s=time_limit_s,
        )
    final = placed.cost
    mapping = map_machine(plan, machine, cost=final, devices=placed.devices, cache=cache)
    # Each mapping's cost is worked out once: one that runs branches at once is simulated.
    mapped = mapping.cost(final)
    if placed.matrix is not None and batch_split_only(plan):
        default = cost or iteration_cost(plan, machine, optimizer=optimizer, runtime=runtime)
        packed = map_machine(plan, machine, cost=default, cache=cache)
        packed_cost = packed.cost(default)
        if _rank(packed_cost) < _rank(mapped):
            reason = "packed placement maps faster"
            placed = PlanPlacement(placed.axes, None, {}, default, placed.tried, reason)
            final, mapping, mapped = default, packed, packed_cost
    if not mapped.feasible:
        final = accumulate_to_fit(
            plan, machine, optimizer=optimizer, runtime=runtime, cost=final, devices=placed.devices
        )
        mapping = map_machine(plan, machine, cost=final, devices=placed.devices, cache=cache)
        mapped = mapping.cost(final)
    if not mapping.divided_splits or _rank(final) <= _rank(mapped):
        # Nothing runs at once, or, simulated, running branches at once is not faster: the
        # plan runs in sequence, at the simulated time.
        mapping = mapping.in_sequence(final)
        mapped = mapping.cost(final)
    else:
        mapping = mapping.simulated(mapped)
    return placed, mapping, mapped


def _rank(cost: CostBreakdown) -> tuple[bool, float]:
    """Plans that fit first, then the faster."""
    return (not cost.feasible, cost.total_s)


#: How long the check takes, predicted before the search so that the phases leave it the time
#: (:func:`check_seconds`): per model node and per windowed node (a convolution or pooling,
#: whose smallest image size is searched) for scaling the pair down, and per task of the
#: parallel evaluator (one per device a node runs on) and per task of a windowed operator
#: (numpy windows cost more per call). Fitted to the checks of the data-parallel and Megatron
#: plans of eight zoo models on 16 and 64 GPUs (0.02-3.6 s; ``python bench/check_time.py``)
#: and raised by about 30%: they predicted 0.93-1.80x of each measured time at 5bab69e.
CHECK_SECONDS_PER_NODE = 1.3e-3
CHECK_SECONDS_PER_WINDOWED_NODE = 9e-3
CHECK_SECONDS_PER_TASK = 17e-6
CHECK_SECONDS_PER_WINDOWED_TASK = 58e-6
_WINDOWED_OPS = frozenset({"conv2d", "pool2d", "batch_norm"})


def check_seconds(pcg: PCG, machine: Machine) -> float:
    """The predicted time of checking a plan of ``pcg`` on ``machine`` (every node on every
    device, as a data-parallel plan would), from the constants above."""
    windowed = sum(n.op in _WINDOWED_OPS for n in pcg.nodes)
    # Operators with windows (their specs' window_inputs): the scaler searches their image size.
    searched = sum(bool(getattr(n.spec, "window_inputs", ())) for n in pcg.nodes)
    per_device = (
        windowed * CHECK_SECONDS_PER_WINDOWED_TASK
        + (len(pcg.nodes) - windowed) * CHECK_SECONDS_PER_TASK
    )
    return (
        len(pcg.nodes) * CHECK_SECONDS_PER_NODE
        + searched * CHECK_SECONDS_PER_WINDOWED_NODE
        + machine.num_devices * per_device
    )


@dataclass(frozen=True)
class _Clock:
    """The search's time budget as a deadline: a phase may use what is left of the budget less
    the shares of the phases after it, that is its own share plus what the phases before it
    left unused, less what they overran; the phases after it keep their shares whole, but
    for those that will not run (``skipped``: the branch-parallel search without baselines,
    the pipeline for a model without cuts), whose shares go to the phases before them. Each
    still gets at least 2% of the budget."""

    budget_s: float
    deadline: float
    skipped: frozenset[str] = frozenset()

    @classmethod
    def untimed(cls) -> _Clock:
        """The clock of a deterministic search: no phase has a time limit."""
        return cls(math.inf, math.inf)

    @classmethod
    def start(
        cls, budget_s: float, check_s: float = 0.0, skipped: frozenset[str] = frozenset()
    ) -> _Clock:
        """The phases share the budget less :data:`RESERVE_SHARE` and the predicted time of
        the check beyond it (``check_s``), but at least :data:`MIN_SEARCH_SHARE` of it."""
        reserved = max(RESERVE_SHARE * budget_s, check_s)
        planned = max(MIN_SEARCH_SHARE * budget_s, budget_s - reserved)
        return cls(planned, time.perf_counter() + planned, skipped)

    def limit(self, phase: str) -> float:
        """Seconds for ``phase`` (one of :data:`PHASE_SHARES`): what is left of the budget,
        keeping the shares of the phases after it."""
        if math.isinf(self.deadline):
            return math.inf
        return max(0.02 * self.budget_s, self._own(phase))

    def spent(self, phase: str, part: float = 0.0) -> bool:
        """Whether ``phase`` has used up its time, or all but ``part`` of its share: what is
        left of the budget, less the shares of the phases after it, is not more than ``part``
        of the phase's own share (never, in a deterministic search)."""
        if math.isinf(self.deadline):
            return False
        return self._own(phase) <= part * PHASE_SHARES[phase] * self.budget_s

    def _own(self, phase: str) -> float:
        """What is left of the budget less the shares of the phases after ``phase``."""
        names = list(PHASE_SHARES)
        after = sum(
            PHASE_SHARES[n] for n in names[names.index(phase) + 1 :] if n not in self.skipped
        )
        return self.deadline - time.perf_counter() - after * self.budget_s

    def fits(self, phase: str, seconds: float) -> bool:
        """Whether ``seconds`` of work fit in what ``phase`` has left (always, in a
        deterministic search)."""
        return math.isinf(self.deadline) or self._own(phase) >= seconds

    def left(self) -> float:
        if math.isinf(self.deadline):
            return math.inf
        return max(0.02 * self.budget_s, self.deadline - time.perf_counter())


#: The part of the time budget no phase plans to use: it absorbs a step that overruns its
#: phase's limit (limits are checked between steps), the check and assembling the Plan. In
#: ``python bench/run.py --budget 20`` at 030240b one search ended 0.5 s after its budget.
RESERVE_SHARE = 0.05

#: A pipeline's check (every stage's plan against its part of the model, and the model on
#: micro-batches against the whole batch) takes about this many times the model's predicted
#: check (:func:`check_seconds`): on BERT-Large on 8 Summit nodes, two stages and the
#: micro-batches 2.43 s against 2.12 s predicted for the model (1.92 s measured; scratch,
#: 2026-12-07). Unbudgeted, it took that search 13% past a 20 s budget.
PIPELINE_CHECK_SHARE = 1.3

#: Saturation and the pipeline phase start only if at least this part of their share of
#: the budget is left for them (:meth:`_Clock.spent`): their first steps (loading the seeds
#: into the e-graph and extracting them; costing the stage plans) take time of their own.
MIN_START_PART = 0.25

#: The least part of the time budget the search phases get, however long the check is
#: predicted to take (a budget smaller than the check is then overrun by the check).
MIN_SEARCH_SHARE = 0.25

#: Saturation's limits in a deterministic search (``saturate_and_extract(deterministic=True)``):
#: iterations and e-nodes (per segment under graph splitting), no wall time. Both iterations
#: run every ruleset (``algebra_from=1``): holding the matrix algebra back
#: (:data:`~pcgopt.egraph.saturate.MATRIX_ALGEBRA_FROM`) would leave it one of the two, and a
#: four-tower model on 4 GPUs then lost the plan running its towers at once (0.159 -> 0.181 ms).
#: The e-node limit lets every zoo model on 1 to 8 Summit nodes keep its second iteration
#: (up to 92,993 e-nodes, CANDLE-Uno on 8; BERT-Large's four distinct segments 203,959 in all):
#: at 50,000 it was run and then undone for MLP on 8 nodes, CANDLE-Uno on 4 and 8, and
#: BERT-Large, whose plans were 1.2-1.7x slower for it (bench/RESULTS.md). A third iteration
#: runs where twice the e-graph fits the limit (:data:`~pcgopt.egraph.saturate.
#: LEAST_ITERATION_GROWTH`; MLP and XDL on 1-4 nodes).
DETERMINISTIC_BUDGET = Budget(
    iterations=3, enodes=100_000, seconds=math.inf, speculate=False, algebra_from=1
)

#: The layer-wise searches' limit in a deterministic search: coordinate descent from the best
#: uniform start only, for at most this many evaluated assignments, then Metropolis-Hastings
#: for as many steps (BERT-Large on 64 GPUs evaluates one in about 0.2 s).
DETERMINISTIC_EVALUATIONS = 24

#: The exact extraction's branch-and-bound node limit in a deterministic search, where it has
#: no time limit (HiGHS is deterministic for a given limit).
DETERMINISTIC_ILP_NODES = 2_000

#: Each phase's share of the time budget less the reserve (they add up to 1), in the order
#: they run.
PHASE_SHARES = {
    "coordinate descent": 0.12,
    "metropolis-hastings": 0.06,
    "saturate": 0.42,
    "extract greedy": 0.14,
    "extract exact": 0.06,
    "branch parallel": 0.08,
    "placement and mapping": 0.08,
    "pipeline": 0.04,
}


def saturate_and_extract(
    pcg: PCG,
    machine: Machine | None = None,
    *,
    time_budget_s: float = 60.0,
    memory_budget: int = 4 * 2**30,
    rules: list[Rule] | None = None,
    check: bool = True,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    baselines: bool = True,
    seeds: Sequence[PCG] = (),
    check_flops_limit: float = CHECK_FLOPS_LIMIT,
    progress: bool | Callable[[str], None] = False,
    split: bool | None = None,
    min_segment_ops: int = MIN_SEGMENT_OPS,
    degrees: Sequence[int] | None = None,
    presets: Sequence[str] | None = None,
    deterministic: bool = False,
    pipeline: bool = True,
) -> Plan:
    """Optimize ``pcg`` for training on ``machine`` (module docstring): returns the fastest
    plan found that fits in device memory, with its predicted cost.

    ``time_budget_s``: the wall-time limit of the whole call (load the rules ahead with
    :func:`pcgopt.egraph.warm_up` to keep their one-time loading out of it). The check's
    time is predicted from the model's size (:func:`check_seconds`) and kept back, at least
    :data:`RESERVE_SHARE` (5%) of the budget, which also absorbs overruns; the phases share the
    rest as :data:`PHASE_SHARES` says (the layer-wise searches 18%, saturation 42% with
    building the baselines and the rest of loading the rules before it and exporting the
    e-graph after it, extraction 20%, the branch-parallel plan 8%, placement and mapping 8%,
    the pipeline 4%; the shares of the branch-parallel plan without ``baselines`` and of the
    pipeline where it cannot run go to the phases before them).
    Saturation runs into greedy extraction's share as long as its e-graph leaves the time to
    cost and extract it, and stops before an iteration predicted not to leave that time (the
    first one included). Time a phase leaves unused goes to the next one; time it overruns
    comes out of its own successors' (limits are checked between steps, so a step in progress
    can overrun them). A phase whose time the phases before it used up is cut short:
    saturation and the pipeline phase do not start (with less than :data:`MIN_START_PART` of
    their share left), and placement, which places the candidates fastest first (by their
    cost before placement), places the first and the others only while its time lasts
    (:attr:`SearchStats.unplaced` names those it left out).
    ``python bench/budgets.py`` measures the adherence. A check predicted to take more than
    the budget still runs (the search keeps :data:`MIN_SEARCH_SHARE`): the call then
    overruns by it;
    ``memory_budget``: the search's own memory limit in bytes (saturation stops before it);
    ``rules``: the rewrite rules (default: the shipped, proved ones); ``check``: verify the
    plan against the input with the reference evaluator (module docstring); ``baselines``:
    also consider the data-parallel, Megatron and sequential plans and run the layer-wise
    searches (whose plans also seed the e-graph); ``seeds``: plans you already have (e.g. from
    another search), each a candidate and an e-graph seed; they must compute what ``pcg``
    computes (with ``check=True`` the returned plan is verified, whichever it is);
    ``progress``: True prints phases to stderr, or a callable receives them;
    ``split``: graph splitting (Unity section 5.3, :mod:`pcgopt.extract.search.splitting`): saturate
    and extract segments of at least ``min_segment_ops`` computing operators separately and
    stitch them, with a DP over the layouts handed across the cuts; None (the default) splits
    when the graph has such cuts, False never does. ``degrees`` (the only degrees rewrites
    may choose, e.g. ``machine.level_degrees()``) and ``presets`` (the shipped rule files to
    saturate with, e.g. ``("transformer", "layouts")``): as for
    :func:`~pcgopt.egraph.saturate`; the default is every divisor of the device count and the
    rule files that can rewrite the model. ``optimizer`` and ``runtime`` (what the training
    runtime overlaps and how it buckets gradients, :class:`~pcgopt.extract.Runtime`; default
    PyTorch DDP's) say how every candidate is costed (:func:`~pcgopt.extract.iteration_cost`);
    extraction in the e-graph ranks choices by its per-e-node model (the sync hidden behind the
    backward where the runtime overlaps them); its plans are costed like every other candidate.

    ``deterministic``: limit the search by work instead of wall time, so that identical inputs
    give identical plans, whatever the machine's speed or load: ``time_budget_s`` is ignored;
    saturation stops at :data:`DETERMINISTIC_BUDGET`'s iterations and e-nodes, the algebra
    not held back (or the memory
    budget, the one limit that still depends on the process), the layer-wise searches at
    :data:`DETERMINISTIC_EVALUATIONS` (their random choices are seeded), the exact
    extraction at :data:`DETERMINISTIC_ILP_NODES` branch-and-bound nodes, and the other
    phases run to their end. Otherwise these phases stop at their share of the time budget, so
    what they find depends on how fast they run: the layer-wise searches, saturation,
    extraction, the branch-parallel search and the placement search.

    ``pipeline``: also cut a model with cuts into pipeline stages (module docstring, phase 6);
    a faster result is :attr:`Plan.pipeline` (never for a model micro-batches would change).

    A candidate that the placement or the machine mapping rejects (:class:`CostError`, a
    bug) is left out with a warning, and the others still compete; if none is left, the
    :class:`CostError` says why.
    """
    machine = _checked_arguments(pcg, machine, time_budget_s, seeds, memory_budget, degrees)
    # The shipped rules load (once per process) on the second core while the layer-wise
    # searches run; saturation waits for them, and its share pays for what is left.
    search = _Search(
        pcg,
        machine,
        optimizer,
        runtime,
        _search_clock(
            pcg,
            machine,
            None if deterministic else time_budget_s,
            check=check,
            baselines=baselines,
            pipeline=pipeline and _may_pipeline(pcg, machine, min_segment_ops),
        ),
        _reporter(progress),
        bool(progress),
        rules,
        warm_up_in_background(rules, [pcg], presets),
        memory_budget,
        degrees,
        presets,
        deterministic,
    )
    say, phases = search.say, search.phases
    input_cost = search.cost(pcg)

    layerwise, extra = _seed_phase(search, baselines, seeds)
    seed_plans = [
        v[0] for v in (*layerwise.values(), *extra.values()) if v is not None and v[0] != pcg
    ]
    fixed, baseline_plans = _baseline_phase(search, baselines)
    extracted, explored = _explore(search, seed_plans, baseline_plans, split, min_segment_ops)

    candidates = {
        **{k: None if p is None else (p, search.cost(p)) for k, p in extracted.items()},
        "input as given": (pcg, input_cost),
        **fixed,
        **({"branch parallel": _branch_parallel(search)} if baselines else {}),
        **layerwise,
        **extra,
    }
    placements, mappings, failed, unplaced = _placement_phase(search, candidates)

    chosen, (best, best_cost) = _best(candidates, failed)
    say(f"chose {chosen}: {best_cost.total_s * 1e3:.4g} ms per iteration")
    piped = _pipeline_phase(search, best_cost, min_segment_ops, check) if pipeline else None
    verdict = _check_phase(search, best, check, check_flops_limit, piped)
    stats = _with_pipeline(explored.stats(candidates, chosen, phases, unplaced), piped)
    return Plan(
        pcg=best,
        machine=machine,
        cost=best_cost,
        mapping=mappings[chosen].device_groups(
            {**default_placement(best), **placements[chosen].devices}
        ),
        stats=stats,
        check=verdict,
        input_cost=input_cost,
        placement=placements[chosen],
        machine_mapping=mappings[chosen],
        model_node_names=frozenset(n.name for n in pcg.nodes),
        pipeline=piped,
    )


def _placement_phase(
    search: _Search, candidates: dict[str, tuple[PCG, CostBreakdown] | None]
) -> tuple[
    dict[str, PlanPlacement],
    dict[str, MachineMapping],
    dict[tuple[PCG, Runtime], str],
    frozenset[str],
]:
    """Phase 5 (module docstring): every candidate placed and mapped (:func:`_place_and_map`,
    which updates ``candidates``); also the names of those left out for want of time."""
    start = time.perf_counter()
    distinct = len({v[0] for v in candidates.values() if v is not None})
    search.say(f"placing and mapping {distinct} distinct candidate plans on the machine")
    keys = {k: (v[0], v[1].runtime) for k, v in candidates.items() if v is not None}
    placements, mappings, failed = _place_and_map(
        candidates,
        search.machine,
        search.optimizer,
        search.clock,
        search.say,
        model=search.pcg,
        cache=search.mapping_cache,
    )
    search.phases["placement and mapping"] = time.perf_counter() - start
    unplaced = frozenset(k for k, key in keys.items() if failed.get(key) == UNPLACED)
    return placements, mappings, failed, unplaced


def _with_pipeline(stats: SearchStats, piped: PipelinePlan | None) -> SearchStats:
    """``stats`` with the kept pipeline among the candidates (and the infeasible, if so)."""
    if piped is None:
        return stats
    name = _pipeline_name(piped)
    return replace(
        stats,
        candidates={**stats.candidates, name: piped.time_s},
        infeasible=stats.infeasible | ({name} if not piped.feasible else frozenset()),
    )


def _pipeline_name(piped: PipelinePlan) -> str:
    return f"pipeline ({len(piped.stages)} stages x {piped.micro_batches} micro-batches)"


def _may_pipeline(pcg: PCG, machine: Machine, min_segment_ops: int) -> bool:
    """Whether the pipeline phase can run: several devices, and a model with cuts."""
    return machine.num_devices >= 2 and len(split_segments(pcg, min_segment_ops)) >= 2


def _pipeline_phase(
    search: _Search, best_cost: CostBreakdown, min_segment_ops: int, check: bool
) -> PipelinePlan | None:
    """Phase 6 (module docstring): the fastest pipelined plan, kept if it has several stages
    and beats ``best_cost`` (fits where it does not, or is faster). A pipeline kept is checked
    too (``check``): that check's predicted time (:data:`PIPELINE_CHECK_SHARE`) comes out of
    the phase's."""
    machine = search.machine
    if not _may_pipeline(search.pcg, machine, min_segment_ops):
        return None
    checking = PIPELINE_CHECK_SHARE * check_seconds(search.pcg, machine) if check else 0.0
    limit = search.clock.limit("pipeline") - checking
    if search.clock.spent("pipeline", MIN_START_PART) or (
        limit < MIN_START_PART * PHASE_SHARES["pipeline"] * search.clock.budget_s
    ):
        search.say("no pipeline: the time budget ran out before its phase and its check")
        search.phases["pipeline"] = 0.0
        return None
    start = time.perf_counter()
    search.say("cutting the model into pipeline stages")
    try:
        piped = pipeline_search(
            search.pcg,
            machine,
            optimizer=search.optimizer,
            runtime=search.runtime,
            min_ops=min_segment_ops,
            min_stages=2,
            time_budget_s=None if search.deterministic else limit,
            faster_than_s=best_cost.total_s if best_cost.feasible else None,
        )
    except (PipelineError, BaselineError, CostError) as e:
        search.say(f"no pipelined plan: {e}")
        piped = None
    search.phases["pipeline"] = time.perf_counter() - start
    if piped is None or len(piped.stages) < 2:
        return None
    if (not piped.feasible, piped.time_s) >= (not best_cost.feasible, best_cost.total_s):
        search.say(f"the pipeline ({piped.time_s * 1e3:.4g} ms) is not faster")
        return None
    search.say(f"a pipeline is faster: {piped.time_s * 1e3:.4g} ms per iteration")
    return piped


def _check_pipeline(model: PCG, piped: PipelinePlan, limit: float) -> str:
    """Every stage's plan against its part of ``model`` (as :func:`_check` checks a plan), the
    stages covering the model's computing nodes once, in order, and the model on two
    micro-batches against the whole batch (:func:`pcgopt.scaled.micro_batch_difference`): so the
    pipeline computes what the model does."""
    computed = [n.name for n in model.nodes if n.op not in ("input", "weight")]
    covered = [x for s in piped.stages for x in s.nodes]
    if covered != computed:
        raise PlanCheckError(
            "the pipeline's stages do not cover the model's operators once, in order; this is a "
            "bug in pcgopt, please report it with the model"
        )
    why = micro_batch_difference(model)
    if why is not None:
        raise PlanCheckError(
            f"the pipeline runs micro-batches, which change what the model computes ({why}); "
            "this is a bug in pcgopt, please report it with the model"
        )
    verdicts = [_check(segment_pcg(model, s.segment), s.plan, limit) for s in piped.stages]
    kinds = sorted(set(v.split(" (")[0] for v in verdicts))
    return (
        f"pipeline stages: {len(verdicts)} checked ({'; '.join(kinds)}), micro-batches "
        "checked against the whole batch"
    )


def _seed_phase(
    search: _Search, baselines: bool, seeds: Sequence[PCG]
) -> tuple[dict[str, tuple[PCG, CostBreakdown] | None], dict[str, tuple[PCG, CostBreakdown]]]:
    """The seeds phase: the layer-wise searches' plans (if ``baselines``) and the caller's
    ``seeds``, each with its cost; they are candidates and seed the e-graph."""
    layerwise: dict[str, tuple[PCG, CostBreakdown] | None] = {}
    if baselines:
        start = time.perf_counter()
        layerwise = _layerwise_searches(
            search.pcg,
            search.machine,
            search.optimizer,
            search.runtime,
            search.clock,
            search.say,
            search.deterministic,
        )
        search.phases["layer-wise search"] = time.perf_counter() - start
    extra = {f"seed {k}": (seed, search.cost(seed)) for k, seed in enumerate(seeds)}
    return layerwise, extra


def _check_phase(
    search: _Search,
    best: PCG,
    check: bool,
    flops_limit: float,
    piped: PipelinePlan | None = None,
) -> str:
    """The check phase: ``best`` (and the pipeline kept beside it, if any) verified against the
    input by the reference evaluator (if ``check``); what was found."""
    start = time.perf_counter()
    verdict = "not checked (check=False)"
    if check:
        search.say("checking the plan against the input with the reference evaluator")
        verdict = _check(search.pcg, best, flops_limit)
        if piped is not None:
            verdict += "; " + _check_pipeline(search.pcg, piped, flops_limit)
    search.phases["check"] = time.perf_counter() - start
    return verdict


def _checked_arguments(
    pcg: Any,
    machine: Any,
    time_budget_s: float,
    seeds: Sequence[Any],
    memory_budget: Any,
    degrees: Sequence[int] | None,
) -> Machine:
    """The machine to plan for (the default for None), after checking the arguments' types."""
    if not isinstance(pcg, PCG):
        raise PCGError(f"saturate_and_extract takes a pcgopt.PCG, got {type(pcg).__name__}")
    if machine is None:
        machine = default_machine()
    if not isinstance(machine, Machine):
        raise PCGError(
            f"machine must be a pcgopt.Machine (or None for the default), got "
            f"{type(machine).__name__}"
        )
    if (
        isinstance(time_budget_s, bool)
        or not isinstance(time_budget_s, int | float)
        or not 0 < time_budget_s < math.inf
    ):
        raise PCGError(
            f"time_budget_s must be a finite number of seconds > 0 (deterministic=True limits "
            f"the search by work instead), got {time_budget_s!r}"
        )
    if pcg.nodes == () or not pcg.outputs:
        raise PCGError("the PCG has no outputs: there is nothing to optimize")
    for k, seed in enumerate(seeds):
        if not isinstance(seed, PCG):
            raise PCGError(f"seeds[{k}] must be a pcgopt.PCG, got {type(seed).__name__}")
    for what, graph in (("the PCG", pcg), *((f"seeds[{k}]", s) for k, s in enumerate(seeds))):
        found = graph.first_in_micro_batches()
        if found is not None:
            raise PCGError(
                f"{what}: node {found[0]!r} outputs {found[1]}, cut into micro-batches; "
                f"saturate_and_extract plans whole batches and cuts micro-batches itself "
                f"(pipeline=True): give it the model without Pipeline and Batch"
            )
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1:
        raise PCGError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    if degrees is not None:
        legal_degrees(machine.num_devices, degrees)  # a clear error now, not after the seeds
    return machine


def _search_clock(
    pcg: PCG,
    machine: Machine,
    time_budget_s: float | None,
    *,
    check: bool,
    baselines: bool,
    pipeline: bool,
) -> _Clock:
    """The search's clock: untimed for a deterministic search (``time_budget_s`` None), else
    the budget less the check's predicted time, with the shares of the phases that will not
    run (the branch-parallel plan without ``baselines``, the pipeline without ``pipeline``)
    given to those before them."""
    if time_budget_s is None:
        return _Clock.untimed()
    skipped = set() if baselines else {"branch parallel"}
    if not pipeline:
        skipped.add("pipeline")
    check_s = check_seconds(pcg, machine) if check else 0.0
    return _Clock.start(time_budget_s, check_s, frozenset(skipped))


def _best(
    candidates: Mapping[str, tuple[PCG, CostBreakdown] | None], failed: Mapping[Any, str]
) -> tuple[str, tuple[PCG, CostBreakdown]]:
    """The fastest candidate that fits in memory (else the fastest), with its name."""
    left = [(k, v) for k, v in candidates.items() if v is not None]
    if not left:
        raise CostError(
            "no candidate plan could be placed and mapped: "
            + "; ".join(dict.fromkeys(failed.values()))
        )
    return min(left, key=lambda item: _rank(item[1][1]))


def _layerwise_searches(
    pcg: PCG,
    machine: Machine,
    optimizer: str,
    runtime: Runtime,
    clock: _Clock,
    say: Callable[[str], None],
    deterministic: bool = False,
) -> dict[str, tuple[PCG, CostBreakdown] | None]:
    """AutoDDL's searches over per-layer SBP matmul strategies: coordinate descent, then
    Metropolis-Hastings from its result (it escapes the local optima where every single-layer
    change costs a redistribution). Their plans seed the e-graph (the rules do not build 2D/3D
    matmul splits within a budget), so extraction can combine their layouts with rewrites
    elsewhere, and they are candidates the joint plan must not lose to."""
    say("coordinate descent over per-layer SBP strategies")
    try:
        found = coordinate_descent(
            pcg,
            machine,
            restarts=1 if deterministic else 4,
            max_evaluations=DETERMINISTIC_EVALUATIONS if deterministic else None,
            optimizer=optimizer,
            runtime=runtime,
            time_limit_s=clock.limit("coordinate descent"),
        )
        say(repr(found))
        walked = metropolis_hastings(
            pcg,
            machine,
            steps=DETERMINISTIC_EVALUATIONS if deterministic else found.evaluations,
            start=found.strategies,
            optimizer=optimizer,
            runtime=runtime,
            time_limit_s=clock.limit("metropolis-hastings"),
        )
        say(repr(walked))
    except (BaselineError, CostError) as e:
        say(f"the layer-wise searches do not apply: {e}")
        return dict.fromkeys(("coordinate descent", "metropolis-hastings"))
    return {
        "coordinate descent": (found.pcg, found.cost),
        "metropolis-hastings": (walked.pcg, walked.cost),
    }


def _baselines(
    pcg: PCG, machine: Machine, optimizer: str, runtime: Runtime, say: Callable[[str], None]
) -> dict[str, tuple[PCG, CostBreakdown] | None]:
    """The data-parallel, FSDP, ZeRO-1/2, Megatron (with and without sequence parallelism)
    and sequential plans with their costs (None: not applicable, said why)."""
    fixed: dict[str, tuple[PCG, CostBreakdown] | None] = {}
    makers = (
        ("data parallel", data_parallel),
        ("fsdp", fsdp),
        ("megatron", megatron),
        ("megatron-sp", megatron_sp),
        # Unity's "sequential optimization": single-device fusion first, then parallelism.
        ("fused, then data parallel or megatron", sequential),
    )
    for name, make in makers:
        try:
            plan = make(pcg, machine)
            fixed[name] = (
                plan,
                iteration_cost(plan, machine, optimizer=optimizer, runtime=runtime),
            )
        except (BaselineError, CostError) as e:
            say(f"baseline {name} does not apply: {e}")
            fixed[name] = None
    fixed.update(_zero_baselines(fixed.get("data parallel"), machine, optimizer, runtime, say))
    return fixed


def _zero_baselines(
    data_parallel_plan: tuple[PCG, CostBreakdown] | None,
    machine: Machine,
    optimizer: str,
    runtime: Runtime,
    say: Callable[[str], None],
) -> dict[str, tuple[PCG, CostBreakdown] | None]:
    """ZeRO-1 and ZeRO-2: the data-parallel plan with its optimizer state (and gradients) sharded
    over the copies of each weight, a runtime option its cost carries
    (:attr:`~pcgopt.extract.Runtime.zero_stage`); none if the runtime already shards, or
    there is no data-parallel plan."""
    if data_parallel_plan is None or runtime.zero_stage:
        return {}
    plan = data_parallel_plan[0]
    found: dict[str, tuple[PCG, CostBreakdown] | None] = {}
    for stage in (1, 2):
        try:
            cost = iteration_cost(
                plan, machine, optimizer=optimizer, runtime=replace(runtime, zero_stage=stage)
            )
        except CostError as e:
            say(f"baseline zero-{stage} does not apply: {e}")
            found[f"zero-{stage}"] = None
            continue
        found[f"zero-{stage}"] = (plan, cost)
    return found


def _baseline_phase(
    search: _Search, build: bool
) -> tuple[dict[str, tuple[PCG, CostBreakdown] | None], list[PCG]]:
    """The baselines phase (if ``build``): the data-parallel, Megatron and sequential plans and
    those of one node, built before saturation so that their time comes out of its share (the
    phases after it have shares of their own); and the plans graph splitting seeds with, the
    whole machine's data-parallel and Megatron ones (for their layouts at the cuts)."""
    start = time.perf_counter()
    fixed: dict[str, tuple[PCG, CostBreakdown] | None] = {}
    if build:
        search.say("building the baselines: data parallel, fsdp, zero, megatron, fused then either")
        options = (search.pcg, search.machine, search.optimizer, search.runtime, search.say)
        fixed = _baselines(*options)
        fixed.update(_on_one_node(*options))
    search.phases["baselines"] = time.perf_counter() - start
    seeds = [v[0] for k, v in fixed.items() if k in ("data parallel", "megatron") and v]
    return fixed, seeds


def _on_one_node(
    pcg: PCG, machine: Machine, optimizer: str, runtime: Runtime, say: Callable[[str], None]
) -> dict[str, tuple[PCG, CostBreakdown] | None]:
    """The data-parallel and Megatron plans of one node of a machine of several, costed on the
    whole machine (the other nodes idle): a plan for part of the machine is a plan for all of
    it, and one the search must not lose to where crossing nodes costs more than it gains."""
    node = machine.one_node()
    if node is None:
        return {}
    found: dict[str, tuple[PCG, CostBreakdown] | None] = {}
    for name, make in (("data parallel", data_parallel), ("megatron", megatron)):
        try:
            plan = make(pcg, node)
            found[f"{name} on one node"] = (
                plan,
                iteration_cost(plan, machine, optimizer=optimizer, runtime=runtime),
            )
        except (BaselineError, CostError) as e:
            say(f"baseline {name} on one node does not apply: {e}")
    return found


def _branch_parallel(search: _Search) -> tuple[PCG, CostBreakdown] | None:
    """Data parallelism narrowed where branches run at once, with tensor parallelism inside
    branches found by coordinate descent under the mapping (the phase "branch parallel", after
    "branch views" if no phase before it needed them)."""
    pcg, machine, optimizer, say = search.pcg, search.machine, search.optimizer, search.say
    runtime = search.runtime
    search.phases["branch parallel"] = 0.0
    try:
        views = search.branch_views("branch parallel")
    except (BaselineError, CostError) as e:
        say(f"branch parallel does not apply: {e}")
        return None
    if views is None or not views.narrowed:
        say("branch parallel: no branch narrows")
        return None
    start = time.perf_counter()
    say(f"branch parallel: narrowing {views.narrowed} nodes, tensor parallel inside them")
    try:
        branches = branch_parallel(
            pcg,
            machine,
            optimizer=optimizer,
            runtime=runtime,
            time_limit_s=search.clock.limit("branch parallel"),
            views=views,
        )
    except (BaselineError, CostError) as e:
        say(f"branch parallel does not apply: {e}")
        return None
    finally:
        search.phases["branch parallel"] = time.perf_counter() - start
    say(repr(branches) if branches else "branch parallel: no branch narrows")
    if branches is None:
        return None
    return branches.pcg, search.cost(branches.pcg)


#: Why a candidate is left out when the placement phase's time is spent before its turn.
UNPLACED = "not placed and mapped: the time budget ran out"


def _in_model_names(
    model: PCG, plan: PCG, cost: CostBreakdown, memo: dict[PCG, tuple[PCG, dict[str, str]]]
) -> tuple[PCG, CostBreakdown]:
    """``plan`` with the model's names put back on the nodes that compute what the model's nodes
    compute, so that it reads in the user's terms (the searches name what they build by
    operator); its cost is renamed with it, not computed again. ``memo``: the plans renamed
    so far."""
    if plan not in memo:
        names = model_names(model, plan)
        memo[plan] = (
            (plan.renamed(names), names)
            if any(k != v for k, v in names.items())
            else (
                plan,
                {},
            )
        )
    renamed, names = memo[plan]
    return (renamed, cost.renamed(names)) if names else (plan, cost)


def _place_and_map(
    candidates: dict[str, tuple[PCG, CostBreakdown] | None],
    machine: Machine,
    optimizer: str,
    clock: _Clock,
    say: Callable[[str], None],
    model: PCG | None = None,
    cache: MappingCache | None = None,
) -> tuple[dict[str, PlanPlacement], dict[str, MachineMapping], dict[tuple[PCG, Runtime], str]]:
    """Places every candidate's parallelism axes on the hierarchy (P^2's parallelism matrices,
    reductions priced with synthesized programs), then maps each onto the machine (branches at
    once on disjoint devices where faster), with one memo table: candidates share most
    sub-graphs. Each candidate's cost becomes its placed and mapped cost, under the runtime its
    cost carries, and (given the ``model``) its nodes take the model's names
    (:func:`_in_model_names`); one that fails is left out (None). The candidates are placed
    fastest first (by their cost before placement); once the phase's time is spent
    (:meth:`_Clock.spent`), those not yet placed are left out too (None, with a message);
    the first is always placed. Past that time a plan split along its batch alone
    (:func:`batch_split_only`) is still placed while its cost before placement beats every
    placed one: that cost is one its default placement has on a real machine (a mixed plan's
    assumes every group on the closest devices at once, so placed it can come out slower: a
    BERT-Large plan of the e-graph on 48 Summit GPUs went from 885.71 to 1,726.77 ms, against
    1,198.17 ms for data parallelism, which was left out), and placing it takes a fraction of a
    second. Returns the placements, the mappings and why plans failed or were not placed."""
    placements: dict[str, PlanPlacement] = {}
    mappings: dict[str, MachineMapping] = {}
    if cache is None:  # (an empty cache is falsy: it has a length)
        cache = MappingCache(machine)
    # Searches often agree (metropolis-hastings keeps coordinate descent's plan): one
    # placement per distinct plan.
    # A candidate is costed under the runtime its cost carries (ZeRO's baselines carry their
    # own); a plan and runtime is placed and mapped once, and a plan placed under one runtime
    # keeps that placement under another (ZeRO changes each weight's sync, not its groups).
    done: dict[tuple[PCG, Runtime], tuple[PlanPlacement, MachineMapping, CostBreakdown]] = {}
    placed_as: dict[PCG, PlanPlacement] = {}
    # Fastest first, by cost before placement; the candidates of one plan together, in the
    # order given (so a plan is placed under the runtime of its first candidate, as before).
    names = [name for name, value in candidates.items() if value is not None]
    best: dict[PCG, tuple[bool, float]] = {}
    for name in names:
        plan, cost = candidates[name]  # type: ignore[misc]
        best[plan] = min(best.get(plan, _rank(cost)), _rank(cost))
    pending = sorted(names, key=lambda n: best[candidates[n][0]])  # type: ignore[index]
    failed: dict[tuple[PCG, Runtime], str] = {}
    renamed: dict[PCG, tuple[PCG, dict[str, str]]] = {}
    for k, name in enumerate(pending):
        plan, cost = candidates[name]  # type: ignore[misc]
        key = (plan, cost.runtime)
        if key not in done and key not in failed and done and clock.spent("placement and mapping"):
            fastest = min(_rank(placed[2]) for placed in done.values())
            if not (_rank(cost) < fastest and batch_split_only(plan)):
                failed[key] = UNPLACED
        if key not in done and key not in failed:
            # What is left of the budget, shared by the plans still to place.
            left = {(candidates[n][0], candidates[n][1].runtime) for n in pending[k:]}  # type: ignore[index]
            try:
                named, named_cost = (
                    (plan, cost) if model is None else _in_model_names(model, plan, cost, renamed)
                )
                done[key] = mapped_cost(
                    named,
                    machine,
                    optimizer=optimizer,
                    runtime=cost.runtime,
                    cost=named_cost,
                    cache=cache,
                    time_limit_s=clock.left() / max(1, len(left - done.keys())),
                    placement=placed_as.get(named),
                )
                placed_as.setdefault(named, done[key][0])
            except CostError as e:  # a bug, but the other candidates still stand
                failed[key] = str(e)
                warnings.warn(
                    f"saturate_and_extract: the {name} plan could not be placed and mapped, "
                    f"so it was left out: {e}",
                    stacklevel=3,
                )
        if key in failed:
            why = failed[key]
            say(
                f"{name}: left out, "
                + (why if why == UNPLACED else f"placing and mapping failed: {why}")
            )
            candidates[name] = None
            continue
        placements[name], mappings[name], final = done[key]
        candidates[name] = (renamed.get(plan, (plan, {}))[0], final)
    return placements, mappings, failed


@dataclass(frozen=True)
class _Explored:
    """What the saturation and extraction phases report to :class:`SearchStats`."""

    num_enodes: int
    num_eclasses: int
    iterations: int
    stop_reason: str
    extraction: str
    peak_rss_bytes: int
    segments: int = 1

    def stats(
        self,
        candidates: Mapping[str, tuple[PCG, CostBreakdown] | None],
        chosen: str,
        phases: dict[str, float],
        unplaced: frozenset[str] = frozenset(),
    ) -> SearchStats:
        """The search's statistics, with every candidate's cost and the one chosen."""
        costs = {k: (v[1].total_s if v is not None else None) for k, v in candidates.items()}
        return SearchStats(
            num_enodes=self.num_enodes,
            num_eclasses=self.num_eclasses,
            iterations=self.iterations,
            stop_reason=self.stop_reason,
            extraction=self.extraction,
            candidates=costs,
            chosen=chosen,
            phase_seconds=phases,
            peak_rss_bytes=self.peak_rss_bytes,
            segments=self.segments,
            infeasible=frozenset(
                k for k, v in candidates.items() if v is not None and not v[1].feasible
            ),
            unplaced=unplaced,
        )


@dataclass(frozen=True)
class _Search:
    """What every phase of one :func:`saturate_and_extract` call shares: the model and the
    machine, the clock, the rules (loading in the background), the saturation's options, the
    reporter, and the seconds each phase took (filled as they run)."""

    pcg: PCG
    machine: Machine
    optimizer: str
    runtime: Runtime
    clock: _Clock
    say: Callable[[str], None]
    progress: bool
    rules: list[Rule] | None
    rules_loaded: Future[float]
    memory_budget: int
    degrees: Sequence[int] | None
    presets: Sequence[str] | None
    deterministic: bool
    phases: dict[str, float] = field(default_factory=dict)
    # branch_views' answer (or why there is none), once computed.
    _views: list[tuple[ElasticViews | None, PCGError | None]] = field(default_factory=list)
    # The machine mapping's memo table, shared by every phase that maps plans.
    mapping_cache: MappingCache | None = None

    def __post_init__(self) -> None:
        if self.mapping_cache is None:
            object.__setattr__(self, "mapping_cache", MappingCache(self.machine))

    def cost(self, plan: PCG) -> CostBreakdown:
        """``plan``'s cost under the search's optimizer and runtime."""
        return iteration_cost(plan, self.machine, optimizer=self.optimizer, runtime=self.runtime)

    @property
    def rewrite_options(self) -> dict[str, Any]:
        return {"degrees": self.degrees, "presets": self.presets}

    def branch_views(self, phase: str) -> ElasticViews | None:
        """The devices each compute node gets when branches run at once (the mapping DP on
        elastic units, :func:`~pcgopt.extract.strategies.branches.elastic_views`), computed by
        the first phase that asks, within its time limit; None if no degree could be costed.
        Raises :class:`BaselineError` where it does not apply (no batch to split, a parallel
        input)."""
        if not self._views:
            start = time.perf_counter()
            try:
                found = elastic_views(
                    self.pcg,
                    self.machine,
                    optimizer=self.optimizer,
                    runtime=self.runtime,
                    time_limit_s=self.clock.limit(phase),
                )
                self._views.append((found, None))
            except (BaselineError, CostError) as e:
                self._views.append((None, e))
            self.phases["branch views"] = time.perf_counter() - start
        found, error = self._views[0]
        if error is not None:
            raise error
        return found

    def saturation_budget(
        self,
        seconds: float,
        after_seconds_per_enode: float = EXTRACTION_SECONDS_PER_ENODE,
        onset_growth: float | None = None,
    ) -> Budget:
        """Saturation's budget: ``seconds`` (with the time to cost and extract what it
        leaves), or in a deterministic search :data:`DETERMINISTIC_BUDGET`. No speculative
        iterations: they would use up the whole share whenever the next iteration is
        predicted not to fit (the suite's searches took 40% longer with them). The
        predictions are fitted to measurements instead (``pcgopt.egraph.saturate``'s
        ``SECOND_ITERATION_GROWTH`` and the constants beside it)."""
        if self.deterministic:
            return replace(DETERMINISTIC_BUDGET, memory_bytes=self.memory_budget)
        return Budget(
            seconds=seconds,
            memory_bytes=self.memory_budget,
            speculate=False,
            after_seconds_per_enode=after_seconds_per_enode,
            onset_growth=onset_growth,
        )


def _explore(
    search: _Search,
    seed_plans: Sequence[PCG],
    baseline_plans: Sequence[PCG],
    split: bool | None,
    min_segment_ops: int,
) -> tuple[dict[str, PCG | None], _Explored]:
    """The e-graph's plans by name (None: extraction failed): graph splitting where the model
    has cuts into two segments of ``min_segment_ops`` operators (unless ``split`` is False),
    else the whole PCG."""
    segments = split_segments(search.pcg, min_segment_ops) if split is not False else ()
    if split and len(segments) < 2:
        search.say(f"graph splitting: no cut leaves two segments of {min_segment_ops} operators")
    # Loading the seeds and extracting them again takes time of its own, whatever the limit
    # (BERT-Large on 64 GPUs: 2 s); under a quarter of the share it only overruns. Asked
    # before waiting for the shipped rules (they load in the background since the call
    # began; what is left of that comes out of saturation's share) and again after.
    waited = 0.0
    if not search.clock.spent("saturate", MIN_START_PART):
        start = time.perf_counter()
        search.rules_loaded.result()
        waited = time.perf_counter() - start
    elif search.rules_loaded.done():
        search.rules_loaded.result()  # raises what loading them raised, if anything
    if search.clock.spent("saturate", MIN_START_PART):
        search.say("no saturation: the time budget ran out before its phase")
        search.phases["saturate"] = waited
        return {}, _Explored(0, 0, 0, "time budget (not started)", "skipped", 0)
    if len(segments) >= 2:
        found = _split_phase(search, seed_plans, baseline_plans, min_segment_ops)
    else:
        found = _whole_phase(search, seed_plans)
    search.phases["saturate"] += waited
    return found


def _whole_phase(
    search: _Search, seed_plans: Sequence[PCG]
) -> tuple[dict[str, PCG | None], _Explored]:
    """Saturation of the whole PCG, then extraction: costed in sequence ("e-graph"); where
    branches can run at once, with them priced by their share of the machine ("e-graph,
    branches at once", :func:`~pcgopt.extract.search.extraction.concurrent_costs`); and on a
    machine of several nodes, costed on one node ("e-graph on one node"). The plans extracted
    (None if extraction failed) and what to report."""
    pcg, machine, clock, phases, say = (
        search.pcg,
        search.machine,
        search.clock,
        search.phases,
        search.say,
    )
    start = time.perf_counter()
    say(f"saturating on {machine.name} ({machine.num_devices} devices)")
    sat = saturate(
        pcg,
        machine,
        rules=search.rules,
        # Saturation runs into greedy extraction's share as long as its e-graph leaves the
        # time to cost and extract it.
        budget=search.saturation_budget(
            clock.limit("extract greedy"),
            WHOLE_EXTRACTION_SECONDS_PER_ENODE,
            ALGEBRA_ONSET_NEXT_GROWTH,
        ),
        progress=search.progress,
        seeds=list(dict.fromkeys(seed_plans)),
        **search.rewrite_options,
    )
    phases["saturate"] = time.perf_counter() - start
    say(sat.summary())

    # The branches' views, timed as a phase of their own (the branch-parallel plan reuses
    # them).
    try:
        views = search.branch_views("extract greedy")
    except (BaselineError, CostError) as e:
        say(f"no branches at once: {e}")
        views = None
    start = time.perf_counter()
    costs = enode_costs(sat.egraph, machine, optimizer=search.optimizer, runtime=search.runtime)
    if costs.uncosted:
        say(f"{costs.uncosted} e-nodes read tensors without shape facts; they are left out")
    extracted: dict[str, PCG | None] = {}
    texts = []
    variants = [("e-graph", costs)]
    concurrent_share: Callable[[ENodeCosts], ENodeCosts] | None = None
    if views is not None and views.narrowed:
        devices = class_devices(sat.egraph, pcg, views.views, machine.num_devices)

        def concurrent_share(costs: ENodeCosts) -> ENodeCosts:
            return concurrent_costs(costs, devices)

        variants.append(("e-graph, branches at once", concurrent_share(costs)))
    node = machine.one_node()
    if node is not None:
        # Costed on one node, the extraction keeps within it where crossing nodes costs more
        # than it gains (per-e-node costs cannot see that a sync at once on several nodes
        # is what makes a whole-machine plan slower).
        variants.append(("e-graph on one node", repriced(costs, machine=node)))
    took: dict[str, float] = {}
    for name, variant in variants:
        begun = time.perf_counter()
        extracted[name], text = _extract(search, sat.egraph, variant)
        took[name] = time.perf_counter() - begun
        texts.append(text if name == "e-graph" else f"{name}: {text}")
        say(f"extracted: {texts[-1]}")
    # Placement in the loop, for the whole-machine extractions (the one-node costs keep to
    # one node, whose groups need no placement).
    until = _rounds_deadline(
        clock,
        search.deterministic,
        "branch parallel" not in clock.skipped and views is not None and bool(views.narrowed),
    )
    for name, _ in variants[:2]:
        share = None if name == "e-graph" else concurrent_share
        # A round reprices and extracts: predicted by the first costing and extraction.
        round_s = costs.seconds + took[name]
        found = _placed_rounds(search, costs, extracted[name], share, round_s, until)
        if found is not None and found[0] is not extracted[name]:
            extracted[name] = found[0]
            texts.append(f"{name}, placed in the loop: {found[1]}")
            say(f"extracted: {texts[-1]}")
    phases["extract"] = time.perf_counter() - start
    return extracted, _Explored(
        sat.num_enodes,
        sat.num_eclasses,
        sat.iterations,
        str(sat.stop_reason.value),
        "; ".join(texts),
        sat.peak_rss_bytes,
    )


def _rounds_deadline(clock: _Clock, deterministic: bool, branch_search_next: bool) -> float:
    """When extraction's placement rounds (:func:`_placed_rounds`) must end, as a
    ``time.perf_counter()`` value, beyond the clock's own limits. Where the branch-parallel
    search runs next, within the exact extraction's share from now: the time the phases before
    left goes to that search (on 8 Summit nodes the MLP's branch-parallel plan was 8% slower
    with 2.7 s instead of 6 s). Where it does not (no baselines, or no branch narrows), or in
    a deterministic search, none: the rounds may use the time it would have had (XDL on 4
    Summit nodes, the e-graph alone at 20 s: 1.105 -> 0.996 ms with this change alone, the call
    8.6 -> 11.6 s)."""
    if deterministic or not branch_search_next:
        return math.inf
    return time.perf_counter() + PHASE_SHARES["extract exact"] * clock.budget_s


#: Extraction with placement in the loop: at most this many extractions after the first, each
#: costing the e-graph on the groups of the last one's placement.
PLACEMENT_ROUNDS = 3


def _placed_rounds(
    search: _Search,
    base: ENodeCosts,
    plan: PCG | None,
    share: Callable[[ENodeCosts], ENodeCosts] | None,
    round_s: float,
    until: float,
) -> tuple[PCG, str] | None:
    """Extraction with placement in the loop (Unity 5.2's aim: the extractor ranks a choice by
    its cost as placed). Extraction costs every collective on the default placement's
    consecutive devices, each group the closest devices at once, which no placement of a plan
    mixing degrees gives them all: on 8 Summit nodes, the e-graph's MLP plan estimated at
    231 ms was 475 ms placed. So the extracted ``plan`` is placed and mapped
    (:func:`mapped_cost`), the e-graph costed again (``base``: its costs,
    :func:`~pcgopt.extract.search.extraction.repriced`) on that placement's groups
    (:func:`~pcgopt.extract.strategies.placement.placement_groups`: a degree the placement
    has no axes for is priced spread across the machine) and extracted again, up to
    :data:`PLACEMENT_ROUNDS` times, until an extraction repeats one before it or another
    round would not end by ``until`` (``time.perf_counter()``) and within the extraction
    phases' time (``round_s``: predicted from the first costing and extraction, then the
    last round's).
    ``share``: how the variant reprices the costs (branches at once), or None. Returns the
    plan of the least placed and mapped cost with its extraction's text, or None if there
    were no rounds."""
    # The rounds take the exact extraction's share too: it runs on small e-graphs only.
    if plan is None or search.clock.spent("extract exact"):
        return None
    seen: dict[PCG, CostBreakdown] = {}
    best: tuple[PCG, str] | None = None
    text = "the first extraction"
    for _ in range(PLACEMENT_ROUNDS):
        try:
            placed, _mapping, cost = mapped_cost(
                plan,
                search.machine,
                optimizer=search.optimizer,
                runtime=search.runtime,
                cost=search.cost(plan),
                cache=search.mapping_cache,
                time_limit_s=search.clock.limit("extract exact") / 4,
            )
        except CostError:
            break  # the placement phase reports it, and keeps the other candidates
        seen[plan] = cost
        if best is None or _rank(cost) < _rank(seen[best[0]]):
            best = plan, text
        if (
            placed.matrix is None
            or not search.clock.fits("extract exact", round_s)
            or time.perf_counter() + round_s > until
        ):
            break
        start = time.perf_counter()
        costs = repriced(base, groups=placement_groups(placed, search.machine))
        found, text = _extract(search, base.egraph, costs if share is None else share(costs))
        round_s = time.perf_counter() - start
        if found is None or found in seen:
            break
        plan = found
    return best


def _extract(search: _Search, egraph: EGraphData, costs: ENodeCosts) -> tuple[PCG | None, str]:
    """The plan ``costs`` rank first in ``egraph``: greedy, then exact for small e-graphs,
    within the extraction phases' time; None and why if no extraction exists."""
    try:
        extraction: Extraction = extract_greedy(
            costs, time_limit_s=search.clock.limit("extract greedy")
        )
        if egraph.num_enodes <= ILP_MAX_ENODES:
            try:
                extraction = extract_ilp(
                    costs,
                    time_limit_s=search.clock.limit("extract exact"),
                    warm_start=extraction,
                    node_limit=DETERMINISTIC_ILP_NODES if search.deterministic else None,
                )
            except ExtractionError as e:
                search.say(f"exact extraction skipped: {e}")
        return egraph.to_pcg(extraction.choice), repr(extraction)
    except ExtractionError as e:
        # The baselines and the input remain candidates: the call still returns a plan.
        return None, f"failed: {e}"


def _split_phase(
    search: _Search,
    seed_plans: Sequence[PCG],
    baseline_plans: Sequence[PCG],
    min_segment_ops: int,
) -> tuple[PCG | None, _Explored]:
    """Graph splitting (:mod:`pcgopt.extract.search.splitting`) in saturation's and extraction's
    shares: the stitched plan (None if it failed) and what to report. The data-parallel and
    Megatron plans join the seeds, for their layouts at the cuts (``baseline_plans`` if the
    caller built them, else built here)."""
    start = time.perf_counter()
    seeds = list(seed_plans)
    if baseline_plans:
        seeds += baseline_plans
    else:
        for make in (data_parallel, megatron):
            with contextlib.suppress(BaselineError, CostError):
                seeds.append(make(search.pcg, search.machine))
    clock = search.clock
    extract_s = (PHASE_SHARES["extract greedy"] + PHASE_SHARES["extract exact"]) * clock.budget_s
    found = split_search(
        search.pcg,
        search.machine,
        seeds=seeds,
        rules=search.rules,
        min_ops=min_segment_ops,
        saturate_s=clock.limit("saturate"),
        extract_s=extract_s,
        memory_budget=search.memory_budget,
        segment_budget=search.saturation_budget(math.inf) if search.deterministic else None,
        optimizer=search.optimizer,
        progress=search.say,
        progress_bar=search.progress,
        **search.rewrite_options,
    )
    assert found is not None  # the caller split it already
    search.phases["saturate"] = found.saturate_seconds
    search.phases["extract"] = time.perf_counter() - start - found.saturate_seconds
    search.say(repr(found))
    text = repr(found) if found.pcg is not None else f"failed: {found.failures}"
    return {"e-graph": found.pcg}, _Explored(
        found.num_enodes,
        found.num_eclasses,
        found.iterations,
        found.stop_reason,
        text,
        found.peak_rss_bytes,
        len(found.segments),
    )


def _reporter(progress: bool | Callable[[str], None]) -> Callable[[str], None]:
    """What ``progress`` asks for: a callable, or lines on stderr stamped with the seconds since
    the call began, so that a reader sees where the time goes."""
    if callable(progress):
        return progress
    if progress:
        start = time.perf_counter()
        return lambda msg: print(
            f"[pcgopt {time.perf_counter() - start:5.1f} s] {msg}", file=sys.stderr, flush=True
        )
    return lambda msg: None
