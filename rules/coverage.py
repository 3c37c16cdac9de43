"""How much of a peer rule set does the generated set cover?

A peer rule is *rediscovered* when a generated rule equals it up to renaming (of tensor
variables and dimension letters), and *implied* when a chain of generated rules rewrites its
left side into its right side (:mod:`pcgopt.rules.rewriting`), at an instance where both sides
are well-formed, each step respecting the rewriting rule's declarations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pcgopt.rewrite import SYMBOLIC, Expr, Instance, Rule, RuleError, Term, resolve
from pcgopt.rules.candidates import canonical_text
from pcgopt.rules.enumerate import fingerprint
from pcgopt.rules.rewriting import Evaluator, Implication, RuleIndex
from pcgopt.verify.instances import instances, random_values


@dataclass(frozen=True)
class Covered:
    rule: str
    how: str  # "renaming", "implied" or "not covered"
    via: tuple[str, ...] = ()
    note: str = ""


def concrete(exprs: tuple[Expr, ...], inst: Instance) -> tuple[Expr, ...]:
    """The terms with symbols and sizes replaced by their values at ``inst``."""

    def value(v):
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        if isinstance(v, SYMBOLIC):
            return resolve(v, inst.symbols, inst.sizes())
        return v

    def go(e: Expr) -> Expr:
        if not isinstance(e, Term):
            return e
        return Term(
            e.op, tuple(go(a) for a in e.args), {k: value(v) for k, v in e.params.items()}, e.index
        )

    return tuple(go(e) for e in exprs)


def coverage(peer: Sequence[Rule], generated: Sequence[Rule], *, seed: int = 0) -> list[Covered]:
    by_text = {canonical_text(r): r.name for r in generated}
    index = RuleIndex()
    for r in generated:
        if len(r.lhs) == 1:
            index.add(r.name, r.lhs[0], r.rhs[0], r.inputs)
    out = []
    for p in peer:
        if canonical_text(p) in by_text:
            out.append(Covered(p.name, "renaming", (by_text[canonical_text(p)],)))
            continue
        try:
            insts = instances(p, count=1, seed=seed, scale=1)
        except RuleError:
            insts = []
        if not insts:
            out.append(
                Covered(p.name, "not covered", note="no instance with both sides well-formed")
            )
            continue
        inst = insts[0]
        evaluator = Evaluator(inst, random_values(p, inst, _rng(seed)), fingerprint)
        search = Implication(
            index, evaluator, max_steps=3, max_visited=2000, size_slack=2, max_pattern_tries=None
        )
        ok, used = search.implied(concrete(p.lhs, inst), concrete(p.rhs, inst))
        out.append(Covered(p.name, "implied" if ok else "not covered", tuple(sorted(used))))
    return out


def _rng(seed: int):
    import numpy as np

    return np.random.default_rng(seed)
