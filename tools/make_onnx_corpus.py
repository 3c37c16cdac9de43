#!/usr/bin/env python3
"""Export a small corpus of ONNX models from PyTorch, for testing an ONNX importer.

What it does
------------
Builds ten models from small configuration objects with *random* initialization (a fixed
seed; no pretrained weights are ever downloaded), puts them in ``eval()`` mode and exports each
with ``torch.onnx.export`` at opset 17, using the TorchScript-based exporter
(``dynamo=False``), which names every node after the module path it came from, e.g.
``/bert/encoder/layer.0/attention/self/query/MatMul``:

====================  ==========================================================================
name                  model
====================  ==========================================================================
bert                  transformers BertModel (hidden 64, 2 layers, 4 heads, FFN 128, vocab 100,
                      seq 16); input ``input_ids`` only; outputs last_hidden_state,
                      pooler_output
gpt2                  transformers GPT2LMHeadModel (n_embd 64, 2 layers, 4 heads, vocab 100,
                      seq 16, use_cache=False, tied LM head); input ``input_ids``; output logits
vit                   transformers ViTModel (image 32, patch 8, hidden 64, 2 layers, 4 heads);
                      input ``pixel_values``; outputs last_hidden_state, pooler_output
bart                  transformers BartModel (d_model 64, 2+2 layers, 4 heads, vocab 100,
                      encoder seq 16, decoder seq 8, use_cache=False); inputs ``input_ids``,
                      ``decoder_input_ids``; outputs last_hidden_state (decoder),
                      encoder_last_hidden_state
resnet                transformers ResNetModel (bottleneck, embedding 16, stages [32, 64],
                      depths [1, 1], image 32); outputs last_hidden_state, pooler_output
convnext              transformers ConvNextModel (patch 4, stages [16, 32], depths [1, 1],
                      image 32); outputs last_hidden_state, pooler_output
transformer_encoder   torch.nn.TransformerEncoder (2 layers, d_model 64, nhead 4, FFN 128,
                      batch_first=True, seq 16); input ``src`` (float); output ``output``
bert_masked           BertModel as ``bert``, given ``attention_mask`` (padded rows, int64 0/1)
                      and ``token_type_ids`` too: the padding mask's Cast/And/Where graph
conv_decoder          ``ConvDecoder`` (torch.nn): ConvTranspose2d (stride 2, output padding,
                      groups), nearest and bilinear Upsample, an asymmetric F.pad, a dilated
                      conv; input ``image`` [batch, 3, 8, 8]
moe                   ``TopTwoMoE`` (torch.nn): LayerNorm, a softmax router, torch.topk of two
                      experts, F.one_hot dispatch weights, four GELU experts; input ``tokens``
                      [batch, 8, 32]
====================  ==========================================================================

Choices that shape the graphs:

* Attention masks are *not* passed (only ids / pixels), except to ``bert_masked``, so the
  other graphs stay simple; what was passed is recorded in the manifest (``passed``).
* Hugging Face models use ``attn_implementation="eager"``: attention is the plain
  MatMul / Mul(scale) / [Add(causal mask), decoders only] / Softmax / MatMul pattern, not SDPA.
* For GPT-2, transformers' packed-sequence detection is patched out while tracing (see
  ``no_packed_sequence_detection()``): it uses ``torch.diff``, which has no ONNX export.
* ``torch.backends.mha`` fast path is switched off, so nn.TransformerEncoder is traced through
  its ordinary Python code (nn.MultiheadAttention, Linear, LayerNorm) instead of the fused
  ``_transformer_encoder_layer_fwd`` kernel.
* ``training=TrainingMode.PRESERVE`` with the model in eval(): the exporter's eval-mode
  peephole pass is skipped, so BatchNormalization is *kept* as its own node (not folded into
  the preceding Conv), while Dropout (a no-op in eval) still disappears. Constant folding is on.
* The batch dimension of every input and output is symbolic, named ``batch`` (via
  ``dynamic_axes``); every other dimension (sequence length, image size) is static (output
  dims the exporter could not infer are set from PyTorch's outputs, see ``fix_output_dims()``).
  The graph keeps the exporter's Shape / Gather / Unsqueeze / Concat arithmetic that computes
  Reshape targets from the runtime batch size.
* Each model is wrapped in a tiny nn.Module that holds it under a short attribute name (``bert``,
  ``gpt2``, ``vit``, ``bart``, ``resnet``, ``convnext``, ``encoder``), which becomes the first
  component of every node name, and returns a tuple of the outputs listed above.

For each model ``NAME`` it writes, in the output directory (default ``tests/data/onnx/``):

* ``NAME.onnx``: the model, weights inside the file;
* ``NAME.npz``: the example inputs (batch 2; keys = ONNX graph input names; integer ids are
  int64, as the exporter emits) and PyTorch's outputs for them (keys = ONNX graph output names);
* ``manifest.json``: NAME -> ``params`` (sum of ``p.numel()`` over ``model.parameters()``,
  tied weights counted once), ``inputs`` (name -> shape, the batch as ``"batch"``),
  ``input_dtypes``, ``outputs`` (names, in order), ``output_shapes``, ``batch_symbol``,
  ``opset``, ``passed`` (what was given to the model), ``exporter``, ``op_types`` (op_type ->
  count), ``nodes``, ``initializers``, ``initializer_elements``, ``initializer_sources``
  (initializer -> the PyTorch parameter it holds, see ``initializer_sources()``),
  ``output_dims_made_static`` (see ``fix_output_dims()``), ``config``, ``bytes``, ``seed``, and
  the torch / transformers / onnx versions; plus, when onnxruntime is installed, the largest
  absolute difference between onnxruntime and PyTorch on the batch-2 example
  (``ort_max_abs_err``) and on a fresh batch of 3 (``ort_max_abs_err_batch3``, which checks
  that the batch really is symbolic in the graph).

Before export every parameter gets small seeded noise (see ``perturb()``), so that no two
parameters are equal and the exporter does not merge them.

``--full DIR`` instead exports two full-size models (same format, manifest in DIR, sequence
length 128, random init): ``bert_base`` (the shapes of bert-base-uncased: 12 layers, hidden 768,
12 heads, FFN 3072, vocab 30522, ~110M parameters) and ``gpt2_small`` (GPT-2 124M: 12 layers,
n_embd 768, vocab 50257, LM head tied). These are ~0.4-0.6 GB each: not for the repository.

How to run it
-------------
PyTorch has no CPU build for Python 3.12 on the package index this project uses, so the
exporter runs in its own Python 3.11 virtualenv (pcgopt itself stays on 3.12 and needs none of
this: it only reads the files written here). Install torch *first*, pinned, so that pip never
resolves a bare ``torch`` requirement (which would pull the CUDA build, several GB)::

    python3.11 -m venv /work/corpus-venv      # e.g. /root/.pyenv/versions/3.11.7/bin/python3.11
    /work/corpus-venv/bin/pip install torch==2.13.0
    /work/corpus-venv/bin/pip install transformers onnx onnxruntime numpy onnxscript

(Versions used to make the committed corpus: torch 2.13.0+cpu, transformers 5.24.0,
onnx 1.23.2, onnxruntime 1.32.0, numpy 2.4.6, onnxscript 0.7.2 (only the dynamo exporter
needs onnxscript).)

Then, from the repository root::

    /work/corpus-venv/bin/python tools/make_onnx_corpus.py                 # all small models
    /work/corpus-venv/bin/python tools/make_onnx_corpus.py bert gpt2       # just these
    /work/corpus-venv/bin/python tools/make_onnx_corpus.py --full /tmp/onnx_full
    /work/corpus-venv/bin/python tools/make_onnx_corpus.py --list

Other options: ``--out DIR`` (default tests/data/onnx), ``--no-check`` (skip onnxruntime),
``--opset N`` (default 17), ``--exporter dynamo`` (use the torch.export-based exporter
instead, with ``--opset 18``: at 17 it exports at 18 and converts down, which leaves GPT-2's
Split invalid. Its node names are ``node_<op>_<n>``, the module path is kept in each node's
``metadata_props`` (``namespace``, ``pkg.torch.onnx.name_scopes``,
``pkg.torch.onnx.class_hierarchy``, ``pkg.torch.onnx.stack_trace``), the graph is much smaller
(no shape arithmetic) and carries value_info for every tensor, but its optimizer folds
BatchNormalization into Conv. Only for experiments: the committed corpus uses the TorchScript
exporter).

The output is deterministic for a given set of versions: every model is built right after
``torch.manual_seed(SEED)`` and its inputs come from a generator seeded the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn

SEED = 0
OPSET = 17
BATCH = 2
BATCH_SYMBOL = "batch"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "data" / "onnx"


class Wrapped(nn.Module):
    """Holds ``model`` as attribute ``attr`` and returns a tuple of named outputs.

    ``forward`` takes the inputs positionally, in the order of ``input_names``, and passes them
    to the model as keyword arguments (plus the fixed ``extra`` keyword arguments).
    """

    def __init__(self, attr, model, input_names, output_keys, extra=None):
        super().__init__()
        self.attr = attr
        setattr(self, attr, model)
        self.input_names = list(input_names)
        self.output_keys = list(output_keys)
        self.extra = dict(extra or {})

    def forward(self, *args):
        model = getattr(self, self.attr)
        out = model(**dict(zip(self.input_names, args, strict=True)), **self.extra)
        if isinstance(out, torch.Tensor):
            return out
        return tuple(out[k] for k in self.output_keys)


def _gen(seed_offset=0):
    g = torch.Generator().manual_seed(SEED + seed_offset)
    return g


def _ids(batch, seq, vocab, gen):
    return torch.randint(0, vocab, (batch, seq), dtype=torch.int64, generator=gen)


def _pixels(batch, channels, size, gen):
    return torch.randn(batch, channels, size, size, generator=gen)


# --- model builders ---------------------------------------------------------------------------
# Each returns a dict: module (the Wrapped model), make_inputs(batch, gen) -> {name: tensor},
# outputs (ONNX output names, in order), passed (what was passed to the model), config (a
# short description of the configuration) and, optionally, patch (a context manager to hold
# while computing the reference outputs and exporting).


def _hf_model(cls, config):
    config._attn_implementation = "eager"
    return cls(config)


def _bert_config(full=False):
    """(config, sequence length) of the BERT models: bert-base-uncased's shapes, or small."""
    from transformers import BertConfig

    if full:  # bert-base-uncased shapes
        cfg = BertConfig(
            vocab_size=30522,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
        )
        return cfg, 128
    cfg = BertConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=32,
    )
    return cfg, 16


