"""Layer helpers for the model zoo: the usual framework layers, written with PCGBuilder ops.

Each helper makes its weights inside a builder scope named after the layer, so weight names
are stable and readable (``layer3/attn/q/w``).
"""

from __future__ import annotations

import math

from pcgopt.builder import PCGBuilder, Tensor


def dense(
    b: PCGBuilder,
    x: Tensor,
    out_features: int,
    *,
    name: str,
    activation: str = "none",
    bias: bool = True,
) -> Tensor:
    """A fully connected layer: Linear over the last dimension of ``x``."""
    with b.scope(name):
        w = b.weight((x.shape.sizes[-1], out_features), name="w")
        args = (x, w, b.weight((out_features,), name="b")) if bias else (x, w)
        return b.linear(*args, activation=activation, name="linear")  # type: ignore[return-value]


def mlp_stack(
    b: PCGBuilder,
    x: Tensor,
    widths: tuple[int, ...],
    *,
    name: str,
    activation: str = "relu",
    last_activation: str | None = None,
    bias: bool = True,
) -> Tensor:
    """Dense layers of the given widths; the last uses ``last_activation`` (default: the same)."""
    for i, width in enumerate(widths):
        last = i == len(widths) - 1
        act = activation if not last or last_activation is None else last_activation
        x = dense(b, x, width, name=f"{name}/fc{i}", activation=act, bias=bias)
    return x


def conv_bn(
    b: PCGBuilder,
    x: Tensor,
    out_channels: int,
    kernel: int | tuple[int, int],
    *,
    name: str,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    groups: int = 1,
    relu: bool = True,
) -> Tensor:
    """Conv2D (no bias) -> BatchNorm -> optional ReLU, the block of ResNeXt and Inception."""
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    c = x.shape.sizes[1]
    with b.scope(name):
        w = b.weight((out_channels, c // groups, kh, kw), name="w")
        y = b.conv2d(x, w, stride=stride, padding=padding, groups=groups, name="conv")
        stats = [b.weight((out_channels,), name=n) for n in ("scale", "shift")]
        stats += [b.weight((out_channels,), name=n, trainable=False) for n in ("mean", "var")]
        y = b.batch_norm(y, *stats, name="bn")
        return b.relu(y, name="relu") if relu else y  # type: ignore[return-value]


def layer_norm(b: PCGBuilder, x: Tensor, *, name: str) -> Tensor:
    h = x.shape.sizes[-1]
    with b.scope(name):
        gamma, beta = b.weight((h,), name="gamma"), b.weight((h,), name="beta")
        return b.layer_norm(x, gamma, beta, name="ln")  # type: ignore[return-value]


def self_attention(
    b: PCGBuilder, x: Tensor, heads: int, *, name: str, dropout: float = 0.1
) -> Tensor:
    """Multi-head self-attention on x [B, S, H]: per-head Q, K, V via reshape/transpose, scaled
    dot-product softmax, output projection. Returns [B, S, H] (before the residual)."""
    bsz, seq, hidden = x.shape.sizes
    if hidden % heads:
        raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
    hd = hidden // heads
    with b.scope(name):

        def project(tag: str, perm: tuple[int, ...]) -> Tensor:
            y = dense(b, x, hidden, name=tag)
            y = b.reshape(y, shape=(bsz, seq, heads, hd), name=f"{tag}_heads")
            return b.transpose(y, perm=perm, name=f"{tag}_t")

        q = project("q", (0, 2, 1, 3))  # [B, h, S, d]
        k = project("k", (0, 2, 3, 1))  # [B, h, d, S]
        v = project("v", (0, 2, 1, 3))  # [B, h, S, d]
        scores = b.batch_matmul(q, k, name="scores")
        scores = b.scale(scores, factor=1.0 / math.sqrt(hd), name="scaled")
        probs = b.dropout(
            b.softmax(scores, axis=-1, name="softmax"), rate=dropout, name="attn_drop"
        )
        ctx = b.batch_matmul(probs, v, name="context")  # [B, h, S, d]
        ctx = b.transpose(ctx, perm=(0, 2, 1, 3), name="context_t")
        ctx = b.reshape(ctx, shape=(bsz, seq, hidden), name="context_merged")
        return dense(b, ctx, hidden, name="out")


def transformer_layer(
    b: PCGBuilder,
    x: Tensor,
    *,
    heads: int,
    ffn: int,
    name: str,
    pre_norm: bool,
    dropout: float = 0.1,
) -> Tensor:
    """One Transformer layer: attention and a GELU feed-forward block, each with a residual.
    ``pre_norm``: LayerNorm before each block (GPT/Megatron) instead of after (BERT)."""
    hidden = x.shape.sizes[-1]
    with b.scope(name):
        h = layer_norm(b, x, name="ln1") if pre_norm else x
        a = b.dropout(
            self_attention(b, h, heads, name="attn", dropout=dropout), rate=dropout, name="drop1"
        )
        x = b.add(x, a, name="res1")
        if not pre_norm:
            x = layer_norm(b, x, name="ln1")
        h = layer_norm(b, x, name="ln2") if pre_norm else x
        f = dense(b, h, ffn, name="ffn1", activation="gelu")
        f = b.dropout(dense(b, f, hidden, name="ffn2"), rate=dropout, name="drop2")
        x = b.add(x, f, name="res2")
        if not pre_norm:
            x = layer_norm(b, x, name="ln2")
        return x
