"""Bounded term rewriting at a concrete instance: is a rule implied by others?

A rule is *implied* by a set of rules when rewriting its left side with them (in either
direction, at any position) reaches its right side. :class:`Implication` searches for such a
chain breadth-first from both sides at once, within a bound on steps, term size, terms
visited and rule patterns tried (the last bounds each question's work whatever the rule set:
a search that runs out answers "not shown implied", which only keeps a candidate for proof).
Matching is syntactic (a rule's tensor variables match any subterm); a rewrite is kept
only if the result is well-formed at the instance and has the same fingerprint as the term it
came from, so an unproved rule can never make a chain that is wrong at the instance.

The generator uses this to drop candidates that smaller rules already give (TASO's pruning), and
the coverage measurement uses it to decide whether a peer rule follows from the generated set.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from pcgopt.errors import PCGError
from pcgopt.ops import get_op
from pcgopt.rewrite import (
    SYMBOLIC,
    Expr,
    Instance,
    Prod,
    Quot,
    SizeOf,
    Sum,
    Sym,
    TensorDecl,
    Term,
    Var,
    concrete_params,
)
from pcgopt.sharded import ShardedArray

Side = tuple[Expr, ...]


@dataclass(frozen=True)
class Rewrite:
    """A single-output rule used as a rewrite, in one direction; with ``decls``, only where the
    bound tensors fit the rule's declarations."""

    name: str
    pattern: Expr
    result: Expr
    decls: Mapping[str, TensorDecl] | None = None


def fits(decls: Mapping[str, TensorDecl], b: Binding) -> bool:
    """Whether bound tensors have the declared ranks, equal sizes where letters agree, sizes of
    at least 2 for letters and exactly the numbers given."""
    letters: dict[str, int] = {}
    for name, decl in decls.items():
        term = b.tensors.get(name)
        if term is None:
            continue
        for d, dim in enumerate(decl.dims):
            n = b.size_of(term, d)
            if n is None:
                return False
            if isinstance(dim, int):
                if n != dim:
                    return False
            elif n < 2 or letters.setdefault(dim, n) != n:
                return False
        if b.size_of(term, decl.rank) is not None:
            return False  # more dimensions than declared
    return True


@dataclass
class Binding:
    """Tensor variables bound to subterms and symbols bound to integers during a match; sizes of
    bound subterms come from ``sizes`` (a function of a term and a dimension)."""

    tensors: dict[str, Expr]
    symbols: dict[str, int]
    sizes: object

    def size_of(self, e: Expr, dim: int) -> int | None:
        return self.sizes(e, dim)


def match(pattern: Expr, term: Expr, b: Binding) -> bool:
    """Extends the binding so that ``pattern`` under it is ``term``; False if impossible."""
    if isinstance(pattern, Var):
        bound = b.tensors.get(pattern.name)
        if bound is None:
            b.tensors[pattern.name] = term
            return True
        return bound == term
    if not isinstance(term, Term):
        return False
    if pattern.op != term.op or pattern.index != term.index or len(pattern.args) != len(term.args):
        return False
    if not all(match(p, t, b) for p, t in zip(pattern.args, term.args, strict=True)):
        return False
    if pattern.params == term.params:
        return True
    return all(_match_value(pattern.params.get(k), v, b) for k, v in term.params.items())


def _match_value(p, v, b: Binding) -> bool:
    if isinstance(p, Sym):
        if p.name in b.symbols:
            return b.symbols[p.name] == v
        if isinstance(v, bool) or not isinstance(v, int):
            return False
        b.symbols[p.name] = v
        return True
    if isinstance(p, tuple):
        return (
            isinstance(v, tuple)
            and len(p) == len(v)
            and all(_match_value(a, c, b) for a, c in zip(p, v, strict=True))
        )
    if isinstance(p, SizeOf | Prod | Sum | Quot):
        value = _int_value(p, b)
        return value is not None and value == v
    return p == v


def _int_value(p, b: Binding) -> int | None:
    if isinstance(p, int):
        return p
    if isinstance(p, Sym):
        return b.symbols.get(p.name)
    if isinstance(p, SizeOf):
        dim = _int_value(p.dim, b)
        tensor = b.tensors.get(p.tensor)
        return None if dim is None or tensor is None else b.size_of(tensor, dim)
    if isinstance(p, Prod | Sum):
        parts = [_int_value(f, b) for f in (p.factors if isinstance(p, Prod) else p.terms)]
        if any(x is None for x in parts):
            return None
        return math.prod(parts) if isinstance(p, Prod) else sum(parts)
    if isinstance(p, Quot):
        num, den = _int_value(p.num, b), _int_value(p.den, b)
        if num is None or not den or num % den:
            return None
        return num // den
    return None


