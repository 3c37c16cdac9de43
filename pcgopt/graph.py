"""The parallel computation graph: a DAG of operator nodes whose edges carry parallel tensors.

A :class:`PCG` is immutable and always valid: its constructor checks names, operators,
parameters, arity, edges, acyclicity and every shape and degree, and raises a typed
:mod:`pcgopt.errors` error naming the node at fault. Nodes are kept in a topological order
(the given order where it already is one), and parameters in canonical form (declared order,
defaults filled in, axes non-negative), so two PCGs that mean the same nodes compare equal.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pcgopt.errors import (
    CycleError,
    DanglingEdgeError,
    DuplicateNameError,
    PCGError,
    SchemaError,
)
from pcgopt.ops import OPERATORS, OpKind, OpSpec, Params, get_op
from pcgopt.shapes import ParallelTensorShape

if TYPE_CHECKING:
    import networkx as nx


@dataclass(frozen=True, slots=True, order=True)
class TensorRef:
    """Output ``index`` of node ``node``. Written ``"node"`` for output 0, else ``"node:index"``."""

    node: str
    index: int = 0

    @classmethod
    def parse(cls, text: str | TensorRef) -> TensorRef:
        if isinstance(text, TensorRef):
            return text
        if not isinstance(text, str) or not text:
            raise SchemaError(f"a tensor reference must be a non-empty string, got {text!r}")
        name, sep, index = text.rpartition(":")
        if sep and index.isdigit():
            return cls(name, int(index))
        return cls(text, 0)

    def __repr__(self) -> str:
        return self.node if self.index == 0 else f"{self.node}:{self.index}"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class Node:
    """One operator application. ``params`` may be given as any mapping; the PCG stores the
    canonical :class:`Params`."""

    name: str
    op: str
    inputs: tuple[TensorRef, ...] = ()
    params: Params = field(default_factory=Params)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(TensorRef.parse(r) for r in self.inputs))
        if not isinstance(self.params, Params):
            if not isinstance(self.params, Mapping):
                raise SchemaError(
                    f"node {self.name!r}: params must be a mapping, got {self.params!r}"
                )
            object.__setattr__(self, "params", Params(dict(self.params)))

    @property
    def spec(self) -> OpSpec:
        return get_op(self.op)

    def output(self, index: int = 0) -> TensorRef:
        return TensorRef(self.name, index)

    def __repr__(self) -> str:
        args = ", ".join(map(str, self.inputs))
        params = "" if not self.params else f" {self.params!r}"
        return f"{self.name} = {self.op}({args}){params}"


class PCG:
    """A validated parallel computation graph (see the module docstring).

    >>> from pcgopt import PCGBuilder
    >>> b = PCGBuilder()
    >>> x = b.input((64, 784), name="x")
    >>> y = b.relu(b.matmul(x, b.weight((784, 512), name="w")))
    >>> pcg = b.build(y)
    >>> pcg.shape(pcg.outputs[0])
    f32[64, 512]
    """

    __slots__ = ("_by_name", "_hash", "_nodes", "_outputs", "_shapes")

    def __init__(
        self, nodes: Iterable[Node], outputs: Iterable[TensorRef | str] | None = None
    ) -> None:
        ordered, shapes = _validate(tuple(nodes))
        self._nodes: tuple[Node, ...] = ordered
        self._by_name: dict[str, Node] = {n.name: n for n in ordered}
        self._shapes: dict[str, tuple[ParallelTensorShape, ...]] = shapes
        if outputs is None:
            self._outputs = _sinks(ordered, shapes)
        else:
            self._outputs = tuple(TensorRef.parse(r) for r in outputs)
            for ref in self._outputs:
                if ref.node not in shapes or ref.index >= len(shapes[ref.node]):
                    raise DanglingEdgeError(
                        f"graph output {ref} names no tensor of the graph", node=ref.node
                    )
        self._hash = hash((self._nodes, self._outputs))

    @classmethod
    def _checked(
        cls,
        nodes: tuple[Node, ...],
        shapes: Mapping[str, tuple[ParallelTensorShape, ...]],
        outputs: Iterable[TensorRef] | None,
    ) -> PCG:
        """A PCG from nodes already validated one by one (in topological order, canonical
        params, ``shapes`` inferred), as :class:`~pcgopt.PCGBuilder` makes them: skips
        re-running every shape rule. Outputs are still checked."""
        self = cls.__new__(cls)
        self._nodes = tuple(nodes)
        self._by_name = {n.name: n for n in self._nodes}
        self._shapes = {n.name: shapes[n.name] for n in self._nodes}
        if outputs is None:
            self._outputs = _sinks(self._nodes, self._shapes)
        else:
            self._outputs = tuple(outputs)
            for ref in self._outputs:
                if ref.node not in self._shapes or ref.index >= len(self._shapes[ref.node]):
                    raise DanglingEdgeError(
                        f"graph output {ref} names no tensor of the graph", node=ref.node
                    )
        self._hash = hash((self._nodes, self._outputs))
        return self

    # -- access ---------------------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[Node, ...]:
        """All nodes, in topological order."""
        return self._nodes

    @property
    def outputs(self) -> tuple[TensorRef, ...]:
        return self._outputs

    def node(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in this PCG") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def shape(self, ref: TensorRef | str) -> ParallelTensorShape:
        """The parallel shape of a tensor."""
        ref = TensorRef.parse(ref)
        return self._shapes[ref.node][ref.index]

    def output_shapes(self, name: str) -> tuple[ParallelTensorShape, ...]:
        """The parallel shapes of a node's outputs."""
        return self._shapes[name]

    def input_shapes(self, name: str) -> tuple[ParallelTensorShape, ...]:
        return tuple(self.shape(r) for r in self.node(name).inputs)

    def nodes_of_kind(self, kind: OpKind) -> tuple[Node, ...]:
        return tuple(n for n in self._nodes if OPERATORS[n.op].kind is kind)

    def first_in_micro_batches(self) -> tuple[str, ParallelTensorShape] | None:
        """The first node (in order) whose output is cut into micro-batches (Pipeline), with
        that output's shape; None when the PCG processes whole batches."""
        # Only a Pipeline cuts micro-batches (sources are whole): without one, nothing to scan
        # (the cost model asks this of every PCG it costs).
        if not any(n.op == "pipeline" for n in self._nodes):
            return None
        for n in self._nodes:
            for s in self.output_shapes(n.name):
                if s.micro_batches > 1:
                    return n.name, s
        return None

    @property
    def inputs(self) -> tuple[Node, ...]:
        """The Input nodes."""
        return tuple(n for n in self._nodes if n.op == "input")

    @property
    def weights(self) -> tuple[Node, ...]:
        """The Weight nodes."""
        return tuple(n for n in self._nodes if n.op == "weight")

    def consumers(self) -> dict[TensorRef, list[tuple[str, int]]]:
        """For every consumed tensor, the (node, input position) pairs that read it."""
        out: dict[TensorRef, list[tuple[str, int]]] = {}
        for n in self._nodes:
            for pos, ref in enumerate(n.inputs):
                out.setdefault(ref, []).append((n.name, pos))
        return out

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PCG):
            return NotImplemented
        return self._nodes == other._nodes and self._outputs == other._outputs

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # Rebuilt, not restored: the cached hash is of strings, whose hashes differ between
        # processes.
        return (PCG, (self._nodes, self._outputs))

    def __repr__(self) -> str:
        outs = ", ".join(map(str, self._outputs))
        return f"<PCG {len(self._nodes)} nodes -> {outs}>"

    def renamed(self, names: Mapping[str, str]) -> PCG:
        """The same graph with node ``n`` named ``names[n]`` (every node must be in ``names``,
        the new names distinct). Shapes are carried over, not inferred again: renaming keeps a
        valid graph valid.

        >>> from pcgopt import PCGBuilder
        >>> b = PCGBuilder()
        >>> pcg = b.build(b.relu(b.input((2, 3), name="x"), name="y"))
        >>> pcg.renamed({"x": "v0", "y": "v1"}).nodes[1]
        v1 = relu(v0)
        """
        missing = [n.name for n in self._nodes if n.name not in names]
        if missing:
            raise SchemaError(f"renamed: no new name for node {missing[0]!r}")
        new = [names[n.name] for n in self._nodes]
        if len(set(new)) != len(new):
            dup = next(x for x in new if new.count(x) > 1)
            raise DuplicateNameError(f"renamed: two nodes would be named {dup!r}", node=dup)
        nodes = tuple(
            Node(
                names[n.name],
                n.op,
                tuple(TensorRef(names[r.node], r.index) for r in n.inputs),
                n.params,
            )
            for n in self._nodes
        )
        shapes = {names[k]: v for k, v in self._shapes.items()}
        outputs = [TensorRef(names[r.node], r.index) for r in self._outputs]
        return PCG._checked(nodes, shapes, outputs)

    # -- views and formats (implemented in their own modules) ----------------------------------

    def to_dict(self) -> dict[str, Any]:
        from pcgopt.serialize import pcg_to_dict

        return pcg_to_dict(self)

    def to_json(self, indent: int | None = 1) -> str:
        """JSON text (one node per line); :meth:`from_json` reads it back."""
        from pcgopt.serialize import pcg_to_json

        return pcg_to_json(self, indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PCG:
        from pcgopt.serialize import pcg_from_dict

        return pcg_from_dict(data)

    @classmethod
    def from_json(cls, text: str) -> PCG:
        from pcgopt.serialize import pcg_from_json

        return pcg_from_json(text)

    def to_networkx(self) -> nx.MultiDiGraph:
        from pcgopt.render import to_networkx

        return to_networkx(self)

    def to_dot(self) -> str:
        from pcgopt.render import to_dot

        return to_dot(self)

    def summary(self, *, max_rows: int | None = 60) -> str:
        from pcgopt.render import summary

        return summary(self, max_rows=max_rows)


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


def _validate(
    nodes: tuple[Node, ...],
) -> tuple[tuple[Node, ...], dict[str, tuple[ParallelTensorShape, ...]]]:
    position: dict[str, int] = {}
    parsed: list[tuple[Node, OpSpec, Params]] = []
    for i, n in enumerate(nodes):
        if not isinstance(n, Node):
            raise SchemaError(f"nodes[{i}] is not a Node: {n!r}")
        if not isinstance(n.name, str) or not n.name:
            raise SchemaError(
                f"nodes[{i}] has an invalid name {n.name!r}; names are non-empty strings"
            )
        if n.name in position:
            raise DuplicateNameError(
                f"two nodes are named {n.name!r} (positions {position[n.name]} and {i})",
                node=n.name,
            )
        position[n.name] = i
        try:
            spec = get_op(n.op)
            spec.check_arity(len(n.inputs))
            params = spec.make_params(n.params)  # axes are normalized once input ranks are known
        except PCGError as e:
            raise e.at_node(n.name, n.op) from None
        parsed.append((n, spec, params))

    num_outputs = {n.name: spec.num_outputs(params) for n, spec, params in parsed}
    for n, _, _ in parsed:
        for pos, ref in enumerate(n.inputs):
            if ref.node not in position:
                raise DanglingEdgeError(
                    f"node {n.name!r} ({n.op}): input {pos} reads {ref}, but no node is named "
                    f"{ref.node!r}",
                    node=n.name,
                )
            if not 0 <= ref.index < num_outputs[ref.node]:
                raise DanglingEdgeError(
                    f"node {n.name!r} ({n.op}): input {pos} reads output {ref.index} of "
                    f"{ref.node!r}, which has {num_outputs[ref.node]} output(s)",
                    node=n.name,
                )

    order = _topological_order(parsed, position)
    shapes: dict[str, tuple[ParallelTensorShape, ...]] = {}
    canonical = []
    for k in order:
        n, spec, params = parsed[k]
        in_shapes = tuple(shapes[r.node][r.index] for r in n.inputs)
        try:
            params = spec.make_params(params, in_shapes)
            shapes[n.name] = spec.infer(params, in_shapes)
        except PCGError as e:
            raise e.at_node(n.name, n.op) from None
        canonical.append(Node(n.name, n.op, n.inputs, params))
    return tuple(canonical), shapes


def _topological_order(parsed, position: dict[str, int]) -> list[int]:
    """Kahn's algorithm, taking the earliest ready node first so a valid order is kept."""
    indegree = [len(n.inputs) for n, _, _ in parsed]
    users: list[list[int]] = [[] for _ in parsed]
    for i, (n, _, _) in enumerate(parsed):
        for ref in n.inputs:
            users[position[ref.node]].append(i)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(parsed):
        stuck = [parsed[i][0].name for i, d in enumerate(indegree) if d > 0]
        cycle = _find_cycle(parsed, position, set(stuck))
        raise CycleError(f"the graph has a cycle: {' -> '.join(map(repr, cycle))}", node=cycle[0])
    return order


def _find_cycle(parsed, position: dict[str, int], stuck: set[str]) -> list[str]:
    """One cycle among the nodes Kahn's algorithm could not order, as a closed path."""
    preds = {
        n.name: [r.node for r in n.inputs if r.node in stuck]
        for n, _, _ in parsed
        if n.name in stuck
    }
    start = min(stuck, key=position.__getitem__)
    path, seen = [start], {start: 0}
    while True:
        nxt = preds[path[-1]][0]
        if nxt in seen:
            cycle = [*path[seen[nxt] :], nxt]
            return list(reversed(cycle))
        seen[nxt] = len(path)
        path.append(nxt)


def _sinks(nodes: tuple[Node, ...], shapes) -> tuple[TensorRef, ...]:
    used = {r for n in nodes for r in n.inputs}
    return tuple(
        TensorRef(n.name, i)
        for n in nodes
        if OPERATORS[n.op].kind is not OpKind.SOURCE
        for i in range(len(shapes[n.name]))
        if TensorRef(n.name, i) not in used
    )


def layout_changes_late(nodes: Iterable[Node]) -> list[Node]:
    """``nodes`` (in an order where inputs come first) with every parallelization node moved to
    just before its first reader, the others kept in their order. The order of a PCG's nodes is
    the order a runtime issues them (:mod:`pcgopt.extract.costmodel.simulate`: each stream runs
    its tasks in that order), so a branch's output laid out for a join is best changed after the
    other branches are issued: changed before them, its collective holds up the streams they
    need (an e-graph's plan of CANDLE-Uno on 2 Summit nodes, listed in post-order: 227.4 ms
    mapped, 113.8 ms with its layout changes late). The baselines' lowerings list the layout
    changes of computed tensors so already (a source's layouts are ready from the start)."""
    ordered = list(nodes)
    held: dict[str, Node] = {}
    out: list[Node] = []

    def emit(node: Node) -> None:
        # Held inputs first, depth first, without recursion (chains of layout changes). A held
        # node leaves ``held`` when it is expanded, not when it is pushed: a node reading a
        # layout change and a layout change of it must find both before it.
        stack: list[tuple[Node, bool]] = [(node, False)]
        while stack:
            current, ready = stack.pop()
            if ready:
                out.append(current)
                continue
            if current is not node:
                if current.name not in held:
                    continue  # expanded already, from another reader's entry
                del held[current.name]
            stack.append((current, True))
            stack.extend((held[r.node], False) for r in reversed(current.inputs) if r.node in held)

    for node in ordered:
        if node.spec.kind is OpKind.PARALLEL:
            held[node.name] = node
        else:
            emit(node)
    for node in ordered:  # read by no other node: an output
        if node.name in held:
            emit(held.pop(node.name))
    return out
