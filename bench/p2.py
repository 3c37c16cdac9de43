"""P^2 on the systems of its Figure 9: placements, synthesized reduction programs, simulated times.

For 2 and 4 nodes of 16 A100 (preset ``dgx-a100``, hierarchy [nodes 16]) and 2 and 4 nodes of
8 V100 (preset ``v100-ring``, [nodes 8]), every single-axis and two-axis configuration (every
ordered pair of axis sizes multiplying to the device count, reduction on either axis): the
number of parallelism matrices, the number of valid programs (at most 5 steps), and per matrix
the simulated time of one AllReduce, the best program and its speedup. The message is P^2's:
2^29 float32 values per device per node (section 4). Also the synthesis time for three axes on
4 nodes, P^2's case (3) (reduction on the first and third axes).

    python bench/p2.py             # prints, and updates the P^2 section of bench/RESULTS.md
    python bench/p2.py --no-write
"""

from __future__ import annotations

import argparse
import statistics
import time

from _results import publish

from pcgopt import Machine
from pcgopt.extract.strategies.placement import matrices
from pcgopt.extract.strategies.reduction import _synthesize_counts, explore, synthesize

HEADING = "## P^2: placements and reduction programs"
SYSTEMS = (("dgx-a100", 2), ("dgx-a100", 4), ("v100-ring", 2), ("v100-ring", 4))


def configurations(devices: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(axes, reduce axes): one axis; every ordered pair of axes, reducing over either."""
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = [((devices,), (0,))]
    for a in range(2, devices):
        if devices % a == 0:
            out += [((a, devices // a), (0,)), ((a, devices // a), (1,))]
    return out


def run() -> tuple[list[str], list[str]]:
    rows = [
        "| system | axes | reduce | matrices | programs | matrix | one AllReduce | best program "
        "| best | speedup |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    speedups: list[float] = []
    for preset, nodes in SYSTEMS:
        machine = Machine.preset(preset, nodes=nodes)
        nbytes = 2**29 * nodes * 4
        for axes, reduce_axes in configurations(machine.num_devices):
            reports = explore(machine, axes, reduce_axes, bytes_per_device=nbytes)
            total = sum(len(r.programs) for r in reports)
            for i, r in enumerate(reports):
                best = r.best
                speedups.append(best.speedup)
                lead = (
                    f"| {preset}:{nodes} | {list(axes)} | {list(reduce_axes)} | {len(reports)} "
                    f"| {total} "
                    if i == 0
                    else "| | | | | "
                )
                rows.append(
                    lead + f"| {r.matrix.to_list()} ({len(r.programs)}) "
                    f"| {r.allreduce_seconds * 1e3:.1f} ms | {best.program.describe(machine)} "
                    f"| {best.seconds * 1e3:.1f} ms | {best.speedup:.2f}x |"
                )
    better = [s for s in speedups if s > 1.0 + 1e-9]
    summary = [
        f"{len(speedups)} (configuration, matrix) pairs; a synthesized program beats one "
        f"AllReduce on {len(better)} ({100 * len(better) / len(speedups):.0f}%), by "
        f"{statistics.mean(better):.2f}x on average and {max(better):.2f}x at most "
        "(P^2 measured 69%, 1.27x on average, 2.04x at most on real hardware).",
    ]
    return rows, summary


def synthesis_times() -> list[str]:
    lines = []
    for preset, axes, reduce_axes in (
        ("dgx-a100", (4, 2, 8), (0, 2)),
        ("v100-ring", (4, 2, 4), (0, 2)),
        ("v100-ring", (2, 4, 4), (0, 2)),
    ):
        machine = Machine.preset(preset, nodes=4)
        _synthesize_counts.cache_clear()
        start = time.perf_counter()
        found = [
            synthesize(machine.counts, axes, reduce_axes, m) for m in matrices(machine.counts, axes)
        ]
        synth = time.perf_counter() - start
        start = time.perf_counter()
        explore(machine, axes, reduce_axes, bytes_per_device=2**29 * 4 * 4)
        both = time.perf_counter() - start
        lines.append(
            f"| {preset}:4 | {list(axes)} | {list(reduce_axes)} | {len(found)} "
            f"| {sum(map(len, found))} | {synth:.3f} s | {both:.2f} s |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    rows, summary = run()
    times = synthesis_times()
    seconds = time.perf_counter() - start
    publish(
        HEADING,
        [
            f"Command: `python bench/p2.py` ({seconds:.0f} s on the development machine).",
            "",
            "The systems of P^2's Figure 9 with the bandwidths its simulator assumes (presets "
            "`dgx-a100`: [nodes 16], NVSwitch 270 GB/s, one 8 GB/s NIC per node; `v100-ring`: "
            "[nodes 8], NVLink ring 135 GB/s, 8 GB/s NIC). Times are "
            "`pcgopt.extract.strategies.reduction.simulate` (each step a flat alpha-beta "
            "collective; groups "
            "that run at once share the links of the units they occupy), for 2^29 float32 "
            "values per device per node. 'matrix (n)': the parallelism matrix, rows per axis, "
            "with its number of valid programs of at most 5 steps. Speedup: one AllReduce on the "
            "same matrix over the best program.",
            "",
            *summary,
            "",
            *rows,
            "",
            "Synthesis time for three parallelism axes on 4 nodes (every matrix; P^2 reports up "
            "to about 3 s with simulation). Synthesis alone, then synthesis and simulation of "
            "every program:",
            "",
            "| system | axes | reduce | matrices | programs | synthesis | with simulation |",
            "|---|---|---|---|---|---|---|",
            *times,
            "",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
