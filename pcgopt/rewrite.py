"""Rewrite rules as data: two term patterns over tensor variables and integer symbols.

A term is an operator applied to terms and tensor variables, written like a call::

    relu(partition(x, dim=0, degree=k))
    split(concat(x, y, axis=1), axis=1, sizes=(size(x, 1), size(y, 1)))[0]

Positional arguments are tensors (terms or tensor variables); keyword arguments are the
operator's parameters, whose integer values may be symbols (``k``), products (``k*m``) or the
size of a tensor variable along a dimension (``size(x, 1)``). ``[i]`` picks output ``i`` of a
multi-output operator. Equal subterms are one value, so a term pattern is a DAG.

A :class:`Rule` says that its left terms equal its right terms, output by output, wherever both
sides are well-formed: same parallel shapes and same values (``pcgopt.equivalent``'s default).
Its tensor variables are declared with lettered dimensions, as in an einsum: ``"[m, k]"`` and
``"[k, n]"`` are matrices whose ``k`` sizes agree. A letter stands for any size of at least 2;
a number fixes a size (``"[1, n]"`` broadcasts along its first dimension); a dtype may lead
(``"i64[b, l]"``). A rule applies only to tensors that fit its declarations.

>>> r = Rule.parse("relu_partition", "relu(partition(x, dim=0, degree=k))",
...                "partition(relu(x), dim=0, degree=k)", {"x": "[m, n]"})
>>> r.inputs
{'x': f32[m, n]}
>>> r.rhs
(partition(relu(x), dim=0, degree=k),)
>>> sorted(r.symbols)
['k']
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pcgopt.errors import PCGError, SchemaError
from pcgopt.ops import OPERATORS, OpKind, Params, get_op
from pcgopt.ops.elementwise import BinaryElementwise, UnaryElementwise
from pcgopt.ops.params import ParamType
from pcgopt.shapes import DType, ParallelTensorShape
from pcgopt.sharded import ShardedArray


class RuleError(SchemaError):
    """A rule or term is malformed (syntax, unknown operator or variable, bad parameter)."""


# --------------------------------------------------------------------------------------------
# integer parameter expressions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sym:
    """An integer symbol, e.g. a parallel degree ``k`` the rule holds for every value of."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class SizeOf:
    """``size(x, dim)``: the logical size of tensor variable ``x`` along ``dim`` (an integer or
    a symbol)."""

    tensor: str
    dim: int | Sym

    def __repr__(self) -> str:
        return f"size({self.tensor}, {self.dim})"


@dataclass(frozen=True, slots=True)
class Prod:
    """A product of integer expressions, ``k*m``."""

    factors: tuple[IntExpr, ...]

    def __repr__(self) -> str:
        return "*".join(map(repr, self.factors))


@dataclass(frozen=True, slots=True)
class Sum:
    """A sum of integer expressions, ``s + t``."""

    terms: tuple[IntExpr, ...]

    def __repr__(self) -> str:
        return " + ".join(f"({t!r})" if isinstance(t, Sum) else repr(t) for t in self.terms)


@dataclass(frozen=True, slots=True)
class Quot:
    """An exact quotient ``n/d``: a reshape that splits a dimension into ``parts`` pieces keeps
    ``size(x, 2)/parts`` in each. Where ``d`` does not divide ``n`` the term is ill-formed."""

    num: IntExpr
    den: IntExpr

    def __repr__(self) -> str:
        # Parenthesized, so that it reads back as one factor inside a product.
        return f"({self.num!r}/{self.den!r})"


IntExpr = int | Sym | SizeOf | Prod | Sum | Quot
#: The integer expression types that are not plain integers.
SYMBOLIC = (Sym, SizeOf, Prod, Sum, Quot)


def int_symbols(value: Any) -> Iterator[str]:
    """The symbols a parameter value mentions."""
    if isinstance(value, Sym):
        yield value.name
    elif isinstance(value, SizeOf):
        yield from int_symbols(value.dim)
    elif isinstance(value, Prod | Sum):
        for f in value.factors if isinstance(value, Prod) else value.terms:
            yield from int_symbols(f)
    elif isinstance(value, Quot):
        yield from int_symbols(value.num)
        yield from int_symbols(value.den)
    elif isinstance(value, tuple):
        for v in value:
            yield from int_symbols(v)


