"""AutoDDL's experiments (section 5) in the cost model: VGG13 and the Transformer on its two
systems, and its Figure 2/3 self-attention comparison.

Systems: Piz Daint-like single-GPU nodes (preset ``piz-daint``, P100 16 GB; the network figure is
an assumption, see pcgopt.machine) and 2 x DGX-A100 (preset ``dgx-a100``, 16 A100 40 GB per node,
AutoDDL's Google Cloud machines; VGG13 on 4 and 8 GPUs per node). Models in float32 (AutoDDL ran
mixed precision on the A100s); the Transformers end in a stand-in loss (the mean of the logits,
``loss=True``) so that no plan has to gather the logits. For each configuration the predicted
iteration time (ms) of data parallelism, Megatron-style tensor parallelism (the best tensor degree
t >= 2 over all that divide the devices, the rest data parallel, as AutoDDL tunes its Megatron
mesh), the best uniform 2D weight-stationary layout ("Summa-like": no weight copies, best grid),
coordinate descent and Metropolis-Hastings over per-layer SBP strategies, and the joint plan of
``saturate_and_extract``, all costed the way ``saturate_and_extract`` costs its candidates: placed
on the hierarchy (P^2 parallelism matrices), with gradient accumulation when it does not fit
otherwise (micro-batches in brackets); "OOM" when nothing fits. Search times are wall seconds on
this machine. The searches are time-limited (``--budget``): coordinate descent and MH get 20% of it
each (MH from the data-parallel start, with as many steps as CD made evaluations); in models of
more than 16 dense layers (the Transformers) layers of one role share a strategy (the searches'
default). The joint plan is ``saturate_and_extract`` with the budget, given the CD and MH plans as
seeds (candidates and e-graph seeds: time-limited searches stop at different points from run to
run); its own layer-wise searches run as well. Its search time does not include the seeds' (their
columns).

    python bench/autoddl.py               # prints, and updates bench/RESULTS.md
    python bench/autoddl.py --no-write --quick
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _results import publish

from pcgopt import Machine, PCGBuilder
from pcgopt.extract import (
    BaselineError,
    CostBreakdown,
    CostError,
    accumulate_to_fit,
    data_parallel,
    megatron,
    saturate_and_extract,
)
from pcgopt.extract.search.plan import placed_cost
from pcgopt.extract.strategies.layerwise import coordinate_descent, metropolis_hastings, summa_like
from pcgopt.graph import PCG
from pcgopt.models import build
from pcgopt.models.layers import self_attention

HEADING = "## AutoDDL: Transformer and VGG13, SBP strategies and coordinate descent"

# (system label, preset, nodes, GPUs per node, model, sizes, what AutoDDL ran)
CONFIGS: tuple[tuple[str, str, int, int | None, str, dict[str, Any]], ...] = (
    ("Piz Daint 16", "piz-daint", 16, None, "vgg13", {"batch": 128}),
    ("Piz Daint 32", "piz-daint", 32, None, "vgg13", {"batch": 256}),
    ("Piz Daint 64", "piz-daint", 64, None, "vgg13", {"batch": 512}),
    ("Piz Daint 64", "piz-daint", 64, None, "transformer", {"layers": 8, "loss": True}),
    ("2 x DGX-A100, 4 GPUs/node", "dgx-a100", 2, 4, "vgg13", {"batch": 128}),
    ("2 x DGX-A100, 8 GPUs/node", "dgx-a100", 2, 8, "vgg13", {"batch": 256}),
    (
        "2 x DGX-A100 (32 GPUs)",
        "dgx-a100",
        2,
        None,
        "transformer",
        {"layers": 24, "hidden": 1024, "heads": 16, "batch": 2048, "seq": 1024, "loss": True},
    ),
    (
        "2 x DGX-A100 (32 GPUs)",
        "dgx-a100",
        2,
        None,
        "transformer",
        {"layers": 28, "hidden": 4096, "heads": 32, "batch": 2048, "seq": 1024, "loss": True},
    ),
)
QUICK = (CONFIGS[0], CONFIGS[4])


def _fmt(cost: CostBreakdown | None) -> str:
    if cost is None:
        return "n/a"
    if not cost.feasible:
        return "OOM"
    mb = f" [{cost.micro_batches}]" if cost.micro_batches > 1 else ""
    return f"{cost.total_s * 1e3:,.0f}{mb}"


def _sizes(sizes: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sizes.items())


def _placed(plan: PCG, machine: Machine, cost: CostBreakdown | None = None) -> CostBreakdown:
    """Costed as saturate_and_extract costs its candidates (placed on the hierarchy, gradient
    accumulation if needed), so that the columns compare."""
    return placed_cost(plan, machine, cost=cost)[1]


def _baseline(make, pcg: PCG, machine: Machine) -> CostBreakdown | None:
    try:
        return _placed(make(pcg, machine), machine)
    except (BaselineError, CostError):
        return None


def _best_megatron(pcg: PCG, machine: Machine) -> tuple[int, CostBreakdown] | None:
    """Megatron-style plans for every tensor degree dividing the machine (AutoDDL tunes the
    2D mesh of its Megatron baseline): the fastest, with its degree."""
    best: tuple[int, CostBreakdown] | None = None
    for t in range(2, machine.num_devices + 1):
        if machine.num_devices % t:
            continue
        try:
            cost = _placed(megatron(pcg, machine, tensor_degree=t), machine)
        except (BaselineError, CostError):
            continue
        if best is None or (not cost.feasible, cost.total_s) < (
            not best[1].feasible,
            best[1].total_s,
        ):
            best = (t, cost)
    return best


def configuration_rows(budget: float, quick: bool) -> list[str]:
    rows = [
        "| system | model | data parallel | Megatron | Summa-like 2D | coordinate descent "
        "| MH | joint plan | joint chosen from | CD search s | MH search s | joint search s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, preset, nodes, per_node, model, sizes in QUICK if quick else CONFIGS:
        machine = Machine.preset(preset, nodes=nodes, devices_per_node=per_node)
        pcg = build(model, **sizes)
        dp = _baseline(data_parallel, pcg, machine)
        best_mt = _best_megatron(pcg, machine)
        mt = None if best_mt is None else best_mt[1]
        try:
            summa = _placed(summa_like(pcg, machine)[0], machine)
        except (BaselineError, CostError):
            summa = None
        limit = 0.2 * budget
        cd = coordinate_descent(pcg, machine, restarts=4, time_limit_s=limit)
        mh = metropolis_hastings(pcg, machine, steps=cd.evaluations, time_limit_s=cd.seconds)
        start = time.perf_counter()
        # The standalone searches' plans are handed over as seeds: time-limited searches stop
        # at different points from run to run, and the joint plan must not lose to them.
        plan = saturate_and_extract(
            pcg, machine, time_budget_s=budget, check=False, seeds=[cd.pcg, mh.pcg]
        )
        joint_s = time.perf_counter() - start
        rows.append(
            f"| {label} | {model} ({_sizes(sizes)}) | {_fmt(dp)} "
            f"| {_fmt(mt)}{'' if best_mt is None else f' (t={best_mt[0]})'} "
            f"| {_fmt(summa)} | {_fmt(_placed(cd.pcg, machine, cd.cost))} "
            f"| {_fmt(_placed(mh.pcg, machine, mh.cost))} | {_fmt(plan.cost)} "
            f"| {plan.stats.chosen} | {cd.seconds:.1f} | {mh.seconds:.1f} | {joint_s:.1f} |"
        )
        print(rows[-1], flush=True)
    return rows


def attention(batch: int = 1024, seq: int = 1024, hidden: int = 8192, heads: int = 64) -> PCG:
    """AutoDDL's Figure 2/3 layer: self-attention (Q, K, V, output projections) on x[B, S, H],
    summed to a scalar so that only the layer's own communication counts."""
    b = PCGBuilder()
    x = b.input((batch, seq, hidden), name="x")
    y = self_attention(b, x, heads, name="attn", dropout=0.0)
    return b.build(b.reduce_sum(y, axes=(0, 1, 2), name="loss"))


