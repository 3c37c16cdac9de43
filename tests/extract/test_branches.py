"""Branch-parallel plans: data parallelism with a batch degree per node, narrowed where the
machine-mapping DP runs branches at once. The plans compute what the input computes; each node
runs at the degree asked; the DP's estimate is what the exact cost model and mapping then find;
towers that data parallelism runs one after another on all devices run side by side."""

import inspect
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcgopt import Machine, PCGBuilder, equivalent
from pcgopt.egraph import saturate
from pcgopt.extract import (
    BaselineError,
    branch_parallel,
    data_parallel,
    iteration_cost,
    lower_degrees,
    map_machine,
    megatron,
    saturate_and_extract,
)
from pcgopt.extract.search.extraction import class_devices, concurrent_costs, enode_costs
from pcgopt.extract.search.plan import mapped_cost
from pcgopt.extract.strategies.layerwise import MatmulStrategy, dense_layers, strategies_for
from pcgopt.extract.strategies.placement import batch_split_only
from pcgopt.models import ZOO, build
from pcgopt.names import model_names
from pcgopt.ops import OpKind
from pcgopt.testing.strategies import flat_machine, towers

FOUR = flat_machine(4)


def weak_scaled(name: str, machine: Machine):
    """A zoo model with its default per-GPU batch on every device (as bench/run.py builds it)."""
    per_gpu = inspect.signature(ZOO[name].builder).parameters["batch"].default
    return build(name, batch=per_gpu * machine.num_devices)


def fork(k: int, *, rows: int = 64, width: int = 2048, depth: int = 2):
    """``k`` identical towers of dense layers over one input, joined by a concatenation."""
    b = PCGBuilder()
    x = b.input((rows, width), name="x")
    outs = []
    for i in range(k):
        t = x
        for j in range(depth):
            w = b.weight((width, width), name=f"w{i}_{j}")
            t = b.relu(b.matmul(t, w, name=f"m{i}_{j}"), name=f"t{i}_{j}")
        outs.append(t)
    return b.build(b.reduce_sum(b.concat(*outs, axis=1, name="join"), axes=(0, 1), name="loss"))


@settings(max_examples=25, deadline=None)
@given(pcg=towers(degrees=(1,)), data=st.data())
def test_every_node_runs_at_its_degree_and_the_plan_is_equivalent(pcg, data):
    compute = [n.name for n in pcg.nodes if n.spec.kind is OpKind.COMPUTE]
    degrees = {name: data.draw(st.sampled_from((1, 2, 4)), label=name) for name in compute}
    # Some dense layers run an SBP matmul strategy on their devices instead (the descent's).
    strategies = {}
    for name in dense_layers(pcg):
        options = strategies_for(pcg, name, FOUR, devices=degrees[name])
        if data.draw(st.booleans(), label=f"{name} strategy"):
            strategies[name] = data.draw(st.sampled_from(options), label=f"{name} option")
    plan = lower_degrees(pcg, FOUR, degrees, strategies)
    assert equivalent(pcg, plan)
    cost = iteration_cost(plan, FOUR)  # fits the machine: no tensor spans more than 4 devices
    assert map_machine(plan, FOUR, cost=cost).time_s <= cost.additive_s * (1 + 1e-12)
    for name, degree in degrees.items():
        if name in strategies:
            continue
        shape = plan.shape(name)
        if shape.rank == 2:  # the batch dimension; a scalar loss holds partial sums instead
            assert shape.degrees[0] == degree, name
            assert shape.num_shards == degree, name


def test_towers_run_side_by_side_at_narrower_degrees():
    pcg = fork(4)
    machine = Machine.preset("dgx-a100", devices_per_node=4)
    found = branch_parallel(pcg, machine)
    assert found is not None and found.narrowed > 0
    assert equivalent(pcg, found.pcg)
    _, dp_mapping, dp_cost = mapped_cost(data_parallel(pcg, machine), machine)
    _, mapping, cost = mapped_cost(found.pcg, machine)
    assert dp_mapping.divided_splits == 0  # every tower spans all devices: nothing fits beside
    assert mapping.divided_splits > 0
    assert cost.total_s < dp_cost.total_s
    # The towers' first layers run at once on disjoint blocks as wide as their degrees.
    first = [u for u in mapping.units if u.nodes[0] in {f"m{i}_0" for i in range(4)}]
    assert all(u.block.size == found.degrees[u.nodes[0]] for u in first)
    starts = {u.start_s for u in first}
    assert len(starts) < len(first)


