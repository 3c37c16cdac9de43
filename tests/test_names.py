"""The model's names in a plan (pcgopt.names): a node that computes what a model node computes
takes its name, in whatever form a rewrite left it; a fused node joins the names it replaces;
a parallel operator is named after the value it moves."""

from pcgopt import PCGBuilder
from pcgopt.names import model_names, restore_names


def _dense_model():
    b = PCGBuilder()
    x, w = b.input((8, 4), name="x"), b.weight((4, 6), name="fc1/w")
    bias = b.weight((6,), name="fc1/b")
    h = b.linear(x, w, bias, name="fc1/linear")
    return b.build(b.relu(h, name="act"))


def test_an_unfused_dense_layer_keeps_its_name_on_each_piece():
    b = PCGBuilder()
    x, w = b.input((8, 4), name="x"), b.weight((4, 6), name="fc1/w")
    bias = b.weight((6,), name="fc1/b")
    # bias first: an addition's inputs are unordered
    h = b.add(bias, b.matmul(x, w, name="matmul_7"), name="add_8")
    plan = b.build(b.relu(h, name="relu_9"))
    names = model_names(_dense_model(), plan)
    assert names == {
        "x": "x",
        "fc1/w": "fc1/w",
        "fc1/b": "fc1/b",
        "matmul_7": "fc1/linear.matmul",
        "add_8": "fc1/linear.add",
        "relu_9": "act",
    }


def test_a_fused_node_joins_the_names_it_replaces():
    b = PCGBuilder()
    x, w = b.input((8, 4), name="x"), b.weight((4, 6), name="fc1/w")
    model = b.build(b.relu(b.matmul(x, w, name="fc1/matmul"), name="fc1/relu"))
    b = PCGBuilder()
    x, w = b.input((8, 4), name="x"), b.weight((4, 6), name="fc1/w")
    plan = b.build(b.linear(x, w, activation="relu", name="linear_3"))
    assert model_names(model, plan)["linear_3"] == "fc1/matmul+relu"


def test_parallel_operators_are_named_after_the_value_they_move():
    b = PCGBuilder()
    x = b.partition(b.input((8, 4), name="x"), dim=0, degree=2, name="partition_1")
    w = b.replicate(b.weight((4, 6), name="fc1/w"), degree=2, name="replicate_2")
    bias = b.replicate(b.weight((6,), name="fc1/b"), degree=2, name="fc1/b.copies")
    h = b.linear(x, w, bias, name="linear_3")
    plan = b.build(b.combine(b.relu(h, name="relu_4"), dim=0, degree=2, name="combine_5"))
    renamed = restore_names(_dense_model(), plan)
    assert [n.name for n in renamed.nodes] == [
        "x",
        "x.partition",
        "fc1/w",
        "fc1/w.replicate",
        "fc1/b",
        "fc1/b.copies",  # already named after its value: kept
        "fc1/linear",
        "act",
        "act.combine",
    ]


def test_pieces_of_one_value_are_numbered_and_unknown_values_keep_their_names():
    b = PCGBuilder()
    x = b.input((8, 4), name="x")
    model = b.build(b.relu(x, name="act"))
    b = PCGBuilder()
    x = b.input((8, 4), name="x")
    first, second = b.relu(x, name="r1"), b.relu(x, name="r2")
    plan = b.build(b.add(first, second, name="sum"))
    names = model_names(model, plan)
    assert (names["r1"], names["r2"], names["sum"]) == ("act", "act~1", "sum")
