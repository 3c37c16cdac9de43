"""Hand-written parallelization baselines, as PCGs costed by the same model as the optimizer.

The joint optimizer must never be worse than these (DESIGN.md, "Baselines"): their plans are in
its search space. Each function takes a sequential PCG (no parallel operators) and returns an
equivalent parallel PCG (``pcgopt.equivalent(pcg, plan)`` with the default ``"parallel"``
comparison: every output is brought back to one unsplit copy at the end).

* :func:`data_parallel`: every data input split by its batch dimension (dimension 0) over
  ``degree`` devices, every weight replicated on all of them (its gradient is all-reduced, the
  backward of Replicate); operators run on their batch shard. Unity Figure 2a.
* :func:`fsdp`: data parallelism with every weight stored sharded over the devices and
  all-gathered where it is used, its gradient reduce-scattered (PyTorch FSDP, ZeRO-3's sharding
  of weights, gradients and optimizer state).
* :func:`megatron`: Megatron-LM tensor parallelism over ``tensor_degree`` devices combined with
  data parallelism over the rest. A weight MatMul/Linear whose output reaches only other weight
  MatMuls/Linears through operators that keep a split of the last dimension (activations,
  dropout, reshape/transpose into attention heads, BatchMatMul, softmax) is *column-parallel*:
  its weight and bias split by output columns, its input replicated; the weight MatMul/Linear
  that reads a tensor split by its contraction dimension is *row-parallel*: its weight split by
  rows, the MatMul leaves partial sums, AllReduce, then the bias and activation (unfused: a
  Linear with a bias cannot split its contraction). In a Transformer this is exactly Megatron's
  attention (Q, K, V column-parallel, heads split, output projection row-parallel) and MLP
  (FFN1 column, FFN2 row). Other models get the same rule on their Linear pairs (an MLP's
  layers alternate column/row); a model without such a pair is data parallel.
  ``sequence_parallel=True`` adds Megatron-LM's sequence parallelism (Korthikanti et al. 2022):
  a row-parallel layer ends in a ReduceScatter along the sequence (dimension 1, or the tokens,
  dimension 0, of a rank-2 activation) instead of the AllReduce, the operators up to the next
  column-parallel layer (bias, dropout, residual, LayerNorm) run on that shard, and that layer
  all-gathers it: the same bytes moved, those activations stored once over the group instead
  of on every device. A layer whose sequence does not divide by the degree keeps its AllReduce.
* :func:`unity_figure_2b`: Unity's Figure 2b plan (section 2) on every two-layer feed-forward
  block (a MatMul or Linear read only, directly or through an activation, by a MatMul or an
  activation-free Linear), nothing else parallel: the first layer's activation is *not* fused,
  so that its MatMul can be reduction-parallel (input split by its last dimension, weight by
  rows, partial sums all-reduced); bias and activation run on the copies; the second layer is
  split by output columns (weight and bias), then combined. No weight is synchronized. A
  reference plan for what saturation must reach (issue 5), not a baseline to beat.
* :func:`sequential`: :func:`fuse` (the algebraic rewrites a single-device optimizer applies:
  MatMul + bias Add + activation into one Linear), kept only when it does not make the
  single-device iteration slower, then the cheaper of :func:`data_parallel` and :func:`megatron`
  on that fixed graph (feasible plans first, then ``iteration_cost(...).total_s``).

Lowering is node by node with :class:`~pcgopt.PCGBuilder`, so every operator's own parallel
shape rule decides what its output layout is. When an operator cannot take its inputs' layout
(a LayerNorm over a split hidden dimension, a reshape that would split a head), its tensor-
parallel splits are all-gathered first, and as a last resort all its inputs are made whole: the
plan stays valid and equivalent, only slower. Weights and what is computed only from weights
(the transposed tied embedding) are materialized at their consumers, replicated as many times as
the consumer's data input has shards, so the Replicate sits right after the Weight (stored
replicated, with gradient synchronization, in the cost model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.divisors import divisors, largest_divisor
from pcgopt.errors import PCGError
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.machine import Level, Machine
from pcgopt.ops import OPERATORS, OpKind
from pcgopt.ops.linalg import ACTIVATIONS
from pcgopt.shapes import ParallelTensorShape

__all__ = [
    "BaselineError",
    "coordinate_descent",
    "data_parallel",
    "fsdp",
    "fuse",
    "megatron",
    "megatron_sp",
    "sequential",
    "split_projections",
    "unity_figure_2b",
]


class BaselineError(PCGError):
    """A baseline cannot be built for this PCG or degree (no batch dimension to split, a degree
    that does not divide the batch or exceeds the machine, a PCG that is already parallel)."""


# Operators through which a column-parallel split of the last dimension travels to the
# row-parallel layer (Megatron's attention and MLP blocks).
_PASS_THROUGH = frozenset(
    {*ACTIVATIONS, "dropout", "scale", "reshape", "transpose", "batch_matmul", "softmax"}
)
# Elementwise operators that pass such a split on when their other inputs are Weights of the
# same sizes (an attention mask imported as a constant, ``scores * keep + fill``): those are
# stored split as the data input is.
_PASS_WITH_CONSTANTS = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "where"})


# ----------------------------------------------------------------------------------------------
# inspection
# ----------------------------------------------------------------------------------------------


def _check_sequential(pcg: PCG) -> None:
    for node in pcg.nodes:
        if OPERATORS[node.op].kind is OpKind.PARALLEL:
            raise BaselineError(
                f"node {node.name!r} ({node.op}): baselines parallelize a sequential PCG, "
                "but this one already has parallel operators",
                node=node.name,
            )


def batch_size(pcg: PCG) -> int:
    """The batch size: dimension 0 of every data input, which must agree (else BaselineError
    naming the input at fault)."""
    inputs = pcg.inputs
    if not inputs:
        raise BaselineError("the PCG has no data input, so there is no batch dimension to split")
    sizes: dict[str, int] = {}
    for node in inputs:
        shape = pcg.shape(node.name)
        if shape.rank == 0:
            raise BaselineError(
                f"node {node.name!r} (input) is a scalar: it has no batch dimension to split",
                node=node.name,
            )
        sizes[node.name] = shape.sizes[0]
    first = inputs[0].name
    for name, size in sizes.items():
        if size != sizes[first]:
            raise BaselineError(
                f"node {name!r} (input) has {size} rows in dimension 0 but {first!r} has "
                f"{sizes[first]}: the inputs do not share a batch dimension",
                node=name,
            )
    return sizes[first]


def _data_free(pcg: PCG) -> set[str]:
    """Nodes computed from weights only (weights included): materialized at their consumers."""
    free: set[str] = set()
    for node in pcg.nodes:
        if node.op == "weight" or (
            node.inputs
            and OPERATORS[node.op].kind is not OpKind.SOURCE
            and all(r.node in free for r in node.inputs)
        ):
            free.add(node.name)
    return free


def _weight_matmul(pcg: PCG, node: Node) -> bool:
    """A MatMul or Linear of an activation by a rank-2 Weight, or by a Slice of one (a part of
    a fused projection, :func:`split_projections`): a dense layer."""
    if node.op not in ("matmul", "linear") or len(node.inputs) < 2:
        return False
    w = pcg.node(node.inputs[1].node)
    if w.op == "slice":
        w = pcg.node(w.inputs[0].node)
    return w.op == "weight" and pcg.shape(node.inputs[1]).rank == 2


def _column_parallel(pcg: PCG, degree: int) -> set[str]:
    """Dense layers whose output reaches only other dense layers' activation input through
    :data:`_PASS_THROUGH` operators: Megatron's column-parallel halves."""
    consumers = pcg.consumers()
    outputs = set(pcg.outputs)
    free = _data_free(pcg)
    chosen: set[str] = set()

    def passes(user: Node, slot: int) -> bool:
        if user.op in _PASS_THROUGH:
            return True
        sizes = pcg.shape(user.inputs[slot]).sizes
        return user.op in _PASS_WITH_CONSTANTS and all(
            r.node in free and pcg.node(r.node).op == "weight" and pcg.shape(r).sizes == sizes
            for i, r in enumerate(user.inputs)
            if i != slot
        )

    for node in pcg.nodes:
        if not _weight_matmul(pcg, node) or pcg.shape(node.inputs[1]).sizes[1] % degree:
            continue
        ok, seen, stack, ends = True, set(), [node.output()], 0
        while stack and ok:
            ref = stack.pop()
            if ref in seen:
                continue
            seen.add(ref)
            if ref in outputs or not consumers.get(ref):
                ok = False
                break
            for name, slot in consumers[ref]:
                user = pcg.node(name)
                if _weight_matmul(pcg, user) and slot == 0:
                    ends += 1
                elif passes(user, slot):
                    stack.extend(user.output(i) for i in range(len(pcg.output_shapes(name))))
                else:
                    ok = False
                    break
        if ok and ends:
            chosen.add(node.name)
    return chosen


