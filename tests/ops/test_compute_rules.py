"""Parallel shape rules of compute operators: what is legal, what is rejected and why, counts."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcgopt import OPERATORS, DegreeError, ShapeError, get_op
from pcgopt.ops.layout import reshape_groups
from pcgopt.shapes import ParallelTensorShape as S
from pcgopt.testing.strategies import op_instances


def infer(op, *shapes, **params):
    spec = get_op(op)
    ins = tuple(S.parse(s) for s in shapes)
    return spec.infer(spec.make_params(params, ins), ins)


@pytest.mark.parametrize(
    ("op", "inputs", "params", "expected"),
    [
        # data parallelism: rows split, weight copied
        ("matmul", ("f32[64/2, 784]", "f32[784, 512] r2"), {}, "f32[64/2, 512]"),
        # model parallelism: columns split, activations copied
        ("matmul", ("f32[64, 784] r2", "f32[784, 512/2]"), {}, "f32[64, 512/2]"),
        # reduction parallelism: contraction split -> partial sums (Unity Figure 2b)
        ("matmul", ("f32[64, 512/2]", "f32[512/2, 10]"), {}, "f32[64, 10] r2(partial)"),
        # partial input times a copied operand stays partial (linearity)
        ("matmul", ("f32[64, 8] r2(partial)", "f32[8, 4] r2"), {}, "f32[64, 4] r2(partial)"),
        # AutoDDL Figure 6: input (S0, B, S1), weight (B, S1, S0) -> output (S0, S1, P)
        ("matmul", ("f32[8/2, 8/2] r2", "f32[8/2, 8/2] r2"), {}, "f32[8/2, 8/2] r2(partial)"),
        # attention heads: batch split needs no copies
        ("batch_matmul", ("f32[2, 16/4, 8, 4]", "f32[2, 16/4, 4, 8]"), {}, "f32[2, 16/4, 8, 8]"),
        ("relu", ("f32[8/2, 4] r3",), {}, "f32[8/2, 4] r3"),
        ("dropout", ("f32[8] r2(partial)",), {}, "f32[8] r2(partial)"),
        (
            "add",
            ("f32[8/2, 4] r2(partial)", "f32[8/2, 4] r2(partial)"),
            {},
            "f32[8/2, 4] r2(partial)",
        ),
        ("add", ("f32[8/2, 4]", "f32[4] r2"), {}, "f32[8/2, 4]"),  # broadcast bias is copied
        ("mul", ("f32[8] r2(partial)", "f32[8] r2"), {}, "f32[8] r2(partial)"),
        ("softmax", ("f32[8/2, 6]",), {"axis": -1}, "f32[8/2, 6]"),
        ("reshape", ("f32[2, 4, 12/4]",), {"shape": (2, 4, 4, 3)}, "f32[2, 4, 4/4, 3]"),
        ("embedding", ("i64[8/2]", "f32[10, 4] r2"), {}, "f32[8/2, 4]"),
        # vocabulary-split table: DLRM's model-parallel embedding, partial sums out
        ("embedding_bag", ("i64[8, 3] r2", "f32[10/2, 4]"), {}, "f32[8, 4] r2(partial)"),
        (
            "conv2d",
            ("f32[4/2, 6, 5, 5]", "f32[8, 6, 3, 3] r2"),
            {"padding": 1},
            "f32[4/2, 8, 5, 5]",
        ),
        # grouped conv: channels of x and w split together by a divisor of groups
        ("conv2d", ("f32[1, 8/2, 5, 5]", "f32[4/2, 2, 3, 3]"), {"groups": 4}, "f32[1, 4/2, 3, 3]"),
        ("reduce_sum", ("f32[4, 6/3]",), {"axes": (1,)}, "f32[4] r3(partial)"),
        ("split", ("f32[4/2, 6]",), {"axis": 1, "sizes": (2, 4)}, "f32[4/2, 2]"),
        # spatial parallelism where windows do not overlap: pooling 2x2/2, patchifying convs
        ("pool2d", ("f32[2, 3, 8/2, 8]",), {"kernel": 2}, "f32[2, 3, 4/2, 4]"),
        (
            "conv2d",
            ("f32[2, 3, 8/4, 8/2]", "f32[5, 3, 2, 2] r8"),
            {"stride": 2},
            "f32[2, 5, 4/4, 4/2]",
        ),
        ("conv2d", ("f32[2, 3, 8/2, 8]", "f32[5, 3, 1, 1] r2"), {}, "f32[2, 5, 8/2, 8]"),
        ("dropout", ("f32[8/2] r3(partial)",), {"rate": 0.5}, "f32[8/2] r3(partial)"),
        # masks: a split mask picks from equally split operands; a broadcast one is copied
        ("compare", ("f32[8/2, 4]", "f32[4] r2"), {"relation": "lt"}, "f32[8/2, 4]"),
        ("where", ("f32[8/2, 4]", "f32[8/2, 4]", "f32[1] r2"), {}, "f32[8/2, 4]"),
        ("cast", ("i64[8/2, 4]",), {"dtype": "f32"}, "f32[8/2, 4]"),
        # a zero pad is linear; the unpadded dimensions split
        (
            "pad",
            ("f32[8/2, 4] r2(partial)",),
            {"low": (0, 1), "high": (0, 1)},
            "f32[8/2, 6] r2(partial)",
        ),
        ("top_k", ("f32[8/4, 16]",), {"k": 2}, "f32[8/4, 2]"),
    ],
)
def test_legal_parallelizations(op, inputs, params, expected):
    assert repr(infer(op, *inputs, **params)[0]) == expected


@pytest.mark.parametrize(
    ("op", "inputs", "params", "message"),
    [
        ("relu", ("f32[8] r2(partial)",), {}, "not linear in x; Reduce it first"),
        ("add", ("f32[8] r2(partial)", "f32[8] r2"), {}, "same number of partial sums"),
        ("mul", ("f32[8] r2(partial)", "f32[8] r2(partial)"), {}, "must be copied a multiple of 2"),
        ("matmul", ("f32[64/2, 784]", "f32[784, 512]"), {}, "b must be copied a multiple of 2"),
        ("matmul", ("f32[64, 784/2]", "f32[784, 512]"), {}, "both index the 'k' axis"),
        ("matmul", ("f32[64/2, 784] r2", "f32[784, 512] r2"), {}, "replicated consistently"),
        ("softmax", ("f32[8, 6/2]",), {"axis": 1}, "cannot split that dimension"),
        ("conv2d", ("f32[1, 2, 6/2, 6]", "f32[2, 2, 3, 3]"), {}, "need a halo exchange"),
        ("pool2d", ("f32[1, 2, 6/2, 6]",), {"kernel": 3, "stride": 1}, "overlap or straddle"),
        ("linear", ("f32[4, 6/2]", "f32[6/2, 3]", "f32[3]"), {}, "split k on the unfused matmul"),
        ("linear", ("f32[4, 6/2]", "f32[6/2, 3]"), {"activation": "relu"}, "unfused matmul"),
        ("layer_norm", ("f32[4, 6/2]", "f32[6]", "f32[6]"), {}, "layer_norm normalizes over it"),
        ("reshape", ("f32[4, 6/2]",), {"shape": (24,)}, "not the outermost of dimensions"),
        ("conv2d", ("f32[1, 6/3, 5, 5]", "f32[6/3, 3, 3, 3]"), {"groups": 2}, "divisors of 2"),
        ("reduce_max", ("f32[4, 6/2]",), {"axes": (1,)}, "cannot split that dimension"),
        ("concat", ("f32[4/2]", "f32[4/2]"), {"axis": 0}, "cannot split that dimension"),
        ("compare", ("f32[8] r2(partial)", "f32[8] r2"), {}, "not linear in x"),
        ("where", ("f32[8]", "f32[8] r2(partial)", "f32[8]"), {}, "not linear in x"),
        ("pad", ("f32[8/2, 4]",), {"low": (1, 0), "high": (0, 0)}, "the pad of a block"),
        ("pad", ("f32[8] r2(partial)",), {"low": (1,), "high": (0,), "value": 1.0}, "not linear"),
        ("top_k", ("f32[8, 16/2]",), {"k": 2}, "the k largest of a block"),
        (
            "conv2d",
            ("f32[1, 2, 4/2, 4]", "f32[2, 2, 1, 1]"),
            {"input_dilation": 2},
            "transposed convolution",
        ),
    ],
)
def test_illegal_parallelizations_say_what_to_do(op, inputs, params, message):
    with pytest.raises(DegreeError, match=message):
        infer(op, *inputs, **params)


@pytest.mark.parametrize(
    ("op", "inputs", "params", "message"),
    [
        ("matmul", ("f32[4, 5]", "f32[6, 3]"), {}, r"contraction sizes differ.*5 vs 6"),
        ("matmul", ("f32[4, 5]", "f64[5, 3]"), {}, "one dtype"),
        ("add", ("f32[4, 5]", "f32[4, 6]"), {}, "do not broadcast"),
        ("concat", ("f32[4, 5]", "f32[3, 6]"), {"axis": 0}, "does not match"),
        ("reshape", ("f32[4, 5]",), {"shape": (3, 7)}, "20 elements"),
        ("split", ("f32[4, 5]",), {"axis": 1, "sizes": (2, 2)}, "add up to 4"),
        ("transpose", ("f32[4, 5]",), {"perm": (0, 0)}, "not a permutation"),
        ("embedding", ("f32[4]", "f32[10, 3]"), {}, "indices must be integers"),
        ("conv2d", ("f32[1, 4, 5, 5]", "f32[6, 3, 3, 3]"), {"groups": 3}, "groups=3 must divide"),
        ("conv2d", ("f32[1, 4, 2, 2]", "f32[6, 4, 3, 3]"), {}, "smaller than the kernel"),
        ("layer_norm", ("f32[4, 5]", "f32[4]", "f32[5]"), {}, "gamma must be"),
        ("relu", ("i64[4]",), {}, "floating-point"),
        ("dropout", ("f32[4]",), {"rate": 1.0}, r"rate must be in \[0, 1\)"),
        ("compare", ("i64[4]", "i64[4]"), {}, "floating-point"),
        ("where", ("f32[4]", "f32[3]", "f32[4]"), {}, "do not broadcast"),
        ("cast", ("f32[4]",), {"dtype": "i64"}, "floating-point dtype"),
        ("pad", ("f32[4, 5]",), {"low": (1,), "high": (1,)}, "one entry per dimension"),
        ("pad", ("f32[4]",), {"low": (-1,), "high": (0,)}, "negative pad is a slice"),
        ("top_k", ("f32[4, 5]",), {"k": 6}, "exceeds the size 5"),
    ],
)
def test_shape_errors(op, inputs, params, message):
    with pytest.raises(ShapeError, match=message):
        infer(op, *inputs, **params)


def counts(op, *shapes, per_shard=True, **params):
    """(FLOPs, bytes) of one task, or of the whole operator."""
    spec = get_op(op)
    ins = tuple(S.parse(s) for s in shapes)
    p = spec.make_params(params, ins)
    outs = spec.infer(p, ins)
    return (
        spec.flops(p, ins, outs, per_shard=per_shard),
        spec.bytes_accessed(p, ins, outs, per_shard=per_shard),
    )


def test_flop_counts():
    assert counts("matmul", "f32[64, 784]", "f32[784, 512]")[0] == 2 * 64 * 784 * 512
    # per shard: the contraction split 4 ways
    assert counts("matmul", "f32[64, 784/4]", "f32[784/4, 512]")[0] == 2 * 64 * 196 * 512
    assert counts("matmul", "f32[64, 784/4]", "f32[784/4, 512]", per_shard=False)[0] == (
        2 * 64 * 784 * 512
    )
    # conv: each output element costs 2 * (C/groups) * kh * kw
    assert counts("conv2d", "f32[1, 4, 5, 5]", "f32[6, 2, 3, 3]", groups=2)[0] == 2 * 54 * 2 * 9
    # a transposed convolution (input dilated 2x2) counts the products with real pixels only
    conv_t = counts("conv2d", "f32[1, 4, 5, 5]", "f32[6, 4, 3, 3]", input_dilation=2, padding=2)
    assert conv_t[0] == 2 * (6 * 11 * 11) * 4 * 9 // 4
    out = 8 * 3
    assert counts("linear", "f32[8, 5]", "f32[5, 3]", "f32[3]", activation="relu")[0] == (
        2 * out * 5 + out + out
    )


def test_every_contraction_counts_one_multiply_add_as_two_flops():
    """One convention for all contractions: a product of [m, k] by [k, n] is 2mkn FLOPs, a
    batch of B such products B times that, and a convolution or dense layer that is a matmul
    counts as that matmul."""
    m, k, n, batch = 6, 5, 3, 4
    matmul = counts("matmul", f"f32[{m}, {k}]", f"f32[{k}, {n}]")[0]
    assert matmul == 2 * m * k * n
    assert counts("matmul", f"f32[{batch}, {m}, {k}]", f"f32[{k}, {n}]")[0] == batch * matmul
    assert counts("batch_matmul", f"f32[{batch}, {m}, {k}]", f"f32[{batch}, {k}, {n}]")[0] == (
        batch * matmul
    )
    # two batch dimensions, and per shard: the batch split 2 ways halves a task's work
    assert counts("batch_matmul", f"f32[2, {batch}, {m}, {k}]", f"f32[2, {batch}, {k}, {n}]")[
        0
    ] == (2 * batch * matmul)
    assert counts("batch_matmul", f"f32[{batch}/2, {m}, {k}]", f"f32[{batch}/2, {k}, {n}]")[0] == (
        batch * matmul // 2
    )
    assert counts("linear", f"f32[{m}, {k}]", f"f32[{k}, {n}]")[0] == matmul
    # a 1x1 convolution over an m-pixel image is the matmul of its pixels by its channels
    assert counts("conv2d", f"f32[1, {k}, {m}, 1]", f"f32[{n}, {k}, 1, 1]")[0] == matmul


def test_a_gather_reads_the_rows_it_looks_up_not_the_table():
    flops, nbytes = counts("embedding_bag", "i64[8, 3]", "f32[1000, 4]")
    assert flops == 8 * 3 * 4
    assert nbytes == 8 * 3 * 8 + 8 * 4 * 4 + 8 * 3 * 4 * 4  # indices, output, gathered rows
    # rows split 4 ways: each shard expects a quarter of the lookups to hit its rows
    flops, nbytes = counts("embedding_bag", "i64[8, 3] r4", "f32[1000/4, 4]")
    assert flops == 8 * 3 * 4 // 4


def test_bytes_accessed_is_per_shard_by_default():
    relu = get_op("relu")
    x = S.parse("f32[8/2, 4]")
    assert relu.bytes_accessed(relu.make_params(), (x,), (x,)) == 2 * 4 * 4 * 4
    assert relu.bytes_accessed(relu.make_params(), (x,), (x,), per_shard=False) == 2 * 8 * 4 * 4


def test_dropout_is_a_fixed_mask_not_the_identity():
    spec = get_op("dropout")
    p = spec.make_params({"rate": 0.5, "seed": 3})
    x = np.ones((64,))
    (y,) = spec.reference(p, x)
    assert set(np.unique(y)) == {0.0, 2.0}  # kept elements are rescaled by 1/(1-rate)
    np.testing.assert_array_equal(spec.reference(p, x)[0], y)  # deterministic
    (z,) = spec.reference(spec.make_params({"rate": 0.5, "seed": 4}), x)
    assert not np.array_equal(y, z)


def _structure(op, params, a, b):
    """Which dimensions each axis indexes, and each axis size as the gcd rule has it."""
    sig = OPERATORS[op].signature(params, (a,), (b,))
    return [(ax.name, ax.inputs, ax.outputs) for ax in sig.axes], [
        ax.size == math.gcd(a[ax.inputs[0]], b[ax.outputs[0]]) for ax in sig.axes if ax.size
    ]


@st.composite
def rescaled_reshapes(draw):
    """A reshape ``a -> b`` and another of the same ranks: each run's outermost dimensions scaled
    alike (which keeps the runs' products equal), then some sizes nudged by one (which often
    breaks them)."""
    instance = draw(op_instances(["reshape"]))
    a, b = instance.inputs[0].sizes, instance.params["shape"]
    a2, b2 = list(a), list(b)
    for ga, gb in reshape_groups(a, b):
        if ga and gb:
            f = draw(st.integers(1, 3))
            a2[ga[0]] *= f
            b2[gb[0]] *= f
    for sizes in (a2, b2):
        if sizes and draw(st.booleans()):
            i = draw(st.integers(0, len(sizes) - 1))
            sizes[i] = max(1, sizes[i] + draw(st.sampled_from([-1, 1])))
    return instance.params, a, b, tuple(a2), tuple(b2)


@given(rescaled_reshapes())
def test_a_reshapes_conditions_keep_its_structure_at_other_sizes(case):
    params, a, b, a2, b2 = case
    conditions = OPERATORS["reshape"].signature_conditions(params, (a,), (b,))
    assert all(c.holds((a,), (b,)) for c in conditions)
    if all(c.holds((a2,), (b2,)) for c in conditions):
        names, gcds = _structure("reshape", params, a2, b2)
        assert names == _structure("reshape", params, a, b)[0]
        assert all(gcds)


def test_a_reshapes_conditions_reject_another_factorization():
    # [6, 4] -> [6, 4] is two runs; [4, 6] -> [6, 4] is one, which splits only its first input
    # dimension: the conditions of the first must fail on the second.
    params = {"shape": (6, 4)}
    conditions = OPERATORS["reshape"].signature_conditions(params, ((6, 4),), ((6, 4),))
    assert not all(c.holds(((4, 6),), ((6, 4),)) for c in conditions)
    assert OPERATORS["matmul"].signature_conditions({}, ((2, 3), (3, 4)), ((2, 4),)) == ()
    assert OPERATORS["conv2d"].signature_conditions({}, (), ()) is None


def _transposed_conv(x, w, stride, pad):
    """PyTorch's ConvTranspose2d (groups 1) written out: every input pixel scatters its kernel
    window, scaled, into the output; then the padding is cropped."""
    n, _, h, wd = x.shape
    _, o, kh, kw = w.shape
    full = np.zeros((n, o, (h - 1) * stride + kh, (wd - 1) * stride + kw))
    for i in range(h):
        for j in range(wd):
            patch = np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
            full[:, :, i * stride : i * stride + kh, j * stride : j * stride + kw] += patch
    return full[:, :, pad : full.shape[2] - pad, pad : full.shape[3] - pad]


@pytest.mark.parametrize(("stride", "pad"), [(2, 0), (2, 1), (3, 1), (1, 0)])
def test_a_convolution_of_the_dilated_input_is_a_transposed_convolution(stride, pad):
    rng = np.random.default_rng(stride * 10 + pad)
    x, w = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((3, 2, 3, 3))
    # the equivalent convolution: kernel flipped, its channels swapped, padding k - 1 - pad
    flipped = np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
    spec = get_op("conv2d")
    params = spec.make_params({"input_dilation": stride, "padding": 3 - 1 - pad})
    (y,) = spec.reference(params, x, flipped)
    np.testing.assert_allclose(y, _transposed_conv(x, w, stride, pad), atol=1e-12)


def test_top_k_takes_the_lower_position_among_equal_elements():
    spec = get_op("top_k")
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0]])
    values, indices = spec.reference(spec.make_params({"k": 3}, (S.parse("f32[1, 5]"),)), x)
    assert values.tolist() == [[3.0, 3.0, 3.0]] and indices.tolist() == [[1, 2, 4]]


def test_where_keeps_infinities_that_mask_arithmetic_would_turn_into_nan():
    spec = get_op("where")
    (y,) = spec.reference({}, np.array([1.0, 0.0]), np.array([2.0, 5.0]), np.array([-np.inf]))
    assert y.tolist() == [2.0, -np.inf]
