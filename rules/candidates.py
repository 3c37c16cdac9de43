"""From enumerated graphs to candidate rules, and from concrete candidates to general rules.

Graphs with equal fingerprints are paired with their group's representative (the smallest, then
the first in text order): one rule per other member, which is enough for every pair to follow
by composition. A pair becomes a candidate only after its full values are compared (a hash hit
alone is not enough) and when its right side reads no tensor its left side does not.

:func:`lift` turns a concrete candidate (found at degree 2 on tensors of fixed sizes) into a
general rule: each parallel degree becomes the symbol ``k``, input sizes become dimension
letters (equal sizes, one letter), and split sizes become the sizes of what was concatenated.
The verifier then decides whether the general rule holds.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pcgopt.ops import OPERATORS, ParallelOp
from pcgopt.ops.layout import reshape_groups
from pcgopt.ops.parallel import StackPartial
from pcgopt.ops.params import ParamType
from pcgopt.rewrite import (
    Expr,
    Instance,
    IntExpr,
    Prod,
    Quot,
    Rule,
    RuleError,
    Sum,
    Sym,
    TensorDecl,
    Term,
    Var,
    format_exprs,
    infer_side,
    int_symbols,
    rename_vars,
    size_expr,
    tensor_vars,
    walk,
)
from pcgopt.rules.enumerate import Config, GraphRecord, Identity, input_values, swap_candidates
from pcgopt.rules.rewriting import Evaluator, side_size


@dataclass(frozen=True)
class Candidate:
    """A concrete rule found by enumeration, at the enumeration's instance."""

    lhs: tuple[Expr, ...]
    rhs: tuple[Expr, ...]

    @property
    def size(self) -> int:
        return side_size(self.lhs) + side_size(self.rhs)

    @property
    def text(self) -> str:
        return f"{format_exprs(self.lhs)} => {format_exprs(self.rhs)}"

    def sort_key(self) -> tuple:
        """Smallest first; at equal size the more general (more distinct variables) first, so
        that its instances are found implied by it."""
        return (self.size, -len(_vars((*self.lhs, *self.rhs))), side_size(self.lhs), self.text)


def _terms(exprs: Iterable[Expr]) -> set[Term]:
    return {t for e in exprs for t in walk(e) if isinstance(t, Term)}


def _vars(exprs: Iterable[Expr]) -> set[str]:
    return {t.name for e in exprs for t in walk(e) if isinstance(t, Var)}


def connected(outputs: Sequence[Expr]) -> bool:
    """Several outputs are one computation only if they share an operator (a split's parts)."""
    if len(outputs) == 1:
        return True
    first = _terms(outputs[:1])
    return all(first & _terms([o]) for o in outputs[1:])


def instance_of(config: Config) -> tuple[Instance, dict]:
    values = input_values(config)
    inst = Instance({s.name: s.shape for s in config.inputs}, {})
    return inst, {s.name: v for s, v in zip(config.inputs, values, strict=True)}


def candidates(
    config: Config, graphs: Iterable[GraphRecord], identities: Iterable[Identity], fingerprint
) -> list[Candidate]:
    """Candidate rules, deduplicated, in processing order (smallest first)."""
    inst, values = instance_of(config)
    evaluator = Evaluator(inst, values, fingerprint)
    groups: dict[bytes, list[GraphRecord]] = defaultdict(list)
    for g in graphs:
        if connected(g.outputs):
            groups[g.key].append(g)
    found: dict[str, Candidate] = {}

    def offer(lhs: tuple[Expr, ...], rhs: tuple[Expr, ...]) -> None:
        if not _vars(rhs) <= _vars(lhs):
            lhs, rhs = rhs, lhs
            if not _vars(rhs) <= _vars(lhs):
                return
        if not _same_values(evaluator, lhs, rhs):
            return
        c = Candidate(lhs, rhs)
        found.setdefault(c.text, c)

    for key in sorted(groups):
        members = sorted(groups[key], key=lambda g: (g.renamed, g.ops, format_exprs(g.outputs)))
        if len(members) < 2 or members[0].renamed:
            continue
        rep = members[0]
        for g in members[1:]:
            offer(g.outputs, rep.outputs)
    for ident in identities:
        offer((ident.term,), (ident.existing,))
    for ab, ba in swap_candidates(config):
        offer((ab,), (ba,))
    return sorted(found.values(), key=Candidate.sort_key)


