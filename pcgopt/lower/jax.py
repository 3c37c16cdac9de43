"""Plans that run: a PCG lowered to a JAX ``shard_map`` program and a training step on N devices.

``pip install 'pcgopt[jax]'``. On a machine without accelerators, JAX runs N virtual devices on
the CPU when ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` is set before it loads
(``pcgopt run`` sets it).

**The program.** :func:`lower` lays every tensor of the plan out on a device mesh
(:mod:`pcgopt.lower.layout`) and builds one SPMD function, run by ``jax.shard_map`` on every
device of the mesh, in which each node becomes what it means on one device:

==================  =================================================================
Partition           the local block: ``lax.dynamic_slice`` at the device's block index
Combine             ``lax.all_gather`` (tiled) over the axes of the joined blocks
Replicate, Discard  nothing: a tensor is the same on every device off its own axes
Reduce              ``lax.psum`` over the axes of the summed partial sums
ToPartial           the value on the first device of the new axes, zeros elsewhere
StackPartial        input ``i`` on the devices at index ``i`` of the new axes
AllReduce           ``lax.psum``
AllGather           ``lax.all_gather`` (tiled)
ReduceScatter       ``lax.psum_scatter`` (tiled)
AllToAll            ``lax.all_to_all`` (tiled)
Pipeline, Batch     nothing: the device computes its whole block (the same values; a
                    pipelined plan's loop over micro-batches is :mod:`pcgopt.lower.pipelined`'s)
compute operators   the operator's own semantics on the local blocks
                    (``OpSpec.local``, run on JAX arrays; :mod:`pcgopt.ops.arrays`)
==================  =================================================================

Graph inputs and weights enter the program already in the layout the plan stores them in (the
Partitions and Replicates right after a source: the data loader delivers the input split, a
weight is kept split), as ``shard_map`` arguments with that ``PartitionSpec``. A weight's
gradient is then what ``jax.grad`` through ``shard_map`` gives: summed over the devices that
hold copies of it (the backward of Replicate on a weight, the plan's gradient
synchronization) and kept split where the weight is split.

**Devices.** The mesh has one axis per prime factor of its size (:class:`DeviceGrid`), named
after the machine's levels when the plan spans the whole machine. Its size is the plan's width
(its widest tensor), or a multiple of it when three splits pairwise share tensors (more
devices than the widest tensor then hold copies); :attr:`Lowered.mesh` says which. The devices
are numbered as the plan numbers them, and the mesh holds them in the order that runs every
collective on the device groups the plan placed it on (:attr:`Plan.mapping
<pcgopt.extract.search.plan.Plan.mapping>`: P^2's placement and the machine mapping's offsets; for a
bare PCG, the ``placement`` given or the cost model's consecutive devices):
:mod:`pcgopt.lower.placement`. Groups no device order can give (the cost model's default
placement of a plan with two axes puts both on consecutive devices) are listed in
:attr:`Lowered.placement`, and :meth:`Lowered.group_checks` sets each compiled collective's
groups beside the plan's. Tensors narrower than the mesh are held, and computed, by every
device off their axes.

**Branches at once.** A Plan whose machine mapping runs branches at once on disjoint blocks of
devices is not one SPMD program: :func:`lower` gives a
:class:`~pcgopt.lower.mapped.MappedLowered`, one such program per block on a sub-mesh of its
devices, the tensors handed between blocks put on the reader's devices
(:mod:`pcgopt.lower.mapped`; sub-meshes rather than masking, so that a branch's weights and
work live only on its block). ``lower(plan, concurrent=False)``, a bare PCG, and plans the
sub-meshes do not support (gradient accumulation; :attr:`Lowered.note` says why) run as one
program on all devices, the branches one after the other; the results are the same.

**Training.** The loss is the mean of the model's output (the sum of the means, with several
outputs): the zoo's models and most imported graphs end before their loss, and the IR has no
loss operators yet. :meth:`Lowered.train_step` differentiates it with ``jax.value_and_grad``
through the sharded program and updates the weights with the optimizer the plan was costed with
(``optax``: ``sgd``, ``momentum`` = SGD with momentum 0.9, ``adam``). A plan costed with
gradient accumulation over ``m`` micro-batches runs the forward and backward of each
micro-batch (a slice of every data input's dimension 0) inside the program, accumulates the
local gradients, and synchronizes them once. A plan costed under ZeRO
(:attr:`~pcgopt.extract.costmodel.simulate.Runtime.zero_stage`) keeps each weight's optimizer
state split over the weight's copies (:meth:`Lowered.state_sharding`), so each copy updates its
part and the step gathers the weights back (ZeRO-1: AllReduce, then AllGather); under ZeRO-2 the
gradients are reduce-scattered into those parts instead of all-reduced. XLA compiles the
collectives the cost model charges for them (:meth:`Lowered.collectives` reads the whole step).
A weight no dimension of which its copies divide, or (ZeRO-2) kept in several layouts, trains
as under DDP (:meth:`Lowered.zero_exceptions`, named in :attr:`Lowered.note`).

**Checks.** :func:`reference_loss_and_grads` is the model evaluated by plain ``jax.numpy`` (one
device, no parallel operators), which the first step's loss and gradients must equal
(:func:`pcgopt.lower.run.run_plan` compares them); :meth:`Lowered.collectives` reads the
collectives XLA compiled for the training step and sets them beside the cost model's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from pcgopt.errors import PCGError
from pcgopt.evaluate import random_feeds
from pcgopt.extract.costmodel.cost import OPTIMIZERS, iteration_cost, source_layouts
from pcgopt.graph import PCG, TensorRef
from pcgopt.lower.collectives import (
    CollectiveComparison,
    PlannedCollective,
    compare_collectives,
    planned_collectives,
)
from pcgopt.lower.hlo import CompiledCollective, compiled_collectives
from pcgopt.lower.layout import (
    DeviceGrid,
    LayoutAssignment,
    LayoutError,
    MeshLayout,
    assign_layouts,
)
from pcgopt.lower.placement import (
    DeviceOrder,
    GroupCheck,
    Groups,
    collective_axes,
    default_placement,
    device_order,
    devices_of,
)
from pcgopt.machine import Machine
from pcgopt.ops import OpKind
from pcgopt.ops.spec import LocalContext, axis_degrees
from pcgopt.scaled import micro_batched

if TYPE_CHECKING:
    from pcgopt.lower.mapped import MappedLowered

try:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "pcgopt.lower.jax runs plans on JAX, an optional extra: pip install 'pcgopt[jax]'"
    ) from err

__all__ = [
    "Lowered",
    "LoweringError",
    "PlanShardings",
    "TrainState",
    "lower",
    "reference_loss_and_grads",
    "shardings",
]

#: The learning rate of :meth:`Lowered.train_step` unless given.
DEFAULT_LEARNING_RATE = 1e-3


class LoweringError(PCGError):
    """A plan that cannot be lowered to JAX as asked (too few devices, an unknown optimizer,
    inputs that do not fit); the message says what would be valid."""


# --- The per-device program ------------------------------------------------------------------


def _linear_index(axes: Sequence[str], grid: DeviceGrid) -> Any:
    """This device's block index along ``axes`` (major first), traced."""
    index: Any = 0
    for a in axes:
        index = index * grid.axis_size(a) + lax.axis_index(a)
    return index


def _slice(x: Any, dim: int, axes: Sequence[str], grid: DeviceGrid, typed: bool) -> Any:
    """Partition: this device's block of ``dim``, one of ``prod(axes)``. ``typed``: the program
    tracks which axes values vary along (``check_vma``); a value the same along ``axes`` then
    gets as its gradient the blocks' gradients gathered (an all-gather), not their sum."""
    if not axes:
        return x
    parts = math.prod(grid.axis_size(a) for a in axes)
    size = x.shape[dim] // parts
    index = _linear_index(axes, grid) * size
    if not typed:
        return lax.dynamic_slice_in_dim(x, index, size, axis=dim)
    varying = _varying(x)
    if all(a in varying for a in axes):
        return lax.dynamic_slice_in_dim(x, index, size, axis=dim)
    if any(a in varying for a in axes):
        x = lax.pcast(x, tuple(a for a in axes if a not in varying), to="varying")
        return lax.dynamic_slice_in_dim(x, index, size, axis=dim)
    return _block_of_copy(x, dim, tuple(axes), index, size)


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 4))
def _block_of_copy(x: Any, dim: int, axes: tuple[str, ...], index: Any, size: int) -> Any:
    """The block at ``index`` of ``x``, which every device along ``axes`` holds whole."""
    return lax.dynamic_slice_in_dim(x, index, size, axis=dim)


def _block_of_copy_fwd(x: Any, dim: int, axes: tuple[str, ...], index: Any, size: int) -> Any:
    return _block_of_copy(x, dim, axes, index, size), index


