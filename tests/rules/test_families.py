"""Enumeration presets: the matrix set is enumerated as before, the transformer families reach
rank-3 and rank-4 tensors, and their runs merge into one rule set."""

import numpy as np
import pytest

from pcgopt.ops import get_op
from pcgopt.rewrite import Var, format_exprs, load_rules
from pcgopt.rules.candidates import canonical_text
from pcgopt.rules.enumerate import Config, Enumerator, InputSpec, fingerprint, input_values
from pcgopt.rules.families import (
    ATTENTION,
    COLLECTIVES,
    EMBEDDING_BAG_SINGLE_ONE,
    EMBEDDING_ONE,
    LINEAR,
    LINEAR_SMOOTH_ONE,
    MIN_RANK,
    PRESETS,
    RESHAPE_MERGE_ONE,
    RESHAPE_SPLIT_ONE,
)
from pcgopt.rules.generate import generate, merge, rule_file, rule_rank
from pcgopt.shapes import ParallelTensorShape
from pcgopt.sharded import ShardedArray


def test_the_matrix_preset_enumerates_matrices_as_flexflows_generator_does():
    config, smooth, softmax, nested = PRESETS["matrix"]
    assert smooth == LINEAR_SMOOTH_ONE
    assert repr(softmax.variants()[0]) == "softmax(axis=1)"
    # Dense layers split two ways at once: composed from one-operator splits of matrices.
    assert nested.nested and nested.one_op
    assert [repr(s.shape) for s in nested.inputs] == ["f32[2, 4]", "f32[4, 4]"]
    names = [repr(v) for v in config.variants()]
    assert "partition(dim=1, degree=2)" in names
    assert not any("dim=2" in n or "inputs=3" in n for n in names)
    assert MIN_RANK["matrix"] == 0


def test_transformer_families_split_every_axis_of_their_tensors():
    linear = [repr(v) for v in LINEAR.variants()]
    assert "partition(dim=2, degree=2)" in linear
    assert "linear(activation='gelu', inputs=3)" in linear  # with its bias
    attention = [repr(v) for v in ATTENTION.variants()]
    assert "partition(dim=3, degree=2)" in attention
    assert "softmax(axis=3)" in attention
    assert MIN_RANK["transformer"] == 3


def test_non_integer_values_keep_their_differences_in_the_fingerprint():
    softmax = get_op("softmax")
    shape = ParallelTensorShape.of((2, 4))
    a, b = (
        ShardedArray.from_logical(np.array(v, dtype=np.int64), shape)
        for v in ([[0, 1, 2, 3]] * 2, [[0, 2, 2, 3]] * 2)
    )
    params = softmax.make_params({"axis": 1}, (shape,))
    (sa,) = softmax.evaluate(params, (a,), (shape,))
    (sb,) = softmax.evaluate(params, (b,), (shape,))
    # Truncated to integers both would be all zeros.
    assert fingerprint(sa) != fingerprint(sb)
    (again,) = softmax.evaluate(params, (a,), (shape,))
    assert fingerprint(again) == fingerprint(sa)


def test_integer_values_hash_as_integers():
    (value, *_) = input_values(Config())
    as_float = ShardedArray.from_logical(value.logical().astype(np.float32), value.shape)
    assert fingerprint(as_float) == fingerprint(value)


RANK3 = Config(
    max_ops=2,
    ops=("gelu", "partition", "combine", "replicate"),
    inputs=(InputSpec("x1", "data", ParallelTensorShape.of((2, 4, 6))),),
)


@pytest.fixture(scope="module")
def rank3_run(tmp_path_factory):
    return generate(RANK3, workers=1, work_dir=tmp_path_factory.mktemp("work"), timeout=3)


def test_a_rank_3_enumeration_finds_rules_on_the_third_axis(rank3_run):
    split, gelu = "partition(v0, dim=2, degree=k)", "gelu(v0)"
    pair = {f"gelu({split})", f"partition({gelu}, dim=2, degree=k)"}
    found = [
        r for r in rank3_run.rules if set(canonical_text(r).split(" | ")[0].split(" => ")) == pair
    ]
    assert len(found) == 1, sorted(canonical_text(r) for r in rank3_run.rules)
    assert [d.rank for d in found[0].inputs.values()] == [3]


def test_merging_keeps_each_rule_once_and_only_those_of_the_preset_ranks(rank3_run):
    twice = merge([rank3_run, rank3_run])
    assert len(twice.rules) == len(rank3_run.rules)
    assert twice.stats.proved == 2 * rank3_run.stats.proved
    assert merge([rank3_run], min_rank=4).rules == []
    text = rule_file(merge([rank3_run], 3), (RANK3, RANK3))
    assert text.count('"max_ops": 2') == 2  # one header per family
    # The candidate-size limit shapes the result: a header records it where it was set.
    assert '"max_rule_ops": 6' in rule_file(rank3_run, LINEAR)
    assert "max_rule_ops" not in text


