"""The machine-mapping DP (Unity section 5.2): independent branches run at once on disjoint
devices when that is faster; the schedule it returns is a valid one (no device runs two things
at once, every unit starts after its producers, the makespan is the time it claims); costs do
not change when a unit moves to other devices of the same shape; the memo table is shared
across candidates."""

import itertools
import math
from dataclasses import replace
from unittest.mock import patch

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pcgopt import Machine, PCGBuilder, equivalent
from pcgopt.extract import (
    DDP,
    CostError,
    MappingCache,
    MappingError,
    Runtime,
    data_parallel,
    iteration_cost,
    map_machine,
    megatron,
    saturate_and_extract,
)
from pcgopt.extract.costmodel.cost import _moved_s
from pcgopt.extract.search import mapping as mapping_module
from pcgopt.extract.search.mapping import MachineMapping, _units
from pcgopt.extract.search.plan import mapped_cost
from pcgopt.extract.strategies.placement import default_placement
from pcgopt.models import build
from pcgopt.testing.strategies import flat_machine, small_pcgs, towers


def flat(p: int, bandwidth: float = 10e9, latency: float = 5e-6) -> Machine:
    return flat_machine(p, bandwidth=bandwidth, latency=latency)


MACHINES = [
    flat(2),
    flat(4, bandwidth=1e15, latency=0.0),
    Machine.preset("dgx-a100", devices_per_node=4),
    Machine.preset("summit", nodes=2),
]


def fork(k: int, *, rows: int = 64, width: int = 512, depth: int = 1):
    """``k`` identical one-device towers over one input, joined by one concatenation."""
    b = PCGBuilder()
    x = b.input((rows, width), name="x")
    outs = []
    for i in range(k):
        t = x
        for j in range(depth):
            w = b.weight((width, width), name=f"w{i}_{j}")
            t = b.relu(b.matmul(t, w, name=f"m{i}_{j}"), name=f"t{i}_{j}")
        outs.append(t)
    y = b.concat(*outs, axis=1, name="join") if k > 1 else outs[0]
    return b.build(b.reduce_sum(y, axes=(0, 1), name="loss"))


def tower_s(cost, i: int) -> float:
    """Sequential seconds of tower ``i`` of :func:`fork`."""
    return sum(
        c.total_s
        for name, c in cost.per_node.items()
        if name.split("_")[0] in {f"{k}{i}" for k in "wmt"}
    )


def check_schedule(pcg, machine, mapping, cost):
    """The schedule is one a machine can run, and its makespan is the time claimed."""
    units, _ = _units(pcg, cost, {})
    mapped = mapping.units
    assert len(mapped) == len(units)
    by_node = {n: u for u in mapped for n in u.nodes}
    assert set(by_node) == {n.name for n in pcg.nodes}
    for u in mapped:
        assert u.block.start >= 0 and u.block.stop <= machine.num_devices
        assert u.end_s >= u.start_s >= 0
        for n in u.nodes:
            assert mapping.offsets[n] == u.block.start
    # Units that overlap in time use disjoint devices.
    for i, a in enumerate(mapped):
        for b in mapped[i + 1 :]:
            if a.start_s < b.end_s - 1e-15 and b.start_s < a.end_s - 1e-15:
                assert a.block.stop <= b.block.start or b.block.stop <= a.block.start, (a, b)
    # Every unit starts after the units it reads from end.
    for n in pcg.nodes:
        for r in n.inputs:
            producer, consumer = by_node[r.node], by_node[n.name]
            if producer is not consumer:
                assert producer.end_s <= consumer.start_s + 1e-12, (producer, consumer)
    makespan = max(u.end_s for u in mapped)
    assert makespan == pytest.approx(mapping.time_s, rel=1e-9, abs=1e-15)
    # Bounds: no worse than in sequence, no better than the longest unit or the work spread
    # evenly over the machine.
    assert mapping.sequential_s == pytest.approx(cost.additive_s, rel=1e-9)
    assert mapping.time_s <= mapping.sequential_s * (1 + 1e-12)
    longest = max(u.end_s - u.start_s for u in mapped)
    work = sum((u.end_s - u.start_s) * u.block.size for u in mapped)
    assert mapping.time_s >= longest - 1e-15
    assert mapping.time_s >= work / machine.num_devices * (1 - 1e-9)


