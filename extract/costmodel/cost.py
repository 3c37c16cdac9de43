"""What one training iteration of a PCG costs on a machine: compute, communication and memory.

:func:`iteration_cost` walks the PCG once and charges every node for its share of a training
iteration (forward, backward, weight-gradient synchronization, optimizer update), then checks
that what each device must hold fits in its memory. Costs add up node by node, so that
extraction can compare PCGs node by node (DESIGN.md, "Cost and extraction"). Units: seconds,
bytes, FLOP.

**Compute** (:func:`roofline_s`). A compute node's forward time is the roofline of one of its
tasks, on its per-device shard shapes, with the FLOP and byte counts of its own operator spec
(``OpSpec.flops`` and ``OpSpec.bytes_accessed``: each operator is counted in one place)::

    forward = max(flops / peak_flops(dtype), bytes / memory_bandwidth) + launch_overhead

The dtype is that of the node's first output. Backward rule: the gradient of every input that
needs one is one kernel, as expensive as the forward (``dA = dY @ B^T`` and ``dB = A^T @ dY``
each take a MatMul's FLOPs and bytes; an activation's gradient is one elementwise pass), except
for an input the operator only broadcasts (by its signature: each of its dimensions is a
dimension of the output, and some output dimension is not one of its: a bias, BatchNorm's
scale), whose gradient is a sum of the output gradient over the broadcast axes: one pass,
``out`` FLOPs and ``out + input`` bytes; and except for an operator whose spec says what one
input's gradient moves (``OpSpec.gradient_bytes_accessed``: a Concat's input gets its slice of
the output gradient, one pass over that input's bytes, so all of them together cost one
forward, not one forward each). So::

    backward = forward * (inputs that need a gradient, broadcast ones apart) + passes

A MatMul of an activation by a weight costs 2x its forward behind the first layer and 1x in the
first layer (the graph input needs no gradient); a node nothing trainable flows into has no
backward. A tensor needs a gradient when a trainable weight flows into it.

**Communication** (:func:`collective_cost`). Only parallelization operators move data (Unity
section 3.3). Each is a collective over groups of ``degree`` devices, all groups at once, with a
per-device message of ``n`` bytes, the larger of the node's input and output shard::

    node            forward          backward (its dual)   n
    partition       scatter          gather                input shard
    combine         gather           scatter               output shard
    replicate       broadcast        reduce                input shard
    reduce          reduce           broadcast             input shard
    all_reduce      all_reduce       all_reduce            input shard
    all_gather      all_gather       reduce_scatter        output shard
    reduce_scatter  reduce_scatter   all_gather            input shard
    all_to_all      all_to_all       all_to_all            input shard
    discard_copies, to_partial, stack_partial: no data moves

The backward runs only when the node's input needs a gradient. Flat algorithms, in the
alpha-beta model (AutoDDL section 3.1, Table 2: bandwidth-optimal, long-message algorithms),
``a * alpha + b * beta`` seconds with ``(a, b)`` from :func:`flat_coefficients`::

    all_reduce (ring)                    2(p-1) alpha + 2(p-1)/p n beta
    all_gather, reduce_scatter (ring)     (p-1) alpha +  (p-1)/p n beta
    all_to_all (pairwise exchange)        (p-1) alpha +  (p-1)/p n beta
    scatter, gather (root and p-1 peers)  (p-1) alpha +  (p-1)/p n beta
    broadcast, reduce (pipelined chain)   (p-1) alpha +          n beta

AutoDDL's table writes ``(2p-1) alpha`` for AllReduce and ``n beta`` for AlltoAll; the ring's
``2(p-1)`` steps and the ``(p-1)/p`` share a pairwise exchange actually sends are used here, and
:mod:`pcgopt.extract.costmodel.calibrate` fits alpha and beta to the same formulas. ``beta`` is one
over the bandwidth of the link that limits the group: the machine's links are per *unit* of their
level (Machine's docstring), so every byte that leaves a unit (a GPU, a socket, a node) is counted
against that unit's link, summed over all the groups that run at once, and the busiest unit link
sets the time. For one group that is :meth:`Machine.slowest_link`; when several groups share a
node's network link, each gets its share. ``alpha`` is the largest latency among the links a group's
messages cross (the outermost level it spans and every level inside it); on every preset, that of
the outermost level.

A group that spans two or more levels of the hierarchy (:meth:`Machine.group_levels`) also
gets a hierarchical algorithm, one phase per level it spans, and the cheaper of flat and
hierarchical is charged. AllReduce is ReduceScatter inside the innermost level, AllReduce across
the next, AllGather inside again (P^2's Figure 10ii, Cho et al. 2019); AllGather, Broadcast and
Scatter go outermost level first, ReduceScatter, Reduce and Gather innermost first. The phase at
level ``i`` with ``p_i`` participating units moves, through each unit's link::

    all_reduce                2(p_i-1)/p_i n     in 2(p_i-1) steps
    all_gather, reduce_scatter (p_i-1)/p_i n     in   p_i-1  steps
    broadcast, reduce                    n       in   p_i-1  steps
    scatter, gather           (p_i-1)/p_i n / (product of the participants outside level i)

All the inner participants of a unit send through its link together, which is why these
volumes do not shrink with the inner phases (on DGX-A100, 16 GPUs share one NIC). AllToAll has
no hierarchical form here.

An AllReduce or Reduce whose groups span two or more levels also gets every reduction program
P^2's synthesis finds for that layout (:mod:`pcgopt.extract.strategies.reduction`: Reduce-AllReduce-
Broadcast, ReduceScatter-AllReduce-AllGather, AllReduce inside then across, ..., each step priced
with the flat algorithms above), and the fastest of flat, hierarchical and synthesized is
charged (``algorithm="synthesized"`` in :class:`CollectiveCost`). The hook ``reduction_cost``
replaces the time of every AllReduce (forward, backward and weight-gradient synchronization)
with the caller's own; the bytes reported stay those of the alpha-beta algorithm.

**Sources and weight-gradient synchronization.** Partition and Replicate applied to a graph
input or weight (directly or after other Partitions and Replicates) cost nothing: the data
loader delivers the input already split and replicated, and a weight is *stored* in that layout.
Its backward is free for Partition (each shard's gradient is where the shard is) and, for
Replicate on a trainable weight, an AllReduce of the gradient among the copies: every copy
updates itself with the sum (Unity section 3.3: parameter synchronization is the backward of
Replicate on weights). A weight that is only looked up by rows (an embedding table: every
reader's operator says so, ``gradient_rows``) has a sparse gradient, at most one row per index:
its synchronization and its optimizer update cover that many rows of the shard (sparse
gradients with a lazy optimizer update, as recommendation models train), not the whole table;
its gradient and optimizer state are still held whole in memory. Other parallel operators after
a weight (AllGather of a sharded weight, as in FSDP) are ordinary communication in every
iteration. Under ZeRO (:attr:`~pcgopt.extract.costmodel.simulate.Runtime.zero_stage`) a weight
stored in copies is synchronized densely instead (ZeRO-1: AllReduce; ZeRO-2: ReduceScatter),
each copy updates only its ``1/copies`` of it, and the updated weight is then all-gathered.

**Placement.** A PCG fixes what every shard holds, not which device holds it. Here, by default,
the groups of every collective are consecutive devices from device 0 (the machine mapping,
:mod:`pcgopt.extract.search.mapping`, moves independent branches to other devices afterwards): group
``g`` of a degree-``d`` collective is devices ``g*d .. g*d + d-1``, the closest devices the
hierarchy offers, since device numbers that are close are close in the machine (Machine's
docstring). This is optimistic: in a hybrid plan two collectives cannot both be innermost
(Megatron's tensor-parallel AllReduce and the data-parallel gradient AllReduce), and the default
places both there. ``devices=`` places the groups of chosen parallel nodes explicitly: ``{node
name: device groups}``, as a sequence of ``groups`` sequences of ``degree`` devices each, or as
one flat sequence read group after group; for a Replicate on a weight this places its gradient
AllReduce. Compute nodes run where their inputs are, so they move no data.

**Training iteration and memory.** Time is forward + backward of every node, communication
included, plus the optimizer update, with no overlap of computation and communication and no
concurrency between nodes: a conservative and additive model. The update (:data:`OPTIMIZERS`) is
memory-bound: it reads and writes the weights, gradients and optimizer state once per stored weight
layout. Memory per device: weights in their stored layout, their gradients, optimizer state (Adam 2
tensors, SGD with momentum 1, plain SGD 0, all in the weight's dtype; under ZeRO the state of a
weight stored in copies is split over them, and from ZeRO-2 its gradient too, unless micro-batches
accumulate it unsynchronized), and every tensor a backward needs: each input of each node with a
backward, except stored weights (counted once as weights). It is the sum of the per-shard sizes of
these tensors: under the default placement device 0 holds a shard of every tensor, and no device
holds more, so this is the maximum over devices. A plan whose memory exceeds the device's capacity
is infeasible.

**Gradient accumulation.** ``micro_batches=m`` runs the iteration as ``m`` micro-batches, each
with ``1/m`` of every data input's dimension 0 (AutoDDL section 5.2), accumulating gradients:
the weights' gradient synchronization and the update happen once. Each collective on a tensor
computed from data runs ``m`` times on ``1/m`` of the bytes (so its latency terms are paid ``m``
times), one on a tensor computed from weights only runs ``m`` times in full; compute keeps its
FLOPs and bytes and pays ``m`` kernel launches; activations kept for the backward are those of
one micro-batch (``1/m``). :func:`accumulate_to_fit` picks the smallest ``m`` that fits memory.
A PCG that cuts micro-batches itself (Pipeline and Batch, :mod:`pcgopt.ops.parallel`;
:func:`pcgopt.with_micro_batches`) is costed so with its own count, the nodes whose outputs are
in micro-batches, and the nodes after them, taking the part of the data's: they run once per
micro-batch on its share and keep one micro-batch's activations; the others compute once, and
their collectives run once per micro-batch in full, as above (every micro-batched tensor must
have the same count). What follows a Batch (a loss's mean over the batch, which cannot take
micro-batches) is costed as a runtime runs it, on each micro-batch with the results added up:
that is what it computes when it sums over the batch, and the pipeline search refuses models
whose operators mix the samples otherwise.
"""

