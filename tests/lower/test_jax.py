"""Plans run as JAX programs: numerics against the unsharded model and the reference evaluator,
training steps, gradient accumulation, compiled collectives, shardings, errors."""

from __future__ import annotations

import json

import numpy as np
import optax
import pytest
from hypothesis import assume, given, settings

from pcgopt import PCGBuilder, evaluate
from pcgopt.errors import DegreeError
from pcgopt.extract.search.plan import machine_from_spec
from pcgopt.extract.strategies.baselines import data_parallel, megatron, unity_figure_2b
from pcgopt.models import build
from pcgopt.testing.strategies import small_pcgs, towers

jax = pytest.importorskip("jax", reason="running plans needs the optional extra pcgopt[jax]")

from pcgopt.lower import jax as lowering  # noqa: E402
from pcgopt.lower.jax import (  # noqa: E402
    LoweringError,
    lower,
    reference_loss_and_grads,
    shardings,
)
from pcgopt.lower.layout import LayoutError  # noqa: E402
from pcgopt.lower.run import devices_needed, run_plan  # noqa: E402
from pcgopt.lower.saved import SavedPlan  # noqa: E402

RTOL = 1e-4


def _close(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want), initial=0.0) / max(1.0, np.max(np.abs(want))))


def _agrees(lowered, model, inputs, weights, micro_batches: int = 1) -> float:
    loss, grads = lowered.loss_and_grads(inputs, weights)
    ref_loss, ref_grads = reference_loss_and_grads(
        model, inputs, weights, micro_batches=micro_batches
    )
    return max(
        [_close(loss, ref_loss)] + [_close(grads[w], ref_grads[w]) for w in lowered.weight_names]
    )


def _mnist_plans():
    machine = machine_from_spec("dgx-a100:1:2")
    model = build("mnist_mlp")
    return model, data_parallel(model, machine), unity_figure_2b(model, machine)


# --- Numerics ----------------------------------------------------------------------------------


def _width(pcg) -> int:
    return max(s.num_shards for n in pcg.nodes for s in pcg.output_shapes(n.name))


@settings(max_examples=25)
@given(small_pcgs(max_ops=8))
def test_random_plans_run_as_the_reference_evaluator_and_the_unsharded_model_say(pcg):
    try:
        # devices_needed lays the plan out too, and may find the same tie (a CI run drew one).
        assume(_width(pcg) > 1 and devices_needed(pcg) <= 8)
        _runs_as_its_reference(pcg)
    except LayoutError:
        # Some random plans tie two splits of one tensor to the same devices (a transpose that
        # swaps split dimensions): no SPMD layout holds them, and the lowering says so before
        # anything runs (tests/lower/test_layout.py checks that error); the others must run.
        assume(False)


@settings(max_examples=15)
@given(towers(max_towers=3, max_depth=2))
def test_random_branchy_plans_run_as_the_reference_evaluator_and_the_unsharded_model_say(pcg):
    """Towers split over their own degrees, narrower than the mesh: every device computes
    them (module docstring of pcgopt.lower.jax)."""
    _runs_as_its_reference(pcg)


def _runs_as_its_reference(pcg) -> None:
    lowered = lower(pcg, 8)
    inputs, weights = lowered.random_sources(seed=3)
    (out,) = lowered.forward(inputs, weights)
    (want,) = evaluate(pcg, {**inputs, **weights}).outputs
    assert _close(out, want.logical()) <= RTOL
    if lowered.weight_names:
        assert _agrees(lowered, pcg, inputs, weights) <= RTOL


def test_a_plan_whose_program_drops_its_reduce_is_caught(monkeypatch):
    model, _, figure_2b = _mnist_plans()
    honest = run_plan(figure_2b, model=model, devices=2, steps=1, collectives=False)
    assert honest.loss_relative <= RTOL and honest.grad_relative <= RTOL

    parallel = lowering._Program._parallel

    def without_reduce(self, node, xs):
        return xs[0] if node.op == "all_reduce" else parallel(self, node, xs)

    monkeypatch.setattr(lowering._Program, "_parallel", without_reduce)
    broken = run_plan(figure_2b, model=model, devices=2, steps=1, collectives=False)
    assert broken.loss_relative > 1e-2 or broken.grad_relative > 1e-2