def test_a_chain_runs_in_sequence_on_the_first_devices():
    pcg = data_parallel(build("mnist_mlp", small=True), MACHINES[2])
    cost = iteration_cost(pcg, MACHINES[2])
    mapping = map_machine(pcg, MACHINES[2], cost=cost)
    assert mapping.time_s == pytest.approx(cost.additive_s)
    assert mapping.divided_splits == 0
    assert set(mapping.offsets.values()) == {0}
    assert mapping.cost(cost).overlap_s == pytest.approx(0, abs=1e-15)
    assert mapping.memory == cost.memory  # every unit on device 0: the cost model's memory
    check_schedule(pcg, MACHINES[2], mapping, cost)
    # Nothing runs at once: the simulated iteration (which overlaps communication) stands.
    assert mapping.cost(cost).total_s == cost.total_s < cost.additive_s


def test_two_towers_run_at_once_and_pay_for_the_transfers():
    machine = flat(2)
    pcg = fork(2, rows=16, width=4096)  # the weight's update alone outweighs the transfers
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    offsets = {mapping.offsets["t0_0"], mapping.offsets["t1_0"]}
    assert offsets == {0, 1}
    # The tower moved off device 0 reads x (no gradient: one message) and sends its ReLU
    # output to the concatenation (it needs a gradient: a message each way), 16 x 4096 float32 each.
    one = 5e-6 + 16 * 4096 * 4 / 10e9
    assert mapping.transfer_s == pytest.approx(3 * one)
    moved = {n for u in mapping.units if u.block.start == 1 for n in u.nodes}
    assert moved in ({"w1_0", "m1_0", "t1_0"}, {"w0_0", "m0_0", "t0_0"})
    assert mapping.time_s == pytest.approx(cost.additive_s - tower_s(cost, 1) + 3 * one)
    check_schedule(pcg, machine, mapping, cost)
    mapped = mapping.cost(cost)
    assert mapped.total_s == mapping.time_s
    # The saving is over the simulated in-sequence iteration (which overlaps communication).
    assert mapped.overlap_s == pytest.approx(cost.total_s - mapping.time_s)
    # Simulated on the mapping's devices, device 0 waits for the three transfers: the moved
    # tower starts once x arrives and its output comes back, then its gradient goes out.
    assert mapped.exposed_comm_s == pytest.approx(3 * one)
    timeline = mapped.timeline()
    assert {t.first_device for t in timeline.tasks} == {0, 1}
    # Each device's tasks are the units on its block: the two towers on one device each.
    on_0, on_1 = timeline.on_device(0), timeline.on_device(1)
    assert on_1 and {t.name for t in on_1 if t.of_node} <= moved
    alone_on = [{t.name for t in tasks if t.devices == 1 and t.of_node} for tasks in (on_0, on_1)]
    assert not alone_on[0] & alone_on[1]
    # Each device updates its own tower's weight, at once.
    updates = [t for t in timeline.tasks if t.phase == "update"]
    assert sorted(t.first_device for t in updates) == [0, 1]
    assert updates[0].start_s == updates[1].start_s
    assert "branches at once" in repr(mapped) and "branches at once" in mapped.summary()


def data_parallel_towers():
    """Two towers, each data parallel on two devices, with large weights."""
    b = PCGBuilder()
    x = b.input((64, 2048), name="x")
    outs = []
    for i in range(2):
        w = b.replicate(b.weight((2048, 2048), name=f"w{i}"), degree=2, name=f"w{i}.copies")
        h = b.matmul(b.partition(x, dim=0, degree=2, name=f"x{i}"), w, name=f"m{i}")
        outs.append(b.combine(b.relu(h, name=f"t{i}"), dim=0, degree=2, name=f"y{i}"))
    return b.build(b.reduce_sum(b.add(*outs, name="join"), axes=(0, 1), name="loss"))


