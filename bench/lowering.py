"""Plans that run: every zoo model's small variant under four planners, lowered to JAX and run
on 8 virtual CPU devices, against the unsharded model, and the collectives XLA compiled
against the cost model's (the plans of tests/lower/test_zoo_plans.py, checked the same way);
and, with ``--run PLAN.json``, training steps of a full-size plan (wall time per step, peak
memory, in a process of its own).

    python bench/lowering.py                          # updates bench/RESULTS.md
    python bench/lowering.py --run plan.json --steps 3 [--optimizer sgd]

The full-size plan of bench/RESULTS.md was made with
``pcgopt optimize bert_large --set batch=8 --set seq=128 --machine dgx-h100:1 --budget 60
--json bert_large_plan.json``.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

from _results import publish, run_child

HEADING = "## Plans run on JAX"
# Not a prefix of HEADING, nor HEADING of it: sections are found by their headings.
RUN_HEADING = "## A full-size plan run on JAX"

RUN_CHILD = """
import json, sys, time
from pcgopt.cli import load_plan
from pcgopt.lower.run import devices_needed, host_devices
pcg, meta = load_plan(sys.argv[1])
host_devices(devices_needed(pcg))
from pcgopt.lower.run import run_plan
start = time.perf_counter()
cost = meta.get("cost") or {}
r = run_plan(pcg, steps=int(sys.argv[2]), optimizer=sys.argv[3] or cost.get("optimizer"),
             micro_batches=cost.get("micro_batches"))
c = r.collectives
print(json.dumps({
    "optimizer": r.lowered.optimizer, "nodes": len(pcg.nodes),
    "devices": r.lowered.mesh.size, "losses": r.losses,
    "step_seconds": r.step_seconds, "peak_rss": r.peak_rss_bytes,
    "loss_relative": r.loss_relative, "grad_relative": r.grad_relative,
    "matched": len(c.matched), "exact": len(c.exact), "planned": len(c.planned),
    "missing": len(c.missing), "extra": len(c.extra),
    "seconds": time.perf_counter() - start}))
