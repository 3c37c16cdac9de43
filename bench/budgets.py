"""Budget adherence: the wall time of ``saturate_and_extract`` against its ``time_budget_s``,
with the shipped rules loaded ahead (``pcgopt.egraph.warm_up``), and the time of each phase.

    python bench/budgets.py [--model bert_large] [--machine dgx-a100:4] [--budgets 5 20]

Prints one row per budget (not written to bench/RESULTS.md: an open issue's measurement).
"""

from __future__ import annotations

import argparse
import time

from pcgopt.egraph import warm_up
from pcgopt.extract.plan import machine_from_spec, saturate_and_extract
from pcgopt.models import build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert_large")
    parser.add_argument("--machine", default="dgx-a100:4")
    parser.add_argument("--budgets", type=float, nargs="+", default=[5.0, 20.0])
    args = parser.parse_args()
    model, machine = build(args.model), machine_from_spec(args.machine)
    start = time.perf_counter()
    warm_up(pcgs=[model])
    print(f"warm_up: {time.perf_counter() - start:.2f} s")
    for budget in args.budgets:
        start = time.perf_counter()
        plan = saturate_and_extract(model, machine, time_budget_s=budget)
        wall = time.perf_counter() - start
        phases = ", ".join(f"{k} {v:.2f}" for k, v in plan.stats.phase_seconds.items())
        print(f"budget {budget:g} s: {wall:.2f} s ({wall / budget:.2f}x); {phases}")


if __name__ == "__main__":
    main()