def test_weights_of_branches_on_different_devices_synchronize_at_once():
    # Mapped side by side, each tower's gradient AllReduce runs in its own group, beside the
    # other's.
    pcg, machine = data_parallel_towers(), flat(4)
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    assert {mapping.offsets["w0.copies"], mapping.offsets["w1.copies"]} == {0, 2}
    syncs = [t for t in mapping.cost(cost).timeline().tasks if t.phase == "sync"]
    assert sorted((t.name, t.first_device, t.devices) for t in syncs) in (
        [("w0.copies", 0, 2), ("w1.copies", 2, 2)],
        [("w0.copies", 2, 2), ("w1.copies", 0, 2)],
    )
    first, second = sorted(syncs, key=lambda t: t.start_s)
    assert second.start_s < first.end_s  # they overlap in time
    # In sequence on the first devices they share one bucket (one process group).
    assert [t.name for t in cost.timeline().tasks if t.phase == "sync"] == [
        "bucket 1 (2 gradients)"
    ]


def test_memory_under_the_mapping_keeps_zero_s_sharded_gradients_apart():
    pcg, machine = data_parallel_towers(), flat(4)
    cost = iteration_cost(pcg, machine, runtime=Runtime(zero_stage=2))
    mapping = map_machine(pcg, machine, cost=cost)
    assert mapping.divided_splits
    # Each device holds one tower's weight whole, half its gradient and half its Adam state.
    w = 2048 * 2048 * 4
    assert mapping.memory.weights == w
    assert mapping.memory.gradients == w // 2
    assert mapping.memory.optimizer_state == 2 * w // 2


def test_more_nodes_never_map_slower_than_one_node_of_them():
    # Two towers run at once within one node; with a second node beside it, the mapping keeps
    # them on the first node's fast links rather than splitting them across the slow one.
    pcg = fork(2, rows=16, width=4096)
    one = Machine.preset("dgx-a100", nodes=1, devices_per_node=2)
    two = Machine.preset("dgx-a100", nodes=2, devices_per_node=2)
    within = map_machine(pcg, one, cost=iteration_cost(pcg, one))
    cost = iteration_cost(pcg, two)
    mapping = map_machine(pcg, two, cost=cost)
    assert within.time_s < within.sequential_s  # the towers do run at once on one node
    assert mapping.time_s == pytest.approx(within.time_s)
    assert {mapping.offsets["t0_0"], mapping.offsets["t1_0"]} == {0, 1}
    check_schedule(pcg, two, mapping, cost)


@pytest.mark.parametrize("k, devices, rounds", [(4, 4, 1), (4, 2, 2), (3, 2, 2), (2, 4, 1)])
def test_identical_towers_spread_evenly_when_moving_is_free(k, devices, rounds):
    machine = flat(devices, bandwidth=1e18, latency=0.0)
    pcg = fork(k, depth=2)
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    # k towers in `rounds` rounds on `devices` devices: k - rounds towers' time is saved.
    saved = (k - rounds) * tower_s(cost, 0)
    assert mapping.time_s == pytest.approx(cost.additive_s - saved, rel=1e-6)
    check_schedule(pcg, machine, mapping, cost)


def _fitting_towers(machine: Machine):
    return towers(degrees=tuple(d for d in (1, 2, 4) if d <= machine.num_devices))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(MACHINES).flatmap(lambda m: st.tuples(_fitting_towers(m), st.just(m))))
def test_the_schedule_of_branchy_graphs_is_valid(case):
    pcg, machine = case
    cost = iteration_cost(pcg, machine)
    check_schedule(pcg, machine, map_machine(pcg, machine, cost=cost), cost)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(MACHINES).flatmap(lambda m: st.tuples(_fitting_towers(m), st.just(m))))
def test_grouping_parts_every_way_is_never_worse_than_one_balanced_tree(case):
    """A parallel split of up to six parts tries every grouping of them into two sides; the
    balanced binary tree it used to take (still taken beyond six) is one of those groupings."""
    pcg, machine = case
    cost = iteration_cost(pcg, machine)
    every_way = map_machine(pcg, machine, cost=cost)
    with patch.object(mapping_module, "_MAX_PARTS", 1):
        one_tree = map_machine(pcg, machine, cost=cost)
        check_schedule(pcg, machine, one_tree, cost)
    assert every_way.time_s <= one_tree.time_s * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(small_pcgs(max_ops=10, degrees=(2, 4)), st.sampled_from(MACHINES[1:]))
def test_the_schedule_of_random_pcgs_is_valid(pcg, machine):
    try:
        cost = iteration_cost(pcg, machine)
    except CostError:  # more devices than the machine has (checked in test_cost)
        assume(False)
    check_schedule(pcg, machine, map_machine(pcg, machine, cost=cost), cost)