def test_a_preset_prefixes_its_rule_names(rank3_run):
    # The same untyped text at rank 2 and rank 3 hashes to one name: the prefix keeps the
    # shipped files' names apart, and the file's records follow the new names.
    merged = merge([rank3_run], 3, prefix="tf_")
    assert merged.rules and all(r.name.startswith("tf_r") for r in merged.rules)
    assert {r.name for r in merged.rules} <= merged.verdicts.keys()
    reloaded = load_rules(rule_file(merged, RANK3))
    assert [r.name for r, _ in reloaded] == [r.name for r in merged.rules]


def test_a_configuration_without_data_tensors_enumerates_matrix_axes():
    weights_only = Config(inputs=(InputSpec("w1", "weight", ParallelTensorShape.of((4, 4))),))
    names = [repr(v) for v in weights_only.variants()]
    assert "partition(dim=1, degree=2)" in names
    assert not any("dim=2" in n for n in names)


# -- one-operator families ----------------------------------------------------------------------

LAYER_NORM_SMALL = Config(
    one_op=True,
    ops=("layer_norm", "partition", "combine", "replicate"),
    inputs=(
        InputSpec("x1", "data", ParallelTensorShape.of((2, 4, 6))),
        InputSpec("g1", "weight", ParallelTensorShape.of((6,))),
        InputSpec("g2", "weight", ParallelTensorShape.of((6,))),
    ),
)


def test_a_one_operator_family_builds_only_the_operator_with_one_parallel_operator_per_tensor():
    e = Enumerator(LAYER_NORM_SMALL)
    assert e.shards() == 1  # one computing variant
    graphs = e.run(0).graphs
    assert graphs
    for g in graphs:
        (term,) = g.outputs
        inner = term.args[0] if term.op != "layer_norm" else term
        assert inner.op == "layer_norm", term
        for a in inner.args:  # each input bare or under one parallel operator
            assert isinstance(a, Var) or all(isinstance(b, Var) for b in a.args), term


@pytest.fixture(scope="module")
def layer_norm_run(tmp_path_factory):
    return generate(LAYER_NORM_SMALL, workers=1, work_dir=None, timeout=3)


def test_the_layer_norm_family_proves_its_data_parallel_rule_with_distinct_gamma_and_beta(
    layer_norm_run,
):
    texts = {f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}": r for r in layer_norm_run.rules}
    dp = (
        "layer_norm(partition(x1, dim=0, degree=k), replicate(x2, degree=k), "
        "replicate(x3, degree=k), normalized_dims=1, eps=1e-05) => "
        "partition(layer_norm(x1, x2, x3, normalized_dims=1, eps=1e-05), dim=0, degree=k)"
    )
    assert dp in texts, sorted(texts)
    assert [d.rank for d in texts[dp].inputs.values()] == [3, 1, 1]
    # Splitting the normalized axis is not a rule: each shard would normalize its own part.
    assert not any("partition(x1, dim=2" in t.split(" => ")[0] for t in texts)
    assert layer_norm_run.stats.refuted == 0


def test_a_scale_factor_and_a_dropout_rate_are_lifted_to_symbols(tmp_path):
    config = Config(
        one_op=True,
        ops=("scale", "dropout", "partition", "combine", "replicate"),
        inputs=(InputSpec("x1", "data", ParallelTensorShape.of((2, 4, 6))),),
    )
    gen = generate(config, workers=1, work_dir=None, timeout=3)
    texts = [f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}" for r in gen.rules]
    assert "scale(partition(x1, dim=0, degree=k), factor=factor) => " in "\n".join(texts)
    assert any("dropout(" in t and "rate=rate" in t for t in texts), texts
    assert gen.stats.refuted == 0 and gen.stats.unknown == 0
    # A rule holds for every factor: the shipped-file header says it was one-operator.
    assert '"one_op": true' in rule_file(gen, config)


def test_merging_keeps_the_same_rule_text_at_two_ranks_under_two_names(rank3_run):
    # Dimensions 0 and 1 of size 1 cannot be split: the rank-4 rules are those on dimensions 2
    # and 3, one of them with the text of a rank-3 rule (3 rules to prove, not 19).
    rank4 = generate(
        Config(
            one_op=True,
            ops=("gelu", "partition"),
            inputs=(InputSpec("x1", "data", ParallelTensorShape.of((1, 1, 4, 4))),),
        ),
        workers=1,
        work_dir=None,
        timeout=3,
    )
    merged = merge([rank3_run, rank4], 3, prefix="tf_")
    names = [r.name for r in merged.rules]
    assert len(names) == len(set(names))
    ranks = {}
    for r in merged.rules:
        ranks.setdefault(r.name.split("_")[1], set()).add(r.inputs["x1"].rank)
    assert any(found == {3, 4} for found in ranks.values()), ranks
    # Every kept rule has its own verdict: the file can be written and read back.
    assert len(load_rules(rule_file(merged, RANK3))) == len(merged.rules)


