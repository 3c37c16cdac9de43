"""Pipelined plans run on their stages' devices (pcgopt.lower.pipelined): a program per stage on
its block, micro-batches through the stages, the loss and gradients those of the unsharded
model over the same micro-batches, and a training step its optimizer's step."""

from __future__ import annotations

import numpy as np
import pytest

from pcgopt import Machine, PCGBuilder, evaluate
from pcgopt.extract.strategies.pipeline import pipeline_search
from pcgopt.models import build

jax = pytest.importorskip("jax", reason="running plans needs the optional extra pcgopt[jax]")

from pcgopt.lower.jax import LoweringError, reference_loss_and_grads  # noqa: E402
from pcgopt.lower.pipelined import PipelinedLowered  # noqa: E402

RTOL = 1e-4


def _close(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want), initial=0.0) / max(1.0, np.max(np.abs(want))))


@pytest.fixture(scope="module")
def bert():
    """A small BERT (its token table tied: read by the first and the last stage), cut into two
    stages of two devices each, with Megatron in the stages; its program, random sources and
    the unsharded model's loss and gradients over the same four micro-batches."""
    model = build("bert_large", batch=8, seq=4, hidden=8, layers=2, heads=2, vocab=11, loss=True)
    machine = Machine.preset("dgx-a100", nodes=2, devices_per_node=2)
    piped = pipeline_search(
        model,
        machine,
        stage_counts=[2],
        micro_batches=[4],
        min_ops=4,
        strategies=["megatron t=2"],
    )
    return _run(model, piped, micro_batches=4, seed=3)


def _run(model, piped, *, micro_batches: int, seed: int):
    """``piped`` as a program, random sources, and the unsharded model's loss and gradients
    over the same micro-batches."""
    program = piped.to_jax(optimizer="sgd", learning_rate=0.5)
    inputs, weights = program.random_sources(seed=seed)
    reference = reference_loss_and_grads(model, inputs, weights, micro_batches=micro_batches)
    return model, program, inputs, weights, reference


def _assert_loss_and_grads(program, inputs, weights, reference) -> None:
    ref_loss, ref_grads = reference
    loss, grads = program.loss_and_grads(inputs, weights)
    assert _close(loss, ref_loss) <= RTOL
    assert set(grads) == set(ref_grads)
    for name in ref_grads:
        assert _close(grads[name], ref_grads[name]) <= RTOL, name


def test_a_pipeline_computes_the_unsharded_models_loss_and_gradients(bert):
    _, program, inputs, weights, reference = bert
    assert isinstance(program, PipelinedLowered)
    assert [p.devices for p in program.pieces] == [(0, 1), (2, 3)]
    _assert_loss_and_grads(program, inputs, weights, reference)
    # The tied table's gradient sums both stages': the lookup's and the logits'.
    assert "embed/tokens" in program.pieces[0].lowered.weight_names
    assert "embed/tokens" in program.pieces[1].lowered.weight_names


def test_a_training_step_of_a_pipeline_is_the_optimizer_step_on_the_micro_batches(bert):
    _, program, inputs, weights, (_, ref_grads) = bert
    state, _ = program.train_step(program.init(weights), inputs)
    for name, g in ref_grads.items():
        want = np.asarray(weights[name]) - 0.5 * np.asarray(g)  # SGD
        assert _close(state.params[name], want) <= RTOL, name


def test_a_2bw_pipeline_is_not_run(bert):
    model = bert[0]
    machine = Machine.preset("dgx-a100", nodes=2, devices_per_node=2)
    two = pipeline_search(
        model, machine, stage_counts=[2], micro_batches=[4], min_ops=4, schedule="2bw"
    )
    with pytest.raises(LoweringError, match="only 1F1B plans"):
        two.to_jax()


def test_forward_joins_batched_outputs_and_averages_the_others():
    """An output without the batch (a mean over it, [6]) is the micro-batches' mean, not their
    concatenation; one with the batch in dimension 0 is joined along it."""
    b = PCGBuilder()
    x = b.input((8, 6), name="x")
    for i in range(2):
        x = b.relu(b.matmul(x, b.weight((6, 6), name=f"w{i}")))
    model = b.build(b.reduce_mean(x, axes=(0,), name="column_mean"), b.scale(x, factor=2.0))
    machine = Machine.preset("dgx-a100", nodes=2, devices_per_node=1)
    piped = pipeline_search(model, machine, stage_counts=[2], micro_batches=[2], min_ops=1)
    program = piped.to_jax()
    inputs, weights = program.random_sources(seed=1)
    outputs = program.forward(inputs, weights)
    want = [r.logical() for r in evaluate(model, {**inputs, **weights}).outputs]
    assert [np.shape(o) for o in outputs] == [(6,), (8, 6)]
    assert all(_close(o, w) <= RTOL for o, w in zip(outputs, want, strict=True))


