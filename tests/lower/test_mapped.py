"""Plans whose branches the machine mapping runs at once on disjoint devices run on those
devices (pcgopt.lower.mapped): one program per block, tensors handed between blocks, the
training step equal to the unsharded model's."""

from __future__ import annotations

import numpy as np
import pytest

from pcgopt import PCGBuilder, evaluate
from pcgopt.extract.search.plan import machine_from_spec, mapped_plan

jax = pytest.importorskip("jax", reason="running plans needs the optional extra pcgopt[jax]")

from pcgopt.lower.jax import Lowered, lower, reference_loss_and_grads  # noqa: E402
from pcgopt.lower.mapped import MappedLowered, _piece_pcg, concurrent_blocks  # noqa: E402
from pcgopt.lower.run import run_plan  # noqa: E402

RTOL = 1e-4


def _two_branches():
    """Two data-parallel branches of one input, added: the mapping runs them at once, each on
    two of four GPUs."""
    b = PCGBuilder()
    x = b.input((256, 1024), name="x")

    def branch(w: str):
        h = b.matmul(
            b.partition(x, dim=0, degree=2),
            b.replicate(b.weight((1024, 1024), name=w), degree=2),
        )
        return b.combine(b.relu(h), dim=0, degree=2)

    pcg = b.build(b.add(branch("w1"), branch("w2")))
    return pcg, mapped_plan(pcg, machine_from_spec("dgx-a100:1:4"), optimizer="sgd")


def _close(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want), initial=0.0) / max(1.0, np.max(np.abs(want))))


def test_branches_run_at_once_on_their_own_devices_and_equal_the_unsharded_model():
    pcg, plan = _two_branches()
    assert concurrent_blocks(plan)
    program = lower(plan)
    assert isinstance(program, MappedLowered)
    blocks = [set(p.devices) for p in program.pieces if len(p.devices) == 2]
    assert len(blocks) == 2 and not blocks[0] & blocks[1]  # the branches' disjoint devices
    inputs, weights = program.random_sources(seed=1)
    loss, grads = program.loss_and_grads(inputs, weights)
    ref_loss, ref_grads = reference_loss_and_grads(pcg, inputs, weights)
    assert _close(loss, ref_loss) <= RTOL
    assert all(_close(grads[w], ref_grads[w]) <= RTOL for w in ("w1", "w2"))
    (out,) = program.forward(inputs, weights)
    assert _close(out, evaluate(pcg, {**inputs, **weights}).outputs[0].logical()) <= RTOL
    # Each branch's weight gradient is summed over its own two devices, as the plan places it.
    checks = program.group_checks()
    syncs = {c.compiled for c in checks if c.purpose == "weight sync"}
    assert syncs == {((0, 1),), ((2, 3),)}
    assert all(c.agrees for c in checks)
    # What the placement reports is about the plan's own nodes (not the pieces' helpers).
    placement = program.placement
    assert placement.honoured and set(placement.honoured) <= {n.name for n in pcg.nodes}
    assert not placement.unmet


def test_a_training_step_of_a_mapped_plan_is_the_optimizer_step_of_the_unsharded_model():
    pcg, plan = _two_branches()
    program = lower(plan, learning_rate=0.5)
    inputs, weights = program.random_sources(seed=2)
    _, ref_grads = reference_loss_and_grads(pcg, inputs, weights)
    state, _ = program.train_step(program.init(weights), inputs)
    for w in ("w1", "w2"):
        want = weights[w] - 0.5 * np.asarray(ref_grads[w])  # SGD, as the plan was costed
        assert _close(state.params[w], want) <= RTOL


def test_without_concurrency_the_plan_is_one_spmd_program_with_the_same_numbers():
    pcg, plan = _two_branches()
    program = lower(plan, concurrent=False)
    assert isinstance(program, Lowered) and not program.note
    inputs, weights = program.random_sources(seed=1)
    loss, _ = program.loss_and_grads(inputs, weights)
    assert _close(loss, reference_loss_and_grads(pcg, inputs, weights)[0]) <= RTOL


def test_run_plan_reports_the_programs_of_a_mapped_plan():
    _, plan = _two_branches()
    report = run_plan(plan, steps=2)
    text = report.summary()
    assert "in 3 programs on blocks of 4 CPU devices" in text
    assert report.loss_relative <= RTOL and report.grad_relative <= RTOL
    assert "device groups: 6 of the 6" in text


def test_partial_sums_handed_between_blocks_arrive_summed_as_the_first_partial_sum():
    b = PCGBuilder()
    x = b.partition(b.input((8, 4), name="x"), dim=1, degree=2)
    w = b.partition(b.weight((4, 6), name="w"), dim=0, degree=2)
    pcg = b.build(b.reduce(b.matmul(x, w, name="mm"), degree=2, name="sum"))
    piece, handed, outputs = _piece_pcg(pcg, ["sum"], {pcg.outputs[0]})
    assert handed == {"mm": pcg.node("sum").inputs[0]} and outputs == pcg.outputs
    assert piece.shape(piece.node("sum").inputs[0]) == pcg.shape("mm")  # partial sums again
    program = lower(piece, 2)
    value = np.arange(48, dtype=np.float32).reshape(8, 6)
    (out,) = program.forward({"mm": value}, {})
    np.testing.assert_array_equal(np.asarray(out), value)


def test_a_mapped_plan_with_micro_batches_runs_as_one_program_and_says_why():
    pcg, plan = _two_branches()
    program = lower(plan, micro_batches=2)
    assert isinstance(program, Lowered)
    assert "run here on all devices" in program.note and "2 micro-batches" in program.note
    inputs, weights = program.random_sources(seed=1)
    loss, grads = program.loss_and_grads(inputs, weights)
    ref_loss, ref_grads = reference_loss_and_grads(pcg, inputs, weights, micro_batches=2)
    assert _close(loss, ref_loss) <= RTOL and _close(grads["w1"], ref_grads["w1"]) <= RTOL


def test_a_plan_file_keeps_its_schedule_and_pcgopt_run_runs_it_as_mapped(tmp_path, capsys):
    from pcgopt.cli import main

    _, plan = _two_branches()
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert main(["run", str(path), "--steps", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "in 3 programs on blocks of 4 CPU devices" in out
    assert "device groups: 6 of the 6" in out and "step 2: loss" in out
