"""Elementwise operators: activations and other functions of one tensor (exp, log, sqrt, erf,
pow, ...), Dropout, Scale, Cast, broadcasting Add / Sub / Mul / Div / Maximum / Compare, and Where.

Masks are float tensors: :class:`Compare` gives 1.0 where its relation holds and 0.0 elsewhere,
and :class:`Where` picks where its condition is non-zero. So a boolean tensor of a model (an
attention mask) is a 0/1 float tensor of the PCG, whose logical operators are exact arithmetic
on it (and: mul, or: maximum, not: ``compare(x, 0, "eq")``)."""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np

from pcgopt.errors import ShapeError
from pcgopt.ops.arrays import array_module
from pcgopt.ops.params import Param, ParamType
from pcgopt.ops.spec import AxisKind, ComputeOp, LocalContext, LoopAxis, Signature
from pcgopt.shapes import DType, ParallelTensorShape
from pcgopt.sharded import ShardedArray, to_blocks


def require_float(op: str, name: str, shape: ParallelTensorShape) -> None:
    if shape.dtype.is_integer:
        raise ShapeError(f"{op} needs a floating-point {name}, got {shape.dtype.value}")


def same_dtype(op: str, names: tuple[str, ...], shapes: tuple[ParallelTensorShape, ...]) -> None:
    dtypes = {s.dtype for s in shapes}
    if len(dtypes) > 1:
        listed = ", ".join(f"{n}: {s.dtype.value}" for n, s in zip(names, shapes, strict=False))
        raise ShapeError(f"{op} needs inputs of one dtype, got {listed}")


def identity_axes(rank: int, n_inputs: int = 1, n_outputs: int = 1) -> tuple[LoopAxis, ...]:
    """One PARALLEL axis per dimension, the same dimension in every input and output."""
    return tuple(
        LoopAxis(f"d{k}", AxisKind.PARALLEL, (k,) * n_inputs, (k,) * n_outputs) for k in range(rank)
    )


class UnaryElementwise(ComputeOp):
    """Base of ``y = f(x)`` applied to every element."""

    input_names = ("x",)
    #: f(a + b) = f(a) + f(b): partial sums may flow through.
    linear: ClassVar[bool] = False
    flops_per_element: ClassVar[int] = 1

    @abstractmethod
    def fn(self, params, x: np.ndarray) -> np.ndarray: ...

    def infer_logical(self, params, inputs):
        require_float(self.name, "input", inputs[0])
        return (inputs[0].unpartitioned(),)

    def signature(self, params, in_sizes, out_sizes):
        return Signature(identity_axes(len(in_sizes[0])), linear_in=(0,) if self.linear else ())

    def reference(self, params, x):
        return (self.fn(params, x),)

    def evaluate(self, params, inputs, outputs):
        # Every element is independent, so all shards are computed in one numpy call.
        return (ShardedArray(outputs[0], self.fn(params, inputs[0].data)),)

    def count_flops(self, params, in_sizes, out_sizes):
        return self.flops_per_element * math.prod(out_sizes[0])


class ReLU(UnaryElementwise):
    """max(x, 0)."""

    name = "relu"

    def fn(self, params, x):
        return array_module(x).maximum(x, 0)


class GELU(UnaryElementwise):
    """GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (as in GPT-2/Megatron)."""

    name = "gelu"
    flops_per_element = 8

    def fn(self, params, x):
        xp = array_module(x)
        return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class Sigmoid(UnaryElementwise):
    """1 / (1 + exp(-x))."""

    name = "sigmoid"
    flops_per_element = 4

    def fn(self, params, x):
        # The same function as 1 / (1 + exp(-x)), without overflow in exp.
        return 0.5 * (1.0 + array_module(x).tanh(0.5 * x))


class Tanh(UnaryElementwise):
    """tanh(x)."""

    name = "tanh"
    flops_per_element = 4

    def fn(self, params, x):
        return array_module(x).tanh(x)


def _outside_domain() -> np.errstate:
    """numpy's warnings silenced where an operator is undefined (log, sqrt of a negative; 1/0):
    the result is NaN or inf, as in JAX, and the evaluator compares it as a value."""
    return np.errstate(divide="ignore", invalid="ignore")


class GELUExact(UnaryElementwise):
    """GELU, exact form: x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))) (PyTorch's and BERT's default).
    It differs from the tanh form :class:`GELU` by up to about 5e-4."""

    name = "gelu_erf"
    flops_per_element = 8

    def fn(self, params, x):
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _erf(x: Any) -> Any:
    xp = array_module(x)
    if xp is np:
        return _np_erf(x)
    return _jax_erf()(x)


