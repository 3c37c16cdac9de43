"""JAX functions as PCGs: traced with ``jax.make_jaxpr`` and mapped primitive by primitive.

>>> import jax.numpy as jnp                                       # doctest: +SKIP
>>> def mlp(params, x):                                           # doctest: +SKIP
...     return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"]
>>> m = from_jax(mlp, params, jnp.zeros((64, 784)), params=(0,))  # doctest: +SKIP

The arguments at the positions in ``params`` are the model's parameters: every array leaf of
them becomes a Weight named by its path in the pytree (``w1``, ``layers/0/kernel``); every leaf
of the other arguments becomes an Input (``x``, or ``arg1/...`` for nested ones). Nodes are named
after the JAX name stack (``jax.named_scope``, Flax module paths) and the primitive, e.g.
``layer1/dot_general``. Calls (``pjit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``)
are inlined. Unsupported primitives raise one :class:`~pcgopt.FrontendError` that lists them
all, with counts and first names.
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
    reshape_to,
)
from pcgopt.frontend.patterns import fuse_patterns
from pcgopt.shapes import DType

__all__ = ["from_jax", "supported_primitives"]

_DTYPES = {"float32": DType.F32, "float64": DType.F64, "float16": DType.F16, "bfloat16": DType.BF16}


class _Unsupported(Exception):
    pass


class _Skipped:
    pass


_SKIPPED = _Skipped()


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
            elif all(not isinstance(x, Tensor) for x in ins) and prim not in _CALLS:
                outs = self._fold(eqn, ins, label)
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
        return [out]


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
    x = imp.tensor(ins[0], name)
    if np.dtype(p["new_dtype"]).kind != "f" or x.shape.dtype.is_integer:
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


def _pow(imp: _Importer, p: dict, ins: list, name: str) -> Tensor:
    e = _scalar(ins[1])
    if e is None:
        raise _Unsupported("only a constant scalar exponent")
    return imp.b.pow(imp.tensor(ins[0], name), exponent=e, name=name)


_HANDLERS["pow"] = _pow


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
    if any(d != 1 for d in (*p["lhs_dilation"], *p["rhs_dilation"])):
        raise _Unsupported("dilated convolution")
    pads = p["padding"]
    if any(lo != hi for lo, hi in pads) or p.get("batch_group_count", 1) != 1:
        raise _Unsupported("asymmetric padding or batch groups")
    return imp.b.conv2d(
        imp.tensor(ins[0], name),
        imp.tensor(ins[1], name),
        stride=tuple(p["window_strides"]),
        padding=(pads[0][0], pads[1][0]),
        groups=p["feature_group_count"],
        name=name,
    )


_HANDLERS["conv_general_dilated"] = _conv


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
    fn: Callable[..., Any], *example_args: Any, params: int | Sequence[int] = 0
) -> ImportedModel:
    """Traces ``fn(*example_args)`` with ``jax.make_jaxpr`` and imports it (module docstring).
    ``params``: the position(s) of the arguments that hold the model's parameters (default: the
    first, as in ``apply(params, x)``); ``()`` when there are none."""
    try:
        import jax
    except ImportError:
        raise FrontendError("importing JAX functions needs pcgopt[jax]") from None
    start = time.perf_counter()
    param_pos = {params} if isinstance(params, int) else set(params)
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
    for k, arg in enumerate(example_args):
        is_param = k in param_pos
        prefix = "" if is_param and len(param_pos) == 1 else f"arg{k}"
        if not is_param and len(example_args) - len(param_pos) == 1:
            prefix = "x"
        for path, leaf in _leaves(arg, prefix):
            value = np.asarray(leaf)
            dtype = _DTYPES.get(str(value.dtype))
            if dtype is None:
                raise FrontendError(
                    f"argument leaf {path!r} has dtype {value.dtype}; pcgopt imports float "
                    "arrays (integer inputs such as token ids: use an embedding lookup in "
                    "ONNX, or pass embeddings)",
                    node=path,
                )
            shape = value.shape or (1,)
            name = imp.name(path)
            if is_param:
                t = imp.b.weight(shape, dtype, name=name)
                imp.weights[name] = value.reshape(shape)
            else:
                t = imp.b.input(shape, dtype, name=name)
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
    pcg = imp.b.build(*tensors)
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
