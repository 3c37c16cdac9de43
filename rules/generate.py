"""The rule-generation job: enumerate, pair, prune, lift, verify.

1. Enumerate every PCG up to ``max_ops`` operators, one shard per first operator, in parallel;
   each finished shard is saved in the work directory, so an interrupted run resumes.
2. Pair graphs with equal fingerprints (and equal full values) into candidate rules.
3. Prune, smallest first: drop candidates equal to a kept one up to renaming or implied by the
   kept ones (a rewrite chain at the enumeration's instance, :mod:`pcgopt.rules.rewriting`).
4. Lift each kept candidate to a general rule (degree ``k``, lettered sizes) and verify it, in
   parallel; verdicts are saved in the work directory too.
5. A candidate dropped because of a chain through a rule that then failed verification is
   taken up again (steps 3-5) until nothing changes.
6. Proved rules that move a layout through a concat of two tensors are widened to every
   arity the e-graph builds (:mod:`pcgopt.rules.arity`) and verified again.
7. With ``Config.nested``, a one-operator family's proved splits of its operator are composed
   into splits two ways at once (:mod:`pcgopt.rules.nesting`), verified again, and those
   are the family's rules.

Only proved rules are written. The output depends only on the configuration: every step runs
in a fixed order, parallel results are sorted before use, and Z3's limits count its work, not
wall time (:mod:`pcgopt.verify.limits`), so a proof does not fail on a loaded machine. Only a
query stopped by the wall-clock cap beside that limit could differ; the job counts them.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pcgopt.progress import Progress
from pcgopt.rewrite import Rule, Sym, Term, dump_rules, operators_of, walk
from pcgopt.rules.arity import widenings
from pcgopt.rules.candidates import (
    Candidate,
    candidates,
    canonical_text,
    generality,
    generalizes,
    instance_of,
    kind,
    lift,
    lifts,
    merge_identities,
    readable,
)
from pcgopt.rules.enumerate import Config, Enumerator, ShardResult, fingerprint
from pcgopt.rules.nesting import nestings
from pcgopt.rules.rewriting import Evaluator, Implication, RuleIndex, side_size
from pcgopt.workers import imap_unordered

FILE_VERSION = 1
#: Seconds of Z3 work (:mod:`pcgopt.verify.limits`) for the conflict check of a refuted
#: candidate: do the axioms prove the false rule anyway? 96% of the proofs of the matrix preset
#: need no more (measured on 506 proofs); the refuted candidates' checks were a third of the
#: job's verification time at half a second of wall time.
CONFLICT_TIMEOUT_S = 0.25


class AxiomConflictError(ValueError):
    """The axioms prove a rule that the reference evaluator refutes: an axiom is wrong, and no
    proof made from them can be trusted until it is found."""


@dataclass
class Stats:
    """What a run did, for the report."""

    graphs: int = 0
    visited: int = 0
    candidates: int = 0
    not_general: int = 0
    too_large: int = 0
    #: With ``Config.second_degree``: candidates without both ``k`` and ``j`` (not kept).
    not_two_degrees: int = 0
    pruned_renaming: int = 0
    pruned_implied: int = 0
    pruned_redundant: int = 0
    #: Implication questions that ran out of their work bound (their candidate is kept for proof).
    implication_exhausted: int = 0
    verified: int = 0
    proved: int = 0
    refuted: int = 0
    unknown: int = 0
    rounds: int = 0
    #: Rules made by widening a proved rule to a concat of 3 or more inputs, and proved
    #: (:mod:`pcgopt.rules.arity`).
    widened: int = 0
    #: With ``Config.nested``: two-level splits composed and proved (:mod:`pcgopt.rules.nesting`).
    nested: int = 0
    #: Verdicts that Z3's wall-clock cap, not its work limit, decided (the file may then differ
    #: on another machine or load; :mod:`pcgopt.verify.limits`).
    clock_stopped: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


def code_key() -> str:
    """A hash of pcgopt's sources: results cached by another version are not reused."""
    h = hashlib.sha1()
    root = Path(__file__).resolve().parent.parent
    for folder in ("pcgopt", "rules", "verify"):
        for f in sorted((root / folder).rglob("*.py")):
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def config_key(config: Config) -> str:
    return hashlib.sha1((repr(config) + code_key()).encode()).hexdigest()[:12]


