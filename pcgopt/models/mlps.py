"""Multi-layer perceptrons: Unity's Figure 1 MNIST MLP, Unity's MLP benchmark, CANDLE-Uno."""

from __future__ import annotations

from pcgopt.builder import PCGBuilder
from pcgopt.graph import PCG
from pcgopt.models.layers import dense, mlp_stack


def mnist_mlp(
    *, batch: int = 64, in_features: int = 784, hidden: int = 512, out_features: int = 10
) -> PCG:
    """Unity Figure 1: MatMul -> ReLU -> MatMul (no biases), b=64, c_i=784, h=512, c_o=10."""
    b = PCGBuilder()
    x = b.input((batch, in_features), name="x")
    w1 = b.weight((in_features, hidden), name="w1")
    w2 = b.weight((hidden, out_features), name="w2")
    h = b.relu(b.matmul(x, w1, name="matmul1"), name="relu")
    return b.build(b.matmul(h, w2, name="matmul2"))


def mlp(
    *,
    batch: int = 256,
    in_features: int = 1024,
    hidden: int = 8192,
    branches: int = 2,
    layers_per_branch: int = 8,
) -> PCG:
    """Unity's MLP benchmark: 16 dense layers of width 8192 (Unity section 6.1).

    Structure as in FlexFlow's Unity artifact (examples/cpp/MLP_Unify/mlp.cc, branch osdi2022ae):
    two branches, each an input of width 1024 and 8 bias-free dense layers (ReLU but the last),
    added, then a softmax. Batch: Unity's per-GPU minibatch for MLP, 256.
    """
    b = PCGBuilder()
    outs = []
    for k in range(branches):
        x = b.input((batch, in_features), name=f"x{k}")
        outs.append(
            mlp_stack(
                b,
                x,
                (hidden,) * layers_per_branch,
                name=f"branch{k}",
                last_activation="none",
                bias=False,
            )
        )
    y = outs[0]
    for k, o in enumerate(outs[1:], 1):
        y = b.add(y, o, name=f"sum{k}")
    return b.build(b.softmax(y, axis=-1, name="softmax"))


CANDLE_FEATURES = {"cell.rnaseq": 942, "drug.descriptors": 5270, "drug.fingerprints": 2048}


def candle_uno(
    *,
    batch: int = 256,
    feature_layers: int = 8,
    feature_width: int = 4192,
    dense_layers: int = 4,
    dense_width: int = 4192,
    feature_sizes: dict[str, int] | None = None,
) -> PCG:
    """CANDLE-Uno (drug response). Configuration of FlexFlow's Unity artifact
    (examples/cpp/candle_uno/candle_uno.cc, branch osdi2022ae): inputs dose1, dose2 [B, 1],
    cell.rnaseq [B, 942], drug1/drug2 descriptors [B, 5270] and fingerprints [B, 2048]; each
    non-dose input through its own 8 dense layers of width 4192 (ReLU, no bias); concatenated
    with the doses; 4 dense layers of width 4192; a 1-wide output. Batch: Unity's per-GPU 256.
    """
    sizes = feature_sizes or CANDLE_FEATURES
    b = PCGBuilder()
    inputs = [
        ("cell.rnaseq", sizes["cell.rnaseq"]),
        ("drug1.descriptors", sizes["drug.descriptors"]),
        ("drug1.fingerprints", sizes["drug.fingerprints"]),
        ("drug2.descriptors", sizes["drug.descriptors"]),
        ("drug2.fingerprints", sizes["drug.fingerprints"]),
    ]
    parts = [b.input((batch, 1), name="dose1"), b.input((batch, 1), name="dose2")]
    for name, width in inputs:
        x = b.input((batch, width), name=name)
        parts.append(
            mlp_stack(b, x, (feature_width,) * feature_layers, name=f"enc_{name}", bias=False)
        )
    h = b.concat(*parts, axis=1, name="features")
    h = mlp_stack(b, h, (dense_width,) * dense_layers, name="dense", bias=False)
    return b.build(dense(b, h, 1, name="out", bias=False))
