"""Calibration by measurement against measured training steps (issue 45).

In one process with 8 virtual CPU devices (JAX, default XLA flags): ``measure_machine`` times
the devices and fits a machine (``pcgopt calibrate --measure``); then, for the data-parallel and
Megatron (tensor-parallel) plans of two small models, the cost model's predicted iteration on
that machine against the median measured step of the plan run on JAX (``pcgopt run``'s
``run_plan``, steps after the first, which compiles). Reports each prediction's error and
whether the predictions rank the plans of each model as the measurements do.

    python bench/calibration.py [--no-write]
"""

from __future__ import annotations

import argparse
import time

from _results import command_sentence, publish, run_child

HEADING = "## Calibration by measurement"

CHILD = """
import json, statistics, sys
from pcgopt.lower.run import host_devices
host_devices(8)
from pcgopt import models
from pcgopt.extract import data_parallel, iteration_cost, megatron
from pcgopt.lower.measure import measure_machine
from pcgopt.lower.run import run_plan
measured = measure_machine(devices=8, repeats=7)
machine = measured.machine
rows = []
cases = {
    "mlp": models.build("mlp", small=True, batch=64),
    "transformer": models.build("transformer", small=True, batch=16),
}
for name, pcg in cases.items():
    for label, make in (("data parallel", data_parallel), ("megatron", megatron)):
        plan = make(pcg, machine)
        predicted = iteration_cost(plan, machine, optimizer="adam")
        report = run_plan(plan, devices=8, steps=8, optimizer="adam", collectives=False)
        rows.append({
            "model": name, "plan": label, "predicted_s": predicted.total_s,
            "additive_s": predicted.additive_s,
            "measured_s": statistics.median(report.step_seconds[1:]),
        })
print(json.dumps({"summary": measured.summary(), "rows": rows,
                  "machine": machine.to_dict()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    r = run_child(CHILD)
    if isinstance(r, str):
        raise SystemExit(f"the measurement failed: {r}")
    lines = [
        "| model | plan | predicted (simulated) | predicted (additive) | measured step | error |",
        "|---|---|---|---|---|---|",
    ]
    errors = []
    for row in r["rows"]:
        error = row["predicted_s"] / row["measured_s"] - 1
        errors.append(abs(error))
        lines.append(
            f"| {row['model']} | {row['plan']} | {row['predicted_s'] * 1e3:.3f} ms | "
            f"{row['additive_s'] * 1e3:.3f} ms | {row['measured_s'] * 1e3:.3f} ms | "
            f"{error:+.0%} |"
        )
    ranks = []
    for model in dict.fromkeys(row["model"] for row in r["rows"]):
        mine = [row for row in r["rows"] if row["model"] == model]
        by_prediction = [row["plan"] for row in sorted(mine, key=lambda x: x["predicted_s"])]
        by_measure = [row["plan"] for row in sorted(mine, key=lambda x: x["measured_s"])]
        ranks.append(
            f"{model}: predicted order {', '.join(by_prediction)}; measured "
            f"{', '.join(by_measure)} ({'same' if by_prediction == by_measure else 'differs'})"
        )
    publish(
        HEADING,
        [
            command_sentence(start),
            "",
            "8 virtual CPU devices of this machine (2 cores), default XLA flags. The fitted "
            f"machine: {r['summary']}. Plans of the small `mlp` (batch 64) and `transformer` "
            "(batch 16) built for it, costed with Adam under the default runtime (simulated, "
            "DDP's) and run on JAX for 8 steps (the median of steps 2-8 is the measured step).",
            "",
            *lines,
            "",
            f"Mean absolute error {sum(errors) / len(errors):.0%}, largest {max(errors):.0%}. "
            + "; ".join(ranks)
            + ".",
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
