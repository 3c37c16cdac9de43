"""Concrete instances of rules and axioms, and their evaluation on the reference evaluator.

An instance fixes a parallel shape for every tensor variable and a value for every symbol.
Structural symbols (axes, split sizes, scale factors: anything an operator's signature depends
on) are drawn first; the remaining ones (parallel degrees) and the input distributions come from
Z3 models of "both sides are well-formed" in the symbolic shape model, so that even rules whose
inputs must be replicated or split just so get instances. Each instance is then evaluated with
random values, partial sums split at random, and the two sides compared.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import z3

from pcgopt.errors import PCGError
from pcgopt.evaluate import value_difference
from pcgopt.ops import OPERATORS, ComputeOp
from pcgopt.ops.params import ParamType
from pcgopt.rewrite import (
    Expr,
    Instance,
    IntExpr,
    Prod,
    Quot,
    Rule,
    RuleError,
    SizeOf,
    Sum,
    Sym,
    Term,
    evaluate_side,
    infer_side,
    int_symbols,
    real_symbols,
    resolve,
    walk,
)
from pcgopt.shapes import ParallelTensorShape
from pcgopt.sharded import ShardedArray
from pcgopt.verify import limits
from pcgopt.verify.shapes import Unsupported, new_model, side, uses_micro_batches

Condition = tuple[IntExpr, str, IntExpr]


def holds(c: Condition, symbols: Mapping, sizes: Mapping[str, tuple[int, ...]]) -> bool:
    left, rel, right = c
    a, b = resolve(left, symbols, sizes), resolve(right, symbols, sizes)
    return a == b if rel == "==" else a != b


#: A condition that mentions a size or dimension an assignment does not have is simply false.
_UNRESOLVABLE = (RuleError, IndexError, KeyError)

#: Sizes are the example's letters times this, so that degrees 2, 3, 4 and 6 can divide them.
SCALE = 12
#: Bound on degrees, copies and partial sums in generated instances.
MAX_DEGREE = 4


def structural_symbols(rule: Rule) -> set[str]:
    """Symbols that parameterize compute operators or choose dimensions (not parallel degrees)."""
    out: set[str] = set()
    for e in (*rule.lhs, *rule.rhs):
        for sub in walk(e):
            if not isinstance(sub, Term):
                continue
            spec = OPERATORS[sub.op]
            count = None if isinstance(spec, ComputeOp) else getattr(spec, "count_param", None)
            for k, v in sub.params.items():
                if k != count:
                    out |= set(int_symbols(v))
    return out


def substitute(exprs: tuple[Expr, ...], values: Mapping[str, int | float]) -> tuple[Expr, ...]:
    """The terms with the given symbols replaced by their values (sizes kept symbolic)."""
    memo: dict[Expr, Expr] = {}

    def sub_value(v):
        if isinstance(v, Sym):
            return values.get(v.name, v)
        if isinstance(v, SizeOf):
            return SizeOf(v.tensor, sub_value(v.dim))
        if isinstance(v, tuple):
            return tuple(sub_value(x) for x in v)
        if isinstance(v, Prod):
            return Prod(tuple(sub_value(f) for f in v.factors))
        if isinstance(v, Sum):
            return Sum(tuple(sub_value(t) for t in v.terms))
        if isinstance(v, Quot):
            return Quot(sub_value(v.num), sub_value(v.den))
        return v

    def go(e: Expr) -> Expr:
        if not isinstance(e, Term):
            return e
        if e not in memo:
            params = {k: sub_value(v) for k, v in e.params.items()}
            memo[e] = Term(e.op, tuple(go(a) for a in e.args), params, e.index)
        return memo[e]

    return tuple(go(e) for e in exprs)


def _structural_candidates(
    rule: Rule, symbol: str, sizes: Mapping[str, tuple[int, ...]], rng
) -> list:
    """Values worth trying for a structural symbol, from how it is used."""
    if symbol in real_symbols((*rule.lhs, *rule.rhs)):
        return [0.5, -1.5, 2.0]
    max_rank = max((len(s) for s in sizes.values()), default=1)
    max_size = max((n for s in sizes.values() for n in s), default=1)
    axis_like = False
    for e in (*rule.lhs, *rule.rhs):
        for sub in walk(e):
            if isinstance(sub, Term):
                for p in OPERATORS[sub.op].params:
                    v = sub.params.get(p.name)
                    if p.type in (ParamType.AXIS, ParamType.AXES) and symbol in set(int_symbols(v)):
                        axis_like = True
            for v in getattr(sub, "params", {}).values():
                if isinstance(v, SizeOf) and isinstance(v.dim, Sym) and v.dim.name == symbol:
                    axis_like = True
    if axis_like:
        return list(range(max_rank))
    return list(range(1, max_size + 1))


def structural_assignments(
    rule: Rule,
    sizes: Mapping[str, tuple[int, ...]],
    conditions: Sequence[Condition] = (),
    *,
    limit: int = 12,
    seed: int = 0,
    dimensions: Sequence[str] = (),
) -> list[dict[str, int | float]]:
    """Up to ``limit`` assignments of the structural symbols (and of ``dimensions``, extra
    symbols that name dimensions) that satisfy the conditions and leave both sides logically
    well-formed."""
    rng = random.Random(seed)
    names = sorted(structural_symbols(rule) | set(dimensions))
    if not names:
        return [{}]
    max_rank = max((len(s) for s in sizes.values()), default=1)
    options = {
        n: list(range(max_rank)) if n in dimensions else _structural_candidates(rule, n, sizes, rng)
        for n in names
    }
    total = math.prod(len(v) for v in options.values())
    combos: list[dict] = []
    if total <= 4096:
        combos = [
            dict(zip(names, vals, strict=True)) for vals in itertools.product(*options.values())
        ]
        rng.shuffle(combos)
    else:
        combos = [{n: rng.choice(v) for n, v in options.items()} for _ in range(4096)]
    out = []
    for combo in combos:
        try:
            if not all(holds(c, combo, sizes) for c in conditions):
                continue
        except _UNRESOLVABLE:
            continue
        if _logically_valid(rule, sizes, combo):
            out.append(combo)
            if len(out) >= limit:
                break
    return out


def _logically_valid(rule: Rule, sizes: Mapping[str, tuple[int, ...]], symbols: Mapping) -> bool:
    """Whether both sides are well-formed on these sizes once parallel operators are ignored."""
    from pcgopt.verify.logic import erased_name

    dtypes = rule.input_dtypes()
    inst = Instance(
        {k: ParallelTensorShape.of(v, dtypes[k]) for k, v in sizes.items()}, dict(symbols)
    )
    for exprs in (rule.lhs, rule.rhs):
        try:
            infer_side(_erase(exprs, erased_name), inst)
        except (PCGError, KeyError, TypeError, ValueError, IndexError):
            return False
    return True


def _erase(exprs: tuple[Expr, ...], erased_name) -> tuple[Expr, ...]:
    memo: dict[Expr, Expr] = {}

    def go(e: Expr) -> Expr:
        if not isinstance(e, Term):
            return e
        if e not in memo:
            if erased_name(e.op) is None:
                memo[e] = go(e.args[0])
            elif e.op == "stack_partial":
                out = go(e.args[0])
                for a in e.args[1:]:
                    out = Term("add", (out, go(a)))
                memo[e] = out
            else:
                memo[e] = Term(e.op, tuple(go(a) for a in e.args), e.params, e.index)
        return memo[e]

    return tuple(go(e) for e in exprs)


def instances(
    rule: Rule,
    *,
    conditions: Sequence[Condition] = (),
    count: int = 12,
    seed: int = 0,
    letters: Mapping[str, int] | None = None,
    dimensions: Sequence[str] = (),
    scale: int = SCALE,
) -> list[Instance]:
    """Concrete instances where both sides are well-formed (see the module docstring). Sizes are
    the letters' (default: the rule's example) times ``scale``."""
    letters = {k: v * scale for k, v in (letters or rule.letter_sizes()).items()}
    sizes = rule.example_sizes(letters)
    out: list[Instance] = []
    assignments = structural_assignments(rule, sizes, conditions, seed=seed, dimensions=dimensions)
    if not assignments:
        return out
    per = max(1, -(-count // len(assignments)))
    for k, fixed in enumerate(assignments):
        lhs, rhs = substitute(rule.lhs, fixed), substitute(rule.rhs, fixed)
        degree_syms = sorted(rule.symbols - set(fixed) - set(dimensions))
        for inst in _z3_instances(rule, lhs, rhs, sizes, fixed, degree_syms, per, seed + k):
            out.append(inst)
        if len(out) >= count:
            break
    return out[:count]


def _z3_instances(rule, lhs, rhs, sizes, fixed, degree_syms, count, seed) -> list[Instance]:
    example = {s: 2 for s in degree_syms} | {k: v for k, v in fixed.items()}
    try:
        micro = uses_micro_batches((*lhs, *rhs))
        m = new_model(sizes, degree_syms, rule.input_dtypes(), micro=micro)
        _, l_valid = side(m, lhs, example, sizes=True)
        _, r_valid = side(m, rhs, example, sizes=True)
    except Unsupported:
        return _sampled_instances(rule, lhs, rhs, sizes, fixed, degree_syms, count, seed)
    solver = z3.Solver()
    solver.set("random_seed", seed)
    limits.limit(solver, 5.0)
    solver.add(m.positive + l_valid + r_valid)
    fields = [f for shape in m.inputs.values() for f in shape.fields()] + list(m.symbols.values())
    for f in fields:
        solver.add(f <= MAX_DEGREE)
    rng = random.Random(seed)
    out = []
    for _ in range(count * 3):
        solver.push()
        # Nudge towards variety: ask for a random subset of fields to exceed 1.
        for f in rng.sample(fields, k=min(len(fields), rng.randint(0, 3))):
            solver.add(f > 1)
        if solver.check() == z3.sat:
            model = solver.model()
            solver.pop()
        else:
            # The nudge over-constrained; without it, either there is another model or none.
            solver.pop()
            if solver.check() != z3.sat:
                break
            model = solver.model()
        shapes = {name: m.inputs[name].concrete(model) for name in rule.inputs}
        symbols = dict(fixed)
        symbols.update(
            {s: model.eval(v, model_completion=True).as_long() for s, v in m.symbols.items()}
        )
        inst = Instance(shapes, symbols)
        if inst not in out:
            out.append(inst)
        solver.add(z3.Or([f != model.eval(f, model_completion=True) for f in fields]))
        if len(out) >= count:
            break
    return out


def _sampled_instances(rule, lhs, rhs, sizes, fixed, degree_syms, count, seed) -> list[Instance]:
    """Random search, for rules the symbolic model cannot express (e.g. symbolic degrees of
    layout-dependent operators)."""
    rng = random.Random(seed)
    out = []
    for _ in range(2000):
        shapes = {}
        for name, decl in rule.inputs.items():
            s = sizes[name]
            degs = [rng.choice([d for d in (1, 2, 4) if n % d == 0]) for n in s]
            shapes[name] = ParallelTensorShape.of(
                s,
                decl.dtype,
                degrees=degs,
                copy_degree=rng.choice([1, 1, 2, 4]),
                sum_degree=rng.choice([1, 1, 2]),
            )
        symbols = dict(fixed) | {sym: rng.choice([2, 4]) for sym in degree_syms}
        inst = Instance(shapes, symbols)
        try:
            infer_side(lhs, inst)
            infer_side(rhs, inst)
        except PCGError:
            continue
        if inst not in out:
            out.append(inst)
        if len(out) >= count:
            break
    return out


# --------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    """Where the two sides of an instance differ."""

    instance: Instance
    output: int
    reason: str

    def __str__(self) -> str:
        return f"at {self.instance}: output {self.output}: {self.reason}"


def random_values(rule: Rule, inst: Instance, rng: np.random.Generator) -> dict[str, ShardedArray]:
    out = {}
    for name, shape in inst.shapes.items():
        if shape.dtype.is_integer:
            value = rng.integers(0, 4, size=shape.sizes)
        else:
            value = rng.standard_normal(shape.sizes)
        out[name] = ShardedArray.from_logical(value, shape, rng)
    return out


def compare(
    rule: Rule, inst: Instance, *, mode: str = "parallel", seed: int = 0, rtol: float = 1e-9
) -> Mismatch | None:
    """Evaluates both sides at ``inst`` on random values; ``mode`` "parallel" also requires
    equal output parallel shapes, "logical" compares values only."""
    rng = np.random.default_rng(seed)
    values = random_values(rule, inst, rng)
    left = evaluate_side(rule.lhs, inst, values)
    right = evaluate_side(rule.rhs, inst, values)
    for k, (a, b) in enumerate(zip(left, right, strict=True)):
        if mode == "parallel" and a.shape != b.shape:
            return Mismatch(
                inst, k, f"parallel shapes differ: {a.shape} on the left, {b.shape} on the right"
            )
        va, vb = a.logical(), b.logical()
        if va.shape != vb.shape:
            return Mismatch(inst, k, f"sizes differ: {va.shape} vs {vb.shape}")
        gap = value_difference(va, vb, rtol)
        if gap is not None:
            return Mismatch(inst, k, f"values differ by up to {float(gap.max()):.3g}")
    return None
