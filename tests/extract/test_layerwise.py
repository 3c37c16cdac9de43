"""Per-layer SBP matmul strategies (AutoDDL section 4): every assignment lowers to an equivalent
plan; the search space holds the 3D matmul, whose communication is Theta(n^2 / p^(2/3));
coordinate descent, Metropolis-Hastings, memory-aware pruning and gradient accumulation."""

import contextlib
import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pcgopt import Machine, PCGBuilder, equivalent
from pcgopt.errors import PCGError
from pcgopt.extract import (
    ADDITIVE,
    BaselineError,
    CostError,
    accumulate_to_fit,
    iteration_cost,
    saturate_and_extract,
)
from pcgopt.extract.costmodel.simulate import DDP
from pcgopt.extract.search.plan import placed_cost
from pcgopt.extract.strategies import baselines, layerwise
from pcgopt.extract.strategies.layerwise import (
    MatmulStrategy,
    coordinate_descent,
    dense_layers,
    lower,
    metropolis_hastings,
    strategies_for,
    summa_like,
    uniform_strategy,
)
from pcgopt.graph import PCG
from pcgopt.machine import DeviceSpec, Level, Link
from pcgopt.models import build

FOUR = Machine.preset("dgx-a100", devices_per_node=4)
EIGHT = Machine.preset("dgx-a100", devices_per_node=8)


def flat_machine(p: int, memory_gib: float = 4) -> Machine:
    """``p`` devices behind one switch, 10 GB/s each: volume and time rank plans alike."""
    device = DeviceSpec(
        name="gpu",
        peak_flops={"f32": 15e12},
        memory_bandwidth_Bps=900e9,
        memory_bytes=int(memory_gib * 2**30),
    )
    return Machine((Level("node", p, Link(10e9, 5e-6, "switched")),), device, name=f"flat{p}")


def chain(n: int, layers: int):
    """``layers`` square n x n dense layers, summed to a loss."""
    b = PCGBuilder()
    x = b.input((n, n), name="x")
    for i in range(layers):
        x = b.matmul(x, b.weight((n, n), name=f"w{i}"), name=f"mm{i}")
    return b.build(b.reduce_sum(x, axes=(0, 1), name="loss"))


# --- the strategy value type -------------------------------------------------------------------


def test_a_strategy_is_written_in_sbp_notation():
    s = MatmulStrategy(2, 4, 8)
    assert s.devices == 64
    assert str(s.input_sbp()) == "(S0:2, B:4, S1:8)"
    assert str(s.weight_sbp()) == "(B:2, S1:4, S0:8)"
    assert str(s.output_sbp(rank=3)) == "(S0:2, S2:4, P:8)"
    # Every SBP signature is the parallel shape the lowering gives the tensor.
    assert s.input_sbp().shape((64, 64)).degrees == (2, 8)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_strategy_needs_positive_integer_degrees(bad):
    with pytest.raises(BaselineError, match="positive integer"):
        MatmulStrategy(1, bad, 1)


# --- lowering ----------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(data=st.data(), model=st.sampled_from(["mnist_mlp", "mlp", "transformer", "vgg13"]))
def test_every_assignment_lowers_to_an_equivalent_plan(data, model):
    pcg = build(model, small=True)
    assignment = {
        layer: data.draw(st.sampled_from(strategies_for(pcg, layer, FOUR)), label=layer)
        for layer in dense_layers(pcg)
    }
    plan = lower(pcg, FOUR, assignment)
    assert equivalent(pcg, plan)
    assert iteration_cost(plan, FOUR).devices_used <= FOUR.num_devices


@st.composite
def dense_stacks(draw):
    """Random stacks of dense layers (MatMul or Linear, with or without bias and activation,
    rank-2 or rank-3 activations) with a residual Add or a reduction at the end."""
    b = PCGBuilder()
    rank3 = draw(st.booleans())
    width = draw(st.sampled_from((4, 6, 8, 12)))
    x = b.input((4, 6, width) if rank3 else (12, width), name="x")
    first = x
    for i in range(draw(st.integers(1, 4))):
        out = draw(st.sampled_from((4, 6, 8, 12)))
        w = b.weight((x.shape.sizes[-1], out), name=f"w{i}")
        if draw(st.booleans()):
            x = b.matmul(x, w, name=f"mm{i}")
        else:
            bias = [b.weight((out,), name=f"b{i}")] if draw(st.booleans()) else []
            act = draw(st.sampled_from(("none", "relu", "gelu")))
            x = b.linear(x, w, *bias, activation=act, name=f"fc{i}")
    if x.shape.sizes == first.shape.sizes and draw(st.booleans()):
        x = b.add(x, first, name="residual")
    if draw(st.booleans()):
        x = b.reduce_sum(x, axes=tuple(range(x.shape.rank)), name="loss")
    return b.build(x)


