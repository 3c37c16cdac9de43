"""Graph splitting (Unity section 5.3): cuts, segments, seed slices, stitching, and the split
search end to end."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcgopt import Machine, PCGBuilder, PCGError, equivalent
from pcgopt.evaluate import assert_equivalent
from pcgopt.extract import data_parallel, iteration_cost, saturate_and_extract
from pcgopt.extract.search.splitting import (
    Segment,
    cancel_inverse_pairs,
    cut_tensors,
    layout_chain,
    seed_owners,
    seed_slice,
    segment_pcg,
    segment_plans,
    split_search,
    split_segments,
)
from pcgopt.extract.strategies.layerwise import dense_layers
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.models import build
from pcgopt.segments import repeated_run
from pcgopt.shapes import ParallelTensorShape

TWO_GPUS = Machine.preset("summit", nodes=1, devices_per_node=2)


def chain(layers: int = 6, *, batch: int = 64, width: int = 32, tied: bool = False) -> PCG:
    """``layers`` MatMul + ReLU layers; ``tied``: the last layer reads the first one's weight."""
    b = PCGBuilder()
    x = b.input((batch, width), name="x")
    first = b.weight((width, width), name="w0")
    for i in range(layers):
        last = i == layers - 1
        w = first if i == 0 or (tied and last) else b.weight((width, width), name=f"w{i}")
        x = b.relu(b.matmul(x, w, name=f"l{i}/mm"), name=f"l{i}/relu")
    return b.build(x)


def residual_block() -> PCG:
    b = PCGBuilder()
    x = b.relu(b.input((8, 4), name="x"), name="r0")
    h = b.relu(b.matmul(x, b.weight((4, 4), name="w"), name="mm"), name="relu")
    y = b.add(h, x, name="sum")
    return b.build(b.relu(y, name="out"))


# -- cuts and segments ---------------------------------------------------------------------------


def test_a_chain_is_cut_after_every_operator_but_the_last():
    g = chain(3)
    assert [str(ref) for _, ref in cut_tensors(g)] == [
        "l0/mm",
        "l0/relu",
        "l1/mm",
        "l1/relu",
        "l2/mm",
    ]


def test_a_tensor_read_again_later_is_no_cut_inside_the_block_it_skips():
    # r0 is live until the residual add: nothing inside the block is a cut; r0 before it and
    # the sum after it are.
    assert [str(ref) for _, ref in cut_tensors(residual_block())] == ["r0", "sum"]


def test_a_weight_read_on_both_sides_does_not_prevent_a_cut():
    g = chain(4, tied=True)
    segments = split_segments(g, min_ops=4)
    assert len(segments) == 2
    first, last = (segment_pcg(g, s) for s in segments)
    assert "w0" in first and "w0" in last


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(1, 12), min_ops=st.integers(1, 9))
def test_segments_cover_the_graph_in_order_and_each_is_big_enough(layers, min_ops):
    g = chain(layers)
    segments = split_segments(g, min_ops)
    computed = [n.name for n in g.nodes if n.op not in ("input", "weight")]
    assert [name for s in segments for name in s.nodes] == computed
    assert segments[0].entry is None and segments[-1].exit is None
    for before, after in itertools.pairwise(segments):
        assert after.entry == before.exit
    if len(segments) > 1:
        assert all(len(s.nodes) >= min_ops for s in segments)
    else:
        assert len(computed) < 2 * min_ops


def test_min_ops_must_be_positive():
    with pytest.raises(PCGError, match="min_ops"):
        split_segments(chain(2), 0)


# -- a segment and a seed's slice of it ---------------------------------------------------------


def test_the_longest_run_of_equal_segments_shortens_to_fewer_repeats_of_the_same_layer():
    g = build("bert_large", layers=6, seq=32, hidden=64, heads=4, batch=8)
    run = repeated_run(g)
    assert run is not None and (run.start, run.length) == (2, 3)
    assert run.shortened(run.length) == g
    one, two = run.shortened(1), run.shortened(2)
    dense = dense_layers(g)
    # The short models keep their layers' names: the first repeats' dense layers, and the rest.
    assert set(dense_layers(one)) < set(dense_layers(two)) < set(dense)
    per_layer = len(dense_layers(two)) - len(dense_layers(one))
    assert len(dense) - len(dense_layers(two)) == per_layer * (run.length - 2)
    assert one.outputs == g.outputs and one.shape(one.outputs[0]) == g.shape(g.outputs[0])
    with pytest.raises(PCGError, match="repeats must be 1 to 3"):
        run.shortened(4)