def _same_values(evaluator: Evaluator, lhs, rhs) -> bool:
    """The full comparison behind a fingerprint match: equal parallel shapes, equal values."""
    for a, b in zip(lhs, rhs, strict=True):
        va, vb = evaluator.value(a), evaluator.value(b)
        if va is None or vb is None or va.shape != vb.shape:
            return False
        if not np.array_equal(va.logical(), vb.logical()):
            return False
    return True


# --------------------------------------------------------------------------------------------
# lifting
# --------------------------------------------------------------------------------------------


def is_parallel(exprs: Iterable[Expr]) -> bool:
    return any(isinstance(OPERATORS[t.op], ParallelOp | StackPartial) for t in _terms(exprs))


def lift(
    c: Candidate, config: Config, letters: Mapping[tuple[str, int], str] | None = None
) -> Rule:
    """The general rule a concrete candidate stands for (see the module docstring). ``letters``
    names the letter of each (input, dimension); by default equal sizes share a letter."""
    shapes = {s.name: s.shape for s in config.inputs}
    used = _used_inputs(c, config)
    if letters is None:
        values = sorted({n for v in used for n in shapes[v].sizes if n > 1})
        by_size = {n: "abcdefgh"[i] for i, n in enumerate(values)}
        letters = {(v, d): by_size[n] for v in used for d, n in enumerate(shapes[v].sizes) if n > 1}
    # A size of 1 stays 1: a letter stands for 2 or more (a dimension of one element cannot
    # be split, so what holds of it is a rule of its own).
    inputs = {
        v: TensorDecl(
            tuple(letters.get((v, d), n) for d, n in enumerate(shapes[v].sizes)),
            shapes[v].dtype,
        )
        for v in used
    }
    example = {
        letters[v, d]: n for v in used for d, n in enumerate(shapes[v].sizes) if (v, d) in letters
    }
    memo: dict[Expr, Expr] = {}
    floats: dict[str, dict[float, Sym]] = {}
    degree_syms: dict[int, IntExpr] = {config.degree: Sym("k")}
    if config.second_degree is not None:
        degree_syms[config.second_degree] = Sym("j")
        degree_syms[config.degree * config.second_degree] = Prod((Sym("k"), Sym("j")))

    def logical_sizes(e: Expr) -> tuple[int, ...]:
        return infer_side((e,), instance_of(config)[0])[0].sizes

    def go(e: Expr) -> Expr:
        if isinstance(e, Var):
            return e
        if e in memo:
            return memo[e]
        args = tuple(go(a) for a in e.args)
        params = dict(e.params)
        spec = OPERATORS[e.op]
        if isinstance(spec, ParallelOp) and params.get(spec.count_param) in degree_syms:
            params[spec.count_param] = degree_syms[params[spec.count_param]]
        if e.op == "split":
            params["sizes"] = _split_sizes(e, args)
        if e.op == "reshape":
            params["shape"] = _reshape_shape(e, args[0], logical_sizes(e.args[0]))
        for p in OPERATORS[e.op].params:
            if p.type is ParamType.FLOAT and p.lifted and isinstance(params.get(p.name), float):
                # A scale factor or a dropout rate is the enumeration's choice, not the
                # rule's: one symbol per parameter name and value.
                reals = floats.setdefault(p.name, {})
                suffix = str(len(reals)) if reals and params[p.name] not in reals else ""
                params[p.name] = reals.setdefault(params[p.name], Sym(p.name + suffix))
        memo[e] = Term(e.op, args, params, e.index)
        return memo[e]

    lhs, rhs = tuple(go(e) for e in c.lhs), tuple(go(e) for e in c.rhs)
    name = "r" + hashlib.sha1(c.text.encode()).hexdigest()[:10]
    return Rule(name, lhs, rhs, inputs, example)


