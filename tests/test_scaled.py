"""Smaller instances of a model and its plan (pcgopt.scaled_down): the same graphs, sizes shrunk
consistently, so that the reference evaluator can check plans of full-size models."""

import inspect

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from pcgopt import (
    Machine,
    PCGBuilder,
    ScaleDownError,
    equivalent,
    evaluate,
    models,
    scaled_down,
)
from pcgopt.extract import data_parallel
from pcgopt.extract.strategies.baselines import megatron
from pcgopt.ops import OpKind
from pcgopt.render import forward_flops
from pcgopt.testing.strategies import sizes, small_pcgs

SUMMIT = Machine.preset("summit")  # one node, 6 GPUs


def _full_size(name: str):
    per_gpu = inspect.signature(models.ZOO[name].builder).parameters["batch"].default
    return models.build(name, batch=per_gpu * SUMMIT.num_devices)


def _elements(pcg) -> int:
    return sum(pcg.shape(n.name).numel for n in pcg.nodes if n.spec.kind is OpKind.SOURCE)


@pytest.mark.parametrize("name", ["mlp", "candle_uno", "dlrm", "xdl", "bert_large", "inception_v3"])
def test_full_size_models_and_their_baseline_plans_shrink_to_equivalent_small_instances(name):
    model = _full_size(name)
    plans = [data_parallel(model, SUMMIT), megatron(model, SUMMIT)]
    for plan in plans:
        small = scaled_down(model, plan)
        small_model, small_plan = small.pcgs
        # Far below full size, and small enough for the evaluator.
        assert forward_flops(model) > 2e9 or _elements(model) > 5e7
        assert forward_flops(small_model) < 2e9 and _elements(small_model) < 5e7
        assert [n.op for n in small_plan.nodes] == [n.op for n in plan.nodes]
        for node in plan.nodes:  # every split survives
            for before, after in zip(
                plan.output_shapes(node.name), small_plan.output_shapes(node.name), strict=True
            ):
                assert before.degrees == after.degrees
        assert equivalent(small_model, small_plan)


def test_a_plan_that_computes_something_else_is_caught_at_the_smaller_size():
    model = _full_size("mlp")
    plan = data_parallel(model, SUMMIT)
    # The same plan with two layers' weights exchanged: same shapes, another function.
    swap = {"branch0/fc1/w": "branch0/fc2/w", "branch0/fc2/w": "branch0/fc1/w"}
    wrong = plan.renamed({n.name: swap.get(n.name, n.name) for n in plan.nodes})
    small_model, small_wrong = scaled_down(model, wrong).pcgs
    assert not equivalent(small_model, small_wrong)
    assert equivalent(*scaled_down(model, plan).pcgs)


def test_what_reads_a_concatenation_takes_its_derived_size():
    b = PCGBuilder()
    parts = [b.input((64, 12), name="a"), b.input((64, 20), name="b"), b.input((64, 1), name="c")]
    y = b.matmul(b.concat(*parts, axis=1, name="cat"), b.weight((33, 16), name="w"))
    model = b.build(y)
    small = scaled_down(model, min_size=4)
    (pcg,) = small.pcgs
    assert [pcg.shape(x).sizes for x in ("a", "b", "c")] == [(4, 4), (4, 4), (4, 1)]
    assert pcg.shape("cat").sizes == (4, 9)
    assert pcg.shape("w").sizes == (9, 4)  # its rows follow the concatenation
    assert (33, 9) in small.sizes


