"""JAX functions as PCGs: traced with ``jax.make_jaxpr`` and mapped primitive by primitive.

>>> import jax.numpy as jnp                                       # doctest: +SKIP
>>> def mlp(params, x):                                           # doctest: +SKIP
...     return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"]
>>> m = from_jax(mlp, params, jnp.zeros((64, 784)), params=(0,))  # doctest: +SKIP

The arguments at the positions in ``params`` are the model's parameters: every array leaf of
them becomes a Weight named by its path in the pytree (``w1``, ``layers/0/kernel``); every leaf
of the other arguments becomes an Input named after the function's parameter and the leaf's
path (``x``, ``batch/tokens``). Nodes are named after the JAX name stack (``jax.named_scope``,
Flax module paths) and the primitive, e.g. ``layer1/dot_general``. Calls (``pjit``,
``custom_jvp_call``, ``custom_vjp_call``, ``remat``) are inlined. Unsupported primitives raise
one :class:`~pcgopt.FrontendError` that lists them all, with counts and first names.

Integer arguments are indices (token ids, labels): non-negative, each bounded by the rows of
the table it indexes. ``table[i]`` and ``jnp.take(x, i, axis)`` become embeddings (of the
slices along the axis); ``jax.nn.one_hot(i, n)`` a lookup in the identity;
``take_along_axis(x, i[..., None], -1)`` (a cross-entropy's pick of the label's
log-probability) the sum of ``x`` times that one-hot, so a function that ends in its loss is
imported with the loss. An integer argument cast to float is a mask (an attention mask): plans
are checked with it drawn from {0, 1}. Integer arithmetic on indices is not held by the PCG:
jnp's wrap of negative indices is dropped (they are non-negative), anything else that reads it
is listed as unsupported.

Booleans are 0/1 float masks: comparisons are ``compare``, ``jnp.where`` on a computed
condition is ``where`` (on a constant one, exact arithmetic ``x * keep + fill``), and ``&``,
``|``, ``~`` are exact arithmetic on masks. Also mapped: ``lax.top_k`` and ``argmax`` (a
``top_k`` of one), ``jnp.pad`` (constant), transposed convolutions (input dilation) and SAME
padding, gathers at constant positions along one axis (``jax.image.resize``'s nearest: a
slice, a repeat or a product with their one-hot rows). Softmax, LayerNorm and GELU, which JAX
writes out, are recognized as pcgopt's operators by
:func:`~pcgopt.frontend.patterns.fuse_patterns`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.errors import FrontendError, PCGError
from pcgopt.frontend.model import (
    UNBOUNDED,
    ImportedModel,
    Masks,
    UniqueNames,
    UnsupportedLog,
    as_float,
    binary,
    bind_integer_inputs,
    broadcast_to,
    identity_table,
    lookup,
    masked,
    pad_or_slice,
    padded_conv2d,
    resample,
    reshape_to,
)
from pcgopt.frontend.patterns import fuse_patterns
from pcgopt.shapes import DType

__all__ = ["from_jax", "supported_primitives"]

_DTYPES = {
    "float32": DType.F32,
    "float64": DType.F64,
    "float16": DType.F16,
    "bfloat16": DType.BF16,
    "int32": DType.I32,
    "int64": DType.I64,
}


class _Unsupported(Exception):
    pass


class _Skipped:
    pass


_SKIPPED = _Skipped()


class _Unrepresented:
    """An integer value computed from integer tensors, which the PCG does not hold: fine while
    nothing reads it (jnp's wrap of negative indices, ``select_n(i < 0, i, i + n)``, discards
    it). ``recipe``: the float arithmetic (``(op, operands, label)``) that computes it exactly
    (below 2**24) where it must be held, as when an integer mask is multiplied with another
    (Flax's ``make_attention_mask``) before it is cast to float."""

    def __init__(self, why: str, recipe: tuple[str, list, str] | None = None) -> None:
        self.why = why
        self.recipe = recipe
        self.value: Tensor | None = None


#: Integer arithmetic that an integer mask may go through, as pcgopt operators on floats.
_INT_ARITHMETIC = {"mul": "mul", "add": "add", "sub": "sub", "max": "maximum"}


class _OneHot:
    """``indices[..., None] == arange(n)``: becomes a float one-hot when converted to one."""

    def __init__(self, indices: Tensor, n: int) -> None:
        self.indices, self.n = indices, n


# Primitives that read integer tensors (indices) or the values above; every other one given an
# integer tensor yields an unrepresented value.
_INDEX_AWARE = frozenset(
    {"gather", "eq", "ne", "lt", "le", "gt", "ge", "select_n", "broadcast_in_dim", "reshape",
     "squeeze", "expand_dims", "slice", "transpose", "concatenate", "convert_element_type",
     "copy", "copy_p", "stop_gradient", "optimization_barrier"}
)  # fmt: skip


class _Importer:
    def __init__(self) -> None:
        self.b = PCGBuilder()
        self.weights: dict[str, np.ndarray] = {}
        self.name = UniqueNames()
        self.unsupported = UnsupportedLog()
        self.masks = Masks()
        #: The equation being mapped (its handler may read the types of its operands).
        self.eqn: Any = None
        self.counts: dict[str, int] = {}
        # id of a constant -> its Weight, and the constant (kept alive so the id stays its own).
        self.consts: dict[int, tuple[Tensor, Any]] = {}

    def tensor(self, v: Any, owner: str) -> Tensor:
        if isinstance(v, Tensor):
            return v
        value = np.asarray(v)
        if value.dtype.kind not in "fb":
            raise _Unsupported(f"a {value.dtype} constant reaches a tensor operator")
        key = id(v)
        if key not in self.consts:
            shape = value.shape or (1,)
            t = self.b.weight(shape, DType.F32, name=self.name(f"{owner}/const"), trainable=False)
            self.weights[t.ref.node] = value.astype(np.float32).reshape(shape)
            self.consts[key] = (t, v)
            if value.dtype.kind == "b":
                self.masks.add(t)  # a boolean constant: a 0/1 float mask
        return self.consts[key][0]

    def as_float(self, v: Any) -> Any:
        """Integer arithmetic (an :class:`_Unrepresented` with a recipe) held as float
        operators on its operands cast to float; integer tensors cast; constants as floats."""
        if isinstance(v, _OneHot):
            raise _Unsupported("reads a boolean one-hot")
        if isinstance(v, Tensor):
            return as_float(self.b, v, self.name(f"{v.ref.node}/as_float"))
        if not isinstance(v, _Unrepresented):
            return np.asarray(v, np.float32)
        if v.recipe is None:
            raise _Unsupported(f"reads {v.why}")
        if v.value is None:
            op, operands, label = v.recipe
            args = [self.as_float(a) for a in operands]
            v.value = binary(
                self.b,
                op,
                *args,
                self.name(label),
                scalar=_scalar,
                tensor=lambda a, slot: self.tensor(a, label),
            )
        return v.value

    def constants(self, owner: str) -> Callable[[np.ndarray, str], Tensor]:
        """Tensors for the constants a handler adds (a zero to compare with)."""
        return lambda value, role: self.tensor(np.asarray(value, np.float32), f"{owner}/{role}")

    def in_dtype(self, k: int) -> np.dtype:
        """The JAX type of operand ``k`` of the equation being mapped."""
        return np.dtype(self.eqn.invars[k].aval.dtype)

    def run_jaxpr(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], scope: str) -> list:
        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            if type(v).__name__ == "Literal":
                return np.asarray(v.val)
            return env[v]

        for var, c in zip(jaxpr.constvars, consts, strict=True):
            env[var] = np.asarray(c)
        for var, a in zip(jaxpr.invars, args, strict=True):
            env[var] = a
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            prim = eqn.primitive.name
            stack = str(eqn.source_info.name_stack)
            where = "/".join(p for p in (scope, stack) if p)
            self.counts[prim] = self.counts.get(prim, 0) + 1
            label = f"{where}/{prim}" if where else prim
            if any(x is _SKIPPED for x in ins):
                outs = [_SKIPPED] * len(eqn.outvars)
            elif all(_is_constant(x) for x in ins) and prim not in _CALLS:
                outs = self._fold(eqn, ins, label)
            elif prim not in _CALLS and prim not in _INDEX_AWARE and any(map(_is_index, ins)):
                op = _INT_ARITHMETIC.get(prim)
                recipe = (op, ins, label) if op and len(eqn.outvars) == 1 else None
                outs = [_Unrepresented(f"{prim} of integer tensors", recipe)] * len(eqn.outvars)
            else:
                outs = self._map(eqn, prim, ins, label, where)
            for var, out in zip(eqn.outvars, outs, strict=True):
                env[var] = out
        return [read(v) for v in jaxpr.outvars]

    def _fold(self, eqn: Any, ins: list, label: str) -> list:
        # Every input is a constant: let JAX compute it.
        try:
            outs = eqn.primitive.bind(*ins, **eqn.params)
        except Exception as e:  # JAX raises many types
            self.unsupported.add(eqn.primitive.name, label, f"folding a constant failed: {e}")
            return [_SKIPPED] * len(eqn.outvars)
        outs = outs if eqn.primitive.multiple_results else [outs]
        return [np.asarray(o) for o in outs]

    def _map(self, eqn: Any, prim: str, ins: list, label: str, where: str) -> list:
        if prim in _CALLS:
            inner, consts = _CALLS[prim](eqn.params)
            return self.run_jaxpr(inner, consts, ins, where)
        if prim != "select_n" and any(isinstance(x, _Unrepresented) and x.recipe for x in ins):
            try:
                ins = [self.as_float(x) if isinstance(x, _Unrepresented) else x for x in ins]
            except _Unsupported as e:
                self.unsupported.add(prim, label, str(e))
                return [_SKIPPED] * len(eqn.outvars)
        odd = [x for x in ins if isinstance(x, _Unrepresented | _OneHot)]
        if odd and not (prim == "select_n" or (prim == "convert_element_type" and ins == odd)):
            why = odd[0].why if isinstance(odd[0], _Unrepresented) else "a boolean one-hot"
            self.unsupported.add(prim, label, f"reads {why}")
            return [_SKIPPED] * len(eqn.outvars)
        handler = _HANDLERS.get(prim)
        if handler is None:
            self.unsupported.add(prim, label)
            return [_SKIPPED] * len(eqn.outvars)
        self.eqn = eqn
        try:
            out = handler(self, eqn.params, ins, self.name(label))
            if prim in _MOVES and ins:
                self.masks.follow(ins[0], out)
        except _Unsupported as e:
            self.unsupported.add(prim, label, str(e))
            return [_SKIPPED] * len(eqn.outvars)
        except PCGError as e:
            raise FrontendError(
                f"JAX equation {label!r} ({prim}): {e.message}", node=label
            ) from None
        return list(out) if isinstance(out, list) else [out]


