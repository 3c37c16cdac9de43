"""Patterns that exporters write out and pcgopt has as one operator.

- A dense layer: ``matmul(x, w)`` whose only reader adds a bias vector ``b`` of the output's
  width becomes ``linear(x, w, b)`` (ONNX's MatMul + Add; a JAX ``dot_general`` + ``add``).
- GELU: an elementwise sub-graph of one tensor ``x`` and scalar constants that computes
  ``x Phi(x)`` becomes ``gelu_erf(x)``; one that computes the tanh approximation becomes ``gelu``.
  The sub-graph is recognized by what it computes, not by its shape: it is evaluated at 241
  points of [-6, 6] and must agree with the operator to 1e-6 (the exporter's constants are
  float32 roundings of the formula's), and each of its inner values must be read only inside it.

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
from collections.abc import Mapping

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


def fuse_patterns(
    pcg: PCG, weights: Mapping[str, np.ndarray]
) -> tuple[PCG, dict[str, np.ndarray], int]:
    """The PCG with the module docstring's patterns fused, the weights it still uses, and how
    many patterns were fused."""
    nodes = list(pcg.nodes)
    fused = 0
    nodes, k = _fuse_gelus(pcg, nodes, weights)
    fused += k
    nodes, k = _fuse_dense(PCG(nodes, pcg.outputs) if fused else pcg, nodes)
    fused += k
    used = {r.node for n in nodes for r in n.inputs} | {r.node for r in pcg.outputs}
    nodes = [n for n in nodes if n.op != "weight" or n.name in used]
    kept = {n.name for n in nodes}
    out = PCG(nodes, pcg.outputs)
    return out, {k: v for k, v in weights.items() if k in kept}, fused


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
        region = _forward_region(pcg, x, by_name, consumers, order)
        for root in sorted(region, key=order.__getitem__, reverse=True):
            if root in taken:
                continue
            sub = _ancestors(root, region, by_name)
            if len(sub) < 3 or sub & taken:
                continue
            if any(c not in sub for n in sub - {root} for c, _ in consumers.get(TensorRef(n), [])):
                continue
            if any(TensorRef(n) in pcg.outputs for n in sub - {root}):
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


def _forward_region(pcg, x, by_name, consumers, order) -> set[str]:
    """Elementwise nodes computed from ``x`` and scalar constants only."""
    region: set[str] = set()
    frontier = sorted({r for r, _ in consumers[x]}, key=order.__getitem__)
    seen: set[str] = set()
    while frontier and len(region) < _MAX_REGION:
        name = frontier.pop(0)
        if name in seen:
            continue
        seen.add(name)
        node = by_name[name]
        if node.op not in _ELEMENTWISE:
            continue
        ok = all(
            r == x or r.node in region or _is_scalar_constant(pcg, by_name[r.node])
            for r in node.inputs
        )
        if not ok:
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
    values: dict[TensorRef, np.ndarray] = {x: _POINTS}
    for name in sorted(sub, key=order.__getitem__):
        node = by_name[name]
        args = []
        for r in node.inputs:
            if r in values:
                args.append(values[r])
            elif r.node in weights:
                args.append(np.asarray(weights[r.node], np.float64).reshape(()))
            else:
                return None
        with np.errstate(all="ignore"):
            (values[TensorRef(name)],) = node.spec.reference(node.params, *args)
    root = max(sub, key=order.__getitem__)
    got = np.broadcast_to(values[TensorRef(root)], _POINTS.shape)
    for op, spec in _TARGETS:
        want = spec.fn(None, _POINTS)
        if np.all(np.isfinite(got)) and np.max(np.abs(got - want)) <= 1e-6 * max(
            1.0, math.fabs(float(np.max(np.abs(want))))
        ):
            return op
    return None