def test_a_reshape_into_heads_keeps_its_runs():
    b = PCGBuilder()
    x = b.input((8, 32, 64), name="x")
    y = b.matmul(x, b.weight((64, 64), name="w"), name="y")
    heads = b.reshape(y, shape=(8, 32, 8, 8), name="h")
    model = b.build(b.reshape(b.relu(heads), shape=(8, 32, 64), name="back"))
    plan_b = PCGBuilder()
    px = plan_b.partition(plan_b.input((8, 32, 64), name="x"), dim=2, degree=2)
    w = plan_b.partition(plan_b.weight((64, 64), name="w"), dim=1, degree=2)
    ph = plan_b.reshape(
        plan_b.matmul(plan_b.all_gather(px, dim=2, degree=2), w), shape=(8, 32, 8, 8)
    )
    plan = plan_b.build(
        plan_b.combine(plan_b.reshape(plan_b.relu(ph), shape=(8, 32, 64)), dim=2, degree=2)
    )
    assert equivalent(model, plan)
    small_model, small_plan = scaled_down(model, plan).pcgs
    b_, s_, h_ = small_model.shape("y").sizes
    *_, nh, dh = small_model.shape("h").sizes
    assert h_ == nh * dh < 64 and b_ < 8 and s_ < 32  # the run [H] -> [heads, dh] multiplies out
    assert small_model.shape("back").sizes == (b_, s_, h_)
    assert small_plan.shape("x").sizes == small_model.shape("x").sizes
    assert equivalent(small_model, small_plan)


def test_a_fused_qkv_of_small_heads_keeps_its_parts_and_the_rest_shrinks():
    # q, k and v sliced out of one product, then split into 4 heads of 4: the heads cannot
    # shrink, so neither can the parts nor the product; batch and sequence do.
    b = PCGBuilder()
    x = b.input((8, 32, 16), name="x")
    qkv = b.matmul(x, b.weight((16, 48), name="w"), name="qkv")
    parts = [b.slice(qkv, axis=2, start=16 * k, stop=16 * (k + 1), name=f"p{k}") for k in range(3)]
    heads = [b.reshape(p, shape=(8, 32, 4, 4), name=f"h{k}") for k, p in enumerate(parts)]
    model = b.build(b.add(b.mul(heads[0], heads[1]), heads[2]))
    plan_b = PCGBuilder()
    px = plan_b.partition(plan_b.input((8, 32, 16), name="x"), dim=0, degree=2)
    pq = plan_b.matmul(px, plan_b.replicate(plan_b.weight((16, 48), name="w"), degree=2))
    pp = [plan_b.slice(pq, axis=2, start=16 * k, stop=16 * (k + 1)) for k in range(3)]
    ph = [plan_b.reshape(p, shape=(8, 32, 4, 4)) for p in pp]
    plan = plan_b.build(
        plan_b.combine(plan_b.add(plan_b.mul(ph[0], ph[1]), ph[2]), dim=0, degree=2)
    )
    small = scaled_down(model, plan)
    small_model, small_plan = small.pcgs
    assert small.kept == ()  # no node keeps all its dimensions
    assert small_model.shape("qkv").sizes[2] == 48 and small_model.shape("h0").sizes[2:] == (4, 4)
    assert small_model.shape("x").sizes[:2] == (4, 4)
    assert equivalent(small_model, small_plan)


def test_embedding_ids_are_drawn_below_the_new_table_size():
    model = _full_size("dlrm")
    small_model, _ = scaled_down(model, data_parallel(model, SUMMIT)).pcgs
    for node in small_model.nodes:
        if node.op == "embedding_bag":
            ids, table = node.inputs
            rows = small_model.shape(table).sizes[0]
            assert rows < 1_000_000
            assert small_model.node(ids.node).params["max_value"] <= rows


def test_ids_reshaped_before_their_lookup_are_drawn_below_the_new_table_size():
    b = PCGBuilder()
    ids = b.input((8, 16), "i64", name="ids", max_value=1000)
    flat = b.reshape(ids, shape=(128,))  # as the JAX importer lays out token ids
    model = b.build(b.embedding(flat, b.weight((1000, 32), name="table")))
    (small,) = scaled_down(model).pcgs
    assert small.node("ids").params["max_value"] <= small.shape("table").sizes[0] < 1000


