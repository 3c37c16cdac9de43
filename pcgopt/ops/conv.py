"""Convolution and pooling on NCHW tensors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from pcgopt.errors import ShapeError
from pcgopt.ops.arrays import is_concrete
from pcgopt.ops.elementwise import require_float, same_dtype
from pcgopt.ops.linalg import ACTIVATION_CHOICES, activation_flops, apply_activation
from pcgopt.ops.params import Param, Params, ParamType
from pcgopt.ops.spec import AxisKind, ComputeOp, LoopAxis, Signature, Sizes
from pcgopt.shapes import ParallelTensorShape


def _out_extent(op: str, size: int, kernel: int, stride: int, pad: int, what: str) -> int:
    out = (size + 2 * pad - kernel) // stride + 1
    if out < 1:
        raise ShapeError(
            f"{op}: {what} of {size} with padding {pad} is smaller than the kernel ({kernel})"
        )
    return out


def spatial_axes(
    params, in_hw: tuple[int, int], out_hw: tuple[int, int], kernel: tuple[int, int], n_inputs: int
) -> tuple[list[LoopAxis], list[tuple[int, int, str]]]:
    """Height and width axes where blocks are exact: no padding, windows that do not overlap
    (kernel <= stride) and that tile the input (size = stride * output size). Elsewhere, a note
    for the error message."""
    axes, notes = [], []
    for k, name in ((0, "height"), (1, "width")):
        size, out, kern = in_hw[k], out_hw[k], kernel[k]
        stride, pad = params["stride"][k], params["padding"][k]
        spread = (params.get("input_dilation") or (1, 1))[k]
        if spread > 1:
            why = (
                f"its input is dilated {spread} times (a transposed convolution), so its windows "
                "straddle block edges, which would need a halo exchange (no operator for it yet)"
            )
            notes.append((0, 2 + k, why))
        elif pad == 0 and kern <= stride and size == stride * out:
            rest = (None,) * (n_inputs - 1)
            axes.append(LoopAxis(name, AxisKind.PARALLEL, (2 + k, *rest), (2 + k,), size=out))
        else:
            why = (
                f"its windows (kernel {kern}, stride {stride}, padding {pad}) overlap or "
                "straddle block edges, which would need a halo exchange (no operator for it yet)"
            )
            notes.append((0, 2 + k, why))
    return axes, notes


def _windows(
    x: np.ndarray, kernel, stride, padding, fill: float, dilation=(1, 1), input_dilation=(1, 1)
) -> np.ndarray:
    """(N, C, H', W', kh, kw) views of the padded input (taps ``dilation`` apart; with
    ``input_dilation``, the input's pixels that far apart with zeros between them)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    if tuple(input_dilation) != (1, 1):
        (ih, iw), (n, c, h, w) = input_dilation, x.shape
        spread = np.zeros((n, c, (h - 1) * ih + 1, (w - 1) * iw + 1), dtype=x.dtype)
        spread[:, :, ::ih, ::iw] = x
        x = spread
    xp = x
    if ph or pw:  # np.pad's general machinery costs more than the copy on small blocks
        n, c, h, w = x.shape
        xp = np.full((n, c, h + 2 * ph, w + 2 * pw), fill, dtype=x.dtype)
        xp[:, :, ph : ph + h, pw : pw + w] = x
    # The strided view numpy's sliding_window_view(...)[..., ::sh, ::sw, ::dh, ::dw] makes,
    # built at once: its checks cost more than the convolution on the evaluator's small blocks.
    n, c, hp, wp = xp.shape
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise ValueError(f"a {kh}x{kw} kernel does not fit a padded input of {hp}x{wp}")
    s0, s1, s2, s3 = xp.strides
    return as_strided(
        xp, (n, c, oh, ow, kh, kw), (s0, s1, s2 * sh, s3 * sw, s2 * dh, s3 * dw), writeable=False
    )


def dilated_kernel(params, kernel: tuple[int, int]) -> tuple[int, int]:
    """The extent a kernel's taps span: ``dilation * (k - 1) + 1`` (the kernel itself for
    operators without dilation)."""
    d = params.get("dilation") or (1, 1)
    return (d[0] * (kernel[0] - 1) + 1, d[1] * (kernel[1] - 1) + 1)


def _conv_jax(params: Params, x: Any, w: Any, groups: int) -> Any:
    """The convolution on JAX arrays: ``lax.conv_general_dilated``, NCHW and OIHW."""
    from jax import lax

    (ph, pw) = params["padding"]
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=tuple(params["stride"]),
        padding=((ph, ph), (pw, pw)),
        lhs_dilation=tuple(params["input_dilation"]),
        rhs_dilation=tuple(params["dilation"]),
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        feature_group_count=groups,
    )


