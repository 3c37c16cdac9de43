"""PCG validation: every malformed graph is rejected with a specific error naming the node."""

import networkx as nx
import pytest

from pcgopt import (
    PCG,
    ArityError,
    CycleError,
    DanglingEdgeError,
    DegreeError,
    DuplicateNameError,
    Node,
    ParameterError,
    PCGError,
    ShapeError,
    TensorRef,
    UnknownOperatorError,
)
from pcgopt.models import build


def x(name="x", shape=(4, 6)):
    return Node(name, "input", (), {"shape": shape})


def w(name="w", shape=(6, 3)):
    return Node(name, "weight", (), {"shape": shape})


def test_a_valid_graph():
    g = PCG([x(), w(), Node("y", "matmul", ("x", "w"))])
    assert repr(g.shape("y")) == "f32[4, 3]"
    assert g.outputs == (TensorRef("y"),)


def test_nodes_are_put_in_topological_order():
    g = PCG([Node("z", "relu", ("y",)), Node("y", "matmul", ("x", "w")), x(), w()])
    assert [n.name for n in g.nodes] == ["x", "w", "y", "z"]


def test_parameters_are_canonical():
    a = PCG([x(), Node("s", "softmax", ("x",), {"axis": -1})])
    b = PCG([x(), Node("s", "softmax", ("x",), {"axis": 1})])
    assert a == b and hash(a) == hash(b)
    assert a.node("s").params["axis"] == 1


@pytest.mark.parametrize(
    ("nodes", "error", "node", "message"),
    [
        (
            [x(), Node("y", "frobnicate", ("x",))],
            UnknownOperatorError,
            "y",
            "unknown operator 'frobnicate'",
        ),
        ([x(), Node("y", "relu", ("x", "x"))], ArityError, "y", "takes 1 input"),
        (
            [x(), w(shape=(5, 3)), Node("y", "matmul", ("x", "w"))],
            ShapeError,
            "y",
            "contraction sizes differ",
        ),
        (
            [x(), Node("p", "partition", ("x",), {"dim": 1, "degree": 4})],
            DegreeError,
            "p",
            "4 does not divide 6",
        ),
        (
            [x(), Node("a", "relu", ("b",)), Node("b", "relu", ("a",))],
            CycleError,
            "a",
            "cycle: 'a' -> 'b' -> 'a'",
        ),
        (
            [x(), Node("y", "relu", ("nowhere",))],
            DanglingEdgeError,
            "y",
            "no node is named 'nowhere'",
        ),
        ([x(), Node("y", "relu", ("x:1",))], DanglingEdgeError, "y", "which has 1 output"),
        ([x(), x()], DuplicateNameError, "x", "two nodes are named 'x'"),
        (
            [Node("x", "input", (), {"shape": (4, -1)})],
            ParameterError,
            "x",
            "list of positive ints",
        ),
        (
            [x(), Node("y", "relu", ("x",), {"alpha": 1})],
            ParameterError,
            "y",
            "unknown parameter 'alpha'",
        ),
        (
            [x(), Node("p", "partition", ("x",), {"dim": 1})],
            ParameterError,
            "p",
            "needs parameter 'degree'",
        ),
        (
            [x(), Node("p", "partition", ("x",), {"dim": 5, "degree": 2})],
            ParameterError,
            "p",
            "out of range",
        ),
        (
            [x(), Node("p", "partition", ("x",), {"dim": "0", "degree": 2})],
            ParameterError,
            "p",
            "must be an axis index",
        ),
        ([x(), Node("r", "reduce", ("x",), {"degree": 2})], DegreeError, "r", "partial sum"),
    ],
)
def test_malformed_graphs_are_rejected_with_a_specific_error(nodes, error, node, message):
    with pytest.raises(error, match=message) as info:
        PCG(nodes)
    assert info.value.node == node
    assert f"'{node}'" in str(info.value)


def test_outputs_must_exist():
    with pytest.raises(DanglingEdgeError, match="graph output y names no tensor"):
        PCG([x()], ["y"])