def test_a_pipeline_read_back_from_its_plan_file_runs_as_the_pipeline_did(bert):
    """What a plan file keeps of a pipeline (``Plan.to_dict()['pipeline']``, through JSON) is
    enough to run it: the same stages on the same devices, the same loss and gradients."""
    import json

    from pcgopt.lower.jax import lower
    from pcgopt.lower.saved import SavedPipeline

    model, program, inputs, weights, (ref_loss, ref_grads) = bert
    machine = Machine.preset("dgx-a100", nodes=2, devices_per_node=2)
    piped = pipeline_search(
        model, machine, stage_counts=[2], micro_batches=[4], min_ops=4, strategies=["megatron t=2"]
    )
    saved = SavedPipeline.from_dict(model, json.loads(json.dumps(piped.to_dict())))
    assert [s.devices for s in saved.stages] == [s.devices for s in piped.stages]
    assert [s.entry for s in saved.stages] == [None, piped.stages[1].entry]
    assert (saved.micro_batches, saved.optimizer) == (4, piped.optimizer)
    read_back = lower(saved, optimizer="sgd", learning_rate=0.5)
    assert isinstance(read_back, PipelinedLowered)
    assert [p.devices for p in read_back.pieces] == [p.devices for p in program.pieces]
    loss, grads = read_back.loss_and_grads(inputs, weights)
    assert _close(loss, ref_loss) <= RTOL
    assert set(grads) == set(ref_grads)
    for name in ref_grads:
        assert _close(grads[name], ref_grads[name]) <= RTOL, name


def test_a_malformed_pipeline_in_a_plan_file_is_named(bert):
    from pcgopt.errors import PCGError
    from pcgopt.lower.saved import SavedPipeline

    model = bert[0]
    machine = Machine.preset("dgx-a100", nodes=2, devices_per_node=2)
    good = pipeline_search(
        model, machine, stage_counts=[2], micro_batches=[4], min_ops=4, strategies=["megatron t=2"]
    ).to_dict()

    def broken(**stage1):
        stages = [good["stages"][0], {**good["stages"][1], **stage1}]
        return {**good, "stages": stages}

    with pytest.raises(PCGError, match=r"stages\[1\]\.entry must name the input"):
        SavedPipeline.from_dict(model, broken(entry="nowhere"))
    with pytest.raises(PCGError, match=r"stages\[1\]\.devices must start at device 2"):
        SavedPipeline.from_dict(model, broken(devices=[3, 5]))
    with pytest.raises(PCGError, match=r"stages\[1\]\.devices must be \[first, stop\)"):
        SavedPipeline.from_dict(model, broken(devices=[2]))
    with pytest.raises(PCGError, match="micro_batches must be a positive integer"):
        SavedPipeline.from_dict(model, {**good, "micro_batches": 0})
    with pytest.raises(PCGError, match="stages must be a non-empty list"):
        SavedPipeline.from_dict(model, {**good, "stages": []})
    # Read back against another model, the stages' sources are not its own.
    from pcgopt.lower.jax import lower

    other = build("mnist_mlp", small=True)
    with pytest.raises(LoweringError, match="is not in the model: the model is not the one"):
        lower(SavedPipeline.from_dict(other, good))


def test_each_stage_runs_its_forwards_and_backwards_in_1f1b_order(bert, monkeypatch):
    """With 2 stages and 4 micro-batches the first stage runs a warm-up forward, then a forward
    and a backward in turn, then its last backward; the last stage alternates from the start.
    (Micro-batch after micro-batch would alternate on both.)"""
    _, program, inputs, weights, _ = bert
    issued: list[tuple[int, str]] = []
    forward, backward = program._forward_piece, program._backward_piece

    def record_forward(piece, *args):
        issued.append((piece.index, "F"))
        return forward(piece, *args)

    def record_backward(piece, *args):
        issued.append((piece.index, "B"))
        return backward(piece, *args)

    monkeypatch.setattr(program, "_forward_piece", record_forward)
    monkeypatch.setattr(program, "_backward_piece", record_backward)
    program.loss_and_grads(inputs, weights)
    per_stage = ["".join(k for s, k in issued if s == stage) for stage in (0, 1)]
    assert per_stage == ["FFBFBFBB", "FBFBFBFB"]
    # Each operation is issued after those it waits for: stage 1's forward of a micro-batch
    # after stage 0's, stage 0's backward after stage 1's.
    assert issued.index((1, "F")) > issued.index((0, "F"))
    assert issued.index((0, "B")) > issued.index((1, "B"))


def test_stages_on_blocks_of_two_sizes_compute_the_unsharded_models_gradients():
    """Three stages on four devices: a block of two, then two of one. The tied table is read
    by the first stage (two devices) and the last (one); its gradient sums both."""
    model = build("bert_large", batch=6, seq=4, hidden=8, layers=2, heads=2, vocab=11, loss=True)
    machine = Machine.preset("dgx-a100", nodes=4, devices_per_node=1)
    piped = pipeline_search(
        model,
        machine,
        stage_counts=[3],
        micro_batches=[3],
        min_ops=2,
        strategies=["data parallel"],
    )
    assert [len(s.devices) for s in piped.stages] in ([2, 1, 1], [1, 1, 2])
    _, program, inputs, weights, reference = _run(model, piped, micro_batches=3, seed=5)
    _assert_loss_and_grads(program, inputs, weights, reference)
