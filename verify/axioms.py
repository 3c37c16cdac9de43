"""The axioms: what the verifier may assume about the operators, as data.

Each axiom is an equation between two terms of the rule language (:mod:`pcgopt.rewrite`) with a
name and a one-line reason, declared over tensor variables with lettered dimensions (which also
tell the validator what shapes to try) and, where the equation needs it, conditions on sizes.
Axioms are statements about *values* (the logical tensors): where they mention a parallel
operator, they say what it does to the value. Every axiom is checked against the reference
evaluator on random instances by the test suite; an axiom that fails there is a bug.

Families that apply to many operators are generated from the operator registry (every
elementwise activation commutes with concatenation, every activation fused into ``linear`` is
the activation applied afterwards, ...), so a new operator of such a kind gets them for free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from pcgopt.ops import OPERATORS, ParallelOp
from pcgopt.ops.elementwise import UnaryElementwise
from pcgopt.ops.linalg import ACTIVATIONS
from pcgopt.rewrite import IntExpr, Rule, parse_int_expr

#: A condition: (left, relation, right) with relation "==" or "!=".
Condition = tuple[IntExpr, str, IntExpr]


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
    """``size(term, dim) = value`` for all tensors of the declared shapes and symbol values that
    make the term well-formed and the conditions true. The value half of a proof needs these
    where a parameter is a size (``split(..., sizes=(size(x, 0), ...))``)."""

    name: str
    why: str
    term: str
    dim: str
    value: str
    inputs: Mapping[str, str]
    conditions: tuple[str, ...] = ()

    @cached_property
    def rule(self) -> Rule:
        """The term as a (trivial) rule, so that instances can be drawn for it."""
        return Rule.parse(self.name, self.term, self.term, self.inputs)

    @cached_property
    def parsed(self) -> tuple[IntExpr, IntExpr]:
        return parse_int_expr(self.dim), parse_int_expr(self.value)

    @cached_property
    def parsed_conditions(self) -> tuple[Condition, ...]:
        return parse_conditions(self.name, self.conditions)


def _erasures() -> list[Axiom]:
    out = []
    for name, spec in OPERATORS.items():
        if not isinstance(spec, ParallelOp):
            continue
        symbol = {"dim": "d", "src_dim": "s", "dst_dim": "t", "degree": "k"}
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


def _activations() -> list[Axiom]:
    """Axioms every elementwise activation satisfies, generated from the registry."""
    out = []
    for name, spec in OPERATORS.items():
        if not isinstance(spec, UnaryElementwise) or name == "dropout":
            continue  # dropout's mask depends on positions: it does not commute with layout
        p = ", factor=f" if name == "scale" else ""
        out += [
            Axiom(
                f"{name}_over_concat",
                f"{name} acts on each element, wherever concat puts it",
                f"{name}(concat(x, y, axis=a){p})",
                f"concat({name}(x{p}), {name}(y{p}), axis=a)",
                {"x": "[m, n]", "y": "[m, n]"},
            ),
            Axiom(
                f"{name}_over_split",
                f"{name} acts on each element, wherever split puts it",
                f"{name}(split(x, axis=a, sizes=(s, t))[0]{p})",
                f"split({name}(x{p}), axis=a, sizes=(s, t))[0]",
                {"x": "[m, n]"},
                conditions=("s + t == size(x, a)",),
            ),
            Axiom(
                f"{name}_over_split_second",
                f"{name} acts on each element, wherever split puts it",
                f"{name}(split(x, axis=a, sizes=(s, t))[1]{p})",
                f"split({name}(x{p}), axis=a, sizes=(s, t))[1]",
                {"x": "[m, n]"},
                conditions=("s + t == size(x, a)",),
            ),
            Axiom(
                f"{name}_over_transpose",
                f"{name} acts on each element, wherever transpose moves it",
                f"{name}(transpose(x, perm=(1, 0)){p})",
                f"transpose({name}(x{p}), perm=(1, 0))",
                {"x": "[m, n]"},
            ),
        ]
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
    return out


_ALGEBRA = [
    # elementwise arithmetic
    Axiom(
        "add_commutative",
        "addition commutes",
        "add(x, y)",
        "add(y, x)",
        {"x": "[m, n]", "y": "[m, n]"},
    ),
    Axiom(
        "add_associative",
        "addition associates",
        "add(add(x, y), z)",
        "add(x, add(y, z))",
        {"x": "[m, n]", "y": "[m, n]", "z": "[m, n]"},
    ),
    Axiom(
        "mul_commutative",
        "multiplication commutes",
        "mul(x, y)",
        "mul(y, x)",
        {"x": "[m, n]", "y": "[m, n]"},
    ),
    Axiom(
        "mul_associative",
        "multiplication associates",
        "mul(mul(x, y), z)",
        "mul(x, mul(y, z))",
        {"x": "[m, n]", "y": "[m, n]", "z": "[m, n]"},
    ),
    Axiom(
        "mul_distributes_over_add",
        "multiplication distributes over addition",
        "mul(add(x, y), z)",
        "add(mul(x, z), mul(y, z))",
        {"x": "[m, n]", "y": "[m, n]", "z": "[m, n]"},
    ),
    Axiom(
        "relu_idempotent",
        "relu(x) is already non-negative",
        "relu(relu(x))",
        "relu(x)",
        {"x": "[m, n]"},
    ),
    Axiom(
        "add_over_transpose",
        "addition is elementwise, so it commutes with transposing",
        "transpose(add(x, y), perm=(1, 0))",
        "add(transpose(x, perm=(1, 0)), transpose(y, perm=(1, 0)))",
        {"x": "[m, n]", "y": "[m, n]"},
    ),
    Axiom(
        "mul_over_transpose",
        "multiplication is elementwise, so it commutes with transposing",
        "transpose(mul(x, y), perm=(1, 0))",
        "mul(transpose(x, perm=(1, 0)), transpose(y, perm=(1, 0)))",
        {"x": "[m, n]", "y": "[m, n]"},
    ),
    Axiom(
        "add_over_concat",
        "addition is elementwise, so it acts on aligned blocks",
        "add(concat(x1, x2, axis=a), concat(y1, y2, axis=a))",
        "concat(add(x1, y1), add(x2, y2), axis=a)",
        {"x1": "[m, n]", "x2": "[m, n]", "y1": "[m, n]", "y2": "[m, n]"},
        conditions=("size(x1, a) == size(y1, a)",),
    ),
    Axiom(
        "mul_over_concat",
        "multiplication is elementwise, so it acts on aligned blocks",
        "mul(concat(x1, x2, axis=a), concat(y1, y2, axis=a))",
        "concat(mul(x1, y1), mul(x2, y2), axis=a)",
        {"x1": "[m, n]", "x2": "[m, n]", "y1": "[m, n]", "y2": "[m, n]"},
        conditions=("size(x1, a) == size(y1, a)",),
    ),
    # matrix products
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
        conditions=("size(x1, 1) == size(w1, 0)",),
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
        "transpose_of_matmul",
        "(x w)^T = w^T x^T",
        "transpose(matmul(x, w), perm=(1, 0))",
        "matmul(transpose(w, perm=(1, 0)), transpose(x, perm=(1, 0)))",
        {"x": "[m, n]", "w": "[n, p]"},
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
        "transpose_involution",
        "transposing twice restores the matrix",
        "transpose(transpose(x, perm=(1, 0)), perm=(1, 0))",
        "x",
        {"x": "[m, n]"},
    ),
    # concatenation and split
    Axiom(
        "split_of_concat_first",
        "splitting a concatenation where it was joined gives the parts",
        "split(concat(x, y, axis=a), axis=a, sizes=(size(x, a), size(y, a)))[0]",
        "x",
        {"x": "[m, n]", "y": "[m, n]"},
    ),
    Axiom(
        "split_of_concat_second",
        "splitting a concatenation where it was joined gives the parts",
        "split(concat(x, y, axis=a), axis=a, sizes=(size(x, a), size(y, a)))[1]",
        "y",
        {"x": "[m, n]", "y": "[m, n]"},
    ),
    Axiom(
        "concat_of_split",
        "joining the parts of a split gives the tensor",
        "concat(split(x, axis=a, sizes=(s, t))[0], split(x, axis=a, sizes=(s, t))[1], axis=a)",
        "x",
        {"x": "[m, n]"},
        conditions=("s + t == size(x, a)",),
    ),
    Axiom(
        "concat_associative",
        "concatenation associates",
        "concat(concat(x, y, axis=a), z, axis=a)",
        "concat(x, concat(y, z, axis=a), axis=a)",
        {"x": "[m, n]", "y": "[m, n]", "z": "[m, n]"},
    ),
    Axiom(
        "concat_block_transpose",
        "a 2x2 block matrix can be joined by rows or by columns first",
        "concat(concat(x1, x2, axis=1), concat(y1, y2, axis=1), axis=0)",
        "concat(concat(x1, y1, axis=0), concat(x2, y2, axis=0), axis=1)",
        {"x1": "[m, n]", "x2": "[m, p]", "y1": "[q, n]", "y2": "[q, p]"},
        conditions=("size(x1, 1) == size(y1, 1)",),
    ),
]


def _sizes() -> list[SizeAxiom]:
    out = []
    for name, spec in OPERATORS.items():
        if isinstance(spec, UnaryElementwise) or name == "softmax":
            p = ", factor=f" if name == "scale" else ""
            out.append(
                SizeAxiom(
                    f"size_of_{name}",
                    f"{name} keeps the shape",
                    f"{name}(x{p})",
                    "d",
                    "size(x, d)",
                    {"x": "[m, n]"},
                )
            )
    for name in ("add", "mul"):
        out.append(
            SizeAxiom(
                f"size_of_{name}",
                f"{name} of equal shapes keeps the shape",
                f"{name}(x, y)",
                "d",
                "size(x, d)",
                {"x": "[m, n]", "y": "[m, n]"},
                ("size(x, d) == size(y, d)",),
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
                    "0",
                    "size(x, 0)",
                    decls,
                ),
                SizeAxiom(
                    f"size_of_linear_{tag}_columns",
                    "linear has the columns of w",
                    f"linear(x, w{bias}{a})",
                    "1",
                    "size(w, 1)",
                    decls,
                ),
            ]
    out += [
        SizeAxiom(
            "size_of_matmul_rows",
            "a product has the rows of its left factor",
            "matmul(x, w)",
            "0",
            "size(x, 0)",
            {"x": "[m, n]", "w": "[n, p]"},
        ),
        SizeAxiom(
            "size_of_matmul_columns",
            "a product has the columns of its right factor",
            "matmul(x, w)",
            "1",
            "size(w, 1)",
            {"x": "[m, n]", "w": "[n, p]"},
        ),
        SizeAxiom(
            "size_of_concat_axis",
            "concatenation adds the sizes along its axis",
            "concat(x, y, axis=a)",
            "a",
            "size(x, a) + size(y, a)",
            {"x": "[m, n]", "y": "[m, n]"},
        ),
        SizeAxiom(
            "size_of_concat_other",
            "concatenation keeps the other sizes",
            "concat(x, y, axis=a)",
            "d",
            "size(x, d)",
            {"x": "[m, n]", "y": "[m, n]"},
            ("d != a",),
        ),
        SizeAxiom(
            "size_of_split_first",
            "the first part of a split has the first size",
            "split(x, axis=a, sizes=(s, t))[0]",
            "a",
            "s",
            {"x": "[m, n]"},
            ("s + t == size(x, a)",),
        ),
        SizeAxiom(
            "size_of_split_second",
            "the second part of a split has the second size",
            "split(x, axis=a, sizes=(s, t))[1]",
            "a",
            "t",
            {"x": "[m, n]"},
            ("s + t == size(x, a)",),
        ),
        SizeAxiom(
            "size_of_split_other",
            "split keeps the other sizes",
            "split(x, axis=a, sizes=(s, t))[0]",
            "d",
            "size(x, d)",
            {"x": "[m, n]"},
            ("s + t == size(x, a)", "d != a"),
        ),
        SizeAxiom(
            "size_of_split_other_second",
            "split keeps the other sizes",
            "split(x, axis=a, sizes=(s, t))[1]",
            "d",
            "size(x, d)",
            {"x": "[m, n]"},
            ("s + t == size(x, a)", "d != a"),
        ),
        SizeAxiom(
            "size_of_transpose_first",
            "a transposed matrix swaps its sizes",
            "transpose(x, perm=(1, 0))",
            "0",
            "size(x, 1)",
            {"x": "[m, n]"},
        ),
        SizeAxiom(
            "size_of_transpose_second",
            "a transposed matrix swaps its sizes",
            "transpose(x, perm=(1, 0))",
            "1",
            "size(x, 0)",
            {"x": "[m, n]"},
        ),
    ]
    return out


def all_axioms() -> tuple[Axiom | SizeAxiom, ...]:
    axioms = (*_erasures(), *_activations(), *_ALGEBRA, *_sizes())
    names = [a.name for a in axioms]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"duplicate axiom names: {sorted(duplicates)}")
    return axioms


AXIOMS: tuple[Axiom | SizeAxiom, ...] = all_axioms()
AXIOMS_BY_NAME: Mapping[str, Axiom | SizeAxiom] = {a.name: a for a in AXIOMS}
