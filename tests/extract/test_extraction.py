"""Extraction: the cheapest PCG of an e-graph under the cost model. The extraction model agrees
with iteration_cost, the exact ILP checks the greedy extractor, an exhaustive enumeration checks
both, memory capacity is respected, and on Unity's MNIST example the chosen plan beats both
Figure 2 plans."""

import contextlib
import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings

from pcgopt import PCG, Machine, PCGBuilder, assert_equivalent
from pcgopt.egraph import Budget, ChoiceError, saturate
from pcgopt.extract import (
    ADDITIVE,
    DDP,
    CostError,
    ExtractionError,
    Runtime,
    dag_cost,
    enode_costs,
    extract_greedy,
    extract_ilp,
    iteration_cost,
)
from pcgopt.extract.search.extraction import repriced
from pcgopt.extract.strategies.baselines import data_parallel, megatron
from pcgopt.extract.strategies.placement import place_plan, placement_groups
from pcgopt.models import ZOO, mnist_mlp
from pcgopt.testing.strategies import small_pcgs

TWO_GPUS = Machine.preset("summit", nodes=1, devices_per_node=2)
# Unity section 1's MLP: b = 64, c_i = 784, h = 512, c_o = 10.
MNIST = mnist_mlp(batch=64, in_features=784, hidden=512, out_features=10)


@pytest.fixture(scope="module")
def mnist():
    sat = saturate(MNIST, TWO_GPUS, budget=Budget(iterations=3))
    return sat, enode_costs(sat.egraph, TWO_GPUS, runtime=ADDITIVE)


def figure_2a():
    """Data parallelism with MatMul+ReLU fused."""
    b = PCGBuilder()
    x, w1 = b.input((64, 784), name="x"), b.weight((784, 512), name="w1")
    w2 = b.weight((512, 10), name="w2")
    h = b.linear(b.partition(x, dim=0, degree=2), b.replicate(w1, degree=2), activation="relu")
    return b.build(b.combine(b.matmul(h, b.replicate(w2, degree=2)), dim=0, degree=2))


def figure_2b():
    """ReLU unfused, reduction parallelism for the first MatMul (4bh elements moved), the second
    split by columns (as in tests/extract/test_cost.py)."""
    b = PCGBuilder()
    x, w1 = b.input((64, 784), name="x"), b.weight((784, 512), name="w1")
    w2 = b.weight((512, 10), name="w2")
    x1 = b.partition(x, dim=1, degree=2)
    h = b.all_reduce(b.matmul(x1, b.partition(w1, dim=0, degree=2)), degree=2)
    return b.build(b.matmul(b.relu(h), b.partition(w2, dim=1, degree=2)))


def test_the_extraction_model_is_the_cost_model(mnist):
    sat, costs = mnist
    found = extract_greedy(costs)
    plan = sat.egraph.to_pcg(found.choice)
    exact = iteration_cost(plan, TWO_GPUS, runtime=ADDITIVE)
    assert found.cost.seconds == pytest.approx(exact.total_s, rel=1e-6)
    assert found.cost.memory_bytes == exact.memory_per_device


def test_mnist_plan_is_equivalent_and_beats_both_figure_2_plans(mnist):
    sat, costs = mnist
    plan = sat.egraph.to_pcg(extract_greedy(costs).choice)
    assert_equivalent(MNIST, plan)
    cost = iteration_cost(plan, TWO_GPUS, runtime=ADDITIVE).total_s
    assert cost < iteration_cost(MNIST, TWO_GPUS, runtime=ADDITIVE).total_s
    for figure in (figure_2a(), figure_2b()):
        assert cost <= iteration_cost(figure, TWO_GPUS, runtime=ADDITIVE).total_s
    # Not Figure 2a's sequential plan: no weight is copied for data parallelism, and the
    # second layer contracts a partitioned dimension (reduction parallelism, partial sums).
    assert not any(n.op == "replicate" and n.inputs[0].node in ("w1", "w2") for n in plan.nodes)
    assert any(plan.shape(n.name).sum_degree > 1 for n in plan.nodes if n.op == "matmul")
    assert iteration_cost(plan, TWO_GPUS).comm_bytes < 131_072 * 4


def test_figure_2a_is_in_the_egraph_and_costs_what_the_model_says(mnist):
    sat, costs = mnist
    choice = sat.egraph.choice_for(figure_2a())
    assert dag_cost(costs, choice).seconds == pytest.approx(
        iteration_cost(figure_2a(), TWO_GPUS, runtime=ADDITIVE).total_s, rel=1e-6
    )


