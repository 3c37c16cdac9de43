"""The rewriting engine behind pruning and coverage."""

import numpy as np

from pcgopt.rewrite import Instance, Rule, parse_expr
from pcgopt.rules.enumerate import fingerprint
from pcgopt.rules.rewriting import Binding, Evaluator, Implication, RuleIndex, match, substitute
from pcgopt.shapes import ParallelTensorShape
from pcgopt.sharded import ShardedArray


def evaluator(**shapes):
    rng = np.random.default_rng(0)
    values = {
        k: ShardedArray.from_logical(rng.integers(-3, 4, size=s.sizes), s, rng)
        for k, s in shapes.items()
    }
    return Evaluator(Instance(shapes, {}), values, fingerprint)


def test_match_binds_tensors_and_symbols():
    (pattern,) = parse_expr("partition(relu(x), dim=0, degree=k)")
    (term,) = parse_expr("partition(relu(add(a, b)), dim=0, degree=4)")
    b = Binding({}, {}, lambda e, d: None)
    assert match(pattern, term, b)
    assert b.symbols == {"k": 4}
    (result,) = parse_expr("relu(partition(x, dim=0, degree=k))")
    assert repr(substitute(result, b)) == "relu(partition(add(a, b), dim=0, degree=4))"
    assert not match(
        pattern, parse_expr("partition(relu(a), dim=1, degree=4)")[0], Binding({}, {}, None)
    )


def test_a_chain_of_rules_implies_a_rule():
    ev = evaluator(a=ParallelTensorShape.of((4, 6)))
    index = RuleIndex()
    rules = [
        Rule.parse(
            f"relu_part{d}",
            f"relu(partition(x, dim={d}, degree=k))",
            f"partition(relu(x), dim={d}, degree=k)",
            {"x": "[m, n]"},
        )
        for d in (0, 1)
    ] + [
        Rule.parse(
            "part_part",
            "partition(partition(x, dim=0, degree=k), dim=1, degree=j)",
            "partition(partition(x, dim=1, degree=j), dim=0, degree=k)",
            {"x": "[m, n]"},
        ),
    ]
    for r in rules:
        index.add(r.name, r.lhs[0], r.rhs[0], r.inputs)
    search = Implication(index, ev)
    lhs = parse_expr("relu(partition(partition(a, dim=0, degree=2), dim=1, degree=2))")
    rhs = parse_expr("partition(partition(relu(a), dim=1, degree=2), dim=0, degree=2)")
    ok, used = search.implied(lhs, rhs)
    assert ok and used == {"relu_part0", "relu_part1", "part_part"}
    assert search.exhausted == 0
    # a false "rule" is never implied: the fingerprints differ
    ok, _ = search.implied(lhs, parse_expr("relu(a)"))
    assert not ok

    # The same question with too little work allowed: not shown implied, and counted as such.
    starved = Implication(index, ev, max_pattern_tries=2)
    assert starved.implied(lhs, rhs) == (False, set())
    assert starved.exhausted == 1


def test_declarations_limit_where_a_rule_applies():
    ev = evaluator(a=ParallelTensorShape.of((4, 6)))
    index = RuleIndex()
    square_only = Rule.parse(
        "t", "transpose(transpose(x, perm=(1, 0)), perm=(1, 0))", "x", {"x": "[n, n]"}
    )
    index.add("t", square_only.lhs[0], square_only.rhs[0], square_only.inputs)
    search = Implication(index, ev)
    ok, _ = search.implied(
        parse_expr("transpose(transpose(a, perm=(1, 0)), perm=(1, 0))"), parse_expr("a")
    )
    assert not ok  # a is 4 x 6, not square
