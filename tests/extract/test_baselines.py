"""The baselines: each is an equivalent parallel PCG of its input, costed by the same model;
Unity's data-parallel MNIST numbers; Megatron's layout; sequential optimization never worse."""

import pytest

import pcgopt
from pcgopt import Machine, PCGBuilder, models
from pcgopt.extract import BaselineError, iteration_cost
from pcgopt.extract.strategies.baselines import (
    data_parallel,
    fsdp,
    fuse,
    megatron,
    sequential,
    unity_figure_2b,
)

TWO_GPUS = Machine.preset("summit", nodes=1, devices_per_node=2)
SUMMIT_NODE = Machine.preset("summit")  # 6 GPUs
BASELINES = {
    "data_parallel": data_parallel,
    "fsdp": fsdp,
    "megatron": megatron,
    "sequential": sequential,
}
UNITY = ("mlp", "bert_large", "dlrm", "xdl", "candle_uno", "resnext50", "inception_v3")


def weight_sync_bytes(cost):
    """Bytes moved (over all devices) by the nodes that synchronize weight gradients: the
    Replicates of weights, whose only collective is that AllReduce."""
    return sum(
        n.comm_bytes
        for n in cost.per_node.values()
        if any(c.purpose == "weight sync" for c in n.collectives)
    )


def parallel_ops(pcg):
    return [n.op for n in pcg.nodes if pcg.node(n.name).spec.kind.name == "PARALLEL"]


# --- Equivalence on the zoo's small variants ------------------------------------------------------


@pytest.mark.parametrize("baseline", sorted(BASELINES))
@pytest.mark.parametrize("name", sorted(models.ZOO))
def test_every_baseline_is_equivalent_to_its_input(name, baseline):
    pcg = models.build(name, small=True)
    plan = BASELINES[baseline](pcg, TWO_GPUS)
    pcgopt.assert_equivalent(pcg, plan, trials=1)
    cost = iteration_cost(plan, TWO_GPUS)
    assert cost.devices_used <= TWO_GPUS.num_devices


@pytest.mark.parametrize("name", ["transformer", "mnist_mlp", "candle_uno", "vgg13"])
def test_hybrid_megatron_on_a_whole_node_is_equivalent(name):
    pcg = models.build(name, small=True, batch=6) if name != "vgg13" else None
    pcg = pcg or models.build(name, small=True, batch=3)
    for t in (2, 3):
        if t == 3 and name != "candle_uno":
            # No layer of theirs splits 3 ways: a plan under Megatron's name would only copy.
            with pytest.raises(BaselineError, match=r"nothing to split; degrees that do: 2$"):
                megatron(pcg, SUMMIT_NODE, tensor_degree=t)
            continue
        plan = megatron(pcg, SUMMIT_NODE, tensor_degree=t)
        pcgopt.assert_equivalent(pcg, plan, trials=1)
        assert iteration_cost(plan, SUMMIT_NODE).devices_used <= 6


# --- Data parallelism ---------------------------------------------------------------------------


def test_data_parallel_mnist_on_two_gpus_syncs_813056_elements_of_weight_gradients():
    pcg = models.build("mnist_mlp")  # Unity Figure 1: b = 64, 784 -> 512 -> 10
    plan = data_parallel(pcg, TWO_GPUS)
    assert plan.shape("x.split").degrees == (2, 1)
    assert plan.shape("w1.r2").copy_degree == 2 and plan.shape("w2.r2").copy_degree == 2
    cost = iteration_cost(plan, TWO_GPUS)
    assert weight_sync_bytes(cost) == 813_056 * 4
    # The rest is the Combine of the [64, 10] output (gather forward, scatter backward).
    assert cost.comm_bytes == 813_056 * 4 + 2 * (64 * 10 * 4) // 2


# --- Fully sharded data parallelism ---------------------------------------------------------------


