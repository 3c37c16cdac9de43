"""saturate_and_extract: the library call of the design card, its Plan, its default machine and
its errors."""

import json
import math
import time

import pytest

import pcgopt
from pcgopt import Machine, MachineError, NotEquivalentError, PCGError, equivalent
from pcgopt.extract import (
    DEFAULT_MACHINE,
    PlanCheckError,
    default_machine,
    machine_from_spec,
    saturate_and_extract,
)
from pcgopt.extract.search import plan as plan_module
from pcgopt.extract.search.report import BASELINE_CANDIDATES
from pcgopt.models import build, mnist_mlp
from pcgopt.serialize import pcg_from_dict

MNIST = mnist_mlp(batch=64, in_features=784, hidden=512, out_features=10)
TWO_GPUS = Machine.preset("summit", nodes=1, devices_per_node=2)


@pytest.fixture(scope="module")
def mnist_plan():
    return saturate_and_extract(MNIST, TWO_GPUS, time_budget_s=15)


def test_the_plan_is_never_worse_than_a_baseline_and_is_checked(mnist_plan):
    plan = mnist_plan
    costs = [v for v in plan.stats.candidates.values() if v is not None]
    assert {
        "e-graph",
        "data parallel",
        "megatron",
        "fused, then data parallel or megatron",
        "coordinate descent",
        "metropolis-hastings",
        "branch parallel",
        "zero-1",
        "zero-2",
    } <= set(plan.stats.candidates)
    assert plan.cost.total_s == min(costs)
    assert plan.cost.feasible
    assert plan.stats.chosen == "e-graph"
    assert plan.check.startswith("equivalent")
    assert equivalent(MNIST, plan.pcg)
    assert plan.speedup > 1


def test_the_plan_reports_search_statistics_and_mapping(mnist_plan):
    s = mnist_plan.stats
    assert s.num_enodes > 0 and s.num_eclasses > 0 and s.iterations >= 1
    assert set(s.phase_seconds) == {
        "saturate",
        "extract",
        "baselines",
        "branch views",
        "branch parallel",
        "layer-wise search",
        "placement and mapping",
        "check",
    }
    assert mnist_plan.placement is not None and mnist_plan.machine_mapping is not None
    # MNIST's MLP is a chain: nothing runs beside anything, the placed cost is the cost.
    assert mnist_plan.machine_mapping.divided_splits == 0
    assert mnist_plan.cost.total_s == mnist_plan.placement.cost.total_s
    for name, groups in mnist_plan.mapping.items():
        node = mnist_plan.pcg.node(name)
        assert all(len(g) == node.params["degree"] for g in groups)


def test_explain_json_and_dot(mnist_plan):
    text = mnist_plan.explain()
    assert "summit" in text and "reduce" in text and "ms per training iteration" in text
    # The headline compares with the best plan a user would write by hand, then the input.
    c = mnist_plan.stats.candidates
    name = min((k for k in BASELINE_CANDIDATES if c.get(k) is not None), key=lambda k: c[k])
    speedup = text.splitlines()[1]
    assert speedup.startswith(
        f"  speedup: {c[name] / mnist_plan.cost.total_s:.3g}x the best baseline ("
    ), speedup
    assert f"x the input as given ({c['input as given'] * 1e3:.4g} ms)" in speedup
    data = json.loads(mnist_plan.to_json())
    assert data["machine"]["num_devices"] == 2
    assert data["cost"]["total_s"] == pytest.approx(mnist_plan.cost.total_s)
    assert equivalent(pcg_from_dict(data["pcg"]), mnist_plan.pcg)
    assert mnist_plan.to_dot().startswith("digraph")