@settings(max_examples=25, deadline=None)
@given(towers(), st.sampled_from(MACHINES[2:]))
def test_moved_units_cost_what_they_cost_on_the_first_devices(pcg, machine):
    """The DP's premise: a unit on another block of the same shape costs the same. The cost
    model, given the shifted device groups, charges every node exactly as before."""
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    moved = iteration_cost(pcg, machine, devices=mapping.device_groups(default_placement(pcg)))
    for name, node_cost in cost.per_node.items():
        assert moved.per_node[name].total_s == pytest.approx(node_cost.total_s, rel=1e-12)
    for name, groups in mapping.device_groups(default_placement(pcg)).items():
        start = mapping.offsets[name]
        assert min(d for g in groups for d in g) >= start


@settings(max_examples=25, deadline=None)
@given(
    towers(),
    st.sampled_from(MACHINES[2:]),
    st.sampled_from((DDP, Runtime(zero_stage=2), Runtime(overlap=False))),
    st.sampled_from((1, 2)),
)
def test_the_mapped_simulation_keeps_every_devices_streams_in_order(
    pcg, machine, runtime, micro_batches
):
    try:
        cost = iteration_cost(pcg, machine, runtime=runtime, micro_batches=micro_batches)
    except CostError as e:
        assert "micro-batches must divide" in str(e)
        return
    # Every node on the first devices, but each device's streams tracked apart: the same time.
    assert cost.mapped_timeline({}, machine, {}).time_s == pytest.approx(cost.total_s, rel=1e-12)
    mapping = map_machine(pcg, machine, cost=cost)
    timeline = cost.mapped_timeline(mapping.offsets, machine, mapping.moves)
    for device in range(machine.num_devices):
        for stream in ("compute", "comm"):
            tasks = [t for t in timeline.on_device(device) if t.stream == stream]
            for a, b in itertools.pairwise(tasks):
                assert a.end_s <= b.start_s + 1e-15, (a, b)
    # No task waits longer than every task before it and every transfer (both ways) take.
    moved = sum(
        _moved_s(machine, mapping.offsets[node], mapping.offsets[reader], nbytes)
        for (reader, node), nbytes in mapping.moves.items()
        if mapping.offsets[node] != mapping.offsets[reader]
    )
    assert timeline.time_s <= (cost.additive_s + 2 * moved * micro_batches) * (1 + 1e-9)

    # No node's task is lost (buckets may regroup: weights on different blocks synchronize in
    # groups of their own).
    def kernels(t):
        return sorted(
            (x.name, x.phase, x.micro_batch)
            for x in t.tasks
            if x.stream == "compute" and x.phase in ("forward", "backward")
        )

    assert kernels(timeline) == kernels(cost.timeline())


def test_a_mapped_simulation_refuses_offsets_off_the_machine():
    machine = flat(2)
    cost = iteration_cost(fork(2), machine)
    with pytest.raises(CostError, match="offsets name node 'nosuch'"):
        cost.mapped_timeline({"nosuch": 0}, machine, {})
    with pytest.raises(CostError, match=r"node 'm1_0' spans 1 devices from 2; machine 'flat2'"):
        cost.mapped_timeline({"m1_0": 2}, machine, {})
    with pytest.raises(CostError, match="from -1"):
        cost.mapped_timeline({"m1_0": -1}, machine, {})


def test_memory_under_the_mapping_is_the_fullest_device():
    machine = Machine.preset("dgx-a100", devices_per_node=4)
    pcg = build("dlrm")
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    assert mapping.divided_splits > 0
    tables = [n for n in pcg.nodes if n.op == "weight" and n.name.startswith("table")]
    assert len({mapping.offsets[t.name] for t in tables}) > 1  # tables spread over devices
    largest = max(cost.per_node[t.name].memory_bytes for t in tables)
    assert largest <= mapping.memory_per_device < cost.memory_per_device
    assert mapping.memory.weights < cost.memory.weights
    assert mapping.cost(cost).memory == mapping.memory


