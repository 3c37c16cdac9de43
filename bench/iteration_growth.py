"""Saturation's first iterations, measured: e-nodes loaded, after each of three iterations, and
each iteration's seconds, with the shipped rules and the data-parallel and Megatron seeds that
``saturate_and_extract`` also loads (graph splitting's distinct segments saturated together
where the model has cuts, as ``saturate_and_extract`` does). The constants saturation predicts
its next iteration with (``pcgopt.egraph.saturate``: ``SECOND_ITERATION_GROWTH`` and the
constants beside it) are fitted to these figures.

    python bench/iteration_growth.py [--only bert_large@dgx-a100:4 ...] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from itertools import pairwise

from _results import command_sentence, publish

from pcgopt.egraph import Budget, saturate, warm_up
from pcgopt.egraph.saturate import (
    ITERATION_SECONDS_PER_ENODE,
    SECOND_ITERATION_ENODES_PER_LOADED,
    SECOND_ITERATION_GROWTH,
    SECOND_ITERATION_MIN_ADDED,
)
from pcgopt.egraph.split import saturate_split
from pcgopt.extract import data_parallel, megatron
from pcgopt.extract.search.plan import machine_from_spec
from pcgopt.models import build
from pcgopt.segments import MIN_SEGMENT_OPS, split_segments

HEADING = "## Saturation's first iterations"

CASES = (
    ("bert_large", "dgx-a100:4"),
    ("bert_large", "summit:2"),
    ("inception_v3", "summit:4"),
    ("resnext50", "summit:2"),
    ("transformer", "dgx-a100:1"),
    ("mlp", "summit:2"),
    ("dlrm", "summit:2"),
    ("candle_uno", "summit:2"),
    ("xdl", "summit:2"),
)


def predicted_second(loaded: int, first: int) -> float:
    """The e-nodes saturation predicts after the second iteration."""
    return SECOND_ITERATION_GROWTH * first + max(
        SECOND_ITERATION_ENODES_PER_LOADED * loaded, SECOND_ITERATION_MIN_ADDED
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="MODEL@MACHINE", help="e.g. mlp@summit:2")
    parser.add_argument(
        "--algebra-from",
        type=int,
        default=None,
        help="the first iteration the algebraic rules run in (default: saturation's own)",
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only is None or "@".join(c) in args.only]
    warnings.simplefilter("ignore")
    rows = [
        "| model | machine | search | loaded | after 1 | after 2 | after 3 | 1st | 2nd | 3rd | "
        "2nd: us per e-node | 2nd predicted e-nodes | predicted / measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    start = time.perf_counter()
    for name, spec in cases:
        pcg, machine = build(name), machine_from_spec(spec)
        seeds = []
        for make in (data_parallel, megatron):
            with contextlib.suppress(Exception):
                seeds.append(make(pcg, machine))
        warm_up(pcgs=[pcg])
        budget = Budget(
            iterations=3,
            enodes=10**7,
            seconds=1e9,
            memory_bytes=16 * 2**30,
            algebra_from=args.algebra_from,
        )
        split = len(split_segments(pcg, MIN_SEGMENT_OPS)) >= 2
        if split:
            sat = saturate_split(pcg, machine, budget=budget, seeds=seeds)
        else:
            sat = saturate(pcg, machine, budget=budget, seeds=seeds)
        history = sat.history
        loaded = sat.loaded_enodes
        nodes = [h.enodes for h in history]
        # Each iteration's seconds (the history's are from the call's start).
        seconds = [b - a for a, b in pairwise([0.0, *(h.seconds for h in history)])]
        second_rate = seconds[1] / nodes[1] * 1e6 if len(nodes) > 1 else float("nan")
        predicted = predicted_second(loaded, nodes[0])
        ratio = predicted / nodes[1] if len(nodes) > 1 else float("nan")
        cells = [f"{n:,}" for n in nodes] + [""] * (3 - len(nodes))
        times = [f"{s:.2f} s" for s in seconds] + [""] * (3 - len(seconds))
        rows.append(
            f"| {name} | {spec} | {'segments together' if split else 'whole'} | {loaded:,} | "
            f"{' | '.join(cells)} | {' | '.join(times)} | {second_rate:.0f} | "
            f"{predicted:,.0f} | {ratio:.2f} |"
        )
        print(rows[-1], flush=True)
    publish(
        HEADING,
        [
            command_sentence(start),
            "",
            "Full-size models (batch as built), the shipped rules, the data-parallel and "
            "Megatron seeds, `Budget(iterations=3)` with no other limit. 'loaded': e-nodes "
            "before the first iteration (the PCGs and their seeds); 'after k': after the k-th "
            "iteration; '1st' includes loading the PCGs and egglog's fixed cost of a run. "
            "'2nd: us per e-node': the second iteration's seconds per e-node it left. The "
            f"prediction of the second iteration: {SECOND_ITERATION_GROWTH:g} x 'after 1' plus "
            f"max({SECOND_ITERATION_ENODES_PER_LOADED} x 'loaded', "
            f"{SECOND_ITERATION_MIN_ADDED:,}), taking {ITERATION_SECONDS_PER_ENODE * 1e6:.0f} us "
            "per e-node; later iterations are predicted from the last one.",
            "",
            *rows,
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    sys.exit(main())
