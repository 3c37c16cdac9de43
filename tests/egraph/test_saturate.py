"""Saturation: Unity's Figure 2 plans are found, every extraction is equivalent to the input,
rules apply only where their other side is well-formed, and budgets are honoured."""

import functools
import importlib
import os
import random
import re
import signal
import threading
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcgopt import Machine, PCGBuilder, assert_equivalent, equivalent
from pcgopt.egraph import (
    Budget,
    ChoiceError,
    EGraphData,
    EGraphError,
    ENode,
    ShapeConflictError,
    StopReason,
    join_segments,
    saturate,
    saturate_split,
    saturate_together,
    shipped_presets,
    warm_up_in_background,
)
from pcgopt.egraph.language import language
from pcgopt.egraph.saturate import MATRIX_ALGEBRA_FROM
from pcgopt.egraph.translate import translate_rule
from pcgopt.errors import PCGError
from pcgopt.extract import iteration_cost
from pcgopt.extract.strategies.baselines import data_parallel, megatron, unity_figure_2b
from pcgopt.models import bert_large, mnist_mlp
from pcgopt.models.mlps import mlp
from pcgopt.ops import Params
from pcgopt.rewrite import Rule, format_exprs
from pcgopt.rules import RULES_FILE, load
from pcgopt.segments import cut_layouts, segment_problems, split_segments
from pcgopt.shapes import ParallelTensorShape
from pcgopt.testing.strategies import small_pcgs

TWO_GPUS = Machine.preset("v100-ring", devices_per_node=2)
FOUR_GPUS = Machine.preset("v100-ring", devices_per_node=4)
B, CI, H, CO = 8, 12, 8, 4  # Unity Figure 1's MLP at test size


def sources(b):
    return b.input((B, CI), name="x"), b.weight((CI, H), name="w1"), b.weight((H, CO), name="w2")


def figure_2a(d=2):
    """Sequential plan: MatMul+ReLU fused, data parallel, weights copied."""
    b = PCGBuilder()
    x, w1, w2 = sources(b)
    h = b.linear(b.partition(x, dim=0, degree=d), b.replicate(w1, degree=d), activation="relu")
    y = b.matmul(h, b.replicate(w2, degree=d))
    return b.build(b.combine(y, dim=0, degree=d))


def model_then_reduction_parallel(d=2):
    """ReLU not fused; the first MatMul split by columns, the second reduction-parallel."""
    b = PCGBuilder()
    x, w1, w2 = sources(b)
    h = b.relu(b.matmul(b.replicate(x, degree=d), b.partition(w1, dim=1, degree=d)))
    y = b.matmul(h, b.partition(w2, dim=0, degree=d))
    return b.build(b.reduce(y, degree=d))


@pytest.fixture(scope="module")
def mnist():
    model = mnist_mlp(batch=B, in_features=CI, hidden=H, out_features=CO)
    return model, saturate(model, TWO_GPUS, budget=Budget(iterations=3))


def figure_2b(d=2):
    """Unity's Figure 2b: ReLU not fused, the first MatMul reduction-parallel, its output
    all-reduced, the second split by columns (and combined: the model's output is whole)."""
    model = mnist_mlp(batch=B, in_features=CI, hidden=H, out_features=CO)
    return unity_figure_2b(model, TWO_GPUS, degree=d)


@pytest.mark.parametrize(
    "plan",
    [figure_2a, figure_2b, model_then_reduction_parallel],
    ids=["figure_2a", "figure_2b", "model_then_reduction_parallel"],
)
def test_unity_figure_2_plans_are_in_the_saturated_mnist_egraph(mnist, plan):
    model, sat = mnist
    assert sat.contains(plan())
    extracted = sat.egraph.to_pcg(sat.egraph.choice_for(plan()))
    assert_equivalent(model, extracted)
    assert sorted(n.op for n in extracted.nodes) == sorted(n.op for n in plan().nodes)


def test_the_extracted_figure_2_plans_move_what_unity_says(mnist):
    """Figure 2a synchronizes both weights, 2(c_i h + h c_o) elements; Figure 2b the first
    MatMul's output and its gradient, 4bh (at full size 6x fewer; tests/extract). Both also
    gather the b x c_o output (and scatter its gradient)."""
    _, sat = mnist
    a = iteration_cost(sat.egraph.to_pcg(sat.egraph.choice_for(figure_2a())), TWO_GPUS)
    b = iteration_cost(sat.egraph.to_pcg(sat.egraph.choice_for(figure_2b())), TWO_GPUS)
    assert a.comm_bytes == (2 * (CI * H + H * CO) + B * CO) * 4
    assert b.comm_bytes == (4 * B * H + B * CO) * 4
    c = model_then_reduction_parallel()
    c = iteration_cost(sat.egraph.to_pcg(sat.egraph.choice_for(c)), TWO_GPUS)
    assert c.comm_bytes < a.comm_bytes


def test_a_plan_with_another_computation_is_not_contained(mnist):
    _, sat = mnist
    b = PCGBuilder()
    x, w1, w2 = sources(b)
    assert not sat.contains(b.build(b.matmul(b.tanh(b.matmul(x, w1)), w2)))


def test_a_choice_that_is_not_in_its_class_is_rejected(mnist):
    _, sat = mnist
    g = sat.egraph
    root = g.roots[0]
    other = next(i for i, n in enumerate(g.nodes) if n.eclass != root)
    with pytest.raises(ChoiceError, match="not in that class"):
        g.to_pcg({root: other})


def test_every_tensor_class_has_shape_facts_matching_its_nodes(mnist):
    model, sat = mnist
    g = sat.egraph
    pcg = g.to_pcg(g.choice_for(model))
    assert pcg.shape(pcg.outputs[0]) == g.shapes[g.roots[0]]
    assert all(
        s is not None or any(g.nodes[i].op == "split" for i in c)
        for s, c in zip(g.shapes, g.classes, strict=True)
    )


# --- soundness: any extraction is the input's computation ----------------------------


def random_acyclic_choice(graph, rng):
    """One e-node per class, drawn at random, bottom up: a class is decided when it is drawn
    among those with an e-node whose children are all decided, and takes one of those e-nodes
    at random. Every choice is acyclic by construction, and every class with an acyclic way to
    compute it is decided; None if an output has none."""
    waiting = [len(set(n.children)) for n in graph.nodes]
    parents = {}
    for i, n in enumerate(graph.nodes):
        for c in set(n.children):
            parents.setdefault(c, []).append(i)
    ready = {}  # class -> its e-nodes whose children are all decided
    for i, n in enumerate(graph.nodes):
        if not waiting[i]:
            ready.setdefault(n.eclass, []).append(i)
    chosen = {}
    while ready:
        c = rng.choice(sorted(ready))
        chosen[c] = rng.choice(ready.pop(c))
        for i in parents.get(c, ()):
            waiting[i] -= 1
            e = graph.nodes[i].eclass
            if not waiting[i] and e not in chosen:
                ready.setdefault(e, []).append(i)
    return chosen if all(r in chosen for r in graph.roots) else None


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pcg=small_pcgs(max_ops=4, ops=("relu", "matmul", "add", "partition", "replicate")),
    seed=st.integers(0, 2**16),
)
def test_random_extractions_are_equivalent_to_the_input(pcg, seed):
    sat = saturate(pcg, TWO_GPUS, budget=Budget(iterations=2, enodes=5_000))
    assert_random_extractions_equivalent(pcg, sat.egraph, random.Random(seed), tries=10)


