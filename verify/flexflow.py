"""Reading FlexFlow's PCG substitution rules (Unity's generated set) as pcgopt rules.

The peer file (``graph_subst_3_v2.json``, FlexFlow's TASO-style protobuf rendered as JSON)
describes rules in the *generator's* model, which differs from pcgopt's typed PCG. The model was
pinned down by evaluating all 640 rules under candidate semantics (the choices below are the
only ones under which all of them hold at degree 2):

* every tensor is 3-D in numpy order: dim 0 is the replica dimension (size 1 on every input),
  dim 1 the rows (batch, or a weight's output channels), dim 2 the columns (input channels);
* inputs -1..-3 are data of shape [b, c]; inputs -4..-6 are weights of shape [o, c]
  (the generator used b=2, c=o=4);
* ``OP_LINEAR(x, w, PM_ACTI)`` is ``x @ w^T`` (TASO's activation numbering: 0 none,
  1 sigmoid, 2 relu, 3 tanh), reading only replica slot 0 of each operand;
* ``OP_REPLICATE``/``OP_REDUCE`` on dim 0 add copies / sum partial results; on a data dim they
  repeat elements / sum adjacent elements (an encoding artifact of the generator);
* ``OP_SPLIT`` cuts where the concat that built its input joined;
* every ``PM_PARALLEL_DEGREE`` is 2 and FlexFlow substitutes one degree for all of a rule's
  parallel operators: it becomes the symbol ``k``.

Translation, operator by operator: replicate/reduce on dim 0 become Replicate/Reduce;
partition, combine, concat and split on dims 1-2 become the same on pcgopt's dims 0-1; a concat
along dim 0 stacks the replica slots, which pcgopt states as StackPartial (the slots are summed
by a later reduce, Unity's Figure 11b). That reading is faithful only while whatever reads the
stacked slots is linear in them (it then makes no difference whether the slots are summed
before or after); a rule where a slot-wise nonlinear operation reads them (relu, a product of
two stacked tensors, a Linear, which the generator let read slot 0 only) is about slot data,
which pcgopt's replicas do not hold. Everything else is reported as not translatable, with
the reason. A translated rule whose sides are never well-formed in pcgopt's typed semantics
(e.g. a Reduce of copies, which the generator read as k * x) is not translatable either; the
verifier finds those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcgopt.rewrite import Expr, IntExpr, Rule, RuleError, Sym, Term, Var, size_expr

DEGREE = Sym("k")
DATA_INPUTS = (-1, -2, -3)
ACTIVATIONS = {0: "none", 1: "sigmoid", 2: "relu", 3: "tanh"}
_SHAPE_PRESERVING = {
    "relu",
    "add",
    "mul",
    "partition",
    "combine",
    "replicate",
    "reduce",
    "stack_partial",
}


class NotTranslatable(Exception):
    """A peer rule uses something pcgopt cannot state; the message says what."""


@dataclass
class _Side:
    ops: Sequence[Mapping[str, Any]]
    memo: dict

    def term(self, op_id: int, ts_id: int) -> Expr:
        if op_id < 0:
            return Var(f"x{-op_id}")
        key = (op_id, ts_id)
        if key not in self.memo:
            self.memo[key] = _translate_op(self, self.ops[op_id], ts_id)
        return self.memo[key]


def _params(op: Mapping[str, Any]) -> dict[str, int]:
    return {p["key"]: p["value"] for p in op.get("para", [])}


def _data_dim(d: int, what: str) -> int:
    if d == 0:
        raise NotTranslatable(f"{what} along the replica dimension (dim 0) used as data")
    return d - 1


def _translate_op(side: _Side, op: Mapping[str, Any], ts_id: int) -> Expr:
    kind = op["type"]
    p = _params(op)
    args = [side.term(t["opId"], t["tsId"]) for t in op["input"]]
    if kind in ("OP_PARTITION", "OP_COMBINE"):
        name = "partition" if kind == "OP_PARTITION" else "combine"
        dim = p["PM_PARALLEL_DIM"]
        if dim == 0:
            raise NotTranslatable(f"{name} along the replica dimension (dim 0)")
        return Term(name, (args[0],), {"dim": dim - 1, "degree": DEGREE})
    if kind in ("OP_REPLICATE", "OP_REDUCE"):
        name = "replicate" if kind == "OP_REPLICATE" else "reduce"
        if p["PM_PARALLEL_DIM"] != 0:
            raise NotTranslatable(
                f"{name} along a data dimension (the generator's "
                f"{'repeat' if name == 'replicate' else 'sum of adjacent elements'}); pcgopt's "
                "replicas are their own dimension"
            )
        return Term(name, (args[0],), {"degree": DEGREE})
    if kind == "OP_CONCAT":
        axis = p["PM_AXIS"]
        if axis == 0:
            return Term("stack_partial", tuple(args))
        return Term("concat", tuple(args), {"axis": axis - 1})
    if kind == "OP_SPLIT":
        axis = _data_dim(p["PM_AXIS"], "split")
        first, second = _concat_boundary(args[0], axis)
        return Term("split", (args[0],), {"axis": axis, "sizes": (first, second)}, ts_id)
    if kind == "OP_LINEAR":
        act = p.get("PM_ACTI", 0)
        if act not in ACTIVATIONS:
            raise NotTranslatable(f"linear activation code {act}")
        w = Term("transpose", (args[1],), {"perm": (1, 0)})
        return Term("linear", (args[0], w), {"activation": ACTIVATIONS[act]})
    if kind == "OP_RELU":
        return Term("relu", (args[0],))
    if kind == "OP_EW_ADD":
        return Term("add", tuple(args))
    if kind == "OP_EW_MUL":
        return Term("mul", tuple(args))
    raise NotTranslatable(f"operator {kind}")


def _concat_boundary(expr: Expr, axis: int) -> tuple[IntExpr, IntExpr]:
    """Where the concat that built ``expr`` along ``axis`` joined its parts."""
    e = expr
    while isinstance(e, Term):
        if e.op == "concat" and e.params["axis"] == axis:
            try:
                return size_expr(e.args[0], axis), size_expr(e.args[1], axis)
            except RuleError as err:
                raise NotTranslatable(err.message) from None
        if e.op in _SHAPE_PRESERVING or (e.op == "linear" and axis == 0):
            e = e.args[0]  # linear keeps the rows of its input, not its columns
            continue
        break
    raise NotTranslatable("split of a tensor that no concat along the same axis built")


#: Operators that act on stacked replica slots the same way whether the slots are summed first.
_SLOT_LINEAR = {
    "add",
    "concat",
    "split",
    "transpose",
    "partition",
    "combine",
    "replicate",
    "stack_partial",
}


def _check_slots(exprs: Sequence[Expr]) -> None:
    """Raises NotTranslatable where something not linear in them reads stacked slots."""
    stacked: dict[Expr, bool] = {}

    def is_stacked(e: Expr) -> bool:
        if isinstance(e, Var):
            return False
        if e not in stacked:
            flags = [is_stacked(a) for a in e.args]
            if e.op == "stack_partial":
                if any(flags) and not all(flags):
                    raise NotTranslatable(
                        "a concat along the replica dimension of tensors with different numbers "
                        "of replica slots"
                    )
                stacked[e] = True
            elif not any(flags):
                stacked[e] = False
            elif e.op == "reduce":
                stacked[e] = False  # the slots are summed here
            elif e.op in _SLOT_LINEAR or (e.op == "mul" and flags.count(True) == 1):
                stacked[e] = True
            else:
                raise NotTranslatable(
                    f"{e.op} reads replica slots holding different tensors (the generator's "
                    "slot-wise semantics; pcgopt's replicas are copies or partial sums)"
                )
        return stacked[e]

    for e in exprs:
        is_stacked(e)
    for e in _terms(exprs):
        if e.op == "reduce" and _copies_on_top(e.args[0]):
            raise NotTranslatable(
                "a reduce of copies: the generator sums identical replicas (k * x), while "
                "pcgopt's Reduce sums partial sums"
            )


def _terms(exprs: Sequence[Expr]):
    seen = set()
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if isinstance(e, Term) and e not in seen:
            seen.add(e)
            yield e
            stack.extend(e.args)


def _copies_on_top(e: Expr) -> bool:
    """Whether the replica slots of ``e`` were last made by a replicate (looking through the
    operators that do not touch the replica dimension)."""
    while isinstance(e, Term) and e.op in ("partition", "combine"):
        e = e.args[0]
    return isinstance(e, Term) and e.op == "replicate"


def translate_rule(record: Mapping[str, Any]) -> Rule:
    """A peer rule as a pcgopt rule; NotTranslatable says why not."""
    name = record["name"]
    src, dst = _Side(record["srcOp"], {}), _Side(record["dstOp"], {})
    lhs, rhs = [], []
    for m in record["mappedOutput"]:
        lhs.append(src.term(m["srcOpId"], m["srcTsId"]))
        rhs.append(dst.term(m["dstOpId"], m["dstTsId"]))
    _check_slots(lhs)
    _check_slots(rhs)
    used = {v.name for e in (*lhs, *rhs) for v in _vars(e)}
    unbound = sorted(used - {v.name for e in lhs for v in _vars(e)})
    if unbound:
        raise NotTranslatable(
            "the right side reads inputs the left side does not have (no rewrite can supply "
            "them; the generator's Linear ignored the replica slot that held them)"
        )
    # The generator's weights were square; declare them [o, c] unless the rule only makes sense
    # for square ones (then [c, c]): the most general statement of what was fingerprinted.
    for weight, example in (("[o, c]", {"b": 2, "c": 4, "o": 6}), ("[c, c]", {"b": 2, "c": 4})):
        inputs = {v: ("[b, c]" if int(v[1:]) <= len(DATA_INPUTS) else weight) for v in sorted(used)}
        try:
            rule = Rule(name, tuple(lhs), tuple(rhs), inputs, example)
        except RuleError as e:
            raise NotTranslatable(e.message) from None
        if _well_formed(rule):
            return rule
    raise NotTranslatable("not well-formed at the generator's shapes")


def _well_formed(rule: Rule) -> bool:
    """Whether both sides are logically well-formed at the rule's example sizes."""
    from pcgopt.errors import PCGError
    from pcgopt.verify.logic import rule_ranks

    try:
        rule_ranks(rule)
    except (PCGError, RuleError):
        return False
    return True


def _vars(e: Expr):
    if isinstance(e, Var):
        yield e
    else:
        for a in e.args:
            yield from _vars(a)


def translate_collection(data: Mapping[str, Any]) -> tuple[list[Rule], dict[str, str]]:
    """All rules of a peer file: the translated ones, and the reasons for the others."""
    rules, skipped = [], {}
    for record in data.get("rule", []):
        try:
            rules.append(translate_rule(record))
        except NotTranslatable as e:
            skipped[record["name"]] = str(e)
    return rules, skipped
