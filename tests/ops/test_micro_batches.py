"""Unity's Pipeline and Batch: micro-batches as part of a parallel shape, carried by compute
operators along their parallel loop axes, computed one at a time by the evaluator, and
a whole PCG cut into them without changing what it computes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcgopt import (
    DegreeError,
    PCGBuilder,
    PCGError,
    ShardedArray,
    assert_equivalent,
    get_op,
    with_micro_batches,
)
from pcgopt.ops import AxisKind, ComputeOp, LoopAxis, Signature
from pcgopt.ops.elementwise import ReLU
from pcgopt.shapes import ParallelDim, ParallelTensorShape
from pcgopt.testing.strategies import small_pcgs


def infer(op: str, shape: str, **raw) -> ParallelTensorShape:
    spec = get_op(op)
    s = ParallelTensorShape.parse(shape)
    (out,) = spec.infer(spec.make_params(raw, (s,)), (s,))
    return out


def test_micro_batches_read_and_print_as_a_tilde_after_the_degree():
    shape = ParallelTensorShape.parse("f32[64/2~4, 784] r2")
    assert shape.micro == (4, 1) and shape.degrees == (2, 1) and shape.micro_batches == 4
    assert shape.block_sizes == (32, 784)  # a device still holds its whole block
    assert repr(shape) == "f32[64/2~4, 784] r2"
    assert repr(ParallelDim(64, 2, 4)) == "ParallelDim(64, 2, micro=4)"
    assert ParallelTensorShape.parse("f32[8~2]").dims[0] == ParallelDim(8, 1, 2)


def test_pipeline_cuts_and_batch_gathers_without_changing_the_degree():
    assert repr(infer("pipeline", "f32[64/2, 8]", dim=0, micro_batches=4)) == "f32[64/2~4, 8]"
    assert repr(infer("batch", "f32[64/2~4, 8]", dim=0, micro_batches=2)) == "f32[64/2~2, 8]"
    # Splitting keeps the micro-batches of every block.
    assert repr(infer("partition", "f32[64~4, 8]", dim=0, degree=2)) == "f32[64/2~4, 8]"
    assert repr(infer("combine", "f32[64/2~4, 8]", dim=0, degree=2)) == "f32[64~4, 8]"


@pytest.mark.parametrize(
    ("op", "shape", "params", "message"),
    [
        ("pipeline", "f32[12/2, 8]", {"dim": 0, "micro_batches": 4}, "blocks of 6 .* into 4"),
        ("batch", "f32[12~3, 8]", {"dim": 0, "micro_batches": 2}, "2 does not divide 3"),
        ("batch", "f32[12, 8]", {"dim": 1, "micro_batches": 2}, "processed in 1 micro-batch"),
        ("partition", "f32[12~4, 8]", {"dim": 0, "degree": 2}, "micro-batches do not divide"),
    ],
)
def test_illegal_micro_batches_are_rejected(op, shape, params, message):
    spec = get_op(op)
    s = ParallelTensorShape.parse(shape)
    with pytest.raises(DegreeError, match=message):
        spec.infer(spec.make_params(params, (s,)), (s,))


def test_compute_operators_carry_micro_batches_along_parallel_axes_only():
    b = PCGBuilder()
    x = b.pipeline(b.input((8, 6), name="x"), dim=0, micro_batches=2)
    h = b.matmul(x, b.weight((6, 4), name="w"))  # the rows are a parallel axis
    assert repr(h.shape) == "f32[8~2, 4]"
    assert repr(b.transpose(h, perm=(1, 0)).shape) == "f32[4, 8~2]"
    with pytest.raises(PCGError, match=r"sums over it .*Batch it first"):
        w = b.pipeline(b.weight((8, 4)), dim=0, micro_batches=2)
        b.matmul(b.transpose(x, perm=(1, 0)), w)  # the contraction, cut alike on both sides
    with pytest.raises(PCGError, match="must be cut alike"):
        b.add(x, b.input((8, 6), name="y"))
    with pytest.raises(PCGError, match="no loop axis over that dimension"):
        b.softmax(b.transpose(x, perm=(1, 0)), axis=1)


class _BatchMean(ReLU):
    """A wrong operator: subtracts the mean over the batch but calls the batch a parallel
    axis, as if its rows were independent."""

    name = "batch_mean"

    def fn(self, params, x):
        return x - x.mean(axis=0, keepdims=True)

    def signature(self, params, in_sizes, out_sizes):
        axes = [LoopAxis(f"d{d}", AxisKind.PARALLEL, (d,), (d,)) for d in range(len(in_sizes[0]))]
        return Signature(tuple(axes))


def test_the_evaluator_computes_every_micro_batch_on_its_own():
    """An operator that mixes the samples of a batch gives another result in micro-batches:
    the evaluator does not run the whole block at once."""
    spec = _BatchMean()
    rng = np.random.default_rng(0)
    value = rng.standard_normal((8, 3))
    whole = ParallelTensorShape.parse("f32[8, 3]")
    cut = ParallelTensorShape.parse("f32[8~2, 3]")
    params = spec.make_params({})
    # The generic path (ReLU's own evaluates all shards in one call).
    (as_whole,) = ComputeOp.evaluate(
        spec, params, (ShardedArray.from_logical(value, whole),), (whole,)
    )
    (in_pieces,) = ComputeOp.evaluate(
        spec, params, (ShardedArray.from_logical(value, cut),), (cut,)
    )
    np.testing.assert_allclose(as_whole.logical(), spec.fn(params, value))
    pieces = np.concatenate([spec.fn(params, value[:4]), spec.fn(params, value[4:])])
    np.testing.assert_allclose(in_pieces.logical(), pieces)
    assert not np.allclose(in_pieces.logical(), as_whole.logical())


def _mlp(batch: int = 8):
    b = PCGBuilder()
    x = b.partition(b.input((batch, 6), name="x"), dim=0, degree=2)
    h = b.linear(x, b.replicate(b.weight((6, 4), name="w"), degree=2), activation="relu")
    loss = b.reduce_mean(b.combine(h, dim=0, degree=2), axes=(0, 1))
    return b.build(loss)


def test_a_pcg_cut_into_micro_batches_computes_what_it_did():
    pcg = _mlp()
    cut = with_micro_batches(pcg, 2)
    assert_equivalent(pcg, cut)
    # Cut after the input's split (how the data is loaded), gathered before the mean over the
    # batch, which cannot run one micro-batch at a time.
    (pipeline,) = [n for n in cut.nodes if n.op == "pipeline"]
    assert cut.node(pipeline.inputs[0].node).op == "partition"
    (batch,) = [n for n in cut.nodes if n.op == "batch"]
    assert repr(cut.shape(batch.inputs[0])) == "f32[8~2, 4]"
    assert cut.consumers()[batch.output()][0][0] == "reduce_mean_1"
    assert with_micro_batches(pcg, 1) is pcg


def test_cutting_micro_batches_says_what_does_not_divide():
    with pytest.raises(PCGError, match="blocks along dimension 0 have 4 elements, which 3"):
        with_micro_batches(_mlp(), 3)
    with pytest.raises(PCGError, match=r"already outputs .* in micro-batches"):
        with_micro_batches(with_micro_batches(_mlp(), 2), 2)
    with pytest.raises(PCGError, match="positive integer"):
        with_micro_batches(_mlp(), 0)


@settings(max_examples=25, deadline=None)
@given(small_pcgs(max_ops=6), st.sampled_from((2, 4)))
def test_random_pcgs_cut_into_micro_batches_compute_what_they_did(pcg, m):
    try:
        cut = with_micro_batches(pcg, m)
    except PCGError as e:
        assert "do not divide" in str(e)
        return
    assert_equivalent(pcg, cut)
    assert all(
        cut.shape(r) == pcg.shape(r0) for r, r0 in zip(cut.outputs, pcg.outputs, strict=True)
    )