def build_bert(full=False):
    from transformers import BertModel

    cfg, seq = _bert_config(full)
    model = _hf_model(BertModel, cfg)
    outputs = ["last_hidden_state", "pooler_output"]
    return dict(
        module=Wrapped("bert", model, ["input_ids"], outputs),
        make_inputs=lambda b, g: {"input_ids": _ids(b, seq, cfg.vocab_size, g)},
        outputs=outputs,
        passed="input_ids only (no attention_mask, no token_type_ids: the model uses ones / zeros)",
        config=cfg.to_diff_dict(),
    )


@contextlib.contextmanager
def no_packed_sequence_detection():
    """Make transformers' mask code skip its packed-sequence detection while tracing.

    With no attention mask, transformers 5's ``create_causal_mask`` calls
    ``masking_utils.find_packed_sequence_indices(position_ids)``, which uses ``torch.diff`` (no
    ONNX symbolic at opset 17) and, while tracing, always returns a tensor, so the graph would
    also carry a "same packed sequence" mask. Our position ids are always ``arange(seq)`` (one
    sequence per row), for which the function returns ``None`` outside tracing anyway; so this
    patch changes nothing numerically, it only keeps the traced causal mask plain.
    """
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    saved = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = saved


def build_gpt2(full=False):
    from transformers import GPT2Config, GPT2LMHeadModel

    if full:  # GPT-2 small, 124M
        cfg = GPT2Config(
            vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, use_cache=False
        )
        seq = 128
    else:
        cfg = GPT2Config(
            vocab_size=100,
            n_positions=32,
            n_embd=64,
            n_layer=2,
            n_head=4,
            use_cache=False,
            bos_token_id=99,
            eos_token_id=99,
        )
        seq = 16
    model = _hf_model(GPT2LMHeadModel, cfg)
    outputs = ["logits"]
    return dict(
        module=Wrapped("gpt2", model, ["input_ids"], outputs, extra={"use_cache": False}),
        make_inputs=lambda b, g: {"input_ids": _ids(b, seq, cfg.vocab_size, g)},
        outputs=outputs,
        passed="input_ids only (no attention_mask; use_cache=False, no past key values); "
        "transformers' packed-sequence detection is patched out while tracing",
        patch=no_packed_sequence_detection,
        config=cfg.to_diff_dict(),
    )