#: Primitives whose output holds elements of their first operand: a mask's stay masks.
_MOVES = frozenset(
    {"broadcast_in_dim", "reshape", "squeeze", "transpose", "slice", "expand_dims", "copy",
     "copy_p", "convert_element_type", "pad"}
)  # fmt: skip


def _closed(params: dict, key: str) -> tuple[Any, Sequence[Any]]:
    closed = params[key]
    return getattr(closed, "jaxpr", closed), getattr(closed, "consts", ())


_CALLS: dict[str, Callable[[dict], tuple[Any, Sequence[Any]]]] = {
    "pjit": lambda p: _closed(p, "jaxpr"),
    "jit": lambda p: _closed(p, "jaxpr"),
    "closed_call": lambda p: _closed(p, "call_jaxpr"),
    "core_call": lambda p: _closed(p, "call_jaxpr"),
    "custom_jvp_call": lambda p: _closed(p, "call_jaxpr"),
    "custom_vjp_call": lambda p: _closed(p, "call_jaxpr" if "call_jaxpr" in p else "fun_jaxpr"),
    "custom_vjp_call_jaxpr": lambda p: _closed(p, "fun_jaxpr"),
    "remat": lambda p: _closed(p, "jaxpr"),
    "checkpoint": lambda p: _closed(p, "jaxpr"),
}

