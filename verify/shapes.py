"""A symbolic model of parallel shapes in Z3, derived from the operator specs.

Every tensor of a rule gets integer terms for its per-dimension degrees, its copies and its
partial sums; every operator adds the constraints under which it is well-formed and defines its
outputs. The constraints come from the specs themselves: a compute operator's
:class:`~pcgopt.ops.Signature` (read at the rule's example sizes, which fix which dimensions
each loop axis indexes) and a parallel operator's primitive steps. Nothing about an individual
operator is written here. An operator whose structure depends on more than that (a reshape's
runs) is modelled where it states the size relations that keep its structure
(:meth:`~pcgopt.ops.spec.ComputeOp.signature_conditions`): the proof holds where they do, and
the e-graph applies a rule only there; its axis sizes are the example's, so they enter only with
``sizes=True``.

Micro-batch counts (Pipeline and Batch) are modelled only in rules that use those operators
(:func:`uses_micro_batches`); elsewhere every count is the constant 1, so the other rules'
obligations are what they were. Like degrees, they follow the loop axes: a parallel axis
carries its inputs' count to its outputs, a reduce axis takes none.

Sizes are left out by default: a rule is proved for every choice of degrees without assuming
they divide the sizes, which is stronger than needed (fewer assumptions), and a counterexample
that needs an impossible size is re-checked concretely by the caller. With ``sizes=True`` the
model adds "degree divides size" at the example sizes, which is what generating concrete
instances needs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import z3

from pcgopt.ops import OPERATORS, AxisKind, ComputeOp, ParallelOp, get_op
from pcgopt.ops.parallel import MICRO_BATCH_OPS, StackPartial
from pcgopt.ops.params import ParamType
from pcgopt.rewrite import (
    Expr,
    Instance,
    IntExpr,
    Prod,
    RuleError,
    SizeOf,
    Sym,
    Term,
    Var,
    operators_of,
    resolve,
)
from pcgopt.shapes import DType, ParallelTensorShape


class Unsupported(Exception):
    """The rule uses something the symbolic model cannot express (e.g. a symbolic axis)."""


@dataclass(frozen=True)
class SymShape:
    """Integer terms for one parallel tensor (its sizes are concrete: the example's)."""

    sizes: tuple[int, ...]
    degrees: tuple[z3.ArithRef, ...]
    copies: z3.ArithRef
    partial: z3.ArithRef
    dtype: DType = DType.F32
    #: Micro-batches per block of every dimension; empty: none (every count 1).
    micro: tuple[z3.ArithRef, ...] = ()

    @property
    def micro_counts(self) -> tuple[z3.ArithRef, ...]:
        return self.micro or (z3.IntVal(1),) * len(self.sizes)

    def fields(self) -> tuple[z3.ArithRef, ...]:
        """The shape's variables (constant micro-batch counts left out)."""
        return (*self.degrees, self.copies, self.partial, *self.micro)

    def equal(self, other: SymShape) -> z3.BoolRef:
        if self.sizes != other.sizes:
            return z3.BoolVal(False)
        mine = (*self.degrees, self.copies, self.partial, *self.micro_counts)
        theirs = (*other.degrees, other.copies, other.partial, *other.micro_counts)
        return z3.And([a == b for a, b in zip(mine, theirs, strict=True)])

    def concrete(self, model: z3.ModelRef) -> ParallelTensorShape:
        ev = lambda t: model.eval(t, model_completion=True).as_long()  # noqa: E731
        return ParallelTensorShape.of(
            self.sizes,
            self.dtype,
            degrees=[ev(d) for d in self.degrees],
            copy_degree=ev(self.copies),
            sum_degree=ev(self.partial),
            micro=[ev(m) for m in self.micro_counts],
        )


@dataclass
class Model:
    """The symbolic model of a rule: its variables, the constraints, and each side's outputs."""

    inputs: dict[str, SymShape]
    symbols: dict[str, z3.ArithRef]
    positive: list[z3.BoolRef] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)

    def fresh(self, prefix: str) -> z3.ArithRef:
        v = z3.Int(f"{prefix}!{next(self.counter)}")
        self.positive.append(v >= 1)
        return v

    def int_expr(self, value: IntExpr, sizes: Mapping[str, tuple[int, ...]]) -> z3.ArithRef:
        if isinstance(value, bool) or value is None:
            raise Unsupported(f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return z3.IntVal(value)
        if isinstance(value, Sym):
            return self.symbols[value.name]
        if isinstance(value, SizeOf):
            # A degree that is a size would tie the proof to the example's sizes.
            raise Unsupported(f"a degree given as a size ({value!r})")
        if isinstance(value, Prod):
            return math.prod((self.int_expr(f, sizes) for f in value.factors), start=z3.IntVal(1))
        raise Unsupported(f"unsupported integer parameter {value!r}")


def uses_micro_batches(exprs: Sequence[Expr]) -> bool:
    """Whether these terms cut or gather micro-batches (Pipeline, Batch)."""
    return bool(operators_of(exprs) & MICRO_BATCH_OPS)


def new_model(
    inputs: Mapping[str, tuple[int, ...]],
    symbols: Sequence[str],
    dtypes: Mapping[str, DType] | None = None,
    *,
    micro: bool = False,
) -> Model:
    """Fresh variables for the rule's tensor variables (given their example sizes) and its
    degree symbols, which are at least 2 (a degree of 1 makes a parallel operator the
    identity, and a rule that only holds then is no parallelization rule). With ``micro``,
    every dimension's micro-batch count is a variable too; without, it is 1."""
    m = Model({}, {})
    for name, sizes in inputs.items():
        degs = tuple(m.fresh(f"{name}.degree{d}") for d in range(len(sizes)))
        m.inputs[name] = SymShape(
            tuple(sizes),
            degs,
            m.fresh(f"{name}.copies"),
            m.fresh(f"{name}.partial"),
            (dtypes or {}).get(name, DType.F32),
            tuple(m.fresh(f"{name}.micro{d}") for d in range(len(sizes))) if micro else (),
        )
    for s in symbols:
        m.symbols[s] = m.fresh(s)
        m.positive.append(m.symbols[s] >= 2)
    return m


def _divides(m: Model, k: z3.ArithRef, n: z3.ArithRef, what: str, out: list) -> z3.ArithRef:
    """Adds ``n == k * q`` and returns ``q`` (the quotient)."""
    q = m.fresh(what)
    out.append(n == k * q)
    return q


def side(
    m: Model,
    exprs: Sequence[Expr],
    example_symbols: Mapping[str, int],
    *,
    sizes: bool = False,
) -> tuple[tuple[SymShape, ...], list[z3.BoolRef]]:
    """The outputs of one side of a rule and the constraints under which it is well-formed."""
    valid: list[z3.BoolRef] = []
    memo: dict[Expr, tuple[SymShape, ...]] = {}
    input_sizes = {k: v.sizes for k, v in m.inputs.items()}
    if sizes:
        for x in m.inputs.values():
            _blocks_divide(m, x, valid)
    example = Instance(
        {k: ParallelTensorShape.of(v.sizes, v.dtype) for k, v in m.inputs.items()},
        dict(example_symbols),
    )

    def shapes(e: Expr) -> tuple[SymShape, ...]:
        if isinstance(e, Var):
            return (m.inputs[e.name],)
        if e in memo:
            return memo[e]
        args = tuple(shapes(a)[a.index if isinstance(a, Term) else 0] for a in e.args)
        spec = get_op(e.op)
        if isinstance(spec, ComputeOp):
            outs = _compute(m, spec, e, args, example, valid, sizes)
        elif isinstance(spec, ParallelOp):
            outs = _parallel(m, spec, e, args, input_sizes, valid)
        elif isinstance(spec, StackPartial):
            for a in args[1:]:
                valid.append(args[0].equal(a))
            first = args[0]
            outs = (replace(first, partial=first.partial * len(args)),)
        else:
            raise Unsupported(f"{e.op} cannot appear in a rule")
        if sizes:
            for o in outs:
                _blocks_divide(m, o, valid)
        memo[e] = outs
        return outs

    outs = tuple(shapes(e)[e.index if isinstance(e, Term) else 0] for e in exprs)
    return outs, valid


def _blocks_divide(m: Model, x: SymShape, valid: list) -> None:
    """Every dimension's degree times micro-batch count divides its size."""
    for n, d, k in zip(x.sizes, x.degrees, x.micro_counts, strict=True):
        _divides(m, d * k if x.micro else d, z3.IntVal(n), "block", valid)


def _concrete_params(e: Term, example: Instance, shapes) -> dict:
    try:
        raw = {k: resolve(v, example.symbols, example.sizes()) for k, v in e.params.items()}
    except RuleError as exc:  # a symbol with no example value
        raise Unsupported(str(exc)) from None
    return get_op(e.op).make_params(raw, shapes)


def _compute(
    m: Model, spec: ComputeOp, e: Term, args, example: Instance, valid: list, sizes: bool
) -> tuple[SymShape, ...]:
    structural = {p.name for p in spec.params if p.type is not ParamType.FLOAT}
    for k, v in e.params.items():
        # A number (a scale factor, a dropout rate) never changes the parallel structure; the
        # example's value stands for all.
        if k in structural and isinstance(v, Sym | Prod):
            raise Unsupported(f"{e.op}.{k} is symbolic; the shape model needs it concrete")
    in_shapes = tuple(ParallelTensorShape.of(a.sizes, a.dtype) for a in args)
    params = _concrete_params(e, example, in_shapes)
    logical = spec.infer_logical(params, in_shapes)
    in_sizes, out_sizes = tuple(s.sizes for s in in_shapes), tuple(o.sizes for o in logical)
    conditions = spec.signature_conditions(params, in_sizes, out_sizes)
    if conditions is None:
        raise Unsupported(f"{e.op}'s parallel structure depends on sizes")
    sig = spec.signature(params, in_sizes, out_sizes)

    degree: dict[str, z3.ArithRef] = {}
    covered = [set() for _ in args]
    for ax in sig.axes:
        mapped = [(i, d) for i, d in enumerate(ax.inputs) if d is not None]
        if not mapped:
            degree[ax.name] = z3.IntVal(1)
            continue
        i0, d0 = mapped[0]
        degree[ax.name] = args[i0].degrees[d0]
        for i, d in mapped:
            covered[i].add(d)
            valid.append(args[i].degrees[d] == degree[ax.name])
        # The structure of an operator whose signature depends on sizes holds wherever its
        # conditions do (the e-graph guards them); its axis sizes are the example's, so they
        # constrain degrees only where sizes are modelled.
        if ax.size is not None and (sizes or not conditions):
            _divides(m, degree[ax.name], z3.IntVal(ax.size), f"{e.op}.{ax.name}", valid)
    for i, a in enumerate(args):
        for d, deg in enumerate(a.degrees):
            if d not in covered[i]:
                valid.append(deg == 1)
    micro = _axis_micro(sig, args, covered, valid)

    linear = set(sig.linear_in)
    for i, a in enumerate(args):
        if i not in linear:
            valid.append(a.partial == 1)
    if sig.joint:
        for a in args[1:]:
            valid.append(a.partial == args[0].partial)
        in_partial = args[0].partial if args else z3.IntVal(1)
    else:
        in_partial = math.prod((args[i].partial for i in sorted(linear)), start=z3.IntVal(1))
    reduce_degree = math.prod(
        (degree[ax.name] for ax in sig.axes if ax.kind is AxisKind.REDUCE), start=z3.IntVal(1)
    )
    copies = m.fresh(f"{e.op}.copies")
    for i, a in enumerate(args):
        need = math.prod(
            (degree[ax.name] for ax in sig.axes if ax.inputs[i] is None), start=z3.IntVal(1)
        )
        if not sig.joint:
            need = need * math.prod(
                (args[j].partial for j in sorted(linear) if j != i), start=z3.IntVal(1)
            )
        valid.append(a.copies == need * copies)

    outs = []
    for o, out in enumerate(logical):
        degs = [z3.IntVal(1)] * out.rank
        counts = [z3.IntVal(1)] * out.rank
        for ax in sig.axes:
            if o < len(ax.outputs) and ax.outputs[o] is not None:
                degs[ax.outputs[o]] = degree[ax.name]
                counts[ax.outputs[o]] = micro.get(ax.name, z3.IntVal(1))
        outs.append(
            SymShape(
                out.sizes,
                tuple(degs),
                copies,
                in_partial * reduce_degree,
                out.dtype,
                tuple(counts) if micro else (),
            )
        )
    return tuple(outs)


def _axis_micro(sig, args, covered: list[set[int]], valid: list) -> dict[str, z3.ArithRef]:
    """Each loop axis's micro-batch count (empty when no argument models any), as
    :func:`pcgopt.ops.spec.axis_micro_batches` reads it: the arguments along an axis agree, a
    reduce axis or one that reaches no output takes none, nor does a dimension no axis
    indexes."""
    if not any(a.micro for a in args):
        return {}
    counts: dict[str, z3.ArithRef] = {}
    for ax in sig.axes:
        mapped = [(i, d) for i, d in enumerate(ax.inputs) if d is not None]
        if not mapped:
            continue
        i0, d0 = mapped[0]
        counts[ax.name] = args[i0].micro_counts[d0]
        for i, d in mapped[1:]:
            valid.append(args[i].micro_counts[d] == counts[ax.name])
        if ax.kind is AxisKind.REDUCE or not any(d is not None for d in ax.outputs):
            valid.append(counts[ax.name] == 1)
    for i, a in enumerate(args):
        for d, k in enumerate(a.micro_counts):
            if d not in covered[i]:
                valid.append(k == 1)
    return counts


def _parallel(
    m: Model, spec: ParallelOp, e: Term, args, input_sizes, valid: list
) -> tuple[SymShape, ...]:
    (x,) = args
    raw = dict(e.params)
    int_params = {}
    for k, v in raw.items():
        if k in ("dim", "src_dim", "dst_dim"):
            if not isinstance(v, int):
                raise Unsupported(f"{e.op}.{k} must be a concrete dimension, got {v!r}")
            if not -len(x.sizes) <= v < len(x.sizes):
                valid.append(z3.BoolVal(False))
                return (x,)
            int_params[k] = v % len(x.sizes)
        else:
            int_params[k] = 0  # a placeholder: steps only read dims from the parameters
    degree = m.int_expr(raw[spec.count_param], input_sizes)
    valid.append(degree >= 1)
    if spec.name == "all_to_all" and int_params["src_dim"] == int_params["dst_dim"]:
        valid.append(z3.BoolVal(False))
    degs, copies, partial = list(x.degrees), x.copies, x.partial
    micro = list(x.micro)
    for kind, dim, _ in spec.steps(int_params):
        if kind in ("pipeline", "batch"):
            if not micro:
                raise Unsupported(f"{e.op} in a model without micro-batch counts")
            if kind == "pipeline":
                micro[dim] = micro[dim] * degree
            else:
                micro[dim] = _divides(m, degree, micro[dim], "batch", valid)
        elif kind == "partition":
            degs[dim] = degs[dim] * degree
        elif kind == "combine":
            degs[dim] = _divides(m, degree, degs[dim], "combine", valid)
        elif kind == "replicate":
            copies = copies * degree
        elif kind == "discard":
            copies = _divides(m, degree, copies, "discard", valid)
        elif kind == "to_partial":
            copies = _divides(m, degree, copies, "to_partial", valid)
            partial = partial * degree
        elif kind == "reduce":
            partial = _divides(m, degree, partial, "reduce", valid)
        else:  # a new primitive must be modelled here
            raise Unsupported(f"no symbolic model for the primitive step {kind!r}")
    return (SymShape(x.sizes, tuple(degs), copies, partial, x.dtype, tuple(micro)),)


def parallel_operator_names() -> set[str]:
    return {n for n, s in OPERATORS.items() if isinstance(s, ParallelOp | StackPartial)}