def lifts(c: Candidate, config: Config) -> tuple[Rule, ...]:
    """The ways to lift a candidate, most general first; empty if even the plain lift (equal
    sizes, one letter) does not generalize.

    The enumeration's inputs share sizes (a [2, 4] tensor times a [4, 4] weight), so the plain
    lift asks for more equal sizes than the rule needs. Its letters are refined: one or two
    dimensions at a time move to a letter of their own while both sides stay well-formed with
    every letter a different size (two, because in ``matmul(x, matmul(w1, w2))`` the columns
    of ``w1`` and the rows of ``w2`` must move together). The verifier decides whether the
    general lift holds; the plain lift is the fallback."""
    plain = lift(c, config)
    if not generalizes(plain):
        return ()
    letters = {
        (v, d): dim
        for v, decl in plain.inputs.items()
        for d, dim in enumerate(decl.dims)
        if isinstance(dim, str)
    }
    fresh = (f"_{i}" for i in itertools.count())
    refined = True
    while refined:
        refined = False
        for letter in sorted(set(letters.values())):
            positions = [pos for pos, x in letters.items() if x == letter]
            for k in (1, 2):
                for moved in itertools.combinations(positions, k):
                    if len(moved) == len(positions):
                        continue
                    trial = dict(letters)
                    new = next(fresh)
                    for pos in moved:
                        trial[pos] = new
                    if generalizes(lift(c, config, trial)):
                        letters, refined = trial, True
                        break
                if refined:
                    break
            if refined:
                break
    general = lift(c, config, _renamed_letters(letters))
    if general.inputs == plain.inputs:
        return (plain,)
    return (general, plain)


#: The letters a rule's sizes are named by, in order.
LETTERS = "abcdefghmnopqrstuvw"


def _renamed_letters(letters: Mapping[tuple[str, int], str]) -> dict[tuple[str, int], str]:
    """Letters renamed a, b, c, ... in order of first use, for readable rules."""
    order: dict[str, str] = {}
    for x in letters.values():
        order.setdefault(x, LETTERS[len(order)])
    return {pos: order[x] for pos, x in letters.items()}


def _used_inputs(c: Candidate, config: Config) -> list[str]:
    names = [s.name for s in config.inputs]
    return sorted(_vars(c.lhs) | _vars(c.rhs), key=names.index)


def generality(rule: Rule) -> tuple[int, int]:
    """Sorts the more general of two rules first: more distinct tensors, more distinct letters."""
    letters = {d for decl in rule.inputs.values() for d in decl.dims if isinstance(d, str)}
    return (-len(rule.inputs), -len(letters))


def _split_sizes(e: Term, lifted_args: tuple[Expr, ...]):
    """Split sizes as the sizes of what was concatenated (looking through operators that keep
    the shape); the concrete sizes when no concatenation explains them."""
    axis = e.params["axis"]
    x = lifted_args[0]
    while isinstance(x, Term):
        if x.op == "concat" and x.params["axis"] == axis and len(x.args) == len(e.params["sizes"]):
            try:
                return tuple(size_expr(a, axis) for a in x.args)
            except RuleError:
                break
        if x.op in ("concat", "split", "matmul", "linear", "transpose"):
            break
        x = x.args[0]
    return e.params["sizes"]


def _reshape_shape(e: Term, lifted_arg: Expr, in_sizes: tuple[int, ...]) -> tuple:
    """A reshape's target shape in terms of its input's sizes, run by run (see
    :func:`~pcgopt.ops.layout.reshape_groups`): a dimension kept is its size, dimensions merged
    are the product of theirs, and a dimension split into several is cut by symbols, ``parts``
    (the number of heads, say) and the rest, ``size(x, 2)/parts``. Entries no such rule
    explains stay concrete."""
    shape = tuple(e.params["shape"])
    out: list = list(shape)
    counter = itertools.count(1)
    try:
        for ga, gb in reshape_groups(in_sizes, shape):
            if not ga or not gb:
                continue
            sizes = [size_expr(lifted_arg, d) for d in ga]
            if len(gb) == 1:
                out[gb[0]] = sizes[0] if len(sizes) == 1 else Prod(tuple(sizes))
            elif len(ga) == 1:
                syms = [
                    Sym("parts" + (str(i) if i > 1 else ""))
                    for i in itertools.islice(counter, len(gb) - 1)
                ]
                for j, sym in zip(gb[:-1], syms, strict=True):
                    out[j] = sym
                out[gb[-1]] = Quot(sizes[0], syms[0] if len(syms) == 1 else Prod(tuple(syms)))
    except RuleError:
        return shape
    return tuple(out)


