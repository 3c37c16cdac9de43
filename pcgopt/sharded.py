"""The value of a parallel tensor: all its shards, in one numpy array.

Layout. A tensor of shape ``ParallelTensorShape`` with partial-sum degree ``S``, per-dimension
degrees ``d0..dn-1`` and block sizes ``b0..bn-1`` is stored as one array of shape
``(S, d0, ..., dn-1, b0, ..., bn-1)``: ``data[s, i0, ..., in-1]`` is the block at block index
``(i0, ..., in-1)`` of partial sum ``s``. Copies are identical by definition, so they are not
stored twice; :meth:`ShardedArray.shard` hands out the same block for every copy index.

Shard order. Shard index ``k`` of a tensor unravels, in C order, to ``(s, c, i0, ..., in-1)``
over ``(S, copy_degree, d0, ..., dn-1)``. A shard index is a position in the tensor's own grid,
not a device: a PCG fixes what every shard holds, and the machine mapping (``pcgopt.extract``)
decides which device holds it. Where a consumer's tasks cannot run where the producer left its
shards, the mapping pays for moving them.

Block conventions shared by every operator:

* splitting a block ``d`` ways (Partition) makes block ``i`` into blocks ``i*d .. i*d+d-1``;
  merging (Combine) is the inverse: adjacent blocks are concatenated;
* reducing partial sums ``d`` ways (Reduce) sums the ``d`` adjacent partial indices
  ``s*d .. s*d+d-1`` into partial index ``s``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pcgopt.errors import EvaluationError
from pcgopt.shapes import ParallelTensorShape


@dataclass(frozen=True, slots=True, eq=False)
class ShardedArray:
    """A parallel tensor's shards (see the module docstring for the layout)."""

    shape: ParallelTensorShape
    data: np.ndarray

    def __post_init__(self) -> None:
        expected = (self.shape.sum_degree, *self.shape.degrees, *self.shape.block_sizes)
        if self.data.shape != expected:
            raise EvaluationError(
                f"shard array of shape {self.data.shape} does not fit {self.shape}; "
                f"expected {expected}"
            )

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_logical(
        cls,
        value: np.ndarray,
        shape: ParallelTensorShape,
        rng: np.random.Generator | None = None,
    ) -> ShardedArray:
        """Shards a logical tensor. Partial sums are a random split of ``value`` when ``rng`` is
        given (integers stay integers), else ``value`` in partial 0 and zeros elsewhere."""
        value = np.asarray(value)
        if value.shape != shape.sizes:
            raise EvaluationError(f"value of shape {value.shape} does not fit {shape}")
        parts = np.zeros((shape.sum_degree, *value.shape), dtype=value.dtype)
        if shape.sum_degree > 1 and rng is not None:
            if np.issubdtype(value.dtype, np.integer):
                parts[1:] = rng.integers(-3, 4, size=parts[1:].shape)
            else:
                parts[1:] = rng.standard_normal(parts[1:].shape)
            parts[0] = value - parts[1:].sum(axis=0)
        else:
            parts[0] = value
        return cls(shape, to_blocks(parts, shape.degrees))

    # -- access -------------------------------------------------------------------------------

    def logical(self) -> np.ndarray:
        """The tensor this value stands for: the sum of the partial sums, blocks assembled."""
        return from_blocks(self.data).sum(axis=0)

    def block(self, sum_index: int, block_index: tuple[int, ...]) -> np.ndarray:
        return self.data[(sum_index, *block_index)]

    def shard(self, index: int) -> np.ndarray:
        """The shard held by device ``index`` (see the device order in the module docstring)."""
        s = self.shape
        grid = (s.sum_degree, s.copy_degree, *s.degrees)
        if not 0 <= index < s.num_shards:
            raise IndexError(f"shard {index} out of range for {s} ({s.num_shards} shards)")
        sum_i, _copy_i, *blk = np.unravel_index(index, grid)
        return self.block(int(sum_i), tuple(int(b) for b in blk))

    def shards(self) -> Iterator[np.ndarray]:
        """All shards in device order."""
        for k in range(self.shape.num_shards):
            yield self.shard(k)

    def __repr__(self) -> str:
        return f"ShardedArray({self.shape}, dtype={self.data.dtype})"


