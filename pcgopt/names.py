"""The model's names in a plan: a plan node that computes what a node of the input computes
takes that node's name.

Searches build new graphs (the e-graph's extraction, graph splitting's stitching, the
baselines) and name what they make after its operator (``split3/linear_40``). A user reads a
plan in their model's terms, so :func:`restore_names` maps each plan node back: a compute node
whose operator and parameters are those of an input node, and whose inputs hold (as logical
values: parallel operators move a value, they do not change it) that node's inputs, computes
that node's value and gets its name. When several plan nodes compute one input node's value
(pieces of a split layer), the first gets the name and the others ``name~1``, ``name~2``, ...
A computing node an algebraic rewrite made (the product of an unfused dense layer, a split
layer's pieces) is named after the model node it helps compute: the first named computing node
its output reaches, ``layer1/dense/matmul`` for a ``matmul`` that feeds ``layer1/dense``, or the
last one its inputs come from when its output reaches none. Parallel operators keep their names.

>>> from pcgopt import PCGBuilder
>>> b = PCGBuilder()
>>> x = b.input((8, 4), name="x")
>>> model = b.build(b.relu(x, name="layer1/act"))
>>> b = PCGBuilder()
>>> x = b.input((8, 4), name="x")
>>> plan = b.build(b.combine(b.relu(b.partition(x, dim=0, degree=2)), dim=0, degree=2))
>>> [n.name for n in restore_names(model, plan).nodes]
['x', 'partition_1', 'layer1/act', 'combine_1']
"""

from __future__ import annotations

from pcgopt.graph import PCG, TensorRef
from pcgopt.ops import OpKind

__all__ = ["model_names", "restore_names"]


def restore_names(source: PCG, plan: PCG) -> PCG:
    """``plan`` with its nodes named after the ``source`` nodes they compute (module doc)."""
    names = model_names(source, plan)
    return plan if all(k == v for k, v in names.items()) else plan.renamed(names)


def model_names(source: PCG, plan: PCG) -> dict[str, str]:
    """The new name of every node of ``plan`` (:func:`restore_names`); a node that computes no
    node of ``source`` keeps its own."""
    index: dict[tuple, str] = {}
    for n in source.nodes:
        if n.spec.kind is OpKind.COMPUTE:
            index.setdefault((n.op, n.params, n.inputs), n.name)
    value: dict[TensorRef, TensorRef] = {}
    wanted: dict[str, str] = {}
    for n in plan.nodes:
        kind = n.spec.kind
        if kind is OpKind.SOURCE:
            if n.name in source:
                value[n.output()] = n.output()
            continue
        args = tuple(value.get(r) for r in n.inputs)
        if kind is OpKind.PARALLEL:
            if len(args) == 1 and args[0] is not None:
                for k in range(len(plan.output_shapes(n.name))):
                    value[n.output(k)] = args[0]
            continue
        if any(a is None for a in args):
            continue
        name = index.get((n.op, n.params, args))
        if name is None:
            continue
        wanted[n.name] = name
        for k in range(len(plan.output_shapes(n.name))):
            value[n.output(k)] = TensorRef(name, k)
    derived = _derived(plan, wanted)
    taken = {n.name for n in plan.nodes if n.name not in wanted and n.name not in derived}
    names: dict[str, str] = {}
    for n in plan.nodes:
        base = wanted.get(n.name) or derived.get(n.name)
        if base is None:
            names[n.name] = n.name
            continue
        k, new = 0, base
        while new in taken:
            k += 1
            new = f"{base}~{k}"
        taken.add(new)
        names[n.name] = new
    return names


def _derived(plan: PCG, wanted: dict[str, str]) -> dict[str, str]:
    """``model node/op`` for each computing node of ``plan`` that computes no model node: after
    the first model node its output reaches (through other nodes), else the last its inputs
    come from."""
    readers: dict[str, list[str]] = {}
    for n in plan.nodes:
        for r in n.inputs:
            readers.setdefault(r.node, []).append(n.name)
    by_name = {n.name: n for n in plan.nodes}
    below: dict[str, str | None] = {}
    for n in reversed(plan.nodes):  # readers come after: their answers are known
        if n.name in wanted:
            below[n.name] = wanted[n.name]
            continue
        below[n.name] = next(
            (below[r] for r in readers.get(n.name, ()) if below.get(r) is not None), None
        )
    above: dict[str, str | None] = {}
    for n in plan.nodes:
        if n.name in wanted:
            above[n.name] = wanted[n.name]
            continue
        above[n.name] = next(
            (above[r.node] for r in reversed(n.inputs) if above.get(r.node) is not None), None
        )
    out = {}
    for name, node in by_name.items():
        if node.spec.kind is not OpKind.COMPUTE or name in wanted:
            continue
        base = below[name] or above[name]
        if base is not None:
            out[name] = f"{base}/{node.op}"
    return out
