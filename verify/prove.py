"""``verify_rule``: prove a rewrite rule, or refute it with a counterexample.

A rule ``lhs => rhs`` holds when, for all inputs and symbol values that make both sides
well-formed, the outputs have the same parallel shapes and the same values. The proof has two
halves, each about one of these:

* values (:mod:`verify.logic`): erase the parallel operators (they do not change the tensor a
  value stands for) and prove the remaining terms equal in Z3 from the algebraic axioms
  (:mod:`verify.axioms`); the unsat core names the axioms used;
* parallel shapes (:mod:`verify.shapes`): in the symbolic model derived from the operator specs,
  prove that both sides well-formed implies equal shapes, for every value of every degree.

This split is sound because of two facts about the reference evaluator that the test suite
checks for every operator: a parallelization operator's logical result is its input (its
sum, for StackPartial), and a compute operator's sharded result stands for its numpy result on
the logical inputs, for every legal distribution.

Independently, concrete instances are evaluated on the reference evaluator. A difference
refutes the rule with a counterexample; a difference on a rule Z3 proved means an axiom is
wrong, and the verdict says so (``axiom_conflict``). That is what keeps the verifier from being
fooled by its own axioms.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import z3

from pcgopt.errors import PCGError
from pcgopt.rewrite import Instance, Rule, Term, infer_side, int_symbols, real_symbols, walk
from pcgopt.shapes import ParallelTensorShape
from pcgopt.verify import limits
from pcgopt.verify.axioms import AXIOMS, Axiom, SizeAxiom
from pcgopt.verify.instances import SCALE, compare, instances, structural_assignments
from pcgopt.verify.logic import SIZE, TENSOR, Encoder, rule_ranks
from pcgopt.verify.shapes import Unsupported, new_model, side, uses_micro_batches

Status = Literal["proved", "refuted", "unknown"]
POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Verdict:
    """What the verifier concluded about one rule."""

    rule: str
    status: Status
    #: For a proof: ``"all"`` degrees, or ``"powers of two up to 64"`` when only that was shown.
    degrees: str | None = None
    #: Axioms the proof drew on: a minimal unsat core over the algebraic axioms, then
    #: the erasures of the parallel operators the rule uses.
    axioms: tuple[str, ...] = ()
    #: For a refutation: where the sides differ (inputs, symbols, and what differs).
    counterexample: str | None = None
    #: Z3 proved the values equal but the evaluator disagrees: an axiom is wrong.
    axiom_conflict: bool = False
    #: Refuted because no distribution makes both sides well-formed (rather than because they
    #: compute different things): in pcgopt's typed semantics the rule never applies.
    never_well_formed: bool = False
    #: Z3's wall-clock cap, not its work limit, ended a check (:mod:`pcgopt.verify.limits`):
    #: on a quieter machine the verdict may differ.
    clock_stopped: bool = False
    #: Concrete instances evaluated on the reference evaluator.
    checked: int = 0
    seconds: float = 0.0
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# the value half
# --------------------------------------------------------------------------------------------


@dataclass
class Prover:
    """Z3 encodings of the axioms, built once and shared by every rule checked with it."""

    axioms: Sequence[Axiom | SizeAxiom] = AXIOMS
    encoder: Encoder = field(default_factory=Encoder)
    _formulas: dict[str, tuple[z3.BoolRef, frozenset[str]]] = field(default_factory=dict)
    #: Each guarded axiom as SMT-LIB text (its declarations, its assertion): printing the
    #: axioms is most of a query's text and took a third of the proving time when redone per rule.
    _smt2: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for a in self.axioms:
            if isinstance(a, Axiom) and a.erasure:
                continue
            formula = self._quantified(a)
            self._formulas[a.name] = (formula, _functions(formula))

    def _symbols(self, rule: Rule, prefix: str = "") -> dict[str, z3.ArithRef]:
        reals = real_symbols((*rule.lhs, *rule.rhs))
        return {
            s: (z3.Real(prefix + s) if s in reals else z3.Int(prefix + s))
            for s in sorted(rule.symbols)
        }

    def _quantified(self, a: Axiom | SizeAxiom) -> z3.BoolRef:
        """The axiom for all tensors of its declared shapes (see the axioms module)."""
        rule = a.rule
        tensors = {v: z3.Const(f"{a.name}.{v}", TENSOR) for v in rule.inputs}
        symbols = self._symbols(rule, f"{a.name}.")
        for left, _, right in a.parsed_conditions:
            for name in sorted((set(int_symbols(left)) | set(int_symbols(right))) - set(symbols)):
                symbols[name] = z3.Int(f"{a.name}.{name}")
        enc_int = lambda v: self.encoder._int(v, tensors, symbols)  # noqa: E731
        ranks = _axiom_ranks(a)
        lhs = [self.encoder.encode(e, tensors, symbols, ranks) for e in rule.lhs]
        if isinstance(a, SizeAxiom):
            trigger = SIZE(lhs[0], z3.IntVal(a.dim))
            body = trigger == enc_int(a.parsed_value)
            candidates = [trigger]
        else:
            rhs = [self.encoder.encode(e, tensors, symbols, ranks) for e in rule.rhs]
            body = z3.And([a_ == b_ for a_, b_ in zip(lhs, rhs, strict=True)])
            candidates = [lhs[0], rhs[0]]
        guards = _declaration_guards(rule, tensors)
        guards += [
            enc_int(left) == enc_int(right) if rel == "==" else enc_int(left) != enc_int(right)
            for left, rel, right in a.parsed_conditions
        ]
        body = z3.Implies(z3.And(guards), body)
        variables = [*tensors.values(), *symbols.values()]
        patterns = [
            t for t in candidates if not z3.is_const(t) and all(_occurs(v, t) for v in variables)
        ]
        return (
            z3.ForAll(variables, body, patterns=patterns)
            if patterns
            else z3.ForAll(variables, body)
        )

    def prove_values(self, rule: Rule, timeout_s: float) -> tuple[bool | None, tuple[str, ...]]:
        """(True, axioms) when Z3 proves the erased sides equal; (None, ()) when it cannot."""
        tensors = {v: z3.Const(v, TENSOR) for v in rule.inputs}
        symbols = self._symbols(rule)
        try:
            ranks = rule_ranks(rule)
        except (PCGError, KeyError, TypeError, ValueError):
            return None, ()
        self.encoder.erased.clear()
        lhs = [self.encoder.encode(e, tensors, symbols, ranks) for e in rule.lhs]
        rhs = [self.encoder.encode(e, tensors, symbols, ranks) for e in rule.rhs]
        if all(a.eq(b) for a, b in zip(lhs, rhs, strict=True)):
            return True, ()
        facts = list(_declaration_guards(rule, tensors))
        # Every size of every subterm is a term Z3 can reason about (E-matching only fires size
        # axioms on terms that exist); each is at least 1 wherever the rule applies.
        encoded = {}
        for e in (*rule.lhs, *rule.rhs):
            for sub in walk(e):
                if isinstance(sub, Term) and sub not in encoded:
                    encoded[sub] = self.encoder.encode(sub, tensors, symbols, ranks)
        facts += [
            SIZE(t, z3.IntVal(d)) >= 1 for sub, t in encoded.items() for d in range(ranks[sub])
        ]
        goal = z3.And([a == b for a, b in zip(lhs, rhs, strict=True)])
        facts.append(z3.Not(goal))
        relevant = _relevant(_functions(goal), {n: fs for n, (_, fs) in self._formulas.items()})
        # The query is handed to Z3 as text, parsed into a fresh context: in the shared context
        # (even through ``translate``) Z3's search, and so the unsat core recorded as the rule's
        # axioms, depends on what the process built before; the same flags must write the same
        # rule file.
        text = _smt2_text([*map(_smt2_pieces, facts), *map(self._guarded_smt2, relevant)])
        ctx = z3.Context()
        s = z3.Solver(ctx=ctx)
        s.add(z3.parse_smt2_string(text, ctx=ctx))
        assumptions = (z3.Bool(f"axiom:{n}", ctx) for n in relevant)
        if limits.check(s, timeout_s, *assumptions) != z3.unsat:
            return None, ()
        return True, tuple(sorted(str(c).removeprefix("axiom:") for c in s.unsat_core()))

    def _guarded_smt2(self, name: str) -> tuple[tuple[str, ...], str]:
        if name not in self._smt2:
            guarded = z3.Implies(z3.Bool(f"axiom:{name}"), self._formulas[name][0])
            self._smt2[name] = _smt2_pieces(guarded)
        return self._smt2[name]


def _smt2_pieces(assertion: z3.BoolRef) -> tuple[tuple[str, ...], str]:
    """An assertion as a solver prints it: its declarations (sorts, then functions, in order of
    first use) and its assertion. A solver prints each command from the first column and
    breaks a long one over indented lines, and it prints each assertion on its own."""
    printer = z3.Solver()
    printer.add(assertion)
    commands = re.split(r"\n(?=\S)", printer.sexpr())
    k = next((i for i, c in enumerate(commands) if not c.startswith("(declare-")), len(commands))
    return tuple(commands[:k]), "\n".join(commands[k:])


def _smt2_text(pieces: Sequence[tuple[tuple[str, ...], str]]) -> str:
    """The text a solver holding the assertions prints, from their pieces (`_smt2_pieces`):
    every sort's declaration, then every function's, each once and in order of first use, then
    the assertions in order."""
    declarations = dict.fromkeys(d for decls, _ in pieces for d in decls)
    ordered = sorted(declarations, key=lambda d: not d.startswith("(declare-sort"))
    return "\n".join(ordered) + "\n" + "".join(body for _, body in pieces)


def _axiom_ranks(a: Axiom | SizeAxiom) -> dict:
    """Ranks of an axiom's sub-expressions, read at one instance of its declarations."""
    rule = a.rule
    sizes = rule.example_sizes()
    for assignment in structural_assignments(rule, sizes, a.parsed_conditions, limit=1):
        return rule_ranks(rule, sizes=sizes, symbols=assignment)
    raise ValueError(f"axiom {a.name}: no instance of its declarations is well-formed")


