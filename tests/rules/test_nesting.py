"""Splits two ways at once: a one-operator family's proved splits of its operator compose
pairwise into splits at degrees k and j (pcgopt.rules.nesting), which the job proves again."""

import pytest

from pcgopt.rewrite import Rule, format_exprs
from pcgopt.rules import RULES_FILE, load
from pcgopt.rules.nesting import nestings
from pcgopt.verify import verify_rule
from pcgopt.verify.instances import compare, instances

DENSE = {"x1": "[a, b]", "x2": "[b, c]"}

#: A dense layer's one-level splits at degree k, as the one-operator family proves them: by
#: the batch, by the columns, and by the contraction (partial sums reduced).
BATCH = Rule.parse(
    "batch",
    "linear(partition(x1, dim=0, degree=k), replicate(x2, degree=k), activation='none')",
    "partition(linear(x1, x2, activation='none'), dim=0, degree=k)",
    DENSE,
)
COLUMNS = Rule.parse(
    "columns",
    "linear(replicate(x1, degree=k), partition(x2, dim=1, degree=k), activation='none')",
    "partition(linear(x1, x2, activation='none'), dim=1, degree=k)",
    DENSE,
)
CONTRACTION = Rule.parse(
    "contraction",
    "reduce(linear(partition(x1, dim=1, degree=k), partition(x2, dim=0, degree=k), "
    "activation='none'), degree=k)",
    "linear(x1, x2, activation='none')",
    DENSE,
)


def _texts(rules):
    return {(format_exprs(r.lhs), format_exprs(r.rhs)) for r in rules}


def test_a_batch_split_and_a_column_split_compose_into_a_2d_split_with_copies_outermost():
    composed = _texts(nestings([BATCH, COLUMNS]))
    two_d = (
        "linear(replicate(partition(x1, dim=0, degree=k), degree=j), "
        "replicate(partition(x2, dim=1, degree=j), degree=k), activation='none')"
    )
    assert composed == {
        # The push: a dense layer on the 2D layouts is the 2D split of the layer.
        (
            two_d,
            "partition(partition(linear(x1, x2, activation='none'), dim=0, degree=k), "
            "dim=1, degree=j)",
        ),
        # The introduction: what turns an unsplit layer in the e-graph into it in one rewrite.
        (
            f"combine(combine({two_d}, dim=1, degree=j), dim=0, degree=k)",
            "linear(x1, x2, activation='none')",
        ),
    }


def test_a_contraction_split_composes_only_inside_a_push():
    """A reduction of partial sums goes innermost: ``reduce(partition(...))`` has a form of its
    own; the other order is the same rule with k and j swapped."""
    composed = _texts(nestings([BATCH, CONTRACTION]))
    inner = (
        "linear(partition(partition(x1, dim=0, degree=k), dim=1, degree=j), "
        "replicate(partition(x2, dim=0, degree=j), degree=k), activation='none')"
    )
    assert composed == {
        (
            f"reduce({inner}, degree=j)",
            "partition(linear(x1, x2, activation='none'), dim=0, degree=k)",
        ),
        (
            f"combine(reduce({inner}, degree=j), dim=0, degree=k)",
            "linear(x1, x2, activation='none')",
        ),
    }
    assert nestings([CONTRACTION]) == []


def test_splits_of_different_operators_or_of_one_kind_do_not_compose():
    relu_batch = Rule.parse(
        "relu_batch",
        "linear(partition(x1, dim=0, degree=k), replicate(x2, degree=k), activation='relu')",
        "partition(linear(x1, x2, activation='relu'), dim=0, degree=k)",
        DENSE,
    )
    assert nestings([BATCH, relu_batch]) == []
    assert nestings([BATCH]) == []
    # A rule that is not a one-level split is not read as one.
    layout = Rule.parse(
        "layout",
        "combine(partition(x1, dim=0, degree=k), dim=0, degree=k)",
        "x1",
        {"x1": "[a, b]"},
    )
    assert nestings([layout, COLUMNS]) == []


@pytest.mark.parametrize("pair", [(BATCH, COLUMNS), (BATCH, CONTRACTION), (COLUMNS, CONTRACTION)])
def test_every_composed_split_is_proved_for_all_degrees_and_holds_on_the_evaluator(pair):
    for rule in nestings(list(pair)):
        verdict = verify_rule(rule, 10.0, checks=2)
        assert verdict.status == "proved" and verdict.to_dict()["degrees"] == "all", rule
        found = instances(rule, count=2, seed=0)
        assert found
        for inst in found:
            assert compare(rule, inst) is None


def test_the_shipped_matrix_rules_split_dense_layers_two_ways_at_once():
    """The batch-by-columns split of a ReLU layer (each branch of Unity's MLP on a node) and
    its introduction are in the shipped file, among the rules with both degree symbols."""
    shipped = _texts(load(RULES_FILE))
    two_d = (
        "linear(replicate(partition(x1, dim=0, degree=k), degree=j), "
        "replicate(partition(x2, dim=1, degree=j), degree=k), activation='relu')"
    )
    assert (
        two_d,
        "partition(partition(linear(x1, x2, activation='relu'), dim=0, degree=k), dim=1, degree=j)",
    ) in shipped
    assert (
        f"combine(combine({two_d}, dim=1, degree=j), dim=0, degree=k)",
        "linear(x1, x2, activation='relu')",
    ) in shipped


def test_only_a_one_operator_family_composes_its_splits():
    from pcgopt.rules.enumerate import Config

    with pytest.raises(ValueError, match="one_op"):
        Config(nested=True)
