"""Parallelism placement on a hierarchical machine (P^2, sections 2.1 and 3.1).

A plan with several parallelism *axes* (data parallelism of 4 times 4 parameter shards, say)
must decide which device runs which combination of axis indices. Of the ``16!`` assignments of
16 shards to 16 GPUs, P^2 keeps the hierarchy-aware ones: a :class:`ParallelismMatrix` has one
row per axis and one column per level of the machine hierarchy (outermost first); entry
``x[i][j]`` says into how many parts axis ``i`` is split at level ``j``. Every row multiplies to
its axis size and every column to its level's count::

    hierarchy [2, 8] (2 nodes of 8 GPUs), axes [4, 4]

    [[1, 4],      axis 0 (size 4): 1 part across nodes, 4 parts inside a node
     [2, 2]]      axis 1 (size 4): 2 parts across nodes, 2 inside a node

**Device numbering.** Devices are numbered as :class:`pcgopt.Machine` numbers them: a device's
number is its coordinate at every level, outermost most significant, read in mixed radix. Under
a matrix, the coordinate at level ``j`` is in turn the axes' digits at that level (radix
``x[i][j]``, axis 0 most significant), and axis ``i``'s index is its digits over the levels
(outermost most significant). So in the matrix above device 5 (node 0, GPU 5) holds axis
indices (2, 1): GPU 5 = axis-0 digit 2 and axis-1 digit 1 inside the node.

A *reduction* over some axes (the gradient AllReduce of data parallelism is a reduction over the
data-parallel axis) happens in groups of devices that agree on every other axis:
:meth:`ParallelismMatrix.groups`. Where those groups land in the hierarchy is what makes one
placement hundreds of times faster than another for the same reduction (P^2 section 4.1).

>>> m = ParallelismMatrix((2, 8), (4, 4), ((1, 4), (2, 2)))
>>> m
ParallelismMatrix([[1, 4], [2, 2]], hierarchy=[2, 8], axes=[4, 4])
>>> m.axis_indices(5)
(2, 1)
>>> m.groups([0])[:2]  # reductions over axis 0 stay inside a node
((0, 2, 4, 6), (1, 3, 5, 7))
>>> parallelism_matrices([2, 8], [4, 4])
[[[1, 4], [2, 2]], [[2, 2], [1, 4]]]
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pcgopt.divisors import divisors
from pcgopt.extract.costmodel.cost import (
    CostBreakdown,
    collective_cost,
    default_groups,
    iteration_cost,
    source_layouts,
)
from pcgopt.extract.costmodel.simulate import DDP, Runtime
from pcgopt.graph import PCG
from pcgopt.machine import Machine
from pcgopt.ops import OpKind

__all__ = [
    "ParallelismMatrix",
    "PlacementError",
    "PlanPlacement",
    "default_placement",
    "matrices",
    "parallel_nodes",
    "parallelism_matrices",
    "place_plan",
    "placement_groups",
    "plan_axes",
]


class PlacementError(ValueError):
    """A hierarchy, parallelism axes, matrix or reduction request that is not valid; the message
    names the argument at fault and what would be valid."""


def _positive_ints(values: object, what: str) -> tuple[int, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise PlacementError(f"{what} must be a list of positive integers, got {values!r}")
    out = tuple(values)
    if not out:
        raise PlacementError(f"{what} must not be empty")
    for i, v in enumerate(out):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlacementError(f"{what}[{i}] must be a positive integer, got {v!r}")
    return out


def _check_sizes(hierarchy: tuple[int, ...], axes: tuple[int, ...]) -> None:
    devices, product = math.prod(hierarchy), math.prod(axes)
    if devices != product:
        hint = (
            f"; add an axis of size {devices // product} (e.g. data parallelism) so that they do"
            if devices % product == 0
            else ""
        )
        raise PlacementError(
            f"the axes {list(axes)} multiply to {product} but the hierarchy {list(hierarchy)} "
            f"has {devices} devices; a parallelism matrix places every device{hint}"
        )


def reduce_axes_of(reduce_axes: object, num_axes: int) -> tuple[int, ...]:
    """The reduction axes as a sorted tuple of distinct axis numbers, checked."""
    if isinstance(reduce_axes, int) and not isinstance(reduce_axes, bool):
        reduce_axes = (reduce_axes,)
    if isinstance(reduce_axes, str | bytes) or not isinstance(reduce_axes, Iterable):
        raise PlacementError(f"reduce_axes must be a list of axis numbers, got {reduce_axes!r}")
    out = tuple(reduce_axes)
    if not out:
        raise PlacementError("reduce_axes must name at least one axis")
    for a in out:
        if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < num_axes:
            raise PlacementError(
                f"reduce axis {a!r} is not one of the {num_axes} axes (0..{num_axes - 1})"
            )
    if len(set(out)) != len(out):
        raise PlacementError(f"reduce_axes {list(out)} names an axis twice")
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class ParallelismMatrix:
    """Axes (rows) placed on hierarchy levels (columns), outermost level first; see the module
    docstring. Construction checks that rows multiply to the axes and columns to the levels."""

    hierarchy: tuple[int, ...]
    axes: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...]
    # Per level, the radix of every axis digit inside the level's coordinate.
    _strides: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)
    # groups() per reduction axes: placing a plan asks every parallel node's groups, thousands
    # of times per matrix for a deep model, and each answer walks every device.
    _groups: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        hierarchy = _positive_ints(self.hierarchy, "hierarchy")
        axes = _positive_ints(self.axes, "axes")
        _check_sizes(hierarchy, axes)
        if isinstance(self.rows, str | bytes) or not isinstance(self.rows, Iterable):
            raise PlacementError(f"rows must be a list of rows, got {self.rows!r}")
        rows = tuple(_positive_ints(r, f"rows[{i}]") for i, r in enumerate(self.rows))
        if len(rows) != len(axes):
            raise PlacementError(
                f"the matrix has {len(rows)} rows; axes {list(axes)} need one each"
            )
        for i, (row, size) in enumerate(zip(rows, axes, strict=True)):
            if len(row) != len(hierarchy):
                raise PlacementError(
                    f"rows[{i}] has {len(row)} entries; the hierarchy {list(hierarchy)} has "
                    f"{len(hierarchy)} levels"
                )
            if math.prod(row) != size:
                raise PlacementError(
                    f"rows[{i}] {list(row)} multiplies to {math.prod(row)}, "
                    f"not to axis {i}'s size {size}"
                )
        for j, count in enumerate(hierarchy):
            column = [r[j] for r in rows]
            if math.prod(column) != count:
                raise PlacementError(
                    f"column {j} {column} multiplies to {math.prod(column)}, not to level {j}'s "
                    f"count {count}"
                )
        object.__setattr__(self, "hierarchy", hierarchy)
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "rows", rows)
        strides = []
        for j in range(len(hierarchy)):
            s, acc = [0] * len(axes), 1
            for i in range(len(axes) - 1, -1, -1):
                s[i] = acc
                acc *= rows[i][j]
            strides.append(tuple(s))
        object.__setattr__(self, "_strides", tuple(strides))
        object.__setattr__(self, "_groups", {})

    def __repr__(self) -> str:
        return (
            f"ParallelismMatrix({[list(r) for r in self.rows]}, hierarchy={list(self.hierarchy)}, "
            f"axes={list(self.axes)})"
        )

    def to_list(self) -> list[list[int]]:
        """The rows as plain lists (what :func:`parallelism_matrices` returns)."""
        return [list(r) for r in self.rows]

    @property
    def num_devices(self) -> int:
        return math.prod(self.hierarchy)

    def coordinates(self, device: int) -> tuple[int, ...]:
        """The unit of every level (outermost first) that holds ``device``, as
        :meth:`pcgopt.Machine.coordinates` numbers them."""
        if isinstance(device, bool) or not isinstance(device, int):
            raise PlacementError(f"a device is an integer, got {device!r}")
        if not 0 <= device < self.num_devices:
            raise PlacementError(f"device {device} is not one of 0..{self.num_devices - 1}")
        coords, rest = [], device
        for count in reversed(self.hierarchy):
            coords.append(rest % count)
            rest //= count
        return tuple(reversed(coords))

    def digits(self, device: int) -> tuple[tuple[int, ...], ...]:
        """``digits[i][j]``: axis ``i``'s digit at level ``j`` for ``device``."""
        coords = self.coordinates(device)
        return tuple(
            tuple(
                (coords[j] // self._strides[j][i]) % self.rows[i][j]
                for j in range(len(self.hierarchy))
            )
            for i in range(len(self.axes))
        )

    def axis_indices(self, device: int) -> tuple[int, ...]:
        """The index along every axis of the shard ``device`` runs."""
        out = []
        for i, row in enumerate(self.digits(device)):
            index = 0
            for j, d in enumerate(row):
                index = index * self.rows[i][j] + d
            out.append(index)
        return tuple(out)

    def device(self, digits: Sequence[Sequence[int]]) -> int:
        """The device number of per-axis, per-level digits (the inverse of :meth:`digits`)."""
        for i, row in enumerate(self.rows):
            for j, radix in enumerate(row):
                try:
                    d = digits[i][j]
                except (IndexError, TypeError):
                    raise PlacementError(
                        f"digits must be {len(self.rows)} rows of {len(row)} digits, got {digits!r}"
                    ) from None
                if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < radix:
                    raise PlacementError(f"digits[{i}][{j}] must be in 0..{radix - 1}, got {d!r}")
        number = 0
        for j, count in enumerate(self.hierarchy):
            coord = sum(digits[i][j] * self._strides[j][i] for i in range(len(self.axes)))
            number = number * count + coord
        return number

    def groups(self, reduce_axes: int | Iterable[int]) -> tuple[tuple[int, ...], ...]:
        """The device groups of a reduction over ``reduce_axes``: devices that agree on every
        other axis, each group sorted by device number, groups ordered by their first device."""
        axes = reduce_axes_of(reduce_axes, len(self.axes))
        found = self._groups.get(axes)
        if found is None:
            by_key: dict[tuple[int, ...], list[int]] = {}
            for d in range(self.num_devices):
                idx = self.axis_indices(d)
                key = tuple(v for i, v in enumerate(idx) if i not in axes)
                by_key.setdefault(key, []).append(d)
            found = tuple(sorted((tuple(g) for g in by_key.values()), key=lambda g: g[0]))
            self._groups[axes] = found
        return found

    def reduction_levels(self, reduce_axes: int | Iterable[int]) -> tuple[tuple[int, int], ...]:
        """The synthesis hierarchy of a reduction over ``reduce_axes`` (P^2 section 2.5,
        hierarchy (d) collapsed): for every level where the reduction axes are split, ``(level,
        product of their factors there)``, outermost first. Levels where they are not split
        (factor 1) are left out: they form no groups of their own."""
        axes = reduce_axes_of(reduce_axes, len(self.axes))
        out = []
        for j in range(len(self.hierarchy)):
            factor = math.prod(self.rows[i][j] for i in axes)
            if factor > 1:
                out.append((j, factor))
        return tuple(out)


def _factorizations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Ordered factorizations of ``n`` into ``parts`` positive factors."""
    if parts == 1:
        yield (n,)
        return
    for f in divisors(n):
        for rest in _factorizations(n // f, parts - 1):
            yield (f, *rest)


def matrices(hierarchy: Sequence[int], axes: Sequence[int]) -> list[ParallelismMatrix]:
    """Every parallelism matrix placing ``axes`` on ``hierarchy`` (P^2 section 3.1), in a fixed
    order (column by column, factors in increasing order)."""
    hierarchy_t = _positive_ints(hierarchy, "hierarchy")
    axes_t = _positive_ints(axes, "axes")
    _check_sizes(hierarchy_t, axes_t)
    found: list[tuple[tuple[int, ...], ...]] = []

    def place(j: int, remaining: tuple[int, ...], columns: list[tuple[int, ...]]) -> None:
        if j == len(hierarchy_t):
            if all(r == 1 for r in remaining):
                found.append(tuple(zip(*columns, strict=True)))
            return
        later = math.prod(hierarchy_t[j + 1 :])
        for column in _factorizations(hierarchy_t[j], len(axes_t)):
            if any(r % c for r, c in zip(remaining, column, strict=True)):
                continue
            rest = tuple(r // c for r, c in zip(remaining, column, strict=True))
            if math.prod(rest) != later:  # always true given the products; cheap guard
                continue
            place(j + 1, rest, [*columns, column])

    place(0, axes_t, [])
    return [ParallelismMatrix(hierarchy_t, axes_t, rows) for rows in found]


def parallelism_matrices(hierarchy: Sequence[int], axes: Sequence[int]) -> list[list[list[int]]]:
    """Every parallelism matrix placing ``axes`` (e.g. ``[4, 8]``) on the system ``hierarchy``
    (e.g. ``[2, 16]``), each as a list of rows, one row per axis (P^2 section 3.1).

    >>> parallelism_matrices([2, 16], [4, 8])
    [[[1, 4], [2, 4]], [[2, 2], [1, 8]]]
    """
    return [m.to_list() for m in matrices(hierarchy, axes)]


# --- Placing a plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanPlacement:
    """Where a PCG's collectives run: ``axes`` (the plan's parallelism axes, an ``unused`` one
    last when the plan spans fewer devices than the machine), the chosen ``matrix`` (None when
    the plan has no axes this view can name, then the cost model's default placement is
    used), ``devices`` (the device groups of every parallel node, as
    :func:`pcgopt.extract.costmodel.cost.iteration_cost` takes them), its ``cost``, and every matrix
    tried with its iteration time (``tried``). ``reason`` says why the default was kept, if it
    was."""

    axes: tuple[int, ...]
    matrix: ParallelismMatrix | None
    devices: Mapping[str, tuple[tuple[int, ...], ...]]
    cost: CostBreakdown
    tried: tuple[tuple[ParallelismMatrix, float], ...] = ()
    reason: str = ""
    #: Matrices left untried because the time limit ran out.
    untried: int = 0

    @property
    def considered(self) -> int:
        """How many placements were tried."""
        return len(self.tried)

    def __repr__(self) -> str:
        where = self.matrix.to_list() if self.matrix is not None else f"default ({self.reason})"
        cut = f", {self.untried} left untried (time limit)" if self.untried else ""
        return (
            f"PlanPlacement(axes={list(self.axes)}, matrix={where}, "
            f"{self.cost.total_s * 1e3:.4g} ms, {self.considered} matrices tried{cut})"
        )


def parallel_nodes(pcg: PCG) -> list[tuple[str, int, int]]:
    """(name, degree, width) of every parallel node that takes a degree: ``width`` is the number of
    devices its groups cover, the most shards among its inputs and outputs; for a trainable weight's
    Replicate, the width of the layouts the weight is stored in below it
    (:func:`~pcgopt.extract.costmodel.cost.source_layouts`), where the cost model syncs its gradient
    in groups of its degree (a weight copied 2 then 3 ways: 3 groups of 2), if they all have one
    width (:func:`_synced_widths`)."""
    return _parallel_nodes(pcg, _synced_widths(pcg))


def default_placement(pcg: PCG) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The device groups of every parallel node that takes a degree in the cost model's
    default placement (consecutive devices)."""
    return {name: default_groups(degree, width) for name, degree, width in parallel_nodes(pcg)}


