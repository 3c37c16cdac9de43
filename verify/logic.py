"""Terms as Z3 terms over an uninterpreted tensor sort: the logical half of a rule.

Every compute operator becomes an uninterpreted Z3 function of its parameters (integers; reals
for floats; choice indices for strings) and its tensor arguments, one function per operator
*and ranks of its arguments*: a fact about a matrix product of two matrices says nothing about
one of a 3-D tensor and a matrix, so the two must not share a symbol. Parallelization operators do
not change the tensor a value stands for, so they are *erased*: Partition, Combine, Replicate,
Reduce, DiscardCopies, ToPartial and the fused collectives become their input, and StackPartial
becomes the sum of its inputs. These erasures are axioms like any other (``verify.axioms``,
each checked against the reference evaluator); applying them by rewriting is just fast. What
erasure forgets, the distribution, is the shape half (``verify.shapes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import z3

from pcgopt.ops import OPERATORS, ParallelOp
from pcgopt.ops.parallel import StackPartial
from pcgopt.ops.params import ParamType
from pcgopt.rewrite import (
    Expr,
    Instance,
    Prod,
    Quot,
    Rule,
    SizeOf,
    Sum,
    Sym,
    Term,
    Var,
    concrete_params,
)
from pcgopt.shapes import DType, ParallelTensorShape

TENSOR = z3.DeclareSort("Tensor")
#: ``size(x, d)``: the logical size of tensor ``x`` along dimension ``d``.
SIZE = z3.Function("size", TENSOR, z3.IntSort(), z3.IntSort())

_INT_TYPES = (ParamType.INT, ParamType.POS_INT, ParamType.NONNEG_INT, ParamType.AXIS)
_TUPLE_TYPES = (ParamType.INTS, ParamType.SHAPE, ParamType.PAIR, ParamType.POS_PAIR, ParamType.AXES)


def erased_name(op: str) -> str | None:
    """``None`` for operators erased to their first input; the operator itself otherwise."""
    spec = OPERATORS[op]
    return None if isinstance(spec, ParallelOp) else op


@dataclass
class Encoder:
    """Builds Z3 terms; one Z3 function per operator and parameter arity (shared by all rules
    and axioms encoded with the same encoder)."""

    functions: dict[tuple, z3.FuncDeclRef] = field(default_factory=dict)
    #: Parallel operators erased while encoding, for reporting.
    erased: set[str] = field(default_factory=set)

    def tensor(self, name: str) -> z3.ExprRef:
        return z3.Const(name, TENSOR)

    def encode(
        self,
        expr: Expr,
        tensors: Mapping[str, z3.ExprRef],
        symbols: Mapping[str, z3.ArithRef],
        ranks: Mapping[Expr, int],
    ) -> z3.ExprRef:
        """``ranks`` gives the rank of every sub-expression (see :func:`logical_ranks`)."""
        if isinstance(expr, Var):
            return tensors[expr.name]
        spec = OPERATORS[expr.op]
        if isinstance(spec, ParallelOp):
            self.erased.add(expr.op)
            return self.encode(expr.args[0], tensors, symbols, ranks)
        args = [self.encode(a, tensors, symbols, ranks) for a in expr.args]
        arg_ranks = tuple(ranks[a] for a in expr.args)
        if isinstance(spec, StackPartial):
            self.erased.add(expr.op)
            total = args[0]
            for a in args[1:]:
                total = self._add(total, a, arg_ranks[0])
            return total
        values, shape_key = [], []
        for p in spec.params:
            v = expr.params.get(p.name, None if p.required else p.default)
            enc = self._param(p, v, tensors, symbols)
            shape_key.append(len(enc))
            values += enc
        key = (expr.op, expr.index, arg_ranks, tuple(shape_key))
        f = self.function(key, len(args), [v.sort() for v in values])
        return f(*values, *args)

    def _add(self, a: z3.ExprRef, b: z3.ExprRef, rank: int) -> z3.ExprRef:
        return self.function(("add", 0, (rank, rank), ()), 2, [])(a, b)

    def function(self, key: tuple, n_tensors: int, param_sorts: list) -> z3.FuncDeclRef:
        if key not in self.functions:
            op, index, arg_ranks, shape = key
            name = op + "_r" + "".join(map(str, arg_ranks))
            name += "".join(f"_{k}" for k in shape if k != 1)
            name += f"#{index}" if index else ""
            self.functions[key] = z3.Function(name, *param_sorts, *([TENSOR] * n_tensors), TENSOR)
        return self.functions[key]

    def _param(self, p, v, tensors, symbols) -> list[z3.ExprRef]:
        if p.type in _TUPLE_TYPES:
            if v is None:
                return [z3.IntVal(-1)]
            return [self._int(x, tensors, symbols) for x in v]
        if p.type in _INT_TYPES:
            return [z3.IntVal(-1) if v is None else self._int(v, tensors, symbols)]
        if p.type is ParamType.FLOAT:
            return [symbols[v.name] if isinstance(v, Sym) else z3.RealVal(repr(float(v)))]
        if p.type is ParamType.BOOL:
            return [z3.IntVal(int(v))]
        if p.type is ParamType.STR:
            return [z3.IntVal(p.choices.index(v) if p.choices else hash(v))]
        if p.type is ParamType.DTYPE:
            return [z3.IntVal(list(DType).index(DType.of(v)))]
        raise ValueError(f"no Z3 encoding for parameter type {p.type!r}")

    def _int(self, v, tensors, symbols) -> z3.ArithRef:
        if isinstance(v, bool):
            return z3.IntVal(int(v))
        if isinstance(v, int):
            return z3.IntVal(v)
        if isinstance(v, Sym):
            return symbols[v.name]
        if isinstance(v, SizeOf):
            return SIZE(tensors[v.tensor], self._int(v.dim, tensors, symbols))
        if isinstance(v, Prod):
            out = z3.IntVal(1)
            for f in v.factors:
                out = out * self._int(f, tensors, symbols)
            return out
        if isinstance(v, Sum):
            out = z3.IntVal(0)
            for t in v.terms:
                out = out + self._int(t, tensors, symbols)
            return out
        if isinstance(v, Quot):
            # Exact where the term is well-formed, which is all a rule speaks about.
            return self._int(v.num, tensors, symbols) / self._int(v.den, tensors, symbols)
        raise ValueError(f"no Z3 encoding for integer parameter {v!r}")


def logical_ranks(
    exprs: Sequence[Expr],
    sizes: Mapping[str, tuple[int, ...]],
    symbols: Mapping[str, int | float],
    dtypes: Mapping[str, DType] | None = None,
) -> dict[Expr, int]:
    """The rank of every sub-expression, from the specs' own logical shape inference at the
    given sizes, element types (default f32; :meth:`Rule.input_dtypes`) and symbol values
    (parallel operators keep the shape). Raises PCGError or RuleError where the terms are not
    well-formed there."""
    dtypes = dtypes or {}
    inst = Instance(
        {k: ParallelTensorShape.of(v, dtypes.get(k, DType.F32)) for k, v in sizes.items()},
        dict(symbols),
    )
    shapes: dict[Expr, tuple[ParallelTensorShape, ...]] = {}
    ranks: dict[Expr, int] = {}

    def go(e: Expr) -> ParallelTensorShape:
        if isinstance(e, Var):
            s = inst.shapes[e.name]
        else:
            key = Term(e.op, e.args, e.params, 0)
            if key not in shapes:
                args = tuple(go(a) for a in e.args)
                spec = OPERATORS[e.op]
                if isinstance(spec, ParallelOp | StackPartial):
                    shapes[key] = (args[0],) * spec.num_outputs(e.params)
                else:
                    params = concrete_params(e, inst, args)
                    shapes[key] = spec.infer_logical(params, args)
            s = shapes[key][e.index]
        ranks[e] = s.rank
        return s

    for e in exprs:
        go(e)
    return ranks


def rule_ranks(
    rule: Rule,
    exprs: Sequence[Expr] | None = None,
    *,
    sizes: Mapping[str, tuple[int, ...]] | None = None,
    symbols: Mapping[str, int | float] | None = None,
) -> dict[Expr, int]:
    """:func:`logical_ranks` of ``exprs`` (default: both sides of ``rule``) at the rule's example
    sizes (or ``sizes``), its example symbol values (:meth:`Rule.example_symbols`, updated with
    ``symbols``) and its inputs' element types."""
    return logical_ranks(
        (*rule.lhs, *rule.rhs) if exprs is None else exprs,
        rule.example_sizes() if sizes is None else sizes,
        {**rule.example_symbols(), **(symbols or {})},
        rule.input_dtypes(),
    )
