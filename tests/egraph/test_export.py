"""The exported e-graph's logical values: every e-class that holds a tensor of the PCG it was
saturated from says which, as the model's names read a plan (parallel operators move a value,
compute nodes over the same values compute the same one)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pcgopt import PCGBuilder
from pcgopt.egraph import saturate
from pcgopt.extract.strategies.branches import lower_degrees
from pcgopt.graph import TensorRef
from pcgopt.names import model_names
from pcgopt.ops import OpKind
from pcgopt.testing.strategies import flat_machine, towers

FOUR = flat_machine(4)


@settings(max_examples=12, deadline=None)
@given(model=towers(degrees=(1,)), data=st.data())
def test_every_class_of_a_seed_holds_the_value_its_node_computes(model, data):
    compute = [n.name for n in model.nodes if n.spec.kind is OpKind.COMPUTE]
    degrees = {name: data.draw(st.sampled_from((1, 2, 4)), label=name) for name in compute}
    seed = lower_degrees(model, FOUR, degrees)
    egraph = saturate(model, FOUR, rules=[], seeds=[seed]).egraph
    values = egraph.logical_values(model)
    for ref, c in egraph.classes_of(model).items():  # the model's own tensors
        assert values[c] == ref
    where = egraph.classes_of(seed)
    names = model_names(model, seed)
    holds: dict[TensorRef, TensorRef] = {}  # the seed's tensors' logical values
    for node in seed.nodes:
        out = node.output()
        if node.spec.kind is OpKind.SOURCE:
            holds[out] = out
        elif node.spec.kind is OpKind.PARALLEL:
            holds[out] = holds[node.inputs[0]]
        else:
            holds[out] = TensorRef(names[node.name], 0)
        assert values[where[out]] == holds[out], node.name


def test_a_value_only_a_rewrite_made_holds_no_tensor_of_the_model():
    b = PCGBuilder()
    x, w = b.input((8, 4), name="x"), b.weight((4, 6), name="w")
    model = b.build(b.matmul(x, w, name="y"))
    b = PCGBuilder()
    x, w = b.input((8, 4), name="x"), b.weight((4, 6), name="w")
    halves = b.split(w, axis=1, sizes=(2, 4), name="halves")
    seed = b.build(b.concat(*(b.matmul(x, h) for h in halves), axis=1, name="joined"))
    egraph = saturate(model, FOUR, rules=[], seeds=[seed]).egraph
    values = egraph.logical_values(model)
    where = egraph.classes_of(seed)
    assert values[where[seed.node("joined").output()]] == TensorRef("y", 0)
    for node in seed.nodes:
        if node.op == "matmul":  # a product by half of the weight: no tensor of the model
            assert values[where[node.output()]] is None


@settings(max_examples=12, deadline=None)
@given(model=towers(degrees=(1,)), data=st.data())
def test_an_extraction_lists_each_layout_change_just_before_its_reader(model, data):
    """A PCG's order is the order a runtime issues its nodes in: an extraction lists a layout
    change (a parallelization node) just before its first reader, as the lowering does, not
    where the e-graph's post-order reaches it (after a branch, before the next branch, where
    its collective holds up the streams the next branch needs)."""
    compute = [n.name for n in model.nodes if n.spec.kind is OpKind.COMPUTE]
    degrees = {name: data.draw(st.sampled_from((1, 2, 4)), label=name) for name in compute}
    seed = lower_degrees(model, FOUR, degrees)
    egraph = saturate(model, FOUR, rules=[], seeds=[seed]).egraph
    plan = egraph.to_pcg(egraph.choice_for(seed))
    nodes, read = plan.nodes, plan.consumers()
    for k, node in enumerate(nodes):
        if node.spec.kind is OpKind.PARALLEL and node.output() in read:
            # The run of layout changes after it, up to the first other node, reads it.
            end = next(
                j for j in range(k + 1, len(nodes)) if nodes[j].spec.kind is not OpKind.PARALLEL
            )
            assert any(r.node == node.name for n in nodes[k + 1 : end + 1] for r in n.inputs), (
                node.name
            )
