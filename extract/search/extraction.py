"""Choosing the cheapest PCG an e-graph represents.

An extraction picks one e-node for every e-class the outputs need, acyclic, so that the PCG it
spells (:meth:`EGraphData.to_pcg`) trains fastest on the machine and fits in its memory. The cost is
the cost model's own (:mod:`pcgopt.extract.costmodel.cost`), split into what one e-node costs on its
own and what one e-class costs once, however many e-nodes share it:

* **per e-node** (:class:`ENodeCosts`, ``node_s``): a compute e-node's forward and backward time
  on its shard shapes (:func:`~pcgopt.extract.costmodel.cost.compute_times`), a parallel e-node's
  collectives and their duals (:func:`~pcgopt.extract.costmodel.cost.parallel_collectives`) in the
  default placement. Sources, and Partition/Replicate of a source layout (how a source is loaded
  or stored), cost nothing;
* **per e-class, once**: a weight layout some other e-node reads is *stored*: its optimizer
  update and, if it has copies, the gradient AllReduce among them (``stored_s``), and its
  weight, gradient and optimizer state in memory (``stored_mem``); a tensor a backward reads is
  *kept* (``act_mem``). A layout a lookup reads (an embedding table) has a sparse gradient:
  ``stored_s`` covers the rows one lookup e-node reading it touches, and an e-node reading it
  densely pays the difference to a dense sync and update in its ``node_s``.

**Overlap.** Under a runtime that overlaps communication with computation
(:class:`~pcgopt.extract.costmodel.simulate.Runtime`, ``overlap=True``: DDP, the default of every
cost), the gradient AllReduces of stored weights run on the links while the backward computes, so
a choice's time is not the plain sum: with ``F`` its forward computation, ``A`` its activations'
collectives (they block the computation that needs them), ``B`` its backward computation, ``S``
its weights' gradient synchronization, ``L`` the part of ``S`` in the last bucket and ``U``
the update, it is ``F + A + max(B, S - L) + L + U``: the sync starts in the backward, the
backward hides no more than itself, and the last bucket (the gradients of the weights read
first, produced last) is synchronized after the backward ends. ``L`` is ``S`` times the
bucket's share of the bytes synchronized (all of ``S`` when they fit one bucket, as in a small
model; none with ``bucket_bytes=0``). ``backward_s`` (per e-node) and ``sync_s`` (per
e-class) are the parts of ``node_s`` and ``stored_s`` that overlap. A choice whose backward
runs collectives of its own once a weight's gradient is synced (a tensor-parallel layer's
ReduceScatter of its input's gradient below a synced layer, ``backward_comm_s``) hides none of
the sync: on the one communication stream each of them waits behind the buckets issued before
it, and the backward waits for it (Unity's MLP split
two ways at once on one node: 119 ms estimated with the sync hidden, 161 ms simulated). This
is the estimate extraction ranks by; the simulated iteration
(:mod:`pcgopt.extract.costmodel.simulate`) also sees each bucket's own timing and what a
dependency delays, and the plan extraction picks is re-costed by it like any other. Without
overlap (``ADDITIVE``) the time is the sum.

For a chosen set of e-nodes, without overlap, the sums are those
:func:`~pcgopt.extract.costmodel.cost.iteration_cost` computes for the PCG, except where a weight
layout is reached through several Replicates (the model charges each) or read by several
lookups (the model charges the largest one's rows, not their sum; a dense reader beside a lookup
pays the difference once per reader); the final plan is always re-costed by ``iteration_cost``.

Two extractors over this model:

* :func:`extract_greedy`, for e-graphs of any size: Knuth's generalization of Dijkstra picks,
  bottom-up, the e-node of least tree cost in every class (acyclic by construction), then local
  search swaps single choices while the DAG cost (shared classes once, memory over capacity
  penalized) goes down, within a time limit. Tree costs add up, and the max does not: under
  overlap the bottom-up pass runs with the sync free but for the last bucket's share of all
  trainable weights and, if the choice it finds synchronizes longer than it computes backward or
  has more of its sync in the last bucket (fewer bytes synced: an embedding table's touched
  rows), again summed, with the backward free and with both at half; the cheapest of these by
  the DAG cost starts the search;
* :func:`extract_ilp`, exact for the model above but for the blocked sync (a choice's
  ``backward_comm_s`` depends on its order, which the program does not see; it counts the sync
  as hideable): a 0-1 program solved by HiGHS (``highspy``),
  with acyclicity by class order variables, ``max(B, S)`` as a variable bounded below by both and
  memory as a constraint; for small e-graphs, and the check of the greedy one in tests. ``L`` is
  not linear in the choice: the program takes the last bucket's share of the sync as fixed, the
  warm start's (or, if that syncs nothing, the share of all trainable weights' bytes), which
  is exact with ``bucket_bytes=0`` and otherwise an estimate; so where its choice costs more
  by the DAG cost than the warm start it was given (that estimate, or a sync it took for hidden
  that is blocked), it returns the warm start.
"""

from __future__ import annotations

import heapq
import os
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx
import numpy as np

from pcgopt.egraph import EGraphData, ENode
from pcgopt.egraph.export import OUT
from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.cost import (
    LAYOUT_OPS,
    Optimizer,
    _optimizer,
    collective_cost,
    compute_times,
    default_groups,
    parallel_collectives,
    update_s,
)
from pcgopt.extract.costmodel.simulate import DDP, Runtime
from pcgopt.extract.search.mapping import runs_with_producer
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.machine import Machine
from pcgopt.ops import OpKind, get_op
from pcgopt.shapes import ParallelTensorShape

__all__ = [
    "DagCost",
    "ENodeCosts",
    "Extraction",
    "ExtractionError",
    "GroupPlacement",
    "class_devices",
    "concurrent_costs",
    "dag_cost",
    "enode_costs",
    "extract_greedy",
    "extract_ilp",
    "repriced",
]

#: Where a collective runs: its device groups for a degree and a width (the shards of the
#: tensor it moves), as :func:`~pcgopt.extract.costmodel.cost.default_groups` gives them.
GroupPlacement = Callable[[int, int], tuple[tuple[int, ...], ...]]

# A tie-breaker added to every e-node that is not free, so that equal-cost alternatives prefer
# fewer operators and zero-cost cycles cannot form.
_EPSILON_S = 1e-12


class ExtractionError(PCGError):
    """No acyclic extraction exists, or the solver failed."""