def test_images_shrink_to_the_least_size_the_windows_fit():
    model = _full_size("inception_v3")  # 299 x 299 images; its windows need at least 75
    small = scaled_down(model, data_parallel(model, SUMMIT))
    small_model, small_plan = small.pcgs
    assert small_model.shape("image").sizes[2:] == (75, 75)
    conv = small_model.node("conv1a/conv")  # kernels, strides and paddings stay
    assert conv.params == model.node("conv1a/conv").params
    assert small_model.shape(conv.inputs[1]).sizes[2:] == model.shape(conv.inputs[1]).sizes[2:]
    assert "conv1a/conv" not in dict(small.kept)
    assert equivalent(small_model, small_plan)


def test_a_global_pooling_stays_global_and_groups_keep_their_number():
    model = _full_size("resnext50")
    small = scaled_down(model, data_parallel(model, SUMMIT))
    small_model, small_plan = small.pcgs
    assert small_model.shape("image").sizes[2:] < model.shape("image").sizes[2:]
    pool = "head/avgpool"
    assert (
        small_model.node(pool).params["kernel"]
        == small_model.shape(small_model.node(pool).inputs[0]).sizes[2:]
    )
    assert small_model.output_shapes(pool)[0].sizes[2:] == (1, 1)
    conv = "stage0/block0/conv2/conv"  # 32 groups of 4 channels become 32 groups of 1
    assert small_model.node(conv).params["groups"] == 32
    assert small_model.shape(small_model.node(conv).inputs[1]).sizes[:2] == (32, 1)
    assert small.kept == ()
    assert equivalent(small_model, small_plan)


def test_a_spatial_split_keeps_a_size_its_degree_divides():
    def pooled(split: bool):
        b = PCGBuilder()
        x = b.input((8, 4, 640, 640), name="image")
        if split:  # spatial parallelism: windows of 2 x 2 that do not overlap
            x = b.partition(x, dim=2, degree=4)
        y = b.pool2d(x, kernel=2, stride=2, mode="avg")
        return b.build(b.combine(y, dim=2, degree=4) if split else y)

    small = scaled_down(pooled(False), pooled(True))
    model, plan = small.pcgs
    height, width = model.shape("image").sizes[2:]
    assert height == 8  # 4 would leave 2 pooled rows, which 4 devices cannot split
    assert width < 640
    assert equivalent(model, plan)


def test_bad_arguments_are_named():
    model = _full_size("mlp")
    with pytest.raises(ScaleDownError, match="at least one PCG"):
        scaled_down()
    with pytest.raises(ScaleDownError, match="min_size must be a positive int"):
        scaled_down(model, min_size=0)
    with pytest.raises(ScaleDownError, match="max_rebuilds must be a non-negative int"):
        scaled_down(model, max_rebuilds=-1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    small_pcgs(
        max_ops=6,
        degrees=(2,),
        input_sizes=sizes(2, 2, st.sampled_from((8, 12, 16))),
    )
)
def test_any_pcg_shrinks_to_a_valid_pcg_with_the_same_operators_and_splits(pcg):
    try:
        small = scaled_down(pcg, min_size=2)
    except ScaleDownError:
        reject()  # no consistent smaller instance; hypothesis fails if that is most of them
    (shrunk,) = small.pcgs
    assert [(n.name, n.op, n.inputs) for n in shrunk.nodes] == [
        (n.name, n.op, n.inputs) for n in pcg.nodes
    ]
    for node in pcg.nodes:
        for before, after in zip(
            pcg.output_shapes(node.name), shrunk.output_shapes(node.name), strict=True
        ):
            assert before.degrees == after.degrees
            assert before.copy_degree == after.copy_degree
            assert all(a <= b for a, b in zip(after.sizes, before.sizes, strict=True))
    evaluate(shrunk)  # and the evaluator runs it


