"""Patterns that exporters write out and pcgopt has as one operator.

- A dense layer: ``matmul(x, w)`` whose only reader adds a bias vector ``b`` of the output's
  width becomes ``linear(x, w, b)`` (ONNX's MatMul + Add; a JAX ``dot_general`` + ``add``).
- GELU: an elementwise sub-graph of one tensor ``x`` and scalar constants that computes
  ``x Phi(x)`` becomes ``gelu_erf(x)``; one that computes the tanh approximation becomes ``gelu``.
  The sub-graph is recognized by what it computes, not by its shape: it is evaluated at 241
  points of [-6, 6] and must agree with the operator to 1e-6 (the exporter's constants are
  float32 roundings of the formula's), and each of its inner values must be read only inside it.
- Softmax and LayerNorm: a sub-graph of one tensor ``x``, scalar constants, reductions
  (``reduce_sum``/``reduce_mean``/``reduce_max``), the reshapes and broadcasts that keep reduced
  dimensions, and for LayerNorm up to two parameter vectors of the normalized shape (its scale and
  shift, read through reshapes), that computes ``softmax(x, axis)`` or
  ``layer_norm(x, gamma, beta, eps)``. ONNX before opset 17 and every JAX program write them out
  so (``(x - mean) / sqrt(var + eps) * g + b``; Flax's ``(x - mean) * (rsqrt(var + eps) * g) + b``;
  ``exp(x - max) / sum``). The test is again what it computes: the sub-graph is evaluated on two
  random inputs (one of unit scale, one of small variance around an offset, on which ``eps``
  matters), with random values for the parameters, so that the match holds for every value
  training gives them, and must agree with the operator to 1e-6. ``eps`` is the sub-graph's
  scalar constant that makes it agree (or 0).

>>> from pcgopt import PCGBuilder
>>> b = PCGBuilder()
>>> x = b.input((4, 8), name="x")
>>> y = b.add(b.matmul(x, b.weight((8, 3), name="w")), b.weight((3,), name="bias"))
>>> pcg, weights, fused = fuse_patterns(b.build(y), {})
>>> [n.op for n in pcg.nodes], fused
(['input', 'weight', 'weight', 'linear'], 1)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.ops import OPERATORS
from pcgopt.ops.elementwise import GELU, BinaryElementwise, GELUExact, UnaryElementwise

__all__ = ["fuse_patterns"]

_ELEMENTWISE = frozenset(
    n for n, s in OPERATORS.items() if isinstance(s, UnaryElementwise | BinaryElementwise)
) - {"dropout"}
_POINTS = np.linspace(-6.0, 6.0, 241)
_TARGETS = (("gelu_erf", GELUExact()), ("gelu", GELU()))
_MAX_REGION = 16
_REDUCTIONS = frozenset({"reduce_sum", "reduce_mean", "reduce_max"})
_ROW_OPS = _ELEMENTWISE | _REDUCTIONS | {"reshape", "broadcast"}
_MAX_ROW_REGION = 32
_LAYOUT = frozenset({"reshape", "broadcast"})
_TOLERANCE = 1e-6


def fuse_patterns(
    pcg: PCG, weights: Mapping[str, np.ndarray]
) -> tuple[PCG, dict[str, np.ndarray], int]:
    """The PCG with the module docstring's patterns fused, the weights it still uses, and how
    many patterns were fused."""
    nodes = list(pcg.nodes)
    weights = dict(weights)
    nodes, gelus = _fuse_gelus(pcg, nodes, weights)
    if gelus:
        pcg = PCG(nodes, pcg.outputs)
    nodes, rows = _fuse_rows(pcg, nodes, weights)
    if rows:
        pcg = PCG(nodes, pcg.outputs)
    nodes, dense = _fuse_dense(pcg, nodes)
    out = PCG(_live(nodes, pcg.outputs), pcg.outputs)
    kept = {n.name for n in out.nodes}
    return out, {k: v for k, v in weights.items() if k in kept}, gelus + rows + dense


def _live(nodes: list[Node], outputs: tuple[TensorRef, ...]) -> list[Node]:
    """The nodes the outputs read, and every input (an input of the model stays one)."""
    by_name = {n.name: n for n in nodes}
    live: set[str] = set()
    stack = [r.node for r in outputs]
    while stack:
        name = stack.pop()
        if name not in live:
            live.add(name)
            stack.extend(r.node for r in by_name[name].inputs)
    return [n for n in nodes if n.name in live or n.op == "input"]


def _fuse_dense(pcg: PCG, nodes: list[Node]) -> tuple[list[Node], int]:
    consumers = pcg.consumers()
    by_name = {n.name: n for n in nodes}
    replace: dict[str, Node] = {}
    drop: set[str] = set()
    for add in nodes:
        if add.op != "add":
            continue
        for mm_slot in (0, 1):
            mm_ref, bias_ref = add.inputs[mm_slot], add.inputs[1 - mm_slot]
            mm = by_name[mm_ref.node]
            if mm.op != "matmul" or mm.name in drop or len(consumers.get(mm_ref, [])) != 1:
                continue
            if mm_ref in pcg.outputs:
                continue
            bias = by_name[bias_ref.node]
            width = pcg.shape(mm_ref).sizes[-1]
            reshaped = None
            if bias.op == "reshape" and len(consumers.get(bias_ref, [])) == 1:
                # A bias vector reshaped to [1, ..., 1, n] for broadcasting (JAX writes it so).
                inner = by_name[bias.inputs[0].node]
                sizes = pcg.shape(bias_ref).sizes
                if inner.op == "weight" and set(sizes[:-1]) <= {1}:
                    reshaped, bias, bias_ref = bias.name, inner, bias.inputs[0]
            if bias.op != "weight" or pcg.shape(bias_ref).sizes != (width,):
                continue
            # Named after the product (the layer), unless the sum is a graph output.
            keep = add.name if TensorRef(add.name) in pcg.outputs else mm.name
            replace[add.name] = Node(keep, "linear", (*mm.inputs, bias_ref))
            drop.add(mm.name)
            if reshaped:
                drop.add(reshaped)
            break
    if not replace:
        return nodes, 0
    renamed = {TensorRef(a): TensorRef(n.name) for a, n in replace.items() if n.name != a}
    out = []
    for n in nodes:
        if n.name in drop:
            continue
        n = replace.get(n.name, n)
        if any(r in renamed for r in n.inputs):
            n = Node(n.name, n.op, tuple(renamed.get(r, r) for r in n.inputs), n.params)
        out.append(n)
    return out, len(replace)


def _is_scalar_constant(pcg: PCG, node: Node) -> bool:
    return node.op == "weight" and not node.params["trainable"] and pcg.shape(node.name).numel == 1


def _fuse_gelus(
    pcg: PCG, nodes: list[Node], weights: Mapping[str, np.ndarray]
) -> tuple[list[Node], int]:
    consumers = pcg.consumers()
    by_name = {n.name: n for n in nodes}
    order = {n.name: k for k, n in enumerate(nodes)}
    taken: set[str] = set()
    found: dict[str, tuple[str, TensorRef, set[str]]] = {}
    for x, readers in consumers.items():
        elementwise = [r for r, _ in readers if by_name[r].op in _ELEMENTWISE]
        if len(elementwise) < 2 or pcg.shape(x).dtype.is_integer:
            continue
        region = _forward_region(
            x,
            by_name,
            consumers,
            order,
            _ELEMENTWISE,
            lambda r: _is_scalar_constant(pcg, by_name[r.node]),
            _MAX_REGION,
        )
        for root in sorted(region, key=order.__getitem__, reverse=True):
            if root in taken:
                continue
            sub = _ancestors(root, region, by_name)
            if len(sub) < 3 or sub & taken:
                continue
            if not _closed(sub, root, pcg, consumers):
                continue
            op = _recognize(sub, x, by_name, order, weights)
            if op is not None:
                found[root] = (op, x, sub)
                taken |= sub
                break
    if not found:
        return nodes, 0
    out = []
    for n in nodes:
        if n.name in found:
            op, x, _ = found[n.name]
            out.append(Node(n.name, op, (x,)))
        elif n.name not in taken:
            out.append(n)
    return out, len(found)


def _forward_region(
    x: TensorRef,
    by_name: Mapping[str, Node],
    consumers: Mapping[TensorRef, list[tuple[str, int]]],
    order: Mapping[str, int],
    ops: frozenset[str],
    admits: Callable[[TensorRef], bool],
    cap: int,
) -> set[str]:
    """Nodes of ``ops`` computed from ``x``, each other input one that ``admits`` accepts."""
    region: set[str] = set()
    frontier = sorted({r for r, _ in consumers[x]}, key=order.__getitem__)
    seen: set[str] = set()
    while frontier and len(region) < cap:
        name = frontier.pop(0)
        if name in seen:
            continue
        seen.add(name)
        node = by_name[name]
        if node.op not in ops:
            continue
        if not all(r == x or r.node in region or admits(r) for r in node.inputs):
            seen.discard(name)  # may qualify once more of the region is known
            continue
        region.add(name)
        for r, _ in consumers.get(TensorRef(name), []):
            if r not in region:
                frontier.append(r)
        frontier.sort(key=order.__getitem__)
    return region


def _ancestors(root: str, region: set[str], by_name) -> set[str]:
    out, stack = set(), [root]
    while stack:
        n = stack.pop()
        if n in out:
            continue
        out.add(n)
        stack.extend(r.node for r in by_name[n].inputs if r.node in region)
    return out


def _recognize(sub, x, by_name, order, weights) -> str | None:
    names = sorted(sub, key=order.__getitem__)
    values = _evaluate(names, x, _POINTS, {}, weights, by_name, set(), None)
    if values is None:
        return None
    got = np.broadcast_to(values[names[-1]], _POINTS.shape)
    for op, spec in _TARGETS:
        if _agrees(got, spec.fn(None, _POINTS)):
            return op
    return None


def _closed(
    sub: set[str], root: str, pcg: PCG, consumers: Mapping[TensorRef, list[tuple[str, int]]]
) -> bool:
    """Whether every value of ``sub`` but the root's is read only inside it."""
    inner = sub - {root}
    if any(TensorRef(n) in pcg.outputs for n in inner):
        return False
    return all(c in sub for n in inner for c, _ in consumers.get(TensorRef(n), []))