def test_an_embedding_tables_sparse_gradient_costs_what_the_model_says():
    """A replicated table only looked up syncs and updates the rows it can touch, in the
    extraction model as in the cost model."""
    b = PCGBuilder()
    idx = b.partition(b.input((8, 4), dtype="i64", max_value=1000, name="idx"), dim=0, degree=2)
    table = b.replicate(b.weight((1000, 16), name="table"), degree=2, name="table.r2")
    plan = b.build(b.combine(b.embedding_bag(idx, table, name="bag"), dim=0, degree=2))
    sat = saturate(plan, TWO_GPUS, budget=Budget(iterations=1))
    costs = enode_costs(sat.egraph, TWO_GPUS, runtime=ADDITIVE)
    exact = iteration_cost(plan, TWO_GPUS, runtime=ADDITIVE)
    # The AllReduce of 32 rows looked up (not 1000): 2 (p - 1) n bytes on two devices.
    assert exact.per_node["table.r2"].comm_bytes == 2 * 32 * 16 * 4
    seconds = dag_cost(costs, sat.egraph.choice_for(plan)).seconds
    assert seconds == pytest.approx(exact.total_s, rel=1e-6)


def test_an_input_named_differentiable_pays_for_its_gradient():
    """A segment's entry under graph splitting: the layers before it need its gradient, so the
    MatMul reading it costs its input-gradient product too, and a Partition of it its dual
    collective."""
    b = PCGBuilder()
    x = b.partition(b.input((64, 32), name="x"), dim=1, degree=2, name="x.split")
    w = b.partition(b.weight((32, 32), name="w"), dim=0, degree=2, name="w.split")
    plan = b.build(b.reduce(b.matmul(x, w, name="mm"), degree=2))
    sat = saturate(plan, TWO_GPUS, budget=Budget(iterations=1))
    choice = sat.egraph.choice_for(plan)
    plain = dag_cost(enode_costs(sat.egraph, TWO_GPUS), choice).seconds
    graded = dag_cost(
        enode_costs(sat.egraph, TWO_GPUS, differentiable_inputs=("x",)), choice
    ).seconds
    assert graded > plain


def _residual_block() -> PCG:
    """Data-parallel h + h @ v for h = relu(x @ w): the split x and the activation h are each
    read twice."""
    b = PCGBuilder()
    x = b.partition(b.input((64, 32), name="x"), dim=0, degree=2, name="x.split")
    w = b.replicate(b.weight((32, 32), name="w"), degree=2, name="w.copies")
    v = b.replicate(b.weight((32, 32), name="v"), degree=2, name="v.copies")
    h = b.relu(b.add(b.matmul(x, w, name="mm"), x, name="skip"), name="act")
    y = b.add(h, b.matmul(h, v, name="mm2"), name="residual")
    return b.build(b.combine(y, dim=0, degree=2))


@pytest.mark.parametrize("which", ["residual block", "transformer"])
def test_a_tensor_read_twice_is_paid_for_once_as_in_the_cost_model(which):
    if which == "residual block":
        plan = _residual_block()
    else:
        plan = megatron(ZOO["bert_large"].build(small=True), TWO_GPUS)
    assert any(len(readers) > 1 for readers in _readers(plan).values())
    sat = saturate(plan, TWO_GPUS, budget=Budget(iterations=1))
    costs = enode_costs(sat.egraph, TWO_GPUS, runtime=ADDITIVE)
    seconds = dag_cost(costs, sat.egraph.choice_for(plan)).seconds
    assert seconds == pytest.approx(
        iteration_cost(plan, TWO_GPUS, runtime=ADDITIVE).total_s, rel=1e-6
    )


def _readers(pcg) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for n in pcg.nodes:
        for r in n.inputs:
            out.setdefault(r.node, set()).add(n.name)
    return out


@pytest.fixture(scope="module")
def one_iteration():
    sat = saturate(MNIST, TWO_GPUS, budget=Budget(iterations=1))
    return sat, enode_costs(sat.egraph, TWO_GPUS)


def test_the_exact_ilp_is_optimal_and_no_worse_than_greedy(one_iteration):
    sat, costs = one_iteration
    greedy = extract_greedy(costs)
    exact = extract_ilp(costs, time_limit_s=60)
    assert exact.optimal
    assert exact.cost.seconds <= greedy.cost.seconds * (1 + 1e-9)
    assert greedy.cost.seconds <= exact.cost.seconds * 1.02
    assert_equivalent(MNIST, sat.egraph.to_pcg(exact.choice))