@dataclass(frozen=True, eq=False)
class ENodeCosts:
    """The cost model laid out over an exported e-graph (module docstring)."""

    egraph: EGraphData
    machine: Machine
    optimizer: Optimizer
    node_s: np.ndarray  # per e-node: compute and communication seconds
    backward_s: np.ndarray  # per e-node: the backward computation in node_s (overlaps the sync)
    backward_comm_s: np.ndarray  # per e-node: the backward's collectives in node_s (queue with it)
    free: np.ndarray  # per e-node: a source, an `out`, or a layout of a source
    backward: np.ndarray  # per e-node: has a backward, so the tensors it reads are kept
    weight_layout: np.ndarray  # per e-class: a source weight in some layout
    stored_s: np.ndarray  # per e-class: update and gradient sync if stored
    sync_s: np.ndarray  # per e-class: the gradient sync in stored_s (overlaps the backward)
    sync_bytes: np.ndarray  # per e-class: the gradient bytes it all-reduces if stored
    stored_mem: np.ndarray  # per e-class: weight, gradient, optimizer state if stored
    act_mem: np.ndarray  # per e-class: shard bytes if kept for a backward
    seconds: float  # time taken to build this table
    uncosted: int = 0  # e-nodes that read a tensor without shape facts (never chosen)
    overlap: bool = True  # the sync runs beside the backward (module docstring)
    bucket_bytes: int = 0  # gradients synchronized in buckets of this many bytes (0: each alone)
    # What repriced() prices again: the e-nodes' keys and each key's costs.
    layout: _CostLayout | None = field(default=None, repr=False)
    key_costs: np.ndarray | None = field(default=None, repr=False)

    @property
    def memory_capacity(self) -> int:
        return self.machine.device.memory_bytes


def _fixpoint_any(
    egraph: EGraphData, seed_nodes: np.ndarray, propagate: np.ndarray | None = None
) -> np.ndarray:
    """Classes reachable upward: a class is marked when one of its e-nodes is seeded, or (for
    e-nodes where ``propagate`` is true; all if None) one of its children is marked."""
    marked = np.zeros(egraph.num_eclasses, dtype=bool)
    cls = egraph.node_classes()
    marked[cls[seed_nodes]] = True
    readers = egraph.readers()
    stack = list(np.flatnonzero(marked))
    while stack:
        c = stack.pop()
        for i in readers[c]:
            if propagate is not None and not propagate[i]:
                continue
            owner = cls[i]
            if not marked[owner]:
                marked[owner] = True
                stack.append(owner)
    return marked


def _derivable(egraph: EGraphData, allowed: np.ndarray) -> np.ndarray:
    """Classes with a derivation that uses only ``allowed`` e-nodes (a least fixpoint: an
    allowed e-node whose children are all derivable makes its class derivable)."""
    cls = egraph.node_classes()
    marked = np.zeros(egraph.num_eclasses, dtype=bool)
    waiting = np.zeros(egraph.num_enodes, dtype=np.int64)
    readers = egraph.readers()
    stack: list[int] = []
    for i, n in enumerate(egraph.nodes):
        if not allowed[i]:
            continue
        waiting[i] = len(set(n.children))
        if not waiting[i] and not marked[cls[i]]:
            marked[cls[i]] = True
            stack.append(int(cls[i]))
    while stack:
        c = stack.pop()
        for i in readers[c]:
            if not allowed[i]:
                continue
            waiting[i] -= 1
            if waiting[i] == 0 and not marked[cls[i]]:
                marked[cls[i]] = True
                stack.append(int(cls[i]))
    return marked


#: Costing an exported e-graph (:func:`enode_costs`) and its greedy extractions take about this
#: long per e-node: 1.6 s for 75,669 e-nodes (BERT-Large's 4 distinct segments on 64 GPUs, 10
#: extractions; ``python bench/budgets.py`` with progress, 2026-11-27). Saturation leaves this
#: much time per e-node of the e-graph it hands over (:class:`~pcgopt.egraph.Budget`).
EXTRACTION_SECONDS_PER_ENODE = 20e-6

#: What the whole-model search does with each e-node of its e-graph after saturation: the
#: branch views, costing it (the first costing on a machine also synthesizes its collectives'
#: reduction programs) and three extractions (in sequence, branches at once, on one node).
#: Measured with ``saturate_and_extract(..., baselines=False, time_budget_s=60)`` on Summit
#: (scratch, 2026-12-07, phases "branch views" and "extract" over the e-nodes): MLP on 2 and 8
#: nodes 81 and 76 us (128k and 182k e-nodes), CANDLE-Uno on 4 nodes 94 us, DLRM on 8 nodes
#: 96 us, XDL on 4 nodes 78 us. With 20 us saturation took the time of the phases after it:
#: on 4 nodes the MLP's fastest extraction was left unplaced.
WHOLE_EXTRACTION_SECONDS_PER_ENODE = 85e-6