def _fuse_rows(
    pcg: PCG, nodes: list[Node], weights: dict[str, np.ndarray]
) -> tuple[list[Node], int]:
    """Softmaxes and LayerNorms written out (module docstring). New constant scales and shifts
    (a LayerNorm written without them) are added to ``weights``."""
    consumers = pcg.consumers()
    by_name = {n.name: n for n in nodes}
    order = {n.name: k for k, n in enumerate(nodes)}
    taken: set[str] = set()
    found: dict[str, list[Node]] = {}
    names = set(by_name)
    for x, readers in consumers.items():
        shape = pcg.shape(x)
        if shape.dtype.is_integer or shape.rank == 0:
            continue
        if not any(by_name[r].op in _REDUCTIONS | {"sub", "exp"} for r, _ in readers):
            continue
        row = math.prod(shape.sizes[1:]) if shape.rank > 1 else shape.sizes[0]

        def admits(r: TensorRef, row: int = row) -> bool:
            node = by_name[r.node]
            return _is_scalar_constant(pcg, node) or _param_chain(r, by_name, pcg, row) is not None

        region = _forward_region(x, by_name, consumers, order, _ROW_OPS, admits, _MAX_ROW_REGION)
        for root in sorted(region, key=order.__getitem__, reverse=True):
            if root in taken or pcg.shape(root).sizes != shape.sizes:
                continue
            sub = _ancestors(root, region, by_name)
            if sub & taken or not any(by_name[n].op in _REDUCTIONS for n in sub):
                continue
            if not _closed(sub, root, pcg, consumers):
                continue
            match = _recognize_row_op(pcg, x, root, sub, by_name, order, weights, names)
            if match is not None:
                found[root] = match
                taken |= sub
                break
    if not found:
        return nodes, 0
    out = []
    for n in nodes:
        if n.name in found:
            out.extend(found[n.name])
        elif n.name not in taken:
            out.append(n)
    return out, len(found)


