"""The collectives a compiled plan runs, beside the ones the cost model charges for it.

The cost model (:func:`pcgopt.extract.costmodel.cost.iteration_cost`) charges every parallel node
its collectives (a Combine a gather forward and a scatter backward, a replicated weight its gradient
all-reduce, ...). An SPMD program runs the same plan with every device holding what it needs, so
some of them take another form there (:func:`spmd_form`):

===============================  ======================================================
cost model                       SPMD program (JAX ``shard_map``, as XLA compiles it)
===============================  ======================================================
all_reduce, all_gather,          the same collective, the same bytes
reduce_scatter, all_to_all
Combine: gather (forward)        all-gather: every device keeps the joined tensor, so
                                 p times the gather's bytes
Combine: scatter (backward)      nothing: every device holds the whole gradient and
                                 slices its block
Reduce: reduce (forward)         all-reduce: every device gets the sum (2x the bytes)
Reduce: broadcast (backward)     nothing: every device holds the sum's gradient
Replicate: broadcast (forward)   nothing: every device holds the tensor already
Replicate: reduce (backward)     all-reduce of the copies' gradients (2x the bytes)
Partition: scatter (forward)     nothing: a local slice
Partition: gather (backward)     all-gather of the blocks' gradients (p times)
weight sync (all_reduce)         all-reduce of the dense gradient (a lookup table's too:
                                 the cost model syncs only the rows lookups touch)
===============================  ======================================================

:func:`compare_collectives` matches each planned collective (in its SPMD form) to one XLA
compiled (same kind, same bytes per device and group size; the same node first), and keeps
what is left on either side: collectives XLA removed or merged, and collectives the plan does
not have (the loss's scalar sum, a gradient summed at a second reader).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pcgopt.extract.costmodel.cost import CostBreakdown, source_layouts
from pcgopt.graph import PCG, Node
from pcgopt.lower.hlo import CompiledCollective, collective_bytes

__all__ = [
    "CollectiveComparison",
    "PlannedCollective",
    "compare_collectives",
    "planned_collectives",
    "spmd_form",
]

#: Cost-model collective kind -> XLA's name for the same collective.
_SAME = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "all_to_all": "all-to-all",
}


#: (operator, cost-model kind) -> (what an SPMD program runs, why it differs), for the
#: collectives that are not the same there (module docstring).
_OTHER_FORMS: dict[tuple[str, str], tuple[str | None, str]] = {
    ("combine", "gather"): ("all-gather", "every device keeps the joined tensor (p x a gather)"),
    ("combine", "scatter"): (None, "every device holds the whole gradient and slices its block"),
    ("reduce", "reduce"): ("all-reduce", "every device gets the sum (2 x a reduce)"),
    ("reduce", "broadcast"): (None, "every device holds the sum's gradient"),
    ("replicate", "broadcast"): (None, "every device holds the tensor already"),
    ("replicate", "reduce"): ("all-reduce", "the copies' gradients are summed on every device"),
    ("partition", "scatter"): (None, "each device slices its block locally"),
    ("partition", "gather"): ("all-gather", "every device gets the whole gradient (p x a gather)"),
}


def spmd_form(op: str, purpose: str, kind: str, p: int, nbytes: int) -> tuple[str | None, int, str]:
    """What an SPMD program runs for one cost-model collective: ``(XLA kind or None, bytes a
    device's buffer holds, why it differs)`` (module docstring). ``nbytes``: the cost model's
    per-device message."""
    if kind in _SAME:
        return _SAME[kind], nbytes, "weight gradient" if purpose == "weight sync" else ""
    spmd_kind, why = _OTHER_FORMS.get((op, kind), (None, f"no SPMD form known for {op}'s {kind}"))
    return spmd_kind, nbytes if spmd_kind else 0, why


@dataclass(frozen=True, slots=True)
class PlannedCollective:
    """One collective the cost model charges, and its SPMD form: ``kind`` and ``bytes`` are the
    cost model's (bytes sent, summed over all devices), ``spmd_kind`` and ``spmd_bytes`` what
    the SPMD program runs for it (``spmd_kind`` None: nothing), ``why`` the reason they
    differ."""

    node: str
    op: str
    purpose: str
    kind: str
    degree: int
    groups: int
    nbytes: int
    bytes: float
    spmd_kind: str | None
    spmd_nbytes: int
    spmd_bytes: int
    why: str
    #: Devices per group of the SPMD form (a weight replicated in steps: all its copies).
    spmd_degree: int = 0

    @property
    def same_form(self) -> bool:
        """Whether the SPMD program runs the collective the cost model charges, bytes and all."""
        return (
            self.spmd_kind is not None
            and _SAME.get(self.kind) == self.spmd_kind
            and (round(self.bytes) == self.spmd_bytes)
        )

    def describe(self) -> str:
        spmd = f"{self.spmd_kind} {self.spmd_bytes:,} B" if self.spmd_kind else "nothing"
        why = f" ({self.why})" if self.why else ""
        return (
            f"{self.node} ({self.op}) {self.purpose}: {self.kind} of {self.degree} x "
            f"{self.groups} groups, {round(self.bytes):,} B -> SPMD {spmd}{why}"
        )


def planned_collectives(
    pcg: PCG,
    cost: CostBreakdown,
    devices: int | None = None,
    split_copies: Iterable[str] = (),
) -> tuple[PlannedCollective, ...]:
    """Every collective of ``cost`` (the cost model's, for ``pcg``) with its SPMD form, in the
    PCG's order. ``devices``: the SPMD program's mesh size; a collective of a tensor that the
    plan keeps on fewer devices runs on all of them there, in more groups. ``split_copies``:
    the Partitions whose input the program holds as copies (typed varying along the new
    axes): each copy takes its block's gradient, and nothing is gathered."""
    split_copies = frozenset(split_copies)
    _, stored = source_layouts(pcg)
    # A weight replicated in steps (2, then 4 ways) is synced once per step by the cost model,
    # and once over all its copies in SPMD: per stored layout, the steps' degrees.
    steps: dict[str, list[str]] = {}
    for node in pcg.nodes:
        nc = cost.per_node.get(node.name)
        synced = iter(stored.get(node.name, ()))
        for c in nc.collectives if nc is not None else ():
            if c.purpose == "weight sync":
                layout = next(synced, None)
                if layout is not None and c.degree > 1:
                    steps.setdefault(layout, []).append(node.name)
    # A tensor replicated in steps (Replicate after Replicate) likewise: the cost model sums its
    # copies' gradients once per step, SPMD once, at the last step, over all of them.
    readers: dict[str, list[str]] = {}
    for node in pcg.nodes:
        for r in node.inputs:
            readers.setdefault(r.node, []).append(node.name)
    source_of, _ = source_layouts(pcg)

    def chained(node: Node) -> bool:
        return node.op == "replicate" and node.name not in source_of

    last_of: dict[str, str] = {}  # every Replicate of a chain -> the chain's last
    product_of: dict[str, int] = {}  # the chain's last -> the product of the chain's degrees
    for node in pcg.nodes:
        if not chained(node) or chained(pcg.node(node.inputs[0].node)):
            continue
        chain, current = [node.name], node.name
        while True:
            nxt = readers.get(current, [])
            if len(nxt) != 1 or not chained(pcg.node(nxt[0])):
                break
            current = nxt[0]
            chain.append(current)
        if len(chain) > 1:
            for name in chain:
                last_of[name] = chain[-1]
            product_of[chain[-1]] = math.prod(pcg.node(n).params["degree"] for n in chain)
    out = []
    for node in pcg.nodes:
        nc = cost.per_node.get(node.name)
        if nc is None:
            continue
        synced = iter(stored.get(node.name, ()))
        for c in nc.collectives:
            layout = next(synced, None) if c.purpose == "weight sync" else None
            if c.degree <= 1 or c.algorithm == "none":
                continue
            nbytes = round(c.nbytes)
            spmd_kind, spmd_nbytes, why = spmd_form(node.op, c.purpose, c.kind, c.degree, nbytes)
            degree = c.degree
            if node.name in split_copies and c.purpose == "backward":
                spmd_kind = None
                why = "it splits copies: each takes its block's gradient, summed where made"
            if layout is not None and pcg.shape(layout).shard_nbytes != spmd_nbytes:
                spmd_nbytes = pcg.shape(layout).shard_nbytes
                why = "the dense gradient (the cost model syncs only the rows lookups touch)"
            if layout is not None and len(steps.get(layout, ())) > 1:
                first = steps[layout][0]
                if node.name != first:
                    spmd_kind, why = None, f"summed with {first}'s: one set of copies in SPMD"
                else:
                    degree = math.prod(pcg.node(n).params["degree"] for n in steps[layout])
                    why = f"all {degree} copies of the weight summed at once"
            if c.purpose == "backward" and node.name in last_of and spmd_kind:
                last = last_of[node.name]
                if node.name != last:
                    spmd_kind, why = None, f"summed with {last}'s: one set of copies in SPMD"
                else:
                    degree = product_of[last]
                    why = f"all {degree} copies' gradients summed at once"
            groups = devices // degree if devices else c.groups * c.degree // degree
            if spmd_kind and groups != c.groups:
                more = f"run by all {devices} devices: {groups} groups, the plan's {c.groups}"
                why = f"{why}; {more}" if why else more
            spmd_bytes = (
                collective_bytes(spmd_kind, degree, spmd_nbytes) * groups if spmd_kind else 0
            )
            # With gradient accumulation, a node's collectives run once per micro-batch (the
            # weights' gradient synchronization once): one entry each.
            repeat = 1 if c.purpose == "weight sync" else cost.micro_batches
            for _ in range(repeat):
                out.append(
                    PlannedCollective(
                        node.name,
                        node.op,
                        c.purpose,
                        c.kind,
                        c.degree,
                        c.groups,
                        nbytes,
                        c.bytes / repeat,
                        spmd_kind,
                        spmd_nbytes,
                        spmd_bytes,
                        why,
                        degree,
                    )
                )
    return tuple(out)


@dataclass(frozen=True)
class CollectiveComparison:
    """Planned collectives against compiled ones (module docstring). ``matched``: pairs;
    ``missing``: planned collectives with an SPMD form that XLA did not run as such (removed
    as dead, merged into another, or run in another form); ``extra``: compiled collectives no
    planned one accounts for; ``free``: planned collectives whose SPMD form moves nothing."""

    matched: tuple[tuple[PlannedCollective, CompiledCollective], ...]
    missing: tuple[PlannedCollective, ...]
    extra: tuple[CompiledCollective, ...]
    free: tuple[PlannedCollective, ...]
    #: Scalar all-reduces no planned collective accounts for: the loss's sum over the devices
    #: (forward) and its gradient's (backward), which the cost model does not charge.
    loss: tuple[CompiledCollective, ...] = ()

    @property
    def planned(self) -> tuple[PlannedCollective, ...]:
        return (*(p for p, _ in self.matched), *self.missing, *self.free)

    @property
    def exact(self) -> tuple[PlannedCollective, ...]:
        """Planned collectives XLA runs in the same kind with the same bytes."""
        return tuple(p for p, c in self.matched if p.same_form and c.bytes == round(p.bytes))

    def bytes_by_kind(self) -> dict[str, tuple[float, int, int]]:
        """Per XLA kind: ``(cost model's bytes of collectives of that SPMD form, bytes of their
        SPMD forms, bytes XLA compiled)``."""
        out: dict[str, list[float]] = {}
        for p in self.planned:
            if p.spmd_kind:
                row = out.setdefault(p.spmd_kind, [0.0, 0, 0])
                row[0] += p.bytes
                row[1] += p.spmd_bytes
        for _, c in self.matched:
            out.setdefault(c.kind, [0.0, 0, 0])[2] += c.bytes
        for c in (*self.extra, *self.loss):
            out.setdefault(c.kind, [0.0, 0, 0])[2] += c.bytes
        return {k: (v[0], int(v[1]), int(v[2])) for k, v in sorted(out.items())}

    def summary(self, *, max_rows: int | None = 12) -> str:
        """A readable table: bytes per kind on both sides, then what differs."""
        lines = [
            f"collectives: {len(self.planned)} planned by the cost model, "
            f"{len(self.matched) + len(self.extra) + len(self.loss)} compiled by XLA; "
            f"{len(self.exact)} the same in kind and bytes, {len(self.matched)} matched"
            + (
                f"; the loss's sum: {len(self.loss)} scalar all-reduce"
                f"{'s' if len(self.loss) > 1 else ''} ({sum(c.bytes for c in self.loss):,} B)"
                if self.loss
                else ""
            ),
            f"  {'kind':<16}{'cost model':>14}{'as SPMD':>14}{'XLA':>14}",
        ]
        for kind, (cost, spmd, xla) in self.bytes_by_kind().items():
            lines.append(f"  {kind:<16}{round(cost):>14,}{spmd:>14,}{xla:>14,}")
        differ = [
            f"{p.describe()}; XLA: {c.groups} group{'s' if c.groups > 1 else ''}, {c.bytes:,} B"
            for p, c in self.matched
            if not p.same_form or c.bytes != round(p.bytes)
        ]
        for title, rows in (
            ("run in another form or by more groups", differ),
            ("moving nothing in SPMD", [p.describe() for p in self.free]),
            ("planned but not compiled", [p.describe() for p in self.missing]),
            ("compiled but not planned", [c.describe() for c in self.extra]),
        ):
            if not rows:
                continue
            lines.append(f"  {title} ({len(rows)}):")
            shown = rows if max_rows is None else rows[:max_rows]
            lines += [f"    {r}" for r in shown]
            if len(shown) < len(rows):
                lines.append(f"    ... {len(rows) - len(shown)} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _scope_node(scope: str, names: dict[str, str]) -> str | None:
    return names.get(scope.split("/")[0]) if scope else None


def compare_collectives(
    planned: Sequence[PlannedCollective],
    compiled: Iterable[CompiledCollective],
    node_names: Iterable[str] = (),
) -> CollectiveComparison:
    """Matches planned collectives (in their SPMD form) to compiled ones: same kind, same
    bytes per device and group size, one to one, a compiled one from the planned one's node
    first (``node_names``: the PCG's node names, to read the scopes)."""
    names = {n.replace("/", "."): n for n in node_names}
    pool = list(compiled)
    used = [False] * len(pool)

    def fits(p: PlannedCollective, c: CompiledCollective) -> bool:
        degree = p.spmd_degree or p.degree
        per_group = collective_bytes(p.spmd_kind, degree, p.spmd_nbytes)
        return (
            c.kind == p.spmd_kind
            and c.group_size == degree
            and collective_bytes(c.kind, c.group_size, c.nbytes) == per_group
        )

    matched, missing, free = [], [], []
    for p in planned:
        if p.spmd_kind is None:
            free.append(p)
            continue
        candidates = [i for i, c in enumerate(pool) if not used[i] and fits(p, c)]
        own = [i for i in candidates if _scope_node(pool[i].scope, names) == p.node]
        pick = (own or candidates or [None])[0]
        if pick is None:
            missing.append(p)
        else:
            used[pick] = True
            matched.append((p, pool[pick]))
    left = [c for c, u in zip(pool, used, strict=True) if not u]
    loss = tuple(c for c in left if c.kind == "all-reduce" and c.shape.endswith("[]"))
    extra = tuple(c for c in left if c not in loss)
    return CollectiveComparison(tuple(matched), tuple(missing), extra, tuple(free), loss)