@pytest.fixture(scope="module")
def embedding_run():
    return generate(EMBEDDING_ONE, workers=1, work_dir=None, timeout=3)


def test_the_embedding_family_splits_ids_by_batch_and_the_table_by_vocabulary_or_hidden(
    embedding_run,
):
    texts = {f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}" for r in embedding_run.rules}
    batch = (
        "embedding(partition(x1, dim=0, degree=k), replicate(x2, degree=k)) => "
        "partition(embedding(x1, x2), dim=0, degree=k)"
    )
    hidden = (
        "embedding(replicate(x1, degree=k), partition(x2, dim=1, degree=k)) => "
        "partition(embedding(x1, x2), dim=2, degree=k)"
    )
    # Each shard of the vocabulary looks up the rows it holds: partial sums.
    vocabulary = (
        "reduce(embedding(replicate(x1, degree=k), partition(x2, dim=0, degree=k)), "
        "degree=k) => embedding(x1, x2)"
    )
    assert {batch, hidden, vocabulary} <= texts, sorted(texts)
    assert embedding_run.stats.refuted == 0 and embedding_run.stats.unknown == 0
    assert all(repr(r.inputs["x1"]).startswith("i64[") for r in embedding_run.rules)


def test_a_rule_counts_the_rank_of_what_it_computes(embedding_run):
    # The ids and the table are matrices, the lookup is [B, S, H]: the transformer preset keeps
    # the embedding's rules although no input has rank 3.
    assert all(max(d.rank for d in r.inputs.values()) == 2 for r in embedding_run.rules)
    assert all(rule_rank(r) == 3 for r in embedding_run.rules)
    assert len(merge([embedding_run], MIN_RANK["transformer"]).rules) == len(embedding_run.rules)


def test_the_collectives_family_gathers_a_column_split_activation():
    gen = generate(COLLECTIVES, workers=1, work_dir=None, timeout=3)
    texts = {f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}" for r in gen.rules}
    assert (
        "all_gather(partition(x1, dim=2, degree=k), dim=2, degree=k) => replicate(x1, degree=k)"
        in texts
    ), sorted(texts)
    assert gen.stats.refuted == 0


HEADS_SHAPE = "shape=(size(x1, 0), size(x1, 1), parts, (size(x1, 2)/parts))"
MERGED_SHAPE = "shape=(size(x1, 0), size(x1, 1), size(x1, 2)*size(x1, 3))"


@pytest.mark.parametrize(
    ("family", "rule"),
    [
        # Megatron's attention: a hidden dimension split by whole heads is a split of the heads.
        (
            RESHAPE_SPLIT_ONE,
            f"reshape(partition(x1, dim=2, degree=k), {HEADS_SHAPE}) => "
            f"partition(reshape(x1, {HEADS_SHAPE}), dim=2, degree=k)",
        ),
        (
            RESHAPE_SPLIT_ONE,
            f"reshape(partition(x1, dim=0, degree=k), {HEADS_SHAPE}) => "
            f"partition(reshape(x1, {HEADS_SHAPE}), dim=0, degree=k)",
        ),
        (
            RESHAPE_MERGE_ONE,
            f"reshape(partition(x1, dim=2, degree=k), {MERGED_SHAPE}) => "
            f"partition(reshape(x1, {MERGED_SHAPE}), dim=2, degree=k)",
        ),
    ],
)
def test_the_reshape_families_lift_the_heads_to_a_symbol_and_prove_their_splits(family, rule):
    gen = generate(family, workers=1, work_dir=None, timeout=3)
    texts = {f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}" for r in gen.rules}
    assert rule in texts, sorted(texts)
    assert gen.stats.not_general == 0 and gen.stats.refuted == 0 and gen.stats.unknown == 0


def test_a_reshape_rule_that_moves_a_split_to_the_wrong_dimension_is_refuted():
    from pcgopt.rewrite import Rule
    from pcgopt.verify.prove import verify_rule

    def split_heads_then(dim: int) -> Rule:
        """Heads split off a hidden dimension split in two = the heads' tensor split on ``dim``."""
        return Rule.parse(
            f"to_dim_{dim}",
            f"reshape(partition(x1, dim=2, degree=k), {HEADS_SHAPE})",
            f"partition(reshape(x1, {HEADS_SHAPE}), dim={dim}, degree=k)",
            {"x1": "[a, b, c]"},
            {"a": 2, "b": 4, "c": 8},
        )

    assert verify_rule(split_heads_then(2)).status == "proved"
    verdict = verify_rule(split_heads_then(3))
    assert verdict.status == "refuted" and "parallel shapes differ" in verdict.counterexample


