"""The cost model: hand-computed values (Unity's MNIST example, alpha-beta closed forms, FLOPs,
memory), properties that must hold for any input, and the errors users see."""

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pcgopt import DeviceSpec, Level, Link, Machine, PCGBuilder, models
from pcgopt.extract import (
    COLLECTIVES,
    OPTIMIZERS,
    CostError,
    collective_cost,
    flat_coefficients,
    iteration_cost,
    roofline_s,
)
from pcgopt.extract.costmodel.cost import update_s
from pcgopt.machine import V100_SXM2_16GB
from pcgopt.testing.strategies import small_pcgs

# Unity section 1: b = 64, h = 512, c_o = 10, c_i = 28 x 28.
B, CI, H, CO = 64, 784, 512, 10
ITEMSIZE = {"f32": 4, "f16": 2}

# Two GPUs of one Summit socket: joined by NVLink (50 GB/s, 3.4 µs).
TWO_GPUS = Machine.preset("summit", nodes=1, devices_per_node=2)
NVLINK = TWO_GPUS.levels[-1].link


def fig2a(dtype="f32"):
    """Unity Figure 2a: MatMul and ReLU fused, data parallelism for both layers."""
    b = PCGBuilder()
    x = b.partition(b.input((B, CI), dtype, name="x"), dim=0, degree=2, name="split_x")
    w1 = b.replicate(b.weight((CI, H), dtype, name="w1"), degree=2, name="copy_w1")
    w2 = b.replicate(b.weight((H, CO), dtype, name="w2"), degree=2, name="copy_w2")
    h = b.linear(x, w1, activation="relu", name="linear1")
    return b.build(b.matmul(h, w2, name="matmul2"))


def fig2b(dtype="f32"):
    """Unity Figure 2b: MatMul and ReLU unfused, reduction parallelism for the first MatMul
    (its output's activation and gradient are all-reduced), the second split by its output
    columns, so no weight is replicated."""
    b = PCGBuilder()
    x = b.partition(b.input((B, CI), dtype, name="x"), dim=1, degree=2, name="split_x")
    w1 = b.partition(b.weight((CI, H), dtype, name="w1"), dim=0, degree=2, name="split_w1")
    h = b.all_reduce(b.matmul(x, w1, name="matmul1"), degree=2, name="sum_h")
    w2 = b.partition(b.weight((H, CO), dtype, name="w2"), dim=1, degree=2, name="split_w2")
    return b.build(b.matmul(b.relu(h, name="relu"), w2, name="matmul2"))


def readme_plan():
    """The README's plan: model parallelism for the first MatMul, reduction for the second."""
    b = PCGBuilder()
    x = b.input((B, CI), name="x")
    w1, w2 = b.weight((CI, H), name="w1"), b.weight((H, CO), name="w2")
    h = b.relu(b.matmul(b.replicate(x, degree=2), b.partition(w1, dim=1, degree=2)))
    y = b.matmul(h, b.partition(w2, dim=0, degree=2))
    return b.build(b.reduce(y, degree=2, name="sum_y"))


def collectives(cost):
    return [
        (n, c.purpose, c.kind, c.nbytes) for n, nc in cost.per_node.items() for c in nc.collectives
    ]


# --- Unity's MNIST example on two GPUs ----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_fig2a_data_parallelism_moves_813056_elements_of_weight_gradients(dtype):
    size = ITEMSIZE[dtype]
    cost = iteration_cost(fig2a(dtype), TWO_GPUS)
    assert 2 * (CI * H + H * CO) == 813_056
    assert cost.comm_bytes == 813_056 * size
    assert dict(cost.comm_bytes_per_level) == {"node": 0, "socket": 0, "gpu": 813_056 * size}
    # All of it is the AllReduce of each replicated weight's gradient, the backward of its
    # Replicate; loading x already split costs nothing.
    assert collectives(cost) == [
        ("copy_w1", "weight sync", "all_reduce", CI * H * size),
        ("copy_w2", "weight sync", "all_reduce", H * CO * size),
    ]
    # A ring AllReduce on 2 devices: 2 steps, and each device sends 2(p-1)/p n = n.
    expected = sum(2 * NVLINK.latency_s + n * size / NVLINK.bandwidth_Bps for n in (CI * H, H * CO))
    assert cost.comm_s == pytest.approx(expected)
    assert cost.comm_s_per_level["gpu"] == pytest.approx(expected)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_fig2b_reduction_parallelism_moves_4bh_elements(dtype):
    size = ITEMSIZE[dtype]
    cost = iteration_cost(fig2b(dtype), TWO_GPUS)
    assert 4 * B * H == 131_072
    assert cost.comm_bytes == 131_072 * size
    # The first MatMul's output is all-reduced forward, and its gradient backward (AllReduce is
    # its own dual); no weight is synchronized.
    assert collectives(cost) == [
        ("sum_h", "forward", "all_reduce", B * H * size),
        ("sum_h", "backward", "all_reduce", B * H * size),
    ]