def test_the_design_card_call_works_with_the_default_machine(monkeypatch):
    monkeypatch.delenv("PCGOPT_MACHINE", raising=False)
    assert default_machine().num_devices == 8
    assert DEFAULT_MACHINE.startswith("dgx-h100")
    monkeypatch.setenv("PCGOPT_MACHINE", "summit:1:2")
    plan = pcgopt.saturate_and_extract(MNIST, time_budget_s=5)
    assert plan.machine.num_devices == 2 and plan.machine.name == "summit"
    assert plan.cost.total_s <= min(v for v in plan.stats.candidates.values() if v is not None)


def test_machine_specs_and_their_errors(monkeypatch, tmp_path):
    assert machine_from_spec("v100-ring").num_devices == 8
    assert machine_from_spec("dgx-a100:2:4").num_devices == 8
    with pytest.raises(MachineError, match="NODES and DEVICES_PER_NODE must be integers"):
        machine_from_spec("summit:two")
    with pytest.raises(MachineError, match="expected NAME"):
        machine_from_spec("summit:1:2:3")
    monkeypatch.setenv("PCGOPT_MACHINE", "nosuch")
    with pytest.raises(MachineError, match="PCGOPT_MACHINE='nosuch'"):
        default_machine()


def test_bad_arguments_are_named():
    with pytest.raises(PCGError, match=r"takes a pcgopt\.PCG, got str"):
        saturate_and_extract("mnist")
    with pytest.raises(PCGError, match=r"machine must be a pcgopt\.Machine"):
        saturate_and_extract(MNIST, "summit")
    for budget in (0, -1.0, float("inf"), float("nan"), "60"):
        with pytest.raises(PCGError, match="time_budget_s must be a finite number of seconds > 0"):
            saturate_and_extract(MNIST, TWO_GPUS, time_budget_s=budget)
    with pytest.raises(PCGError, match="memory_budget must be a positive number of bytes, got 0"):
        saturate_and_extract(MNIST, TWO_GPUS, memory_budget=0)


def test_a_plan_that_differs_from_the_input_is_refused(monkeypatch):
    def differs(a, b):
        raise NotEquivalentError("output 0 differs at index (0, 0)")

    monkeypatch.setattr(plan_module, "assert_equivalent", differs)
    with pytest.raises(
        PlanCheckError, match=r"does not compute what the input computes .*\(0, 0\)"
    ):
        saturate_and_extract(MNIST, TWO_GPUS, time_budget_s=5)


def test_a_model_too_large_for_the_evaluator_is_checked_on_a_scaled_down_instance():
    from pcgopt.extract import data_parallel

    summit = Machine.preset("summit")
    model = pcgopt.models.build("mlp", batch=256 * summit.num_devices)  # 2.9 TFLOP forward
    plan = data_parallel(model, summit)
    verdict = plan_module._check(model, plan, plan_module.CHECK_FLOPS_LIMIT)
    assert verdict.startswith("equivalent to the input on 3 random inputs of an instance")
    assert "8192 to 4" in verdict
    # Two layers' weights exchanged: the small instance tells.
    swap = {"branch0/fc1/w": "branch0/fc2/w", "branch0/fc2/w": "branch0/fc1/w"}
    wrong = plan.renamed({n.name: swap.get(n.name, n.name) for n in plan.nodes})
    with pytest.raises(PlanCheckError, match="scaled down from full size"):
        plan_module._check(model, wrong, plan_module.CHECK_FLOPS_LIMIT)


def test_the_check_is_skipped_with_a_warning_only_when_even_the_small_instance_is_too_large():
    with pytest.warns(UserWarning, match="equivalence check skipped"):
        verdict = plan_module._check(MNIST, MNIST, 1.0)  # no instance has under 1 FLOP
    assert verdict.startswith("skipped: the check needs")
    assert "on the smallest instance still" in verdict and "(check_flops_limit)" in verdict


