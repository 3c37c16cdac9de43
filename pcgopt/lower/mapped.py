"""Plans whose branches run at once on disjoint devices, run on those devices.

The machine mapping (:func:`pcgopt.extract.search.mapping.map_machine`, Unity section 5.2) runs
independent branches of a plan at once on disjoint blocks of devices (DLRM's embedding tables
on one GPU each, Inception's towers side by side). One SPMD program runs every node on every
device of its mesh, so :func:`pcgopt.lower.jax.lower` alone would run such branches one after
the other on all devices. :func:`lower_mapped` runs them as mapped, with **sub-meshes**:

* **Pieces.** The mapping's units, in schedule order (a topological order of the units,
  earliest start first), are grouped into pieces: a unit joins the last piece on its block of
  devices if all it reads from other pieces is computed before that piece starts (so a piece
  waits for no input its first unit did not), else it starts a piece. Each piece is a PCG of
  its own (its nodes; the sources it reads; every tensor it reads from another piece as an
  input of that piece, split and copied as the plan holds it) lowered by
  :func:`~pcgopt.lower.jax.lower` to a ``shard_map`` program on a mesh of its block's
  devices, on the plan's device groups shifted to the block.
* **Running.** A training step calls the pieces' forward programs in order, each a compiled
  ``jax.vjp``; a tensor handed from one piece to another is put on the reader's mesh
  (``jax.device_put``: the mapping's transfer). JAX dispatches asynchronously, so pieces on
  disjoint devices whose inputs are ready run at once. The backward runs the pieces'
  ``vjp``\\ s in reverse, the cotangent of a tensor handed on going back to its producer's
  devices, summed over its readers; a weight's gradient is summed over the pieces that read
  it. The loss is the mean of the model's output, as in :mod:`pcgopt.lower.jax`; the
  optimizer update runs on each weight's devices (those of the first piece that reads it).
* **Collectives.** Each piece's compiled collectives are compared with the cost model's for
  its nodes (:meth:`MappedLowered.collectives`); the transfers between pieces are copies, not
  collectives.

A tensor handed on as partial sums arrives summed, and the reader holds it as the first of
its partial sums (zeros as the others): the same sum, with the bytes of the whole tensor moved.
Not supported, with a :class:`~pcgopt.lower.jax.LoweringError` that says so: gradient
accumulation (the micro-batch loop of a mapped plan). :func:`pcgopt.lower.jax.lower` then runs
the plan as one SPMD program on all devices and says why in
:attr:`Lowered.note <pcgopt.lower.jax.Lowered.note>`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import networkx as nx
import numpy as np

from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.lower.collectives import CollectiveComparison
from pcgopt.lower.jax import (
    DEFAULT_LEARNING_RATE,
    Lowered,
    LoweringError,
    TrainState,
    _dtype,
    _loss_terms,
    _program_on,
    check_sources,
    jax,
    jnp,
    optimizer_transform,
    random_sources,
    zero_stage_of,
)
from pcgopt.lower.placement import DeviceOrder, GroupCheck
from pcgopt.ops import OpKind

__all__ = ["MappedLowered", "Piece", "concurrent_blocks", "lower_mapped"]


@dataclass(frozen=True, eq=False)
class Piece:
    """Consecutive units of the mapping on one block of devices, as a program of its own.

    ``devices``: the block (device numbers of the plan); ``nodes``: the plan's nodes it runs;
    ``lowered``: its PCG's program on the block's devices; ``handed``: for each input of
    its PCG that another piece computes, that tensor of the plan; ``outputs``: the plan's
    tensors it computes that other pieces read or that are the model's outputs."""

    index: int
    devices: tuple[int, ...]
    nodes: tuple[str, ...]
    lowered: Lowered
    handed: Mapping[str, TensorRef]
    outputs: tuple[TensorRef, ...]
    start_s: float = 0.0

    def __repr__(self) -> str:
        return (
            f"Piece({self.index}: {len(self.nodes)} nodes on devices "
            f"{self.devices[0]}..{self.devices[-1]}, {len(self.handed)} tensors in, "
            f"{len(self.outputs)} out)"
        )