def enode_costs(
    egraph: EGraphData,
    machine: Machine,
    *,
    optimizer: str | Optimizer = "adam",
    differentiable_inputs: Collection[str] = (),
    runtime: Runtime = DDP,
    groups: GroupPlacement = default_groups,
) -> ENodeCosts:
    """Every e-node's and e-class's share of a training iteration on ``machine`` (module
    docstring). E-nodes with the same operator, parameters and shapes are costed once.
    ``differentiable_inputs``: names of inputs whose gradient the iteration computes (a
    segment's entry under graph splitting: the layers before it need that gradient).
    ``runtime``: only whether it overlaps the sync with the backward and its bucket size are
    used (its precision and ZeRO stage are the final costing's,
    :func:`~pcgopt.extract.costmodel.cost.iteration_cost`). ``groups(degree, width)``: the
    device groups of a collective of ``degree`` on a tensor of ``width`` shards, and of a
    weight's gradient sync among its copies (default: the cost model's default placement,
    consecutive devices; for extraction with placement in the loop, a placement's:
    :func:`~pcgopt.extract.strategies.placement.placement_groups`)."""
    start = time.perf_counter()
    opt = _optimizer(optimizer)
    nodes, shapes = egraph.nodes, egraph.shapes
    num_nodes = egraph.num_enodes

    ops = [n.op for n in nodes]
    is_source = np.array([op != OUT and get_op(op).kind is OpKind.SOURCE for op in ops], dtype=bool)
    trainable = np.array(
        [op == "weight" and bool(n.params["trainable"]) for op, n in zip(ops, nodes, strict=True)],
        dtype=bool,
    )
    is_weight = np.array([op == "weight" for op in ops], dtype=bool)
    layout_op = np.array([op in LAYOUT_OPS for op in ops], dtype=bool)
    # A class needs a gradient unless some e-node in it computes it without a trainable weight
    # (its value then does not depend on one; other e-nodes in it may mention one, e.g. an
    # output of a Split of a Concat with a weight).
    graded_input = np.array(
        [
            op == "input" and n.name in differentiable_inputs
            for op, n in zip(ops, nodes, strict=True)
        ],
        dtype=bool,
    )
    needs_grad = ~_derivable(egraph, ~(trainable | graded_input))
    # A source layout: a source, or Partition/Replicate of a source layout. Not of an input
    # whose gradient is needed: laying it out has a backward (the gradient gathered back).
    source_layout = _fixpoint_any(egraph, np.flatnonzero(is_source & ~graded_input), layout_op)
    weight_layout = _fixpoint_any(egraph, np.flatnonzero(is_weight), layout_op)
    trainable_layout = _fixpoint_any(egraph, np.flatnonzero(trainable), layout_op)

    # Output shapes of multi-output classes, from their `out` e-nodes.
    tuple_outs: dict[int, dict[int, ParallelTensorShape]] = {}
    for n in nodes:
        if n.op == OUT and shapes[n.eclass] is not None:
            tuple_outs.setdefault(n.children[0], {})[n.params["index"]] = shapes[n.eclass]

    free = np.zeros(num_nodes, dtype=bool)
    # Each e-node's costing key (an index into `keys`; -1: free, or never chosen).
    key_of = np.full(num_nodes, -1, dtype=np.int64)
    index: dict[tuple, int] = {}
    unshaped = np.zeros(num_nodes, dtype=bool)
    # Sparse gradients (iteration_cost, "Sources and weight-gradient synchronization"): a
    # trainable weight layout read by a lookup (an embedding table) syncs and updates the rows
    # the lookup touches (the most any one lookup e-node reading it touches); an e-node that
    # reads it densely pays the difference to a dense sync and update itself.
    rows: dict[int, int] = {}
    dense_readers: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        if n.op == OUT or is_source[i]:
            free[i] = True
            continue
        if layout_op[i] and source_layout[n.children[0]]:
            free[i] = True
            continue  # a source's stored layout, not a reader of one
        for slot, c in enumerate(n.children):
            if trainable_layout[c]:
                sizes = tuple(None if shapes[k] is None else shapes[k].sizes for k in n.children)
                found = None if None in sizes else get_op(n.op).gradient_rows(n.params, sizes, slot)
                if found is None:
                    dense_readers.setdefault(c, []).append(i)
                else:
                    rows[c] = max(rows.get(c, 0), found)
        ins = tuple(shapes[c] for c in n.children)
        out_shape = shapes[n.eclass]
        if out_shape is None:
            by_index = tuple_outs.get(n.eclass, {})
            outs = tuple(by_index[k] for k in sorted(by_index))
        else:
            outs = (out_shape,)
        if not outs or any(s is None for s in ins):
            # A tensor class without shape facts in the export (or a tuple consumed whole):
            # nothing can be costed or built from it, so this e-node is never chosen.
            unshaped[i] = True
            continue
        grads = tuple(bool(needs_grad[c]) for c in n.children)
        key_of[i] = index.setdefault((n.op, n.params, ins, outs, grads), len(index))
    layout = _CostLayout(
        keys=tuple(index),
        key_of=key_of,
        unshaped=unshaped,
        weight_layout=weight_layout,
        trainable_layout=trainable_layout,
        rows=rows,
        dense_readers={c: np.array(v, dtype=np.int64) for c, v in dense_readers.items()},
        optimizer=opt,
    )
    key_costs = np.array(
        [_local_cost(*key, machine, groups) for key in layout.keys], dtype=float
    ).reshape(len(layout.keys), 4)
    return _costed(
        egraph, machine, layout, key_costs, free, runtime, groups, time.perf_counter() - start
    )


@dataclass(frozen=True, eq=False)
class _CostLayout:
    """What :func:`enode_costs` works out of an e-graph before it prices anything: each
    e-node's costing key (operator, parameters, shapes, which inputs need a gradient), the
    classes that hold weight layouts, and the sparse gradients' rows; :func:`repriced` prices
    it again on other device groups or machines without working it out again."""

    keys: tuple[tuple, ...]
    key_of: np.ndarray  # per e-node: its index in keys, -1 if free or never chosen
    unshaped: np.ndarray  # per e-node: reads a tensor without shape facts (never chosen)
    weight_layout: np.ndarray  # per e-class
    trainable_layout: np.ndarray  # per e-class
    rows: Mapping[int, int]  # per sparse trainable layout: the most rows one lookup touches
    dense_readers: Mapping[int, np.ndarray]  # per sparse trainable layout: its dense readers
    optimizer: Optimizer


def repriced(
    costs: ENodeCosts,
    *,
    groups: GroupPlacement = default_groups,
    machine: Machine | None = None,
) -> ENodeCosts:
    """The e-graph of ``costs`` priced as :func:`enode_costs` prices it, with its collectives
    and gradient syncs on ``groups`` and, if given, on another ``machine`` (e.g. one node of
    it): what extraction with placement in the loop costs each round by, and the one-node
    extraction, at a fraction of a fresh costing (the e-nodes' keys are not worked out again,
    and on the same machine the computation's costs are kept). ``costs``: as
    :func:`enode_costs` returned them or any repricing of them (:func:`concurrent_costs`); the
    result is the plain costing."""
    start = time.perf_counter()
    layout = costs.layout
    if layout is None or costs.key_costs is None:
        raise ExtractionError("repriced needs costs from enode_costs (they carry no layout)")
    same = machine is None or machine == costs.machine
    on = costs.machine if machine is None else machine
    key_costs = costs.key_costs.copy()
    for k, key in enumerate(layout.keys):
        if not same or get_op(key[0]).kind is not OpKind.COMPUTE:
            key_costs[k] = _local_cost(*key, on, groups)
    runtime = Runtime(overlap=costs.overlap, bucket_bytes=costs.bucket_bytes)
    return _costed(
        costs.egraph,
        on,
        layout,
        key_costs,
        costs.free,
        runtime,
        groups,
        time.perf_counter() - start,
    )