def test_the_first_and_last_segments_are_never_in_a_run_and_unequal_ones_make_none():
    run = repeated_run(chain(8), min_ops=2)  # a segment per layer; the last returns the output
    assert run is not None and (run.start, run.length) == (1, 6)
    assert repeated_run(chain(3), min_ops=2) is None  # only one segment between first and last
    assert repeated_run(residual_block(), min_ops=1) is None


def test_a_segment_reads_its_entry_as_an_input_and_returns_its_exit_in_each_layout():
    g = chain(4)
    first, second = split_segments(g, min_ops=4)
    split = ParallelTensorShape.of((64, 32)).with_degree(0, 2)
    seg = segment_pcg(g, second, ())
    assert seg.node(str(second.entry)).op == "input"
    out = segment_pcg(g, first, (split,))
    assert [out.shape(r) for r in out.outputs] == [g.shape(first.exit), split]


@pytest.mark.parametrize("model", ["transformer", "inception_v3"])
def test_a_segment_built_from_the_model_s_shapes_is_the_one_validated_again(model):
    """segment_pcg takes the model's shapes instead of inferring them again: the PCG is the
    one a full validation builds, shapes and all."""
    from pcgopt.models import build

    g = build(model, small=True)
    for s in split_segments(g, min_ops=4):
        fast = segment_pcg(g, s)
        again = PCG(list(fast.nodes), fast.outputs)
        assert fast == again
        assert all(fast.output_shapes(n.name) == again.output_shapes(n.name) for n in fast.nodes)


def test_partial_sums_are_no_layout_across_a_cut():
    with pytest.raises(PCGError, match="partial"):
        layout_chain(ParallelTensorShape.of((4, 4), sum_degree=2))


def test_a_seed_slice_computes_what_its_segment_computes():
    g = chain(6)
    seed = data_parallel(g, TWO_GPUS)
    segments = split_segments(g, min_ops=4)
    owners = seed_owners(seed, segments)
    for s in segments:
        layouts = () if s.exit is None else (seed.shape(s.exit),)
        part = seed_slice(seed, g, s, owners, layouts)
        assert part is not None, s
        own = segment_pcg(g, s, layouts)
        assert [part.shape(r) for r in part.outputs] == [own.shape(r) for r in own.outputs]
        assert equivalent(own, part)


# -- stitching -------------------------------------------------------------------------------------


def _split_then_joined(combine_degree: int) -> PCG:
    nodes = [
        Node("x", "input", (), {"shape": (8, 4)}),
        Node("p", "partition", ("x",), {"dim": 0, "degree": 2}),
        Node("r", "relu", ("p",)),
        Node("c", "combine", ("r",), {"dim": 0, "degree": combine_degree}),
        Node("p2", "partition", ("c",), {"dim": 0, "degree": 2}),
        Node("r2", "relu", ("p2",)),
        Node("c2", "combine", ("r2",), {"dim": 0, "degree": 2}),
    ]
    return PCG(nodes, [TensorRef("c2")])


def test_a_partition_that_undoes_a_combine_is_removed_and_the_value_kept():
    g = _split_then_joined(2)
    tidy = cancel_inverse_pairs(g)
    assert [n.op for n in tidy.nodes] == ["input", "partition", "relu", "relu", "combine"]
    assert equivalent(g, tidy)


def test_a_partition_of_another_degree_is_kept():
    nodes = [
        Node("x", "input", (), {"shape": (8, 4)}),
        Node("p", "partition", ("x",), {"dim": 0, "degree": 4}),
        Node("c", "combine", ("p",), {"dim": 0, "degree": 4}),
        Node("p2", "partition", ("c",), {"dim": 0, "degree": 2}),
    ]
    g = PCG(nodes, [TensorRef("p2")])
    assert cancel_inverse_pairs(g) == g


# -- the search ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deep_chain_search():
    g = chain(8)
    seed = data_parallel(g, TWO_GPUS)
    return g, seed, split_search(g, TWO_GPUS, seeds=[seed], min_ops=4, saturate_s=8, extract_s=4)