def test_the_memo_table_is_shared_across_candidates():
    machine = Machine.preset("dgx-a100", devices_per_node=4)
    pcg = build("inception_v3", small=True)
    alone = map_machine(pcg, machine)
    cache = MappingCache(machine)
    first = map_machine(pcg, machine, cache=cache)
    again = map_machine(pcg, machine, cache=cache)
    assert first.time_s == alone.time_s == again.time_s
    assert again.subproblems == 0 and again.cache_hits > 0
    # A candidate sharing the towers (same nodes, same costs) reuses their solutions.
    cache = MappingCache(machine)
    map_machine(fork(2, depth=2), machine, cache=cache)
    three = map_machine(fork(3, depth=2), machine, cache=cache)
    fresh = map_machine(fork(3, depth=2), machine)
    assert three.time_s == fresh.time_s
    assert three.cache_hits > 0 and three.subproblems < fresh.subproblems


def test_bad_arguments_are_typed_errors():
    machine = MACHINES[0]
    pcg = fork(2)
    with pytest.raises(MappingError, match=r"pcgopt\.PCG"):
        map_machine("graph", machine)  # type: ignore[arg-type]
    with pytest.raises(MappingError, match=r"pcgopt\.Machine"):
        map_machine(pcg, "flat2")  # type: ignore[arg-type]
    with pytest.raises(MappingError, match="no entry for node"):
        map_machine(pcg, machine, cost=iteration_cost(fork(1), machine))
    with pytest.raises(MappingError, match="its own MappingCache"):
        map_machine(pcg, machine, cache=MappingCache(MACHINES[2]))
    # A cost from a larger machine: the node that does not fit is named.
    b = PCGBuilder()
    wide = b.build(b.relu(b.partition(b.input((8, 8), name="x"), dim=0, degree=4, name="split")))
    with pytest.raises(MappingError, match="node 'relu_1' spans 4 devices; machine 'flat2' has 2"):
        map_machine(wide, machine, cost=iteration_cost(wide, MACHINES[1]))


def test_branches_at_once_are_kept_when_their_simulation_beats_the_plan_in_sequence():
    # Megatron's DLRM on a Summit node: the DP runs the embedding tables beside the rest
    # (0.277 ms by its estimate, each unit's communication in sequence); the simulated iteration
    # in sequence, which hides communication behind computation, takes 0.235 ms; simulated on
    # the mapping's devices, which does both, 0.230 ms.
    machine = Machine.preset("summit")
    plan = megatron(build("dlrm", small=True), machine)
    placed, mapping, cost = mapped_cost(plan, machine)
    divided = map_machine(plan, machine, cost=placed.cost, devices=placed.devices)
    assert divided.divided_splits > 0 and divided.time_s > placed.cost.total_s
    assert mapping.divided_splits == divided.divided_splits
    assert cost.total_s == mapping.time_s < placed.cost.total_s
    assert mapping.estimate_s == divided.time_s
    assert cost.overlap_s == pytest.approx(placed.cost.total_s - cost.total_s)
    assert cost.timeline().time_s == cost.total_s


def test_a_plan_runs_in_sequence_when_that_beats_running_branches_at_once(monkeypatch):
    machine = Machine.preset("summit")
    plan = megatron(build("dlrm", small=True), machine)
    # Were the mapped simulation slower, the plan would run in sequence, at its simulated time.
    divided_cost = MachineMapping.cost

    def slower(self, cost):
        mapped = divided_cost(self, cost)
        return replace(mapped, total_s=2 * cost.total_s) if self.divided_splits else mapped

    monkeypatch.setattr(MachineMapping, "cost", slower)
    placed, mapping, cost = mapped_cost(plan, machine)
    assert mapping.divided_splits == 0 and set(mapping.offsets.values()) == {0}
    assert cost.total_s == placed.cost.total_s == mapping.time_s and cost.overlap_s == 0
    assert mapping.memory == placed.cost.memory and mapping.estimate_s is None
    starts = [u.start_s for u in mapping.units]
    assert starts == sorted(starts) and {u.block.start for u in mapping.units} == {0}
    # A plan that runs nothing at once keeps the simulated time too.
    chain = data_parallel(build("mnist_mlp", small=True), machine)
    _, in_sequence, chain_cost = mapped_cost(chain, machine)
    assert in_sequence.time_s == chain_cost.total_s < chain_cost.additive_s