def test_a_plan_without_its_reduce_is_not_a_plan():
    b = PCGBuilder()
    x = b.partition(b.input((8, 6), name="x"), dim=1, degree=2)
    partial = b.matmul(x, b.partition(b.weight((6, 4), name="w"), dim=0, degree=2))
    with pytest.raises(DegreeError, match="Reduce it first"):
        b.relu(partial)


# --- Training ----------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_a_training_step_applies_the_optimizer_to_the_unsharded_gradients(optimizer):
    model = build("mnist_mlp", small=True)
    plan = megatron(model, machine_from_spec("dgx-a100:1:2"))
    lowered = lower(plan, 2, optimizer=optimizer, learning_rate=0.1)
    inputs, weights = lowered.random_sources(seed=0)
    state = lowered.init(weights)
    for _ in range(2):
        state, _ = lowered.train_step(state, inputs)
    # The same two steps on the unsharded model, with optax.
    opt = lowering.optimizer_transform(optimizer, 0.1)
    params = {k: jax.numpy.asarray(v) for k, v in weights.items()}
    opt_state = opt.init(params)
    for _ in range(2):
        _, grads = reference_loss_and_grads(model, inputs, params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    for name in lowered.weight_names:
        assert _close(state.params[name], params[name]) <= RTOL
        assert state.params[name].sharding == lowered.sharding(name)
    assert state.step == 2


def test_a_zero_plan_splits_the_optimizer_state_and_trains_as_ddp_does():
    from dataclasses import replace

    from pcgopt.extract import DDP
    from pcgopt.extract.search.plan import mapped_plan

    machine = machine_from_spec("dgx-a100:1:4")
    model = build("transformer", small=True, batch=4)
    runs = {}
    for zero in (0, 1, 2):
        runtime = replace(DDP, zero_stage=zero)
        plan = mapped_plan(data_parallel(model, machine), machine, runtime=runtime)
        lowered = lower(plan)
        assert lowered.zero_stage == zero
        inputs, weights = lowered.random_sources(seed=0)
        state = lowered.init(weights)
        for _ in range(2):
            state, _ = lowered.train_step(state, inputs)
        runs[zero] = (lowered, state)
    _, ddp_state = runs[0]
    assert any(_close(ddp_state.params[n], weights[n]) > RTOL for n in weights)
    for stage in (1, 2):
        lowered, state = runs[stage]
        for name in lowered.weight_names:
            assert _close(state.params[name], ddp_state.params[name]) <= RTOL
        assert lowered.zero_exceptions() == () and lowered.note == ""
        # Adam's moments of a weight in 4 copies: a quarter of it on each device.
        mu = state.opt_state[0].mu
        name = max(lowered.weight_names, key=lambda n: np.prod(weights[n].shape))
        assert mu[name].addressable_shards[0].data.size * 4 == mu[name].size
        # XLA compiles what the cost model charges: the gradient's AllReduce (ZeRO-2: its
        # ReduceScatter), then the updated weight's AllGather, bytes and all.
        report = lowered.collectives()
        assert report.missing == () and report.extra == ()
        kinds = {p.spmd_kind for p, _ in report.matched if p.purpose == "weight sync"}
        synced = {"all-reduce", "all-gather"} if stage == 1 else {"reduce-scatter", "all-gather"}
        assert kinds == synced
        # Its plan file runs the same way.
        saved = SavedPlan.from_dict(lowered.pcg, json.loads(lowered.plan.to_json()))
        assert lower(saved).zero_stage == stage


def test_zero_2_splits_a_tensor_parallel_weights_state_further_and_trains_as_ddp_does():
    from dataclasses import replace

    from pcgopt.extract import DDP
    from pcgopt.extract.search.plan import mapped_plan

    # Megatron with data parallelism on 8 devices: a column-parallel weight is split over the
    # tensor-parallel axis and copied over the data-parallel one, which ZeRO splits it further
    # along (its blocks in the order the merged mesh axes say).
    machine = machine_from_spec("dgx-a100:1:8")
    model = build("transformer", small=True, batch=4)
    plans = {
        zero: mapped_plan(megatron(model, machine), machine, runtime=replace(DDP, zero_stage=zero))
        for zero in (0, 2)
    }
    params = {}
    for zero, plan in plans.items():
        lowered = lower(plan, concurrent=False)
        inputs, weights = lowered.random_sources(seed=1)
        state = lowered.init(weights)
        for _ in range(2):
            state, _ = lowered.train_step(state, inputs)
        params[zero] = state.params
    split = [
        n
        for n in lowered.weight_names
        if len(lowered.state_sharding(n).spec)
        and lowered.state_sharding(n) != lowered.sharding(n)
        and any(isinstance(e, tuple) for e in lowered.state_sharding(n).spec)
    ]
    assert split  # some state is split over both axes in one dimension
    for name in lowered.weight_names:
        assert _close(params[2][name], params[0][name]) <= RTOL, name


def test_a_weight_zero_cannot_split_trains_whole_and_the_run_says_so():
    from dataclasses import replace

    from pcgopt.extract import DDP
    from pcgopt.extract.search.plan import mapped_plan

    b = PCGBuilder()
    x = b.partition(b.input((8, 3), name="x"), dim=0, degree=4, name="x.split")
    odd = b.replicate(b.weight((3,), name="odd"), degree=4, name="odd.copies")
    even = b.replicate(b.weight((3, 4), name="even"), degree=4, name="even.copies")
    y = b.matmul(b.add(x, odd, name="shifted"), even, name="mm")
    pcg = b.build(b.combine(y, dim=0, degree=4, name="y"))
    machine = machine_from_spec("dgx-a100:1:4")
    lowered = lower(mapped_plan(pcg, machine, runtime=replace(DDP, zero_stage=1)))
    # 4 copies divide no dimension of a 3-vector: its state stays whole; the 3 x 4 matrix's
    # splits along its columns.
    assert lowered.zero_exceptions() == ("odd",)
    assert "ZeRO-1 is not applied to odd" in lowered.note
    assert lowered.state_sharding("odd") == lowered.sharding("odd")
    assert lowered.state_sharding("even") != lowered.sharding("even")
    inputs, weights = lowered.random_sources(seed=0)
    state, _ = lowered.train_step(lowered.init(weights), inputs)
    assert state.opt_state[0].mu["odd"].addressable_shards[0].data.shape == (3,)


def test_a_zero_plan_run_as_pieces_on_sub_meshes_says_it_keeps_the_state_whole():
    from dataclasses import replace

    from pcgopt.extract import DDP
    from pcgopt.extract.search.plan import mapped_plan
    from pcgopt.lower.mapped import MappedLowered

    machine = machine_from_spec("dgx-a100:1:4")
    plan = mapped_plan(
        data_parallel(build("transformer", small=True), machine),
        machine,
        runtime=replace(DDP, zero_stage=2),
    )
    pieces = lower(plan)
    assert isinstance(pieces, MappedLowered)
    assert "costed with ZeRO-2" in pieces.note and "optimizer state whole" in pieces.note


def test_gradient_accumulation_syncs_each_weight_once():
    model = build("bert_large", small=True, batch=4, layers=1)
    plan = megatron(model, machine_from_spec("dgx-a100:1:4"))
    lowered = lower(plan, 4, micro_batches=2)
    inputs, weights = lowered.random_sources(seed=2)
    assert _agrees(lowered, model, inputs, weights, micro_batches=2) <= RTOL
    report = lowered.collectives()
    syncs = [p for p, _ in report.matched if p.purpose == "weight sync"]
    assert len(syncs) == sum(1 for p in report.planned if p.purpose == "weight sync") > 0
    # Nothing else is compiled: not one gradient sum per micro-batch.
    assert report.extra == ()
    # The forward collectives run once per micro-batch, each on half of the bytes.
    gathers = [c for p, c in report.matched if p.node == "layer0/attn/q/linear.gather2"]
    assert len(gathers) == 4  # forward and backward, 2 micro-batches


def test_without_dropout_accumulated_gradients_equal_the_full_batch_ones():
    model = build("mlp", small=True, batch=8)
    plan = data_parallel(model, machine_from_spec("dgx-a100:1:2"))
    lowered = lower(plan, 2, micro_batches=4)
    inputs, weights = lowered.random_sources(seed=4)
    assert _agrees(lowered, model, inputs, weights, micro_batches=1) <= RTOL


def test_micro_batches_must_divide_every_batch_block():
    model = build("mlp", small=True)  # batch 4, split 2 ways: 2 rows a device
    plan = data_parallel(model, machine_from_spec("dgx-a100:1:2"))
    with pytest.raises(LoweringError, match="does not divide into 4 micro-batches") as err:
        lower(plan, 2, micro_batches=4)
    assert err.value.node == "x0"


# --- Collectives -------------------------------------------------------------------------------


def test_unity_figure_2_plans_compile_to_the_bytes_unity_gives():
    """Unity section 1: data parallelism moves 813,056 x d bytes, the joint plan of Figure 2b
    131,072 x d (here d = 4, float32), plus each plan's gather of its output."""
    _, figure_2a, figure_2b = _mnist_plans()
    for plan, expected in ((figure_2a, 813_056 * 4), (figure_2b, 131_072 * 4)):
        report = lower(plan, 2).collectives()
        assert report.bytes_by_kind()["all-reduce"][2] == expected
        assert report.bytes_by_kind()["all-gather"][2] == 64 * 10 * 4  # the output, 2 x 1/2
        assert report.extra == () and report.missing == ()


def test_spmd_forms_that_differ_from_the_cost_model_are_named():
    """A Combine's gather is an all-gather in SPMD and its scatter nothing; a Replicate's
    backward reduce an all-reduce and its broadcast nothing; a Reduce's reduce an all-reduce."""
    plan = megatron(build("bert_large", small=True), machine_from_spec("dgx-a100:1:4"))
    report = lower(plan, 4).collectives()
    forms = {(p.op, p.kind): p.spmd_kind for p in report.planned}
    assert forms[("replicate", "reduce")] == "all-reduce"
    assert forms[("replicate", "broadcast")] is None
    assert len(report.exact) == len(report.matched) - 1  # all but the Replicate's reduce
    _, figure_2a, _ = _mnist_plans()
    forms = {(p.op, p.kind): p for p in lower(figure_2a, 2).collectives().planned}
    gather = forms[("combine", "gather")]
    assert gather.spmd_kind == "all-gather" and gather.spmd_bytes == 2 * gather.bytes
    assert forms[("combine", "scatter")].spmd_kind is None


def test_a_lookup_table_syncs_its_dense_gradient():
    plan = data_parallel(build("dlrm", small=True), machine_from_spec("dgx-a100:1:4"))
    report = lower(plan, 4).collectives()
    (sync,) = [p for p in report.planned if p.node == "table0.r4"]
    assert sync.spmd_bytes > sync.bytes and "dense gradient" in sync.why
    assert [c.bytes for p, c in report.matched if p is sync] == [sync.spmd_bytes]


def test_the_loss_is_summed_over_the_devices_and_reported_apart():
    plan = megatron(build("bert_large", small=True), machine_from_spec("dgx-a100:1:4"))
    report = lower(plan, 4).collectives()
    assert report.extra == ()
    assert [c.shape for c in report.loss] == ["f32[]"]
    assert "the loss's sum: 1 scalar all-reduce" in report.summary()


def _megatron_mlp(tanh: bool):
    b = PCGBuilder()
    x = b.replicate(b.input((8, 12), name="x"), degree=2)
    h = b.relu(b.matmul(x, b.partition(b.weight((12, 8), name="w1"), dim=1, degree=2)))
    w2 = b.partition(b.weight((8, 4), name="w2"), dim=0, degree=2)
    y = b.discard_copies(b.all_reduce(b.matmul(h, w2), degree=2), degree=2)
    return b.build(b.tanh(y) if tanh else y)


def test_xla_drops_the_sum_of_a_gradient_it_knows_is_the_same_everywhere():
    """The loss is the mean of the output, so the output's gradient is a constant: the backward
    of an AllReduce right before the output sums a constant, which XLA folds. Behind a tanh the
    gradient depends on the data, and the all-reduce is compiled."""
    folded = lower(_megatron_mlp(tanh=False), 2).collectives()
    assert [(p.node, p.purpose) for p in folded.missing] == [("all_reduce_1", "backward")]
    kept = lower(_megatron_mlp(tanh=True), 2).collectives()
    assert kept.missing == () and len(kept.exact) == 2


# --- Shardings ---------------------------------------------------------------------------------


def test_the_plan_as_shardings_for_gspmd():
    _, figure_2a, figure_2b = _mnist_plans()
    plan = shardings(figure_2b, 2)
    assert plan.sources["w1"].spec == jax.sharding.PartitionSpec("d", None)
    assert plan.partial == {"matmul1.partial": ("d",)}
    assert set(plan.tensors) == {n.name for n in figure_2b.nodes if n.op not in ("input", "weight")}
    # GSPMD partitions data parallelism as the plan says: the same all-reduce of the gradients.
    report = shardings(figure_2a, 2).collectives()
    assert report.bytes_by_kind()["all-reduce"][2] == 813_056 * 4


def test_gspmd_may_choose_other_collectives_and_the_report_says_which():
    plan = megatron(build("bert_large", small=True), machine_from_spec("dgx-a100:1:4"))
    report = shardings(plan, 4).collectives()
    # GSPMD sums the gathered projections' gradients with all-reduces, not reduce-scatters.
    assert report.bytes_by_kind()["reduce-scatter"][2] == 0
    assert any(p.kind == "reduce_scatter" for p in report.missing)
    assert "planned but not compiled" in report.summary()


# --- Errors ------------------------------------------------------------------------------------


def test_errors_name_what_is_wrong():
    _, figure_2a, _ = _mnist_plans()
    with pytest.raises(LoweringError, match="spans 2 devices and JAX has 1"):
        lower(figure_2a, 1)
    with pytest.raises(LoweringError, match="unknown optimizer 'rmsprop'; valid: sgd"):
        lower(figure_2a, 2, optimizer="rmsprop")
    with pytest.raises(LoweringError, match="takes a Plan or a PCG, got str"):
        lower("plan.json")
    lowered = lower(figure_2a, 2)
    inputs, weights = lowered.random_sources()
    with pytest.raises(LoweringError, match=r"inputs 'x' has shape \(3, 784\), expected"):
        lowered.forward({"x": np.zeros((3, 784))}, weights)
    with pytest.raises(LoweringError, match="weights: missing 'w2'"):
        lowered.forward(inputs, {"w1": weights["w1"]})
    with pytest.raises(LoweringError, match="micro_batches must be a positive integer"):
        lower(figure_2a, 2, micro_batches=0)


def test_a_plan_in_micro_batches_runs_as_the_reference_evaluator_says():
    """Pipeline and Batch change the order of work, not values: each device's program
    computes its whole block (a pipelined plan's loop over micro-batches is
    pcgopt.lower.pipelined's)."""
    from pcgopt import with_micro_batches

    _, dp, _ = _mnist_plans()
    cut = with_micro_batches(dp, 4)
    assert any(n.op == "pipeline" for n in cut.nodes)
    _runs_as_its_reference(cut)
