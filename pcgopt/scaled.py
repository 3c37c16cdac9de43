"""Smaller instances of PCGs with the same structure, so that plans of full-size models can be
checked by evaluation.

The reference evaluator runs a 16-layer MLP of width 8192, or a recommendation model with four
million-row tables, in minutes or not at all. Whether a plan computes what its model computes
does not depend on those sizes, only on the graph: :func:`scaled_down` gives both graphs (any
number of PCGs over the same inputs and weights) with every size that can shrink shrunk,
consistently across them, so that :func:`pcgopt.equivalent` on the small pair checks the
structure of the large one.

**Which sizes shrink.** The dimensions of all the graphs' tensors are put in classes that must
keep one size: an input or weight's dimension is the same in every graph (matched by name); a
parallel operator keeps its input's logical shape; a compute operator's loop axes (its
:class:`~pcgopt.ops.Signature`) tie the dimensions each indexes. A class gets the smallest
multiple of the degrees that split any of its dimensions (in any graph) that is at least
``min_size``; a class already that small keeps its size. Input dimensions of one node that no
axis indexes are tied when they have one size (a fused Linear cannot split its contraction, so
its signature leaves it out). An output dimension no axis indexes is derived: shape inference
gives its size from the new inputs (a Concat's axis), and the rest of its class follows (the
rows of the weight that reads the concatenation); an input dimension of its size joins it (a
LayerNorm's normalized dimension).

**Operators whose structure depends on their sizes.** A reshape states the size relations
that keep its runs (:meth:`~pcgopt.ops.spec.ComputeOp.signature_conditions`): its output takes
its classes' sizes (:meth:`~pcgopt.ops.spec.ComputeOp.resized_params` rewrites its target shape),
and the one dimension of a run becomes the product of the others: [H] -> [heads, dh] makes H
heads * dh. Reshapes of one class into factors of the same sizes (the model's and the plan's)
share their factors. A run of two dimensions into two that moves a factor from one to the
other (PyTorch's attention: [B, H] -> [B * heads, H / heads]) gets that factor as a size of its
own, in both products.

**Convolutions and poolings** keep their kernel, stride, padding and number of groups. Their
batch and channels shrink as loop axes; a grouped convolution's channels to multiples of its
groups, and its weight's channels per group to the quotient (an axis of a fixed size keeps it,
and the one input dimension of each group's share follows). The dimensions their windows slide
along (:attr:`~pcgopt.ops.spec.ComputeOp.window_inputs`) take what their own classes take, and
the output's spatial sizes are derived from them; a global pooling stays global. The classes
of windowed dimensions that nothing derives (an image's height and width) get the least size
under which every graph still builds, at least ``min_size``: doubling from it in steps of the
degrees of any spatial split, then bisecting (Inception-v3's 299 x 299 images become 75 x 75,
the least its windows fit). Windows may then rest on padding (ResNeXt-50's last stages run at
1 x 1), which checks less of them; but a plan's windows are its model's unless split, and only
windows that do not overlap are split, along sizes their degrees still divide.

**Parts of a whole.** A split's axis is the sum of its parts
(:meth:`~pcgopt.ops.spec.ComputeOp.summed_dims`), and so is a dimension sliced into equal parts
(a fused QKV product sliced into q, k and v): each part takes its class's size (q's follows its
heads), the whole their sum, and the split's sizes and the slices' positions follow. A
depthwise convolution's groups follow its channels. A convolution ties its input channels in x
and w even where its signature leaves that contraction out (with a bias or an activation).

**Which stay.** The dimensions an operator's parameters or structure fix
(:meth:`~pcgopt.ops.spec.ComputeOp.fixed_dims`: the sliced dimension of a slice that is not
one of equal parts, a convolution's kernel); every dimension of an operator
whose sizes cannot change and that cannot say which (its
:meth:`~pcgopt.ops.spec.ComputeOp.resized_params` is None), and of any node the smaller graph
rejects: it is then rebuilt with that node's
dimensions at full size, at most ``max_rebuilds`` times. Integer inputs that index a dimension
(an embedding's ids, :attr:`~pcgopt.ops.spec.ComputeOp.index_inputs`) are drawn below its new
size. :attr:`ScaledDown.kept` names the nodes kept at full size, and why.

>>> from pcgopt import PCGBuilder, equivalent
>>> def mlp(parallel: bool):
...     b = PCGBuilder()
...     x, w = b.input((4096, 8192), name="x"), b.weight((8192, 8192), name="w")
...     if parallel:  # data parallel on 8 devices
...         x, w = b.partition(x, dim=0, degree=8), b.replicate(w, degree=8)
...     y = b.relu(b.matmul(x, w))
...     return b.build(b.combine(y, dim=0, degree=8) if parallel else y)
>>> small = scaled_down(mlp(False), mlp(True))
>>> small.sizes  # (full size, new size) of every class that shrank
((8192, 4), (4096, 8))
>>> [p.shape("x").sizes for p in small.pcgs]
[(8, 4), (8, 4)]
>>> equivalent(*small.pcgs)
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from networkx.utils import UnionFind

from pcgopt.divisors import divisors
from pcgopt.errors import PCGError
from pcgopt.evaluate import evaluate, index_uses, random_feeds
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.ops import OpKind
from pcgopt.ops.params import Params
from pcgopt.ops.spec import DimRef, SizeRelation
from pcgopt.render import forward_flops
from pcgopt.shapes import ParallelTensorShape

__all__ = [
    "ScaleDownError",
    "ScaledDown",
    "joined_micro_batches",
    "micro_batch_difference",
    "micro_batched",
    "scaled_down",
]


class ScaleDownError(PCGError):
    """The graphs could not be given consistent smaller sizes (``node``: where it failed)."""


@dataclass(frozen=True)
class ScaledDown:
    """Smaller instances of the given PCGs, in their order (see the module docstring).

    ``sizes``: ``(full size, new size)`` of every class of dimensions that shrank, distinct
    pairs, largest full size first; ``kept``: the nodes whose dimensions were kept at full
    size, in order of first appearance, with why (an operator that depends on its sizes, or a
    rejected rebuild).
    """

    pcgs: tuple[PCG, ...]
    sizes: tuple[tuple[int, int], ...]
    kept: tuple[tuple[str, str], ...]

    def __repr__(self) -> str:
        shrunk = ", ".join(f"{a}->{b}" for a, b in self.sizes) or "nothing"
        return f"ScaledDown({len(self.pcgs)} PCGs; sizes {shrunk}; {len(self.kept)} nodes kept)"


Key = Hashable  # ("src", name, dim) for a source's dimension, (graph, node, output, dim) else


def _key(g: int, pcg: PCG, ref: TensorRef, dim: int) -> Key:
    if pcg.node(ref.node).spec.kind is OpKind.SOURCE:
        return ("src", ref.node, dim)
    return (g, ref.node, ref.index, dim)


def _dim_key(g: int, pcg: PCG, node: Node, ref: DimRef) -> Key:
    """The key of a dimension of ``node``'s, as a SizeRelation names it."""
    side, t, d = ref
    return _key(g, pcg, node.inputs[t] if side == "in" else TensorRef(node.name, t), d)


