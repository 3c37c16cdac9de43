"""JSON: a versioned format that round-trips exactly and rejects malformed documents clearly."""

import json

import pytest
from hypothesis import given

from pcgopt import PCG, SchemaError
from pcgopt.models import ZOO, build
from pcgopt.testing.strategies import small_pcgs


@given(small_pcgs())
def test_json_round_trip_is_the_identity(pcg):
    text = pcg.to_json()
    assert PCG.from_json(text) == pcg
    assert PCG.from_json(pcg.to_json(indent=None)) == pcg
    assert PCG.from_json(text).to_json() == text


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_models_round_trip(name):
    g = build(name, small=True)
    assert PCG.from_json(g.to_json()) == g


def test_one_node_per_line():
    g = build("mnist_mlp")
    lines = g.to_json().splitlines()
    assert sum('"op":' in line for line in lines) == len(g)


def _doc():
    return json.loads(build("mnist_mlp").to_json())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="onnx"), "not a PCG document"),
        (lambda d: d.update(version=99), "format version 99"),
        (lambda d: d.update(nodes={}), "'nodes' must be a non-empty list"),
        (lambda d: d.update(nodes=[]), "'nodes' must be a non-empty list"),
        (lambda d: d.update(outputs=[]), "'outputs' is empty"),
        (lambda d: d["nodes"][0].update(color="red"), r"unknown field\(s\) \['color'\]"),
        (lambda d: d["nodes"][3].update(inputs="x"), "'inputs' must be a list"),
        (lambda d: d["nodes"][3].pop("op"), "'op' must be a string"),
        (lambda d: d["nodes"][0].update(name=""), "'name' must be a non-empty string"),
        (lambda d: d.update(outputs="matmul2"), "'outputs' must be a list"),
    ],
)
def test_malformed_documents(mutate, message):
    d = _doc()
    mutate(d)
    with pytest.raises(SchemaError, match=message):
        PCG.from_dict(d)


def test_invalid_json_text():
    with pytest.raises(SchemaError, match="not valid JSON"):
        PCG.from_json("{nodes: ")