def build_vit():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    model = _hf_model(ViTModel, cfg)
    outputs = ["last_hidden_state", "pooler_output"]
    return dict(
        module=Wrapped("vit", model, ["pixel_values"], outputs),
        make_inputs=lambda b, g: {"pixel_values": _pixels(b, 3, 32, g)},
        outputs=outputs,
        passed="pixel_values (float32, NCHW)",
        config=cfg.to_diff_dict(),
    )


def build_bart():
    from transformers import BartConfig, BartModel

    cfg = BartConfig(
        vocab_size=100,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=32,
        use_cache=False,
    )
    model = _hf_model(BartModel, cfg)
    outputs = ["last_hidden_state", "encoder_last_hidden_state"]
    return dict(
        module=Wrapped(
            "bart", model, ["input_ids", "decoder_input_ids"], outputs, extra={"use_cache": False}
        ),
        make_inputs=lambda b, g: {
            "input_ids": _ids(b, 16, cfg.vocab_size, g),
            "decoder_input_ids": _ids(b, 8, cfg.vocab_size, g),
        },
        outputs=outputs,
        passed="input_ids (encoder, seq 16) and decoder_input_ids (decoder, seq 8); no masks; "
        "use_cache=False",
        config=cfg.to_diff_dict(),
    )


def build_resnet():
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(
        num_channels=3,
        embedding_size=16,
        hidden_sizes=[32, 64],
        depths=[1, 1],
        layer_type="bottleneck",
        hidden_act="relu",
    )
    model = ResNetModel(cfg)
    outputs = ["last_hidden_state", "pooler_output"]
    return dict(
        module=Wrapped("resnet", model, ["pixel_values"], outputs),
        make_inputs=lambda b, g: {"pixel_values": _pixels(b, 3, 32, g)},
        outputs=outputs,
        passed="pixel_values (float32, NCHW)",
        config=cfg.to_diff_dict(),
    )


