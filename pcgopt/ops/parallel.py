"""Parallelization operators: the only operators that move data between devices.

The primitives change one thing about a parallel tensor:

* Partition(dim, degree): splits every block of ``dim`` into ``degree`` blocks;
* Combine(dim, degree): concatenates runs of ``degree`` adjacent blocks of ``dim``;
* Replicate(degree): makes ``degree`` copies of every shard;
* Reduce(degree): sums runs of ``degree`` adjacent partial sums;
* DiscardCopies(degree): keeps one in every ``degree`` copies (no data moves);
* ToPartial(degree): turns every ``degree`` copies into ``degree`` partial sums, the first
  keeping the value and the others zero (AutoDDL's free Broadcast -> Partial-sum; no data moves).

Two more change how a tensor is computed, not where it is (Unity section 4.1, Figure 8c):

* Pipeline(dim, micro_batches): processes every block of ``dim`` as ``micro_batches`` equal
  micro-batches, one after another, on the devices that hold it (the degree stays, the size
  processed at once shrinks);
* Batch(dim, micro_batches): gathers runs of ``micro_batches`` micro-batches back into one.

Neither moves data. Compute operators carry micro-batches along their parallel loop axes
(:func:`pcgopt.ops.spec.infer_parallel`) and refuse them on a reduction, where each
micro-batch would leave a partial sum of its own.

Partition/Combine and Replicate/Reduce are each other's backward, as are DiscardCopies and
ToPartial, and Pipeline and Batch. StackPartial(n inputs) makes the inputs the partial sums of
one tensor (no data moves), so that Add = Reduce . StackPartial (Unity Figure 11b). The fused
collectives are defined as compositions of the primitives (:meth:`ParallelOp.steps`), so their
meaning is the composition by construction:

* AllReduce(d) = Replicate(d) . Reduce(d)
* ReduceScatter(dim, d) = Partition(dim, d) . Reduce(d)
* AllGather(dim, d) = Replicate(d) . Combine(dim, d)
* AllToAll(src, dst, d) = Partition(dst, d) . Combine(src, d)
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

from pcgopt.errors import DegreeError, ShapeError
from pcgopt.ops.params import Param, ParamType
from pcgopt.ops.spec import OpKind, OpSpec
from pcgopt.shapes import ParallelTensorShape
from pcgopt.sharded import (
    ShardedArray,
    interleave_partials,
    merge_dim,
    split_dim,
    spread_partials,
    sum_partials,
)

Step = tuple[str, int, int]  # (primitive, dim or -1, degree)


def _partition_shape(s: ParallelTensorShape, dim: int, degree: int) -> ParallelTensorShape:
    d = s.dims[dim]
    if d.size % (d.degree * degree):
        raise DegreeError(
            f"cannot split dimension {dim} (size {d.size}, already split {d.degree} ways) "
            f"{degree} more ways: {d.degree * degree} does not divide {d.size}"
        )
    return s.with_degree(dim, d.degree * degree)


def _combine_shape(s: ParallelTensorShape, dim: int, degree: int) -> ParallelTensorShape:
    d = s.dims[dim]
    if d.degree % degree:
        raise DegreeError(
            f"cannot combine dimension {dim} by {degree}: it is split {d.degree} "
            f"way{'s' if d.degree > 1 else ''}, and {degree} does not divide {d.degree}"
        )
    return s.with_degree(dim, d.degree // degree)


def _reduce_shape(s: ParallelTensorShape, degree: int) -> ParallelTensorShape:
    if s.sum_degree % degree:
        if s.sum_degree == 1 and s.copy_degree > 1:
            why = (
                f"the input {s} holds {s.copy_degree} identical copies, not partial sums; summing "
                "copies would multiply the tensor"
            )
        else:
            why = f"the input {s} holds {s.sum_degree} partial sum(s)"
        raise DegreeError(f"cannot reduce {degree} partial sums: {why}")
    return s.with_replicas(sum_degree=s.sum_degree // degree)


def _take_copies(s: ParallelTensorShape, degree: int, what: str) -> ParallelTensorShape:
    if s.copy_degree % degree:
        raise DegreeError(
            f"cannot {what} {degree} copies: the input {s} holds {s.copy_degree} "
            f"cop{'y' if s.copy_degree == 1 else 'ies'}"
        )
    return s.with_replicas(copy_degree=s.copy_degree // degree)


def _pipeline_shape(s: ParallelTensorShape, dim: int, count: int) -> ParallelTensorShape:
    d = s.dims[dim]
    if d.block % (d.micro * count):
        raise DegreeError(
            f"cannot cut dimension {dim} into {count} more micro-batches: its blocks of "
            f"{d.block} (size {d.size} split {d.degree} way{'s' if d.degree > 1 else ''}"
            + (f", already in {d.micro} micro-batches" if d.micro > 1 else "")
            + f") do not divide into {d.micro * count}"
        )
    return s.with_micro(dim, d.micro * count)


def _batch_shape(s: ParallelTensorShape, dim: int, count: int) -> ParallelTensorShape:
    d = s.dims[dim]
    if d.micro % count:
        raise DegreeError(
            f"cannot batch {count} micro-batches of dimension {dim}: its blocks are processed in "
            f"{d.micro} micro-batch{'es' if d.micro > 1 else ''}, and {count} does not divide "
            f"{d.micro}"
        )
    return s.with_micro(dim, d.micro // count)


def _apply_shape(s: ParallelTensorShape, step: Step) -> ParallelTensorShape:
    kind, dim, degree = step
    if kind == "pipeline":
        return _pipeline_shape(s, dim, degree)
    if kind == "batch":
        return _batch_shape(s, dim, degree)
    if kind == "partition":
        return _partition_shape(s, dim, degree)
    if kind == "combine":
        return _combine_shape(s, dim, degree)
    if kind == "replicate":
        return s.with_replicas(copy_degree=s.copy_degree * degree)
    if kind == "discard":
        return _take_copies(s, degree, "discard")
    if kind == "to_partial":
        s = _take_copies(s, degree, "turn into partial sums")
        return s.with_replicas(sum_degree=s.sum_degree * degree)
    return _reduce_shape(s, degree)


def _apply_data(data, step: Step):
    kind, dim, degree = step
    if kind == "partition":
        return split_dim(data, dim, degree)
    if kind == "combine":
        return merge_dim(data, dim, degree)
    if kind in ("replicate", "discard", "pipeline", "batch"):
        # Copies are not stored twice; micro-batches are an order of work on the same blocks.
        return data
    if kind == "to_partial":
        return spread_partials(data, degree)
    return sum_partials(data, degree)


class ParallelOp(OpSpec):
    """Base: a parallel operator is a sequence of primitive steps."""

    kind = OpKind.PARALLEL
    input_names = ("x",)
    #: The parameter that says how many (devices' blocks, copies, partial sums, micro-batches):
    #: the one a rule generalizes to a symbol.
    count_param: ClassVar[str] = "degree"

    @abstractmethod
    def steps(self, params) -> tuple[Step, ...]: ...

    def infer(self, params, inputs):
        (s,) = inputs
        for step in self.steps(params):
            s = _apply_shape(s, step)
        return (s,)

    def evaluate(self, params, inputs, outputs):
        data = inputs[0].data
        for step in self.steps(params):
            data = _apply_data(data, step)
        return (ShardedArray(outputs[0], data),)

    def reference(self, params, x):
        return (x.copy(),)  # the logical tensor is unchanged; only its distribution is


_DIM = Param("dim", ParamType.AXIS)
_DEGREE = Param("degree", ParamType.POS_INT)


class Partition(ParallelOp):
    """Splits dimension ``dim`` ``degree`` more ways."""

    name = "partition"
    params = (_DIM, _DEGREE)

    def steps(self, params):
        return (("partition", params["dim"], params["degree"]),)


class Combine(ParallelOp):
    """Joins ``degree`` adjacent blocks of dimension ``dim`` (the inverse of Partition)."""

    name = "combine"
    params = (_DIM, _DEGREE)

    def steps(self, params):
        return (("combine", params["dim"], params["degree"]),)


class Replicate(ParallelOp):
    """Makes ``degree`` identical copies of every shard."""

    name = "replicate"
    params = (_DEGREE,)

    def steps(self, params):
        return (("replicate", -1, params["degree"]),)


class Reduce(ParallelOp):
    """Sums runs of ``degree`` adjacent partial sums (the backward of Replicate)."""

    name = "reduce"
    params = (_DEGREE,)

    def steps(self, params):
        return (("reduce", -1, params["degree"]),)


class DiscardCopies(ParallelOp):
    """Keeps one in every ``degree`` copies (the inverse of Replicate; no data moves)."""

    name = "discard_copies"
    params = (_DEGREE,)

    def steps(self, params):
        return (("discard", -1, params["degree"]),)


class ToPartial(ParallelOp):
    """Turns every ``degree`` copies into ``degree`` partial sums: one keeps the value, the
    others become zero (no data moves). Reduce(degree) . ToPartial(degree) = DiscardCopies."""

    name = "to_partial"
    params = (_DEGREE,)

    def steps(self, params):
        return (("to_partial", -1, params["degree"]),)


class StackPartial(OpSpec):
    """Makes ``n`` tensors of one parallel shape the partial sums of one tensor (their sum):
    partial ``s * n + i`` is partial ``s`` of input ``i``. No data moves: each input stays where
    it is. Add(x, y) = Reduce(2) . StackPartial(x, y), Unity's Figure 11b."""

    name = "stack_partial"
    kind = OpKind.PARALLEL
    input_names = ("inputs",)
    variadic = True
    # The partials land on different shards, but the parallel tensor (its shape, and the sum
    # it stands for) does not depend on their order.
    commutative = True

    def input_name(self, i: int) -> str:
        return f"inputs[{i}]"

    def infer(self, params, inputs):
        first = inputs[0]
        for i, s in enumerate(inputs[1:], 1):
            if s != first:
                raise ShapeError(
                    f"stack_partial needs inputs of one parallel shape; inputs[0] is {first}, "
                    f"inputs[{i}] is {s}"
                )
        return (first.with_replicas(sum_degree=first.sum_degree * len(inputs)),)

    def evaluate(self, params, inputs, outputs):
        return (ShardedArray(outputs[0], interleave_partials([x.data for x in inputs])),)

    def reference(self, params, *xs):
        return (sum(xs[1:], xs[0].copy()),)


