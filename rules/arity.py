"""Rules of a variadic operator at every arity the e-graph builds.

The enumeration builds concatenations of two tensors, so its rules about a concat have two
inputs: ``concat(partition(x1, dim=0), partition(x2, dim=0), axis=1) = partition(concat(x1,
x2, axis=1), dim=0)``. The e-graph has a constructor for each arity up to :data:`WIDEST` (a
wider concat is loaded as a concat of concats), and a binary rule never matches a concat of four
embedding bags. A rule is *uniform* in its concat's inputs when every concat on either side
reads two inputs that are the same term of two tensor variables ``x1`` and ``x2`` (``B`` is
``A`` with ``x1`` renamed ``x2``) and neither variable appears anywhere else; its widening to
``n`` inputs repeats the second input with fresh variables ``x3`` ... (declared as ``x2``,
with fresh letters where ``x1`` and ``x2`` differ: the concatenated dimension).

A widened rule is a new rule: the generation job proves it like every other
(:mod:`pcgopt.rules.generate`) and ships it only if proved; its record's operator count
(``ops``) is the size its two-input form was found at.
"""

from __future__ import annotations

from collections.abc import Iterator

from pcgopt.ops import OpKind, get_op
from pcgopt.rewrite import (
    Prod,
    Quot,
    Rule,
    SizeOf,
    Sum,
    TensorDecl,
    Term,
    Var,
    rename_vars,
    tensor_vars,
    walk,
)
from pcgopt.rules.candidates import LETTERS

#: The most inputs of a variadic operator's e-graph constructor (and so of a widened rule).
WIDEST = 8


def _variadic(op: str) -> bool:
    return get_op(op).variadic


def _variadic_terms(rule: Rule) -> list[Term]:
    return [
        e
        for side in (rule.lhs, rule.rhs)
        for root in side
        for e in walk(root)
        if isinstance(e, Term) and _variadic(e.op)
    ]


def _occurrences(e: object, name: str) -> int:
    """How often tensor variable ``name`` appears in ``e`` (through parameters that name its
    sizes too)."""
    if isinstance(e, Var):
        return int(e.name == name)
    if isinstance(e, Term):
        return sum(_occurrences(a, name) for a in e.args) + sum(
            _occurrences(v, name) for v in e.params.values()
        )
    if isinstance(e, SizeOf):
        return int(e.tensor == name)
    if isinstance(e, tuple):
        return sum(_occurrences(v, name) for v in e)
    if isinstance(e, Sum):
        return sum(_occurrences(v, name) for v in e.terms)
    if isinstance(e, Prod):
        return sum(_occurrences(v, name) for v in e.factors)
    if isinstance(e, Quot):
        return _occurrences(e.num, name) + _occurrences(e.den, name)
    return 0


def _layout_of_one_tensor(e: Term | Var) -> bool:
    """Whether ``e`` is parallel operators applied to one tensor variable."""
    while isinstance(e, Term):
        if get_op(e.op).kind is not OpKind.PARALLEL or len(e.args) != 1:
            return False
        e = e.args[0]
    return True


def uniform_pair(rule: Rule) -> tuple[str, str] | None:
    """The variables ``(x1, x2)`` a rule is uniform in (module docstring), or None. Only
    rules about layouts are widened: every concat's inputs are parallel operators applied to
    one tensor (or the tensor itself). Algebraic ones (a product with concatenated weights)
    stay binary, where the e-graph applies them to a concat of concats: at three inputs or more
    their proofs run out of the verifier's time."""
    terms = _variadic_terms(rule)
    if not terms or any(len(t.args) != 2 for t in terms):
        return None
    if not all(_layout_of_one_tensor(a) for t in terms for a in t.args):
        return None
    first, second = terms[0].args
    vars_a, vars_b = set(tensor_vars((first,))), set(tensor_vars((second,)))
    only_first, only_second = vars_a - vars_b, vars_b - vars_a
    if len(only_first) != 1 or len(only_second) != 1:
        return None
    x1, x2 = next(iter(only_first)), next(iter(only_second))
    for t in terms:
        a, b = t.args
        if x1 not in tensor_vars((a,)) or rename_vars(a, {x1: x2}) != b:
            return None
    # Nowhere else: each variable's occurrences are those inside the concats' inputs.
    for name, slot in ((x1, 0), (x2, 1)):
        inside = sum(_occurrences(t.args[slot], name) for t in terms)
        total = sum(_occurrences(e, name) for e in (*rule.lhs, *rule.rhs))
        if inside != total:
            return None
    return x1, x2


def _fresh(taken: set[str]) -> Iterator[str]:
    for c in LETTERS:
        if c not in taken:
            taken.add(c)
            yield c


def widened(rule: Rule, arity: int) -> Rule | None:
    """``rule`` with every concat reading ``arity`` inputs instead of two, if it is uniform in
    them (module docstring); None otherwise. Its name is the rule's with ``_n{arity}``."""
    if not 3 <= arity <= WIDEST:
        raise ValueError(f"arity must be 3 to {WIDEST}, got {arity}")
    pair = uniform_pair(rule)
    if pair is None:
        return None
    x1, x2 = pair
    used_vars = set(rule.inputs)
    extra = [f"x{n}" for n in range(1, 100) if f"x{n}" not in used_vars][: arity - 2]
    d1, d2 = rule.inputs[x1], rule.inputs[x2]
    letters = {d for decl in rule.inputs.values() for d in decl.dims if isinstance(d, str)}
    fresh = _fresh(set(letters))
    example = dict(rule.letter_sizes())
    decls = dict(rule.inputs)
    for name in extra:
        dims: list[str | int] = []
        for a, b in zip(d1.dims, d2.dims, strict=True):
            if a != b and isinstance(b, str):
                letter = next(fresh, None)
                if letter is None:
                    return None  # more letters than a rule can name (wide, high-rank inputs)
                example[letter] = example[b]
                dims.append(letter)
            else:
                dims.append(b)
        decls[name] = TensorDecl(tuple(dims), d2.dtype)

    memo: dict[Term | Var, Term | Var] = {}

    def go(e: Term | Var) -> Term | Var:
        if isinstance(e, Var):
            return e
        if e not in memo:
            args = tuple(go(a) for a in e.args)
            if _variadic(e.op):
                args = (*args, *(rename_vars(args[1], {x2: name}) for name in extra))
            memo[e] = Term(e.op, args, e.params, e.index)
        return memo[e]

    return Rule(
        f"{rule.name}_n{arity}",
        tuple(go(e) for e in rule.lhs),
        tuple(go(e) for e in rule.rhs),
        decls,
        example,
    )


def widenings(rule: Rule) -> list[Rule]:
    """The rule at every arity from 3 to :data:`WIDEST`, if it is uniform; else none."""
    if uniform_pair(rule) is None:
        return []
    return [w for n in range(3, WIDEST + 1) if (w := widened(rule, n)) is not None]