def _param_chain(r: TensorRef, by_name: Mapping[str, Node], pcg: PCG, row: int) -> list[str] | None:
    """The reshapes and broadcasts from a parameter vector (a weight of at most a row's
    elements) to ``r``, ending at the weight, or None when ``r`` is not one."""
    chain = []
    node = by_name[r.node]
    while node.op in _LAYOUT:
        chain.append(node.name)
        node = by_name[node.inputs[0].node]
    numel = pcg.shape(node.name).numel
    if node.op != "weight" or not 1 < numel <= row:
        return None
    return [*chain, node.name]


def _recognize_row_op(
    pcg: PCG,
    x: TensorRef,
    root: str,
    sub: set[str],
    by_name: Mapping[str, Node],
    order: Mapping[str, int],
    weights: dict[str, np.ndarray],
    names: set[str],
) -> list[Node] | None:
    shape = pcg.shape(x)
    row = math.prod(shape.sizes[1:]) if shape.rank > 1 else shape.sizes[0]
    side: set[str] = set()
    params: list[str] = []
    scalars: list[float] = []
    for n in sub:
        for r in by_name[n].inputs:
            if r == x or r.node in sub:
                continue
            chain = _param_chain(r, by_name, pcg, row)
            if chain is not None:
                side.update(chain[:-1])
                if chain[-1] not in params:
                    params.append(chain[-1])
            elif r.node in weights:
                scalars.append(float(np.asarray(weights[r.node]).reshape(())))
            else:
                return None
    if len(params) > 2:
        return None
    reduced = set()
    for n in sub:
        node = by_name[n]
        if node.op in _REDUCTIONS:
            rank = pcg.shape(node.inputs[0]).rank
            if rank != shape.rank:
                return None
            reduced |= {a % rank for a in node.params["axes"]}
    rng = np.random.default_rng(0)
    lead = _truncated_lead(pcg, x, sub, by_name, reduced)
    sizes = (lead, *shape.sizes[1:]) if lead else shape.sizes
    tests = (
        rng.standard_normal(sizes),
        0.3 + 0.01 * rng.standard_normal(sizes),
    )
    values = {w: rng.standard_normal(pcg.shape(w).sizes) for w in params}
    evaluated = [
        _evaluate(
            sorted(sub | side, key=order.__getitem__), x, t, values, weights, by_name, sub, lead
        )
        for t in tests
    ]
    if any(v is None for v in evaluated):
        return None
    got = [v[root] for v in evaluated]
    if not params and len(reduced) == 1:
        (axis,) = reduced
        softmax = OPERATORS["softmax"]
        if all(
            _agrees(g, softmax.reference({"axis": axis}, t)[0])
            for g, t in zip(got, tests, strict=True)
        ):
            return [Node(root, "softmax", (x,), {"axis": axis})]
    if not reduced or reduced != set(range(min(reduced), shape.rank)):
        return None
    k = shape.rank - min(reduced)
    tail = shape.sizes[shape.rank - k :]
    if any(pcg.shape(w).numel != math.prod(tail) for w in params):
        return None
    layer_norm = OPERATORS["layer_norm"]
    one, zero = np.ones(tail), np.zeros(tail)
    options = [(g, b) for g in (*params, None) for b in (*params, None) if g != b or g is None]
    for gamma, beta in options:
        if {gamma, beta} - {None} != set(params):
            continue
        g = one if gamma is None else values[gamma].reshape(tail)
        b = zero if beta is None else values[beta].reshape(tail)
        for eps in (*sorted(set(scalars)), 0.0):
            attrs = {"normalized_dims": k, "eps": eps}
            if all(
                _agrees(v, layer_norm.reference(attrs, t, g, b)[0])
                for v, t in zip(got, tests, strict=True)
            ):
                return _layer_norm_nodes(pcg, x, root, gamma, beta, tail, attrs, weights, names)
    return None