@settings(max_examples=40, deadline=None)
@given(pcg=dense_stacks(), devices=st.sampled_from((2, 4, 6, 8)), data=st.data())
def test_random_dense_stacks_lower_soundly(pcg, devices, data):
    machine = flat_machine(devices)
    assignment = {}
    for layer in dense_layers(pcg):
        options = strategies_for(pcg, layer, machine)
        assume(options)
        assignment[layer] = data.draw(st.sampled_from(options), label=layer)
    assert equivalent(pcg, lower(pcg, machine, assignment))


def test_layers_keep_the_strategy_they_were_given():
    pcg = build("mnist_mlp", small=True)
    first, second = dense_layers(pcg)
    plan = lower(pcg, FOUR, {first: MatmulStrategy(1, 4, 1), second: MatmulStrategy(2, 1, 2)})
    # The first weight is split by columns, the second by rows over 2 and copied twice.
    assert plan.shape(second).is_partial and plan.shape(second).sum_degree == 2
    shapes = {str(plan.shape(n.name)) for n in plan.nodes if n.op in ("matmul", "linear")}
    assert any("r4" not in s for s in shapes)
    assert equivalent(pcg, plan)


def test_a_strategy_that_does_not_fit_a_layer_is_an_error_not_another_plan():
    pcg = build("vgg13", small=True)  # fc2: 8 -> 5 classes
    with pytest.raises(BaselineError, match=r"node 'fc2/linear': strategy \(1, 2, 2\)"):
        lower(pcg, FOUR, {"fc2/linear": MatmulStrategy(1, 2, 2)})


def test_an_embedding_is_a_dense_layer_whose_vocabulary_can_be_split():
    """Megatron's vocabulary-parallel embedding is the strategy (p0, 1, p2): the table's rows
    split p2 ways, the lookups left as p2 partial sums."""
    pcg = build("transformer", small=True, batch=4, vocab=12)
    assert "embed/lookup" in dense_layers(pcg)
    plan = lower(pcg, FOUR, {"embed/lookup": MatmulStrategy(1, 1, 4)})
    assert plan.shape("embed/lookup").sum_degree == 4
    replicated = lower(pcg, FOUR, {"embed/lookup": MatmulStrategy(4, 1, 1)})
    split, whole = iteration_cost(plan, FOUR), iteration_cost(replicated, FOUR)
    table = pcg.shape("embed/tokens").nbytes
    assert whole.memory.weights - split.memory.weights == table - table // 4
    assert equivalent(pcg, plan)


def test_an_embedding_bag_is_a_dense_layer_whose_table_can_be_split():
    """A bag of lookups is a product of summed one-hot indices by the table: its embedding
    dimension splits as a layer's columns (no copy of the table, no gradient all-reduce), its
    rows as a contraction (partial sums)."""
    pcg = build("xdl", small=True)
    bags = [n.name for n in pcg.nodes if n.op == "embedding_bag"]
    assert len(bags) == 3 and set(bags) <= set(dense_layers(pcg))
    strategies = {
        bags[0]: MatmulStrategy(1, 4, 1),
        bags[1]: MatmulStrategy(4, 1, 1),
        bags[2]: MatmulStrategy(2, 2, 1),
    }
    plan = lower(pcg, FOUR, strategies)
    assert plan.shape(bags[0]).degrees == (1, 4)
    assert plan.shape(bags[2]).degrees == (2, 2) and plan.shape(bags[2]).copy_degree == 1
    rows_split = lower(pcg, FOUR, {bags[0]: MatmulStrategy(2, 1, 2)})
    assert rows_split.shape(bags[0]).sum_degree == 2
    replicated = lower(pcg, FOUR, {bags[0]: MatmulStrategy(4, 1, 1)})
    table = pcg.shape(pcg.node(bags[0]).inputs[1]).nbytes
    whole, split = iteration_cost(replicated, FOUR), iteration_cost(plan, FOUR)
    assert whole.memory.weights - split.memory.weights >= table - table // 4
    assert equivalent(pcg, plan) and equivalent(pcg, rows_split)