from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Literal, Protocol, get_args

from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.simulate import (
    DDP,
    PRECISIONS,
    Runtime,
    SimNode,
    Simulation,
    Timeline,
)
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.machine import DeviceSpec, Machine, MachineError
from pcgopt.ops import ComputeOp, OpKind, Params
from pcgopt.shapes import DType, ParallelTensorShape

__all__ = [
    "COLLECTIVES",
    "LAYOUT_OPS",
    "OPTIMIZERS",
    "Collective",
    "CollectiveCost",
    "CostBreakdown",
    "CostError",
    "DevicePlacement",
    "FitsMemory",
    "MemoryBreakdown",
    "NodeCost",
    "Optimizer",
    "ReductionCost",
    "collective_cost",
    "compute_times",
    "default_groups",
    "fewest_micro_batches",
    "flat_coefficients",
    "iteration_cost",
    "micro_batch_counts",
    "parallel_collectives",
    "roofline_s",
    "update_s",
]

Collective = Literal[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "scatter",
    "gather",
]
COLLECTIVES: tuple[str, ...] = get_args(Collective)

Algorithm = Literal["flat", "hierarchical", "synthesized", "best"]


class CostError(PCGError):
    """A PCG cannot be costed on this machine, or an argument of the cost model is invalid.
    ``node`` names the node at fault when there is one."""


# --- Collectives --------------------------------------------------------------------------------


def _check_collective(kind: str) -> None:
    if kind not in COLLECTIVES:
        raise CostError(f"unknown collective {kind!r}; valid: {', '.join(COLLECTIVES)}")


def flat_coefficients(kind: str, p: int, nbytes: float) -> tuple[float, float]:
    """``(a, b)`` such that the flat algorithm for collective ``kind`` among ``p`` devices with a
    per-device message of ``nbytes`` takes ``a * alpha + b * beta`` seconds (module docstring).

    ``b`` is also what each device sends on its busiest edge. ``nbytes`` is the per-device
    buffer: the vector for AllReduce, Broadcast and Reduce, the gathered output for AllGather and
    Gather, the input for ReduceScatter and Scatter, each device's buffer for AllToAll.

    >>> flat_coefficients("all_reduce", 4, 1000)
    (6, 1500.0)
    """
    _check_collective(kind)
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise CostError(f"a group has a positive integer number of devices, got {p!r}")
    if not math.isfinite(nbytes) or nbytes < 0:
        raise CostError(f"a message size is a finite number of bytes >= 0, got {nbytes!r}")
    if kind == "all_reduce":
        return 2 * (p - 1), 2 * (p - 1) / p * nbytes
    if kind in ("broadcast", "reduce"):
        return p - 1, float(nbytes) if p > 1 else 0.0
    return p - 1, (p - 1) / p * nbytes


@dataclass(frozen=True, slots=True)
class CollectiveCost:
    """The cost of one collective (all its groups at once).

    ``nbytes``: the per-device message (see :func:`flat_coefficients`); ``bytes``: everything
    sent, summed over all devices and groups; ``bytes_per_level``: the same bytes by the level
    whose link separates sender and receiver (the outermost one a message crosses);
    ``seconds_per_level``: the time by the level whose link limits it (each hierarchical phase
    on its own level). ``algorithm`` is ``"flat"``, ``"hierarchical"``, ``"custom"`` (the
    ``reduction_cost`` hook) or ``"none"`` (one device per group: nothing moves). ``purpose``
    says why a node pays for it: ``"forward"``, ``"backward"`` or ``"weight sync"``.
    """

    kind: str
    degree: int
    groups: int
    nbytes: float
    algorithm: str
    seconds: float
    bytes: float
    bytes_per_level: Mapping[str, float] = field(default_factory=dict)
    seconds_per_level: Mapping[str, float] = field(default_factory=dict)
    purpose: str = ""

    def __repr__(self) -> str:
        why = f"{self.purpose}: " if self.purpose else ""
        return (
            f"CollectiveCost({why}{self.kind} x{self.groups} groups of {self.degree}, "
            f"{_fmt_bytes(self.nbytes)} each, {self.algorithm}: {_fmt_s(self.seconds)}, "
            f"{_fmt_bytes(self.bytes)} moved)"
        )


class ReductionCost(Protocol):
    """The hook for synthesized reduction programs: seconds for an AllReduce of ``nbytes`` per
    device within each of ``groups`` (tuples of device indices, all running at once) on
    ``machine``."""

    def __call__(
        self, groups: tuple[tuple[int, ...], ...], nbytes: float, machine: Machine
    ) -> float: ...


@dataclass(frozen=True, slots=True)
class _Algo:
    seconds: float
    bytes_per_level: tuple[float, ...]
    seconds_per_level: tuple[float, ...]


def _edges(kind: str, group: tuple[int, ...], nbytes: float) -> Iterable[tuple[int, int, float]]:
    """The point-to-point transfers of a flat algorithm: (sender, receiver, bytes)."""
    p = len(group)
    _, per_edge = flat_coefficients(kind, p, nbytes)
    if kind in ("all_reduce", "all_gather", "reduce_scatter"):  # ring, in the group's order
        return ((group[k], group[(k + 1) % p], per_edge) for k in range(p))
    if kind == "broadcast":  # chain from the root (the first member), pipelined
        return ((group[k], group[k + 1], per_edge) for k in range(p - 1))
    if kind == "reduce":  # the same chain, towards the root
        return ((group[k + 1], group[k], per_edge) for k in range(p - 1))
    if kind == "scatter":  # the root sends each member its block
        return ((group[0], group[k], nbytes / p) for k in range(1, p))
    if kind == "gather":
        return ((group[k], group[0], nbytes / p) for k in range(1, p))
    raise AssertionError(kind)  # all_to_all is counted in closed form


def _edge_share(kind: str, p: int) -> Fraction:
    """What one edge of a flat algorithm carries, as a fraction of the message (exactly)."""
    if kind == "all_reduce":
        return Fraction(2 * (p - 1), p)
    if kind in ("all_gather", "reduce_scatter"):
        return Fraction(p - 1, p)
    if kind in ("broadcast", "reduce"):
        return Fraction(1)
    return Fraction(1, p)  # scatter, gather: one block


def _flat(kind: str, groups: tuple[tuple[int, ...], ...], nbytes: float, machine: Machine) -> _Algo:
    levels = machine.levels
    depth = len(levels)
    coords = {d: machine.coordinates(d) for g in groups for d in g}
    # Bytes leaving (out) and entering (in) each unit, per level: links are per direction.
    out_load: list[defaultdict[tuple[int, ...], float]] = [defaultdict(float) for _ in levels]
    in_load: list[defaultdict[tuple[int, ...], float]] = [defaultdict(float) for _ in levels]
    # Bytes are added up exactly: a ring splits a message into p chunks, and the totals of a
    # plan must come out as whole bytes (Unity's 813,056 elements).
    by_level = [Fraction(0)] * depth
    exact = Fraction(nbytes)
    for g in groups:
        if kind == "all_to_all":
            # Pairwise exchange: every ordered pair sends n/p. A unit holding m of the p members
            # sends and receives m (p - m) n / p; pairs first separated at level j are the pairs
            # in different units at level j minus those already apart at level j - 1.
            p = len(g)
            apart_before = 0
            for j in range(depth):
                members = Counter(coords[d][: j + 1] for d in g)
                for unit, m in members.items():
                    out_load[j][unit] += m * (p - m) * nbytes / p
                    in_load[j][unit] += m * (p - m) * nbytes / p
                apart = p * p - sum(m * m for m in members.values())
                by_level[j] += (apart - apart_before) * exact / p
                apart_before = apart
            continue
        share = _edge_share(kind, len(g)) * exact
        for src, dst, size in _edges(kind, g, nbytes):
            a, b = coords[src], coords[dst]
            first = next(i for i in range(depth) if a[i] != b[i])
            by_level[first] += share
            # The message climbs through the link of every level from the device up to the
            # level that separates the two (Machine's docstring).
            for j in range(first, depth):
                out_load[j][a[: j + 1]] += size
                in_load[j][b[: j + 1]] += size
    bandwidth_s, limiting = 0.0, depth - 1
    for j, level in enumerate(levels):
        busiest = max([*out_load[j].values(), *in_load[j].values(), 0.0])
        t = busiest / level.link.bandwidth_Bps
        if t > bandwidth_s:
            bandwidth_s, limiting = t, j
    steps, _ = flat_coefficients(kind, len(groups[0]), nbytes)
    # Every step waits for the largest latency on its way. (The latency of the lowest-bandwidth
    # link instead would make the time jump up when an inner link gets faster than an outer one.)
    alpha = max(
        max(level.link.latency_s for level in levels[machine.group_levels(g)[0].index :])
        for g in groups
    )
    seconds = steps * alpha + bandwidth_s
    per_level = [0.0] * depth
    per_level[limiting] = seconds
    return _Algo(seconds, tuple(float(b) for b in by_level), tuple(per_level))