def test_fsdp_stores_weights_sharded_gathers_them_where_used_and_reduce_scatters_gradients():
    pcg = models.build("mnist_mlp")  # b = 64, 784 -> 512 -> 10
    dp, sharded = data_parallel(pcg, TWO_GPUS), fsdp(pcg, TWO_GPUS)
    assert sharded.shape("w1.shard2").degrees == (2, 1)  # stored: one half per device
    assert sharded.shape("w1.gather2").copy_degree == 2  # gathered for the MatMul
    assert sharded.node("w2.gather2").params["dim"] == 0
    dp_cost, cost = iteration_cost(dp, TWO_GPUS), iteration_cost(sharded, TWO_GPUS)
    gather = cost.per_node["w1.gather2"].collectives
    assert [(c.kind, c.purpose) for c in gather] == [
        ("all_gather", "forward"),
        ("reduce_scatter", "backward"),
    ]
    # AllGather plus ReduceScatter move what the AllReduce did; weights, gradients and Adam's
    # state are halved, at the price of the gathered weights kept for the backward.
    assert cost.comm_bytes == dp_cost.comm_bytes
    for part in ("weights", "gradients", "optimizer_state"):
        assert getattr(cost.memory, part) * 2 == getattr(dp_cost.memory, part)
    assert weight_sync_bytes(cost) == 0


def test_fsdp_shards_the_most_ways_a_weight_allows_and_replicates_the_shards():
    # 6 GPUs, weights of 1024 rows: 2 ways divide it, 3 and 6 do not (HYBRID_SHARD's layout).
    b = PCGBuilder()
    x = b.input((12, 1024), name="x")
    pcg = b.build(b.relu(b.matmul(x, b.weight((1024, 1024), name="w"))))
    plan = fsdp(pcg, SUMMIT_NODE)
    assert plan.shape("w.shard2").degrees == (2, 1)
    assert plan.shape("w.r3").copy_degree == 3
    assert plan.shape("w.gather2").copy_degree == 6
    pcgopt.assert_equivalent(pcg, plan, trials=1)
    cost = iteration_cost(plan, SUMMIT_NODE)
    # The shards' copies synchronize their gradients: an AllReduce over 3 of each half.
    assert weight_sync_bytes(cost) > 0


def test_default_degree_is_the_largest_that_divides_the_batch_and_fits():
    pcg = models.build("mnist_mlp", small=True)  # batch 8, on 6 GPUs: 4
    plan = data_parallel(pcg, SUMMIT_NODE)
    assert plan.shape("x.split").degrees[0] == 4
    assert data_parallel(pcg, SUMMIT_NODE, degree=2).shape("x.split").degrees[0] == 2
    one = data_parallel(pcg, SUMMIT_NODE, degree=1)
    assert parallel_ops(one) == []
    pcgopt.assert_equivalent(pcg, one, compare="shards")


def test_every_input_is_split_by_batch_and_the_outputs_are_whole():
    pcg = models.build("dlrm", small=True)
    plan = data_parallel(pcg, TWO_GPUS)
    for node in pcg.inputs:
        assert plan.shape(f"{node.name}.split").degrees[0] == 2
    for ref in plan.outputs:
        assert plan.shape(ref).is_unpartitioned


# --- Megatron -----------------------------------------------------------------------------------


def test_megatron_mlp_is_column_then_row_parallel_with_one_all_reduce():
    plan = megatron(models.build("mnist_mlp"), TWO_GPUS)
    assert plan.shape("w1.tp").degrees == (1, 2)  # column-parallel: output columns
    assert plan.shape("w2.tp").degrees == (2, 1)  # row-parallel: contraction rows
    assert plan.node("matmul2").op == "all_reduce"
    cost = iteration_cost(plan, TWO_GPUS)
    assert weight_sync_bytes(cost) == 0  # no weight is replicated
    # Forward and backward AllReduce of the [64, 10] output, and the Broadcast/Reduce of x.
    kinds = sorted(c.kind for n in cost.per_node.values() for c in n.collectives)
    assert kinds.count("all_reduce") == 2


def test_megatron_splits_attention_heads_and_ffn():
    pcg = models.build("transformer", small=True)
    plan = megatron(pcg, TWO_GPUS)
    for proj in ("q", "k", "v"):
        assert plan.shape(f"layer0/attn/{proj}/w.tp").degrees == (1, 2)
    assert plan.shape("layer0/attn/scores").degrees[1] == 2  # heads
    assert plan.shape("layer0/attn/out/w.tp").degrees == (2, 1)
    assert plan.shape("layer0/ffn1/w.tp").degrees == (1, 2)
    assert plan.shape("layer0/ffn2/w.tp").degrees == (2, 1)
    assert plan.node("layer0/attn/out/linear.allreduce").op == "all_reduce"


