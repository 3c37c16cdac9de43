"""Cutting a PCG into micro-batches with Unity's Pipeline and Batch operators.

:func:`with_micro_batches` rewrites a PCG so that its data flows in ``micro_batches`` micro-batches:
a Pipeline on every data input's batch dimension, carried through every operator whose shape
rule takes it (a parallel loop axis, :func:`pcgopt.ops.spec.axis_micro_batches`), and a Batch
before every operator that cannot take it (one that sums over the batch: a loss's mean, a batch
norm's statistics) and before every output. What it computes is unchanged: each step is an
instance of a rule of the shipped ``pipeline`` preset (``relu(pipeline(x)) = pipeline(relu(x))``,
``batch(pipeline(x)) = x``), and ``assert_equivalent(pcg, with_micro_batches(pcg, m))`` checks the
whole on the reference evaluator, which computes every micro-batch of a block on its own.

>>> from pcgopt import PCGBuilder
>>> b = PCGBuilder()
>>> x = b.input((8, 6), name="x")
>>> y = b.relu(b.matmul(x, b.weight((6, 4), name="w")))
>>> with_micro_batches(b.build(y), 4).shape("relu_1")
f32[8~4, 4]
"""

from __future__ import annotations

import functools

from pcgopt.errors import DegreeError, PCGError, ShapeError
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.ops import ComputeOp, OpKind, Params, get_op
from pcgopt.ops.spec import axis_micro_batches
from pcgopt.shapes import ParallelTensorShape

__all__ = ["with_micro_batches"]


# A model repeats its layers, and a search cuts the same plans again: the same operator on the
# same shapes is inferred once.
@functools.lru_cache(maxsize=1 << 14)
def _infer_or_none(
    op: str,
    params: Params,
    ins: tuple[ParallelTensorShape, ...],
    whole: tuple[ParallelTensorShape, ...],
) -> tuple[ParallelTensorShape, ...] | None:
    """The output shapes on inputs in micro-batches (``whole``: those on the same inputs
    without), or None where the operator cannot take them (they must be gathered first)."""
    spec = get_op(op)
    if not isinstance(spec, ComputeOp):
        try:
            return spec.infer(params, ins)
        except (DegreeError, ShapeError):
            return None
    # Only the micro-batch counts differ from the whole inputs, which the operator takes: its
    # outputs are the whole ones with the counts its loop axes carry (as infer_parallel has it).
    sig = spec.signature(params, tuple(s.sizes for s in ins), tuple(s.sizes for s in whole))
    try:
        counts = axis_micro_batches(spec, sig, ins)
    except DegreeError:
        return None
    outs = []
    for o, shape in enumerate(whole):
        for ax in sig.axes:
            if counts[ax.name] > 1 and o < len(ax.outputs) and ax.outputs[o] is not None:
                shape = shape.with_micro(ax.outputs[o], counts[ax.name])
        outs.append(shape)
    return tuple(outs)