def build_convnext():
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig(
        num_channels=3,
        patch_size=4,
        num_stages=2,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        image_size=32,
    )
    model = ConvNextModel(cfg)
    outputs = ["last_hidden_state", "pooler_output"]
    return dict(
        module=Wrapped("convnext", model, ["pixel_values"], outputs),
        make_inputs=lambda b, g: {"pixel_values": _pixels(b, 3, 32, g)},
        outputs=outputs,
        passed="pixel_values (float32, NCHW)",
        config=cfg.to_diff_dict(),
    )


def build_transformer_encoder():
    layer = nn.TransformerEncoderLayer(
        d_model=64, nhead=4, dim_feedforward=128, dropout=0.1, batch_first=True
    )
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return dict(
        module=Wrapped("encoder", model, ["src"], ["output"]),
        make_inputs=lambda b, g: {"src": torch.randn(b, 16, 64, generator=g)},
        outputs=["output"],
        passed="src (float32, [batch, 16, 64]); no mask",
        config=dict(
            d_model=64,
            nhead=4,
            dim_feedforward=128,
            num_layers=2,
            batch_first=True,
            activation="relu",
            norm_first=False,
        ),
    )


def build_bert_masked():
    from transformers import BertModel

    cfg, seq = _bert_config()  # two token types, the default
    model = _hf_model(BertModel, cfg)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    outputs = ["last_hidden_state", "pooler_output"]

    def make_inputs(b, g):
        # Padded sequences: row r keeps its first lengths[r] tokens (at least one), a second
        # segment from a random point on.
        lengths = torch.randint(seq // 2, seq + 1, (b,), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)
        starts = torch.randint(1, seq, (b,), generator=g)
        types = (torch.arange(seq)[None, :] >= starts[:, None]).to(torch.int64)
        return {"input_ids": _ids(b, seq, cfg.vocab_size, g), "attention_mask": mask,
                "token_type_ids": types}  # fmt: skip

    return dict(
        module=Wrapped("bert", model, names, outputs),
        make_inputs=make_inputs,
        outputs=outputs,
        passed="input_ids, attention_mask (padded rows: int64 0/1) and token_type_ids",
        config=cfg.to_diff_dict(),
    )


class ConvDecoder(nn.Module):
    """An image decoder in plain torch.nn: transposed convolutions, nearest and bilinear
    upsampling, an asymmetric pad and a dilated convolution (as U-Nets, segmentation heads and
    GAN generators use them)."""

    def __init__(self, channels=8):
        super().__init__()
        c = channels
        self.stem = nn.Conv2d(3, c, 3, stride=2, padding=1)
        self.up1 = nn.ConvTranspose2d(c, c, 3, stride=2, padding=1, output_padding=1)
        self.up2 = nn.Upsample(scale_factor=2, mode="nearest")
        self.mix = nn.Conv2d(c, c, 2)  # an even kernel: the pad below keeps the size
        self.atrous = nn.Conv2d(c, c, 3, padding=2, dilation=2)
        self.up3 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.head = nn.ConvTranspose2d(c, 2, 4, stride=2, padding=1, groups=2)

    def forward(self, image):
        h = torch.relu(self.stem(image))
        h = torch.relu(self.up1(h))
        h = self.up2(h)
        h = self.mix(nn.functional.pad(h, (0, 1, 0, 1)))
        h = torch.relu(self.atrous(h)) + h
        return self.head(self.up3(h))


def build_conv_decoder():
    return dict(
        module=Wrapped("decoder", ConvDecoder(), ["image"], ["output"]),
        make_inputs=lambda b, g: {"image": _pixels(b, 3, 8, g)},
        outputs=["output"],
        passed="image (float32, [batch, 3, 8, 8])",
        config=dict(channels=8, image=8),
    )


class TopTwoMoE(nn.Module):
    """A mixture-of-experts layer in plain torch.nn with GShard-style dense dispatch: a softmax
    router picks each token's two best experts (torch.topk), whose one-hot rows (F.one_hot)
    weight the experts' outputs."""

    def __init__(self, d=32, experts=4, ffn=64):
        super().__init__()
        self.experts_n = experts
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d)) for _ in range(experts)
        )

    def forward(self, tokens):
        x = tokens
        h = self.norm(x)
        probs = self.router(h).softmax(-1)
        top, chosen = probs.topk(2, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        onehot = nn.functional.one_hot(chosen, self.experts_n).to(x.dtype)
        gates = (onehot * top[..., None]).sum(-2)
        out = x
        for e, expert in enumerate(self.experts):
            out = out + gates[..., e : e + 1] * expert(h)
        return out


def build_moe():
    return dict(
        module=Wrapped("moe", TopTwoMoE(), ["tokens"], ["output"]),
        make_inputs=lambda b, g: {"tokens": torch.randn(b, 8, 32, generator=g)},
        outputs=["output"],
        passed="tokens (float32, [batch, 8, 32])",
        config=dict(d=32, experts=4, ffn=64, top=2, sequence=8),
    )


SMALL = {
    "bert": build_bert,
    "bert_masked": build_bert_masked,
    "conv_decoder": build_conv_decoder,
    "moe": build_moe,
    "gpt2": build_gpt2,
    "vit": build_vit,
    "bart": build_bart,
    "resnet": build_resnet,
    "convnext": build_convnext,
    "transformer_encoder": build_transformer_encoder,
}
FULL = {
    "bert_base": lambda: build_bert(full=True),
    "gpt2_small": lambda: build_gpt2(full=True),
}


# --- export -----------------------------------------------------------------------------------


def _versions():
    import onnx

    v = {"torch": torch.__version__, "onnx": onnx.__version__}
    try:
        import transformers

        v["transformers"] = transformers.__version__
    except ImportError:
        v["transformers"] = None
    return v


def _export(module, inputs, outputs, path, exporter, opset):
    names = list(inputs)
    args = tuple(inputs.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            axes = {n: {0: BATCH_SYMBOL} for n in names + outputs}
            torch.onnx.export(
                module,
                args,
                str(path),
                dynamo=False,
                opset_version=opset,
                input_names=names,
                output_names=outputs,
                dynamic_axes=axes,
                do_constant_folding=True,
                training=torch.onnx.TrainingMode.PRESERVE,
            )
        else:
            batch = torch.export.Dim(BATCH_SYMBOL, min=1, max=1024)
            shapes = (tuple({0: batch} for _ in names),)  # forward(*args): one tuple
            prog = torch.onnx.export(
                module,
                args,
                dynamo=True,
                opset_version=opset,
                input_names=names,
                output_names=outputs,
                dynamic_shapes=shapes,
                external_data=False,
            )
            prog.save(str(path), external_data=False)


def _ort_outputs(path, inputs):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    feeds = {k: v.numpy() for k, v in inputs.items()}
    return dict(zip(names, sess.run(None, feeds), strict=True))


def _torch_outputs(module, inputs, outputs):
    with torch.no_grad():
        out = module(*inputs.values())
    if isinstance(out, torch.Tensor):
        out = (out,)
    return {n: t.detach().numpy() for n, t in zip(outputs, out, strict=True)}


def _max_err(a, b):
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


def export_one(name, build, out_dir, exporter, opset, check, versions):
    import onnx

    torch.manual_seed(SEED)
    spec = build()
    module = spec["module"].eval()
    perturb(module)
    params = sum(p.numel() for p in module.parameters())
    inputs = spec["make_inputs"](BATCH, _gen())
    outputs = spec["outputs"]
    patch = spec.get("patch", contextlib.nullcontext)
    path = out_dir / f"{name}.onnx"
    with patch():
        ref = _torch_outputs(module, inputs, outputs)
        t0 = time.perf_counter()
        _export(module, inputs, outputs, path, exporter, opset)
        seconds = time.perf_counter() - t0

    model = onnx.load(str(path))
    graph = model.graph
    renamed = fix_output_dims(graph, ref)
    if renamed:
        onnx.save(model, str(path))
    onnx.checker.check_model(str(path))
    init_names = {i.name for i in graph.initializer}
    g_inputs = [i for i in graph.input if i.name not in init_names]

    def dims(vi):
        return [d.dim_param if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]

    def dtype(vi):
        return onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type).name

    onnx_inputs = [i.name for i in g_inputs]
    onnx_outputs = [o.name for o in graph.output]
    assert onnx_inputs == list(inputs), (onnx_inputs, list(inputs))
    assert onnx_outputs == outputs, (onnx_outputs, outputs)

    np.savez(out_dir / f"{name}.npz", **{k: v.numpy() for k, v in inputs.items()}, **ref)

    entry = {
        "params": params,
        "inputs": {i.name: dims(i) for i in g_inputs},
        "input_dtypes": {i.name: dtype(i) for i in g_inputs},
        "example_input_shapes": {k: list(v.shape) for k, v in inputs.items()},
        "outputs": onnx_outputs,
        "output_shapes": {o.name: dims(o) for o in graph.output},
        "example_output_shapes": {k: list(v.shape) for k, v in ref.items()},
        "batch_symbol": BATCH_SYMBOL,
        "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "exporter": f"torch.onnx.export(dynamo={exporter == 'dynamo'})",
        "passed": spec["passed"],
        "output_dims_made_static": renamed,
        "nodes": len(graph.node),
        "initializers": len(graph.initializer),
        "initializer_elements": sum(int(np.prod(i.dims)) for i in graph.initializer),
        "initializer_sources": initializer_sources(graph, module),
        "op_types": dict(sorted(Counter(n.op_type for n in graph.node).items())),
        "config": spec["config"],
        "bytes": path.stat().st_size,
        "seed": SEED,
        **versions,
    }
    if check:
        import onnxruntime

        entry["onnxruntime"] = onnxruntime.__version__
        entry["ort_max_abs_err"] = _max_err(ref, _ort_outputs(path, inputs))
        inputs3 = spec["make_inputs"](3, _gen(1))
        entry["ort_max_abs_err_batch3"] = _max_err(
            _torch_outputs(module, inputs3, outputs), _ort_outputs(path, inputs3)
        )
    return entry, seconds


def perturb(module):
    """Add seeded noise (std 0.02) to every parameter and to BatchNorm running statistics.

    Fresh models hold many *equal* tensors (every LayerNorm weight is all ones, every bias all
    zeros, every BatchNorm running_var all ones), and the TorchScript exporter deduplicates
    initializers by value: it would keep one and feed the others through Identity nodes, so
    unrelated parameters would look shared (tied) in the graph. Noise makes every tensor distinct;
    genuinely tied weights (GPT-2's LM head, BART's shared embedding) are one Parameter and
    stay tied.
    """
    g = _gen(1000)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.add_(torch.randn(b.shape, generator=g) * 0.02)
            elif name.endswith("running_var"):
                b.mul_(torch.exp(torch.randn(b.shape, generator=g) * 0.1))


def fix_output_dims(graph, ref):
    """Make the non-batch dims of graph outputs static, from PyTorch's outputs.

    Where the exporter's shape inference cannot follow a Reshape whose target shape is computed
    from the dynamic batch, it declares the output dims with invented symbols such as
    ``LayerNormalizationlast_hidden_state_dim_1``. The only symbolic dim should be the batch, so
    each such dim is replaced by its real size. Returns {output: {axis: old symbol}}.
    """
    renamed = {}
    for out in graph.output:
        shape = ref[out.name].shape
        for axis, d in enumerate(out.type.tensor_type.shape.dim):
            if axis > 0 and d.dim_param:
                renamed.setdefault(out.name, {})[axis] = d.dim_param
                d.dim_value = int(shape[axis])  # clears dim_param (a oneof)
    return renamed


def initializer_sources(graph, module):
    """Map each initializer to the PyTorch parameter or buffer it holds, matched by value.

    The exporter keeps parameter names for most initializers but constant-folds some, e.g. a
    Linear's ``weight.t()`` becomes a new initializer named ``onnx::MatMul_123``. The value is
    ``"NAME"`` for an exact copy, ``"NAME^T"`` for the transpose of a 2-D one, ``null`` when no
    parameter or buffer matches (a folded constant).
    """
    from onnx import numpy_helper

    index = {}
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        a = t.detach().contiguous().numpy()
        index.setdefault((a.dtype.str, a.shape, a.tobytes()), name)
        if a.ndim == 2:
            at = np.ascontiguousarray(a.T)
            index.setdefault((at.dtype.str, at.shape, at.tobytes()), name + "^T")
    out = {}
    for init in graph.initializer:
        a = np.ascontiguousarray(numpy_helper.to_array(init))
        out[init.name] = index.get((a.dtype.str, a.shape, a.tobytes()))
    return out


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return str(o)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("names", nargs="*", help="models to export (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    ap.add_argument(
        "--full",
        type=Path,
        metavar="DIR",
        help="export full-size bert_base and gpt2_small to DIR instead",
    )
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript")
    ap.add_argument(
        "--opset",
        type=int,
        default=OPSET,
        help=f"ONNX opset (default {OPSET}; the dynamo exporter wants >= 18)",
    )
    ap.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    ap.add_argument("--list", action="store_true", help="list model names and exit")
    a = ap.parse_args(argv)

    table = FULL if a.full else SMALL
    if a.list:
        print("small:", " ".join(SMALL), "\nfull: ", " ".join(FULL))
        return 0
    names = a.names or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(table)}")
    out_dir = a.full or a.out
    out_dir.mkdir(parents=True, exist_ok=True)

    torch.backends.mha.set_fastpath_enabled(False)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    versions = _versions()
    manifest_path = out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}

    failed = []
    for name in names:
        t0 = time.perf_counter()
        try:
            entry, seconds = export_one(
                name, table[name], out_dir, a.exporter, a.opset, not a.no_check, versions
            )
        except Exception as e:  # report and go on with the others
            failed.append(name)
            print(f"{name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        manifest[name] = entry
        err = entry.get("ort_max_abs_err")
        err3 = entry.get("ort_max_abs_err_batch3")
        print(
            f"{name}: {entry['params']:,} params, {entry['nodes']} nodes, "
            f"{entry['bytes'] / 1e6:.2f} MB, export {seconds:.1f} s, "
            f"total {time.perf_counter() - t0:.1f} s"
            + (f", ort max abs err {err:.2e} (batch 3: {err3:.2e})" if err is not None else "")
        )
        manifest_path.write_text(
            json.dumps(dict(sorted(manifest.items())), indent=1, default=_json_default) + "\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
