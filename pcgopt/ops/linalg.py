"""Matrix products: MatMul, BatchMatMul, and Linear (MatMul + bias + activation, fused)."""

from __future__ import annotations

import math
from typing import Any

from pcgopt.errors import ShapeError
from pcgopt.ops.elementwise import GELU, ReLU, Sigmoid, Tanh, require_float, same_dtype
from pcgopt.ops.params import Param, ParamType
from pcgopt.ops.spec import AxisKind, ComputeOp, LoopAxis, Signature
from pcgopt.shapes import ParallelTensorShape

#: Activations a fused operator may apply, each defined once by its own operator spec.
ACTIVATIONS = {"relu": ReLU(), "gelu": GELU(), "sigmoid": Sigmoid(), "tanh": Tanh()}
ACTIVATION_CHOICES = ("none", *ACTIVATIONS)


def apply_activation(name: str, x: Any) -> Any:
    return x if name == "none" else ACTIVATIONS[name].fn(None, x)


def activation_flops(name: str, numel: int) -> int:
    return 0 if name == "none" else ACTIVATIONS[name].flops_per_element * numel


def _check_contraction(op: str, a: ParallelTensorShape, b: ParallelTensorShape, ka: int, kb: int):
    if a.sizes[ka] != b.sizes[kb]:
        raise ShapeError(
            f"{op}: contraction sizes differ: {list(a.sizes)} x {list(b.sizes)} "
            f"({a.sizes[ka]} vs {b.sizes[kb]})"
        )


class MatMul(ComputeOp):
    """a @ b for a of shape [..., k] and b of shape [k, n]; the result is [..., n].

    Splitting k leaves partial sums (reduction parallelism); splitting a's leading dimensions
    needs b copied (data parallelism); splitting n needs a copied (model parallelism).
    """

    name = "matmul"
    input_names = ("a", "b")

    def infer_logical(self, params, inputs):
        a, b = inputs
        same_dtype(self.name, self.input_names, inputs)
        require_float(self.name, "a", a)
        if a.rank < 1 or b.rank != 2:
            raise ShapeError(f"matmul needs a of rank >= 1 and b of rank 2, got {a} and {b}")
        _check_contraction(self.name, a, b, -1, 0)
        return (ParallelTensorShape.of((*a.sizes[:-1], b.sizes[1]), a.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        ra = len(in_sizes[0])
        axes = [LoopAxis(f"m{k}", AxisKind.PARALLEL, (k, None), (k,)) for k in range(ra - 1)]
        axes.append(LoopAxis("n", AxisKind.PARALLEL, (None, 1), (ra - 1,)))
        axes.append(LoopAxis("k", AxisKind.REDUCE, (ra - 1, 0)))
        return Signature(tuple(axes), linear_in=(0, 1))

    def reference(self, params, a, b):
        return (a @ b,)

    def count_flops(self, params, in_sizes, out_sizes):
        return 2 * math.prod(out_sizes[0]) * in_sizes[0][-1]


class BatchMatMul(ComputeOp):
    """Batched a @ b: a [*batch, m, k], b [*batch, k, n] -> [*batch, m, n] (equal batch dims).

    Splitting a batch dimension (e.g. attention heads) needs no copies and no reduction.
    """

    name = "batch_matmul"
    input_names = ("a", "b")

    def infer_logical(self, params, inputs):
        a, b = inputs
        same_dtype(self.name, self.input_names, inputs)
        require_float(self.name, "a", a)
        if a.rank < 3 or a.rank != b.rank or a.sizes[:-2] != b.sizes[:-2]:
            raise ShapeError(
                f"batch_matmul needs a [*batch, m, k] and b [*batch, k, n] of rank >= 3 with equal "
                f"batch dimensions, got {a} and {b}"
            )
        _check_contraction(self.name, a, b, -1, -2)
        return (ParallelTensorShape.of((*a.sizes[:-1], b.sizes[-1]), a.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        r = len(in_sizes[0])
        axes = [LoopAxis(f"b{k}", AxisKind.PARALLEL, (k, k), (k,)) for k in range(r - 2)]
        axes += [
            LoopAxis("m", AxisKind.PARALLEL, (r - 2, None), (r - 2,)),
            LoopAxis("n", AxisKind.PARALLEL, (None, r - 1), (r - 1,)),
            LoopAxis("k", AxisKind.REDUCE, (r - 1, r - 2)),
        ]
        return Signature(tuple(axes), linear_in=(0, 1))

    def reference(self, params, a, b):
        return (a @ b,)

    def count_flops(self, params, in_sizes, out_sizes):
        return 2 * math.prod(out_sizes[0]) * in_sizes[0][-1]


class Linear(ComputeOp):
    """Dense layer: activation(x @ w + bias) for x [..., k], w [k, n], optional bias [n].

    With a bias or an activation the result is not linear in x or w, so k cannot be split:
    reduction parallelism needs the unfused form (MatMul, then Add and the activation).
    """

    name = "linear"
    input_names = ("x", "w", "bias")
    optional_inputs = 1
    params = (Param("activation", ParamType.STR, "none", ACTIVATION_CHOICES),)

    def infer_logical(self, params, inputs):
        x, w = inputs[:2]
        same_dtype(self.name, self.input_names, inputs)
        require_float(self.name, "x", x)
        if x.rank < 1 or w.rank != 2:
            raise ShapeError(f"linear needs x of rank >= 1 and w of rank 2, got {x} and {w}")
        _check_contraction(self.name, x, w, -1, 0)
        if len(inputs) == 3 and inputs[2].sizes != (w.sizes[1],):
            raise ShapeError(f"linear: bias must be [{w.sizes[1]}], got {inputs[2]}")
        return (ParallelTensorShape.of((*x.sizes[:-1], w.sizes[1]), x.dtype),)

    def _is_linear(self, params, n_inputs: int) -> bool:
        return n_inputs == 2 and params["activation"] == "none"

    def signature(self, params, in_sizes, out_sizes):
        rx = len(in_sizes[0])
        has_bias = len(in_sizes) == 3
        tail = (None,) if has_bias else ()
        axes = [LoopAxis(f"m{k}", AxisKind.PARALLEL, (k, None, *tail), (k,)) for k in range(rx - 1)]
        axes.append(
            LoopAxis("n", AxisKind.PARALLEL, (None, 1, *((0,) if has_bias else ())), (rx - 1,))
        )
        if self._is_linear(params, len(in_sizes)):
            axes.append(LoopAxis("k", AxisKind.REDUCE, (rx - 1, 0)))
            return Signature(tuple(axes), linear_in=(0, 1))
        why = (
            "with a bias or an activation, linear is not linear in x and w, so its contraction "
            "cannot leave partial sums; split k on the unfused matmul instead"
        )
        return Signature(tuple(axes), notes=((0, rx - 1, why), (1, 0, why)))

    def reference(self, params, x, w, bias=None):
        y = x @ w
        if bias is not None:
            y = y + bias
        return (apply_activation(params["activation"], y),)

    def count_flops(self, params, in_sizes, out_sizes):
        out = math.prod(out_sizes[0])
        bias = out if len(in_sizes) == 3 else 0
        return 2 * out * in_sizes[0][-1] + bias + activation_flops(params["activation"], out)