def _synced_widths(pcg: PCG) -> dict[str, set[int]]:
    """For each Replicate of a trainable weight: the widths of the layouts below it in which
    the weight is stored (those its gradient is synced in)."""
    source_of, stored = source_layouts(pcg)
    out = {}
    for node in pcg.nodes:
        source = pcg.node(source_of.get(node.name, node.name))
        if node.op == "replicate" and source.op == "weight" and source.params["trainable"]:
            out[node.name] = {pcg.shape(layout).num_shards for layout in stored[node.name]}
    return out


def _parallel_nodes(pcg: PCG, synced: Mapping[str, set[int]]) -> list[tuple[str, int, int]]:
    out = []
    for node in pcg.nodes:
        if node.spec.kind is OpKind.PARALLEL and "degree" in node.params:
            widths = synced.get(node.name, ())
            if len(widths) == 1:
                (width,) = widths
            else:
                width = max(
                    max(s.num_shards for s in pcg.input_shapes(node.name)),
                    max(s.num_shards for s in pcg.output_shapes(node.name)),
                )
            out.append((node.name, int(node.params["degree"]), width))
    return out


def _axis_nodes(pcg: PCG) -> list[tuple[str, int, int]]:
    """The parallel nodes whose groups the plan's axes place: those of :func:`parallel_nodes` with
    a degree above 1 (a weight's Replicates at the width of the layouts below them), less those
    of a branch narrowed below the plan's width. Such a node is one group on all of its devices,
    and nothing it is chained to through parallel nodes, up to the compute nodes on either side
    (a weight's Replicate up to the MatMul reading it), spans more devices. Its group is the
    block of consecutive devices the machine mapping gives the branch, wherever that block
    starts, as in the cost model's default placement; naming it by an axis of the wider nodes
    would scatter it over the hierarchy (a 2-device branch across both sockets of a node) for no
    gain. A chain that reaches wider nodes keeps the axes: a Combine after a tensor-parallel
    layer finds its shards where the axes put them."""
    # A weight's Replicate stored at several widths is left out: no one list of groups serves
    # them all, and it keeps the default placement.
    synced = _synced_widths(pcg)
    nodes = [n for n in _parallel_nodes(pcg, synced) if n[1] > 1 and len(synced.get(n[0], ())) <= 1]
    width = max((w for _, _, w in nodes), default=0)
    order = pcg.nodes
    own = {
        n.name: max(s.num_shards for s in (*pcg.input_shapes(n.name), *pcg.output_shapes(n.name)))
        for n in order
    }
    chained: dict[str, list[str]] = {n.name: [] for n in order}  # over tensors of >1 shard
    for n in order:
        for r in n.inputs:
            if pcg.shape(r).num_shards > 1:
                chained[n.name].append(r.node)
                chained[r.node].append(n.name)
    # The widest node of each chain of parallel nodes, its compute ends included.
    chain_width: dict[str, int] = {}
    for n in order:
        if n.name in chain_width or n.spec.kind is OpKind.COMPUTE:
            continue
        members, stack, widest = [], [n.name], 0
        seen = {n.name}
        while stack:
            name = stack.pop()
            widest = max(widest, own[name])
            if pcg.node(name).spec.kind is OpKind.COMPUTE:
                continue  # an end of the chain
            members.append(name)
            for other in chained[name]:
                if other not in seen:
                    seen.add(other)
                    stack.append(other)
        for name in members:
            chain_width[name] = widest
    return [n for n in nodes if not n[1] == n[2] == chain_width[n[0]] < width]