def _truncated_lead(
    pcg: PCG, x: TensorRef, sub: set[str], by_name: Mapping[str, Node], reduced: set[int]
) -> int | None:
    """2 when the sub-graph is row by row along ``x``'s first dimension, so that two rows of
    it stand for all (every value keeps that dimension first and nothing reduces it)."""
    n0 = pcg.shape(x).sizes[0]
    if pcg.shape(x).rank < 2 or n0 <= 2 or 0 in reduced:
        return None
    for n in sub:
        sizes = pcg.shape(n).sizes
        if not sizes or sizes[0] != n0:
            return None
        if any(
            r != x and r.node in sub and pcg.shape(r).sizes[:1] != (n0,) for r in by_name[n].inputs
        ):
            return None
    return 2


def _evaluate(
    names: list[str],
    x: TensorRef,
    test: np.ndarray,
    params: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    by_name: Mapping[str, Node],
    rows: set[str],
    lead: int | None,
) -> dict[str, np.ndarray] | None:
    """Values of the named nodes (in order) for ``x = test``: parameters take ``params``,
    scalar constants their values; the reshapes and broadcasts among ``rows`` (values of
    ``x``'s rows) keep ``lead`` rows."""
    values: dict[TensorRef, np.ndarray] = {x: test}
    for k, v in params.items():
        values[TensorRef(k)] = v
    out = {}
    for name in names:
        node = by_name[name]
        args = []
        for r in node.inputs:
            if r in values:
                args.append(values[r])
            elif r.node in weights:
                args.append(np.asarray(weights[r.node], np.float64).reshape(()))
            else:
                return None
        attrs: Mapping = node.params
        if lead and node.op in _LAYOUT and name in rows:
            attrs = {**node.params, "shape": (lead, *node.params["shape"][1:])}
        try:
            with np.errstate(all="ignore"):
                (value,) = node.spec.reference(attrs, *args)
        except ValueError:  # a reshape or broadcast that two rows do not fit
            return None
        values[TensorRef(name)] = out[name] = value
    return out


