"""Every compute operator's shard semantics agrees with its unsharded numpy semantics, for every
legal parallelization of its inputs (split axes, partial sums, copies)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcgopt import OPERATORS, OpKind, ShardedArray
from pcgopt.testing.strategies import _INSTANCES, COMPUTE_OPS, op_instances, parallelizations


def test_every_compute_operator_has_an_instance_strategy():
    assert set(_INSTANCES) == set(COMPUTE_OPS)


def _logical_inputs(instance, rng):
    values = []
    for shape in instance.inputs:
        if shape.dtype.is_integer:
            # indices into the table (the last input of an embedding)
            values.append(rng.integers(0, instance.inputs[-1].sizes[0], size=shape.sizes))
        elif instance.op == "batch_norm" and len(values) >= 3:
            values.append(rng.uniform(0.5, 1.5, size=shape.sizes))  # a variance
        else:
            values.append(rng.standard_normal(shape.sizes))
    return values


def _check_sharded_matches_reference(instance, parallel_inputs, seed):
    spec = instance.spec
    rng = np.random.default_rng(seed)
    values = _logical_inputs(instance, rng)
    expected = spec.reference(instance.params, *values)
    out_shapes = spec.infer(instance.params, parallel_inputs)
    sharded = tuple(
        ShardedArray.from_logical(v, s, rng) for v, s in zip(values, parallel_inputs, strict=True)
    )
    outs = spec.evaluate(instance.params, sharded, out_shapes)
    assert len(outs) == len(expected) == len(out_shapes)
    for out, exp, shape in zip(outs, expected, out_shapes, strict=True):
        assert out.shape == shape
        np.testing.assert_allclose(out.logical(), exp, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("op", COMPUTE_OPS)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_shard_semantics_agree_with_unsharded_semantics(op, data, seed):
    instance = data.draw(op_instances([op]), label="instance")
    parallel = data.draw(parallelizations(instance), label="parallel inputs")
    _check_sharded_matches_reference(instance, parallel, seed)


@pytest.mark.parametrize("op", COMPUTE_OPS)
@given(data=st.data())
def test_unpartitioned_inference_is_the_logical_shape(op, data):
    instance = data.draw(op_instances([op]))
    for out, logical in zip(
        instance.outputs(),
        instance.spec.infer_logical(instance.params, instance.inputs),
        strict=True,
    ):
        assert out == logical
        assert out.is_unpartitioned


def test_parallel_operators_are_not_in_the_compute_registry():
    assert all(OPERATORS[op].kind is OpKind.COMPUTE for op in COMPUTE_OPS)
    assert "partition" not in COMPUTE_OPS
