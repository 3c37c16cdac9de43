"""ONNX graphs as PCGs.

>>> from pcgopt.frontend.onnx import from_onnx          # doctest: +SKIP
>>> m = from_onnx("bert.onnx", dims={"batch": 8})        # doctest: +SKIP
>>> m.pcg, m.weights, m.inputs                           # doctest: +SKIP

How a graph is read, node by node in the graph's order:

- Symbolic input dimensions are bound by ``dims``; every shape is then concrete, so a
  ``Shape`` of a tensor is a constant, and so is everything computed from constants only
  (``Gather`` on shapes, ``Concat`` of shape vectors, ``Cast``, masks built from ``Range``...).
  Those are folded with ONNX's own reference implementation of each operator.
- Initializers are weights. A float initializer of more than one element is a *parameter*
  (trainable); the rest are constants. Layout operators on a parameter used once (an
  exporter's ``Transpose`` of a weight, an ``Unsqueeze`` of a bias) are folded into it and the
  weight keeps the initializer's name; anything else that reads a parameter becomes an
  operator on it, so parameters are never multiplied into constants.
- Every other node becomes pcgopt operators named after the node (its name, which
  ``torch.onnx.export`` builds from the module path, e.g. ``/encoder/layer.0/attention/MatMul``).
- Booleans are 0/1 float masks (:mod:`pcgopt.ops.elementwise`): Equal, Less, Greater... are
  ``compare``; And, Or, Xor, Not exact arithmetic on masks; Where on a computed condition is
  ``where`` (on a constant one, a causal mask, ``x * keep + fill``, exact for finite x). An
  integer input cast to float (an attention mask) is a mask input, drawn from {0, 1} when
  plans are checked; an integer input that indexes a table is bounded by its rows.
- ConvTranspose is ``conv2d`` of the input dilated by the stride with the kernel flipped (and
  stored so); asymmetric and SAME padding is a ``pad``; Resize (any mode with constant scales
  or sizes) is, per axis, a repeat, a slice or a product with the interpolation matrix ONNX's
  own Resize gives for the identity; TopK, ArgMax and ArgMin are ``top_k``; Gather at computed
  indices along any axis is an embedding of the slices.
- Unsupported nodes are collected; one :class:`~pcgopt.FrontendError` lists them all.

Then :func:`pcgopt.frontend.patterns.fuse_patterns` recognizes dense layers and GELUs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
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
    clean_name,
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

__all__ = ["MIN_OPSET", "from_onnx", "supported_ops", "to_onnx"]

#: The oldest default-domain opset the importer reads.
MIN_OPSET = 17


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise FrontendError(
            "importing ONNX needs the onnx package: pip install 'pcgopt[onnx]'"
        ) from None
    return onnx


@dataclass(eq=False)  # compared and hashed by identity: one weight per constant
class Const:
    """A value known at import time. ``param``: the initializer it is (a possibly re-laid-out)
    trainable parameter of, else None. ``name``: the initializer it is, if it is one."""

    value: np.ndarray
    param: str | None = None
    name: str | None = None
    #: A parameter the exporter stored twice (a tied embedding and output projection, the
    #: second copy transposed): the first copy and the permutation that gives this one.
    alias: tuple[Const, tuple[int, ...]] | None = None
    #: Another parameter is an alias of this one (so it is never folded into a new value).
    shared: bool = False


class _Skipped:
    """The output of a node that could not be imported (its readers are not reported again)."""


_SKIPPED = _Skipped()
Value = Const | Tensor | _Skipped

_DTYPES = {
    np.dtype(np.float32): DType.F32,
    np.dtype(np.float64): DType.F64,
    np.dtype(np.float16): DType.F16,
    np.dtype(np.int64): DType.I64,
    np.dtype(np.int32): DType.I32,
}

#: Operators that only re-lay-out one tensor: folded into a parameter used once.
_LAYOUT = {"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast"}
#: Operators whose output holds elements of their first input: a mask's stay masks.
_MOVES = _LAYOUT | {"Expand", "Slice", "Gather", "Split", "Dropout"}


class _Importer:
    def __init__(self, model: Any, dims: Mapping[str, int]) -> None:
        onnx = _onnx()
        self.onnx = onnx
        self.graph = model.graph
        self.opset = next(
            (o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None
        )
        if self.opset is None or self.opset < MIN_OPSET:
            raise FrontendError(
                f"the model uses ONNX opset {self.opset}; pcgopt reads opset {MIN_OPSET} and "
                "later (re-export with opset_version=17, or convert with "
                "onnx.version_converter.convert_version)"
            )
        self.dims = dict(dims)
        self.b = PCGBuilder()
        self.values: dict[str, Value] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.materialized: dict[Const, Tensor] = {}
        self.buffers: dict[Const, Const] = {}
        self.unsupported = UnsupportedLog()
        self.masks = Masks()
        self.uses: dict[str, int] = {}
        self.folded = 0
        self._name = UniqueNames()
        for node in self.graph.node:
            for name in node.input:
                self.uses[name] = self.uses.get(name, 0) + 1
        for out in self.graph.output:
            self.uses[out.name] = self.uses.get(out.name, 0) + 1

    # -- values ---------------------------------------------------------------------------------

    def _initializers(self) -> None:
        numpy_helper = self.onnx.numpy_helper
        for init in self.graph.initializer:
            value = numpy_helper.to_array(init)
            is_param = value.dtype.kind == "f" and value.size > 1
            self.values[init.name] = Const(value, init.name if is_param else None, init.name)
        self._tie_copies()

    def _tie_copies(self) -> None:
        """Parameters equal to another one or its transpose are one parameter (tied weights,
        which an exporter writes out twice): the copy becomes a transpose of the original."""
        seen: dict[tuple, list[Const]] = {}
        for init in self.graph.initializer:
            c = self.values[init.name]
            if c.param is None or c.value.ndim != 2 or c.value.size < 64:
                continue
            v = c.value
            # Equal multisets of values: a cheap key that a copy and a transpose share.
            key = (tuple(sorted(v.shape)), float(np.sort(v, axis=None).sum()))
            for first in seen.get(key, []):
                if first.value.shape == v.shape and np.array_equal(first.value, v):
                    c.alias, first.shared = (first, (0, 1)), True
                elif first.value.shape == v.shape[::-1] and np.array_equal(first.value.T, v):
                    c.alias, first.shared = (first, (1, 0)), True
                if c.alias:
                    break
            else:
                seen.setdefault(key, []).append(c)

    def _graph_inputs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        inputs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        unbound: dict[str, list[str]] = {}
        tensor_types = self.onnx.helper.tensor_dtype_to_np_dtype
        for vi in self.graph.input:
            if vi.name in self.values:  # an initializer listed as an input (old exporters)
                continue
            t = vi.type.tensor_type
            shape = []
            for k, d in enumerate(t.shape.dim):
                if d.HasField("dim_value"):
                    shape.append(d.dim_value)
                elif d.dim_param and d.dim_param in self.dims:
                    shape.append(self.dims[d.dim_param])
                else:
                    label = d.dim_param or f"{vi.name}[{k}] (unnamed)"
                    unbound.setdefault(label, []).append(vi.name)
                    shape.append(1)
            inputs[vi.name] = (tuple(shape), np.dtype(tensor_types(t.elem_type)))
        if unbound:
            listed = "; ".join(f"{d} (in {', '.join(ins)})" for d, ins in unbound.items())
            example = " ".join(f"{d}=N" for d in unbound if "(" not in d)
            raise FrontendError(
                f"symbolic dimension(s) without a size: {listed}. Bind them with "
                f"dims={{...}} (CLI: --dims {example or 'NAME=N'})",
                node=next(iter(unbound.values()))[0],
            )
        unused = sorted(set(self.dims) - self._dim_params())
        if unused:
            raise FrontendError(
                f"dims {', '.join(unused)} name no symbolic dimension of the graph's inputs "
                f"(those are: {', '.join(sorted(self._dim_params())) or 'none'})"
            )
        for name, (shape, dtype) in inputs.items():
            pdt = _DTYPES.get(dtype)
            if pdt is None:
                raise FrontendError(
                    f"graph input {name!r} has dtype {dtype}; pcgopt imports float16/32/64 and "
                    "int32/64 inputs",
                    node=name,
                )
            if min(shape, default=1) < 1:
                raise FrontendError(f"graph input {name!r} has an empty shape {shape}", node=name)
            # An integer input's bound follows from its uses (bind_integer_inputs, after the walk).
            self.values[name] = self.b.input(
                shape or (1,),
                pdt,
                name=self._name(name),
                max_value=UNBOUNDED if pdt.is_integer else None,
            )
        return inputs

    def _dim_params(self) -> set[str]:
        return {
            d.dim_param
            for vi in self.graph.input
            for d in vi.type.tensor_type.shape.dim
            if d.dim_param
        }

    def buffer_of(self, v: Const) -> Const:
        """The non-trainable twin of a parameter constant (one per constant)."""
        if v not in self.buffers:
            self.buffers[v] = Const(v.value, None, v.name)
        return self.buffers[v]

    def tensor(self, v: Value, owner: str, slot: int) -> Tensor:
        """``v`` as a PCG tensor: a constant becomes a Weight (once per constant)."""
        if isinstance(v, Tensor):
            return v
        assert isinstance(v, Const)
        if v not in self.materialized and v.alias is not None:
            original, perm = v.alias
            t = self.tensor(original, owner, slot)
            if perm != (0, 1):
                t = self.b.transpose(t, perm=perm, name=self._name(f"{v.name}/tied"))
            self.materialized[v] = t
        if v not in self.materialized:
            value = v.value
            if value.dtype.kind == "b":
                value = value.astype(np.float32)  # a mask: pcgopt holds booleans as 0/1 floats
            if value.dtype.kind == "f" and value.dtype != np.float32:
                value = value.astype(np.float32)
            if value.dtype.kind in "iu":
                raise _Unsupported(f"an integer constant reaches input {slot} of a tensor operator")
            name = self._name(v.param or v.name or f"{owner}/const{slot}")
            shape = value.shape or (1,)
            t = self.b.weight(shape, DType.F32, name=name, trainable=v.param is not None)
            self.weights[t.ref.node] = np.asarray(value, np.float32).reshape(shape)
            self.materialized[v] = t
            if v.value.dtype.kind == "b":
                self.masks.add(t)
        return self.materialized[v]

    def constant(self, value: Any, owner: str, role: str) -> Tensor:
        """A tensor for a constant the importer adds (a zero to compare with)."""
        return self.tensor(Const(np.asarray(value)), f"{owner}/{role}", 0)

    # -- the walk -------------------------------------------------------------------------------

    def run(self) -> ImportedModel:
        start = time.perf_counter()
        self._initializers()
        inputs = self._graph_inputs()
        for k, node in enumerate(self.graph.node):
            self._node(node, k)
        if self.unsupported:
            raise self.unsupported.error("the ONNX graph")
        outputs, names = [], []
        for out in self.graph.output:
            v = self.values.get(out.name)
            if isinstance(v, Const):
                v = self.tensor(v, clean_name(out.name), 0)
            if not isinstance(v, Tensor):
                raise FrontendError(f"graph output {out.name!r} is not computed by the graph")
            outputs.append(v)
            names.append(out.name)
        pcg = bind_integer_inputs(self.b.build(*outputs))
        pcg, weights, fused = fuse_patterns(pcg, self.weights)
        return ImportedModel(
            pcg,
            weights,
            inputs,
            tuple(names),
            "onnx",
            {
                "source_nodes": len(self.graph.node),
                "folded": self.folded,
                "fused": fused,
                "pcg_nodes": len(pcg),
                "import_ms": round(1000 * (time.perf_counter() - start)),
            },
        )

    def _node(self, node: Any, k: int) -> None:
        name = _module_path(node) or node.name or f"{node.op_type}_{k}"
        if node.domain not in ("", "ai.onnx"):
            self._skip(node, f"{node.domain}.{node.op_type}", name, "operator of a custom domain")
            return
        ins = [self.values.get(i, _SKIPPED) if i else None for i in node.input]
        if any(v is _SKIPPED for v in ins):
            self._mark(node, _SKIPPED)
            return
        attrs = _attrs(self.onnx, node)
        if node.op_type == "Constant":
            self._set(node, [Const(_constant_value(self.onnx, node))])
            return
        if all(v is None or isinstance(v, Const) for v in ins) and self._may_fold(node, ins):
            param = self._param_of(node, ins)
            self._set(node, [Const(o, param, param) for o in self._fold(node, ins)])
            self.folded += 1
            return
        if node.op_type == "Shape":
            shape = np.array(ins[0].shape.sizes, dtype=np.int64)
            lo, hi = attrs.get("start", 0), attrs.get("end", len(shape))
            self._set(node, [Const(shape[lo:hi])])
            self.folded += 1
            return
        handler = _HANDLERS.get(node.op_type)
        if handler is None:
            self._skip(node, node.op_type, name)
            return
        try:
            outs = handler(self, _Ctx(self._name(name), attrs, tuple(node.input)), ins)
        except _Unsupported as e:
            self._skip(node, node.op_type, name, str(e))
            return
        except PCGError as e:
            raise FrontendError(
                f"ONNX node {name!r} ({node.op_type}): {e.message}", node=name
            ) from None
        if node.op_type in _MOVES:
            self.masks.follow(ins[0], outs)
        self._set(node, outs)

    def _may_fold(self, node: Any, ins: list[Any]) -> bool:
        params = [v for v in ins if isinstance(v, Const) and v.param is not None]
        if not params:
            return True
        return (
            node.op_type in _LAYOUT
            and len(params) == 1
            and ins[0] is params[0]
            and self.may_relayout(params[0], node.input[0])
        )

    def may_relayout(self, v: Const, onnx_name: str) -> bool:
        """Whether constant ``v`` (the ONNX tensor ``onnx_name``) may be stored re-laid-out: a
        parameter only when nothing else reads it and it is no copy or original of a tied one."""
        if v.param is None:
            return True
        return v.alias is None and not v.shared and self.uses.get(onnx_name, 0) == 1

    def _param_of(self, node: Any, ins: list[Any]) -> str | None:
        return next((v.param for v in ins if isinstance(v, Const) and v.param), None)

    def _fold(self, node: Any, ins: list[Any]) -> list[np.ndarray]:
        from onnx.reference.ops import load_op

        own = _OWN_FOLDS.get(node.op_type)
        if own is not None:
            return own(_attrs(self.onnx, node), [None if v is None else v.value for v in ins])
        try:
            impl = load_op(node.domain or "", node.op_type, self.opset)
            run_params = {"log": lambda *a: None, "opsets": {"": self.opset}, "verbose": 0}
            run_params["new_ops"] = None
            outs = impl(node, run_params).run(*[None if v is None else v.value for v in ins])
        except Exception as e:  # ONNX's evaluator raises many types
            raise FrontendError(
                f"ONNX node {node.name!r} ({node.op_type}) computes a constant, but evaluating "
                f"it failed: {e}",
                node=node.name,
            ) from None
        return [np.asarray(o) for o in outs]

    def _set(self, node: Any, outs: list[Value]) -> None:
        for name, v in zip(node.output, outs, strict=False):
            if name:
                self.values[name] = v

    def _mark(self, node: Any, v: Value) -> None:
        for name in node.output:
            if name:
                self.values[name] = v

    def _skip(self, node: Any, op: str, name: str, reason: str = "") -> None:
        self.unsupported.add(op, name, reason)
        self._mark(node, _SKIPPED)


def _gather_elements(attrs: dict[str, Any], ins: list[Any]) -> list[np.ndarray]:
    data, idx = ins
    axis = attrs.get("axis", 0) % data.ndim
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return [np.take_along_axis(data, idx, axis=axis)]


#: Constant folds done here rather than by ONNX's reference evaluator (whose GatherElements
#: fails when the indices are smaller than the data along the other axes, as in BERT-base).
_OWN_FOLDS: dict[str, Callable[[dict[str, Any], list[Any]], list[np.ndarray]]] = {
    "GatherElements": _gather_elements,
}


class _Unsupported(Exception):
    """A node of a known type used in a way pcgopt cannot import (the message says how)."""


@dataclass
class _Ctx:
    """The node being imported: its PCG name, attributes and ONNX input names."""

    name: str
    attrs: dict[str, Any]
    inputs: tuple[str, ...] = ()

    def sub(self, suffix: str) -> str:
        return f"{self.name}/{suffix}"


def _module_path(node: Any) -> str | None:
    """``module/path/node_name`` from the PyTorch module path the dynamo exporter records in a
    node's metadata (the TorchScript exporter puts it in the node name instead)."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            # The module path of every enclosing module, innermost last, then the op's own.
            scopes = [s.strip(" '\"") for s in prop.value.strip("[]").split(",")]
            path = scopes[-2] if len(scopes) >= 2 else ""
            if path:
                return f"{path.replace('.', '/')}/{node.name or node.op_type}"
    return None