def assert_random_extractions_equivalent(pcg, egraph, rng, *, tries):
    """Up to ``tries`` random acyclic choices of ``egraph``, each equivalent to ``pcg``, and
    at least one of them."""
    checked = 0
    for _ in range(tries):
        choice = random_acyclic_choice(egraph, rng)
        if choice is not None:
            assert equivalent(pcg, egraph.to_pcg(choice), trials=1)
            checked += 1
    assert checked


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pcgs=st.lists(
        small_pcgs(max_ops=3, ops=("relu", "matmul", "add", "partition", "replicate")),
        min_size=2,
        max_size=3,
    ),
    seed=st.integers(0, 2**16),
)
def test_random_extractions_from_pcgs_saturated_together_are_each_equivalent_to_its_input(
    pcgs, seed
):
    # Random small PCGs reuse source names with other shapes: each part must still compute
    # exactly its own PCG.
    parts = saturate_together(pcgs, TWO_GPUS, budget=Budget(iterations=2, enodes=10_000))
    rng = random.Random(seed)
    for pcg, part in zip(pcgs, parts, strict=True):
        assert_random_extractions_equivalent(pcg, part.egraph, rng, tries=5)


# --- guards ------------------------------------------------------------------------------


def relu_partition_rule():
    return Rule.parse(
        "relu_partition",
        "partition(relu(x), dim=0, degree=k)",
        "relu(partition(x, dim=0, degree=k))",
        {"x": "[m, n]"},
    )


def introduce_partition_rule():
    return Rule.parse(
        "introduce_partition",
        "x",
        "combine(partition(x, dim=0, degree=k), dim=0, degree=k)",
        {"x": "[m, n]"},
    )


def relu_model(rows):
    b = PCGBuilder()
    return b.build(b.relu(b.input((rows, 4), name="x")))


def test_a_rule_applies_only_where_the_degree_divides_the_size():
    rules = [relu_partition_rule(), introduce_partition_rule()]
    even = saturate(relu_model(4), TWO_GPUS, rules=rules, budget=Budget(iterations=4))
    odd = saturate(relu_model(3), TWO_GPUS, rules=rules, budget=Budget(iterations=4))
    assert any(n.op == "partition" for n in even.egraph.nodes)
    assert not any(n.op == "partition" for n in odd.egraph.nodes)


def test_the_algebraic_rules_join_at_the_iteration_the_budget_says():
    """Before ``algebra_from`` an iteration runs the parallel and cleanup rules alone (layouts
    reach every tensor before the algebra grows the e-graph); iterations that change nothing
    then are not saturation."""
    b = PCGBuilder()
    model = b.build(b.relu(b.relu(b.input((4, 4), name="x"))))
    fold = Rule.parse("relu_twice", "relu(relu(x))", "relu(x)", {"x": "[m, n]"})
    held, joined = Budget(iterations=2, algebra_from=3), Budget(iterations=3, algebra_from=3)
    for rules in ([fold], [fold, introduce_partition_rule()]):
        assert not saturate(model, TWO_GPUS, rules=rules, budget=held).contains(relu_model(4))
        assert saturate(model, TWO_GPUS, rules=rules, budget=joined).contains(relu_model(4))
    with_layouts = [fold, introduce_partition_rule()]
    layouts = saturate(model, TWO_GPUS, rules=with_layouts, budget=held).egraph
    assert any(n.op == "partition" for n in layouts.nodes)
    with pytest.raises(ValueError, match="algebra_from"):
        Budget(algebra_from=0)


def test_the_matrix_algebra_waits_an_iteration_for_the_layouts():
    # Run from the first iteration, the matrix algebra outgrew the layouts of Unity's MLP on
    # 24 GPUs (MATRIX_ALGEBRA_FROM): its first iteration now introduces layouts, not fusions.
    model = mnist_mlp(batch=B, in_features=CI, hidden=H, out_features=CO)
    held = saturate(model, TWO_GPUS, budget=Budget(iterations=1)).egraph
    assert "partition" in {n.op for n in held.nodes}
    assert "linear" not in {n.op for n in held.nodes}
    at_once = saturate(model, TWO_GPUS, budget=Budget(iterations=1, algebra_from=1)).egraph
    assert "linear" in {n.op for n in at_once.nodes}
    # Read from the rules asked for, whatever base serves them: a transformer's algebra (rules
    # that unfuse layers for the layouts) and custom rules run from the first iteration.
    asked = saturate_module._asked_presets
    algebra_from = saturate_module._algebra_from
    assert algebra_from(asked(None, [model], None)) == MATRIX_ALGEBRA_FROM
    assert algebra_from(asked(None, [dense_gelu()], None)) == 1
    assert algebra_from(asked(None, [model], ("matrix/parallel",))) == 1
    assert algebra_from(asked([introduce_partition_rule()], [model], None)) == 1


def test_a_degree_two_operators_share_must_be_the_same_degree_in_both():
    # The matcher binds the second occurrence of k to its own variable and checks it equal
    # (a shared join variable made egglog pair every two Reduces of one degree: 22 s on
    # BERT-Large); the rule must still apply exactly where both degrees agree.
    rule = Rule.parse(
        "reduce_of_concat",
        "concat(reduce(x1, degree=k), reduce(x2, degree=k), axis=0)",
        "reduce(concat(x1, x2, axis=0), degree=k)",
        {"x1": "[a, b]", "x2": "[c, b]"},
    )
    four = Machine.preset("v100-ring", devices_per_node=4)

    def model(d1, d2):
        b = PCGBuilder()
        halves = [
            b.reduce(
                b.to_partial(b.replicate(b.input((4, 4), name=f"x{i}"), degree=d), degree=d),
                degree=d,
            )
            for i, d in ((1, d1), (2, d2))
        ]
        return b.build(b.concat(*halves, axis=0))

    same = saturate(model(2, 2), four, rules=[rule], budget=Budget(iterations=3))
    mixed = saturate(model(2, 4), four, rules=[rule], budget=Budget(iterations=3))
    assert sum(n.op == "reduce" for n in same.egraph.nodes) == 3  # the rewrite added one
    assert sum(n.op == "reduce" for n in mixed.egraph.nodes) == 2
    (forward, *_) = translate_rule(language(), rule)
    query = forward.text.split("\n")[0]
    # One Reduce binds k, the other a variable of its own, checked equal to k.
    assert "(op_reduce v_x1 k_k)" in query
    second = re.search(r"\(op_reduce v_x2 (q\d+)\)", query)
    assert second and f"(= 0 (- {second.group(1)} k_k))" in query


