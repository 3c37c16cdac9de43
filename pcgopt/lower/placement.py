"""The plan's device groups on a mesh: which device sits at each mesh coordinate.

A plan's placement (P^2's parallelism matrix, then the machine mapping's offsets) says, for every
parallel node, which devices its collective runs over:
:attr:`pcgopt.extract.search.plan.Plan.mapping`,
groups of device numbers (the cost model's default for a bare PCG: consecutive devices). A
layout assignment (:mod:`pcgopt.lower.layout`) says which mesh axes each node's collective runs
over (:func:`collective_axes`). The two meet in the mesh's device order: the device at every
mesh position. :func:`device_order` finds an order in which each node's mesh groups are the
plan's groups, so the program runs every collective on the devices the cost model priced it on
(the links it crosses, the level it spans).

**The search.** Positions (row-major over the mesh) take devices one at a time, the lowest
device that keeps every constraint so far, with backtracking: two positions in one mesh group
of a node must hold devices in one of its plan groups, and two in different mesh groups devices
in different plan groups. A node whose plan groups cover only some devices (a branch the
machine mapping narrows to a block) constrains those devices only: the program holds its
tensors on the other devices too, as copies. Nodes with the same mesh groups and plan groups
are one constraint (a deep model has thousands of nodes and a handful of distinct groups).

**What cannot be honoured** is said, node by node (:attr:`DeviceOrder.unmet`): groups of
another size than the program's (a weight replicated in steps, whose copies the program sums
at once), groups on devices beyond the mesh, and groups no order reconciles with the others'
(constraints are added most-used first and one that makes the search fail is dropped; the
search is bounded, :data:`SEARCH_BUDGET`, and says so when it stops at the bound).

>>> from pcgopt.lower.layout import DeviceGrid
>>> grid = DeviceGrid.flat(4)  # axes d0, d1 of size 2
>>> # "a" runs over axis d0; the plan put it on consecutive devices {0, 1} and {2, 3}
>>> order = device_order(grid, {"a": ("d0",)}, {"a": ((0, 1), (2, 3))})
>>> order.order, order.honoured
((0, 2, 1, 3), ('a',))
>>> order.groups(grid, ("d0",))
((0, 1), (2, 3))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from pcgopt.extract.strategies.placement import default_placement
from pcgopt.graph import TensorRef
from pcgopt.lower.layout import DeviceGrid, LayoutAssignment, MeshLayout
from pcgopt.ops import OpKind

__all__ = [
    "DeviceOrder",
    "GroupCheck",
    "collective_axes",
    "default_placement",
    "device_order",
    "devices_of",
]

Groups = tuple[tuple[int, ...], ...]

#: Devices tried, over all positions, before a search gives up (a product-structured placement,
#: the usual case, is found with next to no backtracking; an infeasible one on many devices
#: would otherwise explore every order).
SEARCH_BUDGET = 20_000


@dataclass(frozen=True)
class DeviceOrder:
    """The device number at every mesh position (row-major), and which nodes' plan groups it
    makes the program's (``honoured``) or not, with why (``unmet``)."""

    order: tuple[int, ...]
    honoured: tuple[str, ...] = ()
    unmet: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: The plan's groups of every parallel node, as given.
    planned: Mapping[str, Groups] = field(default_factory=lambda: MappingProxyType({}))
    #: Parallel nodes for which the program runs no collective (a Replicate whose copies are
    #: never used apart, a DiscardCopies): nothing to place.
    silent: tuple[str, ...] = ()

    def groups(self, grid: DeviceGrid, axes: Sequence[str]) -> Groups:
        """The devices of each group of mesh positions that differ only along ``axes``, in
        the order of their lowest device."""
        return devices_of(self.position_groups(grid, axes), self.order)

    @staticmethod
    def position_groups(grid: DeviceGrid, axes: Sequence[str]) -> list[list[int]]:
        keys = _group_keys(grid, axes)
        out: dict[int, list[int]] = {}
        for position, key in enumerate(keys.tolist()):
            out.setdefault(key, []).append(position)
        return list(out.values())

    def summary(self) -> str:
        total = len(self.honoured) + len(self.unmet)
        lines = [
            f"device groups: {len(self.honoured)} of the {total} parallel nodes that run a "
            "collective run it on the plan's groups"
            + (f" ({len(self.silent)} more run none)" if self.silent else "")
        ]
        reasons: dict[str, list[str]] = {}
        for name, why in self.unmet.items():
            reasons.setdefault(why, []).append(name)
        for why, names in reasons.items():
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            lines.append(f"  not the plan's ({len(names)}): {shown}: {why}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class GroupCheck:
    """One compiled collective of a node: the plan's device groups for the node and the ones
    XLA compiled. ``agrees``: every plan group is a compiled group (the program may run more
    groups: copies on devices the plan leaves to other work)."""

    node: str
    purpose: str
    kind: str
    planned: Groups
    compiled: Groups

    @property
    def agrees(self) -> bool:
        return set(self.planned) <= set(self.compiled)

    def __repr__(self) -> str:
        verdict = "the plan's" if self.agrees else f"not the plan's {list(self.planned)}"
        where = f"{self.node} {self.purpose} {self.kind} on {list(self.compiled)}"
        return f"GroupCheck({where}: {verdict})"


def devices_of(groups: Sequence[Sequence[int]], order: Sequence[int]) -> Groups:
    """Groups of mesh positions as groups of the devices at them (``order``), sorted."""
    return tuple(sorted(tuple(sorted(order[p] for p in g)) for g in groups))


def _group_keys(grid: DeviceGrid, axes: Sequence[str]) -> np.ndarray:
    """For every position, the index of its group among those that differ only along ``axes``
    (the position's coordinates on the other axes)."""
    coords = np.indices(grid.shape).reshape(len(grid.shape), grid.size)
    keep = [i for i, name in enumerate(grid.names) if name not in axes]
    if not keep:
        return np.zeros(grid.size, dtype=np.int64)
    return np.ravel_multi_index(tuple(coords[keep]), tuple(grid.sizes[i] for i in keep))


def _roles(layout: MeshLayout) -> dict[str, object]:
    roles: dict[str, object] = {a: i for i, d in enumerate(layout.dims) for a in d}
    roles.update({a: "partial" for a in layout.partial})
    return roles


def collective_axes(
    assignment: LayoutAssignment, copy_axes: Mapping[str, tuple[str, ...]]
) -> dict[str, tuple[str, ...]]:
    """For every parallel node with a degree: the mesh axes its collective runs over in the
    program: those whose role (the dimension they split, or the partial sums) its input and
    output layouts differ in; for a Replicate, the axes its copies are used apart along
    (``copy_axes``, as the program found them)."""
    pcg, grid = assignment.pcg, assignment.grid
    readers: dict[str, list[str]] = {}
    for node in pcg.nodes:
        for r in node.inputs:
            readers.setdefault(r.node, []).append(node.name)
    out: dict[str, tuple[str, ...]] = {}
    for node in pcg.nodes:
        if node.spec.kind is not OpKind.PARALLEL or "degree" not in node.params:
            continue
        if node.op == "replicate":
            # A weight replicated then split is loaded split: its copies are those of the
            # layout it is stored in, down the chain of parallel nodes.
            name = node.name
            while not copy_axes.get(name) and len(readers.get(name, ())) == 1:
                reader = readers[name][0]
                if pcg.node(reader).spec.kind is not OpKind.PARALLEL:
                    break
                name = reader
            out[node.name] = tuple(copy_axes.get(name, ()))
            continue
        before = _roles(assignment.layout(node.inputs[0]))
        after = _roles(assignment.layout(TensorRef(node.name)))
        out[node.name] = tuple(a for a in grid.names if before.get(a) != after.get(a))
    return out


def _canonical(labels: np.ndarray) -> tuple[int, ...]:
    """Labels renumbered in order of first appearance (-1 kept): equal partitions, equal
    tuples."""
    seen: dict[int, int] = {}
    return tuple(-1 if v < 0 else seen.setdefault(v, len(seen)) for v in labels.tolist())


def device_order(
    grid: DeviceGrid,
    axes_of: Mapping[str, Sequence[str]],
    placement: Mapping[str, Sequence[Sequence[int]]],
    *,
    budget: int = SEARCH_BUDGET,
) -> DeviceOrder:
    """A device order on ``grid`` that makes each node's mesh groups (over ``axes_of[node]``)
    its groups in ``placement`` (module docstring)."""
    size = grid.size
    unmet: dict[str, str] = {}
    silent: list[str] = []
    constraints: dict[tuple[tuple[int, ...], tuple[int, ...]], list[str]] = {}
    for name, groups in placement.items():
        if name not in axes_of:
            continue
        if not groups or not all(isinstance(g, (tuple, list)) for g in groups):
            continue  # a compute node's devices, not a collective's groups
        axes = tuple(axes_of[name])
        if not axes:
            silent.append(name)  # no collective in the program: no group to honour
            continue
        members = math.prod(grid.axis_size(a) for a in axes)
        widths = {len(g) for g in groups}
        if widths != {members}:
            unmet[name] = (
                f"the plan's groups have {'/'.join(map(str, sorted(widths)))} devices, the "
                f"program's {members} (its collective runs over "
                f"{'.'.join(axes) if axes else 'no mesh axis'})"
            )
            continue
        devices = [d for g in groups for d in g]
        if min(devices) < 0 or max(devices) >= size:
            unmet[name] = f"the plan's groups lie on devices beyond the mesh's {size}"
            continue
        if len(set(devices)) != len(devices):
            unmet[name] = "the plan's groups share devices (they are not a partition)"
            continue
        target = np.full(size, -1, dtype=np.int64)
        for i, g in enumerate(groups):
            target[list(g)] = i
        key = (_canonical(_group_keys(grid, axes)), _canonical(target))
        constraints.setdefault(key, []).append(name)
    ranked = sorted(constraints.items(), key=lambda kv: -len(kv[1]))
    kept: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    order: list[int] | None = list(range(size))
    for key, names in ranked:
        found = _search([*kept, key], size, budget)
        if not isinstance(found, list):
            why = (
                "no device order makes these groups mesh groups together with the other "
                "nodes' (the layout put its split on axes the placement does not pair)"
                if found is None
                else f"no device order found within {budget:,} steps of the search"
            )
            for name in names:
                unmet[name] = why
            continue
        kept.append(key)
        order = found
    honoured = tuple(n for key in kept for n in constraints[key])
    planned = {
        name: tuple(tuple(g) for g in groups)
        for name, groups in placement.items()
        if name in axes_of and groups and all(isinstance(g, (tuple, list)) for g in groups)
    }
    return DeviceOrder(
        tuple(order),
        honoured,
        MappingProxyType(unmet),
        MappingProxyType(planned),
        tuple(silent),
    )


def _search(
    constraints: Sequence[tuple[tuple[int, ...], tuple[int, ...]]], size: int, budget: int
) -> list[int] | str | None:
    """Positions 0.. take the lowest device that keeps every constraint with the positions
    before them, backtracking; None when there is none, ``"budget"`` when the budget ran out
    first."""
    mesh = np.array([m for m, _ in constraints], dtype=np.int64).reshape(len(constraints), size)
    plan = np.array([t for _, t in constraints], dtype=np.int64).reshape(len(constraints), size)
    assigned = np.full(size, -1, dtype=np.int64)
    used = np.zeros(size, dtype=bool)
    next_device = [0] * (size + 1)
    position, steps = 0, 0
    while 0 <= position < size:
        placed = False
        for d in range(next_device[position], size):
            if used[d]:
                continue
            steps += 1
            if steps > budget:
                return "budget"
            if _fits(mesh, plan, assigned[:position], position, d):
                assigned[position], used[d] = d, True
                next_device[position] = d + 1
                placed = True
                break
        if placed:
            position += 1
            if position < size:
                next_device[position] = 0
            continue
        position -= 1  # backtrack: free the previous position's device and try its next
        if position >= 0:
            used[assigned[position]] = False
            assigned[position] = -1
    return assigned.tolist() if position == size else None


def _fits(
    mesh: np.ndarray, plan: np.ndarray, before: np.ndarray, position: int, device: int
) -> bool:
    if position == 0:
        return True
    same_mesh = mesh[:, :position] == mesh[:, position : position + 1]
    mine = plan[:, device : device + 1]
    theirs = plan[:, before]
    both = (mine >= 0) & (theirs >= 0)
    clash = both & (same_mesh != (mine == theirs))
    # A mesh group spans the plan's devices and others: the plan's group is not a mesh group.
    clash |= same_mesh & ((mine >= 0) != (theirs >= 0))
    return not clash.any()
