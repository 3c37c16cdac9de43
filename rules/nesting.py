"""Two-level splits of one operator, composed from its proved one-level splits.

A one-operator family (``Config.one_op``) proves how its operator splits one way at degree
``k``, in two forms:

* a *push*: ``op(A1(x1), ..., An(xn)) = partition(op(x1, ..., xn), dim=d, degree=k)``, each
  ``Ai`` a Partition or Replicate of its input at degree ``k``, or nothing (a batch split of a
  dense layer: ``linear(partition(x1, dim=0, degree=k), replicate(x2, degree=k))``);
* a *reduction*: ``reduce(op(A1(x1), ...), degree=k) = op(x1, ...)`` (the contraction split).

Two splits of different kinds compose into a split two ways at once, ``k`` ways by the first
and ``j`` by the second on ``k*j`` devices (AutoDDL's 2D matmul, the branch-parallel plans'
batch-by-columns splits): each input takes the first split's layout, then the second's, copies
outermost (``replicate(partition(x, dim=0, degree=k), degree=j)``, the layout a plan stores).
Of each pair two rules are made:

* push and push: ``op(N(x)) = partition(partition(op(x), dim=d1, degree=k), dim=d2,
  degree=j)``, and its introduction ``combine(combine(op(N(x)), dim=d2, degree=j), dim=d1,
  degree=k) = op(x)``;
* push and reduction: ``reduce(op(N(x)), degree=j) = partition(op(x), dim=d1, degree=k)``, and
  ``combine(reduce(op(N(x)), degree=j), dim=d1, degree=k) = op(x)``.

The one-level rules reach such a split in the e-graph only through the cleanup rule that puts
a Partition on every tensor, which the saturation's match limits ban after its first iteration
(:data:`pcgopt.egraph.saturate.MATCH_LIMIT_DEGREES`); an introduction takes an unsplit operator
there in one rewrite. Every composition is verified again like any candidate (the job keeps
only the proved ones).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from pcgopt.ops import OpKind, get_op
from pcgopt.rewrite import Params, Rule, Sym, Term, Var

__all__ = ["nestings"]

_K, _J = Sym("k"), Sym("j")


@dataclass(frozen=True)
class _Split:
    """A one-level split of ``op`` (its params ``params``) read from a proved rule: ``dim`` the
    output dimension a push partitions (None for a reduction), ``wraps`` each input's layout
    (op name and params, or None), in the order of ``variables``."""

    rule: Rule
    op: str
    params: Params
    variables: tuple[str, ...]
    wraps: tuple[tuple[str, Params] | None, ...]
    dim: int | None


def _operator(e: object) -> Term | None:
    """``e`` if it is a computing operator applied to distinct tensor variables."""
    if not isinstance(e, Term) or get_op(e.op).kind is OpKind.PARALLEL:
        return None
    names = [a.name for a in e.args if isinstance(a, Var)]
    if len(names) != len(e.args) or len(set(names)) != len(names):
        return None
    return e


def _wrap(e: object) -> tuple[str | None, Params | None, str | None]:
    """A split operator's input: (layout op, its params, variable), or (None, None, variable)."""
    if isinstance(e, Var):
        return None, None, e.name
    if (
        isinstance(e, Term)
        and e.op in ("partition", "replicate")
        and len(e.args) == 1
        and isinstance(e.args[0], Var)
        and e.params.get("degree") == _K
    ):
        return e.op, e.params, e.args[0].name
    return None, None, None


