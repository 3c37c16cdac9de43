"""pcgopt.verify: operator axioms and the rule verifier.

``verify_rule(rule)`` proves a rewrite rule for all degrees (or for powers of two up to 64),
refutes it with a counterexample, or answers ``unknown``; see :mod:`pcgopt.verify.prove` for
how. The axioms are data in :mod:`pcgopt.verify.axioms`, each checked against the reference
evaluator by the test suite. ``python -m pcgopt.verify FILE`` verifies a whole rule file
(this project's format, or FlexFlow's with ``--format flexflow``).

>>> from pcgopt.rewrite import Rule
>>> rule = Rule.parse("matmul_reduce", "matmul(reduce(x, degree=k), y)",
...                   "reduce(matmul(x, replicate(y, degree=k)), degree=k)",
...                   {"x": "[m, n]", "y": "[n, p]"})
>>> v = verify_rule(rule)
>>> v.status, v.degrees
('proved', 'all')
"""

from pcgopt.verify.axioms import AXIOMS, AXIOMS_BY_NAME, Axiom, SizeAxiom
from pcgopt.verify.prove import Prover, Verdict, verify_rule, verify_rules

__all__ = [
    "AXIOMS",
    "AXIOMS_BY_NAME",
    "Axiom",
    "Prover",
    "SizeAxiom",
    "Verdict",
    "verify_rule",
    "verify_rules",
]