def test_the_estimate_is_what_the_exact_cost_and_mapping_find():
    # CANDLE-Uno on one Summit node: five feature towers on six GPUs. The DP's estimate leaves
    # out the redistributions the plan adds; they are small here.
    machine = Machine.preset("summit")
    pcg = weak_scaled("candle_uno", machine)
    found = branch_parallel(pcg, machine)
    assert found is not None
    as_estimated = lower_degrees(pcg, machine, found.degrees)  # before the descent
    _, _, cost = mapped_cost(as_estimated, machine)
    assert cost.total_s == pytest.approx(found.estimate_s, rel=0.05)
    # The descent over the dense layers' strategies, ranked by the exact mapped time (tensor
    # parallel layers placed by P^2, as saturate_and_extract places them), never makes it worse.
    assert found.mapped_s <= cost.total_s * (1 + 1e-9)
    assert found.evaluations > 1
    _, _, final = mapped_cost(found.pcg, machine)
    assert final.total_s <= found.mapped_s * (1 + 1e-9)
    _, _, dp_cost = mapped_cost(data_parallel(pcg, machine), machine)
    # 118.6 ms against 227.6 ms (data parallelism hides much of its gradient AllReduce behind
    # the backward; without that overlap it was 278 ms).
    assert final.total_s < 0.6 * dp_cost.total_s
    assert final.feasible


def test_the_descent_keeps_the_plan_the_simulation_ranks_first_of_all_it_costed():
    # MLP on 8 Summit nodes: its branches run at once, data parallel inside each. Simulated,
    # with each branch's gradient AllReduce hidden behind its backward, splitting one layer of
    # a branch does not pay for its redistributions, but splitting them all does: the descent
    # steps by the DP's estimate, which leads there, and keeps the best simulated plan.
    machine = Machine.preset("summit", nodes=8)
    pcg = weak_scaled("mlp", machine)
    found = branch_parallel(pcg, machine, optimizer="sgd")
    assert found is not None
    split = [s for s in found.strategies.values() if s.columns > 1 or s.contraction > 1]
    assert len(split) > 1
    _, _, start = mapped_cost(lower_degrees(pcg, machine, found.degrees), machine, optimizer="sgd")
    _, _, final = mapped_cost(found.pcg, machine, optimizer="sgd")
    assert final.total_s == pytest.approx(found.mapped_s)
    assert final.total_s < 0.85 * start.total_s


def test_lookups_in_branches_that_run_at_once_split_their_tables_together():
    """XDL on 8 Summit nodes: four embedding tables, each bag of lookups on its own group of
    GPUs at once. The slowest group sets the time, so splitting one table's columns alone gains
    nothing; the descent moves the whole group of lookups, then each one."""
    machine = Machine.preset("summit", nodes=8)
    pcg = weak_scaled("xdl", machine)
    found = branch_parallel(pcg, machine)
    assert found is not None
    bags = [n.name for n in pcg.nodes if n.op == "embedding_bag"]
    assert all(found.strategies[b].columns > 1 for b in bags)
    replicated = {**found.strategies, **{b: MatmulStrategy(found.degrees[b]) for b in bags}}
    _, _, whole = mapped_cost(lower_degrees(pcg, machine, found.degrees, replicated), machine)
    _, _, split = mapped_cost(found.pcg, machine)
    assert split.total_s < 0.9 * whole.total_s
    assert split.total_s == pytest.approx(found.mapped_s)


def test_a_time_limit_costs_the_widest_degree_first_and_narrows_nothing_it_did_not_cost():
    # The towers narrow with time to cost the narrower degrees (above); with none, only the
    # widest is costed, and no view narrower than it is used.
    pcg = fork(4)
    machine = Machine.preset("dgx-a100", devices_per_node=4)
    assert branch_parallel(pcg, machine, time_limit_s=1e-9) is None


def test_nothing_to_narrow_in_a_chain():
    assert branch_parallel(build("mnist_mlp"), FOUR) is None


