"""The ONNX importer's contract: constants and shape arithmetic fold, initializers become weights
(parameters stay parameters), exporter patterns become pcgopt operators, symbolic dimensions
must be bound, and anything unsupported is one error that lists it all."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from pcgopt import FrontendError, evaluate  # noqa: E402
from pcgopt.frontend.export import EXPORTED_OPS  # noqa: E402
from pcgopt.frontend.onnx import from_onnx, to_onnx  # noqa: E402
from pcgopt.testing.strategies import feeds, small_pcgs  # noqa: E402

RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _x(name="x", shape=("batch", 8)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _y(name="y"):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _dense_gelu_model(gelu="erf"):
    """x @ W + b, then GELU written out as exporters do, then a reshape whose target is
    computed from Shape(x) (folded once the batch is bound)."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="/layer/dense/MatMul"),
        helper.make_node("Add", ["b", "h"], ["hb"], name="/layer/dense/Add"),
    ]
    if gelu == "erf":
        nodes += [
            helper.make_node("Div", ["hb", "sqrt2"], ["t1"], name="/layer/act/Div"),
            helper.make_node("Erf", ["t1"], ["t2"], name="/layer/act/Erf"),
            helper.make_node("Add", ["t2", "one"], ["t3"], name="/layer/act/Add"),
            helper.make_node("Mul", ["hb", "t3"], ["t4"], name="/layer/act/Mul"),
            helper.make_node("Mul", ["t4", "half"], ["a"], name="/layer/act/Mul_1"),
        ]
    else:
        nodes += [
            helper.make_node("Pow", ["hb", "three"], ["c1"], name="/layer/act/Pow"),
            helper.make_node("Mul", ["c1", "k"], ["c2"], name="/layer/act/Mul"),
            helper.make_node("Add", ["hb", "c2"], ["c3"], name="/layer/act/Add"),
            helper.make_node("Mul", ["c3", "s2pi"], ["c4"], name="/layer/act/Mul_1"),
            helper.make_node("Tanh", ["c4"], ["c5"], name="/layer/act/Tanh"),
            helper.make_node("Add", ["c5", "one"], ["c6"], name="/layer/act/Add_1"),
            helper.make_node("Mul", ["hb", "half"], ["c7"], name="/layer/act/Mul_2"),
            helper.make_node("Mul", ["c7", "c6"], ["a"], name="/layer/act/Mul_3"),
        ]
    nodes += [
        helper.make_node("Shape", ["x"], ["s"], name="/shape/Shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="/shape/Gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="/shape/Unsqueeze"),
        helper.make_node("Concat", ["n1", "tail"], ["target"], name="/shape/Concat", axis=0),
        helper.make_node("Reshape", ["a", "target"], ["y"], name="/out/Reshape"),
    ]
    inits = [
        _init("W", RNG.standard_normal((8, 6)).astype(np.float32)),
        _init("b", RNG.standard_normal(6).astype(np.float32)),
        _init("sqrt2", np.float32(math.sqrt(2))),
        _init("one", np.float32(1)),
        _init("half", np.float32(0.5)),
        _init("three", np.float32(3)),
        _init("k", np.float32(0.044715)),
        _init("s2pi", np.float32(math.sqrt(2 / math.pi))),
        _init("zero", np.int64(0)),
        _init("axes0", np.array([0], np.int64)),
        _init("tail", np.array([2, 3], np.int64)),
    ]
    return _model(nodes, [_x()], [_y()], inits)


@pytest.mark.parametrize(("form", "op"), [("erf", "gelu_erf"), ("tanh", "gelu")])
def test_dense_layer_and_gelu_become_one_operator_each(form, op):
    m = from_onnx(_dense_gelu_model(form), dims={"batch": 4})
    ops = [n.op for n in m.pcg.nodes if n.op not in ("input", "weight")]
    assert ops == ["linear", op, "reshape"]
    linear = next(n for n in m.pcg.nodes if n.op == "linear")
    assert linear.name == "/layer/dense/MatMul"
    assert m.parameter_count == 8 * 6 + 6
    # The scalar constants of the formula are gone with it.
    assert set(m.weights) == {"W", "b"}
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    h = x.astype(np.float64) @ m.weights["W"] + m.weights["b"]
    if form == "erf":
        want = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    else:
        want = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose(m.run({"x": x})["y"], want.reshape(4, 2, 3), atol=1e-6)


