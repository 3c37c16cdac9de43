"""Pipeline parallelism in the cost model (issue 44): BERT-Large on Summit with and without a
pipeline (Unity Figure 15a's setting), and AutoDDL Table 3's wide and deep Transformers on Piz
Daint, Megatron with pipelining against pcgopt's stage search.

Every model ends in the stand-in loss (the mean of the logits, ``loss=True``), so that no plan
gathers the logits. Pipelined plans come from ``pipeline_search`` (1F1B, the stage plans costed
with the additive runtime: a stage's gradient synchronization is not overlapped with its
backward); "without a pipeline" is (a) ``saturate_and_extract``'s plan (the full search, costed
under PyTorch DDP's runtime, overlapping the synchronization) and (b) the same stage plans as one
stage (``stage_counts=[1]``, gradient accumulation where it pays). Weak scaling for BERT-Large:
the global batch is Unity's per-GPU 4 times the GPUs.

    python bench/pipeline.py                 # prints, and updates bench/RESULTS.md
    python bench/pipeline.py --no-write --quick
"""

from __future__ import annotations

import argparse
import time

from _results import command_sentence, publish

from pcgopt import Machine
from pcgopt.divisors import divisors
from pcgopt.extract import saturate_and_extract
from pcgopt.extract.costmodel.pipeline import PipelineError
from pcgopt.extract.strategies.pipeline import PipelinePlan, pipeline_search
from pcgopt.models import build
from pcgopt.segments import split_segments

HEADING = "## Pipeline parallelism"