"""


def zoo() -> list[str]:
    os.environ.setdefault(
        "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    )
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "lower"))
    import test_zoo_plans as zoo_plans

    from pcgopt.models import ZOO

    rows, totals = [], collections.Counter()
    missing, extra, unmet = collections.Counter(), collections.Counter(), collections.Counter()
    worst, start = 0.0, time.perf_counter()
    mapped_rows: list[str] = []
    mapped_worst = 0.0
    for name in ZOO:
        plans = zoo_plans.distinct_plans(name)
        errors, runs = [], 0
        for pcg, where in plans.items():
            found = zoo_plans.check(pcg, name, ", ".join(where))
            errors.append(found["error"])
            runs += len(where)
            report = found["collectives"]
            totals["planned"] += len(report.planned)
            totals["matched"] += len(report.matched)
            totals["exact"] += len(report.exact)
            totals["free"] += len(report.free)
            totals["missing"] += len(report.missing)
            totals["extra"] += len(report.extra)
            totals["loss"] += len(report.loss)
            for p in report.missing:
                missing[f"{p.op} {p.purpose} ({p.kind})"] += 1
            for c in report.extra:
                extra[f"{c.kind} {c.shape}"] += 1
            placement = found["placement"]
            totals["nodes"] += len(placement.honoured) + len(placement.unmet)
            totals["honoured"] += len(placement.honoured)
            totals["checked"] += len(found["groups"])
            totals["agree"] += sum(g.agrees for g in found["groups"])
            for why in placement.unmet.values():
                unmet[why.split(" (")[0]] += 1
        worst = max(worst, *errors)
        rows.append(f"| {name} | {runs} | {len(plans)} | {max(errors):.2g} |")
        for plan, where in zoo_plans.mapped_plans(name).values():
            found = zoo_plans.check_mapped(plan, name, ", ".join(where))
            seconds = _step_seconds(plan)
            mapped_rows.append(
                f"| {name} | {', '.join(where)} | {found['pieces']} | "
                f"{plan.machine_mapping.time_s * 1e3:.3g} / "
                f"{plan.machine_mapping.sequential_s * 1e3:.3g} | "
                f"{seconds[0] * 1e3:.3g} / {seconds[1] * 1e3:.3g} | {found['error']:.2g} |"
            )
            mapped_worst = max(mapped_worst, found["error"])
    lines = [
        "Command: `python bench/lowering.py` (the plans of tests/lower/test_zoo_plans.py: data",
        "parallel, Megatron and coordinate descent on a DGX-A100 node of 2, 4 and 8 GPUs, and",
        "saturate_and_extract's plans of tests/lower/sae_plans.json; each distinct plan lowered",
        f"once and run on 8 virtual CPU devices; {time.perf_counter() - start:.0f} s).",
        "",
        "Error: the largest over the loss, every weight's gradient (against the unsharded model,",
        "plain jax.numpy in float32) and every output (against the reference evaluator, float64),",
        "of |difference| / max(1, largest magnitude).",
        "",
        "| model | plans (planner x devices) | distinct plans | largest error |",
        "|---|---|---|---|",
        *rows,
        "",
        f"All {sum(int(r.split('|')[3]) for r in rows)} distinct plans agree; the largest error "
        f"is {worst:.2g} (the tests require 1e-4).",
        "",
        f"Collectives: the cost model charges {totals['planned']} (every node's forward,"
        f" backward and weight-gradient collectives). {totals['free']} move nothing in SPMD "
        "(a Combine's scatter, a Replicate's broadcast, a Partition's scatter, ...). XLA compiled "
        f"{totals['matched']} of the others with exactly the bytes of their SPMD forms; "
        f"{totals['exact']} of those are the very collective and bytes the cost model charges, "
        "the rest differ as pcgopt.lower.collectives names (a Combine's gather is an all-gather "
        "to every device, a Reduce an all-reduce, a sparse table's sync dense, a narrower "
        "tensor's collective run by every group of the mesh). "
        f"{totals['missing']} planned were not compiled: "
        + ", ".join(f"{k} x{v}" for k, v in missing.most_common())
        + f". {totals['extra']} compiled were not planned: "
        + (", ".join(f"{k} x{v}" for k, v in extra.most_common()) or "none")
        + f"; and {totals['loss']} plans' scalar sums of the loss.",
        "",
        f"Device groups (pcgopt.lower.placement): of {totals['nodes']} parallel nodes that run a "
        f"collective, the mesh's device order runs {totals['honoured']} on the cost model's "
        "groups (consecutive devices, its default placement of a bare PCG); the rest: "
        + (", ".join(f"{k} x{v}" for k, v in unmet.most_common()) or "none")
        + f". Of {totals['checked']} compiled collectives read back with their node, "
        f"{totals['agree']} run on exactly the plan's groups (every one of an honoured node "
        "does: the tests assert it).",
        "",
        "Branches at once on their own devices (pcgopt.lower.mapped): the model and each plan "
        "above, placed and mapped on a DGX-A100 node of 2, 4 and 8 GPUs as saturate_and_extract "
        "costs a candidate, where the machine mapping runs branches at once on disjoint devices "
        f"({len(mapped_rows)} distinct mapped plans). Each runs as one program per block of "
        "devices (pieces); predicted: the mapping's time / the same plan in sequence (A100 "
        "model); measured: median wall time of a training step (SGD) on the virtual CPU "
        "devices run as mapped / as one SPMD program on all devices (2 cores run the 8 "
        "virtual devices, so branches cannot gain much here; the column shows the cost of the "
        "pieces' dispatch and transfers as much as concurrency).",
        "",
        "| model | plans | pieces | predicted ms (mapped / in sequence) | "
        "measured ms per step (mapped / one program) | largest error |",
        "|---|---|---|---|---|---|",
        *mapped_rows,
        "",
        f"All agree with the unsharded model; the largest error is {mapped_worst:.2g}.",
    ]
    return lines


def _step_seconds(plan, steps: int = 5) -> tuple[float, float]:
    """Median wall time of a training step after the first: the plan run as mapped, and as
    one SPMD program."""
    import jax

    from pcgopt.lower.jax import lower

    out = []
    for concurrent in (True, False):
        program = lower(plan, 8, concurrent=concurrent)
        inputs, weights = program.random_sources(seed=0)
        state = program.init(weights)
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            state, loss = program.train_step(state, inputs)
            float(loss)
            jax.block_until_ready(state.params)
            times.append(time.perf_counter() - t)
        out.append(statistics.median(times[1:]))
        program.release()
    return out[0], out[1]


def run(plan: str, steps: int, optimizer: str) -> list[str]:
    found = run_child(RUN_CHILD, Path(plan).resolve(), steps, optimizer)
    plan = Path(plan).name
    if isinstance(found, str):
        return [f"`pcgopt run {plan}` failed: {found}"]
    steps_s = found["step_seconds"]
    median = sorted(steps_s[1:])[len(steps_s[1:]) // 2] if len(steps_s) > 1 else steps_s[0]
    return [
        f"Command: `python bench/lowering.py --run {plan} --steps {steps}"
        + (f" --optimizer {optimizer}`" if optimizer else "`"),
        "",
        f"Training steps ({found['optimizer']}) of {plan} ({found['nodes']} nodes) on "
        f"{found['devices']} virtual CPU devices: first step (compiling) {steps_s[0]:.1f} s, "
        f"then {median:.2f} s per step "
        f"(median of {len(steps_s) - 1}); peak memory {found['peak_rss'] / 2**30:.2f} GiB "
        f"(process RSS); losses {', '.join(f'{v:.4f}' for v in found['losses'])}; first "
        f"step against the unsharded model: loss {found['loss_relative']:.2g}, gradients "
        f"{found['grad_relative']:.2g} (relative); collectives: {found['matched']} of "
        f"{found['planned']} planned compiled in their SPMD form ({found['exact']} exactly "
        f"the cost model's), {found['missing']} not compiled, {found['extra']} extra; "
        f"{found['seconds']:.0f} s in all.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", metavar="PLAN.json", help="run a plan's training steps")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizer", default="", help="instead of the plan's")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    lines = run(args.run, args.steps, args.optimizer) if args.run else zoo()
    heading = f"{RUN_HEADING}: {Path(args.run).name}" if args.run else HEADING
    publish(heading, lines, write=not args.no_write)


if __name__ == "__main__":
    main()