def test_lowering_rejects_what_is_not_a_dense_layer():
    pcg = build("mnist_mlp", small=True)
    relu = next(n.name for n in pcg.nodes if n.op == "relu")
    with pytest.raises(BaselineError, match=f"node '{relu}' is not a dense layer"):
        lower(pcg, FOUR, {relu: MatmulStrategy(4, 1, 1)})
    layer = dense_layers(pcg)[0]
    with pytest.raises(BaselineError, match="needs 8 devices"):
        lower(pcg, FOUR, {layer: MatmulStrategy(2, 2, 2)})
    with pytest.raises(BaselineError, match="must be a MatmulStrategy"):
        lower(pcg, FOUR, {layer: (4, 1, 1)})


# --- the 3D matmul -------------------------------------------------------------------------------


def marginal_volume(n: int, p: int, allow=None) -> tuple[float, list[MatmulStrategy]]:
    """Volume per device (in units of n^2 elements) that one more middle layer of a chain adds
    to the plan coordinate descent finds, and that plan's middle strategies."""
    machine = flat_machine(p)
    volumes, middle = [], []
    for layers in (3, 4):
        # Volume is what the additive model ranks by; overlap would hide the weight gradients'.
        result = coordinate_descent(
            chain(n, layers), machine, restarts=2, allow=allow, runtime=ADDITIVE
        )
        assert result.cost.feasible
        volumes.append(result.cost.comm_bytes / p / (4 * n * n))
        middle = list(result.strategies.values())[1:-1]
    return volumes[1] - volumes[0], middle


def test_the_search_finds_the_3d_matmul_whose_volume_is_n2_over_p_to_the_two_thirds():
    """Square n x n layers on p = q^3 devices of 4 GiB, where a replicated weight with its
    gradient and Adam state (4 x 298 MB per layer) does not fit next to the others. Measured
    volume per device of one more middle layer, in n^2 elements (`pytest -s` prints them):

        p = 8:  3D (2, 2, 2) 0.7500, best 2D-only (1, 4, 2) 1.0000
        p = 27: 3D (3, 3, 3) 0.4444, best 2D-only (1, 9, 3) 0.7407
        p = 64: 3D (4, 4, 4) 0.2812, best 2D-only (1, 8, 8) 0.4375

    The 3D volume is exactly 6 (q-1)/q n^2 / p^(2/3): the output's partial sums all-reduced
    over q devices into the next layer's input layout, the same in the backward, and the weight
    gradient's AllReduce over its q copies, each of an n^2/q^2 block; 6 (q-1)/q < 6, so it is
    Theta(n^2 / p^(2/3)). The best 2D-only plan's is 4 (s-1)/s n^2 / s on an s x s grid,
    Theta(n^2 / p^(1/2))."""
    n = 8640  # divisible by 8, 27 and 64
    two_d = lambda s: min(s.batch, s.columns, s.contraction) == 1  # noqa: E731
    for p in (8, 27, 64):
        q = round(p ** (1 / 3))
        volume, middle = marginal_volume(n, p)
        flat_volume, flat_middle = marginal_volume(n, p, allow=two_d)
        print(
            f"p = {p}: 3D {middle[0]} {volume:.4f}, best 2D-only {flat_middle[0]} {flat_volume:.4f}"
        )
        assert all(s == MatmulStrategy(q, q, q) for s in middle)
        assert volume == pytest.approx(6 * (q - 1) / q / p ** (2 / 3), rel=1e-9)
        assert volume < flat_volume
    s = 8
    assert flat_volume == pytest.approx(4 * (s - 1) / s / s, rel=1e-9)


def test_replicated_operands_do_not_fit():
    """The premise of the 3D test: data parallelism does not fit the 4 GiB devices."""
    n, p = 8640, 64
    cost = uniform_strategy(chain(n, 4), flat_machine(p), MatmulStrategy(p, 1, 1))[1]
    assert not cost.feasible
    assert (p, 1, 1) not in {
        (s.batch, s.columns, s.contraction)
        for s in strategies_for(chain(n, 4), "mm1", flat_machine(p, memory_gib=1))
    }


