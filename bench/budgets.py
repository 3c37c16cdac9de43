"""Budget adherence: the wall time of ``saturate_and_extract`` against its ``time_budget_s``,
with the shipped rules loaded ahead (``pcgopt.egraph.warm_up``), the time of each phase and the
plan found; and the same search with ``deterministic=True`` (work limits, no budget).

    python bench/budgets.py [--models bert_large inception_v3] [--machine dgx-a100:4]
                            [--budgets 5 20 60] [--write]

``--write`` puts the table in bench/RESULTS.md ("Budget adherence").
"""

from __future__ import annotations

import argparse
import subprocess
import time

from _results import publish

from pcgopt.egraph import warm_up
from pcgopt.extract.search.plan import machine_from_spec, saturate_and_extract
from pcgopt.models import build

HEADING = "## Budget adherence"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert_large", "inception_v3"])
    parser.add_argument("--machine", default="dgx-a100:4")
    parser.add_argument("--budgets", type=float, nargs="+", default=[5.0, 20.0, 60.0])
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    machine = machine_from_spec(args.machine)
    rows = []
    for name in args.models:
        model = build(name)
        start = time.perf_counter()
        warm_up(pcgs=[model])
        print(f"{name}: warm_up {time.perf_counter() - start:.2f} s", flush=True)
        for budget in [*args.budgets, None]:
            start = time.perf_counter()
            plan = saturate_and_extract(
                model,
                machine,
                time_budget_s=budget or 60.0,
                deterministic=budget is None,
            )
            wall = time.perf_counter() - start
            phases = ", ".join(f"{k} {v:.2f}" for k, v in plan.stats.phase_seconds.items())
            ratio = "" if budget is None else f"{wall / budget:.2f}"
            rows.append(
                f"| {name} | {'deterministic' if budget is None else f'{budget:g} s'} "
                f"| {wall:.2f} s | {ratio} | {plan.stats.iterations} "
                f"| {plan.stats.num_enodes:,} | {plan.stats.chosen} "
                f"| {plan.cost.total_s * 1e3:.3f} ms | {phases} |"
            )
            print(rows[-1], flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"Command: `python bench/budgets.py --write` (at {commit}; full-size models on "
        f"{args.machine}, {machine.num_devices} GPUs; rules loaded ahead by `warm_up`).",
        "",
        "The wall time of one `saturate_and_extract` call, check included, against its "
        "`time_budget_s`; 'deterministic' is the same search with `deterministic=True` "
        "(work limits, no budget).",
        "",
        "| model | budget | wall | wall / budget | iterations | e-nodes | chosen | predicted "
        "iteration | phases (s) |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    publish(HEADING, lines, write=args.write)


if __name__ == "__main__":
    main()