def test_a_plan_that_splits_the_heads_more_than_the_model_shrinks_with_it():
    # Megatron on a DGX-A100 splits BERT-Large's 16 heads 16 ways: the plan's heads stay 16
    # while nothing splits the model's; both reshape one hidden size [H] -> [heads, dh], so the
    # model's heads must stay 16 too.
    model = models.build("bert_large", batch=8)
    plan = megatron(model, Machine.preset("dgx-a100"))
    heads = "layer0/attn/q_heads"
    split = plan.shape(heads).degrees[2]
    assert split > 4  # above min_size: the plan alone would keep them
    small_model, small_plan = scaled_down(model, plan).pcgs
    assert small_model.shape(heads).sizes[2] == small_plan.shape(heads).sizes[2] == split
    assert equivalent(small_model, small_plan)


def test_a_normalized_dimension_keeps_the_size_of_its_input():
    # LayerNorm's signature leaves the normalized dimension out (it cannot be split), so its
    # output's hidden size is derived; it must join its input's class, or the hidden size of
    # the reshaped branch (heads * dh) and that of the other branch disagree at the add.
    b = PCGBuilder()
    back = b.reshape(
        b.relu(b.reshape(b.input((8, 8, 64), name="x"), shape=(8, 8, 8, 8))), shape=(8, 8, 64)
    )
    ln = b.layer_norm(back, b.weight((64,), name="g"), b.weight((64,), name="b"))
    other = b.layer_norm(
        b.input((8, 8, 64), name="z"), b.weight((64,), name="g2"), b.weight((64,), name="b2")
    )
    small = scaled_down(b.build(b.add(ln, other)))
    (pcg,) = small.pcgs
    assert small.kept == ()
    assert pcg.shape("x").sizes == pcg.shape("z").sizes == (4, 4, 16)  # 16: 4 heads of 4


