"""ParallelTensorShape: an immutable value with a readable, parseable repr."""

import pytest
from hypothesis import given

from pcgopt import DegreeError, DType, ParallelDim, ParallelTensorShape, ShapeError
from pcgopt.testing.strategies import parallel_shapes


@pytest.mark.parametrize(
    ("shape", "text"),
    [
        (
            ParallelTensorShape.of((64, 784), degrees=(2, 1), sum_degree=2),
            "f32[64/2, 784] r2(partial)",
        ),
        (ParallelTensorShape.of((8,), copy_degree=2), "f32[8] r2"),
        (
            ParallelTensorShape.of((8, 4), "bf16", degrees=(4, 2), copy_degree=2, sum_degree=4),
            "bf16[8/4, 4/2] r2 r4(partial)",
        ),
        (ParallelTensorShape.of((3,), "i64"), "i64[3]"),
        (ParallelTensorShape.of(()), "f32[]"),
    ],
)
def test_repr_is_the_compact_notation(shape, text):
    assert repr(shape) == text
    assert ParallelTensorShape.parse(text) == shape


@given(parallel_shapes(dtypes=__import__("hypothesis").strategies.sampled_from(list(DType))))
def test_parse_reads_back_every_repr(shape):
    assert ParallelTensorShape.parse(repr(shape)) == shape
    assert hash(ParallelTensorShape.parse(repr(shape))) == hash(shape)


def test_derived_quantities():
    s = ParallelTensorShape.parse("f32[64/2, 784] r3 r2(partial)")
    assert s.sizes == (64, 784)
    assert s.degrees == (2, 1)
    assert s.block_sizes == (32, 784)
    assert s.replica_degree == 6
    assert s.num_shards == 12
    assert s.is_partial and not s.is_unpartitioned
    assert s.nbytes == 64 * 784 * 4
    assert s.shard_nbytes == 32 * 784 * 4
    assert s.unpartitioned() == ParallelTensorShape.of((64, 784))
    assert s.with_degree(-1, 4).degrees == (2, 4)


def test_is_immutable():
    s = ParallelTensorShape.of((4,))
    with pytest.raises(AttributeError):
        s.copy_degree = 2  # type: ignore[misc]


def test_degree_must_divide_size():
    with pytest.raises(DegreeError, match="degree 4 does not divide size 6"):
        ParallelDim(6, 4)
    with pytest.raises(DegreeError, match="dimension 1"):
        ParallelTensorShape.of((4, 6), degrees=(1, 4))


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_sizes_must_be_positive_integers(bad):
    with pytest.raises(ShapeError, match="positive integer"):
        ParallelDim(bad)


def test_unknown_dtype_lists_the_valid_ones():
    with pytest.raises(ShapeError, match="valid: f16, bf16, f32"):
        ParallelTensorShape.of((2,), "float32")


def test_parse_rejects_garbage():
    with pytest.raises(ShapeError, match="cannot parse"):
        ParallelTensorShape.parse("f32(4, 4)")