def _hierarchical(
    kind: str, groups: tuple[tuple[int, ...], ...], nbytes: float, machine: Machine
) -> _Algo | None:
    """One phase per level the groups span (module docstring), or None when that does not apply:
    AllToAll, a group within one level, groups of different shapes, or an irregular group (not
    the same number of members in every unit it occupies)."""
    if kind == "all_to_all":
        return None
    spans = {tuple((s.index, s.participants) for s in machine.group_levels(g)) for g in groups}
    if len(spans) != 1:
        return None
    (span,) = spans
    if len(span) < 2 or math.prod(p for _, p in span) != len(groups[0]):
        return None
    depth = len(machine.levels)
    by_level = [Fraction(0)] * depth
    per_level = [0.0] * depth
    exact = Fraction(nbytes)
    outer = 1  # participants of the spanned levels outside the current one
    for index, p in span:
        link = machine.levels[index].link
        if kind == "all_reduce":
            steps, through_unit = 2 * (p - 1), 2 * (p - 1) / p * nbytes
            sent = 2 * (p - 1) * exact * outer
        elif kind in ("all_gather", "reduce_scatter"):
            steps, through_unit, sent = p - 1, (p - 1) / p * nbytes, (p - 1) * exact * outer
        elif kind in ("broadcast", "reduce"):
            steps, through_unit, sent = p - 1, float(nbytes), (p - 1) * exact * outer
        else:  # scatter, gather: each phase splits what the previous one delivered
            steps, through_unit = p - 1, (p - 1) / p * nbytes / outer
            sent = Fraction(p - 1, p) * exact
        # Groups that share a unit share its link.
        sharing = Counter(
            unit for g in groups for unit in {machine.coordinates(d)[: index + 1] for d in g}
        )
        seconds = steps * link.latency_s + max(sharing.values()) * through_unit / link.bandwidth_Bps
        by_level[index] += sent * len(groups)
        per_level[index] += seconds
        outer *= p
    return _Algo(sum(per_level), tuple(float(b) for b in by_level), tuple(per_level))


def _synthesized(
    kind: str, groups: tuple[tuple[int, ...], ...], nbytes: float, machine: Machine
) -> _Algo | None:
    """The best reduction program P^2-style synthesis finds
    (:mod:`pcgopt.extract.strategies.reduction`)
    for an AllReduce or Reduce whose groups span two or more levels; None otherwise."""
    if kind not in ("all_reduce", "reduce"):
        return None
    depth = len(machine.group_levels(groups[0]))
    if depth < 2:
        return None
    if kind == "reduce" and any(list(g) != sorted(g) for g in groups):
        return None  # programs reduce to the lowest-numbered member; this root is another
    # The synthesizer prices its steps with this module's flat algorithms, so it imports this
    # module; importing it here, at first use, keeps the two free of an import cycle.
    from pcgopt.extract.strategies.reduction import best_program

    # Up to 5 steps on two levels (93 programs); up to 4 on deeper layouts (385 programs on
    # three levels, against 1,635 of 5 steps that take about 0.5 s to synthesize per layout);
    # the 5-step fully hierarchical AllReduce there is the "hierarchical" algorithm above.
    best = best_program(
        groups,
        nbytes,
        machine,
        target=kind,  # type: ignore[arg-type]
        max_size=5 if depth == 2 else 4,
    )
    if best is None:
        return None
    return _Algo(best.seconds, best.bytes_per_level, best.seconds_per_level)


def _as_groups(groups: Iterable[Iterable[int]], machine: Machine) -> tuple[tuple[int, ...], ...]:
    out = tuple(tuple(g) for g in groups)
    if not out:
        raise CostError("a collective needs at least one group of devices")
    sizes = {len(g) for g in out}
    if len(sizes) != 1 or 0 in sizes:
        raise CostError(
            f"the groups of a collective are non-empty and of one size, got sizes {sorted(sizes)}"
        )
    seen: set[int] = set()
    for g in out:
        for d in g:
            try:
                machine.coordinates(d)
            except MachineError as e:
                raise CostError(str(e)) from None
            if d in seen:
                raise CostError(
                    f"device {d} appears twice in the groups {[list(g) for g in out]}; a device "
                    "holds one shard of a tensor"
                )
            seen.add(d)
    return out


def collective_cost(
    kind: str,
    groups: Iterable[Iterable[int]],
    nbytes: float,
    machine: Machine,
    *,
    algorithm: Algorithm = "best",
    reduction_cost: ReductionCost | None = None,
) -> CollectiveCost:
    """The time and traffic of collective ``kind`` run at once within every group of
    ``groups`` (device indices; the first member is the root of rooted collectives), with a
    per-device message of ``nbytes`` (see :func:`flat_coefficients`).

    ``algorithm``: ``"flat"``, ``"hierarchical"`` (flat where no hierarchical form applies),
    ``"synthesized"`` (for an AllReduce or Reduce spanning two or more levels, the fastest program
    of :func:`pcgopt.extract.strategies.reduction.best_program`; otherwise the faster of flat and
    hierarchical) or ``"best"``, the fastest of the three. ``reduction_cost``: the hook that times
    AllReduce instead (see :class:`ReductionCost`).

    >>> m = Machine.preset("summit", nodes=1, devices_per_node=2)
    >>> c = collective_cost("all_reduce", [(0, 1)], 4e6, m)
    >>> c.bytes, round(c.seconds * 1e6, 1)  # 2(p-1) n moved; 2 alpha + n / 50 GB/s
    (8000000.0, 86.8)
    """
    _check_collective(kind)
    if not isinstance(machine, Machine):
        raise CostError(f"machine must be a pcgopt.Machine, got {machine!r}")
    if algorithm not in get_args(Algorithm):
        raise CostError(
            f"algorithm must be one of {', '.join(map(repr, get_args(Algorithm)))}, "
            f"got {algorithm!r}"
        )
    try:
        groups = _memo_groups(groups, machine)  # type: ignore[arg-type]
    except TypeError:  # unhashable (lists): validate without the cache
        groups = _as_groups(groups, machine)
    nbytes = float(nbytes)
    flat_coefficients(kind, len(groups[0]), nbytes)  # validates nbytes
    if reduction_cost is None:
        return _memo_collective(kind, groups, nbytes, machine, algorithm)
    return _collective(kind, groups, nbytes, machine, algorithm, reduction_cost)


def _collective(
    kind: str,
    groups: tuple[tuple[int, ...], ...],
    nbytes: float,
    machine: Machine,
    algorithm: Algorithm,
    reduction_cost: ReductionCost | None,
) -> CollectiveCost:
    names = [level.name for level in machine.levels]
    degree = len(groups[0])
    if degree == 1 or nbytes == 0:
        zero = MappingProxyType(dict.fromkeys(names, 0.0))
        return CollectiveCost(kind, degree, len(groups), nbytes, "none", 0.0, 0.0, zero, zero)
    flat = _flat(kind, groups, nbytes, machine)
    hier = None if algorithm == "flat" else _hierarchical(kind, groups, nbytes, machine)
    chosen, label = flat, "flat"
    if hier is not None and (algorithm == "hierarchical" or hier.seconds < flat.seconds):
        chosen, label = hier, "hierarchical"
    # The hook replaces AllReduce only; Reduce keeps its synthesized programs.
    if algorithm in ("synthesized", "best") and (reduction_cost is None or kind == "reduce"):
        synthesized = _synthesized(kind, groups, nbytes, machine)
        # Ties keep the simpler algorithm (a flat AllReduce is also a one-step program).
        if synthesized is not None and (
            algorithm == "synthesized" or synthesized.seconds < chosen.seconds * (1 - 1e-9)
        ):
            chosen, label = synthesized, "synthesized"
    seconds, per_level = chosen.seconds, dict(zip(names, chosen.seconds_per_level, strict=True))
    if reduction_cost is not None and kind == "all_reduce":
        seconds = float(reduction_cost(groups, nbytes, machine))
        if not math.isfinite(seconds) or seconds < 0:
            raise CostError(f"reduction_cost returned {seconds!r}; it must be seconds >= 0")
        outermost = min(s.index for g in groups for s in machine.group_levels(g))
        per_level = dict.fromkeys(names, 0.0)
        per_level[names[outermost]] = seconds
        label = "custom"
    return CollectiveCost(
        kind=kind,
        degree=degree,
        groups=len(groups),
        nbytes=nbytes,
        algorithm=label,
        seconds=seconds,
        bytes=sum(chosen.bytes_per_level),
        bytes_per_level=MappingProxyType(dict(zip(names, chosen.bytes_per_level, strict=True))),
        seconds_per_level=MappingProxyType(per_level),
    )


# The cost model asks for the same few group layouts thousands of times per plan.
_memo_groups = functools.lru_cache(maxsize=4096)(
    lambda groups, machine: _as_groups(groups, machine)
)


# Searches cost the same collectives over and over (every plan of a coordinate descent, every
# e-node of an extraction); the result depends only on these arguments and is immutable.
@functools.lru_cache(maxsize=1 << 16)
def _memo_collective(
    kind: str,
    groups: tuple[tuple[int, ...], ...],
    nbytes: float,
    machine: Machine,
    algorithm: Algorithm,
) -> CollectiveCost:
    return _collective(kind, groups, nbytes, machine, algorithm, None)


# --- Compute --------------------------------------------------------------------------------------


def roofline_s(flops: float, nbytes: float, dtype: DType | str, device: DeviceSpec) -> float:
    """One kernel's time on ``device``: ``max(flops / peak(dtype), bytes / memory bandwidth)``
    plus the launch overhead. A kernel without FLOPs needs no rate for its dtype.

    >>> from pcgopt.machine import V100_SXM2_16GB as v100
    >>> round(roofline_s(2 * 64 * 784 * 512, 4 * (64 * 784 + 784 * 512 + 64 * 512), "f32", v100)
    ...       * 1e6, 2)
    8.27
    """
    compute = flops / device.peak_flops_for(dtype) if flops else 0.0
    return max(compute, nbytes / device.memory_bandwidth_Bps) + device.launch_overhead_s


def compute_times(
    node: Node,
    ins: tuple[ParallelTensorShape, ...],
    outs: tuple[ParallelTensorShape, ...],
    grad_inputs: Sequence[bool],
    device: DeviceSpec,
) -> tuple[int, float, float]:
    """``(flops, forward_s, backward_s)`` of compute ``node`` on its shard shapes (module
    docstring, "Compute"); ``grad_inputs[i]``: whether input ``i`` needs a gradient. The one
    place a compute node's time is computed: :func:`iteration_cost` and extraction's per-e-node
    costs both call it."""
    try:
        return _memo_compute(node.op, node.params, ins, outs, tuple(grad_inputs), device)
    except MachineError as e:
        raise CostError(f"node {node.name!r} ({node.op}): {e}", node=node.name) from None


