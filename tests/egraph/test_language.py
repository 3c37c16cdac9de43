"""The egglog language is derived from the operator registry, and parameters round-trip."""

import pytest

from pcgopt.egraph.language import (
    PARAM_SORTS,
    EGraphError,
    decode_param,
    encode_param,
    language,
)
from pcgopt.ops import OPERATORS
from pcgopt.ops.params import ParamType
from pcgopt.shapes import DType


def test_every_operator_has_a_constructor_per_input_count():
    lang = language()
    for op, spec in OPERATORS.items():
        c = lang.constructor(op, spec.min_inputs if spec.kind.name != "SOURCE" else 0)
        assert c.op == op
        assert len(c.sorts) >= c.arity + len(spec.params)
    assert lang.constructor("concat", 3).name == "op_concat_3"
    assert lang.constructor("linear", 3).sorts[:3] == ("T", "T", "T")


def test_a_missing_arity_is_a_clear_error():
    with pytest.raises(EGraphError, match="relu with 2 input"):
        language().constructor("relu", 2)


def test_every_parameter_type_has_a_sort():
    assert set(PARAM_SORTS) == set(ParamType)


@pytest.mark.parametrize(
    ("ptype", "value"),
    [
        (ParamType.AXIS, 1),
        (ParamType.POS_INT, None),
        (ParamType.FLOAT, 1e-5),
        (ParamType.BOOL, False),
        (ParamType.STR, 'a "quoted" name'),
        (ParamType.DTYPE, DType.BF16 if hasattr(DType, "BF16") else DType.F32),
        (ParamType.AXES, (1, 0)),
        (ParamType.POS_PAIR, None),
    ],
)
def test_parameters_round_trip_through_egglog_values(ptype, value):
    import egglog.bindings as egg

    eg = egg.EGraph()
    literal = encode_param(ptype, value, "test")
    sort = PARAM_SORTS[ptype]
    decl = "(sort IV (Vec i64))\n" if sort == "IV" else ""
    eg.parse_and_run_program(f"{decl}(function probe () {sort} :no-merge)\n(set (probe) {literal})")
    (row,) = eg.freeze().functions["probe"].rows
    raw = {
        "i64": eg.value_to_i64,
        "String": eg.value_to_string,
        "IV": lambda v: tuple(eg.value_to_i64(x) for x in eg.value_to_vec(v)),
    }[sort](row.output)
    assert decode_param(ptype, raw) == value
