"""egglog's fixed cost per saturation with the shipped rules, and what saturating together saves.

Every :func:`pcgopt.egraph.saturate` pushes the e-graph that holds the rules (a copy), loads
the PCG, iterates and pops; the copy, the first iteration after it and the pop cost about the
same whatever the PCG's size. This bench times those steps on the segments graph splitting cuts
Inception-v3 into (Summit, 8 nodes), then saturates the distinct segments one by one and
together (:func:`pcgopt.egraph.saturate_together`) for the same two iterations.

    python bench/egglog_overhead.py            # updates bench/RESULTS.md
    python bench/egglog_overhead.py --no-write
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import statistics
import time

from _results import publish

from pcgopt import Machine, models
from pcgopt.egraph import Budget, saturate, saturate_together, warm_up
from pcgopt.egraph.translate import legal_degrees
from pcgopt.extract.search.splitting import segment_pcg, split_segments

HEADING = "## egglog's fixed cost per saturation"
MODEL, NODES, ITERATIONS, REPEATS = "inception_v3", 8, 2, 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    saturation = importlib.import_module("pcgopt.egraph.saturate")
    machine = Machine.preset("summit", nodes=NODES)
    per_gpu = inspect.signature(models.ZOO[MODEL].builder).parameters["batch"].default
    pcg = models.build(MODEL, batch=per_gpu * machine.num_devices)
    load_s = warm_up(pcgs=[pcg])
    # Segments named by position, so that segments equal up to names are equal (as
    # split_search does).
    segments = [segment_pcg(pcg, s) for s in split_segments(pcg)]
    distinct = list(
        dict.fromkeys(p.renamed({n.name: f"v{i}" for i, n in enumerate(p.nodes)}) for p in segments)
    )
    base = saturation._shipped_base(saturation.shipped_presets([pcg]))
    eg = base.egraph

    def timed(program: str) -> float:
        start = time.perf_counter()
        eg.parse_and_run_program(program)
        return time.perf_counter() - start

    # The steps of one saturation, on the smallest distinct segment, REPEATS times.
    small = min(distinct, key=lambda p: len(p.nodes))
    setup = "\n".join(
        [
            *(f"(legal {d})" for d in legal_degrees(machine.num_devices)),
            f"(device_budget {machine.num_devices})",
            "(let-scheduler $bo (back-off :match-limit 1000 :ban-length 5))",
        ]
    )
    steps: dict[str, list[float]] = {}
    for _ in range(REPEATS):
        for name, program in (
            ("push (copy of the rules' e-graph)", "(push)"),
            ("load the PCG", setup + "\n" + saturation.pcg_program(base.lang, small)),
            ("first iteration", saturation._SCHEDULE),
            ("second iteration", saturation._SCHEDULE),
            ("pop", "(pop)"),
        ):
            steps.setdefault(name, []).append(timed(program))

    budget = Budget(iterations=ITERATIONS, seconds=600)
    start = time.perf_counter()
    for p in distinct:
        saturate(p, machine, budget=budget)
    alone_s = time.perf_counter() - start
    start = time.perf_counter()
    saturate_together(distinct, machine, budget=budget)
    together_s = time.perf_counter() - start

    command = "python bench/egglog_overhead.py"
    rows = [
        "| step | median | min | max |",
        "|---|---|---|---|",
        *(
            f"| {name} | {statistics.median(v):.3f} s | {min(v):.3f} s | {max(v):.3f} s |"
            for name, v in steps.items()
        ),
    ]
    publish(
        HEADING,
        [
            f"Command: `{command}` (development machine, 2 cores).",
            "",
            f"Loading the shipped rules: {load_s:.1f} s (once per process). The steps of one "
            f"saturation of the smallest of the {len(distinct)} distinct segments graph "
            f"splitting cuts {MODEL} into (Summit, {NODES} nodes; {len(small.nodes)} PCG "
            f"nodes), {REPEATS} times:",
            "",
            *rows,
            "",
            f"The {len(distinct)} distinct segments ({sum(len(p.nodes) for p in distinct)} PCG "
            f"nodes), {ITERATIONS} iterations each (wall time, export included): one "
            f"`saturate` each {alone_s:.2f} s, one `saturate_together` {together_s:.2f} s.",
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