# A node's times depend on its operator, parameters and shard shapes, not on its name: plans
# and e-graphs repeat the same layer many times.
@functools.lru_cache(maxsize=1 << 16)
def _memo_compute(
    op: str,
    params: Params,
    ins: tuple[ParallelTensorShape, ...],
    outs: tuple[ParallelTensorShape, ...],
    grad_inputs: tuple[bool, ...],
    device: DeviceSpec,
) -> tuple[int, float, float]:
    node = Node(op, op, (), params)
    spec = node.spec
    flops = spec.flops(params, ins, outs)
    moved = spec.bytes_accessed(params, ins, outs)
    forward_s = roofline_s(flops, moved, outs[0].dtype, device)
    backward_s = sum(
        _gradient_s(node, ins, outs, i, forward_s, device)
        for i, needed in enumerate(grad_inputs)
        if needed
    )
    return flops, forward_s, backward_s


def parallel_collectives(op: str, input_needs_grad: bool) -> tuple[tuple[str, str], ...]:
    """The ``(collective, purpose)`` pairs parallel operator ``op`` runs when it is not a source
    layout: its forward collective and, when its input needs a gradient, the dual (module
    docstring, "Communication"). Empty for operators that move no data."""
    if op not in _DUALS:
        return ()
    forward, backward = _DUALS[op]
    if input_needs_grad:
        return ((forward, "forward"), (backward, "backward"))
    return ((forward, "forward"),)


def _gradient_s(
    node: Node,
    ins: tuple[ParallelTensorShape, ...],
    outs: tuple[ParallelTensorShape, ...],
    i: int,
    forward_s: float,
    device: DeviceSpec,
) -> float:
    """The time of the gradient of compute ``node``'s input ``i`` (module docstring): the bytes
    its spec says that gradient moves, if it says (a Concat's input: its slice); one pass over
    the output gradient for an input the operator only broadcasts (a bias, BatchNorm's scale);
    else what the forward costs."""
    spec = node.spec
    assert isinstance(spec, ComputeOp)
    moved = spec.gradient_bytes_accessed(node.params, ins, outs, i)
    if moved is not None:
        return roofline_s(0, moved, outs[0].dtype, device)
    sig = spec.signature(node.params, tuple(s.sizes for s in ins), tuple(s.sizes for s in outs))
    # Broadcast only: every dimension of the input is an output dimension, and some output
    # dimension is not one of its (a bias along the rows). A contracted dimension (a weight's k,
    # also in a fused Linear, whose signature leaves k out) or a normalized one is not.
    along_outputs = {
        ax.inputs[i]
        for ax in sig.axes
        if ax.inputs[i] is not None and any(d is not None for d in ax.outputs)
    }
    spread = any(ax.inputs[i] is None and any(d is not None for d in ax.outputs) for ax in sig.axes)
    if spread and along_outputs == set(range(ins[i].rank)):
        out = outs[0]
        return roofline_s(
            out.shard_numel, out.shard_nbytes + ins[i].shard_nbytes, out.dtype, device
        )
    return forward_s


# --- Optimizers -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Optimizer:
    """What the optimizer keeps and touches per weight element: ``states`` extra tensors the size
    of the weight (in its dtype), and ``accesses``, the tensor reads and writes of one update
    (which is memory-bound)."""

    name: str
    states: int
    accesses: int

    def __repr__(self) -> str:
        return f"Optimizer({self.name!r}, {self.states} states, {self.accesses} accesses)"


#: Plain SGD reads w and g and writes w; SGD with momentum also reads and writes the momentum;
#: Adam reads w, g, m, v and writes w, m, v.
OPTIMIZERS: Mapping[str, Optimizer] = MappingProxyType(
    {
        "sgd": Optimizer("sgd", states=0, accesses=3),
        "momentum": Optimizer("momentum", states=1, accesses=5),
        "adam": Optimizer("adam", states=2, accesses=7),
    }
)


def _optimizer(value: str | Optimizer) -> Optimizer:
    if isinstance(value, Optimizer):
        return value
    try:
        return OPTIMIZERS[value]
    except (KeyError, TypeError):
        raise CostError(
            f"unknown optimizer {value!r}; valid: {', '.join(OPTIMIZERS)} (or an Optimizer)"
        ) from None