# -- step 1 -------------------------------------------------------------------------------------


def _run_shard(args: tuple[Config, int, str | None]) -> tuple[int, ShardResult]:
    config, shard, cache = args
    if cache and Path(cache).exists():
        return shard, pickle.loads(Path(cache).read_bytes())
    result = Enumerator(config).run(shard)
    if cache:
        tmp = Path(cache + ".tmp")
        tmp.write_bytes(pickle.dumps(result))
        tmp.replace(cache)
    return shard, result


def enumerate_all(config: Config, workers: int, work_dir: Path | None) -> list[ShardResult]:
    n = Enumerator(config).shards()
    key = config_key(config)
    jobs = [
        (config, s, str(work_dir / f"enum-{key}-{s:03d}.pkl") if work_dir else None)
        for s in range(n)
    ]
    progress = Progress(n, "enumerating")
    results: dict[int, ShardResult] = {}
    for shard, r in imap_unordered(_run_shard, jobs, workers):
        results[shard] = r
        progress.update()
    progress.close()
    return [results[s] for s in range(n)]


# -- step 3 -------------------------------------------------------------------------------------


class Pruner:
    """Drops candidates equal to a kept rule up to renaming, or implied by kept rules, at the
    enumeration's instance (its fingerprint cache is kept across calls)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        inst, values = instance_of(config)
        self.evaluator = Evaluator(inst, values, fingerprint)
        self.index = RuleIndex()
        self.seen: set[str] = set()

    def admit(self, c: Candidate, rules: Sequence[Rule]) -> None:
        """A proved candidate: ``rules[0]`` is the lift that was proved; all of ``rules`` (its
        other lifts) count as seen."""
        self.seen.update(canonical_text(r) for r in rules)
        if len(c.lhs) == 1:
            self.index.add(c.text, c.lhs[0], c.rhs[0], rules[0].inputs)

    def prune(
        self,
        cands: Sequence[Candidate],
        plain: Mapping[str, Rule],
        alternatives: dict[str, tuple[Rule, ...]],
        stats: Stats,
        label: str,
    ) -> tuple[list[Candidate], dict[str, set[str]]]:
        """Kept candidates and, for each dropped by implication, the candidates it used. The
        lifts of kept ones are computed into ``alternatives`` (only now: refining letters costs
        more than pruning), and the most general is admitted into a copy of the index
        (tentatively: it is not proved yet)."""
        index = self.index.copy()
        seen = set(self.seen)
        search = Implication(index, self.evaluator)
        kept: list[Candidate] = []
        used_by: dict[str, set[str]] = {}
        progress = Progress(len(cands), label)
        for c in cands:
            progress.update()
            canon = canonical_text(plain[c.text])
            if canon in seen:
                stats.pruned_renaming += 1
                continue
            ok, used = search.implied(c.lhs, c.rhs)
            if ok:
                used_by[c.text] = used
                stats.pruned_implied += 1
                continue
            if c.text not in alternatives:
                alternatives[c.text] = lifts(c, self.config)
            general = canonical_text(alternatives[c.text][0])
            if general in seen:
                stats.pruned_renaming += 1
                continue
            kept.append(c)
            seen.update((canon, general))
            if len(c.lhs) == 1:
                index.add(c.text, c.lhs[0], c.rhs[0], alternatives[c.text][0].inputs)
        progress.close()
        stats.implication_exhausted += search.exhausted
        return kept, used_by

    def minimize(self, proved: Sequence[tuple[Candidate, Rule]], stats: Stats) -> list[Candidate]:
        """Drops proved rules that the others imply (a small rule found before the general one
        that covers it): most specific first, each checked against the rules still kept, so
        what is dropped always follows from what stays."""
        index = RuleIndex()
        for c, rule in proved:
            if len(c.lhs) == 1:
                index.add(c.text, c.lhs[0], c.rhs[0], rule.inputs)
        search = Implication(index, self.evaluator)
        order = sorted(proved, key=lambda cr: (*_specificity(cr[1]), -cr[0].size, cr[0].text))
        dropped: set[str] = set()
        progress = Progress(len(order), "minimizing")
        for c, _ in order:
            progress.update()
            index.disabled.add(c.text)
            ok, _used = search.implied(c.lhs, c.rhs)
            if ok:
                dropped.add(c.text)
                stats.pruned_redundant += 1
            else:
                index.disabled.discard(c.text)
        progress.close()
        stats.implication_exhausted += search.exhausted
        return [c for c, _ in proved if c.text not in dropped]


def _specificity(rule: Rule) -> tuple[int, int]:
    """Sorts the more specific of two rules first: fewer tensors, fewer letters."""
    tensors, letters = generality(rule)
    return (-tensors, -letters)


# -- step 4 -------------------------------------------------------------------------------------


def _verify(args: tuple[list[dict], float]) -> dict:
    """Verifies the lifts of one candidate, most general first, up to the first proved; the
    verdict says which lift (``lift``) it is about."""
    from pcgopt.verify import verify_rule

    records, timeout = args
    first = None
    for i, record in enumerate(records):
        rule = Rule.from_dict(record)
        try:
            # Six concrete instances are the independent check of each proof. The conflict check
            # on a refuted candidate (do the axioms prove it anyway?) gets CONFLICT_TIMEOUT_S.
            v = verify_rule(rule, timeout, checks=6, conflict_timeout_s=CONFLICT_TIMEOUT_S)
            verdict = {"rule": rule.name, "lift": i, **v.to_dict()}
        except Exception as e:  # one bad rule must not stop the job; it is simply not shipped
            verdict = {
                "rule": rule.name,
                "lift": i,
                "status": "unknown",
                "notes": [f"{type(e).__name__}: {e}"],
            }
        if verdict["status"] == "proved" and verdict.get("degrees") != "all":
            # Shapes shown only for power-of-two degrees: not shipped (the optimizer may meet
            # any degree the machine allows).
            verdict["status"] = "unknown"
            verdict["notes"] = [*verdict.get("notes", []), "proved only for powers of two"]
        if verdict["status"] == "proved":
            return verdict
        first = first or verdict
    assert first is not None
    return first


def verify_all(
    alternatives: Sequence[tuple[Rule, ...]], workers: int, timeout: float, work_dir: Path | None
) -> dict[str, dict]:
    """Verdicts by rule name; each entry of ``alternatives`` is one candidate's lifts."""
    cache_path = work_dir / "verdicts.jsonl" if work_dir else None
    cache: dict[str, dict] = {}
    if cache_path and cache_path.exists():
        for line in cache_path.read_text().splitlines():
            rec = json.loads(line)
            cache[rec["key"]] = rec["verdict"]
    version = code_key()
    keys = {
        alts[0].name: " || ".join(canonical_text(r) for r in alts) + f" @{timeout} #{version}"
        for alts in alternatives
    }
    todo = [alts for alts in alternatives if keys[alts[0].name] not in cache]
    progress = Progress(len(todo), "verifying")
    out = {a[0].name: cache[keys[a[0].name]] for a in alternatives if keys[a[0].name] in cache}
    jobs = [([r.to_dict() for r in alts], timeout) for alts in todo]
    with open(cache_path, "a") if cache_path else _NullFile() as f:
        for v in imap_unordered(_verify, jobs, workers):
            out[v["rule"]] = v
            progress.update(v["status"])
            f.write(json.dumps({"key": keys[v["rule"]], "verdict": v}) + "\n")
            f.flush()
    progress.close()
    return out


