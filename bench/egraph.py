"""Saturation of the zoo models with the shipped rules (issue 5's figures).

For each zoo model (the small variant and full size) on 8 and 64 devices: iterations, e-classes,
e-nodes, saturation and export time, peak memory, why saturation stopped, and whether the
e-graph holds the data-parallel and Megatron-style baselines' plans and Unity's Figure 2b plan
on the feed-forward blocks (:func:`pcgopt.extract.unity_figure_2b`; n/a: the model has none).
Each configuration runs in its own process, so that its peak memory is its own (the rules'
one-off load included). The rules are loaded (``warm_up``) before the call, which the time
budget bounds: the "call" column is the whole ``saturate`` call.

    python bench/egraph.py                               # every model, updates bench/RESULTS.md
    python bench/egraph.py --models mnist_mlp bert_large --devices 64 --no-write
    python bench/egraph.py --split --models bert_large   # by segments, its own section
    python bench/egraph.py --split --levels --models bert_large   # whole levels, two degrees

``--split`` saturates with :func:`pcgopt.egraph.saturate_split`: the distinct segments once,
joined into the whole model's e-graph (the e-node counts are the joined e-graph's; the join's
time is in the export column). ``--levels`` restricts the degrees to those of whole levels of
the machine (:meth:`pcgopt.Machine.level_degrees`) and adds the opt-in ``layouts`` rules
(layouts of two degrees), in a section of its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence

from _results import write_section

from pcgopt import Machine, models
from pcgopt.egraph import Budget, saturate, saturate_split, shipped_presets, warm_up
from pcgopt.extract.strategies.baselines import data_parallel, megatron, unity_figure_2b

HEADING = "## E-graph saturation"
SPLIT_HEADING = "## Split e-graph saturation"
LEVELS_HEADING = "## Split e-graph saturation on whole levels, with layouts of two degrees"
MACHINES = {8: ("dgx-a100", 1, 8), 64: ("dgx-a100", 4, None)}


def machine_for(devices: int) -> Machine:
    name, nodes, per_node = MACHINES[devices]
    return Machine.preset(name, nodes=nodes, devices_per_node=per_node)


def one(
    model: str, small: bool, devices: int, seconds: float, split: bool = False, levels: bool = False
) -> dict:
    machine = machine_for(devices)
    pcg = models.build(model, small=small)
    options: dict = {}
    if levels:
        options = {
            "degrees": machine.level_degrees(),
            "presets": (*shipped_presets([pcg]), "layouts"),
        }
    # Once per process, outside the budget (as documented).
    load_s = warm_up(pcgs=[pcg], presets=options.get("presets"))
    t0 = time.perf_counter()
    sat = (saturate_split if split else saturate)(
        pcg, machine, budget=Budget(seconds=seconds), **options
    )
    total = time.perf_counter() - t0
    contains = {}
    plans = (
        ("data parallel", data_parallel),
        ("megatron", megatron),
        ("figure 2b", unity_figure_2b),
    )
    for label, baseline in plans:
        try:
            plan = baseline(pcg, machine)
        except Exception as e:  # a baseline that does not apply to this model
            contains[label] = f"n/a ({type(e).__name__})"
            continue
        held = sat.contains(plan)
        missing = None if held else sat.egraph.first_missing(plan)
        contains[label] = f"False (from `{missing}`)" if missing else held
    return {
        "model": model,
        "size": "small" if small else "full",
        "devices": devices,
        "nodes": len(pcg),
        "iterations": sat.iterations,
        "eclasses": sat.num_eclasses,
        "enodes": sat.num_enodes,
        "saturate_s": sat.seconds,
        "export_s": sat.export_seconds,
        "call_s": total,
        "load_s": load_s,
        "peak_rss": sat.peak_rss_bytes,
        "stop": sat.stop_reason.value,
        "contains": contains,
    }


def run(
    model_names: Sequence[str],
    devices: Sequence[int],
    seconds: float,
    split: bool = False,
    levels: bool = False,
) -> list[dict]:
    out = []
    for name in model_names:
        for small in (True, False):
            for d in devices:
                cmd = [sys.executable, __file__, "--one", name, str(int(small)), str(d)]
                cmd += ["--seconds", str(seconds)] + (["--split"] if split else [])
                cmd += ["--levels"] if levels else []
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode:
                    row = {
                        "model": name,
                        "size": "small" if small else "full",
                        "devices": d,
                        "error": proc.stderr.strip().splitlines()[-1:],
                    }
                else:
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                print(json.dumps(row), file=sys.stderr, flush=True)
                out.append(row)
    return out


def table(rows: Sequence[dict]) -> list[str]:
    lines = [
        "| model | size | devices | PCG nodes | iterations | e-classes | e-nodes | saturate | "
        "export | call | peak RSS | stopped | has DP plan | has Megatron plan "
        "| has Figure 2b plan |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['size']} | {r['devices']} | error: {r['error']} |")
            continue
        c = r["contains"]
        lines.append(
            f"| {r['model']} | {r['size']} | {r['devices']} | {r['nodes']} | {r['iterations']} "
            f"| {r['eclasses']:,} | {r['enodes']:,} | {r['saturate_s']:.1f} s "
            f"| {r['export_s']:.1f} s | {r['call_s']:.1f} s | {r['peak_rss'] / 2**20:.0f} MiB "
            f"| {r['stop']} "
            f"| {c['data parallel']} | {c['megatron']} | {c.get('figure 2b', 'not run')} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(models.ZOO))
    parser.add_argument("--devices", nargs="+", type=int, default=[8, 64], choices=[8, 64])
    parser.add_argument("--seconds", type=float, default=30.0, help="saturation time budget")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--split", action="store_true", help="saturate by segments (saturate_split)"
    )
    parser.add_argument(
        "--levels",
        action="store_true",
        help="degrees of whole levels of the machine only, with the layouts rules",
    )
    parser.add_argument(
        "--one", nargs=3, metavar=("MODEL", "SMALL", "DEVICES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.one:
        model, small, devices = args.one
        row = one(model, small == "1", int(devices), args.seconds, args.split, args.levels)
        print(json.dumps(row))
        return
    start = time.perf_counter()
    rows = run(args.models, args.devices, args.seconds, args.split, args.levels)
    lines = table(rows)
    print("\n".join(lines))
    if args.no_write:
        return
    command = "python bench/egraph.py " + " ".join(sys.argv[1:] if argv is None else argv)
    heading = LEVELS_HEADING if args.levels else SPLIT_HEADING if args.split else HEADING
    how = (
        "`saturate_split`: the distinct segments (Unity's graph splitting, at least 24 "
        "computing operators each) saturated together, every cut handed on unsplit and in "
        "each batch split and copy count the machine allows, then joined into the whole "
        "model's e-graph (e-classes and e-nodes are the joined e-graph's; the join is in the "
        "export time). "
        if args.split
        else ""
    )
    if args.levels:
        how += (
            "Degrees of whole levels of the machine only (`Machine.level_degrees()`: 8 on "
            "one node of 8 GPUs; 4, 16 and 64 on four nodes of 16), and the opt-in `layouts` "
            "rules (Partition and Replicate of two degrees) with the shipped ones. "
        )
    section = "\n".join(
        [
            heading,
            "",
            f"Command: `{command.strip()}` ({time.perf_counter() - start:.0f} s on the development "
            f"machine, 2 cores). {how}Shipped rules (both directions, guarded), default `Budget` "
            f"(30 iterations, 200,000 e-nodes, {args.seconds:.0f} s, 4 GiB; back-off match limit "
            "1,000, the parallel and cleanup rules' 1,000 times the square root of a third of "
            "the degrees, at least 1,000). 8 devices: one DGX-A100 node cut to 8 GPUs; 64: four "
            "DGX-A100 nodes. Peak RSS "
            "is the whole process, the rules' one-off load (about 4 s, 400 MiB) included, and "
            "its speculative children beside it (pages they share counted once). 'call': the "
            "`saturate` call, after the rules' load (`warm_up`); the time budget bounds it. "
            "'has ... plan': the baseline's PCG is in the e-graph node for node; if not, the "
            "first of its nodes that the e-graph does not hold (`EGraphData.first_missing`).",
            "",
            *lines,
            "",
            "Notes: written by hand below each run (a rerun replaces them).",
            "",
        ]
    )
    write_section(heading, section)


if __name__ == "__main__":
    main()
