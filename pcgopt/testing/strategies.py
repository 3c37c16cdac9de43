"""Hypothesis strategies for PCGs: parallel shapes, operator instances and their legal
parallelizations, valid small PCGs, and inputs. Public: use them to test code that consumes PCGs.

>>> from hypothesis import given
>>> from pcgopt.testing.strategies import small_pcgs
>>> @given(small_pcgs())
... def test_roundtrip(pcg):
...     assert type(pcg).from_json(pcg.to_json()) == pcg

Sizes are small (at most 8 per dimension) and built from factors 2 and 3 so that degrees 2, 3
and 4 have something to divide.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.errors import PCGError
from pcgopt.evaluate import random_feeds
from pcgopt.graph import PCG
from pcgopt.lower.layout import prime_factors
from pcgopt.machine import DeviceSpec, Level, Link, Machine
from pcgopt.ops import OPERATORS, ComputeOp, OpKind, Params, get_op
from pcgopt.ops.elementwise import BinaryElementwise, UnaryElementwise
from pcgopt.shapes import DType, ParallelDim, ParallelTensorShape

SIZES = (1, 2, 3, 4, 6, 8)
DEGREES = (1, 2, 3, 4)
_SIZE = st.sampled_from(SIZES)
_F32 = st.just(DType.F32)


def sizes(
    min_rank: int = 1, max_rank: int = 3, elements: st.SearchStrategy[int] = _SIZE
) -> st.SearchStrategy[tuple[int, ...]]:
    """Logical shapes."""
    return st.lists(elements, min_size=min_rank, max_size=max_rank).map(tuple)


@st.composite
def parallel_dims(draw, size: st.SearchStrategy[int] = _SIZE) -> ParallelDim:
    s = draw(size)
    return ParallelDim(s, draw(st.sampled_from([d for d in DEGREES if s % d == 0])))


@st.composite
def parallel_shapes(
    draw,
    min_rank: int = 0,
    max_rank: int = 4,
    dtypes: st.SearchStrategy[DType] = _F32,
    max_copies: int = 4,
    max_partial: int = 4,
) -> ParallelTensorShape:
    """Any valid parallel shape: split dimensions, copies, partial sums."""
    dims = draw(st.lists(parallel_dims(), min_size=min_rank, max_size=max_rank))
    return ParallelTensorShape(
        tuple(dims),
        draw(dtypes),
        draw(st.integers(1, max_copies)),
        draw(st.integers(1, max_partial)),
    )


# --------------------------------------------------------------------------------------------
# operator instances
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpInstance:
    """A compute operator applied to unpartitioned inputs: the logical computation."""

    op: str
    params: Params
    inputs: tuple[ParallelTensorShape, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", get_op(self.op).make_params(self.params, self.inputs))

    @property
    def spec(self) -> ComputeOp:
        return OPERATORS[self.op]  # type: ignore[return-value]

    def outputs(self) -> tuple[ParallelTensorShape, ...]:
        return self.spec.infer(self.params, self.inputs)


def _f(s: Sequence[int]) -> ParallelTensorShape:
    return ParallelTensorShape.of(s)


def _i(s: Sequence[int]) -> ParallelTensorShape:
    return ParallelTensorShape.of(s, DType.I64)


_ACTS = st.sampled_from(("none", "relu", "gelu", "sigmoid", "tanh"))


_UNARY_PARAMS: dict[str, st.SearchStrategy[dict]] = {
    "dropout": st.just({"rate": 0.25}),
    "scale": st.just({"factor": 0.5}),
    "pow": st.sampled_from((2.0, 3.0, 0.5, -1.0)).map(lambda e: {"exponent": e}),
}


@st.composite
def _unary(draw, op):
    params = draw(_UNARY_PARAMS.get(op, st.just({})))
    return OpInstance(op, params, (_f(draw(sizes(1, 4))),))


@st.composite
def _slice(draw, op):
    x = draw(sizes(1, 3))
    axis = draw(st.integers(0, len(x) - 1))
    start = draw(st.integers(0, x[axis] - 1))
    stop = draw(st.integers(start + 1, x[axis]))
    return OpInstance(op, {"axis": axis, "start": start, "stop": stop}, (_f(x),))


@st.composite
def _broadcast(draw, op):
    out = draw(sizes(1, 4))
    # x: a suffix of the target shape, with some dimensions of size 1.
    suffix = out[draw(st.integers(0, len(out) - 1)) :]
    x = tuple(1 if draw(st.booleans()) else s for s in suffix)
    return OpInstance(op, {"shape": out}, (_f(x),))


_BINARY_PARAMS: dict[str, st.SearchStrategy[dict]] = {
    "compare": st.sampled_from(("eq", "ne", "lt", "le", "gt", "ge")).map(lambda r: {"relation": r}),
}


def _broadcast_operand(draw, out: tuple[int, ...]) -> tuple[int, ...]:
    """A suffix of ``out`` with some dimensions broadcast from 1."""
    suffix = out[draw(st.integers(0, len(out) - 1)) :]
    return tuple(1 if draw(st.booleans()) and draw(st.booleans()) else s for s in suffix)


@st.composite
def _binary(draw, op):
    out = draw(sizes(1, 4))
    pair = (_f(out), _f(_broadcast_operand(draw, out)))
    params = draw(_BINARY_PARAMS.get(op, st.just({})))
    return OpInstance(op, params, pair if draw(st.booleans()) else pair[::-1])


@st.composite
def _where(draw, op):
    out = draw(sizes(1, 4))
    operands = [out, _broadcast_operand(draw, out), _broadcast_operand(draw, out)]
    order = draw(st.permutations(range(3)))
    return OpInstance(op, {}, tuple(_f(operands[k]) for k in order))


@st.composite
def _cast(draw, op):
    x = draw(sizes(1, 3))
    source = _i(x) if draw(st.booleans()) else _f(x)
    return OpInstance(op, {"dtype": draw(st.sampled_from(("f32", "f16", "f64")))}, (source,))


@st.composite
def _pad(draw, op):
    x = draw(sizes(1, 3))
    low = tuple(draw(st.sampled_from((0, 0, 1, 2))) for _ in x)
    high = tuple(draw(st.sampled_from((0, 0, 1, 3))) for _ in x)
    value = draw(st.sampled_from((0.0, 0.0, -1.5)))
    return OpInstance(op, {"low": low, "high": high, "value": value}, (_f(x),))


@st.composite
def _top_k(draw, op):
    x = draw(sizes(1, 3))
    axis = draw(st.integers(-len(x), len(x) - 1))
    return OpInstance(op, {"k": draw(st.integers(1, x[axis])), "axis": axis}, (_f(x),))


@st.composite
def _matmul(draw, op):
    lead, k, n = draw(sizes(1, 3)), draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES))
    if op == "matmul":
        return OpInstance(op, {}, (_f((*lead, k)), _f((k, n))))
    if op == "batch_matmul":
        batch, m = draw(sizes(1, 2)), draw(st.sampled_from(SIZES))
        return OpInstance(op, {}, (_f((*batch, m, k)), _f((*batch, k, n))))
    ins = [_f((*lead, k)), _f((k, n))]
    if draw(st.booleans()):
        ins.append(_f((n,)))
    return OpInstance(op, {"activation": draw(_ACTS)}, tuple(ins))


@st.composite
def _conv2d(draw, op):
    g = draw(st.sampled_from((1, 1, 2, 3)))
    cg, og = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2)))
    n, h, w = draw(st.sampled_from((1, 2))), draw(st.integers(2, 6)), draw(st.integers(2, 6))
    kh, kw = draw(st.sampled_from(((1, 1), (1, 1), (3, 3), (1, 3), (2, 2))))
    params = {
        "stride": draw(st.sampled_from(((1, 1), (1, 1), (2, 2), (1, 2)))),
        "padding": (draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))),
        "groups": g,
        "activation": draw(_ACTS),
        "dilation": draw(st.sampled_from(((1, 1), (1, 1), (2, 2), (1, 2)))),
        # A transposed convolution's stride spreads the input's pixels.
        "input_dilation": draw(st.sampled_from(((1, 1), (1, 1), (1, 1), (2, 2), (2, 1)))),
    }
    (dh, dw) = params["dilation"]
    span_h, span_w = dh * (kh - 1) + 1, dw * (kw - 1) + 1
    (ih, iw) = params["input_dilation"]
    spread_h, spread_w = (h - 1) * ih + 1, (w - 1) * iw + 1
    assume(
        spread_h + 2 * params["padding"][0] >= span_h
        and spread_w + 2 * params["padding"][1] >= span_w
    )
    ins = [_f((n, g * cg, h, w)), _f((g * og, cg, kh, kw))]
    if draw(st.booleans()):
        ins.append(_f((g * og,)))
    return OpInstance(op, params, tuple(ins))


@st.composite
def _pool2d(draw, op):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    h, w = draw(st.integers(kh, 6)), draw(st.integers(kw, 6))
    params = {
        "kernel": (kh, kw),
        "stride": draw(st.sampled_from((None, (1, 1), (2, 2)))),
        "padding": (draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))),
        "mode": draw(st.sampled_from(("max", "avg"))),
    }
    return OpInstance(
        op, params, (_f((draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4))), h, w)),)
    )


@st.composite
def _batch_norm(draw, op):
    x = draw(st.sampled_from([2, 4]).flatmap(lambda r: sizes(r, r)))
    return OpInstance(op, {}, (_f(x), *(_f((x[1],)),) * 4))


@st.composite
def _layer_norm(draw, op):
    x = draw(sizes(1, 3))
    k = draw(st.integers(1, len(x)))
    tail = x[len(x) - k :]
    return OpInstance(op, {"normalized_dims": k}, (_f(x), _f(tail), _f(tail)))


@st.composite
def _softmax(draw, op):
    x = draw(sizes(1, 3))
    return OpInstance(op, {"axis": draw(st.integers(-len(x), len(x) - 1))}, (_f(x),))


@st.composite
def _concat(draw, op):
    base = draw(sizes(1, 3))
    axis = draw(st.integers(0, len(base) - 1))
    parts = draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=3))
    ins = tuple(_f((*base[:axis], p, *base[axis + 1 :])) for p in parts)
    return OpInstance(op, {"axis": axis}, ins)


@st.composite
def _split(draw, op):
    x = draw(sizes(1, 3, st.sampled_from((2, 3, 4, 6, 8))))
    axis = draw(st.integers(0, len(x) - 1))
    cuts = sorted(draw(st.sets(st.integers(1, x[axis] - 1), min_size=1, max_size=2)))
    parts = tuple(b - a for a, b in zip([0, *cuts], [*cuts, x[axis]], strict=True))
    return OpInstance(op, {"axis": axis, "sizes": parts}, (_f(x),))


@st.composite
def _transpose(draw, op):
    x = draw(sizes(1, 4))
    return OpInstance(op, {"perm": tuple(draw(st.permutations(range(len(x)))))}, (_f(x),))


def _factor(n: int) -> list[int]:
    return list(prime_factors(n))


@st.composite
def _reshape(draw, op):
    x = draw(sizes(1, 3))
    factors = draw(st.permutations(_factor(math.prod(x)))) if math.prod(x) > 1 else []
    # Group consecutive factors into dimensions; sometimes keep x's own leading dimensions.
    target: list[int] = []
    for f in factors:
        if target and draw(st.booleans()):
            target[-1] *= f
        else:
            target.append(f)
    if draw(st.booleans()) and len(x) > 1:
        rest = math.prod(x[1:])
        target = [x[0], rest]
    return OpInstance(op, {"shape": tuple(target) or (1,)}, (_f(x),))


@st.composite
def _embedding(draw, op):
    rows, dim = draw(st.sampled_from((2, 3, 4, 6, 8))), draw(st.sampled_from(SIZES))
    idx = draw(sizes(1, 2)) if op == "embedding" else draw(sizes(2, 2))
    return OpInstance(op, {}, (_i(idx), _f((rows, dim))))


@st.composite
def _reduction(draw, op):
    x = draw(sizes(1, 3))
    axes = tuple(sorted(draw(st.sets(st.integers(0, len(x) - 1), min_size=1))))
    return OpInstance(op, {"axes": axes, "keepdims": draw(st.booleans())}, (_f(x),))


_INSTANCES: dict[str, Callable[[str], st.SearchStrategy[OpInstance]]] = {
    **{name: _unary for name, spec in OPERATORS.items() if isinstance(spec, UnaryElementwise)},
    **{name: _binary for name, spec in OPERATORS.items() if isinstance(spec, BinaryElementwise)},
    **dict.fromkeys(("matmul", "batch_matmul", "linear"), _matmul),
    "conv2d": _conv2d,
    "pool2d": _pool2d,
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "softmax": _softmax,
    "concat": _concat,
    "split": _split,
    "slice": _slice,
    "broadcast": _broadcast,
    "pad": _pad,
    "where": _where,
    "cast": _cast,
    "top_k": _top_k,
    "transpose": _transpose,
    "reshape": _reshape,
    **dict.fromkeys(("embedding", "embedding_bag"), _embedding),
    **dict.fromkeys(("reduce_sum", "reduce_mean", "reduce_max"), _reduction),
}

COMPUTE_OPS = tuple(n for n, s in OPERATORS.items() if s.kind is OpKind.COMPUTE)


def op_instances(ops: Sequence[str] = COMPUTE_OPS) -> st.SearchStrategy[OpInstance]:
    """Valid logical instances of the given compute operators (default: all of them)."""
    missing = [op for op in ops if op not in _INSTANCES]
    if missing:
        raise ValueError(f"no instance strategy for {missing}")
    return st.sampled_from(tuple(ops)).flatmap(lambda op: _INSTANCES[op](op))


@st.composite
def parallelizations(
    draw, instance: OpInstance, max_tasks: int = 16
) -> tuple[ParallelTensorShape, ...]:
    """A legal parallelization of ``instance``'s inputs: degrees on the operator's splittable
    axes, partial sums on inputs it is linear in, and the copies that then follow."""
    spec = instance.spec
    logical = spec.infer_logical(instance.params, instance.inputs)
    sig = spec.signature(
        instance.params, tuple(s.sizes for s in instance.inputs), tuple(o.sizes for o in logical)
    )
    tasks = 1
    degrees = {}
    for ax in sig.axes:
        # An axis no input varies along (a broadcast's new dimension) takes its degree from
        # no input, so it stays whole.
        extent = ax.size or next(
            (instance.inputs[i].sizes[d] for i, d in enumerate(ax.inputs) if d is not None), 1
        )
        options = [d for d in DEGREES if extent % d == 0 and tasks * d <= max_tasks]
        degrees[ax.name] = draw(st.sampled_from(options))
        tasks *= degrees[ax.name]
    n = len(instance.inputs)
    sums = [1] * n
    if sig.joint and sig.linear_in:
        s = draw(st.sampled_from([1, 2] if tasks * 2 <= max_tasks else [1]))
        sums = [s] * n
        tasks *= s
    else:
        for i in sig.linear_in:
            sums[i] = draw(st.sampled_from([1, 2] if tasks * 2 <= max_tasks else [1]))
            tasks *= sums[i]
    copies = draw(st.sampled_from([1, 2]))
    shapes = []
    for i, s in enumerate(instance.inputs):
        degs = [1] * s.rank
        need = 1
        for ax in sig.axes:
            if ax.inputs[i] is None:
                need *= degrees[ax.name]
            else:
                degs[ax.inputs[i]] = degrees[ax.name]
        if not sig.joint:
            need *= math.prod(sums[j] for j in sig.linear_in if j != i)
        shapes.append(
            ParallelTensorShape.of(
                s.sizes, s.dtype, degrees=degs, copy_degree=copies * need, sum_degree=sums[i]
            )
        )
    return tuple(shapes)


# --------------------------------------------------------------------------------------------
# small PCGs
# --------------------------------------------------------------------------------------------

DEFAULT_PCG_OPS = (
    "matmul",
    "relu",
    "tanh",
    "add",
    "mul",
    "scale",
    "transpose",
    "concat",
    "partition",
    "combine",
    "replicate",
    "reduce",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "discard_copies",
    "to_partial",
    "stack_partial",
)


def _pick(draw, tensors: list[Tensor], pred=lambda t: True) -> Tensor | None:
    pool = [t for t in tensors if pred(t)]
    return draw(st.sampled_from(pool)) if pool else None


def _try_add(draw, b: PCGBuilder, tensors: list[Tensor], op: str, degrees: Sequence[int]) -> None:
    """Adds one random ``op`` node over existing tensors, if a legal one can be drawn."""
    spec = get_op(op)
    degree = draw(st.sampled_from(tuple(degrees)))
    t = _pick(draw, tensors)
    if t is None:
        return
    s = t.shape
    args: tuple[Tensor, ...] = (t,)
    params: dict = {}
    if op == "matmul":
        if s.rank < 1 or s.dtype.is_integer:
            return
        n = draw(st.sampled_from((2, 4, 6)))
        w = b.weight((s.sizes[-1], n))
        # Copy the weight as the operand's splits require, so that data parallelism is drawn often.
        w_copies = s.copy_degree * math.prod(s.degrees[:-1]) * s.sum_degree
        if s.degrees[-1] > 1:
            w = b.partition(w, dim=0, degree=s.degrees[-1])
        if w_copies > 1:
            w = b.replicate(w, degree=w_copies)
        args = (t, w)
    elif isinstance(spec, BinaryElementwise) or op in ("concat", "stack_partial"):
        other = _pick(draw, tensors, lambda u: u.shape == s)
        args = (t, other)
        if op == "concat":
            params = {"axis": draw(st.integers(0, max(0, s.rank - 1)))}
    elif op == "scale":
        params = {"factor": 0.5}
    elif op == "transpose":
        params = {"perm": tuple(draw(st.permutations(range(s.rank))))}
    elif op in ("partition", "reduce_scatter", "combine", "all_gather"):
        if s.rank == 0:
            return
        params = {"dim": draw(st.integers(0, s.rank - 1)), "degree": degree}
    elif op in ("replicate", "reduce", "all_reduce", "discard_copies", "to_partial"):
        params = {"degree": degree}
    elif op == "all_to_all":
        if s.rank < 2:
            return
        src, dst = draw(st.permutations(range(s.rank)))[:2]
        params = {"src_dim": src, "dst_dim": dst, "degree": degree}
    elif spec.kind is OpKind.COMPUTE and spec.min_inputs != 1:
        return
    try:
        out = b.apply(op, *args, **params)
    except PCGError:
        return  # not legal here (shape, degree or replica kind); draw something else
    tensors.extend(out if isinstance(out, tuple) else (out,))


@st.composite
def small_pcgs(
    draw,
    *,
    max_ops: int = 8,
    ops: Sequence[str] = DEFAULT_PCG_OPS,
    degrees: Sequence[int] = (2,),
    input_sizes: st.SearchStrategy[tuple[int, ...]] | None = None,
) -> PCG:
    """Valid PCGs of up to ``max_ops`` operator nodes over one or two inputs, mixing compute and
    parallelization operators with the given degrees. The output is the last tensor made."""
    b = PCGBuilder()
    if input_sizes is None:
        input_sizes = sizes(2, 2, st.sampled_from((2, 4, 8)))
    first = draw(input_sizes)
    tensors = [b.input(first, name="x")]
    if draw(st.booleans()):
        tensors.append(b.input(first, name="y"))
    for _ in range(draw(st.integers(1, max_ops))):
        _try_add(draw, b, tensors, draw(st.sampled_from(tuple(ops))), degrees)
    return b.build(tensors[-1])


@st.composite
def towers(
    draw,
    *,
    max_towers: int = 4,
    max_depth: int = 3,
    degrees: Sequence[int] = (1, 2, 4),
    rows: int = 8,
) -> PCG:
    """Branchy PCGs: an input (optionally through a first layer) feeding 1 to ``max_towers``
    independent towers of up to ``max_depth`` dense layers (MatMul by a weight, then ReLU or
    tanh; towers may nest a fork of their own), each tower split over its own degree from
    ``degrees`` (Partition of the rows, replicated weights, Combine back), joined by a sum or
    a concatenation, ending in a sum to a scalar. What the machine-mapping DP places side by
    side."""
    b = PCGBuilder()
    width = draw(st.sampled_from((4, 8, 16)))
    x = b.input((rows, width), name="x")
    if draw(st.booleans()):
        x = b.relu(b.matmul(x, b.weight((width, width))))

    def tower(t: Tensor, depth: int) -> Tensor:
        degree = draw(st.sampled_from(tuple(d for d in degrees if rows % d == 0)))
        if degree > 1:
            t = b.partition(t, dim=0, degree=degree)
        for _ in range(draw(st.integers(1, depth))):
            w = b.weight((width, width))
            if degree > 1:
                w = b.replicate(w, degree=degree)
            t = b.matmul(t, w)
            t = b.relu(t) if draw(st.booleans()) else b.tanh(t)
        if degree > 1:
            t = b.combine(t, dim=0, degree=degree)
        if depth > 1 and draw(st.integers(0, 3)) == 0:  # a fork inside the tower
            t = b.add(tower(t, depth - 1), tower(t, depth - 1))
        return t

    outs = [tower(x, max_depth) for _ in range(draw(st.integers(1, max_towers)))]
    if len(outs) > 1 and draw(st.booleans()):
        joined = b.concat(*outs, axis=1)
    else:
        joined = outs[0]
        for o in outs[1:]:
            joined = b.add(joined, o)
    return b.build(b.reduce_sum(joined, axes=(0, 1)))


def feeds(pcg: PCG, dtype: type = np.float64) -> st.SearchStrategy[dict[str, np.ndarray]]:
    """Values for the Input and Weight nodes of ``pcg`` (drawn by seed, so they shrink poorly but
    are valid: indices in range, statistics positive)."""
    return st.integers(0, 2**32 - 1).map(lambda seed: random_feeds(pcg, seed, dtype))


@dataclass(frozen=True)
class Placement:
    """A parallelism placement as plain data (P^2 section 3.1): ``rows[i][j]`` splits axis ``i``
    at level ``j``; ``axes`` are the row products, ``hierarchy`` the column products."""

    hierarchy: tuple[int, ...]
    axes: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...]
    reduce_axes: tuple[int, ...]


def _split_into(draw, n: int, parts: int) -> tuple[int, ...]:
    """A random ordered factorization of ``n`` into ``parts`` factors."""
    out = [1] * parts
    for p in _factor(n):
        out[draw(st.integers(0, parts - 1))] *= p
    return tuple(out)


@st.composite
def placements(draw, *, max_devices: int = 16, max_levels: int = 3, max_axes: int = 3) -> Placement:
    """Small machine hierarchies (level counts of factors 2 and 3, at most ``max_devices``
    devices), parallelism axes, one matrix placing them, and a non-empty set of axes to reduce
    over."""
    levels = draw(st.integers(1, max_levels))
    hierarchy: list[int] = []
    for _ in range(levels):
        room = max_devices // max(1, math.prod(hierarchy))
        choices = [c for c in (1, 2, 3, 4) if c <= room]
        hierarchy.append(draw(st.sampled_from(choices)))
    num_axes = draw(st.integers(1, max_axes))
    columns = [_split_into(draw, count, num_axes) for count in hierarchy]
    rows = tuple(tuple(col[i] for col in columns) for i in range(num_axes))
    axes = tuple(math.prod(r) for r in rows)
    reduce_axes = draw(
        st.lists(st.integers(0, num_axes - 1), min_size=1, max_size=num_axes, unique=True)
    )
    return Placement(tuple(hierarchy), axes, rows, tuple(sorted(reduce_axes)))


def flat_machine(
    devices: int, *, bandwidth: float = 10e9, latency: float = 5e-6, peak_flops: float = 15e12
) -> Machine:
    """A one-level machine of ``devices`` 15-TFLOP (``peak_flops``), 16 GiB GPUs joined by
    one link (bytes per second, seconds): the smallest hierarchy the cost model and the mapping
    DP run on. With slow devices and a fast link, parallelism pays for the smallest models."""
    device = DeviceSpec(
        name="gpu",
        peak_flops={"f32": peak_flops},
        memory_bandwidth_Bps=900e9,
        memory_bytes=16 * 2**30,
    )
    return Machine(
        (Level("gpu", devices, Link(bandwidth, latency)),), device, name=f"flat{devices}"
    )


#: Values a malformed document puts where a well-formed one has something else: wrong types,
#: empty and absurd sizes, NaN and infinities, the empty name, deep nesting.
ODD_JSON_VALUES = (
    None,
    True,
    0,
    -1,
    2**62 + 1,
    2**63,
    -(2**63),
    2.5,
    float("nan"),
    float("inf"),
    "",
    "x",
    "x:1",
    "x:-1",
    [],
    [0],
    [-3, 4],
    [2**63],
    {},
    {"a": 1},
    [[[[[[[[1]]]]]]]],
)


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def json_mutations(draw, document: object, max_edits: int = 3) -> object:
    """``document`` (JSON data: dicts, lists, scalars) with 1 to ``max_edits`` edits at random
    places: a value replaced by one of :data:`ODD_JSON_VALUES` or by another part of the
    document, a key or list item deleted, an item duplicated. For fuzzing readers of files:
    what comes out must be a clean error or a valid result."""
    import copy

    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, max_edits))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(("replace", "delete", "duplicate", "graft")))
        if not path:
            if kind == "replace":
                doc = copy.deepcopy(draw(st.sampled_from(ODD_JSON_VALUES)))
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        last = path[-1]
        if kind == "replace":
            parent[last] = copy.deepcopy(draw(st.sampled_from(ODD_JSON_VALUES)))
        elif kind == "graft":
            parent[last] = copy.deepcopy(_get(doc, draw(st.sampled_from(paths))))
        elif kind == "delete":
            del parent[last]
        elif isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
    return doc


def _get(doc: object, path: tuple) -> object:
    for key in path:
        doc = doc[key]  # type: ignore[index]
    return doc
