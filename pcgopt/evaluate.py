"""The reference evaluator: the meaning of a PCG.

:func:`evaluate` computes every tensor of a PCG as its shards
(:class:`~pcgopt.sharded.ShardedArray`) from values of its Input and Weight nodes. Two PCGs are
equivalent when, for all values of their (same-named) inputs and weights, every output shard
agrees; :func:`equivalent` checks that on random values in float64.

Random values are a function of the seed and the node's *name*, so two graphs that share input
and weight names get the same values however their nodes are ordered.

Equivalence comes in three strengths (``compare=``):

* ``"parallel"`` (default): equal output parallel shapes and equal logical values. This is what
  makes one PCG replaceable by another: every operator that may read a partial-sum tensor is
  linear in it, so only the sum of the partial sums matters, not how it is split.
* ``"shards"``: also equal partial sums one by one (the exact storage; for layout tests).
* ``"logical"``: equal logical values only; the outputs may be distributed differently.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pcgopt.errors import EvaluationError, NotEquivalentError, PCGError
from pcgopt.graph import PCG, TensorRef
from pcgopt.ops import OPERATORS, OpKind
from pcgopt.sharded import ShardedArray

Compare = Literal["parallel", "shards", "logical"]
_COMPARE_MODES = ("parallel", "shards", "logical")


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Result of :func:`evaluate`: every tensor's shards and the source values used."""

    values: Mapping[TensorRef, ShardedArray]
    feeds: Mapping[str, np.ndarray]
    output_refs: tuple[TensorRef, ...]

    @property
    def outputs(self) -> tuple[ShardedArray, ...]:
        return tuple(self.values[r] for r in self.output_refs)

    def __getitem__(self, ref: TensorRef | str) -> ShardedArray:
        return self.values[TensorRef.parse(ref)]


def random_feeds(
    pcg: PCG, seed: int = 0, dtype: type | np.dtype = np.float64
) -> dict[str, np.ndarray]:
    """Random values for every Input and Weight node.

    Floating-point sources get standard normal values (``dtype`` float) or integers in [-3, 3]
    (``dtype`` integer, for exact arithmetic); integer inputs get indices in
    ``[0, max_value)``; buffers (``trainable=False`` weights, e.g. variances) get values in
    [0.5, 1.5] so they are valid statistics.
    """
    exact = np.issubdtype(np.dtype(dtype), np.integer)
    bounds = index_bounds(pcg)
    feeds = {}
    for node in pcg.nodes:
        if OPERATORS[node.op].kind is not OpKind.SOURCE:
            continue
        shape = pcg.shape(node.name)
        rng = np.random.default_rng([seed, zlib.crc32(node.name.encode())])
        if shape.dtype.is_integer:
            high = min(node.params.get("max_value") or 4, bounds.get(node.name, 4))
            feeds[node.name] = rng.integers(0, high, size=shape.sizes, dtype=np.int64)
        elif node.op == "weight" and not node.params["trainable"]:
            if exact:
                feeds[node.name] = rng.integers(1, 3, size=shape.sizes).astype(dtype)
            else:
                feeds[node.name] = rng.uniform(0.5, 1.5, size=shape.sizes).astype(dtype)
        elif exact:
            feeds[node.name] = rng.integers(-3, 4, size=shape.sizes).astype(dtype)
        else:
            feeds[node.name] = rng.standard_normal(shape.sizes).astype(dtype)
    return feeds


def index_bounds(pcg: PCG) -> dict[str, int]:
    """The integer sources whose values index a dimension (an embedding's ids into its table's
    rows, :attr:`~pcgopt.ops.spec.ComputeOp.index_inputs`; an integer weight as well as an
    input), with the exclusive bound their values must stay under: the least such dimension."""
    bound: dict[str, int] = {}
    for source, indexed, d in index_uses(pcg):
        limit = pcg.shape(indexed).sizes[d]
        bound[source] = min(bound.get(source, limit), limit)
    return bound