def test_the_check_bounds_tensor_elements_as_well_as_flops():
    from pcgopt import PCGBuilder

    b = PCGBuilder()
    wide = b.build(b.relu(b.input((5000, 5000), name="x")))  # 5e7 elements, 2.5e7 FLOPs
    verdict = plan_module._check(wide, wide, plan_module.CHECK_FLOPS_LIMIT)
    assert "scaled down from full size (5000 to 4)" in verdict
    b = PCGBuilder()
    x = b.input((5000, 5000), name="x")  # a split's axis shrinks as the sum of its parts
    halves = b.build(*(b.relu(h) for h in b.split(x, axis=0, sizes=(2500, 2500))))
    verdict = plan_module._check(halves, halves, plan_module.CHECK_FLOPS_LIMIT)
    assert "scaled down from full size (5000 to 8, 5000 to 4, 2500 to 4)" in verdict
    b = PCGBuilder()
    x = b.input((5000, 5000), name="x")  # slices fixing both axes: nothing shrinks
    corner = b.slice(b.slice(x, axis=0, start=0, stop=4000), axis=1, start=0, stop=4000)
    fixed = b.build(b.relu(corner))
    with pytest.warns(UserWarning, match="equivalence check skipped"):
        verdict = plan_module._check(fixed, fixed, plan_module.CHECK_FLOPS_LIMIT)
    assert "over the evaluator's limit of 2e+07 (CHECK_ELEMENTS_LIMIT)" in verdict


def test_a_failed_extraction_still_returns_the_best_baseline(monkeypatch):
    from pcgopt.extract import ExtractionError

    def fail(*args, **kwargs):
        raise ExtractionError("no acyclic extraction reaches output e-class c1")

    monkeypatch.setattr(plan_module, "extract_greedy", fail)
    # Deterministic: under a time budget the rules' load could leave saturation no time.
    plan = saturate_and_extract(MNIST, TWO_GPUS, deterministic=True)
    assert plan.stats.extraction.startswith("failed: no acyclic extraction")
    assert plan.stats.candidates["e-graph"] is None
    assert plan.stats.chosen != "e-graph" and equivalent(MNIST, plan.pcg)


def test_a_candidate_that_cannot_be_placed_is_left_out_with_a_warning(monkeypatch):
    from pcgopt.extract import CostError
    from pcgopt.extract.strategies.baselines import data_parallel

    only = data_parallel(MNIST, TWO_GPUS)
    mapped_cost = plan_module.mapped_cost

    def only_data_parallel(plan, machine, **kwargs):
        if plan != only or kwargs["runtime"].zero_stage:
            raise CostError("devices['w.r2'] must be 3 group(s) of 2 devices")
        return mapped_cost(plan, machine, **kwargs)

    monkeypatch.setattr(plan_module, "mapped_cost", only_data_parallel)
    with pytest.warns(UserWarning, match="could not be placed and mapped, so it was left out"):
        plan = saturate_and_extract(MNIST, TWO_GPUS, time_budget_s=4)
    assert plan.stats.chosen == "data parallel" and plan.pcg == only
    assert plan.stats.candidates["fused, then data parallel or megatron"] is None

    monkeypatch.setattr(plan_module, "mapped_cost", lambda *a, **k: only_data_parallel(None, 0))
    with (
        pytest.warns(UserWarning),
        pytest.raises(CostError, match="no candidate plan could be placed and mapped: devices"),
    ):
        saturate_and_extract(MNIST, TWO_GPUS, time_budget_s=4)


def test_candidates_that_are_the_same_plan_are_placed_once(monkeypatch, two_iterations):
    from pcgopt.extract.strategies.baselines import data_parallel

    placed: list[tuple[pcgopt.PCG, dict]] = []
    place = plan_module.place_plan

    def counting(plan, machine, **kwargs):
        placed.append((plan, kwargs))
        return place(plan, machine, **kwargs)

    monkeypatch.setattr(plan_module, "place_plan", counting)
    # The seed is the data-parallel baseline itself: two candidates, one plan. ZeRO-1 and ZeRO-2
    # are that plan too, under runtimes of their own: they keep its placement, costed anew.
    plan = saturate_and_extract(
        MNIST, TWO_GPUS, deterministic=True, seeds=[data_parallel(MNIST, TWO_GPUS)]
    )
    assert len(placed) == len({p for p, _ in placed})
    dp = data_parallel(MNIST, TWO_GPUS)
    # Placed once, under the runtime of its first candidate (plain data parallelism).
    assert [k["runtime"].zero_stage for p, k in placed if p == dp] == [0]
    c = plan.stats.candidates
    assert c["zero-1"] is not None and c["zero-2"] is not None and c["zero-2"] != c["data parallel"]
    assert plan.stats.candidates["seed 0"] == plan.stats.candidates["data parallel"]


