"""Per-layer SBP strategies and AutoDDL's heuristic searches over them (AutoDDL section 4).

A *dense layer* is a MatMul or Linear of an activation ``x[..., K]`` by a rank-2 weight
``W[K, N]`` (or by the transpose of one, as a tied output projection). AutoDDL's SBP matmul
runs it on ``p = p0 * p1 * p2`` devices (section 4.2, Figure 6) with

* input ``x``: ``(S0:p0, B:p1, S{last}:p2)``: batch split ``p0`` ways, contraction ``p2`` ways,
  ``p1`` copies;
* weight ``W``: ``(B:p0, S1:p1, S0:p2)``: stored split ``p2 x p1`` with ``p0`` copies (whose
  gradients are all-reduced);
* output: ``(S0:p0, S{last}:p1, P:p2)``: ``p2`` partial sums, kept as they are until a consumer
  needs otherwise (a ReduceScatter into the dimension it splits, usually), which is what lets
  the partial-sum state save an AllReduce.

:class:`MatmulStrategy` ``(p0, p1, p2)`` is that choice: ``(p, 1, 1)`` is data parallelism,
``(d, t, 1)`` and ``(d, 1, t)`` Megatron's column- and row-parallel halves, ``(1, a, b)`` a 2D
weight-stationary split (no weight copies, as in AutoDDL's Figure 8), and ``(q, q, q)`` the 3D
algorithm whose communication is ``Theta(n^2 / p^(2/3))``.

:func:`lower` builds the parallel PCG of an assignment of strategies to dense layers: every other
operator runs on its inputs' layout when its shape rule accepts it, otherwise on inputs
redistributed to the first input's layout (partial sums reduce-scattered into a dimension, splits
moved by AllToAll, AllGather or taken from copies), otherwise with splits other than the batch
all-gathered, and as a last resort on whole inputs. Between dense layers the redistribution is
section 4.2's path: ReduceScatter of the partial sums, AllToAll between split dimensions, AllGather
into copies. The result is an ordinary PCG, equivalent to the input (``pcgopt.equivalent``), costed
by :func:`~pcgopt.extract.costmodel.cost.iteration_cost` like every other plan.

A layer whose sizes no strategy over all ``p`` devices divides (a batch of 256 and no factor 3
on 12 GPUs) takes its strategies on the most devices that have one; the others idle while it
runs, rather than the whole search giving up.

The searches (section 4.4) rank assignments by ``iteration_cost``: feasible (fits device memory)
before infeasible, feasible ones by predicted time and infeasible ones by memory per device (so that
a search starting out of memory moves towards fitting). Memory-aware pruning: a strategy whose
weight shard alone (with gradient and optimizer state) exceeds device memory is never tried, and an
assignment that does not fit never replaces one that does. An assignment that does not fit at full
batch is costed with gradient accumulation over the fewest micro-batches that fit
(:func:`~pcgopt.extract.costmodel.cost.accumulate_to_fit`, AutoDDL section 5.2), so the micro-batch
count is chosen with the strategies. Repeated evaluations are cached.

**Repeated layers.** With tied layers (below) on a model whose layers repeat (a run of segments
equal up to names, :func:`pcgopt.segments.repeated_run`: 21 of BERT-Large's 24 layers), an
evaluation costs the model shortened to one and to two of the run's repeats and extrapolates
linearly to the run's length (time and memory per device), so its time grows with the distinct
layers, not the layers (where the two short models are small enough to save time:
:data:`PROXY_MAX_SIZE`). The extrapolation is checked on the first assignment against the whole
model's cost (off by more than :data:`PROXY_TOLERANCE`, or a time limit too short for the
proxy to pay off: every assignment is costed on the whole model); the micro-batch count is
chosen as :func:`~pcgopt.extract.costmodel.cost.accumulate_to_fit` would on the extrapolated
memory; and the :data:`PROXY_FINALISTS` best are costed on the whole model at the end, the
result the best of those.

* :func:`coordinate_descent`: from a start, set each layer in turn to its best strategy with the
  others fixed, sweep until no layer changes, then restart from a random assignment; keep the
  best (``restarts`` starts in all, the first the best uniform assignment).
* :func:`metropolis_hastings`: FlexFlow's MCMC as AutoDDL compares it: propose one layer's
  strategy at random, accept with ``min(1, exp(-beta * (cost_new - cost_old)))``.
* :func:`uniform_strategy`: one strategy for every dense layer; :func:`summa_like` is the best
  uniform 2D weight-stationary one ``(1, a, b)`` over the grids ``a * b = p`` (AutoDDL's
  hand-tuned "Summa" mesh; the streaming SUMMA algorithm itself is not modelled).
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any

from pcgopt.builder import Tensor
from pcgopt.divisors import divisors, largest_divisor
from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.cost import (
    CostBreakdown,
    CostError,
    MemoryBreakdown,
    accumulate_to_fit,
    fewest_micro_batches,
    iteration_cost,
    micro_batch_counts,
)
from pcgopt.extract.costmodel.simulate import DDP, Runtime
from pcgopt.extract.strategies.baselines import (
    BaselineError,
    _check_sequential,
    _Lowering,
    batch_size,
)
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.machine import Machine
from pcgopt.sbp import SBP
from pcgopt.segments import RepeatedRun, repeated_run

__all__ = [
    "LayerwiseResult",
    "MatmulStrategy",
    "coordinate_descent",
    "dense_layers",
    "lower",
    "metropolis_hastings",
    "strategies_for",
    "summa_like",
    "uniform_strategy",
]


@dataclass(frozen=True, slots=True, order=True)
class MatmulStrategy:
    """AutoDDL's SBP matmul on ``batch * columns * contraction`` devices (module docstring):
    ``batch`` = p0 splits the batch, ``columns`` = p1 splits the weight's output columns
    (the input is copied p1 times), ``contraction`` = p2 splits the contraction (the output holds
    p2 partial sums).

    >>> s = MatmulStrategy(4, 2, 8)
    >>> s
    MatmulStrategy(x (S0:4, B:2, S1:8), w (B:4, S1:2, S0:8) -> (S0:4, S1:2, P:8))
    >>> s.devices
    64
    """

    batch: int = 1
    columns: int = 1
    contraction: int = 1

    def __post_init__(self) -> None:
        for name in ("batch", "columns", "contraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BaselineError(
                    f"MatmulStrategy.{name} must be a positive integer, got {value!r}"
                )

    @property
    def devices(self) -> int:
        return self.batch * self.columns * self.contraction

    def input_sbp(self, rank: int = 2) -> SBP:
        return SBP((("S0", self.batch), ("B", self.columns), (f"S{rank - 1}", self.contraction)))

    def weight_sbp(self) -> SBP:
        return SBP((("B", self.batch), ("S1", self.columns), ("S0", self.contraction)))

    def output_sbp(self, rank: int = 2) -> SBP:
        return SBP((("S0", self.batch), (f"S{rank - 1}", self.columns), ("P", self.contraction)))

    def __repr__(self) -> str:
        return f"MatmulStrategy(x {self.input_sbp()}, w {self.weight_sbp()} -> {self.output_sbp()})"

    def __str__(self) -> str:
        return f"({self.batch}, {self.columns}, {self.contraction})"


# ----------------------------------------------------------------------------------------------
# dense layers and their candidate strategies
# ----------------------------------------------------------------------------------------------


def _weight_source(pcg: PCG, ref: TensorRef) -> tuple[str, bool] | None:
    """The rank-2 Weight a dense layer multiplies by, and whether it is read transposed."""
    node = pcg.node(ref.node)
    if node.op == "weight" and pcg.shape(ref).rank == 2:
        return node.name, False
    if (
        node.op == "transpose"
        and tuple(node.params["perm"]) == (1, 0)
        and pcg.node(node.inputs[0].node).op == "weight"
    ):
        return node.inputs[0].node, True
    return None


#: Lookups in a weight table, lowered as products of one-hot indices by the table: the
#: contraction is the table's rows, the columns its embedding dimension (an embedding bag also
#: sums its bag, an axis of the indices that stays whole).
LOOKUPS = ("embedding", "embedding_bag")


def dense_layers(pcg: PCG) -> tuple[str, ...]:
    """The dense layers of ``pcg`` in graph order: MatMul/Linear nodes whose second input is a
    rank-2 Weight or its transpose, and whose first is an activation of rank 2 or more, and
    lookups in a Weight table, single or in bags (:data:`LOOKUPS`: a product of the one-hot
    indices by the table: the contraction is the vocabulary, split ``p2`` ways it leaves partial
    sums, Megatron's vocabulary-parallel embedding)."""
    found = []
    for node in pcg.nodes:
        if node.op in LOOKUPS and pcg.node(node.inputs[1].node).op == "weight":
            found.append(node.name)  # a product of one-hot indices by the table
            continue
        if node.op not in ("matmul", "linear") or len(node.inputs) < 2:
            continue
        if pcg.shape(node.inputs[0]).rank < 2 or _weight_source(pcg, node.inputs[1]) is None:
            continue
        if pcg.node(node.inputs[0].node).op == "weight":
            continue
        found.append(node.name)
    return tuple(found)


def _triples(p: int) -> list[tuple[int, int, int]]:
    ds = divisors(p)
    return [(a, b, p // (a * b)) for a in ds for b in ds if (p // a) % b == 0]


def strategies_for(
    pcg: PCG, layer: str, machine: Machine, *, devices: int | None = None, optimizer_states: int = 2
) -> tuple[MatmulStrategy, ...]:
    """Every strategy on ``devices`` (default: all of the machine's, as AutoDDL; a plan on fewer
    devices is the baselines' and the e-graph's to find) that divides the layer's
    batch, columns and contraction, and whose weight shard with its gradient and
    ``optimizer_states`` copies of state fits one device (memory-aware pruning)."""
    p = machine.num_devices if devices is None else devices
    node = pcg.node(layer)
    x = pcg.shape(node.inputs[0])
    w = pcg.shape(node.inputs[1])
    k, n = w.sizes
    capacity = machine.device.memory_bytes
    found = []
    for p0, p1, p2 in _triples(p):
        if x.sizes[0] % p0 or n % p1 or k % p2:
            continue
        if w.nbytes // (p1 * p2) * (2 + optimizer_states) > capacity:
            continue
        found.append(MatmulStrategy(p0, p1, p2))
    return tuple(found)


# ----------------------------------------------------------------------------------------------
# lowering
# ----------------------------------------------------------------------------------------------


def _target(s: Any, dim: int, factor: int) -> tuple[tuple[int, ...], int] | None:
    """The degrees and copies of ``s`` with ``factor`` more splits of ``dim``, or None."""
    degrees = list(s.degrees)
    degrees[dim] *= factor
    if s.sizes[dim] % degrees[dim]:
        return None
    return tuple(degrees), s.copy_degree


class _LayerwiseLowering(_Lowering):
    """:class:`~pcgopt.extract.strategies.baselines._Lowering` with one :class:`MatmulStrategy` per
    dense layer and redistribution between layouts (module docstring)."""

    def __init__(self, pcg: PCG, strategies: Mapping[str, MatmulStrategy], input_degree: int):
        super().__init__(pcg, input_degree)
        self.strategies = strategies
        # Why each failed, as text: an exception kept would hold its traceback's frames.
        self.failed: list[tuple[str, MatmulStrategy, str]] = []

    def lowered(self) -> PCG:
        """The lowered PCG; raises :class:`~pcgopt.extract.strategies.baselines.BaselineError`
        naming the first dense layer whose strategy could not be applied."""
        plan = self.run()
        if self.failed:
            name, strategy, error = self.failed[0]
            raise BaselineError(
                f"node {name!r}: strategy {strategy} cannot be applied: {error}", node=name
            )
        return plan

    # -- redistribution ---------------------------------------------------------------------

    def _redistribute(
        self, ref: TensorRef, t: Tensor, degrees: Sequence[int], copies: int
    ) -> Tensor:
        """``t`` in the layout with these per-dimension ``degrees`` and ``copies`` (no partial
        sums): partial sums reduce-scattered into a dimension that needs more splits (else
        all-reduced), excess splits moved by AllToAll to dimensions that need them, the rest
        all-gathered; missing splits taken from copies; copies matched last."""
        key = ("redistribute", ref, t, tuple(degrees), copies)
        if key in self.cache:
            return self.cache[key]
        b, x, base = self.b, t, ref.node
        s = x.shape

        def need(dim: int) -> int:
            have, want = s.degrees[dim], degrees[dim]
            return want // have if want % have == 0 else 1

        while s.sum_degree > 1:
            p = s.sum_degree
            dims = [d for d in reversed(range(s.rank)) if math.gcd(need(d), p) > 1]
            if dims:
                g = math.gcd(need(dims[0]), p)
                x = b.reduce_scatter(x, dim=dims[0], degree=g, name=self._name(f"{base}.rs"))
            else:
                x = b.all_reduce(x, degree=p, name=self._name(f"{base}.allreduce"))
            s = x.shape
        for src in range(s.rank):
            have, want = s.degrees[src], degrees[src]
            excess = have // math.gcd(have, want)
            for dst in range(s.rank):
                if excess == 1 or dst == src:
                    continue
                g = math.gcd(excess, need(dst))
                if g > 1 and s.sizes[dst] % (s.degrees[dst] * g) == 0:
                    x = b.all_to_all(
                        x, src_dim=src, dst_dim=dst, degree=g, name=self._name(f"{base}.a2a")
                    )
                    s, excess = x.shape, excess // g
            if excess > 1:
                x = b.all_gather(x, dim=src, degree=excess, name=self._name(f"{base}.gather"))
                s = x.shape
        for dst in range(s.rank):
            have, want = s.degrees[dst], degrees[dst]
            if have == want:
                continue
            g = want // have
            # Splits come out of copies where there are copies, so that the tensor spans no
            # more devices than before.
            kept = math.gcd(s.copy_degree, g)
            if kept > 1:
                x = b.discard_copies(x, degree=kept, name=self._name(f"{base}.one"))
            x = b.partition(x, dim=dst, degree=g, name=self._name(f"{base}.split"))
            s = x.shape
        if s.copy_degree < copies and copies % s.copy_degree == 0:
            x = b.replicate(x, degree=copies // s.copy_degree, name=self._name(f"{base}.r"))
        elif s.copy_degree > copies and s.copy_degree % copies == 0:
            x = b.discard_copies(x, degree=s.copy_degree // copies, name=self._name(f"{base}.one"))
        if tuple(x.shape.degrees) != tuple(degrees) or x.shape.copy_degree != copies:
            raise BaselineError(f"cannot bring {ref} from {t.shape} to degrees {degrees} x{copies}")
        self.cache[key] = x
        return x

    def _weight(self, ref: TensorRef, strategy: MatmulStrategy) -> Tensor:
        """A dense layer's weight stored as ``(B:p0, S1:p1, S0:p2)``: layout operators on the
        Weight (free), a transpose after them for a tied weight."""
        source, transposed = _weight_source(self.pcg, ref)  # type: ignore[misc]
        p0, p1, p2 = strategy.batch, strategy.columns, strategy.contraction

        def make() -> Tensor:
            w = self._source(source)
            splits = ((1, p2), (0, p1)) if transposed else ((0, p2), (1, p1))
            for dim, degree in splits:
                if degree > 1:
                    w = self.b.partition(w, dim=dim, degree=degree, name=self._name(f"{source}.s"))
            if p0 > 1:
                w = self.b.replicate(w, degree=p0, name=self._name(f"{source}.r{p0}"))
            if transposed:
                w = self.b.transpose(w, perm=(1, 0), name=self._name(f"{ref.node}"))
            return w

        return self._memo(("weight", ref, strategy), make)

    def _bias(self, ref: TensorRef, split: int, copies: int) -> Tensor:
        def make() -> Tensor:
            v = self._source(ref.node)
            if split > 1:
                v = self.b.partition(v, dim=0, degree=split, name=self._name(f"{ref.node}.s"))
            if copies > 1:
                v = self.b.replicate(v, degree=copies, name=self._name(f"{ref.node}.r{copies}"))
            return v

        return self._memo(("bias", ref, split, copies), make)

    # -- one node ---------------------------------------------------------------------------

    def _input_layout(
        self, layer: Node, strategy: MatmulStrategy, rank: int
    ) -> tuple[list[int], int]:
        """Degrees and copies of a dense layer's data input: ``(S0:p0, B:p1, S{last}:p2)``; an
        embedding's indices have no contraction dimension, so they are copied p1 * p2 times."""
        degrees = [1] * rank
        degrees[0] *= strategy.batch
        if layer.op in LOOKUPS:
            return degrees, strategy.columns * strategy.contraction
        degrees[-1] *= strategy.contraction
        return degrees, strategy.columns

    def _lower(self, node: Node) -> None:
        """A data input read by a dense layer is loaded straight in that layer's input layout
        (layout operators on a source move nothing); other inputs are split by batch."""
        if node.op == "input":
            first = self._first_dense_reader(node.name)
            if first is not None:
                x = self._source(node.name)
                degrees, copies = self._input_layout(
                    self.pcg.node(first), self.strategies[first], x.shape.rank
                )
                for dim, degree in enumerate(degrees):
                    if degree > 1:
                        x = self.b.partition(
                            x, dim=dim, degree=degree, name=self._name(f"{node.name}.split")
                        )
                if copies > 1:
                    x = self.b.replicate(x, degree=copies, name=self._name(f"{node.name}.r"))
                self.env[node.output()] = x
                return
        super()._lower(node)

    def _first_dense_reader(self, name: str) -> str | None:
        rank = self.pcg.shape(TensorRef(name)).rank
        for reader, slot in self.pcg.consumers().get(TensorRef(name), ()):
            embedding = self.pcg.node(reader).op in LOOKUPS
            if slot == 0 and reader in self.strategies and (rank > 1 or embedding):
                return reader
        return None

    def _layer(self, node: Node) -> tuple[Tensor, ...] | None:
        strategy = self.strategies.get(node.name)
        if strategy is None:
            return None
        try:
            return self._dense(node, strategy)
        except PCGError as e:
            # Not silently lowered another way: the assignment would not be what it says.
            self.failed.append((node.name, strategy, str(e)))
            raise

    def _dense(self, node: Node, strategy: MatmulStrategy) -> tuple[Tensor, ...]:
        p0, p1, p2 = strategy.batch, strategy.columns, strategy.contraction
        xref = node.inputs[0]
        x = self.env[xref]
        rank = x.shape.rank
        degrees, copies = self._input_layout(node, strategy, rank)
        x = self._redistribute(xref, x, degrees, copies)
        w = self._weight(node.inputs[1], strategy)
        if node.op in LOOKUPS:
            return self._apply(node, [x, w])  # (S0:p0, S{last}:p1, P:p2)
        extras = node.inputs[2:]
        act = node.params["activation"] if node.op == "linear" else "none"
        if p2 == 1:
            bias = [self._bias(r, p1, p0) for r in extras]
            return self._apply(node, [x, w, *bias])
        last = not extras and act == "none"
        y = self.b.matmul(x, w, name=node.name if last else self._name(f"{node.name}.matmul"))
        if last:
            return (y,)  # partial sums kept: the consumers decide how to reduce them
        n = y.shape.sizes[-1]
        if n % (p1 * p2) == 0:
            y = self.b.reduce_scatter(
                y, dim=rank - 1, degree=p2, name=self._name(f"{node.name}.rs")
            )
            split, copies = p1 * p2, p0
        else:
            y = self.b.all_reduce(y, degree=p2, name=self._name(f"{node.name}.allreduce"))
            split, copies = p1, p0 * p2
        if extras:
            name = node.name if act == "none" else self._name(f"{node.name}.bias")
            y = self.b.add(y, self._bias(extras[0], split, copies), name=name)  # type: ignore[assignment]
        if act != "none":
            y = self.b.apply(act, y, name=node.name)  # type: ignore[assignment]
        return (y,)

    def _attempts(
        self, node: Node, data: dict[int, Tensor]
    ) -> list[Callable[[], dict[int, Tensor]]]:
        attempts: list[Callable[[], dict[int, Tensor]]] = [lambda: data]
        if data:
            first = min(data)
            s = data[first].shape
            targets: list[tuple[tuple[int, ...], int]] = []
            if s.is_partial:
                # Reduce-scatter the partial sums into a dimension, last first.
                for dim in reversed(range(s.rank)):
                    t = _target(s, dim, s.sum_degree)
                    if t is not None:
                        targets.append(t)
                targets.append((s.degrees, s.copy_degree * s.sum_degree))
            else:
                targets.append((s.degrees, s.copy_degree))
            for degrees, copies in targets:
                attempts.append(self._matching(node, data, first, degrees, copies))
            if s.rank:  # a scalar (a loss) has no batch dimension to keep
                gathered = [1] * s.rank
                gathered[0] = s.degrees[0]
                copies = math.prod(s.degrees) * s.copy_degree * s.sum_degree // gathered[0]
                attempts.append(self._matching(node, data, first, tuple(gathered), copies))
        attempts.append(lambda: {i: self._whole(node.inputs[i], t) for i, t in data.items()})
        return attempts

    def _matching(
        self,
        node: Node,
        data: dict[int, Tensor],
        first: int,
        degrees: tuple[int, ...],
        copies: int,
    ) -> Callable[[], dict[int, Tensor]]:
        """Inputs redistributed to ``first``'s target layout (others of a different rank keep
        their batch split with copies to the same device count)."""

        def make() -> dict[int, Tensor]:
            shards = math.prod(degrees) * copies
            out = {}
            for i, t in data.items():
                ref = node.inputs[i]
                if t.shape.rank == len(degrees):
                    out[i] = self._redistribute(ref, t, degrees, copies)
                else:
                    d0 = math.gcd(t.shape.sizes[0], degrees[0]) if t.shape.rank else 1
                    own = [1] * t.shape.rank
                    if own:
                        own[0] = d0
                    out[i] = self._redistribute(ref, t, own, shards // max(1, math.prod(own)))
            return out

        return make


def check_strategies(pcg: PCG, machine: Machine, strategies: Mapping[str, MatmulStrategy]) -> None:
    """Raises :class:`~pcgopt.extract.strategies.baselines.BaselineError`, naming the node, unless
    every key of ``strategies`` is a dense layer of ``pcg`` given a :class:`MatmulStrategy` that
    fits ``machine``."""
    layers = set(dense_layers(pcg))
    for name, strategy in strategies.items():
        if name not in layers:
            raise BaselineError(
                f"node {name!r} is not a dense layer (a MatMul/Linear by a rank-2 weight); "
                f"dense layers: {sorted(layers)[:8]}",
                node=name,
            )
        if not isinstance(strategy, MatmulStrategy):
            raise BaselineError(
                f"node {name!r}: strategy must be a MatmulStrategy, got {strategy!r}", node=name
            )
        if strategy.devices > machine.num_devices:
            raise BaselineError(
                f"node {name!r}: {strategy!r} needs {strategy.devices} devices, machine "
                f"{machine.name!r} has {machine.num_devices}",
                node=name,
            )


def lower(
    pcg: PCG,
    machine: Machine,
    strategies: Mapping[str, MatmulStrategy],
    *,
    input_degree: int | None = None,
) -> PCG:
    """The parallel PCG of ``strategies`` (dense layer name -> :class:`MatmulStrategy`; layers
    left out follow their inputs' layouts). Data inputs are split by batch ``input_degree`` ways
    (default: the largest divisor of the batch up to the machine's devices)."""
    _check_sequential(pcg)
    check_strategies(pcg, machine, strategies)
    if input_degree is None:
        input_degree = largest_divisor(batch_size(pcg), machine.num_devices)
    return _LayerwiseLowering(pcg, strategies, input_degree).lowered()


# ----------------------------------------------------------------------------------------------
# searches
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerwiseResult:
    """The best assignment a search found: its ``pcg``, ``strategies`` per dense layer and
    ``cost``; ``evaluations`` (distinct assignments costed), ``seconds`` of search, and
    ``history``, the best time that fits memory after each evaluation (inf before one does;
    for convergence plots; the depth proxy's times where it stood in). ``proxy_error``: the
    depth proxy's relative error on the first assignment (module docstring, "Repeated
    layers"), None if the search had none; ``proxy_used``: whether the search used it (the
    error was at most :data:`PROXY_TOLERANCE`, and within ``time_limit_s`` it made more
    evaluations than costing each on the whole model)."""

    pcg: PCG
    strategies: Mapping[str, MatmulStrategy]
    cost: CostBreakdown
    evaluations: int
    seconds: float
    method: str
    history: tuple[float, ...] = field(default=(), repr=False)
    proxy_error: float | None = None
    proxy_used: bool = False

    def __repr__(self) -> str:
        return (
            f"LayerwiseResult({self.method}: {self.cost.total_s * 1e3:.3f} ms, "
            f"{len(self.strategies)} layers, {self.evaluations} evaluations, "
            f"{self.seconds:.2f} s)"
        )

    def describe(self) -> str:
        """One line per dense layer: its strategy in SBP notation."""
        return "\n".join(f"{name}: {s!r}" for name, s in self.strategies.items())


def _layer_options(
    pcg: PCG,
    name: str,
    machine: Machine,
    devices: int | None,
    allow: Callable[[MatmulStrategy], bool] | None,
) -> tuple[MatmulStrategy, ...]:
    """The strategies a layer may take: those on all ``devices`` (default: the machine's) or,
    where none divides its sizes (a batch of 256 on 12 GPUs), those on the most devices that
    have one, the others idle while it runs."""
    p = machine.num_devices if devices is None else devices
    # The device counts a strategy can use: products of divisors of the batch, the columns and
    # the contraction, at most p (not every count below p: a loop over those is O(p^2)).
    node = pcg.node(name)
    (k, n), batch = pcg.shape(node.inputs[1]).sizes, pcg.shape(node.inputs[0]).sizes[0]
    counts: set[int] = set()
    for a in divisors(batch, p):
        for b in divisors(n, p // a):
            counts.update(a * b * c for c in divisors(k, p // (a * b)))
    for count in sorted(counts, reverse=True):
        found = tuple(
            o
            for o in strategies_for(pcg, name, machine, devices=count)
            if allow is None or allow(o)
        )
        if found:
            return found
    raise BaselineError(
        f"node {name!r}: no SBP matmul strategy on {p} devices or fewer fits device memory",
        node=name,
    )


_INFEASIBLE = (True, math.inf)

#: The depth proxy's largest relative error in time on a search's first assignment; more, and
#: the search costs every assignment on the whole model.
PROXY_TOLERANCE = 0.02

#: How many of the depth proxy's best assignments are costed on the whole model at the end.
PROXY_FINALISTS = 3

#: The depth proxy is used only where its two short models together have at most this fraction
#: of the whole model's nodes (BERT-Large: 0.40 at 24 layers, 0.79 at 12): each evaluation
#: costs both, and the first and the finalists are costed whole as well.
PROXY_MAX_SIZE = 0.75


@dataclass(frozen=True)
class _DepthProxy:
    """A deep model's cost from the model shortened to one and two repeats of its repeated run
    (module docstring, "Repeated layers"); ``layers``: each short model's dense layers."""

    run: RepeatedRun
    short: tuple[PCG, PCG]
    layers: tuple[tuple[str, ...], tuple[str, ...]]

    @classmethod
    def of(
        cls, pcg: PCG, layers: Sequence[str], groups: Sequence[Sequence[int]]
    ) -> _DepthProxy | None:
        """The proxy of ``pcg`` for a search over ``layers`` tied in ``groups``, or None where
        it saves too little (:data:`PROXY_MAX_SIZE`) or cannot stand for every group (a role
        only the dropped repeats have, or a layer tied to another role than its counterpart
        in the first repeat)."""
        run = repeated_run(pcg)
        if run is None or run.length < 3:
            return None
        short = (run.shortened(1), run.shortened(2))
        if len(short[0].nodes) + len(short[1].nodes) > PROXY_MAX_SIZE * len(pcg.nodes):
            return None
        names = (dense_layers(short[0]), dense_layers(short[1]))
        index = {name: i for i, name in enumerate(layers)}
        if any(n not in index for n in (*names[0], *names[1])):
            return None
        # Every repeat's layer must share its strategy with its counterpart in the first
        # repeat (tied by role), or the repeats dropped would not cost what the kept ones do.
        # (Then every group has a layer in the shortest model: the layers outside the run and
        # the first repeat's are there.)
        group_of = {j: g for g, members in enumerate(groups) for j in members}
        for name, twin in run.counterparts.items():
            if name in index and group_of[index[name]] != group_of.get(index.get(twin, -1)):
                return None
        return cls(run, short, names)

    def estimate(
        self,
        machine: Machine,
        strategies: Mapping[str, MatmulStrategy],
        optimizer: str,
        runtime: Runtime,
    ) -> _Estimate:
        """The whole model's time and memory per device under ``strategies``, extrapolated from
        the short models', with the micro-batch count :func:`accumulate_to_fit` would choose on
        the extrapolated memory."""
        plans = [
            lower(short, machine, {n: strategies[n] for n in names})
            for short, names in zip(self.short, self.layers, strict=True)
        ]
        more = self.run.length - 1

        def at(m: int) -> _Estimate | None:
            try:
                one, two = (
                    iteration_cost(
                        plan, machine, optimizer=optimizer, runtime=runtime, micro_batches=m
                    )
                    for plan in plans
                )
            except CostError:
                return None  # m does not divide some layout's batch blocks
            pairs = zip(astuple(one.memory), astuple(two.memory), strict=True)
            parts = [a + more * (b - a) for a, b in pairs]
            seconds = one.total_s + more * (two.total_s - one.total_s)
            return _Estimate(seconds, MemoryBreakdown(*parts), one.memory_capacity)

        first = at(1)
        if first is None:
            raise CostError("the short models cannot be costed in one batch")
        return fewest_micro_batches(first, micro_batch_counts(plans[0]), at)


@dataclass(frozen=True)
class _Estimate:
    """The depth proxy's extrapolated time and memory per device."""

    total_s: float
    memory: MemoryBreakdown
    memory_capacity: int

    @property
    def feasible(self) -> bool:
        return self.memory.total <= self.memory_capacity

    @property
    def key(self) -> tuple[bool, float]:
        return (False, self.total_s) if self.feasible else (True, float(self.memory.total))


#: With more dense layers than this, the searches tie layers of one role by default (a sweep
#: over every layer of a deep model costs minutes; the roles of a Transformer are a handful).
TIE_ABOVE = 16


class _Search:
    """Shared state of the searches: candidate strategies per layer and a cost cache."""

    def __init__(
        self,
        pcg: PCG,
        machine: Machine,
        optimizer: str,
        runtime: Runtime,
        layers: Sequence[str] | None,
        devices: int | None,
        tie: bool | None,
        allow: Callable[[MatmulStrategy], bool] | None = None,
        depth_proxy: bool = True,
    ) -> None:
        _check_sequential(pcg)
        self.pcg, self.machine, self.optimizer = pcg, machine, optimizer
        self.runtime = runtime
        found = dense_layers(pcg)
        self.layers = tuple(found if layers is None else layers)
        for name in self.layers:
            if name not in found:
                raise BaselineError(
                    f"node {name!r} is not a dense layer (a MatMul/Linear by a rank-2 weight)",
                    node=name,
                )
        if not self.layers:
            raise BaselineError("the PCG has no dense layer (MatMul/Linear by a rank-2 weight)")
        self.options = {
            name: _layer_options(pcg, name, machine, devices, allow) for name in self.layers
        }
        if tie is None:
            tie = len(self.layers) > TIE_ABOVE
        # The coordinates: one per layer, or one per role (layers with the same name but for
        # their numbers and the same weight shape share a strategy).
        by_role: dict[tuple[str, tuple[int, ...]], list[int]] = {}
        for i, name in enumerate(self.layers):
            role = (re.sub(r"\d+", "#", name), pcg.shape(pcg.node(name).inputs[1]).sizes)
            by_role.setdefault(role if tie else (name, ()), []).append(i)
        self.groups = tuple(tuple(members) for members in by_role.values())
        self.group_options = []
        for members in self.groups:
            common = [
                o
                for o in self.options[self.layers[members[0]]]
                if all(o in self.options[self.layers[j]] for j in members)
            ]
            if not common:
                raise BaselineError(
                    f"layers {[self.layers[j] for j in members]} share no strategy; "
                    "search them with tie=False",
                    node=self.layers[members[0]],
                )
            self.group_options.append(tuple(common))
        # The search's keys (the depth proxy's where it stands in) and the whole model's.
        self.cache: dict[tuple[MatmulStrategy, ...], tuple[bool, float]] = {}
        self.exact: dict[tuple[MatmulStrategy, ...], tuple[tuple[bool, float], Any]] = {}
        self.exact_seconds = 0.0  # the longest whole-model evaluation
        self.proxy = (
            _DepthProxy.of(pcg, self.layers, self.groups)
            if depth_proxy and tie and layers is None
            else None
        )
        self.proxy_error: float | None = None
        self.time_limit_s: float | None = None  # the search's, for the proxy's pay-off
        self.history: list[float] = []
        self.best_s = math.inf
        self.start = time.perf_counter()
        self.max_evaluations: int | None = None  # a limit that does not depend on speed

    def evaluate(self, assignment: tuple[MatmulStrategy, ...]) -> tuple[bool, float]:
        hit = self.cache.get(assignment)
        if hit is not None:
            return hit
        key = self._estimated(assignment) if self.proxy is not None else None
        if key is None:
            key = self._exact(assignment)
        self.cache[assignment] = key
        if not key[0]:
            self.best_s = min(self.best_s, key[1])
        self.history.append(self.best_s)
        return key

    def _exact(self, assignment: tuple[MatmulStrategy, ...]) -> tuple[bool, float]:
        """``assignment``'s key from the whole model's lowering and cost."""
        hit = self.exact.get(assignment)
        if hit is not None:
            return hit[0]
        began = time.perf_counter()
        try:
            plan = lower(self.pcg, self.machine, dict(zip(self.layers, assignment, strict=True)))
            cost = accumulate_to_fit(
                plan, self.machine, optimizer=self.optimizer, runtime=self.runtime
            )
            # Plans that fit rank by time; those that do not, by memory, so that a search
            # starting out of memory moves towards fitting.
            key = (False, cost.total_s) if cost.feasible else (True, float(cost.memory.total))
            value: Any = (plan, cost)
        except (PCGError, CostError):
            key, value = _INFEASIBLE, None
        self.exact[assignment] = (key, value)
        self.exact_seconds = max(self.exact_seconds, time.perf_counter() - began)
        return key

    def _estimated(self, assignment: tuple[MatmulStrategy, ...]) -> tuple[bool, float] | None:
        """``assignment``'s key from the depth proxy (None: cost it on the whole model). The
        first assignment it can cost is costed both ways, and the proxy is dropped if they
        disagree."""
        assert self.proxy is not None
        began = time.perf_counter()
        strategies = dict(zip(self.layers, assignment, strict=True))
        try:
            found = self.proxy.estimate(self.machine, strategies, self.optimizer, self.runtime).key
        except (PCGError, CostError):
            return None
        if self.proxy_error is not None:
            return found
        short_s = time.perf_counter() - began
        key = self._exact(assignment)
        comparable = found[0] == key[0] and 0 < key[1] < math.inf
        self.proxy_error = abs(found[1] - key[1]) / key[1] if comparable else math.inf
        if self.proxy_error > PROXY_TOLERANCE or not self._proxy_pays(short_s):
            self.proxy = None
        return key

    def _proxy_pays(self, short_s: float) -> bool:
        """Whether, in the time left, the depth proxy (evaluations of ``short_s``, then the
        finalists costed whole) makes more evaluations than costing each on the whole model."""
        if self.time_limit_s is None or math.isinf(self.time_limit_s):
            return True
        left = self.time_limit_s - (time.perf_counter() - self.start)
        whole_s = self.exact_seconds
        return (left - PROXY_FINALISTS * whole_s) / max(short_s, 1e-9) > left / whole_s

    def result(self, method: str) -> LayerwiseResult:
        if self.proxy is not None:
            ranked = sorted((k, a) for a, k in self.cache.items() if a not in self.exact)
            for key, assignment in ranked[:PROXY_FINALISTS]:
                if key != _INFEASIBLE:
                    self._exact(assignment)
        assignment, (_, value) = min(self.exact.items(), key=lambda kv: kv[1][0])
        if value is None:
            raise BaselineError(
                f"{method}: no assignment of strategies could be lowered and costed "
                f"({len(self.cache)} tried)"
            )
        return LayerwiseResult(
            pcg=value[0],
            strategies=dict(zip(self.layers, assignment, strict=True)),
            cost=value[1],
            evaluations=len(self.cache),
            seconds=time.perf_counter() - self.start,
            method=method,
            history=tuple(self.history),
            proxy_error=self.proxy_error,
            proxy_used=self.proxy is not None,
        )

    def per_group(
        self, choose: Callable[[int, tuple[MatmulStrategy, ...]], MatmulStrategy]
    ) -> tuple[MatmulStrategy, ...]:
        """The assignment giving every layer of group ``g`` ``choose(g, its options)``."""
        out: list[MatmulStrategy | None] = [None] * len(self.layers)
        for g, (members, options) in enumerate(zip(self.groups, self.group_options, strict=True)):
            choice = choose(g, options)
            for j in members:
                out[j] = choice
        return tuple(out)  # type: ignore[arg-type]

    def data_parallel_start(self) -> tuple[MatmulStrategy, ...]:
        """Every layer as data parallel as its options allow (most batch splitting)."""
        return self.per_group(
            lambda _, options: max(options, key=lambda s: (s.batch, -s.contraction))
        )

    def uniform_start(self, time_limit_s: float | None = None) -> tuple[MatmulStrategy, ...]:
        """The best assignment giving every layer the same strategy (a layer that cannot take
        it keeps its data-parallel one): one evaluation per strategy, a strong first start
        (the data-parallel one, then as many others as ``time_limit_s`` allows)."""
        fallback = self.data_parallel_start()
        best, best_key = fallback, self.evaluate(fallback)
        # Most promising first, for when time runs out: the most even split of the three
        # matmul dimensions first (AutoDDL section 4.3: splits of about p^(1/3) each give the
        # 3D algorithms' asymptotically optimal communication and memory), then more batch
        # splitting, then fewer partial sums. Where the pass completes the order changes
        # nothing; where it is cut short (deep models on many devices) the balanced ones are
        # the ones worth having tried: BERT-Large on 64 A100s is fastest at batch 8, columns 2,
        # contraction 4, 15th of 28 in the order this replaced (no partial sums first).
        uniform = sorted(
            {o for options in self.group_options for o in options},
            key=lambda o: (
                max(o.batch, o.columns, o.contraction) / min(o.batch, o.columns, o.contraction),
                -o.batch,
                o.contraction,
            ),
        )
        for option in uniform:
            if self.over(time_limit_s):
                break
            trial = self.per_group(
                lambda g, options, o=option: o if o in options else fallback[self.groups[g][0]]
            )
            key = self.evaluate(trial)
            if key < best_key:
                best, best_key = trial, key
        return best

    def assignment(self, strategies: Mapping[str, MatmulStrategy]) -> tuple[MatmulStrategy, ...]:
        """``strategies`` as an assignment of this search (every layer named, one strategy per
        tied group)."""
        out = []
        for name in self.layers:
            if name not in strategies:
                raise BaselineError(f"start names no strategy for dense layer {name!r}", node=name)
            out.append(strategies[name])
        for members in self.groups:
            if len({out[j] for j in members}) > 1:
                raise BaselineError(
                    f"start gives tied layers {[self.layers[j] for j in members]} different "
                    "strategies; pass tie=False"
                )
        return tuple(out)

    def over(self, time_limit_s: float | None) -> bool:
        """Whether the search is out of time or of evaluations (:attr:`max_evaluations`). With
        the depth proxy, the time its finalists take on the whole model is kept back."""
        if self.max_evaluations is not None and len(self.cache) >= self.max_evaluations:
            return True
        if time_limit_s is None:
            return False
        if self.proxy is not None:
            time_limit_s -= PROXY_FINALISTS * self.exact_seconds
        return time.perf_counter() - self.start > time_limit_s

    def random_start(self, rng: random.Random) -> tuple[MatmulStrategy, ...]:
        return self.per_group(lambda _, options: rng.choice(options))

    def with_group(
        self, current: Sequence[MatmulStrategy], g: int, option: MatmulStrategy
    ) -> tuple[MatmulStrategy, ...]:
        """``current`` with group ``g`` set to ``option``."""
        return self.per_group(lambda h, _: option if h == g else current[self.groups[h][0]])


def coordinate_descent(
    pcg: PCG,
    machine: Machine,
    *,
    restarts: int = 4,
    seed: int = 0,
    max_sweeps: int = 20,
    layers: Sequence[str] | None = None,
    devices: int | None = None,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    time_limit_s: float | None = None,
    tie: bool | None = None,
    allow: Callable[[MatmulStrategy], bool] | None = None,
    max_evaluations: int | None = None,
    depth_proxy: bool = True,
) -> LayerwiseResult:
    """AutoDDL's coordinate descent (section 4.4) over per-layer SBP matmul strategies: from
    each start (the first the best uniform assignment, :meth:`uniform_start`, then random ones
    from ``seed``), every layer in turn
    takes the strategy that minimizes the iteration cost with the others fixed, until a sweep
    changes nothing (or ``max_sweeps``); the best assignment over all ``restarts`` starts is
    returned. ``time_limit_s`` is checked before every evaluation but the first (the
    data-parallel start), so it is exceeded by at most one evaluation; ``max_evaluations``
    likewise, a limit that gives the same result however fast the machine is. ``runtime``: what
    the cost model simulates (:class:`~pcgopt.extract.costmodel.simulate.Runtime`).
    ``tie=True`` makes layers of one role (the same name up to numbers, e.g. ``layer3/ffn1``
    and ``layer5/ffn1``, with the same weight shape) share a strategy: one coordinate per role
    instead of per layer, for deep models; the default (None) ties when there are more than
    :data:`TIE_ABOVE` dense layers. ``allow``: keeps only the strategies it accepts
    (e.g. ``lambda s: s.batch == 1``). ``depth_proxy``: with tied layers, cost a deep model's
    assignments on it shortened to one and two repeats of its layers (module docstring,
    "Repeated layers"); False costs every one on the whole model."""
    if not isinstance(restarts, int) or restarts < 1:
        raise BaselineError(f"restarts must be a positive integer, got {restarts!r}")
    search = _Search(pcg, machine, optimizer, runtime, layers, devices, tie, allow, depth_proxy)
    search.max_evaluations, search.time_limit_s = max_evaluations, time_limit_s
    rng = random.Random(seed)
    for k in range(restarts):
        if k and search.over(time_limit_s):
            break
        start = search.uniform_start(time_limit_s) if k == 0 else search.random_start(rng)
        current = list(start)
        key = search.evaluate(tuple(current))
        for _ in range(max_sweeps):
            changed = False
            for g, options in enumerate(search.group_options):
                if search.over(time_limit_s):
                    break
                for option in options:
                    if option == current[search.groups[g][0]] or search.over(time_limit_s):
                        continue
                    trial = search.with_group(current, g, option)
                    trial_key = search.evaluate(trial)
                    if trial_key < key:
                        current, key, changed = list(trial), trial_key, True
            if not changed or search.over(time_limit_s):
                break
    return search.result("coordinate descent")


def metropolis_hastings(
    pcg: PCG,
    machine: Machine,
    *,
    steps: int = 500,
    beta: float | None = None,
    seed: int = 0,
    layers: Sequence[str] | None = None,
    devices: int | None = None,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    time_limit_s: float | None = None,
    tie: bool | None = None,
    allow: Callable[[MatmulStrategy], bool] | None = None,
    start: Mapping[str, MatmulStrategy] | None = None,
    depth_proxy: bool = True,
) -> LayerwiseResult:
    """Metropolis-Hastings over per-layer strategies (AutoDDL section 4.4, FlexFlow's MCMC):
    from the data-parallel start, ``steps`` proposals each change one random layer to a random
    other strategy, accepted with probability ``min(1, exp(-beta * (new - old)))`` (times in
    seconds; an assignment that does not fit memory is never accepted from one that does, and
    among ones that do not fit only a move to less memory is accepted). Default ``beta``:
    ``100 /`` the first fitting cost, so a proposal 1% slower is accepted with probability 1/e.
    ``tie``, ``allow``, ``depth_proxy``: as for :func:`coordinate_descent`; ``start``: the
    assignment to start from (default: data parallel), e.g. a coordinate-descent result's
    ``strategies``."""
    search = _Search(pcg, machine, optimizer, runtime, layers, devices, tie, allow, depth_proxy)
    search.time_limit_s = time_limit_s
    rng = random.Random(seed)
    current = search.data_parallel_start()
    if start is not None:
        current = search.assignment(start)
    key = search.evaluate(current)
    choices = [g for g, options in enumerate(search.group_options) if len(options) > 1]
    for _ in range(steps if choices else 0):
        if search.over(time_limit_s):
            break
        g = rng.choice(choices)
        now = current[search.groups[g][0]]
        option = rng.choice([o for o in search.group_options[g] if o != now])
        trial = search.with_group(current, g, option)
        trial_key = search.evaluate(trial)
        if trial_key[0] != key[0]:
            accept = trial_key[0] < key[0]
        elif trial_key[1] <= key[1]:
            accept = True
        elif trial_key[0]:
            accept = False  # out of memory: only less memory is a move
        else:
            if beta is None:
                beta = 100.0 / key[1] if key[1] > 0 else 1.0
            accept = rng.random() < math.exp(-beta * (trial_key[1] - key[1]))
        if accept:
            current, key = trial, trial_key
    return search.result("metropolis-hastings")


def uniform_strategy(
    pcg: PCG,
    machine: Machine,
    strategy: MatmulStrategy,
    *,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
) -> tuple[PCG, CostBreakdown]:
    """Every dense layer with the same ``strategy``; its plan and cost (with gradient
    accumulation when it does not fit otherwise)."""
    plan = lower(pcg, machine, dict.fromkeys(dense_layers(pcg), strategy))
    return plan, accumulate_to_fit(plan, machine, optimizer=optimizer, runtime=runtime)


def summa_like(
    pcg: PCG, machine: Machine, *, optimizer: str = "adam", runtime: Runtime = DDP
) -> tuple[PCG, CostBreakdown, MatmulStrategy]:
    """The best uniform 2D weight-stationary strategy ``(1, a, b)``, ``a * b`` = the machine's
    devices, over every grid that divides every dense layer (AutoDDL's tuned Summa baseline's
    layouts; see the module docstring): plan, cost and the grid's strategy."""
    p = machine.num_devices
    grids = [MatmulStrategy(1, a, p // a) for a in divisors(p)]
    best: tuple[PCG, CostBreakdown, MatmulStrategy] | None = None
    errors: list[str] = []
    for grid in grids:
        try:
            plan, cost = uniform_strategy(pcg, machine, grid, optimizer=optimizer, runtime=runtime)
        except (PCGError, CostError) as e:
            errors.append(f"{grid}: {e}")
            continue
        if best is None or (not cost.feasible, cost.total_s) < (
            not best[1].feasible,
            best[1].total_s,
        ):
            best = (plan, cost, grid)
    if best is None:
        raise BaselineError(f"no 2D grid applies to every dense layer: {'; '.join(errors[:3])}")
    return best