Handler = Callable[[_Importer, dict, list, str], Tensor]
_HANDLERS: dict[str, Handler] = {}


def supported_primitives() -> tuple[str, ...]:
    """Primitives mapped when an input is a traced tensor (calls are inlined; primitives of
    constants only are computed by JAX)."""
    return tuple(sorted({*_HANDLERS, *_CALLS}))


def _is_constant(v: Any) -> bool:
    return not isinstance(v, Tensor | _Unrepresented | _OneHot)


def _is_index(v: Any) -> bool:
    return isinstance(v, _Unrepresented | _OneHot) or (
        isinstance(v, Tensor) and v.shape.dtype.is_integer
    )


def _scalar(v: Any) -> float | None:
    if isinstance(v, Tensor):
        return None
    a = np.asarray(v)
    return float(a.reshape(())) if a.size == 1 else None


def _unary(op: str) -> Handler:
    return lambda imp, p, ins, name: imp.b.apply(op, imp.tensor(ins[0], name), name=name)


for _prim, _op in {
    "exp": "exp",
    "log": "log",
    "tanh": "tanh",
    "logistic": "sigmoid",
    "erf": "erf",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "neg": "neg",
}.items():
    _HANDLERS[_prim] = _unary(_op)


def _identity(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    return imp.tensor(ins[0], name)


for _prim in ("copy", "copy_p", "stop_gradient", "optimization_barrier"):
    _HANDLERS[_prim] = _identity


def _convert(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    kind = np.dtype(p["new_dtype"]).kind
    if isinstance(ins[0], _OneHot) and kind == "f":
        # A one-hot is a lookup in the identity: exact, and partitioned like any embedding.
        idx, n = ins[0].indices, ins[0].n
        flat = reshape_to(imp.b, idx, idx.shape.sizes[:-1], f"{name}/indices")
        eye = imp.tensor(_identity_table(n), f"{name}/identity")
        return imp.b.embedding(flat, eye, name=name)
    if isinstance(ins[0], _OneHot):
        raise _Unsupported("a one-hot converted to a non-float type")
    if isinstance(ins[0], _Unrepresented):
        raise _Unsupported(f"reads {ins[0].why}")
    x = imp.tensor(ins[0], name)
    source = imp.in_dtype(0).kind
    if kind == "b":
        return imp.masks.of(imp.b, x, name, imp.constants(name))
    if kind == "f":
        # Integers become floats; a float or a boolean (a 0/1 float of the PCG) stays.
        return as_float(imp.b, x, name) if source in "iu" else x
    if source in "iu" and kind in "iu":
        return x  # an index stays an index
    raise _Unsupported(f"a conversion of {np.dtype(imp.in_dtype(0))} to {p['new_dtype']}")


_HANDLERS["convert_element_type"] = _convert


def _erfc(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    e = imp.b.erf(imp.tensor(ins[0], name), name=f"{name}/erf")
    return imp.b.sub(imp.tensor(np.float32(1.0), name), e, name=name)


_HANDLERS["erfc"] = _erfc


def _binary(op: str) -> Handler:
    def handle(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
        return binary(
            imp.b, op, *ins, name, scalar=_scalar, tensor=lambda v, slot: imp.tensor(v, name)
        )

    return handle


for _prim, _op in {
    "add": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "max": "maximum",
}.items():
    _HANDLERS[_prim] = _binary(_op)
_HANDLERS["add_any"] = _binary("add")


def _integer_pow(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    return imp.b.pow(imp.tensor(ins[0], name), exponent=float(p["y"]), name=name)


_HANDLERS["integer_pow"] = _integer_pow


def _square(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    return imp.b.pow(imp.tensor(ins[0], name), exponent=2.0, name=name)


_HANDLERS["square"] = _square


def _pow(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    e = _scalar(ins[1])
    if e is None:
        raise _Unsupported("only a constant scalar exponent")
    return imp.b.pow(imp.tensor(ins[0], name), exponent=e, name=name)


_HANDLERS["pow"] = _pow


def _select_n(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    # cases[pred]: with a constant predicate (a mask, or a guard such as jnp.var's against a
    # zero count) it is a choice made now, or a masked tensor; with a computed boolean one, a
    # where (jnp.where, masked_fill).
    pred, cases = ins[0], ins[1:]
    if not _is_constant(pred):
        if len(cases) != 2 or imp.in_dtype(0).kind != "b":
            raise _Unsupported("a computed predicate that is not a boolean of two cases")
        if any(
            isinstance(c, _Unrepresented | _OneHot)
            or (isinstance(c, Tensor) and c.shape.dtype.is_integer)
            for c in cases
        ):
            raise _Unsupported("a choice between integers (index arithmetic)")
        mask = imp.masks.of(imp.b, imp.tensor(pred, name), f"{name}/cond", imp.constants(name))
        chosen = [imp.tensor(c, f"{name}/case{k}") for k, c in ((1, cases[1]), (0, cases[0]))]
        return imp.b.where(mask, *chosen, name=name)
    pred = np.asarray(pred).astype(np.int64)
    if np.all(pred == pred.flat[0]):
        chosen = cases[int(pred.flat[0])]
        if isinstance(chosen, _Unrepresented):
            raise _Unsupported(f"it selects {chosen.why}")
        return chosen if isinstance(chosen, Tensor) else imp.tensor(chosen, name)
    traced = [k for k, c in enumerate(cases) if isinstance(c, Tensor)]
    if len(cases) != 2 or len(traced) != 1:
        if len(cases) == 2 and len(traced) == 2:
            keep = imp.tensor((pred == 1).astype(np.float32), f"{name}/cond")
            return imp.b.where(imp.masks.add(keep), cases[1], cases[0], name=name)
        raise _Unsupported("only where(constant mask, tensor, constant)")
    (k,) = traced
    return masked(
        imp.b,
        cases[k],
        pred == k,
        np.asarray(cases[1 - k], np.float32),
        name,
        lambda v, role: imp.tensor(v, f"{name}/{role}"),
    )


_HANDLERS["select_n"] = _select_n


def _compare(op: str) -> Handler:
    def handle(imp: _Importer, p: dict, ins: list, name: str) -> Any:
        a, b = ins
        if any(isinstance(v, Tensor) and v.shape.dtype.is_integer for v in ins):
            index = _index_comparison(op, a, b)
            if index is not None:
                return index
        # Floats, or integers compared as floats (exact below 2**24): a mask.
        x, y = (
            as_float(imp.b, v, f"{name}/{k}")
            if isinstance(v, Tensor)
            else imp.tensor(np.asarray(v, np.float32), name)
            for k, v in enumerate(ins)
        )
        return imp.masks.add(imp.b.compare(x, y, relation=op, name=name))

    return handle


def _index_comparison(op: str, a: Any, b: Any) -> Any:
    """What a comparison of indices means where it is a pattern of jnp's: indices are
    non-negative (the embedding they feed checks its range), so the test for negative ones is
    a constant; a one-hot encoding compares them with an iota. None for any other."""
    flipped = not isinstance(a, Tensor)
    t, c = (b, a) if flipped else (a, b)
    if not isinstance(t, Tensor) or not _is_constant(c):
        return None
    c = np.asarray(c)
    rel = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}.get(op, op) if flipped else op
    if c.size == 1 and float(c.reshape(())) == 0 and rel in ("lt", "ge"):
        return np.full(t.shape.sizes, rel == "ge")
    n = c.shape[-1] if c.ndim else 0
    if (
        rel == "eq"
        and t.shape.sizes[-1:] == (1,)
        and n > 1
        and c.size == n
        and np.array_equal(c.reshape(-1), np.arange(n))
    ):
        return _OneHot(t, n)
    return None


for _prim in ("eq", "ne", "lt", "le", "gt", "ge"):
    _HANDLERS[_prim] = _compare(_prim)


def _logical(op: str) -> Handler:
    def handle(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
        if imp.in_dtype(0).kind != "b":
            raise _Unsupported(f"bitwise {op} of integers")
        x, *rest = (imp.tensor(v, f"{name}/{k}") for k, v in enumerate(ins))
        y = rest[0] if rest else None
        return imp.masks.logical(imp.b, op, x, y, name, imp.constants(name))

    return handle


for _prim in ("not", "and", "or", "xor"):
    _HANDLERS[_prim] = _logical(_prim)


def _identity_table(n: int) -> np.ndarray:
    try:
        return identity_table(n)
    except ValueError as e:
        raise _Unsupported(str(e)) from None


def _sizes(v: Any) -> tuple[int, ...]:
    return v.shape.sizes if isinstance(v, Tensor) else tuple(np.shape(v))


def _gather(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    table, idx = ins
    dn = p["dimension_numbers"]
    out_shape = tuple(imp.eqn.outvars[0].aval.shape)
    if isinstance(idx, _Unrepresented | _OneHot):
        raise _Unsupported("a gather at indices computed by integer arithmetic")
    table = imp.tensor(table, name)
    rank = table.shape.rank
    single = (
        tuple(dn.start_index_map) == tuple(dn.collapsed_slice_dims)
        and len(dn.start_index_map) == 1
        and _sizes(idx)[-1:] == (1,)
        and not dn.operand_batching_dims
    )
    if single:
        axis = dn.start_index_map[0]
        whole = tuple(1 if d == axis else s for d, s in enumerate(table.shape.sizes))
        lead = _sizes(idx)[:-1]
        if tuple(p["slice_sizes"]) == whole and out_shape == (
            *table.shape.sizes[:axis],
            *lead,
            *table.shape.sizes[axis + 1 :],
        ):
            if not isinstance(idx, Tensor):
                # Constant positions (a nearest-neighbour resize): a product with their
                # one-hot rows, a slice or a repeat where they are one.
                at = np.asarray(idx).reshape(-1).astype(np.int64) % table.shape.sizes[axis]
                picked = np.eye(table.shape.sizes[axis], dtype=np.float32)[at]
                y = resample(imp.b, table, picked, axis, f"{name}/rows", imp.constants(name))
                return reshape_to(imp.b, y, out_shape, name)
            if idx.shape.dtype.is_integer:
                # table[i], jnp.take(x, i, axis): slices at integer indices, an embedding.
                flat = reshape_to(imp.b, idx, lead or (1,), f"{name}/indices")
                return reshape_to(imp.b, lookup(imp.b, table, flat, axis, name), out_shape, name)
    if not isinstance(idx, Tensor) or not idx.shape.dtype.is_integer:
        raise _Unsupported("gathers at constant indices other than along one axis")
    lead = idx.shape.sizes[:-1]
    axis = dn.start_index_map[0] if dn.start_index_map else -1
    batch = table.shape.sizes[:-1]
    if (
        axis == rank - 1
        and tuple(dn.operand_batching_dims) == tuple(range(rank - 1))
        and lead == (*batch, 1)
    ):
        # take_along_axis(x, i[..., None], -1), as a cross-entropy picks the label's
        # log-probability: the sum of x times the label's one-hot, exact for finite x.
        n = table.shape.sizes[-1]
        onehot = imp.b.embedding(
            reshape_to(imp.b, idx, batch, f"{name}/indices"),
            imp.tensor(_identity_table(n), f"{name}/identity"),
            name=f"{name}/one_hot",
        )
        picked = imp.b.mul(table, onehot, name=f"{name}/pick")
        return imp.b.reduce_sum(picked, axes=(rank - 1,), keepdims=True, name=name)
    raise _Unsupported(
        "gathers other than slices along one axis and take_along_axis on the last axis"
    )


_HANDLERS["gather"] = _gather


def _reduce(op: str) -> Handler:
    def handle(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
        x = imp.tensor(ins[0], name)
        axes = tuple(int(a) for a in p["axes"])
        return imp.b.apply(op, x, axes=axes, keepdims=False, name=name)

    return handle


_HANDLERS["reduce_sum"] = _reduce("reduce_sum")
_HANDLERS["reduce_max"] = _reduce("reduce_max")


def _broadcast_in_dim(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    x = imp.tensor(ins[0], name)
    shape, dims = tuple(p["shape"]), tuple(p["broadcast_dimensions"])
    # Put x's dimensions where they go, with 1s elsewhere, then broadcast.
    aligned = [1] * len(shape)
    for d, s in zip(dims, x.shape.sizes, strict=True):
        aligned[d] = s
    if sorted(dims) != list(dims):
        raise _Unsupported("broadcast_in_dim that reorders dimensions")
    y = reshape_to(imp.b, x, tuple(aligned), f"{name}/reshape")
    return broadcast_to(imp.b, y, shape, name)


_HANDLERS["broadcast_in_dim"] = _broadcast_in_dim


def _reshape(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    return reshape_to(imp.b, imp.tensor(ins[0], name), tuple(p["new_sizes"]), name)


_HANDLERS["reshape"] = _reshape


def _squeeze(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    x = imp.tensor(ins[0], name)
    drop = {d % x.shape.rank for d in p["dimensions"]}
    shape = tuple(s for k, s in enumerate(x.shape.sizes) if k not in drop)
    return reshape_to(imp.b, x, shape, name)


_HANDLERS["squeeze"] = _squeeze


def _transpose(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    x = imp.tensor(ins[0], name)
    perm = tuple(p["permutation"])
    return x if perm == tuple(range(len(perm))) else imp.b.transpose(x, perm=perm, name=name)


_HANDLERS["transpose"] = _transpose


def _concatenate(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    parts = [imp.tensor(v, name) for v in ins]
    return imp.b.concat(*parts, axis=p["dimension"], name=name)


_HANDLERS["concatenate"] = _concatenate


def _slice(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    x = imp.tensor(ins[0], name)
    if p.get("strides") and any(s != 1 for s in p["strides"]):
        raise _Unsupported("strided slices")
    out = x
    for a, (lo, hi) in enumerate(zip(p["start_indices"], p["limit_indices"], strict=True)):
        if (lo, hi) != (0, x.shape.sizes[a]):
            out = imp.b.slice(
                out, axis=a, start=int(lo), stop=int(hi), name=imp.name(f"{name}/{a}")
            )
    return out


_HANDLERS["slice"] = _slice


def _split(imp: _Importer, p: dict, ins: list, name: str) -> list[Tensor]:
    x = imp.tensor(ins[0], name)
    axis, out, start = p["axis"] % x.shape.rank, [], 0
    for k, size in enumerate(p["sizes"]):
        stop = start + int(size)
        out.append(imp.b.slice(x, axis=axis, start=start, stop=stop, name=imp.name(f"{name}/{k}")))
        start = stop
    return out


_HANDLERS["split"] = _split


def _dot_general(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    # Any contraction: the operands laid out as (batch, free, contracted) and (batch,
    # contracted, free), several free or contracted dimensions merged into one (Flax's
    # LinearGeneral and attention projections keep a heads dimension), then a (batched) matmul.
    (lc, rc), (lb, rb) = p["dimension_numbers"]
    a, b = imp.tensor(ins[0], name), imp.tensor(ins[1], name)
    sa, sb = a.shape.sizes, b.shape.sizes
    a_free = [d for d in range(len(sa)) if d not in (*lb, *lc)]
    b_free = [d for d in range(len(sb)) if d not in (*rb, *rc)]
    batch = tuple(sa[d] for d in lb)
    k = math.prod(sa[d] for d in lc)
    m, n = math.prod(sa[d] for d in a_free), math.prod(sb[d] for d in b_free)
    out = (*batch, *(sa[d] for d in a_free), *(sb[d] for d in b_free))
    a = _permute(imp, a, (*lb, *a_free, *lc), f"{name}/lhs")
    b = _permute(imp, b, (*rb, *rc, *b_free), f"{name}/rhs")
    if batch:
        a = reshape_to(imp.b, a, (*batch, m, k), f"{name}/lhs_merged")
        b = reshape_to(imp.b, b, (*batch, k, n), f"{name}/rhs_merged")
        product = (*batch, m, n)
    else:
        lead = tuple(sa[d] for d in a_free) or (1,)
        a = reshape_to(imp.b, a, (*lead, k), f"{name}/lhs_merged")
        b = reshape_to(imp.b, b, (k, n), f"{name}/rhs_merged")
        product = (*lead, n)
    op = "batch_matmul" if batch else "matmul"
    y = imp.b.apply(op, a, b, name=name if product == out else f"{name}/product")
    return reshape_to(imp.b, y, out, name)  # type: ignore[arg-type]


def _permute(imp: _Importer, x: Tensor, perm: tuple[int, ...], name: str) -> Tensor:
    if perm == tuple(range(x.shape.rank)):
        return x
    return imp.b.transpose(x, perm=perm, name=name)


_HANDLERS["dot_general"] = _dot_general


def _conv(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    dn = p["dimension_numbers"]
    if len(dn.lhs_spec) != 4:
        raise _Unsupported(f"{len(dn.lhs_spec) - 2}-D convolution (pcgopt has conv2d)")
    if p.get("batch_group_count", 1) != 1:
        raise _Unsupported("batch groups")
    # Other layouts (Flax's NHWC and HWIO) are transposed to NCHW and OIHW, and back.
    x = _permute(imp, imp.tensor(ins[0], name), tuple(dn.lhs_spec), f"{name}/to_nchw")
    w = _permute(imp, imp.tensor(ins[1], name), tuple(dn.rhs_spec), f"{name}/to_oihw")
    back = tuple(int(d) for d in np.argsort(dn.out_spec))
    nchw_name = name if back == (0, 1, 2, 3) else f"{name}/nchw"
    pads = [tuple(int(v) for v in pair) for pair in p["padding"]]
    try:
        y = padded_conv2d(
            imp.b,
            [x, w],
            [lo for lo, _ in pads],
            [hi for _, hi in pads],
            nchw_name,
            stride=tuple(p["window_strides"]),
            input_dilation=tuple(p["lhs_dilation"]),
            groups=p["feature_group_count"],
            dilation=tuple(p["rhs_dilation"]),
        )
    except ValueError as e:
        raise _Unsupported(str(e)) from None
    return _permute(imp, y, back, name)


_HANDLERS["conv_general_dilated"] = _conv


def _pad(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    value = _scalar(ins[1])
    if value is None:
        raise _Unsupported("a padding value computed from the inputs")
    config = [tuple(int(v) for v in c) for c in p["padding_config"]]
    if any(interior for _, _, interior in config):
        raise _Unsupported("interior padding")
    low, high = [lo for lo, _, _ in config], [hi for _, hi, _ in config]
    return pad_or_slice(imp.b, imp.tensor(ins[0], name), low, high, value, name)


_HANDLERS["pad"] = _pad


def _top_k(imp: _Importer, p: dict, ins: list, name: str) -> list[Tensor]:
    x = imp.tensor(ins[0], name)
    axis = int(p.get("axis", x.shape.rank - 1))
    return list(imp.b.top_k(x, k=int(p["k"]), axis=axis, name=name))


_HANDLERS["top_k"] = _top_k


def _arg(largest: bool) -> Handler:
    def handle(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
        x = imp.tensor(ins[0], name)
        axis = int(p["axes"][0])
        if not largest:
            x = imp.b.neg(x, name=f"{name}/neg")
        _, indices = imp.b.top_k(x, k=1, axis=axis, name=f"{name}/top_k")
        sizes = tuple(s for d, s in enumerate(x.shape.sizes) if d != axis)
        return reshape_to(imp.b, indices, sizes, name)

    return handle


_HANDLERS["argmax"] = _arg(True)
_HANDLERS["argmin"] = _arg(False)


def _argument_names(fn: Callable[..., Any], count: int) -> list[str]:
    """The names of ``fn``'s first ``count`` positional parameters (``arg{k}`` where it has
    none, e.g. ``*args``): inputs are named after them."""
    import inspect

    names = [f"arg{k}" for k in range(count)]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return names
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for k, p in enumerate(params[:count]):
        if p.kind not in positional:
            break
        names[k] = p.name
    return names


def _flax_variable(x: Any) -> bool:
    """Whether ``x`` is a Flax NNX Variable (a parameter, a batch statistic, ...)."""
    return any(
        c.__name__ == "Variable" and c.__module__.startswith("flax") for c in type(x).__mro__
    )


def _leaves(tree: Any, prefix: str) -> list[tuple[str, Any, bool]]:
    """``(path, array, trainable)`` of every leaf of ``tree``. A Flax Variable is one leaf
    named by its path, trainable when it is a ``Param`` (batch statistics are buffers)."""
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_flax_variable)
    out = []
    for path, leaf in flat:
        parts = []
        for key in path:
            k = getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))
            parts.append(str(k))
        trainable = True
        if _flax_variable(leaf):
            trainable = any(c.__name__ == "Param" for c in type(leaf).__mro__)
            leaf = leaf.get_value() if hasattr(leaf, "get_value") else leaf.value
        out.append(("/".join([*([prefix] if prefix else []), *parts]) or "arg", leaf, trainable))
    return out


def from_jax(
    fn: Callable[..., Any], *example_args: Any, params: int | Sequence[int] | None = 0
) -> ImportedModel:
    """Traces ``fn(*example_args)`` with ``jax.make_jaxpr`` and imports it (module docstring).
    ``params``: the position(s) of the arguments that hold the model's parameters (default: the
    first, as in ``apply(params, x)``); ``()`` or None when there are none."""
    try:
        import jax
    except ImportError:
        raise FrontendError("importing JAX functions needs pcgopt[jax]") from None
    start = time.perf_counter()
    param_pos = {params} if isinstance(params, int) else set(params or ())
    bad = [k for k in param_pos if not 0 <= k < len(example_args)]
    if bad:
        raise FrontendError(
            f"params={sorted(param_pos)} names argument(s) {bad}, but fn is given "
            f"{len(example_args)} example argument(s)"
        )
    closed = jax.make_jaxpr(fn)(*example_args)
    imp = _Importer()
    args: list[Any] = []
    inputs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    arg_names = _argument_names(fn, len(example_args))
    for k, arg in enumerate(example_args):
        is_param = k in param_pos
        prefix = "" if is_param and len(param_pos) == 1 else arg_names[k]
        for path, leaf, trainable in _leaves(arg, prefix):
            value = np.asarray(leaf)
            dtype = _DTYPES.get(str(value.dtype))
            if dtype is None:
                raise FrontendError(
                    f"argument leaf {path!r} has dtype {value.dtype}; pcgopt imports float16/"
                    "32/64 and bfloat16 arrays, and int32/64 arrays of indices",
                    node=path,
                )
            shape = value.shape or (1,)
            name = imp.name(path)
            if is_param and dtype.is_integer:
                raise FrontendError(
                    f"parameter leaf {path!r} holds integers; parameters must be float arrays",
                    node=path,
                )
            if is_param:
                t = imp.b.weight(shape, dtype, name=name, trainable=trainable)
                imp.weights[name] = value.reshape(shape)
            else:
                bound = UNBOUNDED if dtype.is_integer else None
                t = imp.b.input(shape, dtype, name=name, max_value=bound)
                inputs[name] = (shape, value.dtype)
            args.append(t)
    outs = imp.run_jaxpr(closed.jaxpr, closed.consts, args, "")
    if imp.unsupported:
        raise imp.unsupported.error("the JAX function")
    tensors = []
    for k, o in enumerate(outs):
        if not isinstance(o, Tensor):
            raise FrontendError(f"output {k} of the function does not depend on its inputs")
        tensors.append(o)
    pcg = bind_integer_inputs(imp.b.build(*tensors))
    pcg, weights, fused = fuse_patterns(pcg, imp.weights)
    return ImportedModel(
        pcg,
        weights,
        inputs,
        tuple(f"output{k}" for k in range(len(tensors))),
        "jax",
        {
            "source_nodes": sum(imp.counts.values()),
            "fused": fused,
            "pcg_nodes": len(pcg),
            "import_ms": round(1000 * (time.perf_counter() - start)),
        },
    )
