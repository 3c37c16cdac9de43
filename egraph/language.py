"""The egglog language of PCGs, derived from the operator registry.

Every operator of :data:`pcgopt.ops.OPERATORS` becomes one egglog constructor per input count
it takes (``op_relu``, ``op_linear_2``/``op_linear_3``, ``op_concat_3``...): tensor inputs first,
then the operator's parameters in declaration order, each with the egglog sort its
:class:`~pcgopt.ops.params.ParamType` maps to. Sources (``input``, ``weight``) carry the node's
name as well, so that two inputs of one shape stay two tensors. Operators with several outputs
build a tuple (sort ``TT``) whose outputs ``out`` picks.

Per e-class facts are egglog tables keyed by the tensor e-class, without a merge function: a union
of two tensors whose facts differ is an egglog error, which :mod:`pcgopt.egraph.saturate` reports
as a soundness bug (:class:`ShapeConflictError`), never a silent merge.

* ``sizes`` (``Vec i64``): logical sizes; ``degs`` (``Vec i64``): per-dimension degrees;
* ``copies``/``psum`` (``i64``): the replica degree and its kind (identical copies or partial
  sums, as in the IR); ``dtype`` (``String``);
* ``ndev`` (``i64``): the number of shards (devices) the tensor spans.

>>> lang = language()
>>> lang.constructor("linear", 2).name, lang.constructor("partition", 1).sorts
('op_linear_2', ('T', 'i64', 'i64'))
>>> lang.constructor("split", 1).returns
'TT'
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pcgopt.errors import SchemaError
from pcgopt.graph import PCG, Node, TensorRef
from pcgopt.ops import OPERATORS, OpKind, Params, get_op
from pcgopt.ops.params import ParamType
from pcgopt.ops.spec import OpSpec
from pcgopt.rules.arity import WIDEST
from pcgopt.shapes import DType, ParallelTensorShape

#: The egglog sort of each parameter type.
PARAM_SORTS: dict[ParamType, str] = {
    ParamType.INT: "i64",
    ParamType.POS_INT: "i64",
    ParamType.NONNEG_INT: "i64",
    ParamType.AXIS: "i64",
    ParamType.FLOAT: "String",  # repr: exact round trip
    ParamType.BOOL: "String",
    ParamType.STR: "String",
    ParamType.DTYPE: "String",
    ParamType.INTS: "IV",
    ParamType.SHAPE: "IV",
    ParamType.AXES: "IV",
    ParamType.PAIR: "IV",
    ParamType.POS_PAIR: "IV",
}

#: Stands for an integer parameter left at None (no operator takes it as a value).
NONE_INT = -(2**62)

#: The fact tables, in declaration order, with their value sorts.
FACT_TABLES: tuple[tuple[str, str], ...] = (
    ("sizes", "IV"),
    ("degs", "IV"),
    ("copies", "i64"),
    ("psum", "i64"),
    ("dtype", "String"),
    ("ndev", "i64"),
)


class EGraphError(SchemaError):
    """An e-graph cannot be built or read back (an operator or value the language cannot hold)."""


@dataclass(frozen=True, slots=True)
class Constructor:
    """The egglog constructor of ``op`` applied to ``arity`` tensors."""

    op: str
    arity: int
    name: str
    #: Argument sorts: ``arity`` times ``T``, then (sources) the node name, then parameters.
    sorts: tuple[str, ...]
    returns: str  # "T", or "TT" for operators with several outputs

    @property
    def spec(self) -> OpSpec:
        return get_op(self.op)

    def declaration(self) -> str:
        return f"(constructor {self.name} ({' '.join(self.sorts)}) {self.returns})"


def multi_output(spec: OpSpec) -> bool:
    """Whether the operator may have several outputs (its constructor builds a ``TT``)."""
    return type(spec).num_outputs is not OpSpec.num_outputs


#: The most inputs of a variadic operator's constructor; a wider concat is loaded as a concat
#: of concats (:func:`within_arity`). The rules about layouts through a concat are generated
#: at every arity up to it (:mod:`pcgopt.rules.arity`).
MAX_VARIADIC = WIDEST


def _arities(spec: OpSpec, max_variadic: int) -> range:
    if spec.kind is OpKind.SOURCE:
        return range(0, 1)
    hi = spec.max_inputs if spec.max_inputs is not None else max_variadic
    return range(spec.min_inputs, hi + 1)


class Language:
    """The constructors of every operator, and the egglog program's declarations."""

    def __init__(self, max_variadic: int = MAX_VARIADIC) -> None:
        self.max_variadic = max_variadic
        self._by_key: dict[tuple[str, int], Constructor] = {}
        self._by_name: dict[str, Constructor] = {}
        for op, spec in OPERATORS.items():
            arities = _arities(spec, max_variadic)
            for n in arities:
                name = f"op_{op}" if len(arities) == 1 else f"op_{op}_{n}"
                sorts = ("T",) * n
                if spec.kind is OpKind.SOURCE:
                    sorts += ("String",)
                sorts += tuple(PARAM_SORTS[p.type] for p in spec.params)
                c = Constructor(op, n, name, sorts, "TT" if multi_output(spec) else "T")
                self._by_key[op, n] = c
                self._by_name[name] = c

    def constructor(self, op: str, arity: int) -> Constructor:
        try:
            return self._by_key[op, arity]
        except KeyError:
            spec = get_op(op)
            raise EGraphError(
                f"{op} with {arity} input(s) has no e-graph constructor (it takes "
                f"{spec.min_inputs} to {spec.max_inputs or self.max_variadic})"
            ) from None

    def by_name(self, name: str) -> Constructor | None:
        return self._by_name.get(name)

    @property
    def constructors(self) -> tuple[Constructor, ...]:
        return tuple(self._by_key.values())

    def declarations(self) -> str:
        """The sorts, constructors and fact tables, as egglog text."""
        lines = [
            "(sort IV (Vec i64))",
            "(datatype T)",
            "(datatype TT)",
            "(constructor out (TT i64) T)",
        ]
        lines += [c.declaration() for c in self.constructors]
        lines += [f"(function {name} (T) {sort} :no-merge)" for name, sort in FACT_TABLES]
        return "\n".join(lines)