def test_megatron_syncs_fewer_weight_bytes_than_data_parallel_on_a_transformer():
    pcg = models.build("transformer", small=True)
    dp = iteration_cost(data_parallel(pcg, TWO_GPUS), TWO_GPUS)
    mg = iteration_cost(megatron(pcg, TWO_GPUS), TWO_GPUS)
    assert 0 < weight_sync_bytes(mg) < weight_sync_bytes(dp)


def test_megatron_combines_tensor_and_data_parallelism():
    pcg = models.build("transformer", small=True, batch=6)
    plan = megatron(pcg, SUMMIT_NODE, tensor_degree=2)  # 3-way data parallel on the rest
    assert plan.shape("tokens.split").degrees == (3, 1)
    assert plan.shape("layer0/attn/q/w.r3").copy_degree == 3
    assert iteration_cost(plan, SUMMIT_NODE).devices_used == 6


def test_megatron_without_dense_pairs_is_data_parallel():
    pcg = models.build("resnext50", small=True)
    assert megatron(pcg, TWO_GPUS) == data_parallel(pcg, TWO_GPUS)


# --- Megatron with sequence parallelism ---------------------------------------------------------

FOUR_GPUS = Machine.preset("dgx-a100", nodes=1, devices_per_node=4)
# (model, sizes of its small variant, machine, tensor degree, the dimension split as sequence)
SEQUENCE_PARALLEL = [
    ("bert_large", {}, TWO_GPUS, 2, 1),
    ("transformer", {}, TWO_GPUS, 2, 1),
    ("bert_large", {"heads": 4}, FOUR_GPUS, 4, 1),
    ("transformer", {"heads": 4}, FOUR_GPUS, 4, 1),
    ("transformer", {"batch": 6}, SUMMIT_NODE, 2, 1),  # and 3-way data parallel
    ("candle_uno", {"batch": 6}, SUMMIT_NODE, 3, 0),  # [tokens, hidden]: tokens split
    ("mlp", {"layers_per_branch": 4, "batch": 6}, SUMMIT_NODE, 2, 0),
]


def column_parallel_layers(plan, degree):
    """Dense layers whose output is split by columns ``degree`` ways."""
    return [
        n
        for n in plan.nodes
        if n.op in ("linear", "matmul") and plan.shape(n.name).degrees[-1] == degree
    ]


@pytest.mark.parametrize(("name", "sizes", "machine", "tp", "dim"), SEQUENCE_PARALLEL)
def test_megatron_sequence_parallel_is_equivalent_to_its_input(name, sizes, machine, tp, dim):
    pcg = models.build(name, small=True, **sizes)
    plan = megatron(pcg, machine, tensor_degree=tp, sequence_parallel=True)
    assert "reduce_scatter" in parallel_ops(plan)
    pcgopt.assert_equivalent(pcg, plan, trials=1)
    assert iteration_cost(plan, machine).devices_used <= machine.num_devices


@pytest.mark.parametrize(("name", "sizes", "machine", "tp", "dim"), SEQUENCE_PARALLEL)
def test_megatron_sequence_parallel_reduce_scatters_every_row_parallel_sum(
    name, sizes, machine, tp, dim
):
    pcg = models.build(name, small=True, **sizes)
    plain = megatron(pcg, machine, tensor_degree=tp)
    plan = megatron(pcg, machine, tensor_degree=tp, sequence_parallel=True)
    all_reduces = [n.name for n in plain.nodes if n.op == "all_reduce"]
    scatters = [n for n in plan.nodes if n.op == "reduce_scatter"]
    assert all_reduces and "all_reduce" not in parallel_ops(plan)
    assert [n.name for n in scatters] == [
        a.replace(".allreduce", ".reducescatter") for a in all_reduces
    ]
    assert all(dict(n.params) == {"dim": dim, "degree": tp} for n in scatters)
    # What the sum feeds (bias, activation, dropout, residual) runs on the shard, no copies.
    for n in scatters:
        assert plan.shape(n.name).copy_degree == 1
        assert plan.shape(n.name).num_shards == plan.shape(n.inputs[0]).num_shards
    # Only column-parallel layers gather the sequence back: the operators between (a residual
    # add, a Concat of branches) split their other inputs alike.
    columns = {n.name for n in column_parallel_layers(plan, tp)}
    consumers = plan.consumers()
    for n in plan.nodes:
        if n.op == "all_gather":
            assert {user for user, _ in consumers[n.output()]} <= columns