def test_the_stitched_plan_computes_what_the_model_computes(deep_chain_search):
    g, _, search = deep_chain_search
    assert search is not None and search.pcg is not None, search
    assert len(search.segments) == 4
    assert equivalent(g, search.pcg)


def test_segments_equal_up_to_names_share_one_e_graph(deep_chain_search):
    _, _, search = deep_chain_search
    # The first segment reads the model's input, the last returns its output; the two in
    # between are the same layers under other names.
    assert search.saturations == 3


def test_the_batch_split_is_kept_across_the_cuts(deep_chain_search):
    _, seed, search = deep_chain_search
    plan = search.pcg
    # The seed splits the batch once and joins it once; a stitched plan that did not hand the
    # split layout across the cuts would join and split it again at each of the three.
    assert sum(n.op == "combine" for n in plan.nodes) <= 1
    assert iteration_cost(plan, TWO_GPUS).total_s <= iteration_cost(seed, TWO_GPUS).total_s


def test_the_dp_predicts_what_the_cost_model_says_of_the_stitched_plan(deep_chain_search):
    # Boundaries are priced as they are stitched: Combines where the layout changes, nothing
    # where a layout handed on is read as it is.
    _, _, search = deep_chain_search
    assert search.predicted_s == pytest.approx(
        iteration_cost(search.pcg, TWO_GPUS).total_s, rel=1e-6
    )


def test_the_split_search_honours_the_memory_budget_and_shows_saturations_bar(capsys):
    g = chain(8)
    search = split_search(
        g, TWO_GPUS, min_ops=4, saturate_s=8, extract_s=4, memory_budget=1, progress_bar=True
    )
    assert search is not None and search.stop_reasons == {"memory budget": search.saturations}
    assert search.iterations == 0
    assert search.pcg is not None and equivalent(g, search.pcg)
    split_search(g, TWO_GPUS, min_ops=4, saturate_s=2, extract_s=1, progress_bar=True)
    assert "saturate [" in capsys.readouterr().err


def test_every_run_of_segments_is_a_plan_of_its_own():
    """The e-graph's plan of each segment, handing its exit on unsplit, joins with its
    neighbours' into a plan of any run of them (a pipeline stage): it computes what that part
    of the model does, the layout kept across a cut costing nothing."""
    g = chain(8)
    segments = split_segments(g, 4)
    plans = segment_plans(
        g, TWO_GPUS, segments, seeds=[data_parallel(g, TWO_GPUS)], saturate_s=8, extract_s=4
    )
    assert plans.search.saturations == 3 and len(plans.parts) == 4
    assert equivalent(g, plans.span(0, 4))
    middle = plans.span(1, 3)
    merged = Segment(1, segments[1].nodes + segments[2].nodes, segments[1].entry, segments[2].exit)
    assert_equivalent(middle, segment_pcg(g, merged), compare="logical")
    with pytest.raises(PCGError, match="segments 3 to 4: the model has segments 0 to 3"):
        plans.span(3, 5)


def test_a_run_of_segments_keeps_the_layout_across_its_cuts():
    """Where splitting the batch pays, each segment alone gathers its exit; two joined keep
    the split across the cut between them (a Combine then the same Partition cancel)."""
    g = chain(8, batch=4096, width=1024)
    segments = split_segments(g, 4)
    plans = segment_plans(
        g, TWO_GPUS, segments, seeds=[data_parallel(g, TWO_GPUS)], saturate_s=8, extract_s=4
    )

    def combines(plan):
        return sum(n.op == "combine" for n in plan.nodes)

    alone = [combines(plans.span(k, k + 1)) for k in (1, 2)]
    assert min(alone) >= 1 and combines(plans.span(1, 3)) < sum(alone)


def test_a_graph_without_two_big_segments_is_not_split():
    assert split_search(chain(2), TWO_GPUS, min_ops=4) is None


def test_saturate_and_extract_splits_on_request_and_reports_the_segments(two_iterations):
    g = chain(8)
    # Deterministic: under a time budget the rules' load could leave saturation no time.
    plan = saturate_and_extract(g, TWO_GPUS, deterministic=True, split=True, min_segment_ops=4)
    assert plan.stats.segments == 4
    assert plan.check.startswith("equivalent")
    whole = saturate_and_extract(g, TWO_GPUS, time_budget_s=4, split=False, min_segment_ops=4)
    assert whole.stats.segments == 1
