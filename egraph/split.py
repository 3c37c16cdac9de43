"""Saturation of a deep model segment by segment, joined back into one e-graph.

One e-graph for a whole deep model grows with the model, and within a budget every layer gets
the few iterations the whole can afford (BERT-Large's 24 layers: 3). Its layers are equal up to
names, so :func:`saturate_split` cuts the model (:func:`pcgopt.segments.split_segments`),
saturates only its *distinct* segments, side by side in one egglog run
(:func:`~pcgopt.egraph.saturate_together`), and joins copies of their e-graphs into the
whole model's (:func:`join_segments`): each copy's sources get the model's names, and its
entry input's e-class is merged with the previous segment's exit. Congruence closure then
merges the e-classes that became equal: a segment's exit laid out for the next one (a batch
split, copies) meets the next segment's layout of its entry, so a plan that keeps its layout
across a cut is represented without a Combine there. The result is an ordinary
:class:`~pcgopt.egraph.Saturation`: :meth:`~pcgopt.egraph.EGraphData.contains` and
extraction see the whole model.

The layouts a cut may be handed on in are, by default, every batch split and copy count the
machine allows (:func:`pcgopt.segments.cut_layouts`), and those of the seeds. A plan whose
tensor at a cut is laid out otherwise, or holds partial sums there, is not represented. Every
merge is sound: the entry of a segment *is* the previous segment's exit, and merged e-classes
must have the same parallel shape (:class:`~pcgopt.egraph.ShapeConflictError` if not).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from pcgopt.egraph.export import EGraphData, ENode
from pcgopt.egraph.saturate import (
    EXPORT_SECONDS_PER_ENODE,
    Budget,
    Saturation,
    ShapeConflictError,
    saturate_together,
)
from pcgopt.egraph.translate import legal_degrees
from pcgopt.graph import PCG, Node
from pcgopt.machine import Machine
from pcgopt.rewrite import Rule
from pcgopt.segments import (
    MIN_SEGMENT_OPS,
    cut_layouts,
    is_source,
    segment_problems,
    split_segments,
)
from pcgopt.shapes import ParallelTensorShape

__all__ = ["join_segments", "saturate_split"]

#: Joining takes about this long per e-node of the joined e-graph on the development machine
#: (BERT-Large on 8 GPUs: 5.5 s for 642,912 e-nodes from 4 segments' 117,214, and 3.6 s for
#: 482,957); saturation leaves room for it in the time budget (and memory as for an export).
JOIN_SECONDS_PER_ENODE = 9e-6


def saturate_split(
    pcg: PCG,
    machine: Machine,
    *,
    rules: Sequence[Rule] | None = None,
    budget: Budget | None = None,
    progress: bool = False,
    seeds: Sequence[PCG] = (),
    min_ops: int = MIN_SEGMENT_OPS,
    layouts: Callable[[ParallelTensorShape], Sequence[ParallelTensorShape]] | None = None,
    degrees: Sequence[int] | None = None,
    presets: Sequence[str] | None = None,
) -> Saturation:
    """:func:`~pcgopt.egraph.saturate` for a deep model: its distinct segments of at least
    ``min_ops`` computing operators are saturated together and their e-graphs joined into the
    whole model's (module docstring). ``layouts(shape)``: the layouts a cut tensor of unsplit
    ``shape`` may be handed on in (default :func:`~pcgopt.segments.cut_layouts` with the
    machine's degrees); the seeds' are added. ``budget``: its back-off match limit and e-node
    budget are per distinct segment; its seconds cover cutting the model and the join too
    (``export_seconds`` includes the join; saturation stops early enough to leave it
    :data:`JOIN_SECONDS_PER_ENODE` per joined e-node). A model that does not split into two
    segments is saturated whole. ``degrees``, ``presets``: as for
    :func:`~pcgopt.egraph.saturate` (the default cut layouts use only ``degrees``)."""
    if not isinstance(pcg, PCG):
        raise TypeError(f"saturate_split needs a PCG, got {type(pcg).__name__}")
    started = time.perf_counter()  # cutting the model into segments is in the time budget
    budget = budget or Budget()
    segments = split_segments(pcg, min_ops)
    if len(segments) < 2:
        return saturate_together(
            [pcg],
            machine,
            rules=rules,
            budget=budget,
            progress=progress,
            seeds=[seeds],
            started=started,
            degrees=degrees,
            presets=presets,
        )[0]
    if layouts is None:
        legal = legal_degrees(machine.num_devices, degrees)

        def layouts(shape: ParallelTensorShape) -> Sequence[ParallelTensorShape]:
            return cut_layouts(shape, legal)

    seeds = [s for s in dict.fromkeys(seeds) if s != pcg]
    problems = segment_problems(pcg, segments, seeds, layouts)
    distinct = list(dict.fromkeys(p.key for p in problems))
    copies = len(problems) / len(distinct)
    budget = budget.for_problems(len(distinct), len(legal_degrees(machine.num_devices, degrees)))
    sats = saturate_together(
        [key[0] for key in distinct],
        machine,
        rules=rules,
        budget=budget,
        progress=progress,
        seeds=[key[1] for key in distinct],
        export_scale=1 + JOIN_SECONDS_PER_ENODE * copies / EXPORT_SECONDS_PER_ENODE,
        started=started,
        degrees=degrees,
        presets=presets,
    )
    t0 = time.perf_counter()
    by_key = {key: sat.egraph for key, sat in zip(distinct, sats, strict=True)}
    joined = join_segments(
        [(by_key[p.key], p.back, p.entry) for p in problems],
        sources=[(n, pcg.output_shapes(n.name)[0]) for n in pcg.nodes if is_source(n)],
    )
    first = sats[0]
    return replace(
        first,
        num_eclasses=joined.num_eclasses,
        num_enodes=joined.num_enodes,
        export_seconds=first.export_seconds + time.perf_counter() - t0,
        egraph=joined,
    )


#: A segment's e-graph, the map from its source names to the model's, and its entry input.
Part = tuple[EGraphData, Mapping[str, str], str | None]


def join_segments(
    parts: Sequence[Part],
    *,
    sources: Sequence[tuple[Node, ParallelTensorShape]] = (),
) -> EGraphData:
    """One e-graph from the e-graphs of consecutive segments. ``parts[k]``: segment ``k``'s
    e-graph (its roots: the exit unsplit first, then its layouts; the last segment's roots are
    the model's outputs), the map from its source names to the model's, and its entry input's
    name (None for the first). Segment ``k``'s entry e-class is merged with segment ``k-1``'s
    first root, sources of equal names are merged, and congruence closure merges what became
    equal. ``sources``: the model's source nodes with their shapes; those no segment reads are
    added (:meth:`EGraphData.to_pcg` keeps every source of the model).

    Copies of one segment's e-graph share its tables: only e-classes a merge touches are
    visited by the closure, and each e-node once when the result is written."""
    join = _Join(parts)
    join.close(join.initial_merges())
    return join.result(sources)


class _Join:
    """The state of :func:`join_segments`: every part's e-classes and e-nodes numbered
    globally (part ``k``'s from ``class_off[k]``/``node_off[k]``), a union-find over the
    e-classes, and the users of each merged e-class."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts = parts
        self.class_off: list[int] = []
        self.node_off: list[int] = []
        # Per distinct e-graph: e-class -> the e-nodes that use it.
        self.users_of: dict[int, list[list[int]]] = {}
        total_classes = total_nodes = 0
        for data, _, _ in parts:
            self.class_off.append(total_classes)
            self.node_off.append(total_nodes)
            total_classes += data.num_eclasses
            total_nodes += data.num_enodes
            if id(data) not in self.users_of:
                users: list[list[int]] = [[] for _ in data.classes]
                for i, n in enumerate(data.nodes):
                    for c in n.children:
                        users[c].append(i)
                self.users_of[id(data)] = users
        self.total_classes = total_classes
        self.parent = list(range(total_classes))
        self.first_source: dict[str, int] = {}
        self.skip: set[int] = set()  # global ids of the entry inputs' e-nodes
        # Users (global e-node ids) of the e-classes merged so far, by their root.
        self.merged_users: dict[int, list[int]] = {}
        self.touched: set[int] = set()

    def initial_merges(self) -> list[tuple[int, int]]:
        """Each entry input's e-class with the previous part's first root, and each source
        with the first of its (model) name."""
        pending: list[tuple[int, int]] = []
        parts, class_off, node_off = self.parts, self.class_off, self.node_off
        for k, (data, back, entry) in enumerate(parts):
            if k and entry is None:
                raise ValueError(f"segment {k} has no entry input to join to segment {k - 1}")
            off = class_off[k]
            for c, members in enumerate(data.classes):
                for i in members:
                    name = data.nodes[i].name
                    if name is None:
                        continue
                    if name == entry:
                        before = parts[k - 1][0]
                        pending.append((class_off[k - 1] + before.roots[0], off + c))
                        self.skip.add(node_off[k] + i)
                        continue
                    real = back.get(name, name)
                    if self.first_source.setdefault(real, off + c) != off + c:
                        pending.append((self.first_source[real], off + c))
        return pending

    def find(self, c: int) -> int:
        parent = self.parent
        root = c
        while parent[root] != root:
            root = parent[root]
        while parent[c] != root:
            parent[c], c = root, parent[c]
        return root

    def _shape_of(self, c: int) -> ParallelTensorShape | None:
        k = bisect_right(self.class_off, c) - 1
        return self.parts[k][0].shapes[c - self.class_off[k]]

    def _users(self, root: int) -> list[int]:
        found = self.merged_users.get(root)
        if found is None:
            k = bisect_right(self.class_off, root) - 1
            local = root - self.class_off[k]
            found = [self.node_off[k] + i for i in self.users_of[id(self.parts[k][0])][local]]
        return found

    def _key_and_owner(self, g: int) -> tuple[tuple, int]:
        """E-node ``g``'s hash-cons key (children by their root, sources by model name) and
        its e-class."""
        k = bisect_right(self.node_off, g) - 1
        data, back = self.parts[k][0], self.parts[k][1]
        n = data.nodes[g - self.node_off[k]]
        off = self.class_off[k]
        name = None if n.name is None else back.get(n.name, n.name)
        return (n.op, n.params, tuple(self.find(off + c) for c in n.children), name), off + n.eclass

    def close(self, pending: list[tuple[int, int]]) -> None:
        """Merge the ``pending`` pairs and, by congruence, every pair that became equal."""
        find = self.find
        while pending:
            a, b = pending.pop()
            ra, rb = find(a), find(b)
            if ra == rb:
                continue
            sa, sb = self._shape_of(ra), self._shape_of(rb)
            if sa != sb:
                raise ShapeConflictError(
                    f"joining the segments merges e-classes of different shapes ({sa!r} and "
                    f"{sb!r}): a segment's entry is not its predecessor's exit"
                )
            both = self._users(ra) + self._users(rb)
            self.parent[rb] = ra
            self.touched.update((ra, rb))
            self.merged_users.pop(rb, None)
            self.merged_users[ra] = both
            # Congruence: two e-nodes that now have the same key put their e-classes
            # together. Only users of the merged classes can have changed key.
            seen: dict[tuple, int] = {}
            for g in both:
                if g in self.skip:
                    continue
                key, cls = self._key_and_owner(g)
                other = seen.setdefault(key, cls)
                if other != cls and find(other) != find(cls):
                    pending.append((other, cls))

    def result(self, sources: Sequence[tuple[Node, ParallelTensorShape]]) -> EGraphData:
        """The joined e-graph: dense ids for the surviving e-classes; e-nodes that merging
        made equal (users of touched e-classes, sources of one name) kept once; the model's
        ``sources`` no part reads added."""
        parts, class_off, find = self.parts, self.class_off, self.find
        dense = [-1] * self.total_classes
        classes: list[list[int]] = []
        out_shapes: list[ParallelTensorShape | None] = []
        for k, (data, _, _) in enumerate(parts):
            off = class_off[k]
            for c in range(data.num_eclasses):
                r = find(off + c)
                if dense[r] < 0:
                    dense[r] = len(classes)
                    classes.append([])
                    out_shapes.append(data.shapes[c] if r == off + c else self._shape_of(r))
                dense[off + c] = dense[r]
        touched_dense = {dense[c] for c in self.touched}
        nodes: list[ENode] = []
        kept: set[tuple] = set()
        for k, (data, back, _) in enumerate(parts):
            off, first = class_off[k], self.node_off[k]
            view = dense[off : off + data.num_eclasses]
            for i, n in enumerate(data.nodes):
                if first + i in self.skip:
                    continue
                kids = tuple([view[c] for c in n.children])
                cls = view[n.eclass]
                name = n.name
                if name is not None:
                    name = back.get(name, name)
                if (
                    name is not None
                    or cls in touched_dense
                    or any(c in touched_dense for c in kids)
                ):
                    marker = (n.op, n.params, kids, name)
                    if marker in kept:
                        continue
                    kept.add(marker)
                classes[cls].append(len(nodes))
                nodes.append(ENode(n.op, n.params, kids, cls, name))
        for node, shape in sources:
            if node.name in self.first_source:
                continue
            self.first_source[node.name] = -1
            classes.append([len(nodes)])
            out_shapes.append(shape)
            nodes.append(ENode(node.op, node.params, (), len(classes) - 1, node.name))
        roots = tuple(dense[class_off[-1] + r] for r in parts[-1][0].roots)
        return EGraphData(nodes, classes, out_shapes, roots)
