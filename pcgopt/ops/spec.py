"""The operator spec: the one place an operator is defined.

An :class:`OpSpec` holds an operator's name, inputs, parameters, shape inference, FLOP and byte
counts and numpy reference semantics. Every other table in pcgopt (the builder's methods, JSON,
Z3 axioms, the egglog language, costs) is derived from the registry of specs.

Compute operators do not write their parallel behaviour by hand. They declare a
:class:`Signature`: the loop axes of the computation (like the letters of an einsum), which input
and output dimensions each axis indexes, whether splitting it gives independent blocks
(``PARALLEL``) or partial sums (``REDUCE``), and in which inputs the operator is linear. From
that, :func:`infer_parallel` derives the output's parallel shape (degrees, copies, partial sums,
with errors that say what to insert), and :func:`evaluate_parallel` derives the shard semantics:
every task applies the operator's local function to its input blocks.

Micro-batches (Pipeline) follow the same axes: a parallel axis carries its dimensions'
micro-batch count from the inputs to the outputs, and a task runs once per micro-batch on
that piece of its blocks; a reduce axis refuses them (:func:`axis_micro_batches`).
"""

from __future__ import annotations

import enum
import itertools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pcgopt.errors import ArityError, DegreeError, ShapeError
from pcgopt.ops.params import Param, Params, ParamType, canonical_params, normalize_axes
from pcgopt.shapes import ParallelTensorShape
from pcgopt.sharded import ShardedArray, merge_dim, split_dim

Sizes = tuple[int, ...]


class OpKind(enum.Enum):
    SOURCE = "source"  # Input, Weight: no inputs
    COMPUTE = "compute"  # tensor algebra
    PARALLEL = "parallel"  # changes how a tensor is distributed; moves data

    def __repr__(self) -> str:
        return self.name


class AxisKind(enum.Enum):
    PARALLEL = "parallel"  # blocks are independent: split inputs give split outputs
    REDUCE = "reduce"  # summed over: split inputs give partial sums in the outputs

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class LoopAxis:
    """One loop axis of a compute operator.

    ``inputs[i]`` / ``outputs[o]`` is the dimension of input ``i`` / output ``o`` this axis
    indexes, or None when that tensor does not vary along it (it must then be copied across the
    axis's splits). A degree must divide ``size``; ``size`` defaults to the dimensions' sizes and
    is smaller when only coarser splits are exact (for instance the groups of a grouped conv).
    """

    name: str
    kind: AxisKind
    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...] = ()
    size: int | None = None

    def __post_init__(self) -> None:
        if self.kind is AxisKind.REDUCE and any(d is not None for d in self.outputs):
            raise ValueError(f"reduce axis {self.name!r} cannot index an output")


@dataclass(frozen=True, slots=True)
class Signature:
    """How a compute operator may be parallelized (see the module docstring).

    ``linear_in``: inputs the operator is linear in, so they may hold partial sums. With
    ``joint=False`` the operator is multilinear in them (MatMul, Mul): partial sums of different
    inputs multiply out, and every other input must be copied once per partial sum. With
    ``joint=True`` it is linear in all inputs together (Add, Concat): all inputs must hold the
    same number of partial sums, which are paired up.
    """

    axes: tuple[LoopAxis, ...]
    linear_in: tuple[int, ...] = ()
    joint: bool = False
    #: Why particular input dimensions cannot be split: ``((input, dim, reason), ...)``, for
    #: error messages.
    notes: tuple[tuple[int, int, str], ...] = ()

    def note(self, i: int, dim: int) -> str | None:
        return next((text for j, d, text in self.notes if (j, d) == (i, dim)), None)