def _node_keys(g: int, pcg: PCG, node: Node) -> list[Key]:
    keys = [_key(g, pcg, ref, d) for ref in node.inputs for d in range(len(pcg.shape(ref).sizes))]
    for o, shape in enumerate(pcg.output_shapes(node.name)):
        keys += [_key(g, pcg, TensorRef(node.name, o), d) for d in range(len(shape.sizes))]
    return keys


class _Problem:
    def __init__(self, pcgs: tuple[PCG, ...], min_size: int, max_rebuilds: int) -> None:
        self.pcgs, self.min_size, self.max_rebuilds = pcgs, min_size, max_rebuilds
        self.classes = UnionFind()  # of dimension keys
        self.full: dict[Key, int] = {}  # every key's full size
        self.degree: dict[Key, int] = {}  # lcm of the degrees splitting it, in any graph
        self.derived: set[Key] = set()
        self.windows: set[Key] = set()  # dimensions a window slides along (window_inputs)
        self.window_outputs: set[Key] = set()  # and the output dimensions derived from them
        self.windowed: set[Key] = set()  # roots of the windowed classes nothing derives (solve)
        self.kept: dict[str, str] = {}  # node -> why its dimensions keep their size
        self.frozen: set[Key] = set()
        # Size relations of operators whose structure depends on sizes (a reshape's runs):
        # (graph, node, its SizeRelations); and of their "eq" relations, each side of one
        # dimension with the others whose product it is ([H] -> [heads, dh]).
        self.relations: list[tuple[int, Node, tuple[SizeRelation, ...]]] = []
        self.products: list[tuple[Key, list[Key]]] = []
        # (a group's share, the whole, the number of groups): a weight's channels per group.
        self.quotients: list[tuple[Key, Key, int]] = []
        # (a whole, its parts, the node): a split's input axis is the sum of its parts
        # (summed_dims).
        self.sums: list[tuple[Key, list[Key], str]] = []
        self.new_params: dict[tuple[int, str], Params] = {}
        # Sizes chosen for some classes (by a member key), every other class keeping its
        # full size: micro_batched's instance rather than the smallest one.
        self.targets: dict[Key, int] | None = None
        for g, pcg in enumerate(pcgs):
            for node in pcg.nodes:
                self._read(g, pcg, node)

    def _read(self, g: int, pcg: PCG, node: Node) -> None:
        outs = pcg.output_shapes(node.name)
        for o, shape in enumerate(outs):
            for d, dim in enumerate(shape.dims):
                key = _key(g, pcg, TensorRef(node.name, o), d)
                self.full[key] = dim.size
                self.degree[key] = math.lcm(self.degree.get(key, 1), dim.degree)
                self.classes[key]  # registers it
        spec = node.spec
        if spec.kind is OpKind.SOURCE:
            return
        ins = [pcg.shape(ref) for ref in node.inputs]
        if spec.kind is OpKind.PARALLEL:
            shapes = [*ins, *outs]
            if len({s.sizes for s in shapes}) != 1:
                self.freeze(g, pcg, node, "its inputs and outputs differ in logical shape")
                return
            refs = [*node.inputs, *(TensorRef(node.name, o) for o in range(len(outs)))]
            for d in range(len(outs[0].sizes)):
                self.classes.union(*(_key(g, pcg, r, d) for r in refs))
            return
        in_sizes, out_sizes = tuple(s.sizes for s in ins), tuple(s.sizes for s in outs)
        conditions = spec.signature_conditions(node.params, in_sizes, out_sizes)
        fixed = spec.fixed_dims(node.params, in_sizes, out_sizes)
        fixed_keys = {_dim_key(g, pcg, node, ref) for ref in fixed or ()}
        if fixed is not None:
            # Its parameters or its structure fix some dimensions only (a slice's sliced one,
            # a convolution's kernel): they keep their sizes, the others shrink as loop axes.
            self.frozen.update(fixed_keys)
        elif spec.resized_params(node.params, in_sizes, out_sizes) is None:
            self.freeze(g, pcg, node, f"{node.op} cannot change its sizes")
            return
        # A structure that depends on sizes it cannot state (a convolution's windows): the
        # dimensions of its loop axes that all have one size (batch, channels) may change, and
        # those its windows slide along; the rest (a kernel's) keep their sizes.
        opaque = conditions is None
        conditions = conditions or ()

        if conditions:
            self.relations.append((g, node, conditions))
            for c in conditions:
                for one, other in ((c.left, c.right), (c.right, c.left)):
                    if c.kind == "eq" and len(one) == 1 and len(other) >= 2:
                        self.products.append(
                            (
                                _dim_key(g, pcg, node, one[0]),
                                [_dim_key(g, pcg, node, r) for r in other],
                            )
                        )
                if c.kind == "eq" and len(c.left) == len(c.right) == 2:
                    self._read_moved_factor(g, pcg, node, c)
        sig = spec.signature(node.params, in_sizes, out_sizes)
        covered: set[Key] = set()
        for whole, parts in spec.summed_dims(node.params, in_sizes, out_sizes):
            part_keys = [_dim_key(g, pcg, node, ref) for ref in parts]
            self.sums.append((_dim_key(g, pcg, node, whole), part_keys, node.name))
            covered.update(part_keys)  # sized by their classes, not derived
        windows = {_key(g, pcg, node.inputs[i], d) for i, dims in spec.window_inputs for d in dims}
        self.windows |= windows
        grouped: list[tuple[list[Key], int, int, str]] = []  # dims, groups, full size, axis
        for axis in sig.axes:
            axis_outputs = [
                _key(g, pcg, TensorRef(node.name, o), d)
                for o, d in enumerate(axis.outputs)
                if d is not None
            ]
            members = [
                _key(g, pcg, node.inputs[i], d) for i, d in enumerate(axis.inputs) if d is not None
            ] + axis_outputs
            covered.update(members)
            sizes = {self.full[k] for k in members}  # inputs come first: already read
            if len(sizes) == 1 and axis.size in (None, *sizes):
                self.classes.union(*members)
            elif len(sizes) == 1 and axis.size and max(sizes) % axis.size == 0:
                # A fixed number of groups (a grouped convolution's): its dimensions shrink to
                # multiples of it, and each group's share (a weight's channels) with them.
                self.classes.union(*members)
                for k in members:
                    self.degree[k] = math.lcm(self.degree.get(k, 1), axis.size)
                grouped.append((members, axis.size, max(sizes), axis.name))
            elif windows.intersection(members):
                # Windows that do not overlap but stride (a 1x1 convolution of stride 2): the
                # output's size along them is derived from the input's.
                covered.difference_update(axis_outputs)
            elif opaque or not conditions:  # else the relations keep the structure
                self.frozen.update(members)
                self.kept.setdefault(node.name, f"its axis {axis.name!r} is not its dims' size")
        # Input dimensions no axis indexes may still have to agree (a fused Linear's
        # contraction, which its signature leaves out because it cannot be split): those of
        # one size are tied, which can only constrain more than needed.
        loose: dict[int, list[Key]] = {}
        for ref in node.inputs:
            for d, n in enumerate(pcg.shape(ref).sizes):
                key = _key(g, pcg, ref, d)
                if key not in covered and key not in windows and key not in fixed_keys:
                    loose.setdefault(n, []).append(key)
        for members, groups, n, axis_name in grouped:
            share = loose.get(n // groups, [])
            if len(share) == 1:  # else which dimension is the share is not known: keep all
                self.quotients.append((share[0], members[0], groups))
                del loose[n // groups]
            else:
                self.frozen.update(members)
                self.kept.setdefault(node.name, f"its axis {axis_name!r} has no one share")
        for keys in loose.values():
            # An opaque operator that names the dimensions its structure fixes (a
            # convolution's kernel) ties those of one size in pairs (its input channels, in x
            # and in w): a contraction its signature leaves out. A lone one keeps its size.
            if opaque and (fixed is None or len(keys) < 2):
                self.frozen.update(keys)
                if not windows:  # (a kernel's sizes are its windows', not the node's)
                    self.kept.setdefault(node.name, f"{node.op}'s sizes fix its structure")
            else:
                self.classes.union(*keys)
        if spec.size_dependent_signature and not windows:
            return  # its outputs have the sizes of their classes (a reshape's new shape)
        # An output dimension no axis indexes is derived by shape inference (a Concat's axis);
        # one of the size of such an input dimension is tied to it as well (a LayerNorm's
        # normalized dimension), so that all of a model's hidden sizes form one class.
        for o, shape in enumerate(outs):
            for d, n in enumerate(shape.sizes):
                key = _key(g, pcg, TensorRef(node.name, o), d)
                if key not in covered:
                    self.derived.add(key)
                    if windows:
                        self.window_outputs.add(key)
                    if n in loose and not windows:  # (not a kernel's size)
                        self.classes.union(key, loose[n][0])

    def _read_moved_factor(self, g: int, pcg: PCG, node: Node, c: SizeRelation) -> None:
        """A run of two dimensions into two that moves a factor from one to the other:
        [B, H] -> [B * heads, H / heads], PyTorch's attention reshaping its heads into the batch
        (or back). The factor (heads) is a dimension of no tensor: it gets a key of its own,
        and the run two products of it ([B * heads] = B x heads, H = heads x [H / heads])."""
        (x1, x2), (y1, y2) = (
            [_dim_key(g, pcg, node, r) for r in side] for side in (c.left, c.right)
        )
        a1, a2, b1, b2 = (self.full[k] for k in (x1, x2, y1, y2))
        if b1 % a1 == 0 and a2 % b2 == 0 and b1 // a1 == a2 // b2 > 1:
            factor, moved = b1 // a1, [(y1, x1, "left"), (x2, y2, "right")]
        elif a1 % b1 == 0 and b2 % a2 == 0 and a1 // b1 == b2 // a2 > 1:
            factor, moved = a1 // b1, [(x1, y1, "left"), (y2, x2, "right")]
        else:
            return
        aux = ("factor", g, node.name, c.left, c.right)
        self.full[aux] = factor
        self.classes[aux]  # registers it
        for whole, part, side in moved:
            self.products.append((whole, [part, aux] if side == "left" else [aux, part]))

    def freeze(self, g: int, pcg: PCG, node: Node, why: str) -> None:
        self.kept.setdefault(node.name, why)
        self.frozen.update(_node_keys(g, pcg, node))

    def solve(self) -> ScaledDown:
        """Sizes per class, derived sizes by a logical pass, then the rebuilt graphs; a node
        that rejects its new sizes keeps its dimensions at full size, and the graphs are
        rebuilt again. Then, if windows slide along some dimensions, a small size for their
        free classes (an image's height and width) under which the graphs still build (the
        full size always does): doubling from ``min_size`` in steps of every degree that
        splits a windowed dimension or its output (their sizes must stay divisible), then
        bisecting below the first that builds."""
        self._tie_factors()
        find = self.classes.__getitem__
        # A class that two products factor differently (a model's 16 heads of 4 and a plan's 8
        # of 8, of one hidden size) keeps its size: shrunk, both would become 4 x 4 and a plan
        # that groups its elements otherwise would pass for the model.
        factorings: dict[Key, set[tuple[int, ...]]] = {}
        for one, other in self.products:
            sizes = tuple(self.full[k] for k in other if self.full[k] > 1)
            if len(sizes) >= 2:  # (a product of one size and ones is a tie, not a factoring)
                factorings.setdefault(find(one), set()).add(sizes)
        self.frozen.update(root for root, found in factorings.items() if len(found) > 1)
        # A whole's degrees divide the sum of its parts if they divide each part.
        class_degree: dict[Key, int] = {}
        for k, d in self.degree.items():
            class_degree[find(k)] = math.lcm(class_degree.get(find(k), 1), d)
        for whole, parts, _ in self.sums:
            for k in parts:
                self.degree[k] = math.lcm(self.degree.get(k, 1), class_degree.get(find(whole), 1))
        # Classes of windowed dimensions that nothing derives (the classes are final here).
        self.windowed = {find(k) for k in self.windows} - {find(k) for k in self.derived}
        best = self._rebuilding()
        free = self.windowed - {find(k) for k in self.frozen}
        full = max((self.full[k] for k in self.full if find(k) in free), default=0)
        spatial = {find(k) for k in self.windows | self.window_outputs}
        step = math.lcm(*(d for k, d in self.degree.items() if find(k) in spatial))
        # The search asks only whether the sizes hold (a failure is found there, in
        # milliseconds; rebuilding the graphs takes a fraction of a second), then builds the
        # size found; should that fail to build, the search is made again building each size.
        for build in (False, True):
            found = self._smallest_window(self.min_size, step, full, build)
            if found is None:
                return best
            try:
                return found if build else self._attempt(window_size=found)
            except PCGError:
                continue
        return best

    def _smallest_window(
        self, start: int, step: int, full: int, build: bool
    ) -> ScaledDown | int | None:
        """The smallest size of the windowed classes under which the graphs build (``build``:
        the instance built) or their sizes hold (else: the size), doubling from ``start`` in
        multiples of ``step`` and bisecting below the first that does; None if only the full
        size does."""

        def works(size: int) -> ScaledDown | int | None:
            try:
                built = self._attempt(window_size=size, build=build)
            except PCGError:
                return None
            return built if build else size

        lo, hi = start - 1, step * math.ceil(start / step)
        found = None
        while hi < full:
            found = works(hi)
            if found is not None:
                break
            lo, hi = hi, hi * 2
        else:
            hi = full  # the full size builds: bisect below it
        lo += 1  # the last size that failed, or none
        while lo < hi:
            mid = (lo + hi) // 2
            at = works(mid)
            if at is None:
                lo = mid + 1
            else:
                found, hi = at, mid
        return found

    def _rebuilding(self) -> ScaledDown:
        for _ in range(self.max_rebuilds + 1):
            try:
                return self._attempt()
            except PCGError as err:
                where = next(
                    (g for g, pcg in enumerate(self.pcgs) if err.node and err.node in pcg), None
                )
                if where is None:
                    raise ScaleDownError(f"no smaller instance: {err}", node=err.node) from err
                pcg = self.pcgs[where]
                before = len(self.frozen)
                self.freeze(where, pcg, pcg.node(err.node), f"rejected smaller sizes ({err})")
                if len(self.frozen) == before:  # kept already: nothing left to keep
                    raise ScaleDownError(f"no smaller instance: {err}", node=err.node) from err
        raise ScaleDownError(
            f"no smaller instance within {self.max_rebuilds} rebuilds (max_rebuilds); "
            f"{len(self.kept)} nodes kept at full size, first {next(iter(self.kept), None)!r}"
        )

    def _tie_factors(self) -> None:
        """Reshapes of one class into factors of the same sizes (the model's and the plan's
        [H] -> [heads, dh]) get the same factors: nothing else ties a plan's heads to the
        model's, and H cannot be two products. Tying equal sizes can only constrain more."""
        find = self.classes.__getitem__
        changed = True
        while changed:
            changed = False
            seen: dict[tuple, list[Key]] = {}
            for one, other in self.products:
                first = seen.setdefault((find(one), tuple(self.full[k] for k in other)), other)
                for a, b in zip(first, other, strict=True):
                    if find(a) != find(b):
                        self.classes.union(a, b)
                        changed = True

    def _attempt(self, window_size: int | None = None, build: bool = True) -> ScaledDown | None:
        """One instance: every free class at its smallest size, the classes of dimensions
        windows slide along at ``window_size`` (None: their full size), the rest derived.
        ``build=False``: only checks the sizes (raising as the build would), returning None."""
        find = self.classes.__getitem__
        frozen_roots = {find(k) for k in self.frozen}
        # A product's factors keep their sizes where the product must ([H] -> [heads, dh] of
        # a slice's part, whose size the slice fixes).
        grew = True
        while grew:
            grew = False
            for one, other, *_ in (*self.products, *self.sums):
                if find(one) in frozen_roots and not {find(k) for k in other} <= frozen_roots:
                    frozen_roots |= {find(k) for k in other}
                    grew = True
        members: dict[Key, list[Key]] = {}
        for key in self.full:
            members.setdefault(find(key), []).append(key)
        value: dict[Key, int] = {}
        for root, keys in members.items():
            if root in frozen_roots:
                continue
            full = {self.full[k] for k in keys}
            if len(full) != 1:  # a derived class whose parts already differ: keep it
                frozen_roots.add(root)
                continue
            (n,) = full
            step = math.lcm(*(self.degree.get(k, 1) for k in keys))
            if self.targets is not None:
                value[root] = next((v for k, v in self.targets.items() if find(k) == root), n)
            elif root in self.windowed:
                small = n if window_size is None else step * math.ceil(window_size / step)
                value[root] = min(n, small)
            else:
                value[root] = n if n <= self.min_size else step * math.ceil(self.min_size / step)

        def size(key: Key) -> int:
            root = find(key)
            return self.full[key] if root in frozen_roots else value[root]

        # Dependent and derived sizes, repeated while either changes a class: a product of a
        # size relation sets the class of its one dimension (a reshape's [H] -> [heads, dh]
        # makes H heads * dh), and a pass over every graph sets the derived ones (the
        # classes a derivation feeds may be read before it, e.g. a weight's rows).
        states: set[frozenset] = set()
        for _ in range(len(members) + 1):
            # The relations to a fixed point first: one may set a class another reads (a
            # product's factor, set by a later product), and deriving reads them all.
            changed = False
            # (Bounded: relations that disagree would go on changing each other; the sizes
            # are checked below, and the node at fault is kept at full size.)
            for _ in range(min(32, len(self.products) + len(self.sums) + len(self.quotients) + 1)):
                if not self._apply_relations(size, value, frozen_roots):
                    break
                changed = True
            derived_now: dict[Key, tuple[int, str]] = {}
            for g, pcg in enumerate(self.pcgs):
                changed |= self._derive(g, pcg, size, value, frozen_roots, derived_now)
            state = frozenset(value.items())
            if not changed or state in states:  # settled, or going round in circles
                break
            states.add(state)
        for g, node, conditions in self.relations:
            pcg = self.pcgs[g]
            outs = [TensorRef(node.name, o) for o in range(len(pcg.output_shapes(node.name)))]
            new_in, new_out = (
                [tuple(size(_key(g, pcg, r, d)) for d in range(pcg.shape(r).rank)) for r in refs]
                for refs in (node.inputs, outs)
            )
            broken = [c for c in conditions if not c.holds(new_in, new_out)]
            if broken:
                raise ScaleDownError(
                    f"its sizes would break {broken[0]!r}, which its structure needs",
                    node=node.name,
                )
        # Every whole is still the sum of its parts: a slice that was the k-th of n parts is
        # the k-th of n smaller ones (two slices of one tensor into quarters and halves must
        # not both become its first half).
        for whole, parts, name in self.sums:
            if size(whole) != sum(map(size, parts)):
                raise ScaleDownError(
                    f"its parts would be {[size(p) for p in parts]}, not adding up to "
                    f"{size(whole)}",
                    node=name,
                )
        if not build:
            return None
        bounds = self._index_bounds(size)
        rebuilt = tuple(self._rebuild(g, pcg, size, bounds) for g, pcg in enumerate(self.pcgs))
        pairs = sorted(
            {(self.full[k], size(k)) for k in self.full if size(k) != self.full[k]},
            reverse=True,
        )
        return ScaledDown(rebuilt, tuple(pairs), tuple(self.kept.items()))

    def _apply_relations(
        self, size: Callable[[Key], int], value: dict[Key, int], frozen_roots: set[Key]
    ) -> bool:
        find = self.classes.__getitem__
        changed = False
        for one, other in self.products:
            root = find(one)
            if root in frozen_roots or root in {find(k) for k in other}:
                continue
            n = math.prod(map(size, other))
            if value[root] != n:
                value[root], changed = n, True
        for whole, parts, _ in self.sums:
            root = find(whole)
            if root in frozen_roots or root in {find(k) for k in parts}:
                continue
            n = sum(map(size, parts))
            if value[root] != n:
                value[root], changed = n, True
        for share, whole, groups in self.quotients:
            root = find(share)
            n = size(whole) // groups
            if root not in frozen_roots and value[root] != n:
                value[root], changed = n, True
        return changed

    def _derive(
        self,
        g: int,
        pcg: PCG,
        size: Callable[[Key], int],
        value: dict[Key, int],
        frozen_roots: set[Key],
        derived_now: dict[Key, tuple[int, str]],
    ) -> bool:
        find = self.classes.__getitem__
        sizes: dict[TensorRef, tuple[int, ...]] = {}
        changed = False

        def sizes_of(ref: TensorRef) -> tuple[int, ...]:
            if ref in sizes:
                return sizes[ref]
            rank = len(pcg.shape(ref).sizes)  # a source
            return tuple(size(_key(g, pcg, ref, d)) for d in range(rank))

        for node in pcg.nodes:
            spec = node.spec
            outs = pcg.output_shapes(node.name)
            refs = [TensorRef(node.name, o) for o in range(len(outs))]
            if spec.kind is OpKind.SOURCE:
                continue  # read where used: a derivation above may have changed its class
            if spec.kind is OpKind.PARALLEL:
                for r in refs:
                    sizes[r] = sizes_of(node.inputs[0])
                continue
            ins = tuple(
                ParallelTensorShape.of(sizes_of(r), pcg.shape(r).dtype) for r in node.inputs
            )
            # Outputs at their classes' sizes (what an operator whose parameters hold its
            # output shape, a reshape, is given); a derived one is corrected below.
            wanted = tuple(
                tuple(size(_key(g, pcg, r, d)) for d in range(len(o.sizes)))
                for r, o in zip(refs, outs, strict=True)
            )
            new_in = tuple(s.sizes for s in ins)
            if new_in == tuple(pcg.shape(r).sizes for r in node.inputs) and wanted == tuple(
                o.sizes for o in outs
            ):
                params = node.params  # kept at full size (a convolution)
            else:
                params = spec.resized_params(node.params, new_in, wanted)
            if params is None:
                raise ScaleDownError(f"{node.op} cannot take these sizes", node=node.name)
            self.new_params[g, node.name] = params
            try:
                new = spec.infer_logical(params, ins)
            except PCGError as err:
                raise err.at_node(node.name, node.op) from None
            for r, shape in zip(refs, new, strict=True):
                for d, n in enumerate(shape.sizes):
                    key = _key(g, pcg, r, d)
                    if n == size(key):
                        continue
                    root = find(key)
                    seen = derived_now.get(root)
                    if key not in self.derived or root in frozen_roots or (seen and seen[0] != n):
                        raise ScaleDownError(
                            f"dimension {d} of {r} would be {n}, its class {size(key)}",
                            node=node.name,
                        )
                    value[root], derived_now[root], changed = n, (n, node.name), True
                sizes[r] = shape.sizes
        return changed

    def _index_bounds(self, size: Callable[[Key], int]) -> dict[str, int]:
        """Integer inputs that index a dimension: the new exclusive bound of their values."""
        bound: dict[str, int] = {}
        for other_g, other in enumerate(self.pcgs):
            for source, indexed, d in index_uses(other):
                limit = size(_key(other_g, other, indexed, d))
                bound[source] = min(bound.get(source, limit), limit)
        return bound

    def _rebuild(self, g: int, pcg: PCG, size: Callable[[Key], int], bound: dict[str, int]) -> PCG:
        nodes = []
        for node in pcg.nodes:
            if node.spec.kind is OpKind.SOURCE:
                shape = pcg.shape(node.name)
                params = dict(node.params)
                params["shape"] = tuple(size(("src", node.name, d)) for d in range(shape.rank))
                if params.get("max_value") is not None and node.name in bound:
                    params["max_value"] = min(params["max_value"], bound[node.name])
                node = Node(node.name, node.op, node.inputs, params)
            elif (g, node.name) in self.new_params:
                node = Node(node.name, node.op, node.inputs, self.new_params[g, node.name])
            nodes.append(node)
        return PCG(nodes, pcg.outputs)


def micro_batched(pcg: PCG, micro_batches: int) -> PCG:
    """``pcg`` on one micro-batch: every graph input's dimension 0, and every dimension of the
    same class (the batch as it flows through the graph, a reshape's batch factor included),
    divided by ``micro_batches``; every other size as it is. Gradient accumulation runs this
    graph once per micro-batch. Raises :class:`ScaleDownError` when the batch cannot be
    divided (a degree of its split would not divide the new size) or shares its class with a
    weight's dimension (the weights must not change).

    >>> from pcgopt import PCGBuilder
    >>> b = PCGBuilder()
    >>> x = b.partition(b.input((8, 4), name="x"), dim=0, degree=2)
    >>> y = b.matmul(x, b.replicate(b.weight((4, 3), name="w"), degree=2))
    >>> micro_batched(b.build(y), 2).shape("x").sizes
    (4, 4)
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ScaleDownError(f"micro_batches must be a positive int, got {micro_batches!r}")
    if micro_batches == 1:
        return pcg
    problem = _Problem((pcg,), 1, 0)
    problem.targets = {}
    find = problem.classes.__getitem__
    for node in pcg.nodes:
        if node.op == "input" and pcg.shape(node.name).rank:
            key = ("src", node.name, 0)
            size = problem.full[key]
            degree = math.lcm(*(d for k, d in problem.degree.items() if find(k) == find(key)))
            if size % (degree * micro_batches):
                raise ScaleDownError(
                    f"input {node.name!r}: its dimension 0 ({size}, split {degree} ways) does "
                    f"not divide into {micro_batches} micro-batches",
                    node=node.name,
                )
            problem.targets[key] = size // micro_batches
    problem._tie_factors()
    try:
        (small,) = problem._attempt().pcgs
    except PCGError as err:
        raise ScaleDownError(
            f"the batch does not divide into {micro_batches} micro-batches: {err}", node=err.node
        ) from err
    for node in pcg.nodes:
        if node.op == "weight" and small.shape(node.name).sizes != pcg.shape(node.name).sizes:
            raise ScaleDownError(
                f"weight {node.name!r} has a dimension of the batch's class (its sizes would "
                f"become {small.shape(node.name).sizes}); the batch cannot be split here",
                node=node.name,
            )
    return small


def micro_batch_difference(pcg: PCG) -> str | None:
    """Why running ``pcg`` as micro-batches would not compute what it computes on the whole
    batch, or None: the reference evaluator runs a scaled-down instance (:func:`scaled_down`)
    on the whole batch and on ``d`` micro-batches (:func:`micro_batched`, consecutive parts of
    every data input's dimension 0; ``d`` the batch's least divisor above 1), dropout off (a
    micro-batch draws its own masks by design). An output with the batch in dimension 0 must
    be the micro-batches' joined, any other (a mean loss) their mean. What gradient
    accumulation and pipelines assume; an operator that mixes samples (batch normalization
    over the batch, a softmax or a sum across it) breaks it. None for a batch of one. Raises
    :class:`ScaleDownError` when no small instance can be split so (nor ``pcg`` itself, if
    the evaluator can run it)."""
    small = _without_dropout(scaled_down(pcg).pcgs[0])
    d = _least_divisor(small)
    if d is None:
        return None  # a batch of one: nothing a micro-batch loop would run
    try:
        part = micro_batched(small, d)
    except ScaleDownError:
        if over_check_limits(pcg, pcg) is not None:
            raise
        small = _without_dropout(pcg)  # small enough as it is, with a batch the scaled one lost
        d = _least_divisor(small)
        if d is None:
            return None
        part = micro_batched(small, d)
    feeds = random_feeds(small)
    whole = [r.logical() for r in evaluate(small, feeds).outputs]
    data = {n.name for n in small.nodes if n.op == "input" and small.shape(n.name).rank}
    parts = []
    for i in range(d):
        chunk = {
            k: (v[i * len(v) // d : (i + 1) * len(v) // d] if k in data else v)
            for k, v in feeds.items()
        }
        parts.append([r.logical() for r in evaluate(part, chunk).outputs])
    for k, want in enumerate(whole):
        joined = joined_micro_batches([p[k] for p in parts], np.shape(want)[:1])
        scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
        if np.shape(joined) != np.shape(want) or not np.allclose(
            joined, want, rtol=1e-7, atol=1e-9 * scale
        ):
            return (
                f"output {k} ({pcg.outputs[k]}) of {d} micro-batches is not the whole batch's: an "
                "operator mixes the samples of the batch"
            )
    return None


def joined_micro_batches(parts: Sequence[Any], batch: tuple[int, ...], xp: Any = np) -> Any:
    """An output of the whole batch from its micro-batches' ``parts`` (arrays of module ``xp``,
    numpy's or jax.numpy's): joined along dimension 0 where the whole output's ``batch`` (its
    first size, or ``()`` for a scalar) is theirs together, their mean otherwise (a mean over
    the samples). What gradient accumulation and pipelines assume an output is."""
    if batch and xp.ndim(parts[0]) and batch[0] == len(parts) * xp.shape(parts[0])[0]:
        return xp.concatenate(parts)
    return sum(parts) / len(parts)


def _without_dropout(pcg: PCG) -> PCG:
    """``pcg`` with every dropout's rate 0 (a micro-batch draws its own masks by design)."""
    return PCG(
        [
            Node(n.name, n.op, n.inputs, {**n.params, "rate": 0.0}) if n.op == "dropout" else n
            for n in pcg.nodes
        ],
        pcg.outputs,
    )


