"""Layouts of a plan on a device mesh: every shard where an SPMD program computes it."""

import math

import pytest
from hypothesis import given

from pcgopt import PCGBuilder
from pcgopt.extract.search.plan import machine_from_spec
from pcgopt.extract.strategies.baselines import data_parallel, megatron, unity_figure_2b
from pcgopt.lower.layout import DeviceGrid, LayoutError, MeshLayout, assign_layouts
from pcgopt.lower.run import devices_needed
from pcgopt.models import build
from pcgopt.testing.strategies import small_pcgs


def test_a_grid_has_one_axis_per_prime_factor_of_each_level():
    assert DeviceGrid.from_levels([("node", 2), ("gpu", 6)]) == DeviceGrid(
        ("node", "gpu0", "gpu1"), (2, 2, 3)
    )
    assert DeviceGrid.from_levels([("node", 1), ("gpu", 4)]).names == ("gpu0", "gpu1")
    assert DeviceGrid.flat(1).size == 1
    with pytest.raises(LayoutError, match="positive device count"):
        DeviceGrid.from_levels([("gpu", 0)])


def test_data_parallelism_puts_the_batch_on_the_outermost_axes_and_keeps_weights_whole():
    plan = data_parallel(build("mnist_mlp", small=True), machine_from_spec("dgx-a100:1:4"))
    assigned = assign_layouts(plan, DeviceGrid.flat(4))
    assert assigned.layout("x.split") == MeshLayout((("d0", "d1"), ()))
    assert assigned.layout("w1.r4") == MeshLayout(((), ()))
    # The sources are loaded in the layouts the plan stores them in.
    assert assigned.stored == {"x.split": "x", "w1.r4": "w1", "w2.r4": "w2"}


def test_figure_2b_keeps_partial_sums_on_the_axis_its_contraction_is_split_on():
    plan = unity_figure_2b(build("mnist_mlp"), machine_from_spec("dgx-a100:1:2"))
    assigned = assign_layouts(plan, DeviceGrid.flat(2))
    assert assigned.layout("matmul1.input.split") == MeshLayout(((), ("d",)))
    assert assigned.layout("w1.row2") == MeshLayout((("d",), ()))
    assert assigned.layout("matmul1.partial") == MeshLayout(((), ()), ("d",))
    assert assigned.layout("matmul1") == MeshLayout(((), ()))  # the all-reduce's copies


def test_megatron_splits_columns_then_rows_on_the_same_axes():
    plan = megatron(build("bert_large", small=True), machine_from_spec("dgx-a100:1:4"))
    assigned = assign_layouts(plan, DeviceGrid.flat(4))
    ffn1 = assigned.layout("layer0/ffn1/w.tp")
    assert ffn1.dims == ((), ("d0", "d1"))
    assert assigned.layout("layer0/ffn2/w.tp").dims == (("d0", "d1"), ())


def test_a_reduce_scatter_splits_along_the_axes_it_sums_over():
    b = PCGBuilder()
    x = b.partition(b.input((8, 4), name="x"), dim=1, degree=2)
    w = b.partition(b.weight((4, 6), name="w"), dim=0, degree=2)
    y = b.reduce_scatter(b.matmul(x, w), dim=0, degree=2)
    plan = b.build(y)
    assigned = assign_layouts(plan, DeviceGrid.flat(2))
    partial = assigned.layout(plan.node(y.ref.node).inputs[0])
    assert partial.partial == ("d",)
    assert assigned.layout(y.ref) == MeshLayout((("d",), ()))


def test_a_plan_that_ties_two_splits_of_one_tensor_has_no_layout():
    b = PCGBuilder()
    x = b.input((4, 4), name="x")
    y = b.partition(b.partition(x, dim=0, degree=2), dim=1, degree=2)
    plan = b.build(b.add(y, b.transpose(y, perm=(1, 0))))
    with pytest.raises(LayoutError, match="same devices for two of its splits") as err:
        assign_layouts(plan, DeviceGrid.flat(4))
    assert err.value.node is not None


def _summed(b: PCGBuilder, t, axis: int, keep_dim: int):
    """``t`` summed over ``axis`` (then its partial sums reduced), transposed so that the
    dimension that was ``keep_dim`` comes first: a tensor of one split."""
    s = b.reduce(b.reduce_sum(t, axes=(axis,)), degree=2)
    kept = keep_dim - (keep_dim > axis)
    return s if kept == 0 else b.transpose(s, perm=(1, 0))


def test_three_splits_that_share_tensors_pairwise_need_a_larger_mesh():
    """A is split along a and b, B along b and c, C along a and c, and sums tie A's a to C's,
    A's b to B's, B's c to C's: no tensor is wider than 4 devices, yet a, b and c must be on
    three different axes of size 2."""
    b = PCGBuilder()
    x = b.input((4, 4, 4), name="x")

    def split(d1: int, d2: int):
        return b.partition(b.partition(x, dim=d1, degree=2), dim=d2, degree=2)

    a_b, b_c, a_c = split(0, 1), split(1, 2), split(0, 2)
    plan = b.build(
        b.add(_summed(b, a_b, 1, 0), _summed(b, a_c, 2, 0)),
        b.add(_summed(b, a_b, 0, 1), _summed(b, b_c, 2, 1)),
        b.add(_summed(b, b_c, 1, 2), _summed(b, a_c, 0, 2)),
    )
    assert max(s.num_shards for n in plan.nodes for s in plan.output_shapes(n.name)) == 4
    with pytest.raises(LayoutError, match="at least 3 axes of size 2"):
        assign_layouts(plan, DeviceGrid.flat(4))
    assert devices_needed(plan) == 8
    assigned = assign_layouts(plan, DeviceGrid.flat(8))
    assert set(assigned.layout(a_b.ref).axes) | set(assigned.layout(b_c.ref).axes) == {
        "d0",
        "d1",
        "d2",
    }


def test_a_factor_the_mesh_does_not_have_is_named():
    b = PCGBuilder()
    plan = b.build(b.partition(b.input((6, 2), name="x"), dim=0, degree=3))
    with pytest.raises(LayoutError, match="factor of 3") as err:
        assign_layouts(plan, DeviceGrid.flat(4))
    assert err.value.node == plan.nodes[-1].name


def test_splits_by_2_then_3_and_a_combine_by_2_are_named():
    b = PCGBuilder()
    x = b.partition(b.partition(b.input((12, 2), name="x"), dim=0, degree=2), dim=0, degree=3)
    plan = b.build(b.combine(x, dim=0, degree=2))
    with pytest.raises(LayoutError, match="no trailing factors multiply to 2"):
        assign_layouts(plan, DeviceGrid.flat(6))


@given(small_pcgs(max_ops=8))
def test_every_layout_spreads_each_tensor_over_its_degrees_on_distinct_axes(pcg):
    needed = devices_needed(pcg)
    assigned = assign_layouts(pcg, DeviceGrid.flat(needed))
    grid = assigned.grid
    for ref, layout in assigned.layouts.items():
        shape = pcg.shape(ref)
        assert len(set(layout.axes)) == len(layout.axes), (ref, layout)
        for dim, axes in zip(shape.dims, layout.dims, strict=True):
            assert math.prod(grid.axis_size(a) for a in axes) == dim.degree
        assert math.prod(grid.axis_size(a) for a in layout.partial) == shape.sum_degree
