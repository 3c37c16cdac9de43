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
the table it indexes. ``table[i]`` becomes an embedding; ``jax.nn.one_hot(i, n)`` a lookup in
the identity; ``take_along_axis(x, i[..., None], -1)`` (a cross-entropy's pick of the label's
log-probability) the sum of ``x`` times that one-hot, so a function that ends in its loss is
imported with the loss. Integer arithmetic on indices is not held by the PCG: jnp's wrap of
negative indices is dropped (they are non-negative), anything else that reads it is listed as
unsupported. A ``where`` with a constant mask is exact arithmetic (``x * keep + fill``).
Softmax, LayerNorm and GELU, which JAX writes out, are recognized as pcgopt's operators by
:func:`~pcgopt.frontend.patterns.fuse_patterns`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.errors import FrontendError, PCGError
from pcgopt.frontend.model import (
    ImportedModel,
    UniqueNames,
    UnsupportedLog,
    binary,
    broadcast_to,
    identity_table,
    masked,
    reshape_to,
)
from pcgopt.frontend.patterns import fuse_patterns
from pcgopt.graph import PCG, Node
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
# An integer input's bound until the tables it indexes are known (from_jax then sets it).
_UNBOUNDED = 2**31 - 1


class _Unsupported(Exception):
    pass


class _Skipped:
    pass


_SKIPPED = _Skipped()


class _Unrepresented:
    """An integer value computed from indices, which the PCG does not hold: fine while nothing
    reads it (jnp's wrap of negative indices, ``select_n(i < 0, i, i + n)``, discards it)."""

    def __init__(self, why: str) -> None:
        self.why = why


class _OneHot:
    """``indices[..., None] == arange(n)``: becomes a float one-hot when converted to one."""

    def __init__(self, indices: Tensor, n: int) -> None:
        self.indices, self.n = indices, n


# Primitives that read integer tensors (indices) or the values above; every other one given an
# integer tensor yields an unrepresented value.
_INDEX_AWARE = frozenset(
    {"gather", "eq", "lt", "le", "gt", "ge", "select_n", "broadcast_in_dim", "reshape",
     "squeeze", "convert_element_type", "copy", "copy_p", "stop_gradient",
     "optimization_barrier"}
)  # fmt: skip


