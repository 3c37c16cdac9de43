"""Where every shard of a PCG lives on a device mesh: the layouts an SPMD program needs.

A PCG fixes what every shard of every tensor holds (:mod:`pcgopt.sharded`), not which device
holds it. An SPMD program (one program on every device of a mesh, as ``jax.shard_map`` runs it)
needs the second: each device computes the blocks its mesh coordinates name. This module
chooses it.

**The mesh.** A :class:`DeviceGrid` has one axis per prime factor of each machine level's device
count, outermost level first (8 GPUs: axes ``gpu0, gpu1, gpu2`` of size 2; 2 nodes of 6 GPUs:
``node``, ``gpu0`` (2), ``gpu1`` (3)). Devices are numbered as the machine numbers them, so a
group of consecutive devices is a set of inner axes.

**Layouts.** A :class:`MeshLayout` says, for every dimension of a tensor, the mesh axes its
blocks are spread over (major first: block index ``i * 2 + j`` on axes ``(a, b)`` of sizes
``(.., 2)`` is on the devices at ``a = i, b = j``), and the axes that hold its partial sums
(the same order; the sum over them is the tensor). A tensor is the same on every device along
any other axis: copies, and devices the tensor does not need, hold it too. So a device's
coordinates on a tensor's axes name the block and the partial sum it holds, which is what
:func:`pcgopt.evaluate` puts at that shard index, and an operator can run on every device at
once:

* a compute operator needs its inputs' blocks of each loop axis on the same mesh axes (matmul's
  contraction dimension of ``a`` and ``b``), and every tensor's axes distinct;
* Partition and ToPartial (and StackPartial) take new axes; Combine and Reduce give back the
  last axes of their dimension or partial sums (adjacent blocks, adjacent partial sums);
  ReduceScatter and AllToAll hand the axes they free to the dimension they split, which makes
  each of them one collective.

**The assignment.** Every degree a Partition, ToPartial or StackPartial introduces becomes
symbolic factors (one per prime factor, in increasing order); compute operators unify the
factors of the loop axes they share; each class of unified factors must then get a mesh axis
of its size, distinct from the axes of every class it shares a tensor with. That is graph
colouring (:func:`assign_layouts`: classes in order of first appearance, each on the first free
axis, with backtracking), and a plan may need more devices than its widest tensor when three
classes pairwise share tensors: the caller then retries on a larger grid. A plan that no grid
serves (a tensor whose dimension was split 2 then 3 ways combined by 2, or a transpose that
puts one class on two dimensions of a tensor) gets a :class:`LayoutError` naming the node.

>>> from pcgopt import PCGBuilder
>>> b = PCGBuilder()
>>> x, w = b.input((8, 4), name="x"), b.weight((4, 6), name="w")
>>> y = b.matmul(b.partition(x, dim=0, degree=2), b.replicate(w, degree=2))
>>> plan = b.build(b.combine(y, dim=0, degree=2))
>>> assigned = assign_layouts(plan, DeviceGrid.flat(2))
>>> assigned.layout("matmul_1")
MeshLayout([d, -])
>>> assigned.layout("combine_1")
MeshLayout([-, -])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.cost import source_layouts
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.ops import OpKind
from pcgopt.ops.parallel import ParallelOp
from pcgopt.ops.spec import AxisKind, axis_degrees

__all__ = [
    "DeviceGrid",
    "LayoutAssignment",
    "LayoutError",
    "MeshLayout",
    "assign_layouts",
    "prime_factors",
]


class LayoutError(PCGError):
    """No SPMD layout serves the plan on the given devices; the message names the node."""


def prime_factors(n: int) -> tuple[int, ...]:
    """Prime factors in increasing order, with repetition.

    >>> prime_factors(12)
    (2, 2, 3)
    """
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DeviceGrid:
    """Mesh axes (names and sizes, outermost first) over ``size`` devices numbered in
    row-major order; see the module docstring."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.names) != len(self.sizes) or len(set(self.names)) != len(self.names):
            raise LayoutError(f"a device grid needs one distinct name per axis, got {self!r}")
        for n in self.sizes:
            if isinstance(n, bool) or not isinstance(n, int) or n < 2:
                raise LayoutError(f"mesh axes have sizes of at least 2, got {list(self.sizes)}")

    @classmethod
    def from_levels(cls, levels: Sequence[tuple[str, int]]) -> DeviceGrid:
        """One axis per prime factor of each level's count, outermost level first: a level of
        one factor keeps its name, others get ``name0, name1, ...``.

        >>> DeviceGrid.from_levels([("node", 2), ("gpu", 6)])
        DeviceGrid(node=2, gpu0=2, gpu1=3)
        """
        names: list[str] = []
        sizes: list[int] = []
        for name, count in levels:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise LayoutError(
                    f"level {name!r} must have a positive device count, got {count!r}"
                )
            factors = prime_factors(count)
            for i, p in enumerate(factors):
                names.append(name if len(factors) == 1 else f"{name}{i}")
                sizes.append(p)
        return cls(tuple(names), tuple(sizes))

    @classmethod
    def flat(cls, devices: int, name: str = "d") -> DeviceGrid:
        """A grid of one level of ``devices`` devices.

        >>> DeviceGrid.flat(8)
        DeviceGrid(d0=2, d1=2, d2=2)
        """
        return cls.from_levels([(name, devices)])

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.sizes

    def axis_size(self, name: str) -> int:
        return self.sizes[self.names.index(name)]

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={s}" for n, s in zip(self.names, self.sizes, strict=True))
        return f"DeviceGrid({inner})"