def to_blocks(parts: np.ndarray, degrees: tuple[int, ...]) -> np.ndarray:
    """``(S, size0, ..)`` -> ``(S, d0, .., b0, ..)``."""
    n = len(degrees)
    split = [parts.shape[0]]
    for size, d in zip(parts.shape[1:], degrees, strict=True):
        split += [d, size // d]
    arr = parts.reshape(split)
    order = [0, *range(1, 2 * n + 1, 2), *range(2, 2 * n + 2, 2)]
    return arr.transpose(order)


def from_blocks(data: np.ndarray) -> np.ndarray:
    """``(S, d0, .., b0, ..)`` -> ``(S, size0, ..)``."""
    n = (data.ndim - 1) // 2
    order = [0]
    for k in range(n):
        order += [1 + k, 1 + n + k]
    arr = data.transpose(order)
    return arr.reshape(
        data.shape[0], *(data.shape[1 + k] * data.shape[1 + n + k] for k in range(n))
    )


def split_dim(data: np.ndarray, dim: int, factor: int) -> np.ndarray:
    """Partition layout change: each block of ``dim`` becomes ``factor`` adjacent blocks."""
    n = (data.ndim - 1) // 2
    deg_ax, blk_ax = 1 + dim, 1 + n + dim
    d, b = data.shape[deg_ax], data.shape[blk_ax]
    # Split the block axis into (factor, b // factor), then move `factor` next to the degree
    # axis and merge the pair: new block index = old * factor + t.
    arr = data.reshape(*data.shape[:blk_ax], factor, b // factor, *data.shape[blk_ax + 1 :])
    arr = np.moveaxis(arr, blk_ax, deg_ax + 1)
    shape = list(data.shape)
    shape[deg_ax], shape[blk_ax] = d * factor, b // factor
    return arr.reshape(shape)


def merge_dim(data: np.ndarray, dim: int, factor: int) -> np.ndarray:
    """Combine layout change: each run of ``factor`` adjacent blocks of ``dim`` becomes one."""
    n = (data.ndim - 1) // 2
    deg_ax, blk_ax = 1 + dim, 1 + n + dim
    d, b = data.shape[deg_ax], data.shape[blk_ax]
    arr = data.reshape(*data.shape[:deg_ax], d // factor, factor, *data.shape[deg_ax + 1 :])
    arr = np.moveaxis(arr, deg_ax + 1, blk_ax)  # the block axis has moved one to the right
    shape = list(data.shape)
    shape[deg_ax], shape[blk_ax] = d // factor, b * factor
    return arr.reshape(shape)


def sum_partials(data: np.ndarray, factor: int) -> np.ndarray:
    """Reduce layout change: sums each run of ``factor`` adjacent partial sums."""
    s = data.shape[0]
    return data.reshape(s // factor, factor, *data.shape[1:]).sum(axis=1)


def spread_partials(data: np.ndarray, factor: int) -> np.ndarray:
    """Each partial sum becomes ``factor`` adjacent ones: itself, then zeros (the inverse of
    :func:`sum_partials` on such data)."""
    out = np.zeros((data.shape[0], factor, *data.shape[1:]), dtype=data.dtype)
    out[:, 0] = data
    return out.reshape(data.shape[0] * factor, *data.shape[1:])


def interleave_partials(datas: list[np.ndarray]) -> np.ndarray:
    """Stacks tensors of one layout as partial sums: partial ``s * n + i`` is partial ``s`` of
    input ``i`` (so Reduce(n) pairs them up, as Add does)."""
    return np.stack(datas, axis=1).reshape(datas[0].shape[0] * len(datas), *datas[0].shape[1:])


def num_blocks(shape: ParallelTensorShape) -> int:
    return shape.sum_degree * math.prod(shape.degrees)