def concurrent_blocks(plan: Any) -> bool:
    """Whether a Plan's machine mapping runs units at once on disjoint devices."""
    mapping = getattr(plan, "machine_mapping", None)
    if mapping is None:
        return False
    timed = [u for u in mapping.units if u.end_s > u.start_s]
    for i, a in enumerate(timed):
        for b in timed[i + 1 :]:
            disjoint = (
                a.block.start + a.block.size <= b.block.start
                or b.block.start + b.block.size <= a.block.start
            )
            if disjoint and a.start_s < b.end_s and b.start_s < a.end_s:
                return True
    return False


# --- Pieces --------------------------------------------------------------------------------------


def _pieces_of(plan: Any) -> list[tuple[tuple[int, int], list[str], float]]:
    """(block as (start, size), node names in the plan's order, start time) of every piece."""
    pcg: PCG = plan.pcg
    mapping = plan.machine_mapping
    unit_of: dict[str, int] = {}
    for k, unit in enumerate(mapping.units):
        for name in unit.nodes:
            unit_of[name] = k
    unknown = sorted(set(unit_of) - {n.name for n in pcg.nodes})
    if unknown:
        raise LoweringError(
            f"the plan's machine mapping names nodes the plan does not have "
            f"({', '.join(unknown[:3])}): it is not this plan's mapping",
            node=unknown[0],
        )
    uncovered = [n.name for n in pcg.nodes if n.name not in unit_of]
    if uncovered:
        raise LoweringError(
            f"the plan's machine mapping leaves {len(uncovered)} nodes out "
            f"({', '.join(uncovered[:3])}): it is not this plan's mapping",
            node=uncovered[0],
        )
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(mapping.units)))
    for node in pcg.nodes:
        for ref in node.inputs:
            a, b = unit_of[ref.node], unit_of[node.name]
            if a != b:
                graph.add_edge(a, b)
    units = mapping.units
    order = list(nx.lexicographical_topological_sort(graph, key=lambda k: (units[k].start_s, k)))
    # A unit joins the last piece on its block when everything it reads from other blocks is
    # already computed before that piece starts; else it starts a piece. A piece then never
    # waits for more than its first unit did, and pieces stay in a topological order.
    pieces: list[tuple[tuple[int, int], list[int], float]] = []
    ancestors: list[set[int]] = []
    last_on: dict[tuple[int, int], int] = {}
    piece_of: dict[int, int] = {}
    for k in order:
        block = (units[k].block.start, units[k].block.size)
        reads = {piece_of[u] for u in graph.predecessors(k)}
        last = last_on.get(block)
        if last is not None and reads <= {last} | ancestors[last]:
            pieces[last][1].append(k)
            piece_of[k] = last
            continue
        piece_of[k] = last_on[block] = len(pieces)
        pieces.append((block, [k], units[k].start_s))
        ancestors.append(set(reads).union(*(ancestors[q] for q in reads)))
    position = {n.name: i for i, n in enumerate(pcg.nodes)}
    out = []
    for block, ks, start in pieces:
        names = sorted((n for k in ks for n in units[k].nodes), key=position.__getitem__)
        computed = [n for n in names if pcg.node(n).spec.kind is not OpKind.SOURCE]
        if computed:
            out.append((block, computed, start))
    return out


def _handed_name(ref: TensorRef) -> str:
    return ref.node if ref.index == 0 else f"{ref.node}.out{ref.index}"


def _piece_pcg(
    pcg: PCG, names: Sequence[str], needed: set[TensorRef]
) -> tuple[PCG, dict[str, TensorRef], tuple[TensorRef, ...]]:
    """A piece's own PCG: its nodes, the sources they read, and every tensor another piece
    computes as an input split and copied as the plan holds it."""
    members = set(names)
    nodes: list[Node] = []
    handed: dict[str, TensorRef] = {}
    renamed: dict[TensorRef, TensorRef] = {}
    sources: set[str] = set()
    for name in names:
        node = pcg.node(name)
        for ref in node.inputs:
            if ref.node in members or ref in renamed:
                continue
            producer = pcg.node(ref.node)
            if producer.spec.kind is OpKind.SOURCE:
                if ref.node not in sources:
                    sources.add(ref.node)
                    nodes.append(producer)
                continue
            renamed[ref] = _handed_input(pcg, ref, nodes, handed)
        nodes.append(
            Node(node.name, node.op, tuple(renamed.get(r, r) for r in node.inputs), node.params)
        )
    outputs = tuple(
        TensorRef(n, i)
        for n in names
        for i in range(len(pcg.output_shapes(n)))
        if TensorRef(n, i) in needed
    )
    return PCG(nodes, outputs), handed, outputs


