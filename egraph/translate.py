"""Verified rules as guarded egglog rewrites.

A rule holds wherever both of its sides are well-formed (:class:`pcgopt.rewrite.Rule`). In the
e-graph every tensor e-class is well-formed, so a match of one side is a well-formed instance of
it; the rewrite may add the other side only where that side is well-formed too. The guard says
so: from the matched tensors' facts (sizes, degrees, copies, partial sums), the parallel shape of
every node of the new side is derived symbolically, as egglog expressions, from the operator
specs themselves, with the conditions under which the spec's shape inference accepts it:

* compute operators from their :class:`~pcgopt.ops.spec.Signature`, mirroring
  :func:`~pcgopt.ops.spec.infer_parallel` (axes split alike, unsplittable dimensions whole,
  partial sums only into linear inputs, copies where an axis does not index an input);
* parallelization operators from their primitive steps (a degree divides what it splits,
  combines, reduces or discards);
* StackPartial: inputs of one parallel shape.

Declarations of the rule's tensor variables (rank, lettered sizes that agree, sizes of at least
2, fixed sizes, dtype), the device budget (no new tensor spans more devices than the machine has)
and the machine's legal degrees (for degrees the new side chooses) are guards as well. The action
builds the new side, sets its facts and unions the outputs.

Each rule is used in both directions where the other side binds every tensor variable and
the matched side every symbol, as a parameter of its own or as the factors of a matched
degree ``k*j``: then ``k`` is chosen among the legal degrees and ``j`` is the rest, where it
divides and is legal (``partition(x, degree=6)`` splits into 3 then 2, and 2 then 3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pcgopt.divisors import divisors
from pcgopt.egraph.language import Language, encode_param, string_literal
from pcgopt.errors import PCGError
from pcgopt.ops import OpKind, Params, get_op
from pcgopt.ops.parallel import ParallelOp, StackPartial
from pcgopt.ops.params import ParamType
from pcgopt.ops.spec import AxisKind, ComputeOp, SizeRelation
from pcgopt.rewrite import (
    SYMBOLIC,
    Expr,
    Instance,
    Prod,
    Quot,
    Rule,
    RuleError,
    SizeOf,
    Sum,
    Sym,
    Term,
    Var,
    concrete_params,
    int_symbols,
    size_expr,
    symbols_of,
    tensor_vars,
    walk,
)
from pcgopt.shapes import ParallelTensorShape


class Untranslatable(Exception):
    """A rule (in one direction) that has no egglog form; the reason says why."""


class NeverApplies(Untranslatable):
    """The guard is false for every match (found while deriving it)."""


# --------------------------------------------------------------------------------------------
# symbolic integers: egglog expressions with light constant folding
# --------------------------------------------------------------------------------------------


def _const(a: str) -> int | None:
    return int(a) if a.lstrip("-").isdigit() else None


def mul(a: str, b: str) -> str:
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return str(ca * cb)
    if ca == 1:
        return b
    if cb == 1:
        return a
    return f"(* {a} {b})"


def div(a: str, b: str) -> str:
    ca, cb = _const(a), _const(b)
    if cb == 1:
        return a
    if ca is not None and cb is not None and ca % cb == 0:
        return str(ca // cb)
    return f"(/ {a} {b})"


def product(xs: Sequence[str]) -> str:
    out = "1"
    for x in xs:
        out = mul(out, x)
    return out


@dataclass
class Guard:
    """Conditions (egglog facts) collected while deriving shapes."""

    facts: list[str] = field(default_factory=list)
    uses_budget: bool = False

    def add(self, fact: str) -> None:
        if fact not in self.facts:
            self.facts.append(fact)

    def equal(self, a: str, b: str) -> None:
        if a == b:
            return
        ca, cb = _const(a), _const(b)
        if ca is not None and cb is not None:
            raise NeverApplies(f"{a} != {b}")
        self.add(f"(= {a} {b})")

    def not_equal(self, a: str, b: str) -> None:
        ca, cb = _const(a), _const(b)
        if a == b or (ca is not None and ca == cb):
            raise NeverApplies(f"{a} == {b}")
        if ca is None or cb is None:
            self.add(f"(!= {a} {b})")

    def divides(self, d: str, n: str) -> None:
        """``d`` divides ``n``."""
        cd, cn = _const(d), _const(n)
        if cd == 1:
            return
        if cd is not None and cn is not None:
            if cn % cd:
                raise NeverApplies(f"{d} does not divide {n}")
            return
        self.add(f"(= 0 (% {n} {d}))")

    def within_budget(self, ndev: str) -> None:
        """At most the device budget (``B``, bound by the ``device_budget`` relation)."""
        if _const(ndev) == 1:
            return
        self.uses_budget = True
        self.add(f"(<= {ndev} B)")

    def at_least(self, a: str, bound: int) -> None:
        ca = _const(a)
        if ca is not None:
            if ca < bound:
                raise NeverApplies(f"{a} < {bound}")
            return
        self.add(f"(>= {a} {bound})")


@dataclass
class SymShape:
    """A parallel tensor shape whose numbers are egglog expressions."""

    sizes: list[str]
    degs: list[str]
    copies: str
    psum: str
    dtype: str

    @property
    def ndev(self) -> str:
        return product([*self.degs, self.copies, self.psum])

    def facts(self) -> dict[str, str]:
        def vec(xs: list[str]) -> str:
            return "(vec-of " + " ".join(xs) + ")" if xs else "(vec-empty)"

        return {
            "sizes": vec(self.sizes),
            "degs": vec(self.degs),
            "copies": self.copies,
            "psum": self.psum,
            "dtype": string_literal(self.dtype),
            "ndev": self.ndev,
        }


# --------------------------------------------------------------------------------------------
# symbolic shape inference, derived from the operator specs
# --------------------------------------------------------------------------------------------


def _infer_compute(
    spec: ComputeOp,
    params: Params,
    ins: list[SymShape],
    logical_in: tuple[ParallelTensorShape, ...],
    logical_out: tuple[ParallelTensorShape, ...],
    size_of: Callable[[int, int], str],
    g: Guard,
) -> list[SymShape]:
    """The outputs' symbolic shapes from the operator's signature. An output dimension that
    belongs to an axis has the size of that axis's input dimension (whatever the ranks), unless
    the axis has a size of its own (a reshape's run); those and the dimensions outside every
    axis ask ``size_of(output, dim)``. An operator whose structure depends on sizes adds its
    :meth:`~pcgopt.ops.spec.ComputeOp.signature_conditions` as guards."""
    in_sizes = tuple(s.sizes for s in logical_in)
    out_sizes = tuple(s.sizes for s in logical_out)
    conditions = spec.signature_conditions(params, in_sizes, out_sizes)
    if conditions is None:
        raise Untranslatable(f"{spec.name}'s parallel structure depends on its sizes")
    sig = spec.signature(params, in_sizes, out_sizes)
    degrees: dict[str, str] = {}
    covered: list[set[int]] = [set() for _ in ins]
    for ax in sig.axes:
        if ax.size is not None and not conditions:
            raise Untranslatable(f"{spec.name}'s {ax.name!r} axis has a size of its own")
        degree: str | None = None
        for i, dim in enumerate(ax.inputs):
            if dim is None:
                continue
            covered[i].add(dim)
            d = ins[i].degs[dim]
            if degree is None:
                degree = d
            else:
                g.equal(d, degree)
        degrees[ax.name] = degree or "1"
    for i, s in enumerate(ins):
        for dim, d in enumerate(s.degs):
            if dim not in covered[i]:
                g.equal(d, "1")
    linear = set(sig.linear_in)
    for i, s in enumerate(ins):
        if i not in linear:
            g.equal(s.psum, "1")
    if sig.joint:
        for s in ins[1:]:
            g.equal(s.psum, ins[0].psum)
        in_partial = ins[0].psum if ins else "1"
    else:
        in_partial = product([ins[i].psum for i in sorted(linear)])
    out_sum = mul(
        in_partial, product([degrees[a.name] for a in sig.axes if a.kind is AxisKind.REDUCE])
    )
    copies: str | None = None
    for i, s in enumerate(ins):
        need = [degrees[a.name] for a in sig.axes if a.inputs[i] is None]
        if not sig.joint:
            need += [ins[j].psum for j in sorted(linear) if j != i]
        n = product(need)
        g.divides(n, s.copies)
        extra = div(s.copies, n)
        if copies is None:
            copies = extra
        else:
            g.equal(extra, copies)
    outs = []
    for o, out in enumerate(logical_out):
        degs = ["1"] * out.rank
        sizes: list[str | None] = [None] * out.rank
        for ax in sig.axes:
            if o < len(ax.outputs) and ax.outputs[o] is not None:
                degs[ax.outputs[o]] = degrees[ax.name]
                i = next((i for i, dim in enumerate(ax.inputs) if dim is not None), None)
                if i is not None and ax.size is None:
                    sizes[ax.outputs[o]] = ins[i].sizes[ax.inputs[i]]
        filled = [size if size is not None else size_of(o, d) for d, size in enumerate(sizes)]
        for ax in sig.axes:
            # An axis with a size of its own (a reshape's run: heads of a hidden dimension)
            # has the gcd of its dimensions' sizes: its degree divides the output's as well.
            if ax.size is not None and o < len(ax.outputs) and ax.outputs[o] is not None:
                g.divides(degrees[ax.name], filled[ax.outputs[o]])
        outs.append(SymShape(filled, degs, copies or "1", out_sum, out.dtype.value))
    size_conditions(conditions, [s.sizes for s in ins], [s.sizes for s in outs], g)
    return outs


def _infer_steps(spec: ParallelOp, params: Params, s: SymShape, g: Guard) -> SymShape:
    sizes, degs, copies, psum = s.sizes, list(s.degs), s.copies, s.psum
    for kind, dim, k in spec.steps(params):
        if kind == "partition":
            degs[dim] = mul(degs[dim], k)
            g.divides(degs[dim], sizes[dim])
        elif kind == "combine":
            g.divides(k, degs[dim])
            degs[dim] = div(degs[dim], k)
        elif kind == "replicate":
            copies = mul(copies, k)
        elif kind == "discard":
            g.divides(k, copies)
            copies = div(copies, k)
        elif kind == "to_partial":
            g.divides(k, copies)
            copies, psum = div(copies, k), mul(psum, k)
        elif kind == "reduce":
            g.divides(k, psum)
            psum = div(psum, k)
        else:  # pragma: no cover - a new primitive must be taught here
            raise Untranslatable(f"no symbolic form of the {kind!r} step")
    return SymShape(sizes, degs, copies, psum, s.dtype)


def _infer_stack_partial(ins: list[SymShape], g: Guard) -> SymShape:
    first = ins[0]
    for s in ins[1:]:
        if len(s.degs) != len(first.degs) or s.dtype != first.dtype:
            raise NeverApplies("stack_partial of different ranks or dtypes")
        for a, b in zip(s.sizes + s.degs, first.sizes + first.degs, strict=True):
            g.equal(a, b)
        g.equal(s.copies, first.copies)
        g.equal(s.psum, first.psum)
    return SymShape(
        first.sizes, first.degs, first.copies, mul(first.psum, str(len(ins))), first.dtype
    )


# --------------------------------------------------------------------------------------------
# rules
# --------------------------------------------------------------------------------------------


def _egg_int(v: Any, sizes: Mapping[str, str]) -> str:
    """An integer parameter expression as egglog text."""
    if isinstance(v, bool):
        raise Untranslatable(f"boolean where an integer is expected: {v!r}")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, Sym):
        return f"k_{v.name}"
    if isinstance(v, SizeOf):
        if not isinstance(v.dim, int):
            raise Untranslatable(f"size along a symbolic dimension: {v!r}")
        return f"(vec-get {sizes[v.tensor]} {v.dim})"
    if isinstance(v, Prod):
        return product([_egg_int(f, sizes) for f in v.factors])
    if isinstance(v, Sum):
        parts = [_egg_int(t, sizes) for t in v.terms]
        out = parts[0]
        for p in parts[1:]:
            out = f"(+ {out} {p})"
        return out
    if isinstance(v, Quot):
        # Exact wherever the term is well-formed; a new side's guards check that it is.
        return div(_egg_int(v.num, sizes), _egg_int(v.den, sizes))
    raise Untranslatable(f"unsupported parameter value {v!r}")


def _is_symbolic(v: Any) -> bool:
    if isinstance(v, tuple):
        return any(_is_symbolic(x) for x in v)
    return isinstance(v, SYMBOLIC)


def size_conditions(
    conditions: Sequence[SizeRelation],
    in_sizes: Sequence[Sequence[str]],
    out_sizes: Sequence[Sequence[str]],
    g: Guard,
) -> None:
    """Guards that an operator's sizes satisfy ``conditions`` (see
    :meth:`~pcgopt.ops.spec.ComputeOp.signature_conditions`), sizes as egglog expressions."""

    def prod(refs) -> str:
        return product([(in_sizes if s == "in" else out_sizes)[t][d] for s, t, d in refs])

    for c in conditions:
        a = prod(c.left)
        if c.kind == "ge2":
            g.at_least(a, 2)
        elif c.kind == "is1":
            g.equal(a, "1")
        elif c.kind == "eq":
            g.equal(a, prod(c.right))
        else:
            g.not_equal(a, prod(c.right))


def _shape_symbols(exprs: tuple[Expr, ...]) -> set[str]:
    """Symbols in the parameters of compute operators (a reshape's ``parts``)."""
    return {
        name
        for e in exprs
        for t in walk(e)
        if isinstance(t, Term) and isinstance(get_op(t.op), ComputeOp)
        for v in t.params.values()
        for name in int_symbols(v)
    }


def _full_params(term: Term) -> dict[str, Any]:
    spec = get_op(term.op)
    out = {}
    for p in spec.params:
        if p.name in term.params:
            out[p.name] = term.params[p.name]
        else:
            if p.required:
                raise Untranslatable(f"{term.op} needs parameter {p.name!r}")
            out[p.name] = p.default
    return out


@dataclass(frozen=True, slots=True)
class TranslatedRule:
    """One direction of a rule as egglog text."""

    name: str
    rule: str
    direction: str
    kind: str
    text: str


class _Builder:
    def __init__(
        self,
        lang: Language,
        rule: Rule,
        pattern: tuple[Expr, ...],
        result: tuple[Expr, ...],
    ) -> None:
        self.lang, self.rule, self.pattern, self.result = lang, rule, pattern, result
        self.query: list[str] = []
        self.guard = Guard()
        self.pattern_vars = set(tensor_vars(pattern))
        self.sizes = {x: f"s_{x}" for x in self.pattern_vars}
        self.fresh = 0
        self.matched_symbols: set[str] = set()
        #: Pattern parameter entries to check equal to their expressions: (entry, value).
        self.checks: list[tuple[str, Any]] = []
        # Example sizes fix ranks and each compute operator's signature structure, which for
        # operators whose signature does not depend on sizes holds at every size.
        letters = rule.letter_sizes()
        symbols = rule.example_symbols()
        shapes = {
            x: ParallelTensorShape.of(d.sizes(letters), d.dtype) for x, d in rule.inputs.items()
        }
        self.inst = Instance(shapes, symbols)
        self._logical: dict[Expr, tuple[ParallelTensorShape, ...]] = {}

    # -- the example's logical shapes ------------------------------------------------------------

    def logical(self, e: Expr) -> tuple[ParallelTensorShape, ...]:
        if isinstance(e, Var):
            return (self.inst.shapes[e.name],)
        if e not in self._logical:
            args = tuple(self.logical(a)[a.index if isinstance(a, Term) else 0] for a in e.args)
            spec = get_op(e.op)
            try:
                params = concrete_params(e, self.inst, args)
                if isinstance(spec, ComputeOp):
                    outs = spec.infer_logical(params, args)
                else:
                    outs = (ParallelTensorShape.of(args[0].sizes, args[0].dtype),)
            except (PCGError, RuleError) as err:
                raise Untranslatable(f"{e!r} is ill-formed at the example: {err}") from None
            self._logical[e] = outs
        return self._logical[e]

    def var(self) -> str:
        self.fresh += 1
        return f"q{self.fresh}"

    # -- pattern ---------------------------------------------------------------------------------

    def param_pattern(self, term: Term, ptype: ParamType, value: Any) -> str:
        where = f"{term.op}"
        if isinstance(value, tuple):
            if not _is_symbolic(value):
                bound = self.var()
                self.query.append(f"(= {bound} {encode_param(ptype, value, where)})")
                return bound
            # Symbols are bound from the vector's entries (a reshape's ``parts``); the other
            # entries are checked once everything they mention is bound.
            bound = self.var()
            self.query.append(f"(= {len(value)} (vec-length {bound}))")
            for i, v in enumerate(value):
                item = f"(vec-get {bound} {i})"
                if isinstance(v, Sym) and v.name not in self.matched_symbols:
                    self.matched_symbols.add(v.name)
                    self.query.append(f"(= k_{v.name} {item})")
                else:
                    self.checks.append((item, v))
            return bound
        if isinstance(value, Sym):
            if value.name not in self.matched_symbols:
                self.matched_symbols.add(value.name)
                return f"k_{value.name}"
            # A later occurrence gets its own variable, checked equal once bound: a shared one
            # lets egglog's join pair every two operators with that degree (all Reduces of
            # degree 2) before the rest of the pattern narrows them.
            bound = self.var()
            self.guard.add(f"(= 0 (- {bound} k_{value.name}))")
            return bound
        if _is_symbolic(value):
            bound = self.var()
            if self._factor_degrees(bound, value):
                return bound
            self.guard.equal(bound, _egg_int(value, self.sizes))
            return bound
        return encode_param(ptype, value, where)

    def _factor_degrees(self, bound: str, value: Any) -> bool:
        """A matched degree ``k*j`` whose factors no earlier match bound: each factor but the
        last is chosen among the machine's legal degrees, and the last is what remains of the
        matched degree, if it divides and is legal too (``partition(x, degree=6)`` becomes
        ``partition(partition(x, degree=3), degree=2)`` and ``... degree=2), degree=3)``).
        False when ``value`` is not such a product."""
        if not isinstance(value, Prod) or not all(isinstance(f, Sym) for f in value.factors):
            return False
        names = [f.name for f in value.factors]
        free = [n for n in names if n not in self.matched_symbols]
        if not free or len(set(names)) != len(names):
            return False
        *chosen, last = free
        for name in chosen:
            self.matched_symbols.add(name)
            self.query.append(f"(legal k_{name})")
        rest = product([f"k_{n}" for n in names if n != last])
        self.guard.divides(rest, bound)
        self.matched_symbols.add(last)
        self.query.append(f"(= k_{last} (/ {bound} {rest}))")
        self.query.append(f"(legal k_{last})")
        return True

    def pattern_expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return f"v_{e.name}"
        spec = get_op(e.op)
        if spec.kind is OpKind.SOURCE:
            raise Untranslatable("sources cannot be matched")
        c = self.lang.constructor(e.op, len(e.args))
        params = _full_params(e)
        parts = [c.name, *(self.pattern_expr(a) for a in e.args)]
        parts += [self.param_pattern(e, p.type, params[p.name]) for p in spec.params]
        call = "(" + " ".join(parts) + ")"
        return f"(out {call} {e.index})" if c.returns == "TT" else call

    def pattern_structure(self) -> None:
        """Guards that the matched side's operators whose parallel structure depends on sizes
        have the structure they have at the example (the new side's are guarded as derived)."""
        terms = dict.fromkeys(t for p in self.pattern for t in walk(p) if isinstance(t, Term))
        for e in terms:  # in order of appearance: the rule text is the same in every run
            spec = get_op(e.op)
            if not (isinstance(spec, ComputeOp) and spec.size_dependent_signature):
                continue
            logical_in = tuple(
                self.logical(a)[a.index if isinstance(a, Term) else 0] for a in e.args
            )
            params = concrete_params(e, self.inst, logical_in)
            out_logical = self.logical(e)
            conditions = spec.signature_conditions(
                params, tuple(s.sizes for s in logical_in), tuple(s.sizes for s in out_logical)
            )
            if conditions is None:
                raise Untranslatable(f"{e.op}'s parallel structure depends on its sizes")
            try:
                ins = [
                    [_egg_int(size_expr(a, d), self.sizes) for d in range(s.rank)]
                    for a, s in zip(e.args, logical_in, strict=True)
                ]
                outs = [
                    [
                        _egg_int(size_expr(Term(e.op, e.args, e.params, o), d), self.sizes)
                        for d in range(s.rank)
                    ]
                    for o, s in enumerate(out_logical)
                ]
            except (RuleError, KeyError) as err:
                raise Untranslatable(f"no symbolic sizes around {e.op}: {err}") from None
            size_conditions(conditions, ins, outs, self.guard)

    # -- new side ----------------------------------------------------------------------------------

    def var_shape(self, x: str) -> SymShape:
        decl = self.rule.inputs[x]
        return SymShape(
            [f"(vec-get s_{x} {i})" for i in range(decl.rank)],
            [f"(vec-get d_{x} {i})" for i in range(decl.rank)],
            f"c_{x}",
            f"p_{x}",
            decl.dtype.value,
        )

    def build(self) -> str:
        roots = []
        for j, e in enumerate(self.pattern):
            root = f"r{j}"
            roots.append(root)
            if isinstance(e, Var):
                self.query.append(f"(= {root} v_{e.name})")
            else:
                self.query.append(f"(= {root} {self.pattern_expr(e)})")
        # facts of the bound tensors, and their declarations
        letters: dict[str, str] = {}
        for x in sorted(self.pattern_vars):
            decl = self.rule.inputs[x]
            self.query += [
                f"(= s_{x} (sizes v_{x}))",
                f"(= d_{x} (degs v_{x}))",
                f"(= c_{x} (copies v_{x}))",
                f"(= p_{x} (psum v_{x}))",
                f"(= {string_literal(decl.dtype.value)} (dtype v_{x}))",
                f"(= {decl.rank} (vec-length s_{x}))",
            ]
            for i, dim in enumerate(decl.dims):
                size = f"(vec-get s_{x} {i})"
                if isinstance(dim, int):
                    self.guard.equal(size, str(dim))
                elif dim in letters:
                    self.guard.equal(size, letters[dim])
                else:
                    letters[dim] = size
                    self.guard.at_least(size, 2)
        for item, v in self.checks:
            self.guard.equal(item, _egg_int(v, self.sizes))
        self.pattern_structure()
        bound_symbols = symbols_of(self.pattern)
        unbound = sorted(bound_symbols - self.matched_symbols)
        if unbound:
            # e.g. ``replicate(x, degree=k*k)``: a match gives the product, and no factor of
            # it can be chosen (a product of distinct symbols can: _factor_degrees).
            raise Untranslatable(
                f"the matched side fixes {', '.join(map(repr, unbound))} only through "
                f"arithmetic on parameters, so a match does not bind it"
            )
        shape_symbols = _shape_symbols(self.result)
        chosen = sorted(symbols_of(self.result) - bound_symbols)
        for s in chosen:
            if s in shape_symbols:
                # Only degrees are chosen (among the machine's legal ones); a shape is not.
                raise Untranslatable(f"the new side chooses {s!r}, a parameter of a shape")
            self.query.append(f"(legal k_{s})")
        if len(chosen) > 1:
            # A split two ways at once spans the product of its degrees: a legal one too.
            self.query.append(f"(legal (* {' '.join(f'k_{s}' for s in chosen)}))")
        # A degree the new side computes from matched ones (``replicate(x, degree=k*j)``)
        # must be one the machine allows too: 3*3 on 48 devices is not a divisor.
        for term in {t for e in self.result for t in walk(e) if isinstance(t, Term)}:
            degree = term.params.get("degree")
            if isinstance(get_op(term.op), ParallelOp) and isinstance(degree, Prod):
                self.query.append(f"(legal {_egg_int(degree, self.sizes)})")

        # the new side: shapes, guards, construction
        shapes: dict[Expr, list[SymShape]] = {}
        lets: list[str] = []
        names: dict[Expr, str] = {}

        def shape_of(e: Expr) -> SymShape:
            if isinstance(e, Var):
                return self.var_shape(e.name)
            return derive(e)[e.index]

        def ref(e: Expr) -> str:
            if isinstance(e, Var):
                return f"v_{e.name}"
            derive(e)
            key = Term(e.op, e.args, e.params, 0)
            base = names[key]
            c = self.lang.constructor(e.op, len(e.args))
            return f"(out {base} {e.index})" if c.returns == "TT" else base

        def derive(e: Term) -> list[SymShape]:
            key = Term(e.op, e.args, e.params, 0)
            if key in shapes:
                return shapes[key]
            spec = get_op(e.op)
            ins = [shape_of(a) for a in e.args]
            arg_refs = [ref(a) for a in e.args]
            params = _full_params(e)
            if isinstance(spec, ComputeOp):
                logical_in = tuple(
                    self.logical(a)[a.index if isinstance(a, Term) else 0] for a in e.args
                )
                concrete = concrete_params(e, self.inst, logical_in)
                logical_out = self.logical(e)

                def size_of(o: int, d: int, e: Term = e) -> str:
                    try:
                        return _egg_int(size_expr(Term(e.op, e.args, e.params, o), d), self.sizes)
                    except RuleError as err:
                        raise Untranslatable(str(err)) from None

                outs = _infer_compute(
                    spec, concrete, ins, logical_in, logical_out, size_of, self.guard
                )
            elif isinstance(spec, ParallelOp):
                sym_params = Params(
                    {k: _egg_int(v, self.sizes) if k == "degree" else v for k, v in params.items()}
                )
                outs = [_infer_steps(spec, sym_params, ins[0], self.guard)]
            elif isinstance(spec, StackPartial):
                outs = [_infer_stack_partial(ins, self.guard)]
            else:
                raise Untranslatable(f"no symbolic shape inference for {e.op}")
            for s in outs:
                self.guard.within_budget(s.ndev)
            c = self.lang.constructor(e.op, len(e.args))
            call_parts = [c.name, *arg_refs]
            for p in spec.params:
                v = params[p.name]
                if isinstance(v, tuple) and _is_symbolic(v):
                    call_parts.append(
                        "(vec-of " + " ".join(_egg_int(x, self.sizes) for x in v) + ")"
                    )
                elif _is_symbolic(v):
                    call_parts.append(_egg_int(v, self.sizes))
                else:
                    call_parts.append(encode_param(p.type, v, e.op))
            name = f"n{len(names)}"
            names[key] = name
            lets.append(f"(let {name} ({' '.join(call_parts)}))")
            for o, s in enumerate(outs):
                target = f"(out {name} {o})" if c.returns == "TT" else name
                lets.extend(
                    f"(set ({table} {target}) {value})" for table, value in s.facts().items()
                )
            shapes[key] = outs
            return outs

        unions = []
        for j, e in enumerate(self.result):
            unions.append(f"(union r{j} {ref(e)})")
        query = self.query
        if self.guard.uses_budget:
            query = [*query, "(device_budget B)"]
        query += self.guard.facts
        return f"(rule ({' '.join(query)})\n      ({' '.join(lets + unions)}))"


def rule_kind(rule: Rule) -> str:
    """The ruleset of a rule: ``cleanup`` when both sides are parallelization operators only
    (fusing or cancelling communication), ``parallel`` when any side has one, else
    ``algebraic``."""
    kinds = {
        get_op(t.op).kind
        for side in (rule.lhs, rule.rhs)
        for e in side
        for t in walk(e)
        if isinstance(t, Term)
    }
    if kinds == {OpKind.PARALLEL}:
        return "cleanup"
    return "parallel" if OpKind.PARALLEL in kinds else "algebraic"


RULESETS = ("algebraic", "parallel", "cleanup")


def translate_rule(lang: Language, rule: Rule) -> Iterator[TranslatedRule | tuple[str, str, str]]:
    """Both directions of ``rule``: a :class:`TranslatedRule` for each direction that has an
    egglog form, else ``(rule name, direction, reason)``."""
    kind = rule_kind(rule)
    for direction, pattern, result in (("fwd", rule.lhs, rule.rhs), ("bwd", rule.rhs, rule.lhs)):
        if not set(tensor_vars(result)) <= set(tensor_vars(pattern)):
            yield (rule.name, direction, "the other side does not bind every tensor variable")
            continue
        name = f"{rule.name}:{direction}"
        try:
            body = _Builder(lang, rule, pattern, result).build()
        except Untranslatable as e:
            yield (rule.name, direction, str(e))
            continue
        text = body[:-1] + f"\n      :ruleset {kind} :name {string_literal(name)})"
        yield TranslatedRule(name, rule.name, direction, kind, text)


def legal_degrees(num_devices: int, degrees: Sequence[int] | None = None) -> list[int]:
    """Degrees a rewrite may choose: by default the divisors of the device count above 1;
    else ``degrees``, checked to be such divisors (:class:`ValueError` naming the first that
    is not, and the valid ones)."""
    valid = list(divisors(num_devices)[1:])
    if degrees is None:
        return valid
    chosen = list(degrees)
    for d in chosen:
        if isinstance(d, bool) or not isinstance(d, int) or d not in valid:
            raise ValueError(
                f"degrees: {d!r} is not a degree of a machine of {num_devices} devices; "
                f"valid: the divisors above 1, {valid}"
            )
    if not chosen:
        raise ValueError(f"degrees must name at least one of {valid}")
    return sorted(set(chosen))


__all__ = [
    "RULESETS",
    "NeverApplies",
    "TranslatedRule",
    "Untranslatable",
    "legal_degrees",
    "rule_kind",
    "translate_rule",
]