def substitute(pattern: Expr, b: Binding) -> Expr | None:
    """The pattern with the binding applied; None when a symbol or size is unknown (a rule
    direction that introduces a free choice cannot be applied blindly)."""
    if isinstance(pattern, Var):
        return b.tensors[pattern.name]
    args = []
    for a in pattern.args:
        s = substitute(a, b)
        if s is None:
            return None
        args.append(s)
    params = {}
    for k, v in pattern.params.items():
        c = _concrete_value(v, b)
        if c is _UNKNOWN:
            return None
        params[k] = c
    return Term(pattern.op, tuple(args), params, pattern.index)


_UNKNOWN = object()


def _concrete_value(v, b: Binding):
    if isinstance(v, tuple):
        out = tuple(_concrete_value(x, b) for x in v)
        return _UNKNOWN if any(x is _UNKNOWN for x in out) else out
    if isinstance(v, SYMBOLIC):
        value = _int_value(v, b)
        return _UNKNOWN if value is None else value
    return v


def size(e: Expr) -> int:
    """Operators in a term (shared subterms counted once)."""
    seen: set[Expr] = set()

    def go(x: Expr) -> None:
        if isinstance(x, Term) and x not in seen:
            seen.add(x)
            for a in x.args:
                go(a)

    go(e)
    return len(seen)


def side_size(side: Side) -> int:
    seen: set[Expr] = set()
    stack = list(side)
    while stack:
        x = stack.pop()
        if isinstance(x, Term) and x not in seen:
            seen.add(x)
            stack.extend(x.args)
    return len(seen)


def _shape_key(e: Expr) -> tuple:
    """A term's operator and its arguments' operators (``None`` for a variable): what a pattern
    and a term it matches agree on before any binding."""
    return (
        e.op,
        e.index,
        tuple(None if isinstance(a, Var) else (a.op, a.index) for a in e.args),
    )


def _may_match(pattern_key: tuple, term_key: tuple) -> bool:
    """Whether a pattern with ``pattern_key`` can match a term with ``term_key``
    (:func:`_shape_key`): the same root, and each argument a variable or the same operator."""
    (op, index, args), (t_op, t_index, t_args) = pattern_key, term_key
    return (
        op == t_op
        and index == t_index
        and len(args) == len(t_args)
        and all(a is None or a == t for a, t in zip(args, t_args, strict=True))
    )


@dataclass
class RuleIndex:
    """Single-output rules as rewrites in both directions, indexed by the pattern's operator
    and, in a cache filled as terms are met, by its arguments' operators (a rewrite search
    tries each pattern on millions of subterms; most differ in an argument's operator)."""

    by_root: dict[tuple[str, int], list[Rewrite]] = field(default_factory=lambda: defaultdict(list))
    count: int = 0
    #: Rules set aside: their rewrites are not offered.
    disabled: set[str] = field(default_factory=set)
    _by_shape: dict[tuple, list[Rewrite]] = field(default_factory=dict, repr=False)

    def add(
        self, name: str, lhs: Expr, rhs: Expr, decls: Mapping[str, TensorDecl] | None = None
    ) -> None:
        for pattern, result in ((lhs, rhs), (rhs, lhs)):
            if isinstance(pattern, Var):
                continue  # a bare variable matches everything: only use it the other way
            if not _vars(result) <= _vars(pattern):
                continue  # would invent a tensor
            self.by_root[(pattern.op, pattern.index)].append(Rewrite(name, pattern, result, decls))
        self.count += 1
        self._by_shape.clear()

    def copy(self) -> RuleIndex:
        out = RuleIndex()
        for key, rws in self.by_root.items():
            out.by_root[key] = list(rws)
        out.count = self.count
        out.disabled = set(self.disabled)
        return out

    def rewrites_at(
        self, term: Term, sizes, tick: Callable[[], None] | None = None
    ) -> Iterator[tuple[Expr, str]]:
        """The results of rewriting ``term`` at its root; ``tick`` is called before each
        pattern is tried (to bound the work). Patterns whose arguments' operators differ from
        the term's are not tried (nor counted)."""
        key = _shape_key(term)
        rewrites = self._by_shape.get(key)
        if rewrites is None:
            rewrites = self._by_shape[key] = [
                rw
                for rw in self.by_root.get((term.op, term.index), ())
                if _may_match(_shape_key(rw.pattern), key)
            ]
        for rw in rewrites:
            if rw.name in self.disabled:
                continue
            if tick is not None:
                tick()
            b = Binding({}, {}, sizes)
            if match(rw.pattern, term, b) and (rw.decls is None or fits(rw.decls, b)):
                result = substitute(rw.result, b)
                if result is not None:
                    yield result, rw.name


def _vars(e: Expr) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    out: set[str] = set()
    for a in e.args:
        out |= _vars(a)
    return out