def test_each_phase_gets_what_the_phases_before_it_left_and_the_next_keep_theirs(monkeypatch):
    from pcgopt.extract.search.plan import PHASE_SHARES, RESERVE_SHARE, _Clock

    assert sum(PHASE_SHARES.values()) == pytest.approx(1.0)
    now = [0.0]
    monkeypatch.setattr(plan_module.time, "perf_counter", lambda: now[0])
    # A 105.26 s budget: the phases plan 100 s of it, 5% is kept for overruns and the check.
    clock = _Clock.start(100.0 / (1 - RESERVE_SHARE))
    assert clock.deadline == pytest.approx(100.0)
    assert clock.limit("coordinate descent") == pytest.approx(12.0)
    now[0] = 30.0  # the layer-wise searches took 30 s of their 18
    # Saturation keeps the 40 s of the phases after it whole and gets 30 s, not 42.
    assert clock.limit("saturate") == pytest.approx(30.0)
    now[0] = 10.0  # or they took 10 s: saturation gets its 42 s and their unused 8 s
    assert clock.limit("saturate") == pytest.approx(50.0)
    now[0] = 99.5  # every phase overran: the next still gets 2% of the planned time
    assert clock.limit("branch parallel") == pytest.approx(2.0)
    assert clock.left() == pytest.approx(2.0)
    # Without baselines and without cuts, the branch-parallel search and the pipeline do not
    # run: their 8 s and 4 s go to the phases before them.
    now[0] = 0.0
    lean = _Clock.start(
        100.0 / (1 - RESERVE_SHARE), skipped=frozenset({"branch parallel", "pipeline"})
    )
    now[0] = 10.0
    assert lean.limit("saturate") == pytest.approx(50.0 + 12.0)
    assert lean.limit("placement and mapping") == clock.limit("placement and mapping") + 4.0


def test_phases_the_phases_before_them_left_no_time_are_cut_short(monkeypatch):
    """Budgets are limits: when the layer-wise searches overrun the whole budget, saturation
    does not start, the candidates are placed fastest first and only the first before the
    time is out, no pipeline is cut, and the plan returned is still checked."""
    searches = plan_module._layerwise_searches

    def slow(*args, **kwargs):
        found = searches(*args, **kwargs)
        time.sleep(1.5)
        return found

    monkeypatch.setattr(plan_module, "_layerwise_searches", slow)
    plan = saturate_and_extract(MNIST, TWO_GPUS, time_budget_s=1, min_segment_ops=1)
    s = plan.stats
    assert s.extraction == "skipped" and s.iterations == 0 and "e-graph" not in s.candidates
    assert s.phase_seconds["saturate"] == 0.0 and s.phase_seconds["pipeline"] == 0.0
    assert s.unplaced and s.chosen not in s.unplaced
    assert all(s.candidates[k] is None for k in s.unplaced)
    assert "not placed (time budget)" in plan.explain(max_rows=None)
    assert plan.check.startswith("equivalent") and equivalent(MNIST, plan.pcg)