def resolve(value: Any, symbols: Mapping[str, int], sizes: Mapping[str, tuple[int, ...]]) -> Any:
    """A parameter value with its symbols and sizes replaced by integers."""
    if isinstance(value, Sym):
        try:
            return symbols[value.name]
        except KeyError:
            raise RuleError(f"no value for symbol {value.name!r}") from None
    if isinstance(value, SizeOf):
        try:
            return sizes[value.tensor][resolve(value.dim, symbols, sizes)]
        except (KeyError, IndexError):
            raise RuleError(f"no size for {value!r}") from None
    if isinstance(value, Prod):
        return math.prod(resolve(f, symbols, sizes) for f in value.factors)
    if isinstance(value, Sum):
        return sum(resolve(t, symbols, sizes) for t in value.terms)
    if isinstance(value, Quot):
        num, den = resolve(value.num, symbols, sizes), resolve(value.den, symbols, sizes)
        if den <= 0 or num % den:
            raise RuleError(f"{value!r} is not a whole number ({num}/{den})")
        return num // den
    if isinstance(value, tuple):
        return tuple(resolve(v, symbols, sizes) for v in value)
    return value


# --------------------------------------------------------------------------------------------
# terms
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Var:
    """A tensor variable of a rule."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Term:
    """Operator ``op`` applied to ``args`` with ``params``; ``index`` picks one of its outputs."""

    op: str
    args: tuple[Expr, ...] = ()
    params: Params = field(default_factory=Params)
    index: int = 0
    # Terms are hashed over and over as dictionary keys (evaluation caches, rewriting); the
    # hash of a deep term is computed once.
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.params, Params):
            object.__setattr__(self, "params", Params(dict(self.params)))
        object.__setattr__(self, "_hash", hash((self.op, self.args, self.params, self.index)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # Rebuilt, not restored, so that the cached hash is this process's (see Params).
        return (Term, (self.op, self.args, self.params, self.index))

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args]
        parts += [f"{k}={_format_value(v)}" for k, v in self.params.items()]
        text = f"{self.op}({', '.join(parts)})"
        if self.index or OPERATORS[self.op].num_outputs(self.params) > 1:
            text += f"[{self.index}]"
        return text


Expr = Term | Var


def _format_value(v: Any) -> str:
    if isinstance(v, DType):
        return repr(v.value)
    if isinstance(v, tuple):
        inner = ", ".join(_format_value(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    return repr(v)


def walk(expr: Expr) -> Iterator[Expr]:
    """Every sub-expression, children before parents, each once."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, done = stack.pop()
        if id(e) in seen:
            continue
        if done or isinstance(e, Var):
            seen.add(id(e))
            yield e
            continue
        stack.append((e, True))
        for a in reversed(e.args):
            stack.append((a, False))


def tensor_vars(exprs: tuple[Expr, ...]) -> list[str]:
    """Tensor variables in order of first appearance."""
    out: list[str] = []
    for e in exprs:
        for sub in walk(e):
            if isinstance(sub, Var) and sub.name not in out:
                out.append(sub.name)
    return out


def rename_vars(expr: Expr, mapping: Mapping[str, str]) -> Expr:
    """The expression with tensor variables renamed (also where parameters name their sizes);
    names not in ``mapping`` stay."""
    memo: dict[Expr, Expr] = {}

    def value(v: Any) -> Any:
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        if isinstance(v, SizeOf):
            return SizeOf(mapping.get(v.tensor, v.tensor), v.dim)
        if isinstance(v, Sum):
            return Sum(tuple(value(x) for x in v.terms))
        if isinstance(v, Prod):
            return Prod(tuple(value(x) for x in v.factors))
        return v

    def go(e: Expr) -> Expr:
        if isinstance(e, Var):
            return Var(mapping.get(e.name, e.name))
        if e not in memo:
            params = {k: value(v) for k, v in e.params.items()}
            memo[e] = Term(e.op, tuple(go(a) for a in e.args), params, e.index)
        return memo[e]

    return go(expr)


def operators_of(exprs: Iterable[Expr]) -> set[str]:
    """The operators the expressions apply."""
    return {sub.op for e in exprs for sub in walk(e) if isinstance(sub, Term)}


def symbols_of(exprs: tuple[Expr, ...]) -> set[str]:
    out: set[str] = set()
    for e in exprs:
        for sub in walk(e):
            if isinstance(sub, Term):
                for v in sub.params.values():
                    out.update(int_symbols(v))
    return out


