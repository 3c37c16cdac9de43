"""Named enumeration presets: which small graphs the rule-generation job enumerates.

``matrix`` is the default set behind ``rules.json``: matrices ([2, 4] data, [4, 4] weights),
the operators of FlexFlow's generated rules, up to 3 operators, and one-operator families of
dense layers with the activations that enumeration leaves out (GELU, sigmoid, tanh), of a
row softmax, and of dense layers split two ways at once (``LINEAR_NESTED``). Its rules
are typed on rank-2 tensors, so they never match a transformer's [batch, sequence, hidden]
activations or its [batch, heads, sequence, head-dim] attention tensors. ``lookups`` is the
embedding bags' (rank 2 too, but only a model with embedding bags loads them).

``transformer`` is a list of small *families*, each one operator group at the ranks a
transformer uses, with the parallel operators that split, copy, gather and reduce. Enumerating
them together would multiply every family's graphs by every other's; their rules meet only in
the e-graph, so each family is enumerated on its own and the proved rules are merged.
Only rules with a tensor of rank 3 or more are kept (the matrix set covers ranks 1 and 2).

The shipped ``rules_transformer.json`` holds the dense-layer family (enumerated in full) and
one-operator families (``Config.one_op``): each computing operator of a transformer layer with at
most one parallel operator on each input and on its output, which is where its parallelization
rules come from (``layer_norm(partition(x, dim=0), replicate(g), replicate(b)) =
partition(layer_norm(x, g, b), dim=0)``). The full enumeration of the norm family does not
finish on a laptop (four inputs, three operators and three split kinds on three axes: after 36
minutes on 2 cores one of its ten shards had written 308 MB of graphs); its one-operator form
takes seconds. The token and position lookups (``embedding`` of integer ids) are a one-operator
family too, and ``COLLECTIVES`` are the parallel operators alone on [B, S, H] (how one layout
becomes another). The attention heads' reshapes are two one-operator families, their target
shapes lifted to the input's sizes and a symbol for the number of heads (``parts``); a
reshape's parallel structure depends on its sizes, so the verifier reads it at the example and
the e-graph guards the size relations under which it is the same
(:meth:`~pcgopt.ops.spec.ComputeOp.signature_conditions`). A dense layer's split into its
product and a bias add (``LINEAR_DECOMPOSE``) and the bias add's own splits (``BIAS_ADD_ONE``)
are what a row-parallel layer needs: Megatron all-reduces the partial product before adding
the bias. ``LINEAR_ACTIVATION`` takes a dense layer's activation out of it, which Unity's
Figure 2b needs for a GELU layer. ``LINEAR_BIAS_NESTED`` composes the dense layer's
one-level splits into splits two ways at once (AutoDDL's 2D matmul splits).
``NORM`` and ``ATTENTION`` are the full enumerations, kept so they can be run (``generate(NORM)``).
"""

from __future__ import annotations

from dataclasses import replace

from pcgopt.ops.parallel import MICRO_BATCH_OPS
from pcgopt.rules.enumerate import Config, InputSpec
from pcgopt.shapes import ParallelTensorShape

_SPLITS = ("partition", "combine", "replicate", "reduce")


def _x(name: str, sizes: tuple[int, ...], cls: str = "data") -> InputSpec:
    return InputSpec(name, cls, ParallelTensorShape.of(sizes))


#: Dense layers on [B, S, H] activations: with a bias and an activation (fused, as models
#: write them) and without (whose contraction may leave partial sums).
LINEAR = Config(
    max_ops=4,
    max_rule_ops=6,
    ops=("linear_bias", "linear_plain", *_SPLITS),
    inputs=(_x("x1", (2, 4, 6)), _x("w1", (6, 6), "weight"), _x("b1", (6,), "bias")),
)

#: Residual adds, LayerNorm and GELU on [B, S, H].
NORM = Config(
    max_ops=4,
    max_rule_ops=6,
    ops=("add", "gelu", "layer_norm", *_SPLITS[:3]),
    inputs=(
        _x("x1", (2, 4, 6)),
        _x("x2", (2, 4, 6)),
        _x("g1", (6,), "weight"),
        _x("g2", (6,), "weight"),
    ),
)

