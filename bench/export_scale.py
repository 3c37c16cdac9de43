"""Export and extraction at a million e-nodes (issue 5's export figure).

One zoo model is saturated with the shipped rules for a fixed number of iterations, the time,
e-node and memory budgets raised out of the way, until its e-graph passes a million e-nodes;
then the steps that read the whole e-graph are timed one by one: egglog's tables to Python
(:func:`pcgopt.egraph.export`, inside ``saturate``), the cost model laid over every e-node
(:func:`pcgopt.extract.enode_costs`), greedy extraction with local search
(:func:`pcgopt.extract.extract_greedy`) and the chosen e-nodes back to a validated PCG
(:meth:`EGraphData.to_pcg`). It runs in its own process, so that its peak memory is its own.

    python bench/export_scale.py                 # 12 iterations of CANDLE-Uno, 16 GB, 11 min
    python bench/export_scale.py --model mnist_mlp --iterations 6 --match-limit 1000 --no-write
"""

from __future__ import annotations

import argparse
import sys
import time

from _results import command_sentence, publish, run_child

HEADING = "## Export and extraction at a million e-nodes"

CHILD = """
import json, resource, sys, time
from pcgopt import Machine, models
from pcgopt.egraph import Budget, saturate
from pcgopt.extract import enode_costs, extract_greedy, iteration_cost
name, size, nodes, iterations, match_limit = sys.argv[1:6]
machine = Machine.preset("dgx-a100", nodes=int(nodes))
pcg = models.build(name, small=size == "small")
budget = Budget(
    iterations=int(iterations),
    enodes=50_000_000,
    seconds=3600.0,
    memory_bytes=20 * 2**30,
    match_limit=int(match_limit),
)
sat = saturate(pcg, machine, budget=budget)
t = time.perf_counter()
costs = enode_costs(sat.egraph, machine)
costs_s = time.perf_counter() - t
t = time.perf_counter()
extraction = extract_greedy(costs, time_limit_s=120.0)
greedy_s = time.perf_counter() - t
t = time.perf_counter()
plan = sat.egraph.to_pcg(extraction.choice)
to_pcg_s = time.perf_counter() - t
print(json.dumps({
    "nodes": len(pcg.nodes),
    "iterations": sat.iterations,
    "stop": sat.stop_reason.value,
    "eclasses": sat.num_eclasses,
    "enodes": sat.num_enodes,
    "saturate_s": sat.seconds,
    "export_s": sat.export_seconds,
    "costs_s": costs_s,
    "greedy_s": greedy_s,
    "to_pcg_s": to_pcg_s,
    "extraction": repr(extraction),
    "plan_ms": iteration_cost(plan, machine).total_s * 1e3,
    "input_ms": iteration_cost(pcg, machine).total_s * 1e3,
    "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="candle_uno")
    parser.add_argument("--size", choices=["small", "full"], default="full")
    parser.add_argument("--nodes", type=int, default=1, help="DGX-A100 nodes (8 GPUs each)")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument(
        "--match-limit", type=int, default=3_000, help="back-off scheduler's (Budget default 1,000)"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    r = run_child(CHILD, args.model, args.size, args.nodes, args.iterations, args.match_limit)
    if isinstance(r, str):
        sys.exit(f"the run failed: {r}")
    rows = [
        "| model | devices | PCG nodes | iterations | e-classes | e-nodes | saturate | export | "
        "costs | greedy extraction | to PCG | peak RSS | plan / input (cost model) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {args.model} ({args.size}) | {8 * args.nodes} | {r['nodes']} | {r['iterations']} "
        f"| {r['eclasses']:,} | {r['enodes']:,} | {r['saturate_s']:.1f} s "
        f"| {r['export_s']:.1f} s | {r['costs_s']:.1f} s | {r['greedy_s']:.1f} s "
        f"| {r['to_pcg_s']:.2f} s | {r['peak_rss'] / 2**30:.1f} GiB "
        f"| {r['plan_ms']:.3f} / {r['input_ms']:.3f} ms |",
    ]
    publish(
        HEADING,
        [
            command_sentence(start),
            "",
            "Saturation for a fixed number of iterations (time, e-node and memory budgets out of "
            f"the way; back-off match limit {args.match_limit:,}), then each whole-e-graph step "
            "timed on its own: 'export' is egglog's tables to Python, 'costs' the cost model "
            "over every e-node, 'greedy extraction' the DAG-aware greedy extractor with its "
            "local search (time limit 120 s), 'to PCG' the chosen e-nodes back to a validated "
            "PCG. Peak RSS is the whole process.",
            "",
            *rows,
            "",
            f"Extraction: {r['extraction']}.",
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