def _split(rule: Rule) -> _Split | None:
    """The one-level split ``rule`` states (module docstring), or None."""
    if len(rule.lhs) != 1 or len(rule.rhs) != 1:
        return None
    lhs, rhs = rule.lhs[0], rule.rhs[0]
    dim = None
    if (
        isinstance(rhs, Term)
        and rhs.op == "partition"
        and rhs.params.get("degree") == _K
        and isinstance(rhs.params.get("dim"), int)
    ):
        plain, split, dim = _operator(rhs.args[0]), lhs, rhs.params["dim"]
    elif isinstance(lhs, Term) and lhs.op == "reduce" and lhs.params.get("degree") == _K:
        plain, split = _operator(rhs), lhs.args[0]
    else:
        return None
    if plain is None or not isinstance(split, Term) or split.op != plain.op:
        return None
    if split.params != plain.params or len(split.args) != len(plain.args):
        return None
    wraps = []
    for arg, var in zip(split.args, plain.args, strict=True):
        op, params, name = _wrap(arg)
        if name != var.name:  # type: ignore[union-attr]
            return None
        wraps.append(None if op is None else (op, params))
    if all(w is None for w in wraps):
        return None
    variables = tuple(v.name for v in plain.args)  # type: ignore[union-attr]
    return _Split(rule, plain.op, plain.params, variables, tuple(wraps), dim)


def _at(params: Params, degree: Sym) -> Params:
    return Params({**params, "degree": degree})


def _layout(
    x: Var, first: tuple[str, Params] | None, second: tuple[str, Params] | None
) -> Term | Var:
    """``x`` with the first split's layout (degree k) and then the second's (degree j), copies
    outermost."""
    layers = [(op, _at(p, d)) for w, d in ((first, _K), (second, _J)) if w for op, p in [w]]
    if len(layers) == 2 and layers[0][0] == "replicate" and layers[1][0] == "partition":
        layers.reverse()
    e: Term | Var = x
    for op, params in layers:
        e = Term(op, (e,), params)
    return e


def _named(lhs: Term, rhs: Term, like: Rule) -> Rule:
    rule = Rule("r", (lhs,), (rhs,), like.inputs, dict(like.letter_sizes()))
    digest = hashlib.sha1(f"{rule.lhs!r} => {rule.rhs!r}".encode()).hexdigest()[:10]
    return Rule(f"r{digest}", rule.lhs, rule.rhs, rule.inputs, rule.example)


def _compose(outer: _Split, inner: _Split) -> list[Rule]:
    """The two rules of ``outer`` at degree k composed with ``inner`` at degree j (module
    docstring): a push and its introduction."""
    xs = tuple(Var(v) for v in outer.variables)
    # The inner split's inputs are the outer's, position by position.
    laid = tuple(_layout(x, a, b) for x, a, b in zip(xs, outer.wraps, inner.wraps, strict=True))
    both = Term(outer.op, laid, outer.params)
    plain = Term(outer.op, xs, outer.params)

    def split(e: Term, dim: int, degree: Sym, op: str) -> Term:
        return Term(op, (e,), Params({"dim": dim, "degree": degree}))

    assert outer.dim is not None
    if inner.dim is None:
        reduced = Term("reduce", (both,), Params({"degree": _J}))
        push = (reduced, split(plain, outer.dim, _K, "partition"))
        intro = (split(reduced, outer.dim, _K, "combine"), plain)
    else:
        push = (both, split(split(plain, outer.dim, _K, "partition"), inner.dim, _J, "partition"))
        intro = (split(split(both, inner.dim, _J, "combine"), outer.dim, _K, "combine"), plain)
    return [_named(*push, outer.rule), _named(*intro, outer.rule)]


def nestings(rules: Sequence[Rule]) -> list[Rule]:
    """Every two-level split composed from ``rules``' one-level splits of one operator (module
    docstring): pushes in order of their output dimension, a push before a reduction (the
    other orders are the same rules with ``k`` and ``j`` swapped), in a fixed order."""
    splits = [s for s in map(_split, rules) if s is not None]
    out: dict[str, Rule] = {}
    for outer in splits:
        for inner in splits:
            if (outer.op, outer.params) != (inner.op, inner.params) or outer.dim is None:
                continue
            if len(inner.variables) != len(outer.variables):
                continue
            if inner.dim is not None and inner.dim <= outer.dim:
                continue
            for rule in _compose(outer, inner):
                out.setdefault(rule.name, rule)
    return sorted(out.values(), key=lambda r: r.name)