class _NullFile:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, _):
        return 0

    def flush(self):
        return None


# -- the job --------------------------------------------------------------------------------


@dataclass
class Generated:
    rules: list[Rule]
    verdicts: dict[str, dict]
    stats: Stats
    found_with: dict[str, int]
    #: Every rule that was verified, proved or not, by name (for the report).
    verified: dict[str, Rule] = field(default_factory=dict)


def generate(
    config: Config,
    *,
    workers: int = 1,
    work_dir: Path | None = None,
    timeout: float = 10.0,
    max_rounds: int = 4,
) -> Generated:
    """The job (see the module docstring). Candidates are handled level by level in size:
    pruned against the rules already proved at smaller sizes (and this level's kept ones), then
    verified in parallel, so that pruning rests on proved rules."""
    stats = Stats()
    if work_dir:
        work_dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    results = enumerate_all(config, workers, work_dir)
    graphs, identities = merge_identities(results)
    stats.graphs = sum(1 for g in graphs if not g.renamed)
    stats.visited = sum(r.visited for r in results)
    stats.seconds["enumerate"] = time.perf_counter() - t

    t = time.perf_counter()
    cands = candidates(config, graphs, identities, fingerprint)
    del graphs, identities, results
    if config.max_rule_ops is not None:
        small = [c for c in cands if c.size <= config.max_rule_ops]
        stats.too_large = len(cands) - len(small)
        cands = small
    stats.candidates = len(cands)
    plain: dict[str, Rule] = {}
    two_degrees = config.second_degree is not None
    two_degree_seen: set[str] = set()
    for c in cands:
        rule = lift(c, config)
        if two_degrees and not _two_degrees(rule):
            # k, j or k*j alone is an instance of a one-degree rule, and k with k*j one of a
            # rule in k and j (j := k*j).
            stats.not_two_degrees += 1
        elif two_degrees and _sides_key(rule, swap_degrees=True) in two_degree_seen:
            # k and j swapped: the same rule.
            stats.pruned_renaming += 1
        elif generalizes(rule):
            if two_degrees:
                two_degree_seen.add(_sides_key(rule, swap_degrees=False))
            plain[c.text] = rule
        else:
            stats.not_general += 1
    general = [c for c in cands if c.text in plain]
    # At equal size the more general candidate first, so that its instances are found implied.
    general.sort(key=lambda c: (c.size, generality(plain[c.text]), c.sort_key()))
    stats.seconds["pair"] = time.perf_counter() - t

    pruner = Pruner(config)
    alternatives: dict[str, tuple[Rule, ...]] = {}
    #: The rule in force for each kept candidate: its most general lift, or after verification
    #: the lift that was proved.
    lifted: dict[str, Rule] = {}
    proved: list[Candidate] = []
    verdicts: dict[str, dict] = {}
    prune_time = verify_time = 0.0
    for level in sorted({c.size for c in general}):
        pending = [c for c in general if c.size == level]
        for round_ in range(max_rounds):
            stats.rounds = max(stats.rounds, round_ + 1)
            t = time.perf_counter()
            kept, used_by = pruner.prune(
                pending, plain, alternatives, stats, f"pruning size {level}"
            )
            prune_time += time.perf_counter() - t
            t = time.perf_counter()
            results_v = verify_all([alternatives[c.text] for c in kept], workers, timeout, work_dir)
            verify_time += time.perf_counter() - t
            failed = set()
            for c in kept:
                alts = alternatives[c.text]
                v = results_v[alts[0].name]
                verdicts[alts[0].name] = v
                lifted[c.text] = alts[v.get("lift", 0)]
                if v["status"] == "proved":
                    proved.append(c)
                    if v.get("lift", 0):
                        # Only a narrower lift holds: what was pruned through the general one
                        # is taken up again.
                        failed.add(c.text)
                    pruner.admit(c, (lifted[c.text], *alts))
                else:
                    failed.add(c.text)
            # Take up again what was dropped through a rule of this level that is not proved.
            pending = [c for c in pending if c.text in used_by and used_by[c.text] & failed]
            if not pending:
                break
    t = time.perf_counter()
    proved = pruner.minimize([(c, lifted[c.text]) for c in proved], stats)
    prune_time += time.perf_counter() - t
    stats.seconds["prune"] = prune_time
    stats.seconds["verify"] = verify_time
    rules = [readable(lifted[c.text]) for c in proved]
    found_with = {lifted[c.text].name: c.size for c in proved}
    verified = {r.name: r for r in lifted.values() if r.name in verdicts}

    # Step 6: the proved rules about layouts through a concat, at every wider arity.
    t = time.perf_counter()
    wide = [(w, r) for r in sorted(rules, key=canonical_text) for w in widenings(r)]
    verdicts_w = verify_all([(w,) for w, _ in wide], workers, timeout, work_dir)
    for w, r in wide:
        v = verdicts[w.name] = verdicts_w[w.name]
        verified[w.name] = w
        if v["status"] == "proved":
            rules.append(w)
            found_with[w.name] = found_with[r.name]
            stats.widened += 1
    stats.seconds["widen"] = time.perf_counter() - t
    if config.nested:
        # Step 7: the family's rules are the two-level splits its one-level ones compose into.
        t = time.perf_counter()
        nested = nestings(rules)
        verdicts_n = verify_all([(r,) for r in nested], workers, timeout, work_dir)
        rules = []
        for r in nested:
            v = verdicts[r.name] = verdicts_n[r.name]
            verified[r.name] = r
            if v["status"] == "proved":
                rules.append(r)
                found_with[r.name] = side_size(r.lhs) + side_size(r.rhs)
        stats.nested = len(rules)
        stats.seconds["nest"] = time.perf_counter() - t
    stats.verified = len(verdicts)
    conflicts = [v for v in verdicts.values() if v.get("axiom_conflict")]
    if conflicts:
        raise AxiomConflictError(
            f"the axioms prove {len(conflicts)} rule(s) that the reference evaluator refutes, so "
            "an axiom is wrong (the unsat core of proving the rule names the suspects; "
            "python -m pcgopt.verify checks a rule file): "
            + "; ".join(f"{v['rule']}: {v['counterexample']}" for v in conflicts[:3])
        )
    stats.clock_stopped = sum(1 for v in verdicts.values() if v.get("clock_stopped"))
    stats.proved = sum(1 for v in verdicts.values() if v["status"] == "proved")
    stats.refuted = sum(1 for v in verdicts.values() if v["status"] == "refuted")
    stats.unknown = sum(1 for v in verdicts.values() if v["status"] == "unknown")
    rules.sort(key=lambda r: (kind(r), canonical_text(r)))
    return Generated(rules, verdicts, stats, found_with, verified)