@pytest.mark.parametrize(
    ("name", "sizes", "machine", "dim", "gathered", "copied"),
    [
        # 2 layers: Q, K, V (one input) and FFN1 each; the first layer's attention reads the
        # embeddings, which no row-parallel layer split.
        ("bert_large", {}, TWO_GPUS, 1, 3, 1),
        ("transformer", {}, TWO_GPUS, 1, 3, 1),
        # 2 branches of 4 layers: column, row, column, row; 3-way data parallel.
        ("mlp", {"layers_per_branch": 4, "batch": 6}, SUMMIT_NODE, 0, 2, 2),
    ],
)
def test_megatron_sequence_parallel_all_gathers_the_sequence_before_column_parallel_layers(
    name, sizes, machine, dim, gathered, copied
):
    pcg = models.build(name, small=True, **sizes)
    plain = megatron(pcg, machine, tensor_degree=2)
    plan = megatron(pcg, machine, tensor_degree=2, sequence_parallel=True)
    columns = column_parallel_layers(plan, 2)
    assert [n.name for n in columns] == [n.name for n in column_parallel_layers(plain, 2)]
    # Each column-parallel layer reads an AllGather of a sequence shard, except those after
    # no row-parallel layer: they read copies, as in plain Megatron.
    feeds = sorted({n.inputs[0].node for n in columns})
    ops = sorted(plan.node(f).op for f in feeds)
    assert ops == ["all_gather"] * gathered + ["replicate"] * copied
    gathers = [n for n in plan.nodes if n.op == "all_gather"]
    assert {n.name for n in gathers} < set(feeds)
    for n in gathers:
        assert dict(n.params) == {"dim": dim, "degree": 2}
        assert plan.shape(n.inputs[0]).copy_degree == 1 and plan.shape(n.name).copy_degree == 2
    # Plain Megatron's column-parallel layers read the AllReduce's copies: no gather.
    assert "all_gather" not in parallel_ops(plain)


@pytest.mark.parametrize("name", ["bert_large", "transformer"])
def test_megatron_sequence_parallel_stores_fewer_activations_for_the_same_communication(name):
    pcg = models.build(name, small=True)
    plain = megatron(pcg, TWO_GPUS)
    plan = megatron(pcg, TWO_GPUS, sequence_parallel=True)
    before, after = iteration_cost(plain, TWO_GPUS), iteration_cost(plan, TWO_GPUS)
    assert after.memory.activations < before.memory.activations
    assert after.memory.weights == before.memory.weights
    assert after.comm_bytes == pytest.approx(before.comm_bytes, rel=0.1)
    # An AllReduce is a ReduceScatter and an AllGather: the ReduceScatters move half its bytes
    # (forward and backward), the AllGathers before the next layers the other half.
    all_reduce = sum(
        before.per_node[n.name].comm_bytes for n in plain.nodes if n.op == "all_reduce"
    )
    reduce_scatter = sum(
        after.per_node[n.name].comm_bytes for n in plan.nodes if n.op == "reduce_scatter"
    )
    assert reduce_scatter * 2 == all_reduce


def test_megatron_sequence_parallel_needs_less_memory_for_bert_large_on_v100s():
    pcg = models.build("bert_large")  # sequence 512, hidden 1024, 24 layers
    machine = Machine.preset("summit", nodes=4)  # V100 16 GB
    plain = iteration_cost(megatron(pcg, machine), machine)
    sp = iteration_cost(megatron(pcg, machine, sequence_parallel=True), machine)
    assert sp.feasible and plain.feasible
    assert sp.memory_per_device < plain.memory_per_device
    assert sp.memory.activations < 0.8 * plain.memory.activations