_MICRO_BATCHES = Param("micro_batches", ParamType.POS_INT)

#: The operators that cut or gather micro-batches.
MICRO_BATCH_OPS = frozenset({"pipeline", "batch"})


class Pipeline(ParallelOp):
    """Processes every block of dimension ``dim`` as ``micro_batches`` equal micro-batches, one
    after another (Unity's Pipeline; no data moves)."""

    name = "pipeline"
    params = (_DIM, _MICRO_BATCHES)
    count_param = "micro_batches"

    def steps(self, params):
        return (("pipeline", params["dim"], params["micro_batches"]),)


class Batch(ParallelOp):
    """Gathers runs of ``micro_batches`` micro-batches of dimension ``dim`` back into one
    (Unity's Batch, the inverse of Pipeline; no data moves)."""

    name = "batch"
    params = (_DIM, _MICRO_BATCHES)
    count_param = "micro_batches"

    def steps(self, params):
        return (("batch", params["dim"], params["micro_batches"]),)


class AllReduce(ParallelOp):
    """Reduce(degree), then Replicate(degree): every member of a group gets the sum."""

    name = "all_reduce"
    params = (_DEGREE,)

    def steps(self, params):
        return (("reduce", -1, params["degree"]), ("replicate", -1, params["degree"]))


class ReduceScatter(ParallelOp):
    """Reduce(degree), then Partition(dim, degree): each member gets one block of the sum."""

    name = "reduce_scatter"
    params = (_DIM, _DEGREE)

    def steps(self, params):
        return (("reduce", -1, params["degree"]), ("partition", params["dim"], params["degree"]))


class AllGather(ParallelOp):
    """Combine(dim, degree), then Replicate(degree): every member gets all blocks."""

    name = "all_gather"
    params = (_DIM, _DEGREE)

    def steps(self, params):
        return (("combine", params["dim"], params["degree"]), ("replicate", -1, params["degree"]))


class AllToAll(ParallelOp):
    """Combine(src_dim, degree), then Partition(dst_dim, degree): re-splits a tensor along
    another dimension."""

    name = "all_to_all"
    params = (
        Param("src_dim", ParamType.AXIS),
        Param("dst_dim", ParamType.AXIS),
        _DEGREE,
    )

    def infer(self, params, inputs):
        if params["src_dim"] == params["dst_dim"]:
            raise DegreeError(
                f"all_to_all needs two different dimensions, got src_dim = dst_dim = "
                f"{params['src_dim']}"
            )
        return super().infer(params, inputs)

    def steps(self, params):
        return (
            ("combine", params["src_dim"], params["degree"]),
            ("partition", params["dst_dim"], params["degree"]),
        )
