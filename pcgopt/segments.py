"""Cutting a PCG into a sequence of segments (Unity section 5.3's graph splitting).

A *cut* is a tensor that every later operator reaches only through it; *segments* are the runs
of operators between cuts. :func:`segment_pcg` makes one segment a PCG of its own (its entry a
new input, its exit returned unsplit and laid out as each of the layouts it may hand on), and
:func:`seed_slice` takes a plan's part in that segment. These are graph functions only:
:func:`pcgopt.egraph.saturate_split` saturates the distinct segments and joins their e-graphs,
and :mod:`pcgopt.extract.search.splitting` extracts them one by one and stitches the plans.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pcgopt.errors import PCGError
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.ops import OpKind, get_op
from pcgopt.shapes import ParallelTensorShape

__all__ = [
    "MIN_SEGMENT_OPS",
    "RepeatedRun",
    "Segment",
    "SegmentProblem",
    "apply_chain",
    "canonical",
    "cut_layouts",
    "cut_tensors",
    "is_parallel",
    "is_source",
    "layout_chain",
    "repeated_run",
    "seed_owners",
    "seed_slice",
    "segment_pcg",
    "segment_problems",
    "split_segments",
    "undo_chain",
]

#: Unity's minimum segment size *k*, in computing operators (sources and parallel operators
#: not counted): about one transformer layer.
MIN_SEGMENT_OPS = 24


def is_source(node: Node) -> bool:
    return get_op(node.op).kind is OpKind.SOURCE


def is_parallel(node: Node) -> bool:
    return get_op(node.op).kind is OpKind.PARALLEL


@dataclass(frozen=True)
class Segment:
    """Consecutive non-source nodes of a PCG (``nodes``, in topological order) that read the
    cut tensor ``entry`` (None for the first segment) and hand on ``exit`` (None for the last,
    which returns the PCG's outputs)."""

    index: int
    nodes: tuple[str, ...]
    entry: TensorRef | None
    exit: TensorRef | None

    def __repr__(self) -> str:
        return (
            f"Segment({self.index}: {len(self.nodes)} nodes, "
            f"{self.entry or 'inputs'} -> {self.exit or 'outputs'})"
        )


def cut_tensors(pcg: PCG) -> list[tuple[int, TensorRef]]:
    """Every cut of ``pcg`` (module docstring) as ``(position, tensor)``: the tensor is the only
    computed one that nodes after ``position`` (in ``pcg.nodes`` order, sources left out) read
    from before it. Only output 0 of a node, of a float type, unsplit and without replicas
    (the input PCG's layout) qualifies."""
    computed = [n for n in pcg.nodes if not is_source(n)]
    position = {n.name: i for i, n in enumerate(computed)}
    last_read: dict[TensorRef, int] = {}
    for i, n in enumerate(computed):
        for ref in n.inputs:
            if ref.node in position:
                last_read[ref] = max(last_read.get(ref, -1), i)
    for ref in pcg.outputs:
        if ref.node in position:
            last_read[ref] = len(computed)  # returned: live to the end
    # Sweep: tensors made at or before i and read after i.
    live: set[TensorRef] = set()
    ending: dict[int, list[TensorRef]] = {}
    for ref, i in last_read.items():
        ending.setdefault(i, []).append(ref)
    out = []
    for i, n in enumerate(computed[:-1]):
        for k in range(len(pcg.output_shapes(n.name))):
            ref = TensorRef(n.name, k)
            if last_read.get(ref, -1) > i:
                live.add(ref)
        for ref in ending.get(i, ()):
            live.discard(ref)
        if len(live) == 1:
            (ref,) = live
            shape = pcg.shape(ref)
            if ref.index == 0 and not shape.dtype.is_integer and shape.num_shards == 1:
                out.append((i, ref))
    return out


def split_segments(pcg: PCG, min_ops: int = MIN_SEGMENT_OPS) -> tuple[Segment, ...]:
    """``pcg``'s non-source nodes cut into segments of at least ``min_ops`` computing
    operators each (the last may have fewer only if it is the only one), at cuts
    (:func:`cut_tensors`). One segment if no cut leaves both sides big enough."""
    if min_ops < 1:
        raise PCGError(f"min_ops must be at least 1, got {min_ops!r}")
    computed = [n for n in pcg.nodes if not is_source(n)]
    counts = [0]
    for n in computed:
        counts.append(counts[-1] + (not is_parallel(n)))
    total = counts[-1]
    chosen: list[tuple[int, TensorRef]] = []
    start = 0
    for i, ref in cut_tensors(pcg):
        made = counts[i + 1] - counts[start]
        if made >= min_ops and total - counts[i + 1] >= min_ops:
            chosen.append((i, ref))
            start = i + 1
    segments = []
    begin = 0
    entry: TensorRef | None = None
    for k, (i, ref) in enumerate(chosen):
        names = tuple(n.name for n in computed[begin : i + 1])
        segments.append(Segment(k, names, entry, ref))
        begin, entry = i + 1, ref
    segments.append(Segment(len(chosen), tuple(n.name for n in computed[begin:]), entry, None))
    return tuple(segments)


@dataclass(frozen=True)
class RepeatedRun:
    """The longest run of consecutive segments of ``pcg`` equal up to names (the layers of a
    transformer): ``segments[start : start + length]``, all with an entry and an exit;
    ``counterparts``: each node of the run (its sources included) to the node in the same
    place of the run's first segment."""

    pcg: PCG
    segments: tuple[Segment, ...]
    start: int
    length: int
    counterparts: Mapping[str, str] = field(repr=False, compare=False)

    def __repr__(self) -> str:
        return f"RepeatedRun({self.length} x segment {self.start} of {len(self.segments)})"

    def shortened(self, repeats: int) -> PCG:
        """``pcg`` with only the run's first ``repeats`` segments: what came after the run
        reads the last kept segment's exit (which has the run's exit shape, the segments being
        equal) instead of the run's. The nodes kept keep their names; sources only the dropped
        segments read are dropped with them."""
        if not 1 <= repeats <= self.length:
            raise PCGError(
                f"repeats must be 1 to {self.length} (the run's length), got {repeats!r}"
            )
        dropped = {
            name
            for seg in self.segments[self.start + repeats : self.start + self.length]
            for name in seg.nodes
        }
        old = self.segments[self.start + self.length - 1].exit
        new = self.segments[self.start + repeats - 1].exit
        assert old is not None and new is not None  # a run's segments have exits
        kept = [n for n in self.pcg.nodes if n.name not in dropped]
        read = {r.node for n in kept if not is_source(n) for r in n.inputs}
        read.update(r.node for r in self.pcg.outputs)
        nodes = [
            replace(n, inputs=tuple(new if r == old else r for r in n.inputs))
            for n in kept
            if not is_source(n) or n.name in read
        ]
        return PCG(nodes, tuple(new if r == old else r for r in self.pcg.outputs))


def repeated_run(pcg: PCG, min_ops: int = MIN_SEGMENT_OPS) -> RepeatedRun | None:
    """The longest run of at least two consecutive segments (:func:`split_segments`) equal up
    to names, or None if no two neighbours are equal. The first and last segments (which read
    the model's inputs and return its outputs) are never part of a run."""
    segments = split_segments(pcg, min_ops)
    forms = [
        canonical(segment_pcg(pcg, seg)) if seg.entry is not None and seg.exit else None
        for seg in segments
    ]
    keys = [None if form is None else form[0] for form in forms]
    best: tuple[int, int] | None = None
    k = 0
    while k < len(keys):
        end = k + 1
        while keys[k] is not None and end < len(keys) and keys[end] == keys[k]:
            end += 1
        if end - k >= 2 and (best is None or end - k > best[1]):
            best = (k, end - k)
        k = end
    if best is None:
        return None
    first = forms[best[0]]
    assert first is not None
    run = range(best[0], best[0] + best[1])
    counterparts = {
        real: first[1][v]
        for k in run
        for v, real in forms[k][1].items()  # type: ignore[index]
        if real != segments[k].entry.node  # type: ignore[union-attr]
    }
    return RepeatedRun(pcg, segments, best[0], best[1], counterparts)


# -- layouts ---------------------------------------------------------------------------------


def layout_chain(layout: ParallelTensorShape) -> tuple[tuple[str, dict[str, int]], ...]:
    """The parallel operators that lay an unsplit tensor out as ``layout``: a Partition per
    split dimension (in dimension order), then a Replicate for its copies."""
    if layout.is_partial:
        raise PCGError(f"a layout across a cut cannot hold partial sums: {layout!r}")
    ops: list[tuple[str, dict[str, int]]] = [
        ("partition", {"dim": d, "degree": k}) for d, k in enumerate(layout.degrees) if k > 1
    ]
    if layout.copy_degree > 1:
        ops.append(("replicate", {"degree": layout.copy_degree}))
    return tuple(ops)


def cut_layouts(
    shape: ParallelTensorShape, degrees: Sequence[int]
) -> tuple[ParallelTensorShape, ...]:
    """The layouts a cut tensor of (unsplit) ``shape`` may be handed on in, other than unsplit:
    its first dimension (the batch, in the zoo's models) split by each of ``degrees`` that
    divides it, and copies by each of ``degrees``, alone or together, within the largest of
    ``degrees`` (the device count). Data parallelism hands a split batch on, tensor
    parallelism copies (Megatron's activations between its blocks), both together a mix."""
    if not shape.is_unpartitioned:
        raise PCGError(f"a cut tensor is unsplit and without replicas, got {shape!r}")
    legal = sorted({d for d in degrees if d > 1})
    if not legal or shape.rank == 0:
        return ()
    devices = legal[-1]
    out = []
    for split in (1, *legal):
        if shape.sizes[0] % split:
            continue
        for copies in (1, *legal):
            if split * copies == 1 or split * copies > devices:
                continue
            layout = shape.with_degree(0, split) if split > 1 else shape
            out.append(layout.with_replicas(copy_degree=copies) if copies > 1 else layout)
    return tuple(out)


def undo_chain(layout: ParallelTensorShape) -> tuple[tuple[str, dict[str, int]], ...]:
    """The inverse of :func:`layout_chain`: ``discard_copies``, then the Combines, last
    dimension first."""
    ops: list[tuple[str, dict[str, int]]] = []
    if layout.copy_degree > 1:
        ops.append(("discard_copies", {"degree": layout.copy_degree}))
    ops += [
        ("combine", {"dim": d, "degree": k})
        for d, k in reversed(list(enumerate(layout.degrees)))
        if k > 1
    ]
    return tuple(ops)


def apply_chain(
    chain: Sequence[tuple[str, dict[str, int]]], ref: TensorRef, prefix: str, made: list[Node]
) -> TensorRef:
    for j, (op, params) in enumerate(chain):
        node = Node(f"{prefix}.{j}", op, (ref,), params)
        made.append(node)
        ref = node.output()
    return ref


# -- a segment as a PCG of its own -------------------------------------------------------------


def segment_pcg(pcg: PCG, segment: Segment, exits: Sequence[ParallelTensorShape] = ()) -> PCG:
    """``segment`` as a PCG: its entry tensor becomes an input of the same name, and it returns
    its exit tensor unsplit and then laid out as each of ``exits`` (the last segment returns
    the PCG's outputs). Every source it reads comes along."""
    inside = set(segment.nodes)
    made: list[Node] = []
    sources: dict[str, Node] = {}
    for name in segment.nodes:
        node = pcg.node(name)
        for ref in node.inputs:
            if ref.node not in inside and ref != segment.entry:
                src = pcg.node(ref.node)
                if not is_source(src):
                    raise PCGError(
                        f"segment {segment.index} reads {ref}, made outside it and not its entry"
                    )
                sources[src.name] = src
        made.append(node)
    shapes = {n.name: pcg.output_shapes(n.name) for n in (*sources.values(), *made)}
    entry_as_read = True
    if segment.entry is not None:
        shape = pcg.shape(segment.entry)
        # Validated alone, in canonical form; the rest is the model's, already validated.
        alone = PCG(
            [Node(segment.entry.node, "input", (), {"shape": shape.sizes, "dtype": shape.dtype})]
        )
        (entry,) = alone.nodes
        made.insert(0, entry)
        shapes[entry.name] = alone.output_shapes(entry.name)
        entry_as_read = segment.entry.index == 0 and shape == shapes[entry.name][0]
    nodes = [*sources.values(), *made]
    if entry_as_read and not exits:
        # Every node's shape is the model's: no shape rule needs to run again (BERT-Large's
        # pipeline search builds a stage's part 78 times: 2.6 s of validation).
        return PCG._checked(
            tuple(nodes), shapes, pcg.outputs if segment.exit is None else (segment.exit,)
        )
    if segment.exit is None:
        return PCG(nodes, pcg.outputs)
    outputs = [segment.exit]
    for k, layout in enumerate(exits):
        outputs.append(
            apply_chain(layout_chain(layout), segment.exit, f"{segment.exit.node}@{k}", nodes)
        )
    return PCG(nodes, outputs)


def _source_layouts(seed: PCG) -> set[str]:
    """Nodes of ``seed`` that only lay sources out (parallel operators over sources)."""
    out: set[str] = set()
    for n in seed.nodes:
        if is_source(n) or (is_parallel(n) and all(r.node in out for r in n.inputs)):
            out.add(n.name)
    return out


def seed_owners(seed: PCG, segments: Sequence[Segment]) -> dict[str, int]:
    """The segment each node of ``seed`` belongs to: a node of the model its segment; another
    node (a parallel operator the seed added) the first segment that reads it; nodes that only
    lay sources out belong to none (every segment that reads them takes a copy)."""
    home = {name: s.index for s in segments for name in s.nodes}
    shared = _source_layouts(seed)
    readers: dict[str, list[str]] = {}
    for n in seed.nodes:
        for r in n.inputs:
            readers.setdefault(r.node, []).append(n.name)
    owner: dict[str, int] = {}
    last = segments[-1].index
    for n in reversed(seed.nodes):
        if n.name in shared:
            continue
        if n.name in home:
            owner[n.name] = home[n.name]
        else:
            owner[n.name] = min(
                (owner[r] for r in readers.get(n.name, ()) if r in owner), default=last
            )
    return owner


def seed_slice(
    seed: PCG,
    pcg: PCG,
    segment: Segment,
    owners: Mapping[str, int],
    exits: Sequence[ParallelTensorShape] = (),
) -> PCG | None:
    """The part of ``seed`` in ``segment``, as a PCG with the same inputs and output shapes as
    :func:`segment_pcg` (so it can seed that segment's e-graph), or None where the seed does not
    cut there: it lacks the cut tensors, holds partial sums across a cut, or a node of the
    segment reads something the seed made in another segment."""
    shared = _source_layouts(seed)
    mine = [n for n in seed.nodes if owners.get(n.name) == segment.index]
    made: list[Node] = []
    copied: set[str] = set()
    rename: dict[TensorRef, TensorRef] = {}
    if segment.entry is not None:
        if segment.entry.node not in seed:
            return None
        layout = seed.shape(segment.entry)
        if layout.is_partial:
            return None
        shape = pcg.shape(segment.entry)
        made.append(
            Node(segment.entry.node, "input", (), {"shape": shape.sizes, "dtype": shape.dtype})
        )
        copied.add(segment.entry.node)
        rename[segment.entry] = apply_chain(
            layout_chain(layout), segment.entry, f"{segment.entry.node}@seed", made
        )

    def take_shared(name: str) -> None:
        stack = [name]
        order: list[Node] = []
        while stack:
            n = seed.node(stack.pop())
            if n.name in copied:
                continue
            copied.add(n.name)
            order.append(n)
            stack.extend(r.node for r in n.inputs)
        made[:0] = reversed(order)

    body: list[Node] = []
    for n in mine:
        inputs = []
        for r in n.inputs:
            if r in rename:
                inputs.append(rename[r])
            elif r.node in shared:
                take_shared(r.node)
                inputs.append(r)
            elif owners.get(r.node) == segment.index:
                inputs.append(r)
            else:
                return None
        body.append(replace(n, inputs=tuple(inputs)))
    nodes = [*made, *body]
    try:
        if segment.exit is None:
            outputs = [rename.get(r, r) for r in seed.outputs]
            if any(owners.get(r.node) != segment.index and r not in rename for r in outputs):
                return None
            return PCG(nodes, outputs)
        if segment.exit.node not in seed or owners.get(segment.exit.node) != segment.index:
            return None
        layout = seed.shape(segment.exit)
        if layout.is_partial:
            return None
        unsplit = apply_chain(undo_chain(layout), segment.exit, f"{segment.exit.node}@back", nodes)
        outputs = [unsplit]
        for k, want in enumerate(exits):
            if want == layout:
                outputs.append(segment.exit)
            else:
                outputs.append(
                    apply_chain(layout_chain(want), unsplit, f"{segment.exit.node}@{k}", nodes)
                )
        return PCG(nodes, outputs)
    except PCGError:
        return None


def canonical(pcg: PCG) -> tuple[PCG, dict[str, str]]:
    """``pcg`` with its nodes named by position (``v0``, ``v1``, ...) and the map back, so that
    segments equal up to names are equal."""
    names = {n.name: f"v{i}" for i, n in enumerate(pcg.nodes)}
    return pcg.renamed(names), {v: k for k, v in names.items()}


@dataclass(frozen=True)
class SegmentProblem:
    """A segment as a search sees it: its PCG and seed slices with canonical names (the cache
    key: segments equal up to names share it), the map back to the model's names, its entry
    input's canonical name (None for the first segment), and the layouts it hands on,
    unsplit first (output ``j`` of its PCG; none for the last segment)."""

    pcg: PCG
    seeds: tuple[PCG, ...]
    back: Mapping[str, str]
    entry: str | None
    handed: tuple[ParallelTensorShape, ...]

    @property
    def key(self) -> tuple[PCG, tuple[PCG, ...]]:
        return (self.pcg, self.seeds)


def segment_problems(
    pcg: PCG,
    segments: Sequence[Segment],
    seeds: Sequence[PCG] = (),
    layouts: Callable[[ParallelTensorShape], Sequence[ParallelTensorShape]] | None = None,
) -> list[SegmentProblem]:
    """Each segment's PCG and seed slices, with canonical names, and the layouts it hands on:
    unsplit, then ``layouts(unsplit)`` (default none), then the seeds' (partial sums never
    cross a cut)."""
    owners = [seed_owners(s, segments) for s in seeds]
    out = []
    for seg in segments:
        exits: dict[ParallelTensorShape, None] = {}
        if seg.exit is not None:
            unsplit = pcg.shape(seg.exit)
            exits.update(dict.fromkeys(layouts(unsplit) if layouts is not None else ()))
            for s in seeds:
                if seg.exit.node in s:
                    layout = s.shape(seg.exit)
                    if not layout.is_partial and layout != unsplit:
                        exits[layout] = None
            exits.pop(unsplit, None)
        own = segment_pcg(pcg, seg, tuple(exits))
        canon, back = canonical(own)
        names = {v: k for k, v in back.items()}
        sliced: dict[PCG, None] = {}
        for k, (s, o) in enumerate(zip(seeds, owners, strict=True)):
            part = seed_slice(s, pcg, seg, o, tuple(exits))
            if part is None:
                continue
            # The slice's nodes named as the segment's where they are the same node, by
            # position elsewhere (so equal layers stay equal).
            fresh = {n.name: names.get(n.name, f"s{k}.{i}") for i, n in enumerate(part.nodes)}
            sliced[part.renamed(fresh)] = None
            back.update(
                (fresh[n.name], n.name) for n in part.nodes if is_source(n) and n.name not in names
            )
        handed = () if seg.exit is None else (pcg.shape(seg.exit), *exits)
        entry = None if seg.entry is None else names[seg.entry.node]
        out.append(SegmentProblem(canon, tuple(sliced), back, entry, handed))
    return out