def _all_plans(egraph, limit=50_000):
    """Every acyclic extraction of a small e-graph, as PCGs: each needed class gets each of its
    e-nodes in turn (depth first, only the classes the choices so far need)."""
    found = []

    def extend(choice, pending, path_free):
        if len(found) > limit:
            raise AssertionError("the e-graph is too big to enumerate")
        pending = [c for c in pending if c not in choice]
        if not pending:
            with contextlib.suppress(ChoiceError):  # a cycle
                found.append(egraph.to_pcg(choice))
            return
        c = pending[0]
        for i in egraph.classes[c]:
            children = egraph.nodes[i].children
            extend({**choice, c: i}, list(children) + pending[1:], path_free)

    extend({}, list(egraph.roots), True)
    return found


def test_extractors_find_the_true_optimum_of_an_enumerable_egraph():
    b = PCGBuilder()
    y = b.relu(b.matmul(b.input((64, 256), name="x"), b.weight((256, 128), name="w")))
    model = b.build(y)
    sat = saturate(model, TWO_GPUS, budget=Budget(iterations=1))
    costs = enode_costs(sat.egraph, TWO_GPUS, runtime=ADDITIVE)
    best = min(
        iteration_cost(p, TWO_GPUS, runtime=ADDITIVE).total_s for p in _all_plans(sat.egraph)
    )
    for found in (extract_greedy(costs), extract_ilp(costs)):
        got = iteration_cost(sat.egraph.to_pcg(found.choice), TWO_GPUS, runtime=ADDITIVE).total_s
        assert got <= best * 1.02, found.method


def _overlap_egraph(batch: int = 256):
    """Two dense layers on two GPUs: their e-graph holds plans that sync large weight
    gradients (data parallel) and plans that move activations instead."""
    b = PCGBuilder()
    h = b.relu(b.matmul(b.input((batch, 1024), name="x"), b.weight((1024, 1024), name="w1")))
    model = b.build(b.matmul(h, b.weight((1024, 512), name="w2")))
    seeds = [data_parallel(model, TWO_GPUS), megatron(model, TWO_GPUS)]
    return saturate(model, TWO_GPUS, budget=Budget(iterations=1), seeds=seeds), TWO_GPUS


def test_under_overlap_the_backward_hides_the_sync_but_its_last_bucket():
    """F + A + max(B, S - L) + L + U: the additive time with min(B, S - L) taken out, L the
    last bucket's share of the sync, unless the backward runs collectives of its own; without
    overlap, the sum."""
    sat, machine = _overlap_egraph()
    summed_costs = enode_costs(sat.egraph, machine, runtime=ADDITIVE)
    synced = coupled = 0
    for bucket in (0, 2**20, 25 * 2**20):
        costs = enode_costs(sat.egraph, machine, runtime=Runtime(bucket_bytes=bucket))
        assert costs.overlap and not summed_costs.overlap
        for plan in _all_plans(sat.egraph):
            choice = sat.egraph.choice_for(plan)
            with_overlap, summed = dag_cost(costs, choice), dag_cost(summed_costs, choice)
            assert summed.hidden_s == 0.0
            synced_bytes = sum(
                costs.sync_bytes[c] for c in choice if costs.weight_layout[c] and costs.sync_s[c]
            )
            share = min(1.0, bucket / synced_bytes) if synced_bytes else 0.0
            assert with_overlap.last_sync_s == pytest.approx(summed.sync_s * share)
            # A backward with collectives of its own waits for them behind the sync.
            assert with_overlap.hidden_s == pytest.approx(
                0.0
                if with_overlap.backward_comm_s
                else min(summed.backward_s, summed.sync_s - with_overlap.last_sync_s)
            )
            coupled += with_overlap.backward_comm_s > 0 and summed.sync_s > 0
            assert with_overlap.seconds == pytest.approx(summed.seconds - with_overlap.hidden_s)
            assert with_overlap.memory_bytes == summed.memory_bytes
            if bucket == 25 * 2**20:
                # Two small layers' gradients fit one bucket, synchronized after the backward.
                assert with_overlap.hidden_s == 0.0
            synced += summed.sync_s > 0
    assert synced  # some plan copies a weight
    assert coupled  # and some also runs collectives in its backward


def test_gradients_in_one_bucket_are_extracted_as_if_nothing_overlapped():
    """DDP synchronizes a bucket once it is full or the backward ends: two small layers'
    gradients share one, which waits for the whole backward. Extraction must not count on the
    backward hiding it (data parallelism looked 6% cheaper than the sum and simulated 26%
    slower)."""
    sat, machine = _overlap_egraph(batch=1024)
    plans = []
    for runtime in (ADDITIVE, DDP):
        costs = enode_costs(sat.egraph, machine, runtime=runtime)
        for found in (extract_greedy(costs), extract_ilp(costs)):
            plans.append(iteration_cost(sat.egraph.to_pcg(found.choice), machine).total_s)
    assert max(plans) == pytest.approx(min(plans))


