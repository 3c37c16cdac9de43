"""Equality saturation of a PCG under the verified rules, within budgets.

:func:`saturate` loads the PCG into egglog (every tensor with its shape facts), adds the rules
(translated once per process and kept in a base e-graph that every run starts from), and runs the
rulesets ``algebraic``, ``parallel`` and ``cleanup`` one iteration at a time under a persistent
back-off scheduler (a rule that matches too often is banned for a while, so that no iteration
explodes, as measured in the feasibility notes). Between iterations it checks the budgets:

* e-nodes: the iteration that crosses the budget is undone (the e-graph is pushed before each
  iteration and popped back), so the result is the last e-graph that fit;
* wall time and memory (resident set of this process): checked after each iteration, and an
  iteration is started only if it is predicted to end, with the export of its e-graph, within
  them. egglog's run cannot be interrupted, so a misprediction may overshoot by an iteration.
  ``Budget(isolate=True)`` runs the iterations in a child process first, kills it at the limit,
  and replays in this process only the iterations that finished inside it.
* the predictions are rough, so when the next iteration is predicted not to fit the time, it
  is tried anyway in a forked child while this process keeps its e-graph (``speculate``, the
  default; :func:`_speculate`): the child's exported e-graph is taken if it arrives while this
  process could still export its own, and the child is killed otherwise.

The result says why saturation stopped (:class:`StopReason`) and carries the exported e-graph.
"""

from __future__ import annotations

import enum
import functools
import math
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import egglog.bindings as egg

from pcgopt.egraph import rule_cache
from pcgopt.egraph.export import EGraphData, export
from pcgopt.egraph.language import (
    EGraphError,
    Language,
    fact_values,
    language,
    node_call,
    within_arity,
)
from pcgopt.egraph.translate import (
    RULESETS,
    TranslatedRule,
    legal_degrees,
    rule_kind,
    translate_rule,
)
from pcgopt.errors import PCGError
from pcgopt.graph import PCG
from pcgopt.machine import Machine
from pcgopt.ops import OpKind
from pcgopt.progress import Progress
from pcgopt.rewrite import Rule


class StopReason(enum.Enum):
    """Why saturation stopped. TIME and MEMORY: the budget was reached, or the next iteration
    (with the export of its e-graph) was predicted to pass it (:class:`Budget`)."""

    SATURATED = "saturated"
    ITERATIONS = "iteration budget"
    NODES = "e-node budget"
    TIME = "time budget"
    MEMORY = "memory budget"

    def __repr__(self) -> str:
        return self.name


#: The back-off match limit of the rules with degrees (the parallel and cleanup rulesets) grows
#: with the number of degrees rewrites may choose (:meth:`Budget.match_limits`):
#: ``match_limit`` times ``sqrt(n / 3)`` for ``n`` degrees, never less. These rules take their
#: degree from the machine's legal ones, so their matches grow with the degrees: the cleanup
#: rule ``x => combine(partition(x, dim=1, degree=k))`` matched Unity's MLP 1,148 times in the
#: first iteration on 12 Summit GPUs (5 degrees) and 2,276 times on 48 (9 degrees). At a fixed
#: 1,000 it and the rules that parallelize the MLP were banned for every iteration a budget
#: allowed, and the e-graph held the 16 dense layers unsplit but the last (the plan of the
#: e-graph alone on 12 GPUs: 482 ms; 180 ms at 1,150 to 2,000, 173 ms at 4,000). A limit in
#: proportion to the degrees (3,000 on 48 GPUs) splits every layer there too (the plan:
#: 1,901 ms -> 280 ms), but it cost BERT-Large on 64 GPUs 4.3 GB (3.3 GB with the square
#: root) and BERT-Large's and Inception-v3's
#: deterministic searches their second iteration (whose e-graph then passed the e-node limit:
#: 40.4 -> 50.9 ms for BERT-Large): the square root is the compromise that changes neither
#: of those (``python bench/budgets.py``, ``python bench/search_time.py``). The algebraic rules
#: keep ``match_limit``: raised for them too, their split-of-concat patterns took 6 s each to
#: match in the MLP's fourth iteration on 48 GPUs (34 s, against 1.7 s at 1,000).
MATCH_LIMIT_DEGREES = 3


class ShapeConflictError(PCGError):
    """Saturation tried to merge two tensors with different facts (shape, degrees, replicas):
    a rule or an operator's shape derivation is wrong. Never a user error."""


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits of one saturation. In process, ``seconds`` is checked between iterations, and
    saturation also stops before an iteration predicted (from the last one and the e-graph's
    growth) to end, with the export of the e-graph it would leave
    (:data:`EXPORT_SECONDS_PER_ENODE`), past it, or to need more than ``memory_bytes``; a
    misprediction can still overrun by one iteration. An iteration that would leave more than
    ``enodes`` is undone, and one that would even at the least growth measured
    (:data:`LEAST_ITERATION_GROWTH`) is not started. A process that already holds
    ``memory_bytes`` when saturation starts runs no iteration. ``isolate``:
    enforce time and memory strictly by running the iterations in a child process first (costs
    a second run of the iterations that fit). ``speculate``: run the iterations predicted not
    to fit the time in a forked child, and take its e-graph if it is exported in time (this
    process and the child together stay within ``memory_bytes``); the time budget is then
    used up, where a prediction may have stopped early. ``after_seconds_per_enode``: what the
    caller will spend per e-node of the exported e-graph before its own deadline (costing and
    extracting it, :data:`~pcgopt.extract.search.extraction.EXTRACTION_SECONDS_PER_ENODE`), so that
    ``seconds`` covers that work too: an iteration is started only if its e-graph leaves the
    time for it. ``match_limit``: the back-off scheduler's limit on an algebraic rule's
    matches in one iteration (over it, the rule is banned for ``ban_length`` iterations and
    its limit doubles); ``parallel_match_limit``: a parallel or cleanup rule's (the rules with
    degrees), None (the default) for ``match_limit`` grown with the number of degrees the
    rewrites may choose (:data:`MATCH_LIMIT_DEGREES`, :meth:`match_limits`).
    ``algebra_from``: the first iteration the algebraic rules run in (the iterations before
    it run the parallel and cleanup rules alone); None (the default): the first, or
    :data:`MATRIX_ALGEBRA_FROM` when the shipped rules asked for include the matrix algebra.
    ``onset_growth``: the most the iteration after the algebra's first (when it waits) is
    predicted to grow the e-graph (:data:`ALGEBRA_ONSET_NEXT_GROWTH`, measured on whole models);
    None: that first one's growth, as for any other."""

    iterations: int = 30
    enodes: int = 200_000
    seconds: float = 30.0
    memory_bytes: int = 4 * 2**30
    match_limit: int = 1_000
    ban_length: int = 5
    isolate: bool = False
    speculate: bool = True
    after_seconds_per_enode: float = 0.0
    parallel_match_limit: int | None = None
    algebra_from: int | None = None
    onset_growth: float | None = None

    def match_limits(self, num_degrees: int) -> tuple[int, int]:
        """The back-off match limits (algebraic rules, parallel and cleanup rules) of a
        saturation whose rewrites may choose ``num_degrees`` degrees (class docstring)."""
        parallel = self.parallel_match_limit
        if parallel is None:
            growth = max(1.0, math.sqrt(num_degrees / MATCH_LIMIT_DEGREES))
            parallel = round(self.match_limit * growth)
        return self.match_limit, parallel

    def for_problems(self, count: int, num_degrees: int) -> Budget:
        """This budget for ``count`` PCGs saturated together in one run, which counts matches
        and e-nodes over all of them: the match limits (for ``num_degrees`` degrees) and the
        e-node budget multiplied by ``count``."""
        algebraic, parallel = self.match_limits(num_degrees)
        return replace(
            self,
            match_limit=algebraic * count,
            parallel_match_limit=parallel * count,
            enodes=self.enodes * count,
        )

    def __post_init__(self) -> None:
        for name in (
            "iterations",
            "enodes",
            "memory_bytes",
            "match_limit",
            "ban_length",
            "parallel_match_limit",
            "algebra_from",
        ):
            v = getattr(self, name)
            if name in ("parallel_match_limit", "algebra_from") and v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Budget.{name} must be a positive int, got {v!r}")
        if not self.seconds > 0:
            raise ValueError(f"Budget.seconds must be positive, got {self.seconds!r}")
        if self.onset_growth is not None and not self.onset_growth >= 1:
            raise ValueError(f"Budget.onset_growth must be >= 1, got {self.onset_growth!r}")
        if not self.after_seconds_per_enode >= 0:
            raise ValueError(
                f"Budget.after_seconds_per_enode must be >= 0, got {self.after_seconds_per_enode!r}"
            )


