"""Transformer models: BERT-Large (Unity) and the GPT-style Transformer of AutoDDL."""

from __future__ import annotations

from pcgopt.builder import PCGBuilder, Tensor
from pcgopt.graph import PCG
from pcgopt.models.layers import dense, layer_norm, transformer_layer


def _embed(b: PCGBuilder, batch: int, seq: int, hidden: int, vocab: int) -> tuple[Tensor, Tensor]:
    """Token embedding plus a learned position embedding [S, H] (broadcast over the batch).
    Returns (embedded activations, token table)."""
    tokens = b.input((batch, seq), "i64", name="tokens", max_value=vocab)
    table = b.weight((vocab, hidden), name="embed/tokens")
    positions = b.weight((seq, hidden), name="embed/positions")
    x = b.add(b.embedding(tokens, table, name="embed/lookup"), positions, name="embed/sum")
    return x, table


def _tied_logits(b: PCGBuilder, x: Tensor, table: Tensor) -> Tensor:
    """Output logits with the token table as the (tied) output projection."""
    w_out = b.transpose(table, perm=(1, 0), name="head/tied_weight")  # [H, V]
    return b.matmul(x, w_out, name="head/logits")  # type: ignore[return-value]


def _loss(b: PCGBuilder, logits: Tensor) -> Tensor:
    """The mean of the logits: a stand-in for the cross-entropy loss (the same reduction of the
    logits to a scalar on the devices that hold them; labels are not modelled)."""
    return b.reduce_mean(logits, axes=tuple(range(logits.shape.rank)), name="loss")  # type: ignore[return-value]


def bert_large(
    *,
    batch: int = 4,
    seq: int = 512,
    hidden: int = 1024,
    layers: int = 24,
    heads: int = 16,
    ffn: int | None = None,
    vocab: int = 30522,
    dropout: float = 0.1,
    loss: bool = False,
) -> PCG:
    """BERT-Large (Devlin et al.): 24 post-LayerNorm layers, hidden 1024, 16 heads, FFN 4096,
    sequence 512, WordPiece vocabulary 30522, with the masked-LM head (dense + GELU, LayerNorm,
    logits tied to the token embedding). Batch: Unity's per-GPU minibatch for BERT-Large, 4.
    Token-type embeddings are left out (two rows; no effect on the search). ``loss=True`` ends
    in the mean of the logits, as :func:`transformer`'s does (without it every plan brings the
    logits whole to one device)."""
    ffn = ffn or 4 * hidden
    b = PCGBuilder()
    x, table = _embed(b, batch, seq, hidden, vocab)
    x = layer_norm(b, x, name="embed/ln")
    x = b.dropout(x, rate=dropout, name="embed/drop")
    for i in range(layers):
        x = transformer_layer(
            b, x, heads=heads, ffn=ffn, name=f"layer{i}", pre_norm=False, dropout=dropout
        )
    h = dense(b, x, hidden, name="head/transform", activation="gelu")
    h = layer_norm(b, h, name="head/ln")
    return b.build(_loss(b, _tied_logits(b, h, table)) if loss else _tied_logits(b, h, table))


def transformer(
    *,
    batch: int = 1024,
    seq: int = 1024,
    hidden: int = 8192,
    layers: int = 8,
    heads: int = 64,
    ffn: int | None = None,
    vocab: int = 51200,
    dropout: float = 0.1,
    loss: bool = False,
) -> PCG:
    """AutoDDL's Transformer (section 5, Piz Daint): GPT-style pre-LayerNorm layers with model
    dimension 8192, 64 heads of dimension 128, batch 1024 sequences of 1024 tokens, 8 layers on 64
    nodes (20 and 44 on 128 and 256). Megatron-LM's sizes: FFN 4x hidden, vocabulary 51200,
    logits tied to the token embedding; 8 layers then hold 6.9 billion parameters (AutoDDL
    reports 6.8). ``loss=True`` ends in the mean of the logits, a stand-in for the
    cross-entropy loss (the same reduction of the logits to a scalar on the devices that hold
    them; labels are not modelled): without it the output is the logits, which every plan must
    bring whole to one device."""
    ffn = ffn or 4 * hidden
    b = PCGBuilder()
    x, table = _embed(b, batch, seq, hidden, vocab)
    x = b.dropout(x, rate=dropout, name="embed/drop")
    for i in range(layers):
        x = transformer_layer(
            b, x, heads=heads, ffn=ffn, name=f"layer{i}", pre_norm=True, dropout=dropout
        )
    x = layer_norm(b, x, name="final_ln")
    logits = _tied_logits(b, x, table)
    return b.build(_loss(b, logits) if loss else logits)