Axes = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MeshLayout:
    """The mesh axes of each dimension of a tensor and of its partial sums (module docstring).
    Written ``[d0.d1, -] partial(d2)``: dimension 0 over axes d0 and d1, dimension 1 whole,
    partial sums over d2; every other axis holds copies."""

    dims: tuple[Axes, ...]
    partial: Axes = ()

    @property
    def axes(self) -> Axes:
        """Every axis the tensor varies along: its dimensions' and its partial sums'."""
        return (*(a for d in self.dims for a in d), *self.partial)

    def spec(self) -> tuple[str | Axes | None, ...]:
        """The dimensions as ``jax.sharding.PartitionSpec`` entries (partial sums are not part
        of a ``PartitionSpec``)."""
        return tuple(None if not d else d[0] if len(d) == 1 else d for d in self.dims)

    def __repr__(self) -> str:
        dims = ", ".join(".".join(d) if d else "-" for d in self.dims)
        partial = f" partial({'.'.join(self.partial)})" if self.partial else ""
        return f"MeshLayout([{dims}]{partial})"


@dataclass(frozen=True)
class LayoutAssignment:
    """Every tensor's :class:`MeshLayout` on ``grid``, and for each source stored in a layout
    (a weight partitioned or replicated where it is kept), which nodes' values are the source
    as loaded: ``stored[node]`` is the source node it loads (see
    :func:`pcgopt.extract.costmodel.cost.source_layouts`)."""

    pcg: PCG
    grid: DeviceGrid
    layouts: Mapping[TensorRef, MeshLayout]
    stored: Mapping[str, str] = field(default_factory=dict)

    def layout(self, ref: TensorRef | str) -> MeshLayout:
        return self.layouts[TensorRef.parse(ref)]


# --- The symbolic pass ---------------------------------------------------------------------------


