"""FlexFlow's peer rules: translation, and the verdicts on all of them."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from pcgopt.verify import Prover, verify_rule
from pcgopt.verify.__main__ import fix_symbols
from pcgopt.verify.flexflow import NotTranslatable, translate_collection, translate_rule


def _peer_file() -> Path:
    """FlexFlow's rule file lives in the workspace's shared/ folder, not in this repository:
    $PCGOPT_PEERS, else shared/ beside the checkout, else the workspace's /work/shared."""
    name = "flexflow_graph_subst_3_v2.json"
    candidates = [Path(os.environ["PCGOPT_PEERS"]) / name] if "PCGOPT_PEERS" in os.environ else []
    candidates += [
        Path(__file__).resolve().parents[3] / "shared" / "peers" / name,
        Path("/work/shared/peers") / name,
    ]
    return next((p for p in candidates if p.exists()), candidates[0])


PEER_FILE = _peer_file()
needs_peer_file = pytest.mark.skipif(
    not PEER_FILE.exists(), reason=f"FlexFlow's rule file is not at {PEER_FILE}"
)

#: Valid at degree 2 only: they use "Add = concat on the replica dimension + Reduce(k)", and two
#: stacked tensors make two replica slots, so Reduce(k) is wrong for any other k.
UNSOUND_FOR_OTHER_DEGREES = {
    "taso_rule_285",
    "taso_rule_308",
    "taso_rule_313",
    "taso_rule_481",
    "taso_rule_485",
    "taso_rule_494",
    "taso_rule_495",
    "taso_rule_496",
    "taso_rule_497",
    "taso_rule_503",
    "taso_rule_533",
}


def op(kind, inputs, **params):
    return {
        "type": kind,
        "input": [{"opId": i, "tsId": t} for i, t in inputs],
        "para": [{"key": k, "value": v} for k, v in params.items()],
    }


def record(src, dst, mapped=((0, 0, 0, 0),)):
    return {
        "name": "r",
        "srcOp": src,
        "dstOp": dst,
        "mappedOutput": [
            {"srcOpId": a, "srcTsId": b, "dstOpId": c, "dstTsId": d} for a, b, c, d in mapped
        ],
    }


def test_translation_of_a_parallel_rule():
    # relu(partition[dim 2](x)) => partition[dim 2](relu(x)): generator dim 2 is pcgopt's dim 1
    r = translate_rule(
        record(
            [
                op("OP_PARTITION", [(-1, 0)], PM_PARALLEL_DIM=2, PM_PARALLEL_DEGREE=2),
                op("OP_RELU", [(0, 0)]),
            ],
            [
                op("OP_RELU", [(-1, 0)]),
                op("OP_PARTITION", [(0, 0)], PM_PARALLEL_DIM=2, PM_PARALLEL_DEGREE=2),
            ],
            ((1, 0, 1, 0),),
        )
    )
    assert repr(r.lhs[0]) == "relu(partition(x1, dim=1, degree=k))"
    assert repr(r.rhs[0]) == "partition(relu(x1), dim=1, degree=k)"
    assert verify_rule(r).status == "proved"


def test_linear_contracts_the_columns_of_both_operands():
    r = translate_rule(
        record(
            [op("OP_LINEAR", [(-1, 0), (-4, 0)], PM_ACTI=2)],
            [op("OP_RELU", [(1, 0)]), op("OP_LINEAR", [(-1, 0), (-4, 0)], PM_ACTI=0)],
            ((0, 0, 0, 0),),
        )
    )
    assert repr(r.lhs[0]) == "linear(x1, transpose(x4, perm=(1, 0)), activation='relu')"
    assert dict(r.inputs) and repr(r.inputs["x4"]) == "f32[o, c]"


@pytest.mark.parametrize(
    ("src", "why"),
    [
        (
            [op("OP_REPLICATE", [(-1, 0)], PM_PARALLEL_DIM=1, PM_PARALLEL_DEGREE=2)],
            "data dimension",
        ),
        (
            [op("OP_COMBINE", [(-1, 0)], PM_PARALLEL_DIM=0, PM_PARALLEL_DEGREE=2)],
            "replica dimension",
        ),
        (
            [
                op("OP_REPLICATE", [(-1, 0)], PM_PARALLEL_DIM=0, PM_PARALLEL_DEGREE=2),
                op("OP_REDUCE", [(0, 0)], PM_PARALLEL_DIM=0, PM_PARALLEL_DEGREE=2),
            ],
            "reduce of copies",
        ),
        (
            [
                op("OP_CONCAT", [(-1, 0), (-2, 0)], PM_AXIS=0, PM_NUMDIM=3, PM_NUM_INPUTS=2),
                op("OP_RELU", [(0, 0)]),
            ],
            "relu reads replica slots",
        ),
    ],
)
def test_what_cannot_be_translated_says_why(src, why):
    with pytest.raises(NotTranslatable, match=why):
        translate_rule(record(src, src, ((len(src) - 1, 0, len(src) - 1, 0),)))


@needs_peer_file
def test_all_peer_rules():
    """Every translatable peer rule is proved for all degrees, except the eleven that hold only
    at degree 2; with the degree fixed to 2 all of them are proved. No unknowns."""
    rules, skipped = translate_collection(json.loads(PEER_FILE.read_text()))
    assert len(rules) + len(skipped) == 640
    prover = Prover()
    verdicts = {r.name: verify_rule(r, timeout_s=5, checks=6, prover=prover) for r in rules}
    counts = Counter(v.status for v in verdicts.values())
    assert counts["unknown"] == 0
    refuted = {n for n, v in verdicts.items() if v.status == "refuted"}
    assert refuted == UNSOUND_FOR_OTHER_DEGREES
    assert not any(v.axiom_conflict for v in verdicts.values())
    assert all(v.degrees == "all" for v in verdicts.values() if v.status == "proved")
    by_name = {r.name: r for r in rules}
    for name in sorted(UNSOUND_FOR_OTHER_DEGREES):
        assert "k = " in verdicts[name].counterexample  # a concrete degree where it fails
        at_two = verify_rule(fix_symbols(by_name[name], {"k": 2}), prover=prover)
        assert at_two.status == "proved", at_two