def test_candidates_are_placed_fastest_first_and_the_first_always():
    from pcgopt.extract import iteration_cost
    from pcgopt.extract.strategies.baselines import data_parallel, megatron

    plans = {"data parallel": data_parallel(MNIST, TWO_GPUS), "megatron": megatron(MNIST, TWO_GPUS)}
    candidates = {k: (p, iteration_cost(p, TWO_GPUS)) for k, p in plans.items()}
    first = min(candidates, key=lambda k: candidates[k][1].total_s)
    spent = plan_module._Clock(1.0, time.perf_counter() - 1.0)  # its deadline has passed
    _, mappings, failed = plan_module._place_and_map(
        candidates, TWO_GPUS, "adam", spent, lambda _: None
    )
    assert set(mappings) == {first}
    assert list(failed.values()) == [plan_module.UNPLACED]
    assert all(v is None for k, v in candidates.items() if k != first)


def test_a_data_parallel_plan_is_placed_late_when_the_placed_ones_came_out_slower(monkeypatch):
    """A mixed plan's cost before placement puts every group on the closest devices at once;
    placed, it can come out slower than data parallelism's cost before placement, which is a
    real machine's. Past the phase's time, such a data-parallel plan is still placed (quickly)
    and the search does not return the slower plan; another mixed plan is not."""
    from dataclasses import replace

    from pcgopt.extract import iteration_cost
    from pcgopt.extract.strategies.baselines import data_parallel, megatron, megatron_sp

    plans = {
        "data parallel": data_parallel(MNIST, TWO_GPUS),
        "megatron": megatron(MNIST, TWO_GPUS),
        "megatron-sp": megatron_sp(MNIST, TWO_GPUS),
    }
    candidates = {k: (p, iteration_cost(p, TWO_GPUS)) for k, p in plans.items()}
    dp_s = candidates["data parallel"][1].total_s
    first = min(candidates, key=lambda k: candidates[k][1].total_s)
    assert first != "data parallel" and candidates["megatron-sp"][1].total_s < dp_s
    real = plan_module.mapped_cost

    def mixed_plans_place_badly(plan, *args, **kwargs):
        placement, mapping, cost = real(plan, *args, **kwargs)
        if not plan_module.batch_split_only(plan):
            cost = replace(cost, total_s=3 * dp_s)
        return placement, mapping, cost

    monkeypatch.setattr(plan_module, "mapped_cost", mixed_plans_place_badly)
    spent = plan_module._Clock(1.0, time.perf_counter() - 1.0)  # its deadline has passed
    _, mappings, failed = plan_module._place_and_map(
        candidates, TWO_GPUS, "adam", spent, lambda _: None
    )
    assert set(mappings) == {first, "data parallel"}
    assert list(failed.values()) == [plan_module.UNPLACED]


def test_plans_for_one_node_of_several_are_candidates_on_the_whole_machine(two_iterations):
    # On two Summit nodes of two GPUs, the MNIST MLP's gradients cost more to all-reduce across
    # the nodes than the second node's compute saves: data parallelism on one node is faster.
    machine = Machine.preset("summit", nodes=2, devices_per_node=2)
    # Deterministic: under a time budget a loaded machine could leave candidates unplaced.
    plan = saturate_and_extract(MNIST, machine, deterministic=True, check=False)
    c = plan.stats.candidates
    assert c["data parallel on one node"] < c["data parallel"]
    assert c["megatron on one node"] < c["megatron"]
    assert plan.cost.total_s <= min(c["data parallel on one node"], c["megatron on one node"])


def test_the_predicted_check_time_is_kept_back_from_the_phases(monkeypatch):
    from pcgopt.extract.search.plan import MIN_SEARCH_SHARE, RESERVE_SHARE, _Clock

    monkeypatch.setattr(plan_module.time, "perf_counter", lambda: 0.0)
    # A check shorter than the reserve changes nothing; a longer one comes off the phases.
    assert _Clock.start(100.0, 1.0).deadline == pytest.approx(100.0 * (1 - RESERVE_SHARE))
    assert _Clock.start(100.0, 30.0).deadline == pytest.approx(70.0)
    # A check longer than the budget leaves the search its least share (the call overruns).
    assert _Clock.start(100.0, 500.0).deadline == pytest.approx(100.0 * MIN_SEARCH_SHARE)