#: AutoDDL Table 3 (section 5.4): name, sizes, nodes, batch.
AUTODDL = (
    ("wide", {"layers": 20, "hidden": 8192, "heads": 64}, 64, 512),
    ("wide", {"layers": 20, "hidden": 8192, "heads": 64}, 128, 1024),
    ("deep", {"layers": 36, "hidden": 4096, "heads": 32}, 64, 512),
    ("deep", {"layers": 36, "hidden": 4096, "heads": 32}, 128, 1024),
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def _plans(plan: PipelinePlan) -> str:
    """The stages' plans, run-length encoded."""
    runs: list[list] = []
    for s in plan.stages:
        if runs and runs[-1][0] == s.strategy:
            runs[-1][1] += 1
        else:
            runs.append([s.strategy, 1])
    return ", ".join(f"{n} x {name}" if n > 1 else name for name, n in runs)


def _layers(plan: PipelinePlan) -> str:
    return "/".join(str(s.last - s.first + 1) for s in plan.stages)


def _blocks(plan: PipelinePlan) -> str:
    """The devices of each stage (equal blocks unless the stage count does not divide the
    nodes)."""
    return "/".join(str(len(s.devices)) for s in plan.stages) + " GPUs"


def _fits(plan: PipelinePlan) -> str:
    return "" if plan.feasible else " (does not fit)"


def bert(nodes: list[int], budget: float) -> list[str]:
    lines = [
        "### BERT-Large on Summit, with and without a pipeline",
        "",
        "| nodes | GPUs | without a pipeline (full search) | best pipeline: time | "
        "stages x micro-batches, segments and GPUs per stage | stage plans | memory | bubble | "
        "2BW, same search | with pipelines considered | speedup | pipeline search time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in nodes:
        machine = Machine.preset("summit", nodes=n)
        pcg = build("bert_large", batch=4 * machine.num_devices, loss=True)
        full = saturate_and_extract(pcg, machine, time_budget_s=budget, pipeline=False)
        started = time.perf_counter()
        piped = pipeline_search(pcg, machine, min_stages=2)
        took = time.perf_counter() - started
        two = pipeline_search(pcg, machine, min_stages=2, schedule="2bw")
        without = full.cost.total_s
        with_pipelines = min(without, piped.time_s) if piped.feasible else without
        lines.append(
            f"| {n} | {machine.num_devices} | {_ms(without)} ({full.stats.chosen}) | "
            f"{_ms(piped.time_s)}{_fits(piped)} | {len(piped.stages)} x {piped.micro_batches}, "
            f"{_layers(piped)}, {_blocks(piped)} | {_plans(piped)} | {_gib(piped.memory_bytes)} | "
            f"{_ms(piped.bubble_s)} | {_ms(two.time_s)} ({len(two.stages)} x "
            f"{two.micro_batches}) | {_ms(with_pipelines)} | {without / with_pipelines:.2f}x | "
            f"{took:.1f} s |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        "Without a pipeline: `saturate_and_extract(..., pipeline=False)` with the budget. Best "
        "pipeline: `pipeline_search(..., min_stages=2)`, no time limit (inside "
        "`saturate_and_extract` its phase has 4% of the budget). With pipelines considered: the "
        "faster of the two that fits; speedup: without over with. Bubble: the 1F1B iteration "
        "beyond M times the bottleneck stage and its synchronization. 2BW is asynchronous "
        "(each micro-batch's backward uses weights one update old): not the input model's "
        "optimizer, shown for comparison only.",
    ]
    return lines


def autoddl(rows: tuple, quick: bool) -> list[str]:
    lines = [
        "",
        "### AutoDDL Table 3: Megatron with pipelining against pcgopt's stage search (Piz Daint)",
        "",
        "Sequence 1,024, head dimension 128, FFN 4x, vocabulary 51,200, float32, Adam. Megatron: "
        "every stage runs Megatron at one tensor degree t (t = 1: data parallelism), with or "
        "without sequence parallelism, the best over t, SP, stage counts that divide the nodes "
        "(every stage on as many, as Megatron-LM's pipeline degree requires) and micro-batch "
        "counts (AutoDDL tunes its degrees by hand). "
        "pcgopt: the stage search over every stage plan, chosen per stage, and every stage "
        "count (blocks of two sizes where it does not divide the nodes). AutoDDL measured "
        "(Table 3): the best stage count was the same for both.",
        "",
        "| model | nodes | batch | Megatron + pipeline: time, t, stages x micro-batches | "
        "pcgopt: time, stages x micro-batches, segments and GPUs per stage, stage plans | memory | "
        "pcgopt / Megatron | search time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, sizes, nodes, batch in rows:
        machine = Machine.preset("piz-daint", nodes=nodes)
        pcg = build("transformer", batch=batch, seq=1024, loss=True, **sizes)
        best: tuple[PipelinePlan, str] | None = None
        # Megatron-LM's pipeline degree divides the devices: every stage on as many.
        equal_blocks = [s for s in divisors(nodes) if s <= len(split_segments(pcg))]
        degrees = ["data parallel"] + [
            f"megatron{sp} t={t}" for t in (2, 4, 8, 16, 32, 64) for sp in ("", "-sp")
        ]
        for strategy in degrees[:3] if quick else degrees:
            try:
                plan = pipeline_search(
                    pcg, machine, strategies=[strategy], stage_counts=equal_blocks
                )
            except PipelineError as e:
                print(f"  {strategy}: {e}", flush=True)
                continue
            ranked = (not plan.feasible, plan.time_s)
            if best is None or ranked < (not best[0].feasible, best[0].time_s):
                best = (plan, strategy)
        started = time.perf_counter()
        ours = pipeline_search(pcg, machine)
        took = time.perf_counter() - started
        if best is None:
            megatron_cell, ratio = "none", "-"
        else:
            plan, strategy = best
            megatron_cell = (
                f"{_ms(plan.time_s)}{_fits(plan)}, {strategy}, "
                f"{len(plan.stages)} x {plan.micro_batches}"
            )
            ratio = f"{plan.time_s / ours.time_s:.2f}x"
        lines.append(
            f"| {name} | {nodes} | {batch} | {megatron_cell} | {_ms(ours.time_s)}{_fits(ours)}, "
            f"{len(ours.stages)} x {ours.micro_batches}, {_layers(ours)}, {_blocks(ours)}, "
            f"{_plans(ours)} | "
            f"{_gib(ours.memory_bytes)} | {ratio} | {took:.1f} s |"
        )
        print(lines[-1], flush=True)
    lines += ["", "pcgopt / Megatron: Megatron's time over pcgopt's (above 1: pcgopt faster)."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--budget", type=float, default=20.0, help="the full search's budget (s)")
    parser.add_argument("--quick", action="store_true", help="fewer Megatron degrees, 64 nodes")
    parser.add_argument("--no-write", dest="write", action="store_false")
    args = parser.parse_args()
    started = time.perf_counter()
    lines = bert(args.nodes, args.budget)
    rows = tuple(r for r in AUTODDL if r[2] == 64) if args.quick else AUTODDL
    lines += autoddl(rows, args.quick)
    publish(HEADING, [command_sentence(started), "", *lines], write=args.write)


if __name__ == "__main__":
    main()