class _Factors:
    """Symbolic mesh factors of prime sizes, unified with a union-find."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.origin: list[str] = []  # the node that introduced the factor, for messages

    def fresh(self, degree: int, node: str) -> list[int]:
        out = []
        for p in prime_factors(degree):
            self.parent.append(len(self.parent))
            self.size.append(p)
            self.origin.append(node)
            out.append(len(self.parent) - 1)
        return out

    def find(self, v: int) -> int:
        root = v
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[v] != root:
            self.parent[v], v = root, self.parent[v]
        return root

    def unify(self, a: Sequence[int], b: Sequence[int], node: Node, what: str) -> None:
        sa, sb = [self.size[v] for v in a], [self.size[v] for v in b]
        if sa != sb:
            raise LayoutError(
                f"node {node.name!r} ({node.op}): {what} are split as {_text(sa)} in one input "
                f"and {_text(sb)} in another; an SPMD program needs their blocks on the same "
                "devices, and these splits place them differently (split both in the same order)",
                node=node.name,
            )
        for x, y in zip(a, b, strict=True):
            rx, ry = self.find(x), self.find(y)
            if rx != ry:
                self.parent[max(rx, ry)] = min(rx, ry)


def _text(sizes: Sequence[int]) -> str:
    return "x".join(map(str, sizes)) or "whole"


@dataclass
class _Sym:
    dims: list[list[int]]
    partial: list[int]

    def copy(self) -> _Sym:
        return _Sym([list(d) for d in self.dims], list(self.partial))

    def factors(self) -> list[int]:
        return [v for d in self.dims for v in d] + self.partial


def _suffix(vs: list[int], degree: int, factors: _Factors, node: Node, what: str) -> list[int]:
    """The trailing factors of ``vs`` whose sizes multiply to ``degree``."""
    product, k = 1, len(vs)
    while product < degree and k > 0:
        k -= 1
        product *= factors.size[vs[k]]
    if product != degree:
        sizes = [factors.size[v] for v in vs]
        raise LayoutError(
            f"node {node.name!r} ({node.op}): it joins {degree} adjacent blocks of {what}, but "
            f"those blocks are split as {_text(sizes)} (most significant first) and no trailing "
            f"factors multiply to {degree}; on a mesh the joined blocks would not be one group",
            node=node.name,
        )
    return vs[k:]


def _parallel(node: Node, x: _Sym, factors: _Factors) -> _Sym:
    """A parallel operator's output layout from its primitive steps: a split that follows a
    join or a reduction in the same operator takes the factors it freed (ReduceScatter,
    AllToAll: one collective)."""
    out = x.copy()
    spec = node.spec
    assert isinstance(spec, ParallelOp)
    freed: list[int] = []
    for kind, dim, degree in spec.steps(node.params):
        if kind == "partition":
            if freed and math.prod(factors.size[v] for v in freed) == degree:
                new, freed = freed, []
            else:
                new = factors.fresh(degree, node.name)
            out.dims[dim] += new
        elif kind == "combine":
            freed = _suffix(out.dims[dim], degree, factors, node, f"dimension {dim}")
            del out.dims[dim][len(out.dims[dim]) - len(freed) :]
        elif kind == "reduce":
            freed = _suffix(out.partial, degree, factors, node, "its partial sums")
            del out.partial[len(out.partial) - len(freed) :]
        elif kind == "to_partial":
            out.partial += factors.fresh(degree, node.name)
        # replicate, discard: copies are every axis a tensor does not vary along
    return out


def _compute(node: Node, pcg: PCG, ins: list[_Sym], factors: _Factors) -> list[_Sym]:
    """A compute operator's output layouts; unifies the factors its loop axes share."""
    spec = node.spec
    shapes = pcg.input_shapes(node.name)
    outs = pcg.output_shapes(node.name)
    sig = spec.signature(node.params, tuple(s.sizes for s in shapes), tuple(o.sizes for o in outs))
    degrees = axis_degrees(spec, sig, shapes)
    axis_factors: dict[str, list[int]] = {}
    for ax in sig.axes:
        if degrees[ax.name] == 1:
            continue
        lists = [ins[i].dims[d] for i, d in enumerate(ax.inputs) if d is not None]
        for other in lists[1:]:
            factors.unify(lists[0], other, node, f"the blocks of its {ax.name!r} axis")
        axis_factors[ax.name] = list(lists[0])
    partial: list[int] = []
    if sig.joint:
        if shapes and shapes[0].sum_degree > 1:
            for other in ins[1:]:
                factors.unify(ins[0].partial, other.partial, node, "the partial sums it pairs")
            partial = list(ins[0].partial)
    else:
        for i in sig.linear_in:
            if shapes[i].sum_degree > 1:
                partial += ins[i].partial
    for ax in sig.axes:
        if ax.kind is AxisKind.REDUCE and ax.name in axis_factors:
            partial += axis_factors[ax.name]
    result = []
    for o, out in enumerate(outs):
        dims: list[list[int]] = [[] for _ in range(out.rank)]
        for ax in sig.axes:
            if ax.name in axis_factors and o < len(ax.outputs) and ax.outputs[o] is not None:
                dims[ax.outputs[o]] = list(axis_factors[ax.name])
        result.append(_Sym(dims, list(partial)))
    return result


def _symbolic(pcg: PCG, factors: _Factors) -> dict[TensorRef, _Sym]:
    sym: dict[TensorRef, _Sym] = {}
    for node in pcg.nodes:
        spec = node.spec
        if spec.kind is OpKind.SOURCE:
            sym[TensorRef(node.name)] = _Sym([[] for _ in pcg.shape(node.name).sizes], [])
            continue
        ins = [sym[r] for r in node.inputs]
        if node.op == "stack_partial":
            for other in ins[1:]:
                factors.unify(ins[0].factors(), other.factors(), node, "the inputs' blocks")
            out = ins[0].copy()
            out.partial += factors.fresh(len(ins), node.name)
            outs = [out]
        elif spec.kind is OpKind.PARALLEL:
            outs = [_parallel(node, ins[0], factors)]
        else:
            outs = _compute(node, pcg, ins, factors)
        for i, out in enumerate(outs):
            sym[TensorRef(node.name, i)] = out
    return sym


# --- Colouring ---------------------------------------------------------------------------------