def _declaration_guards(rule: Rule, tensors: Mapping[str, z3.ExprRef]) -> list[z3.BoolRef]:
    """What the declarations say: where letters agree, sizes agree; every letter is a size of at
    least 2, every number is that size."""
    guards = []
    first: dict[str, z3.ArithRef] = {}
    for name, decl in rule.inputs.items():
        for d, dim in enumerate(decl.dims):
            size = SIZE(tensors[name], z3.IntVal(d))
            if isinstance(dim, int):
                guards.append(size == dim)
            elif dim in first:
                guards.append(size == first[dim])
            else:
                first[dim] = size
                guards.append(size >= 2)
    return guards


def _functions(e: z3.ExprRef) -> frozenset[str]:
    """Names of the uninterpreted functions a Z3 expression applies."""
    out, seen, stack = set(), set(), [e]
    while stack:
        x = stack.pop()
        if x.get_id() in seen:
            continue
        seen.add(x.get_id())
        if z3.is_quantifier(x):
            stack.append(x.body())
            continue
        if z3.is_app(x) and x.decl().kind() == z3.Z3_OP_UNINTERPRETED and x.num_args() > 0:
            out.add(x.decl().name())
        stack.extend(x.children())
    return frozenset(out)


def _occurs(v: z3.ExprRef, t: z3.ExprRef) -> bool:
    if t.eq(v):
        return True
    return any(_occurs(v, c) for c in t.children())