def _pool_jax(mode: str, x: Any, kernel, stride, padding) -> Any:
    """Pooling on JAX arrays: ``lax.reduce_window``; padding counts as -inf for max and as
    zeros for the average, as in :func:`_windows`."""
    from jax import lax

    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    pads = ((0, 0), (0, 0), (ph, ph), (pw, pw))
    if mode == "max":
        return lax.reduce_window(x, -float("inf"), lax.max, (1, 1, kh, kw), (1, 1, sh, sw), pads)
    summed = lax.reduce_window(x, 0.0, lax.add, (1, 1, kh, kw), (1, 1, sh, sw), pads)
    return summed / (kh * kw)


def _windows_resized(
    spec: ComputeOp, params: Params, in_sizes: tuple[Sizes, ...], out_sizes: tuple[Sizes, ...]
) -> Params | None:
    """A convolution's or pooling's parameters (stride, padding, groups, kernel) fit any batch,
    channel counts and spatial sizes the windows fit: the output's spatial sizes are then what
    they give for the new input's (its ``window_inputs``). None where they do not fit."""
    try:
        spec.infer_logical(params, tuple(ParallelTensorShape.of(s) for s in in_sizes))
    except ShapeError:
        return None
    return params


class Conv2D(ComputeOp):
    """2-D convolution: x [N, C, H, W], w [O, C/groups, kh, kw], bias [O] (optional)
    -> [N, O, H', W']. ``dilation`` spaces the kernel's taps (atrous convolution), so that a
    kernel spans ``dilation * (k - 1) + 1`` pixels. ``input_dilation`` spaces the input's pixels
    with zeros between them: a transposed convolution of stride s is the convolution of the
    s-dilated input with the flipped kernel, its channels swapped (and padding
    ``dilation * (k - 1) - pad``); the products with those zeros are not counted as FLOPs.

    Splits: the batch; output channels (groups = 1; x must be copied); input channels, leaving
    partial sums (groups = 1, no bias, no activation); groups (grouped and depthwise convs:
    x's and w's channels split together, by divisors of ``groups``); and height and width where
    windows do not overlap (1x1 convs, patchifying convs with kernel <= stride, no padding).
    Spatial splits of overlapping windows need a halo exchange, which no operator expresses yet.
    """

    size_dependent_signature = True
    window_inputs = ((0, (2, 3)),)
    name = "conv2d"
    input_names = ("x", "w", "bias")
    optional_inputs = 1
    params = (
        Param("stride", ParamType.POS_PAIR, (1, 1)),
        Param("padding", ParamType.PAIR, (0, 0)),
        Param("groups", ParamType.POS_INT, 1),
        Param("activation", ParamType.STR, "none", ACTIVATION_CHOICES),
        Param("dilation", ParamType.POS_PAIR, (1, 1), doc="spacing of the kernel's taps"),
        Param(
            "input_dilation",
            ParamType.POS_PAIR,
            (1, 1),
            doc="spacing of the input's pixels (a transposed convolution's stride)",
        ),
    )

    def infer_logical(self, params, inputs):
        x, w = inputs[:2]
        same_dtype(self.name, self.input_names, inputs)
        require_float(self.name, "x", x)
        if x.rank != 4 or w.rank != 4:
            raise ShapeError(
                f"conv2d needs x [N, C, H, W] and w [O, C/groups, kh, kw], got {x} and {w}"
            )
        n, c, h, wd = x.sizes
        o, cg, kh, kw = w.sizes
        g = params["groups"]
        if c % g or o % g:
            raise ShapeError(
                f"conv2d: groups={g} must divide input channels {c} and output channels {o}"
            )
        if cg != c // g:
            raise ShapeError(
                f"conv2d: w has {cg} input channels per group; x has {c} channels in {g} "
                f"groups, so {c // g}"
            )
        if len(inputs) == 3 and inputs[2].sizes != (o,):
            raise ShapeError(f"conv2d: bias must be [{o}], got {inputs[2]}")
        (sh, sw), (ph, pw) = params["stride"], params["padding"]
        kh, kw = dilated_kernel(params, (kh, kw))
        (ih, iw) = params["input_dilation"]
        oh = _out_extent(self.name, (h - 1) * ih + 1, kh, sh, ph, "height")
        ow = _out_extent(self.name, (wd - 1) * iw + 1, kw, sw, pw, "width")
        return (ParallelTensorShape.of((n, o, oh, ow), x.dtype),)

    def _is_linear(self, params, n_inputs):
        return n_inputs == 2 and params["activation"] == "none"

    def signature(self, params, in_sizes, out_sizes):
        has_bias = len(in_sizes) == 3
        b = lambda dim: (dim,) if has_bias else ()  # noqa: E731
        axes = [LoopAxis("batch", AxisKind.PARALLEL, (0, None, *b(None)), (0,))]
        linear = self._is_linear(params, len(in_sizes))
        notes = []
        if params["groups"] == 1:
            axes.append(LoopAxis("out_channel", AxisKind.PARALLEL, (None, 0, *b(0)), (1,)))
            if linear:
                axes.append(LoopAxis("in_channel", AxisKind.REDUCE, (1, 1, *b(None))))
            else:
                why = "with a bias or an activation, conv2d cannot leave partial sums"
                notes += [(0, 1, why), (1, 1, why)]
        else:
            axes.append(
                LoopAxis("group", AxisKind.PARALLEL, (1, 0, *b(0)), (1,), size=params["groups"])
            )
        spatial, spatial_notes = spatial_axes(
            params,
            in_sizes[0][2:],
            out_sizes[0][2:],
            dilated_kernel(params, in_sizes[1][2:]),
            len(in_sizes),
        )
        return Signature(
            (*axes, *spatial), linear_in=(0, 1) if linear else (), notes=(*notes, *spatial_notes)
        )

    def resized_params(self, params, in_sizes, out_sizes):
        # A depthwise convolution (one input channel per group) stays depthwise at any number
        # of channels: its groups follow them.
        channels, per_group = in_sizes[0][1], in_sizes[1][1]
        if per_group == 1 and params["groups"] > 1:
            params = Params({**params, "groups": channels})
        return _windows_resized(self, params, in_sizes, out_sizes)

    def fixed_dims(self, params, in_sizes, out_sizes):
        # The kernel's extent is its structure; its channels are the input's (per group).
        return (("in", 1, 2), ("in", 1, 3))

    def reference(self, params, x, w, bias=None):
        return (self._conv(params, x, w, bias, params["groups"]),)

    def local(self, params, ctx, x, w, bias=None):
        # A group split leaves each task a whole number of groups: read it off the block shapes.
        return (self._conv(params, x, w, bias, x.shape[1] // w.shape[1]),)

    @staticmethod
    def _conv(params, x, w, bias, groups):
        if not is_concrete(x, w):
            y = _conv_jax(params, x, w, groups)
            if bias is not None:
                y = y + bias[None, :, None, None]
            return apply_activation(params["activation"], y)
        n = x.shape[0]
        o, cg, kh, kw = w.shape
        win = _windows(
            x,
            (kh, kw),
            params["stride"],
            params["padding"],
            0.0,
            params["dilation"],
            params["input_dilation"],
        )
        oh, ow = win.shape[2], win.shape[3]
        # One batched matrix product per group, (n*oh*ow, cg*kh*kw) @ (cg*kh*kw, o/groups):
        # BLAS without einsum's path search, which dominated the evaluator's small blocks.
        taps = cg * kh * kw
        win = win.reshape(n, groups, cg, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
        rows = win.reshape(groups, n * oh * ow, taps)
        wg = w.reshape(groups, o // groups, taps).transpose(0, 2, 1)
        y = np.matmul(rows, wg).reshape(groups, n, oh, ow, o // groups)
        y = y.transpose(1, 0, 4, 2, 3).reshape(n, o, oh, ow)
        if bias is not None:
            y = y + bias[None, :, None, None]
        return apply_activation(params["activation"], y)

    def count_flops(self, params, in_sizes, out_sizes):
        out = math.prod(out_sizes[0])
        _, cg, kh, kw = in_sizes[1]
        bias = out if len(in_sizes) == 3 else 0
        # Windows over a dilated input meet a real pixel at about one tap in ih * iw.
        (ih, iw) = params["input_dilation"]
        products = 2 * out * cg * kh * kw // (ih * iw)
        return products + bias + activation_flops(params["activation"], out)


class Pool2D(ComputeOp):
    """Max or average pooling over H and W of x [N, C, H, W]. Average pooling counts padding
    as zeros (PyTorch's default), which keeps it linear."""

    size_dependent_signature = True
    window_inputs = ((0, (2, 3)),)
    name = "pool2d"
    input_names = ("x",)
    params = (
        Param("kernel", ParamType.POS_PAIR),
        Param("stride", ParamType.POS_PAIR, None, doc="defaults to the kernel"),
        Param("padding", ParamType.PAIR, (0, 0)),
        Param("mode", ParamType.STR, "max", ("max", "avg")),
    )

    def _stride(self, params):
        return params["stride"] or params["kernel"]

    def infer_logical(self, params, inputs):
        (x,) = inputs
        require_float(self.name, "x", x)
        if x.rank != 4:
            raise ShapeError(f"pool2d needs x [N, C, H, W], got {x}")
        (kh, kw), (sh, sw), (ph, pw) = params["kernel"], self._stride(params), params["padding"]
        if ph * 2 > kh or pw * 2 > kw:
            raise ShapeError(
                f"pool2d: padding {params['padding']} exceeds half the kernel {params['kernel']}"
            )
        n, c, h, w = x.sizes
        oh = _out_extent(self.name, h, kh, sh, ph, "height")
        ow = _out_extent(self.name, w, kw, sw, pw, "width")
        return (ParallelTensorShape.of((n, c, oh, ow), x.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        axes = [
            LoopAxis("batch", AxisKind.PARALLEL, (0,), (0,)),
            LoopAxis("channel", AxisKind.PARALLEL, (1,), (1,)),
        ]
        spatial, notes = spatial_axes(
            {**params, "stride": self._stride(params)},
            in_sizes[0][2:],
            out_sizes[0][2:],
            params["kernel"],
            1,
        )
        return Signature(
            (*axes, *spatial),
            linear_in=(0,) if params["mode"] == "avg" else (),
            notes=tuple(notes),
        )

    def resized_params(self, params, in_sizes, out_sizes):
        (kh, kw), (oh, ow) = params["kernel"], out_sizes[0][2:]
        global_pool = params["padding"] == (0, 0) and self._stride(params) == (kh, kw)
        if global_pool and (oh, ow) == (1, 1) and tuple(in_sizes[0][2:]) != (kh, kw):
            # A global pooling (one window over the whole input, a classifier head's)
            # stays global: its window follows the input's new size.
            params = Params({**params, "kernel": tuple(in_sizes[0][2:]), "stride": None})
        return _windows_resized(self, params, in_sizes, out_sizes)

    def reference(self, params, x):
        if not is_concrete(x):
            stride, padding = self._stride(params), params["padding"]
            return (_pool_jax(params["mode"], x, params["kernel"], stride, padding),)
        fill = -np.inf if params["mode"] == "max" else 0.0
        if np.issubdtype(x.dtype, np.integer) and params["mode"] == "max":
            fill = np.iinfo(x.dtype).min
        win = _windows(x, params["kernel"], self._stride(params), params["padding"], fill)
        if params["mode"] == "max":
            return (win.max(axis=(-2, -1)),)
        return (win.mean(axis=(-2, -1)),)

    def count_flops(self, params, in_sizes, out_sizes):
        kh, kw = params["kernel"]
        return math.prod(out_sizes[0]) * kh * kw