def _least_divisor(pcg: PCG) -> int | None:
    """The least divisor above 1 of the batch (dimension 0 of the data inputs, which must
    agree), or None when the batch is one or the inputs disagree."""
    batch = {
        pcg.shape(n.name).sizes[0] for n in pcg.nodes if n.op == "input" and pcg.shape(n.name).rank
    }
    if len(batch) != 1:
        return None
    (size,) = batch
    return next((d for d in divisors(size) if d > 1), None)


def scaled_down(*pcgs: PCG, min_size: int = 4, max_rebuilds: int = 16) -> ScaledDown:
    """The given PCGs with their sizes shrunk consistently (module docstring): every class of
    dimensions that must keep one size gets the smallest multiple of its degrees that is at
    least ``min_size`` (or keeps its size if already that small). A node that rejects its new
    sizes keeps its dimensions at full size and the graphs are rebuilt, at most
    ``max_rebuilds`` times. Raises :class:`ScaleDownError` if no consistent smaller instance is
    found."""
    if not pcgs:
        raise ScaleDownError("scaled_down needs at least one PCG")
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
        raise ScaleDownError(f"min_size must be a positive int, got {min_size!r}")
    if isinstance(max_rebuilds, bool) or not isinstance(max_rebuilds, int) or max_rebuilds < 0:
        raise ScaleDownError(f"max_rebuilds must be a non-negative int, got {max_rebuilds!r}")
    return _Problem(tuple(pcgs), min_size, max_rebuilds).solve()


