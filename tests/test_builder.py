"""PCGBuilder: one method per operator, errors at the line that makes them."""

import math

import pytest

from pcgopt import OPERATORS, DegreeError, DuplicateNameError, PCGBuilder, PCGError, ShapeError


def test_every_operator_is_a_builder_method():
    b = PCGBuilder()
    names = dir(b)
    for op, spec in OPERATORS.items():
        assert callable(getattr(b, op))
        if spec.kind.name != "SOURCE":
            assert op in names
    assert b.matmul.__doc__ == OPERATORS["matmul"].doc


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="no attribute or operator 'frobnicate'"):
        PCGBuilder().frobnicate  # noqa: B018


def test_names_are_generated_and_scoped():
    b = PCGBuilder()
    x = b.input((2, 3))
    with b.scope("layer0"), b.scope("attn"):
        y = b.relu(x)
        w = b.weight((3,), name="bias")
    assert x.ref.node == "input_1"
    assert y.ref.node == "layer0/attn/relu_1"
    assert w.ref.node == "layer0/attn/bias"


def test_duplicate_names_are_rejected():
    b = PCGBuilder()
    b.input((2,), name="x")
    with pytest.raises(DuplicateNameError, match="'x' already exists"):
        b.weight((2,), name="x")


def test_errors_name_the_node_being_added():
    b = PCGBuilder()
    x = b.input((4, 6), name="x")
    with pytest.raises(ShapeError, match=r"node 'mm' \(matmul\): matmul: contraction sizes differ"):
        b.matmul(x, b.weight((5, 2)), name="mm")
    partial = b.matmul(
        b.partition(x, dim=1, degree=2), b.partition(b.weight((6, 2)), dim=0, degree=2)
    )
    with pytest.raises(DegreeError, match=r"node 'r' \(relu\): x holds 2 partial sums"):
        b.relu(partial, name="r")
    with pytest.raises(DegreeError, match=r"node 'reduce_1' .* identical copies"):
        b.reduce(b.replicate(x, degree=2), degree=2)


def test_foreign_tensors_are_rejected():
    a, b = PCGBuilder(), PCGBuilder()
    x = a.input((2,))
    with pytest.raises(PCGError, match="not a tensor of this builder"):
        b.relu(x)


def test_multi_output_operators_return_tuples():
    b = PCGBuilder()
    parts = b.split(b.input((4, 6)), axis=1, sizes=(2, 4))
    assert [repr(p.shape) for p in parts] == ["f32[4, 2]", "f32[4, 4]"]
    g = b.build(parts)
    assert len(g.outputs) == 2


def test_nodes_built_alike_share_their_inferred_shapes_and_a_list_parameter_is_a_tuple():
    # Shape inference is cached by operator, parameters and input shapes: the searches build
    # the same nodes over and over. A list-valued parameter (no cache key) gives the same node.
    b = PCGBuilder()
    x = b.input((8, 6), name="x")
    first = b.reshape(x, shape=(4, 12), name="first")
    again = b.reshape(x, shape=(4, 12), name="again")
    listed = b.reshape(x, shape=[4, 12], name="listed")
    pcg = b.build(first, again, listed)
    assert pcg.node("first").params == pcg.node("again").params == pcg.node("listed").params
    assert first.shape is again.shape and listed.shape == first.shape
    with pytest.raises(PCGError, match="node 'bad' \\(reshape\\): cannot reshape"):
        b.reshape(x, shape=(5, 12), name="bad")
    with pytest.raises(PCGError, match="node 'bad2' \\(reshape\\): cannot reshape"):
        b.reshape(x, shape=(5, 12), name="bad2")  # an error is not cached
    # Equal values of other types are other parameters: 4.0 and True are still refused after
    # 4 and 1 were accepted.
    with pytest.raises(PCGError, match="'shape' must be a list of positive ints"):
        b.reshape(x, shape=(4.0, 12))
    b.scale(x, factor=1)
    with pytest.raises(PCGError, match="'factor' must be a number, got True"):
        b.scale(x, factor=True)
    # -0.0 == 0.0, but it is another factor.
    b.scale(x, factor=0.0, name="plus")
    b.scale(x, factor=-0.0, name="minus")
    nodes = {n.name: n for n in b.nodes}
    assert math.copysign(1, nodes["minus"].params["factor"]) == -1
