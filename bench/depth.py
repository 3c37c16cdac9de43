"""Search time over depth: ``saturate_and_extract`` on BERT-Large cut or grown to 6, 12, 24 and
48 layers on 64 GPUs (eight DGX-A100 nodes of 8, batch weak-scaled), each call in its own
process so that its peak memory is its own.

Two calls per depth: ``deterministic=True`` (work limits, no wall-time budget: its time is
the work the search does, so its growth over depth is the search's), and the default 60 s
budget (what a user gets). Graph splitting saturates and extracts the distinct segments once,
so those phases should not grow with the layers; the table's phases show which do.

    python bench/depth.py [--layers 6 12 24 48] [--no-write]
"""

from __future__ import annotations

import argparse
import time

from _results import check_kind, command_sentence, publish, run_child

HEADING = "## Search time over depth"

CHILD = """
import json, resource, sys, time, warnings
from pcgopt import Machine, models
from pcgopt.egraph import warm_up
from pcgopt.extract import saturate_and_extract
layers, mode = int(sys.argv[1]), sys.argv[2]
machine = Machine.preset("dgx-a100", nodes=8, devices_per_node=8)
pcg = models.build("bert_large", layers=layers, batch=4 * machine.num_devices)
warnings.simplefilter("ignore")
warm_up(pcgs=[pcg])
t0 = time.perf_counter()
if mode == "deterministic":
    plan = saturate_and_extract(pcg, machine, deterministic=True)
else:
    plan = saturate_and_extract(pcg, machine, time_budget_s=float(mode))
seconds = time.perf_counter() - t0
print(json.dumps({
    "nodes": len(pcg.nodes),
    "seconds": seconds,
    "phases": plan.stats.phase_seconds,
    "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "chosen": plan.stats.chosen,
    "total_s": plan.cost.total_s,
    "enodes": plan.stats.num_enodes,
    "iterations": plan.stats.iterations,
    "segments": plan.stats.segments,
    "extraction": plan.stats.extraction,
    "check": plan.check,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 12, 24, 48])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = [
        "| layers | PCG nodes | search | wall time | peak RSS | phases (s) | segments | "
        "saturation | e-nodes | chosen | predicted iteration | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    start = time.perf_counter()
    for layers in args.layers:
        for mode in ("deterministic", "60"):
            r = run_child(CHILD, layers, mode)
            label = mode if mode == "deterministic" else f"{mode} s budget"
            if isinstance(r, str):
                rows.append(f"| {layers} | | {label} | failed: {r} |")
                continue
            phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
            distinct = r["extraction"].split(" distinct")[0].split(", ")[-1]
            rows.append(
                f"| {layers} | {r['nodes']:,} | {label} | {r['seconds']:.1f} s | "
                f"{r['peak_rss'] / 2**20:.0f} MiB | {phases} | {r['segments']} ({distinct} "
                f"distinct) | {r['iterations']} iteration(s) | {r['enodes']:,} | {r['chosen']} | "
                f"{r['total_s'] * 1e3:.2f} ms | {check_kind(r['check'])} |"
            )
            print(rows[-1], flush=True)
    publish(
        HEADING,
        [
            command_sentence(start),
            "",
            "BERT-Large (hidden 1024, 16 heads, sequence 512) with the given number of layers on "
            "64 A100s (`Machine.preset('dgx-a100', nodes=8, devices_per_node=8)`), batch 256 "
            "(4 per GPU). 'deterministic': `saturate_and_extract(pcg, machine, "
            "deterministic=True)`, whose work limits do not depend on the clock; '60 s budget': "
            "the default `time_budget_s=60`. Rules loaded ahead (`warm_up`). 'e-nodes': of the "
            "distinct segments' e-graph (graph splitting saturates each distinct segment once). "
            "'check': how the plan was verified equivalent to the model.",
            "",
            *rows,
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
