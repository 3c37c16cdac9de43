"""Models written in plain JAX, as a JAX user writes them, for the JAX importer's tests and
benchmark (``pcgopt.frontend.jax.from_jax``): nothing here knows about pcgopt.

>>> params, tokens, targets = gpt_example(vocab=40, d=16, seq=8, batch=4)
>>> loss = gpt_loss(params, tokens, targets)
>>> loss.shape, bool(0 < loss < 10)
((), True)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["gpt_example", "gpt_loss", "layer_norm"]


def layer_norm(x: Any, g: Any, b: Any, eps: float = 1e-5) -> Any:
    """LayerNorm as Flax writes it: ``jnp.var``, and the scale folded into the reciprocal
    deviation."""
    mean, var = jnp.mean(x, -1, keepdims=True), jnp.var(x, -1, keepdims=True)
    return (x - mean) * (jax.lax.rsqrt(var + eps) * g) + b


def gpt_loss(p: dict, tokens: Any, targets: Any, heads: int = 2) -> Any:
    """A causal language model (GPT-2's blocks, the head tied to the embedding) and its
    cross-entropy: token ids in, the mean loss out."""
    b, s = tokens.shape
    d = p["wte"].shape[1]
    x = p["wte"][tokens] + p["wpe"][None, :s]
    causal = jnp.tril(jnp.ones((s, s), bool))

    def split(t: Any) -> Any:
        return t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)

    for i, blk in enumerate(p["blocks"]):
        with jax.named_scope(f"h{i}"):
            with jax.named_scope("attn"):
                h = layer_norm(x, *blk["ln1"]) @ blk["wqkv"] + blk["bqkv"]
                q, k, v = map(split, jnp.split(h, 3, -1))
                att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
                att = jnp.where(causal, att, -1e9)
                o = (jax.nn.softmax(att, -1) @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
                x = x + o @ blk["wo"] + blk["bo"]
            with jax.named_scope("mlp"):
                h = jax.nn.gelu(layer_norm(x, *blk["ln2"]) @ blk["w1"] + blk["b1"])
                x = x + h @ blk["w2"] + blk["b2"]
    logits = layer_norm(x, *p["lnf"]) @ p["wte"].T
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, targets[..., None], -1).mean()


def gpt_example(
    vocab: int = 40,
    d: int = 16,
    seq: int = 8,
    batch: int = 4,
    layers: int = 2,
    seed: int = 0,
) -> tuple[dict, Any, Any]:
    """Random parameters (scale 0.2, LayerNorm scales near 1) and random token ids and targets
    for :func:`gpt_loss`."""
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 16 * layers + 8))

    def n(*shape: int) -> Any:
        return 0.2 * jax.random.normal(next(keys), shape)

    def ln() -> tuple[Any, Any]:
        return (1 + n(d), n(d))

    blocks = [
        {"ln1": ln(), "wqkv": n(d, 3 * d), "bqkv": n(3 * d), "wo": n(d, d), "bo": n(d),
         "ln2": ln(), "w1": n(d, 4 * d), "b1": n(4 * d), "w2": n(4 * d, d), "b2": n(d)}
        for _ in range(layers)
    ]  # fmt: skip
    params = {"wte": n(vocab, d), "wpe": n(seq, d), "blocks": blocks, "lnf": ln()}
    tokens = jax.random.randint(next(keys), (batch, seq), 0, vocab)
    targets = jax.random.randint(next(keys), (batch, seq), 0, vocab)
    return params, tokens, targets