def _sequence_dim(shape: ParallelTensorShape, degree: int) -> int | None:
    """The dimension Megatron-LM's sequence parallelism splits ``degree`` more ways in an
    activation of this shape: the sequence (dimension 1) of ``[batch, seq, ...]``, the tokens
    (dimension 0, already split by batch) of ``[tokens, hidden]``; None when the activation has
    neither or its current block of that dimension does not divide by ``degree``.

    >>> _sequence_dim(ParallelTensorShape.of((2, 512, 1024)), 4)
    1
    >>> _sequence_dim(ParallelTensorShape.of((16, 1024), degrees=(2, 1)), 4)  # blocks of 8
    0
    >>> _sequence_dim(ParallelTensorShape.of((2, 6, 1024)), 4) is None
    True
    """
    if shape.rank < 2:
        return None
    dim = 1 if shape.rank >= 3 else 0
    return dim if shape.dims[dim].block % degree == 0 else None


# ----------------------------------------------------------------------------------------------
# lowering
# ----------------------------------------------------------------------------------------------


class _Lowering:
    """Rebuilds a sequential PCG with its inputs split by batch over ``dp`` devices and, when
    ``tp > 1``, Megatron's tensor parallelism over ``tp``, with its sequence parallelism when
    ``sequence_parallel`` (module docstring)."""

    def __init__(
        self,
        pcg: PCG,
        dp: int,
        tp: int = 1,
        shard_weights: bool = False,
        *,
        sequence_parallel: bool = False,
    ) -> None:
        self.pcg, self.dp, self.tp = pcg, dp, tp
        self.shard_weights = shard_weights
        self.sequence_parallel = sequence_parallel and tp > 1
        self.b = PCGBuilder()
        self.env: dict[TensorRef, Tensor] = {}
        self.cache: dict[tuple[Any, ...], Tensor] = {}
        self.free = _data_free(pcg)
        self.column = _column_parallel(pcg, tp) if tp > 1 else set()
        self.names = {n.name for n in pcg.nodes}
        #: Nodes lowered by the last-resort fallback (whole inputs): a plan quality signal.
        self.fallbacks: list[str] = []

    # -- helpers --------------------------------------------------------------------------

    def _name(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}~{k}"
        self.names.add(name)
        return name

    def _memo(self, key: tuple[Any, ...], make: Callable[[], Tensor]) -> Tensor:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def _source(self, name: str) -> Tensor:
        node = self.pcg.node(name)

        def make() -> Tensor:
            return self.b.apply(node.op, name=node.name, **dict(node.params))  # type: ignore[return-value]

        return self._memo(("source", name), make)

    def _free(self, ref: TensorRef, copies: int) -> Tensor:
        """A weight-only tensor, replicated ``copies`` times (the Replicate right after each
        Weight, then the weight-only operators on the copies)."""

        def make() -> Tensor:
            node = self.pcg.node(ref.node)
            if node.op == "weight":
                w = self._source(node.name)
                if copies == 1:
                    return w
                dim, ways = self._shard(w, copies) if self.shard_weights else (0, 1)
                if ways == 1:
                    return self.b.replicate(
                        w, degree=copies, name=self._name(f"{node.name}.r{copies}")
                    )
                # Stored sharded, gathered where used (FSDP): the gradient is reduce-scattered
                # (and all-reduced over the shards' copies, if any).
                w = self.b.partition(
                    w, dim=dim, degree=ways, name=self._name(f"{node.name}.shard{ways}")
                )
                if copies > ways:
                    replicas = copies // ways
                    w = self.b.replicate(
                        w, degree=replicas, name=self._name(f"{node.name}.r{replicas}")
                    )
                return self.b.all_gather(
                    w, dim=dim, degree=ways, name=self._name(f"{node.name}.gather{ways}")
                )
            ins = [self._free(r, copies) for r in node.inputs]
            name = node.name if copies == 1 else self._name(f"{node.name}.r{copies}")
            out = self.b.apply(node.op, *ins, name=name, **dict(node.params))
            outs = out if isinstance(out, tuple) else (out,)
            for i, t in enumerate(outs):
                self.cache[("free", TensorRef(ref.node, i), copies)] = t
            return outs[ref.index]

        return self._memo(("free", ref, copies), make)

    @staticmethod
    def _shard(w: Tensor, copies: int) -> tuple[int, int]:
        """How weight ``w`` is sharded over ``copies`` devices: ``(dimension, ways)``, the most
        ways (a divisor of ``copies``) that divide one of its dimensions, the first such
        dimension (ways 1: none, the weight stays replicated)."""
        for ways in sorted(divisors(copies), reverse=True):
            for dim, size in enumerate(w.shape.sizes):
                if ways > 1 and size % ways == 0:
                    return dim, ways
        return 0, 1

    def _split_weight(self, ref: TensorRef, dim: int) -> Tensor:
        """A weight split ``tp`` ways along ``dim`` and replicated over the ``dp`` batch shards."""

        def make() -> Tensor:
            name = ref.node
            # A Weight, or a Slice of one computed on one device first (a fused projection's
            # part): its gradient is gathered back into the whole weight's.
            whole = self._source(name) if self.pcg.node(name).op == "weight" else self._free(ref, 1)
            w = self.b.partition(whole, dim=dim, degree=self.tp, name=self._name(f"{name}.tp"))
            if self.dp > 1:
                w = self.b.replicate(w, degree=self.dp, name=self._name(f"{name}.r{self.dp}"))
            return w

        return self._memo(("split", ref, dim), make)

    def _replicate(self, ref: TensorRef, t: Tensor, copies: int) -> Tensor:
        if copies == 1:
            return t
        return self._memo(
            ("copies", ref, t, copies),
            lambda: self.b.replicate(t, degree=copies, name=self._name(f"{ref.node}.r{copies}")),
        )

    def _gather(self, ref: TensorRef, t: Tensor) -> Tensor:
        """Undoes tensor-parallel splits: sums partial sums and all-gathers every split dimension
        but the batch (dimension 0), and the tokens of a sequence-split ``[tokens, hidden]``,
        leaving copies."""

        def make() -> Tensor:
            x = t
            if x.shape.is_partial:
                x = self.b.all_reduce(
                    x, degree=x.shape.sum_degree, name=self._name(f"{ref.node}.allreduce")
                )
            if self._sequence_split(x.shape) == 0:
                # The sequence split sits under the batch split in dimension 0: only it is
                # gathered, its tp blocks of each batch shard being adjacent.
                x = self.b.all_gather(
                    x, dim=0, degree=self.tp, name=self._name(f"{ref.node}.gather0")
                )
            for dim, d in enumerate(x.shape.degrees):
                if dim > 0 and d > 1:
                    x = self.b.all_gather(
                        x, dim=dim, degree=d, name=self._name(f"{ref.node}.gather{dim}")
                    )
            return x

        return self._memo(("gather", ref, t), make)

    def _whole(self, ref: TensorRef, t: Tensor) -> Tensor:
        """One unsplit copy of ``t``."""

        def make() -> Tensor:
            x = t
            if x.shape.is_partial:
                x = self.b.reduce(x, degree=x.shape.sum_degree, name=self._name(f"{ref.node}.sum"))
            if x.shape.copy_degree > 1:
                x = self.b.discard_copies(
                    x, degree=x.shape.copy_degree, name=self._name(f"{ref.node}.one")
                )
            for dim, d in enumerate(x.shape.degrees):
                if d > 1:
                    x = self.b.combine(
                        x, dim=dim, degree=d, name=self._name(f"{ref.node}.combine{dim}")
                    )
            return x

        return self._memo(("whole", ref, t), make)

    def _sequence_split(self, s: ParallelTensorShape) -> int | None:
        """The dimension along which ``s`` has sequence parallelism's layout (one block of the
        sequence, or of the tokens, per device of the tensor-parallel group, no copies), or
        None. Shapes do not say which split is which: this is the layout a ReduceScatter of
        :meth:`_layer` leaves (a heads split of ``[batch, heads, seq, d]`` looks the same, and
        gathering or splitting it is as valid)."""
        if not self.sequence_parallel or s.rank < 2 or s.is_partial or s.copy_degree != 1:
            return None
        dim = 1 if s.rank >= 3 else 0
        # Dimension 0 holds the batch split too (tokens of a rank-2 activation).
        if s.degrees[dim] != self.tp * (self.dp if dim == 0 else 1):
            return None
        return dim if s.num_shards == self.dp * self.tp else None

    def _scatter(self, ref: TensorRef, t: Tensor, layout: ParallelTensorShape) -> Tensor:
        """``t`` split as the sequence-split ``layout`` (:meth:`_sequence_split`) is, when it
        has the same rank and sequence length and differs from it only by that split (its
        other sizes may differ: a Concat's inputs): its copies dropped, then the sequence
        split. Else ``t`` as it is (the node's lowering then tries other layouts)."""
        dim = self._sequence_split(layout)
        s = t.shape
        if dim is None or s.rank != layout.rank or s.is_partial:
            return t
        if s.sizes[dim] != layout.sizes[dim]:
            return t  # broadcast along the sequence: copies of it do
        want = list(layout.degrees)
        want[dim] //= self.tp
        if list(s.degrees) != want:
            return t

        def make() -> Tensor:
            x = t
            if x.shape.copy_degree > 1:
                x = self.b.discard_copies(
                    x, degree=x.shape.copy_degree, name=self._name(f"{ref.node}.one")
                )
            return self.b.partition(x, dim=dim, degree=self.tp, name=self._name(f"{ref.node}.seq"))

        return self._memo(("scatter", ref, t, layout), make)

    def _harmonize(self, node: Node, data: dict[int, Tensor]) -> tuple[list[Tensor], int]:
        """All inputs on the same number of devices: data inputs with fewer shards get copies,
        weight-only inputs are replicated on all of them, except a Weight of an elementwise
        operator's size, which is split as its widest data input is (an attention mask)."""
        shards = max((t.shape.num_shards for t in data.values()), default=1)
        widest = max(data.values(), key=lambda t: t.shape.num_shards, default=None)
        ins: list[Tensor] = []
        for i, ref in enumerate(node.inputs):
            if i in data:
                t = data[i]
                n = t.shape.num_shards
                ins.append(self._replicate(ref, t, shards // n) if shards % n == 0 else t)
            elif (
                node.op in _PASS_WITH_CONSTANTS
                and widest is not None
                and self._splits_like(ref, widest)
            ):
                ins.append(self._weight_like(ref, widest))
            else:
                ins.append(self._free(ref, shards))
        return ins, shards

    def _splits_like(self, ref: TensorRef, t: Tensor) -> bool:
        """Whether weight ``ref`` can take ``t``'s layout: a Weight of ``t``'s sizes, ``t``
        split (not only copied) and without partial sums."""
        s = t.shape
        return (
            self.pcg.node(ref.node).op == "weight"
            and self.pcg.shape(ref).sizes == s.sizes
            and not s.is_partial
            and any(d > 1 for d in s.degrees)
        )

    def _weight_like(self, ref: TensorRef, t: Tensor) -> Tensor:
        """Weight ``ref`` split and copied as ``t`` is (its stored layout: free)."""
        layout = t.shape

        def make() -> Tensor:
            w = self._source(ref.node)
            for dim, d in enumerate(layout.degrees):
                if d > 1:
                    w = self.b.partition(
                        w, dim=dim, degree=d, name=self._name(f"{ref.node}.split{dim}")
                    )
            if layout.copy_degree > 1:
                w = self.b.replicate(w, degree=layout.copy_degree, name=self._name(f"{ref.node}.r"))
            return w

        return self._memo(("like", ref, layout), make)

    def _apply(self, node: Node, ins: list[Tensor], name: str | None = None) -> tuple[Tensor, ...]:
        out = self.b.apply(node.op, *ins, name=name or node.name, **dict(node.params))
        return out if isinstance(out, tuple) else (out,)

    # -- one node -------------------------------------------------------------------------

    def _layer(self, node: Node) -> tuple[Tensor, ...] | None:
        """Column- or row-parallel lowering of a dense layer, or None when it is neither
        (then the node follows its inputs' layouts, :meth:`_attempts`). Under sequence
        parallelism a row-parallel layer reduce-scatters its sums along the sequence, and a
        column-parallel layer all-gathers a sequence-split input."""
        if self.tp == 1 or not _weight_matmul(self.pcg, node):
            return None
        xref = node.inputs[0]
        x = self.env[xref]
        s = x.shape
        if node.name in self.column and not s.is_partial and s.degrees[-1] == 1:
            # Column-parallel: every tensor-parallel device needs the whole input.
            if self._sequence_split(s) is not None:
                x = self._gather(xref, x)  # sequence parallelism's AllGather
            elif s.copy_degree == 1:
                x = self._replicate(xref, x, self.tp)
            elif s.copy_degree != self.tp:
                return None
            w = self._split_weight(node.inputs[1], 1)
            bias = [self._split_weight(r, 0) for r in node.inputs[2:]]
            return self._apply(node, [x, w, *bias])
        if s.degrees[-1] == self.tp and not s.is_partial and s.copy_degree == 1:
            # Row-parallel: partial sums over the split contraction, summed by an AllReduce;
            # bias and activation after it (a fused Linear cannot leave partial sums).
            w = self._split_weight(node.inputs[1], 0)
            extras = node.inputs[2:]
            act = node.params["activation"] if node.op == "linear" else "none"
            last = not extras and act == "none"
            y = self.b.matmul(x, w, name=self._name(f"{node.name}.matmul"))
            seq = _sequence_dim(y.shape, self.tp) if self.sequence_parallel else None
            if seq is None:
                y = self.b.all_reduce(
                    y,
                    degree=self.tp,
                    name=node.name if last else self._name(f"{node.name}.allreduce"),
                )
            else:
                # Sequence parallelism: each device sums only its block of the sequence; what
                # follows up to the next column-parallel layer runs (and is stored) on it.
                y = self.b.reduce_scatter(
                    y,
                    dim=seq,
                    degree=self.tp,
                    name=node.name if last else self._name(f"{node.name}.reducescatter"),
                )
            if extras:
                bias = self._free(extras[0], y.shape.num_shards)
                name = node.name if act == "none" else self._name(f"{node.name}.bias")
                y = self.b.add(y, bias, name=name)  # type: ignore[assignment]
            if act != "none":
                y = self.b.apply(act, y, name=node.name)  # type: ignore[assignment]
            return (y,)
        return None

    def _attempts(
        self, node: Node, data: dict[int, Tensor]
    ) -> list[Callable[[], dict[int, Tensor]]]:
        """Input layouts to try for ``node``, in order; the last one (whole inputs) always
        works and counts as a fallback. Under sequence parallelism, inputs of which some are
        sequence-split (a residual add of a ReduceScatter's output and the embeddings) first
        try the others split alike: gathering the split one back would store it whole."""
        attempts: list[Callable[[], dict[int, Tensor]]] = [lambda: data]
        split = [t for t in data.values() if self._sequence_split(t.shape) is not None]
        if split and len(split) < len(data):
            layout = split[0].shape
            attempts.append(
                lambda: {i: self._scatter(node.inputs[i], t, layout) for i, t in data.items()}
            )
        attempts += [
            lambda: {i: self._gather(node.inputs[i], t) for i, t in data.items()},
            lambda: {i: self._whole(node.inputs[i], t) for i, t in data.items()},
        ]
        return attempts

    def _lower(self, node: Node) -> None:
        if node.op == "input":
            x = self._source(node.name)
            if self.dp > 1:
                x = self.b.partition(
                    x, dim=0, degree=self.dp, name=self._name(f"{node.name}.split")
                )
            self.env[node.output()] = x
            return
        if node.name in self.free:
            return  # materialized at its consumers
        outs: tuple[Tensor, ...] | None = None
        try:
            outs = self._layer(node)
        except PCGError:
            outs = None
        data = {i: self.env[r] for i, r in enumerate(node.inputs) if r.node not in self.free}
        attempts = self._attempts(node, data)
        error = ""
        for k, attempt in enumerate(attempts):
            if outs is not None:
                break
            try:
                ins, _ = self._harmonize(node, attempt())
                outs = self._apply(node, ins)
                if k == len(attempts) - 1:
                    self.fallbacks.append(node.name)
            except PCGError as e:
                # Its text only: the exception's traceback holds this frame, and a cycle
                # through it would keep every failed attempt's objects until a full collection
                # (coordinate descent left 3 million such objects on BERT-Large).
                error = str(e)
        if outs is None:
            raise BaselineError(
                f"node {node.name!r} ({node.op}) cannot be lowered even on whole inputs: {error}",
                node=node.name,
            )
        for i, t in enumerate(outs):
            self.env[node.output(i)] = t

    def run(self) -> PCG:
        for node in self.pcg.nodes:
            self._lower(node)
        results = []
        for ref in self.pcg.outputs:
            if ref.node in self.free:
                results.append(self._free(ref, 1))
            else:
                results.append(self._whole(ref, self.env[ref]))
        # Equivalence matches inputs and weights by name: even unused ones must be there.
        for node in self.pcg.nodes:
            if OPERATORS[node.op].kind is OpKind.SOURCE:
                self._source(node.name)
        return _prune(self.b.build(results))


def _prune(pcg: PCG) -> PCG:
    """Drops nodes no output depends on (layouts made by a lowering attempt that then failed),
    which the cost model would otherwise charge; inputs and weights always stay."""
    live: set[str] = set()
    stack = [r.node for r in pcg.outputs]
    while stack:
        name = stack.pop()
        if name not in live:
            live.add(name)
            stack.extend(r.node for r in pcg.node(name).inputs)
    nodes = [n for n in pcg.nodes if n.name in live or OPERATORS[n.op].kind is OpKind.SOURCE]
    if len(nodes) == len(pcg):
        return pcg
    # A sub-graph closed under inputs of a valid PCG is valid: no shape rule needs re-running.
    return PCG._checked(
        tuple(nodes), {n.name: pcg.output_shapes(n.name) for n in nodes}, pcg.outputs
    )


# ----------------------------------------------------------------------------------------------
# baselines
# ----------------------------------------------------------------------------------------------


def data_parallel(pcg: PCG, machine: Machine, *, degree: int | None = None) -> PCG:
    """Data parallelism over ``degree`` devices (default: the largest that divides the batch
    and fits the machine): inputs split by batch, weights replicated, outputs combined."""
    return _data_parallel(pcg, machine, degree, shard_weights=False)


def _data_parallel(pcg: PCG, machine: Machine, degree: int | None, *, shard_weights: bool) -> PCG:
    """Data parallelism over ``degree`` devices (default: the largest that divides the batch
    and fits the machine), weights replicated or (``shard_weights``) stored sharded."""
    _check_sequential(pcg)
    batch = batch_size(pcg)
    if degree is None:
        degree = largest_divisor(batch, machine.num_devices)
    _check_degree(pcg, machine, degree, batch, "degree")
    return _Lowering(pcg, degree, shard_weights=shard_weights).run()


def fsdp(pcg: PCG, machine: Machine, *, degree: int | None = None) -> PCG:
    """Fully sharded data parallelism (PyTorch FSDP, ZeRO's sharding of weights, gradients and
    optimizer state) over ``degree`` devices (default: as :func:`data_parallel`): inputs split
    by batch; every weight *stored* partitioned over the devices along its first dimension they
    divide (so its gradient and optimizer state are too), all-gathered where it is used (the
    backward reduce-scatters its gradient). A weight no dimension of which the device count
    divides is sharded the most ways that divide one, over groups of consecutive devices, and
    its shards replicated over the groups (FSDP's ``HYBRID_SHARD``; FSDP pads a flattened weight
    instead, which a PCG cannot); one no divisor fits stays replicated. The cost model charges
    one AllGather per weight in the forward (shared by its uses) and keeps the gathered weight
    until the backward (FSDP's ``SHARD_GRAD_OP``, no re-gather in the backward). Under the cost
    model's default placement, the gathers of a hybrid layout and the shards' gradient sync
    both run on consecutive devices, which no machine can do at once (optimistic, as for
    Megatron's hybrid plans); :func:`~pcgopt.extract.search.plan.saturate_and_extract` places
    them on the hierarchy (P^2) before it compares plans."""
    return _data_parallel(pcg, machine, degree, shard_weights=True)


def _check_degree(pcg: PCG, machine: Machine, degree: int, batch: int, what: str) -> None:
    if not isinstance(degree, int) or degree < 1:
        raise BaselineError(f"{what} must be a positive integer, got {degree!r}")
    if degree > machine.num_devices:
        raise BaselineError(
            f"{what} {degree} exceeds machine {machine.name!r}'s {machine.num_devices} devices"
        )
    if batch % degree:
        first = pcg.inputs[0].name
        raise BaselineError(
            f"node {first!r} (input): batch size {batch} is not divisible by {what} {degree}",
            node=first,
        )


def _devices_per_node(machine: Machine) -> int:
    """Devices inside one unit of the outermost level (a node), where Megatron keeps its
    tensor-parallel group so that its AllReduces stay on the fast links."""
    if len(machine.levels) == 1:
        return machine.num_devices
    return machine.num_devices // machine.levels[0].count


def megatron(
    pcg: PCG,
    machine: Machine,
    *,
    tensor_degree: int | None = None,
    sequence_parallel: bool = False,
    copies_if_unsplit: bool = False,
) -> PCG:
    """Megatron-LM tensor parallelism over ``tensor_degree`` devices, data parallelism over the
    remaining ``num_devices // tensor_degree`` (the largest degree dividing the batch).

    Default ``tensor_degree``: of the degrees up to the devices of one node that divide the
    machine, the largest for which every column-parallel layer found can be split (Megatron
    keeps tensor parallelism inside a node); 1, i.e. data parallelism, when none is found.

    ``sequence_parallel``: Megatron-LM's sequence parallelism on top (module docstring): each
    row-parallel layer's AllReduce becomes a ReduceScatter along the sequence and the next
    column-parallel layer's input an AllGather, so that the bias, dropout, residual and
    LayerNorm between them run on, and store, ``1 / tensor_degree`` of the tokens. A layer
    whose sequence (or tokens, for a rank-2 activation) does not divide by the degree keeps
    the AllReduce.

    An explicit ``tensor_degree`` at which no dense layer splits raises :class:`BaselineError`
    naming the degrees that do, unless ``copies_if_unsplit``: then every layer is copied on the
    tensor-parallel devices, as Megatron copies what it does not split (a pipeline stage with
    no dense layer, beside stages that have them).
    """
    if not isinstance(sequence_parallel, bool):
        raise BaselineError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    _check_sequential(pcg)
    batch = batch_size(pcg)
    pcg = split_projections(pcg)
    sp = sequence_parallel
    if tensor_degree is not None:
        _check_tensor_degree(machine, tensor_degree)
        if tensor_degree > 1 and not copies_if_unsplit and not _column_parallel(pcg, tensor_degree):
            # Every layer would fall back to copies on the tensor-parallel devices: not
            # Megatron, and under its name a plan that only replicates its work.
            raise BaselineError(
                f"tensor_degree {tensor_degree}: no dense layer's columns (heads) divide by it "
                "with another dense layer reading its output, so Megatron has nothing to split; "
                "degrees that do: "
                + (", ".join(str(t) for t in _megatron_degrees(pcg, machine)) or "none")
            )
        dp = largest_divisor(batch, machine.num_devices // tensor_degree)
        return _Lowering(pcg, dp, tensor_degree, sequence_parallel=sp).run()
    per_node = _devices_per_node(machine)
    for t in sorted((t for t in divisors(machine.num_devices, per_node) if t >= 2), reverse=True):
        if not _column_parallel(pcg, t):
            continue
        dp = largest_divisor(batch, machine.num_devices // t)
        lowering = _Lowering(pcg, dp, t, sequence_parallel=sp)
        plan = lowering.run()
        if not lowering.fallbacks:
            return plan
    return _Lowering(pcg, largest_divisor(batch, machine.num_devices)).run()


def _megatron_degrees(pcg: PCG, machine: Machine) -> list[int]:
    """The tensor degrees above 1 dividing ``machine``'s devices at which some column-parallel
    layer of ``pcg`` splits."""
    return [t for t in divisors(machine.num_devices) if t > 1 and _column_parallel(pcg, t)]


def megatron_sp(pcg: PCG, machine: Machine) -> PCG:
    """:func:`megatron` with sequence parallelism, at its default tensor degree."""
    return megatron(pcg, machine, sequence_parallel=True)


def split_projections(pcg: PCG) -> PCG:
    """Fused projections as one dense layer per part: a MatMul or Linear by a rank-2 Weight
    whose output only Splits and Slices of its last dimension read (GPT-2's and most
    exporters' fused QKV) becomes one such layer per part, over the Slices of its weight's
    columns (and of its bias), computed from weights only. Each output element is the same
    dot product as before, so the graph computes exactly what ``pcg`` does; Megatron can then
    split each part's columns (its heads), where a split of the fused columns would cut across
    Q, K and V. The parts are named after the fused layer (``qkv`` gives ``qkv.0``...)."""
    consumers = pcg.consumers()
    outputs = set(pcg.outputs)
    added: dict[str, list[Node]] = {}  # fused layer -> the nodes that replace it
    dropped: set[str] = set()
    moved: dict[TensorRef, TensorRef] = {}  # a part's tensor -> its layer's output
    for node in pcg.nodes:
        if not _weight_matmul(pcg, node) or len(pcg.output_shapes(node.name)) != 1:
            continue
        last = pcg.shape(node.output()).rank - 1
        users = [pcg.node(name) for name, _ in consumers.get(node.output(), [])]
        parts: list[tuple[TensorRef, int, int]] = []
        for user in users:
            if user.op == "split" and user.params["axis"] == last:
                stops = np.cumsum(user.params["sizes"]).tolist()
                starts = [0, *stops[:-1]]
                cuts = enumerate(zip(starts, stops, strict=True))
                parts += [(user.output(i), a, b) for i, (a, b) in cuts]
            elif user.op == "slice" and user.params["axis"] == last:
                parts.append((user.output(), user.params["start"], user.params["stop"]))
            else:
                parts = []
                break
        if len(parts) < 2 or node.output() in outputs or any(r in outputs for r, _, _ in parts):
            continue
        new: list[Node] = []
        for k, (ref, start, stop) in enumerate(parts):
            name = f"{node.name}.{k}"
            cut = {"start": start, "stop": stop}
            w = Node(f"{name}.w", "slice", (node.inputs[1],), {"axis": 1, **cut})
            extra = [Node(f"{name}.b", "slice", (r,), {"axis": 0, **cut}) for r in node.inputs[2:]]
            layer = Node(
                name,
                node.op,
                (node.inputs[0], w.output(), *(e.output() for e in extra)),
                node.params,
            )
            new += [w, *extra, layer]
            moved[ref] = layer.output()
        added[node.name] = new
        dropped |= {user.name for user in users}
    if not added:
        return pcg
    nodes: list[Node] = []
    for node in pcg.nodes:
        if node.name in added:
            nodes += added[node.name]
        elif node.name not in dropped:
            inputs = tuple(moved.get(r, r) for r in node.inputs)
            nodes.append(node if inputs == node.inputs else replace(node, inputs=inputs))
    return PCG(nodes, pcg.outputs)


def _feed_forward_blocks(pcg: PCG) -> list[tuple[Node, Node | None, Node]]:
    """The two-layer feed-forward blocks (first layer, its separate activation or None, second
    layer): a Linear, or a MatMul alone or read only by an activation, whose output only the
    data input of a MatMul or activation-free Linear reads, both with rank-2 weights."""
    consumers = pcg.consumers()
    outputs = set(pcg.outputs)

    def only_reader(node: Node) -> Node | None:
        users = consumers.get(node.output(), [])
        if node.output() in outputs or len(users) != 1 or users[0][1] != 0:
            return None
        return pcg.node(users[0][0])

    def dense(node: Node | None) -> bool:
        return (
            node is not None
            and node.op in ("matmul", "linear")
            and pcg.shape(node.inputs[1]).rank == 2
        )

    blocks = []
    seconds: set[str] = set()
    for first in pcg.nodes:
        if not dense(first) or first.name in seconds:  # in a chain, blocks do not overlap
            continue
        act = only_reader(first)
        if first.op == "linear" or act is None or act.op not in ACTIVATIONS:
            act = None
        second = only_reader(act or first)
        if dense(second) and (second.op == "matmul" or second.params["activation"] == "none"):
            blocks.append((first, act, second))
            seconds.add(second.name)
    return blocks


def unity_figure_2b(pcg: PCG, machine: Machine, *, degree: int | None = None) -> PCG:
    """Unity's Figure 2b plan on every two-layer feed-forward block of ``pcg`` (module
    docstring), over ``degree`` devices (default: the largest dividing the machine's device
    count and the width of every block's input and output). Raises :class:`BaselineError`
    when ``pcg`` has no such block or ``degree`` does not divide those widths."""
    _check_sequential(pcg)
    blocks = _feed_forward_blocks(pcg)
    if not blocks:
        raise BaselineError(
            "no two-layer feed-forward block (a MatMul or Linear read only, directly or "
            "through an activation, by another)"
        )
    # The first layer splits its contraction, the second its output columns.
    widths = {
        size
        for first, _, second in blocks
        for size in (pcg.shape(first.inputs[1]).sizes[0], pcg.shape(second.inputs[1]).sizes[1])
    }
    if degree is None:
        degree = math.gcd(machine.num_devices, *widths)
    _check_tensor_degree(machine, degree, "degree")
    if degree < 2 or any(w % degree for w in widths):
        raise BaselineError(
            f"degree {degree} does not split the feed-forward blocks' input and output "
            f"widths {sorted(widths)}"
        )
    d = degree
    firsts = {first.name for first, _, _ in blocks}
    seconds = {second.name for _, _, second in blocks}
    nodes: list[Node] = []
    for node in pcg.nodes:
        if node.name in firsts:
            x, w1, *bias = node.inputs
            last = pcg.shape(x).rank - 1
            summed = f"{node.name}.partial"
            steps = [
                Node(f"{node.name}.input.split", "partition", (x,), {"dim": last, "degree": d}),
                Node(f"{w1.node}.row{d}", "partition", (w1,), {"dim": 0, "degree": d}),
                Node(summed, "matmul", (f"{node.name}.input.split", f"{w1.node}.row{d}")),
                Node(f"{node.name}.allreduce", "all_reduce", (summed,), {"degree": d}),
            ]
            for b in bias:
                steps += [
                    Node(f"{b.node}.r{d}", "replicate", (b,), {"degree": d}),
                    Node(f"{node.name}.bias", "add", (steps[-1].name, f"{b.node}.r{d}")),
                ]
            act = node.params["activation"] if node.op == "linear" else "none"
            if act != "none":
                steps.append(Node(f"{node.name}.{act}", act, (steps[-1].name,)))
            # The layer's last step takes its name: its reader's reference holds.
            steps[-1] = Node(node.name, steps[-1].op, steps[-1].inputs, steps[-1].params)
            nodes += steps
        elif node.name in seconds:
            h, w2, *bias = node.inputs
            last = pcg.shape(node.output()).rank - 1
            steps = [
                Node(f"{w2.node}.col{d}", "partition", (w2,), {"dim": 1, "degree": d}),
                Node(f"{node.name}.matmul", "matmul", (h, f"{w2.node}.col{d}")),
            ]
            for b in bias:
                steps += [
                    Node(f"{b.node}.col{d}", "partition", (b,), {"dim": 0, "degree": d}),
                    Node(f"{node.name}.bias", "add", (steps[-1].name, f"{b.node}.col{d}")),
                ]
            steps.append(Node(node.name, "combine", (steps[-1].name,), {"dim": last, "degree": d}))
            nodes += steps
        else:
            nodes.append(node)
    # A weight or bias that two blocks share is split (or copied) once.
    unique: dict[str, Node] = {}
    for n in nodes:
        unique.setdefault(n.name, n)
    return PCG(list(unique.values()), pcg.outputs)


def _check_tensor_degree(machine: Machine, degree: int, what: str = "tensor_degree") -> None:
    if not isinstance(degree, int) or degree < 1:
        raise BaselineError(f"{what} must be a positive integer, got {degree!r}")
    if degree > machine.num_devices:
        raise BaselineError(
            f"{what} {degree} exceeds machine {machine.name!r}'s {machine.num_devices} devices"
        )


# ----------------------------------------------------------------------------------------------
# sequential optimization
# ----------------------------------------------------------------------------------------------


def fuse(pcg: PCG) -> PCG:
    """Single-device algebraic rewrites, to a fixed point: ``matmul(x, w) + b`` (``b`` a rank-1
    weight, the MatMul read by nothing else) becomes ``linear(x, w, b)``, and an activation
    (ReLU, GELU, sigmoid, tanh) whose input is a bias-free or activation-free Linear or MatMul
    read by nothing else is fused into it. The fused node takes the name of the last node it
    replaces, so every other reference stays valid."""
    _check_sequential(pcg)
    while True:
        fused = _fuse_once(pcg)
        if fused is None:
            return pcg
        pcg = fused


def _fuse_once(pcg: PCG) -> PCG | None:
    consumers = pcg.consumers()
    outputs = set(pcg.outputs)
    for node in pcg.nodes:
        if node.op not in ("matmul", "linear") or node.output() in outputs:
            continue
        users = consumers.get(node.output(), [])
        if len(users) != 1 or len(pcg.output_shapes(node.name)) != 1:
            continue
        user = pcg.node(users[0][0])
        act = node.params["activation"] if node.op == "linear" else "none"
        n = pcg.shape(node.output()).sizes[-1]
        if node.op == "matmul" and pcg.shape(node.inputs[1]).rank != 2:
            continue
        replacement: Node | None = None
        if user.op in ACTIVATIONS and act == "none":
            replacement = Node(user.name, "linear", node.inputs, {"activation": user.op})
        elif user.op == "add" and act == "none" and len(node.inputs) == 2:
            other = user.inputs[1 - users[0][1]]
            src = pcg.node(other.node)
            if src.op == "weight" and pcg.shape(other).sizes == (n,) and other != node.output():
                replacement = Node(user.name, "linear", (*node.inputs, other), {})
        if replacement is None:
            continue
        nodes = [
            replacement if m.name == user.name else m for m in pcg.nodes if m.name != node.name
        ]
        try:
            return PCG(nodes, pcg.outputs)
        except PCGError:
            continue  # e.g. broadcasting the add would not be a bias: keep the graph as it is
    return None


def sequential(pcg: PCG, machine: Machine) -> PCG:
    """Sequential optimization: :func:`fuse` with no parallelism in view (kept when a single
    device runs it no slower), then the cheaper of :func:`data_parallel` and :func:`megatron`
    on that fixed graph (feasible first, then total time)."""
    from pcgopt.extract.costmodel.cost import iteration_cost

    _check_sequential(pcg)
    fused = fuse(pcg)
    if fused is not pcg:
        one = _single_device(machine)
        if iteration_cost(fused, one).total_s > iteration_cost(pcg, one).total_s:
            fused = pcg
    plans = [data_parallel(fused, machine), megatron(fused, machine)]
    costs = [iteration_cost(p, machine) for p in plans]
    best = min(range(len(plans)), key=lambda i: (not costs[i].feasible, costs[i].total_s))
    return plans[best]


def _single_device(machine: Machine) -> Machine:
    """One device of ``machine`` (the single-device optimizer's view)."""
    inner = machine.levels[-1]
    return Machine((Level(inner.name, 1, inner.link),), machine.device, name=machine.name)


def coordinate_descent(pcg: PCG, machine: Machine, *, restarts: int = 4, **options: Any):
    """AutoDDL's coordinate descent over per-layer SBP matmul strategies, as a baseline: see
    :func:`pcgopt.extract.strategies.layerwise.coordinate_descent` (``options``: its keywords).
    Returns a :class:`~pcgopt.extract.strategies.layerwise.LayerwiseResult` (``.pcg``,
    ``.strategies``, ``.cost``)."""
    # layerwise builds on this module's lowering, so it is imported when first needed.
    from pcgopt.extract.strategies.layerwise import coordinate_descent as search

    return search(pcg, machine, restarts=restarts, **options)