def test_a_split_two_ways_at_once_spans_a_legal_number_of_devices():
    """The introduction of a dense layer's batch-by-columns split (pcgopt.rules.nesting)
    chooses both degrees: each a legal one, and their product too (on 12 GPUs, 2 x 3 and 3 x 2
    and 2 x 6, never 2 x 4 on 8 of them)."""
    intro = next(
        r
        for r in load(RULES_FILE)
        if format_exprs(r.rhs) == "linear(x1, x2, activation='relu')"
        and format_exprs(r.lhs).startswith("combine(combine(")
    )
    _, choosing = translate_rule(language(), intro)
    assert "(legal k_j)" in choosing.text and "(legal k_k)" in choosing.text
    assert "(legal (* k_j k_k))" in choosing.text
    b = PCGBuilder()
    layer = b.linear(b.input((24, 24), name="x"), b.weight((24, 24), name="w"), activation="relu")
    twelve = Machine.preset("summit", nodes=2)
    eg = saturate(b.build(layer), twelve, rules=[intro], budget=Budget(iterations=1)).egraph
    spans = {s.num_shards for s in eg.shapes if s is not None}  # shards count copies too
    assert {6, 12} <= spans and spans <= {1, 2, 3, 4, 6, 12}


def test_a_degree_matched_as_a_product_of_two_symbols_is_split_into_legal_factors():
    """replicate(replicate(x, k), j) = replicate(x, k*j) (proved for all degrees): forward,
    both degrees are bound and the nested copies join the single Replicate's e-class;
    backward, a match of ``degree=k*j`` binds neither factor, so ``k`` is chosen among the legal
    degrees and ``j`` is the rest where it divides and is legal. A product of one symbol with
    itself (``k*k``) has no factor to choose: that direction is reported with a reason, not
    handed to egglog with unbound variables."""
    rule = Rule.parse(
        "replicate_twice",
        "replicate(replicate(x, degree=k), degree=j)",
        "replicate(x, degree=k*j)",
        {"x": "[m, n]"},
    )
    forward, backward = translate_rule(language(), rule)
    assert (forward.direction, backward.direction) == ("fwd", "bwd")
    assert "(legal k_k)" in backward.text and "(legal k_j)" in backward.text
    square = Rule.parse(
        "replicate_square",
        "replicate(replicate(x, degree=k), degree=k)",
        "replicate(x, degree=k*k)",
        {"x": "[m, n]"},
    )
    _, untranslated = translate_rule(language(), square)
    assert untranslated[1] == "bwd" and "'k'" in untranslated[2]
    assert "does not bind" in untranslated[2]

    b = PCGBuilder()
    x = b.input((4, 4), name="x")
    twice = b.replicate(b.replicate(x, degree=2), degree=2)
    once = b.replicate(x, degree=4)
    model = b.build(b.add(twice, once))
    sat = saturate(model, FOUR_GPUS, rules=[rule], budget=Budget(iterations=2))
    where = sat.egraph.classes_of(model)
    assert where is not None
    assert where[twice.ref] == where[once.ref]
    # Backward alone: four copies are two copies of two copies.
    b = PCGBuilder()
    only_once = b.build(b.replicate(b.input((4, 4), name="x"), degree=4))
    b = PCGBuilder()
    nested = b.build(b.replicate(b.replicate(b.input((4, 4), name="x"), degree=2), degree=2))
    assert saturate(only_once, FOUR_GPUS, rules=[rule], budget=Budget(iterations=2)).contains(
        nested
    )


def test_no_tensor_spans_more_devices_than_the_machine_has():
    sat = saturate(
        relu_model(16),
        Machine.preset("v100-ring", devices_per_node=4),
        rules=[introduce_partition_rule()],
        budget=Budget(iterations=6),
    )
    assert sat.stop_reason is StopReason.SATURATED
    spans = {s.num_shards for s in sat.egraph.shapes if s is not None}
    assert max(spans) == 4  # 2 x 2 or 4, never 8 or 16


def test_a_wrong_rule_that_changes_a_shape_is_caught_not_merged():
    wrong = Rule.parse("wrong", "relu(x)", "relu(partition(x, dim=0, degree=k))", {"x": "[m, n]"})
    with pytest.raises(ShapeConflictError, match="different facts"):
        saturate(relu_model(4), TWO_GPUS, rules=[wrong], budget=Budget(iterations=2))


# --- several PCGs in one e-graph ----------------------------------------------------------


def test_pcgs_saturated_together_are_each_what_saturating_it_alone_gives():
    # Same source names, different shapes: together they must stay apart (no shape
    # conflict), and each part must be exactly its own saturation (a match limit no rule
    # reaches, so the back-off bans nothing in either run).
    small = mnist_mlp(batch=B, in_features=CI, hidden=H, out_features=CO)
    wide = mnist_mlp(batch=2 * B, in_features=CI, hidden=2 * H, out_features=CO)
    budget = Budget(iterations=2, match_limit=10**6)
    together = saturate_together([small, wide], TWO_GPUS, budget=budget)
    for pcg, part in zip([small, wide], together, strict=True):
        # Alone, the export also holds e-classes no output needs (rules build terms that
        # end up unreachable); together, a part is what its outputs need.
        alone = saturate(pcg, TWO_GPUS, budget=budget).egraph
        alone = alone.reachable(alone.roots)
        assert (part.num_eclasses, part.num_enodes) == (alone.num_eclasses, alone.num_enodes)
        assert sorted(map(repr, part.egraph.nodes)) == sorted(map(repr, alone.nodes))
        assert part.contains(pcg)
        assert_equivalent(pcg, part.egraph.to_pcg(part.egraph.choice_for(pcg)))
    assert together[0].iterations == together[1].iterations == 2


def test_saturate_together_checks_its_arguments():
    with pytest.raises(ValueError, match="one sequence per PCG"):
        saturate_together([relu_model(4)], TWO_GPUS, seeds=[(), ()])
    with pytest.raises(TypeError, match=r"pcgs\[1\] must be a PCG"):
        saturate_together([relu_model(4), "relu"], TWO_GPUS)
    with pytest.raises(ValueError, match="at least one"):
        saturate_together([], TWO_GPUS)


# --- loading the shipped rules ----------------------------------------------------------

saturate_module = importlib.import_module("pcgopt.egraph.saturate")


def test_rules_loaded_in_a_background_thread_serve_saturation_in_this_one(monkeypatch):
    # A stand-in for the shipped rules (loading the real ones takes seconds), built in the
    # loader thread: the e-graph it creates must work from the caller's thread.
    threads = []

    def load(presets):
        threads.append(threading.current_thread())
        return saturate_module._Base(
            language(), [relu_partition_rule(), introduce_partition_rule()]
        )

    monkeypatch.setattr(saturate_module, "_load_shipped_base", load)
    monkeypatch.setattr(saturate_module, "_shipped", {})
    loading = warm_up_in_background()
    assert loading.result(timeout=60) >= 0
    assert threads and threads[0] is not threading.current_thread()
    sat = saturate(relu_model(4), TWO_GPUS, budget=Budget(iterations=3))
    assert any(n.op == "partition" for n in sat.egraph.nodes)
    assert len(threads) == 1  # loaded once, by the thread
    assert warm_up_in_background().result(timeout=0) == 0.0  # already loaded: nothing to do


def test_a_failed_background_load_raises_where_it_is_awaited(monkeypatch):
    def load(presets):
        raise OSError("rules.json: unreadable")

    monkeypatch.setattr(saturate_module, "_load_shipped_base", load)
    monkeypatch.setattr(saturate_module, "_shipped", {})
    with pytest.raises(OSError, match="unreadable"):
        warm_up_in_background().result(timeout=60)


