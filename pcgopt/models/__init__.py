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

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pcgopt.errors import PCGError
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
    source does not say), and the precision the evaluations the zoo reproduces train it in
    (``pcgopt.extract.costmodel.simulate.PRECISIONS``; "f32" for every model: Unity's FlexFlow
    and AutoDDL's OneFlow runs are single precision)."""

    name: str
    builder: Callable[..., PCG]
    small: Mapping[str, Any]
    source: str
    paper_kwargs: Mapping[str, Any] = field(default_factory=dict)
    optimizer: str = "adam"
    precision: str = "f32"

    def sizes(self) -> dict[str, tuple[str, Any]]:
        """The keyword sizes the builder takes (``pcgopt optimize --set KEY=VALUE``): each
        name with its type, as annotated, and its default."""
        return {
            name: (str(p.annotation), p.default)
            for name, p in inspect.signature(self.builder).parameters.items()
        }

    def build(self, *, small: bool = False, **kwargs: Any) -> PCG:
        """The model at the paper's sizes (or the small variant's), ``kwargs`` overriding them.
        Raises :class:`ModelSizeError` naming a size that is unknown or not of its type (sizes
        are positive integers, rates in [0, 1))."""
        known = self.sizes()
        for key, value in kwargs.items():
            if key not in known:
                raise ModelSizeError(
                    f"{self.name} has no size {key!r}; its sizes: {', '.join(known)}"
                )
            _check_size(self.name, key, known[key][0], value)
        args = {**(self.small if small else {}), **kwargs}
        try:
            return self.builder(**args)
        except ValueError as e:  # sizes that do not fit together, e.g. heads and hidden
            if isinstance(e, PCGError):
                raise
            raise ModelSizeError(f"{self.name}: {e}") from None


class ModelSizeError(PCGError):
    """A zoo model size that the model does not have, or a value it cannot take."""


#: The most repeats of a structure a zoo model may have (layers, branches, blocks, tables):
#: the deepest published networks have about a thousand layers, and a builder asked for 10^11
#: would run out of memory before it said anything.
MAX_REPEATS = 1024
_REPEAT_SIZES = frozenset(
    {"layers", "branches", "layers_per_branch", "feature_layers", "dense_layers"}
)


def _check_size(model: str, key: str, annotation: str, value: Any) -> None:
    """Checks one size against its annotation: ints positive, floats finite and positive (a
    rate in [0, 1)), tuples of positive ints, dicts of them, None where allowed."""
    where = f"{model}: {key}"
    if value is None:
        if "None" not in annotation:
            raise ModelSizeError(f"{where} cannot be None")
        return

    def positive_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    if annotation.startswith("int"):
        if not positive_int(value):
            raise ModelSizeError(f"{where} must be a positive integer, got {value!r}")
        if key in _REPEAT_SIZES and value > MAX_REPEATS:
            raise ModelSizeError(f"{where} must be at most {MAX_REPEATS}, got {value!r}")
    elif annotation.startswith("float"):
        rate = key in ("dropout", "rate")
        number = isinstance(value, int | float) and not isinstance(value, bool)
        ok = number and math.isfinite(value) and (0 <= value < 1 if rate else value > 0)
        if not ok:
            valid = "in [0, 1)" if rate else "a positive number"
            raise ModelSizeError(f"{where} must be {valid}, got {value!r}")
    elif annotation.startswith("tuple"):
        if not isinstance(value, tuple | list) or not all(positive_int(v) for v in value):
            raise ModelSizeError(f"{where} must be a list of positive integers, got {value!r}")
        repeats = sum(value) if key == "stage_blocks" else len(value)
        if repeats > MAX_REPEATS:
            raise ModelSizeError(f"{where} makes {repeats} blocks or layers; at most {MAX_REPEATS}")
    elif annotation.startswith("dict"):
        if not isinstance(value, Mapping) or not all(positive_int(v) for v in value.values()):
            raise ModelSizeError(f"{where} must map names to positive integers, got {value!r}")
    elif annotation.startswith("bool") and not isinstance(value, bool):
        raise ModelSizeError(f"{where} must be true or false, got {value!r}")


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
    "ModelSizeError",
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
