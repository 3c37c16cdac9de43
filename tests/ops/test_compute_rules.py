"""Parallel shape rules of compute operators: what is legal, what is rejected and why, counts."""

import pytest

from pcgopt import DegreeError, ShapeError, get_op
from pcgopt.shapes import ParallelTensorShape as S


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
        ("conv2d", ("f32[1, 2, 6/2, 6]", "f32[2, 2, 3, 3]"), {}, "cannot split that dimension"),
        ("linear", ("f32[4, 6/2]", "f32[6/2, 3]", "f32[3]"), {}, "cannot split that dimension"),
        (
            "linear",
            ("f32[4, 6/2]", "f32[6/2, 3]"),
            {"activation": "relu"},
            "cannot split that dimension",
        ),
        ("conv2d", ("f32[1, 6/3, 5, 5]", "f32[6/3, 3, 3, 3]"), {"groups": 2}, "divisors of 2"),
        ("reduce_max", ("f32[4, 6/2]",), {"axes": (1,)}, "cannot split that dimension"),
        ("concat", ("f32[4/2]", "f32[4/2]"), {"axis": 0}, "cannot split that dimension"),
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
    ],
)
def test_shape_errors(op, inputs, params, message):
    with pytest.raises(ShapeError, match=message):
        infer(op, *inputs, **params)


def test_flop_counts():
    mm = get_op("matmul")
    assert mm.flops(mm.make_params(), ((64, 784), (784, 512)), ((64, 512),)) == 2 * 64 * 784 * 512
    conv = get_op("conv2d")
    p = conv.make_params({"groups": 2})
    # each output element: 2 * (C/groups) * kh * kw
    assert conv.flops(p, ((1, 4, 5, 5), (6, 2, 3, 3)), ((1, 6, 3, 3),)) == 2 * 54 * 2 * 9
    lin = get_op("linear")
    p = lin.make_params({"activation": "relu"})
    out = 8 * 3
    assert lin.flops(p, ((8, 5), (5, 3), (3,)), ((8, 3),)) == 2 * out * 5 + out + out


def test_bytes_accessed_is_per_shard_by_default():
    relu = get_op("relu")
    x = S.parse("f32[8/2, 4]")
    assert relu.bytes_accessed(relu.make_params(), (x,), (x,)) == 2 * 4 * 4 * 4
    assert relu.bytes_accessed(relu.make_params(), (x,), (x,), per_shard=False) == 2 * 8 * 4 * 4
