"""Reduction-program synthesis (P^2 sections 3.2-3.5) and its simulator (section 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings

from pcgopt.extract.costmodel.cost import collective_cost
from pcgopt.extract.strategies.placement import ParallelismMatrix
from pcgopt.extract.strategies.reduction import (
    InvalidStep,
    ReductionError,
    apply_collective,
    best_program,
    best_reduction,
    execute,
    explore,
    initial_state,
    run_lowered,
    simulate,
    synthesize,
    timeline,
)
from pcgopt.machine import DeviceSpec, Level, Link, Machine
from pcgopt.testing.strategies import Placement, placements

# P^2 Figure 2d: [rack 1, server 2, CPU 2, GPU 4]; data parallelism [1 1 2 2] (axis 0) and
# parameter sharding [1 2 1 2] (axis 1). GPUs A0-A3 are 0-3, B 4-7, C 8-11, D 12-15.
FIG2D = ParallelismMatrix((1, 2, 2, 4), (4, 4), ((1, 1, 2, 2), (1, 2, 1, 2)))
A0, A1, A2, C0 = 0, 1, 2, 8


def _two_level(inter_Bps: float, intra_Bps: float = 100e9, gpus: int = 8) -> Machine:
    device = DeviceSpec("toy", {"f32": 1e12}, 1e12, 2**34, 0.0)
    return Machine(
        (
            Level("node", 2, Link(inter_Bps, 1e-5, "switched")),
            Level("gpu", gpus, Link(intra_Bps, 1e-6, "switched")),
        ),
        device,
    )


# --- Semantics: Figure 4's invalid programs ------------------------------------------------------


def test_figure_4a_reducing_the_halves_of_a_reduce_scatter_together_is_rejected():
    groups = FIG2D.groups([1])
    assert {A0, A1, C0} <= set(groups[0])  # one reduction group (parameter sharding)
    targets = [(op, [(A0, A1)]) for op in ("ReduceScatter", "AllReduce")]
    with pytest.raises(InvalidStep, match="different chunks"):
        run_lowered(targets, groups, 16)


def test_figure_4b_reducing_the_same_data_twice_is_rejected():
    groups = FIG2D.groups([1])
    with pytest.raises(InvalidStep, match="summed twice"):
        run_lowered([("AllReduce", [(A0, C0)]), ("AllReduce", [(A0, C0)])], groups, 16)


def test_reducing_across_the_axis_that_is_not_reduced_is_rejected():
    # A0 and A2 hold different data-parallel replicas: summing them can never be undone.
    with pytest.raises(InvalidStep, match="must not reduce with"):
        run_lowered([("AllReduce", [(A0, A2)])], FIG2D.groups([1]), 16)


def test_the_hoare_rules_of_figure_8():
    s = initial_state(4)
    # ReduceScatter: member i gets block i of the sum, contributed by both.
    a, b = apply_collective("ReduceScatter", [s[0], s[1]])
    assert a == ((0b0011, 0b0011),) and b == ((0b0011, 0b1100),)
    # AllGather of the two halves: the union.
    assert apply_collective("AllGather", [a, b]) == [((0b0011, 0b1111),)] * 2
    # Reduce leaves the others empty; Broadcast needs the root to know more.
    root, other = apply_collective("Reduce", [s[2], s[3]])
    assert root == ((0b1100, 0b1111),) and other == ()
    assert apply_collective("Broadcast", [root, other]) == [root, root]
    with pytest.raises(InvalidStep, match="knows less"):
        apply_collective("Broadcast", [other, root])
    # A root holding every chunk but fewer contributions than a member cannot broadcast: the
    # member would lose what it knows.
    with pytest.raises(InvalidStep, match="knows less"):
        apply_collective("Broadcast", [((0b0001, 0b1111),), ((0b0011, 0b1111),)])
    assert (
        apply_collective("Broadcast", [((0b0011, 0b1111),), ((0b0001, 0b1111),)])
        == [((0b0011, 0b1111),)] * 2
    )
    with pytest.raises(InvalidStep, match="overlapping"):
        apply_collective("AllGather", [a, a])
    with pytest.raises(InvalidStep, match="do not split"):
        apply_collective("ReduceScatter", [s[0], s[1], s[2]])


# --- Synthesis ---------------------------------------------------------------------------------


def test_the_well_known_two_level_programs_are_synthesized_and_ranked_by_the_network():
    programs = synthesize([2, 8], [16], [0], [[2, 8]])
    text = {p.describe(): p for p in programs}
    rab = text["Reduce[L1] ; AllReduce[L0, first] ; Broadcast[L1]"]
    rsaag = text["ReduceScatter[L1] ; AllReduce[L0] ; AllGather[L1]"]
    assert "AllReduce[L0+L1]" in text
    assert all(len(p) <= 5 for p in programs)
    slow = _two_level(inter_Bps=1e9)
    # Both send one buffer's worth through each node's network link (the link is the node's,
    # shared by its GPUs); the ReduceScatter and AllGather inside the node move 7/8 of the
    # buffer where the Reduce and Broadcast chains move all of it.
    assert simulate(rsaag, slow, 2**30) < simulate(rab, slow, 2**30)
    # One flat ring over the slow network sends nearly twice as much through it.
    flat = text["AllReduce[L0+L1]"]
    assert simulate(rab, slow, 2**30) < simulate(flat, slow, 2**30) / 1.8


@settings(max_examples=40, deadline=None)
@given(placements(max_devices=12))
def test_every_synthesized_program_lowers_to_the_requested_reduction(p: Placement):
    programs = synthesize(p.hierarchy, p.axes, p.reduce_axes, p.rows, max_size=4)
    assert programs
    m = ParallelismMatrix(p.hierarchy, p.axes, p.rows)
    for program in programs:
        execute(program)  # raises if a step is invalid or the end is not the AllReduce
        _check_numerically(program, m)


def _check_numerically(program, m: ParallelismMatrix) -> None:
    """An interpreter on numbers that knows nothing of contributor masks: the lowered program
    must leave every device with the sum of its reduction group."""
    n = m.num_devices
    k = math.prod(program.counts) if program.counts else 1
    rng = np.random.default_rng(len(program))
    data = rng.integers(-9, 9, size=(n, k)).astype(float)
    held = {d: {row: data[d, row] for row in range(k)} for d in range(n)}
    for op, groups in program.lowered():
        for g in groups:
            rows = sorted(held[g[0]])
            if op in ("AllReduce", "ReduceScatter", "Reduce"):
                total = {r: sum(held[d][r] for d in g) for r in rows}
                block = len(rows) // len(g)
                for i, d in enumerate(g):
                    if op == "AllReduce":
                        held[d] = dict(total)
                    elif op == "Reduce":
                        held[d] = dict(total) if i == 0 else {}
                    else:
                        held[d] = {r: total[r] for r in rows[i * block : (i + 1) * block]}
            elif op == "AllGather":
                union = {r: v for d in g for r, v in held[d].items()}
                for d in g:
                    held[d] = dict(union)
            else:
                for d in g[1:]:
                    held[d] = dict(held[g[0]])
    # Translate synthesis rows back: each group reduces its own members' data.
    for g in program.groups:
        expected = data[list(g)].sum(axis=0)
        for d in g:
            assert sorted(held[d]) == list(range(k))
            assert np.allclose([held[d][r] for r in range(k)], expected)


def test_reduce_targets_only_need_the_root():
    programs = synthesize([2, 4], [8], [0], [[2, 4]], target="reduce")
    text = {p.describe() for p in programs}
    assert "Reduce[L0+L1]" in text and "Reduce[L1] ; Reduce[L0, first]" in text
    for program in programs:
        execute(program)


def test_a_reduction_over_axes_of_size_one_needs_no_step():
    (program,) = synthesize([2, 4], [8, 1], [1], [[2, 4], [1, 1]])
    assert len(program) == 0 and all(len(g) == 1 for g in program.groups)


# --- Simulation and ranking --------------------------------------------------------------------


def test_one_allreduce_inside_a_node_costs_the_ring_formula():
    # 2 nodes of 16 A100; the reduced axis inside a node: one 16-GPU ring per node, at once.
    m = Machine.preset("dgx-a100", nodes=2)
    matrix = ParallelismMatrix((2, 16), (16, 2), ((1, 16), (2, 1)))
    (program,) = [p for p in synthesize((2, 16), (16, 2), [0], matrix) if len(p) == 1]
    assert program.describe(m) == "AllReduce[gpu]"
    n, p, nvlink = 2**30, 16, m.levels[1].link
    ring = 2 * (p - 1) * nvlink.latency_s + 2 * (p - 1) / p * n / nvlink.bandwidth_Bps
    assert simulate(program, m, n) == pytest.approx(ring)
    assert [c.kind for c in timeline(program, m, n)] == ["all_reduce"]


def test_ranking_placements_and_programs():
    m = Machine.preset("dgx-a100", nodes=2)
    reports = explore(m, [16, 2], [0])
    assert [r.matrix.to_list() for r in reports] == [[[1, 16], [2, 1]], [[2, 8], [1, 2]]]
    inside, across = reports
    assert inside.allreduce_seconds == pytest.approx(
        2 * 15 * 3.4e-6 + 2 * 15 / 16 * 2**31 / 270e9
    )  # one 16-GPU NVSwitch ring per node
    # Result 1: where the axis lands changes the reduction by orders of magnitude.
    assert across.allreduce_seconds > 30 * inside.allreduce_seconds
    # Result 5: across nodes, a topology-aware program beats one AllReduce.
    assert (
        across.best.program.describe(m) == "ReduceScatter[gpu] ; AllReduce[node] ; AllGather[gpu]"
    )
    assert across.best.speedup > 1.5
    ranked = best_reduction(m, [16, 2], [0], top=None)
    assert len(ranked) == sum(len(r.programs) for r in reports)
    assert ranked[0].seconds == min(r.best.seconds for r in reports)


def test_the_cost_model_charges_the_best_program_for_reductions_across_levels():
    m = Machine.preset("summit", nodes=2)
    groups = [tuple(range(12))]
    best = best_program(groups, 1e6, m, target="reduce")
    programs = synthesize(m.counts, [12], [0], [[2, 2, 3]], target="reduce")
    assert best.seconds == pytest.approx(min(simulate(p, m, 1e6) for p in programs))
    charged = collective_cost("reduce", groups, 1e6, m)
    hierarchical = collective_cost("reduce", groups, 1e6, m, algorithm="hierarchical")
    assert charged.algorithm == "synthesized"
    assert charged.seconds == pytest.approx(best.seconds) and charged.seconds < hierarchical.seconds
    assert charged.bytes == pytest.approx(sum(best.bytes_per_level))


def test_bad_requests_are_refused_with_the_reason():
    with pytest.raises(ReductionError, match="target must be one of"):
        synthesize([2, 4], [8], [0], [[2, 4]], target="gather")
    with pytest.raises(ReductionError, match="max_size must be a positive integer"):
        synthesize([2, 4], [8], [0], [[2, 4]], max_size=0)
    program = synthesize([2, 4], [8], [0], [[2, 4]])[0]
    with pytest.raises(ReductionError, match=r"synthesized for hierarchy \[2, 4\]"):
        simulate(program, Machine.preset("dgx-a100", nodes=2), 1e6)
    with pytest.raises(ReductionError, match="bytes_per_device must be a number >= 0"):
        simulate(program, _two_level(1e9, gpus=4), -1)


def test_run_lowered_checks_hand_written_programs():
    # Devices 2 and 3 take no part in the reduction: they must stay as they are.
    state = run_lowered([("AllReduce", [(0, 1)])], [(0, 1)], 4)
    assert state[2] == initial_state(4)[2] and state[0] == ((0b0011, 0b1111),)
    with pytest.raises(InvalidStep, match="must not reduce with"):
        run_lowered([("AllReduce", [(0, 1), (2, 3)])], [(0, 1)], 4)
    with pytest.raises(ReductionError, match=r"step 1 \(AllReduce\): device 0 is in two groups"):
        run_lowered(
            [("AllReduce", [(0, 1), (2, 3)]), ("AllReduce", [(0, 2), (1, 3), (0, 3)])],
            [(0, 1, 2, 3)],
            4,
        )
    with pytest.raises(ReductionError, match=r"device 7 is not one of 0\.\.3"):
        run_lowered([("AllReduce", [(0, 7)])], [(0, 1)], 4)
    with pytest.raises(ReductionError, match="unknown collective 'Gather'"):
        apply_collective("Gather", [()])


@settings(max_examples=30, deadline=None)
@given(placements(max_devices=12))
def test_lowered_groups_span_the_levels_each_step_names(p: Placement):
    machine = Machine(
        tuple(Level(f"l{j}", c, Link(1e9, 1e-6, "switched")) for j, c in enumerate(p.hierarchy)),
        DeviceSpec("toy", {"f32": 1e12}, 1e12, 2**34, 0.0),
    )
    for program in synthesize(p.hierarchy, p.axes, p.reduce_axes, p.rows, max_size=3):
        for step, (_, groups) in zip(program.steps, program.lowered(), strict=True):
            spans = {tuple(g.index for g in machine.group_levels(grp)) for grp in groups}
            assert spans == {program.step_levels(step)}


def test_reduce_programs_leave_the_sum_on_the_root():
    m = ParallelismMatrix((2, 4), (2, 4), ((1, 2), (2, 2)))
    for program in synthesize((2, 4), (2, 4), [1], m, target="reduce"):
        state = execute(program)
        for g in program.groups:
            assert state[g[0]] == ((sum(1 << d for d in g), 0xFF),)


def test_malformed_steps_and_requests_name_the_fault():
    from pcgopt.extract.strategies.reduction import Step

    with pytest.raises(ReductionError, match=r"Parallel\(e\) needs an ancestor level"):
        Step("AllReduce", 1, "Parallel")
    with pytest.raises(ReductionError, match="unknown form 'Inside'"):
        Step("AllReduce", 1, "Inside")
    m = Machine.preset("dgx-a100", nodes=2)
    with pytest.raises(ReductionError, match="nbytes must be a finite number >= 0"):
        best_program([range(32)], -1.0, m)
    assert best_program([range(32)], 0, m).seconds == 0.0
    with pytest.raises(ReductionError, match="top must be a positive integer"):
        best_reduction(m, [32], [0], top=0)
