"""Views of a PCG for people and tools: a text summary, Graphviz DOT, a networkx graph."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import networkx as nx

from pcgopt.graph import PCG, Node
from pcgopt.ops import OPERATORS, OpKind


def _non_default_params(node: Node) -> str:
    spec = OPERATORS[node.op]
    parts = []
    for p in spec.params:
        v = node.params[p.name]
        if node.op in ("input", "weight") and p.name == "shape":
            continue  # the output shape shows it
        if p.required or v != p.default:
            parts.append(f"{p.name}={v.value if hasattr(v, 'value') else v}")
    return ", ".join(parts)


def forward_flops(pcg: PCG) -> int:
    """Forward FLOPs of the whole (logical) computation."""
    return sum(
        OPERATORS[n.op].flops(
            n.params, pcg.input_shapes(n.name), pcg.output_shapes(n.name), per_shard=False
        )
        for n in pcg.nodes
    )


def _si(x: float) -> str:
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(x) < 1000:
            return f"{x:.4g}{unit}"
        x /= 1000
    return f"{x:.4g}E"


def summary(pcg: PCG, *, max_rows: int | None = 60) -> str:
    """A compact table of the graph: counts, parameters, FLOPs, and one row per node."""
    kinds = Counter(OPERATORS[n.op].kind for n in pcg.nodes)
    params = sum(pcg.shape(n.name).numel for n in pcg.weights if n.params["trainable"])
    param_bytes = sum(pcg.shape(n.name).nbytes for n in pcg.weights if n.params["trainable"])
    lines = [
        f"PCG: {len(pcg)} nodes ({kinds[OpKind.SOURCE]} sources, {kinds[OpKind.COMPUTE]} compute, "
        f"{kinds[OpKind.PARALLEL]} parallel), outputs: {', '.join(map(str, pcg.outputs))}",
        f"parameters: {_si(params)} ({_si(param_bytes)}B), "
        f"forward FLOPs: {_si(forward_flops(pcg))}",
    ]
    rows = [("name", "op", "inputs", "params", "output")]
    for n in pcg.nodes:
        shapes = ", ".join(map(str, pcg.output_shapes(n.name)))
        rows.append(
            (n.name, n.op, ", ".join(map(str, n.inputs)) or "-", _non_default_params(n), shapes)
        )
    hidden = 0
    if max_rows is not None and len(rows) - 1 > max_rows:
        hidden = len(rows) - 1 - max_rows
        rows = rows[: max_rows + 1]
    widths = [min(max(len(r[k]) for r in rows), 40) for k in range(4)]
    for r in rows:
        cells = [c if len(c) <= 40 else c[:37] + "..." for c in r[:4]]
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + "  " + r[4]
        )
    if hidden:
        lines.append(f"  ... {hidden} more nodes")
    return "\n".join(lines)


_DOT_STYLE = {
    OpKind.SOURCE: 'shape=box, style="rounded,filled", fillcolor="#e8e8e8"',
    OpKind.COMPUTE: 'shape=box, style=filled, fillcolor="#cdeccd"',
    OpKind.PARALLEL: 'shape=box, style=filled, fillcolor="#fbd9b0"',
}


def _dot_quote(s: str) -> str:
    """A DOT string: backslashes and quotes escaped, line breaks as DOT's ``\\n``."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(pcg: PCG, *, boxes: Mapping[str, str] | None = None) -> str:
    """Graphviz DOT: compute nodes green, parallelization nodes orange (as in the Unity paper);
    edges labelled with their parallel shapes. ``boxes`` draws groups of nodes as one box each
    (node name -> the box's label, e.g. ``layer1 .. layer23 (x23, as layer0)``), so that a
    model of many alike layers stays a picture one can read."""
    boxes = boxes or {}
    out = [
        "digraph pcg {",
        "  rankdir=TB;",
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]

    def where(name: str) -> str:
        return f"box: {boxes[name]}" if name in boxes else name

    for label in dict.fromkeys(boxes.values()):
        out.append(
            f"  {_dot_quote('box: ' + label)} [label={_dot_quote(label)}, shape=box3d, "
            'style=filled, fillcolor="#dfe7f5"];'
        )
    for n in pcg.nodes:
        if n.name in boxes:
            continue
        params = _non_default_params(n)
        label = f"{n.name}\n{n.op}" + (f"\n{params}" if params else "")
        if OPERATORS[n.op].kind is OpKind.SOURCE:
            label += f"\n{pcg.shape(n.name)}"
        out.append(
            f"  {_dot_quote(n.name)} [label={_dot_quote(label)}, "
            f"{_DOT_STYLE[OPERATORS[n.op].kind]}];"
        )
    drawn: set[tuple[str, str]] = set()
    for n in pcg.nodes:
        for r in n.inputs:
            a, b = where(r.node), where(n.name)
            if a == b or (a, b) in drawn:
                continue
            drawn.add((a, b))
            out.append(
                f"  {_dot_quote(a)} -> {_dot_quote(b)} [label={_dot_quote(str(pcg.shape(r)))}];"
            )
    for k, r in enumerate(pcg.outputs):
        out.append(f'  "__out{k}" [label="output {k}", shape=plaintext];')
        out.append(
            f'  {_dot_quote(where(r.node))} -> "__out{k}" [label={_dot_quote(str(pcg.shape(r)))}];'
        )
    out.append("}")
    return "\n".join(out) + "\n"


def to_networkx(pcg: PCG) -> nx.MultiDiGraph:
    """A networkx view: nodes carry ``op``, ``kind``, ``params`` and ``shapes`` (of their
    outputs); an edge per input, keyed by the input position, carries ``index`` (which output
    of the source) and ``shape``."""
    g = nx.MultiDiGraph(outputs=pcg.outputs)
    for n in pcg.nodes:
        g.add_node(
            n.name,
            op=n.op,
            kind=OPERATORS[n.op].kind,
            params=n.params,
            shapes=pcg.output_shapes(n.name),
        )
    for n in pcg.nodes:
        for pos, r in enumerate(n.inputs):
            g.add_edge(r.node, n.name, key=pos, index=r.index, shape=pcg.shape(r))
    return g
