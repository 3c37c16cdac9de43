"""Graph splitting (Unity section 5.3): saturate and extract a long model segment by segment.

One e-graph for a whole deep model grows with the model, and so does the time its saturation
needs to reach every layer; within a fixed budget the later layers are explored less. Splitting
cuts the model into a sequence of segments at tensors every later operator reaches only
through (*cuts*), explores each segment on its own (the distinct segments are saturated
side by side in one egglog e-graph, :func:`~pcgopt.egraph.saturate_together`, so that
egglog's fixed cost per run is paid once, but nothing connects them), and stitches one
extraction per segment back together:

* **cuts** (:func:`cut_tensors`): a float tensor ``t`` such that, in the PCG's topological
  order, ``t`` is the only computed tensor made before it and read (or returned) after it.
  Sources (inputs, weights) are not computed: a segment takes every source it reads, so a
  weight two segments read (tied embeddings) is in both;
* **segments** (:func:`split_segments`): consecutive runs of at least ``min_ops`` computing
  operators between cuts (Unity's minimum subgraph size *k*);
* **boundary layouts**: the search must not lose the parallelism that spans a cut (data
  parallelism across the whole model), so, as Unity does, every segment is solved for each
  candidate partitioning of the tensor it hands on: the segment's PCG returns its exit tensor
  unsplit and also Partitioned (and Replicated) into each candidate layout, and extraction is run
  once per layout with that output as the root. The candidates are the unsplit layout and
  the layouts the seeds (the layer-wise plans, the baselines) give the tensor. As in Unity,
  partial sums never cross a cut (Replicate and Reduce are not inverses); copies may, since
  ``discard_copies`` undoes ``replicate``;
* **seeds**: each seed plan is cut at the same tensors (:func:`seed_slice`), so a segment's
  e-graph holds what the seeds do within it (the rules do not parallelize every operator);
* **a cache**: segments equal up to the names of their nodes (the layers of a transformer)
  are saturated and extracted once (Unity's cross-invocation cache);
* **a DP over the cuts** (:func:`split_search`): a segment's extraction reads its entry
  tensor in any layout for free; changing the layout the previous segment handed on into the
  ones it reads costs the Combines (and ``discard_copies``) back to the unsplit tensor,
  priced by the extraction's own cost model. The DP picks one exit layout per cut minimizing
  the segments' extraction costs plus these changes, and the stitched PCG joins the segments
  through those Combines; a Partition that undoes a Combine (and a Replicate that undoes a
  ``discard_copies``) is then removed (:func:`cancel_inverse_pairs`), so a layout kept across
  a cut costs nothing.

The stitched plan is an ordinary candidate of
:func:`~pcgopt.extract.search.plan.saturate_and_extract`: re-costed by
:func:`~pcgopt.extract.costmodel.cost.iteration_cost`, placed, mapped and checked like the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pcgopt.egraph import Budget, saturate_together
from pcgopt.egraph.translate import legal_degrees
from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.cost import Optimizer
from pcgopt.extract.costmodel.simulate import ADDITIVE
from pcgopt.extract.search.extraction import (
    EXTRACTION_SECONDS_PER_ENODE,
    ENodeCosts,
    ExtractionError,
    _local_cost,
    enode_costs,
    extract_greedy,
)
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.machine import Machine
from pcgopt.names import restore_names
from pcgopt.ops import get_op
from pcgopt.rewrite import Rule
from pcgopt.segments import (
    MIN_SEGMENT_OPS,
    Segment,
    SegmentProblem,
    apply_chain,
    cut_tensors,
    is_source,
    layout_chain,
    seed_owners,
    seed_slice,
    segment_pcg,
    segment_problems,
    split_segments,
    undo_chain,
)
from pcgopt.shapes import ParallelTensorShape

__all__ = [
    "MIN_SEGMENT_OPS",
    "Segment",
    "SegmentPlans",
    "SplitSearch",
    "cancel_inverse_pairs",
    "cut_tensors",
    "layout_chain",
    "seed_owners",
    "seed_slice",
    "segment_pcg",
    "segment_plans",
    "split_search",
    "split_segments",
]

# -- stitching ------------------------------------------------------------------------------------

_INVERSES = {("partition", "combine"), ("replicate", "discard_copies")}


def cancel_inverse_pairs(pcg: PCG) -> PCG:
    """``pcg`` with every Partition that reads a Combine of the same dimension and degree (and
    every Replicate that reads a ``discard_copies`` of the same degree) bypassed, and nodes
    nothing reads any more removed (sources stay). Both pairs are identities: a Combine's
    output split again the same way is its input; copies discarded and made again are the
    copies."""
    nodes = {n.name: n for n in pcg.nodes}
    outputs = list(pcg.outputs)
    changed = True
    while changed:
        changed = False
        alias: dict[TensorRef, TensorRef] = {}
        for n in nodes.values():
            if len(n.inputs) != 1:
                continue
            before = nodes.get(n.inputs[0].node)
            if before is not None and (n.op, before.op) in _INVERSES and n.params == before.params:
                alias[n.output()] = before.inputs[0]
        if alias:
            changed = True

            nodes = {
                k: replace(n, inputs=tuple(_resolve(alias, r) for r in n.inputs))
                for k, n in nodes.items()
            }
            outputs = [_resolve(alias, r) for r in outputs]
        read = {r.node for n in nodes.values() for r in n.inputs} | {r.node for r in outputs}
        dead = [k for k, n in nodes.items() if k not in read and not is_source(n)]
        if dead:
            changed = True
            for k in dead:
                del nodes[k]
    return PCG(nodes.values(), outputs)


def _resolve(alias: Mapping[TensorRef, TensorRef], ref: TensorRef) -> TensorRef:
    while ref in alias:
        ref = alias[ref]
    return ref


# -- the search ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Solved:
    """A segment's extraction for one exit layout: the PCG (canonical names), its cost in the
    extraction's model, and the layouts in which it reads its entry tensor."""

    pcg: PCG
    seconds: float
    entry_layouts: frozenset[ParallelTensorShape]