@pytest.mark.parametrize(
    ("name", "sizes"),
    [("mnist_mlp", {"batch": 3}), ("transformer", {"seq": 3}), ("bert_large", {"seq": 5})],
)
def test_megatron_sequence_parallel_keeps_the_all_reduce_when_the_sequence_does_not_divide(
    name, sizes
):
    pcg = models.build(name, small=True, **sizes)  # 3 or 5 tokens on 2 GPUs
    plan = megatron(pcg, TWO_GPUS, sequence_parallel=True)
    assert "reduce_scatter" not in parallel_ops(plan)
    assert plan == megatron(pcg, TWO_GPUS)
    pcgopt.assert_equivalent(pcg, plan, trials=1)


def test_megatron_sequence_parallel_must_be_a_bool():
    mnist = models.build("mnist_mlp", small=True)
    for wrong in ("yes", 1, None):
        with pytest.raises(BaselineError, match=r"^sequence_parallel must be True or False"):
            megatron(mnist, TWO_GPUS, sequence_parallel=wrong)


# --- Sequential optimization --------------------------------------------------------------------


def test_fuse_makes_matmul_bias_and_relu_one_linear():
    b = PCGBuilder()
    x = b.input((8, 6), name="x")
    y = b.add(b.matmul(x, b.weight((6, 4), name="w"), name="mm"), b.weight((4,), name="bias"))
    pcg = b.build(b.relu(y, name="act"))
    fused = fuse(pcg)
    assert [n.op for n in fused.nodes if n.op not in ("input", "weight")] == ["linear"]
    assert fused.node("act").params["activation"] == "relu"
    pcgopt.assert_equivalent(pcg, fused, compare="shards")
    mnist = models.build("mnist_mlp", small=True)
    assert fuse(mnist).node("relu").op == "linear"
    pcgopt.assert_equivalent(mnist, fuse(mnist))


def test_fuse_leaves_a_matmul_read_twice():
    b = PCGBuilder()
    h = b.matmul(b.input((4, 4), name="x"), b.weight((4, 4), name="w"), name="mm")
    pcg = b.build(b.relu(h), b.gelu(h))
    assert fuse(pcg) == pcg


@pytest.mark.parametrize("name", [*UNITY, "transformer", "mnist_mlp"])
def test_sequential_is_never_worse_than_the_other_baselines(name):
    pcg = models.build(name, small=True)
    for machine in (TWO_GPUS, SUMMIT_NODE):
        best = iteration_cost(sequential(pcg, machine), machine)
        for other in (data_parallel, megatron):
            cost = iteration_cost(other(pcg, machine), machine)
            assert (not best.feasible, best.total_s) <= (not cost.feasible, cost.total_s * 1.000001)


# --- Errors -------------------------------------------------------------------------------------


def test_errors_name_the_node():
    b = PCGBuilder()
    pcg = b.build(b.relu(b.input((4, 3), name="a")), b.relu(b.input((2, 3), name="c")))
    with pytest.raises(BaselineError, match=r"node 'c' \(input\) has 2 rows .* 'a' has 4") as e:
        data_parallel(pcg, TWO_GPUS)
    assert e.value.node == "c" and isinstance(e.value, ValueError)

    b = PCGBuilder()
    pcg = b.build(b.scale(b.input((), name="s"), factor=2.0))
    with pytest.raises(BaselineError, match=r"node 's' \(input\) is a scalar"):
        megatron(pcg, TWO_GPUS)

    b = PCGBuilder()
    pcg = b.build(b.relu(b.weight((4,), name="w")))
    with pytest.raises(BaselineError, match="no data input"):
        sequential(pcg, TWO_GPUS)

    mnist = models.build("mnist_mlp", small=True)  # batch 8
    with pytest.raises(BaselineError, match=r"node 'x' \(input\): batch size 8 .* degree 3"):
        data_parallel(mnist, SUMMIT_NODE, degree=3)
    with pytest.raises(BaselineError, match="degree 4 exceeds machine 'summit'"):
        data_parallel(mnist, TWO_GPUS, degree=4)
    with pytest.raises(BaselineError, match="tensor_degree 8 exceeds"):
        megatron(mnist, SUMMIT_NODE, tensor_degree=8)
    with pytest.raises(BaselineError, match=r"node 'x.split' \(partition\): .*already"):
        data_parallel(data_parallel(mnist, TWO_GPUS), TWO_GPUS)