def _relevant(
    functions: frozenset[str], axiom_functions: Mapping[str, frozenset[str]]
) -> list[str]:
    """Axioms over the functions the goal applies and those the axioms lead to (a closure), so
    that Z3 is not distracted by unrelated ones. ``size`` alone does not make an axiom relevant."""
    have = set(functions) - {"size"}
    chosen: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, used in axiom_functions.items():
            if name not in chosen and (used - {"size"}) & have:
                chosen.add(name)
                if not used <= have:
                    have |= used - {"size"}
                    changed = True
    return sorted(chosen)


# --------------------------------------------------------------------------------------------
# the shape half
# --------------------------------------------------------------------------------------------


def _micro(rule: Rule) -> bool:
    return uses_micro_batches((*rule.lhs, *rule.rhs))


def _shape_obligation(rule: Rule, bounded: bool) -> tuple[z3.Solver, object, tuple]:
    # The structure is read at the sizes the concrete instances use, so that both halves speak
    # about the same rule.
    sizes = rule.example_sizes({k: v * SCALE for k, v in rule.letter_sizes().items()})
    example = rule.example_symbols()
    m = new_model(sizes, sorted(rule.symbols), rule.input_dtypes(), micro=_micro(rule))
    l_out, l_valid = side(m, rule.lhs, example)
    r_out, r_valid = side(m, rule.rhs, example)
    s = z3.Solver()
    s.add(m.positive + l_valid + r_valid)
    if bounded:
        for f in [f for sh in m.inputs.values() for f in sh.fields()] + list(m.symbols.values()):
            s.add(z3.Or([f == p for p in POWERS_OF_TWO]))
    return s, m, (l_out, r_out)


