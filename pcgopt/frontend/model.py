"""What an importer returns, and the helpers both importers share."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.errors import FrontendError
from pcgopt.evaluate import evaluate
from pcgopt.graph import PCG, Node, TensorRef
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


def lookup(b: PCGBuilder, data: Tensor, indices: Tensor, axis: int, name: str) -> Tensor:
    """The slices of ``data`` along ``axis`` at integer ``indices`` (ONNX's Gather,
    ``jnp.take``), of shape ``data[:axis] + indices + data[axis+1:]``: an embedding whose rows
    are those slices. Exact, and split like any lookup."""
    rank, sizes = data.shape.rank, data.shape.sizes
    axis %= rank
    rest = (*sizes[:axis], *sizes[axis + 1 :])
    table = data
    if axis != 0:
        order = (axis, *(d for d in range(rank) if d != axis))
        table = b.transpose(table, perm=order, name=f"{name}/slices")
    table = reshape_to(b, table, (sizes[axis], math.prod(rest)), f"{name}/table")
    lead = indices.shape.sizes
    moves = axis != 0
    flat = (*lead, math.prod(rest))
    shaped = (*lead, *rest)
    rows = b.embedding(
        indices, table, name=name if flat == shaped and not moves else f"{name}/rows"
    )
    out = reshape_to(b, rows, shaped, name if not moves else f"{name}/reshape")
    if not moves:
        return out
    # From indices + data[:axis] + data[axis+1:] to data[:axis] + indices + data[axis+1:].
    n = len(lead)
    order = (*(n + j for j in range(axis)), *range(n), *(n + j for j in range(axis, rank - 1)))
    return b.transpose(out, perm=order, name=name)


def resample(
    b: PCGBuilder, x: Tensor, matrix: np.ndarray, axis: int, name: str, constant: Constant
) -> Tensor:
    """``x`` with dimension ``axis`` mapped by ``matrix`` (out x in): element o of the result
    is ``sum_i matrix[o, i] x[..., i, ...]``, a resize along one axis. A whole-number repeat
    (nearest-neighbour upsampling) is a reshape and a broadcast, a run of consecutive rows a
    slice; anything else a product with the matrix (a constant)."""
    out_n, in_n = matrix.shape
    sizes = x.shape.sizes
    rows = np.flatnonzero(matrix[0]) if matrix.size else ()
    if len(rows) == 1 and rows[0] + out_n <= in_n:
        start = int(rows[0])
        if np.array_equal(matrix, np.eye(in_n)[start : start + out_n]):
            return b.slice(x, axis=axis, start=start, stop=start + out_n, name=name)
    if out_n % in_n == 0 and np.array_equal(matrix, np.repeat(np.eye(in_n), out_n // in_n, 0)):
        spread = reshape_to(b, x, (*sizes[: axis + 1], 1, *sizes[axis + 1 :]), f"{name}/spread")
        repeated = (*sizes[: axis + 1], out_n // in_n, *sizes[axis + 1 :])
        y = broadcast_to(b, spread, repeated, f"{name}/repeat")
        return reshape_to(b, y, (*sizes[:axis], out_n, *sizes[axis + 1 :]), name)
    last = x.shape.rank - 1
    swap = tuple(last if d == axis else axis if d == last else d for d in range(last + 1))
    if axis != last:
        x = b.transpose(x, perm=swap, name=f"{name}/to_last")
    weights = constant(np.ascontiguousarray(matrix.T, dtype=np.float32), "resample")
    y = b.matmul(x, weights, name=name if axis == last else f"{name}/matmul")
    return y if axis == last else b.transpose(y, perm=swap, name=name)


def pad_or_slice(
    b: PCGBuilder, x: Tensor, low: Sequence[int], high: Sequence[int], value: float, name: str
) -> Tensor:
    """``x`` padded with ``value`` by ``low[k]`` before and ``high[k]`` after each dimension k
    (ONNX's Pad, ``lax.pad``); negative amounts cut elements off instead (a slice)."""
    for axis, (lo, hi) in enumerate(zip(low, high, strict=True)):
        if lo < 0 or hi < 0:
            size = x.shape.sizes[axis]
            x = b.slice(
                x, axis=axis, start=max(-lo, 0), stop=size - max(-hi, 0), name=f"{name}/cut{axis}"
            )
    low, high = tuple(max(v, 0) for v in low), tuple(max(v, 0) for v in high)
    if not any(low) and not any(high):
        return x
    return b.pad(x, low=low, high=high, value=value, name=name)


def padded_conv2d(
    b: PCGBuilder,
    args: Sequence[Tensor],
    low: Sequence[int],
    high: Sequence[int],
    name: str,
    *,
    stride: tuple[int, int] = (1, 1),
    input_dilation: tuple[int, int] = (1, 1),
    **params: Any,
) -> Tensor:
    """``conv2d(*args)`` with ``low[k]`` padding before and ``high[k]`` after spatial axis k,
    any amounts (SAME with an even window, a transposed convolution's crop). The symmetric part
    is the conv's own padding. The rest, on an undilated input, is a ``pad`` (or, negative, a
    slice) of the input; on a dilated one (a transposed convolution) it is the conv's padding
    on both sides by the larger amount, then a crop of the output, exact while the window
    moves one element at a time. ValueError where neither applies."""
    dilated = tuple(input_dilation) != (1, 1)
    asymmetric = any(lo != hi or lo < 0 for lo, hi in zip(low, high, strict=True))
    if not dilated:
        padding = tuple(max(min(lo, hi), 0) for lo, hi in zip(low, high, strict=True))
    elif asymmetric and tuple(stride) != (1, 1):
        raise ValueError("asymmetric padding of a dilated input with a stride")
    else:
        padding = tuple(max(lo, hi, 0) for lo, hi in zip(low, high, strict=True))
    # What the conv's own padding leaves: positive is padding still to add, negative to cut.
    rest_low = [0, 0, *(lo - m for lo, m in zip(low, padding, strict=True))]
    rest_high = [0, 0, *(hi - m for hi, m in zip(high, padding, strict=True))]
    crop = dilated and asymmetric
    x, *others = args
    if not dilated:
        x = pad_or_slice(b, x, rest_low, rest_high, 0.0, f"{name}/pad")
    y = b.conv2d(
        x,
        *others,
        stride=tuple(stride),
        padding=padding,
        input_dilation=tuple(input_dilation),
        name=f"{name}/conv" if crop else name,
        **params,
    )
    return pad_or_slice(b, y, rest_low, rest_high, 0.0, name) if crop else y


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


#: ``constant(value, role)``: an importer's tensor for a constant it adds.
Constant = Callable[[np.ndarray, str], Tensor]


class Masks:
    """The tensors of an import that hold 0/1 masks: a comparison's result, and what logical
    operators and layout operators make of masks. A boolean of the source is such a float
    tensor of the PCG (:mod:`pcgopt.ops.elementwise`), so a cast of one to bool adds nothing."""

    def __init__(self) -> None:
        self.refs: set[TensorRef] = set()

    def add(self, t: Tensor) -> Tensor:
        self.refs.add(t.ref)
        return t

    def __contains__(self, t: object) -> bool:
        return isinstance(t, Tensor) and t.ref in self.refs

    def follow(self, source: Any, outputs: Any) -> None:
        """Marks ``outputs`` (a re-laid-out ``source``: reshaped, broadcast, transposed,
        sliced) as masks when ``source`` is one."""
        if source in self:
            for t in outputs if isinstance(outputs, list | tuple) else [outputs]:
                if isinstance(t, Tensor):
                    self.add(t)

    def of(self, b: PCGBuilder, x: Tensor, name: str, constant: Constant) -> Tensor:
        """``x != 0`` as a mask (``x`` itself when it is one): a cast to bool.
        ``constant(value, role)`` makes a tensor of a constant."""
        if x in self:
            return x
        x = as_float(b, x, name)
        zero = constant(np.zeros(1, np.float32), "zero")
        return self.add(b.compare(x, zero, relation="ne", name=name))

    def logical(
        self, b: PCGBuilder, op: str, x: Tensor, y: Tensor | None, name: str, constant: Constant
    ) -> Tensor:
        """``op`` (and, or, xor, not) of masks, as exact arithmetic on 0/1 tensors."""
        x = self.of(b, x, f"{name}/x", constant)
        if op == "not":
            zero = constant(np.zeros(1, np.float32), "zero")
            return self.add(b.compare(x, zero, relation="eq", name=name))
        if y is None:
            raise ValueError(f"{op} takes two masks")
        y = self.of(b, y, f"{name}/y", constant)
        if op == "and":
            return self.add(b.mul(x, y, name=name))
        if op == "or":
            return self.add(b.maximum(x, y, name=name))
        return self.add(b.compare(x, y, relation="ne", name=name))


def as_float(b: PCGBuilder, x: Tensor, name: str) -> Tensor:
    """``x`` as floats: integers (an integer attention mask, token ids compared with a pad id)
    are cast; floats are ``x`` itself."""
    if not x.shape.dtype.is_integer:
        return x
    return b.cast(x, dtype="f32", name=f"{name}/float")


#: Random values of an integer input that is not an index but only enters arithmetic (an
#: attention mask cast to float) are drawn from [0, MASK_BOUND) when plans are checked.
MASK_BOUND = 2


def bind_integer_inputs(pcg: PCG) -> PCG:
    """``pcg`` with the bound (``max_value``) of every integer input set from its use: the rows
    of the tables it indexes (through layout operators), else :data:`MASK_BOUND` when it is
    cast to float. Raises FrontendError for an integer input used neither way."""
    by_name = {n.name: n for n in pcg.nodes}

    def origin(ref: TensorRef) -> Node:
        src = by_name[ref.node]
        while src.spec.moves_elements:
            src = by_name[src.inputs[0].node]
        return src

    bounds: dict[str, int] = {}
    cast: set[str] = set()
    for n in pcg.nodes:
        if n.op in ("embedding", "embedding_bag"):
            src = origin(n.inputs[0])
            rows = pcg.shape(n.inputs[1]).sizes[0]
            bounds[src.name] = min(bounds.get(src.name, rows), rows)
        elif n.op == "cast":
            cast.add(origin(n.inputs[0]).name)
    nodes = []
    for n in pcg.nodes:
        if n.op == "input" and n.params["dtype"].is_integer:
            bound = bounds.get(n.name, MASK_BOUND if n.name in cast else None)
            if bound is None:
                raise FrontendError(
                    f"input {n.name!r} holds integers but is neither used as indices into a "
                    "table (an embedding, a one-hot, take_along_axis) nor cast to float; "
                    "pcgopt holds integer inputs as lookups or masks",
                    node=n.name,
                )
            n = Node(n.name, n.op, n.inputs, {**n.params, "max_value": bound})
        nodes.append(n)
    return PCG(nodes, pcg.outputs)


#: An integer input's bound until its uses are known (:func:`bind_integer_inputs` sets it).
UNBOUNDED = 2**31 - 1


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