def test_a_formula_that_is_not_gelu_stays_as_written():
    model = _dense_gelu_model("erf")
    for init in model.graph.initializer:
        if init.name == "half":
            init.CopyFrom(_init("half", np.float32(0.6)))
    m = from_onnx(model, dims={"batch": 2})
    assert "gelu_erf" not in {n.op for n in m.pcg.nodes}
    assert "erf" in {n.op for n in m.pcg.nodes}


def test_unbound_symbolic_dimension_is_named():
    with pytest.raises(FrontendError, match=r"batch \(in x\).*dims"):
        from_onnx(_dense_gelu_model())


def test_a_dimension_that_names_nothing_is_an_error():
    with pytest.raises(FrontendError, match="seq name no symbolic dimension"):
        from_onnx(_dense_gelu_model(), dims={"batch": 2, "seq": 4})


def test_old_opsets_are_refused_with_the_fix():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_x(shape=(2, 2))], [_y()], opset=11)
    with pytest.raises(FrontendError, match=r"opset 11.*opset_version=17"):
        from_onnx(model)


def test_every_unsupported_operator_is_listed_at_once():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="ok"),
        helper.make_node("Celu", ["r"], ["c1"], name="celu_a"),
        helper.make_node("Celu", ["c1"], ["c2"], name="celu_b"),
        helper.make_node("HardSwish", ["r"], ["h"], name="hs"),
        helper.make_node("Add", ["c2", "h"], ["y"], name="sum"),
    ]
    with pytest.raises(FrontendError) as info:
        from_onnx(_model(nodes, [_x(shape=(2, 2))], [_y()]))
    err = info.value
    # The second Celu reads the first one's output: it is still listed, counted by type.
    assert err.unsupported == {"Celu": (1, ("celu_a",)), "HardSwish": (1, ("hs",))}
    assert "Celu x1" in str(err) and "HardSwish x1" in str(err)


def test_an_integer_input_is_a_lookup_or_a_mask():
    x = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])
    nodes = [helper.make_node("Identity", ["ids"], ["y"], name="copy")]
    with pytest.raises(FrontendError, match="'ids' holds integers but is neither"):
        from_onnx(_model(nodes, [x], [_y()]))
    nodes = [helper.make_node("Cast", ["ids"], ["y"], to=TensorProto.FLOAT, name="cast")]
    m = from_onnx(_model(nodes, [x], [_y()]))
    assert m.pcg.node("ids").params["max_value"] == 2  # a mask: checked plans draw 0 or 1


def test_lookup_bounds_its_indices_by_the_table():
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 5])
    table = RNG.standard_normal((11, 4)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["y"], name="/emb/Gather")]
    m = from_onnx(_model(nodes, [ids], [_y()], [_init("emb", table)]), dims={"batch": 3})
    assert m.pcg.node("ids").params["max_value"] == 11
    assert [n.op for n in m.pcg.nodes if n.op not in ("input", "weight")] == ["embedding"]
    idx = RNG.integers(0, 11, (3, 5))
    np.testing.assert_allclose(m.run({"ids": idx})["y"], table[idx])


def test_a_weight_stored_twice_is_one_parameter():
    # A tied embedding and output projection, which exporters write as two initializers.
    table = RNG.standard_normal((16, 8)).astype(np.float32)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])
    nodes = [
        helper.make_node("Gather", ["wte", "ids"], ["h"], name="/emb/Gather"),
        helper.make_node("MatMul", ["h", "head"], ["y"], name="/head/MatMul"),
    ]
    inits = [_init("wte", table), _init("head", np.ascontiguousarray(table.T))]
    m = from_onnx(_model(nodes, [ids], [_y()], inits))
    assert m.parameter_count == table.size
    assert "transpose" in {n.op for n in m.pcg.nodes}
    idx = RNG.integers(0, 16, (2, 3))
    np.testing.assert_allclose(m.run({"ids": idx})["y"], table[idx] @ table.T, rtol=1e-6)