def test_under_overlap_without_buckets_the_ilp_is_optimal_and_greedy_no_better():
    """Without buckets (each gradient synchronized alone) the ILP's max(B, S) variable is
    exact: it finds the least overlapped cost among every plan the e-graph holds, and greedy
    (with its weighed starts) finds none cheaper."""
    sat, machine = _overlap_egraph()
    costs = enode_costs(sat.egraph, machine, runtime=Runtime(bucket_bytes=0))
    best = min(dag_cost(costs, sat.egraph.choice_for(p)).seconds for p in _all_plans(sat.egraph))
    greedy = extract_greedy(costs)
    exact = extract_ilp(costs, warm_start=greedy)
    assert exact.cost.seconds == pytest.approx(best, rel=1e-6)
    assert greedy.cost.seconds >= exact.cost.seconds * (1 - 1e-9)
    additive = extract_ilp(enode_costs(sat.egraph, machine, runtime=ADDITIVE))
    # The additive optimum, costed with overlap, is never cheaper than the overlap optimum.
    assert dag_cost(costs, additive.choice).seconds >= exact.cost.seconds * (1 - 1e-9)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_pcgs(max_ops=4))
def test_greedy_is_within_the_ilp_bound_and_both_are_equivalent(pcg):
    try:  # the strategy does not know the machine: keep PCGs that fit its two devices
        iteration_cost(pcg, TWO_GPUS)
    except CostError:
        assume(False)
    sat = saturate(pcg, TWO_GPUS, budget=Budget(iterations=2, enodes=3_000))
    costs = enode_costs(sat.egraph, TWO_GPUS)
    greedy = extract_greedy(costs)
    exact = extract_ilp(costs, time_limit_s=30, warm_start=greedy)
    assert exact.cost.objective(costs.memory_capacity) <= greedy.cost.objective(
        costs.memory_capacity
    ) * (1 + 1e-9)
    for found in (greedy, exact):
        assert_equivalent(pcg, sat.egraph.to_pcg(found.choice))


@pytest.fixture(scope="module")
def two_iterations():
    return saturate(MNIST, TWO_GPUS, budget=Budget(iterations=2))


def test_when_the_model_does_not_fit_one_device_the_plan_fits(two_iterations):
    sat = two_iterations
    unsplit = iteration_cost(MNIST, TWO_GPUS).memory_per_device
    small = dataclasses.replace(
        TWO_GPUS, device=dataclasses.replace(TWO_GPUS.device, memory_bytes=int(unsplit * 0.8))
    )
    tight = enode_costs(sat.egraph, small)
    greedy = extract_greedy(tight)
    # From a cold start HiGHS runs into a 20 s limit here and passes only if it has found a
    # choice that fits by then (in one CI run it had not); warm-started from the greedy choice
    # it has one from the start, and may only improve on it.
    exact = extract_ilp(tight, time_limit_s=5, warm_start=greedy)
    for found in (greedy, exact):
        plan = sat.egraph.to_pcg(found.choice)
        assert iteration_cost(plan, small).feasible, found.method
    capacity = tight.memory_capacity
    assert exact.cost.objective(capacity) <= greedy.cost.objective(capacity) * (1 + 1e-9)


def test_the_ilp_refuses_what_it_cannot_fit(one_iteration):
    sat, _ = one_iteration
    tiny = dataclasses.replace(
        TWO_GPUS, device=dataclasses.replace(TWO_GPUS.device, memory_bytes=1024)
    )
    with pytest.raises(ExtractionError, match="fits the device memory"):
        extract_ilp(enode_costs(sat.egraph, tiny))


def test_the_ilp_refuses_large_egraphs(mnist):
    _, costs = mnist
    with pytest.raises(ExtractionError, match="use extract_greedy"):
        extract_ilp(costs, max_enodes=100)


def test_enodes_reading_a_tensor_without_shape_facts_are_never_chosen(one_iteration):
    sat, _ = one_iteration
    eg = sat.egraph
    # Forget the facts of one class that some e-nodes read and that is not needed by every
    # plan: the class of the first Partition of an input.
    target = next(
        n.eclass for n in eg.nodes if n.op == "partition" and eg.shapes[n.eclass] is not None
    )
    shapes = list(eg.shapes)
    shapes[target] = None
    damaged = dataclasses.replace(eg, shapes=shapes, _index=None)
    costs = enode_costs(damaged, TWO_GPUS)
    readers = [i for i, n in enumerate(eg.nodes) if target in n.children]
    assert readers and costs.uncosted >= len(readers)
    assert all(costs.node_s[i] == float("inf") for i in readers)
    extraction = extract_greedy(costs, time_limit_s=2)  # the sequential plan remains
    assert all(not set(eg.nodes[i].children) & {target} for i in extraction.choice.values())
    assert_equivalent(MNIST, eg.to_pcg(extraction.choice))