@dataclass
class SplitSearch:
    """What :func:`split_search` did: the stitched ``pcg`` (None if it failed: ``failures``
    says why), the segments, the layouts tried at each cut, and the work: distinct segments
    saturated (segments equal up to names are one; all saturated together, so the
    iterations and stop reason are the shared run's), their e-classes and e-nodes in total,
    extractions run, seconds in saturation and in extraction, and the plan's cost in the
    extraction's model (``predicted_s``)."""

    pcg: PCG | None
    segments: tuple[Segment, ...]
    layouts: tuple[tuple[ParallelTensorShape, ...], ...] = ()
    saturations: int = 0
    num_eclasses: int = 0
    num_enodes: int = 0
    iterations: int = 0
    stop_reasons: dict[str, int] = field(default_factory=dict)
    extractions: int = 0
    saturate_seconds: float = 0.0
    extract_seconds: float = 0.0
    peak_rss_bytes: int = 0
    predicted_s: float = float("nan")
    failures: list[str] = field(default_factory=list)

    @property
    def stop_reason(self) -> str:
        """Why the segments' saturation stopped (one run for all of them)."""
        if len(self.stop_reasons) == 1:
            return next(iter(self.stop_reasons))
        return ", ".join(f"{k} x{v}" for k, v in sorted(self.stop_reasons.items()))

    def __repr__(self) -> str:
        return (
            f"SplitSearch({len(self.segments)} segments, {self.saturations} distinct "
            f"({self.stop_reason}), {self.num_enodes:,} e-nodes, {self.extractions} "
            f"extractions, saturation {self.saturate_seconds:.1f} s, extraction "
            f"{self.extract_seconds:.1f} s"
            + (f", failed: {self.failures[0]}" if self.failures else "")
            + ")"
        )


def _entry_layouts(solved: PCG, entry: str) -> frozenset[ParallelTensorShape]:
    """The layouts in which ``solved`` reads its input ``entry``: where each chain of
    Partitions and Replicates from it ends."""
    readers: dict[str, list[Node]] = {}
    for n in solved.nodes:
        for r in n.inputs:
            readers.setdefault(r.node, []).append(n)
    out: set[ParallelTensorShape] = set()
    stack = [entry]
    while stack:
        name = stack.pop()
        for n in readers.get(name, ()):
            if n.op in ("partition", "replicate"):
                stack.append(n.name)
            else:
                out.add(solved.shape(TensorRef(name)))
    out.update(solved.shape(r) for r in solved.outputs if r.node == entry)
    return frozenset(out)


