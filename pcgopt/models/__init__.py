"""The model zoo: the seven models of Unity's evaluation, Unity's Figure 1 MLP, and AutoDDL's
Transformer and VGG13, as PCG builders with keyword sizes and the papers' defaults.

>>> from pcgopt.models import build
>>> len(build("mnist_mlp"))
6
>>> build("bert_large", small=True).outputs
(head/logits,)

Every entry also has a small variant (``small=True``) for tests: the same structure at sizes
that build and evaluate in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pcgopt.graph import PCG
from pcgopt.models.mlps import candle_uno, mlp, mnist_mlp
from pcgopt.models.recommendation import dlrm, xdl
from pcgopt.models.transformers import bert_large, transformer
from pcgopt.models.vision import inception_v3, resnext50, vgg13


@dataclass(frozen=True)
class ModelEntry:
    """A zoo model: its builder, the keyword sizes of its small variant, where it is from, and
    the optimizer its source trains it with (a name in ``pcgopt.extract.costmodel.cost.OPTIMIZERS``;
    Unity section 6.1: Adam for BERT-Large, plain SGD for its other models; "adam" where the
    source does not say)."""

    name: str
    builder: Callable[..., PCG]
    small: Mapping[str, Any]
    source: str
    paper_kwargs: Mapping[str, Any] = field(default_factory=dict)
    optimizer: str = "adam"

    def build(self, *, small: bool = False, **kwargs: Any) -> PCG:
        args = {**(self.small if small else {}), **kwargs}
        return self.builder(**args)


_ENTRIES = (
    ModelEntry(
        "mnist_mlp",
        mnist_mlp,
        {"batch": 8, "in_features": 12, "hidden": 8, "out_features": 4},
        "Unity Figure 1",
    ),
    ModelEntry(
        "mlp",
        mlp,
        {"batch": 4, "in_features": 6, "hidden": 8, "layers_per_branch": 2},
        "Unity section 6 (MLP, 16 x 8192)",
        optimizer="sgd",
    ),
    ModelEntry(
        "bert_large",
        bert_large,
        {"batch": 2, "seq": 4, "hidden": 8, "layers": 2, "heads": 2, "vocab": 11},
        "Unity section 6 (BERT-Large)",
    ),
    ModelEntry(
        "transformer",
        transformer,
        {"batch": 2, "seq": 4, "hidden": 8, "layers": 2, "heads": 2, "vocab": 11},
        "AutoDDL section 5 (Transformer)",
    ),
    ModelEntry(
        "dlrm",
        dlrm,
        {
            "batch": 4,
            "tables": (10, 7),
            "embedding_dim": 4,
            "bag_size": 2,
            "dense_features": 3,
            "bottom": (6, 4),
            "top": (5, 2),
        },
        "Unity section 6 (DLRM)",
        optimizer="sgd",
    ),
    ModelEntry(
        "xdl",
        xdl,
        {"batch": 4, "tables": (10, 7, 5), "embedding_dim": 4, "bag_size": 2, "widths": (6, 2)},
        "Unity section 6 (XDL)",
        optimizer="sgd",
    ),
    ModelEntry(
        "candle_uno",
        candle_uno,
        {
            "batch": 4,
            "feature_layers": 2,
            "feature_width": 6,
            "dense_layers": 2,
            "dense_width": 5,
            "feature_sizes": {"cell.rnaseq": 5, "drug.descriptors": 7, "drug.fingerprints": 3},
        },
        "Unity section 6 (CANDLE-Uno)",
        optimizer="sgd",
    ),
    ModelEntry(
        "resnext50",
        resnext50,
        {
            "batch": 2,
            "image": 32,
            "groups": 2,
            "width_per_group": 2,
            "stage_blocks": (1, 1, 1, 1),
            "stem": 4,
            "num_classes": 5,
        },
        "Unity section 6 (ResNeXt-50)",
        optimizer="sgd",
    ),
    ModelEntry(
        "inception_v3",
        inception_v3,
        {"batch": 1, "image": 75, "width": 1 / 32, "num_classes": 5},
        "Unity section 6 (Inception-v3)",
        optimizer="sgd",
    ),
    ModelEntry(
        "vgg13",
        vgg13,
        {"batch": 2, "image": 32, "width": 1 / 32, "hidden": 8, "num_classes": 5},
        "AutoDDL section 5 (VGG13)",
    ),
)

#: Model name -> entry. Read-only.
ZOO: Mapping[str, ModelEntry] = MappingProxyType({e.name: e for e in _ENTRIES})


def build(name: str, *, small: bool = False, **kwargs: Any) -> PCG:
    """Builds zoo model ``name`` (paper sizes or the small variant); keywords override sizes."""
    try:
        entry = ZOO[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; the zoo has: {', '.join(ZOO)}") from None
    return entry.build(small=small, **kwargs)


__all__ = [
    "ZOO",
    "ModelEntry",
    "bert_large",
    "build",
    "candle_uno",
    "dlrm",
    "inception_v3",
    "mlp",
    "mnist_mlp",
    "resnext50",
    "transformer",
    "vgg13",
    "xdl",
]