# --- the searches ------------------------------------------------------------------------------


def test_coordinate_descent_finds_the_exhaustive_optimum_on_a_small_model():
    pcg = build("mnist_mlp", small=True)
    layers = dense_layers(pcg)
    options = [strategies_for(pcg, layer, EIGHT) for layer in layers]
    best = min(
        iteration_cost(lower(pcg, EIGHT, dict(zip(layers, a, strict=True))), EIGHT).total_s
        for a in itertools.product(*options)
    )
    result = coordinate_descent(pcg, EIGHT, restarts=3)
    assert result.cost.total_s == pytest.approx(best, rel=1e-12)
    assert result.evaluations < math.prod(len(o) for o in options)
    assert equivalent(pcg, result.pcg)
    assert "matmul" in result.describe()


def test_a_layer_that_no_split_over_every_device_divides_runs_on_fewer():
    # Twelve GPUs (two Summit nodes of six) and sizes without a factor 3: no strategy uses all
    # twelve, so each layer runs on the most devices that divide its sizes, eight.
    b = PCGBuilder()
    x = b.input((16, 32), name="x")
    h = b.relu(b.matmul(x, b.weight((32, 64), name="w1")))
    model = b.build(b.matmul(h, b.weight((64, 16), name="w2")))
    found = coordinate_descent(model, Machine.preset("summit", nodes=2), restarts=1)
    assert {s.devices for s in found.strategies.values()} == {8}
    assert equivalent(model, found.pcg)


def test_coordinate_descent_never_loses_to_its_data_parallel_start():
    pcg = build("transformer", small=True, batch=4)
    result = coordinate_descent(pcg, FOUR, restarts=1, tie=True)
    start = uniform_strategy(pcg, FOUR, MatmulStrategy(4, 1, 1))[1]
    assert result.cost.total_s <= start.total_s
    assert result.history == tuple(sorted(result.history, reverse=True))  # best so far
    # tie=True: layers of one role share a strategy.
    by_role = {}
    for name, strategy in result.strategies.items():
        role = "".join(c for c in name if not c.isdigit())
        by_role.setdefault(role, set()).add(strategy)
    assert all(len(v) == 1 for v in by_role.values())


def test_the_uniform_start_tries_the_most_even_three_way_split_right_after_data_parallelism(
    monkeypatch,
):
    from pcgopt.extract.strategies import layerwise

    tried: list[set[MatmulStrategy]] = []
    evaluate = layerwise._Search.evaluate

    def recording(self, assignment):
        tried.append(set(assignment))
        return evaluate(self, assignment)

    monkeypatch.setattr(layerwise._Search, "evaluate", recording)
    pcg = build("transformer", small=True, batch=8)
    coordinate_descent(pcg, EIGHT, restarts=1, max_sweeps=0, tie=True)  # the uniform pass only
    assert tried[0] == {MatmulStrategy(8, 1, 1)}  # data parallelism first, as the fallback
    assert MatmulStrategy(2, 2, 2) in tried[1]  # then the 3D split, 2 x 2 x 2

    def spread(s: MatmulStrategy) -> float:
        return max(s.batch, s.columns, s.contraction) / min(s.batch, s.columns, s.contraction)

    # Each later one is as even or less: when time runs out, the balanced ones were tried.
    # (Layers that cannot take a strategy keep data parallelism; those are left out.)
    # The descent then re-reads its start from the cache: first evaluations only.
    firsts = list(dict.fromkeys(frozenset(t) for t in tried))
    uniform = [t - tried[0] for t in firsts[1:] if t - tried[0]]
    assert all(len(t) == 1 for t in uniform) and len(uniform) > 3
    spreads = [spread(next(iter(t))) for t in uniform]
    assert spreads == sorted(spreads)


def test_the_baseline_entry_point_is_the_same_search():
    pcg = build("mnist_mlp", small=True)
    a = baselines.coordinate_descent(pcg, FOUR, restarts=2)
    b = coordinate_descent(pcg, FOUR, restarts=2)
    assert a.strategies == b.strategies and a.cost.total_s == b.cost.total_s