class _Importer:
    def __init__(self) -> None:
        self.b = PCGBuilder()
        self.weights: dict[str, np.ndarray] = {}
        self.name = UniqueNames()
        self.unsupported = UnsupportedLog()
        self.counts: dict[str, int] = {}
        # id of a constant -> its Weight, and the constant (kept alive so the id stays its own).
        self.consts: dict[int, tuple[Tensor, Any]] = {}

    def tensor(self, v: Any, owner: str) -> Tensor:
        if isinstance(v, Tensor):
            return v
        value = np.asarray(v)
        if value.dtype.kind not in "f":
            raise _Unsupported(f"a {value.dtype} constant reaches a tensor operator")
        key = id(v)
        if key not in self.consts:
            shape = value.shape or (1,)
            t = self.b.weight(shape, DType.F32, name=self.name(f"{owner}/const"), trainable=False)
            self.weights[t.ref.node] = value.astype(np.float32).reshape(shape)
            self.consts[key] = (t, v)
        return self.consts[key][0]

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
                outs = [_Unrepresented(f"{prim} of integer tensors")] * len(eqn.outvars)
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
        odd = [x for x in ins if isinstance(x, _Unrepresented | _OneHot)]
        if odd and not (prim == "select_n" or (prim == "convert_element_type" and ins == odd)):
            why = odd[0].why if isinstance(odd[0], _Unrepresented) else "a boolean one-hot"
            self.unsupported.add(prim, label, f"reads {why}")
            return [_SKIPPED] * len(eqn.outvars)
        handler = _HANDLERS.get(prim)
        if handler is None:
            self.unsupported.add(prim, label)
            return [_SKIPPED] * len(eqn.outvars)
        try:
            out = handler(self, eqn.params, ins, self.name(label))
        except _Unsupported as e:
            self.unsupported.add(prim, label, str(e))
            return [_SKIPPED] * len(eqn.outvars)
        except PCGError as e:
            raise FrontendError(
                f"JAX equation {label!r} ({prim}): {e.message}", node=label
            ) from None
        return list(out) if isinstance(out, list) else [out]


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
    x = imp.tensor(ins[0], name)
    if x.shape.dtype.is_integer and kind in "iu":
        return x  # an index stays an index
    if kind != "f" or x.shape.dtype.is_integer:
        raise _Unsupported("only conversions between float types of a traced tensor")
    return x


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
    # zero count) it is a choice made now, or a masked tensor.
    pred, cases = ins[0], ins[1:]
    if not _is_constant(pred):
        raise _Unsupported("only a constant predicate")
    pred = np.asarray(pred).astype(np.int64)
    if np.all(pred == pred.flat[0]):
        chosen = cases[int(pred.flat[0])]
        if isinstance(chosen, _Unrepresented):
            raise _Unsupported(f"it selects {chosen.why}")
        return chosen if isinstance(chosen, Tensor) else imp.tensor(chosen, name)
    traced = [k for k, c in enumerate(cases) if isinstance(c, Tensor)]
    if len(cases) != 2 or len(traced) != 1:
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
    # Integer inputs are indices: non-negative (the embedding they feed checks its range), so
    # jnp's test for negative indices is a constant. One-hot encodings compare with an iota.
    def handle(imp: _Importer, p: dict, ins: list, name: str) -> Any:
        a, b = ins
        flipped = not isinstance(a, Tensor)
        t, c = (b, a) if flipped else (a, b)
        if not isinstance(t, Tensor) or not t.shape.dtype.is_integer:
            raise _Unsupported("comparisons other than of indices")
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
        raise _Unsupported("comparisons of indices other than i < 0 and one-hot encodings")

    return handle


for _prim in ("eq", "lt", "le", "gt", "ge"):
    _HANDLERS[_prim] = _compare(_prim)


def _identity_table(n: int) -> np.ndarray:
    try:
        return identity_table(n)
    except ValueError as e:
        raise _Unsupported(str(e)) from None