def _chain_s(
    chain: Sequence[tuple[str, dict[str, int]]], shape: ParallelTensorShape, machine: Machine
) -> float:
    """What the parallel operators ``chain`` cost from ``shape`` on, forward and backward, in
    the extraction's model."""
    seconds = 0.0
    for op, raw in chain:
        spec = get_op(op)
        params = spec.make_params(raw, (shape,))
        after = spec.infer(params, (shape,))[0]
        seconds += _local_cost(op, params, (shape,), (after,), (True,), machine)[0]
        shape = after
    return seconds


def _change_s(
    handed: ParallelTensorShape,
    read: frozenset[ParallelTensorShape],
    machine: Machine,
    memo: dict[ParallelTensorShape, tuple[float, float]],
) -> float:
    """The boundary's cost beyond what the two extractions counted. A segment's extraction
    pays for laying its entry out (the Partitions and Replicates, with their backward); the
    stitched plan joins the layout ``handed`` on back to the unsplit tensor first (the
    Combines), and where a segment reads exactly the layout handed on, both chains cancel: that
    boundary costs nothing, so the layout chain the extraction paid is taken back."""
    if handed.num_shards == 1:
        return 0.0
    if handed not in memo:
        unsplit = handed.unpartitioned()
        memo[handed] = (
            _chain_s(undo_chain(handed), handed, machine),
            _chain_s(layout_chain(handed), unsplit, machine),
        )
    undo, redo = memo[handed]
    return -redo if read == {handed} else undo


def _extract(
    costs: ENodeCosts, roots: tuple[int, ...], time_limit_s: float, entry: str | None
) -> _Solved | str:
    """The greedy extraction of ``costs``' e-graph with ``roots`` as its outputs, or why not."""
    egraph = replace(costs.egraph, roots=roots, _index=None)
    try:
        found = extract_greedy(replace(costs, egraph=egraph), time_limit_s=time_limit_s)
        solved = egraph.to_pcg(found.choice)
    except (ExtractionError, PCGError) as e:
        return str(e)
    layouts = frozenset() if entry is None else _entry_layouts(solved, entry)
    return _Solved(solved, found.cost.objective(costs.memory_capacity), layouts)