def test_metropolis_hastings_keeps_the_best_it_saw():
    pcg = build("vgg13", small=True, batch=4)
    mh = metropolis_hastings(pcg, FOUR, steps=40, seed=3)
    cd = coordinate_descent(pcg, FOUR, restarts=2)
    start = uniform_strategy(pcg, FOUR, MatmulStrategy(4, 1, 1))[1]
    assert mh.cost.total_s <= start.total_s
    assert mh.evaluations <= 41
    assert cd.cost.total_s <= mh.cost.total_s * (1 + 1e-12)  # here CD finds the optimum
    assert equivalent(pcg, mh.pcg)


def test_metropolis_hastings_can_start_from_a_coordinate_descent_result():
    pcg = build("mnist_mlp", small=True)
    cd = coordinate_descent(pcg, FOUR, restarts=2)
    mh = metropolis_hastings(pcg, FOUR, steps=10, start=cd.strategies)
    assert mh.cost.total_s <= cd.cost.total_s * (1 + 1e-12)
    first = dense_layers(pcg)[0]
    with pytest.raises(BaselineError, match="start names no strategy for dense layer"):
        metropolis_hastings(pcg, FOUR, steps=1, start={first: MatmulStrategy(4, 1, 1)})


def test_summa_like_is_the_best_uniform_2d_grid():
    pcg = build("vgg13", small=True)
    plan, cost, grid = summa_like(pcg, FOUR)
    assert grid.batch == 1 and grid.devices == 4
    applicable = 0
    for other in (MatmulStrategy(1, 1, 4), MatmulStrategy(1, 2, 2), MatmulStrategy(1, 4, 1)):
        try:
            assert cost.total_s <= uniform_strategy(pcg, FOUR, other)[1].total_s
            applicable += 1
        except BaselineError as e:  # a grid that does not divide some layer is never chosen
            assert "cannot be applied" in str(e) and other != grid
    assert applicable >= 1
    assert equivalent(pcg, plan)


def test_search_arguments_are_checked():
    pcg = build("mnist_mlp", small=True)
    with pytest.raises(BaselineError, match="restarts must be a positive integer"):
        coordinate_descent(pcg, FOUR, restarts=0)
    with pytest.raises(BaselineError, match="is not a dense layer"):
        coordinate_descent(pcg, FOUR, layers=["nope"])
    b = PCGBuilder()
    no_dense = b.build(b.relu(b.input((4, 4), name="x")))
    with pytest.raises(BaselineError, match="no dense layer"):
        coordinate_descent(no_dense, FOUR)


# --- memory: pruning and gradient accumulation -----------------------------------------------


def test_strategies_whose_weight_shard_does_not_fit_are_pruned():
    pcg = chain(8640, 2)
    # 298 MB weight x (weight, gradient, 2 Adam states) = 1.2 GB: unsplit it does not fit 1 GiB.
    options = strategies_for(pcg, "mm0", flat_machine(8, memory_gib=1))
    assert options and all(s.columns * s.contraction > 1 for s in options)
    assert MatmulStrategy(8, 1, 1) in strategies_for(pcg, "mm0", flat_machine(8, memory_gib=8))


def test_gradient_accumulation_divides_activation_memory_not_weights():
    pcg = build("mnist_mlp")
    plan = lower(pcg, EIGHT, dict.fromkeys(dense_layers(pcg), MatmulStrategy(8, 1, 1)))
    one = iteration_cost(plan, EIGHT)
    four = iteration_cost(plan, EIGHT, micro_batches=4)
    assert four.micro_batches == 4 and one.micro_batches == 1
    assert four.memory.weights == one.memory.weights
    assert four.memory.optimizer_state == one.memory.optimizer_state
    assert four.memory.activations == pytest.approx(one.memory.activations / 4, rel=0.01)
    assert four.update_s == one.update_s
    # The gradient AllReduce runs once; data collectives move the same bytes in 4 pieces.
    assert four.comm_bytes == pytest.approx(one.comm_bytes)
    assert four.total_s > one.total_s
    assert "4 micro-batches" in four.summary() and "4 micro-batches" in repr(four)