#: A dimension of an operator's input or output: ``("in", i, dim)`` or ``("out", o, dim)``.
DimRef = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class SizeRelation:
    """A relation among an operator's sizes, each side the product of the sizes of some
    dimensions (an empty product is 1): ``kind`` is ``"eq"`` or ``"ne"`` (the two products),
    ``"is1"`` or ``"ge2"`` (the left product alone)."""

    kind: str
    left: tuple[DimRef, ...]
    right: tuple[DimRef, ...] = ()

    def holds(self, in_sizes: Sequence[Sizes], out_sizes: Sequence[Sizes]) -> bool:
        def prod(refs: tuple[DimRef, ...]) -> int:
            return math.prod((in_sizes if s == "in" else out_sizes)[t][d] for s, t, d in refs)

        a = prod(self.left)
        if self.kind == "is1":
            return a == 1
        if self.kind == "ge2":
            return a >= 2
        b = prod(self.right)
        return a == b if self.kind == "eq" else a != b

    def __repr__(self) -> str:
        def text(refs: tuple[DimRef, ...]) -> str:
            return "*".join(f"{s}{t}[{d}]" for s, t, d in refs) or "1"

        if self.kind in ("is1", "ge2"):
            return f"{text(self.left)} {'== 1' if self.kind == 'is1' else '>= 2'}"
        return f"{text(self.left)} {'==' if self.kind == 'eq' else '!='} {text(self.right)}"


@dataclass(frozen=True, slots=True)
class LocalContext:
    """What a task knows besides its input blocks: where its blocks start along each split axis,
    the sizes of its output blocks, and the global (unsplit) sizes of its inputs."""

    offsets: Mapping[str, int]
    out_sizes: tuple[Sizes, ...]
    global_in_sizes: tuple[Sizes, ...] = field(default=())

    def offset(self, axis: str) -> int:
        return self.offsets.get(axis, 0)