def test_saturate_and_extract_runs_branches_at_once():
    machine = Machine.preset("dgx-a100", devices_per_node=4)
    pcg = build("inception_v3", small=True)
    plan = saturate_and_extract(pcg, machine, time_budget_s=4, check=False)
    m = plan.machine_mapping
    assert m is not None and m.divided_splits > 0
    assert plan.cost.total_s == pytest.approx(m.time_s)
    assert plan.cost.overlap_s > 0
    assert plan.cost.total_s < plan.placement.cost.total_s
    assert plan.stats.candidates[plan.stats.chosen] == plan.cost.total_s
    # The device groups in the plan are where the mapping runs each node.
    for name, groups in plan.mapping.items():
        assert min(d for g in groups for d in g) >= m.offsets[name]
    assert "machine mapping" in plan.explain() and "branches at once" in plan.explain()
    assert plan.to_dict()["machine_mapping"]["time_s"] == m.time_s
    assert equivalent(pcg, plan.pcg)
    placed, mapping, cost = mapped_cost(plan.pcg, machine)
    assert cost.total_s == pytest.approx(plan.cost.total_s) and mapping.time_s == cost.total_s
    assert placed.cost.total_s >= cost.total_s
    assert math.isfinite(cost.total_s)


def test_what_a_branch_reads_from_elsewhere_counts_on_its_devices():
    """A weight both branches read lives where each branch runs (with its gradient and state),
    and a tensor moved to a branch is held there."""
    machine = flat(2, bandwidth=1e15, latency=0.0)
    b = PCGBuilder()
    w = b.weight((4096, 4096), name="w")  # 64 MiB, 256 MiB with gradient and Adam state
    left = b.reduce_sum(b.matmul(b.input((4096, 4096), name="x1"), w, name="ml"), axes=(0, 1))
    y = b.matmul(b.input((16, 4096), name="x2"), w, name="mr")
    big = b.matmul(b.input((2**16, 16), name="xb"), y, name="mb")  # 1 GiB kept for backward
    pcg = b.build(b.add(left, b.reduce_sum(big, axes=(0, 1)), name="loss"))
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    assert mapping.divided_splits == 1
    elsewhere = [u for u in mapping.units if u.block.start != mapping.offsets["w"]]
    assert any("mr" in u.nodes for u in elsewhere)  # a reader of w runs on the other device
    held_there = sum(cost.per_node[n].memory_bytes for u in elsewhere for n in u.nodes)
    weight = cost.per_node["w"].memory_bytes
    assert mapping.memory_per_device >= held_there + weight


def test_the_memo_table_keeps_micro_batch_counts_apart():
    machine = flat(2, bandwidth=1e15, latency=3e-6)
    b = PCGBuilder()
    w1, w2 = b.weight((1024, 1024), name="w1"), b.weight((1024, 1024), name="w2")
    h = b.matmul(b.input((8, 1024), name="x"), b.add(w1, w2, name="s"), name="h")
    pcg = b.build(b.reduce_sum(b.matmul(b.matmul(h, w1), w2), axes=(0, 1)))
    cache = MappingCache(machine)
    for m in (1, 4):
        cost = iteration_cost(pcg, machine, micro_batches=m)
        fresh = map_machine(pcg, machine, cost=cost)
        assert map_machine(pcg, machine, cost=cost, cache=cache).time_s == fresh.time_s


def test_a_tensor_two_nodes_of_a_unit_read_moves_once():
    b = PCGBuilder()
    t = b.relu(b.input((64, 64), name="x"), name="t")
    both = b.add(b.replicate(t, degree=2, name="r1"), b.replicate(t, degree=2, name="r2"))
    pcg = b.build(b.discard_copies(both, degree=2, name="one"))
    units, unit_of = _units(pcg, iteration_cost(pcg, MACHINES[0]), {})
    assert unit_of["r1"] == unit_of["r2"] == unit_of["one"] != unit_of["t"]
    assert len(units[unit_of["r1"]].inputs) == 1  # t, read by both Replicates


def test_flat_device_lists_are_placements_too():
    b = PCGBuilder()
    copies = b.replicate(b.weight((64, 64), name="w"), degree=2, name="rep")
    pcg = b.build(b.matmul(b.replicate(b.input((8, 64), name="x"), degree=2), copies))
    machine = MACHINES[1]
    cost = iteration_cost(pcg, machine, devices={"rep": [2, 3]})
    mapping = map_machine(pcg, machine, cost=cost, devices={"rep": [2, 3]})
    assert mapping.device_groups({"rep": [2, 3]}) == {"rep": (2, 3)}
    assert max(u.block.stop for u in mapping.units) <= machine.num_devices


