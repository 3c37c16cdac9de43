"""verify_rule proves true rules (for all degrees), refutes false ones with a counterexample,
and raises the alarm when the axioms prove something the evaluator refutes."""

import pytest
import z3

from pcgopt.rewrite import Rule
from pcgopt.verify import Axiom, Prover, verify_rule
from pcgopt.verify.axioms import AXIOMS

TRUE_RULES = [
    # Unity section 4's example property
    (
        "matmul_reduce",
        "matmul(reduce(x, degree=k), y)",
        "reduce(matmul(x, replicate(y, degree=k)), degree=k)",
        {"x": "[m, n]", "y": "[n, p]"},
    ),
    # Unity's Pipeline through a product's rows, and Batch undoing it (micro-batch counts in
    # the shape model)
    (
        "matmul_micro_batches",
        "matmul(pipeline(x, dim=0, micro_batches=k), w)",
        "pipeline(matmul(x, w), dim=0, micro_batches=k)",
        {"x": "[m, n]", "w": "[n, p]"},
    ),
    (
        "batch_undoes_pipeline",
        "batch(relu(pipeline(x, dim=1, micro_batches=k)), dim=1, micro_batches=k)",
        "relu(x)",
        {"x": "[m, n]"},
    ),
    # Unity Figure 11a: ReLU supports splitting the rows
    (
        "relu_rows",
        "relu(x)",
        "combine(relu(partition(x, dim=0, degree=k)), dim=0, degree=k)",
        {"x": "[m, n]"},
    ),
    # Unity Figure 11b: an Add is a StackPartial and a Reduce
    (
        "add_is_reduce_of_stack",
        "replicate(add(x, y), degree=2)",
        "all_reduce(stack_partial(x, y), degree=2)",
        {"x": "[m, n]", "y": "[m, n]"},
    ),
    (
        "combine_partition",
        "combine(partition(x, dim=1, degree=k), dim=1, degree=k)",
        "x",
        {"x": "[m, n]"},
    ),
    (
        "partition_twice",
        "partition(partition(x, dim=0, degree=k), dim=0, degree=j)",
        "partition(x, dim=0, degree=k*j)",
        {"x": "[m, n]"},
    ),
    (
        "all_reduce_split",
        "all_reduce(x, degree=k)",
        "replicate(reduce(x, degree=k), degree=k)",
        {"x": "[m, n]"},
    ),
    # Megatron's MLP: column- then row-parallel, one reduction
    (
        "megatron_mlp",
        "matmul(relu(matmul(x, w1)), w2)",
        "reduce(matmul(relu(matmul(replicate(x, degree=k), partition(w1, dim=1, degree=k))), "
        "partition(w2, dim=0, degree=k)), degree=k)",
        {"x": "[b, h]", "w1": "[h, f]", "w2": "[f, h]"},
    ),
    # data parallelism of a dense layer with a fused activation
    (
        "linear_data_parallel",
        "linear(x, w, b, activation='relu')",
        "combine(linear(partition(x, dim=0, degree=k), replicate(w, degree=k), "
        "replicate(b, degree=k), activation='relu'), dim=0, degree=k)",
        {"x": "[m, n]", "w": "[n, p]", "b": "[p]"},
    ),
    # algebra through layout
    (
        "linear_relu_over_rows",
        "split(linear(concat(x, y, axis=0), w, activation='relu'), axis=0, "
        "sizes=(size(x, 0), size(y, 0)))",
        "(linear(x, w, activation='relu'), linear(y, w, activation='relu'))",
        {"x": "[m, n]", "y": "[p, n]", "w": "[n, q]"},
    ),
    (
        "matmul_distributes_twice",
        "matmul(add(x, y), add(v, w))",
        "add(add(matmul(x, v), matmul(y, v)), add(matmul(x, w), matmul(y, w)))",
        {"x": "[m, n]", "y": "[m, n]", "v": "[n, p]", "w": "[n, p]"},
    ),
]

