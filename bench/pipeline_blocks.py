"""Pipeline stages on blocks the search chooses (``pipeline_search(..., blocks="free")``, Alpa's
submesh choice) against balanced blocks only (the default), on bench/pipeline.py's settings:
BERT-Large on Summit and AutoDDL Table 3's Transformers on Piz Daint.

    python bench/pipeline_blocks.py                 # updates bench/RESULTS.md
    python bench/pipeline_blocks.py --no-write --bert 4 --autoddl
"""

from __future__ import annotations

import argparse
import time
import warnings

from _results import command_sentence, publish

from pcgopt import Machine
from pcgopt.extract.strategies.pipeline import PipelinePlan, pipeline_search
from pcgopt.models import build

HEADING = "## Pipeline stages on blocks the search chooses"

#: AutoDDL Table 3's models (bench/pipeline.py): name, sizes, Piz Daint nodes, batch.
AUTODDL = (
    ("wide", {"layers": 20, "hidden": 8192, "heads": 64}, 64, 512),
    ("deep", {"layers": 36, "hidden": 4096, "heads": 32}, 64, 512),
)


def _shape(plan: PipelinePlan, per_unit: int) -> str:
    units = [len(s.devices) // per_unit for s in plan.stages]
    return f"{len(plan.stages)} x {plan.micro_batches}, units {units}"


def _row(label: str, pcg, machine: Machine, per_unit: int) -> str:
    found = {}
    for blocks in ("balanced", "free"):
        started = time.perf_counter()
        plan = pipeline_search(pcg, machine, min_stages=2, blocks=blocks)
        found[blocks] = (plan, time.perf_counter() - started)
    (even, even_s), (free, free_s) = found["balanced"], found["free"]
    row = (
        f"| {label} | {even.time_s * 1e3:.2f} ms | {_shape(even, per_unit)} | "
        f"{free.time_s * 1e3:.2f} ms | {_shape(free, per_unit)} | "
        f"{even.time_s / free.time_s:.3f}x | {even_s:.1f} s | {free_s:.1f} s |"
    )
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bert", type=int, nargs="*", default=[4, 8, 16], help="Summit nodes")
    parser.add_argument("--autoddl", action="store_true", help="also AutoDDL's models")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    rows = [
        "| model and machine | balanced blocks | stages x micro-batches, units per stage | "
        "free blocks | stages x micro-batches, units per stage | balanced / free | "
        "search (balanced) | search (free) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for nodes in args.bert:
        machine = Machine.preset("summit", nodes=nodes)
        pcg = build("bert_large", batch=4 * machine.num_devices, loss=True)
        per_unit = machine.num_devices // nodes
        rows.append(_row(f"bert_large, summit {nodes} nodes", pcg, machine, per_unit))
    for name, sizes, nodes, batch in AUTODDL if args.autoddl else ():
        machine = Machine.preset("piz-daint", nodes=nodes)
        pcg = build("transformer", batch=batch, seq=1024, loss=True, **sizes)
        rows.append(_row(f"{name}, piz-daint {nodes} nodes", pcg, machine, 1))
    lines = [
        command_sentence(start),
        "",
        '`pipeline_search(pcg, machine, min_stages=2)` with `blocks="balanced"` (every stage '
        "count, blocks as equal as whole units allow, the larger first or last) and "
        '`blocks="free"` (also each stage\'s block chosen by the dynamic program, any size up to '
        "16 units, chosen sizes above), no time limit, 1F1B. Settings as bench/pipeline.py: "
        "BERT-Large with 4 samples per GPU; AutoDDL's Transformers with sequence 1,024.",
        "",
        *rows,
    ]
    publish(HEADING, lines, write=not args.no_write)


if __name__ == "__main__":
    main()