# --- Results --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeCost:
    """One node's share of an iteration (per device, in seconds and bytes).

    ``forward_s``/``backward_s``: its compute; ``comm_forward_s``/``comm_backward_s``: its
    communication (for a Replicate on a weight, the backward is the gradient AllReduce);
    ``update_s``: the optimizer update of a weight; ``comm_bytes``: bytes it moves, summed over
    all devices; ``memory_bytes``: what it keeps on a device (a weight: its stored layouts,
    gradients and optimizer state, split in ``weight_memory``; another node: its outputs kept
    for the backward); ``flops``: forward FLOPs of one task; ``collectives``: what it
    communicates, in order.
    """

    name: str
    op: str
    forward_s: float = 0.0
    backward_s: float = 0.0
    comm_forward_s: float = 0.0
    comm_backward_s: float = 0.0
    update_s: float = 0.0
    comm_bytes: float = 0.0
    memory_bytes: int = 0
    flops: int = 0
    collectives: tuple[CollectiveCost, ...] = ()
    #: A weight's ``memory_bytes`` as (weights, gradients, optimizer state); zeros otherwise.
    weight_memory: tuple[int, int, int] = (0, 0, 0)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s

    @property
    def comm_s(self) -> float:
        return self.comm_forward_s + self.comm_backward_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s + self.update_s

    def __repr__(self) -> str:
        parts = [
            f"{label} {_fmt_s(value)}"
            for label, value in (
                ("forward", self.forward_s),
                ("backward", self.backward_s),
                ("comm", self.comm_s),
                ("update", self.update_s),
            )
            if value
        ]
        if self.comm_bytes:
            parts.append(f"moves {_fmt_bytes(self.comm_bytes)}")
        if self.memory_bytes:
            parts.append(f"keeps {_fmt_bytes(self.memory_bytes)}")
        return f"NodeCost({self.name!r} ({self.op}): {', '.join(parts) or 'free'})"


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes one device holds (the maximum over devices; see the module docstring)."""

    weights: int
    gradients: int
    optimizer_state: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer_state + self.activations

    def __repr__(self) -> str:
        return (
            f"MemoryBreakdown({_fmt_bytes(self.total)}: weights {_fmt_bytes(self.weights)}, "
            f"gradients {_fmt_bytes(self.gradients)}, optimizer {_fmt_bytes(self.optimizer_state)}"
            f", activations {_fmt_bytes(self.activations)})"
        )


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """What one training iteration costs, and where (see :func:`iteration_cost`).

    ``total_s``: the iteration's time. From :func:`iteration_cost` it is the simulated iteration
    under ``runtime`` (:mod:`~pcgopt.extract.costmodel.simulate`: collectives beside computation,
    gradients in buckets), at most :attr:`additive_s` ``= compute_s + comm_s + update_s``, the
    same work one task after another (``comm_s`` charges every gradient its own AllReduce);
    ``exposed_comm_s``: how much of ``total_s`` the compute stream waits for communication, and
    :meth:`timeline` what runs when. A machine mapping
    (:meth:`pcgopt.extract.search.mapping.MachineMapping.cost`) that runs independent branches at
    once on disjoint devices sets ``total_s`` to its schedule's time, ``overlap_s`` to what that
    saves over the simulated in-sequence iteration, net of moving tensors between them (0
    otherwise), ``exposed_comm_s`` to all of ``comm_s`` (its schedule overlaps no communication
    inside a branch: an upper bound) and the timeline to its units on their device blocks.
    ``comm_bytes``: bytes sent, summed over all devices; ``*_per_level``: by machine level,
    outermost first. ``memory_per_device``: bytes a device holds (``memory`` splits it),
    ``feasible``: whether that fits ``memory_capacity``. ``devices_used``: the most devices any node
    spans. ``per_node``: every node, in the PCG's order. ``str()`` (or :meth:`summary`) is a table
    of the costliest nodes.
    """

    machine: str
    optimizer: str
    total_s: float
    compute_s: float
    forward_s: float
    backward_s: float
    comm_s: float
    update_s: float
    comm_bytes: float
    comm_bytes_per_level: Mapping[str, float]
    comm_s_per_level: Mapping[str, float]
    memory: MemoryBreakdown
    memory_capacity: int
    devices_used: int
    per_node: Mapping[str, NodeCost]
    micro_batches: int = 1
    overlap_s: float = 0.0
    exposed_comm_s: float = 0.0
    runtime: Runtime = DDP
    schedule: Timeline | None = field(default=None, repr=False, compare=False)
    #: The tasks the timeline was simulated from, to simulate again on a mapping's devices.
    simulation: Simulation | None = field(default=None, repr=False, compare=False)

    @property
    def additive_s(self) -> float:
        """The iteration's time with nothing overlapped: compute, communication and update
        added up (each gradient synchronized alone)."""
        return self.compute_s + self.comm_s + self.update_s

    def timeline(self) -> Timeline:
        """When every task runs (:class:`~pcgopt.extract.costmodel.simulate.Timeline`)."""
        if self.schedule is None:
            if self.simulation is None:
                raise CostError("this cost has no timeline (it was built by hand)")
            # Simulated when first asked for: the additive runtime's time does not need it.
            object.__setattr__(self, "schedule", self.simulation.run())
        return self.schedule

    @property
    def memory_per_device(self) -> int:
        return self.memory.total

    @property
    def feasible(self) -> bool:
        return self.memory.total <= self.memory_capacity

    def renamed(self, names: Mapping[str, str]) -> CostBreakdown:
        """The same costs for the PCG with node ``n`` named ``names[n]`` (``PCG.renamed``)."""
        per_node = {names[k]: replace(v, name=names[k]) for k, v in self.per_node.items()}
        schedule = None if self.schedule is None else self.schedule.renamed(names)
        simulation = None if self.simulation is None else self.simulation.renamed(names)
        return replace(
            self, per_node=MappingProxyType(per_node), schedule=schedule, simulation=simulation
        )

    def mapped_timeline(
        self,
        offsets: Mapping[str, int],
        machine: Machine,
        moves: Mapping[tuple[str, str], float],
    ) -> Timeline:
        """The iteration simulated again with every node's tasks on the devices from
        ``offsets[node]`` (a machine mapping's, which shifts each node's device groups with it;
        nodes not named start at 0), on ``machine``: independent branches on disjoint devices
        run at once, and each overlaps its own communication. ``moves[(reader, node)]``: the
        bytes each receiving device gets of what ``reader`` reads from ``node`` when the two
        start on different devices (:attr:`~pcgopt.extract.search.mapping.MachineMapping.moves`);
        it waits for one message of them (its gradient, if any, goes back the same way) over
        the link of the outermost level where the two devices differ, ``latency + bytes /
        bandwidth``, the machine mapping's price for a transfer."""
        sim = self.simulation
        if sim is None:
            raise CostError("this cost has no simulation to map (it was built by hand)")
        position = {node.name: k for k, node in enumerate(sim.nodes)}
        first = [0] * len(sim.nodes)
        for name, start in offsets.items():
            k = position.get(name)
            if k is None:
                raise CostError(f"offsets name node {name!r}, which this cost has no entry for")
            stop = start + sim.nodes[k].devices if isinstance(start, int) else -1
            if isinstance(start, bool) or not 0 <= start < stop <= machine.num_devices:
                raise CostError(
                    f"node {name!r} spans {sim.nodes[k].devices} devices from {start!r}; machine "
                    f"{machine.name!r} has devices 0 to {machine.num_devices - 1}",
                    node=name,
                )
            first[k] = start
        by_position = {
            (position[node], position[reader]): float(nbytes)
            for (reader, node), nbytes in moves.items()
            if reader in position and node in position
        }
        return sim.run(
            offsets=first, transfer=functools.partial(_moved_s, machine), moves=by_position
        )

    def __repr__(self) -> str:
        fits = "feasible" if self.feasible else "INFEASIBLE"
        if self.micro_batches > 1:
            fits += f", {self.micro_batches} micro-batches"
        return (
            f"CostBreakdown({_fmt_s(self.total_s)}: compute {_fmt_s(self.compute_s)}, comm "
            f"{_fmt_s(self.comm_s)} (exposed {_fmt_s(self.exposed_comm_s)}), update "
            f"{_fmt_s(self.update_s)}"
            + branches_words(self.overlap_s)
            + f"; moves {_fmt_bytes(self.comm_bytes)}; {_fmt_bytes(self.memory_per_device)} "
            "per device of "
            f"{_fmt_bytes(self.memory_capacity)}, {fits})"
        )

    def summary(self, *, max_rows: int | None = 20) -> str:
        """A readable report: totals, communication by level, memory, then the nodes that cost
        the most time (``max_rows`` of them; None: all)."""
        fits = "fits" if self.feasible else "DOES NOT FIT"
        lines = [
            f"training iteration on {self.machine}, {self.devices_used} devices used, "
            f"optimizer {self.optimizer}"
            + (
                f", gradients accumulated over {self.micro_batches} micro-batches"
                if self.micro_batches > 1
                else ""
            )
            + f": {_fmt_s(self.total_s)}",
            f"  compute        {_fmt_s(self.compute_s):>10}  (forward {_fmt_s(self.forward_s)}, "
            f"backward {_fmt_s(self.backward_s)})",
            f"  communication  {_fmt_s(self.comm_s):>10}  ({_fmt_bytes(self.comm_bytes)} moved; "
            f"{_fmt_s(self.exposed_comm_s)} of the iteration waits for it)",
            f"  update         {_fmt_s(self.update_s):>10}",
        ]
        if self.overlap_s:
            lines.append(
                f"  branches at once {-self.overlap_s * 1e3:+8.4g} ms  (machine mapping: "
                "independent branches on disjoint devices, net of transfers"
                + (", kept to fit memory" if self.overlap_s < 0 else "")
                + ")"
            )
        width = max(len(name) for name in self.comm_bytes_per_level)
        for name, moved in self.comm_bytes_per_level.items():
            lines.append(
                f"    over {name:<{width}}  {_fmt_s(self.comm_s_per_level[name]):>10}  "
                f"{_fmt_bytes(moved):>10}"
            )
        how = (
            "the machine mapping's schedule, branches at once"
            if self.overlap_s
            else f"simulated with {self.runtime!r}"
        )
        lines.append(f"  all in sequence {_fmt_s(self.additive_s):>9}  (the time above is {how})")
        m = self.memory
        lines.append(
            f"  memory per device {_fmt_bytes(m.total)} of {_fmt_bytes(self.memory_capacity)} "
            f"({fits}): weights {_fmt_bytes(m.weights)}, gradients {_fmt_bytes(m.gradients)}, "
            f"optimizer {_fmt_bytes(m.optimizer_state)}, activations {_fmt_bytes(m.activations)}"
        )
        nodes = sorted(
            (n for n in self.per_node.values() if n.total_s or n.memory_bytes),
            key=lambda n: (-n.total_s, -n.memory_bytes),
        )
        hidden = 0
        if max_rows is not None and len(nodes) > max_rows:
            hidden = len(nodes) - max_rows
            nodes = nodes[:max_rows]
        header = ("node", "op", "forward", "backward", "comm", "update", "moved", "memory")
        rows = [header] + [
            (
                n.name if len(n.name) <= 32 else n.name[:29] + "...",
                n.op,
                _fmt_s(n.forward_s),
                _fmt_s(n.backward_s),
                _fmt_s(n.comm_s),
                _fmt_s(n.update_s),
                _fmt_bytes(n.comm_bytes),
                _fmt_bytes(n.memory_bytes),
            )
            for n in nodes
        ]
        widths = [max(len(r[k]) for r in rows) for k in range(len(header))]
        for r in rows:
            cells = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
            cells += [c.rjust(w) for c, w in zip(r[2:], widths[2:], strict=True)]
            lines.append("  " + "  ".join(cells))
        if hidden:
            lines.append(f"  ... {hidden} more nodes")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# --- The iteration ------------------------------------------------------------------------------

#: Parallel operators that, applied to a source (or to such a layout of it), describe how it is
#: loaded or stored rather than move data.
LAYOUT_OPS = frozenset({"partition", "replicate"})

# Forward collective and backward (dual) collective of each parallel operator that moves data.
_DUALS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "partition": ("scatter", "gather"),
        "combine": ("gather", "scatter"),
        "replicate": ("broadcast", "reduce"),
        "reduce": ("reduce", "broadcast"),
        "all_reduce": ("all_reduce", "all_reduce"),
        "all_gather": ("all_gather", "reduce_scatter"),
        "reduce_scatter": ("reduce_scatter", "all_gather"),
        "all_to_all": ("all_to_all", "all_to_all"),
    }
)

DevicePlacement = Mapping[str, Sequence[int] | Sequence[Sequence[int]]]


@dataclass
class _Acc:
    """A node's cost while it is being added up."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    comm_forward_s: float = 0.0
    comm_backward_s: float = 0.0
    update_s: float = 0.0
    memory_bytes: int = 0
    flops: int = 0
    grad_inputs: int = 0
    devices: int = 1
    weight_memory: tuple[int, int, int] = (0, 0, 0)
    collectives: list[CollectiveCost] = field(default_factory=list)
    # A replicated trainable weight's gradient synchronizations (groups, bytes, seconds, and
    # under ZeRO its gathered update's seconds), for the simulation's buckets.
    syncs: list[tuple[tuple[tuple[int, ...], ...], float, float, float]] = field(
        default_factory=list
    )

    def add(self, cost: CollectiveCost, purpose: str) -> None:
        self.collectives.append(replace(cost, purpose=purpose))
        if purpose == "forward":
            self.comm_forward_s += cost.seconds
        else:
            self.comm_backward_s += cost.seconds


class _Placement:
    """Device groups of parallel nodes: explicit ones checked, defaults consecutive."""

    def __init__(self, pcg: PCG, machine: Machine, devices: DevicePlacement | None) -> None:
        self.machine = machine
        self.explicit: dict[str, object] = {}
        # Groups already checked, by (groups, degree, width): a placement gives most nodes of
        # a deep model the same groups, and checking walks every device.
        self._checked: dict[tuple[object, int, int], tuple[tuple[int, ...], ...]] = {}
        if devices is None:
            return
        if not isinstance(devices, Mapping):
            raise CostError(
                f"devices must map node names to device groups, got {type(devices).__name__}"
            )
        for name, value in devices.items():
            if name not in pcg:
                raise CostError(f"devices names node {name!r}, which is not in the PCG", node=name)
            node = pcg.node(name)
            if node.spec.kind is not OpKind.PARALLEL:
                raise CostError(
                    f"devices places node {name!r} ({node.op}), but only parallelization "
                    "operators move data; compute nodes run where their inputs are",
                    node=name,
                )
            self.explicit[name] = value

    def groups(self, node: Node, degree: int, width: int) -> tuple[tuple[int, ...], ...]:
        """The ``width // degree`` groups of ``degree`` devices that ``node`` communicates in."""
        num_devices = self.machine.num_devices
        if width > num_devices:
            raise CostError(
                f"node {node.name!r} ({node.op}) spans {width} devices, but machine "
                f"{self.machine.name!r} has {num_devices}",
                node=node.name,
            )
        if node.name not in self.explicit:
            return default_groups(degree, width)
        value = self.explicit[node.name]
        key: tuple[object, int, int] | None = (value, degree, width)
        try:
            if key in self._checked:
                return self._checked[key]
        except TypeError:  # groups given as lists: checked every time
            key = None
        checked = self._check(node, value, degree, width)
        if key is not None:
            self._checked[key] = checked
        return checked

    def _check(
        self, node: Node, value: object, degree: int, width: int
    ) -> tuple[tuple[int, ...], ...]:
        count = width // degree
        where = f"devices[{node.name!r}]"
        try:
            items = list(value)  # type: ignore[call-overload]
        except TypeError:
            raise CostError(
                f"{where} must be device groups, got {value!r}", node=node.name
            ) from None
        if items and all(_is_index(d) for d in items):
            if len(items) != width:
                raise CostError(
                    f"{where} lists {len(items)} devices; node {node.name!r} ({node.op}) needs "
                    f"{width}: {count} group(s) of {degree}",
                    node=node.name,
                )
            items = [items[g * degree : (g + 1) * degree] for g in range(count)]
        if len(items) != count or any(
            isinstance(g, str | bytes) or not isinstance(g, Sequence) or len(g) != degree
            for g in items
        ):
            raise CostError(
                f"{where} must be {count} group(s) of {degree} devices for node {node.name!r} "
                f"({node.op}), got {value!r}",
                node=node.name,
            )
        for g in items:
            for d in g:
                if not _is_index(d):
                    raise CostError(f"{where}: {d!r} is not a device index", node=node.name)
        try:
            return _as_groups(items, self.machine)
        except CostError as e:
            raise CostError(f"{where}: {e.message}", node=node.name) from None


