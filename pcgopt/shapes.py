"""Parallel tensor shapes: the type every edge of a PCG carries.

A parallel tensor has data dimensions, each with a ``size`` and a ``degree`` (the number of equal
blocks it is split into), and a replica dimension. Replicas come in two kinds, kept apart because
they decide which collectives are legal and what they cost:

* copies (``copy_degree``): identical replicas, made by Replicate (AutoDDL's Broadcast,
  DTensor's ``Replicate()``);
* partial sums (``sum_degree``): replicas whose sum is the tensor, made by splitting a reduction
  (AutoDDL's Partial-sum, DTensor's ``Partial()``); Reduce turns them back into one tensor.

A tensor can have both (copies of partial sums), as on a 2-D device mesh where one axis holds
partial sums and the other replicates. The number of shards (devices the tensor spans) is
``sum_degree * copy_degree * prod(degrees)``.

A dimension may also be cut into ``micro`` micro-batches (Unity's Pipeline, section 4.1): every
block is processed as ``micro`` equal pieces, one after another, on the same devices. That is
how the tensor is computed, not where it lives: the degree, the shards and the values are those
without micro-batches. ``64/2~4`` is a dimension of 64 split two ways, each block of 32 in four
micro-batches of 8.

>>> ParallelTensorShape.of((64, 784), degrees=(2, 1), sum_degree=2)
f32[64/2, 784] r2(partial)
>>> ParallelTensorShape.parse("f32[64/2, 784] r2(partial)").num_shards
4
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from pcgopt.errors import DegreeError, ShapeError


class DType(enum.Enum):
    """Element types. The value is the short name used in reprs and JSON."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    I32 = "i32"
    I64 = "i64"

    def __repr__(self) -> str:
        return self.name

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]

    @property
    def is_integer(self) -> bool:
        return self in (DType.I32, DType.I64)

    @classmethod
    def of(cls, value: DType | str) -> DType:
        """A DType from itself or its short name (``"f32"``); ShapeError lists the valid ones."""
        if isinstance(value, DType):
            return value
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(d.value for d in cls)
            raise ShapeError(f"unknown dtype {value!r}; valid: {valid}") from None


_ITEMSIZE = {
    DType.F16: 2,
    DType.BF16: 2,
    DType.F32: 4,
    DType.F64: 8,
    DType.I32: 4,
    DType.I64: 8,
}