def within_arity(pcg: PCG, max_inputs: int) -> PCG:
    """``pcg`` with every concat of more than ``max_inputs`` inputs (a recommender's 26
    embedding tables) written as a concat of concats of at most that many, the same tensor:
    the e-graph has constructors for a bounded number of inputs. The outer concat keeps the
    node's name; the inner ones are ``name/part0``, ``name/part1``, ..."""
    if all(len(n.inputs) <= max_inputs for n in pcg.nodes if n.op == "concat"):
        return pcg
    nodes: list[Node] = []
    for node in pcg.nodes:
        inputs = list(node.inputs)
        level = 0
        while node.op == "concat" and len(inputs) > max_inputs:
            parts = []
            for k in range(0, len(inputs), max_inputs):
                chunk = tuple(inputs[k : k + max_inputs])
                if len(chunk) == 1:
                    parts.append(chunk[0])
                    continue
                name = f"{node.name}/part{f'{level}_' if level else ''}{k // max_inputs}"
                nodes.append(Node(name, "concat", chunk, node.params))
                parts.append(TensorRef(name, 0))
            inputs, level = parts, level + 1
        nodes.append(Node(node.name, node.op, tuple(inputs), node.params))
    return PCG(nodes, pcg.outputs)


@functools.cache
def language() -> Language:
    """The language of the registered operators (built once)."""
    return Language()


# --------------------------------------------------------------------------------------------
# values <-> egglog literals
# --------------------------------------------------------------------------------------------


def string_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def int_vector(values: tuple[int, ...] | list[int]) -> str:
    return "(vec-of " + " ".join(map(str, values)) + ")" if values else "(vec-empty)"


def encode_param(ptype: ParamType, value: Any, where: str) -> str:
    """The egglog literal of a concrete parameter value."""
    sort = PARAM_SORTS[ptype]
    if sort == "i64":
        if value is None:
            return str(NONE_INT)
        if not isinstance(value, int) or isinstance(value, bool):
            raise EGraphError(f"{where}: expected an int, got {value!r}")
        return str(value)
    if sort == "IV":
        if value is None:
            return "(vec-empty)"
        if isinstance(value, int):
            value = (value, value)
        return int_vector(tuple(value))
    if ptype is ParamType.DTYPE:
        return string_literal(DType.of(value).value)
    return string_literal(repr(value) if ptype in (ParamType.FLOAT, ParamType.BOOL) else value)


def decode_param(ptype: ParamType, raw: Any) -> Any:
    """A parameter value from the decoded egglog value (int, string or tuple of ints)."""
    sort = PARAM_SORTS[ptype]
    if sort == "i64":
        return None if raw == NONE_INT else raw
    if sort == "IV":
        # The empty vector is None for optional lists (axes=None: all of them); a shape is
        # never None, and empty is a rank-0 tensor's.
        return None if raw == () and ptype is not ParamType.SHAPE else tuple(raw)
    if ptype is ParamType.DTYPE:
        return DType.of(raw)
    if ptype is ParamType.FLOAT:
        return float(raw)
    if ptype is ParamType.BOOL:
        return raw == "True"
    return raw


def node_call(
    lang: Language, op: str, args: list[str], params: Params | Mapping, source_name: str | None
) -> str:
    """The egglog call building ``op`` on argument expressions, with concrete parameters."""
    c = lang.constructor(op, len(args))
    parts = [c.name, *args]
    if source_name is not None:
        parts.append(string_literal(source_name))
    for p in c.spec.params:
        parts.append(encode_param(p.type, params.get(p.name), f"{op}.{p.name}"))
    return "(" + " ".join(parts) + ")"


def fact_values(shape: ParallelTensorShape) -> dict[str, str]:
    """The fact-table literals of a concrete parallel shape."""
    return {
        "sizes": int_vector(shape.sizes),
        "degs": int_vector(shape.degrees),
        "copies": str(shape.copy_degree),
        "psum": str(shape.sum_degree),
        "dtype": string_literal(shape.dtype.value),
        "ndev": str(shape.num_shards),
    }


__all__ = [
    "FACT_TABLES",
    "PARAM_SORTS",
    "Constructor",
    "EGraphError",
    "Language",
    "decode_param",
    "encode_param",
    "fact_values",
    "language",
    "multi_output",
    "node_call",
]