def test_costed_for_fewer_devices_the_wider_enodes_are_never_chosen(mnist):
    # The e-graph was saturated for 2 GPUs; costed on one of them (as the search costs it on
    # one node of several), every e-node that spans 2 devices is out, and extraction finds the
    # plan that fits: the model unsplit. Local search must not try them (trying one looked up
    # the best e-node of a class only such e-nodes derive: a KeyError).
    sat, _ = mnist
    eg = sat.egraph
    one = Machine.preset("summit", nodes=1, devices_per_node=1)
    costs = enode_costs(eg, one)
    wide = [
        i
        for i, n in enumerate(eg.nodes)
        if eg.shapes[n.eclass] is not None
        and eg.shapes[n.eclass].num_shards > 1
        and not costs.free[i]
    ]
    assert wide and all(costs.node_s[i] == float("inf") for i in wide)
    extraction = extract_greedy(costs, time_limit_s=5)
    plan = eg.to_pcg(extraction.choice)
    assert all(n.spec.kind.name != "PARALLEL" for n in plan.nodes)
    assert_equivalent(MNIST, plan)


def test_repricing_an_egraph_equals_costing_it_afresh():
    """Extraction with placement in the loop and the one-node extraction reprice an e-graph
    already costed (repriced): on other device groups, or on one node of the machine, the
    result is what enode_costs gives from scratch, and the groups change what it says."""
    two_nodes = Machine.preset("summit", nodes=2, devices_per_node=2)
    b = PCGBuilder()
    x = b.partition(b.input((64, 32), name="x"), dim=0, degree=2)
    w = b.replicate(b.weight((32, 32), name="w"), degree=2)
    # A Combine of degree 2 on a tensor of 4 shards: its groups are a placement's choice.
    y = b.combine(b.partition(b.matmul(x, w), dim=1, degree=2), dim=1, degree=2)
    sat = saturate(b.build(b.combine(y, dim=0, degree=2)), two_nodes, budget=Budget(iterations=1))
    costs = enode_costs(sat.egraph, two_nodes, optimizer="sgd")

    def spread(degree: int, width: int) -> tuple[tuple[int, ...], ...]:
        stride = width // degree
        return tuple(tuple(range(g, width, stride)) for g in range(stride))

    node = two_nodes.one_node()
    assert node is not None
    fields = ("node_s", "backward_s", "backward_comm_s", "backward", "stored_s", "sync_s")
    for again, fresh in [
        (
            repriced(costs, groups=spread),
            enode_costs(sat.egraph, two_nodes, optimizer="sgd", groups=spread),
        ),
        (repriced(costs, machine=node), enode_costs(sat.egraph, node, optimizer="sgd")),
        (repriced(repriced(costs, groups=spread)), costs),
    ]:
        for name in (*fields, "sync_bytes", "stored_mem", "act_mem", "free"):
            assert (getattr(again, name) == getattr(fresh, name)).all(), name
        assert again.machine == fresh.machine
    # Groups across the nodes cost more than the closest devices for some e-node.
    assert (repriced(costs, groups=spread).node_s > costs.node_s).any()


def test_on_a_placements_groups_extraction_prices_the_placed_plan_at_its_placed_cost():
    """Extraction with placement in the loop: the e-graph priced on a placement's device
    groups costs the plan that placement was found for exactly as the cost model costs it
    placed, where the default groups (each the closest devices) cost it otherwise."""
    summit = Machine.preset("summit", nodes=2)
    plan = megatron(ZOO["mlp"].build(small=True), summit)  # 4-way data x 2-way tensor
    placed = place_plan(plan, summit, runtime=ADDITIVE)
    assert placed.matrix is not None
    sat = saturate(plan, summit, budget=Budget(iterations=1))
    choice = sat.egraph.choice_for(plan)
    costs = enode_costs(sat.egraph, summit, runtime=ADDITIVE)
    on_placement = repriced(costs, groups=placement_groups(placed, summit))
    exact = iteration_cost(plan, summit, runtime=ADDITIVE, devices=placed.devices).total_s
    assert dag_cost(on_placement, choice).seconds == pytest.approx(exact, rel=1e-6)
    assert dag_cost(costs, choice).seconds != pytest.approx(exact, rel=1e-3)
