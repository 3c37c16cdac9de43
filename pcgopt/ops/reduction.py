"""Reductions along axes: sum, mean (both linear: a split reduced axis leaves partial sums) and
max (not linear: reduced axes cannot be split); and the selection of the k largest elements
along an axis (TopK: a router's choice of experts, ArgMax)."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from pcgopt.errors import ShapeError
from pcgopt.ops.arrays import array_module
from pcgopt.ops.elementwise import require_float
from pcgopt.ops.params import Param, ParamType
from pcgopt.ops.spec import AxisKind, ComputeOp, LocalContext, LoopAxis, Signature
from pcgopt.shapes import DType, ParallelTensorShape


class AxisReduction(ComputeOp):
    input_names = ("x",)
    params = (Param("axes", ParamType.AXES), Param("keepdims", ParamType.BOOL, False))
    linear: ClassVar[bool] = True

    def infer_logical(self, params, inputs):
        (x,) = inputs
        require_float(self.name, "x", x)
        axes = params["axes"]
        if not axes or len(set(axes)) != len(axes):
            raise ShapeError(f"{self.name}: axes must be non-empty and distinct, got {list(axes)}")
        sizes = [1 if k in axes else s for k, s in enumerate(x.sizes)]
        if not params["keepdims"]:
            sizes = [s for k, s in enumerate(sizes) if k not in axes]
        return (ParallelTensorShape.of(sizes, x.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        axes, keep = params["axes"], params["keepdims"]
        loop, j = [], 0
        for k in range(len(in_sizes[0])):
            if k in axes:
                if self.linear:
                    loop.append(LoopAxis(f"r{k}", AxisKind.REDUCE, (k,)))
                j += keep
            else:
                loop.append(LoopAxis(f"d{k}", AxisKind.PARALLEL, (k,), (j,)))
                j += 1
        notes = (
            ()
            if self.linear
            else tuple(
                (
                    0,
                    k,
                    f"{self.name} is not a sum, so a split reduced axis cannot leave partial sums",
                )
                for k in axes
            )
        )
        return Signature(tuple(loop), linear_in=(0,) if self.linear else (), notes=notes)

    def count_flops(self, params, in_sizes, out_sizes):
        return math.prod(in_sizes[0])


class ReduceSum(AxisReduction):
    """Sum over ``axes``."""

    name = "reduce_sum"

    def reference(self, params, x):
        return (x.sum(axis=params["axes"], keepdims=params["keepdims"]),)


class ReduceMean(AxisReduction):
    """Mean over ``axes``."""

    name = "reduce_mean"

    def reference(self, params, x):
        return (x.mean(axis=params["axes"], keepdims=params["keepdims"]),)

    def local(self, params, ctx: LocalContext, x):
        # A block's share of the mean: its sum over the global count.
        count = math.prod(ctx.global_in_sizes[0][k] for k in params["axes"])
        return (x.sum(axis=params["axes"], keepdims=params["keepdims"]) / count,)


class ReduceMax(AxisReduction):
    """Maximum over ``axes``."""

    name = "reduce_max"
    linear = False

    def reference(self, params, x):
        return (x.max(axis=params["axes"], keepdims=params["keepdims"]),)


class TopK(ComputeOp):
    """The ``k`` largest elements of ``x`` along ``axis``, largest first, and their positions:
    two outputs, ``values`` (x's type) and ``indices`` (i64), each of x's shape with ``axis``
    of size k. Equal elements come in order of position (the lower first), as in
    ``jax.lax.top_k`` and ``torch.topk``. The selected axis cannot be split."""

    name = "top_k"
    input_names = ("x",)
    params = (Param("k", ParamType.POS_INT), Param("axis", ParamType.AXIS, -1))

    def num_outputs(self, params):
        return 2

    def infer_logical(self, params, inputs):
        (x,) = inputs
        require_float(self.name, "x", x)
        axis, k = params["axis"], params["k"]
        if not 0 <= axis < x.rank:
            raise ShapeError(f"top_k: axis {axis} is outside x's {x.rank} dimensions")
        if k > x.sizes[axis]:
            raise ShapeError(f"top_k: k={k} exceeds the size {x.sizes[axis]} of axis {axis} of x")
        sizes = list(x.sizes)
        sizes[axis] = k
        return (ParallelTensorShape.of(sizes, x.dtype), ParallelTensorShape.of(sizes, DType.I64))

    def signature(self, params, in_sizes, out_sizes):
        axis = params["axis"]
        axes = tuple(
            LoopAxis(f"d{k}", AxisKind.PARALLEL, (k,), (k, k))
            for k in range(len(in_sizes[0]))
            if k != axis
        )
        why = "the k largest of a block are not a block of the k largest"
        return Signature(axes, notes=((0, axis, why),))

    def reference(self, params, x):
        axis, k = params["axis"], params["k"]
        xp = array_module(x)
        if xp is not np:
            from jax import lax

            values, indices = lax.top_k(xp.moveaxis(x, axis, -1), k)
            return xp.moveaxis(values, -1, axis), xp.moveaxis(indices, -1, axis)
        # A stable sort of -x keeps equal elements in order of position.
        order = np.argsort(-x, axis=axis, kind="stable")
        indices = np.take(order, np.arange(k), axis=axis)
        return np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)

    def count_flops(self, params, in_sizes, out_sizes):
        # A selection: about log2(k) comparisons per element.
        return math.prod(in_sizes[0]) * max(1, params["k"].bit_length())
