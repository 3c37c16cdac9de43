"""The model's names in a plan: a plan node that computes what a node of the input computes
takes that node's name.

Searches build new graphs (the e-graph's extraction, graph splitting's stitching, the
baselines) and name what they make after its operator (``split3/linear_40``). A user reads a
plan in their model's terms, so :func:`restore_names` maps each plan node back: a compute node
whose operator and parameters are those of an input node, and whose inputs hold (as logical
values: parallel operators move a value, they do not change it) that node's inputs, computes
that node's value and gets its name. When several plan nodes compute one input node's value
(pieces of a split layer), the first gets the name and the others ``name~1``, ``name~2``, ...
Nodes an algebraic rewrite made keep their generated names.

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
    taken = {n.name for n in plan.nodes if n.name not in wanted}
    names: dict[str, str] = {}
    for n in plan.nodes:
        if n.name not in wanted:
            names[n.name] = n.name
            continue
        base, k = wanted[n.name], 0
        new = base
        while new in taken:
            k += 1
            new = f"{base}~{k}"
        taken.add(new)
        names[n.name] = new
    return names