# --- Unity's Figure 2b plan on feed-forward blocks --------------------------------------------


def test_unity_figure_2b_on_the_mnist_mlp_is_the_papers_plan():
    """ReLU not fused; the first MatMul reduction-parallel (input split by columns, weight by
    rows), its output all-reduced; the second split by output columns: 4bh = 131,072 elements
    moved for the activation and its gradient (Unity section 2), plus gathering the 64 x 10
    output and scattering its gradient; no weight synchronized."""
    model = models.mnist_mlp()
    plan = unity_figure_2b(model, TWO_GPUS)
    pcgopt.assert_equivalent(model, plan, trials=1)
    assert [n.op for n in plan.nodes if n.op not in ("input", "weight")] == [
        "partition",
        "partition",
        "matmul",
        "all_reduce",
        "relu",
        "partition",
        "matmul",
        "combine",
    ]
    assert plan.shape("matmul1.partial").sum_degree == 2
    cost = iteration_cost(plan, TWO_GPUS)
    assert cost.comm_bytes == (131_072 + 64 * 10) * 4
    assert weight_sync_bytes(cost) == 0


def test_unity_figure_2b_on_bert_unfuses_each_feed_forward_block():
    model = models.build("bert_large", small=True)
    plan = unity_figure_2b(model, TWO_GPUS)
    pcgopt.assert_equivalent(model, plan, trials=1)
    ffn1 = [n.name for n in model.nodes if n.name.endswith("ffn1/linear")]
    assert ffn1 and all(plan.node(name).op == "gelu" for name in ffn1)
    assert sum(n.op == "all_reduce" for n in plan.nodes) == len(ffn1)
    # Nothing else is parallel: the attention's Linears are as they were.
    attention = [n for n in model.nodes if "/attn/" in n.name and n.op == "linear"]
    assert attention and all(plan.node(n.name) == n for n in attention)


def test_unity_figure_2b_needs_a_feed_forward_block_and_a_degree_that_splits_it():
    b = PCGBuilder()
    only_one = b.build(b.matmul(b.input((4, 6), name="x"), b.weight((6, 6), name="w")))
    with pytest.raises(BaselineError, match="no two-layer feed-forward block"):
        unity_figure_2b(only_one, TWO_GPUS)
    with pytest.raises(BaselineError, match=r"degree 3 does not split .*\[10, 784\]"):
        unity_figure_2b(models.mnist_mlp(), SUMMIT_NODE, degree=3)
    with pytest.raises(BaselineError, match=r"^degree must be a positive integer"):
        unity_figure_2b(models.mnist_mlp(), TWO_GPUS, degree=0)
    # 784 inputs and 10 outputs: of the node's 6 GPUs, 2 is the largest degree splitting both.
    plan = unity_figure_2b(models.mnist_mlp(), SUMMIT_NODE)
    assert plan.node("matmul1").params["degree"] == 2


def test_unity_figure_2b_blocks_do_not_overlap_and_shared_weights_are_split_once():
    b = PCGBuilder()
    w, v, u = b.weight((4, 4), name="w"), b.weight((4, 4), name="v"), b.weight((4, 4), name="u")
    x, y = b.input((2, 4), name="x"), b.input((2, 4), name="y")
    # x: a chain of three layers, of which the first two make the block; y: a second block
    # with the same weights.
    chain = b.matmul(b.matmul(b.relu(b.matmul(x, w, name="a1")), v, name="a2"), u, name="a3")
    other = b.matmul(b.relu(b.matmul(y, w, name="b1")), v, name="b2")
    model = b.build(b.add(chain, other))
    plan = unity_figure_2b(model, TWO_GPUS)
    pcgopt.assert_equivalent(model, plan, trials=1)
    assert plan.node("a3") == model.node("a3")
    split = [n.inputs[0].node for n in plan.nodes if n.op == "partition"]
    assert split.count("w") == 1 and split.count("v") == 1
    assert [n.op for n in plan.nodes if n.name in ("a2", "b2")] == ["combine", "combine"]


