"""The axioms: what the verifier may assume about the operators, as data.

Each axiom is an equation between two terms of the rule language (:mod:`pcgopt.rewrite`) with a
name and a one-line reason, declared over tensor variables with lettered dimensions. The
declarations are part of the statement: the prover asserts an axiom only for tensors of the
declared ranks whose sizes agree where the letters agree (each letter a size of at least 2, each
number exactly that size), which is precisely what the validator checks it on. There are no
symbolic axes: an axiom about concatenation along axis 0 of matrices is a different axiom from
the one along axis 1, or of 3-D tensors.

Axioms are statements about *values* (the logical tensors): the erasure axioms say what a
parallel operator does to the value (nothing; StackPartial sums). Every axiom is checked against
the reference evaluator on random instances by the test suite; one that fails there is a bug.

Families that apply to many operators are generated from the operator registry (every
elementwise activation commutes with concatenation, every activation fused into ``linear`` is
the activation applied afterwards, ...), so a new operator of such a kind gets them for free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from pcgopt.ops import OPERATORS, ParallelOp
from pcgopt.ops.elementwise import BinaryElementwise, UnaryElementwise
from pcgopt.ops.linalg import ACTIVATIONS
from pcgopt.rewrite import IntExpr, Rule, parse_int_expr

#: A condition: (left, relation, right) with relation "==" or "!=".
Condition = tuple[IntExpr, str, IntExpr]

#: Ranks the layout and elementwise families are stated for.
RANKS = (1, 2, 3)


def parse_conditions(name: str, conditions: tuple[str, ...]) -> tuple[Condition, ...]:
    out = []
    for c in conditions:
        for rel in ("==", "!="):
            left, sep, right = c.partition(rel)
            if sep:
                out.append((parse_int_expr(left), rel, parse_int_expr(right)))
                break
        else:
            raise ValueError(f"axiom {name}: condition {c!r} is neither an == nor a != relation")
    return tuple(out)


@dataclass(frozen=True)
class Axiom:
    """``lhs = rhs`` (as values) for all tensors of the declared shapes and all symbol values
    that make both sides well-formed and the ``conditions`` true."""

    name: str
    why: str
    lhs: str
    rhs: str
    inputs: Mapping[str, str]
    conditions: tuple[str, ...] = ()
    #: Erasure axioms hold for every parallel operator by the evaluator's construction; the
    #: prover applies them by rewriting instead of asserting them.
    erasure: bool = False
    example: Mapping[str, int] = field(default_factory=dict)

    @cached_property
    def rule(self) -> Rule:
        return Rule.parse(self.name, self.lhs, self.rhs, self.inputs, self.example or None)

    @cached_property
    def parsed_conditions(self) -> tuple[Condition, ...]:
        return parse_conditions(self.name, self.conditions)


@dataclass(frozen=True)
class SizeAxiom:
    """``size(term, dim) = value`` for all tensors of the declared shapes (and symbol values)
    that make the term well-formed and the conditions true. The value half of a proof needs these
    where a parameter is a size (``split(..., sizes=(size(x, 0), ...))``)."""

    name: str
    why: str
    term: str
    dim: int
    value: str
    inputs: Mapping[str, str]
    conditions: tuple[str, ...] = ()

    @cached_property
    def rule(self) -> Rule:
        """The term as a (trivial) rule, so that instances can be drawn for it."""
        return Rule.parse(self.name, self.term, self.term, self.inputs)

    @cached_property
    def parsed_value(self) -> IntExpr:
        return parse_int_expr(self.value)

    @cached_property
    def parsed_conditions(self) -> tuple[Condition, ...]:
        return parse_conditions(self.name, self.conditions)


def _decl(letters: str) -> str:
    return "[" + ", ".join(letters) + "]"


def _shapes(rank: int) -> str:
    """Distinct letters for a tensor of this rank: "mnp"[:rank]."""
    return "mnpq"[:rank]


def _with(letters: str, axis: int, letter: str) -> str:
    return letters[:axis] + letter + letters[axis + 1 :]


# --------------------------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------------------------


def _erasures() -> list[Axiom]:
    out = []
    symbol = {"dim": "d", "src_dim": "s", "dst_dim": "t", "degree": "k", "micro_batches": "k"}
    for name, spec in OPERATORS.items():
        if isinstance(spec, ParallelOp):
            params = ", ".join(f"{p.name}={symbol[p.name]}" for p in spec.params)
            out.append(
                Axiom(
                    f"{name}_keeps_value",
                    f"{name} changes how a tensor is distributed, not the tensor",
                    f"{name}(x, {params})",
                    "x",
                    {"x": "[m, n]"},
                    erasure=True,
                )
            )
    out.append(
        Axiom(
            "stack_partial_is_sum",
            "stacked tensors are the partial sums of their sum",
            "stack_partial(x, y)",
            "add(x, y)",
            {"x": "[m, n]", "y": "[m, n]"},
            erasure=True,
        )
    )
    return out


def _unary_ops() -> list[tuple[str, str]]:
    """(name, extra parameters) of the elementwise activations that commute with layout:
    not dropout, whose mask depends on positions."""
    out = []
    for name, spec in OPERATORS.items():
        if isinstance(spec, UnaryElementwise) and name != "dropout":
            # A numeric parameter (scale's factor, pow's exponent) is a symbol of the axiom.
            out.append((name, "".join(f", {p.name}=f" for p in spec.params)))
    return out


def _binary_ops() -> tuple[str, ...]:
    """The broadcasting elementwise operators of two tensors."""
    return tuple(n for n, s in OPERATORS.items() if isinstance(s, BinaryElementwise))


def _layout() -> list[Axiom]:
    """Elementwise operators commute with concat, split and transpose; concat and split undo
    each other; per rank and axis."""
    out = []
    for r in RANKS:
        base = _shapes(r)
        for a in range(r):
            xa, ya = base, _with(base, a, "z")
            d = {"x": _decl(xa), "y": _decl(ya)}
            tag = f"r{r}_axis{a}"
            for name, p in _unary_ops():
                out.append(
                    Axiom(
                        f"{name}_over_concat_{tag}",
                        f"{name} acts on each element, wherever concat puts it",
                        f"{name}(concat(x, y, axis={a}){p})",
                        f"concat({name}(x{p}), {name}(y{p}), axis={a})",
                        d,
                    )
                )
                for i in (0, 1):
                    out.append(
                        Axiom(
                            f"{name}_over_split{i}_{tag}",
                            f"{name} acts on each element, wherever split puts it",
                            f"{name}(split(x, axis={a}, sizes=(s, t))[{i}]{p})",
                            f"split({name}(x{p}), axis={a}, sizes=(s, t))[{i}]",
                            {"x": _decl(xa)},
                            conditions=(f"s + t == size(x, {a})",),
                        )
                    )
            d6 = {f"{v}{k}": _decl(xa if k == 1 else ya) for v in "cxy" for k in (1, 2)}
            out.append(
                Axiom(
                    f"where_over_concat_{tag}",
                    "where picks element by element, so it acts on aligned blocks",
                    f"where(concat(c1, c2, axis={a}), concat(x1, x2, axis={a}), "
                    f"concat(y1, y2, axis={a}))",
                    f"concat(where(c1, x1, y1), where(c2, x2, y2), axis={a})",
                    d6,
                )
            )
            out.append(
                Axiom(
                    f"cast_over_concat_{tag}",
                    "a cast converts each element, wherever concat puts it",
                    f"cast(concat(x, y, axis={a}), dtype='f64')",
                    f"concat(cast(x, dtype='f64'), cast(y, dtype='f64'), axis={a})",
                    d,
                )
            )
            for op in _binary_ops():
                d4 = {"x1": _decl(xa), "x2": _decl(ya), "y1": _decl(xa), "y2": _decl(ya)}
                out.append(
                    Axiom(
                        f"{op}_over_concat_{tag}",
                        f"{op} is elementwise, so it acts on aligned blocks",
                        f"{op}(concat(x1, x2, axis={a}), concat(y1, y2, axis={a}))",
                        f"concat({op}(x1, y1), {op}(x2, y2), axis={a})",
                        d4,
                    )
                )
            for i, part in ((0, "x"), (1, "y")):
                out.append(
                    Axiom(
                        f"split{i}_of_concat_{tag}",
                        "splitting a concatenation where it was joined gives the parts",
                        f"split(concat(x, y, axis={a}), axis={a}, "
                        f"sizes=(size(x, {a}), size(y, {a})))[{i}]",
                        part,
                        d,
                    )
                )
            out.append(
                Axiom(
                    f"concat_of_split_{tag}",
                    "joining the parts of a split gives the tensor",
                    f"concat(split(x, axis={a}, sizes=(s, t))[0], "
                    f"split(x, axis={a}, sizes=(s, t))[1], axis={a})",
                    "x",
                    {"x": _decl(xa)},
                    conditions=(f"s + t == size(x, {a})",),
                )
            )
            out.append(
                Axiom(
                    f"concat_associative_{tag}",
                    "concatenation associates",
                    f"concat(concat(x, y, axis={a}), w, axis={a})",
                    f"concat(x, concat(y, w, axis={a}), axis={a})",
                    {"x": _decl(xa), "y": _decl(ya), "w": _decl(_with(base, a, "v"))},
                )
            )
    for name, p in _unary_ops():
        out.append(
            Axiom(
                f"{name}_over_transpose",
                f"{name} acts on each element, wherever transpose moves it",
                f"{name}(transpose(x, perm=(1, 0)){p})",
                f"transpose({name}(x{p}), perm=(1, 0))",
                {"x": "[m, n]"},
            )
        )
    return out


def _elementwise() -> list[Axiom]:
    out = []
    for r in RANKS:
        s = _decl(_shapes(r))
        two, three = {"x": s, "y": s}, {"x": s, "y": s, "z": s}
        out += [
            Axiom(f"add_commutative_r{r}", "addition commutes", "add(x, y)", "add(y, x)", two),
            Axiom(
                f"add_associative_r{r}",
                "addition associates",
                "add(add(x, y), z)",
                "add(x, add(y, z))",
                three,
            ),
            Axiom(
                f"mul_commutative_r{r}", "multiplication commutes", "mul(x, y)", "mul(y, x)", two
            ),
            Axiom(
                f"mul_associative_r{r}",
                "multiplication associates",
                "mul(mul(x, y), z)",
                "mul(x, mul(y, z))",
                three,
            ),
            Axiom(
                f"mul_distributes_over_add_r{r}",
                "multiplication distributes over addition",
                "mul(add(x, y), z)",
                "add(mul(x, z), mul(y, z))",
                three,
            ),
            Axiom(
                f"relu_idempotent_r{r}",
                "relu(x) is already non-negative",
                "relu(relu(x))",
                "relu(x)",
                {"x": s},
            ),
            Axiom(
                f"relu_of_square_r{r}",
                "a square is non-negative",
                "relu(mul(x, x))",
                "mul(x, x)",
                {"x": s},
            ),
            Axiom(
                f"relu_of_nonnegative_product_r{r}",
                "a product of non-negative tensors is non-negative",
                "relu(mul(relu(x), relu(y)))",
                "mul(relu(x), relu(y))",
                two,
            ),
            Axiom(
                f"relu_of_nonnegative_sum_r{r}",
                "a sum of non-negative tensors is non-negative",
                "relu(add(relu(x), relu(y)))",
                "add(relu(x), relu(y))",
                two,
            ),
            Axiom(
                f"relu_positively_homogeneous_r{r}",
                "relu(2x) = 2 relu(x)",
                "relu(add(x, x))",
                "add(relu(x), relu(x))",
                {"x": s},
            ),
            Axiom(
                f"mul_relu_self_r{r}",
                "x relu(x) is relu(x)^2: where x < 0 both are 0",
                "mul(x, relu(x))",
                "mul(relu(x), relu(x))",
                {"x": s},
            ),
        ]
    out += [
        Axiom(
            "where_over_transpose",
            "where picks element by element, so it commutes with transposing",
            "transpose(where(c, x, y), perm=(1, 0))",
            "where(transpose(c, perm=(1, 0)), transpose(x, perm=(1, 0)), "
            "transpose(y, perm=(1, 0)))",
            {"c": "[m, n]", "x": "[m, n]", "y": "[m, n]"},
        ),
        Axiom(
            "pad_of_pad",
            "two zero pads are one, of the sums of their widths",
            "pad(pad(x, low=(a, b), high=(c, d)), low=(e, f), high=(g, h))",
            "pad(x, low=(a + e, b + f), high=(c + g, d + h))",
            {"x": "[m, n]"},
        ),
    ]
    for op in _binary_ops():
        out.append(
            Axiom(
                f"{op}_over_transpose",
                f"{op} is elementwise, so it commutes with transposing",
                f"transpose({op}(x, y), perm=(1, 0))",
                f"{op}(transpose(x, perm=(1, 0)), transpose(y, perm=(1, 0)))",
                {"x": "[m, n]", "y": "[m, n]"},
            )
        )
    return out


def _products() -> list[Axiom]:
    out = []
    for act in ACTIVATIONS:
        out += [
            Axiom(
                f"linear_{act}_is_{act}_after_matmul",
                f"linear with activation {act} applies {act} to the product",
                f"linear(x, w, activation='{act}')",
                f"{act}(matmul(x, w))",
                {"x": "[m, n]", "w": "[n, p]"},
            ),
            Axiom(
                f"linear_bias_{act}_is_{act}_after_add",
                f"linear with a bias adds it before the activation {act}",
                f"linear(x, w, b, activation='{act}')",
                f"{act}(add(matmul(x, w), b))",
                {"x": "[m, n]", "w": "[n, p]", "b": "[p]"},
            ),
        ]
    out += [
        Axiom(
            "relu_of_nonnegative_matmul",
            "a product of non-negative matrices is non-negative",
            "relu(matmul(relu(x), relu(w)))",
            "matmul(relu(x), relu(w))",
            {"x": "[m, n]", "w": "[n, p]"},
        ),
        Axiom(
            "matmul_associative",
            "matrix products associate",
            "matmul(matmul(x, y), z)",
            "matmul(x, matmul(y, z))",
            {"x": "[m, n]", "y": "[n, p]", "z": "[p, q]"},
        ),
        Axiom(
            "matmul_distributes_left",
            "the product is linear in its left factor",
            "matmul(add(x, y), w)",
            "add(matmul(x, w), matmul(y, w))",
            {"x": "[m, n]", "y": "[m, n]", "w": "[n, p]"},
        ),
        Axiom(
            "matmul_distributes_right",
            "the product is linear in its right factor",
            "matmul(x, add(v, w))",
            "add(matmul(x, v), matmul(x, w))",
            {"x": "[m, n]", "v": "[n, p]", "w": "[n, p]"},
        ),
        Axiom(
            "matmul_over_row_concat",
            "rows of the left factor give rows of the product",
            "matmul(concat(x, y, axis=0), w)",
            "concat(matmul(x, w), matmul(y, w), axis=0)",
            {"x": "[m, n]", "y": "[p, n]", "w": "[n, q]"},
        ),
        Axiom(
            "matmul_over_column_concat",
            "columns of the right factor give columns of the product",
            "matmul(x, concat(v, w, axis=1))",
            "concat(matmul(x, v), matmul(x, w), axis=1)",
            {"x": "[m, n]", "v": "[n, p]", "w": "[n, q]"},
        ),
        Axiom(
            "matmul_over_inner_concat",
            "a product over a split contraction is a sum of products",
            "matmul(concat(x1, x2, axis=1), concat(w1, w2, axis=0))",
            "add(matmul(x1, w1), matmul(x2, w2))",
            {"x1": "[m, n]", "x2": "[m, p]", "w1": "[n, q]", "w2": "[p, q]"},
        ),
        Axiom(
            "linear_is_matmul",
            "linear without bias or activation is the product",
            "linear(x, w)",
            "matmul(x, w)",
            {"x": "[m, n]", "w": "[n, p]"},
        ),
        Axiom(
            "linear_bias_is_add_after_matmul",
            "linear with a bias adds it to the product",
            "linear(x, w, b)",
            "add(matmul(x, w), b)",
            {"x": "[m, n]", "w": "[n, p]", "b": "[p]"},
        ),
        Axiom(
            "linear_bias_is_add_after_matmul_r3",
            "a dense layer on [B, S, H] activations adds its bias to the product",
            "linear(x, w, b)",
            "add(matmul(x, w), b)",
            {"x": "[m, s, n]", "w": "[n, p]", "b": "[p]"},
        ),
        *(
            Axiom(
                f"linear_bias_{act}_is_{act}_after_linear_r3",
                f"a dense layer on [B, S, H] activations applies {act} after its biased product",
                f"linear(x, w, b, activation='{act}')",
                f"{act}(linear(x, w, b))",
                {"x": "[m, s, n]", "w": "[n, p]", "b": "[p]"},
            )
            for act in ACTIVATIONS
        ),
        Axiom(
            "add_bias_commutes_r3",
            "adding a broadcast bias commutes",
            "add(b, x)",
            "add(x, b)",
            {"x": "[m, s, n]", "b": "[n]"},
        ),
        Axiom(
            "transpose_of_matmul",
            "(x w)^T = w^T x^T",
            "transpose(matmul(x, w), perm=(1, 0))",
            "matmul(transpose(w, perm=(1, 0)), transpose(x, perm=(1, 0)))",
            {"x": "[m, n]", "w": "[n, p]"},
        ),
        Axiom(
            "transpose_involution",
            "transposing twice restores the matrix",
            "transpose(transpose(x, perm=(1, 0)), perm=(1, 0))",
            "x",
            {"x": "[m, n]"},
        ),
        Axiom(
            "transpose_over_row_concat",
            "rows joined become columns joined",
            "transpose(concat(x, y, axis=0), perm=(1, 0))",
            "concat(transpose(x, perm=(1, 0)), transpose(y, perm=(1, 0)), axis=1)",
            {"x": "[m, n]", "y": "[p, n]"},
        ),
        Axiom(
            "transpose_over_column_concat",
            "columns joined become rows joined",
            "transpose(concat(x, y, axis=1), perm=(1, 0))",
            "concat(transpose(x, perm=(1, 0)), transpose(y, perm=(1, 0)), axis=0)",
            {"x": "[m, n]", "y": "[m, p]"},
        ),
        Axiom(
            "concat_block_transpose",
            "a 2x2 block matrix can be joined by rows or by columns first",
            "concat(concat(x1, x2, axis=1), concat(y1, y2, axis=1), axis=0)",
            "concat(concat(x1, y1, axis=0), concat(x2, y2, axis=0), axis=1)",
            {"x1": "[m, n]", "x2": "[m, p]", "y1": "[q, n]", "y2": "[q, p]"},
        ),
    ]
    return out


def _sizes() -> list[SizeAxiom]:
    out = []
    for r in RANKS:
        s = _decl(_shapes(r))
        for d in range(r):
            for name, p in _unary_ops():
                out.append(
                    SizeAxiom(
                        f"size_of_{name}_r{r}_dim{d}",
                        f"{name} keeps the shape",
                        f"{name}(x{p})",
                        d,
                        f"size(x, {d})",
                        {"x": s},
                    )
                )
            for op in ("add", "mul"):
                out.append(
                    SizeAxiom(
                        f"size_of_{op}_r{r}_dim{d}",
                        f"{op} of equal shapes keeps the shape",
                        f"{op}(x, y)",
                        d,
                        f"size(x, {d})",
                        {"x": s, "y": s},
                    )
                )
        base = _shapes(r)
        for a in range(r):
            decls = {"x": _decl(base), "y": _decl(_with(base, a, "z"))}
            for d in range(r):
                value = f"size(x, {a}) + size(y, {a})" if d == a else f"size(x, {d})"
                out.append(
                    SizeAxiom(
                        f"size_of_concat_r{r}_axis{a}_dim{d}",
                        "concatenation adds the sizes along its axis and keeps the others",
                        f"concat(x, y, axis={a})",
                        d,
                        value,
                        decls,
                    )
                )
                for i, part in ((0, "s"), (1, "t")):
                    out.append(
                        SizeAxiom(
                            f"size_of_split{i}_r{r}_axis{a}_dim{d}",
                            "a part of a split has its size along the axis and keeps the others",
                            f"split(x, axis={a}, sizes=(s, t))[{i}]",
                            d,
                            part if d == a else f"size(x, {d})",
                            {"x": _decl(base)},
                            (f"s + t == size(x, {a})",),
                        )
                    )
    for act in ("none", *ACTIVATIONS):
        a = f", activation='{act}'"
        for bias in ("", ", b"):
            tag = f"{act}{'_bias' if bias else ''}"
            decls = {"x": "[m, n]", "w": "[n, p]"} | ({"b": "[p]"} if bias else {})
            out += [
                SizeAxiom(
                    f"size_of_linear_{tag}_rows",
                    "linear keeps the rows of x",
                    f"linear(x, w{bias}{a})",
                    0,
                    "size(x, 0)",
                    decls,
                ),
                SizeAxiom(
                    f"size_of_linear_{tag}_columns",
                    "linear has the columns of w",
                    f"linear(x, w{bias}{a})",
                    1,
                    "size(w, 1)",
                    decls,
                ),
            ]
    out += [
        SizeAxiom(
            "size_of_matmul_rows",
            "a product has the rows of its left factor",
            "matmul(x, w)",
            0,
            "size(x, 0)",
            {"x": "[m, n]", "w": "[n, p]"},
        ),
        SizeAxiom(
            "size_of_matmul_columns",
            "a product has the columns of its right factor",
            "matmul(x, w)",
            1,
            "size(w, 1)",
            {"x": "[m, n]", "w": "[n, p]"},
        ),
        *(
            SizeAxiom(
                f"size_of_matmul_r3_dim{d}",
                "a product of [B, S, H] and a matrix keeps B and S and has the matrix's columns",
                "matmul(x, w)",
                d,
                "size(w, 1)" if d == 2 else f"size(x, {d})",
                {"x": "[m, s, n]", "w": "[n, p]"},
            )
            for d in range(3)
        ),
        *(
            SizeAxiom(
                f"size_of_add_bias{'_first' if first else ''}_r3_dim{d}",
                "adding a broadcast bias keeps the shape of the activations",
                "add(b, x)" if first else "add(x, b)",
                d,
                f"size(x, {d})",
                {"x": "[m, s, n]", "b": "[n]"},
            )
            for first in (False, True)
            for d in range(3)
        ),
        SizeAxiom(
            "size_of_transpose_rows",
            "a transposed matrix swaps its sizes",
            "transpose(x, perm=(1, 0))",
            0,
            "size(x, 1)",
            {"x": "[m, n]"},
        ),
        SizeAxiom(
            "size_of_transpose_columns",
            "a transposed matrix swaps its sizes",
            "transpose(x, perm=(1, 0))",
            1,
            "size(x, 0)",
            {"x": "[m, n]"},
        ),
    ]
    return out


def all_axioms() -> tuple[Axiom | SizeAxiom, ...]:
    axioms = (*_erasures(), *_layout(), *_elementwise(), *_products(), *_sizes())
    names = [a.name for a in axioms]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"duplicate axiom names: {sorted(duplicates)}")
    return axioms


AXIOMS: tuple[Axiom | SizeAxiom, ...] = all_axioms()
AXIOMS_BY_NAME: Mapping[str, Axiom | SizeAxiom] = {a.name: a for a in AXIOMS}
