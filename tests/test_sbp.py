"""The SBP view (AutoDDL section 4): signatures to and from parallel tensor shapes."""

from __future__ import annotations

import pytest
from hypothesis import given

from pcgopt.sbp import SBP, SBPError, sbp_of
from pcgopt.shapes import ParallelTensorShape
from pcgopt.testing.strategies import parallel_shapes


@given(parallel_shapes())
def test_a_shape_read_as_sbp_builds_the_same_shape_back(shape: ParallelTensorShape):
    signature = sbp_of(shape)
    assert signature.shape(shape.sizes, shape.dtype) == shape
    assert signature.num_devices == shape.num_shards
    assert SBP.parse(repr(signature).removeprefix("SBP")) == signature


def test_autoddl_figure_6_matmul_signatures():
    # p = 2 x 2 x 2 devices; I (S0, B, S1) @ W (B, S1, S0) = O (S0, S1, P), then ReduceScatter.
    i = SBP.parse("(S0:2, B:2, S1:2)").shape((8, 8))
    w = SBP.parse("(B:2, S1:2, S0:2)").shape((8, 8))
    o = SBP.parse("(S0:2, S1:2, P:2)").shape((8, 8))
    assert repr(i) == repr(w) == "f32[8/2, 8/2] r2"
    assert repr(o) == "f32[8/2, 8/2] r2(partial)"
    assert sbp_of(o) == SBP((("S0", 2), ("S1", 2), ("P", 2)))


def test_tuple_degrees_are_parallelism_matrix_rows():
    # AutoDDL section 4.2: 2 nodes of 4 GPUs.
    s = SBP.parse("(S0:(1, 2), B:(2, 2))")
    assert s.axes == (2, 4) and s.rows == ((1, 2), (2, 2)) and s.num_devices == 8
    assert repr(s) == "SBP(S0:(1, 2), B:(2, 2))"
    assert SBP.parse("(S0:2, B:4)").placed([(1, 2), (2, 2)]) == s
    assert repr(s.shape((6, 3))) == "f32[6/2, 3] r4"


def test_bad_signatures_are_refused_with_the_reason():
    with pytest.raises(SBPError, match="cannot parse SBP"):
        SBP.parse("S0:2")
    with pytest.raises(SBPError, match="state must be S<dim>, B or P"):
        SBP((("X", 2),))
    with pytest.raises(SBPError, match="S2 splits dimension 2, but the tensor has 2"):
        SBP.parse("(S2:2)").shape((4, 4))
    with pytest.raises(SBPError, match="does not fit sizes"):
        SBP.parse("(S0:3)").shape((4, 4))
    with pytest.raises(SBPError, match="either every degree is a tuple"):
        SBP.parse("(S0:(1, 2), B:2)")
    with pytest.raises(SBPError, match="multiplies to 3"):
        SBP.parse("(S0:2, B:4)").placed([(1, 3), (2, 2)])