def _two_degrees(rule: Rule) -> bool:
    """Whether a rule's parallel operators have both degree symbols ``k`` and ``j``."""
    degrees = {
        t.params["degree"]
        for side in (rule.lhs, rule.rhs)
        for e in side
        for t in walk(e)
        if isinstance(t, Term) and "degree" in t.params
    }
    return Sym("k") in degrees and Sym("j") in degrees


_SWAP = {"k*j": "k*j", "k": "j", "j": "k"}


def _sides_key(rule: Rule, *, swap_degrees: bool) -> str:
    """The rule's sides in a fixed order, with the degrees ``k`` and ``j`` swapped or not."""
    text = "|".join(sorted((repr(rule.lhs), repr(rule.rhs))))
    if not swap_degrees:
        return text
    return re.sub(r"degree=(k\*j|k|j)\b", lambda m: "degree=" + _SWAP[m.group(1)], text)


def rule_rank(rule: Rule) -> int:
    """The highest rank of a tensor of ``rule``: its inputs' and what its operators compute
    (an embedding of [B, S] indices computes [B, S, H])."""
    from pcgopt.verify.logic import rule_ranks

    return max(rule_ranks(rule).values(), default=0)  # the input variables included


def merge(
    gens: Sequence[Generated],
    min_rank: int = 0,
    prefix: str = "",
    uses: frozenset[str] | None = None,
) -> Generated:
    """The proved rules of several runs (a preset's families) as one set: each rule once (by
    canonical text, the first run's), and only rules with a tensor (input or computed, see
    :func:`rule_rank`) of rank ``min_rank`` or more and, with ``uses``, one of those operators
    on a side, named ``prefix`` + their name. Statistics
    are summed. (A rule's name hashes its untyped text, so the same text at another rank, in
    another preset's file, has the same name: the prefix keeps the names of every shipped file
    distinct.)"""
    stats = Stats()
    rules: dict[str, Rule] = {}
    taken: set[str] = set()
    out = Generated([], {}, stats, {})
    for gen in gens:
        for name, value in asdict(gen.stats).items():
            if name == "seconds":
                for phase, sec in value.items():
                    stats.seconds[phase] = stats.seconds.get(phase, 0.0) + sec
            elif name == "rounds":
                stats.rounds = max(stats.rounds, value)
            else:
                setattr(stats, name, getattr(stats, name) + value)
        # The same untyped text at another rank (scale on [B, S, H] in one family, on
        # [B, h, S, d] in another) has the same name: the later one gets a suffix.
        renamed: dict[str, str] = {}
        for r in gen.rules:
            if rule_rank(r) >= min_rank and (uses is None or operators_of((*r.lhs, *r.rhs)) & uses):
                text = canonical_text(r)
                if text in rules:
                    continue
                name = prefix + r.name
                n = 2
                while name in taken:
                    name, n = f"{prefix}{r.name}_{n}", n + 1
                taken.add(name)
                renamed[r.name] = name
                rules[text] = replace(r, name=name)
        for mine, theirs in (
            (out.verdicts, gen.verdicts),
            (out.found_with, gen.found_with),
            (out.verified, gen.verified),
        ):
            for k, v in theirs.items():
                key = renamed.get(k, prefix + k)
                if k in renamed or key not in mine:  # never another family's record
                    mine[key] = v
    out.rules = sorted(rules.values(), key=lambda r: (kind(r), canonical_text(r)))
    return out