def _attention(split: str, b_=16, s=128, d=256, heads=4):
    """One attention block whose q, k and v come out of one fused product, by a ``split`` or
    by three slices (as Megatron's plan and the ONNX importer lay them out)."""
    b = PCGBuilder()
    x = b.input((b_, s, d), name="x")
    qkv = b.matmul(x, b.weight((d, 3 * d), name="wqkv"), name="qkv")
    if split == "split":
        parts = b.split(qkv, axis=2, sizes=(d, d, d), name="parts")
    else:
        parts = [b.slice(qkv, axis=2, start=k * d, stop=(k + 1) * d) for k in range(3)]
    q, k, v = (
        b.transpose(
            b.reshape(t, shape=(b_, s, heads, d // heads), name=f"{n}_heads"), perm=(0, 2, 1, 3)
        )
        for n, t in zip("qkv", parts, strict=True)
    )
    att = b.softmax(b.batch_matmul(q, b.transpose(k, perm=(0, 1, 3, 2))), axis=3)
    o = b.reshape(b.transpose(b.batch_matmul(att, v), perm=(0, 2, 1, 3)), shape=(b_, s, d))
    return b.build(b.add(x, b.matmul(o, b.weight((d, d), name="wo"))))


@pytest.mark.parametrize("split", ["split", "slices"])
def test_a_fused_qkv_shrinks_as_the_sum_of_its_parts(split):
    # 4 heads of 64: each part shrinks with its heads (to 4 x 4), and the product and its
    # weight to the sum of the three; the plans (data parallel, and Megatron's slices of the
    # weight) shrink with them.
    model = _attention(split)
    for plan in (data_parallel(model, SUMMIT), megatron(model, SUMMIT)):
        small = scaled_down(model, plan)
        small_model, small_plan = small.pcgs
        assert small.kept == ()
        assert small_model.shape("q_heads").sizes[2:] == (4, 4)
        # (The residual's width is free: nothing ties it to the heads'.)
        assert small_model.shape("x").sizes == (4, 4, 4)
        assert small_model.shape("wqkv").sizes == small_plan.shape("wqkv").sizes == (4, 48)
        assert equivalent(small_model, small_plan)


def test_a_slice_that_is_not_an_equal_part_keeps_its_positions():
    b = PCGBuilder()
    x = b.input((64, 30), name="x")
    model = b.build(b.relu(b.slice(x, axis=1, start=4, stop=24, name="s")))
    (small,) = scaled_down(model).pcgs
    assert small.shape("x").sizes == (4, 30) and small.shape("s").sizes == (4, 20)
    assert small.node("s").params == model.node("s").params


def _mobilenet_block(split: bool):
    """A depthwise 3 x 3 convolution and a pointwise one with an activation (MobileNet's
    block), data parallel on 4 devices when ``split``."""
    b = PCGBuilder()
    x = b.input((32, 256, 28, 28), name="image")
    if split:
        x = b.partition(x, dim=0, degree=4)
    dw, pw = b.weight((256, 1, 3, 3), name="dw"), b.weight((512, 256, 1, 1), name="pw")
    if split:
        dw, pw = b.replicate(dw, degree=4), b.replicate(pw, degree=4)
    y = b.conv2d(x, dw, padding=(1, 1), groups=256, activation="relu", name="depthwise")
    y = b.conv2d(y, pw, activation="relu", name="pointwise")
    return b.build(b.combine(y, dim=0, degree=4) if split else y)


def test_depthwise_and_pointwise_convolutions_shrink_their_channels():
    # A depthwise convolution stays depthwise (its groups follow its channels); a pointwise
    # one ties its input channels in x and w (a contraction its signature leaves out, since
    # the activation forbids partial sums), and its kernel keeps its extent.
    small = scaled_down(_mobilenet_block(False), _mobilenet_block(True))
    small_model, small_plan = small.pcgs
    assert small.kept == ()
    assert small_model.shape("dw").sizes == (4, 1, 3, 3)
    assert small_model.node("depthwise").params["groups"] == 4
    assert small_model.shape("pw").sizes == (4, 4, 1, 1)
    assert small_model.shape("image").sizes[:2] == (4, 4)
    assert equivalent(small_model, small_plan)


def test_a_broadcast_takes_its_new_target_shape():
    # A position embedding broadcast over the batch (as BERT's and GPT-2's importers lay it
    # out): its target shape follows the batch and hidden sizes.
    b = PCGBuilder()
    x = b.input((64, 128, 256), name="x")
    pos = b.broadcast(b.weight((128, 256), name="pos"), shape=(64, 128, 256), name="bcast")
    model = b.build(b.add(x, pos))
    small = scaled_down(model)
    (pcg,) = small.pcgs
    assert small.kept == ()
    assert pcg.node("bcast").params["shape"] == pcg.shape("x").sizes == (4, 4, 4)
    evaluate(pcg)


def test_windows_bisect_below_the_full_size_when_doubling_reaches_it():
    # An 8 x 8 image under a 5 x 5 kernel: 2 and 4 are too small, doubling reaches 8 (the full
    # size); the least size that fits, 5, lies below it.
    b = PCGBuilder()
    x = b.input((16, 8, 8, 8), name="image")
    model = b.build(b.conv2d(x, b.weight((8, 8, 5, 5), name="w"), name="conv"))
    (pcg,) = scaled_down(model, min_size=2).pcgs
    assert pcg.shape("image").sizes[2:] == (5, 5)


def test_a_window_size_whose_sizes_hold_but_whose_graphs_do_not_build_is_passed_over(
    monkeypatch,
):
    # The search for the least window size asks only whether the sizes hold, then builds the
    # size found; if that build fails, it searches again building each size.
    from pcgopt import scaled

    attempt = scaled._Problem._attempt

    def fails_to_build_5(self, window_size=None, build=True):
        if build and window_size == 5:
            raise ScaleDownError("rebuilt graphs rejected (injected)")
        return attempt(self, window_size, build)

    monkeypatch.setattr(scaled._Problem, "_attempt", fails_to_build_5)
    b = PCGBuilder()
    x = b.input((16, 8, 8, 8), name="image")
    model = b.build(b.conv2d(x, b.weight((8, 8, 5, 5), name="w"), name="conv"))
    (pcg,) = scaled_down(model, min_size=2).pcgs
    assert pcg.shape("image").sizes[2:] == (6, 6)


def test_a_reshape_that_moves_the_heads_into_the_batch_shrinks_with_them():
    # PyTorch's attention: [S, B, H] -> [S, B * heads, H / heads], and back. The run moves the
    # factor heads from one dimension to the other; heads is no tensor's dimension, yet both
    # sides must agree on it.
    def attention(split: bool):
        b = PCGBuilder()
        x = b.input((16, 8, 64), name="x")
        if split:  # the batch over 2 devices
            x = b.partition(x, dim=1, degree=2)
        wq, wo = b.weight((64, 64), name="wq"), b.weight((64, 64), name="wo")
        if split:
            wq, wo = b.replicate(wq, degree=2), b.replicate(wo, degree=2)
        heads = b.reshape(b.matmul(x, wq, name="q"), shape=(16, 32, 16), name="heads")
        t = b.transpose(heads, perm=(1, 0, 2))
        att = b.softmax(b.batch_matmul(t, b.transpose(t, perm=(0, 2, 1))), axis=2)
        o = b.transpose(b.batch_matmul(att, t), perm=(1, 0, 2))
        y = b.matmul(b.reshape(o, shape=(16, 8, 64), name="back"), wo)
        return b.build(b.combine(y, dim=1, degree=2) if split else y)

    small = scaled_down(attention(False), attention(True))
    model, plan = small.pcgs
    assert small.kept == ()
    seq, batch, hidden = model.shape("q").sizes
    assert (seq, batch) == (4, 4) and hidden < 64
    _, batch_heads, head_dim = model.shape("heads").sizes
    assert batch_heads == batch * 4 and hidden == 4 * head_dim  # 4 heads on both sides
    assert equivalent(model, plan)


def test_parts_of_an_axis_keep_their_proportions_so_different_parts_stay_different():
    # Found in review: the model takes rows 16..32 of x, the plan rows 32..48 (the same shapes,
    # another function). Parts that shrank on their own made both the first of three equal
    # parts; so did two slices into quarters and halves.
    def split_part(sizes):
        b = PCGBuilder()
        parts = b.split(b.input((64, 8), name="x"), axis=0, sizes=sizes, name="s")
        return b.build(b.relu(parts[1], name="out"))

    def sliced(start, stop):
        b = PCGBuilder()
        x = b.input((64, 8), name="x")
        return b.build(b.relu(b.slice(x, axis=0, start=start, stop=stop, name="s"), name="out"))

    for model, plan in [
        (split_part((16, 16, 32)), split_part((32, 16, 16))),
        (sliced(16, 32), split_part((32, 16, 16))),
        (sliced(16, 32), sliced(32, 48)),
    ]:
        assert not equivalent(model, plan)
        assert not equivalent(*scaled_down(model, plan).pcgs)

    b = PCGBuilder()
    x = b.input((64, 8), name="x")
    quarter = b.slice(x, axis=0, start=0, stop=16, name="quarter")
    half = b.slice(x, axis=0, start=0, stop=32, name="half")
    (small,) = scaled_down(b.build(b.relu(quarter), b.relu(half))).pcgs
    rows = small.shape("x").sizes[0]
    assert small.shape("quarter").sizes[0] * 4 == small.shape("half").sizes[0] * 2 == rows


@pytest.mark.parametrize("moved", [False, True])
def test_a_size_factored_two_ways_keeps_its_size(moved):
    # Found in review: a model's 16 heads of 4 and a plan's 8 heads of 8, of one hidden size,
    # both became 4 x 4 once shrunk, and a softmax over groups of 4 passed for one over 8.
    def heads(count: int):
        b = PCGBuilder()
        x = b.input((4, 64), name="x")
        # [B, H] -> [B, heads, H / heads], or PyTorch's [B * heads, H / heads]
        shape = (4 * count, 64 // count) if moved else (4, count, 64 // count)
        y = b.softmax(b.reshape(x, shape=shape, name="r1"), name="sm")
        return b.build(b.reshape(y, shape=(4, 64), name="r2"))

    model, plan = heads(16), heads(8)
    assert not equivalent(model, plan)
    assert not equivalent(*scaled_down(model, plan).pcgs)
