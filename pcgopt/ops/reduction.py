"""Reductions along axes: sum, mean (both linear: a split reduced axis leaves partial sums) and
max (not linear: reduced axes cannot be split)."""

from __future__ import annotations

import math
from typing import ClassVar

from pcgopt.errors import ShapeError
from pcgopt.ops.elementwise import require_float
from pcgopt.ops.params import Param, ParamType
from pcgopt.ops.spec import AxisKind, ComputeOp, LocalContext, LoopAxis, Signature
from pcgopt.shapes import ParallelTensorShape


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