def real_symbols(exprs: tuple[Expr, ...]) -> set[str]:
    """Symbols that stand for real numbers (used as floating-point parameters)."""
    out: set[str] = set()
    for e in exprs:
        for sub in walk(e):
            if isinstance(sub, Term):
                for p in get_op(sub.op).params:
                    v = sub.params.get(p.name)
                    if p.type is ParamType.FLOAT and isinstance(v, Sym):
                        out.add(v.name)
    return out


def parse_int_expr(text: str) -> IntExpr:
    """An integer expression on its own: ``s + t``, ``size(x, 1)``, ``k*m``."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise RuleError(f"cannot parse integer expression {text!r}: {e.msg}") from None
    return _value(tree, text)


def parse_expr(text: str) -> tuple[Expr, ...]:
    """Parses one term, or a parenthesized tuple of terms (several outputs). A multi-output
    operator written without ``[i]`` at the top stands for all its outputs."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise RuleError(f"cannot parse term {text!r}: {e.msg}") from None
    nodes = tree.elts if isinstance(tree, ast.Tuple) else [tree]
    out: list[Expr] = []
    for node in nodes:
        e = _expr(node, text)
        n = OPERATORS[e.op].num_outputs(e.params) if isinstance(e, Term) else 1
        if isinstance(node, ast.Call) and n > 1:
            out += [Term(e.op, e.args, e.params, i) for i in range(n)]
        else:
            out.append(e)
    return tuple(out)


def _expr(node: ast.AST, text: str) -> Expr:
    if isinstance(node, ast.Name):
        return Var(node.id)
    if isinstance(node, ast.Subscript):
        inner = _expr(node.value, text)
        index = node.slice
        if not isinstance(inner, Term) or not (
            isinstance(index, ast.Constant) and isinstance(index.value, int)
        ):
            raise RuleError(f"in {text!r}: [i] must follow an operator and hold an integer")
        return Term(inner.op, inner.args, inner.params, index.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        op = node.func.id
        if op not in OPERATORS:
            raise RuleError(f"in {text!r}: unknown operator {op!r}")
        args = tuple(_expr(a, text) for a in node.args)
        params = {kw.arg: _value(kw.value, text) for kw in node.keywords if kw.arg}
        return Term(op, args, params)
    raise RuleError(
        f"in {text!r}: expected an operator call or a tensor variable, got {ast.unparse(node)!r}"
    )


def _value(node: ast.AST, text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
    ):
        return -node.operand.value
    if isinstance(node, ast.Name):
        return Sym(node.id)
    if isinstance(node, ast.Tuple):
        return tuple(_value(e, text) for e in node.elts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        left, right = _value(node.left, text), _value(node.right, text)
        factors = []
        for f in (left, right):
            factors.extend(f.factors if isinstance(f, Prod) else (f,))
        return Prod(tuple(factors))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return Quot(_value(node.left, text), _value(node.right, text))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, text), _value(node.right, text)
        terms = []
        for t in (left, right):
            terms.extend(t.terms if isinstance(t, Sum) else (t,))
        return Sum(tuple(terms))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "size"
        and len(node.args) == 2
        and isinstance(node.args[0], ast.Name)
        and isinstance(node.args[1], ast.Constant | ast.Name)
    ):
        dim = node.args[1]
        return SizeOf(node.args[0].id, dim.value if isinstance(dim, ast.Constant) else Sym(dim.id))
    raise RuleError(f"in {text!r}: unsupported parameter value {ast.unparse(node)!r}")


def format_exprs(exprs: tuple[Expr, ...]) -> str:
    """The text :func:`parse_expr` reads back. All outputs of one operator, in order, print as
    the bare call."""
    first = exprs[0]
    if (
        isinstance(first, Term)
        and len(exprs) == OPERATORS[first.op].num_outputs(first.params) > 1
        and all(
            isinstance(e, Term)
            and (e.op, e.args, e.params, e.index) == (first.op, first.args, first.params, i)
            for i, e in enumerate(exprs)
        )
    ):
        return repr(first).rsplit("[", 1)[0]
    if len(exprs) == 1:
        return repr(exprs[0])
    return "(" + ", ".join(map(repr, exprs)) + ")"