def with_micro_batches(pcg: PCG, micro_batches: int, dim: int = 0) -> PCG:
    """``pcg`` with its data in ``micro_batches`` micro-batches along dimension ``dim`` of every
    data input (module docstring). New nodes are named after the tensor they cut or gather
    (``x_pipeline``, ``relu_1_batch``); every input node keeps its name. Raises PCGError when
    the count does not divide an input's blocks along ``dim`` or an input has no such
    dimension."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise PCGError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    if micro_batches == 1:
        return pcg
    found = pcg.first_in_micro_batches()
    if found is not None:
        raise PCGError(
            f"node {found[0]!r} already outputs {found[1]}, in micro-batches; with_micro_batches "
            f"takes a PCG of whole batches"
        )
    taken = {n.name for n in pcg.nodes}
    nodes: list[Node] = []
    shapes: dict[TensorRef, ParallelTensorShape] = {}
    node_shapes: dict[str, tuple[ParallelTensorShape, ...]] = {}
    # Where each tensor of the input PCG is in the new one: whole, and (if cut) in micro-batches.
    whole: dict[TensorRef, TensorRef] = {}
    cut: dict[TensorRef, TensorRef] = {}

    def fresh(base: str) -> str:
        name, k = base, 2
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    def add(
        node: Node, outs: tuple[ParallelTensorShape, ...] | None = None
    ) -> tuple[ParallelTensorShape, ...]:
        if outs is None:
            outs = node.spec.infer(node.params, tuple(shapes[r] for r in node.inputs))
        nodes.append(node)
        node_shapes[node.name] = outs
        for i, s in enumerate(outs):
            shapes[TensorRef(node.name, i)] = s
        return outs

    def add_micro(op: str, of: TensorRef, at: TensorRef, d: int, m: int) -> TensorRef:
        """A Pipeline or Batch (``op``) of ``at`` along ``d`` by ``m``, named after ``of``."""
        params = get_op(op).make_params({"dim": d, "micro_batches": m})
        node = Node(fresh(f"{of.node}_{op}"), op, (at,), params)
        add(node)
        return node.output()

    def whole_of(ref: TensorRef) -> TensorRef:
        """The tensor gathered back from its micro-batches (a Batch per cut dimension)."""
        if ref not in whole:
            at = cut[ref]
            for d, m in enumerate(shapes[at].micro):
                if m > 1:
                    at = add_micro("batch", ref, at, d, m)
            whole[ref] = at
        return whole[ref]

    def pipelined(ref: TensorRef) -> TensorRef:
        """A data input (as laid out) cut into micro-batches along ``dim``."""
        if ref not in cut:
            shape = shapes[ref]
            if not -shape.rank <= dim < shape.rank:
                raise PCGError(
                    f"input {ref.node!r} is {shape}, which has no dimension {dim} to cut into "
                    f"micro-batches"
                )
            d = dim % shape.rank
            block = shape.dims[d].block
            if block % micro_batches:
                raise PCGError(
                    f"{ref.node!r} is {shape}: its blocks along dimension {d} have {block} "
                    f"elements, which {micro_batches} micro-batches do not divide"
                )
            cut[ref] = add_micro("pipeline", ref, ref, d, micro_batches)
        return cut[ref]

    # A data input and the parallel operators that only lay it out (its split over the
    # devices: how it is loaded) stay whole; what reads them takes them in micro-batches.
    loaded: set[TensorRef] = set()
    for n in pcg.nodes:
        kind = n.spec.kind
        if kind is OpKind.SOURCE or (
            kind is OpKind.PARALLEL and all(r in loaded for r in n.inputs)
        ):
            outs = add(n, pcg.output_shapes(n.name))
            for i in range(len(outs)):
                ref = TensorRef(n.name, i)
                whole[ref] = ref
                if n.op != "weight":
                    loaded.add(ref)
            continue
        for r in n.inputs:
            if r in loaded:
                pipelined(r)
        refs = n.inputs
        if any(r in cut for r in refs):
            attempt = Node(n.name, n.op, tuple(cut.get(r, whole.get(r)) for r in refs), n.params)
            outs = _infer_or_none(
                n.op, n.params, tuple(shapes[r] for r in attempt.inputs), pcg.output_shapes(n.name)
            )
            if outs is not None:
                add(attempt, outs)
                for i, s in enumerate(outs):
                    ref = TensorRef(n.name, i)
                    (cut if s.micro_batches > 1 else whole)[ref] = ref
                continue
        ins = tuple(whole_of(r) for r in refs)
        outs = add(
            n if ins == refs else Node(n.name, n.op, ins, n.params), pcg.output_shapes(n.name)
        )
        for i in range(len(outs)):
            whole[TensorRef(n.name, i)] = TensorRef(n.name, i)
    outputs = tuple(whole_of(r) if r in cut else whole[r] for r in pcg.outputs)
    # Every node was inferred (and checked) on the way.
    return PCG._checked(tuple(nodes), node_shapes, outputs)
