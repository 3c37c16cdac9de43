"""Layout operators: Concat, Split, Slice, Transpose, Reshape, Broadcast. They move data, compute
nothing, and are linear, so partial sums pass through them."""

from __future__ import annotations

import math

import numpy as np

from pcgopt.errors import ShapeError
from pcgopt.ops.arrays import array_module
from pcgopt.ops.elementwise import same_dtype
from pcgopt.ops.params import Param, Params, ParamType
from pcgopt.ops.spec import AxisKind, ComputeOp, LoopAxis, Signature, SizeRelation
from pcgopt.shapes import ParallelTensorShape


class Concat(ComputeOp):
    """Concatenation along ``axis``; the other dimensions must agree. The concatenated
    dimension cannot be split (blocks of the parts are not blocks of the whole)."""

    moves_elements = True
    name = "concat"
    input_names = ("inputs",)
    variadic = True
    params = (Param("axis", ParamType.AXIS),)

    def input_name(self, i: int) -> str:
        return f"inputs[{i}]"

    def infer_logical(self, params, inputs):
        same_dtype(self.name, tuple(self.input_name(i) for i in range(len(inputs))), inputs)
        axis, first = params["axis"], inputs[0]
        for i, s in enumerate(inputs[1:], 1):
            if s.rank != first.rank or any(
                a != b
                for k, (a, b) in enumerate(zip(s.sizes, first.sizes, strict=True))
                if k != axis
            ):
                raise ShapeError(
                    f"concat along axis {axis}: inputs[{i}] {list(s.sizes)} does not match "
                    f"inputs[0] {list(first.sizes)} outside that axis"
                )
        sizes = list(first.sizes)
        sizes[axis] = sum(s.sizes[axis] for s in inputs)
        return (ParallelTensorShape.of(sizes, first.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        n = len(in_sizes)
        axes = tuple(
            LoopAxis(f"d{k}", AxisKind.PARALLEL, (k,) * n, (k,))
            for k in range(len(out_sizes[0]))
            if k != params["axis"]
        )
        why = "blocks of the parts are not blocks of the concatenation"
        notes = tuple((i, params["axis"], why) for i in range(n))
        return Signature(axes, linear_in=tuple(range(n)), joint=True, notes=notes)

    def gradient_bytes_accessed(self, params, inputs, outputs, i):
        # Input i's gradient is its slice of the output gradient: read once, written once.
        return 2 * inputs[i].shard_nbytes

    def reference(self, params, *xs):
        return (array_module(*xs).concatenate(xs, axis=params["axis"]),)


class Split(ComputeOp):
    """Splits ``axis`` into consecutive parts of the given ``sizes``; one output per part."""

    name = "split"
    input_names = ("x",)
    params = (Param("axis", ParamType.AXIS), Param("sizes", ParamType.SHAPE))

    def num_outputs(self, params):
        return len(params["sizes"])

    def infer_logical(self, params, inputs):
        (x,) = inputs
        axis, sizes = params["axis"], params["sizes"]
        if sum(sizes) != x.sizes[axis]:
            raise ShapeError(
                f"split sizes {list(sizes)} add up to {sum(sizes)}, but axis {axis} of the input "
                f"has size {x.sizes[axis]}"
            )
        outs = []
        for part in sizes:
            s = list(x.sizes)
            s[axis] = part
            outs.append(ParallelTensorShape.of(s, x.dtype))
        return tuple(outs)

    def signature(self, params, in_sizes, out_sizes):
        n_out = len(out_sizes)
        axes = tuple(
            LoopAxis(f"d{k}", AxisKind.PARALLEL, (k,), (k,) * n_out)
            for k in range(len(in_sizes[0]))
            if k != params["axis"]
        )
        why = "it is the axis being split into parts"
        return Signature(axes, linear_in=(0,), notes=((0, params["axis"], why),))

    def resized_params(self, params, in_sizes, out_sizes):
        # Parts in the same proportions that add up to the input's axis: every position along
        # it scales alike, so the i-th part stays the same share of the axis.
        axis, sizes = params["axis"], tuple(params["sizes"])
        parts = tuple(out[axis] for out in out_sizes)
        if in_sizes[0][axis] != sum(parts):
            return None
        if any(p * sizes[0] != s * parts[0] for p, s in zip(parts, sizes, strict=True)):
            return None
        return params if parts == sizes else Params({**params, "sizes": parts})

    def summed_dims(self, params, in_sizes, out_sizes):
        axis = params["axis"]
        return ((("in", 0, axis), tuple(("out", o, axis) for o in range(len(out_sizes)))),)

    def reference(self, params, x):
        cuts = np.cumsum(params["sizes"])[:-1]
        return tuple(array_module(x).split(x, cuts.tolist(), axis=params["axis"]))


class Transpose(ComputeOp):
    """Permutes dimensions: output dimension j is input dimension ``perm[j]``."""

    moves_elements = True
    name = "transpose"
    input_names = ("x",)
    params = (Param("perm", ParamType.AXES),)

    def infer_logical(self, params, inputs):
        (x,) = inputs
        perm = params["perm"]
        if sorted(perm) != list(range(x.rank)):
            raise ShapeError(
                f"transpose: perm {list(perm)} is not a permutation of 0..{x.rank - 1}"
            )
        return (ParallelTensorShape.of(tuple(x.sizes[p] for p in perm), x.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        axes = tuple(
            LoopAxis(f"d{p}", AxisKind.PARALLEL, (p,), (j,)) for j, p in enumerate(params["perm"])
        )
        return Signature(axes, linear_in=(0,))

    def reference(self, params, x):
        return (array_module(x).transpose(x, params["perm"]).copy(),)


def reshape_groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[range, range]]:
    """Pairs the dimensions of two shapes of equal size into the smallest runs of equal product:
    ``(2, 6) -> (2, 2, 3)`` gives ``[(range(0, 1), range(0, 1)), (range(1, 2), range(1, 3))]``."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        si, sj, pa, pb = i, j, 1, 1
        if i < len(a):
            pa, i = a[i], i + 1
        if j < len(b):
            pb, j = b[j], j + 1
        while pa != pb:
            if pa < pb:
                pa, i = pa * a[i], i + 1
            else:
                pb, j = pb * b[j], j + 1
        groups.append((range(si, i), range(sj, j)))
    return groups


def _outer(dims: range, sizes: tuple[int, ...]) -> int | None:
    """The most significant dimension of a run that is not of size 1."""
    return next((d for d in dims if sizes[d] > 1), None)


class Reshape(ComputeOp):
    """Reshape (row-major) to ``shape``.

    Within each run of dimensions that reshape into each other, only the outermost may be
    split, by a divisor of both sides' outermost sizes: [B, S, H] -> [B, S, heads, H/heads] keeps
    splits of B and S, and a split of H becomes a split of heads.
    """

    size_dependent_signature = True
    moves_elements = True
    name = "reshape"
    input_names = ("x",)
    params = (Param("shape", ParamType.SHAPE),)

    def infer_logical(self, params, inputs):
        (x,) = inputs
        shape = params["shape"]
        if math.prod(shape) != x.numel:
            raise ShapeError(
                f"cannot reshape {list(x.sizes)} ({x.numel} elements) to {list(shape)} "
                f"({math.prod(shape)} elements)"
            )
        return (ParallelTensorShape.of(shape, x.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        a, b = in_sizes[0], out_sizes[0]
        axes, notes = [], []
        for ga, gb in reshape_groups(a, b):
            oa, ob = _outer(ga, a), _outer(gb, b)
            if oa is not None and ob is not None:
                axes.append(
                    LoopAxis(f"d{oa}", AxisKind.PARALLEL, (oa,), (ob,), size=math.gcd(a[oa], b[ob]))
                )
            why = (
                f"it is not the outermost of dimensions {list(ga)}, which reshape together into "
                f"output dimensions {list(gb)}"
            )
            notes += [(0, d, why) for d in ga if d != oa]
        return Signature(tuple(axes), linear_in=(0,), notes=tuple(notes))

    def signature_conditions(self, params, in_sizes, out_sizes):
        # The runs, which of their dimensions are 1, and that no shorter prefixes of a run
        # multiply to the same size fix the runs and their outermost dimensions; each axis's
        # size is the gcd of its two dimensions.
        a, b = in_sizes[0], out_sizes[0]
        out = [
            SizeRelation("is1" if n == 1 else "ge2", ((side, 0, d),))
            for side, sizes in (("in", a), ("out", b))
            for d, n in enumerate(sizes)
        ]
        for ga, gb in reshape_groups(a, b):
            ins, outs = tuple(("in", 0, d) for d in ga), tuple(("out", 0, d) for d in gb)
            out.append(SizeRelation("eq", ins, outs))
            out += [
                SizeRelation("ne", ins[:i], outs[:j])
                for i in range(1, len(ins) + 1)
                for j in range(1, len(outs) + 1)
                if (i, j) != (len(ins), len(outs))
            ]
        return tuple(out)

    def resized_params(self, params, in_sizes, out_sizes):
        # Its target shape is its output's: any sizes whose runs still multiply out, which
        # signature_conditions requires.
        return Params({**params, "shape": tuple(out_sizes[0])})

    def reference(self, params, x):
        return (x.reshape(params["shape"]),)

    def local(self, params, ctx, x):
        return (x.reshape(ctx.out_sizes[0]),)


class Slice(ComputeOp):
    """The elements ``start:stop`` of dimension ``axis`` (step 1); the other dimensions are kept.
    The sliced dimension cannot be split (the slice of a block is not a block of the slice)."""

    moves_elements = True
    name = "slice"
    input_names = ("x",)
    params = (
        Param("axis", ParamType.AXIS),
        Param("start", ParamType.NONNEG_INT),
        Param("stop", ParamType.POS_INT),
    )

    def infer_logical(self, params, inputs):
        (x,) = inputs
        axis, start, stop = params["axis"], params["start"], params["stop"]
        if not start < stop <= x.sizes[axis]:
            raise ShapeError(
                f"slice {start}:{stop} of dimension {axis} (size {x.sizes[axis]}) must satisfy "
                f"0 <= start < stop <= {x.sizes[axis]}"
            )
        sizes = list(x.sizes)
        sizes[axis] = stop - start
        return (ParallelTensorShape.of(sizes, x.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        axis = params["axis"]
        axes = tuple(
            LoopAxis(f"d{k}", AxisKind.PARALLEL, (k,), (k,))
            for k in range(len(in_sizes[0]))
            if k != axis
        )
        why = "the slice of a block is not a block of the slice"
        return Signature(axes, linear_in=(0,), notes=((0, axis, why),))

    def resized_params(self, params, in_sizes, out_sizes):
        # Positions along the sliced dimension keep their meaning if it keeps its size; the
        # k-th of n equal parts (a fused QKV's q, k or v) stays the k-th at any part size.
        if _slice_unchanged(params, in_sizes[0], out_sizes[0]):
            return params
        axis, start, stop = params["axis"], params["start"], params["stop"]
        part = out_sizes[0][axis]
        if start % (stop - start) or (start // (stop - start) + 1) * part > in_sizes[0][axis]:
            return None
        k = start // (stop - start)
        return Params({**params, "start": k * part, "stop": (k + 1) * part})

    def fixed_dims(self, params, in_sizes, out_sizes):
        if _equal_parts(params, in_sizes[0]):
            return None
        return (("in", 0, params["axis"]), ("out", 0, params["axis"]))

    def summed_dims(self, params, in_sizes, out_sizes):
        n = _equal_parts(params, in_sizes[0])
        axis = params["axis"]
        return ((("in", 0, axis), (("out", 0, axis),) * n),) if n else ()

    def reference(self, params, x):
        index = [slice(None)] * x.ndim
        index[params["axis"]] = slice(params["start"], params["stop"])
        return (x[tuple(index)],)


def _equal_parts(params: Params, in_sizes: tuple[int, ...]) -> int:
    """n when the slice is one of n >= 2 equal parts of at least 2 elements each (a fused
    QKV's q), else 0: a smaller instance keeps it the same part of n smaller ones."""
    part, size = params["stop"] - params["start"], in_sizes[params["axis"]]
    aligned = part >= 2 and size % part == 0 and params["start"] % part == 0
    return size // part if aligned and size > part else 0


def _slice_unchanged(params: Params, in_sizes: tuple[int, ...], out_sizes: tuple[int, ...]) -> bool:
    axis = params["axis"]
    return params["stop"] <= in_sizes[axis] and out_sizes[axis] == params["stop"] - params["start"]


class Broadcast(ComputeOp):
    """x broadcast to ``shape`` (numpy's rules: x's dimensions align with the last ones of
    ``shape``; a dimension of size 1 is repeated). A repeated dimension of the output does not
    vary in x, so splitting it needs x copied (as for a class token expanded over the batch)."""

    moves_elements = True
    name = "broadcast"
    input_names = ("x",)
    params = (Param("shape", ParamType.SHAPE),)

    def infer_logical(self, params, inputs):
        (x,) = inputs
        shape = tuple(params["shape"])
        lead = len(shape) - x.rank
        if lead < 0 or any(s not in (1, t) for s, t in zip(x.sizes, shape[lead:], strict=True)):
            raise ShapeError(
                f"broadcast: {list(x.sizes)} cannot be broadcast to {list(shape)} (each dimension "
                f"of x must be 1 or equal the matching trailing dimension of the shape)"
            )
        return (ParallelTensorShape.of(shape, x.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        x, out = in_sizes[0], out_sizes[0]
        lead = len(out) - len(x)
        axes = []
        for k, size in enumerate(out):
            j = k - lead
            dim = j if j >= 0 and x[j] == size else None
            axes.append(LoopAxis(f"d{k}", AxisKind.PARALLEL, (dim,), (k,)))
        return Signature(tuple(axes), linear_in=(0,))

    def resized_params(self, params, in_sizes, out_sizes):
        # Its target shape is its output's: any sizes numpy's rules still broadcast to.
        resized = Params({**params, "shape": tuple(out_sizes[0])})
        try:
            self.infer_logical(resized, (ParallelTensorShape.of(in_sizes[0]),))
        except ShapeError:
            return None
        return resized

    def reference(self, params, x):
        return (array_module(x).broadcast_to(x, params["shape"]).copy(),)

    def local(self, params, ctx, x):
        return (array_module(x).broadcast_to(x, ctx.out_sizes[0]).copy(),)


class Pad(ComputeOp):
    """``x`` with ``low[k]`` elements of ``value`` before and ``high[k]`` after it along each
    dimension k (a constant pad: ONNX's ``Pad``, ``torch.nn.functional.pad``, ``jnp.pad``).
    A padded dimension cannot be split (the pad of a block is not a block of the pad); the
    operator is linear when ``value`` is 0."""

    name = "pad"
    input_names = ("x",)
    params = (
        Param("low", ParamType.INTS, doc="elements added before each dimension"),
        Param("high", ParamType.INTS, doc="elements added after each dimension"),
        Param("value", ParamType.FLOAT, 0.0, doc="the padding value"),
    )

    def infer_logical(self, params, inputs):
        (x,) = inputs
        low, high = params["low"], params["high"]
        if len(low) != x.rank or len(high) != x.rank:
            raise ShapeError(
                f"pad: low {list(low)} and high {list(high)} need one entry per dimension of "
                f"x ({x.rank})"
            )
        if min((*low, *high)) < 0:
            raise ShapeError(
                f"pad: low {list(low)} and high {list(high)} must be non-negative (a negative "
                "pad is a slice)"
            )
        sizes = tuple(s + a + b for s, a, b in zip(x.sizes, low, high, strict=True))
        return (ParallelTensorShape.of(sizes, x.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        padded = {
            k for k, (a, b) in enumerate(zip(params["low"], params["high"], strict=True)) if a or b
        }
        axes = tuple(
            LoopAxis(f"d{k}", AxisKind.PARALLEL, (k,), (k,))
            for k in range(len(in_sizes[0]))
            if k not in padded
        )
        why = "the pad of a block is not a block of the pad"
        return Signature(
            axes,
            linear_in=(0,) if params["value"] == 0.0 else (),
            notes=tuple((0, k, why) for k in sorted(padded)),
        )

    def reference(self, params, x):
        widths = tuple(zip(params["low"], params["high"], strict=True))
        return (array_module(x).pad(x, widths, constant_values=params["value"]),)
