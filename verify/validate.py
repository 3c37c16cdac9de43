"""Checking the axioms against the reference evaluator.

An axiom is only as good as the evidence that it holds; :func:`validate` evaluates both sides
of an axiom on concrete instances (random sizes for its dimension letters, every legal value of
its structural symbols, inputs distributed in many ways) and reports every instance where they
differ. The test suite runs it for every axiom.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pcgopt.rewrite import infer_side, int_symbols, resolve
from pcgopt.verify.axioms import Axiom, SizeAxiom
from pcgopt.verify.instances import SCALE, compare, instances


@dataclass(frozen=True)
class Validation:
    axiom: str
    checked: int
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.checked > 0 and not self.failures


def validate(
    axiom: Axiom | SizeAxiom,
    *,
    letters: Mapping[str, int] | None = None,
    count: int = 8,
    seed: int = 0,
    scale: int = SCALE,
) -> Validation:
    """Evaluates ``axiom`` on up to ``count`` instances (sizes: ``letters`` times ``scale``);
    ``ok`` when some were checked and none failed."""
    if isinstance(axiom, Axiom):
        insts = instances(
            axiom.rule,
            conditions=axiom.parsed_conditions,
            count=count,
            seed=seed,
            letters=letters,
            scale=scale,
        )
        failures = []
        for k, inst in enumerate(insts):
            mismatch = compare(axiom.rule, inst, mode="logical", seed=seed + k)
            if mismatch is not None:
                failures.append(str(mismatch))
        return Validation(axiom.name, len(insts), tuple(failures))

    extra = set(int_symbols(axiom.parsed_value)) - axiom.rule.symbols
    for left, _, right in axiom.parsed_conditions:
        extra |= (set(int_symbols(left)) | set(int_symbols(right))) - axiom.rule.symbols
    insts = instances(
        axiom.rule,
        conditions=axiom.parsed_conditions,
        count=count,
        seed=seed,
        letters=letters,
        dimensions=sorted(extra),
        scale=scale,
    )
    failures = []
    for inst in insts:
        (shape,) = infer_side(axiom.rule.lhs, inst)
        got = shape.sizes[axiom.dim]
        want = resolve(axiom.parsed_value, inst.symbols, inst.sizes())
        if got != want:
            failures.append(f"at {inst}: size is {got}, the axiom says {want}")
    return Validation(axiom.name, len(insts), tuple(failures))
