"""How well extraction's estimate predicts the simulated iteration: for each model on Summit 1
and 2 nodes (weak-scaled, each with the optimizer Unity trains it with), its e-graph saturated 2
iterations with the data-parallel and Megatron plans as seeds; for those two plans and the plans
extracted under each estimate, the estimate (``dag_cost`` of the plan's choice) against
``iteration_cost`` (the simulated iteration, unmapped). 'summed': extraction costed with
``runtime=ADDITIVE``; 'overlapped': with DDP's (the default: the sync hidden behind the backward
where the simulated order lets it).

    python bench/estimate.py [--models mlp candle_uno dlrm xdl] [--nodes 1 2] [--no-write]
"""

from __future__ import annotations

import argparse
import time

from _results import command_sentence, publish, run_child

HEADING = "## Extraction's estimate against the simulated iteration"

CHILD = """
import json, sys
from baselines import per_gpu_batch
from pcgopt import Machine, models
from pcgopt.egraph import Budget, saturate
from pcgopt.errors import PCGError
from pcgopt.extract import ADDITIVE, iteration_cost
from pcgopt.extract.search.extraction import dag_cost, enode_costs, extract_greedy
from pcgopt.extract.strategies.baselines import data_parallel, megatron
name, nodes = sys.argv[1], int(sys.argv[2])
machine = Machine.preset("summit", nodes=nodes)
pcg = models.build(name, batch=per_gpu_batch(name) * machine.num_devices)
optimizer = models.ZOO[name].optimizer
plans = {}
for label, make in (("data parallel", data_parallel), ("Megatron", megatron)):
    try:
        plans[label] = make(pcg, machine)
    except PCGError:
        pass
budget = Budget(iterations=2, seconds=120, enodes=300_000, speculate=False)
egraph = saturate(pcg, machine, budget=budget, seeds=list(plans.values())).egraph
summed = enode_costs(egraph, machine, optimizer=optimizer, runtime=ADDITIVE)
overlapped = enode_costs(egraph, machine, optimizer=optimizer)
for label, costs in (("summed", summed), ("overlapped", overlapped)):
    plans[f"extracted ({label})"] = egraph.to_pcg(extract_greedy(costs, time_limit_s=20).choice)
rows = []
for label, plan in plans.items():
    choice = egraph.choice_for(plan)
    rows.append({
        "plan": label,
        "simulated": iteration_cost(plan, machine, optimizer=optimizer).total_s,
        "summed": dag_cost(summed, choice).seconds,
        "overlapped": dag_cost(overlapped, choice).seconds,
    })
print(json.dumps(rows))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "candle_uno", "dlrm", "xdl"])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    table = [
        "| model | nodes | plan | simulated | summed estimate | overlapped estimate |",
        "|---|---|---|---|---|---|",
    ]
    errors: dict[str, dict[str, list[float]]] = {}
    start = time.perf_counter()
    for name in args.models:
        for nodes in args.nodes:
            found = run_child(CHILD, name, nodes)
            if isinstance(found, str):
                table.append(f"| {name} | {nodes} | failed: {found} | | | |")
                continue
            for row in found:
                sim = row["simulated"]
                kind = row["plan"].split(" (")[0]
                cells = []
                for model in ("summed", "overlapped"):
                    error = row[model] / sim - 1
                    errors.setdefault(model, {}).setdefault(kind, []).append(abs(error))
                    cells.append(f"{row[model] * 1e3:.2f} ms ({error:+.1%})")
                table.append(
                    f"| {name} | {nodes} | {row['plan']} | {sim * 1e3:.2f} ms | "
                    f"{' | '.join(cells)} |"
                )
                print(table[-1], flush=True)
    summary = ["| plans | mean absolute error, summed | overlapped |", "|---|---|---|"]
    kinds = sorted({k for by_kind in errors.values() for k in by_kind})
    for kind in ["all", *kinds]:
        cells = []
        for model in ("summed", "overlapped"):
            values = [e for k, v in errors.get(model, {}).items() if kind in ("all", k) for e in v]
            cells.append(f"{sum(values) / len(values):.1%}" if values else "")
        count = sum(len(v) for k, v in errors.get("summed", {}).items() if kind in ("all", k))
        summary.append(f"| {kind} ({count}) | {' | '.join(cells)} |")
    publish(
        HEADING,
        [
            command_sentence(start),
            "",
            "Extraction ranks the e-graph's choices by a per-e-node estimate "
            "(`pcgopt.extract.search.extraction`, 'Overlap'); the plan it picks is then costed "
            "by the simulated iteration like every candidate. How far apart the two are:",
            "",
            *summary,
            "",
            *table,
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
