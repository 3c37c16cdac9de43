"""Text summary and DOT export."""

from pcgopt import PCGBuilder
from pcgopt.models import build


def test_summary_counts_and_rows():
    g = build("mnist_mlp")
    text = g.summary()
    assert (
        text.splitlines()[0] == "PCG: 6 nodes (3 sources, 3 compute, 0 parallel), outputs: matmul2"
    )
    # 784*512 + 512*10 parameters; 2*64*784*512 + 64*512 + 2*64*512*10 forward FLOPs
    assert "parameters: 406.5K (1.626MB)" in text
    assert "forward FLOPs: 52.07M" in text  # 52,068,352
    assert any(
        line.split() == ["relu", "relu", "matmul1", "f32[64,", "512]"] for line in text.splitlines()
    )


def test_summary_truncates_long_graphs():
    g = build("bert_large", small=True)
    text = g.summary(max_rows=5)
    assert f"... {len(g) - 5} more nodes" in text


def test_dot_has_every_node_and_edge_and_colors_parallel_operators():
    b = PCGBuilder()
    x = b.input((4, 2), name="x")
    y = b.combine(b.relu(b.partition(x, dim=0, degree=2)), dim=0, degree=2)
    dot = b.build(y).to_dot()
    assert dot.startswith("digraph pcg {")
    for name in ("x", "partition_1", "relu_1", "combine_1"):
        assert f'"{name}" [label=' in dot
    assert '"x" -> "partition_1" [label="f32[4, 2]"]' in dot
    assert '"partition_1" -> "relu_1" [label="f32[4/2, 2]"]' in dot
    assert dot.count("#fbd9b0") == 2  # the two parallelization operators


def test_dot_labels_break_lines_as_graphviz_reads_them():
    b = PCGBuilder()
    x = b.input((4, 2), name='say "x"')
    dot = b.build(b.relu(x, name="act")).to_dot()
    # One backslash before n: DOT's line break (two would show a literal "\n" in the picture).
    assert '"act" [label="act\\nrelu",' in dot
    assert '[label="say \\"x\\"\\ninput\\nf32[4, 2]",' in dot
    assert "\\\\n" not in dot
