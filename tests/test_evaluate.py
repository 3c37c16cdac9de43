"""The reference evaluator and the equivalence check, on Unity's Figure 2 plans among others."""

import numpy as np
import pytest

from pcgopt import (
    PCG,
    EvaluationError,
    Node,
    NotEquivalentError,
    PCGBuilder,
    PCGError,
    assert_equivalent,
    equivalent,
    evaluate,
    random_feeds,
)
from pcgopt.evaluate import index_bounds
from pcgopt.models import mnist_mlp

B, CI, H, CO = 8, 12, 8, 4  # Unity Figure 1's MLP at test size


def sources(b):
    """The MLP's input and weights, named as in the model."""
    return b.input((B, CI), name="x"), b.weight((CI, H), name="w1"), b.weight((H, CO), name="w2")


def original():
    return mnist_mlp(batch=B, in_features=CI, hidden=H, out_features=CO)


def figure_2a(d=2):
    """Sequential plan: MatMul+ReLU fused, then data parallelism (weights copied)."""
    b = PCGBuilder()
    x, w1, w2 = sources(b)
    xp = b.partition(x, dim=0, degree=d)
    h = b.linear(xp, b.replicate(w1, degree=d), activation="relu")
    y = b.matmul(h, b.replicate(w2, degree=d))
    return b.build(b.combine(y, dim=0, degree=d))


def figure_2b(d=2):
    """Joint plan: ReLU not fused; model parallelism then reduction parallelism."""
    b = PCGBuilder()
    x, w1, w2 = sources(b)
    h = b.relu(b.matmul(b.replicate(x, degree=d), b.partition(w1, dim=1, degree=d)))
    y = b.matmul(h, b.partition(w2, dim=0, degree=d))
    assert repr(y.shape) == f"f32[{B}, {CO}] r{d}(partial)"
    return b.build(b.reduce(y, degree=d))


@pytest.mark.parametrize("degree", [2, 4])
def test_unity_figure_2_plans_are_equivalent_to_the_model(degree):
    assert_equivalent(original(), figure_2a(degree))
    assert_equivalent(original(), figure_2b(degree))


def test_a_different_computation_is_not_equivalent():
    b = PCGBuilder()
    x, w1, w2 = sources(b)
    wrong = b.build(b.matmul(b.tanh(b.matmul(x, w1)), w2))
    assert not equivalent(original(), wrong)
    with pytest.raises(
        NotEquivalentError, match=r"output 0 .* differs on random inputs with seed 0"
    ):
        assert_equivalent(original(), wrong)


@pytest.mark.parametrize("trials", [0, -1, 2.5, True])
def test_comparing_on_no_random_input_is_refused(trials):
    # Zero trials compared nothing and called two different graphs equivalent.
    b = PCGBuilder()
    x, w1, w2 = sources(b)
    wrong = b.build(b.matmul(b.tanh(b.matmul(x, w1)), w2))
    with pytest.raises(PCGError, match="trials must be a positive int"):
        equivalent(original(), wrong, trials=trials)


def _log_of(transform):
    b = PCGBuilder()
    return b.build(transform(b, b.input((6, 4), name="x")))


def test_nan_outside_a_domain_agrees_with_nan_and_only_with_nan():
    # log of a standard normal input is NaN at about half the elements, in both graphs alike.
    plain = _log_of(lambda b, x: b.log(x))
    split = _log_of(lambda b, x: b.combine(b.log(b.partition(x, dim=0, degree=2)), dim=0, degree=2))
    assert equivalent(plain, split, compare="logical")
    guarded = _log_of(lambda b, x: b.log(b.relu(x)))  # -inf where the other is NaN
    with pytest.raises(NotEquivalentError, match=r"max \|difference\| inf"):
        assert_equivalent(plain, guarded)


def test_different_sources_are_not_equivalent():
    b = PCGBuilder()
    x, w = b.input((B, CI), name="x"), b.weight((CI, CO), name="w_other")
    other = b.build(b.matmul(x, w))
    with pytest.raises(NotEquivalentError, match=r"only in the second: \['w_other'\]"):
        assert_equivalent(original(), other)


def test_parallel_shapes_must_agree_unless_comparing_logical_values():
    b = PCGBuilder()
    x, w1, w2 = sources(b)
    h = b.relu(b.matmul(b.partition(x, dim=0, degree=2), b.replicate(w1, degree=2)))
    split_output = b.build(b.matmul(h, b.replicate(w2, degree=2)))
    assert not equivalent(original(), split_output)
    assert equivalent(original(), split_output, compare="logical")


