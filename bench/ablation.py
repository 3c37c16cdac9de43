"""The e-graph alone against the full search, on the Unity table's setting (bench/run.py):
Unity's seven models on Summit, weak-scaled, each with the optimizer Unity trains it with.

'full search': ``saturate_and_extract(pcg, machine, time_budget_s=budget)`` with its defaults,
every candidate generator on. 'e-graph alone': the same call with ``baselines=False``: no
layer-wise searches, no baselines, no branch-parallel plan; what it returns is the e-graph's
extracted plan (or the input, if that is faster), placed and mapped. Under graph splitting the
e-graph is still seeded with the data-parallel and Megatron plans, for the layouts they hand
across the cuts (``pcgopt.extract.search.plan``: the split phase), so for split models the
e-graph is not seedless; the table says which rows split. Each call runs in its own process.

``--deterministic``: the e-graph alone with ``deterministic=True`` instead (work limits, no
time budget: what the e-graph finds when it is given the iterations its limits allow, however
fast the machine), in a section of its own.

    python bench/ablation.py [--models mlp dlrm] [--nodes 1 2 4 8] [--budget 20]
                             [--deterministic] [--no-write]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from _results import command_sentence, publish, run_child
from baselines import UNITY_MODELS

HEADING = "## The e-graph alone against the full search"
DETERMINISTIC_HEADING = "## The e-graph alone, deterministic, against the full search"

CHILD = """
import json, sys, time, warnings
from baselines import per_gpu_batch
from pcgopt import Machine, models
from pcgopt.egraph import warm_up
from pcgopt.extract import saturate_and_extract
name, nodes, budget, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
machine = Machine.preset("summit", nodes=nodes)
pcg = models.build(name, batch=per_gpu_batch(name) * machine.num_devices)
warnings.simplefilter("ignore")
warm_up(pcgs=[pcg])
optimizer = models.ZOO[name].optimizer
t0 = time.perf_counter()
plan = saturate_and_extract(
    pcg,
    machine,
    time_budget_s=budget,
    optimizer=optimizer,
    baselines=mode == "full",
    deterministic=mode == "deterministic",
)
print(json.dumps({
    "seconds": time.perf_counter() - t0,
    "total_s": plan.cost.total_s,
    "chosen": plan.stats.chosen,
    "segments": plan.stats.segments,
    "iterations": plan.stats.iterations,
    "enodes": plan.stats.num_enodes,
}))
"""


def _table(
    args: argparse.Namespace,
    mode: str,
    header: list[str],
    cells: Callable[[dict, dict, float], str],
) -> tuple[list[str], int, int]:
    """The rows of each model and node count: the full search's call and ``mode``'s, the
    second's cells from ``cells(full, alone, ratio)``; with how many rows are within 5%."""
    rows = list(header)
    within = total = 0
    for name in args.models:
        for nodes in args.nodes:
            full = run_child(CHILD, name, nodes, args.budget, "full")
            alone = run_child(CHILD, name, nodes, args.budget, mode)
            if isinstance(full, str) or isinstance(alone, str):
                rows.append(f"| {name} | {nodes} | {6 * nodes} | failed: {full} / {alone} |")
                continue
            ratio = alone["total_s"] / full["total_s"]
            total += 1
            within += ratio <= 1.05
            rows.append(
                f"| {name} | {nodes} | {6 * nodes} | {full['total_s'] * 1e3:.2f} ms | "
                f"{cells(full, alone, ratio)} | "
                f"{full['seconds']:.1f} s, {alone['seconds']:.1f} s |"
            )
            print(rows[-1], flush=True)
    return rows, within, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=UNITY_MODELS, default=list(UNITY_MODELS))
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.deterministic:
        rows, within, total = _table(
            args,
            "deterministic",
            [
                "| model | nodes | GPUs | full search | e-graph alone, deterministic | chosen | "
                "iterations | e-nodes | alone / full | search time (full, alone) |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ],
            lambda full, alone, ratio: (
                f"{alone['total_s'] * 1e3:.2f} ms | {alone['chosen']} | {alone['iterations']} | "
                f"{alone['enodes']:,} | {ratio:.2f}x"
            ),
        )
        heading = DETERMINISTIC_HEADING
        about = (
            "The e-graph alone as in the section above (`baselines=False`), with "
            "`deterministic=True`: saturation limited by iterations and e-nodes "
            "(`DETERMINISTIC_BUDGET`) instead of time, every later phase run to its end; the "
            f"full search with `time_budget_s={args.budget:g}`. 'e-nodes': of the e-graph "
            "extracted (under graph splitting, of the distinct segments')."
        )
    else:
        rows, within, total = _table(
            args,
            "alone",
            [
                "| model | nodes | GPUs | full search | chosen | e-graph alone | chosen | "
                "e-graph alone / full | graph split | search time (full, alone) |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ],
            lambda full, alone, ratio: (
                f"{full['chosen']} | {alone['total_s'] * 1e3:.2f} ms | {alone['chosen']} | "
                f"{ratio:.2f}x | "
                + (f"{alone['segments']} segments" if alone["segments"] > 1 else "no")
            ),
        )
        heading = HEADING
        about = (
            "Issue 42's ablation: on the Unity table's rows (bench/run.py's setting), the plan "
            "of the e-graph alone (`saturate_and_extract(..., baselines=False)`: no layer-wise "
            "searches, baselines or branch-parallel plan; graph splitting still seeds the "
            "data-parallel and Megatron plans for the layouts at its cuts) against the full "
            f"search, both with `time_budget_s={args.budget:g}` and rules loaded ahead. The "
            "aim: within 5% on every row."
        )
    publish(
        heading,
        [
            command_sentence(start),
            "",
            about,
            "",
            *rows,
            "",
            f"Within 5%: {within} of {total} rows.",
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
