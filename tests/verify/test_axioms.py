"""Every axiom holds on the reference evaluator; the validator can tell a wrong one."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcgopt.verify import AXIOMS, Axiom, SizeAxiom
from pcgopt.verify.validate import validate


@pytest.mark.parametrize("axiom", AXIOMS, ids=lambda a: a.name)
def test_axiom_holds_at_its_default_sizes(axiom):
    v = validate(axiom, count=4)
    assert v.checked > 0, f"{axiom.name}: no instance where both sides are well-formed"
    assert not v.failures, v.failures


@pytest.mark.parametrize("axiom", AXIOMS, ids=lambda a: a.name)
@settings(max_examples=2)
@given(data=st.data())
def test_axiom_holds_at_small_random_sizes(axiom, data):
    """Letters are sizes of at least 2; here they are drawn small and used as they are, so that
    sizes that share factors, odd sizes and unequal letters all come up."""
    letters = {k: data.draw(st.integers(2, 5), label=k) for k in axiom.rule.letter_sizes()}
    v = validate(axiom, letters=letters, count=3, seed=data.draw(st.integers(0, 999)), scale=1)
    assert not v.failures, v.failures


def test_every_axiom_has_a_name_and_a_reason():
    assert len({a.name for a in AXIOMS}) == len(AXIOMS)
    assert all(a.why for a in AXIOMS)


@pytest.mark.parametrize(
    "wrong",
    [
        Axiom(
            "relu_is_additive",
            "(wrong)",
            "relu(add(x, y))",
            "add(relu(x), relu(y))",
            {"x": "[m, n]", "y": "[m, n]"},
        ),
        Axiom(
            "concat_commutes",
            "(wrong)",
            "concat(x, y, axis=a)",
            "concat(y, x, axis=a)",
            {"x": "[m, n]", "y": "[m, n]"},
        ),
        SizeAxiom(
            "matmul_keeps_columns",
            "(wrong)",
            "matmul(x, w)",
            1,
            "size(x, 1)",
            {"x": "[m, n]", "w": "[n, p]"},
        ),
    ],
    ids=lambda a: a.name,
)
def test_the_validator_rejects_wrong_axioms(wrong):
    v = validate(wrong)
    assert v.checked > 0 and v.failures