def attention_rows() -> list[str]:
    rows = [
        "| nodes | best Megatron-style (tensor degree) | its volume GiB | data parallel GiB "
        "| coordinate descent GiB | its strategies | CD / Megatron | CD / data parallel |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pcg = attention()
    for nodes in (4, 64):
        machine = Machine.preset("piz-daint", nodes=nodes)
        dp = accumulate_to_fit(data_parallel(pcg, machine), machine)
        best: tuple[int, CostBreakdown] | None = None
        for t in range(2, nodes + 1):
            if nodes % t:
                continue
            cost = accumulate_to_fit(megatron(pcg, machine, tensor_degree=t), machine)
            if best is None or cost.comm_bytes < best[1].comm_bytes:
                best = (t, cost)
        assert best is not None
        cd = coordinate_descent(pcg, machine, restarts=4)
        kinds = sorted({str(s) for s in cd.strategies.values()})
        gib = 2**30
        rows.append(
            f"| {nodes} | t = {best[0]} | {best[1].comm_bytes / gib:,.1f} "
            f"| {dp.comm_bytes / gib:,.1f} | {cd.cost.comm_bytes / gib:,.1f} | {', '.join(kinds)} "
            f"| {cd.cost.comm_bytes / best[1].comm_bytes:.2f} "
            f"| {cd.cost.comm_bytes / dp.comm_bytes:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=100.0, help="joint search budget (s)")
    parser.add_argument("--quick", action="store_true", help="two small configurations only")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    command = "python bench/autoddl.py" + (
        f" --budget {args.budget:g}" if args.budget != 100 else ""
    )
    lines = [
        f"Regenerate: `{command}` (cost-model predictions on this machine; see the script's "
        "docstring for the systems and settings). Iteration times in ms, micro-batches of "
        "gradient accumulation in brackets, OOM: no plan of that kind fits device memory even "
        "with gradient accumulation.",
        "",
        *configuration_rows(args.budget, args.quick),
        "",
        "Figure 2/3 of AutoDDL: one self-attention layer (model dimension 8192, batch 1024, "
        "sequence 1024, 64 heads) on Piz Daint-like nodes; communication volume (bytes sent "
        "summed over devices, forward and backward, gradient synchronization included) of the "
        "lowest-volume Megatron-style plan (tensor degree >= 2, the rest data parallel) and of "
        "the coordinate-descent plan (chosen for time, not volume).",
        "",
        *attention_rows(),
    ]
    publish(HEADING, lines, write=not args.no_write)


if __name__ == "__main__":
    main()