def _solve(
    pcg: PCG,
    segments: Sequence[Segment],
    machine: Machine,
    result: SplitSearch,
    *,
    seeds: Sequence[PCG],
    rules: list[Rule] | None,
    extract_until: float,
    memory_budget: int,
    optimizer: str | Optimizer,
    say: Callable[[str], None],
    progress_bar: bool,
    segment_budget: Budget | None,
    degrees: Sequence[int] | None,
    presets: Sequence[str] | None,
    unsplit_only: bool = False,
) -> tuple[list[SegmentProblem], dict[tuple[PCG, tuple[PCG, ...]], list[_Solved | str]]]:
    """Every distinct segment saturated (all in one run) and extracted once per layout it
    hands on (``unsplit_only``: the unsplit exit alone), within the deadlines; the work is
    recorded in ``result``. The segments' problems and each distinct one's extractions."""
    seeds = [s for s in dict.fromkeys(seeds) if s != pcg]
    problems = segment_problems(pcg, segments, seeds)
    distinct = {p.key: p for p in problems}
    say(f"graph splitting: {len(segments)} segments, {len(distinct)} distinct")
    runs = sum(1 if unsplit_only else max(1, len(distinct[k].handed)) for k in distinct)
    solved: dict[tuple[PCG, tuple[PCG, ...]], list[_Solved | str]] = {}
    # One e-graph for all distinct segments: egglog's fixed cost of a run (about a second
    # with the shipped rules, whatever the graph's size) is paid once. The back-off's match
    # limit and the e-node budget count over all of them, so they grow with their number.
    # Saturation's budget runs to the extractions' deadline, leaving each e-node it adds the
    # time to cost and extract it.
    budget = segment_budget or Budget(
        seconds=max(0.05, extract_until - time.perf_counter()),
        memory_bytes=memory_budget,
        speculate=False,  # as in the whole-graph phase (plan.py: _Search.saturation_budget)
        after_seconds_per_enode=EXTRACTION_SECONDS_PER_ENODE,
    )
    budget = budget.for_problems(len(distinct), len(legal_degrees(machine.num_devices, degrees)))
    start = time.perf_counter()
    sats = saturate_together(
        [p.pcg for p in distinct.values()],
        machine,
        rules=rules,
        budget=budget,
        progress=progress_bar,
        seeds=[p.seeds for p in distinct.values()],
        degrees=degrees,
        presets=presets,
    )
    result.saturate_seconds = time.perf_counter() - start
    first = sats[0]  # the shared run's figures are in each
    result.saturations = len(sats)
    result.iterations = first.iterations
    result.stop_reasons = {str(first.stop_reason.value): len(sats)}
    result.peak_rss_bytes = first.peak_rss_bytes
    say(
        f"{len(sats)} segments saturated together: {first.stop_reason.value} after "
        f"{first.iterations} iteration(s), {sum(t.num_enodes for t in sats):,} e-nodes, "
        f"{first.seconds:.2f} s saturation + {first.export_seconds:.2f} s export, peak RSS "
        f"{first.peak_rss_bytes / 2**20:.0f} MiB"
    )
    for k, ((key, problem), sat) in enumerate(zip(distinct.items(), sats, strict=True)):
        result.num_eclasses += sat.num_eclasses
        result.num_enodes += sat.num_enodes
        start = time.perf_counter()
        # Summed, not overlapped: a segment's gradient sync runs beside the backward of the
        # segments before it too, which its own max(B, S) cannot see; with it, a segment whose
        # sync outlasts its backward took extra backward work for free (BERT-Large on one
        # Summit node, deterministic: 411.20 ms against 398.90 ms summed).
        costs = enode_costs(
            sat.egraph,
            machine,
            runtime=ADDITIVE,
            optimizer=optimizer,
            differentiable_inputs=() if problem.entry is None else (problem.entry,),
        )
        roots = sat.egraph.roots
        # One extraction per layout handed on (root j is the exit laid out as handed[j]);
        # the last segment's outputs all at once.
        wanted = [(r,) for r in roots] if problem.handed else [tuple(roots)]
        if unsplit_only:
            wanted = wanted[:1]
        answers: list[_Solved | str] = []
        for picked in wanted:
            left = (extract_until - time.perf_counter()) / max(1, runs - result.extractions)
            answers.append(_extract(costs, picked, max(0.05, left), problem.entry))
            result.extractions += 1
        solved[key] = answers
        result.extract_seconds += time.perf_counter() - start
        say(
            f"segment {k + 1}/{len(distinct)}: {sat.num_eclasses:,} e-classes, "
            f"{sat.num_enodes:,} e-nodes, {len(wanted)} extraction(s)"
        )
    return problems, solved