def index_uses(pcg: PCG) -> Iterator[tuple[str, TensorRef, int]]:
    """``(source, tensor, dim)`` for every use of an integer source's values as indices into
    dimension ``dim`` of ``tensor`` (:attr:`~pcgopt.ops.spec.ComputeOp.index_inputs`), followed
    back through operators that move integers unchanged."""
    for node in pcg.nodes:
        for i, j, d in getattr(node.spec, "index_inputs", ()):
            source = node.inputs[i].node
            spec = pcg.node(source).spec
            while spec.kind is OpKind.PARALLEL or spec.moves_elements:
                source = pcg.node(source).inputs[0].node
                spec = pcg.node(source).spec
            if spec.kind is OpKind.SOURCE:
                yield source, node.inputs[j], d


def _check_feed(pcg: PCG, name: str, value: np.ndarray) -> np.ndarray:
    node = pcg.node(name)
    shape = pcg.shape(name)
    value = np.asarray(value)
    if value.shape != shape.sizes:
        raise EvaluationError(
            f"value for {node.op} {name!r} has shape {value.shape}, expected {shape.sizes}",
            node=name,
        )
    if shape.dtype.is_integer:
        if not np.issubdtype(value.dtype, np.integer):
            raise EvaluationError(
                f"value for {name!r} must be integers ({shape.dtype.value})", node=name
            )
        bound = node.params.get("max_value")
        if value.size and (value.min() < 0 or (bound is not None and value.max() >= bound)):
            raise EvaluationError(
                f"value for {name!r} has entries outside [0, {bound}): "
                f"[{value.min()}, {value.max()}]",
                node=name,
            )
    return value


def evaluate(
    pcg: PCG,
    inputs: Mapping[str, np.ndarray] | None = None,
    *,
    seed: int = 0,
    dtype: type | np.dtype = np.float64,
) -> Evaluation:
    """Evaluates ``pcg``. ``inputs`` maps Input/Weight names to logical values; the others get
    random values from ``seed`` (see :func:`random_feeds`)."""
    inputs = dict(inputs or {})
    sources = {n.name for n in pcg.nodes if OPERATORS[n.op].kind is OpKind.SOURCE}
    unknown = sorted(set(inputs) - sources)
    if unknown:
        raise EvaluationError(
            f"values given for {', '.join(map(repr, unknown))}, which are not Input or Weight "
            f"nodes of the graph (those are: {', '.join(sorted(sources)) or 'none'})",
            node=unknown[0],
        )
    feeds = random_feeds(pcg, seed, dtype)
    for name, value in inputs.items():
        feeds[name] = _check_feed(pcg, name, value)

    values: dict[TensorRef, ShardedArray] = {}
    for node in pcg.nodes:
        spec = OPERATORS[node.op]
        out_shapes = pcg.output_shapes(node.name)
        if spec.kind is OpKind.SOURCE:
            values[TensorRef(node.name)] = ShardedArray.from_logical(
                feeds[node.name], out_shapes[0]
            )
            continue
        args = tuple(values[r] for r in node.inputs)
        try:
            outs = spec.evaluate(node.params, args, out_shapes)
        except PCGError as e:
            raise e.at_node(node.name, node.op) from None
        for i, out in enumerate(outs):
            values[TensorRef(node.name, i)] = out
    return Evaluation(values, feeds, pcg.outputs)


# ----------------------------------------------------------------------------------------------
# equivalence
# ----------------------------------------------------------------------------------------------


def _source_signature(pcg: PCG) -> dict[str, tuple]:
    return {
        n.name: (n.op, pcg.shape(n.name).sizes, pcg.shape(n.name).dtype)
        for n in pcg.nodes
        if OPERATORS[n.op].kind is OpKind.SOURCE
    }


