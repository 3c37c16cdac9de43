"""JAX functions import as PCGs that compute what JAX computes, with weights named by their pytree
paths and nodes by JAX's name stack; unsupported primitives are listed in one error."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from pcgopt import FrontendError  # noqa: E402
from pcgopt.frontend.jax import from_jax  # noqa: E402

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
    "conv": (conv_net, {"k": _normal(6, (4, 3, 3, 3))}, _normal(7, (2, 3, 6, 6))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_function_computes_what_jax_computes(case):
    fn, params, x = CASES[case]
    m = from_jax(fn, params, x)
    got = m.run({"x": np.asarray(x)})["output0"]
    np.testing.assert_allclose(got, np.asarray(fn(params, x)), rtol=1e-5, atol=1e-5)
    assert m.parameter_count == sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(params))


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
