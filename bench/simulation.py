"""The simulated iteration (issue 45): what it costs to simulate, what it changes.

Three tables:

1. Simulation cost: ``iteration_cost`` per call on the data-parallel and Megatron plans of
   full BERT-Large and Inception-v3 (Summit, 4 and 32 nodes), and the part of it spent
   building and running the simulation; the simulated and the additive time of each plan.
2. Search time with and without it: ``saturate_and_extract(..., deterministic=True)`` on
   BERT-Large and Inception-v3 on 2 Summit nodes with ``runtime=DDP`` and ``runtime=ADDITIVE``,
   each in its own process.
3. The additive estimates against the simulation: for the data-parallel, FSDP, Megatron (with
   and without sequence parallelism) and sequential plans of Unity's seven models on 1, 2, 4
   and 8 Summit nodes, how often the mapping DP (which prices units additively) runs branches
   at once, how often that mapping, simulated on its devices, beats the simulated in-sequence
   iteration (the DP's choice is the simulation's best of the two), how far the DP's
   estimate is from that simulation, and how often the additive model picks the same baseline
   as the simulation.

    python bench/simulation.py [--no-write]
"""

from __future__ import annotations

import argparse
import inspect
import time

from _results import command_sentence, publish, run_child

from pcgopt import Machine, models
from pcgopt.extract import ADDITIVE, BaselineError, CostError, iteration_cost
from pcgopt.extract.costmodel import cost as cost_module
from pcgopt.extract.costmodel import simulate as simulate_module
from pcgopt.extract.search.mapping import map_machine
from pcgopt.extract.strategies.baselines import (
    data_parallel,
    fsdp,
    megatron,
    megatron_sp,
    sequential,
)

HEADING = "## The simulated iteration"
UNITY_MODELS = ("mlp", "bert_large", "dlrm", "xdl", "candle_uno", "resnext50", "inception_v3")

SEARCH_CHILD = """
import inspect, json, sys, time, warnings
from pcgopt import Machine, models
from pcgopt.egraph import warm_up
from pcgopt.extract import ADDITIVE, DDP, saturate_and_extract
name, runtime = sys.argv[1], {"ddp": DDP, "additive": ADDITIVE}[sys.argv[2]]
machine = Machine.preset("summit", nodes=2)
per_gpu = inspect.signature(models.ZOO[name].builder).parameters["batch"].default
pcg = models.build(name, batch=per_gpu * machine.num_devices)
warnings.simplefilter("ignore")
warm_up(pcgs=[pcg])
optimizer = models.ZOO[name].optimizer
t0 = time.perf_counter()
plan = saturate_and_extract(
    pcg, machine, deterministic=True, optimizer=optimizer, runtime=runtime, check=False
)
print(json.dumps({
    "seconds": time.perf_counter() - t0,
    "chosen": plan.stats.chosen,
    "total_s": plan.cost.total_s,
    "additive_s": plan.cost.additive_s,
}))
"""


def weak_scaled(name: str, machine: Machine):
    per_gpu = inspect.signature(models.ZOO[name].builder).parameters["batch"].default
    return models.build(name, batch=per_gpu * machine.num_devices)


def per_call(plan, machine, optimizer: str, **options) -> tuple[float, float]:
    """Seconds per ``iteration_cost`` call, and of them the simulation's (building its task
    list, ``_Iteration.simulation``, and running it, ``Simulation.run``)."""
    iteration_cost(plan, machine, optimizer=optimizer, **options)  # warm the memo tables
    inside = [0.0]
    patched = [(cost_module._Iteration, "simulation"), (simulate_module.Simulation, "run")]
    originals = [getattr(owner, attr) for owner, attr in patched]

    def timing(original):
        def timed(self, *args, **kwargs):
            t = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - t

        return timed

    repeats = 10
    for (owner, attr), original in zip(patched, originals, strict=True):
        setattr(owner, attr, timing(original))
    try:
        t0 = time.perf_counter()
        for _ in range(repeats):
            iteration_cost(plan, machine, optimizer=optimizer, **options)
        total = time.perf_counter() - t0
    finally:
        for (owner, attr), original in zip(patched, originals, strict=True):
            setattr(owner, attr, original)
    return total / repeats, inside[0] / repeats