# --------------------------------------------------------------------------------------------
# tensor declarations
# --------------------------------------------------------------------------------------------

_DECL_RE = re.compile(r"\s*([a-z0-9]*)\[([^\]]*)\]\s*")


@dataclass(frozen=True, slots=True)
class TensorDecl:
    """A tensor variable's dtype and dimensions: letters (sizes to choose) or fixed sizes."""

    dims: tuple[str | int, ...]
    dtype: DType = DType.F32

    @classmethod
    def parse(cls, text: str | TensorDecl) -> TensorDecl:
        if isinstance(text, TensorDecl):
            return text
        m = _DECL_RE.fullmatch(text) if isinstance(text, str) else None
        if not m:
            raise RuleError(f"cannot read tensor declaration {text!r}; expected e.g. '[m, k]'")
        dims: list[str | int] = []
        for part in (p.strip() for p in m.group(2).split(",") if p.strip()):
            if part.isdigit() and int(part) > 0:
                dims.append(int(part))
            elif part.isidentifier():
                dims.append(part)
            else:
                raise RuleError(f"in {text!r}: dimension {part!r} is neither a letter nor a size")
        return cls(tuple(dims), DType.of(m.group(1) or "f32"))

    @property
    def rank(self) -> int:
        return len(self.dims)

    def sizes(self, letters: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else letters[d] for d in self.dims)

    def __repr__(self) -> str:
        return f"{self.dtype.value}[{', '.join(map(str, self.dims))}]"


def default_letter_sizes(decls: Mapping[str, TensorDecl]) -> dict[str, int]:
    """Distinct sizes 2, 3, 5, 7, ... for the letters, so that no two agree by accident and
    none is a broadcastable 1."""
    primes = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    letters: list[str] = []
    for decl in decls.values():
        letters += [d for d in decl.dims if isinstance(d, str) and d not in letters]
    return {letter: primes[i % len(primes)] for i, letter in enumerate(letters)}