def test_joint_plan_moves_six_times_less_than_the_fused_data_parallel_one():
    a, b = iteration_cost(fig2a(), TWO_GPUS), iteration_cost(fig2b(), TWO_GPUS)
    assert a.comm_bytes / b.comm_bytes == pytest.approx(813_056 / 131_072)  # 6.2x
    assert b.comm_s < a.comm_s


def test_readme_plan_moves_only_the_output_and_its_gradient():
    cost = iteration_cost(readme_plan(), TWO_GPUS)
    # Reduce of y [b, c_o] forward (one device sends it), Broadcast of its gradient backward;
    # x is loaded on both devices and the weights are stored split.
    assert collectives(cost) == [
        ("sum_y", "forward", "reduce", B * CO * 4),
        ("sum_y", "backward", "broadcast", B * CO * 4),
    ]
    assert cost.comm_bytes == 2 * B * CO * 4


def test_explicit_devices_put_fig2a_across_two_nodes():
    machine = Machine.preset("summit", nodes=2)
    groups = {"copy_w1": [(0, 6)], "copy_w2": (0, 6)}  # groups, or one flat tuple
    cost = iteration_cost(fig2a(), machine, devices=groups)
    assert dict(cost.comm_bytes_per_level) == {"node": 813_056 * 4, "socket": 0, "gpu": 0}
    net = machine.levels[0].link
    expected = sum(2 * net.latency_s + n * 4 / net.bandwidth_Bps for n in (CI * H, H * CO))
    assert cost.comm_s == pytest.approx(expected)
    # By default the groups are the closest devices: 0 and 1, over NVLink.
    default = iteration_cost(fig2a(), machine)
    assert dict(default.comm_bytes_per_level) == {"node": 0, "socket": 0, "gpu": 813_056 * 4}
    assert default.comm_s < cost.comm_s


# --- Alpha-beta closed forms --------------------------------------------------------------------

ALPHA, BANDWIDTH = 2e-6, 10e9


def flat_machine(devices=8, bandwidth=BANDWIDTH, latency=ALPHA):
    return Machine((Level("gpu", devices, Link(bandwidth, latency)),), V100_SXM2_16GB, name="flat")


# AutoDDL Table 2 (with the ring's 2(p-1) steps for AllReduce), and what all devices send.
CLOSED_FORMS = {
    "all_reduce": (
        lambda p, n: 2 * (p - 1),
        lambda p, n: 2 * (p - 1) / p * n,
        lambda p, n: 2 * (p - 1) * n,
    ),
    "all_gather": (lambda p, n: p - 1, lambda p, n: (p - 1) / p * n, lambda p, n: (p - 1) * n),
    "reduce_scatter": (lambda p, n: p - 1, lambda p, n: (p - 1) / p * n, lambda p, n: (p - 1) * n),
    "all_to_all": (lambda p, n: p - 1, lambda p, n: (p - 1) / p * n, lambda p, n: (p - 1) * n),
    "broadcast": (lambda p, n: p - 1, lambda p, n: n, lambda p, n: (p - 1) * n),
    "reduce": (lambda p, n: p - 1, lambda p, n: n, lambda p, n: (p - 1) * n),
    "scatter": (lambda p, n: p - 1, lambda p, n: (p - 1) / p * n, lambda p, n: (p - 1) / p * n),
    "gather": (lambda p, n: p - 1, lambda p, n: (p - 1) / p * n, lambda p, n: (p - 1) / p * n),
}


def test_every_collective_has_a_closed_form():
    assert set(CLOSED_FORMS) == set(COLLECTIVES)


@pytest.mark.parametrize("kind", COLLECTIVES)
@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_flat_collective_on_one_level_is_its_closed_form(kind, p):
    n = 3 * 2**20
    steps, volume, total = CLOSED_FORMS[kind]
    assert flat_coefficients(kind, p, n) == pytest.approx((steps(p, n), volume(p, n)))
    cost = collective_cost(kind, [tuple(range(p))], n, flat_machine())
    assert cost.algorithm == "flat"
    assert cost.seconds == pytest.approx(steps(p, n) * ALPHA + volume(p, n) / BANDWIDTH)
    assert cost.bytes == pytest.approx(total(p, n), rel=1e-12)
    assert dict(cost.bytes_per_level) == pytest.approx({"gpu": total(p, n)})


