"""Recommendation models: DLRM and XDL, with the configurations of FlexFlow's Unity artifact."""

from __future__ import annotations

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.graph import PCG
from pcgopt.models.layers import mlp_stack


def _sparse_features(
    b: PCGBuilder, batch: int, tables: tuple[int, ...], dim: int, bag: int
) -> list[Tensor]:
    out = []
    for k, rows in enumerate(tables):
        idx = b.input((batch, bag), "i64", name=f"sparse{k}", max_value=rows)
        table = b.weight((rows, dim), name=f"table{k}")
        out.append(b.embedding_bag(idx, table, name=f"bag{k}"))
    return out


def dlrm(
    *,
    batch: int = 1024,
    tables: tuple[int, ...] = (1_000_000,) * 4,
    embedding_dim: int = 64,
    bag_size: int = 1,
    dense_features: int = 4,
    bottom: tuple[int, ...] = (64, 64),
    top: tuple[int, ...] = (64, 2),
) -> PCG:
    """DLRM (Naumov et al.) as configured in FlexFlow's Unity artifact
    (examples/cpp/DLRM/dlrm.cc, branch osdi2022ae): 4 embedding tables of 1M rows, dimension 64,
    bags of 1 (sum); 4 dense features through a bottom MLP 4-64-64 (ReLU, no bias); "cat"
    interaction (64 + 4 x 64 = 320); top MLP 320-64-2 with a sigmoid output.
    Batch: Unity's per-GPU minibatch for DLRM, 1024."""
    b = PCGBuilder()
    dense_x = b.input((batch, dense_features), name="dense")
    bot = mlp_stack(b, dense_x, bottom, name="bottom", bias=False)
    h = b.concat(
        bot, *_sparse_features(b, batch, tables, embedding_dim, bag_size), axis=1, name="interact"
    )
    return b.build(mlp_stack(b, h, top, name="top", last_activation="sigmoid", bias=False))


def xdl(
    *,
    batch: int = 1024,
    tables: tuple[int, ...] = (1_000_000,) * 4,
    embedding_dim: int = 64,
    bag_size: int = 1,
    widths: tuple[int, ...] = (256, 256, 2),
) -> PCG:
    """XDL (Alibaba's ads model) as configured in FlexFlow's Unity artifact
    (examples/cpp/XDL/xdl.cc, branch osdi2022ae): 4 embedding tables of 1M rows, dimension 64,
    bags of 1, concatenated (256 wide), then dense 256-256-2 (ReLU, sigmoid output, no bias).
    Batch: Unity's per-GPU minibatch for XDL, 1024."""
    b = PCGBuilder()
    h = b.concat(
        *_sparse_features(b, batch, tables, embedding_dim, bag_size), axis=1, name="concat"
    )
    return b.build(mlp_stack(b, h, widths, name="mlp", last_activation="sigmoid", bias=False))
