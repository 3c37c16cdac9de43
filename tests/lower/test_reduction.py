"""Synthesized reduction programs run as real JAX collectives (psum, psum_scatter, all_gather
under shard_map) on 8 and 16 virtual CPU devices, and equal a plain AllReduce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax", reason="the JAX lowering is the optional extra pcgopt[jax]")

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from pcgopt.extract.strategies.reduction import synthesize
    from pcgopt.lower.reduction import run_allreduce, run_program

    def covering(programs):
        # The fewest programs, in order, that use every (collective, form) pair at least once.
        chosen, covered = [], set()
        for p in programs:
            keys = {(s.collective, s.form) for s in p.steps}
            if keys - covered:
                chosen.append(p)
                covered |= keys
        return chosen, sorted(covered)

    cases = json.loads(sys.argv[1])
    rng = np.random.default_rng(0)
    report = []
    for hierarchy, axes, reduce_axes, rows in cases:
        programs = synthesize(hierarchy, axes, reduce_axes, rows)
        chosen, covered = covering(programs)
        well_known = ("Reduce[L1] ; AllReduce[L0, first] ; Broadcast[L1]",
                      "ReduceScatter[L1] ; AllReduce[L0] ; AllGather[L1]")
        chosen += [p for p in programs if p.describe() in well_known and p not in chosen]
        devices = int(np.prod(hierarchy))
        values = rng.integers(-100, 100, size=(devices, 96)).astype(np.float32)
        plain = run_allreduce(programs[0], values)
        expected = np.empty_like(values)
        for g in programs[0].groups:
            expected[list(g)] = values[list(g)].sum(axis=0)
        longest = max(programs, key=len)
        truncated = run_program(
            type(longest)(longest.steps[:-1], longest.levels, longest.groups,
                          longest.hierarchy), values)
        report.append({
            "case": [hierarchy, axes, reduce_axes, rows],
            "plain_is_group_sum": bool(np.array_equal(plain, expected)),
            "programs": [p.describe() for p in chosen],
            "equal": [bool(np.array_equal(run_program(p, values), plain)) for p in chosen],
            "covered": covered,
            "truncated_differs": not np.array_equal(truncated, plain),
        })
    print(json.dumps(report))
    """
)


def _run(devices: int, cases: list) -> list[dict]:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(cases)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(report: list[dict]) -> None:
    for case in report:
        assert case["plain_is_group_sum"], case["case"]
        assert case["programs"] and all(case["equal"]), case
        assert case["truncated_differs"], case["case"]  # the comparison can fail


@pytest.mark.slow
def test_programs_on_8_virtual_devices_equal_a_plain_allreduce():
    report = _run(8, [[[2, 4], [8], [0], [[2, 4]]], [[2, 4], [2, 4], [1], [[1, 2], [2, 2]]]])
    _check(report)
    # Every collective and every form appears among the programs run.
    covered = {tuple(k) for k in report[0]["covered"]}
    assert {c for c, _ in covered} == {
        "AllReduce",
        "ReduceScatter",
        "AllGather",
        "Reduce",
        "Broadcast",
    }
    assert {f for _, f in covered} == {"InsideGroup", "Parallel", "Master"}


@pytest.mark.slow
def test_programs_on_16_virtual_devices_equal_a_plain_allreduce():
    report = _run(
        16,
        [
            [[2, 8], [4, 4], [0], [[1, 4], [2, 2]]],
            [[2, 8], [16], [0], [[2, 8]]],
            # Two reduction axes collapsed on both levels: axes 0 and 2 of [2, 2, 4].
            [[2, 8], [2, 2, 4], [0, 2], [[1, 2], [1, 2], [2, 2]]],
        ],
    )
    _check(report)
    for program in (
        "Reduce[L1] ; AllReduce[L0, first] ; Broadcast[L1]",
        "ReduceScatter[L1] ; AllReduce[L0] ; AllGather[L1]",
    ):
        assert program in report[1]["programs"]
