"""An unpartitioned PCG written as ONNX, for the operators both sides share.

Its purpose is testing the importer on graphs nobody wrote by hand (a random PCG written out
and read back must compute the same), so GELUs are written out the way exporters write them
(erf or tanh formulas), which exercises pattern recognition too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pcgopt.errors import FrontendError
from pcgopt.evaluate import random_feeds
from pcgopt.graph import PCG, Node
from pcgopt.ops import OpKind

_ONNX_TYPES = {"f32": 1, "i64": 7, "i32": 6, "f64": 11, "f16": 10}


class _Writer:
    def __init__(self, onnx: Any) -> None:
        self.onnx = onnx
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0

    def const(self, value: Any, dtype: Any = np.float32) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(
        self, op_type: str, inputs: list[str], name: str, out: str | None = None, **attrs
    ) -> str:
        self.count += 1
        out = out or f"{name}__{self.count}"
        self.nodes.append(
            self.onnx.helper.make_node(
                op_type, inputs, [out], name=f"{name}/{op_type}{self.count}", **attrs
            )
        )
        return out


_SIMPLE = {
    "relu": "Relu",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "erf": "Erf",
    "neg": "Neg",
    "reciprocal": "Reciprocal",
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "maximum": "Max",
    "matmul": "MatMul",
    "batch_matmul": "MatMul",
}


def _emit(w: _Writer, node: Node, ins: list[str], out: str, pcg: PCG) -> None:
    p = node.params
    name = node.name
    if node.op in _SIMPLE:
        w.op(_SIMPLE[node.op], ins, name, out)
    elif node.op == "scale":
        w.op("Mul", [ins[0], w.const(p["factor"])], name, out)
    elif node.op == "pow":
        w.op("Pow", [ins[0], w.const(p["exponent"])], name, out)
    elif node.op == "linear":
        y = w.op(
            "MatMul", ins[:2], name, None if len(ins) > 2 or p["activation"] != "none" else out
        )
        if len(ins) > 2:
            y = w.op("Add", [y, ins[2]], name, None if p["activation"] != "none" else out)
        if p["activation"] != "none":
            _emit(w, Node(name, p["activation"]), [y], out, pcg)
    elif node.op == "gelu_erf":
        # x * 0.5 * (1 + erf(x / sqrt(2))), as torch.onnx writes nn.GELU().
        t = w.op("Div", [ins[0], w.const(math.sqrt(2.0))], name)
        t = w.op("Add", [w.op("Erf", [t], name), w.const(1.0)], name)
        w.op("Mul", [w.op("Mul", [ins[0], t], name), w.const(0.5)], name, out)
    elif node.op == "gelu":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as GPT-2's gelu_new is written.
        cube = w.op("Pow", [ins[0], w.const(3.0)], name)
        inner = w.op("Add", [ins[0], w.op("Mul", [cube, w.const(0.044715)], name)], name)
        t = w.op("Tanh", [w.op("Mul", [inner, w.const(math.sqrt(2.0 / math.pi))], name)], name)
        half = w.op("Mul", [ins[0], w.const(0.5)], name)
        w.op("Mul", [half, w.op("Add", [t, w.const(1.0)], name)], name, out)
    elif node.op == "transpose":
        w.op("Transpose", ins, name, out, perm=list(p["perm"]))
    elif node.op == "reshape":
        w.op("Reshape", [ins[0], w.const(list(p["shape"]), np.int64)], name, out)
    elif node.op == "broadcast":
        w.op("Expand", [ins[0], w.const(list(p["shape"]), np.int64)], name, out)
    elif node.op == "concat":
        w.op("Concat", ins, name, out, axis=p["axis"])
    elif node.op == "slice":
        consts = [w.const([v], np.int64) for v in (p["start"], p["stop"], p["axis"])]
        w.op("Slice", [ins[0], *consts], name, out)
    elif node.op == "softmax":
        w.op("Softmax", ins, name, out, axis=p["axis"])
    elif node.op == "layer_norm":
        rank = pcg.shape(node.inputs[0]).rank
        axis = rank - p["normalized_dims"]
        w.op("LayerNormalization", ins, name, out, axis=axis, epsilon=p["eps"])
    elif node.op in ("reduce_sum", "reduce_mean", "reduce_max"):
        onnx_op = {
            "reduce_sum": "ReduceSum",
            "reduce_mean": "ReduceMean",
            "reduce_max": "ReduceMax",
        }
        axes = w.const(list(p["axes"]), np.int64)
        keep = int(p["keepdims"])
        if node.op == "reduce_sum":
            w.op("ReduceSum", [ins[0], axes], name, out, keepdims=keep)
        else:  # attribute axes until opset 18
            w.op(onnx_op[node.op], ins, name, out, axes=list(p["axes"]), keepdims=keep)
    else:
        raise FrontendError(
            f"to_onnx: no ONNX form for {node.op} (node {node.name!r})", node=node.name
        )


EXPORTED_OPS: tuple[str, ...] = (
    *_SIMPLE,
    "scale",
    "pow",
    "linear",
    "gelu_erf",
    "gelu",
    "transpose",
    "reshape",
    "broadcast",
    "concat",
    "slice",
    "softmax",
    "layer_norm",
    "reduce_sum",
    "reduce_mean",
    "reduce_max",
)


def pcg_to_onnx(
    pcg: PCG,
    *,
    weights: Mapping[str, np.ndarray] | None = None,
    opset: int = 17,
    seed: int = 0,
    on_node: Callable[[Node], None] | None = None,
) -> Any:
    """``pcg`` (unpartitioned, operators of :data:`EXPORTED_OPS`) as an ONNX ``ModelProto``.
    Inputs become graph inputs; weights become initializers holding ``weights[name]`` (random
    from ``seed`` when not given)."""
    import onnx

    w = _Writer(onnx)
    feeds = random_feeds(pcg, seed, np.float32)
    given = dict(weights or {})
    graph_inputs = []
    names: dict[Any, str] = {}
    for node in pcg.nodes:
        kind = node.spec.kind
        if kind is OpKind.PARALLEL or not all(
            s.is_unpartitioned for s in pcg.output_shapes(node.name)
        ):
            raise FrontendError(
                f"to_onnx writes unpartitioned PCGs; node {node.name!r} is {node.op}",
                node=node.name,
            )
        shape = pcg.shape(node.name)
        if node.op == "input":
            graph_inputs.append(
                onnx.helper.make_tensor_value_info(
                    node.name, _ONNX_TYPES[shape.dtype.value], shape.sizes
                )
            )
            names[node.output()] = node.name
            continue
        if node.op == "weight":
            value = np.asarray(given.get(node.name, feeds[node.name]), np.float32)
            w.inits.append(onnx.numpy_helper.from_array(value, node.name))
            names[node.output()] = node.name
            continue
        out = f"{node.name}__out"
        _emit(w, node, [names[r] for r in node.inputs], out, pcg)
        names[node.output()] = out
        if on_node:
            on_node(node)
    outputs = [
        onnx.helper.make_tensor_value_info(names[r], 1, pcg.shape(r).sizes) for r in pcg.outputs
    ]
    graph = onnx.helper.make_graph(w.nodes, "pcgopt", graph_inputs, outputs, w.inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model