def _generator(config: Config) -> dict:
    """The settings a file was generated with (``max_rule_ops`` only where it was set; a
    one-operator family says so instead of giving ``max_ops``, which it does not use)."""
    limit = {} if config.max_rule_ops is None else {"max_rule_ops": config.max_rule_ops}
    size = {"one_op": True} if config.one_op else {"max_ops": config.max_ops}
    return {
        **size,
        **limit,
        "degree": config.degree,
        **({} if config.second_degree is None else {"second_degree": config.second_degree}),
        **({"nested": True} if config.nested else {}),
        "ops": list(config.ops),
        "inputs": {s.name: repr(s.shape) for s in config.inputs},
        "file_version": FILE_VERSION,
    }


def rule_file(gen: Generated, config: Config | Sequence[Config]) -> str:
    """The shipped file: only proved rules, each with its kind, size, verdict and axioms.
    With several configurations (a preset's families, :func:`merge`), the header lists each."""
    extra = {}
    for r in gen.rules:
        v = gen.verdicts[r.name]
        extra[r.name] = {
            "kind": kind(r),
            "ops": gen.found_with[r.name],
            "verdict": {
                "status": v["status"],
                "degrees": v["degrees"],
                "axioms": list(v["axioms"]),
            },
        }
    if isinstance(config, Config):
        generator: dict | list = _generator(config)
    else:
        generator = [_generator(c) for c in config]
    body = dump_rules(gen.rules, extra)
    # The generator settings go first, on one line, after the format marker.
    return body.replace('"rules": [', f'"generated_by": {json.dumps(generator)}, "rules": [', 1)


def stats_dict(stats: Stats) -> dict:
    return asdict(stats)