def test_placement_rounds_keep_the_branch_parallel_search_its_time_only_where_it_runs(
    monkeypatch,
):
    from pcgopt.extract.search.plan import PHASE_SHARES, _Clock, _rounds_deadline

    monkeypatch.setattr(plan_module.time, "perf_counter", lambda: 5.0)
    clock = _Clock.start(20.0)
    # With the branch-parallel search next, the rounds end within the exact extraction's share.
    assert _rounds_deadline(clock, False, True) == pytest.approx(
        5.0 + PHASE_SHARES["extract exact"] * clock.budget_s
    )
    # Without it (no baselines, no branch to narrow), only the clock's limits bound them; a
    # deterministic search has none.
    assert _rounds_deadline(clock, False, False) == math.inf
    assert _rounds_deadline(_Clock.untimed(), True, True) == math.inf


def test_the_check_time_grows_with_the_model_and_the_devices():
    from pcgopt.extract.search.plan import check_seconds

    small, large = build("mlp"), build("bert_large")
    one, four = Machine.preset("dgx-a100", nodes=1), Machine.preset("dgx-a100", nodes=4)
    assert check_seconds(small, one) < check_seconds(large, one) < check_seconds(large, four)


_DETERMINISTIC_SEARCH = """
import json
from pcgopt import Machine
from pcgopt.extract import saturate_and_extract
from pcgopt.models import build
machine = Machine.preset("dgx-a100", nodes=1, devices_per_node=2)
model = build("transformer", small=True, layers=2)
plan = saturate_and_extract(model, machine, deterministic=True)
found = plan.to_dict()
stats = found.pop("stats")  # its seconds and memory are the run's, the rest is the search's
found["searched"] = {
    k: stats[k] for k in ("candidates", "chosen", "num_enodes", "iterations", "segments")
}
print(json.dumps(found, sort_keys=True))
"""