#: Above this many forward FLOPs the reference evaluator would take minutes; the check then
#: runs on a scaled-down instance of the model and the plan (:func:`pcgopt.scaled.scaled_down`),
#: or, if even that is over, is skipped with a warning (``Plan.check`` says so).
CHECK_FLOPS_LIMIT = 2e9

#: Above this many tensor elements (every node's outputs, inputs and weights included, in the
#: model and, counting every copy and partial sum, in the plan) the evaluator would take
#: gigabytes in float64 and several seconds (a scaled-down Inception-v3 on one Summit node,
#: 1.3e7 in its plan, takes about 2 s); the check is scaled down or skipped the same way.
CHECK_ELEMENTS_LIMIT = 2e7


def _tensor_elements(pcg: PCG) -> int:
    """Elements of every tensor of ``pcg``, every copy and partial sum counted."""
    return sum(
        s.numel * s.copy_degree * s.sum_degree for n in pcg.nodes for s in pcg.output_shapes(n.name)
    )


def over_check_limits(model: PCG, plan: PCG, flops_limit: float = CHECK_FLOPS_LIMIT) -> str | None:
    """Why the reference evaluator cannot compare ``plan`` with ``model`` in reasonable time
    and memory, or None."""
    flops = forward_flops(model)
    if flops > flops_limit:
        return (
            f"{flops:.3g} forward FLOPs, over the evaluator's limit of {flops_limit:.3g} "
            "(check_flops_limit)"
        )
    elements = max(_tensor_elements(model), _tensor_elements(plan))
    if elements > CHECK_ELEMENTS_LIMIT:
        return (
            f"tensors of {elements:.3g} elements, over the evaluator's limit of "
            f"{CHECK_ELEMENTS_LIMIT:.3g} (CHECK_ELEMENTS_LIMIT)"
        )
    return None