def _costed(
    egraph: EGraphData,
    machine: Machine,
    layout: _CostLayout,
    key_costs: np.ndarray,
    free: np.ndarray,
    runtime: Runtime,
    groups: GroupPlacement,
    seconds: float,
) -> ENodeCosts:
    """The costs of :func:`enode_costs` from its layout and each key's (seconds, has a
    backward, backward computation, backward collectives)."""
    start = time.perf_counter()
    opt = layout.optimizer
    num_nodes, num_classes = egraph.num_enodes, egraph.num_eclasses
    node_s = np.zeros(num_nodes)
    backward_s = np.zeros(num_nodes)
    backward_comm_s = np.zeros(num_nodes)
    backward = np.zeros(num_nodes, dtype=bool)
    keyed = layout.key_of >= 0
    of = layout.key_of[keyed]
    node_s[keyed] = key_costs[of, 0] + _EPSILON_S
    backward[keyed] = key_costs[of, 1] > 0
    backward_s[keyed] = key_costs[of, 2]
    backward_comm_s[keyed] = key_costs[of, 3]
    node_s[layout.unshaped] = np.inf

    stored_s, sync_s, sync_bytes, stored_mem, act_mem = np.zeros((5, num_classes))
    weight_layout, trainable_layout, rows = (
        layout.weight_layout,
        layout.trainable_layout,
        layout.rows,
    )
    for c, shape in enumerate(egraph.shapes):
        if shape is None:
            continue
        nbytes = shape.shard_nbytes
        if not weight_layout[c]:
            act_mem[c] = nbytes
            continue
        stored_mem[c] = nbytes
        if shape.num_shards > machine.num_devices:
            stored_s[c] = np.inf  # only e-nodes of infinite cost read it (_local_cost)
            continue
        if trainable_layout[c]:
            stored_mem[c] += (1 + opt.states) * nbytes
            stored_s[c], sync_s[c] = dense, _ = _sync_and_update(
                shape, nbytes, opt, machine, groups
            )
            touched = nbytes
            if c in rows and shape.rank:
                shard_rows = max(1, shape.sizes[0] // shape.degrees[0])
                touched = min(nbytes, rows[c] * (nbytes // shard_rows))
                stored_s[c], sync_s[c] = _sync_and_update(shape, touched, opt, machine, groups)
                readers = layout.dense_readers.get(c)
                if readers is not None:
                    np.add.at(node_s, readers, dense - stored_s[c])
            if shape.copy_degree > 1:
                sync_bytes[c] = touched
    return ENodeCosts(
        egraph=egraph,
        machine=machine,
        optimizer=opt,
        node_s=node_s,
        backward_s=backward_s,
        backward_comm_s=backward_comm_s,
        free=free,
        backward=backward,
        weight_layout=weight_layout,
        stored_s=stored_s,
        sync_s=sync_s,
        sync_bytes=sync_bytes,
        stored_mem=stored_mem,
        act_mem=act_mem,
        seconds=seconds + time.perf_counter() - start,
        uncosted=int(layout.unshaped.sum()),
        overlap=runtime.overlap,
        bucket_bytes=runtime.bucket_bytes,
        layout=layout,
        key_costs=key_costs,
    )


def _sync_and_update(
    shape: ParallelTensorShape,
    touched: int,
    opt: Optimizer,
    machine: Machine,
    groups: GroupPlacement = default_groups,
) -> tuple[float, float]:
    """A stored weight layout's update of ``touched`` bytes per shard and the AllReduce of
    their gradient among its copies: both seconds, and the AllReduce's alone."""
    sync = 0.0
    if shape.copy_degree > 1:
        among = groups(shape.copy_degree, shape.num_shards)
        sync = collective_cost("all_reduce", among, touched, machine).seconds
    return sync + update_s(touched, opt, machine.device), sync


def _local_cost(
    op: str,
    params,
    ins: tuple[ParallelTensorShape, ...],
    outs: tuple[ParallelTensorShape, ...],
    grads: tuple[bool, ...],
    machine: Machine,
    groups: GroupPlacement = default_groups,
) -> tuple[float, bool, float, float]:
    """Seconds of one e-node, whether it has a backward that keeps its inputs, and the seconds
    of that backward's computation and of its collectives."""
    spec = get_op(op)
    width = max(s.num_shards for s in (*ins, *outs))
    if width > machine.num_devices:
        # More shards than devices: not a plan for this machine (an e-graph saturated for a
        # larger machine, costed on one of its nodes).
        return float("inf"), False, 0.0, 0.0
    if spec.kind is OpKind.COMPUTE:
        node = Node(op, op, tuple(TensorRef(f"in{k}") for k in range(len(ins))), params)
        _, forward_s, backward_s = compute_times(node, ins, outs, grads, machine.device)
        return forward_s + backward_s, any(grads), backward_s, 0.0
    collectives = parallel_collectives(op, grads[0] if grads else False)
    if not collectives:
        return 0.0, False, 0.0, 0.0
    among = groups(params["degree"], max(ins[0].num_shards, outs[0].num_shards))
    nbytes = max(ins[0].shard_nbytes, outs[0].shard_nbytes)
    times = [(collective_cost(kind, among, nbytes, machine).seconds, p) for kind, p in collectives]
    return sum(t for t, _ in times), False, 0.0, sum(t for t, p in times if p == "backward")


# --- Branches that run at once -------------------------------------------------------------


def class_devices(
    egraph: EGraphData, pcg: PCG, views: Mapping[str, int], num_devices: int
) -> np.ndarray:
    """For every e-class, the devices its value gets in a mapping where branches run at once:
    ``views`` gives them for ``pcg``'s compute nodes (the mapping DP's, e.g.
    :func:`~pcgopt.extract.strategies.branches.elastic_views`). An e-class holding a node's
    output (:meth:`~pcgopt.egraph.EGraphData.logical_values`) gets that node's view; one holding
    a source, the view its readers share (if they do); one holding no tensor of ``pcg`` (a
    value a rewrite made), the widest view of an e-node's children that all have one. The rest
    get ``num_devices``."""
    # A source's view: the one its readers share, if they do (0: none).
    shared: dict[str, set[int]] = {}
    for n in pcg.nodes:
        for r in n.inputs:
            shared.setdefault(r.node, set()).add(views.get(n.name, 0))
    source_view = {k: next(iter(v)) if len(v) == 1 else 0 for k, v in shared.items()}
    devices = [
        0 if value is None else views.get(value.node, source_view.get(value.node, 0))
        for value in egraph.logical_values(pcg)
    ]
    # Values rewrites made: from their children, by a worklist over the e-nodes reading a
    # class as it gets its view.
    readers, nodes = egraph.readers(), egraph.nodes
    stack = [c for c, d in enumerate(devices) if d]
    while stack:
        for i in readers[stack.pop()]:
            n = nodes[i]
            if devices[n.eclass] == 0 and all(devices[k] for k in n.children):
                devices[n.eclass] = max(devices[k] for k in n.children)
                stack.append(n.eclass)
    return np.array([d or num_devices for d in devices], dtype=np.int64)


def concurrent_costs(costs: ENodeCosts, devices: np.ndarray) -> ENodeCosts:
    """``costs`` with branches that run at once priced by their share of the machine: an
    e-node of e-class ``c`` that spans at most ``devices[c]`` devices (:func:`class_devices`)
    pays ``devices[c] / num_devices`` of its time, and so does a stored weight layout's update
    and gradient sync. Summed over branches that run at once on a division of the machine,
    these shares are the division's time when the branches take equally long (the
    device-seconds they occupy, over the devices): so extraction prefers e-nodes narrow enough
    to run beside the other branches, and the machine mapping
    (:func:`~pcgopt.extract.search.mapping.map_machine`) then runs them at once. An e-node wider
    than its class's view pays its whole time: it cannot run beside anything. A layout change
    the mapping runs with its reader (:func:`_widens`: a branch's output laid out wider for the
    join) takes the view of its widest reader instead of its own class's. Memory is per
    device, so unchanged. An estimate for ranking: the plan extracted with it is mapped and
    costed exactly like any other."""
    egraph = costs.egraph
    total = costs.machine.num_devices
    shapes, nodes, readers = egraph.shapes, egraph.nodes, egraph.readers()
    width = np.array([1 if s is None else s.num_shards for s in shapes], dtype=np.int64)
    parallel = {
        op: op != OUT and get_op(op).kind is OpKind.PARALLEL for op in {n.op for n in nodes}
    }
    share = devices / total
    node_share = np.ones(egraph.num_enodes)
    for i, n in enumerate(nodes):
        c = n.eclass
        if share[c] < 1:
            spans = max([width[c], *(width[k] for k in n.children)])
            view = devices[c]
            if parallel[n.op] and _widens(n, shapes):
                # The mapping runs a widening layout change with its reader (a branch's
                # output partitioned for the join runs on the join's devices, after the
                # branches): it shares the widest reader's view, not its producer's.
                view = max((devices[nodes[r].eclass] for r in readers[c]), default=view)
            if spans <= view < total:
                node_share[i] = view / total
    class_share = np.where((share < 1) & (width <= devices), share, 1.0)
    return replace(
        costs,
        node_s=costs.node_s * node_share,
        backward_s=costs.backward_s * node_share,
        backward_comm_s=costs.backward_comm_s * node_share,
        stored_s=costs.stored_s * class_share,
        sync_s=costs.sync_s * class_share,
    )


def _widens(node: ENode, shapes: Sequence[ParallelTensorShape | None]) -> bool:
    """Whether the machine mapping runs the parallel e-node ``node`` with its reader
    (:func:`~pcgopt.extract.search.mapping.runs_with_producer` says it does not run with its
    producer) and it leaves its tensor on more devices than it found it. (Layout changes that
    keep the width, an AllToAll, also run with their reader; they keep their producer's view
    here, which can underprice one that feeds a join.)"""
    ins = [shapes[k] for k in node.children]
    out = shapes[node.eclass]
    if out is None or not ins or any(s is None for s in ins):
        return False
    return not runs_with_producer(ins, [out]) and out.num_shards > max(s.num_shards for s in ins)


# --- The cost of a choice ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DagCost:
    """A choice's cost in the extraction model: seconds and bytes per device, shared e-classes
    counted once. ``backward_s``, ``sync_s`` and ``last_sync_s``: its ``B``, ``S`` and ``L``
    (module docstring); under overlap ``seconds`` has ``min(B, S - L)`` taken out
    (``hidden_s``), unless the backward runs collectives of its own after a weight's gradient
    is synced (``backward_comm_s``, part of the activation collectives ``A``)."""

    seconds: float
    memory_bytes: float
    classes: int
    backward_s: float = 0.0
    sync_s: float = 0.0
    last_sync_s: float = 0.0
    hidden_s: float = 0.0
    backward_comm_s: float = 0.0

    def objective(self, capacity: float) -> float:
        """Seconds, plus a penalty that makes any plan that fits better than any that does not."""
        over = self.memory_bytes - capacity
        return self.seconds if over <= 0 else 1e6 + self.seconds + over * 1e-6


def dag_cost(costs: ENodeCosts, choice: Mapping[int, int]) -> DagCost:
    """The cost of the PCG ``choice`` spells (module docstring). Raises
    :class:`ExtractionError` if the choice misses a needed class or has a cycle."""
    nodes = costs.egraph.nodes
    seen: set[int] = set()
    on_path: set[int] = set()
    stored: set[int] = set(costs.egraph.roots)
    kept: set[int] = set()
    seconds = backward_s = backward_comm_s = 0.0
    postorder: list[int] = []
    stack: list[tuple[int, bool]] = [(r, False) for r in costs.egraph.roots]
    while stack:
        c, done = stack.pop()
        if done:
            on_path.discard(c)
            postorder.append(c)
            continue
        if c in seen:
            if c in on_path:
                raise ExtractionError(f"the choice has a cycle through e-class c{c}")
            continue
        seen.add(c)
        on_path.add(c)
        i = choice.get(c)
        if i is None:
            raise ExtractionError(f"no e-node chosen for needed e-class c{c}")
        seconds += costs.node_s[i]
        backward_s += costs.backward_s[i]
        backward_comm_s += costs.backward_comm_s[i]
        n = nodes[i]
        if not costs.free[i]:
            stored.update(n.children)
        if costs.backward[i]:
            kept.update(n.children)
        stack.append((c, True))
        stack.extend((ch, False) for ch in n.children)
    memory = sync_s = sync_bytes = 0.0
    for c in seen:
        if costs.weight_layout[c]:
            if c in stored:
                seconds += costs.stored_s[c]
                sync_s += costs.sync_s[c]
                sync_bytes += costs.sync_bytes[c]
                memory += costs.stored_mem[c]
        elif c in kept:
            memory += costs.act_mem[c]
    hidden = last = 0.0
    if costs.overlap:
        last = sync_s * min(1.0, costs.bucket_bytes / sync_bytes) if sync_bytes else 0.0
        if backward_comm_s and sync_s:
            backward_comm_s = _blocked_comm_s(costs, choice, postorder, stored)
        # A backward that runs collectives of its own after a weight's gradient is synced waits
        # for them behind the buckets issued before them on the one communication stream: the
        # sync then delays the backward instead of hiding behind it (the simulated order).
        hidden = 0.0 if backward_comm_s > 0 else min(backward_s, sync_s - last)
    return DagCost(
        seconds=float(seconds - hidden),
        memory_bytes=memory,
        classes=len(seen),
        backward_s=float(backward_s),
        sync_s=float(sync_s),
        last_sync_s=float(last),
        hidden_s=float(hidden),
        backward_comm_s=float(backward_comm_s),
    )


def _blocked_comm_s(
    costs: ENodeCosts, choice: Mapping[int, int], postorder: Sequence[int], stored: set[int]
) -> float:
    """The backward collectives of ``choice`` that run after some weight's gradient is synced:
    those of e-nodes with a reader of a synced weight layout between them and an output
    (``postorder``: the choice's classes, inputs before readers)."""
    nodes, sync_s, weight_layout = costs.egraph.nodes, costs.sync_s, costs.weight_layout
    after_sync: set[int] = set()
    blocked = 0.0
    for c in reversed(postorder):  # outputs first
        i = choice[c]
        if c in after_sync:
            blocked += costs.backward_comm_s[i]
        children = nodes[i].children
        if c in after_sync or any(
            weight_layout[k] and sync_s[k] > 0 and k in stored for k in children
        ):
            after_sync.update(children)
    return blocked


# --- Extractors -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Extraction:
    """A choice of e-nodes (``{e-class: e-node}``, only the classes the outputs need), its cost
    in the extraction model, how it was found and how long that took."""

    choice: Mapping[int, int]
    cost: DagCost
    method: str
    seconds: float
    improvements: int = 0
    optimal: bool = False

    def __repr__(self) -> str:
        return (
            f"Extraction({self.method}: {self.cost.seconds * 1e3:.4g} ms, "
            f"{self.cost.memory_bytes / 2**30:.3g} GiB, {len(self.choice)} classes, "
            f"{self.seconds:.3g} s)"
        )


def _tree_best(
    costs: ENodeCosts, backward_weight: float = 1.0, sync_weight: float = 1.0
) -> dict[int, int]:
    """Knuth's algorithm: every class's e-node of least tree cost, children finalized first.
    The backward computation and the gradient sync count ``backward_weight`` and
    ``sync_weight`` of their seconds (1, 1: the sum)."""
    egraph = costs.egraph
    nodes = egraph.nodes
    parents = egraph.readers()
    waiting = np.zeros(egraph.num_enodes, dtype=np.int64)
    heap: list[tuple[float, int, int]] = []
    node_s = costs.node_s - (1.0 - backward_weight) * costs.backward_s
    extra = costs.stored_s - (1.0 - sync_weight) * costs.sync_s
    for i, n in enumerate(nodes):
        waiting[i] = len(set(n.children))
        if not waiting[i] and np.isfinite(node_s[i]):
            heapq.heappush(heap, (float(node_s[i]), i, n.eclass))
    best: dict[int, int] = {}
    cost = np.full(egraph.num_eclasses, np.inf)
    while heap:
        total, i, c = heapq.heappop(heap)
        if c in best:
            continue
        best[c] = i
        cost[c] = total
        for p in parents[c]:
            waiting[p] -= 1
            if waiting[p] == 0:
                n = nodes[p]
                if n.eclass in best:
                    continue
                t = node_s[p] + sum(cost[ch] for ch in n.children)
                if not costs.free[p]:
                    t += sum(extra[ch] for ch in set(n.children))
                if np.isfinite(t):  # an e-node that cannot be costed is never chosen
                    heapq.heappush(heap, (float(t), p, n.eclass))
    missing = [r for r in egraph.roots if r not in best]
    if missing:
        raise ExtractionError(
            f"no acyclic extraction reaches output e-class c{missing[0]} (every e-node of some "
            "needed class depends on itself)"
        )
    return best


def extract_greedy(costs: ENodeCosts, *, time_limit_s: float = 10.0) -> Extraction:
    """Tree-cost greedy extraction, then local search on the DAG cost (module docstring) until
    no single swap helps or ``time_limit_s`` has passed. Never returns a cycle."""
    start = time.perf_counter()
    egraph = costs.egraph
    capacity = costs.memory_capacity
    # `merged`: the current choice where it has one, the tree-best elsewhere, so that a swap
    # can pull in classes the current choice does not need yet. Kept up to date on acceptance
    # rather than rebuilt per trial.
    merged, choice, current = _tree_start(costs)
    improvements = 0
    improved = True
    while improved and time.perf_counter() - start < time_limit_s:
        improved = False
        for c in list(choice):
            if c not in choice or len(egraph.classes[c]) < 2:
                continue
            for i in egraph.classes[c]:
                if i == choice[c] or not np.isfinite(costs.node_s[i]):
                    continue

                def pick(k: int, c: int = c, i: int = i) -> int:
                    if k == c:
                        return i
                    if k not in merged:
                        # No e-node of finite cost derives this class (an e-node wider than
                        # the machine, or one without shape facts, is all it has).
                        raise ExtractionError(f"e-class c{k} has no e-node of finite cost")
                    return merged[k]

                try:
                    trial = _reachable_checked(egraph, pick)
                    cost = dag_cost(costs, trial)
                except ExtractionError:
                    continue
                if cost.objective(capacity) < current.objective(capacity) - 1e-15:
                    choice, current = trial, cost
                    merged.update(trial)
                    improvements += 1
                    improved = True
                    break
            if time.perf_counter() - start >= time_limit_s:
                break
    return Extraction(
        choice=choice,
        cost=current,
        method="greedy",
        seconds=time.perf_counter() - start,
        improvements=improvements,
    )


def _tree_start(costs: ENodeCosts) -> tuple[dict[int, int], dict[int, int], DagCost]:
    """The tree-best choice local search starts from (module docstring): under overlap, first
    with the sync free but for the last bucket's share; if that choice synchronizes longer
    than it computes backward or has more of its sync in the last bucket than assumed, also
    summed, with the backward free and with both at half, the cheapest by the DAG cost. Each as
    the whole tree-best table (``merged``), the part the outputs need, and its cost."""
    if costs.overlap:
        last = _last_bucket_share(costs, None)
        weights = [(1.0, last), (1.0, 1.0), (0.0, 1.0), (0.5, 0.5)]
    else:
        last, weights = 1.0, [(1.0, 1.0)]
    capacity = costs.memory_capacity
    best: tuple[dict[int, int], dict[int, int], DagCost] | None = None
    for backward_weight, sync_weight in weights:
        merged = _tree_best(costs, backward_weight, sync_weight)
        choice = _reachable_checked(costs.egraph, merged.__getitem__)
        cost = dag_cost(costs, choice)
        if best is None:
            best = merged, choice, cost
            if (
                cost.sync_s - cost.last_sync_s <= cost.backward_s
                and cost.last_sync_s <= last * cost.sync_s * (1 + 1e-9)
            ):
                # The backward covers the sync, and no more of it is in the last bucket than
                # the pass assumed: the choice stands (other weighings would trade backward
                # work for sync it does not need).
                break
        elif cost.objective(capacity) < best[2].objective(capacity):
            best = merged, choice, cost
    assert best is not None
    return best


def _reachable_checked(egraph: EGraphData, pick: Callable[[int], int]) -> dict[int, int]:
    """The part of a choice (``pick(class) -> e-node``) the outputs need;
    :class:`ExtractionError` on a cycle."""
    out: dict[int, int] = {}
    state: dict[int, int] = {}  # 1 on the path, 2 done
    for root in egraph.roots:
        stack: list[tuple[int, bool]] = [(root, False)]
        while stack:
            c, done = stack.pop()
            if done:
                state[c] = 2
                continue
            s = state.get(c)
            if s == 2:
                continue
            if s == 1:
                raise ExtractionError(f"cycle through e-class c{c}")
            state[c] = 1
            out[c] = pick(c)
            stack.append((c, True))
            stack.extend((ch, False) for ch in egraph.nodes[out[c]].children)
    return out


def _needed_classes(egraph: EGraphData) -> list[int]:
    """Every class some choice could need: reachable from the roots through any e-node."""
    seen: set[int] = set()
    stack = list(egraph.roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        for i in egraph.classes[c]:
            stack.extend(egraph.nodes[i].children)
    return sorted(seen)


def quiet_highs(highspy: Any) -> Any:
    """A HiGHS solver, without the licence banner the first one in a process prints to standard
    output whatever its options (``pcgopt optimize`` writes the plan there): the process's
    standard output is pointed at the null device while it is made."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def extract_ilp(
    costs: ENodeCosts,
    *,
    time_limit_s: float = 60.0,
    max_enodes: int = 50_000,
    warm_start: Extraction | None = None,
    node_limit: int | None = None,
) -> Extraction:
    """The optimal extraction for the model in the module docstring, memory capacity included,
    as a 0-1 program solved by HiGHS, started from ``warm_start`` if given (the result is never
    worse than it by :func:`dag_cost`, the warm start itself where the program's estimates of
    the last bucket or of the blocked sync misled it). Raises :class:`ExtractionError` above
    ``max_enodes`` needed e-nodes (use :func:`extract_greedy`), if the solver finds no solution
    in ``time_limit_s`` (or ``node_limit`` branch-and-bound nodes, a limit that does not depend
    on the machine's speed) or if no acyclic choice fits; ``optimal`` says whether it proved
    optimality within them."""
    try:
        import highspy
    except ImportError as e:  # pragma: no cover - declared dependency
        raise ExtractionError("extract_ilp needs highspy (pip install highspy)") from e
    start = time.perf_counter()
    egraph = costs.egraph
    classes = _needed_classes(egraph)
    cls_col = {c: k for k, c in enumerate(classes)}
    enodes = [i for c in classes for i in egraph.classes[c]]
    if len(enodes) > max_enodes:
        raise ExtractionError(
            f"the e-graph has {len(enodes)} needed e-nodes, over max_enodes={max_enodes}; "
            "use extract_greedy"
        )
    num_x, nc = len(enodes), len(classes)
    # Columns: x (e-nodes), stored s (weight classes), kept k (other classes), order o, and
    # under overlap t = max(B, S) (module docstring).
    x0, s0, k0, o0 = 0, num_x, num_x + nc, num_x + 2 * nc
    t0, ncols = num_x + 3 * nc, num_x + 3 * nc + 1
    lower = np.zeros(ncols)
    upper = np.ones(ncols)
    upper[o0:t0] = nc
    upper[t0] = np.inf if costs.overlap else 0.0
    cost = np.zeros(ncols)
    cost[t0] = 1e-6  # t is in microseconds (below)
    # Under overlap B and the sync before the last bucket count through t alone.
    through_t = 1.0 if costs.overlap else 0.0  # neither is ever infinite
    backward_s = through_t * costs.backward_s
    sync_s = through_t * (1.0 - _last_bucket_share(costs, warm_start)) * costs.sync_s
    for j, i in enumerate(enodes):
        n = egraph.nodes[i]
        finite = bool(np.isfinite(costs.node_s[i]))
        cost[x0 + j] = costs.node_s[i] - backward_s[i] if finite else 0.0
        if not finite or n.eclass in n.children:  # too wide for the machine, or a self-loop
            upper[x0 + j] = 0
    for k, c in enumerate(classes):
        if np.isfinite(costs.stored_s[c]):
            cost[s0 + k] = costs.stored_s[c] - sync_s[c]
        else:  # a layout wider than the machine: never stored (its readers are out too)
            upper[s0 + k] = 0
    h = quiet_highs(highspy)
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    if node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(node_limit))
    inf = highspy.kHighsInf
    h.addVars(ncols, lower, upper)
    # HiGHS's tolerances are absolute: in microseconds and GiB the coefficients are O(1).
    h.changeColsCost(ncols, np.arange(ncols, dtype=np.int32), cost * 1e6)
    h.setOptionValue("mip_rel_gap", 1e-7)
    h.setOptionValue("mip_abs_gap", 0.0)
    integer = np.arange(o0, dtype=np.int32)
    h.changeColsIntegrality(
        len(integer), integer, np.full(len(integer), highspy.HighsVarType.kInteger)
    )

    def row(lo: float, hi: float, idx: list[int], val: list[float]) -> None:
        h.addRow(lo, hi, len(idx), np.array(idx, dtype=np.int32), np.array(val, dtype=float))

    node_col = {i: x0 + j for j, i in enumerate(enodes)}
    roots = set(egraph.roots)
    # Active classes: y_c = sum of its x; a root is active; at most one e-node per class.
    y_of = {c: [node_col[i] for i in egraph.classes[c]] for c in classes}
    for c in classes:
        cols = y_of[c]
        row(1.0 if c in roots else 0.0, 1.0, cols, [1.0] * len(cols))
    # Acyclicity constraints only matter inside strongly connected components of the class
    # graph: an edge between components can never close a cycle.
    class_graph = nx.DiGraph()
    class_graph.add_nodes_from(classes)
    class_graph.add_edges_from(
        (egraph.nodes[i].eclass, ch) for i in enodes for ch in egraph.nodes[i].children
    )
    component = {}
    for k, members in enumerate(nx.strongly_connected_components(class_graph)):
        for c in members:
            component[c] = k
    big = nc + 1
    for i in enodes:
        n = egraph.nodes[i]
        xc = node_col[i]
        for ch in set(n.children) - {n.eclass}:
            # A chosen e-node needs its children: x_i <= sum x over child class.
            row(-inf, 0.0, [xc, *y_of[ch]], [1.0] + [-1.0] * len(y_of[ch]))
            # Acyclic: o_c - o_ch >= 1 - big (1 - x_i).
            if component[ch] == component[n.eclass]:
                row(
                    1.0 - big,
                    inf,
                    [o0 + cls_col[n.eclass], o0 + cls_col[ch], xc],
                    [1.0, -1.0, -big],
                )
            if costs.weight_layout[ch] and not costs.free[i]:
                row(-inf, 0.0, [xc, s0 + cls_col[ch]], [1.0, -1.0])
            if costs.backward[i] and not costs.weight_layout[ch]:
                row(-inf, 0.0, [xc, k0 + cls_col[ch]], [1.0, -1.0])
    for c in roots:
        if costs.weight_layout[c]:
            row(1.0, 1.0, [s0 + cls_col[c]], [1.0])
    if costs.overlap:
        # t >= B and t >= the sync before the last bucket, in microseconds as the objective.
        computed = [i for i in enodes if backward_s[i] and np.isfinite(costs.node_s[i])]
        synced = [c for c in classes if sync_s[c] and np.isfinite(sync_s[c])]
        row(0.0, inf, [t0, *(node_col[i] for i in computed)], [1, *-1e6 * backward_s[computed]])
        row(0.0, inf, [t0, *(s0 + cls_col[c] for c in synced)], [1, *-1e6 * sync_s[synced]])
    # Memory: stored weights and kept activations fit in the device.
    mem_idx = [s0 + k for k, c in enumerate(classes) if costs.stored_mem[c]]
    mem_idx += [k0 + k for k, c in enumerate(classes) if costs.act_mem[c]]
    mem_val = [costs.stored_mem[classes[j - s0]] for j in mem_idx if j < k0]
    mem_val += [costs.act_mem[classes[j - k0]] for j in mem_idx if j >= k0]
    if mem_idx:
        gib = float(2**30)
        row(-inf, costs.memory_capacity / gib, mem_idx, [v / gib for v in mem_val])
    if warm_start is not None:
        v = _as_solution(egraph, costs, warm_start.choice, ncols, node_col, cls_col, nc)
        h.setSolution(ncols, np.arange(ncols, dtype=np.int32), v)
    h.run()
    status = h.getModelStatus()
    solution = h.getSolution()
    if not solution.value_valid:
        raise ExtractionError(
            f"the ILP found no extraction ({h.modelStatusToString(status)}): no acyclic choice "
            "fits the device memory, or the time limit was too short"
        )
    values = np.asarray(solution.col_value)
    picked = {egraph.nodes[i].eclass: i for i in enodes if values[node_col[i]] > 0.5}
    choice = _reachable_checked(egraph, picked.__getitem__)
    cost, optimal = dag_cost(costs, choice), status == highspy.HighsModelStatus.kOptimal
    if warm_start is not None:
        warm_cost = dag_cost(costs, warm_start.choice)
        if warm_cost.objective(costs.memory_capacity) < cost.objective(costs.memory_capacity):
            choice, cost, optimal = dict(warm_start.choice), warm_cost, False
    seconds = time.perf_counter() - start
    return Extraction(choice=choice, cost=cost, method="ilp", seconds=seconds, optimal=optimal)


def _last_bucket_share(costs: ENodeCosts, warm_start: Extraction | None) -> float:
    """The share of the sync in the last bucket that :func:`extract_ilp` takes as fixed: the
    warm start's, or, if it syncs nothing, that of all trainable weights' bytes."""
    if warm_start is not None and warm_start.cost.sync_s > 0:
        return warm_start.cost.last_sync_s / warm_start.cost.sync_s
    egraph = costs.egraph
    weights = {
        n.eclass
        for n in egraph.nodes
        if n.op == "weight" and n.params["trainable"] and egraph.shapes[n.eclass] is not None
    }
    total = sum(egraph.shapes[c].nbytes for c in weights)
    return min(1.0, costs.bucket_bytes / total) if total else 0.0


def _as_solution(
    egraph: EGraphData,
    costs: ENodeCosts,
    choice: Mapping[int, int],
    ncols: int,
    node_col: Mapping[int, int],
    cls_col: Mapping[int, int],
    nc: int,
) -> np.ndarray:
    """``choice`` as a column vector of :func:`extract_ilp`'s program."""
    x0 = min(node_col.values())
    nx_ = len(node_col)
    s0, k0, o0 = x0 + nx_, x0 + nx_ + nc, x0 + nx_ + 2 * nc
    v = np.zeros(ncols)
    depth: dict[int, int] = {}
    for c in _post_order(egraph, choice):
        n = egraph.nodes[choice[c]]
        depth[c] = 1 + max((depth[ch] for ch in n.children), default=0)
        v[node_col[choice[c]]] = 1.0
        v[o0 + cls_col[c]] = depth[c]
        for ch in n.children:
            if costs.weight_layout[ch] and not costs.free[choice[c]]:
                v[s0 + cls_col[ch]] = 1.0
            if costs.backward[choice[c]] and not costs.weight_layout[ch]:
                v[k0 + cls_col[ch]] = 1.0
    for c in egraph.roots:
        if costs.weight_layout[c]:
            v[s0 + cls_col[c]] = 1.0
    if costs.overlap:
        found = dag_cost(costs, choice)
        v[o0 + nc] = max(found.backward_s, found.sync_s - found.last_sync_s) * 1e6
    return v


def _post_order(egraph: EGraphData, choice: Mapping[int, int]) -> list[int]:
    """The classes of an acyclic ``choice``, children before parents."""
    order: list[int] = []
    done: set[int] = set()
    stack: list[tuple[int, bool]] = [(r, False) for r in egraph.roots]
    while stack:
        c, expanded = stack.pop()
        if c in done:
            continue
        if expanded:
            done.add(c)
            order.append(c)
            continue
        stack.append((c, True))
        stack.extend((ch, False) for ch in egraph.nodes[choice[c]].children if ch not in done)
    return order
