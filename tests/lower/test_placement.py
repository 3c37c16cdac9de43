"""A plan's device groups on the mesh (pcgopt.lower.placement): the mesh's device order runs
every collective on the devices the plan placed it on, and says where it cannot."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcgopt.extract.costmodel.simulate import ADDITIVE
from pcgopt.extract.search.plan import machine_from_spec
from pcgopt.extract.strategies.baselines import megatron
from pcgopt.extract.strategies.placement import ParallelismMatrix, place_plan
from pcgopt.lower.layout import DeviceGrid, prime_factors
from pcgopt.lower.placement import device_order
from pcgopt.models import build
from pcgopt.testing.strategies import placements

# --- The search (no JAX) -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(placements(max_devices=24), st.randoms(use_true_random=False))
def test_every_parallelism_matrix_is_honoured_whatever_the_mesh_axes_order(placement, rnd):
    """P^2's matrix places each plan axis over levels of the hierarchy; the program runs each
    plan axis over its own mesh axes (one per prime factor). Every reduction over any set of
    plan axes then runs on exactly the matrix's groups."""
    matrix = ParallelismMatrix(placement.hierarchy, placement.axes, placement.rows)
    mesh_axes: list[tuple[str, int, int]] = []  # (name, size, plan axis)
    for i, n in enumerate(placement.axes):
        mesh_axes += [(f"a{i}_{k}", p, i) for k, p in enumerate(prime_factors(n))]
    if not mesh_axes:
        return  # one device: nothing to place
    rnd.shuffle(mesh_axes)
    grid = DeviceGrid(tuple(a[0] for a in mesh_axes), tuple(a[1] for a in mesh_axes))
    real = [i for i, n in enumerate(placement.axes) if n > 1]
    axes_of, groups = {}, {}
    for k in range(1, len(real) + 1):
        for subset in itertools.combinations(real, k):
            name = "over" + "_".join(map(str, subset))
            axes_of[name] = tuple(a[0] for a in mesh_axes if a[2] in subset)
            groups[name] = matrix.groups(subset)
    order = device_order(grid, axes_of, groups)
    assert sorted(order.order) == list(range(grid.size))
    assert not order.unmet and set(order.honoured) == set(groups)
    for name, axes in axes_of.items():
        assert order.groups(grid, axes) == tuple(sorted(groups[name])), name


def test_groups_no_layout_can_pair_are_reported_not_run_as_if_honoured():
    # Both splits on consecutive devices, as the cost model's default placement says of a
    # plan with two axes: no device order makes both mesh groups.
    grid = DeviceGrid.flat(4)
    pairs = ((0, 1), (2, 3))
    order = device_order(grid, {"dp": ("d0",), "tp": ("d1",)}, {"dp": pairs, "tp": pairs})
    assert len(order.honoured) == 1 and len(order.unmet) == 1
    (name, why), kept = next(iter(order.unmet.items())), order.honoured[0]
    assert "no device order" in why
    assert order.groups(grid, {"dp": ("d0",), "tp": ("d1",)}[kept]) == pairs
    assert order.groups(grid, {"dp": ("d0",), "tp": ("d1",)}[name]) == ((0, 2), (1, 3))


def test_a_search_stopped_by_its_budget_says_so():
    grid = DeviceGrid.flat(4)
    pairs = ((0, 1), (2, 3))
    order = device_order(grid, {"dp": ("d0",), "tp": ("d1",)}, {"dp": pairs, "tp": pairs}, budget=2)
    assert any("within 2 steps" in why for why in order.unmet.values())


def test_a_branch_on_a_block_of_devices_constrains_only_those_devices():
    grid = DeviceGrid.flat(8)  # d0, d1, d2
    order = device_order(
        grid,
        {"dp": ("d0",), "branch": ("d1", "d2")},
        {"dp": ((0, 4), (1, 5), (2, 6), (3, 7)), "branch": ((4, 5, 6, 7),)},
    )
    assert set(order.honoured) == {"dp", "branch"}
    assert (4, 5, 6, 7) in order.groups(grid, ("d1", "d2"))


