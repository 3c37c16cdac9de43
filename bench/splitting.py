"""Graph splitting (Unity section 5.3): how the search's work grows with the model's depth,
with and without splitting.

BERT-Large with 1 to 24 layers on 64 A100s (eight DGX-A100 nodes), seeded with the
data-parallel and Megatron plans. Both ways explore the same number of saturation iterations
(per segment when split), with the time and node budgets out of the way, so the figures compare
the work each needs, not what a budget cut off: wall time of saturation and extraction, e-nodes,
and the extracted plan's predicted iteration time (``iteration_cost``, default placement). Each
run is a process of its own, so its peak memory is its own.

    python bench/splitting.py                      # updates bench/RESULTS.md
    python bench/splitting.py --layers 2 4 --no-write
"""

from __future__ import annotations

import argparse
import time

from _results import command_sentence, publish, run_child

HEADING = "## Graph splitting"

CHILD = """
import json, resource, sys, time, warnings
from pcgopt import Machine, models
from pcgopt.egraph import Budget, saturate, warm_up
from pcgopt.extract import data_parallel, iteration_cost, megatron
from pcgopt.extract.search.extraction import enode_costs, extract_greedy
from pcgopt.extract.search.splitting import split_search
layers, iterations, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
machine = Machine.preset("dgx-a100", nodes=8, devices_per_node=8)
pcg = models.build("bert_large", layers=layers, batch=4 * machine.num_devices)
seeds = [data_parallel(pcg, machine), megatron(pcg, machine)]
budget = Budget(iterations=iterations, enodes=5_000_000, seconds=3000, memory_bytes=16 * 2**30)
warnings.simplefilter("ignore")
warm_up()
t0 = time.perf_counter()
if how == "whole":
    sat = saturate(pcg, machine, budget=budget, seeds=seeds)
    t1 = time.perf_counter()
    found = extract_greedy(enode_costs(sat.egraph, machine), time_limit_s=600)
    plan = sat.egraph.to_pcg(found.choice)
    enodes, stop, egraphs, segments = sat.num_enodes, sat.stop_reason.value, 1, 1
else:
    search = split_search(
        pcg, machine, seeds=seeds, segment_budget=budget, extract_s=600, min_ops=24
    )
    if search is None:  # too short to split
        print(json.dumps({"unsplit": True}))
        sys.exit()
    t1 = t0 + search.saturate_seconds
    plan = search.pcg
    enodes, stop = search.num_enodes, search.stop_reason
    egraphs, segments = search.saturations, len(search.segments)
seconds = time.perf_counter() - t0
print(json.dumps({
    "pcg_nodes": len(pcg.nodes),
    "saturate_s": t1 - t0,
    "seconds": seconds,
    "enodes": enodes,
    "stop": stop,
    "egraphs": egraphs,
    "segments": segments,
    "plan_ms": iteration_cost(plan, machine).total_s * 1e3,
    "dp_ms": iteration_cost(seeds[0], machine).total_s * 1e3,
    "megatron_ms": iteration_cost(seeds[1], machine).total_s * 1e3,
    "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", nargs="+", type=int, default=[1, 2, 4, 8, 16, 24])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = [
        "| layers | PCG nodes | search | segments | distinct e-graphs | e-nodes | saturation stop "
        "| saturation | saturation + extraction | peak RSS | plan | data parallel | Megatron |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    start = time.perf_counter()
    for layers in args.layers:
        for how in ("whole", "split"):
            r = run_child(CHILD, layers, args.iterations, how)
            if isinstance(r, str):
                rows.append(f"| {layers} | | {how} | failed: {r} |")
                print(rows[-1], flush=True)
                continue
            if r.get("unsplit"):
                rows.append(f"| {layers} | | {how} | no cut leaves two segments of 24 operators |")
                continue
            rows.append(
                f"| {layers} | {r['pcg_nodes']:,} | {how} | {r['segments']} | {r['egraphs']} | "
                f"{r['enodes']:,} | {r['stop']} | {r['saturate_s']:.1f} s | {r['seconds']:.1f} s "
                f"| {r['peak_rss'] / 2**20:.0f} MiB | {r['plan_ms']:.2f} ms | "
                f"{r['dp_ms']:.2f} ms | {r['megatron_ms']:.2f} ms |"
            )
            print(rows[-1], flush=True)
    publish(
        HEADING,
        [
            command_sentence(start),
            "",
            f"BERT-Large cut to the given number of layers, batch 256, on 64 A100s (eight "
            f"DGX-A100 nodes); seeds: the data-parallel and Megatron plans. {args.iterations} "
            "saturation iterations for the whole graph and for each distinct segment (time and "
            "node budgets out of the way), then greedy extraction (per segment and layout "
            "handed on when split, stitched by the DP over the cuts). 'plan' is the extracted "
            "plan's predicted iteration time (`iteration_cost`, default placement).",
            "",
            *rows,
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
