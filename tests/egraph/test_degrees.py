"""Saturation restricted to chosen degrees, and the opt-in rules of two degrees (``layouts``)
that relate the orders in which a plan and the e-graph compose data and tensor parallelism."""

import pytest

from pcgopt import Machine, PCGBuilder
from pcgopt.egraph import Budget, saturate, saturate_split, shipped_presets
from pcgopt.egraph.translate import legal_degrees
from pcgopt.extract.strategies.baselines import megatron
from pcgopt.models import bert_large
from pcgopt.rewrite import Rule
from pcgopt.rules import LAYOUTS_RULES_FILE, OPT_IN, load
from pcgopt.rules.enumerate import Config
from pcgopt.rules.families import LAYOUTS

FOUR_GPUS = Machine.preset("v100-ring", devices_per_node=4)


def test_level_degrees_are_the_products_of_whole_levels():
    assert Machine.preset("dgx-a100", nodes=4).level_degrees() == (4, 16, 64)
    assert Machine.preset("dgx-a100", nodes=1, devices_per_node=8).level_degrees() == (8,)
    assert Machine.preset("dgx-a100", nodes=2, devices_per_node=2).level_degrees() == (2, 4)


def test_chosen_degrees_must_divide_the_device_count():
    assert legal_degrees(64, (64, 4, 16, 4)) == [4, 16, 64]
    with pytest.raises(ValueError, match=r"3 is not a degree .* 4 devices; valid: .*\[2, 4\]"):
        legal_degrees(4, (2, 3))
    with pytest.raises(ValueError, match="at least one"):
        legal_degrees(4, ())


def one_matrix():
    b = PCGBuilder()
    return b, b.input((8, 12), name="x")


def test_bad_degrees_and_presets_are_named_before_saturation():
    b, x = one_matrix()
    pcg = b.build(b.relu(x))
    with pytest.raises(ValueError, match="1 is not a degree"):
        saturate(pcg, FOUR_GPUS, degrees=(1,))
    with pytest.raises(ValueError, match=r"no shipped rule file 'layout'; valid: \["):
        saturate(pcg, FOUR_GPUS, presets=("layout",))
    with pytest.raises(TypeError, match="sequence of names"):
        saturate(pcg, FOUR_GPUS, presets="layouts")
    with pytest.raises(ValueError, match="rules or presets"):
        saturate(pcg, FOUR_GPUS, rules=[], presets=("layouts",))


def test_a_saturation_chooses_only_the_given_degrees():
    # x = combine(partition(x, dim=0, degree=k), dim=0, degree=k): the new side chooses k.
    introduce = Rule.parse(
        "introduce_partition",
        "x",
        "combine(partition(x, dim=0, degree=k), dim=0, degree=k)",
        {"x": "f32[a, b]"},
    )
    b, x = one_matrix()
    pcg = b.build(b.relu(x))

    def degrees_of_partitions(sat):
        return {n.params["degree"] for n in sat.egraph.nodes if n.op == "partition"}

    assert degrees_of_partitions(saturate(pcg, FOUR_GPUS, rules=[introduce])) == {2, 4}
    only = saturate(pcg, FOUR_GPUS, rules=[introduce], degrees=(4,))
    assert degrees_of_partitions(only) == {4}


def copies(degrees):
    b, x = one_matrix()
    for d in degrees:
        x = b.replicate(x, degree=d)
    return b.build(x)


def test_layouts_relate_copies_of_two_degrees_within_the_legal_degrees():
    rules = load(LAYOUTS_RULES_FILE)
    sat = saturate(copies([2, 2]), FOUR_GPUS, rules=rules)
    assert sat.contains(copies([4]))
    # 2*2 is not among the chosen degrees: the product is guarded like a chosen degree.
    only_two = saturate(copies([2, 2]), FOUR_GPUS, rules=rules, degrees=(2,))
    assert not only_two.contains(copies([4]))
    # Without the layouts, one degree's rules do not relate them.
    assert not saturate(copies([2, 2]), FOUR_GPUS).contains(copies([4]))


SIX_GPUS = Machine.preset("summit", nodes=1)


def splits(degrees):
    b = PCGBuilder()
    x = b.input((12, 12), name="x")
    for d in degrees:
        x = b.partition(x, dim=0, degree=d)
    return b.build(x)


def test_layouts_split_a_degree_into_legal_factors():
    # partition(x, k*j) => partition(partition(x, k), j), used from right to left: a match of
    # degree 6 chooses k among the legal degrees and j is what remains. A branch data parallel
    # on 3 of 6 devices joins a 6-way plan this way (the branch-parallel plan of Unity's MLP).
    rules = load(LAYOUTS_RULES_FILE)
    sat = saturate(splits([6]), SIX_GPUS, rules=rules)
    assert sat.contains(splits([3, 2])) and sat.contains(splits([2, 3]))
    # Only legal factors: 3*2 with 3 left out of the chosen degrees is not built.
    only = saturate(splits([6]), SIX_GPUS, rules=rules, degrees=(2, 6))
    assert not only.contains(splits([3, 2])) and not only.contains(splits([2, 3]))


def test_the_layouts_file_relates_two_degrees_at_every_rank_it_is_for():
    from pcgopt.rules.generate import _two_degrees

    rules = load(LAYOUTS_RULES_FILE)
    assert "layouts" in OPT_IN and all(_two_degrees(r) for r in rules)
    for config in LAYOUTS:
        rank = config.inputs[0].shape.rank
        mine = [r for r in rules if len(r.inputs["x1"].dims) == rank]
        sides = [{repr(r.lhs), repr(r.rhs)} for r in mine]
        # Copies of copies are copies of the product ...
        assert any(
            any(t.startswith("(replicate(replicate(") for t in pair)
            and any(t.startswith("(replicate(x1, degree=k*j)") for t in pair)
            for pair in sides
        ), rank
        # ... and a split of copies is copies of the split.
        assert any(
            {t[:21] for t in pair} == {"(replicate(partition(", "(partition(replicate("}
            for pair in sides
        ), rank


def test_a_second_degree_is_coprime_to_the_first():
    assert Config(second_degree=3).degrees() == (2, 3, 6)
    with pytest.raises(ValueError, match="coprime"):
        Config(second_degree=4)


def test_megatron_with_data_parallelism_needs_the_two_degree_layouts():
    # Three nodes of two GPUs: Megatron splits each layer over a node's 2 GPUs and copies it
    # over the 3 nodes: its biases are copied 6 times and its weights split 2 ways on 3
    # copies, where the e-graph copies biases 3 and then 2 times and splits copies.
    machine = Machine.preset("dgx-a100", nodes=3, devices_per_node=2)
    model = bert_large(batch=6, seq=4, hidden=8, layers=1, heads=2, vocab=16)
    plan = megatron(model, machine)
    assert {n.params.get("degree") for n in plan.nodes} >= {2, 3, 6}
    options = {"degrees": machine.level_degrees(), "min_ops": 12, "budget": Budget(iterations=3)}
    with_layouts = saturate_split(
        model, machine, presets=(*shipped_presets([model]), "layouts"), **options
    )
    assert with_layouts.contains(plan)
    # The default rules, loaded after the layouts, are the default rules: without layouts the
    # same iterations do not reach the plan. Their two-level dense splits take the column-parallel
    # Q, K and V layers there (replicate(partition(w, dim=1, degree=2), degree=3)); the
    # row-parallel output projection's product is where they stop.
    without = saturate_split(model, machine, **options)
    assert without.egraph.first_missing(plan) == "layer0/attn/out/linear.matmul"