def _agrees(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return False
    return float(np.max(np.abs(got - want))) <= _TOLERANCE * max(1.0, float(np.max(np.abs(want))))


def _layer_norm_nodes(
    pcg: PCG,
    x: TensorRef,
    root: str,
    gamma: str | None,
    beta: str | None,
    tail: tuple[int, ...],
    attrs: dict,
    weights: dict[str, np.ndarray],
    names: set[str],
) -> list[Node]:
    """A layer_norm named ``root``, with the scale and shift it was found with (reshaped to the
    normalized shape if stored otherwise), or constant ones and zeros when written without."""
    dtype = pcg.shape(x).dtype
    nodes: list[Node] = []
    refs = []
    for role, w, fill in (("gamma", gamma, 1.0), ("beta", beta, 0.0)):
        name = _fresh(f"{root}/{role}", names)
        if w is None:
            nodes.append(
                Node(name, "weight", (), {"shape": tail, "dtype": dtype, "trainable": False})
            )
            weights[name] = np.full(tail, fill, np.float32)
            refs.append(TensorRef(name))
        elif pcg.shape(w).sizes != tail:
            nodes.append(Node(name, "reshape", (TensorRef(w),), {"shape": tail}))
            refs.append(TensorRef(name))
        else:
            refs.append(TensorRef(w))
    nodes.append(Node(root, "layer_norm", (x, *refs), attrs))
    return nodes


def _fresh(name: str, names: set[str]) -> str:
    k, out = 1, name
    while out in names:
        k += 1
        out = f"{name}_{k}"
    names.add(out)
    return out