FALSE_RULES = [
    (
        "pipeline_moves_dimension",
        "relu(pipeline(x, dim=0, micro_batches=k))",
        "pipeline(relu(x), dim=1, micro_batches=k)",
        {"x": "[m, n]"},
        "parallel shapes differ",
    ),
    (
        "relu_is_additive",
        "relu(add(x, y))",
        "add(relu(x), relu(y))",
        {"x": "[m, n]", "y": "[m, n]"},
        "values differ",
    ),
    # Reduce does not commute with ReLU: the right side is never well-formed
    (
        "relu_reduce",
        "relu(reduce(x, degree=k))",
        "reduce(relu(x), degree=k)",
        {"x": "[m, n]"},
        "relu is not linear",
    ),
    # the feasibility note's wrong rule: without the Replicate, y is not where it is needed
    (
        "matmul_reduce_no_replicate",
        "matmul(reduce(x, degree=k), y)",
        "reduce(matmul(x, y), degree=k)",
        {"x": "[m, n]", "y": "[n, p]"},
        "must be copied",
    ),
    (
        "partition_other_dim",
        "partition(x, dim=0, degree=k)",
        "partition(x, dim=1, degree=k)",
        {"x": "[m, m]"},
        "parallel shapes differ",
    ),
    (
        "all_reduce_is_reduce",
        "all_reduce(x, degree=k)",
        "reduce(x, degree=k)",
        {"x": "[m, n]"},
        "parallel shapes differ",
    ),
    (
        "concat_commutes",
        "concat(x, y, axis=1)",
        "concat(y, x, axis=1)",
        {"x": "[m, n]", "y": "[m, n]"},
        "values differ",
    ),
    ("matmul_commutes", "matmul(x, y)", "matmul(y, x)", {"x": "[m, m]", "y": "[m, m]"}, "differ"),
]


@pytest.mark.parametrize(
    ("name", "lhs", "rhs", "inputs"), TRUE_RULES, ids=[r[0] for r in TRUE_RULES]
)
def test_true_rules_are_proved_for_all_degrees(name, lhs, rhs, inputs):
    v = verify_rule(Rule.parse(name, lhs, rhs, inputs))
    assert v.status == "proved", v
    assert v.degrees == "all"
    assert v.checked > 0


@pytest.mark.parametrize(
    ("name", "lhs", "rhs", "inputs", "why"), FALSE_RULES, ids=[r[0] for r in FALSE_RULES]
)
def test_false_rules_are_refuted_with_a_counterexample(name, lhs, rhs, inputs, why):
    v = verify_rule(Rule.parse(name, lhs, rhs, inputs), timeout_s=3)
    assert v.status == "refuted", v
    assert why in v.counterexample
    assert not v.axiom_conflict


def test_proofs_name_their_axioms():
    v = verify_rule(Rule.parse(*TRUE_RULES[-2][:4]))
    assert "split0_of_concat_r2_axis0" in v.axioms
    assert "linear_relu_is_relu_after_matmul" in v.axioms
    v = verify_rule(Rule.parse(*TRUE_RULES[0][:4]))
    assert set(v.axioms) == {"reduce_keeps_value", "replicate_keeps_value"}


def test_a_wrong_axiom_is_caught_by_the_evaluator():
    """The verifier cannot be fooled by its own axioms: with a false axiom Z3 'proves' a false
    rule, and the concrete check flags the conflict."""
    wrong = Axiom("relu_is_identity", "(wrong)", "relu(x)", "x", {"x": "[m, n]"})
    prover = Prover((*AXIOMS, wrong))
    v = verify_rule(Rule.parse("relu_drop", "relu(x)", "x", {"x": "[m, n]"}), prover=prover)
    assert v.status == "refuted"
    assert v.axiom_conflict


def test_unknown_when_z3_cannot_decide():
    # true, but needs an axiom pcgopt does not have (tanh is odd)
    rule = Rule.parse(
        "tanh_odd", "tanh(scale(x, factor=-1.0))", "scale(tanh(x), factor=-1.0)", {"x": "[m, n]"}
    )
    v = verify_rule(rule, timeout_s=1)
    assert v.status == "unknown"
    assert v.checked > 0  # no counterexample in the concrete checks either