def value_difference(a: np.ndarray, b: np.ndarray, rtol: float) -> np.ndarray | None:
    """None if ``b`` equals ``a`` to ``rtol`` (relative to ``a``'s largest finite magnitude,
    at least 1), else ``|a - b|`` elementwise. Outside an operator's domain (log or sqrt of a
    negative) both must give NaN at the same elements: there the difference is 0 where both
    are NaN and inf where only one is."""
    finite = np.isfinite(a)
    scale = max(1.0, float(np.max(np.abs(a[finite]))) if finite.any() else 1.0)
    if np.allclose(a, b, rtol=rtol, atol=rtol * scale, equal_nan=True):
        return None
    diff = np.abs(np.where(np.isnan(a) & np.isnan(b), 0.0, a - b))
    return np.where(np.isnan(diff), np.inf, diff)


def _difference(
    a: PCG, b: PCG, trials: int, rtol: float, seed: int, compare: Compare
) -> str | None:
    """None if equivalent on ``trials`` random inputs, else a sentence saying where they differ."""
    if compare not in _COMPARE_MODES:
        raise ValueError(f"compare must be one of {_COMPARE_MODES}, got {compare!r}")
    # Zero trials would compare nothing and call any two graphs equivalent.
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise PCGError(
            f"trials must be a positive int (how many random inputs to compare on), got {trials!r}"
        )
    sa, sb = _source_signature(a), _source_signature(b)
    if sa != sb:
        only_a = sorted(set(sa) - set(sb))
        only_b = sorted(set(sb) - set(sa))
        changed = sorted(k for k in set(sa) & set(sb) if sa[k] != sb[k])
        return (
            "the graphs have different inputs or weights "
            f"(only in the first: {only_a}; only in the second: {only_b}; differing: {changed})"
        )
    if len(a.outputs) != len(b.outputs):
        return f"the graphs have {len(a.outputs)} and {len(b.outputs)} outputs"
    for k, (ra, rb) in enumerate(zip(a.outputs, b.outputs, strict=True)):
        pa, pb = a.shape(ra), b.shape(rb)
        if compare != "logical" and pa != pb:
            return f"output {k} has parallel shape {pa} in the first graph and {pb} in the second"
        if pa.sizes != pb.sizes or pa.dtype != pb.dtype:
            return f"output {k} is {pa} in the first graph and {pb} in the second"
    for t in range(trials):
        ea = evaluate(a, seed=seed + t)
        eb = evaluate(b, ea.feeds)
        for k, (xa, xb) in enumerate(zip(ea.outputs, eb.outputs, strict=True)):
            va, vb = (xa.data, xb.data) if compare == "shards" else (xa.logical(), xb.logical())
            diff = value_difference(va, vb, rtol)
            if diff is not None:
                where = np.unravel_index(int(np.argmax(diff)), diff.shape)
                return (
                    f"output {k} ({a.outputs[k]} vs {b.outputs[k]}) differs on random inputs with "
                    f"seed {seed + t}: max |difference| {float(diff.max()):.3g} at "
                    f"{'(partial, block..., element...) ' if compare == 'shards' else ''}"
                    f"index {tuple(int(i) for i in where)}"
                )
    return None


def equivalent(
    a: PCG,
    b: PCG,
    *,
    trials: int = 3,
    rtol: float = 1e-7,
    seed: int = 0,
    compare: Compare = "parallel",
) -> bool:
    """Whether ``a`` and ``b`` compute the same outputs from the same inputs and weights (matched
    by name), on ``trials`` random float64 inputs. ``compare`` is ``"parallel"`` (default: same
    output parallel shapes, same values), ``"shards"`` or ``"logical"`` (module docstring).
    """
    return _difference(a, b, trials, rtol, seed, compare) is None


def assert_equivalent(
    a: PCG,
    b: PCG,
    *,
    trials: int = 3,
    rtol: float = 1e-7,
    seed: int = 0,
    compare: Compare = "parallel",
) -> None:
    """Like :func:`equivalent`, but raises NotEquivalentError saying where the graphs differ."""
    why = _difference(a, b, trials, rtol, seed, compare)
    if why is not None:
        raise NotEquivalentError(why)