def test_a_rank_2_model_loads_only_the_matrix_rules_and_a_loaded_superset_serves_it(
    monkeypatch,
):
    assert shipped_presets([relu_model(4)]) == ("matrix",)
    # Rank-3 activations only: the matrix rules can rewrite weights alone, so their algebra
    # is left out; with a rank-2 activation anywhere it is loaded.
    assert shipped_presets([dense_gelu()]) == ("matrix/parallel", "transformer")
    assert shipped_presets([dense_gelu(), relu_model(4)]) == ("matrix", "transformer")
    assert shipped_presets() == ("matrix", "transformer", "lookups")
    loads = []

    def load(presets):
        loads.append(presets)
        return saturate_module._Base(language(), [relu_partition_rule()])

    monkeypatch.setattr(saturate_module, "_load_shipped_base", load)
    monkeypatch.setattr(saturate_module, "_shipped", {})
    saturate(dense_gelu(), TWO_GPUS, budget=Budget(iterations=1))
    saturate(relu_model(4), TWO_GPUS, budget=Budget(iterations=1))
    assert loads == [("matrix/parallel", "transformer"), ("matrix",)]
    monkeypatch.setattr(saturate_module, "_shipped", {})
    assert warm_up_in_background().result(timeout=60) >= 0
    saturate(dense_gelu(), TWO_GPUS, budget=Budget(iterations=1))
    saturate(relu_model(4), TWO_GPUS, budget=Budget(iterations=1))
    assert loads[2:] == [("matrix", "transformer", "lookups")]  # every model reuses the larger set
    monkeypatch.setattr(saturate_module, "_shipped", {})
    assert warm_up_in_background(pcgs=[relu_model(4)]).result(timeout=60) >= 0
    assert loads[-1] == ("matrix",)


def test_the_embedding_bag_rules_load_only_for_a_model_with_embedding_bags():
    from pcgopt.models import dlrm

    assert shipped_presets([dlrm(batch=8)]) == ("matrix", "lookups")
    assert "lookups" not in shipped_presets([relu_model(4), dense_gelu()])


@pytest.mark.parametrize("model", ["xdl", "dlrm"])
def test_the_egraph_alone_reaches_data_parallelism_of_a_recommender(model):
    # Bags of one id each (their own rules), a concat of four or five (rules widened past two
    # inputs) and a sigmoid output layer (a dense layer with any activation): without seeds,
    # two iterations hold the data-parallel plan.
    from pcgopt.models import dlrm, xdl

    build = {"xdl": xdl, "dlrm": dlrm}[model]
    pcg = build(batch=64, tables=(1000,) * 4, embedding_dim=8)
    machine = Machine.preset("dgx-a100", nodes=1, devices_per_node=4)
    sat = saturate(pcg, machine, budget=Budget(iterations=2))
    plan = data_parallel(pcg, machine)
    assert sat.egraph.contains(plan), sat.egraph.first_missing(plan)


def test_a_plans_split_of_rank_2_token_ids_does_not_bring_back_the_matrix_algebra():
    from pcgopt.extract.strategies.baselines import data_parallel
    from pcgopt.models import bert_large

    bert = bert_large(batch=8, seq=16, hidden=32, layers=1, heads=4, vocab=64)
    plan = data_parallel(bert, Machine.preset("dgx-a100"))
    assert any(n.op == "partition" and plan.output_shapes(n.name)[0].rank == 2 for n in plan.nodes)
    assert shipped_presets([bert, plan]) == ("matrix/parallel", "transformer")


def test_the_matrix_rules_without_their_algebra_keep_every_parallel_and_cleanup_rule():
    from pcgopt.egraph.translate import rule_kind
    from pcgopt.rules import RULES_FILE, load

    base = saturate_module._load_shipped_base(("matrix/parallel",))
    wanted = {r.name for r in load(RULES_FILE) if rule_kind(r) != "algebraic"}
    assert {t.kind for t in base.rules} == {"parallel", "cleanup"}
    # Every direction of every wanted rule is translated or says why not.
    seen = {t.rule for t in base.rules} | {name for name, _, _ in base.untranslated}
    assert seen == wanted


def test_custom_rules_need_no_background_load():
    loading = warm_up_in_background([relu_partition_rule()])
    assert loading.done() and loading.result() == 0.0


# --- budgets -----------------------------------------------------------------------------


def test_memory_freed_but_kept_by_the_allocator_is_returned_before_the_budget_is_read():
    """Freed small blocks between live ones stay in the C heap, and in the resident set the
    memory budget reads, until ``return_freed_memory`` hands them back (glibc)."""
    import numpy as np

    if saturate_module._malloc_trim() is None:
        pytest.skip("not glibc: nothing to return")
    blocks = [np.ones(128) for _ in range(400_000)]  # 1 KiB each: malloc's heap, not mmap
    kept = blocks[::100]
    del blocks
    released = saturate_module.return_freed_memory()
    assert released > 100 * 2**20, released
    del kept  # alive until here: the freed blocks lie between them


def blowing_up_model():
    return mnist_mlp(batch=B, in_features=CI, hidden=H, out_features=CO)


def test_the_node_budget_keeps_the_last_egraph_that_fit():
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(enodes=3_000))
    assert sat.stop_reason is StopReason.NODES
    assert sat.num_enodes <= 3_000
    assert sat.history[-1].enodes == sat.num_enodes  # the replay rebuilt the same e-graph


def test_an_iteration_that_would_pass_the_node_budget_even_at_the_least_growth_is_not_run(
    monkeypatch,
):
    """After one iteration of ``n`` e-nodes and a budget under ``2n``, the next is not run
    (it could only be undone), and the e-graph is kept as it is, not rebuilt and replayed."""
    first = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(iterations=1)).num_enodes
    starts = []
    start = saturate_module._start
    monkeypatch.setattr(saturate_module, "_start", lambda *args: starts.append(1) or start(*args))
    budget = Budget(enodes=int(first * saturate_module.LEAST_ITERATION_GROWTH) - 1)
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=budget)
    assert (sat.stop_reason, sat.iterations, sat.num_enodes) == (StopReason.NODES, 1, first)
    assert len(starts) == 1


def test_the_iteration_budget_is_reported():
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(iterations=1))
    assert (sat.stop_reason, sat.iterations) == (StopReason.ITERATIONS, 1)


def test_the_egraph_as_loaded_is_reported():
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(iterations=1))
    assert 0 < sat.loaded_enodes < sat.history[0].enodes


def test_the_second_iteration_is_predicted_from_the_egraph_size(monkeypatch):
    # At a second per e-node it leaves, the second iteration (at least the first's e-nodes
    # doubled plus SECOND_ITERATION_MIN_ADDED) cannot end within 60 s: one iteration, on time.
    # (No speculative child: it would try the iteration predicted not to fit.)
    monkeypatch.setattr(saturate_module, "ITERATION_SECONDS_PER_ENODE", 1.0)
    budget = Budget(seconds=60.0, enodes=10**7, speculate=False)
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=budget)
    assert (sat.stop_reason, sat.iterations) == (StopReason.TIME, 1)