def test_bad_degrees_are_named():
    pcg = fork(2, rows=8, width=16)
    with pytest.raises(BaselineError, match="'x' is not a compute node"):
        lower_degrees(pcg, FOUR, {"x": 2})
    with pytest.raises(BaselineError, match=r"'m0_0'.*degree 3 must divide the batch"):
        lower_degrees(pcg, FOUR, {"m0_0": 3})
    with pytest.raises(BaselineError, match=r"'m0_0'.*at most the 4 devices"):
        lower_degrees(pcg, FOUR, {"m0_0": 8})
    with pytest.raises(BaselineError, match=r"'m0_0'.*positive integer"):
        lower_degrees(pcg, FOUR, {"m0_0": 0})
    with pytest.raises(BaselineError, match=r"already parallel|sequential"):
        branch_parallel(data_parallel(pcg, FOUR), FOUR)


def test_a_narrowed_tensor_moves_to_its_reader():
    # The AllGather and DiscardCopies that narrow a tensor for a narrow branch run with its
    # producer, so the branch's block is as narrow as the branch.
    pcg = fork(2, rows=8, width=16)
    plan = lower_degrees(pcg, FOUR, {"m0_0": 4, "t0_0": 4, "m0_1": 2, "t0_1": 2})
    mapping = map_machine(plan, FOUR, cost=iteration_cost(plan, FOUR))
    unit_of = {n: u for u in mapping.units for n in u.nodes}
    assert unit_of["m0_1"].block.size == 2
    narrowing = [n.name for n in plan.nodes if n.op in ("all_gather", "discard_copies")]
    assert {"t0_0.gather", "t0_0.one"} <= set(narrowing)  # t0_0 from 4 devices to 2
    for name in narrowing:  # each with what it narrows
        producer = plan.node(name).inputs[0].node
        assert unit_of[name] is unit_of[producer], name


def test_saturate_and_extract_proposes_the_branch_parallel_plan():
    pcg = fork(4, width=1024)  # small enough for the equivalence check
    machine = Machine.preset("dgx-a100", devices_per_node=4)
    plan = saturate_and_extract(pcg, machine, time_budget_s=8)
    times = plan.stats.candidates
    assert times["branch parallel"] is not None
    assert times["branch parallel"] < times["data parallel"]
    assert plan.cost.total_s <= times["branch parallel"]
    assert plan.check.startswith("equivalent")


def test_the_egraph_alone_runs_branches_at_once(two_iterations):
    """Extraction with branches priced by their share of the machine (the mapping DP's views)
    finds, in the e-graph alone (no baselines, no side generators), towers narrow enough to run
    side by side: faster than the extraction costed in sequence, the input and the
    branch-parallel generator's plan."""
    pcg = fork(4, width=1024)
    machine = Machine.preset("dgx-a100", devices_per_node=4)
    plan = saturate_and_extract(pcg, machine, baselines=False, deterministic=True)
    times = plan.stats.candidates
    assert plan.stats.chosen == "e-graph, branches at once"
    assert times["e-graph, branches at once"] < min(times["e-graph"], times["input as given"])
    assert plan.machine_mapping.divided_splits > 0
    assert plan.cost.total_s <= branch_parallel(pcg, machine).mapped_s
    assert plan.check.startswith("equivalent")


def test_each_class_gets_its_nodes_view_and_fitting_enodes_pay_their_share():
    model = fork(2, rows=8, width=16)
    narrow = {
        n.name: 2 for n in model.nodes if n.name[1:2] in "01" and n.spec.kind is OpKind.COMPUTE
    }
    views = {**{n.name: 4 for n in model.nodes if n.spec.kind is OpKind.COMPUTE}, **narrow}
    seed = lower_degrees(model, FOUR, {**narrow, "join": 4, "loss": 4})
    wide = data_parallel(model, FOUR)
    egraph = saturate(model, FOUR, rules=[], seeds=[seed, wide]).egraph
    costs = enode_costs(egraph, FOUR)
    devices = class_devices(egraph, model, views, FOUR.num_devices)
    names = model_names(model, seed)
    for node in seed.nodes:
        if node.spec.kind is OpKind.COMPUTE:
            assert devices[egraph.classes_of(seed)[node.output()]] == views[names[node.name]]
    at_once = concurrent_costs(costs, devices)
    halved = 0
    for i, n in enumerate(egraph.nodes):
        spans = max(egraph.shapes[c].num_shards for c in (n.eclass, *n.children))
        if devices[n.eclass] == 2 and spans <= 2 and costs.node_s[i] > 0:
            assert at_once.node_s[i] == pytest.approx(costs.node_s[i] / 2)
            halved += 1
        else:  # on the whole machine, or too wide to run beside the other tower
            assert at_once.node_s[i] == costs.node_s[i]
    assert halved >= len(narrow)
    # Where every node has the whole machine, nothing changes.
    whole = class_devices(egraph, model, dict.fromkeys(views, 4), 4)
    assert (concurrent_costs(costs, whole).node_s == costs.node_s).all()