def split_search(
    pcg: PCG,
    machine: Machine,
    *,
    seeds: Sequence[PCG] = (),
    rules: list[Rule] | None = None,
    min_ops: int = MIN_SEGMENT_OPS,
    saturate_s: float = 30.0,
    extract_s: float = 10.0,
    memory_budget: int = 4 * 2**30,
    optimizer: str | Optimizer = "adam",
    progress: Callable[[str], None] | None = None,
    progress_bar: bool = False,
    segment_budget: Budget | None = None,
    degrees: Sequence[int] | None = None,
    presets: Sequence[str] | None = None,
) -> SplitSearch | None:
    """Saturate and extract ``pcg`` segment by segment and stitch the best combination
    (module docstring). None if it does not split into at least two segments of ``min_ops``
    computing operators. ``seeds``: plans equivalent to ``pcg`` whose slices seed the
    segments' e-graphs and whose layouts at the cuts are tried. ``saturate_s`` (from the
    call: cutting the graph and slicing the seeds count) and ``extract_s`` are the time of the
    distinct segments' saturation together and of their extractions: saturation may run into
    ``extract_s`` as long as its e-graph leaves the time to cost and extract it
    (:data:`~pcgopt.extract.search.extraction.EXTRACTION_SECONDS_PER_ENODE`), and each extraction
    gets what is left divided by the number still to do.
    ``segment_budget``: the saturation's budget instead (benchmarks: an iteration budget
    gives every segment that many iterations); either way its back-off match limit and
    e-node budget are per segment (multiplied by the number of distinct segments, since the
    run counts matches and e-nodes in all of them). ``degrees``, ``presets``: as for
    :func:`~pcgopt.egraph.saturate`. ``progress`` receives a line per phase;
    ``progress_bar``: saturation's bar on stderr too."""
    say = progress or (lambda msg: None)
    # The deadlines run from the call: cutting the graph and slicing the seeds is in the shares.
    saturate_until = time.perf_counter() + saturate_s
    extract_until = saturate_until + extract_s
    segments = split_segments(pcg, min_ops)
    if len(segments) < 2:
        return None
    result = SplitSearch(None, segments)
    problems, solved = _solve(
        pcg,
        segments,
        machine,
        result,
        seeds=seeds,
        rules=rules,
        extract_until=extract_until,
        memory_budget=memory_budget,
        optimizer=optimizer,
        say=say,
        progress_bar=progress_bar,
        segment_budget=segment_budget,
        degrees=degrees,
        presets=presets,
    )
    result.layouts = tuple(p.handed for p in problems)

    # The DP over the layouts handed on, first segment to last: best[k][j] is the cheapest
    # way through segment k handing on layout j, and the layout segment k-1 handed on.
    memo: dict[ParallelTensorShape, tuple[float, float]] = {}
    best: list[dict[int, tuple[float, int]]] = []
    for k, problem in enumerate(problems):
        table: dict[int, tuple[float, int]] = {}
        for j, ans in enumerate(solved[problem.key]):
            if isinstance(ans, str):
                continue
            if k == 0:
                table[j] = (ans.seconds, -1)
                continue
            before = problems[k - 1].handed
            options = [
                (cost + _change_s(before[i], ans.entry_layouts, machine, memo) + ans.seconds, i)
                for i, (cost, _) in best[k - 1].items()
            ]
            if options:
                table[j] = min(options)
        if not table:
            why = next((a for a in solved[problem.key] if isinstance(a, str)), "no extraction")
            result.failures.append(f"segment {k}: {why}")
            return result
        best.append(table)
    picks = [0] * len(problems)
    j = min(best[-1], key=lambda i: best[-1][i][0])
    result.predicted_s = best[-1][j][0]
    for k in range(len(problems) - 1, -1, -1):
        picks[k] = j
        j = best[k][j][1]
    try:
        result.pcg = _stitch(
            pcg, problems, [solved[p.key][j] for p, j in zip(problems, picks, strict=True)], picks
        )  # type: ignore[misc]
    except PCGError as e:
        result.failures.append(f"stitching: {e}")
    return result


@dataclass(frozen=True)
class SegmentPlans:
    """Each segment's plan from the e-graph on one machine, handing its exit on unsplit:
    graph splitting's saturation and extraction (:func:`segment_plans`) without its DP over
    the layouts at the cuts, so that any run of consecutive segments is a plan of its own
    (:meth:`span`), as a pipeline stage is. ``search``: the work done."""

    pcg: PCG
    segments: tuple[Segment, ...]
    problems: tuple[SegmentProblem, ...]
    parts: tuple[_Solved | str, ...]  # per segment; a str says why its extraction failed
    search: SplitSearch

    def span(self, first: int, stop: int) -> PCG:
        """Segments ``first .. stop-1`` as one plan with the inputs and outputs of
        :func:`segment_pcg` of them merged (the entry an input, the exit returned unsplit),
        its nodes named after the model's (:func:`pcgopt.names.restore_names`). Raises
        :class:`PCGError` naming a segment whose extraction failed."""
        if not 0 <= first < stop <= len(self.segments):
            raise PCGError(
                f"segments {first} to {stop - 1}: the model has segments 0 to "
                f"{len(self.segments) - 1}"
            )
        segs = self.segments[first:stop]
        merged = Segment(
            first, tuple(x for s in segs for x in s.nodes), segs[0].entry, segs[-1].exit
        )
        parts = []
        for k in range(first, stop):
            part = self.parts[k]
            if isinstance(part, str):
                raise PCGError(f"segment {k} has no plan from the e-graph: {part}")
            parts.append(part)
        own = segment_pcg(self.pcg, merged)
        stitched = _stitch(own, self.problems[first:stop], parts, [0] * len(parts))
        return restore_names(own, stitched)