def test_the_time_budget_stops_a_run_that_would_blow_up():
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(seconds=0.3, enodes=10**7))
    assert sat.stop_reason is StopReason.TIME
    assert sat.iterations < 30


def test_the_time_budget_leaves_room_to_export_the_egraph(monkeypatch):
    # With an export predicted at a second per e-node, no e-graph past the loaded one could be
    # exported within 60 s: saturation runs no iteration, on time.
    monkeypatch.setattr(saturate_module, "EXPORT_SECONDS_PER_ENODE", 1.0)
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(seconds=60.0, enodes=10**7))
    assert (sat.stop_reason, sat.iterations) == (StopReason.TIME, 0)


def test_the_time_budget_leaves_room_for_what_the_caller_does_with_the_egraph():
    # The caller costs and extracts the e-graph at a second per e-node: the first iteration's
    # e-graph would not leave that time in 60 s, so the model comes back as loaded.
    model = blowing_up_model()
    budget = Budget(seconds=60.0, enodes=10**7, after_seconds_per_enode=1.0)
    sat = saturate(model, TWO_GPUS, budget=budget)
    assert (sat.stop_reason, sat.iterations) == (StopReason.TIME, 0)
    assert_equivalent(model, sat.egraph.to_pcg(sat.egraph.choice_for(model)))


def test_a_budget_too_small_for_the_first_iteration_does_not_start_it():
    # egglog's first iteration alone takes about half a second (FIRST_ITERATION_SECONDS).
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(seconds=0.05))
    assert (sat.stop_reason, sat.iterations) == (StopReason.TIME, 0)
    assert sat.history == ()


def test_budget_rejects_a_negative_time_per_enode_after_saturation():
    with pytest.raises(ValueError, match="after_seconds_per_enode must be >= 0"):
        Budget(after_seconds_per_enode=-1.0)


def test_the_memory_budget_leaves_room_to_export_the_egraph(monkeypatch):
    # A gigabyte per exported e-node: the e-graph past the first iteration would not fit.
    monkeypatch.setattr(saturate_module, "EXPORT_BYTES_PER_ENODE", 2**30)
    budget = Budget(seconds=60.0, enodes=10**7, memory_bytes=2**40)
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=budget)
    assert (sat.stop_reason, sat.iterations) == (StopReason.MEMORY, 1)


def test_a_memory_budget_spent_before_the_first_iteration_runs_none():
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(seconds=60.0, memory_bytes=1))
    assert (sat.stop_reason, sat.iterations) == (StopReason.MEMORY, 0)
    assert sat.contains(blowing_up_model())


def test_an_isolated_run_is_killed_at_its_time_limit_and_keeps_what_finished():
    # Long enough for the forked child's first iteration on a busy machine (once, in a
    # suite run, 3 s was not).
    budget = Budget(seconds=6.0, enodes=10**7, isolate=True)
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=budget)
    assert sat.stop_reason is StopReason.TIME
    assert sat.iterations >= 1


# --- speculative iterations: the next iteration runs in a forked child while this process
# keeps its e-graph. A pessimistic prediction (every iteration x10,000) makes the in-process
# run stop after one iteration; the rest is up to the child.


def _pessimistic(monkeypatch) -> None:
    monkeypatch.setattr(saturate_module, "SECOND_ITERATION_GROWTH", 1e4)
    monkeypatch.setattr(saturate_module, "ITERATION_SECONDS_PER_ENODE", 1.0)


def _in_child(monkeypatch, action) -> None:
    """Makes every iteration in a forked child call ``action`` first."""
    parent, iteration = os.getpid(), saturate_module._iteration

    def in_child(eg, algebra=True):
        if os.getpid() != parent:
            action()
        return iteration(eg, algebra)

    monkeypatch.setattr(saturate_module, "_iteration", in_child)


def test_a_speculative_child_gets_the_iterations_the_prediction_would_not_run(monkeypatch):
    _pessimistic(monkeypatch)
    budget = Budget(seconds=4.0, enodes=10**7)
    cautious = saturate(blowing_up_model(), TWO_GPUS, budget=replace(budget, speculate=False))
    assert (cautious.stop_reason, cautious.iterations) == (StopReason.TIME, 1)
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=budget)
    assert sat.iterations > 1
    assert [h.iteration for h in sat.history] == list(range(1, sat.iterations + 1))
    # The child's e-graph is the one this process would have after as many iterations.
    same = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(iterations=sat.iterations))
    assert (sat.num_eclasses, sat.num_enodes) == (same.num_eclasses, same.num_enodes)
    assert sat.contains(blowing_up_model())


def test_a_speculative_child_that_overruns_is_killed_and_the_parents_egraph_kept(monkeypatch):
    _pessimistic(monkeypatch)
    _in_child(monkeypatch, lambda: time.sleep(600))
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(seconds=2.0, enodes=10**7))
    assert (sat.stop_reason, sat.iterations) == (StopReason.TIME, 1)
    assert sat.seconds < 30  # killed at the budget, not after the child's 600 s


def test_a_speculative_child_past_the_memory_budget_is_killed(monkeypatch):
    _pessimistic(monkeypatch)
    monkeypatch.setattr(saturate_module, "_private_bytes", lambda pid="self": 2**50)
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(seconds=4.0, enodes=10**7))
    assert (sat.stop_reason, sat.iterations) == (StopReason.MEMORY, 1)


def test_a_speculative_child_killed_by_the_system_leaves_the_parents_egraph(monkeypatch):
    _pessimistic(monkeypatch)
    _in_child(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGKILL))  # as the OOM killer
    sat = saturate(blowing_up_model(), TWO_GPUS, budget=Budget(seconds=4.0, enodes=10**7))
    assert (sat.stop_reason, sat.iterations) == (StopReason.MEMORY, 1)


def test_a_shape_conflict_in_a_speculative_child_is_raised_here(monkeypatch):
    _pessimistic(monkeypatch)

    def conflict():
        raise ShapeConflictError("merged [8, 12] with [8, 4]")

    _in_child(monkeypatch, conflict)
    with pytest.raises(ShapeConflictError, match=r"merged \[8, 12\]"):
        saturate(blowing_up_model(), TWO_GPUS, budget=Budget(seconds=4.0, enodes=10**7))


def test_bad_input_is_a_type_error():
    with pytest.raises(TypeError, match="needs a PCG"):
        saturate("mnist", TWO_GPUS)
    with pytest.raises(TypeError, match=r"pcgopt\.Machine"):
        saturate(blowing_up_model(), 8)
    with pytest.raises(ValueError, match=r"Budget\.enodes"):
        Budget(enodes=0)


def _square_chain(n: int, layers: int):
    b = PCGBuilder()
    x = b.input((n, n), name="x")
    for i in range(layers):
        x = b.matmul(x, b.weight((n, n), name=f"w{i}"), name=f"mm{i}")
    return b.build(x)