def test_constant_mask_where_is_exact():
    mask = np.tril(np.ones((4, 4), bool))
    nodes = [helper.make_node("Where", ["m", "x", "fill"], ["y"], name="/attn/Where")]
    inits = [_init("m", mask), _init("fill", np.float32(-1e9))]
    m = from_onnx(_model(nodes, [_x(shape=(2, 4, 4))], [_y()], inits))
    x = RNG.standard_normal((2, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(m.run({"x": x})["y"], np.where(mask, x, np.float32(-1e9)))


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(FrontendError, match="no such ONNX file"):
        from_onnx(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01not a model")
    with pytest.raises(FrontendError, match="not a readable ONNX model"):
        from_onnx(junk)


_ROUND_TRIP_OPS = tuple(
    op
    for op in (
        "matmul",
        "relu",
        "tanh",
        "sigmoid",
        "gelu",
        "gelu_erf",
        "exp",
        "add",
        "sub",
        "mul",
        "scale",
        "transpose",
        "concat",
        "softmax",
    )
    if op in EXPORTED_OPS
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_pcgs_written_as_onnx_read_back_equal(data):
    pcg = data.draw(small_pcgs(max_ops=6, ops=_ROUND_TRIP_OPS, degrees=(1,)), label="pcg")
    weights = {
        n.name: np.asarray(RNG.standard_normal(pcg.shape(n.name).sizes), np.float32)
        for n in pcg.weights
    }
    m = from_onnx(to_onnx(pcg, weights=weights))
    values = data.draw(feeds(pcg), label="inputs")
    inputs = {n.name: values[n.name].astype(np.float32) for n in pcg.inputs}
    want = evaluate(pcg, {**inputs, **weights}).outputs[0].logical()
    got = next(iter(m.run(inputs).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_one_hot_is_a_lookup_that_bounds_its_indices():
    labels = helper.make_tensor_value_info("labels", TensorProto.INT64, [6])
    nodes = [
        helper.make_node("OneHot", ["labels", "depth", "values"], ["oh"], name="/loss/OneHot"),
        helper.make_node("Mul", ["oh", "x"], ["y"], name="/loss/Mul"),
    ]
    inits = [_init("depth", np.int64(5)), _init("values", np.array([0.0, 1.0], np.float32))]
    m = from_onnx(_model(nodes, [labels, _x(shape=(6, 5))], [_y()], inits))
    assert m.pcg.node("labels").params["max_value"] == 5
    idx, x = RNG.integers(0, 5, 6), RNG.standard_normal((6, 5)).astype(np.float32)
    np.testing.assert_array_equal(m.run({"labels": idx, "x": x})["y"], np.eye(5)[idx] * x)


def test_layer_norm_and_softmax_as_old_exporters_wrote_them_are_operators():
    d = 8
    g, b = RNG.standard_normal(d).astype(np.float32), RNG.standard_normal(d).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], name="/ln/ReduceMean"),
        helper.make_node("Sub", ["x", "mu"], ["dx"], name="/ln/Sub"),
        helper.make_node("Pow", ["dx", "two"], ["sq"], name="/ln/Pow"),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], name="/ln/ReduceMean_1"),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="/ln/Add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="/ln/Sqrt"),
        helper.make_node("Div", ["dx", "sd"], ["n"], name="/ln/Div"),
        helper.make_node("Mul", ["n", "g"], ["ng"], name="/ln/Mul"),
        helper.make_node("Add", ["ng", "b"], ["h"], name="/ln/Add_1"),
        helper.make_node("Exp", ["h"], ["e"], name="/sm/Exp"),
        helper.make_node("ReduceSum", ["e", "last"], ["s"], name="/sm/ReduceSum"),
        helper.make_node("Div", ["e", "s"], ["y"], name="/sm/Div"),
    ]
    inits = [
        _init("two", np.float32(2.0)),
        _init("eps", np.float32(1e-5)),
        _init("g", g),
        _init("b", b),
        _init("last", np.array([-1], np.int64)),
    ]
    m = from_onnx(_model(nodes, [_x(shape=(3, d))], [_y()], inits))
    assert [n.op for n in m.pcg.nodes if n.op not in ("input", "weight")] == [
        "layer_norm",
        "softmax",
    ]
    assert set(m.weights) == {"g", "b"} and m.pcg.node("/ln/Add_1").op == "layer_norm"
    x = RNG.standard_normal((3, d))
    h = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b
    want = np.exp(h) / np.exp(h).sum(-1, keepdims=True)
    np.testing.assert_allclose(m.run({"x": x.astype(np.float32)})["y"], want, rtol=1e-5)


def test_dilated_convolution_computes_what_onnx_computes():
    from onnx.reference import ReferenceEvaluator

    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    node = helper.make_node(
        "Conv", ["x", "w"], ["y"], dilations=[2, 2], pads=[2, 2, 2, 2], name="/aspp/Conv"
    )
    model = _model([node], [_x(shape=(2, 3, 9, 9))], [_y()], [_init("w", w)])
    m = from_onnx(model)
    assert m.pcg.node("/aspp/Conv").params["dilation"] == (2, 2)
    x = RNG.standard_normal((2, 3, 9, 9)).astype(np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


# --- Operators of masks, padding, upsampling, routing and gathers, against onnxruntime --------

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _in(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, name=f"/{op}_{outs[0]}", **attrs)


def _floats(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _padding_mask():
    mask = np.ones((2, 4), np.int64)
    mask[1, 2:] = 0
    return mask


_BERT_MASK = (
    # transformers' padding mask: the integer mask as bool, and-ed with a constant one, then
    # where(mask, 0, min) added to the attention scores.
    [
        _node("Cast", ["mask"], ["mb"], to=TensorProto.BOOL),
        _node("Unsqueeze", ["mb", "axis1"], ["mu"]),
        _node("Cast", ["mu"], ["mu2"], to=TensorProto.BOOL),
        _node("And", ["mu2", "causal"], ["keep"]),
        _node("Where", ["keep", "zero", "lowest"], ["bias"]),
        _node("Add", ["scores", "bias"], ["s"]),
        _node("Softmax", ["s"], ["y"], axis=-1),
    ],
    [_in("mask", (2, 4), I64), _in("scores", (2, 4, 4))],
    [
        _init("axis1", np.array([1], np.int64)),
        _init("causal", np.tril(np.ones((4, 4), bool))),
        _init("zero", np.float32(0)),
        _init("lowest", np.finfo(np.float32).min),
    ],
    {"mask": _padding_mask(), "scores": _floats(2, 4, 4)},
)

_LOGIC = (
    [
        _node("Less", ["x", "z"], ["lt"]),
        _node("GreaterOrEqual", ["x", "c"], ["ge"]),
        _node("Or", ["lt", "ge"], ["or"]),
        _node("Not", ["or"], ["not"]),
        _node("Xor", ["not", "lt"], ["xor"]),
        _node("Equal", ["ids", "pad"], ["eq"]),
        _node("Or", ["xor", "eq"], ["any"]),
        _node("Where", ["any", "x", "inf"], ["y"]),
    ],
    [_in("x", (3, 5)), _in("z", (3, 5)), _in("ids", (3, 5), I64)],
    [_init("c", np.float32(0.3)), _init("pad", np.int64(1)), _init("inf", np.float32(-np.inf))],
    {"x": _floats(3, 5), "z": _floats(3, 5), "ids": RNG.integers(0, 2, (3, 5))},
)


def _resize_case(scales, **attrs):
    nodes = [_node("Resize", ["x", "", "scales"], ["y"], **attrs)]
    inits = [_init("scales", np.array(scales, np.float32))]
    return nodes, [_in("x", (2, 3, 4, 6))], inits, {"x": _floats(2, 3, 4, 6)}


_OPERATOR_CASES = {
    "padding mask": _BERT_MASK,
    "comparisons and logic": _LOGIC,
    "pad with a value, and a negative pad": (
        [_node("Pad", ["x", "pads", "v"], ["y"])],
        [_in("x", (3, 5))],
        [_init("pads", np.array([1, -1, 0, 2], np.int64)), _init("v", np.float32(-2))],
        {"x": _floats(3, 5)},
    ),
    "conv with SAME padding and a stride": (
        [_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
        [_in("x", (2, 3, 8, 7))],
        [_init("w", _floats(4, 3, 3, 3))],
        {"x": _floats(2, 3, 8, 7)},
    ),
    "grouped transposed conv with output padding": (
        [
            _node(
                "ConvTranspose",
                ["x", "w", "b"],
                ["y"],
                strides=[2, 2],
                pads=[1, 0, 1, 1],
                output_padding=[1, 0],
                group=2,
            )
        ],
        [_in("x", (2, 4, 5, 4))],
        [_init("w", _floats(4, 3, 3, 3)), _init("b", _floats(6))],
        {"x": _floats(2, 4, 5, 4)},
    ),
    "nearest upsampling": _resize_case(
        [1, 1, 2, 2], mode="nearest", coordinate_transformation_mode="asymmetric"
    ),
    "bilinear resize": _resize_case([1, 1, 2, 3], mode="linear"),
    "bicubic resize, up and down": _resize_case([1, 1, 1.5, 0.5], mode="cubic"),
    "smallest two along an axis": (
        [
            _node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0),
            _node("Cast", ["i"], ["fi"], to=F),
            _node("Add", ["v", "fi"], ["y"]),
        ],
        [_in("x", (3, 6, 2))],
        [_init("k", np.array([2], np.int64))],
        {"x": _floats(3, 6, 2)},
    ),
    "argmax, then a lookup": (
        [_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0), _node("Gather", ["t", "i"], ["y"])],
        [_in("x", (3, 6))],
        [_init("t", _floats(6, 4))],
        {"x": _floats(3, 6)},
    ),
    "gather of a computed tensor along axis 1": (
        [_node("Relu", ["x"], ["r"]), _node("Gather", ["r", "ids"], ["y"], axis=1)],
        [_in("x", (3, 6, 2)), _in("ids", (4,), I64)],
        [],
        {"x": _floats(3, 6, 2), "ids": RNG.integers(0, 6, 4)},
    ),
}


@pytest.mark.parametrize("case", sorted(_OPERATOR_CASES))
def test_operator_computes_what_onnxruntime_computes(case):
    ort = pytest.importorskip("onnxruntime")
    nodes, inputs, inits, feeds = _OPERATOR_CASES[case]
    model = _model(nodes, inputs, [_y()], inits, opset=18)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(["y"], feeds)
    got = from_onnx(model).run(feeds)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_padding_mask_is_a_where_on_a_0_1_float_mask():
    m = from_onnx(_model(*_BERT_MASK[:2], [_y()], _BERT_MASK[2], opset=18))
    ops = [n.op for n in m.pcg.nodes if n.op not in ("input", "weight")]
    # One cast to float and one comparison, although the exporter cast to bool twice.
    assert ops == ["cast", "compare", "reshape", "mul", "where", "add", "softmax"]
    assert m.pcg.node("mask").params["max_value"] == 2


def test_a_transposed_convolution_stores_its_kernel_flipped_under_its_name():
    nodes, inputs, inits, _ = _OPERATOR_CASES["grouped transposed conv with output padding"]
    m = from_onnx(_model(nodes, inputs, [_y()], inits, opset=18))
    conv = next(n for n in m.pcg.nodes if n.op == "conv2d")
    assert conv.params["input_dilation"] == (2, 2)
    assert m.pcg.shape("w").sizes == (6, 2, 3, 3) and m.parameter_count == 4 * 3 * 9 + 6