def _gather(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    table, idx = ins
    if not isinstance(idx, Tensor) or not idx.shape.dtype.is_integer:
        raise _Unsupported("gathers at constant indices")
    table = imp.tensor(table, name)
    dn = p["dimension_numbers"]
    rank = table.shape.rank
    lead = idx.shape.sizes[:-1]
    if idx.shape.sizes[-1:] != (1,) or tuple(dn.start_index_map) != (dn.collapsed_slice_dims):
        raise _Unsupported("gathers of more than one index per lookup")
    axis = dn.start_index_map[0]
    if rank == 2 and axis == 0 and not dn.operand_batching_dims:
        # table[i]: rows of a table, an embedding.
        if tuple(p["slice_sizes"]) != (1, table.shape.sizes[1]):
            raise _Unsupported("gathers of partial rows")
        flat = reshape_to(imp.b, idx, lead, f"{name}/indices")
        return imp.b.embedding(flat, table, name=name)
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
    raise _Unsupported("gathers other than table rows and take_along_axis on the last axis")


_HANDLERS["gather"] = _gather


def _reduce(op: str) -> Handler:
    def handle(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
        x = imp.tensor(ins[0], name)
        return imp.b.apply(op, x, axes=tuple(p["axes"]), keepdims=False, name=name)

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
    (lc, rc), (lb, rb) = p["dimension_numbers"]
    a, b = imp.tensor(ins[0], name), imp.tensor(ins[1], name)
    if len(lc) != 1:
        raise _Unsupported("contraction over several dimensions")
    ra, rb_ = a.shape.rank, b.shape.rank
    a_free = [d for d in range(ra) if d not in (*lb, *lc)]
    b_free = [d for d in range(rb_) if d not in (*rb, *rc)]
    if not lb:
        if len(b_free) != 1:
            raise _Unsupported("a product whose right operand keeps several dimensions")
        a = _permute(imp, a, (*a_free, lc[0]), f"{name}/lhs")
        b = _permute(imp, b, (rc[0], b_free[0]), f"{name}/rhs")
        return imp.b.matmul(a, b, name=name)
    if len(a_free) != 1 or len(b_free) != 1:
        raise _Unsupported("a batched product with several free dimensions")
    a = _permute(imp, a, (*lb, a_free[0], lc[0]), f"{name}/lhs")
    b = _permute(imp, b, (*rb, rc[0], b_free[0]), f"{name}/rhs")
    return imp.b.batch_matmul(a, b, name=name)


def _permute(imp: _Importer, x: Tensor, perm: tuple[int, ...], name: str) -> Tensor:
    if perm == tuple(range(x.shape.rank)):
        return x
    return imp.b.transpose(x, perm=perm, name=name)


_HANDLERS["dot_general"] = _dot_general


def _conv(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    dn = p["dimension_numbers"]
    if (tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec)) != (
        (0, 1, 2, 3),
        (0, 1, 2, 3),
        (0, 1, 2, 3),
    ):
        raise _Unsupported("convolutions other than NCHW x OIHW")
    if any(d != 1 for d in p["lhs_dilation"]):
        raise _Unsupported("input dilation (a transposed convolution)")
    pads = p["padding"]
    if any(lo != hi for lo, hi in pads) or p.get("batch_group_count", 1) != 1:
        raise _Unsupported("asymmetric padding or batch groups")
    return imp.b.conv2d(
        imp.tensor(ins[0], name),
        imp.tensor(ins[1], name),
        stride=tuple(p["window_strides"]),
        padding=(pads[0][0], pads[1][0]),
        groups=p["feature_group_count"],
        dilation=tuple(p["rhs_dilation"]),
        name=name,
    )


_HANDLERS["conv_general_dilated"] = _conv


def _bound_indices(pcg: PCG) -> PCG:
    """Integer inputs bounded by the rows of the tables they index (through layout ops)."""
    by_name = {n.name: n for n in pcg.nodes}
    bounds: dict[str, int] = {}
    for n in pcg.nodes:
        if n.op != "embedding":
            continue
        src = by_name[n.inputs[0].node]
        while src.op in ("reshape", "broadcast", "transpose", "slice", "concat"):
            src = by_name[src.inputs[0].node]
        rows = pcg.shape(n.inputs[1]).sizes[0]
        bounds[src.name] = min(bounds.get(src.name, rows), rows)
    nodes = []
    for n in pcg.nodes:
        if n.op == "input" and n.params["dtype"].is_integer:
            if n.name not in bounds:
                raise FrontendError(
                    f"input {n.name!r} holds integers but is not used as indices into a table "
                    "(an embedding, a one-hot or take_along_axis); pcgopt needs integer inputs "
                    "to be lookups",
                    node=n.name,
                )
            n = Node(n.name, n.op, n.inputs, {**n.params, "max_value": bounds[n.name]})
        nodes.append(n)
    return PCG(nodes, pcg.outputs)


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


def _leaves(tree: Any, prefix: str) -> list[tuple[str, Any]]:
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    out = []
    for path, leaf in flat:
        parts = []
        for key in path:
            k = getattr(key, "key", getattr(key, "idx", getattr(key, "name", key)))
            parts.append(str(k))
        out.append(("/".join([*([prefix] if prefix else []), *parts]) or "arg", leaf))
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
        for path, leaf in _leaves(arg, prefix):
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
                t = imp.b.weight(shape, dtype, name=name)
                imp.weights[name] = value.reshape(shape)
            else:
                bound = _UNBOUNDED if dtype.is_integer else None
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
    pcg = _bound_indices(imp.b.build(*tensors))
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
