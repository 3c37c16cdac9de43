"""Embedding lookups. An embedding is a product with a one-hot matrix, so it is linear in the
table, and splitting the table's rows (vocabulary) leaves partial sums: each shard looks up the
rows it holds and contributes zeros for the others. That is DLRM's model-parallel embedding."""

from __future__ import annotations

import math
from typing import Any

from pcgopt.errors import EvaluationError, ShapeError
from pcgopt.ops.arrays import array_module, is_concrete
from pcgopt.ops.spec import AxisKind, ComputeOp, LocalContext, LoopAxis, Signature
from pcgopt.shapes import ParallelTensorShape


def _check_inputs(op: str, indices: ParallelTensorShape, table: ParallelTensorShape) -> None:
    if not indices.dtype.is_integer:
        raise ShapeError(f"{op}: indices must be integers, got {indices.dtype.value}")
    if table.rank != 2:
        raise ShapeError(f"{op}: table must be [rows, dim], got {table}")
    if table.dtype.is_integer:
        raise ShapeError(f"{op}: table must be floating-point, got {table.dtype.value}")


def _gathered_rows(inputs, per_shard: bool) -> tuple[float, int]:
    """(rows read, elements per row) of one task (or the whole operator): a gather reads the
    looked-up rows, not the table; a shard holding a block of the rows expects that share of its
    lookups to land in it."""
    idx, table = inputs
    if not per_shard:
        return float(idx.numel), table.sizes[1]
    hit = table.block_sizes[0] / table.sizes[0]
    return idx.shard_numel * hit, table.block_sizes[1]


def _gather_bytes(inputs, outputs, per_shard: bool) -> int:
    rows, width = _gathered_rows(inputs, per_shard)
    idx, table = inputs
    moved = (idx.shard_nbytes if per_shard else idx.nbytes) + sum(
        o.shard_nbytes if per_shard else o.nbytes for o in outputs
    )
    return moved + int(rows * width * table.dtype.itemsize)


def _lookup(indices: Any, table: Any, first_row: Any, total_rows: int) -> Any:
    """Rows ``indices`` of the full table, given the block ``table`` that starts at
    ``first_row``; rows outside the block contribute zeros. On numpy values, indices outside
    the table are an error; traced JAX values cannot be checked here."""
    xp = array_module(indices, table, first_row)
    if is_concrete(indices) and indices.size and (indices.min() < 0 or indices.max() >= total_rows):
        raise EvaluationError(
            f"embedding index out of range: values must lie in [0, {total_rows}), got "
            f"[{indices.min()}, {indices.max()}]"
        )
    local = indices - first_row
    inside = (local >= 0) & (local < table.shape[0])
    rows = table[xp.where(inside, local, 0)]
    return xp.where(inside[..., None], rows, xp.zeros((), dtype=table.dtype))


class Embedding(ComputeOp):
    """Row lookup: indices [...] (integers), table [rows, dim] -> [..., dim]."""

    name = "embedding"
    input_names = ("indices", "table")
    index_inputs = ((0, 1, 0),)

    def infer_logical(self, params, inputs):
        idx, table = inputs
        _check_inputs(self.name, idx, table)
        return (ParallelTensorShape.of((*idx.sizes, table.sizes[1]), table.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        r = len(in_sizes[0])
        axes = [LoopAxis(f"i{k}", AxisKind.PARALLEL, (k, None), (k,)) for k in range(r)]
        axes.append(LoopAxis("dim", AxisKind.PARALLEL, (None, 1), (r,)))
        axes.append(LoopAxis("rows", AxisKind.REDUCE, (None, 0)))
        return Signature(tuple(axes), linear_in=(1,))

    def reference(self, params, indices, table):
        return (_lookup(indices, table, 0, table.shape[0]),)

    def local(self, params, ctx: LocalContext, indices, table):
        return (_lookup(indices, table, ctx.offset("rows"), ctx.global_in_sizes[1][0]),)

    def bytes_accessed(self, params, inputs, outputs, *, per_shard=True):
        return _gather_bytes(inputs, outputs, per_shard)

    def gradient_rows(self, params, in_sizes, i):
        return math.prod(in_sizes[0]) if i == 1 else None  # one table row per index


class EmbeddingBag(ComputeOp):
    """Sum of looked-up rows per bag: indices [N, L] (integers), table [rows, dim] -> [N, dim].
    Splitting L (the bag) also leaves partial sums."""

    name = "embedding_bag"
    input_names = ("indices", "table")
    index_inputs = ((0, 1, 0),)

    def infer_logical(self, params, inputs):
        idx, table = inputs
        _check_inputs(self.name, idx, table)
        if idx.rank != 2:
            raise ShapeError(f"embedding_bag: indices must be [batch, bag], got {idx}")
        return (ParallelTensorShape.of((idx.sizes[0], table.sizes[1]), table.dtype),)

    def signature(self, params, in_sizes, out_sizes):
        axes = (
            LoopAxis("batch", AxisKind.PARALLEL, (0, None), (0,)),
            LoopAxis("dim", AxisKind.PARALLEL, (None, 1), (1,)),
            LoopAxis("bag", AxisKind.REDUCE, (1, None)),
            LoopAxis("rows", AxisKind.REDUCE, (None, 0)),
        )
        return Signature(axes, linear_in=(1,))

    def reference(self, params, indices, table):
        return (_lookup(indices, table, 0, table.shape[0]).sum(axis=1),)

    def local(self, params, ctx: LocalContext, indices, table):
        rows = _lookup(indices, table, ctx.offset("rows"), ctx.global_in_sizes[1][0])
        return (rows.sum(axis=1),)

    def flops(self, params, inputs, outputs, *, per_shard=True):
        rows, width = _gathered_rows(inputs, per_shard)
        return int(rows * width)  # one add per gathered element

    def bytes_accessed(self, params, inputs, outputs, *, per_shard=True):
        return _gather_bytes(inputs, outputs, per_shard)

    def gradient_rows(self, params, in_sizes, i):
        return math.prod(in_sizes[0]) if i == 1 else None  # one table row per bag entry
