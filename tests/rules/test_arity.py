"""Rules about layouts through a concat hold at every arity the e-graph builds: the generation
job widens them from two inputs to up to eight and proves each again."""

import pytest

from pcgopt.rewrite import Rule, format_exprs
from pcgopt.rules import RULES_FILE, load, load_records
from pcgopt.rules.arity import WIDEST, uniform_pair, widened, widenings
from pcgopt.verify import verify_rule
from pcgopt.verify.instances import compare, instances

BATCH_SPLIT_THROUGH_CONCAT = Rule.parse(
    "r",
    "concat(partition(x1, dim=0, degree=k), partition(x2, dim=0, degree=k), axis=1)",
    "partition(concat(x1, x2, axis=1), dim=0, degree=k)",
    {"x1": "[a, b]", "x2": "[a, c]"},
)


def test_a_layout_through_a_concat_widens_with_a_fresh_letter_per_concatenated_input():
    wide = widened(BATCH_SPLIT_THROUGH_CONCAT, 4)
    assert wide.name == "r_n4"
    assert format_exprs(wide.lhs) == (
        "concat(partition(x1, dim=0, degree=k), partition(x2, dim=0, degree=k), "
        "partition(x3, dim=0, degree=k), partition(x4, dim=0, degree=k), axis=1)"
    )
    assert format_exprs(wide.rhs) == "partition(concat(x1, x2, x3, x4, axis=1), dim=0, degree=k)"
    # The batch is shared; each input's width is its own.
    assert {k: repr(v) for k, v in wide.inputs.items()} == {
        "x1": "f32[a, b]",
        "x2": "f32[a, c]",
        "x3": "f32[a, d]",
        "x4": "f32[a, e]",
    }
    assert [w.name for w in widenings(BATCH_SPLIT_THROUGH_CONCAT)] == [
        f"r_n{n}" for n in range(3, WIDEST + 1)
    ]


def test_a_widened_rule_is_proved_and_holds_on_the_reference_evaluator():
    wide = widened(BATCH_SPLIT_THROUGH_CONCAT, 5)
    verdict = verify_rule(wide, 10.0, checks=2)
    assert verdict.status == "proved" and verdict.to_dict()["degrees"] == "all"
    found = instances(wide, count=2, seed=0)
    assert found
    for inst in found:
        assert compare(wide, inst) is None


@pytest.mark.parametrize(
    ("lhs", "rhs", "inputs"),
    [
        # A compute operator inside: an algebraic rule, left binary.
        (
            "concat(relu(x1), relu(x2), axis=0)",
            "relu(concat(x1, x2, axis=0))",
            {"x1": "[a, b]", "x2": "[c, b]"},
        ),
        # The inputs differ in form.
        (
            "concat(partition(x1, dim=0, degree=k), x2, axis=1)",
            "concat(partition(x1, dim=0, degree=k), x2, axis=1)",
            {"x1": "[a, b]", "x2": "[a, c]"},
        ),
        # x1 also appears outside the concat.
        (
            "add(replicate(x1, degree=k), concat(replicate(x1, degree=k), "
            "replicate(x2, degree=k), axis=1))",
            "add(replicate(x1, degree=k), replicate(concat(x1, x2, axis=1), degree=k))",
            {"x1": "[a, b]", "x2": "[a, b]"},
        ),
    ],
)
def test_only_rules_uniform_in_their_concats_inputs_widen(lhs, rhs, inputs):
    rule = Rule.parse("r", lhs, rhs, inputs)
    assert uniform_pair(rule) is None
    assert widenings(rule) == []


def test_partial_sums_of_more_parts_widen_too():
    # As the enumeration lifts it: a letter per dimension, an example where the shapes agree.
    rule = Rule.parse(
        "s",
        "stack_partial(replicate(x1, degree=k), replicate(x2, degree=k))",
        "replicate(stack_partial(x1, x2), degree=k)",
        {"x1": "[a, b]", "x2": "[c, d]"},
        {"a": 2, "b": 4, "c": 2, "d": 4},
    )
    wide = widened(rule, 3)
    assert format_exprs(wide.rhs) == "replicate(stack_partial(x1, x2, x3), degree=k)"
    assert verify_rule(wide, 10.0, checks=2).status == "proved"


def test_a_rule_that_would_need_more_letters_than_there_are_is_not_widened():
    # Four new letters per input at rank 4: eight inputs need 24, more than the pool holds.
    rule = Rule.parse(
        "s",
        "stack_partial(replicate(x1, degree=k), replicate(x2, degree=k))",
        "replicate(stack_partial(x1, x2), degree=k)",
        {"x1": "[a, b, c, d]", "x2": "[e, f, g, h]"},
    )
    assert widened(rule, 3) is not None
    assert widened(rule, WIDEST) is None


def test_the_shipped_matrix_rules_move_a_batch_split_through_a_concat_of_up_to_eight():
    texts = {f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}" for r in load(RULES_FILE)}
    for n in range(2, WIDEST + 1):
        parts = ", ".join(f"partition(x{i}, dim=0, degree=k)" for i in range(1, n + 1))
        names = ", ".join(f"x{i}" for i in range(1, n + 1))
        assert (
            f"concat({parts}, axis=1) => partition(concat({names}, axis=1), dim=0, degree=k)"
            in texts
        ), n
    # Each widened rule is shipped beside the two-input rule it came from.
    names = {r.name for r, _ in load_records(RULES_FILE)}
    wide = [name for name in names if name.endswith(f"_n{WIDEST}")]
    assert wide and all(name.removesuffix(f"_n{WIDEST}") in names for name in wide)