@pytest.mark.parametrize(
    ("name", "lhs", "rhs", "inputs", "example"),
    [
        # size facts about matrices must not leak to 3-D tensors (true only where m = n = p)
        (
            "rank3_split",
            "split(concat(matmul(x, w), matmul(x2, w2), axis=1), axis=1, "
            "sizes=(size(w, 1), size(w2, 1)))[0]",
            "matmul(x, w)",
            {"x": "[b, m, k]", "w": "[k, n]", "x2": "[b, p, j]", "w2": "[j, n]"},
            {"m": 3, "p": 3, "n": 3},
        ),
        # a degree that is a size must not be read at the example's sizes (true only where m = n)
        (
            "size_degree",
            "combine(partition(x, dim=0, degree=size(x, 1)), dim=0, degree=size(x, 0))",
            "x",
            {"x": "[m, n]"},
            {"m": 3, "n": 3},
        ),
        # true, but no axiom says relu(3a) = 3 relu(a): an untyped encoding once "proved" the
        # factor-2 form (which the positive-homogeneity axiom now proves, rightly)
        (
            "relu_scaling",
            "linear(scale(w1, factor=3.0), w1, activation='relu')",
            "scale(linear(w1, w1, activation='relu'), factor=3.0)",
            {"w1": "[c, c]"},
            None,
        ),
        # whether a conv's rows can be split depends on sizes the shape model does not see
        (
            "conv_spatial",
            "combine(conv2d(partition(x, dim=2, degree=k), replicate(w, degree=k), "
            "stride=(2, 2)), dim=2, degree=k)",
            "conv2d(x, w, stride=(2, 2))",
            {"x": "[n, c, h, v]", "w": "[o, c, 1, 1]"},
            None,
        ),
    ],
)
def test_no_proof_beyond_what_the_axioms_and_model_cover(name, lhs, rhs, inputs, example):
    """Found in review: each of these was once 'proved'. They are false at other sizes (the
    first two) or true for reasons the axioms do not state; the verifier must not prove them."""
    v = verify_rule(Rule.parse(name, lhs, rhs, inputs, example), timeout_s=2)
    assert v.status != "proved", v


def test_the_axioms_recorded_do_not_depend_on_what_was_proved_before():
    # Z3's unsat core once varied with the process's history, so one rule file could differ
    # from the next run's.
    rule = Rule.parse(
        "relu_doubling",
        "linear(add(w1, w1), w1, activation='relu')",
        "add(linear(w1, w1, activation='relu'), linear(w1, w1, activation='relu'))",
        {"w1": "[c, c]"},
    )
    first = verify_rule(rule, timeout_s=10)
    assert first.status == "proved"
    assert "relu_positively_homogeneous_r2" in first.axioms
    for other in (
        Rule.parse("t", "transpose(transpose(x, perm=(1, 0)), perm=(1, 0))", "x", {"x": "[m, n]"}),
        Rule.parse(
            "m",
            "matmul(matmul(x, y), z)",
            "matmul(x, matmul(y, z))",
            {"x": "[m, n]", "y": "[n, p]", "z": "[p, q]"},
        ),
    ):
        verify_rule(other, timeout_s=10)
    assert verify_rule(rule, timeout_s=10).axioms == first.axioms


def test_a_query_pieced_from_printed_assertions_is_the_text_a_solver_prints():
    # The prover prints each axiom once and pieces each query's text together; the text decides
    # the unsat core recorded in the rule files, so it must be what printing the query gives:
    # with every axiom, a first fact without a tensor (sorts are printed first) and a function
    # whose declaration is longer than a line (printed over several).
    from pcgopt.verify.prove import _smt2_pieces, _smt2_text

    prover = Prover()
    tensor = z3.DeclareSort("Tensor")
    x, y = z3.Consts("x y", tensor)
    n = z3.Int("n")
    size = z3.Function("size", tensor, z3.IntSort(), z3.IntSort())
    wide = z3.Function("conv2d_r44_2_2_2_2", *[z3.IntSort()] * 10, tensor, tensor, tensor)
    assertions = [n >= 2, size(x, 0) == n, wide(*range(10), x, y) == y]
    assertions += [
        z3.Implies(z3.Bool(f"axiom:{name}"), formula)
        for name, (formula, _) in sorted(prover._formulas.items())
    ]
    solver = z3.Solver()
    solver.add(assertions)
    assert _smt2_text([_smt2_pieces(a) for a in assertions]) == solver.sexpr()
