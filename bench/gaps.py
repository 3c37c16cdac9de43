"""Where the joint plan falls short of Unity's speedups, with the plans an expert would try.

bench/run.py compares the joint plan with Unity's speedups per node count. Where it falls short,
this costs, with the same cost model and optimizer as the search (weak scaling, Summit):

- DLRM and XDL: the model on one GPU, and the hybrid Unity's expert baseline uses (Neo): every
  embedding table whole on k GPUs (k = 1, 2, 3), everything else data parallel on all GPUs or
  on one node's, with the time of its costliest transfer;
- MLP: every alternating assignment of the legal matmul strategies to its dense layers, at the
  degrees of the branch-parallel plan;
- Inception-v3: where the data-parallel plan's time goes, and what one all-reduce over all GPUs
  costs at the least (the latency every weight tensor's gradient pays).

    python bench/gaps.py              # prints, updates bench/RESULTS.md
    python bench/gaps.py --no-write
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings

from _results import publish
from baselines import per_gpu_batch

from pcgopt import Machine, OpKind, models
from pcgopt.extract.costmodel.cost import CostBreakdown, collective_cost, iteration_cost
from pcgopt.extract.search.plan import mapped_cost
from pcgopt.extract.strategies.baselines import data_parallel
from pcgopt.extract.strategies.branches import branch_parallel, lower_degrees
from pcgopt.extract.strategies.layerwise import dense_layers, strategies_for
from pcgopt.graph import PCG

HEADING = "## Where the joint plan falls short"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def weak_scaled(name: str, gpus: int) -> PCG:
    return models.build(name, batch=per_gpu_batch(name) * gpus)


def costliest_transfer(cost: CostBreakdown) -> str:
    node = max(cost.per_node.values(), key=lambda c: c.comm_forward_s + c.comm_backward_s)
    return f"{node.name} {ms(node.comm_forward_s + node.comm_backward_s)}"


def recommendation(name: str, nodes: int) -> list[str]:
    """The one-GPU plan and the table-whole hybrids of DLRM or XDL on ``nodes`` Summit nodes."""
    machine = Machine.preset("summit", nodes=nodes)
    optimizer = models.ZOO[name].optimizer
    pcg = weak_scaled(name, machine.num_devices)
    alone = iteration_cost(pcg, machine, optimizer=optimizer)  # sequential: on device 0
    rows = [
        f"| {name} | {nodes} | one GPU | {ms(alone.total_s)} | compute {ms(alone.compute_s)}, "
        f"update {ms(alone.update_s)} | none |"
    ]
    # On all GPUs, and on the first node's only (the same batch).
    for where, target in (("all GPUs", machine), ("one node", Machine.preset("summit"))):
        if where == "one node" and nodes == 1:
            continue
        width = target.num_devices
        for k in (1, 2, 3):
            degrees = {
                n.name: (k if n.op == "embedding_bag" else width)
                for n in pcg.nodes
                if n.spec.kind is OpKind.COMPUTE
            }
            _, _, cost = mapped_cost(
                lower_degrees(pcg, target, degrees), target, optimizer=optimizer
            )
            rows.append(
                f"| {name} | {nodes} | tables whole on {k} GPU{'s' if k > 1 else ''}, the rest "
                f"on {where} ({width}) | {ms(cost.total_s)} | compute {ms(cost.compute_s)}, "
                f"communication {ms(cost.comm_s)}, update {ms(cost.update_s)}, branches at "
                f"once save {ms(cost.overlap_s)} | {costliest_transfer(cost)} |"
            )
    return rows


def mlp_assignments(nodes: int) -> list[str]:
    """Every alternating pair of legal strategies for MLP's dense layers on ``nodes`` nodes."""
    machine = Machine.preset("summit", nodes=nodes)
    pcg = weak_scaled("mlp", machine.num_devices)
    optimizer = models.ZOO["mlp"].optimizer
    plan = branch_parallel(pcg, machine, optimizer=optimizer, time_limit_s=1.0)
    if plan is None:
        return [f"| mlp | {nodes} | no branch narrows | | |"]
    degrees = dict(plan.degrees)
    layers = dense_layers(pcg)
    options = strategies_for(pcg, layers[0], machine, devices=degrees[layers[0]])
    results = []
    for even, odd in itertools.product(options, repeat=2):
        chosen = {n: (even if i % 2 == 0 else odd) for i, n in enumerate(layers)}
        _, _, cost = mapped_cost(
            lower_degrees(pcg, machine, degrees, chosen), machine, optimizer=optimizer
        )
        results.append((cost.total_s, str(even), str(odd)))
    results.sort()
    best = ", ".join(f"{a} / {b}: {ms(t)}" for t, a, b in results[:3])
    return [
        f"| mlp | {nodes} | {len(results)} assignments of {len(options)} strategies "
        f"({', '.join(map(str, options))}) on {degrees[layers[0]]} GPUs per tower | "
        f"{ms(results[0][0])} | best three: {best} |"
    ]


def inception(nodes: int) -> list[str]:
    """The data-parallel plan of Inception-v3 and the least cost of one all-reduce."""
    machine = Machine.preset("summit", nodes=nodes)
    pcg = weak_scaled("inception_v3", machine.num_devices)
    optimizer = models.ZOO["inception_v3"].optimizer
    _, _, cost = mapped_cost(data_parallel(pcg, machine), machine, optimizer=optimizer)
    weights = [w for w in pcg.weights if w.params["trainable"]]
    everyone = [list(range(machine.num_devices))]
    least = collective_cost("all_reduce", everyone, 4, machine).seconds
    return [
        f"| inception_v3 | {nodes} | data parallel | {ms(cost.total_s)} | compute "
        f"{ms(cost.compute_s)}, communication {ms(cost.comm_s)}, update {ms(cost.update_s)} | "
        f"{len(weights)} weight tensors, each all-reduced over {machine.num_devices} GPUs; one "
        f"all-reduce of 4 bytes costs {ms(least)}: {ms(least * len(weights))} of latency |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    start = time.perf_counter()
    rows = [
        "| model | nodes | plan | predicted time | where the time goes | costliest transfer |",
        "|---|---|---|---|---|---|",
    ]
    parts = [(recommendation, name, nodes) for name in ("dlrm", "xdl") for nodes in (1, 4, 8)]
    parts += [(mlp_assignments, 2), (mlp_assignments, 4), (inception, 8)]
    for make, *part_args in parts:
        new = make(*part_args)
        rows += new
        print(*new, sep="\n", flush=True)
    total = time.perf_counter() - start
    publish(
        HEADING,
        [
            f"Command: `python bench/gaps.py` ({total:.0f} s on the development machine).",
            "",
            "Plans an expert would try where the joint plan falls short of Unity's speedup "
            "(bench/run.py), costed like the search's candidates: weak scaling, Summit, the "
            "optimizer Unity trains the model with, axes placed and branches mapped "
            "(`pcgopt.extract.search.plan.mapped_cost`). 'one GPU': the model as given, "
            "sequential. "
            "'tables whole on k GPUs': each embedding lookup on k GPUs (batch split k ways), "
            "every other operator data parallel on all GPUs or on the first node's, tensors "
            "redistributed between them. MLP: its dense layers alternate between two of the "
            "legal matmul strategies (AutoDDL's (batch, columns, contraction) degrees) at the "
            "branch-parallel plan's degrees. Inception-v3: the data-parallel baseline.",
            "",
            *rows,
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