def _handed_input(
    pcg: PCG, ref: TensorRef, nodes: list[Node], handed: dict[str, TensorRef]
) -> TensorRef:
    shape = pcg.shape(ref)
    name = _handed_name(ref)
    params: dict[str, Any] = {"shape": shape.sizes, "dtype": shape.dtype.value}
    if shape.dtype.is_integer:
        params["max_value"] = 2**31 - 1  # only bounds random test values
    nodes.append(Node(name, "input", (), params))
    handed[name] = ref
    last = TensorRef(name)
    for d, dim in enumerate(shape.dims):
        if dim.degree > 1:
            split = f"{name}.split{d}"
            nodes.append(Node(split, "partition", (last,), {"dim": d, "degree": dim.degree}))
            last = TensorRef(split)
    # Partial sums arrive summed (the producer's program hands on the tensor's value): the
    # reader's piece holds the value as the first of its partial sums, zeros as the others.
    if shape.copy_degree * shape.sum_degree > 1:
        copies = f"{name}.copies"
        degree = shape.copy_degree * shape.sum_degree
        nodes.append(Node(copies, "replicate", (last,), {"degree": degree}))
        last = TensorRef(copies)
    if shape.sum_degree > 1:
        partial = f"{name}.partial"
        nodes.append(Node(partial, "to_partial", (last,), {"degree": shape.sum_degree}))
        last = TensorRef(partial)
    return last


# --- The program ---------------------------------------------------------------------------------