# --------------------------------------------------------------------------------------------
# rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """``lhs`` equals ``rhs`` (output by output) wherever both sides are well-formed.

    Symbols only the right side mentions are free choices (a rule that introduces parallelism
    picks its degree); parallel degrees are at least 2 (degree 1 is the identity).
    ``inputs`` declares each tensor variable (see the module docstring); ``example`` optionally
    gives sizes for the dimension letters at which the rule is meaningful (default: distinct
    primes, see :func:`default_letter_sizes`).
    """

    name: str
    lhs: tuple[Expr, ...]
    rhs: tuple[Expr, ...]
    inputs: Mapping[str, TensorDecl]
    example: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "inputs", {k: TensorDecl.parse(v) for k, v in dict(self.inputs).items()}
        )
        if self.example is not None:
            object.__setattr__(self, "example", dict(self.example))
        if len(self.lhs) != len(self.rhs) or not self.lhs:
            raise RuleError(
                f"rule {self.name!r}: {len(self.lhs)} left output(s) but {len(self.rhs)} right"
            )
        used = set(tensor_vars(self.lhs)) | set(tensor_vars(self.rhs))
        missing = sorted(used - set(self.inputs))
        if missing:
            raise RuleError(f"rule {self.name!r}: tensor variable(s) {missing} are not declared")
        unbound = sorted(set(tensor_vars(self.rhs)) - set(tensor_vars(self.lhs)))
        if unbound:
            raise RuleError(
                f"rule {self.name!r}: right side uses {unbound}, which the left side does not bind"
            )
        for side in (self.lhs, self.rhs):
            for e in side:
                for sub in walk(e):
                    if isinstance(sub, Term):
                        _check_term(sub, self.name)

    @classmethod
    def parse(
        cls,
        name: str,
        lhs: str,
        rhs: str,
        inputs: Mapping[str, str | TensorDecl],
        example: Mapping[str, int] | None = None,
    ) -> Rule:
        return cls(name, parse_expr(lhs), parse_expr(rhs), inputs, example)

    @property
    def symbols(self) -> set[str]:
        return symbols_of(self.lhs) | symbols_of(self.rhs)

    def letter_sizes(self) -> dict[str, int]:
        """Sizes for the dimension letters: the example's, else distinct defaults."""
        sizes = default_letter_sizes(self.inputs)
        sizes.update(self.example or {})
        return sizes

    def example_symbols(self) -> dict[str, int | float]:
        """A value for each symbol at which the rule's operators accept their parameters: 2
        for an integer (a degree), 0.5 for a real number (a scale factor; a dropout rate must
        lie in [0, 1))."""
        reals = real_symbols((*self.lhs, *self.rhs))
        return {s: 0.5 if s in reals else 2 for s in sorted(self.symbols)}

    def example_sizes(self, letters: Mapping[str, int] | None = None) -> dict[str, tuple[int, ...]]:
        letters = self.letter_sizes() if letters is None else letters
        return {k: d.sizes(letters) for k, d in self.inputs.items()}

    def input_dtypes(self) -> dict[str, DType]:
        """The element type of each tensor variable (an embedding's indices are integers)."""
        return {k: d.dtype for k, d in self.inputs.items()}

    def __repr__(self) -> str:
        inputs = {k: repr(v) for k, v in self.inputs.items()}
        return (
            f"Rule({self.name!r}, {format_exprs(self.lhs)!r}, {format_exprs(self.rhs)!r}, "
            f"{inputs!r})"
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "lhs": format_exprs(self.lhs),
            "rhs": format_exprs(self.rhs),
            "inputs": {k: repr(v) for k, v in self.inputs.items()},
        }
        if self.example is not None:
            out["example"] = dict(self.example)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rule:
        try:
            return cls.parse(
                data["name"], data["lhs"], data["rhs"], data["inputs"], data.get("example")
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise RuleError(f"malformed rule record {dict(data)!r}: {e}") from None


def _check_term(term: Term, rule: str) -> None:
    spec = get_op(term.op)
    if spec.kind is OpKind.SOURCE:
        raise RuleError(f"rule {rule!r}: {term.op} cannot appear in a rule (use a tensor variable)")
    try:
        spec.check_arity(len(term.args))
    except PCGError as e:
        raise RuleError(f"rule {rule!r}: {e.message}") from None
    known = {p.name for p in spec.params}
    unknown = sorted(set(term.params) - known)
    if unknown:
        raise RuleError(f"rule {rule!r}: {term.op} has no parameter(s) {unknown}")
    for p in spec.params:
        v = term.params.get(p.name)
        if p.type in (ParamType.BOOL, ParamType.STR, ParamType.DTYPE) and isinstance(v, SYMBOLIC):
            raise RuleError(f"rule {rule!r}: {term.op}.{p.name} must be a constant, got {v!r}")


# --------------------------------------------------------------------------------------------
# concrete instances: shapes and values of a side
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Instance:
    """Concrete values for a rule's variables: a parallel shape per tensor variable and an
    integer per symbol."""

    shapes: Mapping[str, ParallelTensorShape]
    symbols: Mapping[str, int]

    def sizes(self) -> dict[str, tuple[int, ...]]:
        return {k: s.sizes for k, s in self.shapes.items()}

    def __repr__(self) -> str:
        parts = [f"{k}: {v}" for k, v in self.shapes.items()]
        parts += [f"{k} = {v}" for k, v in self.symbols.items()]
        return "{" + ", ".join(parts) + "}"


def concrete_params(
    term: Term, inst: Instance, arg_shapes: tuple[ParallelTensorShape, ...]
) -> Params:
    raw = {k: resolve(v, inst.symbols, inst.sizes()) for k, v in term.params.items()}
    return get_op(term.op).make_params(raw, arg_shapes)


def infer_side(exprs: tuple[Expr, ...], inst: Instance) -> tuple[ParallelTensorShape, ...]:
    """Output shapes of one side at an instance; raises PCGError where it is ill-formed."""
    memo: dict[Expr, tuple[ParallelTensorShape, ...]] = {}

    def shape(e: Expr) -> ParallelTensorShape:
        if isinstance(e, Var):
            return inst.shapes[e.name]
        if e not in memo:
            args = tuple(shape(a) for a in e.args)
            spec = get_op(e.op)
            memo[e] = spec.infer(concrete_params(e, inst, args), args)
        outs = memo[e]
        if e.index >= len(outs):
            raise RuleError(f"{e.op} has {len(outs)} output(s), [{e.index}] asked")
        return outs[e.index]

    return tuple(shape(e) for e in exprs)


def evaluate_side(
    exprs: tuple[Expr, ...], inst: Instance, values: Mapping[str, ShardedArray]
) -> tuple[ShardedArray, ...]:
    """Outputs of one side on sharded input values (shapes from ``inst``)."""
    memo: dict[Expr, tuple[ShardedArray, ...]] = {}

    def value(e: Expr) -> ShardedArray:
        if isinstance(e, Var):
            return values[e.name]
        if e not in memo:
            args = tuple(value(a) for a in e.args)
            spec = get_op(e.op)
            arg_shapes = tuple(a.shape for a in args)
            params = concrete_params(e, inst, arg_shapes)
            memo[e] = spec.evaluate(params, args, spec.infer(params, arg_shapes))
        return memo[e][e.index]

    return tuple(value(e) for e in exprs)


# --------------------------------------------------------------------------------------------
# symbolic sizes of terms
# --------------------------------------------------------------------------------------------

#: Operators whose output has the shape of their first input.
_SAME_SHAPE = {
    *(
        name
        for name, spec in OPERATORS.items()
        if isinstance(spec, UnaryElementwise | BinaryElementwise)
    ),
    "softmax",
    "layer_norm",
    "partition",
    "combine",
    "replicate",
    "reduce",
    "discard_copies",
    "to_partial",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "stack_partial",
}


def size_expr(expr: Expr, dim: int) -> IntExpr:
    """The size of ``expr`` along ``dim`` in terms of its tensor variables' sizes, for the
    operators rules are written with (elementwise, matrix products, layout, parallel).
    ``matmul`` and ``linear`` are taken at rank 2 (the rank of a variable is not known here);
    the e-graph derives compute operators' sizes from their signatures instead, and the one
    other use, lifting split sizes, is checked by verifying the lifted rule."""
    if isinstance(expr, Var):
        return SizeOf(expr.name, dim)
    if expr.op in _SAME_SHAPE:
        return size_expr(expr.args[0], dim)
    if expr.op == "transpose":
        return size_expr(expr.args[0], expr.params["perm"][dim])
    if expr.op in ("matmul", "linear"):
        if dim == 1:
            return size_expr(expr.args[1], 1)
        return size_expr(expr.args[0], dim)
    if expr.op == "concat":
        if dim == expr.params["axis"]:
            return Sum(tuple(size_expr(a, dim) for a in expr.args))
        return size_expr(expr.args[0], dim)
    if expr.op == "split":
        if dim == expr.params["axis"]:
            return expr.params["sizes"][expr.index]
        return size_expr(expr.args[0], dim)
    if expr.op == "reshape":
        return expr.params["shape"][dim]
    raise RuleError(f"no symbolic size for {expr.op}")


# --------------------------------------------------------------------------------------------
# rule files
# --------------------------------------------------------------------------------------------

RULES_FORMAT = "pcgopt.rules"
RULES_VERSION = 1


def dump_rules(rules: Sequence[Rule], extra: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """A rule file: JSON, one rule per line (diff-friendly). ``extra`` adds fields per rule name
    (e.g. the verifier's verdict)."""
    extra = extra or {}
    lines = [json.dumps({**r.to_dict(), **extra.get(r.name, {})}, sort_keys=False) for r in rules]
    body = ",\n  ".join(lines)
    return f'{{"format": "{RULES_FORMAT}", "version": {RULES_VERSION}, "rules": [\n  {body}\n]}}\n'


def load_rules(text: str) -> list[tuple[Rule, dict[str, Any]]]:
    """Reads a rule file: each rule with the record's other fields (verdict, provenance)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise RuleError(f"not valid JSON: {e}") from None
    if not isinstance(data, Mapping) or data.get("format") != RULES_FORMAT:
        raise RuleError(f"not a pcgopt rule file: 'format' is not {RULES_FORMAT!r}")
    if not isinstance(data.get("version"), int) or data["version"] > RULES_VERSION:
        raise RuleError(
            f"rule file version {data.get('version')!r}; this pcgopt reads up to {RULES_VERSION}"
        )
    out = []
    for i, rec in enumerate(data.get("rules", [])):
        if not isinstance(rec, Mapping):
            raise RuleError(f"rules[{i}] is not an object")
        rule = Rule.from_dict(rec)
        known = {"name", "lhs", "rhs", "inputs", "example"}
        out.append((rule, {k: v for k, v in rec.items() if k not in known}))
    return out