@pytest.mark.parametrize(
    ("lhs", "rhs", "status"),
    [
        # Megatron's row-parallel layer adds the bias after the all-reduce of the partial
        # product: the dense layer is its product plus a bias, whichever side the bias is on.
        ("add(x1, matmul(x2, x3))", "linear(x2, x3, x1, activation='none')", "proved"),
        ("add(matmul(x2, x3), x1)", "linear(x2, x3, x1, activation='none')", "proved"),
        ("add(x1, matmul(x2, x3))", "linear(x2, x3, x1, activation='gelu')", "refuted"),
        # The activation after the biased product (Unity's Figure 2b unfuses it).
        (
            "gelu(linear(x2, x3, x1, activation='none'))",
            "linear(x2, x3, x1, activation='gelu')",
            "proved",
        ),
        (
            "linear(gelu(x2), x3, x1, activation='none')",
            "linear(x2, x3, x1, activation='gelu')",
            "refuted",
        ),
        # The bias added to every copy of an all-reduced product.
        (
            "add(replicate(x2, degree=k), replicate(x1, degree=k))",
            "replicate(add(x2, x1), degree=k)",
            "proved",
        ),
        # A bias split like the hidden dimension it is added to.
        (
            "add(partition(x2, dim=2, degree=k), partition(x1, dim=0, degree=k))",
            "partition(add(x2, x1), dim=2, degree=k)",
            "proved",
        ),
        (
            "add(partition(x2, dim=1, degree=k), partition(x1, dim=0, degree=k))",
            "partition(add(x2, x1), dim=1, degree=k)",
            "refuted",
        ),
    ],
)
def test_a_dense_layer_is_its_product_and_a_broadcast_bias_add(lhs, rhs, status):
    from pcgopt.rewrite import Rule
    from pcgopt.verify.prove import verify_rule

    inputs = {"x1": "[d]", "x2": "[a, b, c]", "x3": "[c, d]"}
    if "x3" not in lhs:
        inputs = {"x1": "[c]", "x2": "[a, b, c]"}
    rule = Rule.parse("bias", lhs, rhs, inputs)
    assert verify_rule(rule).status == status


def test_the_shipped_transformer_rules_hold_the_row_parallel_layers_bias_rules():
    from pcgopt.rules import TRANSFORMER_RULES_FILE, load

    shipped = {
        (f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}", str(dict(r.inputs)))
        for r in load(TRANSFORMER_RULES_FILE)
    }
    bias = "{'x1': f32[a, b, c], 'x2': f32[c]}"
    assert (
        "add(x1, matmul(x2, x3)) => linear(x2, x3, x1, activation='none')",
        "{'x1': f32[d], 'x2': f32[a, b, c], 'x3': f32[c, d]}",
    ) in shipped
    assert ("add(x1, x2) => add(x2, x1)", bias) in shipped
    assert (
        "gelu(linear(x1, x2, x3, activation='none')) => linear(x1, x2, x3, activation='gelu')",
        "{'x1': f32[a, b, c], 'x2': f32[c, d], 'x3': f32[d]}",
    ) in shipped
    assert (
        "add(replicate(x1, degree=k), replicate(x2, degree=k)) => replicate(add(x1, x2), degree=k)",
        bias,
    ) in shipped


def test_a_bag_of_one_id_gets_rules_of_its_own_with_the_bag_size_fixed_at_one():
    # A letter stands for 2 or more, so XDL's and DLRM's bags of one id ([batch, 1]) need rules
    # that say 1.
    gen = generate(EMBEDDING_BAG_SINGLE_ONE, workers=1, work_dir=None, timeout=5)
    texts = {f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}" for r in gen.rules}
    batch = (
        "embedding_bag(partition(x1, dim=0, degree=k), replicate(x2, degree=k)) => "
        "partition(embedding_bag(x1, x2), dim=0, degree=k)"
    )
    assert batch in texts, sorted(texts)
    assert all(repr(r.inputs["x1"]) == "i64[a, 1]" for r in gen.rules)
    assert gen.stats.refuted == 0


def test_the_shipped_matrix_rules_split_dense_layers_with_every_activation():
    from pcgopt.rules import RULES_FILE, load

    texts = {f"{format_exprs(r.lhs)} => {format_exprs(r.rhs)}" for r in load(RULES_FILE)}
    for activation in ("none", "gelu", "sigmoid", "tanh"):
        batch = (
            f"linear(partition(x1, dim=0, degree=k), replicate(x2, degree=k), "
            f"activation='{activation}') => "
            f"partition(linear(x1, x2, activation='{activation}'), dim=0, degree=k)"
        )
        assert batch in texts, activation