def test_a_seed_plan_joins_the_input_class_and_can_be_extracted():
    """AutoDDL's 3D matmul is not built by the rules within a small budget, but a plan of the
    layer-wise search seeds the e-graph: it is then represented, and extracting it gives a PCG
    equivalent to the input."""
    from pcgopt.extract.strategies.layerwise import MatmulStrategy, lower

    model = _square_chain(8, 2)
    machine = Machine.preset("dgx-a100", devices_per_node=8)
    seed = lower(model, machine, {"mm0": MatmulStrategy(2, 2, 2), "mm1": MatmulStrategy(1, 2, 4)})
    plain = saturate(model, machine, budget=Budget(iterations=2))
    seeded = saturate(model, machine, budget=Budget(iterations=2), seeds=[seed])
    assert not plain.contains(seed)
    assert seeded.contains(seed) and seeded.contains(model)
    assert_equivalent(model, seeded.egraph.to_pcg(seeded.egraph.choice_for(seed)))


def test_a_seed_must_be_a_pcg_with_the_inputs_outputs():
    model = _square_chain(8, 1)
    machine = Machine.preset("dgx-a100", devices_per_node=2)
    with pytest.raises(TypeError, match=r"seeds\[0\] must be a PCG"):
        saturate(model, machine, seeds=["plan"])
    b = PCGBuilder()
    x, w = b.input((8, 8), name="x"), b.weight((8, 8), name="w0")
    y = b.matmul(x, w, name="mm0")
    two_outputs = b.build(y, b.relu(y))
    with pytest.raises(EGraphError, match="a seed must have the input's 1 output"):
        saturate(model, machine, seeds=[two_outputs])
    b = PCGBuilder()
    split = b.build(
        b.matmul(
            b.partition(b.input((8, 8), name="x"), dim=0, degree=2),
            b.replicate(b.weight((8, 8), name="w0"), degree=2),
            name="mm0",
        )
    )
    with pytest.raises(ShapeConflictError, match="seed 0"):
        saturate(model, machine, seeds=[split])  # its output is split, the input's is whole


# -- transformers: rank-3 tensors ---------------------------------------------------------------

BS, SEQ, HID = 4, 4, 8


def dense_gelu(plan=None, d=2):
    """A transformer's dense layer on [batch, sequence, hidden] with bias and GELU, as the model
    (``plan=None``), data parallel (``"batch"``), split by output columns (``"columns"``,
    Megatron's first FFN layer) or reduction-parallel (``"reduction"``, Unity's Figure 2b: the
    GELU unfused, the product's partial sums all-reduced, bias and GELU on every copy)."""
    b = PCGBuilder()
    x = b.input((BS, SEQ, HID), name="x")
    w, bias = b.weight((HID, HID), name="w"), b.weight((HID,), name="b")
    if plan is None:
        return b.build(b.linear(x, w, bias, activation="gelu"))
    if plan == "reduction":
        partial = b.matmul(b.partition(x, dim=2, degree=d), b.partition(w, dim=0, degree=d))
        y = b.add(b.all_reduce(partial, degree=d), b.replicate(bias, degree=d))
        return b.build(b.discard_copies(b.gelu(y), degree=d))
    if plan == "batch":
        args, out_dim = (b.partition(x, dim=0, degree=d), b.replicate(w, degree=d)), 0
        args += (b.replicate(bias, degree=d),)
    else:
        args, out_dim = (b.replicate(x, degree=d), b.partition(w, dim=1, degree=d)), 2
        args += (b.partition(bias, dim=0, degree=d),)
    y = b.linear(*args, activation="gelu")
    return b.build(b.combine(y, dim=out_dim, degree=d))


@functools.cache
def saturated_on_two_gpus(model, iterations: int, presets=None, algebra_from=None):
    """One saturation per model, iteration count and presets, shared by the tests that look
    for different plans in it (a saturation's fixed cost in egglog is most of such a test's)."""
    budget = Budget(iterations=iterations, algebra_from=algebra_from)
    return saturate(model, TWO_GPUS, presets=presets, budget=budget)


def assert_shipped_rules_reach(model, target, iterations: int) -> None:
    """With the shipped rules the saturated e-graph holds ``target`` and extracting it gives a
    PCG equivalent to ``model``; the matrix rules alone (typed on rank-2 tensors) do not."""
    sat = saturated_on_two_gpus(model, iterations)
    assert sat.contains(target)
    assert_equivalent(model, sat.egraph.to_pcg(sat.egraph.choice_for(target)))
    # The matrix rules' preset (loaded once per process, as saturate loads shipped rules), its
    # algebra in every iteration.
    assert not saturated_on_two_gpus(model, iterations, ("matrix",), 1).contains(target)


@pytest.mark.parametrize("plan", ["batch", "columns"])
def test_the_shipped_rules_parallelize_a_rank_3_dense_layer(plan):
    assert_shipped_rules_reach(dense_gelu(), dense_gelu(plan), iterations=3)


def test_the_shipped_rules_split_a_rank_3_dense_layer_two_ways_at_once():
    """The transformer rules' two-level splits (``LINEAR_BIAS_NESTED``): a GELU dense layer on
    [batch, sequence, hidden] split by the batch 2 ways and by the columns 2 ways on 4 devices,
    copies outermost (AutoDDL's 2D matmul split), in one iteration."""
    b = PCGBuilder()
    x = b.input((BS, SEQ, HID), name="x")
    w, bias = b.weight((HID, HID), name="w"), b.weight((HID,), name="b")

    y = b.linear(
        b.replicate(b.partition(x, dim=0, degree=2), degree=2),
        b.replicate(b.partition(w, dim=1, degree=2), degree=2),
        b.replicate(b.partition(bias, dim=0, degree=2), degree=2),
        activation="gelu",
    )
    target = b.build(b.combine(b.combine(y, dim=2, degree=2), dim=0, degree=2))
    four = Machine.preset("dgx-a100", nodes=1, devices_per_node=4)
    sat = saturate(dense_gelu(), four, budget=Budget(iterations=1))
    assert sat.contains(target)
    assert_equivalent(dense_gelu(), sat.egraph.to_pcg(sat.egraph.choice_for(target)))


def test_the_shipped_rules_unfuse_a_gelu_dense_layer_to_make_it_reduction_parallel():
    """GELU is taken out of the dense layer and the bias add out of the product; the product is
    split by its contraction and all-reduced, and bias and GELU run on the copies."""
    assert_shipped_rules_reach(dense_gelu(), dense_gelu("reduction"), iterations=4)


def row_parallel_dense(plan=None, d=2):
    """A dense layer with a bias on [batch, sequence, hidden] (``plan=None``), or row-parallel as
    Megatron's second FFN layer (``"rows"``): the input split by its contraction dimension, the
    weight by rows, the partial product all-reduced, then the bias added to every copy."""
    b = PCGBuilder()
    x = b.input((BS, SEQ, HID), name="x")
    w, bias = b.weight((HID, HID), name="w"), b.weight((HID,), name="b")
    if plan is None:
        return b.build(b.linear(x, w, bias))
    partial = b.matmul(b.partition(x, dim=2, degree=d), b.partition(w, dim=0, degree=d))
    y = b.add(b.all_reduce(partial, degree=d), b.replicate(bias, degree=d))
    return b.build(b.discard_copies(y, degree=d))


def test_the_shipped_rules_reach_a_row_parallel_dense_layer():
    """The dense layer is split into its product and a bias add, the product by its contraction
    (partial sums), and the bias added after the all-reduce."""
    assert_shipped_rules_reach(row_parallel_dense(), row_parallel_dense("rows"), iterations=5)