def two_nodes(gpus=4, nic=5e9, nvlink=200e9):
    """Two nodes of ``gpus`` GPUs; one NIC per node, shared by its GPUs."""
    return Machine(
        (Level("node", 2, Link(nic, 8e-6)), Level("gpu", gpus, Link(nvlink, 3e-6))),
        V100_SXM2_16GB,
    )


def test_all_reduce_across_nodes_is_hierarchical_when_the_network_is_slow():
    m, n = two_nodes(), 1e8
    (net, nvl) = (level.link for level in m.levels)
    cost = collective_cost("all_reduce", [tuple(range(8))], n, m)
    # ReduceScatter among the 4 GPUs of a node, AllReduce between the 2 nodes (all 4 GPUs of a
    # node through its one NIC, n bytes in all), AllGather among the 4 GPUs.
    inner = 2 * (3 * nvl.latency_s + 3 / 4 * n / nvl.bandwidth_Bps)
    outer = 2 * net.latency_s + 2 * (1 / 2) * n / net.bandwidth_Bps
    assert cost.algorithm == "hierarchical"
    assert cost.seconds == pytest.approx(inner + outer)
    assert dict(cost.seconds_per_level) == pytest.approx({"node": outer, "gpu": inner})
    # The ring would cross the NIC with 2(p-1)/p n: almost twice the hierarchical n.
    flat = collective_cost("all_reduce", [tuple(range(8))], n, m, algorithm="flat")
    assert flat.seconds == pytest.approx(14 * net.latency_s + 2 * 7 / 8 * n / net.bandwidth_Bps)
    # Same bytes in all (2(p-1) n), but only 2n of them between the nodes.
    assert cost.bytes == flat.bytes == 2 * 7 * n
    assert cost.bytes_per_level["node"] == 2 * n


def test_groups_sharing_a_network_link_share_its_bandwidth():
    m, n = two_nodes(), 1e8
    net = m.levels[0].link
    one = collective_cost("all_reduce", [(0, 4)], n, m)
    four = collective_cost("all_reduce", [(k, k + 4) for k in range(4)], n, m)
    assert one.seconds == pytest.approx(2 * net.latency_s + n / net.bandwidth_Bps)
    assert four.seconds == pytest.approx(2 * net.latency_s + 4 * n / net.bandwidth_Bps)
    assert four.bytes == 4 * one.bytes


def test_operators_that_only_relabel_shards_move_nothing():
    b = PCGBuilder()
    w = b.replicate(b.weight((4, 4), name="w"), degree=2)
    y = b.matmul(b.replicate(b.input((4, 4), name="x"), degree=2), w)  # r2 copies
    partial = b.to_partial(y, degree=2, name="to_partial")
    s = b.stack_partial(partial, partial, name="stack")  # r4(partial): on 4 devices
    z = b.discard_copies(b.relu(y), degree=2, name="discard")
    cost = iteration_cost(b.build(s, z), Machine.preset("summit"))
    for name in ("to_partial", "stack", "discard"):
        assert cost.per_node[name].collectives == () and cost.per_node[name].total_s == 0


def test_a_group_of_one_device_moves_nothing():
    cost = collective_cost("all_reduce", [(0,), (1,)], 1e6, flat_machine())
    assert (cost.seconds, cost.bytes, cost.algorithm) == (0.0, 0.0, "none")


def test_reduction_cost_hook_times_every_all_reduce():
    seen = []

    def synthesized(groups, nbytes, machine):
        seen.append((groups, nbytes, machine))
        return 1.0

    cost = iteration_cost(fig2a(), TWO_GPUS, reduction_cost=synthesized)
    assert cost.comm_s == 2.0
    assert cost.comm_bytes == 813_056 * 4  # the bytes stay the alpha-beta algorithm's
    # Each gradient's AllReduce, then the bucket of both, which the simulation runs instead.
    assert seen == [
        (((0, 1),), CI * H * 4.0, TWO_GPUS),
        (((0, 1),), H * CO * 4.0, TWO_GPUS),
        (((0, 1),), (CI * H + H * CO) * 4.0, TWO_GPUS),
    ]
    assert [t.name for t in cost.timeline().tasks if t.phase == "sync"] == [
        "bucket 1 (2 gradients)"
    ]
    assert {c.algorithm for n in cost.per_node.values() for c in n.collectives} == {"custom"}


# --- Properties of communication ----------------------------------------------------------------


