"""JAX functions import as PCGs that compute what JAX computes, with weights named by their pytree
paths and nodes by JAX's name stack; unsupported primitives are listed in one error."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from pcgopt import FrontendError  # noqa: E402
from pcgopt.frontend.jax import from_jax  # noqa: E402
from pcgopt.testing.jax_models import gpt_example, gpt_loss  # noqa: E402

KEYS = jax.random.split(jax.random.PRNGKey(0), 8)


def _normal(k, shape):
    return jax.random.normal(KEYS[k], shape, jnp.float32)


def mlp(params, x):
    for i, layer in enumerate(params["layers"]):
        with jax.named_scope(f"layer{i}"):
            x = jax.nn.gelu(x @ layer["w"] + layer["b"], approximate=i == 1)
    return jax.nn.relu(x)


def attention_block(p, x):
    b, s, d = x.shape
    heads = 2

    def split(t):
        return t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)

    with jax.named_scope("attn"):
        q, k, v = split(x @ p["wq"]), split(x @ p["wk"]), split(x @ p["wv"])
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(d / heads)
        o = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
        o = o.transpose(0, 2, 1, 3).reshape(b, s, d)
    with jax.named_scope("rmsnorm"):
        y = o * jax.lax.rsqrt(jnp.mean(o**2, axis=-1, keepdims=True) + 1e-6) * p["g"]
    return y + x


def conv_net(p, x):
    y = jax.lax.conv_general_dilated(x, p["k"], (1, 1), ((1, 1), (1, 1)))
    # An atrous (dilated) convolution, as in DeepLab's ASPP.
    y = jax.lax.conv_general_dilated(y, p["k2"], (1, 1), ((2, 2), (2, 2)), rhs_dilation=(2, 2))
    return jnp.mean(jax.nn.relu(y), axis=(2, 3))


CASES = {
    "mlp": (
        mlp,
        {
            "layers": [
                {"w": _normal(0, (8, 16)), "b": _normal(1, (16,))},
                {"w": _normal(2, (16, 4)), "b": _normal(3, (4,))},
            ]
        },
        _normal(4, (6, 8)),
    ),
    "attention": (
        attention_block,
        {**{n: _normal(k, (8, 8)) for k, n in enumerate(("wq", "wk", "wv"))}, "g": jnp.ones(8)},
        _normal(5, (2, 4, 8)),
    ),
    "conv": (
        conv_net,
        {"k": _normal(6, (4, 3, 3, 3)), "k2": _normal(5, (4, 4, 3, 3))},
        _normal(7, (2, 3, 6, 6)),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_function_computes_what_jax_computes(case):
    fn, params, x = CASES[case]
    m = from_jax(fn, params, x)
    got = m.run({"x": np.asarray(x)})["output0"]
    np.testing.assert_allclose(got, np.asarray(fn(params, x)), rtol=1e-5, atol=1e-5)
    assert m.parameter_count == sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(params))


def padded_attention(p, x, mask):
    scores = (x @ p["wq"]) @ (x @ p["wk"]).T
    return jax.nn.softmax(jnp.where(mask.astype(bool), scores, -jnp.inf), axis=-1)


def gated(p, x):
    m = jnp.logical_and(x > 0.1, ~(x < -0.5)) | (x == 0)
    return m.astype(jnp.float32) * jnp.pad(x @ p, ((1, 0), (0, 2)), constant_values=-1.0)[1:, :6]


def routed(p, x):
    # A router's top two, the argmax's row of a table, and columns gathered at the top one.
    top, chosen = jax.lax.top_k(x @ p["router"], 2)
    best = p["table"][jnp.argmax(x, axis=1)]
    return top.sum(-1, keepdims=True) + best + jnp.take(x, chosen[0], axis=1).sum()


def decoder(p, img):
    # Transposed conv (SAME), a strided conv with asymmetric SAME padding, nearest upsampling.
    dn = ("NCHW", "OIHW", "NCHW")
    y = jax.lax.conv_transpose(img, p["up"], (2, 2), "SAME", dimension_numbers=dn)
    y = jax.lax.conv_general_dilated(y, p["down"], (2, 2), "SAME", dimension_numbers=dn)
    return jax.image.resize(y, (*y.shape[:2], 2 * y.shape[2], 2 * y.shape[3]), "nearest")


OPERATOR_CASES = {
    "padding mask": (
        padded_attention,
        {"wq": _normal(0, (6, 4)), "wk": _normal(1, (6, 4))},
        _normal(2, (5, 6)),
        jnp.asarray([1, 1, 1, 0, 0], jnp.int32),
    ),
    "comparisons, logic and pad": (gated, _normal(3, (6, 6)), _normal(4, (3, 6))),
    "top_k, argmax and take": (
        routed,
        {"router": _normal(5, (6, 4)), "table": _normal(6, (6, 4))},
        _normal(7, (3, 6)),
    ),
    "transposed and SAME convolutions, upsampling": (
        decoder,
        {"up": _normal(0, (5, 3, 3, 3)), "down": _normal(1, (4, 5, 3, 3))},
        _normal(2, (2, 3, 4, 4)),
    ),
}


@pytest.mark.parametrize("case", sorted(OPERATOR_CASES))
def test_imported_operator_computes_what_jax_computes(case):
    fn, params, *args = OPERATOR_CASES[case]
    m = from_jax(fn, params, *args)
    got = m.run(dict(zip(m.inputs, map(np.asarray, args), strict=True)))["output0"]
    np.testing.assert_allclose(got, np.asarray(fn(params, *args)), rtol=1e-5, atol=1e-5)


def test_weights_are_named_by_pytree_path_and_nodes_by_name_stack():
    fn, params, x = CASES["mlp"]
    m = from_jax(fn, params, x)
    assert set(m.weights) == {"layers/0/w", "layers/0/b", "layers/1/w", "layers/1/b"}
    ops = {n.name: n.op for n in m.pcg.nodes}
    # x @ w + b is one dense layer; exact and tanh GELUs are recognized as themselves.
    assert ops["layer0/dot_general"] == "linear" and ops["layer1/dot_general"] == "linear"
    assert sorted(op for op in ops.values() if op.startswith("gelu")) == ["gelu", "gelu_erf"]


def test_unsupported_primitives_are_listed_together():
    def fn(p, x):
        return jnp.sort(x @ p["w"], axis=-1) + jnp.cumsum(x @ p["w"], axis=-1)

    with pytest.raises(FrontendError) as info:
        from_jax(fn, {"w": _normal(0, (8, 8))}, _normal(1, (2, 8)))
    assert {"sort", "cumsum"} <= set(info.value.unsupported)


def test_params_must_name_arguments():
    fn, params, x = CASES["mlp"]
    with pytest.raises(FrontendError, match="names argument"):
        from_jax(fn, params, x, params=3)


def test_a_language_model_ending_in_its_loss_imports_with_the_loss():
    params, tokens, targets = gpt_example()
    m = from_jax(gpt_loss, params, tokens, targets)
    feeds = {"tokens": np.asarray(tokens), "targets": np.asarray(targets)}
    got = m.run(feeds)["output0"]
    assert got.shape == () and abs(float(got) - float(gpt_loss(params, tokens, targets))) < 1e-5
    ops = [n.op for n in m.pcg.nodes]
    # Every LayerNorm and softmax JAX wrote out is one operator; the log-softmax of the loss
    # (not an operator of pcgopt) stays as written.
    assert ops.count("layer_norm") == 5 and ops.count("softmax") == 2
    assert ops.count("embedding") == 2  # the tokens' lookup and the targets' one-hot
    bounds = {n.name: n.params["max_value"] for n in m.pcg.inputs}
    assert bounds == {"tokens": 40, "targets": 40}
    assert m.parameter_count == sum(np.size(x) for x in jax.tree_util.tree_leaves(params))


def test_a_data_parallel_plan_of_the_loss_trains_as_jax_differentiates_it():
    from pcgopt.extract.search.plan import machine_from_spec
    from pcgopt.extract.strategies.baselines import data_parallel
    from pcgopt.lower.jax import lower

    params, tokens, targets = gpt_example()
    m = from_jax(gpt_loss, params, tokens, targets)
    plan = data_parallel(m.pcg, machine_from_spec("dgx-a100:1:4"))
    trainable = {n.name for n in m.pcg.weights if n.params["trainable"]}
    feeds = {"tokens": np.asarray(tokens), "targets": np.asarray(targets)}
    feeds.update({k: v for k, v in m.weights.items() if k not in trainable})
    loss, grads = lower(plan, 4).loss_and_grads(feeds, {k: m.weights[k] for k in trainable})
    want_loss, want_grads = jax.value_and_grad(gpt_loss)(params, tokens, targets)
    assert abs(float(loss) - float(want_loss)) < 1e-5
    flat = {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): g
            for path, g in jax.tree_util.tree_flatten_with_path(want_grads)[0]}  # fmt: skip
    assert set(flat) == set(grads)
    for name, g in flat.items():
        np.testing.assert_allclose(np.asarray(grads[name]), g, rtol=1e-4, atol=1e-5)


def test_one_hot_labels_are_a_lookup_in_the_identity():
    def loss(p, x, labels):
        logp = jax.nn.log_softmax(x @ p["w"], -1)
        return -(jax.nn.one_hot(labels, 5) * logp).sum(-1).mean()

    p, x = {"w": _normal(0, (8, 5))}, _normal(1, (6, 8))
    labels = jax.random.randint(KEYS[2], (6,), 0, 5)
    m = from_jax(loss, p, x, labels)
    got = m.run({"x": np.asarray(x), "labels": np.asarray(labels)})["output0"]
    assert abs(float(got) - float(loss(p, x, labels))) < 1e-5
    assert "embedding" in {n.op for n in m.pcg.nodes}


def test_integer_arithmetic_is_refused_and_a_cast_integer_is_a_mask():
    def halved(p, x, steps):
        return x @ p["w"] * (steps // 2).astype(jnp.float32)

    args = ({"w": _normal(0, (8, 8))}, _normal(1, (2, 8)), jnp.ones((2, 1), jnp.int32))
    with pytest.raises(FrontendError, match="of integer tensors"):
        from_jax(halved, *args)

    def masked(p, x, keep):
        # Products of integer masks (Flax's make_attention_mask) are exact in float.
        return x @ p["w"] * (keep * keep).astype(jnp.float32)

    m = from_jax(masked, *args)
    # An integer that is no index is a mask: checked plans draw it from {0, 1}.
    assert m.pcg.node("keep").params["max_value"] == 2
    assert {"cast", "mul"} <= {n.op for n in m.pcg.nodes}
    keep = np.asarray([[1], [0]], np.int32)
    got = m.run({"x": np.asarray(args[1]), "keep": keep})["output0"]
    np.testing.assert_allclose(got, masked(args[0], args[1], keep), rtol=1e-5, atol=1e-6)


def test_a_one_hot_too_large_for_an_identity_table_is_refused_clearly():
    from pcgopt.frontend.model import MAX_ONE_HOT_CLASSES

    n = MAX_ONE_HOT_CLASSES + 1

    def loss(logits, labels):
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1).mean()

    with pytest.raises(FrontendError) as info:
        from_jax(loss, jnp.zeros((2, n)), jnp.zeros((2,), jnp.int32), params=())
    assert "identity table" in str(info.value) and "gather" in info.value.unsupported