def prove_shapes(rule: Rule, timeout_s: float = 5.0) -> tuple[str | None, Instance | None, str]:
    """``(degrees, counterexample, note)``: degrees is "all" or "powers of two up to 64" when
    both sides well-formed imply equal parallel shapes; otherwise a concrete counterexample
    (when one exists at sizes that make it real) or None."""
    try:
        s, _, _ = _shape_obligation(rule, False)
        if limits.check(s, timeout_s) == z3.unsat:
            return None, None, "the shape model has no instance with both sides well-formed"
        for bounded in (False, True):
            s, m, (l_out, r_out) = _shape_obligation(rule, bounded)
            differ = z3.Not(z3.And([a.equal(b) for a, b in zip(l_out, r_out, strict=True)]))
            s.add(differ)
            result = limits.check(s, timeout_s)
            if result == z3.unsat:
                return ("all" if not bounded else "powers of two up to 64"), None, ""
            if result == z3.sat:
                inst = _concretize(rule, m, s)
                if inst is not None and _shapes_differ(rule, inst):
                    return None, inst, "parallel shapes differ"
        return None, None, "the shape model found no proof (and no concrete counterexample)"
    except Unsupported as e:
        return None, None, f"shape model: {e}"


def _concretize(rule: Rule, m, solver: z3.Solver) -> Instance | None:
    """A concrete instance from a model of the shape obligation, with sizes scaled so that every
    degree divides them; small values preferred."""
    fields = [f for sh in m.inputs.values() for f in sh.fields()] + list(m.symbols.values())
    solver.push()
    for f in fields:
        solver.add(f <= 8)
    if solver.check() != z3.sat:
        solver.pop()
        if solver.check() != z3.sat:
            return None
    model = solver.model()
    solver.pop()
    values = [model.eval(f, model_completion=True).as_long() for f in fields]
    # Scaling every letter alike keeps the structure; this factor makes every product of
    # degrees on a dimension divide its size.
    scale = SCALE * math.prod(set(values))
    letters = {k: v * scale for k, v in rule.letter_sizes().items()}
    sizes = rule.example_sizes(letters)
    shapes = {}
    for name, sh in m.inputs.items():
        degs = [model.eval(d, model_completion=True).as_long() for d in sh.degrees]
        shapes[name] = ParallelTensorShape.of(
            sizes[name],
            rule.inputs[name].dtype,
            degrees=degs,
            copy_degree=model.eval(sh.copies, model_completion=True).as_long(),
            sum_degree=model.eval(sh.partial, model_completion=True).as_long(),
            micro=[model.eval(k, model_completion=True).as_long() for k in sh.micro_counts],
        )
    symbols = {k: model.eval(v, model_completion=True).as_long() for k, v in m.symbols.items()}
    return Instance(shapes, symbols)


def _shapes_differ(rule: Rule, inst: Instance) -> bool:
    try:
        return infer_side(rule.lhs, inst) != infer_side(rule.rhs, inst)
    except PCGError:
        return False  # the model's counterexample needs sizes no tensor has


def _never_both_well_formed(rule: Rule) -> str | None:
    """If no distribution makes both sides well-formed, a witness: an instance where the left
    side is well-formed and what goes wrong on the right."""
    try:
        s, _, _ = _shape_obligation(rule, False)
    except Unsupported:
        return None
    if limits.check(s, 5.0) != z3.unsat:
        return None
    sizes = rule.example_sizes({k: v * SCALE for k, v in rule.letter_sizes().items()})
    m2 = new_model(sizes, sorted(rule.symbols), rule.input_dtypes(), micro=_micro(rule))
    _, l_valid = side(m2, rule.lhs, rule.example_symbols())
    s2 = z3.Solver()
    s2.add(m2.positive + l_valid)
    if limits.check(s2, 5.0) != z3.sat:
        return "neither side is ever well-formed"
    inst = _concretize(rule, m2, s2)
    if inst is None:
        return "the two sides are never well-formed together"
    try:
        infer_side(rule.rhs, inst)
    except PCGError as e:
        return f"at {inst}, the left side is well-formed but the right is not: {e.message}"
    return f"the two sides are never well-formed together (e.g. at {inst})"


# --------------------------------------------------------------------------------------------
# verify_rule
# --------------------------------------------------------------------------------------------


@functools.cache
def default_prover() -> Prover:
    """The prover over all axioms (building the Z3 encodings takes a moment; done once)."""
    return Prover()