@functools.cache
def _jax_erf() -> Any:
    """``lax.erf`` with its derivative written out: JAX 0.12's own derivative evaluates a
    polynomial whose constant coefficients shard_map's check of varying axes rejects when x
    varies along several mesh axes (a data-parallel plan on a 2 x 2 mesh)."""
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def erf(x: Any) -> Any:
        return jax.lax.erf(x)

    @erf.defjvp
    def erf_jvp(primals: Any, tangents: Any) -> Any:
        (x,), (dx,) = primals, tangents
        return erf(x), dx * (2.0 / math.sqrt(math.pi)) * jnp.exp(-x * x)

    return erf


def _np_erf(x: np.ndarray) -> np.ndarray:
    # math.erf is exact to the last bit of a double; vectorized, it is fast enough for the
    # reference evaluator's small tensors.
    x = np.asarray(x)
    return np.frompyfunc(math.erf, 1, 1)(x).astype(x.dtype if x.dtype.kind == "f" else float)


class Erf(UnaryElementwise):
    """The error function erf(x)."""

    name = "erf"
    flops_per_element = 8

    def fn(self, params, x):
        return _erf(x)


class Exp(UnaryElementwise):
    """exp(x)."""

    name = "exp"
    flops_per_element = 4

    def fn(self, params, x):
        return array_module(x).exp(x)


class Log(UnaryElementwise):
    """Natural logarithm (NaN below 0, -inf at 0, as in numpy)."""

    name = "log"
    flops_per_element = 4

    def fn(self, params, x):
        with _outside_domain():
            return array_module(x).log(x)


class Sqrt(UnaryElementwise):
    """Square root (NaN below 0)."""

    name = "sqrt"
    flops_per_element = 4

    def fn(self, params, x):
        with _outside_domain():
            return array_module(x).sqrt(x)


class Rsqrt(UnaryElementwise):
    """1 / sqrt(x) (as in RMSNorm)."""

    name = "rsqrt"
    flops_per_element = 5

    def fn(self, params, x):
        with _outside_domain():
            return 1.0 / array_module(x).sqrt(x)


class Reciprocal(UnaryElementwise):
    """1 / x."""

    name = "reciprocal"

    def fn(self, params, x):
        with _outside_domain():
            return 1.0 / x


class Neg(UnaryElementwise):
    """-x."""

    name = "neg"
    linear = True

    def fn(self, params, x):
        return -x


class Pow(UnaryElementwise):
    """x ** exponent, for a constant exponent (NaN for a negative x and a fractional exponent)."""

    name = "pow"
    params = (Param("exponent", ParamType.FLOAT),)
    flops_per_element = 2

    def fn(self, params, x):
        e = params["exponent"]
        if float(e).is_integer() and abs(e) <= 4:
            # x*x and x*x*x, as exporters' Pow(x, 2) and Pow(x, 3) compute them.
            n = int(abs(e))
            y = array_module(x).ones_like(x) if n == 0 else x
            for _ in range(n - 1):
                y = y * x
            if e >= 0:
                return y
            with _outside_domain():
                return 1.0 / y
        with _outside_domain():
            return array_module(x).power(x, e)


def dropout_mask(
    rate: float,
    seed: int,
    sizes: tuple[int, ...],
    starts: tuple[Any, ...] | None = None,
    block: tuple[int, ...] | None = None,
    xp: Any = None,
) -> Any:
    """The kept-and-rescaled mask of a dropout over a tensor of ``sizes``: 1/(1-rate) where an
    element is kept, 0 where it is dropped; with ``starts`` and ``block``, only the block of that
    size starting there (``starts`` may be traced JAX values; the mask is then a JAX array).

    Whether an element is kept depends only on ``seed`` and the element's row-major position
    in the whole tensor: a 32-bit integer hash of the two (the ``lowbias32`` mixer), read as a
    uniform number in [0, 1) and kept when it is at least ``rate``. So any block of the tensor
    computes its own part of the mask, on any device, without the whole mask (a counter-based
    random stream, as Megatron-LM's model-parallel RNG provides). Positions are taken modulo
    2**32. ``xp``: the array namespace to compute in (default: JAX's if a start is traced,
    else numpy's)."""
    if xp is None:
        xp = array_module(*starts) if starts is not None else np
    block = tuple(sizes) if block is None else tuple(block)
    starts = (0,) * len(sizes) if starts is None else tuple(starts)
    u32 = xp.uint32
    position = xp.zeros(block, dtype=u32)
    stride = 1
    for k in range(len(sizes) - 1, -1, -1):
        shape = [1] * len(block)
        shape[k] = block[k]
        index = xp.arange(block[k], dtype=u32).reshape(shape) + xp.asarray(starts[k]).astype(u32)
        position = position + index * u32(stride % 2**32)
        stride *= sizes[k]
    h = position ^ u32((seed * 0x85EBCA77 + 0xD409) % 2**32)
    h = h ^ (h >> u32(16))
    h = h * u32(0x7FEB352D)
    h = h ^ (h >> u32(15))
    h = h * u32(0x846CA68B)
    h = h ^ (h >> u32(16))
    uniform = (h >> u32(8)).astype(xp.float32) * (1.0 / 2**24)
    return xp.where(uniform >= rate, 1.0 / (1.0 - rate), 0.0)


