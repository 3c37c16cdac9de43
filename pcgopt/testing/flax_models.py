"""Flax NNX modules for tests and benchmarks of the JAX importer (needs ``flax``).

Each is imported as a function of its state: ``graphdef, state = nnx.split(module)``, then
``from_jax(lambda s, *a: nnx.merge(graphdef, s)(*a), state, *args)``.

>>> import jax.numpy as jnp
>>> block = Block(16, 2, nnx.Rngs(0))
>>> block(jnp.ones((2, 5, 16))).shape
(2, 5, 16)
"""

from __future__ import annotations

from typing import Any

from flax import nnx

__all__ = ["Block", "Decoder", "masked_block_apply"]


class Block(nnx.Module):
    """A pre-norm Transformer block: multi-head attention (projection kernels of shape
    [d, heads, head_dim]) and a GELU MLP."""

    def __init__(self, d: int, heads: int, rngs: nnx.Rngs) -> None:
        self.norm1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=d, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, 4 * d, rngs=rngs)
        self.down = nnx.Linear(4 * d, d, rngs=rngs)

    def __call__(self, x: Any, mask: Any = None) -> Any:
        x = x + self.attn(self.norm1(x), mask=mask)
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class Decoder(nnx.Module):
    """NHWC convolutions (one strided), a transposed convolution, batch norm in inference and
    a classifier over the pooled features."""

    def __init__(self, rngs: nnx.Rngs, channels: int = 8, classes: int = 10) -> None:
        c = channels
        self.conv1 = nnx.Conv(3, c, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(c, c, (3, 3), strides=2, rngs=rngs)
        self.up = nnx.ConvTranspose(c, c // 2, (2, 2), strides=(2, 2), rngs=rngs)
        self.bn = nnx.BatchNorm(c // 2, use_running_average=True, rngs=rngs)
        self.head = nnx.Linear(c // 2, classes, rngs=rngs)

    def __call__(self, image: Any) -> Any:
        x = nnx.relu(self.conv2(nnx.relu(self.conv1(image))))
        return self.head(self.bn(self.up(x)).mean(axis=(1, 2)))


def masked_block_apply(block: Block) -> tuple[Any, Any]:
    """``(apply, state)``: ``apply(state, x, keep)`` runs ``block`` on ``x`` with the attention
    mask ``nnx.make_attention_mask(keep, keep)`` of the integer padding mask ``keep``."""
    graphdef, state = nnx.split(block)

    def apply(state: Any, x: Any, keep: Any) -> Any:
        return nnx.merge(graphdef, state)(x, mask=nnx.make_attention_mask(keep, keep))

    return apply, state