def verify_rule(
    rule: Rule,
    timeout_s: float = 10.0,
    *,
    checks: int = 12,
    seed: int = 0,
    prover: Prover | None = None,
    conflict_timeout_s: float = 2.0,
) -> Verdict:
    """Proves ``rule`` for all degrees (or powers of two up to 64), or refutes it with a
    counterexample, or says it could do neither (``unknown``). See the module docstring.
    ``timeout_s`` and ``conflict_timeout_s`` are seconds of Z3 work (:mod:`pcgopt.verify.limits`),
    not of wall time: the same rule gets the same verdict however loaded the machine is."""
    start = time.perf_counter()
    prover = prover or default_prover()
    notes: list[str] = []
    clock_stops = limits.clock_stops

    insts = instances(rule, count=checks, seed=seed)
    for k, inst in enumerate(insts):
        mismatch = compare(rule, inst, seed=seed + k)
        if mismatch is not None:
            # Would the axioms "prove" this false rule? Then one of them is wrong. A real
            # conflict shows up fast; a false rule otherwise just times out.
            proved, _ = prover.prove_values(rule, min(timeout_s, conflict_timeout_s))
            shapes_ok = "parallel shapes" not in mismatch.reason
            return Verdict(
                rule.name,
                "refuted",
                counterexample=str(mismatch),
                axiom_conflict=bool(proved and shapes_ok),
                checked=k + 1,
                seconds=time.perf_counter() - start,
            )
    if not insts:
        why = _never_both_well_formed(rule)
        if why is not None:
            return Verdict(
                rule.name,
                "refuted",
                counterexample=why,
                never_well_formed=True,
                seconds=time.perf_counter() - start,
            )
        notes.append("no concrete instance with both sides well-formed was found")

    degrees, shape_cex, shape_note = prove_shapes(rule, timeout_s=min(timeout_s, 5.0))
    if shape_cex is not None:
        l_shapes, r_shapes = infer_side(rule.lhs, shape_cex), infer_side(rule.rhs, shape_cex)
        return Verdict(
            rule.name,
            "refuted",
            counterexample=f"at {shape_cex}: parallel shapes differ: {list(l_shapes)} on the "
            f"left, {list(r_shapes)} on the right",
            checked=len(insts),
            seconds=time.perf_counter() - start,
        )
    if shape_note:
        notes.append(shape_note)

    proved, used = prover.prove_values(rule, timeout_s)
    erased = tuple(
        sorted(f"{op}_keeps_value" for op in prover.encoder.erased if op != "stack_partial")
    )
    if "stack_partial" in prover.encoder.erased:
        erased += ("stack_partial_is_sum",)
    clock_stopped = limits.clock_stops > clock_stops
    if clock_stopped:
        notes.append(
            f"Z3 was stopped by the wall-clock cap ({limits.WALL_CAP_FACTOR}x its limit) before "
            "its work limit: on a quieter machine the verdict may differ"
        )
    if proved and degrees is not None and insts:
        return Verdict(
            rule.name,
            "proved",
            degrees=degrees,
            axioms=used + erased,
            clock_stopped=clock_stopped,
            checked=len(insts),
            seconds=time.perf_counter() - start,
            notes=tuple(notes),
        )
    if not proved:
        notes.append(f"Z3 did not prove the values equal within {timeout_s:g} s of work")
    return Verdict(
        rule.name,
        "unknown",
        clock_stopped=clock_stopped,
        checked=len(insts),
        seconds=time.perf_counter() - start,
        notes=tuple(notes),
    )


def verify_record(job: tuple[dict, float, int]) -> dict:
    """A worker's job: the verdict, as a dict, on a rule given as a dict, with a timeout and a
    number of instance checks. A crash on one rule becomes an ``unknown`` verdict naming it, so
    that it does not hide the others' verdicts."""
    record, timeout, checks = job
    rule = Rule.from_dict(record)
    try:
        verdict = verify_rule(rule, timeout, checks=checks)
    except Exception as e:
        verdict = Verdict(rule.name, "unknown", notes=(f"verifier error: {type(e).__name__}: {e}",))
    return verdict.to_dict()


def verify_rules(rules: Iterable[Rule], timeout_s: float = 10.0, **kwargs) -> list[Verdict]:
    prover = Prover()
    return [verify_rule(r, timeout_s, prover=prover, **kwargs) for r in rules]