class Dropout(UnaryElementwise):
    """Dropout with a mask fixed by ``seed``: each element is kept (and scaled by 1/(1-rate))
    or zeroed according to its position in the logical tensor.

    Because the mask depends only on the seed and the element's position, every block, copy and
    partial sum of an element sees the same mask: the operator is linear and commutes with
    splits, but it is never the identity (rewrites cannot drop it). Devices running it must
    share the dropout random stream, as Megatron-LM's model-parallel RNG does.
    """

    name = "dropout"
    linear = True
    params = (Param("rate", ParamType.FLOAT, 0.1), Param("seed", ParamType.NONNEG_INT, 0))

    def infer_logical(self, params, inputs):
        if not 0.0 <= params["rate"] < 1.0:
            raise ShapeError(f"dropout rate must be in [0, 1), got {params['rate']}")
        return super().infer_logical(params, inputs)

    def fn(self, params, x):
        xp = array_module(x)
        mask = dropout_mask(params["rate"], params["seed"], x.shape, xp=xp)
        return x * (mask if xp is np else mask.astype(x.dtype))

    def local(self, params, ctx: LocalContext, x):
        # A block's mask is the whole tensor's mask at the block's position.
        sizes = ctx.global_in_sizes[0]
        starts = tuple(ctx.offset(f"d{k}") for k in range(len(sizes)))
        mask = dropout_mask(params["rate"], params["seed"], sizes, starts, x.shape)
        return (x * mask.astype(x.dtype),)

    def evaluate(self, params, inputs, outputs):
        (x,) = inputs
        mask = dropout_mask(params["rate"], params["seed"], x.shape.sizes)
        blocks = to_blocks(mask[None], x.shape.degrees)  # the mask laid out like the shards
        return (ShardedArray(outputs[0], x.data * blocks),)


class Scale(UnaryElementwise):
    """x * factor, for a constant factor (e.g. 1/sqrt(head_dim) in attention)."""

    name = "scale"
    linear = True
    params = (Param("factor", ParamType.FLOAT),)

    def fn(self, params, x):
        return x * params["factor"]