#: The first iteration the shipped matrix rules' algebra runs in (:attr:`Budget.algebra_from`).
#: Its 267 rules (associativity, distribution over concatenations and splits, on tensors of rank
#: 2) grow an MLP's e-graph faster than the layouts do: with them from the first iteration,
#: the cleanup rule that introduces a layout at every tensor passes its match limit and is
#: banned, and within a 20 s budget the e-graph of Unity's MLP on 24 and 48 Summit GPUs held
#: its first dense layers on one device (the plan of the e-graph alone: 958 and 1,900 ms;
#: CANDLE-Uno on 48, 1,033 ms). Held back by one iteration, the layouts reach every tensor
#: first: 218, 225 and 266 ms, 1.25-1.66x the full search's (``python bench/ablation.py``,
#: bench/RESULTS.md). Only where the matrix algebra is asked for (rank-2 models, and models
#: with a rank-2 classifier such as ResNeXt-50 and Inception-v3, whose transformer rules'
#: four algebraic ones, which unfuse layers, then wait too): a transformer's saturation
#: (``"matrix/parallel"``) runs its algebraic rules from the first iteration.
MATRIX_ALGEBRA_FROM = 2

#: How the second iteration is predicted: egglog's first has a fixed cost (about a second with
#: the shipped rules, whatever the size), so its time says little about the second. Its
#: e-nodes do: the second at most doubles them and adds up to about 40 per e-node loaded (the
#: rules' first matches on the PCG and its seeds' layouts), and takes 9-31 us per e-node it
#: leaves. Measured by ``python bench/iteration_growth.py`` (bench/RESULTS.md, "Saturation's
#: first iterations"; nine models with their seeds, e.g. BERT-Large's 4 distinct segments on
#: dgx-a100:4: 666 e-nodes loaded, 76,578 after the first iteration, 151,896 after the second
#: in 4.7 s): the constants below predicted 1.04-1.60x the measured e-nodes. Since the matrix
#: algebra waits for the second iteration (:data:`MATRIX_ALGEBRA_FROM`) they predict 1.08-1.53x
#: for the transformers, 0.68-0.92x for the rank-2 models (MLP, DLRM, CANDLE-Uno, XDL: their
#: second iteration, the algebra's first, takes 0.4-0.6 s, so the underestimate costs a
#: fraction of a second) and 4.8-7.0x for Inception-v3 and ResNeXt-50 (their first iteration,
#: layouts alone, hardly grows them; a cautious stop). Later iterations are predicted from the
#: last one.
SECOND_ITERATION_GROWTH = 2.0

#: The iteration after the algebraic rules' first (when they wait, :attr:`Budget.algebra_from`)
#: is predicted to grow the e-graph at most this much: that first one is a jump (the layouts
#: of the first iteration meet the algebra) that the next does not repeat. Measured with the
#: shipped rules on Summit 2-8 nodes (scratch ``saturate(..., Budget(iterations=4))``,
#: 2026-12-07): MLP 9.2x, 5.3x and 6.0x in the second iteration, then 2.4x, 2.2x and 2.3x;
#: CANDLE-Uno 9.3x and 4.3x, then 2.0x and 2.3x; XDL 6.3x and 3.8x, then 2.5x and 2.3x; DLRM
#: on 8 nodes 2.1x (below this, so not capped), then 3.0x. The last one's growth predicted the
#: third iteration 2-4x too long, so saturation stopped with most of its time unused. The
#: whole-model search sets it (:attr:`Budget.onset_growth`); graph splitting's segments, whose
#: extraction it was not measured with, do not (Inception-v3's 7 segments on 8 Summit nodes then
#: saturated a third iteration whose extraction took the call 20% past its budget).
ALGEBRA_ONSET_NEXT_GROWTH = 2.5
SECOND_ITERATION_ENODES_PER_LOADED = 40

#: An iteration is not started when growing the e-graph this much (or as much as the last one
#: did, if that was less: near saturation) would pass the e-node budget: it would be run and
#: then undone. Measured (scratch ``saturate`` with ``DETERMINISTIC_BUDGET`` and 3 iterations,
#: 2026-12-07), the third iteration grew MLP and XDL on 1-8 Summit nodes 2.0-3.4x; the second
#: 3-9x. The least growth seen, so an iteration that would have fitted is not given up.
LEAST_ITERATION_GROWTH = 2.0
SECOND_ITERATION_MIN_ADDED = 10_000
ITERATION_SECONDS_PER_ENODE = 30e-6

#: How the first iteration is predicted, so that it is not started when even its e-graph would
#: not leave the time to export and extract it (the PCGs and their seeds are then extracted as
#: loaded). Measured with the shipped rules on dgx-a100:1 to 4 nodes (egglog 14,
#: ``saturate(model, machine, budget=Budget(iterations=2))``, 2026-11-27): it took 0.5-1.1 s
#: and grew the loaded PCG 2.9x (Inception-v3 on 64 GPUs), 30x (MLP), 39x (BERT-Large), 49x
#: (Transformer), 315x (DLRM, 22 nodes), at about 20 us per e-node it left beyond the fixed
#: cost. The growth taken is a typical one, not a bound: the e-graphs it underestimates are
#: small ones.
FIRST_ITERATION_SECONDS = 0.5
FIRST_ITERATION_SECONDS_PER_ENODE = 20e-6
FIRST_ITERATION_GROWTH = 40.0

#: Exporting the e-graph (and, for several PCGs, cutting out each one's part) takes about
#: this long per e-node on the development machine: 12-22 us in bench/RESULTS.md's saturation
#: runs of one PCG (at b45aa80), 17-29 us for BERT-Large's segments saturated together; it adds
#: about this much memory per e-node (113 MiB for 246,225 e-nodes). Saturation stops before an
#: iteration whose e-graph would not leave the time or the memory to export it.
EXPORT_SECONDS_PER_ENODE = 30e-6
EXPORT_BYTES_PER_ENODE = 600

#: The most memory an e-node is predicted to add. The first iteration's growth of the resident
#: set is mostly egglog's fixed cost (its first matches build the rules' indexes), so over a small
#: e-graph it reads as far more per e-node: Inception-v3's segments on 192 GPUs grew 215 MiB over
#: 3,400 e-nodes (66 KB each), and their second iteration was predicted at 4.9 GB. Large
#: e-graphs hold about 16 KB per e-node (CANDLE-Uno: 855,430 e-nodes in 13.1 GB; BERT-Large's
#: segments on 64 GPUs: 150,431 in 3.3 GB with the rules and the process).
MAX_BYTES_PER_ENODE = 24 * 1024

#: A speculative child's export also goes to its parent, pickled: 7.5 us per e-node to pickle
#: and 9.2 to unpickle BERT-Large's e-graph on 64 GPUs (702,229 e-nodes, 29 MiB).
TRANSFER_SECONDS_PER_ENODE = 17e-6


