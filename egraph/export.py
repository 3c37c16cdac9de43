"""The saturated e-graph as plain Python data, and the way back to a PCG.

:func:`export` reads egglog's tables once (``EGraph.freeze``) into an :class:`EGraphData`:
dense e-class ids, one :class:`ENode` per row of every operator constructor, the parallel shape
of every tensor e-class, and the e-classes of the input PCG's outputs. Values are decoded once
per distinct egglog value (memoized), not per use.

:meth:`EGraphData.to_pcg` turns a choice of one e-node per needed e-class into a validated PCG;
:meth:`EGraphData.contains` says whether a given PCG, node for node, is represented.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pcgopt.egraph.language import (
    MAX_VARIADIC,
    EGraphError,
    Language,
    decode_param,
    multi_output,
    within_arity,
)
from pcgopt.errors import PCGError
from pcgopt.graph import PCG, Node, TensorRef, layout_changes_late
from pcgopt.ops import OpKind, Params, get_op
from pcgopt.shapes import DType, ParallelTensorShape

#: The pseudo-operator of an e-node that picks output ``index`` of a multi-output e-class.
OUT = "out"


@dataclass(frozen=True, slots=True)
class ENode:
    """One e-node: operator, parameters, child e-classes (tensor inputs in order) and, for
    sources, the source's name. An ``out`` e-node picks output ``params['index']`` of its
    child (a multi-output e-class)."""

    op: str
    params: Params
    children: tuple[int, ...]
    eclass: int
    name: str | None = None

    def __repr__(self) -> str:
        args = ", ".join(f"c{c}" for c in self.children)
        if self.name is not None:
            args = repr(self.name)
        params = f" {self.params!r}" if self.params else ""
        return f"{self.op}({args}){params} in c{self.eclass}"


class ChoiceError(PCGError):
    """A choice of e-nodes that does not make a PCG (missing class, cycle, wrong node)."""


@dataclass
class EGraphData:
    """An exported e-graph (see the module docstring).

    ``nodes[i]`` is e-node ``i``; ``classes[c]`` lists the e-nodes of e-class ``c``;
    ``shapes[c]`` is the parallel shape of tensor e-class ``c`` (None for the tuple classes of
    multi-output operators); ``roots`` are the e-classes of the input PCG's outputs.
    """

    nodes: list[ENode]
    classes: list[list[int]]
    shapes: list[ParallelTensorShape | None]
    roots: tuple[int, ...]
    _index: dict[tuple, int] | None = field(default=None, repr=False)
    _readers: list[list[int]] | None = field(default=None, repr=False)

    @property
    def num_enodes(self) -> int:
        return len(self.nodes)

    @property
    def num_eclasses(self) -> int:
        return len(self.classes)

    def node_classes(self) -> np.ndarray:
        """The e-class of every e-node, as an array."""
        return np.fromiter((n.eclass for n in self.nodes), dtype=np.int64, count=len(self.nodes))

    def readers(self) -> list[list[int]]:
        """For every e-class, the e-nodes that read it, in e-node order, each once however many
        of its children it is. Computed once: extraction's fixpoints and
        :meth:`logical_values` walk the e-graph upward with it."""
        if self._readers is None:
            readers: list[list[int]] = [[] for _ in range(self.num_eclasses)]
            for i, n in enumerate(self.nodes):
                for c in dict.fromkeys(n.children):
                    readers[c].append(i)
            self._readers = readers
        return self._readers

    def reachable(self, roots: Sequence[int], *, source_prefix: str = "") -> EGraphData:
        """The e-graph that outputs ``roots``: the e-classes they need, and every source whose
        name starts with ``source_prefix`` (kept used or not, as :meth:`to_pcg` keeps every
        source), with that prefix taken off the names; e-classes renumbered densely. For
        e-graphs holding several PCGs (:func:`~pcgopt.egraph.saturate_together`)."""
        new_class: dict[int, int] = {}
        stack: list[int] = []

        def visit(c: int) -> None:
            if c not in new_class:
                new_class[c] = len(new_class)
                stack.append(c)

        for c in roots:
            visit(c)
        for n in self.nodes:
            if n.name is not None and n.name.startswith(source_prefix):
                visit(n.eclass)
        while stack:
            for i in self.classes[stack.pop()]:
                for child in self.nodes[i].children:
                    visit(child)
        nodes: list[ENode] = []
        classes: list[list[int]] = [[] for _ in new_class]
        for n in self.nodes:
            c = new_class.get(n.eclass)
            if c is None:
                continue
            name = n.name
            if name is not None:
                if not name.startswith(source_prefix):
                    raise EGraphError(
                        f"source {name!r} is in an e-class the outputs need but lacks the "
                        f"prefix {source_prefix!r}: PCGs loaded together are connected"
                    )
                name = name[len(source_prefix) :]
            classes[c].append(len(nodes))
            nodes.append(ENode(n.op, n.params, tuple(new_class[k] for k in n.children), c, name))
        shapes: list[ParallelTensorShape | None] = [None] * len(new_class)
        for old, c in new_class.items():
            shapes[c] = self.shapes[old]
        return EGraphData(nodes, classes, shapes, tuple(new_class[c] for c in roots))

    # -- from a choice to a PCG ------------------------------------------------------------------

    def to_pcg(self, choose: Mapping[int, int] | Callable[[int], int]) -> PCG:
        """The PCG that picks e-node ``choose[c]`` (an index into ``nodes``) for every e-class
        ``c`` the outputs need, with every source of the input PCG (used or not). Raises
        :class:`ChoiceError` if a needed class has no choice, the choice is not in its class, or
        the choices form a cycle; the PCG validates."""
        pick = choose if callable(choose) else choose.__getitem__
        built: dict[int, TensorRef] = {}
        made: list[Node] = []
        names: set[str] = set()
        on_path: set[int] = set()

        def fresh(op: str) -> str:
            k = len(made)
            name = f"{op}_{k}"
            while name in names:
                k += 1
                name = f"{op}_{k}"
            return name

        def chosen(c: int) -> ENode:
            try:
                i = pick(c)
            except (KeyError, IndexError):
                raise ChoiceError(f"no e-node chosen for e-class c{c}") from None
            if not 0 <= i < len(self.nodes) or self.nodes[i].eclass != c:
                raise ChoiceError(f"e-node {i} chosen for e-class c{c} is not in that class")
            return self.nodes[i]

        def build(c: int) -> TensorRef:
            # Iterative post-order: models are deep, recursion would overflow.
            stack: list[tuple[int, bool]] = [(c, False)]
            while stack:
                cls, expanded = stack.pop()
                if cls in built:
                    continue
                node = chosen(cls)
                if not expanded:
                    if cls in on_path:
                        raise ChoiceError(f"the chosen e-nodes form a cycle through e-class c{cls}")
                    on_path.add(cls)
                    stack.append((cls, True))
                    stack.extend((ch, False) for ch in reversed(node.children) if ch not in built)
                    continue
                on_path.discard(cls)
                if node.op == OUT:
                    parent = built[node.children[0]]
                    built[cls] = TensorRef(parent.node, node.params["index"])
                    continue
                name = node.name if node.name is not None else fresh(node.op)
                names.add(name)
                made.append(
                    Node(name, node.op, tuple(built[ch] for ch in node.children), node.params)
                )
                built[cls] = TensorRef(name, 0)
            return built[c]

        outputs = [build(r) for r in self.roots]
        # Every source stays, used or not, so the plan takes the same inputs as the model.
        for n in self.nodes:
            if n.name is not None and n.name not in names:
                made.append(Node(n.name, n.op, (), n.params))
                names.add(n.name)
        return PCG(layout_changes_late(made), outputs)

    # -- is a PCG represented? -------------------------------------------------------------------

    def _hashcons(self) -> dict[tuple, int]:
        if self._index is None:
            self._index = {(n.op, n.params, n.children, n.name): n.eclass for n in self.nodes}
        return self._index

    def classes_of(self, pcg: PCG) -> dict[TensorRef, int] | None:
        """The e-class of every tensor of ``pcg`` if the e-graph holds all its nodes (sources by
        name), else None."""
        where, missing = self._walk(pcg)
        return None if missing is not None else where

    def first_missing(self, pcg: PCG) -> str | None:
        """The first node of ``pcg`` (in its order) that the e-graph does not hold over the
        e-classes of its inputs, or None if it holds them all: where a plan that
        :meth:`contains` rejects leaves the e-graph.

        >>> from pcgopt import Machine, PCGBuilder
        >>> from pcgopt.egraph import saturate
        >>> b = PCGBuilder()
        >>> pcg = b.build(b.relu(b.input((4, 4), name="x")))
        >>> eg = saturate(pcg, Machine.preset("v100-ring", devices_per_node=2), rules=[]).egraph
        >>> b = PCGBuilder()
        >>> copied = b.build(b.relu(b.replicate(b.input((4, 4), name="x"), degree=2, name="x2")))
        >>> eg.first_missing(pcg) is None, eg.first_missing(copied)
        (True, 'x2')
        """
        return self._walk(pcg)[1]

    def _walk(self, pcg: PCG) -> tuple[dict[TensorRef, int], str | None]:
        pcg = within_arity(pcg, MAX_VARIADIC)  # as it was loaded
        index = self._hashcons()
        where: dict[TensorRef, int] = {}
        for node in pcg.nodes:
            children = tuple(where[r] for r in node.inputs)
            name = node.name if node.spec.kind is OpKind.SOURCE else None
            cls = index.get((node.op, node.params, children, name))
            if cls is None:
                return where, node.name
            n_out = len(pcg.output_shapes(node.name))
            if self.shapes[cls] is None:  # a multi-output class: its outputs are `out` nodes
                for i in range(n_out):
                    out_cls = index.get((OUT, Params({"index": i}), (cls,), None))
                    if out_cls is None:
                        return where, node.name
                    where[TensorRef(node.name, i)] = out_cls
            else:
                where[TensorRef(node.name, 0)] = cls
        return where, None

    def logical_values(self, pcg: PCG) -> list[TensorRef | None]:
        """For every e-class, the tensor of ``pcg`` (the PCG the e-graph was saturated from) it
        holds as a logical value, or None if it holds none (a value only a rewrite made, such
        as half of a split weight, or a tuple class). Parallel operators move a value without
        changing it, and a compute e-node with ``pcg``'s operator and parameters over the
        values of that node's inputs holds that node's output (the exact-match part of
        :func:`pcgopt.names.model_names`, which also follows fused and unfused dense
        layers): so the e-class of a linear layer's batch-split shard holds that layer's
        output."""
        pcg = within_arity(pcg, MAX_VARIADIC)  # as it was loaded
        index: dict[tuple, str] = {}
        for n in pcg.nodes:
            if n.spec.kind is OpKind.COMPUTE:
                index.setdefault((n.op, n.params, n.inputs), n.name)
        value: list[TensorRef | None] = [None] * self.num_eclasses
        readers = self.readers()
        stack: list[int] = []
        for n in self.nodes:
            if n.name is not None and n.name in pcg and value[n.eclass] is None:
                value[n.eclass] = TensorRef(n.name, 0)
                stack.append(n.eclass)
        # A worklist over the e-nodes that read a class as it gets its value.
        while stack:
            for i in readers[stack.pop()]:
                n = self.nodes[i]
                if value[n.eclass] is not None:
                    continue
                args = [value[c] for c in n.children]
                if any(a is None for a in args):
                    continue
                found: TensorRef | None = None
                if n.op == OUT:
                    parent = args[0]
                    assert parent is not None
                    found = TensorRef(parent.node, n.params["index"])
                elif get_op(n.op).kind is OpKind.PARALLEL:
                    found = args[0] if len(args) == 1 else None
                else:
                    name = index.get((n.op, n.params, tuple(args)))
                    found = None if name is None else TensorRef(name, 0)
                if found is not None:
                    value[n.eclass] = found
                    stack.append(n.eclass)
        return value

    def contains(self, pcg: PCG) -> bool:
        """Whether ``pcg`` (the same operators, parameters and sources, node for node) is
        represented in the e-graph with its outputs in the input PCG's output e-classes, that is,
        whether extraction could return exactly it."""
        where = self.classes_of(pcg)
        if where is None or len(pcg.outputs) != len(self.roots):
            return False
        return all(where[r] == root for r, root in zip(pcg.outputs, self.roots, strict=True))

    def choice_for(self, pcg: PCG) -> dict[int, int]:
        """The choice of e-nodes that :meth:`to_pcg` turns into ``pcg`` (up to node names).
        Raises :class:`ChoiceError` if the e-graph does not contain it."""
        if not self.contains(pcg):
            raise ChoiceError("the e-graph does not contain this PCG")
        pcg = within_arity(pcg, MAX_VARIADIC)  # as it was loaded
        where = self.classes_of(pcg)
        assert where is not None
        node_of = {}
        for i, n in enumerate(self.nodes):
            node_of.setdefault((n.op, n.params, n.children, n.name), i)
        choice: dict[int, int] = {}
        for node in pcg.nodes:
            children = tuple(where[r] for r in node.inputs)
            name = node.name if node.spec.kind is OpKind.SOURCE else None
            key = (node.op, node.params, children, name)
            cls = self._hashcons()[key]
            choice[cls] = node_of[key]
            if self.shapes[cls] is None:
                for i in range(len(pcg.output_shapes(node.name))):
                    k = (OUT, Params({"index": i}), (cls,), None)
                    choice[self._hashcons()[k]] = node_of[k]
        return choice


# --------------------------------------------------------------------------------------------
# reading egglog's tables
# --------------------------------------------------------------------------------------------


class _Decoder:
    """Decodes egglog values once each."""

    def __init__(self, egraph: Any) -> None:
        self.eg = egraph
        self._i64: dict[Any, int] = {}
        self._str: dict[Any, str] = {}
        self._vec: dict[Any, tuple[int, ...]] = {}

    def i64(self, v: Any) -> int:
        out = self._i64.get(v)
        if out is None:
            out = self._i64[v] = self.eg.value_to_i64(v)
        return out

    def string(self, v: Any) -> str:
        out = self._str.get(v)
        if out is None:
            out = self._str[v] = self.eg.value_to_string(v)
        return out

    def vec(self, v: Any) -> tuple[int, ...]:
        out = self._vec.get(v)
        if out is None:
            out = self._vec[v] = tuple(self.i64(x) for x in self.eg.value_to_vec(v))
        return out

    def of_sort(self, sort: str, v: Any) -> Any:
        if sort == "i64":
            return self.i64(v)
        if sort == "String":
            return self.string(v)
        if sort == "IV":
            return self.vec(v)
        raise EGraphError(f"cannot decode a value of sort {sort}")


def export(egraph: Any, lang: Language, roots: Sequence[Any]) -> EGraphData:
    """Reads a saturated egglog e-graph (``egglog.bindings.EGraph``) into :class:`EGraphData`;
    ``roots`` are the egglog values of the output e-classes."""
    frozen = egraph.freeze().functions
    dec = _Decoder(egraph)
    class_id: dict[Any, int] = {}

    def cid(v: Any) -> int:
        c = class_id.get(v)
        if c is None:
            c = class_id[v] = len(class_id)
        return c

    nodes: list[ENode] = []
    for fname, table in frozen.items():
        if fname == OUT:
            for row in table.rows:
                tt, index = row.inputs
                nodes.append(
                    ENode(OUT, Params({"index": dec.i64(index)}), (cid(tt),), cid(row.output))
                )
            continue
        c = lang.by_name(fname)
        if c is None:
            continue
        spec = c.spec
        param_specs = spec.params
        n_args = c.arity
        is_source = spec.kind is OpKind.SOURCE
        sorts = c.sorts
        for row in table.rows:
            ins = row.inputs
            children = tuple(cid(v) for v in ins[:n_args])
            k = n_args
            name = None
            if is_source:
                name = dec.string(ins[k])
                k += 1
            params = Params(
                {
                    p.name: decode_param(p.type, dec.of_sort(sorts[k + j], ins[k + j]))
                    for j, p in enumerate(param_specs)
                }
            )
            nodes.append(ENode(c.op, params, children, cid(row.output), name))

    classes: list[list[int]] = [[] for _ in range(len(class_id))]
    for i, n in enumerate(nodes):
        classes[n.eclass].append(i)
    facts: dict[str, dict[int, Any]] = {}
    for table in ("sizes", "degs", "copies", "psum", "dtype"):
        sort = "String" if table == "dtype" else ("IV" if table in ("sizes", "degs") else "i64")
        facts[table] = {
            class_id[row.inputs[0]]: dec.of_sort(sort, row.output)
            for row in frozen[table].rows
            if row.inputs[0] in class_id
        }
    shape_memo: dict[tuple, ParallelTensorShape] = {}
    shapes: list[ParallelTensorShape | None] = [None] * len(classes)
    for c in range(len(classes)):
        if c not in facts["sizes"]:
            continue
        key = (
            facts["sizes"][c],
            facts["degs"][c],
            facts["copies"][c],
            facts["psum"][c],
            facts["dtype"][c],
        )
        shape = shape_memo.get(key)
        if shape is None:
            shape = shape_memo[key] = ParallelTensorShape.of(
                key[0], DType.of(key[4]), degrees=key[1], copy_degree=key[2], sum_degree=key[3]
            )
        shapes[c] = shape
    for i, n in enumerate(nodes):
        if n.op != OUT and shapes[n.eclass] is None and not multi_output(get_op(n.op)):
            raise EGraphError(f"e-class c{n.eclass} of {nodes[i]!r} has no shape facts")
    return EGraphData(nodes, classes, shapes, tuple(cid(r) for r in roots))


__all__ = ["OUT", "ChoiceError", "EGraphData", "ENode", "export"]