def generalizes(rule: Rule) -> bool:
    """Whether both sides are well-formed at sizes unrelated to the enumeration's (each letter a
    different prime): a candidate that is well-formed only because 2 + 2 = 4 there does not
    generalize, and is not worth verifying."""
    from pcgopt.errors import PCGError
    from pcgopt.verify.logic import rule_ranks

    primes = [3, 5, 7, 11, 13, 17, 19, 23]
    # Sizes a symbol divides (a reshape's ``size(x, 2)/parts``) are multiples of its value.
    divisors = rule.example_symbols()
    scale = math.prod(divisors[s] for s in _divisor_symbols((*rule.lhs, *rule.rhs)))
    letters = {k: scale * primes[i % len(primes)] for i, k in enumerate(rule.letter_sizes())}
    try:
        rule_ranks(rule, sizes=rule.example_sizes(letters))
    except (PCGError, RuleError):
        return False
    return True


def _divisor_symbols(exprs: Iterable[Expr]) -> set[str]:
    def dens(v) -> Iterator[IntExpr]:
        if isinstance(v, Quot):
            yield v.den
            yield from dens(v.num)
        elif isinstance(v, tuple):
            for x in v:
                yield from dens(x)
        elif isinstance(v, Prod | Sum):
            for x in v.factors if isinstance(v, Prod) else v.terms:
                yield from dens(x)

    return {
        name
        for t in _terms(exprs)
        for v in t.params.values()
        for d in dens(v)
        for name in int_symbols(d)
    }


def kind(rule: Rule) -> str:
    return "parallel" if is_parallel((*rule.lhs, *rule.rhs)) else "algebraic"


def _renamed(rule: Rule, mapping: Mapping[str, str]) -> Rule:
    """The rule with its tensor variables renamed, inputs in the order of ``mapping``."""
    return Rule(
        rule.name,
        tuple(rename_vars(e, mapping) for e in rule.lhs),
        tuple(rename_vars(e, mapping) for e in rule.rhs),
        {new: rule.inputs[old] for old, new in mapping.items()},
        rule.example,
    )


def canonical_text(rule: Rule) -> str:
    """The rule's text with tensor variables renamed in order of appearance, and letters in
    order of use (so rules equal up to renaming compare equal)."""
    order = tensor_vars((*rule.lhs, *rule.rhs))
    r = _renamed(rule, {v: f"v{i}" for i, v in enumerate(order)})
    letters: dict[str, str] = {}
    decls = {}
    for v in (f"v{i}" for i in range(len(order))):
        d = r.inputs[v]
        dims = [
            dim if isinstance(dim, int) else letters.setdefault(dim, f"L{len(letters)}")
            for dim in d.dims
        ]
        decls[v] = f"{d.dtype.value}{dims}"
    return f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)} | {sorted(decls.items())}"


def readable(rule: Rule) -> Rule:
    """The rule with its tensors renamed x1, x2, ... in order of appearance: the enumeration's
    names (``w1``, ``p1``) tell how a tensor was found, not what the rule asks of it."""
    order = tensor_vars((*rule.lhs, *rule.rhs))
    return _renamed(rule, {v: f"x{i + 1}" for i, v in enumerate(order)})


def merge_identities(results: Iterable) -> tuple[list[GraphRecord], list[Identity]]:
    graphs: list[GraphRecord] = []
    identities: list[Identity] = []
    for r in results:
        graphs += r.graphs
        identities += r.identities
    return graphs, identities


def by_name(rules: Sequence[Rule]) -> Mapping[str, Rule]:
    return {r.name: r for r in rules}
