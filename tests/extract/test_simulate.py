"""The simulated iteration (pcgopt.extract.costmodel.simulate): what overlaps, what waits, and
the bounds that tie it to the additive cost model."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings

from pcgopt import Machine, PCGBuilder, models
from pcgopt.extract import (
    ADDITIVE,
    DDP,
    CostError,
    Runtime,
    collective_cost,
    iteration_cost,
)
from pcgopt.extract.strategies.baselines import data_parallel
from pcgopt.testing.strategies import small_pcgs

TWO_GPUS = Machine.preset("summit", nodes=1, devices_per_node=2)
TWO_NODES = Machine.preset("summit", nodes=2)
RUNTIMES = (
    DDP,
    Runtime(overlap=False),
    Runtime(bucket_bytes=0),
    ADDITIVE,
    Runtime(precision="bf16-mixed"),
    Runtime(zero_stage=1),
    Runtime(zero_stage=2, bucket_bytes=0),
)


def dense_chain(layers: int, width: int = 256, rows: int = 64, degree: int = 2):
    """A data-parallel chain of ``layers`` dense layers: each weight replicated ``degree``
    ways, so each has a gradient AllReduce."""
    b = PCGBuilder()
    h = b.partition(b.input((rows, width), name="x"), dim=0, degree=degree, name="x.split")
    for i in range(layers):
        w = b.replicate(b.weight((width, width), name=f"w{i}"), degree=degree, name=f"w{i}.copies")
        h = b.relu(b.matmul(h, w, name=f"mm{i}"), name=f"act{i}")
    return b.build(b.combine(h, dim=0, degree=degree, name="y"))


def assert_valid(timeline) -> None:
    """Tasks of one stream never overlap, and all lie within the iteration."""
    for stream in ("compute", "comm"):
        tasks = sorted((t for t in timeline.tasks if t.stream == stream), key=lambda t: t.start_s)
        for a, b in itertools.pairwise(tasks):
            assert a.end_s <= b.start_s + 1e-15, (a, b)
    assert all(0 <= t.start_s <= t.end_s <= timeline.time_s + 1e-15 for t in timeline.tasks)


def test_without_communication_the_iteration_is_the_sum_of_its_kernels():
    pcg = models.build("mnist_mlp", small=True)
    cost = iteration_cost(pcg, TWO_GPUS)
    assert cost.comm_s == 0
    assert cost.total_s == pytest.approx(cost.additive_s, rel=1e-12)
    assert cost.exposed_comm_s == pytest.approx(0, abs=1e-15)
    assert {t.stream for t in cost.timeline().tasks} == {"compute"}


def test_a_lone_allreduce_with_nothing_to_hide_behind_is_exposed_whole():
    # One layer over the input: its weight gradient is the backward's last kernel, so its
    # AllReduce has nothing left to overlap and the update waits for it.
    pcg = dense_chain(1)
    cost = iteration_cost(pcg, TWO_GPUS)
    alone = collective_cost("all_reduce", [(0, 1)], 256 * 256 * 4, TWO_GPUS).seconds
    sync = [t for t in cost.timeline().tasks if t.phase == "sync"]
    assert [t.name for t in sync] == ["w0.copies"]
    assert sync[0].seconds == pytest.approx(alone, rel=1e-12)
    # Nothing overlaps: the output's Combine is waited for too, in the forward and backward.
    assert cost.exposed_comm_s == pytest.approx(cost.comm_s, rel=1e-9)
    assert cost.total_s == pytest.approx(cost.additive_s, rel=1e-9)


def test_a_gradient_allreduce_runs_beside_the_backward_of_the_layers_before_it():
    pcg = dense_chain(4, width=1024)
    cost = iteration_cost(pcg, TWO_NODES, runtime=Runtime(bucket_bytes=0))
    tasks = cost.timeline().tasks
    sync = {t.name: t for t in tasks if t.phase == "sync"}
    backward = {t.name: t for t in tasks if t.phase == "backward"}
    # w3's gradient is ready after mm3's backward and is summed while mm2..mm0 run theirs.
    assert sync["w3.copies"].start_s == pytest.approx(backward["mm3"].end_s)
    assert sync["w3.copies"].start_s < backward["mm0"].end_s
    assert cost.total_s < cost.additive_s
    assert cost.exposed_comm_s < cost.comm_s
    without = iteration_cost(pcg, TWO_NODES, runtime=Runtime(overlap=False, bucket_bytes=0))
    assert without.total_s == pytest.approx(cost.additive_s, rel=1e-12)


def test_buckets_pay_one_latency_for_many_small_gradients():
    # 40 small weights: alone, each AllReduce pays the inter-node latency 2(p-1) times.
    pcg = dense_chain(40, width=64, rows=96, degree=12)
    alone = iteration_cost(pcg, TWO_NODES, runtime=Runtime(overlap=False, bucket_bytes=0))
    bucketed = iteration_cost(pcg, TWO_NODES, runtime=Runtime(overlap=False))
    assert bucketed.total_s < 0.5 * alone.total_s
    syncs = [t for t in bucketed.timeline().tasks if t.phase == "sync"]
    assert [t.name for t in syncs] == ["bucket 1 (40 gradients)"]  # 640 KiB < 25 MiB
    # One bucket per 16 KiB: every gradient (16 KiB) fills one.
    small = iteration_cost(pcg, TWO_NODES, runtime=Runtime(bucket_bytes=16 * 2**10))
    assert sum(t.phase == "sync" for t in small.timeline().tasks) == 40


def test_gradient_accumulation_synchronizes_once_after_the_last_micro_batch():
    pcg = dense_chain(3, width=512, rows=64)
    one = iteration_cost(pcg, TWO_GPUS)
    four = iteration_cost(pcg, TWO_GPUS, micro_batches=4)
    timeline = four.timeline()
    assert {t.micro_batch for t in timeline.tasks} == {0, 1, 2, 3}
    assert {t.micro_batch for t in timeline.tasks if t.phase in ("sync", "update")} == {3}
    # The first three micro-batches take the same time each, one after another.
    starts = [min(t.start_s for t in timeline.tasks if t.micro_batch == k) for k in range(4)]
    assert starts[2] - starts[1] == pytest.approx(starts[1] - starts[0])
    assert four.total_s > one.total_s  # the same work, paying more launches
    assert_valid(timeline)


@settings(max_examples=60, deadline=None)
@given(small_pcgs(max_ops=6, degrees=(2, 4)))
def test_the_simulated_time_lies_between_the_compute_streams_work_and_the_additive_sum(pcg):
    machine = Machine.preset("dgx-a100", nodes=2)
    try:
        costs = {runtime: iteration_cost(pcg, machine, runtime=runtime) for runtime in RUNTIMES}
    except CostError as e:
        assert "devices" in str(e) and e.node in pcg
        return
    for runtime, cost in costs.items():
        busy = cost.compute_s + cost.update_s
        assert busy * (1 - 1e-9) <= cost.total_s <= cost.additive_s * (1 + 1e-9), runtime
        # Nor can it be shorter than the communication stream's work.
        assert cost.timeline().busy_s("comm") <= cost.total_s * (1 + 1e-9)
        assert_valid(cost.timeline())
    assert costs[ADDITIVE].total_s == costs[ADDITIVE].additive_s
    # Buckets never make it slower than gradients alone, nor overlap than running in turn.
    assert costs[Runtime(overlap=False)].total_s <= costs[ADDITIVE].total_s * (1 + 1e-9)
    assert costs[DDP].total_s <= costs[Runtime(overlap=False)].total_s * (1 + 1e-9)
    assert costs[Runtime(bucket_bytes=0)].total_s <= costs[ADDITIVE].total_s * (1 + 1e-9)
    # Gradient accumulation keeps the bounds, where the batch divides.
    try:
        two = iteration_cost(pcg, machine, micro_batches=2)
    except CostError as e:
        assert "micro-batches must divide" in str(e)
        return
    busy = two.compute_s + two.update_s
    assert busy * (1 - 1e-9) <= two.total_s <= two.additive_s * (1 + 1e-9)
    assert_valid(two.timeline())


def test_the_timeline_says_what_each_device_runs():
    pcg = data_parallel(models.build("mnist_mlp", small=True), TWO_GPUS)
    cost = iteration_cost(pcg, TWO_GPUS)
    timeline = cost.timeline()
    assert timeline.time_s == cost.total_s
    assert timeline.on_device(1) == tuple(sorted(timeline.tasks, key=lambda t: t.start_s))
    assert timeline.on_device(2) == ()
    assert timeline.busy_s("compute") == pytest.approx(cost.compute_s + cost.update_s)
    assert "Timeline(" in repr(timeline) and "Runtime(overlap, 25 MiB buckets)" in repr(timeline)
    renamed = cost.renamed({n.name: f"model/{n.name}" for n in pcg.nodes}).timeline()
    assert {t.name for t in renamed.tasks if t.phase == "forward"} == {
        f"model/{t.name}" for t in timeline.tasks if t.phase == "forward"
    }


def test_runtime_options_are_checked():
    with pytest.raises(ValueError, match="bucket_bytes must be a non-negative"):
        Runtime(bucket_bytes=-1)
    with pytest.raises(ValueError, match=r"zero_stage must be one of 0, 1, 2 \(ZeRO-3 is the fsdp"):
        Runtime(zero_stage=3)
    with pytest.raises(ValueError, match="zero_stage must be one of"):
        Runtime(zero_stage=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="zero_stage must be one of"):
        Runtime(zero_stage=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="overlap must be True or False"):
        Runtime(overlap="yes")  # type: ignore[arg-type]
    with pytest.raises(CostError, match=r"runtime must be a pcgopt\.extract\.Runtime"):
        iteration_cost(dense_chain(1), TWO_GPUS, runtime="ddp")  # type: ignore[arg-type]
    assert repr(ADDITIVE) == "Runtime(additive)"
    assert repr(Runtime(overlap=False, bucket_bytes=2**20)) == "Runtime(no overlap, 1 MiB buckets)"


# --- Mixed precision ------------------------------------------------------------------------------

A100S = Machine.preset("dgx-a100", nodes=1, devices_per_node=2)


def test_zero_shards_the_optimizer_state_then_the_gradients_over_the_copies():
    pcg = dense_chain(3, degree=4)
    machine = Machine.preset("dgx-a100", nodes=1, devices_per_node=4)
    ddp, one, two = (iteration_cost(pcg, machine, runtime=Runtime(zero_stage=k)) for k in (0, 1, 2))
    w = 3 * 256 * 256 * 4  # three float32 weights, each kept whole on every copy
    assert ddp.memory.weights == one.memory.weights == two.memory.weights == w
    assert ddp.memory.optimizer_state == 2 * w  # Adam's two moments
    assert one.memory.optimizer_state == two.memory.optimizer_state == 2 * w // 4
    assert ddp.memory.gradients == one.memory.gradients == w
    assert two.memory.gradients == w // 4
    # Each copy updates its quarter; the update's launches stay.
    assert one.update_s == two.update_s < ddp.update_s


def test_zero_gathers_the_updated_weights_after_the_update():
    pcg = dense_chain(3, degree=4)
    machine = Machine.preset("dgx-a100", nodes=1, devices_per_node=4)
    ddp = iteration_cost(pcg, machine, runtime=Runtime(bucket_bytes=0))
    two = iteration_cost(pcg, machine, runtime=Runtime(zero_stage=2, bucket_bytes=0))
    one = iteration_cost(pcg, machine, runtime=Runtime(zero_stage=1, bucket_bytes=0))
    kinds = [c.kind for c in two.per_node["w0.copies"].collectives]
    assert kinds == ["reduce_scatter", "all_gather"]
    assert [c.kind for c in one.per_node["w0.copies"].collectives] == ["all_reduce", "all_gather"]
    # A reduce-scatter and an all-gather move what one all-reduce does.
    assert two.comm_bytes == pytest.approx(ddp.comm_bytes)
    # ZeRO-1 gathers on top of the all-reduce: half as much again.
    syncs = [f"w{i}.copies" for i in range(3)]
    assert sum(one.per_node[n].comm_bytes for n in syncs) == pytest.approx(
        1.5 * sum(ddp.per_node[n].comm_bytes for n in syncs)
    )
    tasks = two.timeline().tasks
    update = next(t for t in tasks if t.phase == "update")
    gathers = [t for t in tasks if t.phase == "sync" and t.start_s >= update.end_s]
    assert len(gathers) == 3 and all(t.stream == "comm" for t in gathers)
    assert two.total_s == pytest.approx(max(t.end_s for t in gathers))
    assert "ZeRO-2" in repr(two.runtime)


def test_zero_buckets_its_gathers_as_its_gradients():
    pcg = dense_chain(6, width=64)
    bucketed = iteration_cost(pcg, TWO_NODES, runtime=Runtime(zero_stage=1))
    names = [t.name for t in bucketed.timeline().tasks if t.phase == "sync"]
    assert names == ["bucket 1 (6 gradients)", "gather 1 (6 weights)"]


def test_zero_2_keeps_whole_gradients_while_it_accumulates_micro_batches():
    pcg = dense_chain(3, degree=4)
    machine = Machine.preset("dgx-a100", nodes=1, devices_per_node=4)
    w = 3 * 256 * 256 * 4
    once = iteration_cost(pcg, machine, runtime=Runtime(zero_stage=2))
    twice = iteration_cost(pcg, machine, runtime=Runtime(zero_stage=2), micro_batches=2)
    assert once.memory.gradients == w // 4
    # The first micro-batch's gradients wait, unsynchronized and whole, for the second's.
    assert twice.memory.gradients == w
    assert twice.memory.optimizer_state == once.memory.optimizer_state == 2 * w // 4


def test_zero_synchronizes_an_embedding_table_densely():
    b = PCGBuilder()
    ids = b.partition(
        b.input((64, 1), dtype="i64", max_value=10_000, name="ids"),
        dim=0,
        degree=2,
        name="ids.split",
    )
    table = b.replicate(b.weight((10_000, 64), name="table"), degree=2, name="table.copies")
    rows = b.embedding(ids, table, name="lookup")
    pcg = b.build(b.combine(rows, dim=0, degree=2, name="y"))
    ddp = iteration_cost(pcg, TWO_GPUS)
    zero = iteration_cost(pcg, TWO_GPUS, runtime=Runtime(zero_stage=1))
    sync = {c.kind: c for c in zero.per_node["table.copies"].collectives}
    # DDP all-reduces the rows the batch looked up; ZeRO's flat buffers are the whole table.
    assert ddp.per_node["table.copies"].collectives[0].nbytes < 10_000 * 64 * 4
    assert sync["all_reduce"].nbytes == sync["all_gather"].nbytes == 10_000 * 64 * 4


def test_mixed_precision_computes_in_bf16_and_keeps_float32_master_weights():
    pcg = data_parallel(models.build("mnist_mlp"), A100S)  # b = 64, 784 -> 512 -> 10
    full = iteration_cost(pcg, A100S)
    mixed = iteration_cost(pcg, A100S, precision="bf16-mixed")
    assert mixed.runtime.precision == "bf16-mixed" and "bf16-mixed" in repr(mixed.runtime)
    # Kernels at the bf16 rate on 2-byte tensors.
    assert mixed.compute_s < full.compute_s
    # Weights: the float32 master copy and a bf16 one; gradients and Adam's state in float32;
    # the activations kept for the backward in bf16.
    assert mixed.memory.weights == full.memory.weights * 3 // 2
    assert mixed.memory.gradients == full.memory.gradients
    assert mixed.memory.optimizer_state == full.memory.optimizer_state
    assert mixed.memory.activations * 2 == full.memory.activations
    # The gradients' AllReduce stays in float32; the output's Combine moves bf16.
    sync = [c for n in mixed.per_node.values() for c in n.collectives if c.purpose == "weight sync"]
    full_sync = [
        c for n in full.per_node.values() for c in n.collectives if c.purpose == "weight sync"
    ]
    assert sum(c.bytes for c in sync) == sum(c.bytes for c in full_sync) > 0
    assert (
        mixed.per_node["matmul2.combine0"].comm_bytes * 2
        == full.per_node["matmul2.combine0"].comm_bytes
    )


def test_a_precision_the_device_has_no_rate_for_is_refused_with_the_one_to_use():
    v100s = Machine.preset("summit", nodes=1, devices_per_node=2)
    with pytest.raises(CostError, match=r"no rate for it .* use 'f32' or 'f16-mixed'"):
        iteration_cost(dense_chain(1), v100s, precision="bf16-mixed")
    assert iteration_cost(dense_chain(1), v100s, precision="f16-mixed").feasible
    with pytest.raises(CostError, match="precision must be one of f32, bf16-mixed, f16-mixed"):
        iteration_cost(dense_chain(1), v100s, precision="fp8")
