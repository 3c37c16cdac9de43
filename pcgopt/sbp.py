"""The Split / Broadcast / Partial-sum (SBP) view of parallel tensors (OneFlow's abstraction, as
AutoDDL uses it, section 4).

An SBP signature lists the axes of a device mesh, each with the state a tensor has along it and
the axis size: ``(S0:4, B:2, S1:8)`` is a tensor split 4 ways along dimension 0 over the first
mesh axis, copied (broadcast) over the second, split 8 ways along dimension 1 over the third,
on 64 devices. ``P`` marks partial sums (the tensor is the sum over that axis). A
:class:`~pcgopt.shapes.ParallelTensorShape` says the same without the order of the mesh axes:
per-dimension degrees, copies and partial sums. :func:`sbp_of` reads a shape as a signature
(splits in dimension order, then B, then P) and :meth:`SBP.shape` builds the shape back.

For machines with several GPUs per node (AutoDDL section 4.2) a degree can be a tuple, one
factor per hierarchy level: ``(S0:(1, 2), B:(2, 2))`` on 2 nodes of 4 GPUs splits dimension 0
in two inside each node and copies across nodes and the other GPU pair. The tuples are the rows
of a P^2 parallelism matrix (:class:`pcgopt.extract.strategies.placement.ParallelismMatrix` with
``axes=sbp.axes`` and ``rows=sbp.rows``).

>>> from pcgopt.shapes import ParallelTensorShape
>>> s = sbp_of(ParallelTensorShape.of((1024, 8192), degrees=(4, 8), copy_degree=2))
>>> s
SBP(S0:4, S1:8, B:2)
>>> s.shape((1024, 8192))
f32[1024/4, 8192/8] r2
>>> SBP.parse("(S0:(1, 2), B:(2, 2))").rows
((1, 2), (2, 2))
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pcgopt.errors import ShapeError
from pcgopt.shapes import DType, ParallelTensorShape

__all__ = ["SBP", "SBPError", "sbp_of"]


class SBPError(ShapeError):
    """An SBP signature that is malformed or does not fit a tensor."""


_ENTRY = re.compile(r"\s*(S(\d+)|B|P)\s*:\s*(\d+|\(\s*\d+(?:\s*,\s*\d+)*\s*,?\s*\))\s*")


@dataclass(frozen=True, slots=True)
class SBP:
    """One ``(state, degree)`` per mesh axis, ``state`` ``"S<dim>"``, ``"B"`` or ``"P"``, the
    degree an int or a tuple of per-level factors."""

    entries: tuple[tuple[str, int | tuple[int, ...]], ...]

    def __post_init__(self) -> None:
        entries = tuple((str(s), d if isinstance(d, int) else tuple(d)) for s, d in self.entries)
        levels = {len(d) for _, d in entries if isinstance(d, tuple)}
        for i, (state, degree) in enumerate(entries):
            if not (state in ("B", "P") or re.fullmatch(r"S\d+", state)):
                raise SBPError(f"entry {i}: state must be S<dim>, B or P, got {state!r}")
            factors = degree if isinstance(degree, tuple) else (degree,)
            if not factors or any(
                isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in factors
            ):
                raise SBPError(f"entry {i} ({state}): degree must be positive, got {degree!r}")
        if len(levels) > 1 or (levels and any(isinstance(d, int) for _, d in entries)):
            raise SBPError(
                "either every degree is a tuple over the same hierarchy levels or none is; got "
                f"{[d for _, d in entries]}"
            )
        object.__setattr__(self, "entries", entries)

    @classmethod
    def parse(cls, text: str) -> SBP:
        """Reads ``"(S0:4, B:2, S1:8)"`` or ``"(S0:(1, 2), B:(2, 2))"``."""
        body = text.strip()
        if body.startswith("SBP"):
            body = body[3:].strip()
        if not (body.startswith("(") and body.endswith(")")):
            raise SBPError(f"cannot parse SBP {text!r}; expected e.g. '(S0:4, B:2, P:8)'")
        body = body[1:-1]
        entries: list[tuple[str, int | tuple[int, ...]]] = []
        pos = 0
        while pos < len(body):
            m = _ENTRY.match(body, pos)
            if not m:
                raise SBPError(f"cannot parse SBP {text!r} at {body[pos:]!r}")
            degree = m.group(3)
            value: int | tuple[int, ...] = (
                tuple(int(v) for v in degree.strip("() ").split(",") if v.strip())
                if degree.startswith("(")
                else int(degree)
            )
            entries.append((m.group(1), value))
            pos = m.end()
            if pos < len(body):
                if body[pos] != ",":
                    raise SBPError(f"cannot parse SBP {text!r}: expected ',' at {body[pos:]!r}")
                pos += 1
        return cls(tuple(entries))

    def __repr__(self) -> str:
        def fmt(d: int | tuple[int, ...]) -> str:
            return str(d) if isinstance(d, int) else f"({', '.join(map(str, d))})"

        return f"SBP({', '.join(f'{s}:{fmt(d)}' for s, d in self.entries)})"

    def __str__(self) -> str:
        """AutoDDL's notation, ``(S0:4, B:2)``."""
        return repr(self)[3:]

    @property
    def axes(self) -> tuple[int, ...]:
        """The size of every mesh axis."""
        return tuple(d if isinstance(d, int) else math.prod(d) for _, d in self.entries)

    @property
    def rows(self) -> tuple[tuple[int, ...], ...]:
        """Per mesh axis, its factor at every hierarchy level (a parallelism matrix); plain
        degrees count as one level."""
        return tuple(d if isinstance(d, tuple) else (d,) for _, d in self.entries)

    @property
    def num_devices(self) -> int:
        return math.prod(self.axes)

    def shape(self, sizes: Sequence[int], dtype: DType | str = DType.F32) -> ParallelTensorShape:
        """The parallel shape of a tensor of logical ``sizes`` with this signature."""
        degrees = [1] * len(sizes)
        copies = partial = 1
        for (state, _), degree in zip(self.entries, self.axes, strict=True):
            if state == "B":
                copies *= degree
            elif state == "P":
                partial *= degree
            else:
                dim = int(state[1:])
                if dim >= len(sizes):
                    raise SBPError(
                        f"{state} splits dimension {dim}, but the tensor has {len(sizes)}"
                    )
                degrees[dim] *= degree
        try:
            return ParallelTensorShape.of(
                sizes, dtype, degrees=degrees, copy_degree=copies, sum_degree=partial
            )
        except ShapeError as e:
            raise SBPError(f"{self!r} does not fit sizes {list(sizes)}: {e.message}") from None

    def placed(self, rows: Iterable[Sequence[int]]) -> SBP:
        """The same signature with tuple degrees: ``rows[i]`` (a parallelism matrix row, one
        factor per hierarchy level) must multiply to axis ``i``."""
        rows_t = tuple(tuple(r) for r in rows)
        if len(rows_t) != len(self.entries):
            raise SBPError(f"{len(rows_t)} rows for the {len(self.entries)} axes of {self!r}")
        for (state, _), row, size in zip(self.entries, rows_t, self.axes, strict=True):
            if math.prod(row) != size:
                raise SBPError(
                    f"row {list(row)} multiplies to {math.prod(row)}, not {state}'s {size}"
                )
        return SBP(tuple((s, r) for (s, _), r in zip(self.entries, rows_t, strict=True)))


def sbp_of(shape: ParallelTensorShape) -> SBP:
    """A shape as an SBP signature: one split axis per split dimension in dimension order, then
    the copies (B) and the partial sums (P); an unpartitioned tensor is ``SBP(B:1)``."""
    entries: list[tuple[str, int | tuple[int, ...]]] = [
        (f"S{i}", d.degree) for i, d in enumerate(shape.dims) if d.degree > 1
    ]
    if shape.copy_degree > 1:
        entries.append(("B", shape.copy_degree))
    if shape.sum_degree > 1:
        entries.append(("P", shape.sum_degree))
    return SBP(tuple(entries) if entries else (("B", 1),))
