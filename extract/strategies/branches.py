"""Branch-parallel plans: data parallelism whose degree narrows where branches run at once
(Unity section 5.2, where extraction and machine mapping interact).

A data-parallel plan spans as many devices as its degree, in every node, so the machine-mapping DP
(:func:`~pcgopt.extract.search.mapping.map_machine`) cannot run two of its branches at once: neither
fits beside the other. CANDLE-Uno's five feature towers on a 6-GPU Summit node show what that loses:
run one after another on all six GPUs, or side by side on one or two GPUs each. Such a plan is only
cheaper once mapped, and extraction costs plans as if their nodes ran in sequence, so no other
search proposes it. :func:`branch_parallel` does:

1. **Elastic costs.** The data-parallel plan at every legal degree ``d`` (a divisor of the
   batch, at most the machine's devices) is costed by the cost model, and every node's time is
   charged to the sequential node it came from (a Replicate to its Weight's reader, an
   AllReduce to what it reduces). A unit of the sequential graph (as the mapping forms them)
   then has a time on every view of ``w`` devices: at degree ``d(w)``, the largest legal one up
   to ``w``.
2. **The mapping DP on elastic units.** The sequential graph's series-parallel decomposition is
   solved with those times: a parallel split runs its sides in sequence on the whole view, or at
   once on a division of it, each side then at the degree its share allows; moves between
   divided sides carry each receiving device's share of the tensor. The solution says how many
   devices every unit gets, hence its degree.
3. **The plan.** The sequential PCG is lowered with each compute node at its degree
   (:func:`lower_degrees`): a node whose inputs come at another degree gets them
   redistributed (an AllGather and DiscardCopies to narrow, a Partition to widen), so the plan
   is an ordinary PCG, equivalent to the input.
4. **The descent.** Coordinate descent over the dense layers' SBP matmul strategies, each on
   the devices of its view, ranked by the exact cost under the mapping (a tensor-parallel
   assignment placed by P^2, as :func:`~pcgopt.extract.search.plan.saturate_and_extract` places it),
   within ``time_limit_s``. Besides one layer at a time, it moves all layers of one operator
   together (every embedding table's columns split 2 ways, say): branches that run at once
   take as long as the slowest, so a move of one branch alone often gains nothing.

The estimate of step 2 leaves out the redistributions step 3 adds (a degree change at a join
can cost more than the DP saw), so the plan is judged like every other candidate:
:func:`~pcgopt.extract.search.plan.saturate_and_extract` places and maps it
with the exact cost model, and keeps it only if it is the fastest.

>>> from pcgopt import Machine
>>> from pcgopt.models import build
>>> from pcgopt.extract import data_parallel
>>> from pcgopt.extract.search.plan import mapped_cost
>>> summit, pcg = Machine.preset("summit"), build("candle_uno", batch=6 * 64)  # full size
>>> found = branch_parallel(pcg, summit)
>>> found.narrowed > 0  # towers below the widest data-parallel degree
True
>>> def mapped_s(plan):
...     return mapped_cost(plan, summit)[2].total_s
>>> mapped_s(found.pcg) < mapped_s(data_parallel(pcg, summit))
True
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from pcgopt.builder import Tensor
from pcgopt.divisors import largest_divisor
from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.cost import CostError, iteration_cost
from pcgopt.extract.costmodel.simulate import DDP, Runtime
from pcgopt.extract.search.mapping import (
    MappingCache,
    _annotate,
    _decompose,
    _Solver,
    _units,
    map_machine,
)
from pcgopt.extract.strategies.baselines import (
    BaselineError,
    _check_sequential,
    batch_size,
    data_parallel,
)
from pcgopt.extract.strategies.layerwise import (
    MatmulStrategy,
    _LayerwiseLowering,
    check_strategies,
    dense_layers,
    strategies_for,
)
from pcgopt.extract.strategies.placement import batch_split_only, place_plan
from pcgopt.graph import PCG, Node
from pcgopt.machine import Machine
from pcgopt.ops import OpKind

__all__ = ["BranchParallel", "ElasticViews", "branch_parallel", "elastic_views", "lower_degrees"]


@dataclass(frozen=True)
class ElasticViews:
    """The mapping DP's answer on elastic units (module docstring, steps 1 and 2): the batch
    ``degrees`` and the ``views`` (devices) of the sequential graph's compute nodes; the DP's
    ``estimate_s`` against ``uniform_s`` (every node at the ``widest`` degree, in sequence);
    how many compute nodes are ``narrowed`` below the widest degree."""

    degrees: Mapping[str, int] = field(repr=False)
    views: Mapping[str, int] = field(repr=False)
    estimate_s: float
    uniform_s: float
    widest: int
    narrowed: int


@dataclass(frozen=True)
class BranchParallel:
    """A branch-parallel plan: its ``pcg``; the mapping DP's ``views`` it was lowered from
    (the batch ``degrees`` of its compute nodes, the DP's ``estimate_s`` against ``uniform_s``,
    how many compute nodes are ``narrowed`` below the ``widest`` degree: properties here too);
    the ``strategies`` of its dense layers; ``mapped_s``, the plan's time under the exact cost
    model and machine mapping (default placement for batch splits, P^2's for tensor-parallel
    layers); and how many assignments the descent costed (``evaluations``)."""

    pcg: PCG = field(repr=False)
    views: ElasticViews = field(repr=False)
    strategies: Mapping[str, MatmulStrategy] = field(repr=False)
    mapped_s: float
    evaluations: int

    @property
    def degrees(self) -> Mapping[str, int]:
        return self.views.degrees

    @property
    def estimate_s(self) -> float:
        return self.views.estimate_s

    @property
    def uniform_s(self) -> float:
        return self.views.uniform_s

    @property
    def widest(self) -> int:
        return self.views.widest

    @property
    def narrowed(self) -> int:
        return self.views.narrowed

    def __repr__(self) -> str:
        split = sum(1 for s in self.strategies.values() if s.columns * s.contraction > 1)
        return (
            f"BranchParallel({self.narrowed} of {len(self.degrees)} compute nodes below degree "
            f"{self.widest}, {split} dense layers tensor parallel; {self.mapped_s * 1e3:.4g} ms "
            f"mapped (DP estimate {self.estimate_s * 1e3:.4g} ms, data parallel in sequence "
            f"{self.uniform_s * 1e3:.4g} ms); {self.evaluations} assignments costed)"
        )


class _DegreeLowering(_LayerwiseLowering):
    """Data-parallel lowering with a batch degree per compute node (module docstring); dense
    layers given a strategy run it instead."""

    def __init__(
        self,
        pcg: PCG,
        degrees: Mapping[str, int],
        input_degree: int,
        strategies: Mapping[str, MatmulStrategy],
    ) -> None:
        super().__init__(pcg, strategies, input_degree)
        self.degrees = degrees
        consumers = pcg.consumers()
        self.input_degrees = {
            n.name: min(
                (degrees[r] for r, _ in consumers.get(n.output(), ()) if r in degrees),
                default=input_degree,
            )
            for n in pcg.inputs
        }

    def _lower(self, node: Node) -> None:
        if node.op == "input":
            self.dp = self.input_degrees[node.name]  # split as its first readers need it
        super()._lower(node)

    def _attempts(self, node: Node, data: dict[int, Tensor]):  # type: ignore[no-untyped-def]
        attempts = super()._attempts(node, data)
        degree = self.degrees.get(node.name)
        if degree is None or not data:
            return attempts
        first = min(data)
        rank = data[first].shape.rank
        if rank == 0 or data[first].shape.sizes[0] % degree:
            return attempts
        target = (degree, *([1] * (rank - 1)))
        # Its own degree first; the inputs' layouts (and the fallbacks) if that fails.
        return [self._matching(node, data, first, target, 1), *attempts]


def lower_degrees(
    pcg: PCG,
    machine: Machine,
    degrees: Mapping[str, int],
    strategies: Mapping[str, MatmulStrategy] | None = None,
) -> PCG:
    """``pcg`` (sequential) data parallel with compute node ``name`` split by batch
    ``degrees[name]`` ways (nodes left out follow their inputs): inputs arriving at another degree
    are redistributed. Dense layers in ``strategies`` run that SBP matmul strategy instead
    (:func:`~pcgopt.extract.strategies.layerwise.lower`). Raises
    :class:`~pcgopt.extract.strategies.baselines.BaselineError` for a node that is not a compute
    node of ``pcg``, a degree that does not divide the batch or exceeds the machine, or a strategy
    that cannot be applied."""
    _check_sequential(pcg)
    strategies = dict(strategies or {})
    check_strategies(pcg, machine, strategies)
    batch = batch_size(pcg)
    for name, degree in degrees.items():
        node = pcg.node(name) if name in pcg else None
        if node is None or node.spec.kind is not OpKind.COMPUTE:
            raise BaselineError(f"node {name!r} is not a compute node of the PCG", node=name)
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise BaselineError(
                f"node {name!r}: degree must be a positive integer, got {degree!r}", node=name
            )
        if batch % degree or degree > machine.num_devices:
            raise BaselineError(
                f"node {name!r}: degree {degree} must divide the batch ({batch}) and be at most "
                f"the {machine.num_devices} devices of {machine.name!r}",
                node=name,
            )
    widest = max(degrees.values(), default=largest_divisor(batch, machine.num_devices))
    plan = _DegreeLowering(pcg, degrees, widest, strategies).lowered()
    for node in plan.nodes:
        width = max(
            s.num_shards for s in (*plan.input_shapes(node.name), *plan.output_shapes(node.name))
        )
        if width > machine.num_devices:
            raise BaselineError(
                f"node {node.name!r} ({node.op}) of the lowered plan spans {width} devices, "
                f"machine {machine.name!r} has {machine.num_devices}: these degrees and "
                "strategies do not fit together",
                node=node.name,
            )
    return plan


def _origins(plan: PCG, unit_of: Mapping[str, int]) -> list[tuple[str, int]]:
    """Each node of a data-parallel ``plan`` with the sequential unit it came from: its own
    name's, else its first input's (layout operators follow what they lay out)."""
    origin: dict[str, int] = {}
    out = []
    for n in plan.nodes:
        if n.name in unit_of:
            origin[n.name] = unit_of[n.name]
        elif n.inputs:
            origin[n.name] = origin[n.inputs[0].node]
        else:
            continue
        out.append((n.name, origin[n.name]))
    return out


def elastic_views(
    pcg: PCG,
    machine: Machine,
    *,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    time_limit_s: float | None = None,
) -> ElasticViews | None:
    """How many devices each compute node of the sequential ``pcg`` gets when branches that
    run at once share ``machine`` (module docstring, steps 1 and 2), or None when no degree of
    the batch could be costed. ``time_limit_s`` bounds the costing of degrees (the widest
    first; after half the limit no further degree is costed, and views narrower than every
    costed degree are not used); the DP itself is not bounded. Raises
    :class:`~pcgopt.extract.strategies.baselines.BaselineError` when ``pcg`` has no batch to
    split or is already parallel."""
    _check_sequential(pcg)
    batch = batch_size(pcg)
    # The degrees views can get: the largest divisor of the batch up to each view's size.
    sizes = {
        a * math.prod(machine.counts[j + 1 :])
        for j in range(len(machine.counts))
        for a in range(1, machine.counts[j] + 1)
    }
    started = time.perf_counter()
    legal = sorted({largest_divisor(batch, w) for w in sizes})
    sequential_cost = iteration_cost(pcg, machine, optimizer=optimizer, runtime=runtime)
    units, unit_of = _units(pcg, sequential_cost, {})
    table = np.full((len(units), len(legal)), math.inf)
    # Costing a degree is a lowering and a costing of the whole plan (about half a second for
    # BERT-Large on 48 GPUs): within a time limit, the widest degrees first, in at most half
    # of it (the widest always), so that the caller keeps the rest.
    for k in sorted(range(len(legal)), key=lambda k: -legal[k]):
        degree = legal[k]
        late = time_limit_s is not None and time.perf_counter() - started > time_limit_s / 2
        if late and k != len(legal) - 1:
            break
        try:
            plan = data_parallel(pcg, machine, degree=degree)
            cost = iteration_cost(plan, machine, optimizer=optimizer, runtime=runtime)
        except (PCGError, CostError):
            continue  # this degree does not apply: never chosen
        column = np.zeros(len(units))
        for name, u in _origins(plan, unit_of):
            column[u] += cost.per_node[name].total_s
        table[:, k] = column
    usable = [k for k in range(len(legal)) if np.isfinite(table[0, k])]
    if not usable:
        return None
    # The degree a view of w devices gets: the largest usable one up to w (none, if the time
    # limit left out every degree that small: such a view is never chosen).
    by_width = {w: max((k for k in usable if legal[k] <= w), default=-1) for w in sizes}

    def unit_s(u: int, width: int) -> float:
        k = by_width[width]
        return math.inf if k < 0 else float(table[u, k])

    cache = MappingCache(machine)
    tree = _decompose(units, tuple(range(len(units))))
    _annotate(tree, units, cache)
    solver = _Solver(
        machine, 1, cache, unit_s=unit_s, receivers=lambda width: legal[max(0, by_width[width])]
    )
    root = solver.normalize(0, machine.counts[0])
    estimate = solver.solve(tree, root)
    placed: dict[int, tuple[int, float, float, int]] = {}
    solver.schedule(tree, root, 0, 0.0, units, placed, [0.0, 0.0, 0.0])
    widest = legal[by_width[machine.num_devices]]
    degrees: dict[str, int] = {}
    views: dict[str, int] = {}
    for u in units:
        degree = legal[by_width[placed[u.index][3]]]
        for name in u.nodes:
            if pcg.node(name).spec.kind is OpKind.COMPUTE:
                degrees[name], views[name] = degree, placed[u.index][3]
    return ElasticViews(
        degrees=MappingProxyType(degrees),
        views=MappingProxyType(views),
        estimate_s=estimate,
        uniform_s=float(table[:, by_width[machine.num_devices]].sum()),
        widest=widest,
        narrowed=sum(1 for d in degrees.values() if d < widest),
    )


def branch_parallel(
    pcg: PCG,
    machine: Machine,
    *,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    time_limit_s: float | None = None,
    views: ElasticViews | None = None,
) -> BranchParallel | None:
    """The branch-parallel plan of ``pcg`` on ``machine`` (module docstring), or None when the DP
    narrows no branch (the plan would be data parallelism). ``time_limit_s`` bounds step 1 (as
    :func:`elastic_views` says) and the coordinate descent of step 4 (checked before every
    evaluation); the DP itself is not bounded. ``views``: steps 1 and 2 done already
    (:func:`elastic_views` of the same arguments). Raises
    :class:`~pcgopt.extract.strategies.baselines.BaselineError` when ``pcg`` has no batch to split
    or is already parallel."""
    started = time.perf_counter()
    _check_sequential(pcg)
    found = views
    if found is None:
        found = elastic_views(
            pcg, machine, optimizer=optimizer, runtime=runtime, time_limit_s=time_limit_s
        )
    if found is None or not found.narrowed:
        return None
    left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - started)
    strategies, plan, mapped_s, evaluations = _descend(
        pcg,
        machine,
        found.degrees,
        found.views,
        optimizer=optimizer,
        runtime=runtime,
        time_limit_s=left,
    )
    return BranchParallel(
        pcg=plan,
        views=found,
        strategies=MappingProxyType(strategies),
        mapped_s=mapped_s,
        evaluations=evaluations,
    )


def _descend(
    pcg: PCG,
    machine: Machine,
    degrees: Mapping[str, int],
    views: Mapping[str, int],
    *,
    optimizer: str,
    runtime: Runtime,
    time_limit_s: float | None,
) -> tuple[dict[str, MatmulStrategy], PCG, float, int]:
    """Coordinate descent (AutoDDL section 4.4) over the SBP matmul strategies of the dense
    layers, each on the devices of its view (or its data-parallel degree's), ranked by the
    exact cost model's time under the machine mapping: the plan the DP estimated, made
    consistent with the exact costs (the redistributions, tensor parallelism in a branch).
    Starts from data parallelism at each layer's degree; the slowest layers first, so a time
    limit leaves out the least.

    The descent steps by the mapping DP's estimate (units at their additive cost), and the
    plan returned is the one of every plan it costed that the simulated iteration ranks first:
    with communication hidden behind the backward, tensor parallelism in one layer of a
    branch rarely pays for its redistributions on its own, so the simulation's landscape
    stops a one-layer-at-a-time descent where the estimate's leads on to splitting them all
    (MLP on 8 Summit nodes: 228 ms against 171 ms, simulated)."""
    started = time.perf_counter()
    cache = MappingCache(machine)
    # assignment -> (the estimate's rank, the simulation's rank, the plan)
    seen: dict[tuple, tuple[tuple[bool, float], tuple[bool, float], PCG | None]] = {}

    def evaluate(assignment: dict[str, MatmulStrategy]) -> tuple[bool, float]:
        key = tuple(sorted(assignment.items()))
        if key not in seen:
            try:
                plan = lower_degrees(pcg, machine, degrees, assignment)
                cost = iteration_cost(plan, machine, optimizer=optimizer, runtime=runtime)
                devices = None
                if not batch_split_only(plan):  # placed as saturate_and_extract will place it
                    placed = place_plan(
                        plan, machine, optimizer=optimizer, runtime=runtime, default_cost=cost
                    )
                    cost, devices = placed.cost, placed.devices
                mapping = map_machine(plan, machine, cost=cost, devices=devices, cache=cache)
                # As saturate_and_extract costs it: mapped, or in sequence if that is faster.
                mapped = mapping.cost(cost)
                fits = mapped.feasible
                in_sequence = (not cost.feasible, cost.total_s)
                estimate = (not fits, mapping.time_s) if mapping.divided_splits else in_sequence
                simulated = (not fits, mapped.total_s)
                seen[key] = (min(estimate, in_sequence), min(simulated, in_sequence), plan)
            except (PCGError, CostError):
                seen[key] = ((True, math.inf), (True, math.inf), None)
        return seen[key][0]

    layers = [name for name in dense_layers(pcg) if name in degrees]
    options: dict[str, list[MatmulStrategy]] = {}
    current: dict[str, MatmulStrategy] = {}
    for name in layers:
        found = {
            o
            for devices in {degrees[name], views[name]}
            for o in strategies_for(pcg, name, machine, devices=devices)
        }
        start = MatmulStrategy(degrees[name], 1, 1)
        if start in found:
            current[name] = start
        # Most promising first: no partial sums, then even splits of batch and columns.
        options[name] = sorted(found, key=lambda o: (o.contraction, -min(o.batch, o.columns)))
    best = evaluate(current)
    first_plan = seen[tuple(sorted(current.items()))][2]
    if first_plan is None:  # data parallelism at the chosen degrees: a bug if it fails
        lower_degrees(pcg, machine, degrees, current)  # raises the error naming the node
        raise BaselineError("the branch-parallel degrees could not be costed or mapped")
    # The slowest layers first (their time in the plan at the start).
    start_cost = iteration_cost(first_plan, machine, optimizer=optimizer, runtime=runtime)
    layers.sort(key=lambda n: -start_cost.per_node[n].total_s if n in start_cost.per_node else 0)

    def over() -> bool:
        return time_limit_s is not None and time.perf_counter() - started > time_limit_s

    # Layers of one operator (a model's embedding tables, say) often sit in branches that run
    # at once, where the slowest branch sets the time: changing one of them alone gains
    # nothing, so the descent also moves a whole group by the same split.
    groups: dict[str, list[str]] = {}
    for name in layers:
        groups.setdefault(pcg.node(name).op, []).append(name)
    group_moves = [
        (members, axis, factor)
        for members in groups.values()
        if len(members) > 1
        for axis in ("columns", "contraction")
        for factor in sorted({getattr(o, axis) for n in members for o in options[n]} - {1})
    ]

    for _ in range(3):  # sweeps
        changed = False
        for name in layers:
            for option in options[name]:
                if over():
                    break
                if current.get(name) == option:
                    continue
                trial = {**current, name: option}
                key = evaluate(trial)
                if key < best:
                    current, best, changed = trial, key, True
        for members, axis, factor in group_moves:
            if over():
                break
            trial = dict(current)
            for name in members:
                moved = _moved(current.get(name), axis, factor)
                if moved in options[name]:
                    trial[name] = moved
            if trial != current:
                key = evaluate(trial)
                if key < best:
                    current, best, changed = trial, key, True
        if not changed or over():
            break
    key = min(seen, key=lambda k: seen[k][1])
    _, (_, seconds), plan = seen[key]
    assert plan is not None
    return dict(key), plan, seconds, len(seen)


def _moved(strategy: MatmulStrategy | None, axis: str, factor: int) -> MatmulStrategy | None:
    """``strategy`` with ``factor`` of its batch split moved to ``axis`` (columns or
    contraction), or None if the batch split is not a multiple of ``factor``."""
    if strategy is None or strategy.batch % factor:
        return None
    split = {axis: getattr(strategy, axis) * factor}
    return replace(strategy, batch=strategy.batch // factor, **split)