def broadcast_sizes(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting of two shapes, with an error naming both."""
    rank = max(len(a), len(b))
    a1, b1 = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    out = []
    for k, (x, y) in enumerate(zip(a1, b1, strict=True)):
        if x != y and 1 not in (x, y):
            raise ShapeError(
                f"{op}: sizes {list(a)} and {list(b)} do not broadcast (dimension {k} of the "
                f"result: {x} vs {y})"
            )
        out.append(max(x, y))
    return tuple(out)


class BroadcastingElementwise(ComputeOp):
    """Base of ``z = f(a, b, ...)`` applied to every element, with numpy broadcasting."""

    linear_inputs: ClassVar[tuple[int, ...]] = ()
    jointly_linear: ClassVar[bool] = False

    def infer_logical(self, params, inputs):
        same_dtype(self.name, self.input_names, inputs)
        sizes = inputs[0].sizes
        for s in inputs[1:]:
            sizes = broadcast_sizes(self.name, sizes, s.sizes)
        return (ParallelTensorShape.of(sizes, inputs[0].dtype),)

    def signature(self, params, in_sizes, out_sizes):
        out = out_sizes[0]
        axes = []
        for k, size in enumerate(out):
            dims = []
            for s in in_sizes:
                j = k - (len(out) - len(s))
                # A dimension broadcast from size 1 does not vary along the axis.
                dims.append(j if j >= 0 and (s[j] == size) else None)
            axes.append(LoopAxis(f"d{k}", AxisKind.PARALLEL, tuple(dims), (k,)))
        return Signature(tuple(axes), self.linear_inputs, self.jointly_linear)

    def count_flops(self, params, in_sizes, out_sizes):
        return math.prod(out_sizes[0])


class BinaryElementwise(BroadcastingElementwise):
    """Base of ``z = f(x, y)`` with numpy broadcasting."""

    input_names = ("x", "y")

    @abstractmethod
    def fn(self, x: np.ndarray, y: np.ndarray) -> np.ndarray: ...

    def reference(self, params, x, y):
        return (self.fn(x, y),)


class Add(BinaryElementwise):
    """x + y (broadcasting)."""

    name = "add"
    commutative = True
    linear_inputs = (0, 1)
    jointly_linear = True  # (x1 + x2) + (y1 + y2) = (x1 + y1) + (x2 + y2)

    def fn(self, x, y):
        return x + y


class Mul(BinaryElementwise):
    """x * y (broadcasting)."""

    name = "mul"
    commutative = True
    linear_inputs = (0, 1)  # bilinear: (x1 + x2) * y = x1 * y + x2 * y

    def fn(self, x, y):
        return x * y


class Sub(BinaryElementwise):
    """x - y (broadcasting)."""

    name = "sub"
    linear_inputs = (0, 1)
    jointly_linear = True  # (x1 + x2) - (y1 + y2) = (x1 - y1) + (x2 - y2)

    def fn(self, x, y):
        return x - y


class Div(BinaryElementwise):
    """x / y (broadcasting). Linear in x only: partial sums of x may flow through."""

    name = "div"
    linear_inputs = (0,)

    def fn(self, x, y):
        with _outside_domain():
            return x / y


class Maximum(BinaryElementwise):
    """Elementwise maximum of x and y (broadcasting)."""

    name = "maximum"
    commutative = True

    def fn(self, x, y):
        return array_module(x, y).maximum(x, y)


_RELATIONS = {
    "eq": "equal",
    "ne": "not_equal",
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
}


class Compare(BinaryElementwise):
    """1.0 where ``x relation y`` holds, else 0.0 (broadcasting; relation: eq, ne, lt, le, gt,
    ge). A mask in the inputs' float type, as pcgopt holds masks (module docstring); its
    gradient is zero."""

    name = "compare"
    params = (Param("relation", ParamType.STR, "eq", tuple(_RELATIONS)),)

    def infer_logical(self, params, inputs):
        for name, shape in zip(self.input_names, inputs, strict=True):
            require_float(self.name, name, shape)
        return super().infer_logical(params, inputs)

    def reference(self, params, x, y):
        xp = array_module(x, y)
        holds = getattr(xp, _RELATIONS[params["relation"]])(x, y)
        dtype = np.result_type(x, y) if xp is np else xp.result_type(x, y)
        return (holds.astype(dtype),)


class Where(BroadcastingElementwise):
    """``x`` where ``cond`` is non-zero, else ``y`` (broadcasting; a mask fill such as
    ``masked_fill(mask, -inf)``). Exact for every value of ``x`` and ``y``, infinities
    included, unlike the arithmetic ``cond * x + (1 - cond) * y``."""

    name = "where"
    input_names = ("cond", "x", "y")

    def reference(self, params, cond, x, y):
        return (array_module(cond, x, y).where(cond != 0, x, y),)


class Cast(ComputeOp):
    """``x`` converted to the floating-point ``dtype``: integers (token ids, an integer
    attention mask) become floats, so that they can enter arithmetic. A cast between float
    types changes only the storage (the reference evaluator computes in one precision)."""

    name = "cast"
    input_names = ("x",)
    params = (Param("dtype", ParamType.DTYPE, DType.F32, doc="the floating-point result type"),)

    def infer_logical(self, params, inputs):
        (x,) = inputs
        if params["dtype"].is_integer:
            raise ShapeError(
                f"cast converts to a floating-point dtype (f16, bf16, f32, f64), not "
                f"{params['dtype'].value}"
            )
        return (ParallelTensorShape.of(x.sizes, params["dtype"]),)

    def signature(self, params, in_sizes, out_sizes):
        return Signature(identity_axes(len(in_sizes[0])))

    def reference(self, params, x):
        if array_module(x) is np:
            # The evaluator computes every float in one precision: integers become float64.
            return (x if x.dtype.kind == "f" else x.astype(np.float64),)
        return (x.astype(_JAX_FLOAT[params["dtype"]]),)

    def count_flops(self, params, in_sizes, out_sizes):
        return math.prod(out_sizes[0])


_JAX_FLOAT = {
    DType.F16: "float16",
    DType.BF16: "bfloat16",
    DType.F32: "float32",
    DType.F64: "float64",
}
