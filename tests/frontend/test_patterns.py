"""Softmax and LayerNorm written out (as JAX programs and old ONNX exports write them) are
recognized as pcgopt's operators by what they compute, with their axis, eps, scale and shift;
anything that computes something else, or whose inner values are read elsewhere, stays as
written."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcgopt import PCGBuilder, evaluate
from pcgopt.frontend.patterns import fuse_patterns

RNG = np.random.default_rng(0)


class Program:
    """A PCGBuilder with scalar constants and random parameter values kept beside it."""

    def __init__(self):
        self.b = PCGBuilder()
        self.weights = {}

    def const(self, value):
        w = self.b.weight((1,), trainable=False, name=f"c{len(self.weights)}")
        self.weights[w.ref.node] = np.full((1,), value, np.float32)
        return w

    def param(self, shape, name):
        w = self.b.weight(shape, name=name)
        self.weights[name] = RNG.standard_normal(shape).astype(np.float32)
        return w

    def fused(self, out):
        pcg = self.b.build(out)
        fused, weights, count = fuse_patterns(pcg, self.weights)
        x = {n.name: RNG.standard_normal(n.params["shape"]) for n in pcg.inputs}
        want = evaluate(pcg, {**self.weights, **x}).outputs[0].logical()
        got = evaluate(fused, {**weights, **x}).outputs[0].logical()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        return fused, weights, count


def layer_norm_written_out(p, x, k, eps, form="textbook", gamma=None, beta=None):
    b, rank = p.b, x.shape.rank
    axes = tuple(range(rank - k, rank))
    mean = b.reduce_mean(x, axes=axes, keepdims=True)
    d = b.sub(x, mean)
    var = b.reduce_mean(b.pow(d, exponent=2.0), axes=axes, keepdims=True)
    if form == "textbook":  # (x - mean) / sqrt(var + eps) * g + b
        y = b.div(d, b.sqrt(b.add(var, p.const(eps))))
        if gamma is not None:
            y = b.mul(y, gamma)
    else:  # Flax: (x - mean) * (rsqrt(var + eps) * g) + b
        inv = b.rsqrt(b.add(var, p.const(eps)))
        y = b.mul(d, inv if gamma is None else b.mul(inv, gamma))
    return y if beta is None else b.add(y, beta)


def ops(pcg):
    return [n.op for n in pcg.nodes if n.op not in ("input", "weight")]


@pytest.mark.parametrize("form", ["textbook", "flax"])
def test_layer_norm_with_scale_and_shift_is_one_operator(form):
    p = Program()
    x = p.b.input((6, 5, 8), name="x")
    g, beta = p.param((8,), "g"), p.param((8,), "b")
    fused, weights, count = p.fused(layer_norm_written_out(p, x, 1, 1e-5, form, g, beta))
    assert ops(fused) == ["layer_norm"] and count == 1
    (ln,) = (n for n in fused.nodes if n.op == "layer_norm")
    assert [r.node for r in ln.inputs] == ["x", "g", "b"]
    assert ln.params["eps"] == pytest.approx(1e-5) and ln.params["normalized_dims"] == 1
    assert set(weights) == {"g", "b"}  # the eps constant is inside the operator now


def test_parameters_read_through_reshapes_are_the_scale_and_shift():
    # JAX broadcasts g to [1, 1, 8] before multiplying.
    p = Program()
    x = p.b.input((6, 5, 8), name="x")
    g = p.b.reshape(p.param((8,), "g"), shape=(1, 1, 8))
    beta = p.b.reshape(p.param((8,), "b"), shape=(1, 1, 8))
    fused, _, _ = p.fused(layer_norm_written_out(p, x, 1, 1e-6, "textbook", g, beta))
    assert ops(fused) == ["layer_norm"]


def test_layer_norm_without_scale_and_shift_gets_constant_ones_and_zeros():
    p = Program()
    x = p.b.input((4, 3, 8), name="x")
    fused, weights, _ = p.fused(layer_norm_written_out(p, x, 2, 1e-3))
    (ln,) = (n for n in fused.nodes if n.op == "layer_norm")
    assert ln.params["normalized_dims"] == 2
    gamma, beta = (weights[r.node] for r in ln.inputs[1:])
    assert np.all(gamma == 1) and np.all(beta == 0) and gamma.shape == (3, 8)
    assert not any(n.params["trainable"] for n in fused.weights)


@pytest.mark.parametrize("subtract_max", [True, False])
@pytest.mark.parametrize("axis", [1, 2])
def test_softmax_on_any_axis_is_one_operator(axis, subtract_max):
    p = Program()
    x = p.b.input((3, 6, 5), name="x")
    z = x
    if subtract_max:
        z = p.b.sub(x, p.b.reduce_max(x, axes=(axis,), keepdims=True))
    e = p.b.exp(z)
    fused, _, _ = p.fused(p.b.div(e, p.b.reduce_sum(e, axes=(axis,), keepdims=True)))
    assert ops(fused) == ["softmax"]
    assert next(n for n in fused.nodes if n.op == "softmax").params["axis"] == axis


def test_formulas_that_are_not_the_operators_stay_as_written():
    p = Program()
    x = p.b.input((4, 8), name="x")
    g = p.param((8,), "g")
    # RMSNorm: no mean is subtracted.
    ms = p.b.reduce_mean(p.b.pow(x, exponent=2.0), axes=(1,), keepdims=True)
    rms = p.b.mul(p.b.mul(x, p.b.rsqrt(p.b.add(ms, p.const(1e-6)))), g)
    # exp(x - max over one axis) / (sum of exp(x) over another).
    e = p.b.exp(p.b.sub(rms, p.b.reduce_max(rms, axes=(1,), keepdims=True)))
    y = p.b.div(e, p.b.reduce_sum(p.b.exp(rms), axes=(0,), keepdims=True))
    fused, _, count = p.fused(y)
    assert count == 0 and "layer_norm" not in ops(fused) and "softmax" not in ops(fused)


def test_a_layer_norm_whose_mean_is_read_elsewhere_stays_as_written():
    p = Program()
    x = p.b.input((4, 8), name="x")
    mean = p.b.reduce_mean(x, axes=(1,), keepdims=True)
    d = p.b.sub(x, mean)
    var = p.b.reduce_mean(p.b.pow(d, exponent=2.0), axes=(1,), keepdims=True)
    y = p.b.div(d, p.b.sqrt(p.b.add(var, p.const(1e-5))))
    fused, _, _ = p.fused(p.b.add(y, mean))  # fusing would lose the mean
    assert "layer_norm" not in ops(fused)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 6), min_size=2, max_size=4),
    k=st.integers(1, 2),
    eps=st.sampled_from([1e-12, 1e-6, 1e-5, 1e-3, 0.1]),
    form=st.sampled_from(["textbook", "flax"]),
    affine=st.booleans(),
)
def test_written_out_layer_norm_is_recognized_with_its_eps(sizes, k, eps, form, affine):
    k = min(k, len(sizes) - 1)
    p = Program()
    x = p.b.input(tuple(sizes), name="x")
    tail = tuple(sizes[-k:])
    g, beta = (p.param(tail, "g"), p.param(tail, "b")) if affine else (None, None)
    fused, _, count = p.fused(layer_norm_written_out(p, x, k, eps, form, g, beta))
    assert count == 1 and ops(fused) == ["layer_norm"]
    ln = next(n for n in fused.nodes if n.op == "layer_norm")
    assert ln.params["normalized_dims"] == k
    assert ln.params["eps"] == pytest.approx(np.float32(eps), rel=1e-6)