def test_default_outputs_are_the_unread_tensors():
    g = PCG(
        [x(), Node("s", "split", ("x",), {"axis": 1, "sizes": (2, 4)}), Node("r", "relu", ("s:1",))]
    )
    assert g.outputs == (TensorRef("s", 0), TensorRef("r"))


def test_tensor_refs_parse_and_print():
    assert TensorRef.parse("a/b:2") == TensorRef("a/b", 2)
    assert TensorRef.parse("a") == TensorRef("a", 0)
    assert str(TensorRef("s", 1)) == "s:1"


def test_networkx_view_is_the_graph():
    g = build("bert_large", small=True)
    view = g.to_networkx()
    assert nx.is_directed_acyclic_graph(view)
    assert view.number_of_nodes() == len(g)
    assert view.number_of_edges() == sum(len(n.inputs) for n in g.nodes)
    assert view.nodes["head/logits"]["op"] == "matmul"
    u, _, data = next(iter(view.in_edges("head/logits", data=True)))
    assert data["shape"] == g.shape(TensorRef(u, data["index"]))


def test_consumers():
    g = PCG([x(), Node("a", "relu", ("x",)), Node("b", "add", ("x", "a"))])
    assert g.consumers()[TensorRef("x")] == [("a", 0), ("b", 0)]


def test_renaming_keeps_the_graph_and_its_shapes():
    g = PCG([x(), w(), Node("y", "matmul", ("x", "w")), Node("z", "relu", ("y",))])
    names = {"x": "a", "w": "b", "y": "c", "z": "d"}
    r = g.renamed(names)
    # The same as building the renamed nodes from scratch (which re-infers every shape).
    rebuilt = PCG(
        [x("a"), w("b"), Node("c", "matmul", ("a", "b")), Node("d", "relu", ("c",))], ["d"]
    )
    assert r == rebuilt and r.shape("c") == g.shape("y")
    with pytest.raises(DuplicateNameError, match="'a'"):
        g.renamed({**names, "w": "a"})
    with pytest.raises(PCGError, match="no new name for node 'z'"):
        g.renamed({"x": "a", "w": "b", "y": "c"})


def test_layout_changes_are_listed_just_before_their_first_reader():
    from pcgopt.graph import layout_changes_late

    def part(name, of):
        return Node(name, "partition", (TensorRef(of),), {"dim": 0, "degree": 2})

    # Two branches over x, joined by an add; each branch's output is laid out for the join
    # right after the branch (a post-order), and a weight's layout sits at the start.
    listed = [
        x(),
        w("w", (6, 6)),
        part("w2", "w"),
        Node("a", "relu", (TensorRef("x"),), {}),
        part("a2", "a"),
        Node("b", "relu", (TensorRef("x"),), {}),
        part("b2", "b"),
        Node("joined", "add", (TensorRef("a2"), TensorRef("b2")), {}),
        Node("y", "relu", (TensorRef("w2"),), {}),
    ]
    late = layout_changes_late(listed)
    assert [n.name for n in late] == ["x", "w", "a", "b", "a2", "b2", "joined", "w2", "y"]
    # A valid order: the PCG keeps it.
    kept = PCG(late, [TensorRef("joined"), TensorRef("y")]).nodes
    assert [n.name for n in kept] == [n.name for n in late]
    # A layout change nothing reads (an output) keeps its place among the last.
    assert [n.name for n in layout_changes_late(listed[:5])] == ["x", "w", "a", "w2", "a2"]
    # A node reading a layout change and a layout change of it comes after both, in order.
    chained = [
        x(),
        Node("a", "relu", (TensorRef("x"),), {}),
        part("p1", "a"),
        Node("p2", "replicate", (TensorRef("p1"),), {"degree": 2}),
        Node("c", "relu", (TensorRef("a"),), {}),
        Node("d", "add", (TensorRef("p2"), TensorRef("p1")), {}),
    ]
    assert [n.name for n in layout_changes_late(chained)] == ["x", "a", "c", "p1", "p2", "d"]