@st.composite
def machines_and_groups(draw):
    counts = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    links = [Link(draw(st.floats(1e9, 1e12)), draw(st.floats(0, 1e-4)), "switched") for _ in counts]
    machine = Machine(
        tuple(
            Level(f"l{i}", c, link) for i, (c, link) in enumerate(zip(counts, links, strict=True))
        ),
        V100_SXM2_16GB,
    )
    size = draw(
        st.sampled_from(
            [d for d in range(2, machine.num_devices + 1) if machine.num_devices % d == 0] or [1]
        )
    )
    groups = [
        tuple(range(g * size, (g + 1) * size))
        for g in range(draw(st.integers(1, machine.num_devices // size)))
    ]
    return machine, groups


@given(
    machines_and_groups(),
    st.sampled_from(COLLECTIVES),
    st.floats(1, 1e9),
    st.data(),
)
def test_more_bandwidth_never_costs_more(setup, kind, nbytes, data):
    machine, groups = setup
    level = data.draw(st.integers(0, len(machine.levels) - 1))
    factor = data.draw(st.floats(1, 100))
    faster = Machine(
        tuple(
            Level(lv.name, lv.count, Link(lv.link.bandwidth_Bps * factor, lv.link.latency_s))
            if i == level
            else lv
            for i, lv in enumerate(machine.levels)
        ),
        machine.device,
    )
    for algorithm in ("flat", "best"):
        slow = collective_cost(kind, groups, nbytes, machine, algorithm=algorithm)
        fast = collective_cost(kind, groups, nbytes, faster, algorithm=algorithm)
        assert fast.seconds <= slow.seconds * (1 + 1e-12)
        assert fast.bytes == slow.bytes or algorithm == "best"


@given(st.floats(1, 100))
def test_more_bandwidth_never_makes_an_iteration_slower(factor):
    machine = Machine.preset("summit", nodes=2)
    faster = Machine(
        tuple(
            Level(lv.name, lv.count, Link(lv.link.bandwidth_Bps * factor, lv.link.latency_s))
            for lv in machine.levels
        ),
        machine.device,
    )
    for plan in (fig2a(), fig2b(), readme_plan()):
        for devices in (
            None,
            {n.name: (0, 6) for n in plan.nodes if n.op in ("replicate", "all_reduce", "reduce")},
        ):
            assert (
                iteration_cost(plan, faster, devices=devices).total_s
                <= iteration_cost(plan, machine, devices=devices).total_s
            )


# --- Compute -----------------------------------------------------------------------------------


def test_a_matmul_counts_2mkn_flops_per_task_and_runs_at_the_roofline():
    b = PCGBuilder()
    x = b.input((B, CI), name="x")
    y = b.matmul(x, b.weight((CI, H), name="w"), name="mm")
    cost = iteration_cost(b.build(y), TWO_GPUS)
    mm = cost.per_node["mm"]
    assert mm.flops == 2 * B * CI * H == 51_380_224
    moved = 4 * (B * CI + CI * H + B * H)
    v100 = TWO_GPUS.device
    assert mm.forward_s == pytest.approx(
        max(mm.flops / 15.7e12, moved / 900e9) + v100.launch_overhead_s
    )
    assert mm.forward_s == roofline_s(mm.flops, moved, "f32", v100)
    # Only the weight needs a gradient (x is data): dW = x^T dY costs one forward.
    assert mm.backward_s == mm.forward_s


def test_split_batch_halves_a_matmuls_flops():
    b = PCGBuilder()
    x = b.partition(b.input((B, CI), name="x"), dim=0, degree=2)
    y = b.matmul(x, b.replicate(b.weight((CI, H), name="w"), degree=2), name="mm")
    assert iteration_cost(b.build(y), TWO_GPUS).per_node["mm"].flops == B * CI * H


def test_backward_costs_one_forward_per_input_needing_a_gradient_and_a_pass_for_a_bias():
    b = PCGBuilder()
    x = b.input((B, CI), name="x")
    h = b.relu(b.matmul(x, b.weight((CI, H), name="w1"), name="mm1"), name="relu")
    y = b.matmul(h, b.weight((H, CO), name="w2"), name="mm2")
    z = b.linear(y, b.weight((CO, CO), name="w3"), b.weight((CO,), name="bias"), name="fc")
    cost = iteration_cost(b.build(z), TWO_GPUS)
    nodes = cost.per_node
    assert nodes["mm1"].backward_s == nodes["mm1"].forward_s  # dW1 only
    assert nodes["relu"].backward_s == nodes["relu"].forward_s
    assert nodes["mm2"].backward_s == 2 * nodes["mm2"].forward_s  # dH and dW2
    # fc: dY and dW3 like the forward; the bias's gradient sums dZ over the batch: one pass.
    out_bytes = B * CO * 4
    bias_pass = roofline_s(B * CO, out_bytes + CO * 4, "f32", TWO_GPUS.device)
    assert nodes["fc"].backward_s == pytest.approx(2 * nodes["fc"].forward_s + bias_pass)
    assert cost.compute_s == pytest.approx(sum(n.forward_s + n.backward_s for n in nodes.values()))


def test_a_concats_backward_is_one_pass_in_all_not_one_per_input():
    # Each input's gradient is its slice of dY: together they read and write what the forward
    # did, however many inputs there are (not the whole concatenation once per input).
    b = PCGBuilder()
    rows, cols = 4096, 1024
    parts = [b.weight((rows, cols), name=f"w{k}") for k in range(5)]
    cost = iteration_cost(b.build(b.concat(*parts, axis=1, name="cat")), TWO_GPUS)
    cat = cost.per_node["cat"]
    part_bytes = rows * cols * 4
    assert cat.forward_s == roofline_s(0, 2 * 5 * part_bytes, "f32", TWO_GPUS.device)
    slice_pass = roofline_s(0, 2 * part_bytes, "f32", TWO_GPUS.device)
    assert cat.backward_s == pytest.approx(5 * slice_pass)
    # One kernel launch per input apart, that is the forward's time, not 5 times it.
    assert cat.backward_s < 1.2 * cat.forward_s


def test_nothing_trainable_no_backward():
    b = PCGBuilder()
    y = b.matmul(b.input((4, 8), name="x"), b.weight((8, 2), name="w", trainable=False), name="mm")
    cost = iteration_cost(b.build(y), TWO_GPUS)
    assert cost.backward_s == 0 and cost.update_s == 0
    assert cost.memory.gradients == cost.memory.optimizer_state == cost.memory.activations == 0
    assert cost.memory.weights == 8 * 2 * 4


@given(
    st.sampled_from(["data", "model", "reduction"]),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from([(64, 784, 512), (16, 64, 64), (2048, 2048, 2048), (32, 16, 4096)]),
)
def test_more_devices_on_a_partitionable_matmul_never_increase_its_compute_time(
    parallelism, d1, d2, mkn
):
    """x [m, k] @ w [k, n] split by rows of x (data), columns of w (model) or k (reduction), on
    d1 devices and on d1 * d2."""
    m, k, n = mkn
    split = {"data": m, "model": n, "reduction": k}[parallelism]
    assume(split % (d1 * d2) == 0)
    machine = Machine.preset("dgx-a100", nodes=16)  # 256 devices

    def matmul_time(degree):
        b = PCGBuilder()
        x, w = b.input((m, k), name="x"), b.weight((k, n), name="w")
        if parallelism == "data":
            x, w = b.partition(x, dim=0, degree=degree), b.replicate(w, degree=degree)
        elif parallelism == "model":
            x, w = b.replicate(x, degree=degree), b.partition(w, dim=1, degree=degree)
        else:
            x, w = b.partition(x, dim=1, degree=degree), b.partition(w, dim=0, degree=degree)
        c = iteration_cost(b.build(b.matmul(x, w, name="mm")), machine).per_node["mm"]
        return c.forward_s + c.backward_s

    assert matmul_time(d1 * d2) <= matmul_time(d1)


# --- Memory -------------------------------------------------------------------------------------


def small_mlp(batch_degree=1):
    b = PCGBuilder()
    x = b.input((8, 16), name="x")
    w1, w2 = b.weight((16, 32), name="w1"), b.weight((32, 4), name="w2")
    if batch_degree > 1:
        x = b.partition(x, dim=0, degree=batch_degree, name="split_x")
        w1 = b.replicate(w1, degree=batch_degree, name="copy_w1")
        w2 = b.replicate(w2, degree=batch_degree, name="copy_w2")
    h = b.relu(b.matmul(x, w1, name="mm1"), name="relu")
    return b.build(b.matmul(h, w2, name="mm2"))


@pytest.mark.parametrize(("optimizer", "states"), [("adam", 2), ("momentum", 1), ("sgd", 0)])
def test_memory_of_a_small_mlp_by_hand(optimizer, states):
    cost = iteration_cost(small_mlp(), TWO_GPUS, optimizer=optimizer)
    weights = (16 * 32 + 32 * 4) * 4  # 2,560 bytes
    # Kept for the backward: x (for dW1), the MatMul's output (ReLU's input) and ReLU's output
    # (for dW2); weights are counted once, as weights.
    activations = (8 * 16 + 8 * 32 + 8 * 32) * 4  # 2,560 bytes
    m = cost.memory
    assert (m.weights, m.gradients, m.optimizer_state, m.activations) == (
        weights,
        weights,
        states * weights,
        activations,
    )
    assert cost.memory_per_device == (2 + states) * weights + activations  # 12,800 with Adam
    assert cost.per_node["w1"].memory_bytes == (2 + states) * 16 * 32 * 4
    assert cost.per_node["relu"].memory_bytes == 8 * 32 * 4


def test_data_parallelism_splits_activations_not_weights():
    one, two = iteration_cost(small_mlp(), TWO_GPUS), iteration_cost(small_mlp(2), TWO_GPUS)
    assert two.memory.weights == one.memory.weights
    assert two.memory.optimizer_state == one.memory.optimizer_state
    assert two.memory.activations == one.memory.activations // 2


def test_a_plan_over_the_device_memory_is_infeasible():
    def machine(memory):
        device = DeviceSpec("tiny", {"f32": 1e12}, memory_bandwidth_Bps=1e11, memory_bytes=memory)
        return Machine((Level("gpu", 2, Link(1e10, 1e-6)),), device)

    assert iteration_cost(small_mlp(), machine(12_800)).feasible
    tight = iteration_cost(small_mlp(), machine(12_799))
    assert not tight.feasible
    assert "DOES NOT FIT" in str(tight) and "INFEASIBLE" in repr(tight)


def test_the_optimizer_update_reads_and_writes_weights_gradients_and_state():
    v100 = TWO_GPUS.device
    cost = iteration_cost(small_mlp(), TWO_GPUS, optimizer="adam")
    update = [
        7 * n * 4 / v100.memory_bandwidth_Bps + v100.launch_overhead_s for n in (16 * 32, 32 * 4)
    ]
    assert cost.update_s == pytest.approx(sum(update))
    assert cost.per_node["w1"].update_s == pytest.approx(update[0])


def test_sharded_weights_gathered_each_iteration_fsdp():
    """A weight stored split and all-gathered before use: forward AllGather, backward
    ReduceScatter of its gradient, memory of one shard."""
    b = PCGBuilder()
    x = b.partition(b.input((8, 16), name="x"), dim=0, degree=2)
    w = b.all_gather(
        b.partition(b.weight((16, 32), name="w"), dim=0, degree=2), dim=0, degree=2, name="gather_w"
    )
    cost = iteration_cost(b.build(b.matmul(x, w)), TWO_GPUS)
    full = 16 * 32 * 4
    assert collectives(cost) == [
        ("gather_w", "forward", "all_gather", full),
        ("gather_w", "backward", "reduce_scatter", full),
    ]
    assert cost.comm_bytes == 2 * full  # (p-1) n each way
    assert cost.memory.weights == full // 2


def _lookup_model(rows: int, *, dense_reader: bool = False):
    """Data parallel over two GPUs: 8 rows of 4 indices each looked up in a [rows, 16] table
    (and, optionally, the table also multiplied densely)."""
    b = PCGBuilder()
    idx = b.partition(b.input((8, 4), dtype="i64", max_value=rows, name="idx"), dim=0, degree=2)
    table = b.replicate(b.weight((rows, 16), name="table"), degree=2, name="table.r2")
    y = b.embedding_bag(idx, table, name="bag")
    if dense_reader:
        x = b.partition(b.input((8, rows), name="x"), dim=0, degree=2)
        y = b.add(y, b.matmul(x, table), name="both")
    return b.build(b.reduce_sum(y, axes=(0, 1)))


def test_an_embedding_table_syncs_and_updates_only_the_rows_looked_up():
    # 32 indices in all: at most 32 rows of the table's gradient are non-zero.
    cost = iteration_cost(_lookup_model(1000), TWO_GPUS)
    touched = 32 * 16 * 4
    assert collectives(cost) == [("table.r2", "weight sync", "all_reduce", touched)]
    node = cost.per_node["table"]
    assert node.update_s == pytest.approx(update_s(touched, OPTIMIZERS["adam"], TWO_GPUS.device))
    assert cost.memory.weights == 1000 * 16 * 4  # the table is still held whole ...
    assert cost.memory.optimizer_state == 2 * 1000 * 16 * 4  # ... with its state


def test_a_table_smaller_than_its_lookups_or_also_read_densely_syncs_whole():
    small = iteration_cost(_lookup_model(20), TWO_GPUS)  # 20 rows < 32 indices
    assert collectives(small) == [("table.r2", "weight sync", "all_reduce", 20 * 16 * 4)]
    dense = iteration_cost(_lookup_model(1000, dense_reader=True), TWO_GPUS)
    syncs = [c for c in collectives(dense) if c[1] == "weight sync"]
    assert syncs == [("table.r2", "weight sync", "all_reduce", 1000 * 16 * 4)]


def test_the_additive_total_is_the_sum_of_its_parts():
    cost = iteration_cost(fig2b(), TWO_GPUS)
    nodes = cost.per_node.values()
    assert cost.additive_s == pytest.approx(cost.compute_s + cost.comm_s + cost.update_s)
    assert cost.additive_s == pytest.approx(sum(n.total_s for n in nodes))
    assert cost.comm_bytes == sum(n.comm_bytes for n in nodes)
    assert sum(cost.comm_bytes_per_level.values()) == cost.comm_bytes
    assert sum(cost.comm_s_per_level.values()) == pytest.approx(cost.comm_s)


# --- The zoo and random PCGs --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_every_zoo_model_is_costed(name):
    pcg = models.build(name, small=True)
    cost = iteration_cost(pcg, Machine.preset("summit"))
    assert list(cost.per_node) == [n.name for n in pcg.nodes]
    assert cost.forward_s > 0 and cost.backward_s > 0 and cost.update_s > 0
    assert cost.comm_bytes == 0 and cost.devices_used == 1 and cost.feasible


@given(small_pcgs(max_ops=6, degrees=(2, 4)))
def test_any_valid_pcg_is_costed_consistently(pcg):
    machine = Machine.preset("dgx-a100", nodes=4)  # 64 devices
    try:
        cost = iteration_cost(pcg, machine)
    except CostError as e:
        assert "devices" in str(e) and e.node in pcg
        return
    assert cost.additive_s == pytest.approx(cost.compute_s + cost.comm_s + cost.update_s)
    # The simulated iteration lies between the compute stream's work and the additive sum.
    busy = cost.compute_s + cost.update_s
    assert busy * (1 - 1e-9) <= cost.total_s <= cost.additive_s * (1 + 1e-9)
    assert cost.exposed_comm_s == pytest.approx(cost.total_s - busy, abs=1e-15)
    assert all(
        v >= 0 for v in (cost.compute_s, cost.comm_s, cost.comm_bytes, cost.memory_per_device)
    )
    assert sum(cost.comm_bytes_per_level.values()) == pytest.approx(cost.comm_bytes)
    assert cost.devices_used <= machine.num_devices


# --- What users see -----------------------------------------------------------------------------


def test_summary_shows_where_the_time_goes():
    cost = iteration_cost(fig2a(), TWO_GPUS)
    text = cost.summary()
    assert str(cost) == text
    lines = text.splitlines()
    assert lines[0].startswith("training iteration on summit (2 x V100-SXM2-16GB)")
    assert any(line.split()[:2] == ["over", "gpu"] for line in lines)
    table = lines[
        lines.index(next(line for line in lines if line.split()[:2] == ["node", "op"])) + 1 :
    ]
    assert table[0].split()[0] == "copy_w1"  # the costliest node first
    assert "3.062 MiB" in table[0]
    assert repr(cost).startswith("CostBreakdown(") and "\n" not in repr(cost)
    assert "all_reduce" in repr(cost.per_node["copy_w1"].collectives[0])


def test_errors_name_the_node_and_what_is_valid():
    four = PCGBuilder()
    y = four.relu(four.replicate(four.input((4, 4), name="x"), degree=4, name="copies"), name="r")
    with pytest.raises(
        CostError, match=r"node 'copies' \(replicate\) spans 4 devices, but machine 'summit' has 2"
    ):
        iteration_cost(four.build(y), TWO_GPUS)
    # Also a parallel node that moves no data: stacking partial sums twice spans 4 devices.
    partial = PCGBuilder()
    x = partial.input((4, 4), name="x")
    two = partial.stack_partial(x, x, name="two")
    z = partial.stack_partial(two, two, name="sums")
    with pytest.raises(
        CostError,
        match=r"node 'sums' \(stack_partial\) spans 4 devices, but machine 'summit' has 2",
    ):
        iteration_cost(partial.build(z), TWO_GPUS)

    plan = fig2a()
    with pytest.raises(
        CostError, match=r"node 'linear1' .*compute nodes run where their inputs are"
    ):
        iteration_cost(plan, TWO_GPUS, devices={"linear1": (0, 1)})
    with pytest.raises(CostError, match="'nope', which is not in the PCG"):
        iteration_cost(plan, TWO_GPUS, devices={"nope": (0, 1)})
    with pytest.raises(
        CostError, match=r"devices\['copy_w1'\] lists 3 devices; .* needs 2: 1 group\(s\) of 2"
    ):
        iteration_cost(plan, Machine.preset("summit"), devices={"copy_w1": (0, 1, 2)})
    with pytest.raises(CostError, match="device 1 appears twice"):
        iteration_cost(plan, TWO_GPUS, devices={"copy_w1": [(1, 1)]})
    with pytest.raises(CostError, match="out of range"):
        iteration_cost(plan, TWO_GPUS, devices={"copy_w1": [(0, 7)]})
    # Group lists in any sequence form are read alike; bad ones are refused however often given.
    as_lists = iteration_cost(plan, TWO_GPUS, devices={"copy_w1": ([1, 0],)})
    assert (
        as_lists.total_s == iteration_cost(plan, TWO_GPUS, devices={"copy_w1": ((1, 0),)}).total_s
    )
    with pytest.raises(CostError, match="device 1 appears twice"):
        iteration_cost(plan, TWO_GPUS, devices={"copy_w1": ([1, 1],)})
    with pytest.raises(CostError, match="unknown optimizer 'adamw'; valid: sgd, momentum, adam"):
        iteration_cost(plan, TWO_GPUS, optimizer="adamw")
    with pytest.raises(CostError, match=r"node 'linear1' .*no peak FLOP/s for dtype 'bf16'"):
        iteration_cost(fig2a("bf16"), TWO_GPUS)
    with pytest.raises(CostError, match="unknown collective 'allreduce'"):
        collective_cost("allreduce", [(0, 1)], 1, TWO_GPUS)


def test_closed_forms_agree_with_the_machine_presets_links():
    # One Summit node: a ring on the 3 GPUs of a socket runs on NVLink, one across sockets is
    # limited by the X-Bus.
    m = Machine.preset("summit")
    socket, nvlink = m.levels[1].link, m.levels[2].link
    n = 6e6
    inside = collective_cost("all_gather", [(0, 1, 2)], n, m)
    assert inside.seconds == pytest.approx(2 * nvlink.latency_s + 2 / 3 * n / nvlink.bandwidth_Bps)
    across = collective_cost("all_gather", [(0, 3)], n, m)
    assert across.seconds == pytest.approx(socket.latency_s + n / 2 / socket.bandwidth_Bps)
    assert math.isclose(across.bytes_per_level["socket"], n)


def test_docstring_examples_run():
    """extract/ is not among pytest's doctest paths; its examples are checked here."""
    import doctest

    import pcgopt.extract.costmodel.calibrate
    import pcgopt.extract.costmodel.cost

    for module in (pcgopt.extract.costmodel.cost, pcgopt.extract.costmodel.calibrate):
        failed, tried = doctest.testmod(module)
        assert tried > 0 and failed == 0, module.__name__


def test_a_pcg_in_micro_batches_costs_what_gradient_accumulation_does():
    """Unity's Pipeline and Batch in the PCG say which nodes run once per micro-batch; cut
    where gradient accumulation cuts, the cost is the same."""
    from pcgopt import with_micro_batches
    from pcgopt.extract.strategies.baselines import data_parallel, megatron

    machine = Machine.preset("dgx-a100")
    model = models.build("mnist_mlp")
    b = PCGBuilder()  # a loss: its mean over the batch takes the micro-batches gathered
    x = b.partition(b.input((64, 32), name="x"), dim=0, degree=8)
    logits = b.matmul(x, b.replicate(b.weight((32, 1024), name="w"), degree=8))
    with_loss = b.build(b.reduce_mean(b.combine(logits, dim=0, degree=8), axes=(0, 1)))
    for plan in (model, data_parallel(model, machine), megatron(model, machine), with_loss):
        cut = iteration_cost(with_micro_batches(plan, 4), machine)
        accumulated = iteration_cost(plan, machine, micro_batches=4)
        assert cut.micro_batches == 4
        assert cut.total_s == pytest.approx(accumulated.total_s, rel=1e-9)
        assert cut.memory == accumulated.memory
        assert cut.memory.activations < iteration_cost(plan, machine).memory.activations


def test_micro_batches_are_one_count_per_pcg():
    from pcgopt import with_micro_batches

    machine = Machine.preset("dgx-a100")
    cut = with_micro_batches(models.build("mnist_mlp"), 2)
    with pytest.raises(CostError, match=r"cuts 2 micro-batches itself .* leave micro_batches at 1"):
        iteration_cost(cut, machine, micro_batches=2)
    b = PCGBuilder()
    x = b.pipeline(b.input((8, 4), name="x"), dim=0, micro_batches=2)
    y = b.pipeline(b.input((8, 4), name="y"), dim=0, micro_batches=4)
    z = b.add(
        b.batch(b.relu(x), dim=0, micro_batches=2), b.batch(b.relu(y), dim=0, micro_batches=4)
    )
    with pytest.raises(CostError, match="different counts"):
        iteration_cost(b.build(z), machine)
