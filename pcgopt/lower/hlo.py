"""The collectives in XLA's compiled HLO text, with the bytes each moves.

:func:`compiled_collectives` reads ``jax.jit(f).lower(...).compile().as_text()``: every
``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all`` and ``collective-permute``
(and their ``-start`` forms), with its operand shapes, its replica groups and, from its
metadata, the plan node whose scope it was emitted in and whether it belongs to the forward or
the backward pass. XLA combines collectives of one kind into a tuple (all gradient
all-reduces in one, say); each operand is reported as a collective of its own, marked
``combined``. No JAX is needed: the input is text.

**Bytes** are what every device sends, summed over all devices and groups, for the algorithms the
cost model charges (:func:`pcgopt.extract.costmodel.cost.flat_coefficients`), with ``n`` the bytes
of a device's buffer and ``p`` devices per group::

    all-reduce          2 (p-1) n      per group (ring)
    all-gather            (p-1) n      per group, n the gathered result
    reduce-scatter        (p-1) n      per group, n the input (p results)
    all-to-all            (p-1) n      per group, n the buffer (all of a tuple's operands)
    collective-permute        n        per source-target pair

>>> text = ('%ar = (f32[64,512]{1,0}, f32[]) all-reduce(%a, %b), channel_id=1, '
...     "replica_groups=mesh['d'=2] {'d'}, to_apply=%add, "
...     'metadata={op_name="jit(step)/transpose(jvp())/shard_map/layer1/psum"}')
>>> for c in compiled_collectives(text):
...     print(c.describe())
all-reduce f32[64,512] over d (2 x 1 groups) backward layer1: 262,144 B
all-reduce f32[] over d (2 x 1 groups) backward layer1: 8 B
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["CompiledCollective", "collective_bytes", "compiled_collectives"]

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_ITEMSIZE = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}

_LINE = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>\(.*?\)|[\w]+\[[\d,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<kind>" + "|".join(KINDS) + r")(?P<start>-start)?\("
)
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_LIST_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclass(frozen=True, slots=True)
class CompiledCollective:
    """One collective (or one operand of a combined one) in compiled HLO.

    ``shape``: its result, e.g. ``f32[64,512]``; ``nbytes``: a device's buffer (the result;
    for a reduce-scatter its input, ``group_size`` results); ``axes``: the mesh axes of its
    groups (empty when the groups are listed by device); ``bytes``: sent, summed over all
    devices (module docstring); ``scope``: the named scope it was emitted in (a plan node,
    with ``/`` written ``.``), empty at the ``shard_map`` boundary (a weight's gradient
    synchronization); ``phase``: ``"forward"`` or ``"backward"``; ``combined``: how many
    operands its tuple had."""

    kind: str
    shape: str
    nbytes: int
    group_size: int
    groups: int
    axes: tuple[str, ...]
    scope: str
    phase: str
    combined: int = 1
    #: The groups as listed in the text (mesh positions, row-major); empty when given by
    #: ``axes``.
    members: tuple[tuple[int, ...], ...] = ()

    @property
    def bytes(self) -> int:
        return collective_bytes(self.kind, self.group_size, self.nbytes) * self.groups

    def describe(self) -> str:
        where = ".".join(self.axes) if self.axes else "listed devices"
        at = f" {self.scope}" if self.scope else " (no plan node: a weight gradient's sum)"
        return (
            f"{self.kind} {self.shape} over {where} ({self.group_size} x {self.groups} groups) "
            f"{self.phase}{at}: {self.bytes:,} B"
        )


def collective_bytes(kind: str, p: int, nbytes: int) -> int:
    """Bytes one group of ``p`` devices sends for a buffer of ``nbytes`` per device (module
    docstring); ``collective-permute``: one pair."""
    if kind == "all-reduce":
        return 2 * (p - 1) * nbytes
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return (p - 1) * nbytes
    if kind == "collective-permute":
        return nbytes
    raise ValueError(f"unknown collective {kind!r}; valid: {', '.join(KINDS)}")


def _nbytes(dtype: str, dims: str) -> int:
    size = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
    return size * _ITEMSIZE.get(dtype, 4)


_Groups = tuple[tuple[int, ...], ...]


def _groups(
    line: str, axis_sizes: Mapping[str, int] | None
) -> tuple[int, int, tuple[str, ...], _Groups]:
    """(group size, number of groups, mesh axes, listed groups) of a collective line."""
    m = _MESH_GROUPS.search(line)
    if m:
        sizes = {}
        for part in m.group(1).split(","):
            name, _, size = part.partition("=")
            sizes[name.strip().strip("'")] = int(size)
        axes = tuple(a.strip().strip("'") for a in m.group(2).split(",") if a.strip())
        p = math.prod(sizes[a] for a in axes)
        return p, math.prod(sizes.values()) // p, axes, ()
    m = _IOTA_GROUPS.search(line)
    if m:
        # [groups, size] <= [dims] T(perm): iota over dims, transposed, read in rows.
        count, p = int(m.group(1)), int(m.group(2))
        ids = np.arange(count * p).reshape([int(d) for d in m.group(3).split(",")])
        if m.group(4):
            ids = ids.transpose([int(d) for d in m.group(4).split(",")])
        return p, count, (), tuple(tuple(row) for row in ids.reshape(count, p).tolist())
    m = _LIST_GROUPS.search(line)
    if m and m.group(1):
        listed = tuple(
            tuple(int(d) for d in g.split(",") if d)
            for g in re.findall(r"\{([\d,]*)\}", m.group(1))
        )
        return len(listed[0]), len(listed), (), listed
    m = _PAIRS.search(line)
    if m:
        pairs = tuple((int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group(1)))
        return 2, len(pairs), (), pairs
    total = math.prod(axis_sizes.values()) if axis_sizes else 1
    return total, 1, tuple(axis_sizes or ()), ()


def _scope(op_name: str) -> tuple[str, str]:
    """(named scope inside ``shard_map``, phase) from an HLO op_name."""
    # A combined collective's op_name lists its parts' names, joined by ':'.
    op_name = op_name.split(":")[0]
    phase = "backward" if "transpose(" in op_name else "forward"
    _, found, rest = op_name.partition("shard_map/")
    if not found:
        return "", phase
    parts = rest.split("/")
    scope = "/".join(parts[:-1]) if len(parts) > 1 else ""
    # A scope traced inside jax.vjp is written jvp(scope), its backward transpose(jvp(scope)).
    while scope.endswith(")") and "(" in scope:
        scope = scope[scope.index("(") + 1 : -1]
    return scope, phase


def compiled_collectives(
    text: str, axis_sizes: Mapping[str, int] | None = None
) -> tuple[CompiledCollective, ...]:
    """Every collective in compiled HLO ``text``, one per operand (module docstring).
    ``axis_sizes``: the mesh, for collectives whose groups the text leaves implicit (all
    devices)."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        kind = m.group("kind")
        shapes = _SHAPE.findall(m.group("shape"))
        if m.group("start") and len(shapes) > 1 and kind != "all-reduce":
            # An async start returns (operands, results[, scratch]): the results are the second
            # half for all-gather and the like.
            shapes = shapes[len(shapes) // 2 : len(shapes) // 2 * 2] or shapes
        p, groups, axes, members = _groups(line, axis_sizes)
        op = _OP_NAME.search(line)
        scope, phase = _scope(op.group(1) if op else "")
        if kind == "all-to-all" and len(shapes) > 1:
            # Tuple form: operand i goes to participant i; together they are one buffer.
            total = sum(_nbytes(dtype, dims) for dtype, dims in shapes)
            pieces = ", ".join(f"{dtype}[{dims}]" for dtype, dims in shapes)
            out.append(
                CompiledCollective(
                    kind, f"({pieces})", total, p, groups, axes, scope, phase, 1, members
                )
            )
            continue
        for dtype, dims in shapes:
            nbytes = _nbytes(dtype, dims)
            if kind == "reduce-scatter":
                nbytes *= p  # the input: p results
            out.append(
                CompiledCollective(
                    kind,
                    f"{dtype}[{dims}]",
                    nbytes,
                    p,
                    groups,
                    axes,
                    scope,
                    phase,
                    len(shapes),
                    members,
                )
            )
    return tuple(out)