def test_a_narrowing_chain_runs_before_the_reader_that_needs_it():
    """Review regression: a tensor read by a later compute node and, through an AllGather and
    DiscardCopies, by an earlier one. The narrowing chain joins the tensor's unit, which must
    then be its own (not folded into the later reader's), or an edge would run backwards."""
    b = PCGBuilder()
    xs = b.partition(b.input((8, 4), name="x"), dim=1, degree=2, name="x.split")
    one = b.discard_copies(b.all_gather(xs, dim=1, degree=2, name="x.gather"), degree=2)
    m1 = b.matmul(one, b.weight((4, 4), name="w1"), name="m1")
    m3 = b.matmul(xs, b.partition(b.weight((4, 4), name="w3"), dim=0, degree=2), name="m3")
    pcg = b.build(b.reduce_sum(b.add(m1, b.reduce(m3, degree=2)), axes=(0, 1)))
    machine = MACHINES[1]
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    check_schedule(pcg, machine, mapping, cost)
    assert mapping.offsets["x.gather"] == mapping.offsets["x.split"]


def row_parallel_towers():
    """Two towers, each a column- then a row-parallel layer on two devices whose partial sums a
    ReduceScatter reduces, joined by an add of the scattered halves."""
    b = PCGBuilder()
    outs = []
    for i in range(2):
        x = b.replicate(b.input((64, 1024), name=f"x{i}"), degree=2, name=f"x{i}.copies")
        w0 = b.partition(b.weight((1024, 1024), name=f"w{i}_0"), dim=1, degree=2)
        w1 = b.partition(b.weight((1024, 1024), name=f"w{i}_1"), dim=0, degree=2)
        h = b.relu(b.matmul(x, w0, name=f"m{i}_0"), name=f"t{i}")
        partial = b.matmul(h, w1, name=f"m{i}_1")
        outs.append(b.reduce_scatter(partial, dim=0, degree=2, name=f"y{i}"))
    joined = b.combine(b.add(*outs, name="join"), dim=0, degree=2, name="joined")
    return b.build(b.reduce_sum(joined, axes=(0, 1), name="loss"))


def test_a_branch_reduces_its_own_partial_sums_on_its_own_devices():
    """Review regression (the e-graph's MLP plan on 6 GPUs, mapped at 304 ms against the DP's
    157 ms): a ReduceScatter at a branch's end ran with the join that reads it, on the other
    branch's devices, so the simulation made the branches' backward passes wait for each
    other. The devices that hold partial sums reduce them: the branch keeps its devices."""
    pcg = row_parallel_towers()
    machine = flat(4, bandwidth=1e12, latency=1e-6)
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    check_schedule(pcg, machine, mapping, cost)
    assert {mapping.offsets.get("m0_1", 0), mapping.offsets.get("m1_1", 0)} == {0, 2}
    for i in range(2):
        assert mapping.offsets.get(f"y{i}", 0) == mapping.offsets.get(f"m{i}_1", 0)
    # What the DP estimated is what the iteration simulated on its devices takes.
    simulated = mapping.cost(cost).total_s
    assert simulated == pytest.approx(mapping.time_s, rel=1e-6)
    assert simulated < 0.75 * cost.total_s


def test_a_level_of_many_units_is_divided_at_a_logarithmic_set_of_points():
    # Every division of up to 64 units; above, powers of two from either end and sixteenths.
    assert mapping_module.division_points(64) == list(range(1, 64))
    points = mapping_module.division_points(100_000)
    assert len(points) < 64 and points == sorted(set(points))
    assert {1, 2, 50_000, 99_999, 99_998} <= set(points)
    # On 100,000 nodes (where every division was a million sub-problems per view), two towers
    # still run at once, each on its own node, and the schedule is valid.
    machine = Machine.preset("summit", nodes=100_000, devices_per_node=1)
    pcg = fork(2, rows=16, width=4096)
    cost = iteration_cost(pcg, machine)
    mapping = map_machine(pcg, machine, cost=cost)
    assert {mapping.offsets["t0_0"], mapping.offsets["t1_0"]} == {0, 1}
    assert mapping.time_s < mapping.sequential_s
    check_schedule(pcg, machine, mapping, cost)