class Evaluator:
    """Fingerprints of terms at one instance (None where a term is ill-formed), cached."""

    def __init__(self, inst: Instance, values: Mapping[str, ShardedArray], fingerprint) -> None:
        self.inst = inst
        self.values = dict(values)
        self.fingerprint = fingerprint
        self._cache: dict[Expr, tuple[ShardedArray, ...] | None] = {}

    def size(self, e: Expr, dim: int) -> int | None:
        v = self.value(e)
        if v is None or not 0 <= dim < v.shape.rank:
            return None
        return v.shape.sizes[dim]

    def value(self, e: Expr) -> ShardedArray | None:
        if isinstance(e, Var):
            return self.values[e.name]
        outs = self._outputs(e)
        return None if outs is None else outs[e.index]

    def _outputs(self, e: Term) -> tuple[ShardedArray, ...] | None:
        key = Term(e.op, e.args, e.params, 0)
        if key in self._cache:
            return self._cache[key]
        args = [self.value(a) for a in e.args]
        result = None
        if all(a is not None for a in args):
            spec = get_op(e.op)
            try:
                shapes = tuple(a.shape for a in args)
                params = concrete_params(e, self.inst, shapes)
                result = spec.evaluate(params, tuple(args), spec.infer(params, shapes))
            except PCGError:
                result = None
        self._cache[key] = result
        return result

    def key(self, side: Side) -> bytes | None:
        parts = []
        for e in side:
            v = self.value(e)
            if v is None:
                return None
            parts.append(self.fingerprint(v))
        return b"".join(parts)


@dataclass
class Implication:
    """Searches rewrite chains between two sides (see the module docstring)."""

    index: RuleIndex
    evaluator: Evaluator
    max_steps: int = 2
    max_visited: int = 400
    size_slack: int = 1
    #: Rule patterns tried per question (matched or not); None: no bound.
    max_pattern_tries: int | None = 20_000
    #: Questions that ran out of ``max_pattern_tries`` before an answer.
    exhausted: int = 0
    _tried: int = field(default=0, init=False, repr=False)

    def neighbours(self, side: Side, limit: int) -> Iterator[tuple[Side, str]]:
        """Sides one rewrite away that keep the size limit. A rewrite replaces every occurrence
        of a subterm at once: the side is a graph, where a shared tensor is one node (as in an
        e-graph, where it is one e-class). Every pattern tried counts towards
        ``max_pattern_tries``."""
        for t in _subterms(side):
            for new_t, name in self.index.rewrites_at(t, self.evaluator.size, self._tick):
                new_side = _replace(side, t, new_t)
                if side_size(new_side) <= limit:
                    yield new_side, name

    def _tick(self) -> None:
        self._tried += 1
        if self.max_pattern_tries is not None and self._tried > self.max_pattern_tries:
            raise _OutOfWork

    def implied(self, lhs: Side, rhs: Side) -> tuple[bool, set[str]]:
        """Whether a chain of at most ``2 * max_steps`` rewrites joins ``lhs`` and ``rhs``;
        also the names of the rules such a chain used."""
        key = self.evaluator.key(lhs)
        if key is None or key != self.evaluator.key(rhs):
            return False, set()
        if lhs == rhs:
            return True, set()
        self._tried = 0
        try:
            return self._search(lhs, rhs, key, max(side_size(lhs), side_size(rhs)))
        except _OutOfWork:
            self.exhausted += 1
            return False, set()

    def _search(self, lhs: Side, rhs: Side, key: bytes, size: int) -> tuple[bool, set[str]]:
        limit = size + self.size_slack
        seen = [{lhs: frozenset()}, {rhs: frozenset()}]
        frontier = [[lhs], [rhs]]
        for _ in range(self.max_steps):
            for d in (0, 1):
                nxt = []
                for s in frontier[d]:
                    used = seen[d][s]
                    for t, name in self.neighbours(s, limit):
                        if t in seen[d] or self.evaluator.key(t) != key:
                            continue
                        seen[d][t] = used | {name}
                        if t in seen[1 - d]:
                            return True, set(seen[d][t] | seen[1 - d][t])
                        nxt.append(t)
                        if len(seen[d]) >= self.max_visited:
                            break
                frontier[d] = nxt
        return False, set()


class _OutOfWork(Exception):
    """An implication search used up its ``max_pattern_tries``."""


def _subterms(side: Side) -> list[Term]:
    """The distinct operator terms of a side, parents before children, in a fixed order."""
    seen: dict[Expr, None] = {}
    stack = list(reversed(side))
    while stack:
        x = stack.pop()
        if isinstance(x, Term) and x not in seen:
            seen[x] = None
            stack.extend(reversed(x.args))
    return list(seen)  # type: ignore[arg-type]


def _replace(side: Side, old: Expr, new: Expr) -> Side:
    memo: dict[Expr, Expr] = {}

    def go(e: Expr) -> Expr:
        if e == old:
            return new
        if not isinstance(e, Term):
            return e
        if e not in memo:
            args = tuple(go(a) for a in e.args)
            memo[e] = e if args == e.args else Term(e.op, args, e.params, e.index)
        return memo[e]

    return tuple(go(e) for e in side)


def build_index(rules: Sequence[tuple[str, Side, Side]]) -> RuleIndex:
    index = RuleIndex()
    for name, lhs, rhs in rules:
        if len(lhs) == 1:
            index.add(name, lhs[0], rhs[0])
    return index