def test_micro_batches_must_divide_the_batch_blocks():
    pcg = build("mnist_mlp", small=True)  # batch 8
    plan = lower(pcg, FOUR, dict.fromkeys(dense_layers(pcg), MatmulStrategy(4, 1, 1)))
    with pytest.raises(CostError, match="3 micro-batches must divide"):
        iteration_cost(plan, FOUR, micro_batches=3)
    with pytest.raises(CostError, match="positive integer"):
        iteration_cost(plan, FOUR, micro_batches=0)


def test_accumulation_uses_the_fewest_micro_batches_that_fit():
    pcg = build("mnist_mlp", batch=1024)
    machine = flat_machine(2, memory_gib=0.0075)  # 7.7 MiB: weights and state 6.2, activations 3.5
    plan = lower(pcg, machine, dict.fromkeys(dense_layers(pcg), MatmulStrategy(2, 1, 1)))
    assert not iteration_cost(plan, machine).feasible
    fitted = accumulate_to_fit(plan, machine)
    m = fitted.micro_batches
    assert fitted.feasible and m > 1
    for fewer in range(1, m):
        with contextlib.suppress(CostError):  # CostError: does not divide the batch blocks
            assert not iteration_cost(plan, machine, micro_batches=fewer).feasible


def test_the_joint_optimizer_is_never_worse_than_coordinate_descent():
    pcg = build("transformer", small=True)
    plan = saturate_and_extract(pcg, FOUR, time_budget_s=10)
    cd = coordinate_descent(pcg, FOUR, restarts=4)
    assert plan.stats.candidates["coordinate descent"] is not None
    assert plan.cost.total_s <= placed_cost(cd.pcg, FOUR, cost=cd.cost)[1].total_s * (1 + 1e-9)
    assert equivalent(pcg, plan.pcg)


def test_seed_plans_are_candidates_of_the_joint_optimizer(two_iterations):
    pcg = build("mnist_mlp", small=True)
    seed = lower(pcg, FOUR, dict.fromkeys(dense_layers(pcg), MatmulStrategy(1, 2, 2)))
    # Work limits, not time: run alone, the rules' loading would take the time to place it.
    plan = saturate_and_extract(pcg, FOUR, deterministic=True, seeds=[seed])
    assert plan.stats.candidates["seed 0"] == pytest.approx(placed_cost(seed, FOUR)[1].total_s)
    assert plan.cost.total_s <= plan.stats.candidates["seed 0"]
    with pytest.raises(PCGError, match=r"seeds\[0\] must be a pcgopt.PCG"):
        saturate_and_extract(pcg, FOUR, time_budget_s=5, seeds=["plan"])


# -- repeated layers: the depth proxy -------------------------------------------------------------

#: Thirteen equal BERT layers (a run of 10 between the first two and the last), 81 dense
#: layers, tied; the short models have 0.73 of its nodes.
DEEP = build("bert_large", layers=13, seq=32, hidden=64, heads=4, batch=8)


@pytest.mark.parametrize(
    ("machine", "runtime"),
    [(EIGHT, DDP), (flat_machine(8, memory_gib=0.02), DDP)],
    ids=["overlapped", "accumulating"],
)
def test_a_deep_model_costed_from_two_short_ones_is_costed_as_the_whole(machine, runtime):
    """Every assignment's time extrapolated from the model with one and two of its repeated
    layers is the whole model's (the history holds each evaluation's best), the micro-batch
    count (0.02 GiB devices) included, so the search goes the same way and ends on the same
    plan."""
    kwargs = {"restarts": 1, "max_evaluations": 6, "runtime": runtime, "time_limit_s": math.inf}
    short = coordinate_descent(DEEP, machine, **kwargs)
    whole = coordinate_descent(DEEP, machine, depth_proxy=False, **kwargs)
    assert short.proxy_used and short.proxy_error is not None and short.proxy_error < 1e-9
    assert not whole.proxy_used and whole.proxy_error is None
    assert short.history == pytest.approx(whole.history, rel=1e-9)
    assert short.strategies == whole.strategies and short.cost == whole.cost
    if machine is not EIGHT:
        assert short.cost.micro_batches > 1


