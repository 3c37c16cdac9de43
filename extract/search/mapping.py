"""Machine mapping by dynamic programming over series-parallel splits (Unity, section 5.2).

A PCG fixes how every tensor is split, not which devices run what: the cost model
(:func:`~pcgopt.extract.costmodel.cost.iteration_cost`) puts every node's tasks on the first devices
and adds the nodes' times up, as if the whole graph ran one node after another. Independent branches
(DLRM's embedding tables, Inception's towers, the query/key/value projections) could instead run *at
once* on disjoint devices. :func:`map_machine` decides that:

**Units.** Every compute node is a unit; a source or parallelization node joins the unit that
reads it (a weight, its Replicate and the MatMul reading it run together), or is a unit of its
own if several units read it (an input every branch reads); a parallel node nothing reads (a
final Combine) joins its producer's. A unit's *footprint* is the number of devices from the
start of its block to the last it touches: its tasks, and the devices of any explicit device
groups of its parallel nodes. Units inherit the graph's edges, which go from lower to higher
unit in topological order.

**Splits.** The unit graph is cut recursively. A *sequence split* cuts at every unit that is
before or after every other unit (Unity's post-dominator; an edge may skip over it, as a
residual connection does, and its tensor is simply read later): the parts run one after the
other on the same devices. A *parallel split* separates weakly connected parts: every way of
cutting them into two groups is tried (up to six parts; more are first grouped into a binary
tree balanced in sequential time), and the two groups run either one after the other on all of
the view's devices or at once on a division of them, whichever is faster (Unity does not
interleave the two, nor does this). A part with neither split (not series-parallel) runs its
units in sequence.

**Views.** A view is a block of the machine hierarchy: ``a`` consecutive units of one level
(``a`` nodes, or ``a`` GPUs of one node). A parallel split divides the outermost level the view
spans into ``a1 + (a - a1)`` (Unity's search over resource quantities, quadratic rather than
over device subsets); above :data:`MAX_EXACT_DIVISIONS` units, ``a1`` is one of a logarithmic
set (powers of two from either end, and sixteenths), so that a machine of 100,000 nodes is
mapped in a second rather than minutes. Every block of ``a`` units of a level is laid out like
every other, so a sub-problem's cost depends on the view's *shape*, not on where it starts: the
memo table is keyed by (sub-graph, view shape), and a unit's cost on a view is its cost from
the cost model at device 0. Costs do not change when shifted:
:meth:`MachineMapping.device_groups` shifts the cost model's device groups, and
:func:`~pcgopt.extract.costmodel.cost.iteration_cost` on the shifted groups charges every node
the same.

**Transfers.** The side of a parallel split that does not start on the view's first device needs
its inputs moved there and its outputs moved back: per tensor, one message of the bytes a
receiving device gets over the link of the divided level, ``latency + bytes / bandwidth`` (one
per micro-batch for the latency), twice if the tensor needs a gradient (the gradient comes
back). Concurrent branches are assumed not to slow each other's collectives.

**Limits.** The mapping places a fixed PCG: how many devices a branch spans is the PCG's choice,
made by extraction and the layer-wise searches, which cost a plan as if its nodes ran in sequence; a
branch narrowed to leave room for another only pays off once mapped, and
:func:`~pcgopt.extract.strategies.branches.branch_parallel` proposes such plans (data parallel ones)
by running this DP on units whose time depends on their view. Memory under the mapping counts a
weight on every device of its unit, and what a unit reads from a unit placed elsewhere on the
reader's devices too (a shared weight with its gradient and optimizer state, any other tensor as
activations): an upper bound.

**Result.** :class:`MachineMapping`: the iteration time (critical path), the schedule (every
unit's devices and start and end), each node's device offset, per-device memory under the
mapping, and the DP's statistics. :class:`MappingCache` can be shared between calls (Unity's
cross-candidate cache): sub-graphs of several candidate PCGs with identical units and
boundaries are solved once.

>>> from pcgopt import Machine, PCGBuilder
>>> from pcgopt.extract import iteration_cost
>>> b = PCGBuilder()
>>> x = b.input((64, 512), name="x")
>>> left = b.relu(b.matmul(x, b.weight((512, 512), name="w1")), name="left")
>>> right = b.relu(b.matmul(x, b.weight((512, 512), name="w2")), name="right")
>>> pcg = b.build(b.add(left, right))
>>> machine = Machine.preset("dgx-a100")
>>> mapping = map_machine(pcg, machine)
>>> mapping.time_s < iteration_cost(pcg, machine).total_s  # the two branches run at once
True
>>> sorted({mapping.offsets["left"], mapping.offsets["right"]})  # one device each
[0, 1]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.cost import (
    CostBreakdown,
    DevicePlacement,
    MemoryBreakdown,
    iteration_cost,
)
from pcgopt.extract.costmodel.simulate import DDP, Runtime, Task, Timeline
from pcgopt.graph import PCG, TensorRef
from pcgopt.machine import Link, Machine
from pcgopt.ops import OpKind
from pcgopt.shapes import ParallelTensorShape

__all__ = [
    "DeviceBlock",
    "MachineMapping",
    "MappedUnit",
    "MappingCache",
    "MappingError",
    "map_machine",
]

_INF = math.inf


class MappingError(PCGError):
    """A machine mapping that cannot be made: the machine or the cost do not fit the PCG."""


@dataclass(frozen=True, slots=True)
class DeviceBlock:
    """``size`` consecutive devices from ``start``."""

    start: int
    size: int

    @property
    def stop(self) -> int:
        return self.start + self.size

    def __repr__(self) -> str:
        return f"devices[{self.start}:{self.stop}]"


@dataclass(frozen=True, slots=True)
class MappedUnit:
    """One unit of the schedule: its nodes (the compute node first, if any), the devices it
    runs on, and when it starts and ends within the iteration (seconds)."""

    nodes: tuple[str, ...]
    block: DeviceBlock
    start_s: float
    end_s: float

    def __repr__(self) -> str:
        more = f" +{len(self.nodes) - 1}" if len(self.nodes) > 1 else ""
        return (
            f"MappedUnit({self.nodes[0]!r}{more} on {self.block!r}, "
            f"{self.start_s * 1e3:.4g}-{self.end_s * 1e3:.4g} ms)"
        )


@dataclass(frozen=True)
class MachineMapping:
    """Where and when every part of a PCG runs (module docstring).

    ``time_s``: the iteration's critical path under the mapping, the DP's estimate (after
    :meth:`simulated`, the simulated iteration's time on the mapping's devices, and
    ``estimate_s`` the DP's; for a mapping that runs every unit in sequence,
    :meth:`in_sequence`: the simulated iteration's time, which overlaps communication, so its
    units' own times add up to more); ``sequential_s``: the same units run one after another,
    each at its additive cost; ``transfer_s``: seconds of tensor moves between branches in the
    schedule; ``units``: the schedule (by the DP's estimate; :meth:`cost`'s timeline is the
    simulated one); ``offsets``: every node's first device; ``memory``: what the fullest device
    holds under the mapping; ``decomposition``: the splits, readable;
    ``subproblems``/``cache_hits``: the DP's work.
    """

    time_s: float
    sequential_s: float
    transfer_s: float
    units: tuple[MappedUnit, ...]
    offsets: Mapping[str, int]
    memory: MemoryBreakdown
    decomposition: str
    subproblems: int
    cache_hits: int
    parallel_splits: int = 0
    divided_splits: int = 0
    #: The DP's own estimate of ``time_s`` when that is the simulated time (:meth:`simulated`).
    estimate_s: float | None = None
    #: The machine mapped onto, and the tensors moved between units (:func:`_moves`): to
    #: simulate the mapped iteration (:meth:`cost`).
    machine: Machine | None = field(default=None, repr=False, compare=False)
    moves: Mapping[tuple[str, str], float] = field(default_factory=dict, repr=False, compare=False)

    @property
    def memory_per_device(self) -> int:
        return self.memory.total

    def __repr__(self) -> str:
        return (
            f"MachineMapping({self.time_s * 1e3:.4g} ms vs {self.sequential_s * 1e3:.4g} ms in "
            f"sequence; {self.divided_splits} of {self.parallel_splits} parallel splits run "
            f"branches at once; {len(self.units)} units)"
        )

    def device_groups(
        self, groups: Mapping[str, Sequence[int] | Sequence[Sequence[int]]]
    ) -> dict[str, tuple[int, ...] | tuple[tuple[int, ...], ...]]:
        """``groups`` (device groups of parallel nodes, or flat device lists, as the cost model
        places them at device 0) moved to where the mapping runs each node."""
        out: dict[str, tuple[int, ...] | tuple[tuple[int, ...], ...]] = {}
        for name, value in groups.items():
            shift = self.offsets.get(name, 0)
            if all(isinstance(g, int) for g in value):
                out[name] = tuple(d + shift for d in value)  # type: ignore[operator]
            else:
                out[name] = tuple(tuple(d + shift for d in g) for g in value)  # type: ignore[union-attr]
        return out

    def cost(self, cost: CostBreakdown) -> CostBreakdown:
        """``cost`` (the cost model's, for the same PCG) under this mapping. A mapping that runs
        no branches at once leaves the cost model's simulated time as it is. One that does is
        simulated again with every node's tasks on its devices
        (:meth:`~pcgopt.extract.costmodel.cost.CostBreakdown.mapped_timeline`: branches at once,
        each overlapping its own communication, tensors moved between them): ``total_s`` is
        that simulation's time, ``overlap_s`` what it saves over the simulated in-sequence
        iteration (negative if it costs more), ``exposed_comm_s`` the time the busiest
        device's compute stream waits, the timeline the mapped one, and the memory the fullest
        device's under the mapping. (A cost without its simulation, built by hand, takes the
        DP's schedule instead, with all of its communication exposed.)"""
        if not self.divided_splits:
            return replace(cost, memory=self.memory)
        if cost.simulation is not None and self.machine is not None:
            timeline = cost.mapped_timeline(self.offsets, self.machine, self.moves)
            busy = np.zeros(self.machine.num_devices)
            for t in timeline.tasks:
                if t.stream == "compute":
                    busy[t.first_device : t.first_device + t.devices] += t.seconds
            return replace(
                cost,
                total_s=timeline.time_s,
                overlap_s=cost.total_s - timeline.time_s,
                exposed_comm_s=max(0.0, timeline.time_s - float(busy.max())),
                memory=self.memory,
                schedule=timeline,
            )
        units = tuple(
            Task("compute", u.start_s, u.end_s, u.nodes[0], "unit", u.block.size, 0, u.block.start)
            for u in self.units
        )
        return replace(
            cost,
            total_s=self.time_s,
            overlap_s=cost.total_s - self.time_s,
            exposed_comm_s=cost.comm_s,
            memory=self.memory,
            schedule=Timeline(units, self.time_s, cost.runtime),
        )

    def simulated(self, cost: CostBreakdown) -> MachineMapping:
        """This mapping with ``time_s`` the simulated time ``cost`` (:meth:`cost`'s) gives
        and the DP's estimate kept in ``estimate_s``."""
        return replace(self, time_s=cost.total_s, estimate_s=self.time_s)

    def in_sequence(self, cost: CostBreakdown) -> MachineMapping:
        """The same units run one after another from device 0, as the cost model simulates
        the iteration, whose time (``time_s``) and memory ``cost`` gives: for a plan that runs
        no branches at once, or when running them at once is not faster than the simulated
        iteration, which overlaps communication instead. The units keep their own times, one
        after another (their sum, ``sequential_s``, is the additive time)."""
        t = 0.0
        units = []
        for u in self.units:
            seconds = u.end_s - u.start_s
            units.append(MappedUnit(u.nodes, DeviceBlock(0, u.block.size), t, t + seconds))
            t += seconds
        return replace(
            self,
            time_s=cost.total_s,
            transfer_s=0.0,
            units=tuple(units),
            offsets=MappingProxyType(dict.fromkeys(self.offsets, 0)),
            memory=cost.memory,
            decomposition="every unit in sequence on the first devices",
            divided_splits=0,
            estimate_s=None,
        )

    def explain(self, *, max_rows: int | None = 12) -> str:
        """The units that run beside others: their devices and times (``max_rows`` of them)."""
        lines = [repr(self)]
        if not self.divided_splits:
            lines.append("  every unit runs on the first devices, one after another")
            return "\n".join(lines)
        concurrent = [u for u in self.units if u.block.start > 0]
        lines.append(
            f"  {len(concurrent)} units run beside others, off device 0; transfers "
            f"{self.transfer_s * 1e3:.4g} ms; memory per device "
            f"{self.memory_per_device / 2**20:.4g} MiB"
        )
        shown = concurrent if max_rows is None else concurrent[:max_rows]
        for u in shown:
            lines.append(f"  {u!r}")
        if len(shown) < len(concurrent):
            lines.append(f"  ... {len(concurrent) - len(shown)} more")
        return "\n".join(lines)


@dataclass
class MappingCache:
    """The DP's memo table, shareable between :func:`map_machine` calls on one machine
    (Unity's cross-candidate cache). Keys are sub-graph contents with the view's shape and the
    number of micro-batches, so candidates that share a sub-graph (same nodes, costs and
    boundary tensors) share its solution."""

    machine: Machine | None = None
    _keys: dict[tuple, int] = field(default_factory=dict, repr=False)
    # (sub-graph, view, micro-batches) -> (seconds, decision); with a fourth item, a group of
    # a parallel split's children (bit mask).
    _solved: dict[tuple, tuple[float, tuple]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self._solved)

    def intern(self, content: tuple) -> int:
        return self._keys.setdefault(content, len(self._keys))


# --- Units ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Unit:
    index: int
    nodes: list[str]
    seconds: float = 0.0
    footprint: int = 1
    # Per node: bytes on each of its devices (weights, gradients, optimizer state, activations).
    memory: list[tuple[float, float, float, float]] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)  # per node, devices it touches
    # Tensors read from other units: (producer unit, bytes a receiving device gets, grad).
    inputs: list[tuple[int, float, bool]] = field(default_factory=list)
    outputs: list[tuple[int, float, bool]] = field(default_factory=list)
    signature: tuple = ()
    widest: str = ""  # a node that spans the footprint


def _needs_grad(pcg: PCG) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for n in pcg.nodes:
        if n.op == "weight":
            out[n.name] = bool(n.params["trainable"])
        else:
            out[n.name] = any(out[r.node] for r in n.inputs)
    return out


def _devices_of(value: object) -> list[int]:
    """The devices of an explicit placement: groups of devices, or a flat list (as the cost
    model accepts them)."""
    out: list[int] = []
    for item in value:  # type: ignore[attr-defined]
        if isinstance(item, int):
            out.append(item)
        else:
            out.extend(item)
    return out


def _node_width(pcg: PCG, name: str, explicit: Mapping[str, object]) -> int:
    shapes = [*pcg.input_shapes(name), *pcg.output_shapes(name)]
    width = max(s.num_shards for s in shapes)
    devices = _devices_of(explicit.get(name) or ())
    if devices:
        width = max(width, 1 + max(devices))
    return width


def runs_with_producer(
    inputs: Sequence[ParallelTensorShape], outputs: Sequence[ParallelTensorShape]
) -> bool:
    """Whether the machine mapping runs a parallelization node of these input and output
    shapes in its producer's unit (:func:`_units`): where it leaves its tensor on fewer devices
    than it found it, or reduces partial sums. The others run in their reader's."""
    return max(s.num_shards for s in outputs) < max(s.num_shards for s in inputs) or any(
        s.is_partial for s in inputs
    )


def _units(
    pcg: PCG, cost: CostBreakdown, explicit: Mapping[str, object]
) -> tuple[list[_Unit], dict[str, int]]:
    # The optimizer's states per weight element, from the cost itself (it charged them).
    mem = cost.memory
    states = mem.optimizer_state / mem.gradients if mem.gradients else 0.0
    nodes = pcg.nodes
    position = {n.name: k for k, n in enumerate(nodes)}
    readers_of: dict[str, list[str]] = {}
    for n in nodes:
        for r in n.inputs:
            readers_of.setdefault(r.node, []).append(n.name)
    # Each unit is named by its representative node; a unit's representative precedes every
    # node of the units it feeds, so ordering units by it orders the unit graph.
    # A parallel node that leaves its tensor on fewer devices than it found it (a Combine, a
    # DiscardCopies after an AllGather) runs with its producer: the narrowed tensor then moves
    # to its reader, which can run on a narrower block of its own. So does one that reduces
    # partial sums (a ReduceScatter ending a branch's row-parallel layer): the devices that
    # hold them reduce them, and the branch keeps its own devices to the end (run with its
    # reader, on a join's devices, it made the branches' backward passes wait for each other).
    narrowing = {
        n.name
        for n in nodes
        if n.spec.kind is OpKind.PARALLEL
        and runs_with_producer(pcg.input_shapes(n.name), pcg.output_shapes(n.name))
    }
    rep_of: dict[str, str] = {}
    pending = []
    for n in reversed(nodes):
        names = readers_of.get(n.name, ())
        readers = {rep_of[c] for c in names if c in rep_of}
        # Readers still without a unit join their latest producer below, and so this node's
        # unit if they have readers of their own (a narrowing chain): each counts as one more
        # reading unit, so that this node does not fold into a later unit than theirs.
        joining = sum(1 for c in names if c not in rep_of and (c in narrowing or readers_of.get(c)))
        if n.name in narrowing:
            pending.append(n)  # joins its producer's unit, below, however many read it
        elif n.spec.kind is OpKind.COMPUTE or len(readers) + joining > 1:
            rep_of[n.name] = n.name  # a compute node, or a tensor several units read
        elif readers:
            rep_of[n.name] = readers.pop()
        else:
            pending.append(n)  # joins its producer's unit, below
    for n in reversed(pending):  # forward order: producers first; join the latest producer
        producers = [rep_of[r.node] for r in n.inputs]
        rep_of[n.name] = max(producers, key=position.__getitem__) if producers else n.name
    reps = sorted(set(rep_of.values()), key=position.__getitem__)
    index = {rep: k for k, rep in enumerate(reps)}
    units = [_Unit(k, []) for k in range(len(reps))]
    unit_of = {name: index[rep] for name, rep in rep_of.items()}
    for n in nodes:
        units[unit_of[n.name]].nodes.append(n.name)
    needs_grad = _needs_grad(pcg)
    for u in units:
        u.nodes.sort(key=lambda name: pcg.node(name).spec.kind is not OpKind.COMPUTE)
        for name in u.nodes:
            u.seconds += cost.per_node[name].total_s
            u.widths.append(_node_width(pcg, name, explicit))
        u.footprint = max(u.widths)
        u.widest = u.nodes[u.widths.index(u.footprint)]
        for k, name in enumerate(u.nodes):
            node = pcg.node(name)
            held = float(cost.per_node[name].memory_bytes)
            if node.op != "weight":
                u.memory.append((0.0, 0.0, 0.0, held))
                continue
            # A weight is kept in the layouts its Partition/Replicate nodes make, which are in
            # its unit: count it on all of the unit's devices (an upper bound).
            u.widths[k] = u.footprint
            split = cost.per_node[name].weight_memory
            if sum(split) == held:
                u.memory.append((*map(float, split), 0.0))
            elif node.params["trainable"]:  # a cost built by hand: as the optimizer keeps it
                w = held / (2 + states)
                u.memory.append((w, w, held - 2 * w, 0.0))
            else:
                u.memory.append((held, 0.0, 0.0, 0.0))
    seen: set[tuple[int, TensorRef]] = set()  # one transfer per tensor and reading unit
    for n in nodes:
        mine = unit_of[n.name]
        for r in n.inputs:
            theirs = unit_of[r.node]
            if theirs == mine or (mine, r) in seen:
                continue
            seen.add((mine, r))
            if theirs > mine:
                raise MappingError(  # by construction edges go forward; a bug if not
                    f"internal: unit of {r.node!r} follows the unit of its reader {n.name!r}",
                    node=n.name,
                )
            nbytes = _moved_bytes(pcg.shape(r), units[mine].footprint)
            grad = needs_grad[r.node]
            units[mine].inputs.append((theirs, nbytes, grad))
            units[theirs].outputs.append((mine, nbytes, grad))
    for u in units:
        u.signature = (tuple(u.nodes), u.seconds, u.footprint)
    return units, unit_of


def _moved_bytes(shape: ParallelTensorShape, footprint: int) -> float:
    """What each receiving device gets of ``shape`` moved to a unit of ``footprint`` devices:
    its share of the shards."""
    receivers = min(shape.num_shards, footprint)
    return shape.shard_nbytes * math.ceil(shape.num_shards / receivers)


def _moves(
    pcg: PCG, units: Sequence[_Unit], unit_of: Mapping[str, int]
) -> dict[tuple[str, str], float]:
    """For every node that reads a tensor of another unit's node: (reader, node) -> the bytes
    a receiving device gets (:func:`_moved_bytes`; several tensors of one node add up)."""
    moves: dict[tuple[str, str], float] = {}
    for n in pcg.nodes:
        mine = unit_of[n.name]
        for r in dict.fromkeys(n.inputs):
            if unit_of[r.node] != mine:
                key = (n.name, r.node)
                nbytes = _moved_bytes(pcg.shape(r), units[mine].footprint)
                moves[key] = moves.get(key, 0.0) + nbytes
    return moves


# --- Series-parallel decomposition -----------------------------------------------------------


class _Tree:
    """A node of the decomposition: ``kind`` is "leaf" (units in sequence), "series" or
    "parallel" (two to ``_MAX_PARTS`` independent children)."""

    __slots__ = ("children", "footprint", "key", "kind", "moves", "seconds", "units")

    def __init__(self, kind: str, children: tuple[_Tree, ...], units: tuple[int, ...]) -> None:
        self.kind = kind
        self.children = children
        self.units = units
        self.seconds = 0.0
        self.footprint = 1
        self.key = -1
        # Tensors crossing this sub-graph's boundary: (bytes, needs a gradient, "in"/"out").
        self.moves: tuple[tuple[float, bool, str], ...] = ()


def _decompose(units: list[_Unit], subset: tuple[int, ...]) -> _Tree:
    if len(subset) == 1:
        return _Tree("leaf", (), subset)
    pos = {u: k for k, u in enumerate(subset)}
    n = len(subset)
    preds: list[list[int]] = [[] for _ in range(n)]
    for k, u in enumerate(subset):
        for p, _, _ in units[u].inputs:
            if p in pos:
                preds[k].append(pos[p])
    # Weakly connected components (union-find).
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for k in range(n):
        for p in preds[k]:
            ra, rb = find(k), find(p)
            if ra != rb:
                parent[ra] = rb
    comps: dict[int, list[int]] = {}
    for k in range(n):
        comps.setdefault(find(k), []).append(subset[k])
    if len(comps) > 1:
        parts = [(_seq_seconds(units, c), tuple(c)) for c in comps.values()]
        return _balanced_parallel(units, parts)
    # Units comparable with every other: the cut points of sequence splits.
    anc = [0] * n
    for k in range(n):
        for p in preds[k]:
            anc[k] |= anc[p] | (1 << p)
    desc = [0] * n
    for k in range(n - 1, -1, -1):
        for p in preds[k]:
            desc[p] |= desc[k] | (1 << k)
    full = (1 << n) - 1
    cuts = [k for k in range(n) if anc[k] | desc[k] | (1 << k) == full]
    if not cuts or (len(cuts) == 1 and n == 1):
        return _Tree("leaf", (), subset)
    parts: list[tuple[int, ...]] = []
    before = 0
    for k in cuts:
        mask = anc[k] & ~before
        members = [subset[i] for i in range(n) if mask >> i & 1]
        if members:
            parts.append(tuple(members))
        parts.append((subset[k],))
        before |= anc[k] | (1 << k)
    rest = full & ~before
    if rest:
        parts.append(tuple(subset[i] for i in range(n) if rest >> i & 1))
    if len(parts) == 1:  # a single unit: cannot happen with n > 1
        return _Tree("leaf", (), subset)
    return _Tree("series", tuple(_decompose(units, p) for p in parts), subset)


def _seq_seconds(units: list[_Unit], members: Iterable[int]) -> float:
    return sum(units[u].seconds for u in members)


#: Up to this many units of a level, a parallel split tries every division of them; above
#: it, the points :func:`division_points` gives.
MAX_EXACT_DIVISIONS = 64


def division_points(count: int) -> list[int]:
    """Where a view of ``count`` units of a level may be divided (the first part's size): every
    point up to :data:`MAX_EXACT_DIVISIONS` units; above, powers of two from either end and
    the sixteenths, ascending.

    >>> division_points(4)
    [1, 2, 3]
    >>> len(division_points(100_000)), division_points(100_000)[:4]
    (49, [1, 2, 4, 8])
    """
    if count <= MAX_EXACT_DIVISIONS:
        return list(range(1, count))
    points = {count * k // 16 for k in range(1, 16)}
    power = 1
    while power < count:
        points.update((power, count - power))
        power *= 2
    return sorted(x for x in points if 0 < x < count)


# Up to this many independent parts, a parallel split considers every way of grouping them
# (3^k sub-problems per view); more are first grouped into a balanced binary tree.
_MAX_PARTS = 6


def _balanced_parallel(units: list[_Unit], parts: list[tuple[float, tuple[int, ...]]]) -> _Tree:
    """Independent parts as one parallel split (at most ``_MAX_PARTS``), or as a binary tree
    of them, each side about half the sequential time (largest first, to the lighter side)."""
    if len(parts) == 1:
        return _decompose(units, parts[0][1])
    parts = sorted(parts, key=lambda p: (-p[0], p[1]))
    if len(parts) <= _MAX_PARTS:
        children = tuple(_decompose(units, p[1]) for p in parts)
        return _Tree("parallel", children, tuple(sorted(u for c in children for u in c.units)))
    sides: list[list[tuple[float, tuple[int, ...]]]] = [[], []]
    loads = [0.0, 0.0]
    for p in parts:
        k = min((0, 1), key=lambda i: (loads[i], len(sides[i])))  # free parts alternate
        sides[k].append(p)
        loads[k] += p[0]
    a, b = (_balanced_parallel(units, s) for s in sides)
    return _Tree("parallel", (a, b), tuple(sorted(a.units + b.units)))


def _annotate(tree: _Tree, units: list[_Unit], cache: MappingCache) -> None:
    """Fill in every tree node's sequential time, footprint, boundary moves and cache key."""
    for c in tree.children:
        _annotate(c, units, cache)
    if tree.kind == "leaf":
        tree.seconds = _seq_seconds(units, tree.units)
        tree.footprint = max(units[u].footprint for u in tree.units)
        content: tuple = ("leaf", tuple(units[u].signature for u in tree.units))
    else:
        tree.seconds = sum(c.seconds for c in tree.children)
        tree.footprint = max(c.footprint for c in tree.children)
        content = (tree.kind, tuple(c.key for c in tree.children))
    if tree.kind == "parallel":
        for c in tree.children:
            inside = set(c.units)
            moves = []
            for u in c.units:
                moves += [(b, g, "in") for p, b, g in units[u].inputs if p not in inside]
                moves += [(b, g, "out") for q, b, g in units[u].outputs if q not in inside]
            c.moves = tuple(sorted(moves))
        content += tuple(c.moves for c in tree.children)
    tree.key = cache.intern(content)


# --- The dynamic program ---------------------------------------------------------------------


class _Solver:
    def __init__(
        self,
        machine: Machine,
        micro_batches: int,
        cache: MappingCache,
        unit_s: Callable[[int, int], float] | None = None,
        receivers: Callable[[int], int] | None = None,
    ) -> None:
        # unit_s (unit, devices) -> seconds: units whose time depends on the devices they get
        # (elastic, pcgopt.extract.strategies.branches); moves are then split over the receiving
        # devices. None: every unit takes its fixed time.
        self.unit_s = unit_s
        self.receivers = receivers  # elastic units: the degree a view of that many devices runs
        self._divisions: dict[tuple[int, int], list] = {}
        self._groups: dict[tuple[int, int], tuple[list[int], list[float], list[float]]] = {}
        self.counts = machine.counts
        self.links: tuple[Link, ...] = tuple(level.link for level in machine.levels)
        depth = len(self.counts)
        self.unit_size = [math.prod(self.counts[j + 1 :]) for j in range(depth)]
        self.m = micro_batches
        self.cache = cache
        self.subproblems = 0
        self.hits = 0

    def normalize(self, j: int, a: int) -> tuple[int, int]:
        while a == 1 and j < len(self.counts) - 1:
            j += 1
            a = self.counts[j]
        return j, a

    def size(self, view: tuple[int, int]) -> int:
        return view[1] * self.unit_size[view[0]]

    def unit_seconds(self, units: Sequence[_Unit], u: int, view: tuple[int, int]) -> float:
        return units[u].seconds if self.unit_s is None else self.unit_s(u, self.size(view))

    def share(self, devices: int) -> int:
        """Over how many devices a side on a view of ``devices`` receives a moved tensor: 1 for
        fixed units (their moves already hold one device's bytes), else the degree elastic
        units run at there."""
        if self.unit_s is None:
            return 1
        return devices if self.receivers is None else self.receivers(devices)

    def child_moves(self, child: _Tree, link: Link) -> tuple[float, float, float, float]:
        """``child``'s boundary moves over ``link``: latency seconds and seconds per receiving
        device's share, in then out. A tensor with a gradient moves twice (it comes back);
        every micro-batch pays the latency."""
        out = [0.0, 0.0, 0.0, 0.0]
        for nbytes, grad, way in child.moves:
            times = 2 if grad else 1
            k = 0 if way == "in" else 2
            out[k] += times * self.m * link.latency_s
            out[k + 1] += times * nbytes / link.bandwidth_Bps
        return out[0], out[1], out[2], out[3]

    def solve(self, tree: _Tree, view: tuple[int, int]) -> float:
        key = (tree.key, view, self.m)  # transfers' latencies depend on micro-batches
        found = self.cache._solved.get(key)
        if found is not None:
            self.hits += 1
            return found[0]
        self.subproblems += 1
        decision: tuple = ()
        if tree.footprint > self.size(view):
            best = _INF
        elif tree.kind == "leaf":
            best = (
                tree.seconds
                if self.unit_s is None
                else sum(self.unit_s(u, self.size(view)) for u in tree.units)
            )
        elif tree.kind == "series":
            best = sum(self.solve(c, view) for c in tree.children)
        else:
            best = self.solve_group(tree, (1 << len(tree.children)) - 1, view)
        self.cache._solved[key] = (best, decision)
        return best

    def divisions(
        self, view: tuple[int, int]
    ) -> list[tuple[int, tuple[int, int], tuple[int, int], int, int]]:
        """The divisions of ``view``: (a1, the two views, their sizes)."""
        found = self._divisions.get(view)
        if found is None:
            j, count = view
            found = []
            for a1 in division_points(count):
                v1, v2 = self.normalize(j, a1), self.normalize(j, count - a1)
                found.append((a1, v1, v2, self.size(v1), self.size(v2)))
            self._divisions[view] = found
        return found

    def group_table(self, tree: _Tree, j: int) -> tuple[list[int], list[float], list[float]]:
        """For every group (bit mask) of the children of parallel split ``tree``: its widest
        footprint, and its moves (in and out) over level ``j``'s link as latency seconds plus
        seconds per receiving device's share (:meth:`child_moves` summed over the group)."""
        key = (id(tree), j)
        found = self._groups.get(key)
        if found is None:
            link = self.links[j]
            k = len(tree.children)
            foot, lat, per_byte = [0] * (1 << k), [0.0] * (1 << k), [0.0] * (1 << k)
            own = []
            for c in tree.children:
                lat_in, bytes_in, lat_out, bytes_out = self.child_moves(c, link)
                own.append((c.footprint, lat_in + lat_out, bytes_in + bytes_out))
            for mask in range(1, 1 << k):
                low = (mask & -mask).bit_length() - 1
                prev = mask & (mask - 1)
                foot[mask] = max(foot[prev], own[low][0])
                lat[mask] = lat[prev] + own[low][1]
                per_byte[mask] = per_byte[prev] + own[low][2]
            found = self._groups[key] = (foot, lat, per_byte)
        return found

    def solve_group(self, tree: _Tree, mask: int, view: tuple[int, int]) -> float:
        """The children of parallel split ``tree`` in ``mask`` on ``view``: one child alone, or
        two groups of them one after the other on the whole view, or at once on a division of
        it (the group off the view's first device paying its transfers)."""
        key = (tree.key, view, self.m, mask)
        found = self.cache._solved.get(key)
        if found is not None:
            self.hits += 1
            return found[0]
        self.subproblems += 1
        members = [k for k in range(len(tree.children)) if mask >> k & 1]
        if len(members) == 1:
            best, decision = self.solve(tree.children[members[0]], view), ("one", members[0])
            self.cache._solved[key] = (best, decision)
            return best
        best, decision = _INF, ()
        foot, lat, per_byte = self.group_table(tree, view[0])
        low = mask & -mask
        sub = (mask - 1) & mask
        while sub:  # every proper non-empty subset: the group that goes first / on the left
            rest = mask & ~sub
            if sub & low:  # in sequence the order does not matter: each pair once
                t = self.solve_group(tree, sub, view) + self.solve_group(tree, rest, view)
                if t < best:
                    best, decision = t, ("sequence", sub, rest)
            for a1, v1, v2, size1, size2 in self.divisions(view):
                if foot[sub] > size1 or foot[rest] > size2:
                    continue
                moves = lat[rest] + per_byte[rest] / self.share(size2)
                t = max(self.solve_group(tree, sub, v1), self.solve_group(tree, rest, v2) + moves)
                if t < best:
                    best, decision = t, ("divide", sub, rest, a1)
            sub = (sub - 1) & mask
        # Or keep to the view's first unit of its level (one node of several), leaving the rest
        # idle: a division there crosses only that unit's faster links.
        narrow = self.narrower(view)
        if narrow is not None:
            t = self.solve_group(tree, mask, narrow)
            if t < best:
                best, decision = t, ("narrow", narrow)
        self.cache._solved[key] = (best, decision)
        return best

    def narrower(self, view: tuple[int, int]) -> tuple[int, int] | None:
        """The first unit of ``view``'s level, as a view of the level below (None if ``view``
        is one unit already or of the innermost level). Not for elastic units (the
        branch-parallel DP): its estimate leaves out the redistributions a narrower degree
        adds, and narrowed plans it preferred cost 1.3-2.6x more once built (XDL on 8 Summit
        nodes, DLRM on 4)."""
        j, count = view
        if count == 1 or j == len(self.counts) - 1 or self.unit_s is not None:
            return None
        return self.normalize(j, 1)

    def schedule(
        self,
        tree: _Tree,
        view: tuple[int, int],
        start: int,
        t0: float,
        units: list[_Unit],
        out: dict[int, tuple[int, float, float, int]],
        stats: list[float],
    ) -> float:
        """Lays ``tree`` out from device ``start`` at time ``t0`` by the solved decisions:
        ``out[unit] = (first device, start, end, devices of its view)``; returns the end."""
        if tree.kind == "leaf":
            t = t0
            for u in tree.units:
                seconds = self.unit_seconds(units, u, view)
                out[u] = (start, t, t + seconds, self.size(view))
                t += seconds
            return t
        if tree.kind == "series":
            t = t0
            for c in tree.children:
                t = self.schedule(c, view, start, t, units, out, stats)
            return t
        return self.schedule_group(
            tree, (1 << len(tree.children)) - 1, view, start, t0, units, out, stats
        )

    def schedule_group(
        self,
        tree: _Tree,
        mask: int,
        view: tuple[int, int],
        start: int,
        t0: float,
        units: list[_Unit],
        out: dict[int, tuple[int, float, float, int]],
        stats: list[float],
    ) -> float:
        _, decision = self.cache._solved[(tree.key, view, self.m, mask)]
        if decision[0] == "one":
            return self.schedule(tree.children[decision[1]], view, start, t0, units, out, stats)
        if decision[0] == "narrow":
            return self.schedule_group(tree, mask, decision[1], start, t0, units, out, stats)
        stats[0] += 1  # a binary split of the group: counted as one parallel split
        if decision[0] == "sequence":
            t = self.schedule_group(tree, decision[1], view, start, t0, units, out, stats)
            return self.schedule_group(tree, decision[2], view, start, t, units, out, stats)
        stats[1] += 1
        _, first, second, a1 = decision
        j, count = view
        link = self.links[j]
        v2 = self.normalize(j, count - a1)
        moved = [tree.children[k] for k in range(len(tree.children)) if second >> k & 1]
        share = self.share(self.size(v2))
        parts = [self.child_moves(c, link) for c in moved]
        move_in = sum(p[0] + p[1] / share for p in parts)
        move_out = sum(p[2] + p[3] / share for p in parts)
        stats[2] += move_in + move_out
        v1 = self.normalize(j, a1)
        end1 = self.schedule_group(tree, first, v1, start, t0, units, out, stats)
        offset = start + a1 * self.unit_size[j]
        end2 = self.schedule_group(tree, second, v2, offset, t0 + move_in, units, out, stats)
        return max(end1, end2 + move_out)


def _describe(tree: _Tree, units: list[_Unit], depth: int = 0, limit: int = 40) -> list[str]:
    lines: list[str] = []

    def walk(t: _Tree, d: int) -> None:
        if len(lines) >= limit:
            return
        pad = "  " * d
        if t.kind == "leaf":
            names = [units[u].nodes[0] for u in t.units]
            more = f" +{len(names) - 3}" if len(names) > 3 else ""
            lines.append(f"{pad}{', '.join(names[:3])}{more}")
            return
        lines.append(f"{pad}{t.kind} ({len(t.units)} units, {t.seconds * 1e3:.4g} ms in sequence)")
        for c in t.children:
            walk(c, d + 1)

    walk(tree, depth)
    return lines


def map_machine(
    pcg: PCG,
    machine: Machine,
    *,
    cost: CostBreakdown | None = None,
    devices: DevicePlacement | None = None,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    cache: MappingCache | None = None,
) -> MachineMapping:
    """The fastest mapping of ``pcg``'s units onto ``machine`` (module docstring).

    ``cost``: the cost model's breakdown of ``pcg`` (computed if not given, with ``devices``
    and ``optimizer``); ``devices``: the explicit device groups that cost used (a placement
    from :func:`~pcgopt.extract.strategies.placement.place_plan`), so that footprints include them;
    ``cache``: a :class:`MappingCache` to share between calls on the same machine.
    """
    if not isinstance(pcg, PCG):
        raise MappingError(f"map_machine takes a pcgopt.PCG, got {type(pcg).__name__}")
    if not isinstance(machine, Machine):
        raise MappingError(f"machine must be a pcgopt.Machine, got {type(machine).__name__}")
    if cost is None:
        cost = iteration_cost(pcg, machine, optimizer=optimizer, runtime=runtime, devices=devices)
    missing = [n.name for n in pcg.nodes if n.name not in cost.per_node]
    if missing:
        raise MappingError(
            f"cost does not belong to this PCG: it has no entry for node {missing[0]!r}",
            node=missing[0],
        )
    if cache is None:
        cache = MappingCache(machine)
    elif cache.machine is None:
        cache.machine = machine
    elif cache.machine != machine:
        raise MappingError(
            f"cache was filled for machine {cache.machine.name!r}; a mapping for "
            f"{machine.name!r} needs its own MappingCache"
        )
    explicit = dict(devices or {})
    units, unit_of = _units(pcg, cost, explicit)
    for u in units:
        if u.footprint > machine.num_devices:
            name = u.widest
            raise MappingError(
                f"node {name!r} spans {u.footprint} devices; machine {machine.name!r} has "
                f"{machine.num_devices}",
                node=name,
            )
    tree = _decompose(units, tuple(range(len(units))))
    _annotate(tree, units, cache)
    solver = _Solver(machine, cost.micro_batches, cache)
    root = solver.normalize(0, machine.counts[0])
    time_s = solver.solve(tree, root)
    placed: dict[int, tuple[int, float, float, int]] = {}
    stats = [0.0, 0.0, 0.0]
    end = solver.schedule(tree, root, 0, 0.0, units, placed, stats)
    assert math.isclose(end, time_s, rel_tol=1e-9, abs_tol=1e-15), (end, time_s)
    held = np.zeros((machine.num_devices, 4))
    for u in units:
        start = placed[u.index][0]
        for categories, width in zip(u.memory, u.widths, strict=True):
            held[start : start + width] += categories
        # What a unit reads from a unit that runs elsewhere is held here too: a weight (a
        # tensor several units read) with its gradient and state, anything else as activations.
        mine = slice(start, start + u.footprint)
        for p, nbytes, _ in u.inputs:
            if placed[p][0] == start:
                continue
            computes = pcg.node(units[p].nodes[0]).spec.kind is OpKind.COMPUTE
            weights = [c for c in units[p].memory if c[0]] if not computes else []
            held[mine] += np.sum(weights, axis=0) if weights else (0.0, 0.0, 0.0, nbytes)
    if stats[1]:
        fullest = held[int(np.argmax(held.sum(axis=1)))]
        memory = MemoryBreakdown(*(round(float(x)) for x in fullest))
    else:  # everything on the first devices: the cost model's own figure, exactly
        memory = cost.memory
    schedule = tuple(
        MappedUnit(
            tuple(u.nodes), DeviceBlock(placed[u.index][0], u.footprint), *placed[u.index][1:3]
        )
        for u in units
    )
    return MachineMapping(
        time_s=time_s,
        sequential_s=tree.seconds,
        transfer_s=stats[2],
        units=schedule,
        offsets=MappingProxyType({n: placed[unit_of[n]][0] for n in unit_of}),
        memory=memory,
        decomposition="\n".join(_describe(tree, units)),
        subproblems=solver.subproblems,
        cache_hits=solver.hits,
        parallel_splits=int(stats[0]),
        divided_splits=int(stats[1]),
        machine=machine,
        moves=MappingProxyType(_moves(pcg, units, unit_of)) if stats[1] else MappingProxyType({}),
    )