def _block_of_copy_bwd(dim: int, axes: tuple[str, ...], size: int, index: Any, ct: Any) -> Any:
    # Every device holds x whole, so its gradient is the blocks' gradients side by side.
    gathered = lax.all_gather(ct, _named(axes), axis=dim, tiled=True, to="invarying")
    return gathered, None


_block_of_copy.defvjp(_block_of_copy_fwd, _block_of_copy_bwd)


def _varying(x: Any) -> frozenset[str]:
    """The mesh axes ``x`` is typed as varying along inside ``shard_map``."""
    return frozenset(jax.typeof(x).manual_axis_type.varying)


def _named(axes: Sequence[str]) -> str | tuple[str, ...]:
    return axes[0] if len(axes) == 1 else tuple(axes)


def _sum_scattered(x: Any, axes: Sequence[str], over: Sequence[str], dim: int) -> Any:
    """Inside ``shard_map``: ``x`` summed over mesh ``axes``, each device keeping its block of
    dimension ``dim`` along ``over`` (in that order): a ReduceScatter when ``over`` are the
    axes summed over, else the sum and then the block."""
    if set(axes) == set(over):
        return lax.psum_scatter(x, _named(tuple(over)), scatter_dimension=dim, tiled=True)
    total = lax.psum(x, _named(tuple(axes))) if axes else x
    index = lax.axis_index(_named(tuple(over)))
    size = total.shape[dim] // math.prod(lax.axis_size(a) for a in over)
    return lax.dynamic_slice_in_dim(total, index * size, size, axis=dim)


def zero_stage_of(plan: Any) -> int:
    """The ZeRO stage of the runtime a Plan (or a plan file) was costed with; 0 for none."""
    cost = getattr(plan, "cost", None)
    runtime = getattr(cost, "runtime", None)
    return int(getattr(runtime, "zero_stage", getattr(cost, "zero_stage", 0)) or 0)


def _named_tuple(entry: str | tuple[str, ...]) -> tuple[str, ...]:
    """A ``PartitionSpec`` entry's mesh axes, as a tuple."""
    return (entry,) if isinstance(entry, str) else tuple(entry)


@dataclass(frozen=True)
class _Slot:
    """A ``shard_map`` argument: ``source`` as stored in the layout of node ``node``."""

    source: str
    node: str
    spec: Any  # PartitionSpec


class _Program:
    """The SPMD body of a PCG on a layout assignment (module docstring)."""

    def __init__(self, pcg: PCG, assignment: LayoutAssignment, *, typed: bool = True) -> None:
        self.pcg = pcg
        self.typed = typed
        self.assignment = assignment
        self.grid = assignment.grid
        source_of, _ = source_layouts(pcg)
        self.source_of = source_of
        self.slots = tuple(
            _Slot(src, node, P(*assignment.layout(node).spec()))
            for node, src in assignment.stored.items()
        )
        self.outputs = pcg.outputs
        # Where copies are used apart: found by tracing once (probe) before the real traces.
        self.copy_axes: dict[str, tuple[str, ...]] = {}
        self._record: dict[TensorRef, frozenset[str]] | None = None
        # Partitions of copies (typed varying along the new axes): each device's copy takes its
        # block's gradient, and the copies' gradients are summed where they were made.
        self.split_copies: set[str] = set()

    def probe(self, mesh: Any) -> None:
        """Traces the program once, without running it, to find along which axes the readers
        of every Replicate and every loaded source vary (JAX types a value as varying along
        every axis any of its operands varies along); their copies are then typed varying
        along those axes at once, where they are made, so that each gets one sum of its
        copies' gradients rather than one per reader."""
        if not self.typed:
            return
        seen: dict[TensorRef, frozenset[str]] = {}

        def body(*local: Any) -> Any:
            self._record = seen
            try:
                self.run(*local)
            finally:
                self._record = None
            return jnp.zeros(())

        mapped = jax.shard_map(
            body, mesh=mesh, in_specs=tuple(s.spec for s in self.slots), out_specs=P()
        )
        args = [
            jax.ShapeDtypeStruct(
                self.pcg.shape(s.source).sizes, _dtype(self.pcg.shape(s.source).dtype.value)
            )
            for s in self.slots
        ]
        jax.eval_shape(mapped, *args)
        self.copy_axes = _copy_axes(self.pcg, self.assignment, seen)

    def layout(self, ref: TensorRef | str) -> MeshLayout:
        return self.assignment.layout(ref)

    def run(self, *local: Any, cast: frozenset[str] = frozenset()) -> dict[TensorRef, Any]:
        """Every tensor's local block on this device, from the slots' local blocks (those of
        the slot nodes in ``cast`` already typed as copies, :meth:`_copies`)."""
        values: dict[TensorRef, Any] = {}
        for slot, value in zip(self.slots, local, strict=True):
            if slot.node not in cast:
                value = self._copies(slot.node, value)
            values[TensorRef(slot.node)] = value
        for node in self.pcg.nodes:
            ref = TensorRef(node.name)
            if ref in values or node.name in self.source_of:
                continue  # loaded, or a layout of a source that only its chain reads
            with jax.named_scope(node.name.replace("/", ".")):
                if node.spec.kind is OpKind.COMPUTE:
                    outs = self._compute(node, [values[r] for r in node.inputs])
                else:
                    outs = (self._parallel(node, [values[r] for r in node.inputs]),)
            for i, v in enumerate(outs):
                values[TensorRef(node.name, i)] = v
                if self._record is not None:
                    self._record[TensorRef(node.name, i)] = _varying(v)
        return values

    def _copies(self, name: str, x: Any) -> Any:
        """``x`` as copies that its readers use apart (a Replicate's output, a weight as
        loaded): typed as varying along the axes they vary along, once, so that their
        gradients meet in one sum, the backward of Replicate."""
        if not self.typed:
            return x
        axes = tuple(a for a in self.copy_axes.get(name, ()) if a not in _varying(x))
        return lax.pcast(x, _named(axes), to="varying") if axes else x

    def _compute(self, node: Any, blocks: list[Any]) -> tuple[Any, ...]:
        spec, pcg = node.spec, self.pcg
        shapes = pcg.input_shapes(node.name)
        outs = pcg.output_shapes(node.name)
        sig = spec.signature(
            node.params, tuple(s.sizes for s in shapes), tuple(o.sizes for o in outs)
        )
        degrees = axis_degrees(spec, sig, shapes)
        offsets: dict[str, Any] = {}
        for ax in sig.axes:
            if degrees[ax.name] == 1:
                continue
            i, d = next((i, d) for i, d in enumerate(ax.inputs) if d is not None)
            axes = self.layout(node.inputs[i]).dims[d]
            extent = ax.size or shapes[i].sizes[d]
            offsets[ax.name] = _linear_index(axes, self.grid) * (extent // degrees[ax.name])
        ctx = LocalContext(
            offsets, tuple(o.block_sizes for o in outs), tuple(s.sizes for s in shapes)
        )
        result = spec.local(node.params, ctx, *blocks)
        return tuple(
            jnp.asarray(r).astype(_dtype(o.dtype.value)) for r, o in zip(result, outs, strict=True)
        )

    def _parallel(self, node: Any, xs: list[Any]) -> Any:
        grid, typed = self.grid, self.typed
        before = self.layout(node.inputs[0])
        after = self.layout(node.name)
        if node.op == "stack_partial":
            new = after.partial[len(before.partial) :]
            return jnp.stack(xs)[_linear_index(new, grid)]
        (x,) = xs
        # The primitive steps, fused where one collective does two (module docstring).
        dims = [list(d) for d in before.dims]
        partial = list(before.partial)
        steps = list(node.spec.steps(node.params))
        k = 0
        while k < len(steps):
            kind, dim, degree = steps[k]
            nxt = steps[k + 1] if k + 1 < len(steps) else None
            if kind in ("reduce", "combine"):
                own = partial if kind == "reduce" else dims[dim]
                freed = _tail(own, degree, grid)
                del own[len(own) - len(freed) :]
                axes = _named(freed)
                if nxt is not None and nxt[0] == "partition" and _reuses(after, dims, nxt, freed):
                    if kind == "reduce":
                        x = lax.psum_scatter(x, axes, scatter_dimension=nxt[1], tiled=True)
                    else:
                        x = lax.all_to_all(x, axes, nxt[1], dim, tiled=True)
                    dims[nxt[1]] += freed
                    k += 2
                    continue
                # Followed by Replicate: the result is copies, which get their own gradients
                # (an AllReduce's backward is an all-reduce, an AllGather's a reduce-scatter);
                # alone, it is one tensor every device holds (a Combine's backward is a slice).
                copies = nxt is not None and nxt[0] == "replicate"
                if kind == "reduce":
                    x = lax.psum(x, axes)
                    if copies and typed:
                        x = lax.pcast(x, axes, to="varying")
                elif typed:
                    to = "varying" if copies else "invarying"
                    x = lax.all_gather(x, axes, axis=dim, tiled=True, to=to)
                else:
                    x = lax.all_gather(x, axes, axis=dim, tiled=True)
            elif kind == "partition":
                new = _head(after.dims[dim][len(dims[dim]) :], degree, grid)
                if typed and set(new) <= _varying(x):
                    self.split_copies.add(node.name)
                x = _slice(x, dim, new, grid, typed)
                dims[dim] += new
            elif kind == "replicate" and node.op == "replicate":
                x = self._copies(node.name, x)
            elif kind == "to_partial":
                new = _head(after.partial[len(partial) :], degree, grid)
                x = jnp.where(_linear_index(new, grid) == 0, x, jnp.zeros_like(x))
                partial += new
            k += 1
        return x


def _copy_axes(
    pcg: PCG, assignment: LayoutAssignment, varying: Mapping[TensorRef, frozenset[str]]
) -> dict[str, tuple[str, ...]]:
    """For every Replicate and every source as loaded: the mesh axes its copies are used apart
    along, in grid order: those its readers' outputs vary along (``varying``, as traced) and it
    is not split or summed along; none if it has no copies. A reader that varies along no more
    than it and keeps copies (a transpose of a replicated weight) computes on the same copies:
    its own readers count instead."""
    readers: dict[str, list[str]] = {}
    for node in pcg.nodes:
        for r in node.inputs:
            readers.setdefault(r.node, []).append(node.name)

    def vma(name: str) -> set[str]:
        return set().union(
            *(varying.get(TensorRef(name, i), ()) for i in range(len(pcg.output_shapes(name))))
        )

    out = {}
    for node in pcg.nodes:
        if node.op != "replicate" and node.name not in assignment.stored:
            continue
        if pcg.shape(node.name).copy_degree == 1:
            out[node.name] = ()  # no copies: one tensor, computed alike on every device
            continue
        own = set(assignment.layout(node.name).axes)
        used: set[str] = set()
        split: set[str] = set()  # the axes the readers' outputs are split or summed along
        stack, seen = list(readers.get(node.name, ())), set()
        while stack:
            reader = stack.pop()
            if reader in seen:
                continue
            seen.add(reader)
            axes = vma(reader)
            passes = (
                pcg.node(reader).op != "replicate"
                and reader not in assignment.stored
                and all(s.copy_degree > 1 for s in pcg.output_shapes(reader))
            )
            if axes <= own and passes:
                stack.extend(readers.get(reader, ()))
            else:
                used |= axes
                for i in range(len(pcg.output_shapes(reader))):
                    split.update(assignment.layout(TensorRef(reader, i)).axes)
        # As many axes as the tensor has copies, those its readers split along first: along
        # other axes its readers only hold copies of copies, summed where those are made.
        grid = assignment.grid
        candidates = [a for a in grid.names if a in (used & split) - own]
        candidates += [a for a in grid.names if a in used - split - own]
        chosen, product = set(), 1
        for a in candidates:
            if product * grid.axis_size(a) <= pcg.shape(node.name).copy_degree:
                chosen.add(a)
                product *= grid.axis_size(a)
        used = chosen
        out[node.name] = tuple(a for a in assignment.grid.names if a in used - own)
    return out


def _local_loss(program: _Program, values: Mapping[TensorRef, Any]) -> Any:
    """The loss on every device: each output's local sum, summed over the devices it varies
    along, less the copies among them, over its size."""
    total: Any = 0.0
    grid = program.grid
    for ref in _loss_terms(program.pcg):
        layout = program.layout(ref)
        s = jnp.sum(values[ref].astype(jnp.float32))
        varying = _varying(s)
        axes = tuple(a for a in grid.names if a in varying)
        if axes:
            s = lax.psum(s, _named(axes))
        copies = math.prod(grid.axis_size(a) for a in axes if a not in layout.axes)
        total = total + s / (program.pcg.shape(ref).numel * copies)
    return total


def _glorot_scale(shape: tuple[int, ...]) -> np.float32:
    """Glorot's standard deviation for a weight of ``shape`` (1 for fewer than 2 dims)."""
    if len(shape) < 2:
        return np.float32(1.0)
    receptive = math.prod(shape[2:])
    fan_in, fan_out = (shape[0], shape[1]) if len(shape) == 2 else (shape[1], shape[0])
    return np.float32(math.sqrt(2.0 / ((fan_in + fan_out) * receptive)))


def _tail(axes: list[str], degree: int, grid: DeviceGrid) -> list[str]:
    """The trailing axes whose sizes multiply to ``degree``."""
    product, k = 1, len(axes)
    while product < degree:
        k -= 1
        product *= grid.axis_size(axes[k])
    return axes[k:]


def _head(axes: Sequence[str], degree: int, grid: DeviceGrid) -> list[str]:
    """The leading axes whose sizes multiply to ``degree``."""
    product, k = 1, 0
    while product < degree:
        product *= grid.axis_size(axes[k])
        k += 1
    return list(axes[:k])


def _reuses(after: MeshLayout, dims: list[list[str]], step: tuple, freed: list[str]) -> bool:
    """Whether the split ``step`` puts its blocks on the axes just freed (a fused collective)."""
    _, dim, _ = step
    return list(after.dims[dim][len(dims[dim]) : len(dims[dim]) + len(freed)]) == freed


_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}
_DTYPES |= {"i32": "int32", "i64": "int64"}