def test_a_deterministic_search_gives_the_same_plan_in_every_process():
    # Two processes at once, with different string hashing (set and dict orders of names
    # change with it), on a model that graph splitting cuts into segments.
    import os
    import subprocess
    import sys

    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _DETERMINISTIC_SEARCH],
            env={**os.environ, "PYTHONHASHSEED": seed},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in ("1", "2")
    ]
    outputs = [run.communicate(timeout=600) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err
    first, second = (json.loads(out) for out, _ in outputs)
    assert first["searched"]["segments"] >= 2 and first["searched"]["chosen"] == "e-graph"
    assert first == second


def test_a_deterministic_search_is_limited_by_work_not_time(monkeypatch):
    # Not one phase gets a time limit: each is handed infinity, and saturation its e-node and
    # iteration limits.
    limits, budgets, saturate = [], [], plan_module.saturate
    greedy = plan_module.extract_greedy

    def spy_saturate(*args, **kwargs):
        budgets.append(kwargs["budget"])
        return saturate(*args, **kwargs)

    def spy_greedy(*args, **kwargs):
        limits.append(kwargs["time_limit_s"])
        return greedy(*args, **kwargs)

    monkeypatch.setattr(plan_module, "saturate", spy_saturate)
    monkeypatch.setattr(plan_module, "extract_greedy", spy_greedy)
    plan = saturate_and_extract(MNIST, TWO_GPUS, time_budget_s=1e-3, deterministic=True)
    assert budgets == [
        plan_module.replace(plan_module.DETERMINISTIC_BUDGET, memory_bytes=4 * 2**30)
    ]
    # Every extraction (the first, and those with placement in the loop) has no time limit.
    assert limits and all(limit == float("inf") for limit in limits)
    assert plan.stats.iterations <= plan_module.DETERMINISTIC_BUDGET.iterations


def test_a_plan_runs_on_jax_as_it_was_costed(mnist_plan):
    pytest.importorskip("jax", reason="running plans needs the optional extra pcgopt[jax]")
    from pcgopt.lower.jax import reference_loss_and_grads

    lowered = mnist_plan.to_jax(2)
    assert lowered.plan is mnist_plan
    assert (lowered.optimizer, lowered.micro_batches) == (
        mnist_plan.cost.optimizer,
        mnist_plan.cost.micro_batches,
    )
    inputs, weights = lowered.random_sources()
    loss, grads = lowered.loss_and_grads(inputs, weights)
    ref_loss, ref_grads = reference_loss_and_grads(MNIST, inputs, weights)
    assert abs(float(loss) - float(ref_loss)) <= 1e-4 * max(1.0, abs(float(ref_loss)))
    for name, g in ref_grads.items():
        assert float(abs(grads[name] - g).max()) <= 1e-4 * max(1.0, float(abs(g).max()))


def test_the_rewrite_options_of_saturate_are_options_of_the_search(monkeypatch, two_iterations):
    machine = Machine.preset("dgx-a100", nodes=2, devices_per_node=2)
    given, saturate = {}, plan_module.saturate

    def spy(*args, **kwargs):
        given.update(degrees=kwargs.get("degrees"), presets=kwargs.get("presets"))
        return saturate(*args, **kwargs)

    monkeypatch.setattr(plan_module, "saturate", spy)
    plan = saturate_and_extract(
        MNIST,
        machine,
        deterministic=True,  # saturation runs, whatever the rules' load takes
        degrees=machine.level_degrees(),
        presets=("matrix",),
        baselines=False,
    )
    assert plan.check.startswith("equivalent")
    assert given == {"degrees": (2, 4), "presets": ("matrix",)}
    with pytest.raises(ValueError, match=r"degrees: 3 is not a degree .* valid: the divisors"):
        saturate_and_extract(MNIST, machine, time_budget_s=4, degrees=(3,))
    with pytest.raises(ValueError, match="no shipped rule file 'nope'"):
        saturate_and_extract(MNIST, machine, time_budget_s=4, presets=("nope",))


def test_a_candidate_is_placed_and_mapped_under_the_runtime_its_cost_carries():
    from dataclasses import replace

    from pcgopt.extract import DDP, data_parallel, iteration_cost

    plan = data_parallel(MNIST, TWO_GPUS)
    # Device memory between what ZeRO-2 and what plain data parallelism needs.
    ddp, zero = (iteration_cost(plan, TWO_GPUS, runtime=replace(DDP, zero_stage=k)) for k in (0, 2))
    capacity = (ddp.memory_per_device + zero.memory_per_device) // 2
    small = Machine(TWO_GPUS.levels, replace(TWO_GPUS.device, memory_bytes=capacity), TWO_GPUS.name)
    candidates = {
        name: (plan, iteration_cost(plan, small, runtime=replace(DDP, zero_stage=k)))
        for name, k in (("data parallel", 0), ("zero-2", 2))
    }
    _, mappings, failed = plan_module._place_and_map(
        candidates, small, "adam", plan_module._Clock.untimed(), lambda _: None
    )
    assert not failed and set(mappings) == {"data parallel", "zero-2"}
    assert candidates["zero-2"][1].runtime.zero_stage == 2
    assert candidates["zero-2"][1].feasible
    # Data parallelism fits only by accumulating gradients over micro-batches.
    assert candidates["data parallel"][1].runtime.zero_stage == 0
    assert (
        candidates["data parallel"][1].micro_batches > 1
        or not candidates["data parallel"][1].feasible
    )


def test_a_model_in_micro_batches_is_refused_with_what_to_do():
    cut = pcgopt.with_micro_batches(mnist_mlp(), 2)
    with pytest.raises(PCGError, match=r"cuts micro-batches itself .* without Pipeline and Batch"):
        saturate_and_extract(cut, Machine.preset("dgx-a100"))
    with pytest.raises(PCGError, match=r"seeds\[0\]: node 'x_pipeline'"):
        saturate_and_extract(mnist_mlp(), Machine.preset("dgx-a100"), seeds=[cut])
