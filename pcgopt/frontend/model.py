"""What an importer returns, and the helpers both importers share."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.errors import FrontendError
from pcgopt.evaluate import evaluate
from pcgopt.graph import PCG
from pcgopt.ops import OpKind


@dataclass(frozen=True)
class ImportedModel:
    """A model imported from another framework.

    ``pcg``: the computation, one Input node per graph input and one Weight node per parameter
    or constant. ``weights``: every Weight node's value, after any folding the importer did
    (a weight an exporter stored transposed is stored as the PCG uses it). ``inputs``: the
    graph inputs' names, logical shapes and numpy dtypes, in the source's order.
    ``output_names``: the source's names of the PCG's outputs, in order.
    ``source``: where it came from (``"onnx"`` or ``"jax"``)."""

    pcg: PCG
    weights: Mapping[str, np.ndarray]
    inputs: Mapping[str, tuple[tuple[int, ...], np.dtype]]
    output_names: tuple[str, ...] = ()
    source: str = ""
    #: Facts about the import: how many source nodes there were, what was folded or fused.
    stats: Mapping[str, int] = field(default_factory=dict)

    @property
    def parameter_count(self) -> int:
        """Elements of the trainable weights (what PyTorch's ``sum(p.numel())`` counts)."""
        return sum(
            int(np.prod(self.pcg.shape(n.name).sizes))
            for n in self.pcg.weights
            if n.params["trainable"]
        )

    def run(self, inputs: Mapping[str, np.ndarray], *, dtype: Any = np.float64) -> dict:
        """The model's outputs on ``inputs`` (graph input name -> array), by the reference
        evaluator: a dict from the source's output names to numpy arrays."""
        missing = sorted(set(self.inputs) - set(inputs))
        if missing:
            raise FrontendError(
                f"values missing for graph input(s) {', '.join(missing)} "
                f"(the inputs are: {', '.join(self.inputs)})"
            )
        feeds = {**self.weights, **{k: np.asarray(v) for k, v in inputs.items()}}
        result = evaluate(self.pcg, feeds, dtype=dtype)
        return {
            name: out.logical() for name, out in zip(self.output_names, result.outputs, strict=True)
        }

    def summary(self) -> str:
        counts = Counter(n.op for n in self.pcg.nodes if n.spec.kind is OpKind.COMPUTE)
        ops = ", ".join(f"{op} {k}" for op, k in counts.most_common())
        ins = ", ".join(f"{n}{list(s)}" for n, (s, _) in self.inputs.items())
        return (
            f"imported from {self.source}: {len(self.pcg)} PCG nodes, "
            f"{self.parameter_count:,} parameters; inputs {ins}\n  operators: {ops}"
        )


_TRAILING_INDEX = re.compile(r":(\d+)$")


def clean_name(name: str) -> str:
    """A source name usable as a PCG node name: ``node:3`` would read as output 3 of ``node``,
    so a trailing ``:digits`` becomes ``_digits``."""
    return _TRAILING_INDEX.sub(r"_\1", name)


class UniqueNames:
    """Node names from source names: cleaned (:func:`clean_name`), and ``name_2``, ``name_3``
    ... when a source name repeats (or several nodes come from one source node)."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def __call__(self, wanted: str) -> str:
        name = clean_name(wanted) or "node"
        base, k = name, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def reshape_to(b: PCGBuilder, x: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
    """``x`` reshaped (a scalar shape ``()`` is ``(1,)``), or ``x`` itself if it has the shape."""
    shape = tuple(shape) or (1,)
    return x if x.shape.sizes == shape else b.reshape(x, shape=shape, name=name)


def broadcast_to(b: PCGBuilder, x: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
    """``x`` broadcast to ``shape``, or ``x`` itself if it has the shape."""
    shape = tuple(shape)
    return x if x.shape.sizes == shape else b.broadcast(x, shape=shape, name=name)


#: The largest class count whose one-hot is imported as a lookup in an identity table (the
#: table has n^2 elements: 64 MiB of float32 at 4096).
MAX_ONE_HOT_CLASSES = 4096


def identity_table(n: int, off: float = 0.0, on: float = 1.0) -> np.ndarray:
    """``off + (on - off) * I_n``: the table whose row i is i's one-hot, for a one-hot as an
    embedding lookup. Refused (ValueError) above :data:`MAX_ONE_HOT_CLASSES` classes."""
    if n > MAX_ONE_HOT_CLASSES:
        raise ValueError(
            f"a one-hot over {n:,} classes would be an identity table of {n:,} x {n:,}; "
            f"pcgopt imports one-hots of at most {MAX_ONE_HOT_CLASSES:,} classes (it has no "
            "one_hot operator yet): end the function before the loss, or pass one-hot targets"
        )
    return (off + (on - off) * np.eye(n)).astype(np.float32)


def masked(
    b: PCGBuilder,
    x: Tensor,
    keep: np.ndarray,
    fill: np.ndarray,
    name: str,
    constant: Callable[[np.ndarray, str], Tensor],
) -> Tensor:
    """``where(keep, x, fill)`` for a constant mask and fill, as ``x * keep + fill'`` with
    ``fill'`` zero where ``keep`` holds: exact for finite ``x``, since each element adds an exact
    zero (a causal mask; a variance's guard against a zero count). ``constant(value, role)``
    makes a tensor of a constant."""
    keep = np.asarray(keep, bool)
    shape = np.broadcast_shapes(keep.shape, np.shape(fill))
    outside = np.where(keep, 0.0, np.broadcast_to(fill, shape)).astype(np.float32)
    kept = b.mul(x, constant(keep.astype(np.float32), "keep"), name=f"{name}/keep")
    return b.add(kept, constant(outside, "fill"), name=name)


def binary(
    b: PCGBuilder,
    op: str,
    x: Any,
    y: Any,
    name: str,
    *,
    scalar: Callable[[Any], float | None],
    tensor: Callable[[Any, int], Tensor],
) -> Tensor:
    """A broadcasting elementwise ``op`` (add, sub, mul, div, maximum) of two operands, each a
    traced :class:`Tensor` or an importer's constant: ``scalar(v)`` is a constant's value when it
    is one element, ``tensor(v, slot)`` makes a constant a Weight. A product or quotient by a
    scalar is a ``scale``; ``max(x, 0)`` is a ``relu`` and ``max(x, -inf)`` is ``x`` (softmax's
    guard); anything else is ``op`` itself."""
    if op in ("mul", "div") and isinstance(x, Tensor) and (c := scalar(y)) is not None:
        return b.scale(x, factor=c if op == "mul" else 1.0 / c, name=name)
    if op == "mul" and isinstance(y, Tensor) and (c := scalar(x)) is not None:
        return b.scale(y, factor=c, name=name)
    if op == "maximum" and isinstance(x, Tensor) != isinstance(y, Tensor):
        t, c = (x, scalar(y)) if isinstance(x, Tensor) else (y, scalar(x))
        if c == 0.0:
            return b.relu(t, name=name)
        if c == -np.inf:
            return t
    return b.apply(op, tensor(x, 0), tensor(y, 1), name=name)  # type: ignore[return-value]


class UnsupportedLog:
    """Collects every unsupported operator (with counts and first names) for one error."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.names: dict[str, list[str]] = {}
        self.reasons: dict[str, str] = {}

    def add(self, op: str, name: str, reason: str = "") -> None:
        self.counts[op] += 1
        self.names.setdefault(op, [])
        if len(self.names[op]) < 3:
            self.names[op].append(name)
        if reason and op not in self.reasons:
            self.reasons[op] = reason

    def __bool__(self) -> bool:
        return bool(self.counts)

    def error(self, what: str) -> FrontendError:
        lines = []
        for op, k in self.counts.most_common():
            why = f": {self.reasons[op]}" if op in self.reasons else ""
            lines.append(f"  {op} x{k} (first: {', '.join(self.names[op])}){why}")
        total = sum(self.counts.values())
        return FrontendError(
            f"{what} has {total} node(s) pcgopt cannot import:\n" + "\n".join(lines),
            node=next(iter(self.names.values()))[0],
            unsupported={op: (k, tuple(self.names[op])) for op, k in self.counts.items()},
        )


def parse_dims(items: list[str] | None) -> dict[str, int]:
    """``["batch=64", "seq=128"]`` (the CLI's ``--dims``) as a dict, with clear errors."""
    dims: dict[str, int] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit() or int(value) < 1:
            raise FrontendError(
                f"--dims {item!r}: expected NAME=SIZE with a positive integer size, "
                "e.g. --dims batch=64"
            )
        dims[name.strip()] = int(value)
    return dims


def load_model(path: str | Path, *, dims: Mapping[str, int] | None = None) -> ImportedModel:
    """Imports a model file by its suffix (``.onnx``)."""
    path = Path(path)
    if path.suffix.lower() == ".onnx":
        from pcgopt.frontend.onnx import from_onnx

        return from_onnx(path, dims=dims)
    raise FrontendError(
        f"{path}: cannot import a {path.suffix or 'suffix-less'} file (known: .onnx)"
    )