def _attrs(onnx: Any, node: Any) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def _constant_value(onnx: Any, node: Any) -> np.ndarray:
    for a in node.attribute:
        if a.name == "value":
            return onnx.numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_int"):
            return np.array(onnx.helper.get_attribute_value(a))
        if a.name in ("value_floats", "value_ints"):
            return np.array(onnx.helper.get_attribute_value(a))
    raise FrontendError(f"Constant node {node.name!r} has no value attribute", node=node.name)


# ------------------------------------------------------------------------------------------------
# handlers: one per ONNX operator with a tensor (non-constant) input
# ------------------------------------------------------------------------------------------------

Handler = Callable[[_Importer, _Ctx, list[Any]], list[Value]]
_HANDLERS: dict[str, Handler] = {}


def _handles(*ops: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in ops:
            _HANDLERS[op] = fn
        return fn

    return register


def supported_ops() -> tuple[str, ...]:
    """ONNX operator types the importer maps when their inputs are tensors (any operator whose
    inputs are all constants is folded)."""
    return tuple(sorted({*_HANDLERS, "Constant", "Shape"}))


def _const(v: Any, what: str) -> np.ndarray:
    if not isinstance(v, Const):
        raise _Unsupported(f"{what} must be a constant, not computed from the graph's inputs")
    return v.value


def _scalar(v: Any) -> float | None:
    """The value of a one-element non-parameter constant, else None."""
    if isinstance(v, Const) and v.param is None and v.value.size == 1:
        return float(v.value.reshape(()))
    return None


_UNARY = {
    "Relu": "relu",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "Erf": "erf",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Neg": "neg",
    "Reciprocal": "reciprocal",
}


def _unary_handler(op: str) -> Handler:
    def handle(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
        return [imp.b.apply(op, imp.tensor(ins[0], ctx.name, 0), name=ctx.name)]

    return handle


for _onnx_op, _pcg_op in _UNARY.items():
    _HANDLERS[_onnx_op] = _unary_handler(_pcg_op)


@_handles("Identity", "Dropout")
def _identity(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    # Dropout at inference (exported models are in eval mode) is the identity.
    return [ins[0]]


@_handles("Cast")
def _cast(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = ins[0]
    to = np.dtype(imp.onnx.helper.tensor_dtype_to_np_dtype(ctx.attrs["to"]))
    if to.kind == "b":
        return [imp.masks.of(imp.b, x, ctx.name, _constants(imp, ctx))]
    if to.kind == "f":
        # Integers (an attention mask) become floats; a float or a mask stays as it is (the
        # PCG computes every float in one precision, and holds booleans as 0/1 floats).
        return [as_float(imp.b, x, ctx.name) if x.shape.dtype.is_integer else x]
    if x.shape.dtype.is_integer:
        return [x]  # an index stays an index
    raise _Unsupported(f"a cast of floats or booleans to {to} (integer arithmetic)")


def _constants(imp: _Importer, ctx: _Ctx) -> Callable[[np.ndarray, str], Tensor]:
    return lambda value, role: imp.constant(value, ctx.name, role)


_COMPARE = {
    "Equal": "eq",
    "Less": "lt",
    "LessOrEqual": "le",
    "Greater": "gt",
    "GreaterOrEqual": "ge",
}


def _compare_handler(relation: str) -> Handler:
    def handle(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
        # Integers (ids compared with a pad id) are compared as floats: exact below 2**24.
        a, b = (
            as_float(imp.b, v, ctx.sub(f"in{k}"))
            if isinstance(v, Tensor)
            else imp.tensor(Const(np.asarray(v.value, np.float32)), ctx.name, k)
            for k, v in enumerate(ins)
        )
        return [imp.masks.add(imp.b.compare(a, b, relation=relation, name=ctx.name))]

    return handle


for _onnx_op, _relation in _COMPARE.items():
    _HANDLERS[_onnx_op] = _compare_handler(_relation)


def _logical_handler(op: str) -> Handler:
    def handle(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
        x, *rest = (imp.tensor(v, ctx.name, k) for k, v in enumerate(ins))
        y = rest[0] if rest else None
        return [imp.masks.logical(imp.b, op, x, y, ctx.name, _constants(imp, ctx))]

    return handle


for _onnx_op, _op in {"Not": "not", "And": "and", "Or": "or", "Xor": "xor"}.items():
    _HANDLERS[_onnx_op] = _logical_handler(_op)


@_handles("Gelu")
def _gelu(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    op = "gelu" if ctx.attrs.get("approximate", "none") == "tanh" else "gelu_erf"
    return [imp.b.apply(op, imp.tensor(ins[0], ctx.name, 0), name=ctx.name)]


_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "maximum"}


def _binary_handler(onnx_op: str) -> Handler:
    op = _BINARY[onnx_op]

    def handle(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
        if len(ins) != 2:
            raise _Unsupported(f"{onnx_op} of {len(ins)} inputs")
        return [
            binary(
                imp.b,
                op,
                *ins,
                ctx.name,
                scalar=_scalar,
                tensor=lambda v, slot: imp.tensor(v, ctx.name, slot),
            )
        ]

    return handle


for _onnx_op in _BINARY:
    _HANDLERS[_onnx_op] = _binary_handler(_onnx_op)


@_handles("Pow")
def _pow(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    e = _scalar(ins[1])
    if e is None or not isinstance(ins[0], Tensor):
        raise _Unsupported("only a tensor to a constant scalar power is imported")
    return [imp.b.pow(ins[0], exponent=e, name=ctx.name)]


@_handles("Where")
def _where(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    cond, x, y = ins
    if isinstance(cond, Const) and isinstance(x, Tensor) != isinstance(y, Tensor):
        # A constant mask over one tensor (a causal mask): x * keep + fill, exact for finite x,
        # in operators the rules already parallelize.
        c = cond.value.astype(bool)
        t, keep, fill = (x, c, y.value) if isinstance(x, Tensor) else (y, ~c, x.value)
        slots = {"keep": 0, "fill": 2}

        def constant(value: np.ndarray, role: str) -> Tensor:
            return imp.tensor(Const(value), ctx.name, slots[role])

        return [masked(imp.b, t, keep, fill, ctx.name, constant)]
    mask = imp.masks.of(imp.b, imp.tensor(cond, ctx.name, 0), ctx.sub("cond"), _constants(imp, ctx))
    chosen = [imp.tensor(v, ctx.name, k) for k, v in ((1, x), (2, y))]
    return [imp.b.where(mask, *chosen, name=ctx.name)]


@_handles("MatMul")
def _matmul(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    a, b = ins
    ta, tb = imp.tensor(a, ctx.name, 0), imp.tensor(b, ctx.name, 1)
    ra, rb = ta.shape.rank, tb.shape.rank
    if rb == 2 and ra >= 1:
        return [imp.b.matmul(ta, tb, name=ctx.name)]
    if ra == rb and ra >= 3:
        return [imp.b.batch_matmul(ta, tb, name=ctx.name)]
    if ra > rb >= 3 or rb > ra >= 3:
        # Broadcast the batch dimensions of the shorter one.
        lead = np.broadcast_shapes(ta.shape.sizes[:-2], tb.shape.sizes[:-2])
        ta = broadcast_to(imp.b, ta, (*lead, *ta.shape.sizes[-2:]), ctx.sub("broadcast_a"))
        tb = broadcast_to(imp.b, tb, (*lead, *tb.shape.sizes[-2:]), ctx.sub("broadcast_b"))
        return [imp.b.batch_matmul(ta, tb, name=ctx.name)]
    raise _Unsupported(f"MatMul of ranks {ra} and {rb}")


@_handles("Gemm")
def _gemm(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = ctx.attrs.get("alpha", 1.0), ctx.attrs.get("beta", 1.0)
    x = imp.tensor(a, ctx.name, 0)
    if ctx.attrs.get("transA", 0):
        x = imp.b.transpose(x, perm=(1, 0), name=ctx.sub("transpose_a"))
    if isinstance(b, Const) and ctx.attrs.get("transB", 0) and imp.may_relayout(b, ctx.inputs[1]):
        # A weight stored transposed and read once: stored as the product uses it.
        w = imp.tensor(Const(np.ascontiguousarray(b.value.T), b.param, b.name), ctx.name, 1)
    else:
        w = imp.tensor(b, ctx.name, 1)
        if ctx.attrs.get("transB", 0):
            w = imp.b.transpose(w, perm=(1, 0), name=ctx.sub("transpose_b"))
    if alpha != 1.0:
        x = imp.b.scale(x, factor=alpha, name=ctx.sub("alpha"))
    if c is None:
        return [imp.b.matmul(x, w, name=ctx.name)]
    y = imp.b.matmul(x, w, name=ctx.sub("matmul"))
    if beta != 1.0:
        if isinstance(c, Const):
            c = Const(c.value * beta, c.param, c.name)
        else:
            c = imp.b.scale(c, factor=beta, name=ctx.sub("beta"))
    return [imp.b.add(y, imp.tensor(c, ctx.name, 2), name=ctx.name)]


def _conv_pads(a: dict[str, Any], x: Tensor, kernel: tuple[int, int]) -> list[int]:
    """ONNX's pads ``[top, left, bottom, right]`` of a Conv, ``auto_pad`` resolved."""
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        return list(a.get("pads", [0, 0, 0, 0])) if auto == "NOTSET" else [0, 0, 0, 0]
    strides, dilations = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
    lo, hi = [], []
    for k in range(2):
        size, s, span = x.shape.sizes[2 + k], strides[k], dilations[k] * (kernel[k] - 1) + 1
        total = max((-(-size // s) - 1) * s + span - size, 0)
        # SAME_UPPER puts the odd element at the end, SAME_LOWER at the start.
        small = total // 2
        lo.append(small if auto == "SAME_UPPER" else total - small)
        hi.append(total - lo[-1])
    return [*lo, *hi]


@_handles("Conv")
def _conv(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    if x.shape.rank != 4:
        raise _Unsupported(f"{x.shape.rank - 2}-D convolution (pcgopt has conv2d)")
    a = ctx.attrs
    w = imp.tensor(ins[1], ctx.name, 1)
    pads = _conv_pads(a, x, w.shape.sizes[2:])
    args = [x, w]
    if len(ins) > 2 and ins[2] is not None:
        args.append(imp.tensor(ins[2], ctx.name, 2))
    return [
        padded_conv2d(
            imp.b,
            args,
            pads[:2],
            pads[2:],
            ctx.name,
            stride=tuple(a.get("strides", [1, 1])),
            groups=a.get("group", 1),
            dilation=tuple(a.get("dilations", [1, 1])),
        )
    ]


@_handles("ConvTranspose")
def _conv_transpose(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    # The convolution of the input dilated by the stride with the flipped kernel, its channels
    # swapped: exact. The kernel is stored that way (a parameter read once).
    x = imp.tensor(ins[0], ctx.name, 0)
    w = ins[1]
    a = ctx.attrs
    if x.shape.rank != 4:
        raise _Unsupported(f"{x.shape.rank - 2}-D transposed convolution (pcgopt has conv2d)")
    if not isinstance(w, Const) or not imp.may_relayout(w, ctx.inputs[1]):
        raise _Unsupported("a transposed convolution whose kernel is computed or shared")
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or "output_shape" in a:
        raise _Unsupported("auto_pad or output_shape (give pads and output_padding)")
    g = a.get("group", 1)
    c, og, kh, kw = w.value.shape
    flipped = w.value[:, :, ::-1, ::-1].reshape(g, c // g, og, kh, kw).transpose(0, 2, 1, 3, 4)
    kernel = Const(np.ascontiguousarray(flipped.reshape(g * og, c // g, kh, kw)), w.param, w.name)
    strides, dilations = a.get("strides", [1, 1]), a.get("dilations", [1, 1])
    pads, extra = a.get("pads", [0, 0, 0, 0]), a.get("output_padding", [0, 0])
    lo = [dilations[k] * ((kh, kw)[k] - 1) - pads[k] for k in range(2)]
    hi = [dilations[k] * ((kh, kw)[k] - 1) - pads[2 + k] + extra[k] for k in range(2)]
    args = [x, imp.tensor(kernel, ctx.name, 1)]
    if len(ins) > 2 and ins[2] is not None:
        args.append(imp.tensor(ins[2], ctx.name, 2))
    y = padded_conv2d(
        imp.b,
        args,
        lo,
        hi,
        ctx.name,
        input_dilation=tuple(strides),
        groups=g,
        dilation=tuple(dilations),
    )
    return [y]


@_handles("Pad")
def _pad(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    if ctx.attrs.get("mode", "constant") != "constant":
        raise _Unsupported(f"{ctx.attrs['mode']} padding (pcgopt pads with a constant)")
    pads = [int(v) for v in _const(ins[1], "the pads of Pad").reshape(-1)]
    value = 0.0
    if len(ins) > 2 and ins[2] is not None:
        value = float(np.asarray(_const(ins[2], "the value of Pad")).reshape(-1)[0])
    rank = x.shape.rank
    axes = list(range(rank))
    if len(ins) > 3 and ins[3] is not None:
        axes = [int(v) % rank for v in _const(ins[3], "the axes of Pad").reshape(-1)]
    low, high = [0] * rank, [0] * rank
    for k, axis in enumerate(axes):
        low[axis], high[axis] = pads[k], pads[len(axes) + k]
    return [pad_or_slice(imp.b, x, low, high, value, ctx.name)]


def _pool_handler(mode: str) -> Handler:
    def handle(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
        x = imp.tensor(ins[0], ctx.name, 0)
        a = ctx.attrs
        if x.shape.rank != 4:
            raise _Unsupported(f"{x.shape.rank - 2}-D pooling")
        if a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", [1, 1])):
            raise _Unsupported("ceil_mode or dilations")
        pads = a.get("pads", [0, 0, 0, 0])
        if pads[0] != pads[2] or pads[1] != pads[3]:
            raise _Unsupported(f"asymmetric padding {pads}")
        if mode == "avg" and any(pads) and not a.get("count_include_pad", 0):
            raise _Unsupported("average pooling that excludes padding from the count")
        return [
            imp.b.pool2d(
                x,
                kernel=tuple(a["kernel_shape"]),
                stride=tuple(a.get("strides", a["kernel_shape"])),
                padding=(pads[0], pads[1]),
                mode=mode,
                name=ctx.name,
            )
        ]

    return handle


_HANDLERS["MaxPool"] = _pool_handler("max")
_HANDLERS["AveragePool"] = _pool_handler("avg")


@_handles("GlobalAveragePool")
def _global_avg(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = ins[0]
    axes = tuple(range(2, x.shape.rank))
    return [imp.b.reduce_mean(x, axes=axes, keepdims=True, name=ctx.name)]


@_handles("BatchNormalization")
def _batch_norm(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    if ctx.attrs.get("training_mode", 0):
        raise _Unsupported("training-mode batch normalization (export the model in eval mode)")
    x = imp.tensor(ins[0], ctx.name, 0)
    stats = []
    for k, v in enumerate(ins[1:5], 1):
        if isinstance(v, Const) and k >= 3 and v.param:
            v = imp.buffer_of(v)  # running statistics are buffers, not parameters
        stats.append(imp.tensor(v, ctx.name, k))
    return [imp.b.batch_norm(x, *stats, eps=ctx.attrs.get("epsilon", 1e-5), name=ctx.name)]


@_handles("LayerNormalization")
def _layer_norm(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    axis = ctx.attrs.get("axis", -1)
    axis = axis + x.shape.rank if axis < 0 else axis
    tail = x.shape.sizes[axis:]
    gamma = imp.tensor(_full(ins[1], tail), ctx.name, 1)
    beta_in = ins[2] if len(ins) > 2 and ins[2] is not None else Const(np.zeros(tail, np.float32))
    beta = imp.tensor(_full(beta_in, tail), ctx.name, 2)
    return [
        imp.b.layer_norm(
            x,
            gamma,
            beta,
            normalized_dims=x.shape.rank - axis,
            eps=ctx.attrs.get("epsilon", 1e-5),
            name=ctx.name,
        )
    ]


def _full(v: Any, shape: tuple[int, ...]) -> Any:
    """A constant scale or bias broadcast to ``shape`` (ONNX allows broadcastable ones)."""
    if isinstance(v, Const) and v.value.shape != tuple(shape):
        return Const(np.broadcast_to(v.value, shape).copy(), v.param, v.name)
    return v


@_handles("Softmax")
def _softmax(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    return [imp.b.softmax(x, axis=ctx.attrs.get("axis", -1), name=ctx.name)]


_REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max"}


def _reduce_handler(op: str) -> Handler:
    def handle(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
        x = imp.tensor(ins[0], ctx.name, 0)
        if len(ins) > 1 and ins[1] is not None:
            axes = [int(a) for a in _const(ins[1], "reduction axes").reshape(-1)]
        else:
            axes = list(ctx.attrs.get("axes", []))
        if not axes:
            if ctx.attrs.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.shape.rank))
        return [
            imp.b.apply(
                op,
                x,
                axes=tuple(sorted(a % x.shape.rank for a in axes)),
                keepdims=bool(ctx.attrs.get("keepdims", 1)),
                name=ctx.name,
            )
        ]

    return handle


for _onnx_op, _pcg_op in _REDUCE.items():
    _HANDLERS[_onnx_op] = _reduce_handler(_pcg_op)


@_handles("Reshape")
def _reshape(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    target = [int(s) for s in _const(ins[1], "the target shape of Reshape")]
    allowzero = ctx.attrs.get("allowzero", 0)
    sizes = list(x.shape.sizes)
    out = [sizes[k] if s == 0 and not allowzero else s for k, s in enumerate(target)]
    if -1 in out:
        known = math.prod(s for s in out if s != -1)
        out[out.index(-1)] = x.shape.numel // known if known else 0
    return [reshape_to(imp.b, x, tuple(out), ctx.name)]


@_handles("Flatten")
def _flatten(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = ins[0]
    axis = ctx.attrs.get("axis", 1)
    axis += x.shape.rank if axis < 0 else 0  # 0..rank: Flatten at the rank gives [numel, 1]
    s = x.shape.sizes
    return [reshape_to(imp.b, x, (math.prod(s[:axis]), math.prod(s[axis:])), ctx.name)]


def _squeeze_handler(unsqueeze: bool) -> Handler:
    def handle(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
        x = ins[0]
        sizes = list(x.shape.sizes)
        if len(ins) > 1 and ins[1] is not None:
            axes = [int(a) for a in _const(ins[1], "axes").reshape(-1)]
        else:
            axes = list(ctx.attrs.get("axes", []))
        if unsqueeze:
            rank = len(sizes) + len(axes)
            for a in sorted(a % rank for a in axes):
                sizes.insert(a, 1)
        else:
            drop = (
                {a % len(sizes) for a in axes}
                if axes
                else {k for k, s in enumerate(sizes) if s == 1}
            )
            sizes = [s for k, s in enumerate(sizes) if k not in drop]
        return [reshape_to(imp.b, x, tuple(sizes), ctx.name)]

    return handle


_HANDLERS["Squeeze"] = _squeeze_handler(False)
_HANDLERS["Unsqueeze"] = _squeeze_handler(True)


@_handles("Transpose")
def _transpose(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    perm = tuple(ctx.attrs.get("perm", range(x.shape.rank - 1, -1, -1)))
    if perm == tuple(range(x.shape.rank)):
        return [x]
    return [imp.b.transpose(x, perm=perm, name=ctx.name)]


@_handles("Concat")
def _concat(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    parts = [imp.tensor(v, ctx.name, k) for k, v in enumerate(ins) if v is not None]
    parts = [p for p in parts if p.shape.numel > 0]
    if len(parts) == 1:
        return [parts[0]]
    return [imp.b.concat(*parts, axis=ctx.attrs["axis"], name=ctx.name)]


@_handles("Split")
def _split(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    axis = ctx.attrs.get("axis", 0) % x.shape.rank
    if len(ins) > 1 and ins[1] is not None:
        sizes = tuple(int(s) for s in _const(ins[1], "split sizes"))
    elif "split" in ctx.attrs:
        sizes = tuple(ctx.attrs["split"])
    else:
        n = ctx.attrs.get("num_outputs") or 1
        total = x.shape.sizes[axis]
        each = -(-total // n)
        sizes = tuple(min(each, total - k * each) for k in range(n))
    if len(sizes) == 1:
        return [x]
    outs = imp.b.split(x, axis=axis, sizes=sizes, name=ctx.name)
    return list(outs)


@_handles("Slice")
def _slice(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    starts = _const(ins[1], "Slice starts").reshape(-1)
    ends = _const(ins[2], "Slice ends").reshape(-1)
    rank = x.shape.rank
    axes = (
        _const(ins[3], "Slice axes").reshape(-1)
        if len(ins) > 3 and ins[3] is not None
        else np.arange(len(starts))
    )
    steps = (
        _const(ins[4], "Slice steps").reshape(-1)
        if len(ins) > 4 and ins[4] is not None
        else np.ones(len(starts), np.int64)
    )
    out = x
    for k, (s, e, a, st) in enumerate(zip(starts, ends, axes, steps, strict=True)):
        if st != 1:
            raise _Unsupported(f"a slice with step {st}")
        a = int(a) % rank
        size = out.shape.sizes[a]
        lo, hi = _clamp(int(s), size), _clamp(int(e), size)
        if (lo, hi) == (0, size):
            continue
        if hi <= lo:
            raise _Unsupported("an empty slice")
        name = ctx.name if k == len(starts) - 1 else ctx.sub(f"axis{a}")
        out = imp.b.slice(out, axis=a, start=lo, stop=hi, name=name)
    return [out]


def _clamp(i: int, size: int) -> int:
    if i < 0:
        i += size
    return min(max(i, 0), size)


@_handles("OneHot")
def _one_hot(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    # A one-hot is a lookup in off + (on - off) * I: exact, and partitioned like any embedding.
    idx = ins[0]
    depth = int(np.asarray(_const(ins[1], "OneHot's depth")).reshape(()))
    off, on = np.asarray(_const(ins[2], "OneHot's values"), np.float32).reshape(2)
    if not isinstance(idx, Tensor) or not idx.shape.dtype.is_integer:
        raise _Unsupported("a one-hot of constant or non-integer indices")
    if ctx.attrs.get("axis", -1) not in (-1, idx.shape.rank):
        raise _Unsupported("a one-hot along an axis other than the last")
    try:
        table = Const(identity_table(depth, float(off), float(on)))
    except ValueError as e:
        raise _Unsupported(str(e)) from None
    return [imp.b.embedding(idx, imp.tensor(table, ctx.name, 2), name=ctx.name)]


@_handles("Gather")
def _gather(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    data, idx = ins
    axis = ctx.attrs.get("axis", 0)
    if isinstance(idx, Tensor):
        # A lookup: integer indices into the slices of a table (or of a computed tensor).
        if not idx.shape.dtype.is_integer:
            raise _Unsupported("a gather at float indices")
        return [lookup(imp.b, imp.tensor(data, ctx.name, 0), idx, axis, ctx.name)]
    # Constant indices into a computed tensor or a parameter (position ids into a table).
    x = imp.tensor(data, ctx.name, 0)
    axis %= x.shape.rank
    i = np.asarray(idx.value).astype(np.int64)
    i = np.where(i < 0, i + x.shape.sizes[axis], i)
    # Indices repeated along leading dimensions (positions for every sequence of a batch):
    # gather once, then broadcast.
    core, lead = i, []
    while core.ndim > 1 and bool((core == core[:1]).all()):
        lead.append(core.shape[0])
        core = core[0]
    flat = core.reshape(-1)
    sizes = list(x.shape.sizes)
    if flat.size and bool((np.diff(flat) == 1).all()):
        part = x
        lo, hi = int(flat[0]), int(flat[-1]) + 1
        if (lo, hi) != (0, x.shape.sizes[axis]):
            part = imp.b.slice(x, axis=axis, start=lo, stop=hi, name=ctx.sub("slice"))
    elif flat.size and bool((flat == flat[0]).all()) and axis == 0:
        part = imp.b.slice(
            x, axis=0, start=int(flat[0]), stop=int(flat[0]) + 1, name=ctx.sub("row")
        )
        part = broadcast_to(imp.b, part, (flat.size, *sizes[1:]), ctx.sub("rows"))
    elif axis == 0 and x.shape.rank == 2:
        # Any other constant rows: a product with their one-hot matrix (exact: one term each).
        onehot = Const(np.eye(sizes[0], dtype=np.float32)[flat])
        part = imp.b.matmul(imp.tensor(onehot, ctx.name, 1), x, name=ctx.sub("rows"))
    else:
        raise _Unsupported("a gather at constant indices that are not a range along axis 0")
    sizes[axis : axis + 1] = list(core.shape)
    part = reshape_to(imp.b, part, tuple(sizes), ctx.sub("reshape") if lead else ctx.name)
    if lead:
        part = broadcast_to(imp.b, part, (*lead, *part.shape.sizes), ctx.name)
    return [part]


@_handles("TopK")
def _top_k(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    k = int(np.asarray(_const(ins[1], "the k of TopK")).reshape(-1)[0])
    axis = ctx.attrs.get("axis", -1)
    if ctx.attrs.get("largest", 1):
        return list(imp.b.top_k(x, k=k, axis=axis, name=ctx.name))
    # The k smallest: the k largest of -x, negated back.
    values, indices = imp.b.top_k(imp.b.neg(x, name=ctx.sub("neg")), k=k, axis=axis, name=ctx.name)
    return [imp.b.neg(values, name=ctx.sub("values")), indices]


def _arg_handler(largest: bool) -> Handler:
    def handle(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
        x = imp.tensor(ins[0], ctx.name, 0)
        if ctx.attrs.get("select_last_index", 0):
            raise _Unsupported("select_last_index=1 (pcgopt picks the first of equal elements)")
        axis = ctx.attrs.get("axis", 0) % x.shape.rank
        if not largest:
            x = imp.b.neg(x, name=ctx.sub("neg"))
        _, indices = imp.b.top_k(x, k=1, axis=axis, name=ctx.sub("top_k"))
        sizes = list(indices.shape.sizes)
        if not ctx.attrs.get("keepdims", 1):
            del sizes[axis]
        return [reshape_to(imp.b, indices, tuple(sizes), ctx.name)]

    return handle


_HANDLERS["ArgMax"] = _arg_handler(True)
_HANDLERS["ArgMin"] = _arg_handler(False)


def _unchanged(given: dict[str, np.ndarray], k: int, size: int) -> bool:
    """Whether a Resize's k-th axis (of this size) keeps its size and scale."""
    kind, value = next(iter(given.items()))
    return int(value[k]) == size if kind == "sizes" else float(value[k]) == 1.0


@_handles("Resize")
def _resize(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    # Resizing (nearest, linear or cubic, any coordinate mode) acts on each axis by a matrix:
    # ONNX's own Resize run on an identity gives it. A whole-number upsampling is a repeat.
    x = imp.tensor(ins[0], ctx.name, 0)
    a = ctx.attrs
    if a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        raise _Unsupported("tf_crop_and_resize")
    if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise _Unsupported(f"keep_aspect_ratio_policy={a['keep_aspect_ratio_policy']}")
    rank = x.shape.rank
    axes = [int(v) % rank for v in a.get("axes", range(rank))]
    given = {}
    for slot, what in ((2, "scales"), (3, "sizes")):
        if len(ins) > slot and ins[slot] is not None:
            v = _const(ins[slot], f"the {what} of Resize").reshape(-1)
            if v.size:
                given[what] = v
    if not given:
        raise _Unsupported("a Resize without scales or sizes")
    attrs = {k: v for k, v in a.items() if k not in ("axes", "keep_aspect_ratio_policy")}
    y = x
    for k, axis in enumerate(axes):
        n = x.shape.sizes[axis]
        if _unchanged(given, k, n):
            continue
        kind, value = next(iter(given.items()))
        per_axis = value[k]
        # Rows of the identity resized along the second axis: column i is where input i goes.
        feed = (
            {"scales": np.array([1.0, per_axis], np.float32)}
            if kind == "scales"
            else {"sizes": np.array([n, int(per_axis)], np.int64)}
        )
        probe = imp.onnx.helper.make_node(
            "Resize",
            ["X", "", "scales" if kind == "scales" else "", "sizes" if kind == "sizes" else ""],
            ["Y"],
            name=f"{ctx.name}/axis{axis}",
            **attrs,
        )
        consts = [Const(np.eye(n, dtype=np.float64)), None, None, None]
        consts[2 if kind == "scales" else 3] = Const(next(iter(feed.values())))
        (resized,) = imp._fold(probe, consts)
        last = all(
            _unchanged(given, j, x.shape.sizes[later]) for j, later in enumerate(axes) if j > k
        )
        y = resample(
            imp.b,
            y,
            np.asarray(resized).T,
            axis,
            ctx.name if last else ctx.sub(f"axis{axis}"),
            lambda m, role: imp.tensor(Const(m), ctx.name, 1),
        )
    return [y]


@_handles("Expand")
def _expand(imp: _Importer, ctx: _Ctx, ins: list[Any]) -> list[Value]:
    x = imp.tensor(ins[0], ctx.name, 0)
    shape = tuple(int(s) for s in _const(ins[1], "the shape of Expand"))
    target = tuple(np.broadcast_shapes(x.shape.sizes, shape))
    return [broadcast_to(imp.b, x, target, ctx.name)]


# ------------------------------------------------------------------------------------------------
# public API
# ------------------------------------------------------------------------------------------------


def from_onnx(model_or_path: Any, *, dims: Mapping[str, int] | None = None) -> ImportedModel:
    """Imports an ONNX model (a ``ModelProto``, or a path to a ``.onnx`` file) as a PCG.

    ``dims`` binds the symbolic dimensions of the graph inputs (``{"batch": 64}``); an unbound
    one is an error that names it. Raises :class:`~pcgopt.FrontendError` listing every
    unsupported operator (see the module docstring for what is imported how)."""
    onnx = _onnx()
    if isinstance(model_or_path, str | Path):
        path = Path(model_or_path)
        if not path.is_file():
            raise FrontendError(f"{path}: no such ONNX file")
        try:
            model = onnx.load(str(path))
        except Exception as e:  # protobuf's DecodeError and friends
            raise FrontendError(f"{path}: not a readable ONNX model ({e})") from None
    else:
        model = model_or_path
    if not hasattr(model, "graph"):
        raise FrontendError(
            f"from_onnx takes an onnx.ModelProto or a path, not {type(model).__name__}"
        )
    return _Importer(model, dims or {}).run()


def to_onnx(
    pcg: Any, *, weights: Mapping[str, np.ndarray] | None = None, opset: int = MIN_OPSET
) -> Any:
    """Writes an unpartitioned PCG as an ONNX model, for the operators both sides share
    (:data:`pcgopt.frontend.export.EXPORTED_OPS`); weights become initializers holding
    ``weights[name]`` (random when not given). The inverse of :func:`from_onnx` up to names,
    used to test the importer."""
    from pcgopt.frontend.export import pcg_to_onnx

    return pcg_to_onnx(pcg, weights=weights, opset=opset)