HEADS, HEAD_DIM = 2, 4


def attention_core(plan=None, d=2):
    """Scaled dot-product attention on [batch, heads, sequence, head-dim] (softmax over the keys,
    dropout on the probabilities), as the model (``plan=None``), split by batch (``"batch"``) or
    by heads (``"heads"``, Megatron's attention)."""
    b = PCGBuilder()
    q = b.input((BS, HEADS, SEQ, HEAD_DIM), name="q")
    k = b.input((BS, HEADS, HEAD_DIM, SEQ), name="k")
    v = b.input((BS, HEADS, SEQ, HEAD_DIM), name="v")
    dim = {"batch": 0, "heads": 1}.get(plan)
    if dim is not None:
        q, k, v = (b.partition(t, dim=dim, degree=d) for t in (q, k, v))
    s = b.scale(b.batch_matmul(q, k), factor=0.35)
    p = b.dropout(b.softmax(s, axis=-1), rate=0.1)
    out = b.batch_matmul(p, v)
    return b.build(out if dim is None else b.combine(out, dim=dim, degree=d))


def add_norm(plan=None, d=2):
    """A position embedding's broadcast add and LayerNorm on [batch, sequence, hidden], as the
    model or data parallel (``"batch"``: the [sequence, hidden] table and LayerNorm's weights
    replicated)."""
    b = PCGBuilder()
    x = b.input((BS, SEQ, HID), name="x")
    pos = b.weight((SEQ, HID), name="pos")
    gamma, beta = b.weight((HID,), name="gamma"), b.weight((HID,), name="beta")
    if plan == "batch":
        x = b.partition(x, dim=0, degree=d)
        pos, gamma, beta = (b.replicate(t, degree=d) for t in (pos, gamma, beta))
    y = b.layer_norm(b.add(x, pos), gamma, beta)
    return b.build(y if plan is None else b.combine(y, dim=0, degree=d))


@pytest.mark.parametrize(
    ("model", "plan"),
    [(attention_core, "batch"), (attention_core, "heads"), (add_norm, "batch")],
)
def test_the_shipped_one_operator_families_parallelize_attention_and_layer_norm(model, plan):
    assert_shipped_rules_reach(model(), model(plan), iterations=3)


VOCAB = 8


def token_embedding(plan=None, d=2):
    """A token lookup, integer ids [batch, sequence] into a [vocabulary, hidden] table, as the
    model or split: by the batch (``"batch"``, data parallel), the table's rows with partial
    sums (``"vocabulary"``, Megatron's vocabulary-parallel embedding) or its columns
    (``"hidden"``)."""
    b = PCGBuilder()
    ids = b.input((BS, SEQ), "i64", name="ids", max_value=VOCAB)
    table = b.weight((VOCAB, HID), name="table")
    if plan is None:
        return b.build(b.embedding(ids, table))
    if plan == "batch":
        y = b.embedding(b.partition(ids, dim=0, degree=d), b.replicate(table, degree=d))
        return b.build(b.combine(y, dim=0, degree=d))
    split = b.partition(table, dim={"vocabulary": 0, "hidden": 1}[plan], degree=d)
    y = b.embedding(b.replicate(ids, degree=d), split)
    return b.build(b.reduce(y, degree=d) if plan == "vocabulary" else b.combine(y, dim=2, degree=d))


def gathered_dense(d=2):
    """Megatron's column-parallel dense layer whose output is gathered on every device
    (``all_gather`` along the hidden dimension), its copies then dropped to give the model's
    one output."""
    b = PCGBuilder()
    x = b.input((BS, SEQ, HID), name="x")
    w, bias = b.weight((HID, HID), name="w"), b.weight((HID,), name="b")
    args = (b.replicate(x, degree=d), b.partition(w, dim=1, degree=d))
    y = b.linear(*args, b.partition(bias, dim=0, degree=d), activation="gelu")
    return b.build(b.discard_copies(b.all_gather(y, dim=2, degree=d), degree=d))


@pytest.mark.parametrize(
    ("model", "plan"),
    [
        (token_embedding, "batch"),
        (token_embedding, "vocabulary"),
        (token_embedding, "hidden"),
        (dense_gelu, "gathered"),
    ],
)
def test_the_shipped_rules_split_an_embedding_and_gather_a_column_split(model, plan):
    target = gathered_dense() if plan == "gathered" else model(plan)
    assert_shipped_rules_reach(model(), target, iterations=4)