#: Attention: heads split off the hidden dimension and moved before the sequence, batched
#: matmuls, scaling and softmax over the keys.
ATTENTION = Config(
    max_ops=3,
    ops=("reshape_heads", "transpose_heads", "batch_matmul", "scale", "softmax", *_SPLITS[:3]),
    inputs=(
        _x("x1", (2, 2, 4, 4)),
        _x("x2", (2, 2, 4, 4)),
        _x("h1", (2, 4, 8), "hidden"),
    ),
)

#: One-operator families (``Config.one_op``): LayerNorm with distinct gamma and beta.
LAYER_NORM_ONE = Config(
    one_op=True,
    ops=("layer_norm", *_SPLITS),
    inputs=(_x("x1", (2, 4, 6)), _x("g1", (6,), "weight"), _x("g2", (6,), "weight")),
)

#: Elementwise operators on [B, S, H], with the [S, H] add of a position embedding.
ELEMENTWISE_ONE = Config(
    one_op=True,
    ops=("add", "dropout", "gelu", "scale", *_SPLITS),
    inputs=(_x("x1", (2, 4, 6)), _x("x2", (2, 4, 6)), _x("p1", (4, 6), "weight")),
)

#: Attention on [B, heads, S, head-dim]: head transposes, batched matmuls, scaling, softmax
#: over the keys, dropout.
ATTENTION_ONE = Config(
    one_op=True,
    ops=("transpose_heads", "batch_matmul", "scale", "softmax", "dropout", *_SPLITS),
    inputs=(_x("x1", (2, 2, 4, 4)), _x("x2", (2, 2, 4, 4))),
)

#: [B, S, H] times a matrix without a bias (tied output logits).
MATMUL_ONE = Config(
    one_op=True,
    ops=("matmul", *_SPLITS),
    inputs=(_x("x1", (2, 4, 6)), _x("w1", (6, 6), "weight")),
)

#: Token and position lookups: integer ids [B, S] into a [vocabulary, H] table (split by the
#: batch, the sequence, the hidden dimension, or the vocabulary with partial sums).
EMBEDDING_ONE = Config(
    one_op=True,
    ops=("embedding", *_SPLITS),
    inputs=(
        InputSpec("i1", "ids", ParallelTensorShape.of((2, 4), "i64")),
        _x("t1", (4, 6), "weight"),
    ),
    split_rank=3,
)

#: The parallel operators alone on [B, S, H], collectives included: how a layout becomes
#: another (``all_gather(partition(x, dim=2)) = replicate(x)`` after Megatron's column split).
COLLECTIVES = Config(
    max_ops=2,
    ops=(
        *_SPLITS,
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "discard_copies",
    ),
    inputs=(
        _x("x1", (2, 4, 6)),
        InputSpec("p1", "partial", ParallelTensorShape.of((2, 4, 6), sum_degree=2)),
    ),
)

#: A dense layer written as its product and a bias add (``linear(x, w, b) = add(matmul(x, w),
#: b)``): Megatron's row-parallel layer all-reduces the partial product *before* the bias.
LINEAR_DECOMPOSE = Config(
    max_ops=2,
    ops=("linear_bias", "matmul", "add"),
    inputs=(_x("x1", (2, 4, 6)), _x("w1", (6, 6), "weight"), _x("b1", (6,), "bias")),
)

#: A dense layer's activation applied after it (``linear(x, w, b, activation='gelu') =
#: gelu(linear(x, w, b))``): with ``LINEAR_DECOMPOSE`` it unfuses BERT's first feed-forward
#: layer into a product, a bias add and a GELU, so the product can be reduction-parallel and
#: all-reduced before the bias and the activation (Unity's Figure 2b).
LINEAR_ACTIVATION = Config(
    max_ops=2,
    ops=("linear_bias", "gelu"),
    inputs=(_x("x1", (2, 4, 6)), _x("w1", (6, 6), "weight"), _x("b1", (6,), "bias")),
)

#: The bias add alone, [B, S, H] plus a broadcast [H], with the splits that pass through it.
BIAS_ADD_ONE = Config(
    one_op=True,
    ops=("add", *_SPLITS),
    inputs=(_x("x1", (2, 4, 6)), _x("b1", (6,), "bias")),
)

