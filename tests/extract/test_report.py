"""Plan.explain for a person (pcgopt.extract.search.report): layers named after the model's
paths, alike layers sharing a row, the strategy in words and SBP, idle devices said plainly,
identical node rows grouped, and a legend."""

import re

import pytest

from pcgopt import Machine
from pcgopt.extract.search.plan import mapped_plan
from pcgopt.extract.search.report import device_map, layer_of, layer_rows, strategy_words
from pcgopt.extract.strategies.baselines import data_parallel, megatron
from pcgopt.models import ZOO
from pcgopt.shapes import ParallelTensorShape

FOUR = Machine.preset("dgx-a100", devices_per_node=4)
SIX = Machine.preset("summit")


def test_a_layer_is_the_path_prefix_that_tells_the_blocks_apart():
    zoo = ["embed/lookup", "layer0/attn/q/linear", "layer1/ffn1/linear", "head/logits", "loss"]
    assert layer_of(zoo) == {
        "embed/lookup": "embed",
        "layer0/attn/q/linear": "layer0",
        "layer1/ffn1/linear": "layer1",
        "head/logits": "head",
        "loss": "loss",
    }
    # An imported model's paths share a root, and most nodes are in its encoder.
    onnx = [
        "/bert/embeddings/Add",
        *(f"/bert/encoder/layer.{k}/attention/self/{op}" for k in range(3) for op in "QKV"),
        "/pooler/dense/MatMul",
    ]
    layers = layer_of(onnx)
    assert layers["/bert/encoder/layer.2/attention/self/V"] == "bert/encoder/layer.2"
    assert layers["/bert/embeddings/Add"] == "bert/embeddings"
    assert layers["/pooler/dense/MatMul"] == "pooler"


def test_strategies_in_words():
    batch_split = ParallelTensorShape.of((64, 512), degrees=(4, 1))
    copied_weight = ParallelTensorShape.of((512, 512), copy_degree=4)
    assert strategy_words(batch_split, copied_weight) == "data parallel x4; weights copied"
    columns = ParallelTensorShape.of((64, 512), degrees=(1, 2), copy_degree=2)
    assert strategy_words(columns, ParallelTensorShape.of((512, 512), degrees=(1, 2))) == (
        "tensor parallel x2 (dim 1), replicated x2; weights split dim 1 x2"
    )
    # FSDP: the weight is read whole (gathered) but stored split.
    stored = ParallelTensorShape.of((512, 512), degrees=(4, 1))
    assert strategy_words(batch_split, copied_weight, stored) == (
        "data parallel x4; weights stored split dim 0 x4, gathered where used"
    )
    partial = ParallelTensorShape.of((64, 512), sum_degree=2)
    assert strategy_words(partial, None) == "reduction parallel x2 (partial sums)"
    assert strategy_words(ParallelTensorShape.of((64, 512)), None) == "one device"


def test_alike_layers_share_a_row_and_unlike_ones_do_not():
    model = ZOO["bert_large"].build(small=True, layers=3, batch=4)
    rows = layer_rows(mapped_plan(data_parallel(model, FOUR), FOUR), [n.name for n in model.nodes])
    labels = [r.label for r in rows]
    assert "layer0 .. layer2 (x3)" in labels, labels
    (layers,) = [r for r in rows if r.count == 3]
    assert layers.strategy.startswith("data parallel x4") and layers.devices == 4
    assert layers.sbp == "(S0:4)"
    assert dict(layers.collectives)["all_reduce"] > 0  # the weights' gradients
    # Megatron splits the attention and the feed-forward layers, not the embedding.
    rows = layer_rows(mapped_plan(megatron(model, FOUR), FOUR), [n.name for n in model.nodes])
    (layers,) = [r for r in rows if r.count == 3]
    assert "tensor parallel" in layers.strategy or "reduction parallel" in layers.strategy
    assert "embed" in [r.label for r in rows]


