"""Models this project did not write (tests/data/onnx, exported from PyTorch and transformers by
tools/make_onnx_corpus.py) import as PCGs that compute what PyTorch computed, with PyTorch's
parameter counts, and optimize into checked plans that speak in the model's layer names."""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

from pcgopt import Machine
from pcgopt.frontend.onnx import from_onnx

CORPUS = Path(__file__).parents[1] / "data" / "onnx"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())
MODELS = sorted(MANIFEST)


@pytest.fixture(scope="module", params=MODELS)
def corpus_model(request):
    name = request.param
    entry = MANIFEST[name]
    data = np.load(CORPUS / f"{name}.npz")
    batch = entry["example_input_shapes"][next(iter(entry["inputs"]))][0]
    imported = from_onnx(CORPUS / f"{name}.onnx", dims={entry["batch_symbol"]: batch})
    return name, entry, data, imported


def test_the_corpus_has_the_architectures_the_issue_names():
    assert {"bert", "gpt2", "vit", "bart", "resnet", "convnext", "transformer_encoder"} <= set(
        MODELS
    )


def test_imported_model_computes_what_pytorch_computed(corpus_model):
    _name, entry, data, m = corpus_model
    outputs = m.run({k: data[k] for k in m.inputs})
    assert list(outputs) == entry["outputs"]
    for key, value in outputs.items():
        expected = data[key]
        assert value.shape == expected.shape, key
        scale = max(1.0, float(np.abs(expected).max()))
        np.testing.assert_allclose(value, expected, rtol=0, atol=1e-4 * scale, err_msg=key)


def test_imported_model_agrees_with_onnxruntime(corpus_model):
    ort = pytest.importorskip("onnxruntime")
    name, entry, data, m = corpus_model
    session = ort.InferenceSession(str(CORPUS / f"{name}.onnx"))
    feeds = {k: data[k] for k in m.inputs}
    reference = dict(zip(entry["outputs"], session.run(entry["outputs"], feeds), strict=True))
    for key, value in m.run(feeds).items():
        scale = max(1.0, float(np.abs(reference[key]).max()))
        np.testing.assert_allclose(value, reference[key], rtol=0, atol=1e-4 * scale)


def test_parameter_count_is_pytorchs(corpus_model):
    _name, entry, _data, m = corpus_model
    assert m.parameter_count == entry["params"]


def test_node_and_weight_names_are_the_exporters(corpus_model):
    name, _entry, _data, m = corpus_model
    import onnx

    graph = onnx.load(str(CORPUS / f"{name}.onnx")).graph
    onnx_nodes = {n.name for n in graph.node}
    initializers = {i.name for i in graph.initializer}
    compute = [n for n in m.pcg.nodes if n.op not in ("input", "weight")]
    # Every compute node is named after the ONNX node it came from (one ONNX node may give
    # several, suffixed "/..."), or after the parameter it re-lays-out (a tied weight).
    sources = onnx_nodes | initializers

    def named_after_a_source(name: str) -> bool:
        parts = name.split("/")
        return any("/".join(parts[:k]) in sources for k in range(len(parts), 0, -1))

    assert all(named_after_a_source(n.name) for n in compute)
    trainable = [n.name for n in m.pcg.weights if n.params["trainable"]]
    assert trainable and all(t in initializers for t in trainable)
    assert set(m.weights) == {n.name for n in m.pcg.weights}


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_optimize_returns_a_checked_plan_in_the_models_names(name):
    from pcgopt.extract.search.plan import saturate_and_extract

    entry = MANIFEST[name]
    m = from_onnx(CORPUS / f"{name}.onnx", dims={entry["batch_symbol"]: 16})
    plan = saturate_and_extract(m.pcg, Machine.preset("dgx-a100"), time_budget_s=2)
    assert plan.check.startswith("equivalent"), plan.check
    text = plan.explain(max_rows=10)
    layer_names = {n.name for n in m.pcg.nodes if n.op not in ("input", "weight")}
    shown = [n.name for n in plan.pcg.nodes if n.name in layer_names]
    assert len(shown) >= len(layer_names) // 2
    assert any(f"/{name}/" in line for line in text.splitlines())


def test_cli_summary_and_optimize_read_onnx(tmp_path, capsys):
    from pcgopt.cli import main

    model = str(CORPUS / "vit.onnx")
    assert main(["summary", model, "--dims", "batch=4", "--rows", "3"]) == 0
    captured = capsys.readouterr()
    assert "imported from onnx" in captured.err and "f32[4, 3, 32, 32]" in captured.out
    plan_file = tmp_path / "plan.json"
    args = ["optimize", model, "--dims", "batch=8", "--machine", "dgx-a100:1", "--budget", "1"]
    assert main([*args, "--quiet", "--json", str(plan_file)]) == 0
    assert "/vit/" in capsys.readouterr().out and plan_file.exists()


def test_cli_names_an_unbound_dimension(capsys):
    from pcgopt.cli import main

    assert main(["summary", str(CORPUS / "vit.onnx")]) == 2
    err = capsys.readouterr().err
    assert "batch (in pixel_values)" in err and "--dims batch=N" in err
    assert main(["summary", "mlp", "--dims", "batch=4"]) == 2
    assert "--dims applies to ONNX models" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["gpt2", "vit", "bert_masked", "conv_decoder", "moe"])
def test_data_parallel_plan_of_an_imported_model_trains_on_jax(name):
    """The new operators (exact GELU, slices, broadcasts, pow, sqrt, ...) lower to sharded JAX
    programs whose loss and gradients are the unsharded model's."""
    pytest.importorskip("jax")
    from pcgopt.extract.search.plan import machine_from_spec
    from pcgopt.extract.strategies.baselines import data_parallel
    from pcgopt.lower.jax import lower, reference_loss_and_grads

    entry = MANIFEST[name]
    m = from_onnx(CORPUS / f"{name}.onnx", dims={entry["batch_symbol"]: 4})
    plan = data_parallel(m.pcg, machine_from_spec("dgx-a100:1:4"))
    assert any(n.op == "partition" for n in plan.nodes)
    data = np.load(CORPUS / f"{name}.npz")
    trainable = {n.name for n in m.pcg.weights if n.params["trainable"]}
    params = {k: v for k, v in m.weights.items() if k in trainable}
    # Constants (masks, eps) are fed like inputs; parameters get gradients.
    inputs = {k: np.concatenate([data[k], data[k]]) for k in m.inputs}
    inputs.update({k: v for k, v in m.weights.items() if k not in trainable})
    lowered = lower(plan, 4)
    loss, grads = lowered.loss_and_grads(inputs, params)
    want_loss, want_grads = reference_loss_and_grads(m.pcg, inputs, params)
    assert abs(float(loss) - float(want_loss)) <= 1e-4 * max(1.0, abs(float(want_loss)))
    for w in lowered.weight_names:
        scale = max(1.0, float(np.abs(want_grads[w]).max()))
        assert float(np.abs(np.asarray(grads[w]) - want_grads[w]).max()) <= 1e-4 * scale, w