#: Bags of lookups (a recommender's sparse features): integer ids [N, L] into a [rows, H] table,
#: summed over each bag of L (split by the batch, the table's columns, or its rows or the bag
#: with partial sums). Every tensor has rank 2, so this is a preset of its own (``lookups``):
#: the transformer preset keeps only rules with a tensor of rank 3.
EMBEDDING_BAG_ONE = Config(
    one_op=True,
    ops=("embedding_bag", *_SPLITS),
    inputs=(
        InputSpec("i1", "ids", ParallelTensorShape.of((2, 4), "i64")),
        _x("t1", (4, 6), "weight"),
    ),
    split_rank=2,
)

#: Bags of one id each (a categorical feature with one value per sample, as in DLRM and XDL):
#: a rule's lettered size stands for 2 or more, so bags of length 1 need rules of their own.
EMBEDDING_BAG_SINGLE_ONE = replace(
    EMBEDDING_BAG_ONE,
    inputs=(
        InputSpec("i1", "ids", ParallelTensorShape.of((2, 1), "i64")),
        _x("t1", (4, 6), "weight"),
    ),
)

#: Attention's head reshapes, one operator: [B, S, H] -> [B, S, heads, H/heads] (the number of
#: heads a symbol, ``parts``) and [B, S, h, d] -> [B, S, h*d] back, with the splits that pass
#: through them (the batch, the sequence, and the hidden dimension as whole heads).
RESHAPE_SPLIT_ONE = Config(
    one_op=True,
    ops=("reshape_split", *_SPLITS),
    inputs=(_x("x1", (2, 4, 8)),),
)
RESHAPE_MERGE_ONE = Config(
    one_op=True,
    ops=("reshape_merge", *_SPLITS),
    inputs=(_x("x1", (2, 4, 2, 4)),),
)

#: Layouts of two degrees (``layouts`` preset): Partition and Replicate at degrees 2, 3 and 6,
#: lifted to ``k``, ``j`` and ``k*j``, on one tensor of each rank a model uses (1: biases and
#: LayerNorm's gamma and beta; 2: weights; 3 and 4: activations and attention). A plan that
#: is data-parallel over ``dp`` devices and tensor-parallel over ``tp`` copies a bias
#: ``dp*tp`` times and splits a weight ``tp`` ways on ``dp`` copies; the e-graph composes the
#: same layouts in other orders (``replicate(replicate(b, degree=dp), degree=tp)``), and these
#: rules are what relate them.
LAYOUTS = tuple(
    Config(
        max_ops=2,
        degree=2,
        second_degree=3,
        ops=("partition", "replicate"),
        inputs=(_x("x1", (6,) * rank),),
    )
    for rank in (1, 2, 3, 4)
)

#: Dense layers of matrices with the activations the matrix enumeration leaves out (GELU,
#: sigmoid, tanh: a recommender's last layer), one operator with its splits.
LINEAR_SMOOTH_ONE = Config(
    one_op=True,
    ops=("linear_smooth", *_SPLITS),
    inputs=(_x("x1", (2, 4)), _x("w1", (4, 4), "weight")),
)

#: A softmax over a matrix's rows (a classifier's last operator: Unity's MLP ends in one), one
#: operator with its splits: the batch splits through it, the axis it normalizes does not.
SOFTMAX_ONE = Config(
    one_op=True,
    ops=("softmax", *_SPLITS),
    inputs=(_x("x1", (2, 4)),),
)

#: Dense layers of matrices split two ways at once (ReLU and none): their one-operator splits
#: composed pairwise (``Config.nested``, :mod:`pcgopt.rules.nesting`), e.g. a batch split of
#: ``k`` by a column split of ``j`` on ``k*j`` devices, the layout of each branch of the
#: branch-parallel plans of Unity's MLP and CANDLE-Uno.
LINEAR_NESTED = Config(
    one_op=True,
    nested=True,
    ops=("linear", *_SPLITS),
    inputs=(_x("x1", (2, 4)), _x("w1", (4, 4), "weight")),
)

#: A transformer's dense layers on [B, S, H] (with a bias, and without), split two ways at
#: once (:mod:`pcgopt.rules.nesting`): the batch or the sequence by the columns, either by the
#: contraction, the batch by the sequence; AutoDDL's 2D matmul splits of a layer, reached in one
#: rewrite instead of only through the cleanup rules.
LINEAR_BIAS_NESTED = Config(
    one_op=True,
    nested=True,
    ops=("linear_bias", "linear_plain", *_SPLITS),
    inputs=(_x("x1", (2, 4, 6)), _x("w1", (6, 6), "weight"), _x("b1", (6,), "bias")),
)

