"""Models that come in: the ONNX corpus imported, checked and optimized; full-size BERT-base and
GPT-2 imported and set beside the zoo's hand-built equivalents.

    python bench/frontend.py [--budget 20] [--batch 64] [--full DIR] [--only onnx|jax] [--write]

For each model of tests/data/onnx: ONNX nodes, PCG nodes, import time, the largest difference
of its outputs from PyTorch's (stored by tools/make_onnx_corpus.py) and from onnxruntime's, and
``saturate_and_extract`` on one DGX-A100 node (16 GPUs) with ``--budget`` seconds: the predicted
iteration time and the speedup over the best of the three baselines (data parallel, Megatron,
the better of the two after single-device fusion). ``--full DIR``: the full-size models that
``tools/make_onnx_corpus.py --full DIR`` exported (not committed: 1.1 GB).

JAX: GPT-style causal language models written in plain JAX and ending in their cross-entropy
(``pcgopt.testing.jax_models.gpt_loss``), traced by ``from_jax``: JAX equations, PCG nodes,
what was recognized, import time, the loss's difference from JAX's (batch 2), and the plan;
and two Flax NNX modules (``pcgopt.testing.flax_models``) the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from _results import check_kind, publish

from pcgopt import Machine
from pcgopt.extract.search.plan import saturate_and_extract
from pcgopt.frontend.onnx import from_onnx
from pcgopt.models import ZOO
from pcgopt.render import forward_flops

CORPUS = Path(__file__).parents[1] / "tests" / "data" / "onnx"
BASELINES = ("data parallel", "megatron", "fused, then data parallel or megatron")


def _max_err(got: dict, want: dict) -> float:
    return max(float(np.max(np.abs(got[k] - want[k]))) for k in got)


def _plan_cells(pcg, budget: float) -> str:
    start = time.perf_counter()
    plan = saturate_and_extract(pcg, Machine.preset("dgx-a100"), time_budget_s=budget)
    search_s = time.perf_counter() - start
    cands = plan.stats.candidates
    best_name = min((k for k in BASELINES if cands.get(k) is not None), key=lambda k: cands[k])
    # Whether the plan was checked against the model by the evaluator, or why not.
    checked = check_kind(plan.check)
    if checked == "skipped":
        checked += f" ({plan.check.split(':', 1)[1].strip()})"
    return (
        f"{plan.cost.total_s * 1e3:.3f} ms ({plan.stats.chosen}) | "
        f"{cands[best_name] * 1e3:.3f} ms ({best_name}) | "
        f"{cands[best_name] / plan.cost.total_s:.2f}x | {search_s:.1f} s | {checked} |"
    )


def corpus_rows(budget: float, batch: int) -> list[str]:
    import onnx
    import onnxruntime as ort

    manifest = json.loads((CORPUS / "manifest.json").read_text())
    rows = [
        "| model | ONNX nodes | PCG nodes | import | max err vs PyTorch | vs onnxruntime | "
        f"plan (batch {batch}) | best baseline | speedup | search | plan checked |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in sorted(manifest):
        entry = manifest[name]
        path = CORPUS / f"{name}.onnx"
        data = np.load(CORPUS / f"{name}.npz")
        example_batch = entry["example_input_shapes"][next(iter(entry["inputs"]))][0]
        start = time.perf_counter()
        m = from_onnx(path, dims={entry["batch_symbol"]: example_batch})
        import_s = time.perf_counter() - start
        feeds = {k: data[k] for k in m.inputs}
        got = m.run(feeds)
        err_torch = _max_err(got, {k: data[k] for k in got})
        session = ort.InferenceSession(str(path))
        ort_out = dict(zip(entry["outputs"], session.run(entry["outputs"], feeds), strict=True))
        err_ort = _max_err(got, ort_out)
        big = from_onnx(path, dims={entry["batch_symbol"]: batch})
        onnx_nodes = len(onnx.load(str(path)).graph.node)
        rows.append(
            f"| {name} | {onnx_nodes} | {len(m.pcg)} | {import_s * 1e3:.0f} ms | "
            f"{err_torch:.1e} | {err_ort:.1e} | {_plan_cells(big.pcg, budget)}"
        )
        print(rows[-1], file=sys.stderr)
    return rows


ZOO_TWINS = {
    # The zoo's hand-built model with the exported one's sizes.
    "bert_base": ("bert_large", {"hidden": 768, "layers": 12, "heads": 12, "seq": 128}),
    "gpt2_small": (
        "transformer",
        {"hidden": 768, "layers": 12, "heads": 12, "seq": 128, "vocab": 50257},
    ),
}


def full_rows(folder: Path, batch: int) -> list[str]:
    rows = [
        f"| model (batch {batch}, seq 128) | import | ONNX nodes | PCG nodes | parameters | "
        "forward FLOPs | zoo twin | its PCG nodes | its parameters | its FLOPs |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, (zoo_name, sizes) in ZOO_TWINS.items():
        start = time.perf_counter()
        m = from_onnx(folder / f"{name}.onnx", dims={"batch": batch})
        import_s = time.perf_counter() - start
        twin = ZOO[zoo_name].build(batch=batch, **sizes)
        twin_params = sum(
            int(np.prod(twin.shape(n.name).sizes)) for n in twin.weights if n.params["trainable"]
        )
        onnx_nodes = manifest[name].get("nodes", "?")
        twin_args = ", ".join(f"{k}={v}" for k, v in sizes.items())
        rows.append(
            f"| {name} | {import_s:.1f} s | {onnx_nodes} | {len(m.pcg)} | "
            f"{m.parameter_count:,} (PyTorch: {manifest[name]['params']:,}) | "
            f"{forward_flops(m.pcg) / 1e9:.1f} G | {zoo_name}({twin_args}) | "
            f"{len(twin)} | {twin_params:,} | {forward_flops(twin) / 1e9:.1f} G |"
        )
        print(rows[-1], file=sys.stderr)
    return rows


JAX_MODELS = {
    # name: gpt_example sizes, heads
    "gpt tiny (2 layers, d 64)": ({"vocab": 512, "d": 64, "seq": 128, "layers": 2}, 4),
    "gpt-2 small blocks (12 layers, d 768, vocab 2048)": (
        {"vocab": 2048, "d": 768, "seq": 128, "layers": 12},
        12,
    ),
}


def jax_rows(budget: float, batch: int) -> list[str]:
    import functools

    import jax

    from pcgopt.frontend.jax import from_jax
    from pcgopt.testing.jax_models import gpt_example, gpt_loss

    rows = [
        "| model | JAX equations | PCG nodes | recognized | parameters | import | "
        f"loss err vs JAX | plan (batch {batch}) | best baseline | speedup | search | "
        "plan checked |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, (sizes, heads) in JAX_MODELS.items():
        fn = functools.partial(gpt_loss, heads=heads)
        params, tokens, targets = gpt_example(batch=2, **sizes)
        start = time.perf_counter()
        m = from_jax(fn, params, tokens, targets)
        import_s = time.perf_counter() - start
        feeds = {"tokens": np.asarray(tokens), "targets": np.asarray(targets)}
        got = float(m.run(feeds)["output0"])
        err = abs(got - float(jax.jit(fn)(params, tokens, targets)))
        ops = [n.op for n in m.pcg.nodes]
        recognized = ", ".join(
            f"{ops.count(op)} {op}" for op in ("layer_norm", "softmax", "gelu", "linear")
        )
        big_params, big_tokens, big_targets = gpt_example(batch=batch, **sizes)
        big = from_jax(fn, big_params, big_tokens, big_targets)
        rows.append(
            f"| {name} | {m.stats['source_nodes']} | {len(m.pcg)} | {recognized} | "
            f"{m.parameter_count:,} | {import_s:.1f} s | {err:.1e} | "
            f"{_plan_cells(big.pcg, budget)}"
        )
        print(rows[-1], file=sys.stderr)
    return rows


def flax_rows(budget: float, batch: int) -> list[str]:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from pcgopt.frontend.jax import from_jax
    from pcgopt.testing.flax_models import Block, Decoder, masked_block_apply

    def block_case(b: int):
        apply, state = masked_block_apply(Block(512, 8, nnx.Rngs(0)))
        x = jax.random.normal(jax.random.PRNGKey(1), (b, 128, 512))
        lengths = jnp.arange(b) % 64 + 65  # padded rows: 65 to 128 tokens
        keep = (jnp.arange(128)[None, :] < lengths[:, None]).astype(jnp.int32)
        return apply, state, (x, keep)

    def decoder_case(b: int):
        graphdef, state = nnx.split(Decoder(nnx.Rngs(0), channels=64))
        image = jax.random.normal(jax.random.PRNGKey(2), (b, 32, 32, 3))
        return (lambda s, img: nnx.merge(graphdef, s)(img)), state, (image,)

    cases = {
        "Transformer block, padding mask (d 512, 8 heads, seq 128)": block_case,
        "NHWC decoder (convs, transposed conv, batch norm; 64 channels, 32x32)": decoder_case,
    }
    rows = [
        "| Flax NNX module | JAX equations | PCG nodes | parameters | import | "
        f"output err vs Flax | plan (batch {batch}) | best baseline | speedup | search | "
        "plan checked |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, case in cases.items():
        apply, state, args = case(2)
        start = time.perf_counter()
        m = from_jax(apply, state, *args)
        import_s = time.perf_counter() - start
        got = m.run(dict(zip(m.inputs, map(np.asarray, args), strict=True)))["output0"]
        err = float(np.max(np.abs(got - np.asarray(apply(state, *args)))))
        apply, state, args = case(batch)
        big = from_jax(apply, state, *args)
        rows.append(
            f"| {name} | {m.stats['source_nodes']} | {len(m.pcg)} | {m.parameter_count:,} | "
            f"{import_s:.1f} s | {err:.1e} | {_plan_cells(big.pcg, budget)}"
        )
        print(rows[-1], file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--full", type=Path, help="folder of make_onnx_corpus.py --full")
    parser.add_argument("--only", choices=("onnx", "jax"), help="one of the two sections")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    if args.only != "onnx":
        publish(
            "## Models that come in: JAX functions",
            [
                f"`python bench/frontend.py --budget {args.budget:g} --batch {args.batch} "
                "--only jax --write` (2-core CPU). GPT-style language models written in plain "
                "JAX and ending in their cross-entropy (`pcgopt.testing.jax_models`: token ids "
                "in, loss out; LayerNorm as Flax writes it, a causal `jnp.where` mask, the head "
                "tied to the embedding), imported by `from_jax`. Recognized: the operators that "
                "JAX wrote out and `fuse_patterns` found (the loss's log-softmax stays as "
                "written). Loss error: float64 evaluation of the PCG against JAX's float32 loss "
                "(batch 2, seq 128). Plans: one DGX-A100 node (16 A100), Adam; training on the "
                "real loss.",
                "",
                *jax_rows(args.budget, args.batch),
                "",
                "Flax NNX modules (`pcgopt.testing.flax_models`), imported as functions of "
                "their state (`nnx.split`, then `nnx.merge` inside the function); output error: "
                "float64 evaluation of the PCG against Flax's float32 output (batch 2).",
                "",
                *flax_rows(args.budget, args.batch),
            ],
            write=args.write,
        )
    if args.only == "jax":
        return
    lines = [
        f"`python bench/frontend.py --budget {args.budget:g} --batch {args.batch}"
        + (f" --full {args.full}" if args.full else "")
        + " --write` (2-core CPU). The corpus (tests/data/onnx) was exported by "
        "`tools/make_onnx_corpus.py` from transformers 5.24 and PyTorch 2.13 (TorchScript "
        "exporter, opset 17). Errors: the largest absolute difference over all outputs, "
        "float64 evaluation of the imported PCG against float32 PyTorch and onnxruntime, at the "
        "stored example inputs (batch 2). Plans: one DGX-A100 node (16 A100), Adam; speedup "
        "over the best baseline, all on pcgopt's cost model.",
        "",
        *corpus_rows(args.budget, args.batch),
    ]
    if args.full:
        lines += [
            "",
            "Full-size models (exported by `tools/make_onnx_corpus.py --full`, not committed), "
            "beside the zoo's hand-built equivalents. The exported BERT-base is `BertModel` "
            "(embeddings with token types, 12 layers, pooler; no masked-LM head); the zoo's "
            "`bert_large` has the masked-LM head with logits over the vocabulary and no pooler, "
            "hence its larger FLOPs. The exported GPT-2 is `GPT2LMHeadModel` (tied head).",
            "",
            *full_rows(args.full, 8),
        ]
    publish("## Models that come in: ONNX corpus and full-size imports", lines, write=args.write)


if __name__ == "__main__":
    main()
