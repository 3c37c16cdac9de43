"""Flax NNX modules come in through from_jax: a module split into its graph and state, applied
by a function of the state, imports with its parameters named by their paths in the state and
computes what Flax computes (attention with a padding mask, NHWC convolutions, transposed
convolutions, batch norm in inference)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")
import jax.numpy as jnp  # noqa: E402

from pcgopt.frontend.jax import from_jax  # noqa: E402
from pcgopt.testing.flax_models import Block, Decoder, masked_block_apply  # noqa: E402


def test_an_attention_block_with_a_padding_mask_computes_what_flax_computes():
    apply, state = masked_block_apply(Block(16, 2, nnx.Rngs(0)))
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 16))
    keep = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.int32)
    m = from_jax(apply, state, x, keep)
    got = m.run({"x": np.asarray(x), "keep": np.asarray(keep)})["output0"]
    np.testing.assert_allclose(got, np.asarray(apply(state, x, keep)), rtol=1e-5, atol=1e-5)
    assert m.pcg.node("keep").params["max_value"] == 2  # a mask, drawn from {0, 1}
    # Parameters are named by their paths in the state, as Flax names them.
    assert {"attn/query/kernel", "attn/out/kernel", "up/kernel", "norm1/scale"} <= set(m.weights)
    assert m.parameter_count == sum(np.size(v) for v in jax.tree_util.tree_leaves(state))
    assert {"layer_norm", "softmax", "where", "linear"} <= {n.op for n in m.pcg.nodes}


def test_an_nhwc_decoder_computes_what_flax_computes():
    graphdef, state = nnx.split(Decoder(nnx.Rngs(0)))

    def apply(state, image):
        return nnx.merge(graphdef, state)(image)

    image = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 8, 3))
    m = from_jax(apply, state, image)
    got = m.run({"image": np.asarray(image)})["output0"]
    np.testing.assert_allclose(got, np.asarray(apply(state, image)), rtol=1e-5, atol=1e-5)
    convs = [n for n in m.pcg.nodes if n.op == "conv2d"]
    assert [n.params["input_dilation"] for n in convs] == [(1, 1), (1, 1), (2, 2)]
    # Batch norm's running statistics are buffers (weights without gradients), its scale and
    # shift parameters: the parameter count is Flax's count of nnx.Param.
    assert (
        not m.pcg.node("bn/var").params["trainable"] and m.pcg.node("bn/scale").params["trainable"]
    )
    params = nnx.state(Decoder(nnx.Rngs(0)), nnx.Param)
    assert m.parameter_count == sum(np.size(v) for v in jax.tree_util.tree_leaves(params))
