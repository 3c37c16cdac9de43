"""Parallelization operators: exact meaning on shards, identities between them, and errors."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pcgopt import (
    DegreeError,
    PCGBuilder,
    ShapeError,
    ShardedArray,
    assert_equivalent,
    get_op,
)
from pcgopt.shapes import ParallelTensorShape
from pcgopt.testing.strategies import parallel_shapes


def apply(op, x: ShardedArray, **raw) -> ShardedArray:
    spec = get_op(op)
    params = spec.make_params(raw, (x.shape,))
    (out_shape,) = spec.infer(params, (x.shape,))
    (out,) = spec.evaluate(params, (x,), (out_shape,))
    return out


@st.composite
def sharded(draw, min_rank=1):
    shape = draw(parallel_shapes(min_rank=min_rank, max_rank=3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return ShardedArray.from_logical(rng.standard_normal(shape.sizes), shape, rng)


def same(a: ShardedArray, b: ShardedArray) -> None:
    assert a.shape == b.shape
    np.testing.assert_allclose(a.data, b.data, rtol=1e-12, atol=1e-12)


@given(sharded(), st.data())
def test_combine_undoes_partition(x, data):
    dim = data.draw(st.integers(0, x.shape.rank - 1))
    d = x.shape.dims[dim]
    degree = data.draw(
        st.sampled_from([k for k in (2, 3, 4) if d.size % (d.degree * k) == 0] or [1])
    )
    same(apply("combine", apply("partition", x, dim=dim, degree=degree), dim=dim, degree=degree), x)


@given(sharded(), st.data())
def test_partition_undoes_combine(x, data):
    dim = data.draw(st.integers(0, x.shape.rank - 1))
    deg = x.shape.dims[dim].degree
    degree = data.draw(st.sampled_from([k for k in (1, 2, 3, 4) if deg % k == 0]))
    same(apply("partition", apply("combine", x, dim=dim, degree=degree), dim=dim, degree=degree), x)


@given(sharded(), st.data())
def test_parallel_operators_keep_the_logical_tensor(x, data):
    s = x.shape
    dim = data.draw(st.integers(0, s.rank - 1))
    candidates = [("replicate", {"degree": 2})]
    if s.sum_degree % 2 == 0:
        candidates += [("reduce", {"degree": 2}), ("all_reduce", {"degree": 2})]
        if s.sizes[dim] % (s.degrees[dim] * 2) == 0:
            candidates.append(("reduce_scatter", {"dim": dim, "degree": 2}))
    if s.sizes[dim] % (s.degrees[dim] * 2) == 0:
        candidates.append(("partition", {"dim": dim, "degree": 2}))
    if s.degrees[dim] % 2 == 0:
        candidates += [
            ("combine", {"dim": dim, "degree": 2}),
            ("all_gather", {"dim": dim, "degree": 2}),
        ]
    op, params = data.draw(st.sampled_from(candidates))
    np.testing.assert_allclose(
        apply(op, x, **params).logical(), x.logical(), rtol=1e-12, atol=1e-12
    )


@given(sharded())
def test_all_reduce_is_reduce_then_replicate(x):
    k = x.shape.sum_degree
    assume(k > 1)
    same(
        apply("all_reduce", x, degree=k), apply("replicate", apply("reduce", x, degree=k), degree=k)
    )


@given(sharded(), st.data())
def test_reduce_scatter_is_reduce_then_partition(x, data):
    k = x.shape.sum_degree
    dim = data.draw(st.integers(0, x.shape.rank - 1))
    assume(x.shape.sizes[dim] % (x.shape.degrees[dim] * k) == 0)
    same(
        apply("reduce_scatter", x, dim=dim, degree=k),
        apply("partition", apply("reduce", x, degree=k), dim=dim, degree=k),
    )


@given(sharded(), st.data())
def test_all_gather_is_combine_then_replicate(x, data):
    dim = data.draw(st.integers(0, x.shape.rank - 1))
    k = x.shape.degrees[dim]
    same(
        apply("all_gather", x, dim=dim, degree=k),
        apply("replicate", apply("combine", x, dim=dim, degree=k), degree=k),
    )


@given(sharded(min_rank=2), st.data())
def test_all_to_all_is_combine_then_partition(x, data):
    src, dst = data.draw(st.permutations(range(x.shape.rank)))[:2]
    k = x.shape.degrees[src]
    assume(x.shape.sizes[dst] % (x.shape.degrees[dst] * k) == 0)
    same(
        apply("all_to_all", x, src_dim=src, dst_dim=dst, degree=k),
        apply("partition", apply("combine", x, dim=src, degree=k), dim=dst, degree=k),
    )


@given(sharded())
def test_reduce_after_to_partial_discards_copies(x):
    k = x.shape.copy_degree
    assume(k > 1)
    same(
        apply("reduce", apply("to_partial", x, degree=k), degree=k),
        apply("discard_copies", x, degree=k),
    )
    same(apply("discard_copies", apply("replicate", x, degree=3), degree=3), x)


def test_add_is_reduce_of_stacked_partial_sums():
    """Unity Figure 11b: Add -> StackPartial + Reduce, so a Replicate after it fuses into an
    AllReduce."""

    def graph(stacked: bool):
        b = PCGBuilder()
        x, y = b.input((4, 6), name="x"), b.input((4, 6), name="y")
        if not stacked:
            return b.build(b.replicate(b.add(x, y), degree=2))
        s = b.stack_partial(x, y)
        assert repr(s.shape) == "f32[4, 6] r2(partial)"
        return b.build(b.all_reduce(s, degree=2))

    assert_equivalent(graph(False), graph(True))


@pytest.mark.parametrize("degree", [2, 3, 4])
@given(m=st.sampled_from([1, 2, 5]), n=st.sampled_from([1, 3, 4]), k=st.sampled_from([1, 2, 3]))
def test_reduce_of_partial_sum_matmul_shards_is_the_matmul(degree, m, n, k):
    def graph(split: bool):
        b = PCGBuilder()
        x, w = b.input((m, k * degree), name="x"), b.weight((k * degree, n), name="w")
        if not split:
            return b.build(b.matmul(x, w))
        y = b.matmul(b.partition(x, dim=1, degree=degree), b.partition(w, dim=0, degree=degree))
        assert y.shape.sum_degree == degree
        return b.build(b.reduce(y, degree=degree))

    assert_equivalent(graph(False), graph(True))


def test_partition_blocks_are_contiguous_and_in_order():
    x = ShardedArray.from_logical(np.arange(8.0), ParallelTensorShape.of((8,)))
    y = apply("partition", x, dim=0, degree=4)
    assert [list(s) for s in y.shards()] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    z = apply("partition", y, dim=0, degree=2)  # each block splits in place: block i -> 2i, 2i+1
    assert [list(s) for s in z.shards()] == [[k] for k in range(8)]


def test_reduce_sums_adjacent_partial_sums():
    shape = ParallelTensorShape.of((1,), sum_degree=4)
    x = ShardedArray(shape, np.array([1.0, 2.0, 4.0, 8.0]).reshape(4, 1, 1))
    y = apply("reduce", x, degree=2)
    assert y.shape.sum_degree == 2
    assert [float(s[0]) for s in y.shards()] == [3.0, 12.0]


def test_copies_are_the_same_shard_in_device_order():
    shape = ParallelTensorShape.parse("f32[4/2] r3")
    x = ShardedArray.from_logical(np.arange(4.0), shape)
    shards = [list(s) for s in x.shards()]
    assert shape.num_shards == len(shards) == 6
    assert shards == [[0, 1], [2, 3]] * 3  # device index = (copy, block) in C order


@pytest.mark.parametrize(
    ("op", "shape", "params", "message"),
    [
        ("reduce", "f32[4] r2", {"degree": 2}, "identical copies, not partial sums"),
        ("reduce", "f32[4] r2(partial)", {"degree": 4}, "holds 2 partial sum"),
        ("partition", "f32[6/2]", {"dim": 0, "degree": 2}, "4 does not divide 6"),
        ("combine", "f32[8/2]", {"dim": 0, "degree": 4}, "4 does not divide 2"),
        ("all_gather", "f32[8]", {"dim": 0, "degree": 2}, "it is split 1 way, and"),
        (
            "all_to_all",
            "f32[8/2, 4]",
            {"src_dim": 1, "dst_dim": 1, "degree": 2},
            "two different dimensions",
        ),
        ("discard_copies", "f32[8] r2", {"degree": 4}, "cannot discard 4 copies: .* holds 2"),
        ("to_partial", "f32[8] r3(partial)", {"degree": 3}, "holds 1 copy"),
    ],
)
def test_illegal_parallel_operators_are_rejected(op, shape, params, message):
    """Each bad configuration is rejected with a message that says why."""
    spec = get_op(op)
    s = ParallelTensorShape.parse(shape)
    with pytest.raises(DegreeError, match=message):
        spec.infer(spec.make_params(params, (s,)), (s,))


def test_stack_partial_needs_one_parallel_shape():
    b = PCGBuilder()
    x = b.input((4,), name="x")
    with pytest.raises(ShapeError, match=r"inputs\[1\] is f32\[4/2\]"):
        b.stack_partial(x, b.partition(x, dim=0, degree=2))
