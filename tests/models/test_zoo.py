"""The model zoo: every model builds and validates at paper size; small variants evaluate."""

import numpy as np
import pytest

from pcgopt import OpKind, evaluate
from pcgopt.models import ZOO, build, mlp, mnist_mlp


def trainable_parameters(g):
    return sum(g.shape(w.name).numel for w in g.weights if w.params["trainable"])


@pytest.mark.parametrize("name", list(ZOO))
def test_builds_and_validates_at_paper_size(name):
    g = build(name)
    assert len(g) > 0 and g.outputs
    assert all(not g.shape(n.name).is_partial for n in g.nodes)  # unparallelized input graphs
    assert not g.nodes_of_kind(OpKind.PARALLEL)


@pytest.mark.parametrize("name", list(ZOO))
def test_small_variant_evaluates(name):
    g = build(name, small=True)
    for out in evaluate(g, seed=1).outputs:
        value = out.logical()
        assert value.shape == out.shape.sizes
        assert np.all(np.isfinite(value))


@pytest.mark.parametrize(
    ("name", "params"),
    [
        # torchvision's published counts (resnext50_32x4d, vgg13; inception_v3 without AuxLogits:
        # 27,161,264 - 3,326,696)
        ("resnext50", 25_028_904),
        ("vgg13", 133_047_848),
        ("inception_v3", 23_834_568),
        ("mnist_mlp", 784 * 512 + 512 * 10),
        ("mlp", 2 * (1024 * 8192 + 7 * 8192 * 8192)),
    ],
)
def test_parameter_counts_match_the_published_architectures(name, params):
    assert trainable_parameters(build(name)) == params


def test_transformer_has_autoddl_size():
    # AutoDDL: 8 layers of dimension 8192 hold 6.8 billion parameters
    assert 6.8e9 <= trainable_parameters(build("transformer")) <= 6.9e9


def test_transformer_can_end_in_a_stand_in_loss():
    g = build("transformer", small=True, loss=True)
    (out,) = g.outputs
    assert g.node(out.node).op == "reduce_mean" and g.shape(out).rank == 0
    logits = build("transformer", small=True)
    assert trainable_parameters(g) == trainable_parameters(logits)


def test_bert_large_size():
    g = build("bert_large")
    assert sum(1 for n in g.nodes if n.op == "batch_matmul") == 2 * 24
    assert 334e6 <= trainable_parameters(g) <= 336e6


def test_unity_figure_1_mlp():
    g = mnist_mlp()
    assert [n.op for n in g.nodes] == ["input", "weight", "weight", "matmul", "relu", "matmul"]
    assert repr(g.shape("x")) == "f32[64, 784]"
    assert repr(g.shape("relu")) == "f32[64, 512]"
    assert repr(g.shape(g.outputs[0])) == "f32[64, 10]"


def test_mlp_has_sixteen_dense_layers_of_width_8192():
    dense = [n for n in mlp().nodes if n.op == "linear"]
    assert len(dense) == 16
    assert all(mlp().shape(n.name).sizes[-1] == 8192 for n in dense)


def test_sizes_are_keywords():
    g = build("bert_large", small=True, layers=1)
    assert sum(1 for n in g.nodes if n.op == "batch_matmul") == 2
    with pytest.raises(KeyError, match="the zoo has: mnist_mlp"):
        build("gpt5")


def test_each_model_names_the_optimizer_its_source_trains_it_with():
    from pcgopt.extract.costmodel.cost import OPTIMIZERS

    assert {entry.optimizer for entry in ZOO.values()} <= set(OPTIMIZERS)
    # Unity section 6.1: Adam for BERT-Large, SGD for its other six models.
    assert ZOO["bert_large"].optimizer == "adam"
    assert all(ZOO[n].optimizer == "sgd" for n in ("mlp", "dlrm", "xdl", "candle_uno"))