def split_heads(plan=None, d=2, heads=HEADS):
    """Attention's head split: [batch, sequence, hidden] -> [batch, sequence, heads, head-dim]
    -> [batch, heads, sequence, head-dim], as the model or split by the batch (``"batch"``) or
    by whole heads (``"heads"``, Megatron's attention after its column-split projection)."""
    b = PCGBuilder()
    x = b.input((BS, SEQ, HID), name="x")
    dim = {"batch": 0, "heads": 2}.get(plan)
    if dim is not None:
        x = b.partition(x, dim=dim, degree=d)
    y = b.transpose(b.reshape(x, shape=(BS, SEQ, heads, HID // heads)), perm=(0, 2, 1, 3))
    return b.build(y if dim is None else b.combine(y, dim=min(dim, 1), degree=d))


def merge_heads(plan=None, d=2):
    """The way back: [batch, heads, sequence, head-dim] -> [batch, sequence, hidden]."""
    b = PCGBuilder()
    x = b.input((BS, HEADS, SEQ, HEAD_DIM), name="x")
    dim = {"batch": 0, "heads": 1}.get(plan)
    if dim is not None:
        x = b.partition(x, dim=dim, degree=d)
    y = b.reshape(b.transpose(x, perm=(0, 2, 1, 3)), shape=(BS, SEQ, HEADS * HEAD_DIM))
    return b.build(y if dim is None else b.combine(y, dim=2 * dim, degree=d))


@pytest.mark.parametrize(
    ("model", "plan"),
    [
        (split_heads, "batch"),
        (split_heads, "heads"),
        (merge_heads, "batch"),
        (merge_heads, "heads"),
    ],
)
def test_the_shipped_rules_split_the_attention_heads_reshapes(model, plan):
    assert_shipped_rules_reach(model(), model(plan), iterations=4)


def test_random_extractions_through_the_heads_reshapes_are_equivalent_to_the_input():
    model = split_heads()
    g = saturate(model, FOUR_GPUS, budget=Budget(iterations=4)).egraph
    assert any(n.op == "reshape" and g.shapes[n.eclass].degrees[2] > 1 for n in g.nodes)
    rng = random.Random(0)
    for _ in range(8):
        choice = random_acyclic_choice(g, rng)
        if choice is not None:
            assert_equivalent(model, g.to_pcg(choice))


def test_heads_are_split_only_by_a_degree_that_divides_their_number():
    # Six heads on two devices split whole; on four they cannot be (four does not divide six),
    # although four divides the hidden size.
    b = PCGBuilder()
    x = b.input((BS, SEQ, 24), name="x")
    model = b.build(b.transpose(b.reshape(x, shape=(BS, SEQ, 6, 4)), perm=(0, 2, 1, 3)))
    g = saturate(model, FOUR_GPUS, budget=Budget(iterations=4)).egraph
    heads_degrees = {g.shapes[n.eclass].degrees[2] for n in g.nodes if n.op == "reshape"}
    assert 2 in heads_degrees and 4 not in heads_degrees


# --- graph splitting: distinct segments saturated once, joined into the model's e-graph ----


@pytest.fixture(scope="module")
def deep():
    """A five-layer BERT, split into five segments of which four are distinct. Four iterations:
    Unity's Figure 2b needs GELU taken out of FFN1, the bias out of its product, and then the
    product split by its contraction."""
    model = bert_large(batch=4, seq=4, hidden=8, layers=5, heads=2, vocab=16)
    return model, saturate_split(model, TWO_GPUS, budget=Budget(iterations=4))


def test_a_split_deep_model_is_cut_into_segments_some_equal():
    model = bert_large(batch=4, seq=4, hidden=8, layers=5, heads=2, vocab=16)
    problems = segment_problems(model, split_segments(model))
    assert len(problems) == 5
    assert len({p.key for p in problems}) == 4  # the third and fourth are equal


@pytest.mark.parametrize("baseline", [data_parallel, megatron], ids=["dp", "megatron"])
def test_the_joined_egraph_holds_the_whole_models_plans_across_the_cuts(deep, baseline):
    model, sat = deep
    plan = baseline(model, TWO_GPUS)
    assert sat.contains(model)
    assert sat.contains(plan)
    extracted = sat.egraph.to_pcg(sat.egraph.choice_for(plan))
    assert_equivalent(model, extracted)
    assert len(extracted) == len(plan)


def test_the_joined_egraph_holds_unity_figure_2b_on_the_feed_forward_blocks(deep):
    model, sat = deep
    plan = unity_figure_2b(model, TWO_GPUS)
    assert sat.contains(plan)
    assert_equivalent(model, sat.egraph.to_pcg(sat.egraph.choice_for(plan)))


def test_random_extractions_from_the_joined_egraph_are_equivalent_to_the_model(deep):
    model, sat = deep
    assert_random_extractions_equivalent(model, sat.egraph, random.Random(0), tries=3)


def test_a_model_that_does_not_split_is_saturated_whole(mnist):
    model, whole = mnist
    split = saturate_split(model, TWO_GPUS, budget=Budget(iterations=3))
    assert (split.num_eclasses, split.num_enodes) == (whole.num_eclasses, whole.num_enodes)


def _one_segment(entry_shape, exit_shape, *, entry):
    """A one-node e-graph: a source (the entry) and its relu, both roots."""
    nodes = [
        ENode(
            "input", Params({"shape": entry_shape.sizes, "dtype": entry_shape.dtype}), (), 0, entry
        ),
        ENode("relu", Params(), (0,), 1),
    ]
    return EGraphData(nodes, [[0], [1]], [entry_shape, exit_shape], (1,))


def test_joining_segments_whose_entry_is_not_the_exit_before_is_a_shape_conflict():
    a, b = ParallelTensorShape.parse("f32[4, 8]"), ParallelTensorShape.parse("f32[4, 6]")
    first, second = _one_segment(a, a, entry="x"), _one_segment(b, b, entry="e")
    with pytest.raises(ShapeConflictError, match="different shapes"):
        join_segments([(first, {}, None), (second, {}, "e")])
    joined = join_segments([(first, {}, None), (_one_segment(a, a, entry="e"), {}, "e")])
    # The second relu reads the first: its entry's e-class is the first segment's exit.
    assert [str(n.op) for n in joined.nodes] == ["input", "relu", "relu"]
    assert joined.nodes[2].children == (joined.nodes[1].eclass,)


def test_cut_layouts_are_the_batch_splits_and_copies_the_devices_allow():
    shape = ParallelTensorShape.parse("f32[4, 8]")
    found = {repr(s) for s in cut_layouts(shape, (2, 4, 8))}
    assert found == {
        "f32[4, 8] r2", "f32[4, 8] r4", "f32[4, 8] r8",
        "f32[4/2, 8]", "f32[4/2, 8] r2", "f32[4/2, 8] r4",
        "f32[4/4, 8]", "f32[4/4, 8] r2",
    }  # fmt: skip
    with pytest.raises(PCGError, match="unsplit"):
        cut_layouts(shape.with_degree(0, 2), (2,))


def test_a_concat_of_more_inputs_than_a_constructor_takes_is_loaded_as_a_tree():
    # A recommender's 26 embedding tables and dense features, concatenated: the e-graph holds
    # it as a concat of concats (each within the constructors' arity), seeds and all.
    b = PCGBuilder()
    feats = [b.input((8, 2), name=f"f{k}") for k in range(26)]
    model = b.build(b.relu(b.matmul(b.concat(*feats, axis=1), b.weight((52, 4), name="w"))))
    sat = saturate(
        model, TWO_GPUS, budget=Budget(iterations=2), seeds=[data_parallel(model, TWO_GPUS)]
    )
    assert sat.contains(model) and sat.contains(data_parallel(model, TWO_GPUS))
    extracted = sat.egraph.to_pcg(sat.egraph.choice_for(model))
    assert max(len(n.inputs) for n in extracted.nodes if n.op == "concat") <= 8
    assert_equivalent(model, extracted)


def test_the_match_limit_grows_with_the_degrees_so_every_layer_gets_split():
    # The parallel rules take their degree from the machine's legal ones, so their matches
    # grow with the number of degrees; at a fixed limit of 1,000, two Summit nodes (12 GPUs,
    # 5 degrees) banned them so often that 3 iterations split only 2 of this MLP's 16 layers.
    # The algebraic rules' limit stays (their matches do not grow with the degrees).
    assert Budget().match_limits(3) == Budget().match_limits(1) == (1000, 1000)
    assert Budget().match_limits(5) == (1000, round(1000 * (5 / 3) ** 0.5))
    assert Budget(match_limit=77, parallel_match_limit=88).match_limits(5) == (77, 88)
    # Segments saturated together in one run share its counts: each gets the whole limits.
    together = Budget(enodes=10).for_problems(4, 6)
    assert (together.match_limits(6), together.enodes) == ((4000, 4 * 1414), 40)
    model = mlp(batch=48, in_features=32, hidden=64)  # two branches of 8 dense layers
    sat = saturate(model, Machine.preset("summit", nodes=2), budget=Budget(iterations=3))
    values = sat.egraph.logical_values(model)
    split = {
        values[n.eclass].node
        for n in sat.egraph.nodes
        if n.op == "linear"
        and values[n.eclass] is not None
        and sat.egraph.shapes[n.eclass].num_shards > 1
    }
    assert split >= {n.name for n in model.nodes if n.op == "linear"}


def test_a_pcg_in_micro_batches_is_refused_by_name():
    """The e-graph's shapes have no micro-batch counts: it would drop them."""
    from pcgopt import with_micro_batches
    from pcgopt.models import mnist_mlp

    cut = with_micro_batches(mnist_mlp(), 2)
    with pytest.raises(EGraphError, match=r"node 'x_pipeline' outputs f32\[64~2, 784\]"):
        saturate(cut, Machine.preset("dgx-a100"))