class OpSpec:
    """Base of every operator spec. Subclasses set the class attributes and override methods.

    Specs are stateless singletons: all per-node information is in the node's ``Params``.
    """

    name: ClassVar[str]
    kind: ClassVar[OpKind]
    #: Names of the inputs, for messages and docs. With ``variadic`` the last one repeats.
    input_names: ClassVar[tuple[str, ...]] = ()
    #: How many trailing inputs may be left out.
    optional_inputs: ClassVar[int] = 0
    variadic: ClassVar[bool] = False
    params: ClassVar[tuple[Param, ...]] = ()
    #: Swapping two inputs gives an equal parallel tensor. The rule enumerator builds one input
    #: order only and emits the swap itself as a (verified) rule.
    commutative: ClassVar[bool] = False
    #: Its outputs hold elements of its inputs, unchanged (a reshape, a broadcast, a slice):
    #: an index moved so is still an index into the same table.
    moves_elements: ClassVar[bool] = False

    # -- structure ----------------------------------------------------------------------------

    @property
    def doc(self) -> str:
        return (type(self).__doc__ or "").strip()

    @property
    def min_inputs(self) -> int:
        return len(self.input_names) - self.optional_inputs

    @property
    def max_inputs(self) -> int | None:
        return None if self.variadic else len(self.input_names)

    def check_arity(self, n: int) -> None:
        lo, hi = self.min_inputs, self.max_inputs
        if n < lo or (hi is not None and n > hi):
            if hi is None:
                want = f"at least {lo}"
            elif lo == hi:
                want = str(lo)
            else:
                want = f"{lo} to {hi}"
            names = ", ".join(self.input_names) + (", ..." if self.variadic else "")
            raise ArityError(f"{self.name} takes {want} input(s) ({names}), got {n}")

    def make_params(
        self,
        raw: Mapping[str, Any] | None = None,
        inputs: Sequence[ParallelTensorShape] = (),
    ) -> Params:
        """Checked, canonical parameters; with ``inputs``, axes are made non-negative against
        the rank of the first input."""
        params = canonical_params(self.params, raw or {}, self.name)
        if inputs:
            params = normalize_axes(self.params, params, inputs[0].rank)
        return params

    def num_outputs(self, params: Params) -> int:
        return 1

    def input_name(self, i: int) -> str:
        if i < len(self.input_names):
            return self.input_names[i]
        return f"{self.input_names[-1]}{i - len(self.input_names) + 1}"

    # -- semantics ----------------------------------------------------------------------------

    def infer(
        self, params: Params, inputs: tuple[ParallelTensorShape, ...]
    ) -> tuple[ParallelTensorShape, ...]:
        """Output parallel shapes. Raises ShapeError / DegreeError saying what is wrong."""
        raise NotImplementedError

    def evaluate(
        self,
        params: Params,
        inputs: tuple[ShardedArray, ...],
        outputs: tuple[ParallelTensorShape, ...],
    ) -> tuple[ShardedArray, ...]:
        """Shard semantics: output shards from input shards (``outputs`` from :meth:`infer`)."""
        raise NotImplementedError

    def reference(self, params: Params, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """Logical semantics on whole (unsharded) tensors."""
        raise NotImplementedError

    # -- counts -------------------------------------------------------------------------------

    def flops(
        self,
        params: Params,
        inputs: Sequence[ParallelTensorShape],
        outputs: Sequence[ParallelTensorShape],
        *,
        per_shard: bool = True,
    ) -> int:
        """Forward floating-point operations of one task (per shard, the default) or of the whole
        operator. A multiply-add counts 2."""
        if per_shard:
            return self.count_flops(params, _blocks(inputs), _blocks(outputs))
        return self.count_flops(params, _sizes(inputs), _sizes(outputs))

    def count_flops(
        self, params: Params, in_sizes: Sequence[Sizes], out_sizes: Sequence[Sizes]
    ) -> int:
        """Forward FLOPs on tensors of these sizes; operators override this."""
        return 0

    def bytes_accessed(
        self,
        params: Params,
        inputs: Sequence[ParallelTensorShape],
        outputs: Sequence[ParallelTensorShape],
        *,
        per_shard: bool = True,
    ) -> int:
        """Bytes read and written by one forward execution (per shard by default)."""
        attr = "shard_nbytes" if per_shard else "nbytes"
        return sum(getattr(s, attr) for s in (*inputs, *outputs))

    def gradient_bytes_accessed(
        self,
        params: Params,
        inputs: Sequence[ParallelTensorShape],
        outputs: Sequence[ParallelTensorShape],
        i: int,
    ) -> int | None:
        """Bytes one shard's gradient of input ``i`` reads and writes, for an operator whose
        per-input gradient moves less than its forward (a Concat's input ``i`` gets only its
        slice of the output gradient). None, the default: as much as the forward, which the
        cost model then charges per input."""
        return None

    def gradient_rows(self, params: Params, in_sizes: Sequence[Sizes], i: int) -> int | None:
        """How many rows (dimension-0 slices) of input ``i``'s gradient one execution on
        whole tensors of these sizes can make non-zero, when that is fewer than all of them
        by construction (a lookup touches only the rows it reads): the cost model then syncs
        and updates only those. None: the gradient is dense."""
        return None

    def __repr__(self) -> str:
        return f"<op {self.name}>"


class ComputeOp(OpSpec):
    """A tensor-algebra operator whose parallel behaviour follows from its :class:`Signature`."""

    kind = OpKind.COMPUTE
    #: Whether which dimensions the signature's axes index depends on sizes beyond which ones
    #: are 1 (a conv's spatial axes exist only for windows that tile; a reshape's runs follow
    #: its factorization). Symbolic reasoning about all sizes must not assume one structure,
    #: except where :meth:`signature_conditions` says which size relations keep it.
    size_dependent_signature: ClassVar[bool] = False
    #: ``(i, j, d)``: the integer values of input ``i`` index dimension ``d`` of input ``j``
    #: (an embedding's ids and its table's rows), so a smaller instance of the graph
    #: (:func:`pcgopt.scaled_down`) draws them below that dimension's new size.
    index_inputs: ClassVar[tuple[tuple[int, int, int], ...]] = ()
    #: ``(i, dims)``: dimensions of input ``i`` that a window slides along (a convolution's
    #: height and width). A smaller instance of the graph may give them any size the windows
    #: still fit; the output's sizes along them follow by shape inference.
    window_inputs: ClassVar[tuple[tuple[int, tuple[int, ...]], ...]] = ()

    def infer_logical(
        self, params: Params, inputs: tuple[ParallelTensorShape, ...]
    ) -> tuple[ParallelTensorShape, ...]:
        """Unpartitioned output shapes from the inputs' sizes and dtypes."""
        raise NotImplementedError

    def signature(
        self, params: Params, in_sizes: tuple[Sizes, ...], out_sizes: tuple[Sizes, ...]
    ) -> Signature:
        raise NotImplementedError

    def signature_conditions(
        self, params: Params, in_sizes: tuple[Sizes, ...], out_sizes: tuple[Sizes, ...]
    ) -> tuple[SizeRelation, ...] | None:
        """Relations among the sizes under which :meth:`signature` has the structure it has at
        these sizes: the same axes on the same dimensions, and every axis ``size`` the greatest
        common divisor of the sizes of the dimensions it indexes. Symbolic reasoning (the rule
        verifier's shape model, the e-graph's guards) may read the structure at one example
        and assume these relations wherever it applies it. Empty for an operator whose
        structure does not depend on sizes; None when an operator whose structure does cannot
        say (it is then left out of symbolic reasoning)."""
        return None if self.size_dependent_signature else ()

    def resized_params(
        self, params: Params, in_sizes: tuple[Sizes, ...], out_sizes: tuple[Sizes, ...]
    ) -> Params | None:
        """The parameters under which this operator maps inputs of ``in_sizes`` to outputs of
        ``out_sizes`` (new sizes, in a smaller instance of its graph: :mod:`pcgopt.scaled`), or
        None when its sizes cannot change that way. The default: the same parameters, unless
        its structure depends on its sizes (a convolution's windows) or a parameter holds
        sizes (a split's parts); an operator that can say (a reshape) overrides it."""
        if self.size_dependent_signature or any(p.type is ParamType.SHAPE for p in self.params):
            return None
        return params

    def summed_dims(
        self, params: Params, in_sizes: tuple[Sizes, ...], out_sizes: tuple[Sizes, ...]
    ) -> tuple[tuple[DimRef, tuple[DimRef, ...]], ...]:
        """Dimensions whose size is the sum of other dimensions' sizes, as ``(whole, parts)``
        (a split's input axis and its parts'): a smaller instance of the graph
        (:mod:`pcgopt.scaled`) gives each part its class's size and the whole their sum, so
        that a fused QKV product shrinks with its heads. Empty for most operators."""
        return ()

    def fixed_dims(
        self, params: Params, in_sizes: tuple[Sizes, ...], out_sizes: tuple[Sizes, ...]
    ) -> tuple[DimRef, ...] | None:
        """The dimensions whose sizes the parameters fix, when :meth:`resized_params` takes
        any other sizes as long as these keep theirs (a slice's sliced dimension): a smaller
        instance of the graph keeps them and shrinks the rest. None: not known, so a smaller
        instance keeps all of the node's dimensions."""
        return None

    def local(
        self, params: Params, ctx: LocalContext, *blocks: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """One task's computation on its input blocks. Most operators compute the same thing as
        on whole tensors; those that need their block's position (an embedding shard looking up
        only its rows) override this."""
        return self.reference(params, *blocks)

    def infer(self, params, inputs):
        logical = self.infer_logical(params, inputs)
        sig = self.signature(params, _sizes(inputs), _sizes(logical))
        return infer_parallel(self, sig, inputs, logical)

    def evaluate(self, params, inputs, outputs):
        sig = self.signature(params, _sizes([x.shape for x in inputs]), _sizes(outputs))
        if any(x.shape.micro_batches > 1 for x in inputs):
            return _evaluate_micro_batches(self, params, sig, inputs, outputs)
        return evaluate_parallel(self, params, sig, inputs, outputs)


def _sizes(shapes: Sequence[ParallelTensorShape]) -> tuple[Sizes, ...]:
    return tuple(s.sizes for s in shapes)


def _blocks(shapes: Sequence[ParallelTensorShape]) -> tuple[Sizes, ...]:
    return tuple(s.block_sizes for s in shapes)


# --------------------------------------------------------------------------------------------
# The parallel engine
# --------------------------------------------------------------------------------------------


def _along_axes(
    op: OpSpec,
    sig: Signature,
    inputs: Sequence[ParallelTensorShape],
    field: str,
    differ: Callable[[str, str, int, int, LoopAxis], str],
) -> tuple[dict[str, tuple[int, tuple[int, int] | None]], list[set[int]]]:
    """Per loop axis, the value of ``field`` (``"degree"``, ``"micro"``) that the input
    dimensions it indexes agree on, with the first of them (None: it indexes no input); and per
    input, the dimensions some axis indexes. ``differ(first, other, a, b, axis)`` words the
    error when two disagree (``first``/``other``: "input dimension d")."""
    found: dict[str, tuple[int, tuple[int, int] | None]] = {}
    covered: list[set[int]] = [set() for _ in inputs]
    for ax in sig.axes:
        first: tuple[int, int] | None = None
        value = 1
        for i, dim in enumerate(ax.inputs):
            if dim is None:
                continue
            covered[i].add(dim)
            v = getattr(inputs[i].dims[dim], field)
            if first is None:
                first, value = (i, dim), v
            elif v != value:
                fi, fd = first
                raise DegreeError(
                    differ(
                        f"{op.input_name(fi)} dimension {fd}",
                        f"{op.input_name(i)} dimension {dim}",
                        value,
                        v,
                        ax,
                    )
                )
        found[ax.name] = (value, first)
    return found, covered


def axis_degrees(
    op: OpSpec, sig: Signature, inputs: Sequence[ParallelTensorShape]
) -> dict[str, int]:
    """The degree of every loop axis, read off the inputs; checks that they agree, that they
    divide the axis size, and that no input dimension outside the axes is split."""
    found, covered = _along_axes(
        op,
        sig,
        inputs,
        "degree",
        lambda a, b, x, y, ax: (
            f"{a} is split {x} ways but {b} is split {y} ways; both index the {ax.name!r} axis "
            f"of {op.name} and must be split alike"
        ),
    )
    degrees: dict[str, int] = {}
    for ax in sig.axes:
        degree = found[ax.name][0]
        if ax.size is not None and ax.size % degree:
            raise DegreeError(
                f"the {ax.name!r} axis of {op.name} can be split only by divisors of {ax.size}, "
                f"not {degree}"
            )
        degrees[ax.name] = degree
    for i, shape in enumerate(inputs):
        for dim, pd in enumerate(shape.dims):
            if pd.degree > 1 and dim not in covered[i]:
                why = sig.note(i, dim)
                splittable = sorted(covered[i])
                raise DegreeError(
                    f"{op.input_name(i)} dimension {dim} is split {pd.degree} ways, but {op.name} "
                    f"cannot split that dimension"
                    + (f": {why}" if why else "")
                    + f" (splittable dimensions of {op.input_name(i)}: {splittable or 'none'}); "
                    f"Combine it first"
                )
    return degrees


def axis_micro_batches(
    op: OpSpec, sig: Signature, inputs: Sequence[ParallelTensorShape]
) -> dict[str, int]:
    """The micro-batch count of every loop axis, read off the inputs (Pipeline, module
    docstring). Checks that the inputs indexed by an axis agree, that only parallel axes that
    reach an output carry micro-batches, and that no other input dimension is in any."""
    found, covered = _along_axes(
        op,
        sig,
        inputs,
        "micro",
        lambda a, b, x, y, ax: (
            f"{a} is in {x} micro-batch(es) but {b} is in {y}; both index the {ax.name!r} axis "
            f"of {op.name} and must be cut alike (Pipeline or Batch one of them)"
        ),
    )
    counts: dict[str, int] = {}
    for ax in sig.axes:
        count, first = found[ax.name]
        if count > 1:
            assert first is not None  # a count above 1 was read off an input
            fi, fd = first
            where = f"{op.input_name(fi)} dimension {fd} is in {count} micro-batches"
            if ax.kind is AxisKind.REDUCE:
                raise DegreeError(
                    f"{where}, but {op.name} sums over it (its {ax.name!r} axis): every "
                    f"micro-batch would leave a partial sum of its own; Batch it first"
                )
            if not any(d is not None for d in ax.outputs):
                raise DegreeError(
                    f"{where}, but no output of {op.name} has that axis; Batch it first"
                )
            blocks = (ax.size or _axis_extent(ax, inputs)) // inputs[fi].dims[fd].degree
            if blocks % count:
                raise DegreeError(
                    f"{where}, but the {ax.name!r} axis of {op.name} has blocks of {blocks}, "
                    f"which {count} micro-batches do not divide"
                )
        counts[ax.name] = count
    for i, shape in enumerate(inputs):
        for dim, pd in enumerate(shape.dims):
            if pd.micro > 1 and dim not in covered[i]:
                raise DegreeError(
                    f"{op.input_name(i)} dimension {dim} is in {pd.micro} micro-batches, but "
                    f"{op.name} has no loop axis over that dimension to run them one at a "
                    f"time; Batch it first"
                )
    return counts


def _partial_degrees(
    op: OpSpec, sig: Signature, inputs: Sequence[ParallelTensorShape]
) -> tuple[int, ...]:
    sums = tuple(s.sum_degree for s in inputs)
    linear = set(sig.linear_in)
    for i, s in enumerate(sums):
        if s > 1 and i not in linear:
            raise DegreeError(
                f"{op.input_name(i)} holds {s} partial sums, but {op.name} is not linear in "
                f"{op.input_name(i)}; Reduce it first"
            )
    if sig.joint and len(set(sums)) > 1:
        listed = ", ".join(f"{op.input_name(i)}: {s}" for i, s in enumerate(sums))
        raise DegreeError(
            f"{op.name} is linear in its inputs together, so they must hold the same number of "
            f"partial sums (got {listed}); Reduce the partial ones, or turn copies of the others "
            f"into partial sums (Replicate, then ToPartial)"
        )
    return sums


def infer_parallel(
    op: OpSpec,
    sig: Signature,
    inputs: Sequence[ParallelTensorShape],
    logical: Sequence[ParallelTensorShape],
) -> tuple[ParallelTensorShape, ...]:
    """Output parallel shapes of a compute operator from its signature (module docstring)."""
    degrees = axis_degrees(op, sig, inputs)
    micro = axis_micro_batches(op, sig, inputs)
    sums = _partial_degrees(op, sig, inputs)
    linear = set(sig.linear_in)
    reduce_degree = math.prod(degrees[a.name] for a in sig.axes if a.kind is AxisKind.REDUCE)
    # Jointly linear inputs pair their partial sums up; multilinear ones multiply out.
    in_partial = (sums[0] if sums else 1) if sig.joint else math.prod(sums[i] for i in linear)
    out_sum = in_partial * reduce_degree

    extra_copies: int | None = None
    for i, shape in enumerate(inputs):
        reasons = []
        need = 1
        for ax in sig.axes:
            if ax.inputs[i] is None and degrees[ax.name] > 1:
                need *= degrees[ax.name]
                reasons.append(f"the {ax.name!r} axis is split {degrees[ax.name]} ways")
        if not sig.joint:
            for j in linear:
                if j != i and sums[j] > 1:
                    need *= sums[j]
                    reasons.append(f"{op.input_name(j)} holds {sums[j]} partial sums")
        if shape.copy_degree % need:
            raise DegreeError(
                f"{op.input_name(i)} must be copied a multiple of {need} times "
                f"({'; '.join(reasons)}), but it has {shape.copy_degree} cop"
                f"{'y' if shape.copy_degree == 1 else 'ies'}; Replicate it"
            )
        extra = shape.copy_degree // need
        if extra_copies is None:
            extra_copies = extra
        elif extra != extra_copies:
            raise DegreeError(
                f"{op.input_name(0)} carries {extra_copies} redundant cop"
                f"{'y' if extra_copies == 1 else 'ies'} but {op.input_name(i)} carries {extra}; "
                f"the inputs of {op.name} must be replicated consistently (DiscardCopies or "
                f"Replicate one of them)"
            )
    copies = extra_copies or 1

    outs = []
    for o, out in enumerate(logical):
        out_degrees = [1] * out.rank
        out_micro = [1] * out.rank
        for ax in sig.axes:
            if o < len(ax.outputs) and ax.outputs[o] is not None:
                out_degrees[ax.outputs[o]] = degrees[ax.name]
                out_micro[ax.outputs[o]] = micro[ax.name]
        outs.append(
            ParallelTensorShape.of(
                out.sizes,
                out.dtype,
                degrees=out_degrees,
                copy_degree=copies,
                sum_degree=out_sum,
                micro=out_micro,
            )
        )
    return tuple(outs)


def evaluate_parallel(
    op: ComputeOp,
    params: Params,
    sig: Signature,
    inputs: Sequence[ShardedArray],
    outputs: Sequence[ParallelTensorShape],
) -> tuple[ShardedArray, ...]:
    """Shard semantics of a compute operator: one local computation per task.

    The tasks are the product of the inputs' partial-sum indices (paired when the operator is
    jointly linear) and the block indices of every split axis. Output partial-sum index: the
    inputs' partial indices first (in input order), then the indices of split reduce axes.
    """
    shapes = [x.shape for x in inputs]
    degrees = axis_degrees(op, sig, shapes)
    split_axes = [a for a in sig.axes if degrees[a.name] > 1]
    if sig.joint:
        partial_ranges = [shapes[0].sum_degree] if shapes and shapes[0].sum_degree > 1 else []
        partial_owner: list[tuple[int, ...]] = [tuple(range(len(inputs)))] if partial_ranges else []
    else:
        partial_owner = [(i,) for i in sig.linear_in if shapes[i].sum_degree > 1]
        partial_ranges = [shapes[i[0]].sum_degree for i in partial_owner]

    results: list[np.ndarray | None] = [None] * len(outputs)
    ranges = [range(n) for n in (*partial_ranges, *(degrees[a.name] for a in split_axes))]
    ctx_sizes = tuple(tuple(s.block_sizes) for s in outputs)
    global_in_sizes = tuple(s.sizes for s in shapes)
    # Index maps worked out once, not per task (a plan on 64 devices has 64 tasks a node):
    # each input's partial-sum position among the task's and its split dimensions, each
    # output's, and where each split axis's blocks start.
    n_partial = len(partial_ranges)
    in_sum = [
        max((k for k, owners in enumerate(partial_owner) if i in owners), default=None)
        for i in range(len(inputs))
    ]
    in_dims = [
        [(a.inputs[i], k) for k, a in enumerate(split_axes) if a.inputs[i] is not None]
        for i in range(len(inputs))
    ]
    out_dims = [
        [
            (a.outputs[o], k)
            for k, a in enumerate(split_axes)
            if o < len(a.outputs) and a.outputs[o] is not None
        ]
        for o in range(len(outputs))
    ]
    names = [a.name for a in split_axes]
    steps = [(a.size or _axis_extent(a, shapes)) // degrees[a.name] for a in split_axes]
    sum_axes = [
        *range(n_partial),
        *(n_partial + k for k, a in enumerate(split_axes) if a.kind is AxisKind.REDUCE),
    ]
    sum_grid = list(zip([len(ranges[t]) for t in sum_axes], sum_axes, strict=True))
    # Every block's index as items of the task extended by a 0 and its output partial-sum
    # index (``ext`` below), fetched by one itemgetter: the loop runs once per task.
    zero, summed = len(ranges), len(ranges) + 1
    in_index = []
    for x, s, dims in zip(inputs, in_sum, in_dims, strict=True):
        items = [zero if s is None else s] + [zero] * x.shape.rank
        for d, k in dims:
            items[1 + d] = n_partial + k
        in_index.append((x.data, _items_getter(items)))
    out_index = []
    for o, out_shape in enumerate(outputs):
        items = [summed] + [zero] * out_shape.rank
        for d, k in out_dims[o]:
            items[1 + d] = n_partial + k
        out_index.append(_items_getter(items))
    # Most operators compute a block as they compute a whole tensor: no context to build.
    positioned = type(op).local is not ComputeOp.local
    for task in itertools.product(*ranges):
        sum_index = 0
        for g, t in sum_grid:
            sum_index = sum_index * g + task[t]
        ext = (*task, 0, sum_index)
        blocks = [data[index(ext)] for data, index in in_index]
        if positioned:
            a_idx = task[n_partial:]
            ctx = LocalContext(
                {name: k * step for name, k, step in zip(names, a_idx, steps, strict=True)},
                ctx_sizes,
                global_in_sizes,
            )
            local_out = op.local(params, ctx, *blocks)
        else:
            local_out = op.reference(params, *blocks)
        for o, (val, sizes) in enumerate(zip(local_out, ctx_sizes, strict=True)):
            val = np.asarray(val)
            if val.shape != sizes:
                out_shape = outputs[o]
                raise ShapeError(
                    f"{op.name}: local computation produced a block of shape {val.shape}, "
                    f"expected {out_shape.block_sizes} for {out_shape} (a bug in the operator spec)"
                )
            if results[o] is None:
                out_shape = outputs[o]
                results[o] = np.zeros(
                    (out_shape.sum_degree, *out_shape.degrees, *sizes), dtype=val.dtype
                )
            results[o][out_index[o](ext)] = val
    return tuple(ShardedArray(s, r) for s, r in zip(outputs, results, strict=True))


def _items_getter(items: list[int]) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    """The tuple of ``items`` of a tuple (a tuple even for one item, as an index must be)."""
    get = operator.itemgetter(*items)
    return get if len(items) > 1 else lambda t: (get(t),)


def _evaluate_micro_batches(
    op: ComputeOp,
    params: Params,
    sig: Signature,
    inputs: Sequence[ShardedArray],
    outputs: Sequence[ParallelTensorShape],
) -> tuple[ShardedArray, ...]:
    """Shard semantics with micro-batches: every micro-batch of a block is computed on its own,
    as a block of a split ``micro`` times finer would be, and the pieces are put back in place
    (the layout does not change: micro-batches are pieces of the blocks a device holds)."""
    axis_micro_batches(op, sig, [x.shape for x in inputs])  # refuses what cannot be cut

    def pieces(shape: ParallelTensorShape) -> ParallelTensorShape:
        return ParallelTensorShape.of(
            shape.sizes,
            shape.dtype,
            degrees=[d.degree * d.micro for d in shape.dims],
            copy_degree=shape.copy_degree,
            sum_degree=shape.sum_degree,
        )

    split = []
    for x in inputs:
        data = x.data
        for dim, m in enumerate(x.shape.micro):
            if m > 1:
                data = split_dim(data, dim, m)
        split.append(ShardedArray(pieces(x.shape), data))
    results = evaluate_parallel(op, params, sig, split, [pieces(o) for o in outputs])
    merged = []
    for r, shape in zip(results, outputs, strict=True):
        data = r.data
        for dim, m in enumerate(shape.micro):
            if m > 1:
                data = merge_dim(data, dim, m)
        merged.append(ShardedArray(shape, data))
    return tuple(merged)


def _axis_extent(ax: LoopAxis, shapes: Sequence[ParallelTensorShape]) -> int:
    for i, dim in enumerate(ax.inputs):
        if dim is not None:
            return shapes[i].sizes[dim]
    raise ValueError(f"axis {ax.name!r} indexes no input")