def _colour(
    classes: list[int],
    size: Mapping[int, int],
    conflicts: Mapping[int, set[int]],
    grid: DeviceGrid,
    budget: int = 20_000,
) -> dict[int, str] | None:
    """Each class a grid axis of its size, conflicting classes on different axes: classes in
    order (of first appearance), each on the first axis free of its neighbours' (so the first
    classes, the input's batch split, get the outermost axes), backtracking within ``budget``
    steps. None when none is found."""
    by_size: dict[int, list[str]] = {}
    for name, n in zip(grid.names, grid.sizes, strict=True):
        by_size.setdefault(n, []).append(name)
    chosen: dict[int, str] = {}
    steps = 0

    def place(k: int) -> bool:
        nonlocal steps
        if k == len(classes):
            return True
        steps += 1
        if steps > budget:
            return False
        c = classes[k]
        taken = {chosen[o] for o in conflicts[c] if o in chosen}
        for axis in by_size.get(size[c], ()):
            if axis not in taken:
                chosen[c] = axis
                if place(k + 1):
                    return True
                del chosen[c]
        return False

    return chosen if place(0) else None


def _check_distinct(pcg: PCG, sym: Mapping[TensorRef, _Sym], factors: _Factors) -> None:
    for ref, s in sym.items():
        roots = [factors.find(v) for v in s.factors()]
        if len(set(roots)) != len(roots):
            node = pcg.node(ref.node)
            raise LayoutError(
                f"node {ref.node!r} ({node.op}): tensor {ref} would need the same devices for "
                f"two of its splits ({pcg.shape(ref)}): its inputs' splits were tied together by "
                "the operators between them (a transpose that swaps two split dimensions, say), "
                "so no SPMD layout holds each shard on its own device",
                node=ref.node,
            )


def _stored_sources(pcg: PCG) -> dict[str, str]:
    """For every node that is a source as loaded (the source itself or a Partition/Replicate
    chain below it) and that something other than that chain reads, the source's name."""
    _, stored = source_layouts(pcg)
    out: dict[str, str] = {}
    for node in pcg.nodes:
        if node.spec.kind is OpKind.SOURCE:
            for layout in stored.get(node.name, ()):
                out[layout] = node.name
    return out


def assign_layouts(pcg: PCG, grid: DeviceGrid) -> LayoutAssignment:
    """Every tensor of ``pcg`` a :class:`MeshLayout` on ``grid`` (module docstring). Raises
    :class:`LayoutError` when the plan has no SPMD layout, or none on this grid (the message
    says how many axes of which size it needs)."""
    if not isinstance(pcg, PCG):
        raise LayoutError(f"assign_layouts takes a pcgopt.PCG, got {type(pcg).__name__}")
    factors = _Factors()
    sym = _symbolic(pcg, factors)
    _check_distinct(pcg, sym, factors)
    order: dict[int, None] = {}
    conflicts: dict[int, set[int]] = {}
    for s in sym.values():
        roots = [factors.find(v) for v in s.factors()]
        for r in roots:
            order.setdefault(r, None)
            conflicts.setdefault(r, set()).update(o for o in roots if o != r)
    classes = list(order)
    size = {c: factors.size[c] for c in classes}
    available = {p: grid.sizes.count(p) for p in set(grid.sizes)}
    for c in classes:
        if size[c] not in available:
            raise LayoutError(
                f"node {factors.origin[c]!r} splits by a factor of {size[c]}, but the mesh "
                f"{grid!r} ({grid.size} devices) has no axis of that size",
                node=factors.origin[c],
            )
    chosen = _colour(classes, size, conflicts, grid)
    if chosen is None:
        need = _lower_bound(classes, size, conflicts)
        short = {p: n for p, n in need.items() if n > available.get(p, 0)}
        detail = ", ".join(f"{n} axes of size {p}" for p, n in sorted(short.items()))
        raise LayoutError(
            f"the plan's splits need more mesh axes than {grid!r} has"
            + (f" (at least {detail})" if detail else " (no colouring found within the budget)")
            + ": some tensors share splits pairwise, so a larger mesh would run it, with "
            "copies on the extra devices"
        )
    layouts = {
        ref: MeshLayout(
            tuple(tuple(chosen[factors.find(v)] for v in d) for d in s.dims),
            tuple(chosen[factors.find(v)] for v in s.partial),
        )
        for ref, s in sym.items()
    }
    return LayoutAssignment(pcg, grid, layouts, _stored_sources(pcg))


def _lower_bound(
    classes: Iterable[int], size: Mapping[int, int], conflicts: Mapping[int, set[int]]
) -> dict[int, int]:
    """Per size, the largest set of pairwise conflicting classes found greedily: axes any
    colouring needs."""
    need: dict[int, int] = {}
    for c in classes:
        clique = [c]
        for o in sorted(conflicts[c]):
            if size[o] == size[c] and all(o in conflicts[m] for m in clique):
                clique.append(o)
        need[size[c]] = max(need.get(size[c], 0), len(clique))
    return need