def test_only_batch_split_plans_may_keep_the_packed_placement():
    # The default placement puts every collective's group on the closest devices; for a
    # tensor-parallel group inside a data-parallel one no machine can do both, so such plans
    # keep P^2's placement even where the default would cost less.
    machine = Machine.preset("summit")
    model = weak_scaled("mlp", machine)
    hybrid = megatron(model, machine)  # 3 x 2 on the node's 6 GPUs
    assert not batch_split_only(hybrid)
    placed, _, cost = mapped_cost(hybrid, machine)
    assert placed.matrix is not None
    assert cost.total_s > iteration_cost(hybrid, machine).total_s  # the default is optimistic
    assert batch_split_only(data_parallel(model, machine))
    assert batch_split_only(lower_degrees(fork(2, rows=8, width=16), FOUR, {"m0_0": 2}))


def test_splits_come_out_of_copies_so_the_plan_fits_the_machine():
    """Review regression: x, copied twice for a column-split layer, then split four ways for a
    data-parallel one, spanned 8 devices of a 4-device machine."""
    b = PCGBuilder()
    x = b.input((8, 4), name="x")
    m1 = b.matmul(x, b.weight((4, 4), name="w1"), name="m1")
    m3 = b.matmul(x, b.weight((4, 4), name="w3"), name="m3")
    pcg = b.build(b.reduce_sum(b.add(m1, m3, name="add"), axes=(0, 1), name="loss"))
    degrees = {"m1": 2, "m3": 4, "add": 4, "loss": 4}
    plan = lower_degrees(pcg, FOUR, degrees, {"m1": MatmulStrategy(1, 2, 1)})
    assert max(s.num_shards for n in plan.nodes for s in plan.output_shapes(n.name)) <= 4
    assert iteration_cost(plan, FOUR).devices_used == 4
    assert equivalent(pcg, plan)


def test_a_layout_change_for_the_join_pays_its_whole_time():
    """The machine mapping runs a layout change that widens a branch's output with its reader
    (the join, after the branches), so extraction must not price it as running beside the
    other branch: widened for a join on the whole machine, it pays its whole time, while the
    branches' own e-nodes pay their share."""
    model = fork(2, rows=8, width=16)
    compute = [n.name for n in model.nodes if n.spec.kind is OpKind.COMPUTE]
    towers = [name for name in compute if re.fullmatch(r"[mt][01]_\d+", name)]
    views = dict.fromkeys(compute, 4)
    views.update(dict.fromkeys(towers, 2))
    seed = lower_degrees(model, FOUR, {**dict.fromkeys(towers, 1), "join": 2, "loss": 2})
    egraph = saturate(model, FOUR, rules=[], seeds=[seed]).egraph
    costs = enode_costs(egraph, FOUR)
    devices = class_devices(egraph, model, views, FOUR.num_devices)
    at_once = concurrent_costs(costs, devices)
    shapes, readers = egraph.shapes, egraph.readers()
    widening = [
        i
        for i, n in enumerate(egraph.nodes)
        if n.op in ("partition", "replicate")
        and devices[n.eclass] == 2
        and shapes[n.eclass].num_shards > max(shapes[k].num_shards for k in n.children)
        and costs.node_s[i] > 0
    ]
    assert widening, "the seed widens the towers' outputs for the join"
    for i in widening:
        assert {devices[egraph.nodes[r].eclass] for r in readers[egraph.nodes[i].eclass]} == {4}
        assert at_once.node_s[i] == costs.node_s[i]
    towers_in_seed = [egraph.classes_of(seed)[seed.node(name).output()] for name in towers]
    for c in towers_in_seed:
        i = next(i for i, n in enumerate(egraph.nodes) if n.eclass == c and costs.node_s[i] > 0)
        assert at_once.node_s[i] == pytest.approx(costs.node_s[i] / 2)