def _dtype(name: str) -> Any:
    """The JAX dtype of a PCG dtype name; 64-bit types are 32-bit unless JAX runs with x64."""
    return jax.dtypes.canonicalize_dtype(np.dtype(_DTYPES[name]))


# --- The lowered plan --------------------------------------------------------------------------


def random_sources(
    pcg: PCG, weight_names: Sequence[str], input_names: Sequence[str], seed: int, scaled: bool
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Random ``(inputs, weights)`` of a plan (:meth:`Lowered.random_sources`)."""
    feeds = random_feeds(pcg, seed, np.float32)
    weights = {k: feeds[k] for k in weight_names}
    if scaled:
        weights = {k: v * _glorot_scale(v.shape) for k, v in weights.items()}
    return {k: feeds[k] for k in input_names}, weights


def check_sources(pcg: PCG, values: Mapping[str, Any], names: Sequence[str], what: str) -> None:
    """Raises :class:`LoweringError` unless ``values`` has exactly ``names``, each of the
    plan's shape (``what``: "inputs" or "weights", for the message)."""
    missing = [n for n in names if n not in values]
    unknown = sorted(set(values) - set(names))
    if missing or unknown:
        raise LoweringError(
            f"{what}: "
            + (f"missing {', '.join(map(repr, missing))}" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"not {what} of the plan: {', '.join(map(repr, unknown))}" if unknown else "")
            + f" ({what} of the plan: {', '.join(names) or 'none'})"
        )
    for name in names:
        sizes = pcg.shape(name).sizes
        if tuple(np.shape(values[name])) != sizes:
            raise LoweringError(
                f"{what} {name!r} has shape {tuple(np.shape(values[name]))}, expected {sizes}"
            )


class TrainState(NamedTuple):
    """What a training step carries: the trainable weights (each a global ``jax.Array`` in the
    layout the plan stores it in), the optimizer's state, and the step count."""

    params: dict[str, Any]
    opt_state: Any
    step: int


def _optax() -> Any:
    try:
        import optax
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise LoweringError(
            "training steps use optax, part of the optional extra: pip install 'pcgopt[jax]'"
        ) from None
    return optax


def optimizer_transform(name: str, learning_rate: float) -> Any:
    """The optax transformation of an optimizer the cost model knows (``OPTIMIZERS``)."""
    optax = _optax()
    if name == "sgd":
        return optax.sgd(learning_rate)
    if name == "momentum":
        return optax.sgd(learning_rate, momentum=0.9)
    if name == "adam":
        return optax.adam(learning_rate)
    raise LoweringError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")


def _data_inputs(pcg: PCG) -> frozenset[str]:
    """Graph inputs with a batch dimension (dimension 0): what micro-batches divide."""
    return frozenset(n.name for n in pcg.nodes if n.op == "input" and pcg.shape(n.name).rank)


def _loss_terms(pcg: PCG) -> tuple[TensorRef, ...]:
    """The outputs the loss averages: the floating-point ones."""
    terms = tuple(r for r in pcg.outputs if not pcg.shape(r).dtype.is_integer)
    if not terms:
        raise LoweringError(
            "the model has no floating-point output to take the mean of as its loss "
            f"(outputs: {', '.join(f'{r} {pcg.shape(r)}' for r in pcg.outputs)})"
        )
    return terms


@dataclass(frozen=True, eq=False)
class Lowered:
    """A plan as a JAX program on ``mesh`` (module docstring). Build it with :func:`lower`.

    ``pcg``: the plan; ``assignment``: every tensor's layout on the mesh; ``optimizer``,
    ``learning_rate``, ``micro_batches``: the training step's; ``plan``: the
    :class:`~pcgopt.extract.search.plan.Plan` it came from, if any (its cost model is what
    :meth:`collectives` compares against)."""

    pcg: PCG
    assignment: LayoutAssignment
    mesh: Any
    optimizer: str
    learning_rate: float
    micro_batches: int
    plan: Any = None
    #: The device at every mesh position and which nodes run in the plan's device groups
    #: (:mod:`pcgopt.lower.placement`); None: the devices in the order given.
    placement: DeviceOrder | None = field(default=None, repr=False)
    #: Why the program differs from the plan, if it does (a mapped plan run as one program).
    note: str = ""
    #: The ZeRO stage the plan was costed with (:func:`zero_stage_of`; 0 for a bare PCG).
    zero_stage: int = 0
    _program: _Program | None = field(default=None, repr=False)
    _cache: dict[str, Any] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.placement is None:
            object.__setattr__(self, "placement", DeviceOrder(tuple(range(self.mesh.size))))
        if self._program is None:
            program = _Program(self.pcg, self.assignment)
            program.probe(self.mesh)
            object.__setattr__(self, "_program", program)

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in self.mesh.shape.items())
        return (
            f"Lowered({len(self.pcg.nodes)} nodes on a mesh of {self.mesh.size} devices ({axes}); "
            f"{self.optimizer}, {self.micro_batches} micro-batch"
            f"{'es' if self.micro_batches > 1 else ''})"
        )

    # -- sources ----------------------------------------------------------------------------

    @property
    def weight_names(self) -> tuple[str, ...]:
        """Trainable weights: what the training step updates."""
        return tuple(n.name for n in self.pcg.nodes if n.op == "weight" and n.params["trainable"])

    @property
    def input_names(self) -> tuple[str, ...]:
        """Graph inputs and buffers (weights that are not trained): what each step is fed."""
        trained = set(self.weight_names)
        return tuple(
            n.name for n in self.pcg.nodes if n.spec.kind is OpKind.SOURCE and n.name not in trained
        )

    def sharding(self, source: str) -> Any:
        """The ``NamedSharding`` a source is kept in: its first stored layout."""
        for slot in self._program.slots:
            if slot.source == source:
                return NamedSharding(self.mesh, slot.spec)
        if source in self.pcg and self.pcg.node(source).spec.kind is OpKind.SOURCE:
            return NamedSharding(self.mesh, P())  # read by nothing
        raise LoweringError(f"{source!r} is not an input or weight of the plan")

    def random_sources(
        self, seed: int = 0, *, scaled: bool = True
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Random ``(inputs, weights)`` (float32) as :func:`pcgopt.evaluate` draws them, but,
        with ``scaled``, the trainable weights of two or more dimensions scaled to Glorot's
        standard deviation, sqrt(2 / (fan_in + fan_out)) (a [fan_in, fan_out] matrix; a
        convolution's [out, in, kh, kw] kernel), as a model is initialized: with unit
        variance, a full-size model's activations and gradients overflow float32."""
        return random_sources(self.pcg, self.weight_names, self.input_names, seed, scaled)

    def _placed(self, values: Mapping[str, Any], names: Sequence[str], what: str) -> dict[str, Any]:
        check_sources(self.pcg, values, names, what)
        out = {}
        for name in names:
            value = values[name]
            shape = self.pcg.shape(name)
            out[name] = jax.device_put(
                jnp.asarray(value, _dtype(shape.dtype.value)), self.sharding(name)
            )
        return out

    def _in_micro_batch_order(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The data inputs' rows reordered so that micro-batch ``i`` (rows ``i*B/m`` to
        ``(i+1)*B/m``) is chunk ``i`` of every device's block: as a data loader that feeds
        micro-batches would deliver them. Nothing moves between devices."""
        m = self.micro_batches
        out = dict(inputs)
        if m == 1:
            return out
        for name in _data_inputs(self.pcg):
            if name not in out:
                continue
            value = np.asarray(out[name])
            slot = next(s for s in self._program.slots if s.source == name)
            d = math.prod(self.mesh.shape[a] for a in self._program.layout(slot.node).dims[0])
            rest = value.shape[1:]
            blocks = value.reshape(m, d, value.shape[0] // (d * m), *rest).swapaxes(0, 1)
            out[name] = blocks.reshape(value.shape)
        return out

    def _args(self, sources: Mapping[str, Any]) -> list[Any]:
        return [sources[slot.source] for slot in self._program.slots]

    def _mapped(
        self, body: Callable[..., Any], out_specs: Any, *, typed: bool = True
    ) -> Callable[..., Any]:
        return jax.shard_map(
            body,
            mesh=self.mesh,
            in_specs=tuple(slot.spec for slot in self._program.slots),
            out_specs=out_specs,
            check_vma=typed,
        )

    # -- forward and loss -------------------------------------------------------------------

    def forward(self, inputs: Mapping[str, Any], weights: Mapping[str, Any]) -> tuple[Any, ...]:
        """The plan's outputs (logical values, as global ``jax.Array``s) on these inputs and
        weights (logical values: numpy or JAX arrays, by name)."""
        if "forward" not in self._cache:
            program = _Program(self.pcg, self.assignment, typed=False)
            specs = []
            for ref in program.outputs:
                lay = program.layout(ref)
                specs.append(P(_named(lay.partial) if lay.partial else None, *lay.spec()))

            def body(*local: Any) -> tuple[Any, ...]:
                values = program.run(*local)
                return tuple(values[r][None] for r in program.outputs)

            mapped = self._mapped(body, tuple(specs), typed=False)
            self._cache["forward"] = jax.jit(
                lambda sources: tuple(y.sum(axis=0) for y in mapped(*self._args(sources)))
            )
        sources = {
            **self._placed(inputs, self.input_names, "inputs"),
            **self._placed(weights, self.weight_names, "weights"),
        }
        return self._cache["forward"](sources)

    def _loss_fn(self, *, outputs: bool = False) -> Callable[[dict[str, Any], dict[str, Any]], Any]:
        """The loss of the sharded program; with ``outputs``, also every device's block of
        every model output (gathered along all mesh axes: no collective), as an aux value."""
        key = f"loss_fn{outputs}"
        if key not in self._cache:
            program = self._program
            every = P(tuple(self.assignment.grid.names) or None)

            def body(*local: Any) -> Any:
                values = program.run(*local)
                loss = _local_loss(program, values)
                if not outputs:
                    return loss
                return loss, tuple(values[r][None] for r in program.outputs)

            specs = (P(), tuple(every for _ in program.outputs)) if outputs else P()
            mapped = self._mapped(body, specs)

            def loss_fn(params: dict[str, Any], others: dict[str, Any]) -> Any:
                return mapped(*self._args({**others, **params}))

            self._cache[key] = loss_fn
        return self._cache[key]

    def tensors_fn(self, refs: Sequence[TensorRef]) -> Callable[[dict[str, Any]], tuple]:
        """``f(sources) -> values``: the logical values of tensors ``refs`` (global arrays) from
        the sources' (by name, global arrays in :meth:`sharding`), differentiable: every
        device's block leaves the program, and the blocks are put together outside it (one of
        the copies taken, partial sums added), so a gradient enters where the value left."""
        program = self._program
        every = P(tuple(self.assignment.grid.names) or None)

        def body(*local: Any) -> tuple[Any, ...]:
            values = program.run(*local)
            return tuple(values[r][None] for r in refs)

        mapped = self._mapped(body, tuple(every for _ in refs))

        def fn(sources: dict[str, Any]) -> tuple[Any, ...]:
            blocks = mapped(*self._args(sources))
            return tuple(self._assemble(r, b, jnp) for r, b in zip(refs, blocks, strict=True))

        return fn

    def _assemble(self, ref: TensorRef, blocks: Any, xp: Any = np) -> Any:
        """A tensor's logical value from every device's block (device order: the mesh's,
        row-major over its axes): blocks laid side by side along each dimension's axes,
        partial sums added, one of the copies taken (``xp``: numpy, or ``jax.numpy`` on
        traced values)."""
        grid = self.assignment.grid
        layout = self._program.layout(ref)
        block = xp.asarray(blocks)
        arr = block.reshape(*grid.sizes, *block.shape[1:])
        names = list(grid.names)
        for a in reversed(names):  # one copy along the axes the tensor does not vary along
            if a not in layout.axes:
                arr = arr.take(0, axis=names.index(a))
                names.remove(a)
        order = [names.index(a) for a in layout.partial]
        for k, axes in enumerate(layout.dims):
            order += [names.index(a) for a in axes] + [len(names) + k]
        arr = arr.transpose(order)
        shape = self.pcg.shape(ref).sizes
        parts = math.prod(grid.axis_size(a) for a in layout.partial)
        return arr.reshape(parts, *shape).sum(axis=0)

    def loss_grads_and_outputs(
        self, inputs: Mapping[str, Any], weights: Mapping[str, Any]
    ) -> tuple[Any, dict[str, Any], tuple[np.ndarray, ...]]:
        """:meth:`loss_and_grads` and the model's outputs (logical numpy values) from the same
        program (one compilation); without gradient accumulation."""
        if self.micro_batches > 1:
            raise LoweringError(
                "with gradient accumulation the outputs are per micro-batch; use forward()"
            )
        params = self._placed(weights, self.weight_names, "weights")
        others = self._placed(inputs, self.input_names, "inputs")
        (loss, blocks), grads = self._gradient_program(params, others)(params, others)
        outputs = tuple(
            self._assemble(r, b) for r, b in zip(self._program.outputs, blocks, strict=True)
        )
        return loss, grads, outputs

    def loss_and_grads(
        self, inputs: Mapping[str, Any], weights: Mapping[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """The loss and the gradient of every trainable weight (global arrays in the weights'
        stored layouts; with micro-batches under ZeRO-2, split as the optimizer state is), as
        one training step computes them (under ZeRO-2 with one micro-batch, all-reduced rather
        than reduce-scattered: the same values)."""
        params = self._placed(weights, self.weight_names, "weights")
        others = self._placed(self._in_micro_batch_order(inputs), self.input_names, "inputs")
        loss, grads = self._gradient_program(params, others)(params, others)
        return (loss[0] if self.micro_batches == 1 else loss), grads

    def _gradient_program(self, params: dict[str, Any], others: dict[str, Any]) -> Any:
        """The loss-and-gradients program (with the outputs' blocks beside the loss, without
        gradient accumulation), compiled once; its text is what :meth:`compiled_text`
        reads."""
        if "grad" not in self._cache:
            if self.micro_batches == 1:
                fn = jax.value_and_grad(self._loss_fn(outputs=True), has_aux=True)
            else:
                fn = self._accumulated()
            self._cache["grad"] = jax.jit(fn).lower(params, others).compile()
        return self._cache["grad"]

    def _value_and_grad(self) -> Callable[..., Any]:
        # ZeRO-2 reduce-scatters gradients itself, as accumulation over one micro-batch does.
        if self.micro_batches == 1 and self.zero_stage < 2:
            return jax.value_and_grad(self._loss_fn())
        return self._accumulated()

    def _accumulated(self) -> Callable[..., Any]:
        """Gradient accumulation (module docstring): inside the program, each micro-batch's
        loss and gradients (``jax.vjp`` of the plan on one micro-batch, with every weight
        already typed as its copies, so nothing is summed yet), added up; then each weight's
        copies' gradients summed once."""
        m = self.micro_batches
        try:
            micro_pcg = micro_batched(self.pcg, m)
        except PCGError as err:
            raise LoweringError(f"{m} micro-batches: {err}", node=err.node) from err
        grid = self.assignment.grid
        micro = _Program(micro_pcg, assign_layouts(micro_pcg, grid))
        slots = self._program.slots
        if [(s.node, s.spec) for s in micro.slots] != [(s.node, s.spec) for s in slots]:
            raise LoweringError(f"the plan on 1/{m} of its batch is laid out differently")
        micro.probe(self.mesh)
        trained = set(self.weight_names)
        data = _data_inputs(self.pcg)
        weight_slots = [k for k, slot in enumerate(slots) if slot.source in trained]
        cast = frozenset(slots[k].node for k in weight_slots)
        # ZeRO-2: a weight kept in one layout gets its gradient reduce-scattered into the
        # part of it that its copy updates (state_sharding): (dimension, axes) per slot.
        scatter = self._zero_scatter(weight_slots) if self.zero_stage >= 2 else {}

        def body(*local: Any) -> tuple[Any, list[Any]]:
            params = {k: micro._copies(slots[k].node, local[k]) for k in weight_slots}

            def loss_of(params: dict[int, Any], i: int) -> Any:
                args = []
                for k, (slot, value) in enumerate(zip(slots, local, strict=True)):
                    if k in params:
                        value = params[k]
                    elif slot.source in data:
                        size = value.shape[0] // m
                        value = lax.dynamic_slice_in_dim(value, i * size, size, axis=0)
                    args.append(value)
                return _local_loss(micro, micro.run(*args, cast=cast))

            loss: Any = 0.0
            grads = {k: jnp.zeros_like(v) for k, v in params.items()}
            for i in range(m):
                value, vjp = jax.vjp(partial(loss_of, i=i), params)
                (g,) = vjp(jnp.asarray(1.0 / m, jnp.float32))
                grads = {k: grads[k] + g[k] for k in grads}
                loss = loss + value / m
            synced = []
            for k in weight_slots:
                own = micro.layout(slots[k].node).axes
                axes = tuple(a for a in grid.names if a in _varying(grads[k]) and a not in own)
                if k in scatter:
                    dim, over = scatter[k]
                    synced.append(_sum_scattered(grads[k], axes, over, dim))
                else:
                    synced.append(lax.psum(grads[k], _named(axes)) if axes else grads[k])
            return loss, synced

        out_specs = [
            self.state_sharding(slots[k].source).spec if k in scatter else slots[k].spec
            for k in weight_slots
        ]
        mapped = self._mapped(body, (P(), out_specs))

        def value_and_grad(params: dict[str, Any], others: dict[str, Any]) -> Any:
            loss, synced = mapped(*self._args({**others, **params}))
            grads: dict[str, Any] = {}
            for k, g in zip(weight_slots, synced, strict=True):
                name = slots[k].source
                kept = self.state_sharding(name) if k in scatter else self.sharding(name)
                g = jax.lax.with_sharding_constraint(g, kept)
                grads[name] = g if name not in grads else grads[name] + g
            return loss, grads

        return value_and_grad

    # -- training ---------------------------------------------------------------------------

    def state_sharding(self, weight: str) -> Any:
        """The ``NamedSharding`` of the optimizer state that follows ``weight``: the weight's
        own, or under ZeRO (:attr:`zero_stage`) split further over the mesh axes the weight is
        copied on (along its first dimension their sizes divide), so that each copy keeps and
        updates its part, and the updated weight is gathered back."""
        own = self.sharding(weight)
        if not self.zero_stage:
            return own
        spec = tuple(own.spec) + (None,) * (self.pcg.shape(weight).rank - len(own.spec))
        used = {a for entry in spec if entry is not None for a in _named_tuple(entry)}
        copies = tuple(a for a in self.mesh.axis_names if a not in used and self.mesh.shape[a] > 1)
        ways = math.prod(self.mesh.shape[a] for a in copies)
        if ways == 1:
            return own
        sizes = self.pcg.shape(weight).sizes
        for dim, entry in enumerate(spec):
            split = math.prod(self.mesh.shape[a] for a in _named_tuple(entry)) if entry else 1
            if sizes[dim] % (split * ways) == 0:
                merged = (*_named_tuple(entry), *copies) if entry else copies
                new = list(spec)
                new[dim] = merged if len(merged) > 1 else merged[0]
                return NamedSharding(self.mesh, P(*new))
        return own  # no dimension divides: kept whole on every copy

    def zero_exceptions(self) -> tuple[str, ...]:
        """Under ZeRO, the weights kept in copies that run as DDP does, unlike the plan's cost:
        those no dimension of which the copies divide (the state stays whole), and under ZeRO-2
        those kept in several layouts (their gradients are all-reduced, not reduce-scattered).
        Empty without ZeRO."""
        if not self.zero_stage:
            return ()
        slots = self._program.slots
        layouts: dict[str, int] = {}
        for slot in slots:
            layouts[slot.source] = layouts.get(slot.source, 0) + 1
        found = []
        for name in self.weight_names:
            own = self.sharding(name)
            used = {a for entry in own.spec if entry is not None for a in _named_tuple(entry)}
            copied = any(a not in used and self.mesh.shape[a] > 1 for a in self.mesh.axis_names)
            if not copied:
                continue
            whole = self.state_sharding(name) == own
            if whole or (self.zero_stage >= 2 and layouts.get(name, 0) > 1):
                found.append(name)
        return tuple(found)

    def _zero_scatter(self, weight_slots: Sequence[int]) -> dict[int, tuple[int, tuple[str, ...]]]:
        """For ZeRO-2, the weight slots whose gradient is reduce-scattered: slot -> (the
        dimension :meth:`state_sharding` splits further, the mesh axes it adds there). Only a
        weight kept in one layout (its slots' gradients are otherwise added up whole)."""
        slots = self._program.slots
        count: dict[str, int] = {}
        for k in weight_slots:
            count[slots[k].source] = count.get(slots[k].source, 0) + 1
        found = {}
        for k in weight_slots:
            name = slots[k].source
            own, state = tuple(slots[k].spec), tuple(self.state_sharding(name).spec)
            width = max(len(own), len(state))
            own, state = own + (None,) * (width - len(own)), state + (None,) * (width - len(state))
            if count[name] != 1 or own == state:
                continue
            for dim, (before, after) in enumerate(zip(own, state, strict=True)):
                if before != after:
                    had = _named_tuple(before) if before else ()
                    found[k] = (dim, _named_tuple(after)[len(had) :])
        return found

    def init(self, weights: Mapping[str, Any]) -> TrainState:
        """The training state for these (logical) weights."""
        params = self._placed(weights, self.weight_names, "weights")
        opt = optimizer_transform(self.optimizer, self.learning_rate)
        # The optimizer's state is laid out like the weights it follows (jit keeps the
        # layouts), so that every step takes and returns the same layouts (one compilation);
        # under ZeRO, split over the weight's copies (state_sharding). Its scalars (Adam's step
        # count) are replicated on the mesh.
        replicated = NamedSharding(self.mesh, P())

        def placed(path: Any, x: Any) -> Any:
            last = path[-1] if path else None
            name = getattr(last, "key", None)
            if name in params:
                return jax.device_put(x, self.state_sharding(name))
            if len(x.sharding.device_set) == self.mesh.size:
                return x
            return jax.device_put(x, replicated)

        opt_state = jax.tree_util.tree_map_with_path(placed, jax.jit(opt.init)(params))
        # Under ZeRO the step keeps these layouts (XLA would otherwise be free to choose).
        if self.zero_stage:
            self._cache["state_shardings"] = jax.tree.map(lambda x: x.sharding, opt_state)
        return TrainState(params, opt_state, 0)

    def _step_fn(self) -> Callable[..., Any]:
        if "step" not in self._cache:
            opt = optimizer_transform(self.optimizer, self.learning_rate)
            value_and_grad = self._value_and_grad()
            optax = _optax()

            kept = {name: self.sharding(name) for name in self.weight_names}

            def step(params: dict[str, Any], opt_state: Any, others: dict[str, Any]) -> Any:
                loss, grads = value_and_grad(params, others)
                updates, opt_state = opt.update(grads, opt_state, params)
                # Under ZeRO the updates come out split like the state: the weights gather
                # them back, inside the step.
                params = jax.lax.with_sharding_constraint(
                    optax.apply_updates(params, updates), kept
                )
                state_shardings = self._cache.get("state_shardings")
                if self.zero_stage and state_shardings is not None:
                    opt_state = jax.lax.with_sharding_constraint(opt_state, state_shardings)
                return params, opt_state, loss

            self._cache["step"] = jax.jit(step, donate_argnums=(0, 1))
        return self._cache["step"]

    def _shardings_of(self, tree: Any) -> Any:
        return jax.tree.map(lambda x: x.sharding, tree)

    def train_step(self, state: TrainState, inputs: Mapping[str, Any]) -> tuple[TrainState, Any]:
        """One training step: forward, loss, backward through the sharded program, the plan's
        gradient synchronization and the optimizer update. Returns the new state and the loss.
        ``state``'s buffers are donated to the new state. With micro-batches, micro-batch ``i``
        is rows ``i*B/m`` to ``(i+1)*B/m`` of every data input."""
        others = self._placed(self._in_micro_batch_order(inputs), self.input_names, "inputs")
        params, opt_state, loss = self._step_fn()(state.params, state.opt_state, others)
        # Keep the state's layouts from step to step (XLA may pick others for outputs).
        params = jax.device_put(params, self._shardings_of(state.params))
        opt_state = jax.device_put(opt_state, self._shardings_of(state.opt_state))
        return TrainState(params, opt_state, state.step + 1), loss

    def planned_collectives(self) -> tuple[PlannedCollective, ...]:
        """The cost model's collectives for this plan, with their SPMD forms: the plan's own
        cost if lowered from a Plan, else :func:`~pcgopt.extract.costmodel.cost.iteration_cost` on a
        node of the mesh's size (one DGX-H100 node of that many GPUs)."""
        if self.plan is not None:
            cost = self.plan.cost
        else:
            cost = iteration_cost(
                self.pcg,
                Machine.preset("dgx-h100", devices_per_node=self.mesh.size),
                optimizer=self.optimizer,
                micro_batches=self.micro_batches,
            )
        return planned_collectives(self.pcg, cost, self.mesh.size, self._program.split_copies)

    def collectives(self) -> CollectiveComparison:
        """The collectives XLA compiled for the training step (:meth:`compiled_text`) beside
        the cost model's for the plan, matched one to one
        (:func:`pcgopt.lower.collectives.compare_collectives`)."""
        # The compiled text first: tracing it finds the Partitions of copies. Under ZeRO the
        # update adds collectives (the weights gathered back): the whole step's.
        text = self.compiled_text(update=bool(self.zero_stage))
        compiled = compiled_collectives(text, dict(self.mesh.shape))
        return compare_collectives(
            self.planned_collectives(), compiled, (n.name for n in self.pcg.nodes)
        )

    def compiled_groups(self, collective: CompiledCollective) -> Groups | None:
        """The devices of each group of a compiled collective, numbered as the plan numbers
        them (the position of each in the devices lowered to); None if the text does not say."""
        assert self.placement is not None
        if collective.members:
            return devices_of(collective.members, self.placement.order)
        if collective.axes:
            return self.placement.groups(self.assignment.grid, collective.axes)
        return None

    def group_checks(
        self, comparison: CollectiveComparison | None = None
    ) -> tuple[GroupCheck, ...]:
        """For every matched collective (``comparison``, default :meth:`collectives`) of a node
        with groups in the plan, compiled in that node's scope (or, for a weight's gradient
        synchronization, at the program's boundary) and run by as many devices per group as
        the plan says: the plan's groups beside the compiled ones."""
        assert self.placement is not None
        comparison = comparison or self.collectives()
        names = {n.name.replace("/", "."): n.name for n in self.pcg.nodes}
        planned_of = self.placement.planned
        # Weight gradients are summed at the program's boundary, with no scope: matched to a
        # planned sync by size alone, which names the node only if all syncs of that size
        # have the same groups.
        syncs: dict[tuple, set] = {}
        for p in comparison.planned:
            if p.purpose == "weight sync" and p.node in planned_of:
                syncs.setdefault((p.spmd_kind, p.spmd_nbytes, p.degree), set()).add(
                    planned_of[p.node]
                )
        out = []
        for p, c in comparison.matched:
            planned = planned_of.get(p.node)
            if planned is None or (p.spmd_degree or p.degree) != p.degree:
                continue
            if c.scope:
                if names.get(c.scope.split("/")[0]) != p.node:
                    continue
            elif (
                p.purpose != "weight sync" or len(syncs[(p.spmd_kind, p.spmd_nbytes, p.degree)]) > 1
            ):
                continue
            compiled = self.compiled_groups(c)
            if compiled is not None:
                out.append(GroupCheck(p.node, p.purpose, c.kind, tuple(planned), compiled))
        return tuple(out)

    def release(self) -> None:
        """Drops the compiled loss-and-gradients and forward programs (a full-size model's
        hold buffers the size of its weights); the next call compiles them again. The HLO
        text :meth:`collectives` reads is kept (under ZeRO it reads the whole step's, which it
        compiles again, with a training state of its own)."""
        program = self._cache.pop("grad", None)
        if program is not None:
            self._cache["grad_text"] = program.as_text()
        self._cache.pop("forward", None)

    def compiled_text(self, *, update: bool = False) -> str:
        """XLA's compiled HLO (after its SPMD and collective passes) of the training step's
        loss and gradients, or with ``update`` of the whole step (the optimizer update is
        elementwise on every device's shards: it adds no collectives, except under ZeRO, where
        the updated weights are gathered back)."""
        if not update and "grad" in self._cache:
            return self._cache["grad"].as_text()
        if not update and "grad_text" in self._cache:
            return self._cache["grad_text"]
        inputs, weights = self.random_sources()
        others = self._placed(self._in_micro_batch_order(inputs), self.input_names, "inputs")
        if not update:
            params = self._placed(weights, self.weight_names, "weights")
            return self._gradient_program(params, others).as_text()
        state = self.init(weights)
        lowered = self._step_fn().lower(state.params, state.opt_state, others)
        return lowered.compile().as_text()


# --- Lowering ------------------------------------------------------------------------------------


def _width(pcg: PCG) -> int:
    return max(s.num_shards for n in pcg.nodes for s in pcg.output_shapes(n.name))


def _grid(devices: int, machine: Any) -> DeviceGrid:
    if machine is not None and machine.num_devices == devices:
        return DeviceGrid.from_levels([(lv.name, lv.count) for lv in machine.levels])
    return DeviceGrid.flat(devices)


def _assign(pcg: PCG, available: int, machine: Any) -> LayoutAssignment:
    """Layouts on the smallest mesh that serves the plan: its width, or a multiple of it."""
    width = _width(pcg)
    if width > available:
        raise LoweringError(
            f"the plan spans {width} devices and JAX has {available}: on a CPU, set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={width} before JAX loads "
            "(pcgopt run --devices N does)"
        )
    first: LayoutError | None = None
    for size in range(width, available + 1, width):
        try:
            return assign_layouts(pcg, _grid(size, machine))
        except LayoutError as err:
            if err.node is not None:
                raise  # not a question of devices
            first = first or err
    assert first is not None
    raise LoweringError(f"{first} (JAX has {available} devices)") from first


def lower(
    plan_or_pcg: Any,
    devices: Sequence[Any] | int | None = None,
    *,
    optimizer: str | None = None,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    micro_batches: int | None = None,
    placement: Mapping[str, Sequence[Sequence[int]]] | None = None,
    concurrent: bool = True,
    machine: Machine | None = None,
) -> Lowered | MappedLowered:
    """The plan (a :class:`~pcgopt.extract.search.plan.Plan` or a PCG; a pipeline,
    :func:`~pcgopt.lower.pipelined.lower_pipeline`) as a JAX program (module docstring).
    ``devices``: the JAX devices to run on, or how many of ``jax.devices()`` (default: as many
    as the plan needs), numbered as the plan numbers its devices. ``optimizer`` and
    ``micro_batches`` default to the plan's cost model's (a bare PCG: Adam, 1).
    ``placement``: the device groups of the parallel nodes (default: the Plan's
    :attr:`~pcgopt.extract.search.plan.Plan.mapping`; for a PCG given a ``machine``, P^2's
    placement on it, :func:`~pcgopt.extract.strategies.placement.place_plan`; else the cost model's
    consecutive devices); the mesh's devices are ordered to run each node's collective on its
    groups (:mod:`pcgopt.lower.placement`; :attr:`Lowered.placement` says which nodes' groups
    it could not make the plan's).

    A Plan whose machine mapping runs branches at once on disjoint devices becomes a
    :class:`~pcgopt.lower.mapped.MappedLowered`, its branches programs on sub-meshes of their
    own devices (:mod:`pcgopt.lower.mapped`); ``concurrent=False`` runs it as one SPMD
    program on all devices instead."""
    from pcgopt.extract.search.plan import Plan
    from pcgopt.extract.strategies.pipeline import PipelinePlan
    from pcgopt.lower.saved import SavedPipeline, SavedPlan

    if isinstance(plan_or_pcg, PipelinePlan | SavedPipeline):
        if micro_batches not in (None, plan_or_pcg.micro_batches) or placement is not None:
            raise LoweringError(
                f"a pipeline runs its own {plan_or_pcg.micro_batches} micro-batches on its "
                "stages' devices: give it no micro_batches or placement"
            )
        from pcgopt.lower.pipelined import lower_pipeline

        return lower_pipeline(
            plan_or_pcg, devices, optimizer=optimizer, learning_rate=learning_rate
        )
    if isinstance(plan_or_pcg, Plan | SavedPlan) and concurrent and placement is None:
        return _lower_concurrent(plan_or_pcg, devices, optimizer, learning_rate, micro_batches)
    zero_stage = zero_stage_of(plan_or_pcg)
    if isinstance(plan_or_pcg, SavedPlan):  # a plan file: its graph, on its device groups
        optimizer = optimizer or plan_or_pcg.cost.optimizer
        if micro_batches is None:
            micro_batches = plan_or_pcg.cost.micro_batches
        placement = placement if placement is not None else plan_or_pcg.mapping
        plan_or_pcg = plan_or_pcg.pcg
    if isinstance(plan_or_pcg, Plan):
        plan, pcg, machine = plan_or_pcg, plan_or_pcg.pcg, plan_or_pcg.machine
        optimizer = optimizer or plan.cost.optimizer
        micro_batches = plan.cost.micro_batches if micro_batches is None else micro_batches
    elif isinstance(plan_or_pcg, PCG):
        plan, pcg = None, plan_or_pcg
        if machine is not None and not isinstance(machine, Machine):
            raise LoweringError(f"machine must be a pcgopt.Machine, got {machine!r}")
    else:
        raise LoweringError(f"lower takes a Plan or a PCG, got {type(plan_or_pcg).__name__}")
    optimizer = optimizer or "adam"
    if optimizer not in OPTIMIZERS:
        raise LoweringError(f"unknown optimizer {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    micro_batches = 1 if micro_batches is None else micro_batches
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise LoweringError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    if not learning_rate > 0:
        raise LoweringError(f"learning_rate must be > 0, got {learning_rate!r}")
    available = _available(devices)
    if plan is None and placement is None and machine is not None:
        from pcgopt.extract.strategies.placement import place_plan

        placement = place_plan(pcg, machine, optimizer=optimizer).devices
    _loss_terms(pcg)
    if micro_batches > 1:
        try:
            micro_batched(pcg, micro_batches)
        except PCGError as err:
            raise LoweringError(f"{micro_batches} micro-batches: {err}", node=err.node) from err
    lowered = _program_on(
        pcg,
        available,
        _placement_of(pcg, plan, placement),
        plan=plan,
        machine=machine,
        optimizer=optimizer,
        learning_rate=learning_rate,
        micro_batches=micro_batches,
        zero_stage=zero_stage,
    )
    exceptions = lowered.zero_exceptions()
    if exceptions:
        shown = ", ".join(exceptions[:3]) + (
            f" and {len(exceptions) - 3} more" if len(exceptions) > 3 else ""
        )
        object.__setattr__(
            lowered,
            "note",
            f"ZeRO-{zero_stage} is not applied to {shown}: no dimension their copies divide, or "
            "(ZeRO-2) kept in several layouts; they train as under DDP",
        )
    return lowered


def _program_on(
    pcg: PCG,
    available: Sequence[Any],
    groups: Mapping[str, Any],
    *,
    plan: Any = None,
    machine: Machine | None = None,
    optimizer: str = "adam",
    learning_rate: float = DEFAULT_LEARNING_RATE,
    micro_batches: int = 1,
    zero_stage: int = 0,
) -> Lowered:
    """The SPMD program of ``pcg`` on the first of ``available``, in the device order that
    gives its parallel nodes ``groups`` (checked arguments: :func:`lower` checks them)."""
    assignment = _assign(pcg, len(available), machine)
    grid = assignment.grid
    devices_used = available[: grid.size]
    program = _Program(pcg, assignment)
    program.probe(_mesh(devices_used, grid))  # the probe needs the axes, not the devices' order
    placement = device_order(grid, collective_axes(assignment, program.copy_axes), groups)
    mesh = _mesh([devices_used[d] for d in placement.order], grid)
    return Lowered(
        pcg,
        assignment,
        mesh,
        optimizer,
        learning_rate,
        micro_batches,
        plan,
        placement=placement,
        zero_stage=zero_stage,
        _program=program,
    )


def _available(devices: Sequence[Any] | int | None) -> list[Any]:
    """The JAX devices ``lower`` was given (module docstring of :func:`lower`)."""
    if devices is None:
        return list(jax.devices())
    if isinstance(devices, int) and not isinstance(devices, bool):
        if devices < 1 or devices > len(jax.devices()):
            raise LoweringError(
                f"devices={devices}: JAX has {len(jax.devices())} devices (on a CPU, set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={max(devices, 1)} before "
                "JAX loads)"
            )
        return list(jax.devices())[:devices]
    return list(devices)


def _lower_concurrent(
    plan: Any,
    devices: Sequence[Any] | int | None,
    optimizer: str | None,
    learning_rate: float,
    micro_batches: int | None,
) -> Lowered | MappedLowered:
    """A Plan as programs on sub-meshes if its mapping runs branches at once, else (or if
    those are not supported for it, said in :attr:`Lowered.note`) as one SPMD program."""
    from pcgopt.lower.mapped import concurrent_blocks, lower_mapped

    note = ""
    if concurrent_blocks(plan):
        try:
            if micro_batches not in (None, 1):
                raise LoweringError(f"{micro_batches} micro-batches asked for")
            chosen = None if devices is None else _available(devices)
            return lower_mapped(plan, chosen, optimizer=optimizer, learning_rate=learning_rate)
        except PCGError as err:  # a LoweringError, or a piece with no SPMD layout
            note = f"branches the mapping runs at once run here on all devices ({err})"
    lowered = lower(
        plan,
        devices,
        optimizer=optimizer,
        learning_rate=learning_rate,
        micro_batches=micro_batches,
        concurrent=False,
    )
    if note:
        object.__setattr__(lowered, "note", "; ".join(n for n in (note, lowered.note) if n))
    return lowered


def _placement_of(
    pcg: PCG, plan: Any, placement: Mapping[str, Sequence[Sequence[int]]] | None
) -> dict[str, Any]:
    if placement is None:
        return dict(plan.mapping) if plan is not None else default_placement(pcg)
    if not isinstance(placement, Mapping):
        raise LoweringError(
            f"placement must map parallel node names to device groups, got "
            f"{type(placement).__name__}"
        )
    unknown = sorted(set(placement) - {n.name for n in pcg.nodes})
    if unknown:
        raise LoweringError(
            f"placement names nodes the plan does not have: {', '.join(unknown[:5])}",
            node=unknown[0],
        )
    # Nodes the placement leaves out keep the cost model's default, as the cost model does.
    return {**default_placement(pcg), **placement}


#: The axis of a program on one device. Its grid has no axes, and shard_map (since JAX 0.12.1)
#: refuses a mesh without one; every value is replicated along this one-device axis.
ONE_DEVICE_AXIS = "one"


def _mesh(devices: Sequence[Any], grid: DeviceGrid) -> Any:
    """``devices`` (row-major) as a mesh of ``grid``'s axes (one device: of
    :data:`ONE_DEVICE_AXIS`)."""
    names, shape = (grid.names, grid.shape) if grid.names else ((ONE_DEVICE_AXIS,), (1,))
    return Mesh(
        np.array(devices, dtype=object).reshape(shape),
        names,
        axis_types=(jax.sharding.AxisType.Auto,) * len(names),
    )


# --- The unsharded model ------------------------------------------------------------------------


def reference_values(
    pcg: PCG,
    sources: Mapping[str, Any],
    constrain: Callable[[TensorRef, Any], Any] | None = None,
) -> dict[TensorRef, Any]:
    """Every tensor of ``pcg`` as a logical value computed by plain ``jax.numpy`` (each
    operator's reference semantics; parallel operators change nothing logically), each
    computed one passed through ``constrain`` if given."""
    values: dict[TensorRef, Any] = {}
    for node in pcg.nodes:
        if node.spec.kind is OpKind.SOURCE:
            values[TensorRef(node.name)] = sources[node.name]
            continue
        outs = node.spec.reference(node.params, *(values[r] for r in node.inputs))
        for i, v in enumerate(outs):
            ref = TensorRef(node.name, i)
            values[ref] = v if constrain is None else constrain(ref, v)
    return values


def reference_loss_and_grads(
    pcg: PCG,
    inputs: Mapping[str, Any],
    weights: Mapping[str, Any],
    *,
    micro_batches: int = 1,
) -> tuple[Any, dict[str, Any]]:
    """The loss (module docstring) and its gradient in every weight of ``weights``, computed
    by plain ``jax.numpy`` on one device: the unsharded model a lowered plan must agree with.
    ``micro_batches=m``: the mean of the loss and the gradients of the model on rows ``i*B/m``
    to ``(i+1)*B/m`` of every data input, for each ``i`` (each micro-batch draws its dropout
    masks by positions within it, as a separate forward pass does)."""
    if micro_batches > 1:
        small = micro_batched(pcg, micro_batches)
        data = _data_inputs(pcg)
        results = []
        for i in range(micro_batches):
            chunk = {}
            for k, v in inputs.items():
                if k in data:
                    size = np.shape(v)[0] // micro_batches
                    v = np.asarray(v)[i * size : (i + 1) * size]
                chunk[k] = v
            results.append(reference_loss_and_grads(small, chunk, weights))
        loss = sum(r[0] for r in results) / micro_batches
        grads = {k: sum(r[1][k] for r in results) / micro_batches for k in weights}
        return loss, grads
    terms = _loss_terms(pcg)

    def loss(params: dict[str, Any], others: dict[str, Any]) -> Any:
        values = reference_values(pcg, {**others, **params})
        return sum(jnp.mean(values[r].astype(jnp.float32)) for r in terms)

    cast = {
        k: jnp.asarray(v, _dtype(pcg.shape(k).dtype.value))
        for k, v in {**inputs, **weights}.items()
    }
    params = {k: cast[k] for k in weights}
    others = {k: cast[k] for k in inputs}
    return jax.jit(jax.value_and_grad(loss))(params, others)


# --- The plan as shardings -----------------------------------------------------------------------


@dataclass(frozen=True)
class PlanShardings:
    """The plan as ``NamedSharding``s on ``mesh`` (:func:`shardings`): for every graph input and
    weight (``sources``, in the layout the plan stores it in) and every tensor the plan
    computes (``tensors``, by node name, ``node:i`` for a further output). ``partial``: the
    tensors the plan holds as partial sums, with the mesh axes they are summed over; a
    ``NamedSharding`` cannot say that, so theirs shows only how their blocks are split."""

    pcg: PCG
    mesh: Any
    sources: Mapping[str, Any]
    tensors: Mapping[str, Any]
    partial: Mapping[str, tuple[str, ...]]
    optimizer: str = "adam"

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in self.mesh.shape.items())
        return (
            f"PlanShardings({len(self.sources)} inputs and weights, {len(self.tensors)} tensors on "
            f"a mesh of {self.mesh.size} devices ({axes}); {len(self.partial)} partial)"
        )

    def loss_and_grads_fn(self) -> Callable[..., Any]:
        """``f(weights, inputs) -> (loss, grads)``: the model (plain ``jax.numpy``, the plan's
        logical computation) with every computed tensor constrained to its sharding, jitted
        with the sources' shardings; GSPMD (XLA's SPMD partitioner) inserts the collectives."""
        pcg = self.pcg
        terms = _loss_terms(pcg)
        trained = {n.name for n in pcg.nodes if n.op == "weight" and n.params["trainable"]}

        def constrain(ref: TensorRef, value: Any) -> Any:
            sharding = self.tensors.get(str(ref))
            if sharding is None or str(ref) in self.partial:
                return value
            return jax.lax.with_sharding_constraint(value, sharding)

        def loss(params: dict[str, Any], others: dict[str, Any]) -> Any:
            values = reference_values(pcg, {**others, **params}, constrain)
            return sum(jnp.mean(values[r].astype(jnp.float32)) for r in terms)

        params = {k: v for k, v in self.sources.items() if k in trained}
        others = {k: v for k, v in self.sources.items() if k not in trained}
        return jax.jit(jax.value_and_grad(loss), in_shardings=(params, others))

    def compiled_text(self) -> str:
        """XLA's compiled HLO of :meth:`loss_and_grads_fn` on the plan's shapes."""
        pcg = self.pcg
        structs = {
            k: jax.ShapeDtypeStruct(pcg.shape(k).sizes, _dtype(pcg.shape(k).dtype.value))
            for k in self.sources
        }
        trained = {n.name for n in pcg.nodes if n.op == "weight" and n.params["trainable"]}
        params = {k: v for k, v in structs.items() if k in trained}
        others = {k: v for k, v in structs.items() if k not in trained}
        return self.loss_and_grads_fn().lower(params, others).compile().as_text()

    def collectives(self) -> CollectiveComparison:
        """The collectives GSPMD compiled for the forward and backward, beside the cost
        model's for the plan (XLA's partitioner chooses its own; the differences are the
        report's ``extra`` and ``missing``)."""
        compiled = compiled_collectives(self.compiled_text(), dict(self.mesh.shape))
        cost = iteration_cost(
            self.pcg,
            Machine.preset("dgx-h100", devices_per_node=self.mesh.size),
            optimizer=self.optimizer,
        )
        return compare_collectives(
            planned_collectives(self.pcg, cost, self.mesh.size),
            compiled,
            (n.name for n in self.pcg.nodes),
        )


def shardings(plan_or_pcg: Any, devices: Sequence[Any] | int | None = None) -> PlanShardings:
    """The plan as ``NamedSharding``s (:class:`PlanShardings`), for users who keep their own
    JAX code: put the inputs and weights in ``sources`` and constrain activations with
    ``tensors`` (``jax.lax.with_sharding_constraint``), and XLA's SPMD partitioner inserts the
    collectives. It may choose other collectives than the plan's explicit program
    (:func:`lower`); :meth:`PlanShardings.collectives` reports what it compiled."""
    lowered = lower(plan_or_pcg, devices)
    mesh, assignment, pcg = lowered.mesh, lowered.assignment, lowered.pcg
    sources = {n.name: lowered.sharding(n.name) for n in pcg.nodes if n.spec.kind is OpKind.SOURCE}
    tensors, partial = {}, {}
    for node in pcg.nodes:
        if node.spec.kind is OpKind.SOURCE:
            continue
        for i in range(len(pcg.output_shapes(node.name))):
            ref = TensorRef(node.name, i)
            layout = assignment.layout(ref)
            tensors[str(ref)] = NamedSharding(mesh, P(*layout.spec()))
            if layout.partial:
                partial[str(ref)] = layout.partial
    return PlanShardings(pcg, mesh, sources, tensors, partial, lowered.optimizer)