def test_explain_groups_identical_nodes_says_idle_devices_and_has_a_legend():
    model = ZOO["bert_large"].build(small=True, layers=3, batch=4)
    # Data parallelism on four of Summit's six GPUs.
    plan = mapped_plan(data_parallel(model, FOUR), SIX)
    text = plan.explain(max_rows=None)
    assert "uses 4 of 6 devices (2 left idle" in text
    assert "device map (a character per device, 6 in all: # used, . idle)" in text
    assert "  layer0 .. layer2 (x3)  ####.." in text
    assert re.search(r"layer\{0\.\.2\}/ffn1/w\.r4 \(x3\)", text), text
    assert "notation: a layout lists the device mesh's axes" in text
    # Each grouped row stands for three nodes: every node appears once in the table.
    rows = [line for line in text.splitlines() if re.match(r"\s+[\d.]+ (ms|µs|s)\s", line)]
    counts = [int(m.group(1)) if (m := re.search(r"\(x(\d+)\)", r)) else 1 for r in rows]
    shown = sum(c for r, c in zip(rows, counts, strict=True) if "layers" not in r)
    assert shown >= len([n for n in plan.pcg.nodes if n.op not in ("input",)]) - 5
    # A grouped row gives the group's total first (it is ordered by it), then each node's time.
    unit = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}
    totals = []
    for row, count in zip(rows, counts, strict=True):
        times = re.findall(r"([\d.]+) (s|ms|µs|ns)\s", row)
        total = float(times[0][0]) * unit[times[0][1]]
        if count > 1:
            each = float(times[1][0]) * unit[times[1][1]]
            assert total == pytest.approx(each * count, rel=1e-3), row
        totals.append(total)
    assert totals == sorted(totals, reverse=True)


def test_the_picture_draws_one_of_each_run_of_alike_layers():
    model = ZOO["bert_large"].build(small=True, layers=4, batch=4)
    plan = mapped_plan(data_parallel(model, FOUR), FOUR)
    whole, collapsed = plan.to_dot(collapse=False), plan.to_dot()
    assert '"layer3/ffn1/linear"' in whole and '"layer3/ffn1/linear"' not in collapsed
    assert '"layer0/ffn1/linear"' in collapsed
    box = '"box: layer1 .. layer3\\n(x3, as layer0)"'
    assert f"{box} [label=" in collapsed
    assert (
        f'"layer0/ln2/ln" -> {box}' in collapsed
        and f'{box} -> "head/transform/linear"' in collapsed
    )
    assert len(collapsed.splitlines()) < len(whole.splitlines()) / 2


def test_on_a_large_machine_the_device_map_has_a_character_per_node():
    model = ZOO["mlp"].build(small=True, batch=64)
    four_nodes = data_parallel(model, Machine.preset("summit", nodes=4))
    plan = mapped_plan(four_nodes, Machine.preset("summit", nodes=16))  # 96 GPUs, 24 used
    rows = layer_rows(plan, [n.name for n in model.nodes])
    lines = device_map(plan, rows)
    assert lines[0] == (
        "device map (a character per node of 6 devices, 16 in all: # all used, + some, . idle)"
    )
    used = sum(len(r.device_set) for r in rows[:1])
    cells = lines[1].split()[-1]
    assert len(cells) == 16 and set(cells) <= set("#+.") and "." in cells
    assert cells.count("#") * 6 <= used <= (cells.count("#") + cells.count("+")) * 6


def test_branches_run_at_once_count_every_device_they_use():
    # Unsplit DLRM on one Summit node: the mapping runs its embedding bags beside the bottom MLP,
    # each on a device of its own; every node spans one device.
    model = ZOO["dlrm"].build(small=True)
    plan = mapped_plan(model, SIX)
    offsets = plan.machine_mapping.offsets
    used = {offsets.get(n.name, 0) for n in model.nodes if n.op not in ("input", "weight")}
    assert plan.cost.devices_used == 1 and len(used) > 1
    assert f"uses {len(used)} of 6 devices ({6 - len(used)} left idle)" in plan.explain()


def test_the_headline_compares_with_the_fastest_baseline_that_fits():
    from dataclasses import replace

    from pcgopt.extract.search.report import headline

    plan = mapped_plan(data_parallel(ZOO["mlp"].build(small=True), FOUR), FOUR)
    time = plan.cost.total_s
    candidates = {"data parallel": time / 2, "zero-2": time, "input as given": time}
    stats = replace(plan.stats, candidates=candidates, infeasible=frozenset({"data parallel"}))
    line = headline(replace(plan, stats=stats))[1]
    assert "1x the best baseline (zero-2," in line, line
    # With nothing that fits, the fastest, said not to fit.
    stats = replace(stats, infeasible=frozenset({"data parallel", "zero-2"}))
    line = headline(replace(plan, stats=stats))[1]
    assert "(data parallel, " in line and "does not fit)" in line, line