def test_groups_of_another_size_or_beyond_the_mesh_say_why():
    grid = DeviceGrid.flat(4)
    order = device_order(
        grid,
        {"wide": ("d0",), "far": ("d1",), "none": ()},
        {"wide": ((0, 1, 2, 3),), "far": ((4, 5),), "none": ((0, 1),)},
    )
    assert "groups have 4 devices, the program's 2" in order.unmet["wide"]
    assert "beyond the mesh's 4" in order.unmet["far"]
    assert order.silent == ("none",) and "none" not in order.unmet
    assert order.order == (0, 1, 2, 3)


# --- On JAX --------------------------------------------------------------------------------------


def test_a_placed_plan_runs_its_collectives_on_the_placement_groups_and_stays_exact():
    """Megatron on 2 nodes of 4 GPUs, placed by P^2: XLA's compiled groups are the placement's,
    collective by collective, and the loss and gradients are the unsharded model's."""
    pytest.importorskip("jax", reason="running plans needs the optional extra pcgopt[jax]")
    from pcgopt.lower.jax import lower, reference_loss_and_grads

    machine = machine_from_spec("dgx-a100:2:4")
    model = build("transformer", small=True)
    plan = megatron(model, machine)
    # The additive model's placement (tensor parallelism over 2 GPUs of each node and across
    # the nodes): the simulated model's meets a limit of the device order
    # (test_a_placement_with_a_narrowed_part_is_honoured_everywhere).
    placed = place_plan(plan, machine, runtime=ADDITIVE)
    assert placed.devices, placed
    lowered = lower(plan, 8, placement=placed.devices)
    assert not lowered.placement.unmet, lowered.placement.summary()
    # Given the machine, lower places the PCG itself, as place_plan does by default.
    by_default = lower(plan, 8, placement=place_plan(plan, machine).devices)
    assert lower(plan, 8, machine=machine).placement.order == by_default.placement.order
    checks = lowered.group_checks()
    assert len(checks) >= 20 and all(c.agrees for c in checks), [c for c in checks if not c.agrees]
    inputs, weights = lowered.random_sources(seed=3)
    loss, grads = lowered.loss_and_grads(inputs, weights)
    ref_loss, ref_grads = reference_loss_and_grads(model, inputs, weights)
    assert abs(float(loss) - float(ref_loss)) <= 1e-4 * max(1.0, abs(float(ref_loss)))
    for name in lowered.weight_names:
        want = np.asarray(ref_grads[name])
        err = np.max(np.abs(np.asarray(grads[name]) - want), initial=0.0)
        assert err <= 1e-4 * max(1.0, float(np.max(np.abs(want)))), name


@pytest.mark.xfail(
    strict=True,
    reason="known limit: P^2 leaves the embeddings' 2-way data-parallel part on devices 0-1 "
    "while the layers' data parallelism runs across the nodes (0, 4); no mesh order pairs both",
)
def test_a_placement_with_a_narrowed_part_is_honoured_everywhere():
    pytest.importorskip("jax", reason="running plans needs the optional extra pcgopt[jax]")
    from pcgopt.lower.jax import lower

    machine = machine_from_spec("dgx-a100:2:4")
    plan = megatron(build("transformer", small=True), machine)
    placed = place_plan(plan, machine)  # tensor parallel in a node, data parallel across
    assert placed.matrix.rows == ((1, 4), (2, 1))
    lowered = lower(plan, 8, placement=placed.devices)
    assert not lowered.placement.unmet, lowered.placement.summary()


def test_a_placement_that_names_unknown_nodes_is_refused():
    pytest.importorskip("jax", reason="running plans needs the optional extra pcgopt[jax]")
    from pcgopt.lower.jax import LoweringError, lower

    plan = megatron(build("mlp", small=True), machine_from_spec("dgx-a100:1:2"))
    with pytest.raises(LoweringError, match="placement names nodes the plan does not have: nope"):
        lower(plan, 2, placement={"nope": ((0, 1),)})
