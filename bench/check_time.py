"""The plan check's time against its prediction (issue 42: a time budget keeps the check's
predicted time back, so a prediction under the measured time overruns the budget).

For the data-parallel and Megatron plans of the zoo's full-size models on 16 and 64 GPUs: the
time of the check ``saturate_and_extract`` makes (the plan and the model scaled down together,
then evaluated on 3 random inputs), and what :func:`~pcgopt.extract.search.plan.check_seconds`
predicted before the search.

    python bench/check_time.py               # updates bench/RESULTS.md
    python bench/check_time.py --no-write --only bert_large
"""

from __future__ import annotations

import argparse
import inspect
import time
import warnings

from _results import command_sentence, publish

from pcgopt import Machine, models
from pcgopt.evaluate import assert_equivalent
from pcgopt.extract.search.plan import check_seconds
from pcgopt.extract.strategies.baselines import data_parallel, megatron
from pcgopt.scaled import CHECK_FLOPS_LIMIT, checkable_pair

HEADING = "## The plan check's time"
MODELS = (
    "mlp",
    "bert_large",
    "transformer",
    "dlrm",
    "xdl",
    "candle_uno",
    "resnext50",
    "inception_v3",
)
NODES = (2, 8)  # dgx-a100 nodes of 8 GPUs: 16 and 64 GPUs
PLANS = {"data parallel": data_parallel, "megatron": megatron}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    rows = [
        "| model | GPUs | plan | model nodes | plan nodes | scaling down | evaluation | "
        "check | predicted | predicted / measured |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for name in args.only:
        per_gpu = inspect.signature(models.ZOO[name].builder).parameters["batch"].default
        for nodes in NODES:
            machine = Machine.preset("dgx-a100", nodes=nodes, devices_per_node=8)
            pcg = models.build(name, batch=per_gpu * machine.num_devices)
            predicted = check_seconds(pcg, machine)
            for plan_name, make in PLANS.items():
                try:
                    plan = make(pcg, machine)
                except Exception as err:  # a plan the model has no such form of: said so
                    rows.append(
                        f"| {name} | {machine.num_devices} | {plan_name} | {len(pcg.nodes):,} "
                        f"| no plan: {type(err).__name__} | | | | | |"
                    )
                    continue
                t0 = time.perf_counter()
                pair = checkable_pair(pcg, plan, flops_limit=CHECK_FLOPS_LIMIT)
                t1 = time.perf_counter()
                if pair.skipped is None:
                    assert_equivalent(*pair.pcgs)
                t2 = time.perf_counter()
                check = t2 - t0
                ratios.append(predicted / check)
                rows.append(
                    f"| {name} | {machine.num_devices} | {plan_name} | {len(pcg.nodes):,} | "
                    f"{len(plan.nodes):,} | {t1 - t0:.2f} s | "
                    f"{'skipped' if pair.skipped else f'{t2 - t1:.2f} s'} | {check:.2f} s | "
                    f"{predicted:.2f} s | {predicted / check:.2f} |"
                )
                print(rows[-1], flush=True)
    rows += [
        "",
        f"Predicted / measured: {min(ratios):.2f} to {max(ratios):.2f} over {len(ratios)} "
        f"checks; under 1 on {sum(r < 1 for r in ratios)} (the budget is overrun by the "
        "difference).",
    ]
    lines = [
        command_sentence(start),
        "",
        "The check `saturate_and_extract` makes of its plan (scaled down with the model when "
        "too large for the evaluator, then both evaluated on 3 random inputs), timed in one "
        "process, against `check_seconds`, the time a time budget keeps back for it. Full-size "
        "models, batch weak-scaled (each model's default per GPU), `dgx-a100` nodes of 8 GPUs.",
        "",
        *rows,
    ]
    publish(HEADING, lines, write=not args.no_write)


if __name__ == "__main__":
    main()