def _check_positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ShapeError(f"{what} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ParallelDim:
    """One data dimension: ``size`` elements split into ``degree`` equal blocks, each processed
    as ``micro`` equal micro-batches one after another (module docstring)."""

    size: int
    degree: int = 1
    micro: int = 1

    def __post_init__(self) -> None:
        _check_positive_int(self.size, "dimension size")
        _check_positive_int(self.degree, "dimension degree")
        if self.size % self.degree:
            raise DegreeError(f"degree {self.degree} does not divide size {self.size}")
        # Shapes are made on every shape rule's path; most have no micro-batches.
        if self.micro == 1 and type(self.micro) is int:
            return
        _check_positive_int(self.micro, "micro-batch count")
        if self.block % self.micro:
            raise DegreeError(
                f"{self.micro} micro-batches do not divide a block of {self.block} (size "
                f"{self.size} split {self.degree} way{'s' if self.degree > 1 else ''})"
            )

    @property
    def block(self) -> int:
        """Size of one block (the per-shard extent)."""
        return self.size // self.degree

    def __repr__(self) -> str:
        args = [str(self.size)]
        if self.degree > 1 or self.micro > 1:
            args.append(str(self.degree))
        if self.micro > 1:
            args.append(f"micro={self.micro}")
        return f"ParallelDim({', '.join(args)})"

    def __str__(self) -> str:
        text = str(self.size) if self.degree == 1 else f"{self.size}/{self.degree}"
        return text if self.micro == 1 else f"{text}~{self.micro}"


@dataclass(frozen=True, slots=True)
class ParallelTensorShape:
    """Shape of a parallel tensor. Immutable and hashable; ``repr`` is the compact notation
    ``f32[64/2, 784] r2 r4(partial)`` that :meth:`parse` reads back."""

    dims: tuple[ParallelDim, ...]
    dtype: DType = DType.F32
    copy_degree: int = 1
    sum_degree: int = 1

    def __post_init__(self) -> None:
        dims = tuple(self.dims)
        for i, d in enumerate(dims):
            if not isinstance(d, ParallelDim):
                raise ShapeError(f"dims[{i}] must be a ParallelDim, got {d!r}")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "dtype", DType.of(self.dtype))
        _check_positive_int(self.copy_degree, "copy degree")
        _check_positive_int(self.sum_degree, "partial-sum degree")

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def of(
        cls,
        sizes: Iterable[int],
        dtype: DType | str = DType.F32,
        *,
        degrees: Iterable[int] | None = None,
        copy_degree: int = 1,
        sum_degree: int = 1,
        micro: Iterable[int] | None = None,
    ) -> ParallelTensorShape:
        """Builds a shape from plain sizes (and optionally per-dimension degrees and micro-batch
        counts)."""
        sizes = tuple(sizes)
        degrees = tuple(degrees) if degrees is not None else (1,) * len(sizes)
        micro = tuple(micro) if micro is not None else (1,) * len(sizes)
        if len(degrees) != len(sizes) or len(micro) != len(sizes):
            what, values = (
                ("degrees", degrees)
                if len(degrees) != len(sizes)
                else ("micro-batch counts", micro)
            )
            raise ShapeError(f"{len(values)} {what} given for {len(sizes)} dimensions")
        dims = []
        for i, (s, d, m) in enumerate(zip(sizes, degrees, micro, strict=True)):
            try:
                dims.append(ParallelDim(s, d, m))
            except ShapeError as e:
                raise type(e)(f"dimension {i}: {e.message}") from None
        return cls(tuple(dims), DType.of(dtype), copy_degree, sum_degree)

    @classmethod
    def parse(cls, text: str) -> ParallelTensorShape:
        """Reads the repr notation back: ``"f32[64/2, 784] r2 r4(partial)"`` (``64/2~4``: four
        micro-batches per block)."""
        m = _SHAPE_RE.fullmatch(text.strip())
        if not m:
            raise ShapeError(
                f"cannot parse parallel shape {text!r}; expected e.g. 'f32[64/2, 784] r2(partial)'"
            )
        dims = []
        body = m.group("dims").strip()
        for part in body.split(",") if body else []:
            split, _, micro = part.strip().partition("~")
            size, _, degree = split.partition("/")
            dims.append(ParallelDim(int(size), int(degree) if degree else 1, int(micro or 1)))
        copies, partial = 1, 1
        for rep in re.finditer(r"r(\d+)(\(partial\))?", m.group("reps") or ""):
            if rep.group(2):
                partial *= int(rep.group(1))
            else:
                copies *= int(rep.group(1))
        return cls(tuple(dims), DType.of(m.group("dtype")), copies, partial)

    # -- derived quantities -------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The logical (global) shape."""
        return tuple(d.size for d in self.dims)

    @property
    def degrees(self) -> tuple[int, ...]:
        return tuple(d.degree for d in self.dims)

    @property
    def micro(self) -> tuple[int, ...]:
        """Micro-batches per block of every dimension (1: none)."""
        return tuple(d.micro for d in self.dims)

    @property
    def micro_batches(self) -> int:
        """How many micro-batches a block is processed in (the product over dimensions)."""
        return math.prod(d.micro for d in self.dims)

    @property
    def block_sizes(self) -> tuple[int, ...]:
        """Shape of one shard."""
        return tuple(d.block for d in self.dims)

    @property
    def replica_degree(self) -> int:
        """All replicas: copies times partial sums."""
        return self.copy_degree * self.sum_degree

    @property
    def is_partial(self) -> bool:
        return self.sum_degree > 1

    @property
    def is_unpartitioned(self) -> bool:
        """One shard: no split dimension, no replicas."""
        return self.num_shards == 1

    @property
    def num_shards(self) -> int:
        """Number of shards, i.e. devices the tensor spans."""
        return self.replica_degree * math.prod(self.degrees)

    @property
    def numel(self) -> int:
        """Elements of the logical tensor."""
        return math.prod(self.sizes)

    @property
    def nbytes(self) -> int:
        """Bytes of the logical tensor."""
        return self.numel * self.dtype.itemsize

    @property
    def shard_numel(self) -> int:
        return math.prod(self.block_sizes)

    @property
    def shard_nbytes(self) -> int:
        return self.shard_numel * self.dtype.itemsize

    # -- updates (each returns a new shape) -----------------------------------------------------

    def with_degree(self, dim: int, degree: int) -> ParallelTensorShape:
        """The shape with dimension ``dim`` split ``degree`` ways (its micro-batches kept)."""
        dim = self.normalize_dim(dim)
        dims = list(self.dims)
        try:
            dims[dim] = ParallelDim(dims[dim].size, degree, dims[dim].micro)
        except ShapeError as e:
            raise type(e)(f"dimension {dim}: {e.message}") from None
        return replace(self, dims=tuple(dims))

    def with_micro(self, dim: int, micro: int) -> ParallelTensorShape:
        """The shape with every block of dimension ``dim`` in ``micro`` micro-batches."""
        dim = self.normalize_dim(dim)
        dims = list(self.dims)
        try:
            dims[dim] = ParallelDim(dims[dim].size, dims[dim].degree, micro)
        except ShapeError as e:
            raise type(e)(f"dimension {dim}: {e.message}") from None
        return replace(self, dims=tuple(dims))

    def with_replicas(self, *, copy_degree: int | None = None, sum_degree: int | None = None):
        return replace(
            self,
            copy_degree=self.copy_degree if copy_degree is None else copy_degree,
            sum_degree=self.sum_degree if sum_degree is None else sum_degree,
        )

    def unpartitioned(self) -> ParallelTensorShape:
        """The same logical tensor on one device."""
        return ParallelTensorShape.of(self.sizes, self.dtype)

    def normalize_dim(self, dim: int) -> int:
        """``dim`` as a non-negative index; negative counts from the end."""
        if not -self.rank <= dim < self.rank:
            raise ShapeError(f"dimension {dim} out of range for rank {self.rank}")
        return dim % self.rank

    # -- text -----------------------------------------------------------------------------------

    def __repr__(self) -> str:
        text = f"{self.dtype.value}[{', '.join(str(d) for d in self.dims)}]"
        if self.copy_degree > 1:
            text += f" r{self.copy_degree}"
        if self.sum_degree > 1:
            text += f" r{self.sum_degree}(partial)"
        return text

    __str__ = __repr__


_SHAPE_RE = re.compile(
    r"(?P<dtype>[a-z0-9]+)\[(?P<dims>[0-9/~,\s]*)\](?P<reps>(\s+r\d+(\(partial\))?)*)"
)


def shape_of(sizes: Sequence[int], dtype: DType | str = DType.F32) -> ParallelTensorShape:
    """Shorthand for an unpartitioned shape."""
    return ParallelTensorShape.of(sizes, dtype)