def test_a_depth_proxy_that_misses_the_first_assignment_is_not_used(monkeypatch):
    estimate = layerwise._DepthProxy.estimate

    def twice(self, *args):
        found = estimate(self, *args)
        return replace(found, total_s=2 * found.total_s)

    monkeypatch.setattr(layerwise._DepthProxy, "estimate", twice)
    off = metropolis_hastings(DEEP, EIGHT, steps=4, seed=1)
    assert off.proxy_error == pytest.approx(1.0) and not off.proxy_used
    whole = metropolis_hastings(DEEP, EIGHT, steps=4, seed=1, depth_proxy=False)
    assert off.history == whole.history and off.strategies == whole.strategies


def _roles_chain(swapped: bool) -> PCG:
    """120 dense layers in 10 segments of 12 (graph splitting's), each layer of role ``odd`` or
    ``even`` by its place; ``swapped``: the roles change places in every other segment."""
    b = PCGBuilder()
    x = b.input((64, 64), name="x")
    for i in range(120):
        segment, place = divmod(i, 12)
        role = "odd" if (place + (segment % 2 if swapped else 0)) % 2 else "even"
        w = b.weight((64, 64), name=f"{role}{i}/w")
        x = b.relu(b.matmul(x, w, name=f"{role}{i}/mm"), name=f"{role}{i}/relu")
    return b.build(b.reduce_sum(x, axes=(0, 1), name="loss"))


def test_the_depth_proxy_needs_every_repeat_tied_as_the_first_one():
    """Tied by role, the repeats of a model cost alike only if each layer has the role of its
    counterpart in the first repeat: where the roles change places, no proxy."""
    kwargs = {"restarts": 1, "max_evaluations": 2, "tie": True}
    same = coordinate_descent(_roles_chain(False), EIGHT, **kwargs)
    assert same.proxy_error is not None
    assert coordinate_descent(_roles_chain(True), EIGHT, **kwargs).proxy_error is None


def test_the_depth_proxy_is_checked_on_the_first_assignment_it_can_cost(monkeypatch):
    estimate, calls = layerwise._DepthProxy.estimate, []

    def first_fails(self, *args):
        calls.append(1)
        if len(calls) == 1:
            raise CostError("the short models cannot be costed")
        return estimate(self, *args)

    monkeypatch.setattr(layerwise._DepthProxy, "estimate", first_fails)
    found = coordinate_descent(DEEP, EIGHT, restarts=1, max_evaluations=3)
    assert len(calls) > 1 and found.proxy_error is not None and found.proxy_error < 1e-9


def test_a_time_limit_too_short_for_the_depth_proxy_to_pay_off_leaves_it_out():
    found = coordinate_descent(DEEP, EIGHT, restarts=1, time_limit_s=0.0)
    assert found.proxy_error is not None and not found.proxy_used


def test_the_joint_optimizer_accumulates_gradients_when_the_batch_does_not_fit():
    pcg = build("mnist_mlp", batch=1024)
    # One device of 8.2 MiB: weights and state 6.2 MiB, activations 5 to 7 MiB (fused or not).
    plan = saturate_and_extract(pcg, flat_machine(1, memory_gib=0.008), time_budget_s=5)
    assert plan.cost.feasible and plan.cost.micro_batches > 1
    assert "micro-batches" in plan.explain()
    assert plan.to_dict()["cost"]["micro_batches"] == plan.cost.micro_batches


def test_the_joint_optimizer_finds_the_3d_plan_on_64_devices():
    """saturate_and_extract on the square chain of the 3D test, p = 64: its plan (the e-graph,
    seeded with the coordinate-descent plan, or that plan itself) is as fast as coordinate
    descent's and moves less than the best plan without 3D splits."""
    n, p = 8640, 64
    machine = flat_machine(p)
    pcg = chain(n, 3)
    plan = saturate_and_extract(pcg, machine, time_budget_s=10, check=False)
    cd = coordinate_descent(pcg, machine, restarts=4)
    two_d = coordinate_descent(
        pcg, machine, restarts=4, allow=lambda s: min(s.batch, s.columns, s.contraction) == 1
    )
    assert plan.cost.total_s <= placed_cost(cd.pcg, machine, cost=cd.cost)[1].total_s * (1 + 1e-9)
    assert MatmulStrategy(4, 4, 4) in cd.strategies.values()
    assert plan.cost.comm_bytes < two_d.cost.comm_bytes