@dataclass(frozen=True)
class CheckablePair:
    """Two PCGs to compare with the reference evaluator: as given, or scaled down together.
    ``where``: what was done (empty, or " of an instance scaled down from full size (...)");
    ``skipped``: why no comparison is possible (too big even scaled down), or None."""

    pcgs: tuple[PCG, PCG]
    where: str = ""
    skipped: str | None = None


def checkable_pair(
    model: PCG, plan: PCG, *, flops_limit: float = CHECK_FLOPS_LIMIT
) -> CheckablePair:
    """``model`` and ``plan``, scaled down together (:func:`scaled_down`) when the evaluator
    could not compare them at full size (:func:`over_check_limits`)."""
    over = over_check_limits(model, plan, flops_limit)
    if over is None:
        return CheckablePair((model, plan))
    try:
        small = scaled_down(model, plan)
    except ScaleDownError as err:
        why = f"the check needs {over}, and the model has no smaller instance: {err}"
        return CheckablePair((model, plan), skipped=why)
    still = over_check_limits(*small.pcgs, flops_limit)
    if still is not None:
        why = f"the check needs {over}, and on the smallest instance still {still}"
        return CheckablePair((model, plan), skipped=why)
    shrunk = ", ".join(f"{a} to {b}" for a, b in small.sizes)
    return CheckablePair(
        (small.pcgs[0], small.pcgs[1]),
        where=f" of an instance scaled down from full size ({shrunk})",
    )
