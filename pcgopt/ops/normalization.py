"""Normalizations: BatchNorm, LayerNorm, Softmax."""

from __future__ import annotations

import math

from pcgopt.errors import ShapeError
from pcgopt.ops.arrays import array_module
from pcgopt.ops.elementwise import require_float, same_dtype
from pcgopt.ops.params import Param, ParamType
from pcgopt.ops.spec import AxisKind, ComputeOp, LoopAxis, Signature


class BatchNorm(ComputeOp):
    """Batch normalization with given statistics, per channel (dimension 1):
    (x - mean) / sqrt(var + eps) * scale + bias, for x [N, C, ...] and scale, bias, mean, var [C]
    (ONNX's BatchNormalization inputs).

    pcgopt uses this fixed-statistics form so that every split of the batch is exactly the same
    computation. Data-parallel training frameworks compute statistics per device, which is a
    different (accepted) computation; the costs of the two forms are alike.
    """

    name = "batch_norm"
    input_names = ("x", "scale", "bias", "mean", "var")
    params = (Param("eps", ParamType.FLOAT, 1e-5, lifted=False),)

    def infer_logical(self, params, inputs):
        x = inputs[0]
        same_dtype(self.name, self.input_names, inputs)
        require_float(self.name, "x", x)
        if x.rank < 2:
            raise ShapeError(f"batch_norm needs x [N, C, ...], got {x}")
        for name, s in zip(self.input_names[1:], inputs[1:], strict=True):
            if s.sizes != (x.sizes[1],):
                raise ShapeError(
                    f"batch_norm: {name} must be [{x.sizes[1]}] (one per channel), got {s}"
                )
        return (x.unpartitioned(),)

    def signature(self, params, in_sizes, out_sizes):
        rank = len(in_sizes[0])
        axes = [
            LoopAxis(
                "channel" if k == 1 else f"d{k}",
                AxisKind.PARALLEL,
                (k, *((0,) * 4 if k == 1 else (None,) * 4)),
                (k,),
            )
            for k in range(rank)
        ]
        return Signature(tuple(axes))

    def reference(self, params, x, scale, bias, mean, var):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        inv = scale / array_module(var).sqrt(var + params["eps"])
        return ((x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape),)

    def count_flops(self, params, in_sizes, out_sizes):
        return 2 * math.prod(out_sizes[0])


class LayerNorm(ComputeOp):
    """Layer normalization over the last ``normalized_dims`` dimensions, with elementwise
    scale (gamma) and shift (beta) of those dimensions' shape."""

    name = "layer_norm"
    input_names = ("x", "gamma", "beta")
    params = (
        Param("normalized_dims", ParamType.POS_INT, 1),
        Param("eps", ParamType.FLOAT, 1e-5, lifted=False),
    )

    def infer_logical(self, params, inputs):
        x, gamma, beta = inputs
        same_dtype(self.name, self.input_names, inputs)
        require_float(self.name, "x", x)
        k = params["normalized_dims"]
        if k > x.rank:
            raise ShapeError(f"layer_norm normalizes {k} dimensions of a rank-{x.rank} input")
        tail = x.sizes[x.rank - k :]
        for name, s in (("gamma", gamma), ("beta", beta)):
            if s.sizes != tail:
                raise ShapeError(f"layer_norm: {name} must be {list(tail)}, got {s}")
        return (x.unpartitioned(),)

    def signature(self, params, in_sizes, out_sizes):
        rank = len(in_sizes[0])
        lead = rank - params["normalized_dims"]
        axes = tuple(
            LoopAxis(f"d{k}", AxisKind.PARALLEL, (k, None, None), (k,)) for k in range(lead)
        )
        why = "layer_norm normalizes over it (its statistics need the whole dimension)"
        return Signature(axes, notes=tuple((0, k, why) for k in range(lead, rank)))

    def reference(self, params, x, gamma, beta):
        axes = tuple(range(x.ndim - params["normalized_dims"], x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
        return ((x - mean) / array_module(x).sqrt(var + params["eps"]) * gamma + beta,)

    def count_flops(self, params, in_sizes, out_sizes):
        return 8 * math.prod(out_sizes[0])


class Softmax(ComputeOp):
    """Softmax along ``axis``."""

    name = "softmax"
    input_names = ("x",)
    params = (Param("axis", ParamType.AXIS, -1),)

    def infer_logical(self, params, inputs):
        require_float(self.name, "x", inputs[0])
        return (inputs[0].unpartitioned(),)

    def signature(self, params, in_sizes, out_sizes):
        axes = tuple(
            LoopAxis(f"d{k}", AxisKind.PARALLEL, (k,), (k,))
            for k in range(len(in_sizes[0]))
            if k != params["axis"]
        )
        why = "softmax normalizes along it"
        return Signature(axes, notes=((0, params["axis"], why),))

    def reference(self, params, x):
        z = array_module(x).exp(x - x.max(axis=params["axis"], keepdims=True))
        return (z / z.sum(axis=params["axis"], keepdims=True),)

    def count_flops(self, params, in_sizes, out_sizes):
        return 5 * math.prod(out_sizes[0])
