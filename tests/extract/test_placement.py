"""Parallelism matrices (P^2 section 3.1) and the device groups of a reduction under them."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings

from pcgopt.extract.strategies.placement import (
    ParallelismMatrix,
    PlacementError,
    matrices,
    parallelism_matrices,
)
from pcgopt.testing.strategies import Placement, placements


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _brute_force(hierarchy: list[int], axes: list[int]) -> set[tuple[tuple[int, ...], ...]]:
    """Every matrix of divisors whose rows and columns multiply right, by exhaustion."""
    cells = [_divisors(min(a, h)) for a in axes for h in hierarchy]
    found = set()
    for flat in itertools.product(*cells):
        rows = tuple(
            tuple(flat[i * len(hierarchy) : (i + 1) * len(hierarchy)]) for i in range(len(axes))
        )
        if all(math.prod(r) == a for r, a in zip(rows, axes, strict=True)) and all(
            math.prod(col) == h for col, h in zip(zip(*rows, strict=True), hierarchy, strict=True)
        ):
            found.add(rows)
    return found


def test_the_figure_2_placements_are_among_the_matrices():
    # P^2 Figure 2: rack 1, servers 2, CPUs 2, GPUs 4; data parallelism 4 x 4 parameter shards.
    found = parallelism_matrices([1, 2, 2, 4], [4, 4])
    assert [[1, 2, 2, 1], [1, 1, 1, 4]] in found  # Figure 2b: each CPU one replica
    assert [[1, 1, 2, 2], [1, 2, 1, 2]] in found  # Figure 2d
    assert len(found) == len({str(m) for m in found})  # no duplicates


def test_two_axes_on_two_nodes_of_sixteen():
    assert parallelism_matrices([2, 16], [4, 8]) == [[[1, 4], [2, 4]], [[2, 2], [1, 8]]]


@settings(max_examples=60, deadline=None)
@given(placements(max_devices=24))
def test_matrices_are_exactly_those_whose_rows_and_columns_multiply_right(p: Placement):
    found = matrices(p.hierarchy, p.axes)
    assert {m.rows for m in found} == _brute_force(list(p.hierarchy), list(p.axes))
    assert p.rows in {m.rows for m in found}


@settings(max_examples=60, deadline=None)
@given(placements())
def test_reduction_groups_partition_the_devices_and_vary_only_the_reduced_axes(p: Placement):
    m = ParallelismMatrix(p.hierarchy, p.axes, p.rows)
    groups = m.groups(p.reduce_axes)
    size = math.prod(p.axes[i] for i in p.reduce_axes)
    assert sorted(d for g in groups for d in g) == list(range(m.num_devices))
    assert all(len(g) == size and list(g) == sorted(g) for g in groups)
    for g in groups:
        kept = {
            tuple(v for i, v in enumerate(m.axis_indices(d)) if i not in p.reduce_axes) for d in g
        }
        assert len(kept) == 1
    # Every device holds a distinct combination of axis indices, and digits round-trip.
    assert len({m.axis_indices(d) for d in range(m.num_devices)}) == m.num_devices
    assert all(m.device(m.digits(d)) == d for d in range(m.num_devices))
    # The synthesis hierarchy covers exactly the group.
    assert math.prod(c for _, c in m.reduction_levels(p.reduce_axes)) == size


def test_where_an_axis_lands_decides_which_links_its_reduction_crosses():
    # Figure 2b: parameter sharding inside each CPU; its reductions stay among 4 GPUs of a CPU.
    inside = ParallelismMatrix((1, 2, 2, 4), (4, 4), ((1, 2, 2, 1), (1, 1, 1, 4)))
    assert inside.groups([1])[:2] == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert inside.reduction_levels([1]) == ((3, 4),)
    # Figure 2d: half of the reduction inside a CPU, the rest across servers.
    spread = ParallelismMatrix((1, 2, 2, 4), (4, 4), ((1, 1, 2, 2), (1, 2, 1, 2)))
    assert spread.groups([1])[0] == (0, 1, 8, 9)
    assert spread.reduction_levels([1]) == ((1, 2), (3, 2))


def test_bad_placements_are_refused_with_the_reason():
    with pytest.raises(PlacementError, match=r"multiply to 8 but .* has 16 devices.* size 2"):
        parallelism_matrices([2, 8], [2, 4])
    with pytest.raises(PlacementError, match=r"hierarchy\[1\] must be a positive integer"):
        parallelism_matrices([2, 0], [2])
    with pytest.raises(PlacementError, match=r"column 0 \[2, 2\] multiplies to 4"):
        ParallelismMatrix((2, 8), (4, 4), ((2, 2), (2, 2)))
    with pytest.raises(PlacementError, match=r"rows\[0\] has 1 entries"):
        ParallelismMatrix((2, 8), (16,), ((16,),))
    m = ParallelismMatrix((2, 8), (4, 4), ((1, 4), (2, 2)))
    with pytest.raises(PlacementError, match="reduce axis 2 is not one of the 2 axes"):
        m.groups([2])
    with pytest.raises(PlacementError, match="names an axis twice"):
        m.groups([0, 0])
    with pytest.raises(PlacementError, match=r"device 16 is not one of 0\.\.15"):
        m.axis_indices(16)
    with pytest.raises(PlacementError, match=r"digits\[0\]\[1\] must be in 0\.\.3, got 9"):
        m.device(((0, 9), (0, 0)))


def test_placing_a_hybrid_plan_keeps_tensor_parallelism_inside_a_socket():
    from pcgopt.extract.costmodel.cost import iteration_cost
    from pcgopt.extract.strategies.baselines import megatron
    from pcgopt.extract.strategies.placement import place_plan, plan_axes, sub_hierarchies
    from pcgopt.machine import Machine
    from pcgopt.models import ZOO

    summit = Machine.preset("summit", nodes=2)  # [node 2, socket 2, gpu 3]
    plan = megatron(ZOO["mlp"].build(), summit)  # 4-way data x 2-way tensor parallelism
    assert plan_axes(plan) == ((4, 2), {4: (0,), 2: (1,)}, "")
    assert (2, 2, 2) in sub_hierarchies(summit.counts, 8)
    placed = place_plan(plan, summit)
    assert placed.matrix is not None and placed.matrix.rows == ((2, 2, 1), (1, 1, 2))
    assert placed.cost.total_s == iteration_cost(plan, summit, devices=placed.devices).total_s
    # Consecutive devices (the cost model's default) straddle sockets on Summit's 3-GPU sockets.
    assert placed.cost.total_s < iteration_cost(plan, summit).total_s
    # Every other placement of the same axes is slower: where the axes land matters.
    assert placed.considered == 3
    others = [t for m, t in placed.tried if m != placed.matrix]
    assert len(others) == 2 and all(t > placed.cost.total_s for t in others)


def test_a_time_limit_keeps_the_first_matrix_tried_and_counts_the_rest():
    from pcgopt.extract.strategies.baselines import megatron
    from pcgopt.extract.strategies.placement import place_plan
    from pcgopt.machine import Machine
    from pcgopt.models import ZOO

    summit = Machine.preset("summit", nodes=2)
    plan = megatron(ZOO["mlp"].build(), summit)
    whole = place_plan(plan, summit)
    cut = place_plan(plan, summit, time_limit_s=0.0)
    assert (cut.considered, cut.untried) == (1, whole.considered - 1) == (1, 2)
    assert cut.tried == whole.tried[:1] and cut.matrix == whole.tried[0][0]
    assert "2 left untried (time limit)" in repr(cut) and whole.untried == 0


def test_a_matrix_remembers_its_groups_without_changing_what_it_equals():
    m = ParallelismMatrix((2, 8), (4, 4), ((1, 4), (2, 2)))
    fresh = ParallelismMatrix((2, 8), (4, 4), ((1, 4), (2, 2)))
    first = m.groups([1])
    assert m.groups([1]) is first and m.groups((1,)) is first  # computed once per axes
    assert m == fresh and hash(m) == hash(fresh) and fresh.groups([1]) == first
    assert m.groups([0]) != first


def test_plans_whose_axes_cannot_be_named_keep_the_default_placement():
    from pcgopt.extract.strategies.baselines import megatron
    from pcgopt.extract.strategies.placement import place_plan
    from pcgopt.machine import Machine
    from pcgopt.models import ZOO

    m = Machine.preset("summit", nodes=1)
    placed = place_plan(megatron(ZOO["mlp"].build(), m), m)  # 2 x 2: which axis is which?
    assert placed.matrix is None and "nested axes of the same size" in placed.reason


def test_a_branch_narrowed_to_one_group_runs_on_consecutive_devices_beside_the_others():
    from pcgopt import Machine, PCGBuilder
    from pcgopt.extract.search.mapping import map_machine
    from pcgopt.extract.strategies.branches import lower_degrees
    from pcgopt.extract.strategies.layerwise import MatmulStrategy
    from pcgopt.extract.strategies.placement import parallel_nodes, place_plan, plan_axes

    b = PCGBuilder()
    x = b.input((96, 1024), name="x")
    left = b.relu(b.matmul(x, b.weight((1024, 1024), name="w_left"), name="left"), name="l_relu")
    right = b.relu(b.matmul(x, b.weight((1024, 1024), name="w_right"), name="right"), name="r_relu")
    joined = b.add(left, right, name="join")
    pcg = b.build(b.matmul(joined, b.weight((1024, 1024), name="w_top"), name="top"))
    summit = Machine.preset("summit")  # one node: 2 sockets of 3 GPUs
    # Each branch data parallel on 2 GPUs; the top layer 3-way data x 2-way tensor parallel.
    degrees = {"left": 2, "l_relu": 2, "right": 2, "r_relu": 2, "join": 6, "top": 6}
    plan = lower_degrees(pcg, summit, degrees, {"top": MatmulStrategy(3, 2, 1)})
    assert plan_axes(plan)[:2] == ((3, 2), {3: (0,), 2: (1,)})
    placed = place_plan(plan, summit)
    # The branches' weight copies and input split: one group of 2, on 2 devices. The 2-way axis
    # spans the sockets; these keep two neighbouring GPUs instead (the cost model's default).
    narrow = {n for n, d, w in parallel_nodes(plan) if d == w == 2}
    assert narrow == {"x.split", "w_left.r2", "w_right.r2", "w_top.s", "top.combine1"}
    assert not {"x.split", "w_left.r2", "w_right.r2"} & set(placed.devices)
    # A 2-device chain that meets the tensor-parallel layer keeps the axes: the top weight's
    # column split (replicated 3 ways next) and the Combine of the layer's column shards.
    assert placed.devices["w_top.s"] == placed.devices["top.combine1"] == ((0, 3),)
    # So the two branches fit beside each other (2 + 2 of 6 devices) and run at once.
    mapping = map_machine(plan, summit, cost=placed.cost, devices=placed.devices)
    assert mapping.divided_splits == 1 and mapping.time_s < placed.cost.total_s


def test_a_weight_copied_in_two_steps_syncs_its_gradient_in_groups_across_all_its_copies():
    """A weight replicated 2 then 3 ways (6 copies, as extraction can give it) syncs the
    gradient of the first Replicate over 3 groups of 2: its groups are placed at the width
    of the layout the weight is stored in, not at the 2 devices its own output spans."""
    from pcgopt import Machine, PCGBuilder
    from pcgopt.extract import iteration_cost
    from pcgopt.extract.search.plan import mapped_cost
    from pcgopt.extract.strategies.placement import place_plan

    b = PCGBuilder()
    x = b.replicate(b.partition(b.input((96, 64), name="x"), dim=0, degree=3), degree=2)
    w = b.weight((64, 64), name="w")
    w6 = b.replicate(b.replicate(w, degree=2, name="w.r2"), degree=3, name="w.r6")
    pcg = b.build(b.matmul(x, w6, name="mm"))
    summit = Machine.preset("summit")  # one node: 2 sockets of 3 GPUs
    placed = place_plan(pcg, summit)
    assert placed.matrix is not None
    first, second = placed.devices["w.r2"], placed.devices["w.r6"]
    assert len(first) == 3 and all(len(g) == 2 for g in first)
    assert sorted(d for g in first for d in g) == list(range(6))
    assert len(second) == 2 and all(len(g) == 3 for g in second)
    # The cost model accepts the placement and syncs over those groups.
    cost = iteration_cost(pcg, summit, devices=placed.devices)
    assert cost.total_s == pytest.approx(placed.cost.total_s)
    _, _, mapped = mapped_cost(pcg, summit)
    assert mapped.feasible


def test_placement_groups_give_the_placed_plan_its_groups_and_spread_degrees_it_cannot_make():
    """Extraction with placement in the loop prices the e-graph's other choices on a
    placement's groups: the plan's own collectives get exactly the groups the placement gave
    them, and a degree no set of its axes multiplies to is spread across the machine rather
    than given the closest devices."""
    from pcgopt.extract.costmodel.cost import default_groups
    from pcgopt.extract.strategies.baselines import megatron
    from pcgopt.extract.strategies.placement import (
        PlanPlacement,
        parallel_nodes,
        place_plan,
        placement_groups,
    )
    from pcgopt.machine import Machine
    from pcgopt.models import ZOO

    summit = Machine.preset("summit", nodes=2)  # [node 2, socket 2, gpu 3]
    plan = megatron(ZOO["mlp"].build(), summit)
    placed = place_plan(plan, summit)  # axes (4, 2) on 8 of the 12 GPUs
    groups = placement_groups(placed, summit)
    widths = {name: (degree, width) for name, degree, width in parallel_nodes(plan)}
    assert placed.devices
    for name, among in placed.devices.items():
        assert groups(*widths[name]) == among
    # 3 is no product of the axes (4, 2), and 12 devices are more than the plan's 8.
    assert groups(3, 12) == ((0, 4, 8), (1, 5, 9), (2, 6, 10), (3, 7, 11))
    assert groups(3, 12) != default_groups(3, 12)
    kept = PlanPlacement((), None, {}, placed.cost, reason="no axes")
    assert placement_groups(kept, summit) is default_groups