@dataclass(frozen=True, slots=True)
class IterationStats:
    iteration: int
    enodes: int
    seconds: float
    rss_bytes: int


@dataclass(frozen=True)
class Saturation:
    """The result of :func:`saturate`. ``seconds``: from the call (or the caller's ``started``)
    until the export of the e-graph began, loading the PCG included but not the rules (once per
    process, :func:`warm_up`);
    ``export_seconds``: the export (and the caller's join, for :func:`saturate_split`);
    ``peak_rss_bytes``: the most memory the processes holding e-graphs used together."""

    stop_reason: StopReason
    iterations: int
    num_eclasses: int
    num_enodes: int
    seconds: float
    export_seconds: float
    peak_rss_bytes: int
    egraph: EGraphData
    history: tuple[IterationStats, ...] = field(repr=False)
    num_rewrites: int = 0
    untranslated: tuple[tuple[str, str, str], ...] = field(default=(), repr=False)
    #: E-nodes before the first iteration: the PCGs and their seeds as loaded (all problems'
    #: together, for :func:`saturate_together` and :func:`~pcgopt.egraph.saturate_split`).
    loaded_enodes: int = 0

    def contains(self, other: PCG) -> bool:
        """Whether ``other`` (node for node) is represented, with its outputs equal to the
        input's (see :meth:`EGraphData.contains`)."""
        return self.egraph.contains(other)

    def summary(self) -> str:
        return (
            f"{self.stop_reason.value} after {self.iterations} iteration(s): "
            f"{self.num_eclasses:,} e-classes, {self.num_enodes:,} e-nodes, "
            f"{self.seconds:.2f} s saturation + {self.export_seconds:.2f} s export, "
            f"peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB"
        )


# --------------------------------------------------------------------------------------------
# the rules, translated once per process
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RuleProgram:
    rules: tuple[TranslatedRule, ...]
    untranslated: tuple[tuple[str, str, str], ...]
    commands: object  # parsed egglog commands


def _translate(lang: Language, rules: Sequence[Rule]) -> tuple[list[TranslatedRule], list]:
    ok: list[TranslatedRule] = []
    skipped: list[tuple[str, str, str]] = []
    for rule in rules:
        for t in translate_rule(lang, rule):
            (ok if isinstance(t, TranslatedRule) else skipped).append(t)
    return ok, skipped


def _header(lang: Language) -> str:
    return "\n".join(
        [
            lang.declarations(),
            "(relation legal (i64))",
            "(relation device_budget (i64))",
            "(function root (i64) T :no-merge)",
            *(f"(ruleset {r})" for r in RULESETS),
        ]
    )


class _Base:
    """An egglog e-graph holding the declarations and the rules, reused by pushing and popping."""

    def __init__(
        self,
        lang: Language,
        rules: Sequence[Rule],
        translated: tuple[list[TranslatedRule], list[tuple[str, str, str]]] | None = None,
    ) -> None:
        """``translated``: ``rules`` translated already (:mod:`pcgopt.egraph.rule_cache`)."""
        self.lang = lang
        ok, skipped = _translate(lang, rules) if translated is None else translated
        self.rules = tuple(ok)
        self.untranslated = tuple(skipped)
        self.egraph = egg.EGraph()
        self.egraph.parse_and_run_program(_header(lang))
        self.egraph.parse_and_run_program("\n".join(r.text for r in ok))


#: A selection of a shipped rule file without its algebraic rules (``"matrix/parallel"``).
WITHOUT_ALGEBRA = "/parallel"


def shipped_presets(pcgs: Sequence[PCG] = ()) -> tuple[str, ...]:
    """The shipped rule files (by preset, :data:`pcgopt.rules.SHIPPED`) that can rewrite
    ``pcgs``; all of them when no PCG is given, except the opt-in ones
    (:data:`pcgopt.rules.OPT_IN`). The matrix rules always can. Every rule of
    another preset has a tensor of its minimum rank (:data:`pcgopt.rules.families.MIN_RANK`)
    on each side, and no rule of a lower preset builds such a tensor, so that preset's rules
    can match only where a PCG already has one: a rank-2 model (an MLP, DLRM) saturates
    without the transformer rules, which would cost it seconds of loading and matching. Alike,
    a preset of :data:`pcgopt.rules.families.OPERATORS_OF` (the embedding bags' ``lookups``)
    has one of its operators on each side of every rule, and no rule builds one.

    The matrix rules' algebraic part (``"matrix/parallel"`` leaves it out) is loaded only for
    PCGs that compute a tensor of rank 2 or less from a data input. Every tensor of a matrix
    rule has rank 2 or less, so elsewhere (a transformer, whose activations have rank 3 or 4)
    those rules only rewrite weight-only terms, such as the tied output weight's transpose,
    into other weight-only terms: concatenations, splits and transposes of weights that no
    activation's rule can use. On a one-layer BERT they are most of the e-graph's growth (on 8
    GPUs its Megatron plan was out of reach within 4 GB with them, and in the e-graph in 14
    iterations without them). Their parallel and cleanup rules (a replicated weight's
    transpose) stay."""
    from pcgopt.rules import OPT_IN, SHIPPED
    from pcgopt.rules.families import MIN_RANK, OPERATORS_OF

    default = tuple(p for p in SHIPPED if p not in OPT_IN)
    if not pcgs:
        return default
    ranks = (s.rank for pcg in pcgs for n in pcg.nodes for s in pcg.output_shapes(n.name))
    rank = max(ranks, default=0)
    ops = {n.op for pcg in pcgs for n in pcg.nodes}
    presets = tuple(
        p
        for p in default
        if MIN_RANK[p] <= rank and (p not in OPERATORS_OF or ops & set(OPERATORS_OF[p]))
    )
    if any(_computes_low_rank_data(pcg) for pcg in pcgs):
        return presets
    return tuple(p + WITHOUT_ALGEBRA if MIN_RANK[p] == 0 else p for p in presets)


def _computes_low_rank_data(pcg: PCG) -> bool:
    """Whether a computing node outputs a tensor of rank 2 or less that depends on a data
    input (not on weights alone). Parallel operators do not count: no algebraic rule matches
    them, and a plan's split of rank-2 token ids is no rank-2 computation."""
    from_data: set[str] = set()
    for node in pcg.nodes:  # in topological order
        if node.spec.kind is OpKind.SOURCE:
            if node.op == "input":
                from_data.add(node.name)
            continue
        if any(r.node in from_data for r in node.inputs):
            from_data.add(node.name)
            if node.spec.kind is OpKind.PARALLEL:
                continue
            if any(s.rank <= 2 for s in pcg.output_shapes(node.name)):
                return True
    return False


def _load_shipped_base(presets: tuple[str, ...]) -> _Base:
    from pcgopt.rules import SHIPPED, load

    for p in presets:
        name, slash, part = p.partition("/")
        if slash and slash + part != WITHOUT_ALGEBRA:
            raise ValueError(f"unknown selection {p!r} of a shipped rule file")
    # The translation is the same for the same files and the same pcgopt: read from the
    # cache when a process has made it before (seconds saved; rule_cache's docstring).
    key = rule_cache.translation_key(presets, [SHIPPED[p.partition("/")[0]] for p in presets])
    cached = rule_cache.read(key)
    if cached is not None:
        return _Base(language(), (), cached)
    rules: list[Rule] = []
    for p in presets:
        name, slash, _ = p.partition("/")
        loaded = load(SHIPPED[name])
        rules += [r for r in loaded if rule_kind(r) != "algebraic"] if slash else loaded
    lang = language()
    translated = _translate(lang, rules)
    rule_cache.write(key, *translated)
    return _Base(lang, rules, translated)