# --- Fused projections ----------------------------------------------------------------------------


def attention(*, fused: bool, batch=8, seq=16, d=32, heads=4):
    """One self-attention block over ``x`` (no LayerNorm), its Q, K and V from one fused
    projection and a Split (as GPT-2 and most exporters write it) or from three projections."""
    b = PCGBuilder()
    x = b.input((batch, seq, d), name="x")
    if fused:
        w, bias = b.weight((d, 3 * d), name="wqkv"), b.weight((3 * d,), name="bqkv")
        qkv = b.apply("linear", x, w, bias, name="qkv")
        q, k, v = b.apply("split", qkv, axis=2, sizes=(d, d, d), name="qkv_split")
    else:
        q, k, v = (
            b.apply("linear", x, b.weight((d, d), name=f"w{p}"), b.weight((d,), name=f"b{p}"))
            for p in "qkv"
        )

    def heads_of(t, name):
        t = b.apply("reshape", t, shape=(batch, seq, heads, d // heads), name=f"{name}_heads")
        return b.apply("transpose", t, perm=(0, 2, 1, 3), name=f"{name}_t")

    q, k, v = heads_of(q, "q"), heads_of(k, "k"), heads_of(v, "v")
    kt = b.apply("transpose", k, perm=(0, 1, 3, 2), name="kt")
    scores = b.apply("scale", b.apply("batch_matmul", q, kt, name="qk"), factor=0.5, name="s")
    att = b.apply("batch_matmul", b.apply("softmax", scores, axis=3, name="p"), v, name="pv")
    o = b.apply("transpose", att, perm=(0, 2, 1, 3), name="o_t")
    o = b.apply("reshape", o, shape=(batch, seq, d), name="o")
    y = b.apply("matmul", o, b.weight((d, d), name="wo"), name="proj")
    return b.build(b.reduce_sum(y, axes=(0, 1, 2), name="loss"))


def test_a_fused_projection_becomes_exact_layers_over_its_weight_slices():
    from pcgopt.extract.strategies.baselines import split_projections

    model = attention(fused=True)
    split = split_projections(model)
    assert pcgopt.equivalent(model, split)
    assert "qkv_split" not in {n.name for n in split.nodes}
    parts = [n for n in split.nodes if n.op == "linear"]
    assert [n.name for n in parts] == ["qkv.0", "qkv.1", "qkv.2"]
    # Each reads a slice of the fused weight's columns and of its bias.
    assert [split.shape(n.inputs[1]).sizes for n in parts] == [(32, 32)] * 3
    assert split_projections(attention(fused=False)) == attention(fused=False)


def test_megatron_splits_the_heads_of_a_fused_qkv_projection():
    machine = Machine.preset("dgx-a100", nodes=1, devices_per_node=4)
    fused = attention(fused=True)
    plan = megatron(fused, machine, tensor_degree=4)
    assert pcgopt.equivalent(fused, plan)
    # Q, K and V column-parallel (their weight slices split by columns), the output
    # projection row-parallel (partial sums all-reduced).
    splits = [n for n in plan.nodes if n.op == "partition" and n.params["dim"] == 1]
    assert {n.inputs[0].node for n in splits} >= {"qkv.0.w", "qkv.1.w", "qkv.2.w"}
    assert any(n.op == "all_reduce" and n.name == "proj" for n in plan.nodes)
    # At BERT-Large's sizes it costs about what Megatron on separate projections costs: the
    # slices of the fused weight are computed on one device and split, so their gradients are
    # gathered back (8.7% here). Before, Q, K and V were not split at all (3.1x slower).
    sizes = {"batch": 16, "seq": 512, "d": 1024, "heads": 16}
    fused, separate = attention(fused=True, **sizes), attention(fused=False, **sizes)
    fused_s = iteration_cost(megatron(fused, machine, tensor_degree=4), machine).total_s
    separate_s = iteration_cost(megatron(separate, machine, tensor_degree=4), machine).total_s
    assert separate_s < fused_s < 1.1 * separate_s