@dataclass(eq=False)
class MappedLowered:
    """A plan whose branches run at once on disjoint devices, as programs on sub-meshes
    (module docstring). The same calls as :class:`~pcgopt.lower.jax.Lowered`."""

    pcg: PCG
    pieces: tuple[Piece, ...]
    devices: tuple[Any, ...]
    optimizer: str
    learning_rate: float
    plan: Any = None
    micro_batches: int = 1
    #: Plan nodes whose device groups leave their piece's block, with why.
    outside: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    _compiled: dict[int, tuple[Any, Any]] = field(default_factory=dict, repr=False)
    _updates: dict[str, Any] = field(default_factory=dict, repr=False)
    #: A model output a piece computes under another name (a pipeline stage's plan returns
    #: it through its layout's last operator): the model's tensor -> the piece's.
    aliases: Mapping[TensorRef, TensorRef] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return (
            f"MappedLowered({len(self.pcg.nodes)} nodes in {len(self.pieces)} pieces on "
            f"{len(self.devices)} devices; {self.optimizer})"
        )

    @property
    def note(self) -> str:
        """What this run does differently from the plan's cost: a plan costed under ZeRO
        runs its pieces with their optimizer state whole (the same numbers, DDP's memory)."""
        stage = zero_stage_of(self.plan)
        if not stage:
            return ""
        return (
            f"the plan was costed with ZeRO-{stage}; its branches run as programs on sub-meshes, "
            "which keep every weight's optimizer state whole (the same training, not ZeRO's "
            "memory)"
        )

    @property
    def mesh(self) -> Any:
        """All the devices the pieces run on, as one flat mesh (for its size and platform)."""
        return jax.sharding.Mesh(np.array(self.devices, dtype=object), ("device",))

    @property
    def weight_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.pcg.weights if n.params["trainable"])

    @property
    def input_names(self) -> tuple[str, ...]:
        trained = set(self.weight_names)
        return tuple(
            n.name for n in self.pcg.nodes if n.spec.kind is OpKind.SOURCE and n.name not in trained
        )

    @cached_property
    def placement(self) -> DeviceOrder:
        """Every piece's nodes' groups, merged, in the plan's device numbers (``order``: the
        devices the pieces use; each piece's mesh has its own order)."""
        honoured, unmet, planned, silent = [], {}, {}, []
        order: set[int] = set()
        for piece in self.pieces:
            p = piece.lowered.placement
            assert p is not None
            mine = set(piece.nodes)
            honoured += [n for n in p.honoured if n in mine]
            unmet.update({k: v for k, v in p.unmet.items() if k in mine})
            silent += [n for n in p.silent if n in mine]
            shift = piece.devices[0]
            planned.update(
                {
                    k: tuple(tuple(d + shift for d in g) for g in v)
                    for k, v in p.planned.items()
                    if k in mine and v
                }
            )
            order.update(d + shift for d in p.order)
        unmet.update(self.outside)
        return DeviceOrder(tuple(sorted(order)), tuple(honoured), unmet, planned, tuple(silent))

    def random_sources(
        self, seed: int = 0, *, scaled: bool = True
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """As :meth:`pcgopt.lower.jax.Lowered.random_sources`."""
        return random_sources(self.pcg, self.weight_names, self.input_names, seed, scaled)

    # -- running ------------------------------------------------------------------------------

    def _programs(self, piece: Piece) -> tuple[Any, Any]:
        """The piece's compiled forward (returning its outputs and their vjp) and backward."""
        if piece.index not in self._compiled:
            fn = piece.lowered.tensors_fn(piece.outputs)
            forward = jax.jit(lambda d, f: jax.vjp(lambda x: fn({**x, **f}), d))
            backward = jax.jit(lambda vjp, cts: vjp(cts)[0])
            self._compiled[piece.index] = (forward, backward)
        return self._compiled[piece.index]

    def _differentiable(self, piece: Piece) -> list[str]:
        low = piece.lowered
        trained = set(self.weight_names)
        return [
            n
            for n in (*low.input_names, *low.weight_names)
            if (n in trained or n in piece.handed) and not low.pcg.shape(n).dtype.is_integer
        ]

    def _sources(self, piece: Piece, feeds: Mapping[str, Any], values: Mapping) -> dict:
        low = piece.lowered
        out = {}
        for name in (*low.input_names, *low.weight_names):
            value = values[piece.handed[name]] if name in piece.handed else feeds[name]
            dtype = _dtype(low.pcg.shape(name).dtype.value)
            out[name] = jax.device_put(jnp.asarray(value, dtype), low.sharding(name))
        return out

    def _run(self, feeds: Mapping[str, Any], *, backward: bool) -> tuple[Any, dict, dict]:
        values: dict[TensorRef, Any] = {}
        tapes = [self._forward_piece(piece, feeds, values) for piece in self.pieces]
        loss, cotangents, grads = self._loss(feeds, values, backward=backward)
        if backward:
            for piece, vjp in zip(reversed(self.pieces), reversed(tapes), strict=True):
                self._backward_piece(piece, vjp, values, cotangents, grads)
        return loss, values, grads

    def _forward_piece(self, piece: Piece, feeds: Mapping[str, Any], values: dict) -> Any:
        """Runs ``piece`` forward on ``feeds`` and the ``values`` other pieces computed; puts
        its outputs in ``values`` and returns its vjp."""
        forward, _ = self._programs(piece)
        sources = self._sources(piece, feeds, values)
        diff = self._differentiable(piece)
        outs, vjp = forward(
            {k: sources[k] for k in diff}, {k: v for k, v in sources.items() if k not in diff}
        )
        values.update(zip(piece.outputs, outs, strict=True))
        return vjp

    def _loss(
        self, feeds: Mapping[str, Any], values: dict, *, backward: bool
    ) -> tuple[Any, dict[TensorRef, Any], dict[str, Any]]:
        """The loss of the computed ``values``; with ``backward``, its cotangents of the
        outputs (and the gradients of outputs that are weights as given)."""
        for r in self.pcg.outputs:  # a model output that is a source as given
            if self.aliases.get(r, r) not in values:
                values[r] = jnp.asarray(feeds[r.node], _dtype(self.pcg.shape(r).dtype.value))
        terms = [self.aliases.get(r, r) for r in _loss_terms(self.pcg)]
        loss = sum(jnp.mean(values[r].astype(jnp.float32)) for r in terms)
        if not backward:
            return loss, {}, {}
        cotangents: dict[TensorRef, Any] = {}
        for r in terms:  # the loss sums the mean of every output, once per mention
            ct = jnp.full(values[r].shape, 1.0 / math.prod(values[r].shape), values[r].dtype)
            cotangents[r] = cotangents[r] + ct if r in cotangents else ct
        grads: dict[str, Any] = {
            r.node: jax.device_put(ct, self._sharding(r.node))
            for r, ct in cotangents.items()
            if r.node in self.weight_names
        }
        return loss, cotangents, grads

    def _backward_piece(
        self, piece: Piece, vjp: Any, values: dict, cotangents: dict, grads: dict
    ) -> None:
        """Runs ``piece`` backward from the ``cotangents`` of its outputs: adds the gradients
        of its weights to ``grads`` and the cotangents of what other pieces handed it to
        ``cotangents``."""
        _, backward_fn = self._programs(piece)
        cts = tuple(
            jax.device_put(cotangents[r], values[r].sharding)
            if r in cotangents
            else jnp.zeros_like(values[r])
            for r in piece.outputs
        )
        got = backward_fn(vjp, cts)
        for name, g in got.items():
            if name in piece.handed:
                ref = piece.handed[name]
                g = jax.device_put(g, values[ref].sharding)
                cotangents[ref] = cotangents[ref] + g if ref in cotangents else g
            else:
                g = jax.device_put(g, self._sharding(name))
                grads[name] = grads[name] + g if name in grads else g

    def _home(self, weight: str) -> Piece | None:
        """The first piece that reads ``weight`` (its optimizer state lives there)."""
        return next((p for p in self.pieces if weight in p.lowered.weight_names), None)

    def _sharding(self, weight: str) -> Any:
        home = self._home(weight)
        if home is None:  # read by no piece: kept on the first device
            return jax.sharding.SingleDeviceSharding(self.devices[0])
        return home.lowered.sharding(weight)

    def forward(self, inputs: Mapping[str, Any], weights: Mapping[str, Any]) -> tuple[Any, ...]:
        """The plan's outputs (logical values) on these inputs and weights."""
        check_sources(self.pcg, inputs, self.input_names, "inputs")
        check_sources(self.pcg, weights, self.weight_names, "weights")
        _, values, _ = self._run({**inputs, **weights}, backward=False)
        return tuple(values[self.aliases.get(r, r)] for r in self.pcg.outputs)

    def loss_and_grads(
        self, inputs: Mapping[str, Any], weights: Mapping[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """The loss and the gradient of every trainable weight, as a training step computes
        them."""
        check_sources(self.pcg, inputs, self.input_names, "inputs")
        check_sources(self.pcg, weights, self.weight_names, "weights")
        loss, _, grads = self._run({**inputs, **weights}, backward=True)
        for name in self.weight_names:  # a weight nothing differentiable reads
            if name not in grads:
                zeros = jnp.zeros(self.pcg.shape(name).sizes, jnp.float32)
                grads[name] = jax.device_put(zeros, self._sharding(name))
        return loss, grads

    def init(self, weights: Mapping[str, Any]) -> TrainState:
        """The training state: the weights on their devices and the optimizer's state."""
        check_sources(self.pcg, weights, self.weight_names, "weights")
        params = {
            name: jax.device_put(jnp.asarray(weights[name], jnp.float32), self._sharding(name))
            for name in self.weight_names
        }
        tx = optimizer_transform(self.optimizer, self.learning_rate)
        # One optimizer state per set of devices: optax compiles its update over the whole
        # tree, which must live on one set of devices.
        opt_state = {
            k: tx.init({w: params[w] for w in names}) for k, names in self._homes().items()
        }
        return TrainState(params, opt_state, 0)

    def _homes(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for name in self.weight_names:
            home = self._home(name)
            out.setdefault(-1 if home is None else home.index, []).append(name)
        return out

    def train_step(self, state: TrainState, inputs: Mapping[str, Any]) -> tuple[TrainState, Any]:
        """One step: the forward and backward through the pieces, then the optimizer's update
        of every weight on its devices."""
        check_sources(self.pcg, inputs, self.input_names, "inputs")
        loss, _, grads = self._run({**inputs, **state.params}, backward=True)
        if "update" not in self._updates:
            tx = optimizer_transform(self.optimizer, self.learning_rate)

            def update(grads: dict, opt_state: Any, params: dict) -> tuple[dict, Any]:
                updates, opt_state = tx.update(grads, opt_state, params)
                return {k: params[k] + updates[k] for k in params}, opt_state

            self._updates["update"] = jax.jit(update)
        update = self._updates["update"]
        params, opt_state = dict(state.params), {}
        for k, names in self._homes().items():
            new, opt_state[k] = update(
                {w: grads[w] for w in names},
                state.opt_state[k],
                {w: state.params[w] for w in names},
            )
            params.update(new)
        return TrainState(params, opt_state, state.step + 1), loss

    # -- reports ------------------------------------------------------------------------------

    def collectives(self) -> CollectiveComparison:
        """Every piece's compiled collectives beside the cost model's for its nodes, merged:
        a piece's are those of its own loss-and-gradients program (the mean of its outputs as
        the loss: the forward and backward the step runs, with the same collectives), against
        the cost model's for the piece's PCG (its nodes' collectives depend on their shapes,
        not on the machine). The transfers between pieces are copies, not collectives; a piece
        with no floating-point output has no gradient program and is left out."""
        parts = [
            p.lowered.collectives()
            for p in self.pieces
            if any(not p.lowered.pcg.shape(r).dtype.is_integer for r in p.outputs)
        ]
        return CollectiveComparison(
            tuple(m for c in parts for m in c.matched),
            tuple(m for c in parts for m in c.missing),
            tuple(m for c in parts for m in c.extra),
            tuple(m for c in parts for m in c.free),
            tuple(m for c in parts for m in c.loss),
        )

    def group_checks(self, comparison: CollectiveComparison | None = None) -> tuple:
        """Every piece's :meth:`~pcgopt.lower.jax.Lowered.group_checks`, in the plan's device
        numbers."""
        del comparison  # each piece compares its own
        out = []
        for piece in self.pieces:
            shift = piece.devices[0]
            for c in piece.lowered.group_checks():
                out.append(
                    GroupCheck(
                        c.node,
                        c.purpose,
                        c.kind,
                        tuple(tuple(d + shift for d in g) for g in c.planned),
                        tuple(tuple(d + shift for d in g) for g in c.compiled),
                    )
                )
        return tuple(out)

    def release(self) -> None:
        self._compiled.clear()
        for piece in self.pieces:
            piece.lowered.release()


def lower_mapped(
    plan: Any,
    devices: Sequence[Any] | None = None,
    *,
    optimizer: str | None = None,
    learning_rate: float = DEFAULT_LEARNING_RATE,
) -> MappedLowered:
    """A Plan whose machine mapping runs branches at once on disjoint devices, as programs on
    sub-meshes of ``devices`` (default: the first of ``jax.devices()``), one a piece (module
    docstring)."""
    pcg: PCG = plan.pcg
    optimizer = optimizer or plan.cost.optimizer
    if plan.cost.micro_batches > 1:
        raise LoweringError(
            "gradient accumulation in a plan whose branches run on disjoint devices is not "
            "supported: lower(plan, concurrent=False) runs it on all devices"
        )
    pieces_of = _pieces_of(plan)
    width = max(start + size for (start, size), _, _ in pieces_of)
    available = list(jax.devices()) if devices is None else list(devices)
    if width > len(available):
        raise LoweringError(
            f"the plan's mapping uses {width} devices and JAX has {len(available)}: on a CPU, "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count={width} before JAX loads"
        )
    piece_of = {n: k for k, (_, names, _) in enumerate(pieces_of) for n in names}
    needed = {r for r in pcg.outputs}
    for node in pcg.nodes:
        for ref in node.inputs:
            if ref.node in piece_of and piece_of.get(node.name) != piece_of[ref.node]:
                needed.add(ref)
    pieces = []
    outside: dict[str, str] = {}
    for k, ((start, size), names, start_s) in enumerate(pieces_of):
        sub, handed, outputs = _piece_pcg(pcg, names, needed)
        block = tuple(range(start, start + size))
        # Only the plan's own nodes are placed: the Partitions and Replicates that bring a
        # handed tensor into its layout, and nodes whose groups leave the block, constrain
        # nothing (empty groups).
        groups: dict[str, Any] = {n.name: () for n in sub.nodes}
        for name in names:
            planned = plan.mapping.get(name)
            if not planned or not all(isinstance(g, (tuple, list)) for g in planned):
                continue
            if all(start <= d < start + size for g in planned for d in g):
                groups[name] = tuple(tuple(d - start for d in g) for g in planned)
            else:
                outside[name] = (
                    f"its groups {list(planned)[:2]} leave its piece's devices "
                    f"{start}..{start + size - 1}"
                )
        lowered = _program_on(
            sub,
            [available[d] for d in block],
            groups,
            optimizer=optimizer,
            learning_rate=learning_rate,
        )
        pieces.append(Piece(k, block, tuple(names), lowered, handed, outputs, start_s))
    return MappedLowered(
        pcg,
        tuple(pieces),
        tuple(available[:width]),
        optimizer,
        learning_rate,
        plan,
        outside=MappingProxyType(outside),
    )