def _serves(loaded: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    """Whether the rules of selection ``loaded`` include those of ``wanted``, and no opt-in
    rules that ``wanted`` leaves out (they change what saturation finds, not only its time)."""
    from pcgopt.rules import OPT_IN

    if any(p in OPT_IN and p not in wanted for p in loaded):
        return False
    return all(p in loaded or p.partition("/")[0] in loaded for p in wanted)


# The shipped rules are loaded once per process and set of files, possibly from a background
# thread (:func:`warm_up_in_background`) while the caller also needs them: one loads, the
# other waits.
_shipped_lock = threading.Lock()
_shipped: dict[tuple[str, ...], _Base] = {}


def _loaded_superset(presets: tuple[str, ...]) -> _Base | None:
    """The smallest loaded base holding at least ``presets``' rules (more rules only cost time:
    a base loaded for the whole model serves its segments)."""
    fits = [k for k in _shipped if _serves(k, presets)]
    return min((_shipped[k] for k in fits), key=lambda b: len(b.rules), default=None)


def _shipped_base(presets: tuple[str, ...]) -> _Base:
    with _shipped_lock:
        base = _loaded_superset(presets)
        if base is None:
            base = _shipped[presets] = _load_shipped_base(presets)
        return base


def warm_up(
    rules: Sequence[Rule] | None = None,
    pcgs: Sequence[PCG] = (),
    presets: Sequence[str] | None = None,
) -> float:
    """Translates and loads the shipped rules now, if ``rules`` is None and they are not loaded
    yet (once per process; seconds, see the README), so that a caller's time budget for
    :func:`saturate` can leave that time out. ``pcgs``: the PCGs to be saturated, when known:
    only the rule files that can rewrite them are loaded (:func:`shipped_presets`).
    ``presets``: the shipped rule files to load instead (as for :func:`saturate`). Returns
    the seconds it took (0 when already done; custom rules are translated by each
    :func:`saturate` call)."""
    presets = shipped_presets(pcgs) if presets is None else _check_presets(presets)
    if rules is not None or _loaded_superset(presets) is not None:
        return 0.0
    start = time.perf_counter()
    _shipped_base(presets)
    return time.perf_counter() - start


def warm_up_in_background(
    rules: Sequence[Rule] | None = None,
    pcgs: Sequence[PCG] = (),
    presets: Sequence[str] | None = None,
) -> Future[float]:
    """:func:`warm_up` in a daemon thread; the future gives its seconds, or raises what it
    raised. egglog releases the interpreter lock while it compiles the rules (most of the
    load; reading and translating them holds it), so on a machine with a core to spare the
    load overlaps the caller's own work. Wait for the future before :func:`saturate` with
    ``Budget(isolate=True)``, which forks."""
    done: Future[float] = Future()
    wanted = shipped_presets(pcgs) if presets is None else _check_presets(presets)
    if rules is not None or _loaded_superset(wanted) is not None:
        done.set_result(0.0)
        return done

    def load() -> None:
        try:
            done.set_result(warm_up(pcgs=pcgs, presets=presets))
        except BaseException as e:  # handed to whoever waits on the future
            done.set_exception(e)

    threading.Thread(target=load, name="pcgopt-warm-up", daemon=True).start()
    return done


def _check_presets(presets: Sequence[str]) -> tuple[str, ...]:
    from pcgopt.rules import SHIPPED

    if isinstance(presets, str):
        raise TypeError(f"presets must be a sequence of names, got the string {presets!r}")
    for p in presets:
        name, slash, part = str(p).partition("/")
        if name not in SHIPPED or (slash and slash + part != WITHOUT_ALGEBRA):
            raise ValueError(
                f"presets: no shipped rule file {p!r}; valid: {sorted(SHIPPED)}, or "
                f"'<name>{WITHOUT_ALGEBRA}' for one without its algebraic rules"
            )
    return tuple(presets)


def _asked_presets(
    rules: Sequence[Rule] | None, pcgs: Sequence[PCG], presets: Sequence[str] | None
) -> tuple[str, ...] | None:
    """The shipped rule files a saturation asks for (checked), or None for custom ``rules``."""
    if rules is not None:
        if presets is not None:
            raise ValueError("give rules or presets, not both")
        return None
    return shipped_presets(pcgs) if presets is None else _check_presets(presets)


def _algebra_from(asked: tuple[str, ...] | None) -> int:
    """The default :attr:`Budget.algebra_from` for the shipped rule files ``asked`` for (None:
    custom rules): :data:`MATRIX_ALGEBRA_FROM` when they include the matrix rules' algebra,
    else 1. Read from what was asked, not from the base that serves it (a base loaded earlier
    may hold more rules)."""
    return MATRIX_ALGEBRA_FROM if asked is not None and "matrix" in asked else 1


# --------------------------------------------------------------------------------------------
# loading a PCG
# --------------------------------------------------------------------------------------------


def pcg_program(
    lang: Language,
    pcg: PCG,
    *,
    prefix: str = "$n",
    seed_of: PCG | None = None,
    seed_of_prefix: str = "$n",
    source_prefix: str = "",
    first_root: int = 0,
) -> str:
    """egglog commands that add ``pcg``'s nodes with the facts of every tensor, and record its
    outputs as ``(root i)`` from ``first_root`` on; with ``seed_of``, the PCG already loaded
    (with ``seed_of_prefix``), ``pcg``'s outputs are instead unioned with that PCG's.
    ``source_prefix`` goes before every input's and weight's name (PCGs loaded together keep
    their sources apart)."""
    # Loaded as written within the constructors' arities (the PCG that seeds refer to too, so
    # that its nodes keep the numbers they were loaded with).
    pcg = within_arity(pcg, lang.max_variadic)
    if seed_of is not None:
        seed_of = within_arity(seed_of, lang.max_variadic)
    lines: list[str] = []
    ref: dict[tuple[str, int], str] = {}
    for k, node in enumerate(pcg.nodes):
        spec = node.spec
        args = [ref[r.node, r.index] for r in node.inputs]
        source = source_prefix + node.name if spec.kind is OpKind.SOURCE else None
        call = node_call(lang, node.op, args, node.params, source)
        var = f"{prefix}{k}"
        lines.append(f"(let {var} {call})")
        shapes = pcg.output_shapes(node.name)
        multi = lang.constructor(node.op, len(args)).returns == "TT"
        for i, shape in enumerate(shapes):
            target = f"(out {var} {i})" if multi else var
            ref[node.name, i] = target
            for table, value in fact_values(shape).items():
                lines.append(f"(set ({table} {target}) {value})")
    if seed_of is None:
        for i, r in enumerate(pcg.outputs):
            lines.append(f"(set (root {first_root + i}) {ref[r.node, r.index]})")
        return "\n".join(lines)
    if len(seed_of.outputs) != len(pcg.outputs):
        raise EGraphError(
            f"a seed must have the input's {len(seed_of.outputs)} output(s), it has "
            f"{len(pcg.outputs)}"
        )
    index = {n.name: k for k, n in enumerate(seed_of.nodes)}
    for r, mine in zip(seed_of.outputs, pcg.outputs, strict=True):
        node = seed_of.node(r.node)
        theirs = f"{seed_of_prefix}{index[r.node]}"
        if lang.constructor(node.op, len(node.inputs)).returns == "TT":
            theirs = f"(out {theirs} {r.index})"
        lines.append(f"(union {theirs} {ref[mine.node, mine.index]})")
    return "\n".join(lines)


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # not Linux: the peak so far is what we can read
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


#: Whether this process is a speculative child (:func:`_speculate`): its memory is then what it
#: does not share with its parent.
_speculative_child = False


def _private_bytes(pid: int | str = "self") -> int:
    """The memory of process ``pid`` that no other process shares (after a fork, what it wrote
    since); its resident set where that cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return 1024 * sum(
                int(line.split()[1]) for line in f if line.startswith(("Private_", "Swap:"))
            )
    except (OSError, ValueError, IndexError):
        return _rss() if pid == "self" else _child_rss(pid)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is not glibc."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def return_freed_memory() -> int:
    """Hands the memory that freed e-graphs leave in the C allocator's heap back to the system
    (glibc's ``malloc_trim``; elsewhere nothing), so that the resident set, which the memory
    budget reads, is what is in use: after BERT-Large's saturation on 64 GPUs was dropped, the
    process kept 826 MiB resident, 456 MiB after this, and a later saturation in the same
    process (Inception-v3's) found its budget spent and ran no iteration. It takes 4-63 ms
    (27 ms after that saturation; the first call also loads the library). Returns the bytes
    the resident set shrank by."""
    trim = _malloc_trim()
    if trim is None:
        return 0
    before = _rss()
    trim(0)
    return max(0, before - _rss())


def _footprint() -> int:
    """What this process adds to the memory of the saturation: its resident set, or in a
    speculative child what it does not share with its parent (which counts the rest)."""
    return _private_bytes() if _speculative_child else _rss()


def _enodes(eg: egg.EGraph, lang: Language) -> int:
    (out,) = eg.parse_and_run_program("(print-size)")
    return sum(n for name, n in out.sizes if name == "out" or lang.by_name(name) is not None)


# The rulesets of rules with degrees (parallel, cleanup) have a back-off scheduler of their own
# ($bp), with its own match limit (Budget.match_limits).
_SCHEDULE = (
    "(run-schedule "
    + " ".join(f"(run-with {'$bo' if r == 'algebraic' else '$bp'} {r})" for r in RULESETS)
    + ")"
)
_SCHEDULE_WITHOUT_ALGEBRA = (
    "(run-schedule " + " ".join(f"(run-with $bp {r})" for r in RULESETS if r != "algebraic") + ")"
)


def _iteration(eg: egg.EGraph, algebra: bool = True) -> tuple[bool, int]:
    """One iteration of every ruleset (``algebra=False``: but the algebraic one); (whether
    anything changed or may still change, number of rewrites applied)."""
    try:
        (out,) = eg.parse_and_run_program(_SCHEDULE if algebra else _SCHEDULE_WITHOUT_ALGEBRA)
    except egg.EggSmolError as e:
        if "merge" in str(e).lower():
            raise ShapeConflictError(
                f"saturation merged two tensors with different facts; a rule or a shape "
                f"derivation is wrong: {e}"
            ) from None
        raise
    report = out.report
    matches = sum(report.num_matches_per_rule.values())
    return (report.updated or not report.can_stop), matches


#: One PCG to saturate and the seeds equivalent to it (see :func:`saturate`).
_Problem = tuple[PCG, Sequence[PCG]]


def _every_pcg(problems: Sequence[_Problem]) -> list[PCG]:
    return [p for pcg, seeds in problems for p in (pcg, *seeds)]


def _source_prefix(j: int, problems: Sequence[_Problem]) -> str:
    """What goes before the source names of problem ``j``: nothing for a PCG alone."""
    return "" if len(problems) == 1 else f"{j}:"


def _start(
    base: _Base,
    problems: Sequence[_Problem],
    machine: Machine,
    budget: Budget,
    degrees: Sequence[int],
) -> egg.EGraph:
    eg = base.egraph
    programs: list[tuple[str, str, bool]] = []  # (what, program, whether a seed)
    first_root = 0
    for j, (pcg, seeds) in enumerate(problems):
        mine = "$n" if len(problems) == 1 else f"$n{j}_"
        sources = _source_prefix(j, problems)
        programs.append(
            (
                "the PCG" if len(problems) == 1 else f"PCG {j}",
                pcg_program(
                    base.lang, pcg, prefix=mine, source_prefix=sources, first_root=first_root
                ),
                False,
            )
        )
        first_root += len(pcg.outputs)
        for k, seed in enumerate(seeds):
            theirs = f"$s{k}_" if len(problems) == 1 else f"$s{j}_{k}_"
            what = f"seed {k}" if len(problems) == 1 else f"PCG {j}'s seed {k}"
            program = pcg_program(
                base.lang,
                seed,
                prefix=theirs,
                seed_of=pcg,
                seed_of_prefix=mine,
                source_prefix=sources,
            )
            programs.append((what, program, True))
    eg.parse_and_run_program("(push)")
    setup = [
        *(f"(legal {d})" for d in degrees),
        f"(device_budget {machine.num_devices})",
        *(
            f"(let-scheduler {name} (back-off :match-limit {limit} "
            f":ban-length {budget.ban_length}))"
            for name, limit in zip(("$bo", "$bp"), budget.match_limits(len(degrees)), strict=True)
        ),
    ]
    eg.parse_and_run_program("\n".join(setup))
    for what, program, is_seed in programs:
        try:
            eg.parse_and_run_program(program)
        except egg.EggSmolError as e:
            eg.parse_and_run_program("(pop)")
            if is_seed and "merge" in str(e).lower():
                raise ShapeConflictError(
                    f"{what}: its outputs do not have the input's parallel shapes: {e}"
                ) from None
            raise EGraphError(f"cannot load {what} into the e-graph: {e}") from None
    return eg


@dataclass
class _RunState:
    """Where a run of iterations is: what :func:`_run` continues from (in a speculative child,
    the parent's run)."""

    history: list[IterationStats] = field(default_factory=list)
    rewrites: int = 0
    quiet: int = 0  # iterations in a row that changed nothing
    # The loaded PCGs' size and the memory before the first iteration: how much memory an
    # e-node takes (the first iteration's growth says little about the second's).
    initial_enodes: int = 0
    initial_rss: int = 0
    last_end: float = 0.0  # when the last iteration ended
    peak_footprint: int = 0  # the most this process added to the memory (:func:`_footprint`)
    # The last iteration left more e-nodes than the budget (the e-graph must be rebuilt without
    # it); a NODES stop without it was a prediction, the e-graph as it is fits.
    overshot: bool = False


def _export_seconds(nodes: float, export_scale: float) -> tuple[float, float]:
    """Predicted (export, what the caller does after it) seconds for an e-graph of ``nodes``
    exported in this process (in a speculative child, with its transfer to the parent)."""
    export_s = EXPORT_SECONDS_PER_ENODE * nodes
    transfer_s = TRANSFER_SECONDS_PER_ENODE * nodes if _speculative_child else 0.0
    return export_s + transfer_s, export_s * (export_scale - 1)


def _run(
    base: _Base,
    budget: Budget,
    *,
    max_iterations: int | None = None,
    report=None,
    progress: Progress | None = None,
    started: float | None = None,
    export_scale: float = 1.0,
    state: _RunState | None = None,
    deliver_by: float = float("inf"),
) -> tuple[StopReason, _RunState]:
    """Runs iterations on the loaded e-graph; returns why it stopped and the run's state
    (per-iteration stats, rewrites applied). With ``max_iterations`` (a replay), runs exactly
    that many unless saturated first, without budget checks. On the node budget the e-graph is
    left one iteration past the budget: the caller replays one iteration fewer. ``started``:
    when the time budget began (``time.perf_counter()``; default now), so that loading the PCG
    counts. ``state``: a run to continue. ``deliver_by``: the export must also be done by then
    (a speculative child's parent stops waiting for it then)."""
    eg = base.egraph
    lang = base.lang
    run_start = time.perf_counter()
    start = run_start if started is None else started
    if state is None:
        state = _RunState(
            initial_enodes=_enodes(eg, lang),
            initial_rss=_rss(),
            last_end=run_start,
        )
    history = state.history
    initial, initial_rss = state.initial_enodes, state.initial_rss
    limit = budget.iterations if max_iterations is None else max_iterations
    reason = StopReason.ITERATIONS

    def over_time(elapsed: float, now: float, iteration_s: float, nodes: float) -> bool:
        """Whether an iteration of ``iteration_s`` leaving ``nodes`` e-nodes would end, with
        the export and what the caller does with it, past the budget."""
        export_s, after_s = _export_seconds(nodes, export_scale)
        after_s += budget.after_seconds_per_enode * nodes
        return (
            elapsed + iteration_s + export_s + after_s >= budget.seconds
            or now + iteration_s + export_s >= deliver_by
        )

    if max_iterations is None and not history:
        # The first iteration is predicted from the constants above: a budget too small for it
        # gets the loaded PCGs and their seeds, in time.
        nodes = initial * FIRST_ITERATION_GROWTH
        iteration_s = FIRST_ITERATION_SECONDS + FIRST_ITERATION_SECONDS_PER_ENODE * nodes
        now = time.perf_counter()
        if over_time(now - start, now, iteration_s, nodes):
            return StopReason.TIME, state
        # Likewise a memory budget already spent (by the caller, or the loaded e-graph): no
        # iteration at all. (What the first adds is not known before it runs.) Memory that
        # earlier saturations freed is returned to the system first, so it does not count.
        return_freed_memory()
        if _footprint() >= budget.memory_bytes:
            return StopReason.MEMORY, state
    for it in range(len(history) + 1, limit + 1):
        algebra = it >= (budget.algebra_from or 1)
        changed, matches = _iteration(eg, algebra)
        nodes = _enodes(eg, lang)
        now = time.perf_counter()
        elapsed = now - start
        last_s, state.last_end = now - state.last_end, now
        rss = _rss()
        footprint = rss if not _speculative_child else _footprint()
        state.peak_footprint = max(state.peak_footprint, footprint)
        if max_iterations is None and nodes > budget.enodes:
            reason, state.overshot = StopReason.NODES, True
            break
        state.rewrites += matches
        history.append(IterationStats(it, nodes, elapsed, rss))
        if report is not None:
            report(history[-1])
        if progress is not None:
            _show(progress, budget, it, nodes, elapsed)
        # With back-off, one quiet iteration is not saturation: banned rules come back; nor is
        # one without the algebraic rules.
        state.quiet = state.quiet + 1 if not changed and algebra else 0
        if state.quiet >= 2:
            reason = StopReason.SATURATED
            break
        if max_iterations is not None:
            continue
        if it == limit:
            break  # the iteration limit, whatever the predictions for a next one say
        # egglog cannot interrupt an iteration, so stop before one that would overrun: predict
        # it as the last one times the e-graph's last growth, at least doubled (on MNIST, 2
        # GPUs: 4.4x more e-nodes, the next iteration took 4x longer); the second from the
        # constants above.
        if len(history) == 1:
            predicted_nodes = SECOND_ITERATION_GROWTH * nodes + max(
                SECOND_ITERATION_ENODES_PER_LOADED * initial, SECOND_ITERATION_MIN_ADDED
            )
            iteration_s = ITERATION_SECONDS_PER_ENODE * predicted_nodes
            before_nodes, before_rss = initial, initial_rss
        else:
            growth = max(2.0, nodes / max(history[-2].enodes, 1))
            if budget.onset_growth is not None and it == budget.algebra_from and it > 1:
                # The algebra's first iteration is a jump the next one does not repeat.
                growth = min(growth, budget.onset_growth)
            iteration_s = last_s * growth
            predicted_nodes = nodes * growth
            before_nodes, before_rss = history[-2].enodes, history[-2].rss_bytes
        least = min(LEAST_ITERATION_GROWTH, nodes / max(before_nodes, 1))
        if nodes * least > budget.enodes:
            reason = StopReason.NODES
            break
        # The export after the last iteration is in the budget too.
        if over_time(elapsed, now, iteration_s, predicted_nodes):
            reason = StopReason.TIME
            break
        # Memory grows with the e-nodes as in the last iteration, or as over the whole run when
        # the last one hardly grew the e-graph (a few MiB over a few e-nodes says nothing). The
        # growth is read from the resident set; what is held, from the footprint (in a
        # speculative child, the pages it shares with its parent are its parent's).
        per_enode = max(0, rss - initial_rss) / max(1, nodes - initial)
        if nodes - before_nodes >= nodes // 10:
            per_enode = max(per_enode, max(0, rss - before_rss) / max(1, nodes - before_nodes))
        per_enode = min(per_enode, MAX_BYTES_PER_ENODE)
        predicted_rss = (
            footprint
            + per_enode * (predicted_nodes - nodes)
            + EXPORT_BYTES_PER_ENODE * export_scale * predicted_nodes
        )
        if footprint >= budget.memory_bytes or predicted_rss >= budget.memory_bytes:
            reason = StopReason.MEMORY
            break
    return reason, state


def saturate(
    pcg: PCG,
    machine: Machine,
    *,
    rules: Sequence[Rule] | None = None,
    budget: Budget | None = None,
    progress: bool = False,
    seeds: Sequence[PCG] = (),
    degrees: Sequence[int] | None = None,
    presets: Sequence[str] | None = None,
) -> Saturation:
    """Saturates ``pcg`` with the verified rules (default: the shipped set) for ``machine``
    (its device count bounds the devices any tensor may span; its divisors above 1 are the
    degrees rewrites may choose), within ``budget`` (default :class:`Budget`).

    ``seeds``: PCGs equivalent to ``pcg`` (same inputs and weights by name, same output parallel
    shapes), e.g. plans of another search, added before the rules run with their outputs in the
    input's e-classes, so that rewrites apply to them too and extraction can mix their parts
    with the rest. They are trusted, not proved: give only plans built by sound lowerings, and
    check what is extracted (``saturate_and_extract`` checks its plan against the input).

    ``degrees``: the only degrees rewrites may choose (each a divisor of the device count
    above 1; e.g. :meth:`Machine.level_degrees`, the degrees of whole levels of the machine),
    instead of every divisor: fewer degrees, a smaller e-graph per iteration.
    ``presets``: the shipped rule files to use (:data:`pcgopt.rules.SHIPPED`; default
    :func:`shipped_presets`, those that can rewrite the PCG). ``"layouts"`` is never chosen
    by default: its rules relate layouts of two degrees (a bias copied ``dp*tp`` times, or
    ``tp`` times on ``dp`` copies), which a plan combining data and tensor parallelism needs,
    and they grow the e-graph by every pair of degrees.

    >>> from pcgopt import models
    >>> shipped_presets([models.build("bert_large", small=True)]) + ("layouts",)
    ('matrix/parallel', 'transformer', 'layouts')
    """
    (sat,) = saturate_together(
        [pcg],
        machine,
        rules=rules,
        budget=budget,
        progress=progress,
        seeds=[seeds],
        degrees=degrees,
        presets=presets,
    )
    return sat


def _refuse_micro_batches(pcg: PCG, what: str) -> None:
    """The e-graph's shapes have no micro-batch counts (Pipeline, Batch): a PCG cut into
    micro-batches would lose them there, so it is refused."""
    found = pcg.first_in_micro_batches()
    if found is not None:
        name, shape = found
        raise EGraphError(
            f"{what}: node {name!r} outputs {shape}, cut into micro-batches; the e-graph does "
            f"not model micro-batches (Pipeline, Batch): saturate the PCG without them "
            f"(pipelined plans come from pcgopt.extract.pipeline_search)"
        )


def saturate_together(
    pcgs: Sequence[PCG],
    machine: Machine,
    *,
    rules: Sequence[Rule] | None = None,
    budget: Budget | None = None,
    progress: bool = False,
    seeds: Sequence[Sequence[PCG]] | None = None,
    export_scale: float = 1.0,
    started: float | None = None,
    degrees: Sequence[int] | None = None,
    presets: Sequence[str] | None = None,
) -> list[Saturation]:
    """:func:`saturate` for several PCGs at once (``seeds[j]``: those of ``pcgs[j]``), in one
    e-graph under one ``budget``: egglog's fixed cost of a run (copying the e-graph of the
    rules, and a first iteration that takes about half a second with the shipped rules
    whatever the PCG's size) is paid once, not once per PCG. Their inputs and weights are kept
    apart (sources of different PCGs are different tensors even where their names are equal),
    so no rewrite connects them. Returns one :class:`Saturation` per PCG, whose e-graph is
    the part reachable from that PCG's outputs; the stop reason, iterations, times and memory
    are the shared run's. Graph splitting saturates its distinct segments this way.
    ``export_scale``: the export and what the caller does with it afterwards (a join of
    copies, :func:`~pcgopt.egraph.saturate_split`) cost this many times a plain export, in time
    and memory; saturation leaves room for them in the budget. ``started``: when the caller's
    time budget began (``time.perf_counter()``; default: when this call began), so that its
    own work before this call counts; loading the rules (once per process) does not.
    ``degrees``, ``presets``: as for :func:`saturate`."""
    t0 = time.perf_counter() if started is None else started
    pcgs = tuple(pcgs)
    seeds = tuple(tuple(s) for s in (seeds if seeds is not None else [()] * len(pcgs)))
    if len(seeds) != len(pcgs):
        raise ValueError(f"seeds must give one sequence per PCG ({len(pcgs)}), got {len(seeds)}")
    if not pcgs:
        raise ValueError("saturate_together needs at least one PCG")
    for j, pcg in enumerate(pcgs):
        if not isinstance(pcg, PCG):
            what = "saturate needs a PCG" if len(pcgs) == 1 else f"pcgs[{j}] must be a PCG"
            raise TypeError(f"{what}, got {type(pcg).__name__}")
        for k, seed in enumerate(seeds[j]):
            if not isinstance(seed, PCG):
                where = f"seeds[{k}]" if len(pcgs) == 1 else f"seeds[{j}][{k}]"
                raise TypeError(f"{where} must be a PCG, got {type(seed).__name__}")
        for k, graph in enumerate((pcg, *seeds[j])):
            _refuse_micro_batches(graph, "the PCG" if k == 0 else f"seed {k - 1}")
    if not isinstance(machine, Machine):
        raise TypeError(f"saturate needs a pcgopt.Machine, got {type(machine).__name__}")
    problems: list[_Problem] = list(zip(pcgs, seeds, strict=True))
    budget = budget or Budget()
    legal = legal_degrees(machine.num_devices, degrees)
    asked = _asked_presets(rules, _every_pcg(problems), presets)
    loading = time.perf_counter()
    base = _Base(language(), rules) if asked is None else _shipped_base(asked)
    t0 += time.perf_counter() - loading  # once per process (warm_up), not this call's work
    if budget.algebra_from is None:
        budget = replace(budget, algebra_from=_algebra_from(asked))
    fit: int | None = None
    reason: StopReason | None = None
    if budget.isolate:
        fit, reason = _probe_in_child(problems, machine, budget, base, legal, export_scale)
        t0 = time.perf_counter()  # the probe had its own budget
    bar = Progress(budget.iterations, "saturate") if progress else None
    eg = _start(base, problems, machine, budget, legal)
    try:
        outcome: _Outcome | None = None
        if fit is None:
            reason, state = _run(base, budget, progress=bar, started=t0, export_scale=export_scale)
            if reason is StopReason.NODES and state.overshot:
                # The last iteration overshot: rebuild the e-graph that fit (egglog is
                # deterministic, so replaying gives the same e-graph).
                fit = len(state.history)
                eg.parse_and_run_program("(pop)")
                eg = _start(base, problems, machine, budget, legal)
            elif reason is StopReason.TIME and budget.speculate and state.history:
                outcome, stop = _speculate(
                    _Speculation(base, problems, budget, t0, export_scale),
                    state,
                    deliver_by=float("inf"),
                    allowance=budget.memory_bytes,
                    on_iteration=None if bar is None else _progress_reporter(bar, budget, t0),
                )
                reason = stop or reason
        if fit is not None:
            replay_reason, state = _run(base, budget, max_iterations=fit)
            if reason is None or replay_reason is StopReason.SATURATED:
                reason = replay_reason
        if outcome is None:
            outcome = _export_outcome(base, problems, reason, state)
        # The figures of the process whose e-graph was exported, and of its ancestors' memory.
        parts = pickle.loads(outcome.parts) if isinstance(outcome.parts, bytes) else outcome.parts
        reason, history, rewrites = outcome.reason, outcome.history, outcome.rewrites
        loaded = outcome.loaded_enodes
        seconds = outcome.saturated_at - t0
        export_seconds = time.perf_counter() - outcome.saturated_at
        peak = outcome.peak_rss
    finally:
        eg.parse_and_run_program("(pop)")
        if bar is not None:
            bar.close()
    return [
        Saturation(
            stop_reason=reason,
            iterations=len(history),
            num_eclasses=part.num_eclasses,
            num_enodes=part.num_enodes,
            seconds=seconds,
            export_seconds=export_seconds,
            peak_rss_bytes=peak,
            egraph=part,
            history=tuple(history),
            num_rewrites=rewrites,
            untranslated=base.untranslated,
            loaded_enodes=loaded,
        )
        for part in parts
    ]


# --------------------------------------------------------------------------------------------
# speculative iterations
# --------------------------------------------------------------------------------------------


#: A speculative child is forked only if it has at least this long before its parent must start
#: its own export.
MIN_SPECULATION_SECONDS = 0.5


@dataclass
class _Outcome:
    """A saturation's result before it becomes :class:`Saturation` s: why it stopped, its run,
    when its export began, the peak memory of the processes that held e-graphs meanwhile, and
    the exported e-graph of every problem (pickled, when it comes from a speculative child)."""

    reason: StopReason
    history: list[IterationStats]
    rewrites: int
    saturated_at: float
    peak_rss: int
    parts: list[EGraphData] | bytes
    loaded_enodes: int = 0


def _export_outcome(
    base: _Base, problems: Sequence[_Problem], reason: StopReason, state: _RunState
) -> _Outcome:
    saturated_at = time.perf_counter()
    eg = base.egraph
    root_rows = eg.freeze().functions["root"].rows
    roots = sorted((eg.value_to_i64(r.inputs[0]), r.output) for r in root_rows)
    data = export(eg, base.lang, [v for _, v in roots])
    parts = [data]
    if len(problems) > 1:
        parts, first = [], 0
        for j, (pcg, _) in enumerate(problems):
            mine = data.roots[first : first + len(pcg.outputs)]
            first += len(pcg.outputs)
            parts.append(data.reachable(mine, source_prefix=_source_prefix(j, problems)))
    peak = max(state.peak_footprint, _footprint())  # the export's memory included
    return _Outcome(
        reason, state.history, state.rewrites, saturated_at, peak, parts, state.initial_enodes
    )


def _show(bar: Progress, budget: Budget, iteration: int, enodes: int, elapsed: float) -> None:
    """The bar fills towards whichever of the budget's limits is nearest: iterations, e-nodes
    or seconds."""
    fraction = max(
        iteration / max(1, budget.iterations),
        enodes / max(1, budget.enodes),
        elapsed / budget.seconds if budget.seconds else 0.0,
    )
    limit = f" of {budget.seconds:.0f} s" if budget.seconds else ""
    bar.update(
        note=f"iteration {iteration}: {enodes:,} e-nodes, {elapsed:.1f} s{limit}",
        fraction=fraction,
    )


def _progress_reporter(bar: Progress, budget: Budget, started: float):
    def update(stats: IterationStats) -> None:
        _show(bar, budget, stats.iteration, stats.enodes, time.perf_counter() - started)

    return update


@dataclass(frozen=True)
class _Speculation:
    """What a chain of speculative children shares: the saturation (its e-graph is forked),
    when its time budget began, and how much the export costs (``export_scale``)."""

    base: _Base
    problems: Sequence[_Problem]
    budget: Budget
    started: float
    export_scale: float


def _speculate(
    run: _Speculation,
    state: _RunState,
    *,
    deliver_by: float,
    allowance: int,
    on_iteration,
) -> tuple[_Outcome | None, StopReason | None]:
    """The next iteration was predicted not to fit the time budget, but egglog's predictions
    are rough (the second iteration grew BERT-Large's segments on 64 GPUs 1.95x where 6x is
    predicted): try it anyway in a forked child, a copy of this e-graph, while this process
    keeps its own. The child goes on as this process would have (iterations predicted to fit,
    then a child of its own) and sends back its exported e-graph, or says it has nothing that
    would be ready in time. This process waits until it must start its own export (the export
    and what the caller does after it, ``run.export_scale``, must end by ``run.started`` +
    ``run.budget.seconds``, and be with its own parent by ``deliver_by``) and kills the child then,
    or when this process and the child together pass ``allowance`` bytes. Returns the child's
    outcome (None to export this e-graph) and, if the child stopped on a budget, which."""
    deadline = run.started + run.budget.seconds
    export_s, after_s = _export_seconds(state.history[-1].enodes, run.export_scale)
    give_up = min(deliver_by, deadline - after_s) - export_s
    if give_up - time.perf_counter() < MIN_SPECULATION_SECONDS:
        return None, None
    own = _footprint()  # what this process holds while its child runs
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_speculation_worker,
        args=(run, state, give_up, allowance - own, sender),
    )
    proc.start()
    sender.close()
    stop: StopReason | None = StopReason.TIME
    outcome: _Outcome | None = None
    child_peak = 0
    try:
        next_memory_check = 0.0
        while (now := time.perf_counter()) < give_up:
            if now >= next_memory_check:  # reading a process's page tables is not free
                next_memory_check = now + 0.2
                child_peak = max(child_peak, _private_bytes(proc.pid))
                if own + child_peak > allowance:
                    stop = StopReason.MEMORY
                    break
            if not receiver.poll(min(0.05, give_up - now)):
                if not proc.is_alive() and not receiver.poll(0):
                    stop = _died(proc)
                    break
                continue
            try:
                message = receiver.recv()
            except EOFError:
                stop = _died(proc)
                break
            if message[0] == "iteration":
                if on_iteration is not None:
                    on_iteration(message[1])
            elif message[0] == "error":
                raise message[1]
            elif message[0] == "stop":  # nothing that would be ready in time, or past a budget
                stop = message[1]
                break
            else:  # "done": the outcome, its e-graphs still pickled
                outcome = message[1]
                outcome.parts = receiver.recv_bytes()
                outcome.peak_rss = max(outcome.peak_rss, child_peak) + own
                stop = None
                break
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        receiver.close()
    return outcome, stop


def _speculation_worker(
    run: _Speculation, state: _RunState, deliver_by: float, allowance: int, conn
) -> None:
    global _speculative_child
    _speculative_child = True
    _die_with_parent()
    state.peak_footprint = _footprint()

    def report(stats: IterationStats) -> None:
        conn.send(("iteration", stats))

    def deliver(outcome: _Outcome, payload: bytes) -> None:
        outcome.parts = b""  # the e-graphs go as raw bytes, not pickled a second time
        conn.send(("done", outcome))
        conn.send_bytes(payload)

    try:
        reason, state = _run(
            run.base,
            replace(run.budget, memory_bytes=max(1, allowance)),
            report=report,
            started=run.started,
            export_scale=run.export_scale,
            state=state,
            deliver_by=deliver_by,
        )
        if reason is StopReason.NODES and state.overshot:  # past the budget; the parent's is not
            conn.send(("stop", reason))
            return
        if reason is StopReason.TIME:
            outcome, stop = _speculate(
                run, state, deliver_by=deliver_by, allowance=allowance, on_iteration=report
            )
            if outcome is not None:
                assert isinstance(outcome.parts, bytes)  # as received from its own child
                deliver(outcome, outcome.parts)
                return
            reason = stop or reason
        now = time.perf_counter()
        export_s, after_s = _export_seconds(state.history[-1].enodes, run.export_scale)
        if (
            now + export_s >= deliver_by
            or now + export_s + after_s >= run.started + run.budget.seconds
        ):
            conn.send(("stop", StopReason.TIME))  # too late, whatever else stopped it
            return
        outcome = _export_outcome(run.base, run.problems, reason, state)
        deliver(outcome, pickle.dumps(outcome.parts, pickle.HIGHEST_PROTOCOL))
    except BaseException as e:  # the parent raises it: a shape conflict must not be lost
        try:
            conn.send(("error", e))
        except Exception:
            conn.send(("error", EGraphError(f"speculative saturation failed: {e!r}")))


def _died(proc) -> StopReason:
    """Why a speculative child that ended without a word stopped: killed by a signal (the
    system's memory limit is the likely one: this process keeps its e-graph, as at a budget),
    or a bug (raised)."""
    proc.join()
    if proc.exitcode is not None and proc.exitcode < 0:
        return StopReason.MEMORY
    raise EGraphError(f"a speculative saturation child died (exit code {proc.exitcode})")


def _die_with_parent() -> None:
    """A speculative child's own children hold nothing its parent can use: when the parent
    kills it, they go too (Linux; elsewhere they end at their deadline)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------------------------
# the isolated probe
# --------------------------------------------------------------------------------------------


def _probe_worker(
    problems: Sequence[_Problem],
    machine: Machine,
    budget: Budget,
    base: _Base,
    degrees: Sequence[int],
    export_scale: float,
    conn,
) -> None:
    _start(base, problems, machine, budget, degrees)

    def report(stats: IterationStats) -> None:
        conn.send(("iteration", stats.iteration, stats.enodes))

    reason, state = _run(base, budget, report=report, export_scale=export_scale)
    conn.send(("done", reason.name, len(state.history)))


def _probe_in_child(
    problems: Sequence[_Problem],
    machine: Machine,
    budget: Budget,
    base: _Base,
    degrees: Sequence[int],
    export_scale: float = 1.0,
) -> tuple[int, StopReason | None]:
    """Runs the iterations in a child process under hard time and memory limits; returns how
    many iterations finished within them and, if a limit was hit, which."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_probe_worker,
        args=(problems, machine, budget, base, degrees, export_scale, child),
    )
    proc.start()
    child.close()
    done = 0
    reason: StopReason | None = None
    deadline = time.monotonic() + budget.seconds
    try:
        while True:
            if parent.poll(0.05):
                try:
                    msg = parent.recv()
                except EOFError:
                    break
                if msg[0] == "iteration":
                    done = msg[1]
                else:
                    return msg[2], StopReason[msg[1]]
            if time.monotonic() > deadline:
                reason = StopReason.TIME
                break
            if _child_rss(proc.pid) > budget.memory_bytes:
                reason = StopReason.MEMORY
                break
            if not proc.is_alive() and not parent.poll(0):
                break
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
    if reason is None:
        raise EGraphError(f"the saturation worker died (exit code {proc.exitcode})")
    return done, reason


def _child_rss(pid: int | None) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, TypeError):
        return 0


__all__ = [
    "Budget",
    "IterationStats",
    "Saturation",
    "ShapeConflictError",
    "StopReason",
    "pcg_program",
    "saturate",
    "saturate_together",
    "warm_up",
    "warm_up_in_background",
]