#: Micro-batches (``pipeline`` preset): Pipeline and Batch through one operator of each kind a
#: model pipelines (``relu(pipeline(x, dim=0, micro_batches=k)) = pipeline(relu(x), dim=0,
#: micro_batches=k)``), on matrices and on a transformer's ranks, and their relation to the
#: splits (``pipeline(partition(x))``). Every rule has Pipeline or Batch on a side, so the
#: e-graph, which does not model micro-batches, never loads them (:data:`OPT_IN`); they are the
#: proofs that cutting a whole PCG into micro-batches keeps what it computes.
_MICRO = ("pipeline", "batch")
PIPELINE = (
    Config(
        one_op=True,
        ops=("linear", "relu", "softmax", "add", *_MICRO),
        inputs=(_x("x1", (2, 4)), _x("x2", (2, 4)), _x("w1", (4, 4), "weight")),
    ),
    Config(
        one_op=True,
        ops=("linear_bias", "linear_plain", "layer_norm", *_MICRO),
        inputs=(_x("x1", (2, 4, 6)), _x("w1", (6, 6), "weight"), _x("b1", (6,), "bias")),
    ),
    Config(
        one_op=True,
        ops=("add", "gelu", "dropout", "matmul", *_MICRO),
        inputs=(_x("x1", (2, 4, 6)), _x("x2", (2, 4, 6)), _x("w1", (6, 6), "weight")),
    ),
    Config(
        one_op=True,
        ops=("transpose_heads", "batch_matmul", "scale", "softmax", *_MICRO),
        inputs=(_x("x1", (2, 2, 4, 4)), _x("x2", (2, 2, 4, 4))),
    ),
    Config(
        one_op=True,
        ops=("reshape_split", *_MICRO),
        inputs=(_x("x1", (2, 4, 8)),),
    ),
    Config(
        one_op=True,
        ops=("embedding", *_MICRO),
        inputs=(
            InputSpec("i1", "ids", ParallelTensorShape.of((2, 4), "i64")),
            _x("t1", (4, 6), "weight"),
        ),
        split_rank=3,
    ),
    Config(
        max_ops=2,
        ops=("partition", "combine", "replicate", *_MICRO),
        inputs=(_x("x1", (4, 4)),),
    ),
)

PRESETS: dict[str, tuple[Config, ...]] = {
    "matrix": (Config(), LINEAR_SMOOTH_ONE, SOFTMAX_ONE, LINEAR_NESTED),
    "transformer": (
        LINEAR,
        LAYER_NORM_ONE,
        ELEMENTWISE_ONE,
        ATTENTION_ONE,
        MATMUL_ONE,
        EMBEDDING_ONE,
        COLLECTIVES,
        RESHAPE_SPLIT_ONE,
        RESHAPE_MERGE_ONE,
        LINEAR_DECOMPOSE,
        BIAS_ADD_ONE,
        LINEAR_ACTIVATION,
        LINEAR_BIAS_NESTED,
    ),
    "layouts": LAYOUTS,
    "lookups": (EMBEDDING_BAG_ONE, EMBEDDING_BAG_SINGLE_ONE),
    "pipeline": PIPELINE,
}

#: What a preset's rule names start with (:func:`pcgopt.rules.generate.merge`).
NAME_PREFIX = {
    "matrix": "",
    "transformer": "tf_",
    "layouts": "ly_",
    "lookups": "lk_",
    "pipeline": "pp_",
}

#: The operators of which a preset's every rule has one on a side (the others its families
#: find are another preset's).
USES = {"pipeline": MICRO_BATCH_OPS}

#: The operators of which a preset's every rule has one on each side: such a preset can rewrite
#: only a PCG with one of them (the e-graph leaves it out elsewhere).
OPERATORS_OF = {"lookups": ("embedding_bag",)}

#: The lowest rank a preset's rules must touch to be kept (ranks below are another preset's).
MIN_RANK = {"matrix": 0, "transformer": 3, "layouts": 0, "lookups": 0, "pipeline": 0}