def _subsets_with_product(axes: tuple[int, ...], value: int) -> list[tuple[int, ...]]:
    """The sets of axis positions whose sizes multiply to ``value``."""
    out = []
    for mask in range(1, 1 << len(axes)):
        chosen = tuple(i for i in range(len(axes)) if mask >> i & 1)
        if math.prod(axes[i] for i in chosen) == value:
            out.append(chosen)
    return out


def _factorizations_into(n: int, largest: int) -> Iterator[tuple[int, ...]]:
    """Factorizations of ``n`` into factors > 1 in non-increasing order, none above
    ``largest``."""
    if n == 1:
        yield ()
        return
    for f in range(min(n, largest), 1, -1):
        if n % f == 0:
            for rest in _factorizations_into(n // f, f):
                yield (f, *rest)


def plan_axes(pcg: PCG) -> tuple[tuple[int, ...], dict[int, tuple[int, ...]], str]:
    """The parallelism axes of a plan, read from the degrees of its parallel nodes but those of
    narrowed branches (:func:`_axis_nodes`): the fewest axes, multiplying to the plan's width,
    such that every degree is the product of exactly one set of them (data parallelism 2 x
    tensor parallelism 4 on 8 devices, with collectives of degree 2, 4 and 8: axes [4, 2],
    degree 8 spanning both). Returns the axes, the axes each degree spans, and, when no such
    axes exist (two nested axes of the same size, whose collectives could run on either), empty
    axes and the reason."""
    return _axes_of(_axis_nodes(pcg))


def _axes_of(
    nodes: list[tuple[str, int, int]],
) -> tuple[tuple[int, ...], dict[int, tuple[int, ...]], str]:
    """:func:`plan_axes` from the plan's :func:`_axis_nodes`."""
    if not nodes:
        return (), {}, "the plan has no parallel operators"
    width = max(w for _, _, w in nodes)
    degrees = sorted({d for _, d, _ in nodes}, reverse=True)
    best: tuple[tuple[int, ...], dict[int, tuple[int, ...]]] | None = None
    for axes in _factorizations_into(width, width):
        spans = {d: _subsets_with_product(axes, d) for d in degrees}
        if all(len(v) == 1 for v in spans.values()) and (best is None or len(axes) < len(best[0])):
            best = axes, {d: v[0] for d, v in spans.items()}
    if best is None:
        return (
            (),
            {},
            (
                f"no axes name the degrees {degrees} of the plan's {width} devices unambiguously "
                "(nested axes of the same size)"
            ),
        )
    return best[0], best[1], ""


def sub_hierarchies(counts: Sequence[int], devices: int) -> list[tuple[int, ...]]:
    """The ways to take ``devices`` devices from a machine of level ``counts`` as a regular
    sub-machine: at every level the first ``c_j <= counts[j]`` units, with the product of the
    ``c_j`` equal to ``devices``."""
    out: list[tuple[int, ...]] = []

    def pick(j: int, left: int, chosen: tuple[int, ...]) -> None:
        if j == len(counts):
            if left == 1:
                out.append(chosen)
            return
        for c in range(1, min(counts[j], left) + 1):
            if left % c == 0:
                pick(j + 1, left // c, (*chosen, c))

    pick(0, devices, ())
    return out


def batch_split_only(plan: PCG) -> bool:
    """Whether every tensor of ``plan`` is split along its first (batch) dimension at most,
    with copies, or holds partial sums alone (a loss summed over the batch shards): data
    parallelism, at one degree or several. Numbering each tensor's shards batch block first,
    copies next, every collective's group is then consecutive devices, the cost model's
    default placement. One move goes uncharged: after an AllGather that narrows a tensor, the
    copy DiscardCopies keeps of a block may sit on another device than the narrower reader's
    (DiscardCopies moves no data in the cost model), at most one shard per device."""
    for node in plan.nodes:
        for shape in plan.output_shapes(node.name):
            if any(d > 1 for d in shape.degrees[1:]):
                return False
            if shape.sum_degree > 1 and (shape.num_shards > shape.sum_degree):
                return False  # partial sums beside another split (a row-parallel output)
    return True


def _on_machine(matrix: ParallelismMatrix, machine: Machine) -> list[int]:
    """The machine device of each device of ``matrix``'s (sub-)machine: the one with the same
    coordinates."""
    return [machine.device_at(matrix.coordinates(d)) for d in range(matrix.num_devices)]


def _span_groups(
    matrix: ParallelismMatrix,
    on_machine: Sequence[int],
    span: tuple[int, ...],
    degree: int,
    width: int,
) -> tuple[tuple[int, ...], ...]:
    """The groups of a collective of ``degree`` over the axes ``span`` on a tensor of ``width``
    shards: the first ``width // degree`` of the matrix's groups, as machine devices."""
    return tuple(tuple(on_machine[d] for d in g) for g in matrix.groups(span)[: width // degree])


def place_plan(
    pcg: PCG,
    machine: Machine,
    *,
    optimizer: str = "adam",
    runtime: Runtime = DDP,
    default_cost: CostBreakdown | None = None,
    time_limit_s: float | None = None,
) -> PlanPlacement:
    """The fastest placement of a plan's parallelism axes on the machine hierarchy. For every
    regular sub-machine of the plan's width (:func:`sub_hierarchies`; the whole machine when the
    plan uses every device) and every parallelism matrix of the axes of :func:`plan_axes` on it, the
    collectives of each degree run in the groups of the axes it spans
    (:meth:`ParallelismMatrix.groups`); the one with the lowest iteration time under
    :func:`pcgopt.extract.costmodel.cost.iteration_cost` is kept (feasible ones first). Reductions
    that span levels are priced with the best synthesized program, so placement and reduction
    strategy are chosen together. The nodes of a branch narrowed to one group of fewer devices keep
    the default's consecutive devices (:func:`_axis_nodes`), so that the machine mapping can run the
    branch beside others. Plans whose axes cannot be named keep the cost model's default placement,
    with the reason (``default_cost``: its cost, if already known). ``time_limit_s``: checked before
    every matrix but the first; the matrices not reached are counted in
    :attr:`PlanPlacement.untried`."""
    nodes = _axis_nodes(pcg)
    axes, spans, reason = _axes_of(nodes)
    default = default_cost or iteration_cost(pcg, machine, optimizer=optimizer, runtime=runtime)
    if not axes:
        return PlanPlacement((), None, {}, default, (), reason)
    width = max(w for _, _, w in nodes)
    candidates = [m for sub in sub_hierarchies(machine.counts, width) for m in matrices(sub, axes)]
    if not candidates:
        return PlanPlacement(axes, None, {}, default, (), "no regular sub-machine fits the plan")
    best: PlanPlacement | None = None
    tried = []
    start = time.perf_counter()
    for m in candidates:
        if tried and time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            break
        on_machine = _on_machine(m, machine)
        devices: dict[str, tuple[tuple[int, ...], ...]] = {}
        # One tuple per (degree, width), shared by the nodes that have it: the cost model
        # checks each distinct group list once.
        shared: dict[tuple[int, int], tuple[tuple[int, ...], ...]] = {}
        for name, degree, w in nodes:
            if (degree, w) not in shared:
                shared[degree, w] = _span_groups(m, on_machine, spans[degree], degree, w)
            devices[name] = shared[degree, w]
        cost = iteration_cost(pcg, machine, devices=devices, optimizer=optimizer, runtime=runtime)
        tried.append((m, cost.total_s))
        if best is None or (not cost.feasible, cost.total_s) < (
            not best.cost.feasible,
            best.cost.total_s,
        ):
            best = PlanPlacement(axes, m, devices, cost)
    assert best is not None
    return replace(best, tried=tuple(tried), untried=len(candidates) - len(tried))


#: The message size :func:`placement_groups` compares a degree's possible groups at.
_NOMINAL_BYTES = 64 * 2**20


def placement_groups(
    placement: PlanPlacement, machine: Machine
) -> Callable[[int, int], tuple[tuple[int, ...], ...]]:
    """The device groups of a collective of ``degree`` on ``width`` shards (and of a weight's
    gradient sync among its copies) under ``placement``, for any degree, not only the plan's:
    what extraction with placement in the loop costs the e-graph's other choices by
    (``enode_costs(..., groups=...)``), so that they are priced on devices the placed plan
    really has. A degree that is the product of a set of the placement's axes runs in those
    axes' groups (:meth:`ParallelismMatrix.groups`; of several such sets, the one whose
    AllReduce of 64 MiB is fastest), on the first ``width // degree`` groups as
    :func:`place_plan` takes them. A degree no axes make, or a tensor wider than the placed
    plan, would need a placement of its own: its groups are spread as far apart as the
    numbering allows (every ``width // degree``-th device), the placement that crosses the
    outermost levels most, so a choice the placement cannot give is not priced as if it had
    the closest devices. Without a matrix (the default placement kept), the default's
    consecutive groups."""
    matrix = placement.matrix
    if matrix is None:
        return default_groups
    on_machine = _on_machine(matrix, machine)
    found: dict[tuple[int, int], tuple[tuple[int, ...], ...]] = {}

    def groups(degree: int, width: int) -> tuple[tuple[int, ...], ...]:
        key = degree, width
        if key in found:
            return found[key]
        spans = _subsets_with_product(matrix.axes, degree) if width <= matrix.num_devices else []
        if not spans:
            stride = max(1, width // degree)
            found[key] = tuple(tuple(range(g, width, stride)) for g in range(stride))
            return found[key]
        best: tuple[float, tuple[tuple[int, ...], ...]] | None = None
        for span in spans:
            among = _span_groups(matrix, on_machine, span, degree, width)
            seconds = collective_cost("all_reduce", among, _NOMINAL_BYTES, machine).seconds
            if best is None or seconds < best[0]:
                best = seconds, among
        assert best is not None
        found[key] = best[1]
        return found[key]

    return groups