def segment_plans(
    pcg: PCG,
    machine: Machine,
    segments: Sequence[Segment],
    *,
    seeds: Sequence[PCG] = (),
    rules: list[Rule] | None = None,
    saturate_s: float = 30.0,
    extract_s: float = 10.0,
    memory_budget: int = 4 * 2**30,
    optimizer: str | Optimizer = "adam",
    segment_budget: Budget | None = None,
    degrees: Sequence[int] | None = None,
    presets: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> SegmentPlans:
    """Every segment of ``segments`` (a cut of ``pcg``, :func:`split_segments`) saturated and
    extracted on ``machine`` handing its exit on unsplit (:class:`SegmentPlans`); segments
    equal up to names once, all in one saturation. The options are :func:`split_search`'s."""
    extract_until = time.perf_counter() + saturate_s + extract_s
    result = SplitSearch(None, tuple(segments))
    problems, solved = _solve(
        pcg,
        segments,
        machine,
        result,
        seeds=seeds,
        rules=rules,
        extract_until=extract_until,
        memory_budget=memory_budget,
        optimizer=optimizer,
        say=progress or (lambda msg: None),
        progress_bar=False,
        segment_budget=segment_budget,
        degrees=degrees,
        presets=presets,
        unsplit_only=True,
    )
    result.layouts = tuple(p.handed[:1] for p in problems)
    return SegmentPlans(
        pcg, tuple(segments), tuple(problems), tuple(solved[p.key][0] for p in problems), result
    )


def _stitch(
    pcg: PCG, problems: Sequence[SegmentProblem], parts: Sequence[_Solved], picks: Sequence[int]
) -> PCG:
    """The segments' extractions joined into one PCG over ``pcg``'s sources: segment k's entry
    input becomes the Combines of what segment k-1 handed on, then inverse pairs cancel. The
    first segment's entry, if it has one, is an input of ``pcg`` (``pcg`` is then a run of
    segments, :func:`segment_pcg`); a last segment that hands on returns what it hands on."""
    sources = {n.name for n in pcg.nodes if is_source(n)}
    nodes: list[Node] = [n for n in pcg.nodes if is_source(n)]
    handed: TensorRef | None = None
    outputs: list[TensorRef] = []
    for k, (problem, part) in enumerate(zip(problems, parts, strict=True)):
        names: dict[str, str] = {}
        entry_ref: TensorRef | None = None
        if problem.entry is not None and handed is None:
            entry_ref = TensorRef(problem.back[problem.entry])
        elif problem.entry is not None:
            before = problems[k - 1].handed[picks[k - 1]]
            entry_ref = apply_chain(undo_chain(before), handed, f"split{k}/entry", nodes)
        for n in part.pcg.nodes:
            if n.name == problem.entry:
                continue
            if is_source(n):
                real = problem.back.get(n.name, n.name)
                if real not in sources:
                    raise PCGError(f"segment {k} reads source {real!r}, which the model lacks")
                names[n.name] = real
            else:
                names[n.name] = f"split{k}/{n.name}"

        for n in part.pcg.nodes:
            if n.name == problem.entry or is_source(n):
                continue
            nodes.append(
                replace(
                    n,
                    name=names[n.name],
                    inputs=tuple(_moved(r, names, problem.entry, entry_ref) for r in n.inputs),
                )
            )
        if problem.handed:
            handed = _moved(part.pcg.outputs[0], names, problem.entry, entry_ref)
            outputs = [handed]
        else:
            outputs = [_moved(r, names, problem.entry, entry_ref) for r in part.pcg.outputs]
    return cancel_inverse_pairs(PCG(nodes, outputs))


def _moved(
    ref: TensorRef, names: Mapping[str, str], entry: str | None, entry_ref: TensorRef | None
) -> TensorRef:
    """A segment's tensor in the stitched PCG: its entry input is ``entry_ref``."""
    if ref.node == entry:
        assert entry_ref is not None
        return entry_ref
    return TensorRef(names[ref.node], ref.index)