def simulation_cost() -> list[str]:
    rows = [
        "| model | nodes | plan | PCG nodes | simulated | additive | iteration_cost per call | "
        "of which the simulation | tasks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, nodes in (("bert_large", 4), ("inception_v3", 32)):
        machine = Machine.preset("summit", nodes=nodes)
        pcg = weak_scaled(name, machine)
        optimizer = models.ZOO[name].optimizer
        for label, make in (("data parallel", data_parallel), ("megatron", megatron)):
            plan = make(pcg, machine)
            cost = iteration_cost(plan, machine, optimizer=optimizer)
            plain = iteration_cost(plan, machine, optimizer=optimizer, runtime=ADDITIVE)
            seconds, simulating = per_call(plan, machine, optimizer)
            rows.append(
                f"| {name} | {nodes} | {label} | {len(plan.nodes):,} | "
                f"{cost.total_s * 1e3:.2f} ms | {plain.total_s * 1e3:.2f} ms | "
                f"{seconds * 1e3:.1f} ms | {simulating * 1e3:.1f} ms | "
                f"{len(cost.timeline().tasks):,} |"
            )
            print(rows[-1], flush=True)
    return rows


def search_time() -> list[str]:
    rows = [
        "| model (2 Summit nodes) | runtime | search time | chosen | its time | "
        "its time, all in sequence |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("bert_large", "inception_v3"):
        for runtime in ("ddp", "additive"):
            r = run_child(SEARCH_CHILD, name, runtime)
            if isinstance(r, str):
                rows.append(f"| {name} | {runtime} | failed: {r} | | | |")
                continue
            rows.append(
                f"| {name} | {runtime} | {r['seconds']:.1f} s | {r['chosen']} | "
                f"{r['total_s'] * 1e3:.2f} ms | {r['additive_s'] * 1e3:.2f} ms |"
            )
            print(rows[-1], flush=True)
    return rows


def mapping_against_simulation() -> tuple[list[str], str]:
    rows = [
        "| model | nodes | plan | simulated in sequence | mapping DP's estimate (branches at "
        "once) | simulated on the mapping | kept |",
        "|---|---|---|---|---|---|---|",
    ]
    plans = divided = replaced = rows_compared = same_best = 0
    disagree = []
    errors: list[float] = []
    for name in UNITY_MODELS:
        optimizer = models.ZOO[name].optimizer
        for nodes in (1, 2, 4, 8):
            machine = Machine.preset("summit", nodes=nodes)
            pcg = weak_scaled(name, machine)
            ranked = {}
            for label, make in (
                ("data parallel", data_parallel),
                ("fsdp", fsdp),
                ("megatron", megatron),
                ("megatron-sp", megatron_sp),
                ("sequential", sequential),
            ):
                try:
                    plan = make(pcg, machine)
                    cost = iteration_cost(plan, machine, optimizer=optimizer)
                except (BaselineError, CostError):
                    continue
                # Which baseline each model would pick (feasible first).
                ranked[label] = (
                    (not cost.feasible, cost.additive_s),
                    (not cost.feasible, cost.total_s),
                )
                plans += 1
                mapping = map_machine(plan, machine, cost=cost)
                if not mapping.divided_splits:
                    continue
                divided += 1
                mapped = mapping.cost(cost)
                errors.append(abs(mapping.time_s - mapped.total_s) / mapped.total_s)
                sequence_wins = (not cost.feasible, cost.total_s) <= (
                    not mapped.feasible,
                    mapped.total_s,
                )
                replaced += sequence_wins
                rows.append(
                    f"| {name} | {nodes} | {label} | {cost.total_s * 1e3:.2f} ms | "
                    f"{mapping.time_s * 1e3:.2f} ms | {mapped.total_s * 1e3:.2f} ms | "
                    f"{'in sequence' if sequence_wins else 'branches at once'} |"
                )
                print(rows[-1], flush=True)
            if ranked:
                rows_compared += 1
                by_additive = min(ranked, key=lambda k: ranked[k][0])
                by_simulation = min(ranked, key=lambda k: ranked[k][1])
                same_best += by_additive == by_simulation
                if by_additive != by_simulation:
                    disagree.append(f"{name} on {nodes}: {by_additive} -> {by_simulation}")
    mean = 100 * sum(errors) / len(errors) if errors else 0.0
    worst = 100 * max(errors, default=0.0)
    summary = (
        f"Of {plans} baseline plans, the mapping DP runs branches at once in {divided}. "
        f"Simulated on the mapping's devices, running them at once beats the simulated "
        f"in-sequence iteration in {divided - replaced} of those {divided} (the DP's choice is "
        f"the simulation's best of the two); in {replaced} the in-sequence plan is faster and "
        f"replaces it. The DP's estimate differs from the mapped simulation by {mean:.0f}% on "
        f"average (at most {worst:.0f}%). "
        f"The additive model picks the baseline the simulation picks (of data parallel, FSDP, "
        f"Megatron, Megatron-SP and sequential, each in sequence) on {same_best} of "
        f"{rows_compared} rows"
        + (f"; where not (additive's -> simulation's): {'; '.join(disagree)}." if disagree else ".")
    )
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    cost_rows = simulation_cost()
    search_rows = search_time()
    mapping_rows, summary = mapping_against_simulation()
    publish(
        HEADING,
        [
            command_sentence(start),
            "",
            "Full-size models, weak scaling (Unity's per-GPU batch), the optimizer Unity trains "
            "each with. 'simulated': `iteration_cost` with its default runtime, PyTorch DDP's "
            "(collectives beside computation, gradients all-reduced in 25 MiB buckets as the "
            "backward produces them); 'additive': `runtime=ADDITIVE`, everything in sequence, "
            "each gradient alone (the model before issue 45). Per call: the mean of 10 calls "
            "after one that fills the memo tables, and of it the time in "
            "`_Iteration.simulation` and `Simulation.run` (building the task list and running "
            "it); 'tasks': the simulated timeline's.",
            "",
            *cost_rows,
            "",
            "Search time, `saturate_and_extract(pcg, machine, deterministic=True, check=False)`, "
            "rules loaded ahead, each in its own process:",
            "",
            *search_rows,
            "",
            "The machine-mapping DP prices each unit at its additive cost. A mapping that runs "
            "branches at once is then simulated on its devices (every node's tasks on its "
            "block, each device's streams apart, tensors moved between blocks over the link "
            "they cross: `CostBreakdown.mapped_timeline`); when the simulated iteration of the "
            "plan run in sequence is at least as fast, the plan keeps the in-sequence mapping "
            "(`extract/search/plan.py`, `mapped_cost`). " + summary,
            "",
            *mapping_rows,
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