def test_how_partial_sums_are_split_matters_only_when_comparing_shards():
    def reduction_parallel(swap_halves):
        b = PCGBuilder()
        x, w = b.input((4, 8), name="x"), b.weight((8, 3), name="w")
        if swap_halves:  # reorder the contraction: the partial sums come out in the other order
            x0, x1 = b.split(x, axis=1, sizes=(4, 4))
            w0, w1 = b.split(w, axis=0, sizes=(4, 4))
            x, w = b.concat(x1, x0, axis=1), b.concat(w1, w0, axis=0)
        y = b.matmul(b.partition(x, dim=1, degree=2), b.partition(w, dim=0, degree=2))
        return b.build(y)

    a, b = reduction_parallel(False), reduction_parallel(True)
    assert a.shape(a.outputs[0]) == b.shape(b.outputs[0])
    # Interchangeable: every reader of partial sums only sees their sum ...
    assert equivalent(a, b)
    assert equivalent(a, b, compare="logical")
    # ... but not the same storage.
    assert not equivalent(a, b, compare="shards")


def test_random_feeds_depend_on_names_not_order():
    a = PCG(
        [
            Node("x", "input", (), {"shape": (3,)}),
            Node("w", "weight", (), {"shape": (3,)}),
            Node("y", "add", ("x", "w")),
        ]
    )
    b = PCG(
        [
            Node("w", "weight", (), {"shape": (3,)}),
            Node("x", "input", (), {"shape": (3,)}),
            Node("y", "add", ("x", "w")),
        ]
    )
    fa, fb = random_feeds(a, seed=7), random_feeds(b, seed=7)
    for name in ("x", "w"):
        np.testing.assert_array_equal(fa[name], fb[name])
    assert not np.array_equal(fa["x"], fa["w"])
    assert not np.array_equal(fa["x"], random_feeds(a, seed=8)["x"])


def test_given_inputs_are_used_and_checked():
    g = original()
    x = np.ones((B, CI))
    ev = evaluate(g, {"x": x})
    np.testing.assert_array_equal(ev.feeds["x"], x)
    expected = np.maximum(x @ ev.feeds["w1"], 0) @ ev.feeds["w2"]
    np.testing.assert_allclose(ev.outputs[0].logical(), expected)
    with pytest.raises(
        EvaluationError, match=r"value for input 'x' has shape \(2, 2\), expected \(8, 12\)"
    ):
        evaluate(g, {"x": np.ones((2, 2))})
    with pytest.raises(EvaluationError, match="'nope', which are not Input or Weight nodes"):
        evaluate(g, {"nope": x})


def test_indices_are_range_checked():
    b = PCGBuilder()
    idx = b.input((4,), "i64", name="idx", max_value=10)
    g = b.build(b.embedding(idx, b.weight((10, 3), name="table")))
    assert evaluate(g).feeds["idx"].max() < 10
    with pytest.raises(EvaluationError, match=r"entries outside \[0, 10\)"):
        evaluate(g, {"idx": np.array([0, 1, 2, 10])})


def test_integer_evaluation_is_exact():
    ev = evaluate(figure_2b(), seed=3, dtype=np.int64)
    out = ev.outputs[0].logical()
    assert out.dtype == np.int64
    f = ev.feeds
    np.testing.assert_array_equal(out, np.maximum(f["x"] @ f["w1"], 0) @ f["w2"])


def test_every_shard_of_a_plan_is_available_by_device():
    ev = evaluate(figure_2b(4))
    y = ev["matmul_2"]
    assert y.shape.num_shards == 4
    np.testing.assert_allclose(sum(y.shards()), ev.outputs[0].logical())


def test_an_integer_weight_of_indices_gets_values_its_table_has_rows_for():
    # An index buffer into a 3-row table: random values below 4 would read a fourth row.
    b = PCGBuilder()
    ids = b.weight((6,), dtype="i64", trainable=False, name="ids")
    table = b.weight((3, 5), name="table")
    pcg = b.build(b.embedding(ids, table, name="rows"))
    assert index_bounds(pcg) == {"ids": 3}
    for seed in range(5):
        assert random_feeds(pcg, seed)["ids"].max() < 3
    assert equivalent(pcg, pcg)