def default_groups(degree: int, width: int) -> tuple[tuple[int, ...], ...]:
    """The default placement (module docstring, "Placement"): ``width // degree`` groups of
    ``degree`` consecutive devices."""
    return tuple(tuple(range(g * degree, (g + 1) * degree)) for g in range(width // degree))


def _bucket_s(
    machine: Machine,
    timer: ReductionCost | None,
    groups: tuple[tuple[int, ...], ...],
    nbytes: float,
    kind: str,
) -> float:
    """A bucket's collective (:data:`~pcgopt.extract.costmodel.simulate.BucketCost`): once, at
    the end of the last micro-batch."""
    return collective_cost(kind, groups, nbytes, machine, reduction_cost=timer).seconds


def _moved_s(machine: Machine, source: int, target: int, nbytes: float) -> float:
    """One message of ``nbytes`` from device ``source`` to device ``target``, over the link of
    the outermost level where they differ."""
    unit = machine.num_devices
    for level in machine.levels:
        unit //= level.count
        if source // unit != target // unit:
            return level.link.latency_s + nbytes / level.link.bandwidth_Bps
    return 0.0


def update_s(nbytes: int, optimizer: Optimizer, device: DeviceSpec) -> float:
    """The optimizer update of a stored weight layout of ``nbytes`` per device: memory-bound,
    ``optimizer.accesses`` passes plus one launch."""
    return optimizer.accesses * nbytes / device.memory_bandwidth_Bps + device.launch_overhead_s


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def source_layouts(pcg: PCG) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Where ``pcg`` keeps its sources. ``source_of[name]``: the source that node ``name`` only
    loads or stores (the source itself, or a Partition or Replicate of such a node);
    ``stored[name]``, for each of those nodes: the layouts at or after it that something else
    reads (or that are graph outputs), i.e. those the source is kept in. A replicated
    trainable weight syncs its gradient in each of them."""
    source_of: dict[str, str] = {}
    for n in pcg.nodes:
        if n.spec.kind is OpKind.SOURCE:
            source_of[n.name] = n.name
        elif n.op in LAYOUT_OPS and n.inputs[0].node in source_of:
            source_of[n.name] = source_of[n.inputs[0].node]
    consumers = pcg.consumers()
    graph_outputs = set(pcg.outputs)
    stored: dict[str, tuple[str, ...]] = {}
    for n in reversed(pcg.nodes):  # consumers first
        if n.name not in source_of:
            continue
        ref = TensorRef(n.name)
        readers = consumers.get(ref, ())
        kept = ref in graph_outputs or any(c not in source_of for c, _ in readers)
        below = [c for c, _ in readers if c in source_of]
        stored[n.name] = ((n.name,) if kept else ()) + tuple(
            layout for c in below for layout in stored[c]
        )
    return source_of, stored


def iteration_cost(
    pcg: PCG,
    machine: Machine,
    *,
    optimizer: str | Optimizer = "adam",
    devices: DevicePlacement | None = None,
    reduction_cost: ReductionCost | None = None,
    micro_batches: int = 1,
    runtime: Runtime = DDP,
    precision: str | None = None,
    grad_inputs: Collection[str] = (),
) -> CostBreakdown:
    """The cost of one training iteration of ``pcg`` on ``machine`` (model in the module
    docstring): time, communication, memory per device and whether it fits.

    ``optimizer``: ``"adam"``, ``"momentum"``, ``"sgd"`` (see :data:`OPTIMIZERS`) or an
    :class:`Optimizer`. ``devices``: explicit device groups for parallel nodes (module
    docstring, "Placement"). ``reduction_cost``: times every AllReduce instead of the alpha-beta
    model (:class:`ReductionCost`). ``micro_batches``: gradient accumulation over that many
    micro-batches (module docstring); every data input's dimension-0 blocks must divide by it.
    ``runtime``: what the training runtime overlaps and how it buckets gradients
    (:class:`~pcgopt.extract.costmodel.simulate.Runtime`; default PyTorch DDP's): the time is
    that of the simulated iteration (:mod:`~pcgopt.extract.costmodel.simulate`), the additive
    figures stay in the breakdown. ``precision``: the runtime's (``"f32"``, ``"bf16-mixed"``,
    ``"f16-mixed"``; :class:`~pcgopt.extract.costmodel.simulate.Runtime`), if given.
    ``grad_inputs``: names of inputs whose gradient the iteration computes (a pipeline stage's
    entry, whose gradient goes back to the stage before it, in the layout the input came in:
    the gradients of an input fed in copies are summed by a Reduce); other inputs get none.

    >>> from pcgopt import PCGBuilder
    >>> b = PCGBuilder()
    >>> x = b.partition(b.input((64, 784), name="x"), dim=0, degree=2)
    >>> w = b.replicate(b.weight((784, 10), name="w"), degree=2)
    >>> cost = iteration_cost(b.build(b.matmul(x, w)), Machine.preset("dgx-a100"))
    >>> cost.comm_bytes == 2 * 784 * 10 * 4  # the gradient AllReduce of w: 2(p-1) n
    True
    """
    if not isinstance(pcg, PCG):
        raise CostError(f"pcg must be a pcgopt.PCG, got {type(pcg).__name__}")
    if not isinstance(machine, Machine):
        raise CostError(f"machine must be a pcgopt.Machine, got {type(machine).__name__}")
    # Micro-batches first: a count that does not divide the batch fails before the placement
    # is worked out (accumulate_to_fit tries several).
    m = _check_micro_batches(pcg, micro_batches)
    m, micro_nodes = _explicit_micro_batches(pcg, m)
    if not isinstance(runtime, Runtime):
        raise CostError(
            f"runtime must be a pcgopt.extract.Runtime (e.g. Runtime(overlap=False)), got "
            f"{type(runtime).__name__}"
        )
    if precision is not None:
        try:
            runtime = replace(runtime, precision=precision)
        except ValueError as e:
            raise CostError(f"precision: {e}") from None
    _check_precision(runtime, machine)
    grad_inputs = frozenset(grad_inputs)
    inputs = {n.name for n in pcg.inputs}
    for name in sorted(grad_inputs - inputs):
        raise CostError(
            f"grad_inputs names {name!r}, which is not an input of the PCG (its inputs: "
            f"{', '.join(sorted(inputs)) or 'none'})"
        )
    it = _Iteration(
        pcg,
        machine,
        _optimizer(optimizer),
        _Placement(pcg, machine, devices),
        reduction_cost,
        m,
        runtime,
        grad_inputs,
        micro_nodes,
    )
    devices_used = it.add_node_times()
    memory = it.add_memory_and_updates()
    return it.breakdown(memory, devices_used)


def _check_precision(runtime: Runtime, machine: Machine) -> None:
    """A mixed precision needs the device's rate for its dtype."""
    low = runtime.compute_dtype
    rates = machine.device.peak_flops
    if low is not None and low.value not in rates:
        usable = [repr(p) for p in PRECISIONS if p.split("-")[0] in rates]
        raise CostError(
            f"precision {runtime.precision!r} computes in {low.value}, but device "
            f"{machine.device.name!r} has no rate for it (it has: {', '.join(rates)}); use "
            + " or ".join(usable)
        )


class _Iteration:
    """One :func:`iteration_cost` call's facts about the PCG, and the per-node costs being
    added up: times and collectives first, then memory and updates, then the breakdown."""

    def __init__(
        self,
        pcg: PCG,
        machine: Machine,
        opt: Optimizer,
        placement: _Placement,
        reduction_cost: ReductionCost | None,
        micro_batches: int,
        runtime: Runtime = DDP,
        grad_inputs: frozenset[str] = frozenset(),
        micro_nodes: frozenset[str] | None = None,
    ) -> None:
        self.pcg, self.machine, self.opt, self.placement = pcg, machine, opt, placement
        self.reduction_cost = reduction_cost
        self.runtime = runtime
        self.low = runtime.compute_dtype
        self.m = micro_batches
        self.acc = {n.name: _Acc() for n in pcg.nodes}
        # Which nodes carry the data (and so a micro-batch's share), which tensors need a
        # gradient, and which nodes only load or store a source in a layout.
        self.on_data: dict[str, bool] = {}
        self.needs_grad: dict[str, bool] = {}
        for n in pcg.nodes:
            if micro_nodes is not None:  # the PCG says which nodes (Pipeline .. Batch)
                self.on_data[n.name] = n.name in micro_nodes
            else:
                self.on_data[n.name] = n.op == "input" or any(
                    self.on_data[r.node] for r in n.inputs
                )
            if n.op == "weight":
                self.needs_grad[n.name] = bool(n.params["trainable"])
            elif n.op == "input":
                self.needs_grad[n.name] = n.name in grad_inputs
            else:
                self.needs_grad[n.name] = any(self.needs_grad[r.node] for r in n.inputs)
        self.source_of, self.stored_below = source_layouts(pcg)
        self.consumers = pcg.consumers()
        self._gradient_rows: dict[str, int | None] = {}
        # Under ZeRO: how many ways the optimizer of a weight layout stored in copies is sharded.
        self.zero_ways: dict[str, int] = {}

    def computed(self, shape: ParallelTensorShape) -> ParallelTensorShape:
        """``shape`` in the dtype the runtime computes it in (mixed precision: float32 in
        its low precision)."""
        if self.low is None or shape.dtype is not DType.F32:
            return shape
        return replace(shape, dtype=self.low)

    def touched_bytes(self, weight: str, layout: ParallelTensorShape) -> int:
        """Bytes of one shard of ``weight`` (stored as ``layout``) an iteration's gradient can
        make non-zero: every row, unless every reader of the weight's stored layouts only
        looks rows up (an embedding table), then at most one row per index read."""
        pcg = self.pcg
        if weight not in self._gradient_rows:
            rows: int | None = 0
            for stored in self.stored_below[weight]:
                for c, slot in self.consumers.get(TensorRef(stored), ()):
                    if c in self.source_of:
                        continue
                    reader = pcg.node(c)
                    sizes = tuple(s.sizes for s in pcg.input_shapes(c))
                    found = reader.spec.gradient_rows(reader.params, sizes, slot)
                    rows = None if found is None or rows is None else rows + found
            self._gradient_rows[weight] = rows
        rows = self._gradient_rows[weight]
        if rows is None or layout.rank == 0:
            return layout.shard_nbytes
        shard_rows = max(1, layout.sizes[0] // layout.degrees[0])
        return min(layout.shard_nbytes, rows * (layout.shard_nbytes // shard_rows))

    def collective(
        self, kind: str, groups, nbytes: float, name: str | None = None
    ) -> CollectiveCost:
        """One collective, or (``name`` given, with gradient accumulation) the ``m`` that node
        runs, one per micro-batch."""
        m, machine, timer = self.m, self.machine, self.reduction_cost
        if m == 1 or name is None:
            return collective_cost(kind, groups, nbytes, machine, reduction_cost=timer)
        share = nbytes / m if self.on_data[name] else nbytes
        one = collective_cost(kind, groups, share, machine, reduction_cost=timer)
        return replace(
            one,
            seconds=m * one.seconds,
            bytes=m * one.bytes,
            bytes_per_level=MappingProxyType({k: m * v for k, v in one.bytes_per_level.items()}),
            seconds_per_level=MappingProxyType(
                {k: m * v for k, v in one.seconds_per_level.items()}
            ),
        )

    def _fits(self, n: Node, count: int, what: str, unit: str = "") -> None:
        machine = self.machine
        if count > machine.num_devices:
            raise CostError(
                f"node {n.name!r} ({n.op}) {what}, but machine {machine.name!r} has "
                f"{machine.num_devices}{unit}",
                node=n.name,
            )

    def add_node_times(self) -> int:
        """Each node's compute times and collectives; returns the devices the plan spans."""
        devices_used = 1
        for n in self.pcg.nodes:
            if n.spec.kind is OpKind.COMPUTE:
                devices_used = max(devices_used, self._add_compute(n))
            elif n.spec.kind is OpKind.PARALLEL and n.op in _DUALS:
                devices_used = max(devices_used, self._add_collectives(n))
            elif n.spec.kind is OpKind.PARALLEL:
                # Moves no data, but its tensors must fit the machine.
                shapes = (*self.pcg.input_shapes(n.name), *self.pcg.output_shapes(n.name))
                width = max(s.num_shards for s in shapes)
                self._fits(n, width, f"spans {width} devices")
                devices_used = max(devices_used, width)
        return devices_used

    def _add_compute(self, n: Node) -> int:
        a, device = self.acc[n.name], self.machine.device
        ins, outs = self.pcg.input_shapes(n.name), self.pcg.output_shapes(n.name)
        if self.low is not None:
            ins, outs = tuple(map(self.computed, ins)), tuple(map(self.computed, outs))
        tasks = outs[0].num_shards
        self._fits(n, tasks, f"runs {tasks} tasks", " devices")
        grads = tuple(self.needs_grad[r.node] for r in n.inputs)
        a.devices = tasks
        a.flops, a.forward_s, a.backward_s = compute_times(n, ins, outs, grads, device)
        a.grad_inputs = sum(grads)
        if self.m > 1 and self.on_data[n.name]:
            launches = (self.m - 1) * device.launch_overhead_s
            a.forward_s += launches
            a.backward_s += launches * sum(grads)
        return tasks

    def _add_collectives(self, n: Node) -> int:
        """A parallel node that moves data: its collectives in the forward and backward pass,
        or, for a replicated trainable weight, the gradient sync of each stored layout."""
        a, pcg, placement = self.acc[n.name], self.pcg, self.placement
        ins, outs = pcg.input_shapes(n.name), pcg.output_shapes(n.name)
        degree = n.params["degree"]
        width = max(ins[0].num_shards, outs[0].num_shards)
        nbytes = max(self.computed(ins[0]).shard_nbytes, self.computed(outs[0]).shard_nbytes)
        a.devices = width
        source = self.source_of.get(n.name)
        if source is None:
            groups = placement.groups(n, degree, width)
            for kind, purpose in parallel_collectives(n.op, self.needs_grad[n.inputs[0].node]):
                a.add(self.collective(kind, groups, nbytes, n.name), purpose)
        elif n.op == "replicate" and self.needs_grad[n.name] and pcg.node(source).op == "input":
            # An input fed in copies whose gradient goes back (grad_inputs): each copy's
            # gradient is a share of it, summed before it goes back. (A split input's gradient
            # goes back split, as the input came: free.)
            groups = placement.groups(n, degree, width)
            a.add(self.collective("reduce", groups, nbytes, n.name), "backward")
        elif n.op == "replicate" and self.needs_grad[n.name]:
            # A replicated trainable weight: every copy must receive the summed gradient (under
            # ZeRO-2 its shard of it), and under ZeRO its updated weight is gathered.
            zero = self.runtime.zero_stage
            for layout in self.stored_below[n.name]:
                shape = pcg.shape(layout)
                groups = placement.groups(n, degree, shape.num_shards)
                # ZeRO shards and gathers whole flat buffers: no sparse rows.
                touched = (
                    shape.shard_nbytes
                    if zero
                    else self.touched_bytes(self.source_of[n.name], shape)
                )
                sync = self.collective(self.runtime.sync_collective, groups, touched)
                a.add(sync, "weight sync")
                gather = 0.0
                if zero:
                    gathered = self.collective("all_gather", groups, touched)
                    a.add(gathered, "weight sync")
                    gather = gathered.seconds
                    self.zero_ways[layout] = len(groups[0])
                a.syncs.append((groups, touched, sync.seconds, gather))
        else:
            placement.groups(n, degree, width)  # still on the machine
        return width

    def add_memory_and_updates(self) -> MemoryBreakdown:
        """Memory per device and the optimizer update. Weights are kept in their stored
        layouts, once each; activations are the tensors a backward pass reads."""
        pcg, opt, device, acc = self.pcg, self.opt, self.machine.device, self.acc
        weights = gradients = states = activations = 0
        stored_weight: set[str] = set()
        for n in pcg.nodes:
            if n.op != "weight":
                continue
            trainable = bool(n.params["trainable"])
            a = acc[n.name]
            for layout in dict.fromkeys(self.stored_below[n.name]):
                stored_weight.add(layout)
                shape = pcg.shape(layout)
                # Its update runs on every device that keeps it (the simulation's).
                a.devices = max(a.devices, shape.num_shards)
                size = shape.shard_nbytes
                # Mixed precision: the float32 master copy and the low-precision one kernels read.
                copy = self.computed(shape).shard_nbytes if self.low else 0
                if copy == size:
                    copy = 0  # not a float32 weight: no second copy
                weights += size + copy
                a.memory_bytes += size + copy
                kept = [size + copy, 0, 0]
                if trainable:
                    # ZeRO (Runtime.zero_stage): each copy keeps 1/ways of the optimizer state
                    # and updates that part, densely. From stage 2 it keeps 1/ways of the
                    # gradient too, unless it accumulates micro-batches without syncing them,
                    # which needs the whole gradient (DDP's no_sync).
                    ways = self.zero_ways.get(layout, 1)
                    shard_gradient = self.runtime.zero_stage >= 2 and self.m == 1
                    gradient = -(-size // ways) if shard_gradient else size
                    state = opt.states * -(-size // ways)
                    gradients += gradient
                    states += state
                    a.memory_bytes += gradient + state
                    kept[1:] = [gradient, state]
                    touched = size if ways > 1 else self.touched_bytes(n.name, shape)
                    a.update_s += update_s(-(-touched // ways), opt, device)
                a.weight_memory = tuple(x + y for x, y in zip(a.weight_memory, kept, strict=True))  # type: ignore[assignment]
        kept: dict[TensorRef, None] = {}
        for n in pcg.nodes:
            if acc[n.name].grad_inputs:
                for r in n.inputs:
                    if r.node not in stored_weight:
                        kept[r] = None
        for r in kept:
            size = self.computed(pcg.shape(r)).shard_nbytes
            if self.on_data[r.node]:
                size = -(-size // self.m)  # one micro-batch's share
            activations += size
            acc[r.node].memory_bytes += size
        return MemoryBreakdown(weights, gradients, states, activations)

    def breakdown(self, memory: MemoryBreakdown, devices_used: int) -> CostBreakdown:
        """The nodes' costs, added up (module docstring)."""
        machine, device = self.machine, self.machine.device
        per_node = {}
        level_names = [level.name for level in machine.levels]
        bytes_per_level = dict.fromkeys(level_names, 0.0)
        seconds_per_level = dict.fromkeys(level_names, 0.0)
        for n in self.pcg.nodes:
            a = self.acc[n.name]
            for c in a.collectives:
                for name in level_names:
                    bytes_per_level[name] += c.bytes_per_level[name]
                    seconds_per_level[name] += c.seconds_per_level[name]
            per_node[n.name] = NodeCost(
                name=n.name,
                op=n.op,
                forward_s=a.forward_s,
                backward_s=a.backward_s,
                comm_forward_s=a.comm_forward_s,
                comm_backward_s=a.comm_backward_s,
                update_s=a.update_s,
                comm_bytes=sum(c.bytes for c in a.collectives),
                memory_bytes=a.memory_bytes,
                flops=a.flops,
                collectives=tuple(a.collectives),
                weight_memory=a.weight_memory,
            )
        nodes = per_node.values()
        forward_s = sum(c.forward_s for c in nodes)
        backward_s = sum(c.backward_s for c in nodes)
        comm_s = sum(c.comm_s for c in nodes)
        total_update_s = sum(c.update_s for c in nodes)
        additive_s = forward_s + backward_s + comm_s + total_update_s
        simulation = self.simulation(total_update_s, devices_used)
        # The additive runtime's time is the sum itself, in the order extraction adds it up;
        # its timeline is simulated only if asked for (CostBreakdown.timeline).
        timeline = None if self.runtime.additive else simulation.run()
        total_s = additive_s if timeline is None else timeline.time_s
        return CostBreakdown(
            machine=f"{machine.name} ({machine.num_devices} x {device.name})",
            optimizer=self.opt.name,
            total_s=total_s,
            compute_s=forward_s + backward_s,
            forward_s=forward_s,
            backward_s=backward_s,
            comm_s=comm_s,
            update_s=total_update_s,
            comm_bytes=sum(c.comm_bytes for c in nodes),
            comm_bytes_per_level=MappingProxyType(bytes_per_level),
            comm_s_per_level=MappingProxyType(seconds_per_level),
            memory=memory,
            memory_capacity=device.memory_bytes,
            devices_used=devices_used,
            per_node=MappingProxyType(per_node),
            micro_batches=self.m,
            exposed_comm_s=max(0.0, total_s - forward_s - backward_s - total_update_s),
            runtime=self.runtime,
            schedule=timeline,
            simulation=simulation,
        )

    def simulation(self, update_seconds: float, devices_used: int) -> Simulation:
        """The iteration's tasks under the runtime (:mod:`~.simulate`)."""
        index = {n.name: i for i, n in enumerate(self.pcg.nodes)}
        pcg = self.pcg
        sim = []
        for n in pcg.nodes:
            a = self.acc[n.name]
            kind = n.spec.kind
            if kind is OpKind.COMPUTE:
                what, fwd, bwd = "compute", a.forward_s, a.backward_s
            elif kind is OpKind.PARALLEL and n.name not in self.source_of and a.collectives:
                what, fwd, bwd = "comm", a.comm_forward_s, a.comm_backward_s
            else:
                what, fwd, bwd = "free", 0.0, 0.0
            sim.append(
                SimNode(
                    n.name,
                    tuple(index[r.node] for r in n.inputs),
                    what,
                    fwd,
                    bwd,
                    self.needs_grad[n.name],
                    a.devices,
                    tuple(a.syncs),
                    a.update_s,
                )
            )
        bucket_cost = functools.partial(_bucket_s, self.machine, self.reduction_cost)
        return Simulation(
            tuple(sim), update_seconds, self.runtime, bucket_cost, self.m, devices_used
        )


def _explicit_micro_batches(pcg: PCG, micro_batches: int) -> tuple[int, frozenset[str] | None]:
    """The micro-batch count a PCG cuts itself (Pipeline) and the nodes that run once per
    micro-batch: those whose outputs are in micro-batches, and those after them (module
    docstring); ``(micro_batches, None)`` for a PCG that cuts none."""
    if pcg.first_in_micro_batches() is None:
        return micro_batches, None
    counts: dict[int, str] = {}
    nodes: set[str] = set()
    for n in pcg.nodes:
        m = max(s.micro_batches for s in pcg.output_shapes(n.name))
        if m > 1:
            counts.setdefault(m, n.name)
        if m > 1 or any(r.node in nodes for r in n.inputs):
            nodes.add(n.name)
    if len(counts) > 1:
        seen = ", ".join(f"{m} at node {name!r}" for m, name in sorted(counts.items()))
        raise CostError(
            f"the PCG cuts micro-batches of different counts ({seen}); the cost model takes one "
            f"count per iteration"
        )
    ((m, first),) = counts.items()
    if micro_batches != 1:
        raise CostError(
            f"micro_batches={micro_batches} given for a PCG that cuts {m} micro-batches itself "
            f"(from node {first!r}); leave micro_batches at 1",
            node=first,
        )
    return m, frozenset(nodes)


def _check_micro_batches(pcg: PCG, micro_batches: int) -> int:
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise CostError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    if micro_batches == 1:
        return 1
    for name, shape in _data_blocks(pcg):
        if shape.rank == 0 or shape.dims[0].block % micro_batches:
            block = shape.dims[0].block if shape.rank else "a scalar"
            raise CostError(
                f"node {name!r} ({pcg.node(name).op}): {micro_batches} micro-batches must divide "
                f"every data input's dimension-0 blocks, but this one's is {block}",
                node=name,
            )
    return micro_batches


class FitsMemory(Protocol):
    """What :func:`fewest_micro_batches` reads of a cost (a :class:`CostBreakdown`, or an
    estimate of one)."""

    @property
    def feasible(self) -> bool: ...

    @property
    def memory(self) -> MemoryBreakdown: ...

    @property
    def memory_capacity(self) -> int: ...


def _data_blocks(pcg: PCG) -> list[tuple[str, ParallelTensorShape]]:
    """The data inputs of ``pcg`` and the layouts of them (the tensors micro-batches cut)."""
    sources = {n.name for n in pcg.nodes if n.op == "input"}
    out = []
    for n in pcg.nodes:
        if n.name in sources or (n.op in LAYOUT_OPS and n.inputs[0].node in sources):
            sources.add(n.name)
            out.append((n.name, pcg.shape(n.name)))
    return out


def micro_batch_counts(pcg: PCG, max_micro_batches: int = 64) -> tuple[int, ...]:
    """The micro-batch counts above 1 and up to ``max_micro_batches`` that ``pcg`` can be
    costed in: those dividing every data input's dimension-0 blocks (and its layouts')."""
    blocks = [shape.dims[0].block if shape.rank else 1 for _, shape in _data_blocks(pcg)]
    return tuple(m for m in range(2, max_micro_batches + 1) if all(b % m == 0 for b in blocks))


def fewest_micro_batches[C: FitsMemory](
    first: C, counts: Sequence[int], trial: Callable[[int], C | None]
) -> C:
    """:func:`accumulate_to_fit`'s choice given the single-batch cost ``first`` and
    ``trial(m)``, the cost in ``m`` micro-batches (None where it cannot be costed): ``first``
    if it fits, else the cost with the fewest of ``counts`` (ascending) that fits, else the one
    with the most (the least memory). Memory falls as the micro-batches grow (they shrink only
    the activations), so no count below ``activations / (capacity - the rest)`` is tried."""
    if first.feasible:
        return first
    mem = first.memory
    room = first.memory_capacity - (mem.total - mem.activations)
    least: C | None = None
    for m in counts:
        if m * room < mem.activations and m != counts[-1]:
            continue
        found = trial(m)
        if found is not None:
            if found.feasible:
                return found
            least = found
    if least is None:  # the most micro-batches could not be costed: the most that can
        least = next((c for m in reversed(counts) if (c := trial(m)) is not None), None)
    return first if least is None else least


def accumulate_to_fit(
    pcg: PCG,
    machine: Machine,
    *,
    optimizer: str | Optimizer = "adam",
    max_micro_batches: int = 64,
    cost: CostBreakdown | None = None,
    **options: Any,
) -> CostBreakdown:
    """The iteration cost with the fewest micro-batches (gradient accumulation, module
    docstring) that makes ``pcg`` fit device memory, trying 1, 2, 3, ... up to
    ``max_micro_batches`` among the counts every data input's batch blocks divide by; more
    micro-batches only add time, so the fewest that fit is the fastest plan that fits. When none
    fits, the cost with the most micro-batches allowed (the least memory; infeasible), so that
    searches can rank plans that do not fit by how far they are. ``cost``: the already-known
    single-batch cost."""
    first = (
        cost if cost is not None else iteration_cost(pcg, machine, optimizer=optimizer, **options)
    )

    def trial(m: int) -> CostBreakdown | None:
        try:
            return iteration_cost(pcg, machine, optimizer=optimizer, micro_batches=m, **options)
        except CostError:
            return None  # m does not divide some layout's batch blocks

    return fewest_micro_batches(first, micro_batch_counts(pcg, max_micro_batches), trial)


# --- Readable numbers -----------------------------------------------------------------------------


def branches_words(overlap_s: float) -> str:
    """What running branches at once changes, in a sentence's tail ("" if nothing)."""
    if overlap_s > 0:
        return f", branches at once save {_fmt_s(overlap_s)}"
    if overlap_s < 0:
        return f", branches at once (to fit memory) cost {_fmt_s(-overlap_s)} more"
    return ""


def _fmt_s(value: float) -> str:
    if value == 0:
        return "0"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-9:.4g} ns"


def _fmt_bytes(value: float) -> str:
    if value == 0:
        return "0"
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g} B"
