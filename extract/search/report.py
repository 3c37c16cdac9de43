"""A plan in its model's terms: the text :meth:`~pcgopt.extract.search.plan.Plan.explain` prints.

Three parts, most useful first:

1. The headline: the predicted time of one training iteration, and how much faster that is
   than the best plan a user would write by hand (the baselines: data parallelism, FSDP,
   Megatron's tensor parallelism, either after single-device fusion, or on one node), then than
   the input
   as given; which devices the plan uses.
2. One row per layer: the model's node names are paths (``layer5/attn/q/linear``), and a layer
   is the first part of the path that tells the model's big blocks apart (:func:`layer_of`).
   Each row says the strategy in words (data parallel x4, tensor parallel x2, ...) and in SBP
   notation (AutoDDL's: ``S0:4`` split dimension 0 four ways, ``B:2`` two copies, ``P:2`` two
   partial sums), the devices it runs on, its time, its memory and its collectives. Consecutive
   layers that are alike (same operators, layouts and collectives) share one row: ``layer0 ..
   layer23 (x24)`` with the figures of one layer.
3. The costliest nodes, identical rows (the same node in every layer) grouped, then how the
   plan was found (candidates, search, placement, machine mapping) and a legend.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pcgopt.extract.costmodel.cost import branches_words
from pcgopt.graph import PCG, Node
from pcgopt.machine import Machine
from pcgopt.ops import OpKind
from pcgopt.sbp import sbp_of
from pcgopt.shapes import ParallelTensorShape

if TYPE_CHECKING:
    from pcgopt.extract.search.plan import Plan

#: The candidates that are plans a user could write without pcgopt (the headline compares
#: with the best of them).
BASELINE_CANDIDATES = (
    "data parallel",
    "fsdp",
    "megatron",
    "megatron-sp",
    "fused, then data parallel or megatron",
    "zero-1",
    "zero-2",
    "data parallel on one node",
    "megatron on one node",
)

LEGEND = (
    "notation: a layout lists the device mesh's axes: S<d>:k splits dimension d k ways, B:k "
    "keeps k copies, P:k holds k partial sums still to be added (AutoDDL's SBP). In a shape, "
    "f32[1024/4, 512] r2 is a 1024 x 512 tensor whose dimension 0 is split 4 ways, in 2 copies; "
    "r2(partial) marks 2 partial sums. Times are per training iteration: forward, backward, "
    "communication and update."
)

_DIGITS = re.compile(r"\d+")


def _fmt_s(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds * 1e6:.4g} µs"


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _parts(name: str) -> list[str]:
    return [p for p in name.split("/") if p]


def layer_of(names: Sequence[str]) -> dict[str, str]:
    """The layer of each node name: a prefix of its path. The prefix starts after the parts every
    name shares (an imported model's ``/bert/...``) and is one part long, except that a layer
    holding more than half of the names (``encoder``) is split by its next part, so that
    ``/bert/encoder/layer.0/attention/...`` is in layer ``encoder/layer.0``. A name that is not
    a path is its own layer."""
    paths = {n: _parts(n) for n in names}
    multi = [p for p in paths.values() if len(p) > 1]
    shared = 0
    if multi:
        while all(len(p) > shared + 1 and p[shared] == multi[0][shared] for p in multi):
            shared += 1
    depth = {n: shared + 1 for n in names}

    def key(n: str) -> str:
        p = paths[n]
        return "/".join(p[shared : depth[n]]) if len(p) > 1 else n

    for _ in range(4):  # a few levels: encoder/layer.0, not every module of a layer
        sizes = Counter(key(n) for n in names)
        big = {k for k, v in sizes.items() if v > len(names) / 2 and v > 1}
        deeper = [n for n in names if key(n) in big and len(paths[n]) > depth[n] + 1]
        if not deeper:
            break
        for n in deeper:
            depth[n] += 1
    return {n: key(n) for n in names}


def node_layers(plan: PCG, model_names: Iterable[str]) -> dict[str, str]:
    """The layer of every node of ``plan``: a node that computes a model node (it has its name,
    or ``name~k`` for a piece of it) is in that node's layer; a node the search added (a
    parallel operator, a fused or rewritten node) is in the layer of its first input that has
    one, else of its first reader; a source the model names by a bare word (an input) is in
    its first reader's layer."""
    model = set(model_names)
    own = {}
    for n in plan.nodes:
        base = n.name.split("~")[0]
        if base in model and ("/" in base or n.spec.kind is OpKind.COMPUTE):
            own[n.name] = base
    layers = layer_of(sorted(set(own.values())))
    out: dict[str, str] = {name: layers[base] for name, base in own.items()}
    for n in plan.nodes:
        if n.name not in out:
            for r in n.inputs:
                if r.node in out:
                    out[n.name] = out[r.node]
                    break
    for n in reversed(plan.nodes):
        for r in n.inputs:
            if r.node not in out and n.name in out:
                out[r.node] = out[n.name]
    for n in plan.nodes:
        out.setdefault(n.name, n.name)
    return out


def _weight_input(plan: PCG, node: Node) -> ParallelTensorShape | None:
    """The layout of the trainable weight ``node`` reads (through parallel operators), if any."""
    found = _weight_layouts(plan, node)
    return None if found is None else found[0]


def _weight_layouts(
    plan: PCG, node: Node
) -> tuple[ParallelTensorShape, ParallelTensorShape | None] | None:
    """The layout of the trainable weight ``node`` reads (through parallel operators), and, if
    it is gathered on the way (FSDP), the split layout it is stored in; None if it reads none."""
    for r in node.inputs[1:]:
        ref, stored = r, None
        while plan.node(ref.node).spec.kind is OpKind.PARALLEL:
            step = plan.node(ref.node)
            if step.op == "all_gather":
                stored = plan.shape(step.inputs[0])
            ref = step.inputs[0]
        source = plan.node(ref.node)
        if source.op == "weight" and source.params["trainable"]:
            return plan.shape(r), stored
    return None


def strategy_words(
    out: ParallelTensorShape,
    weight: ParallelTensorShape | None,
    stored: ParallelTensorShape | None = None,
) -> str:
    """A node's parallelism in words, from the layout of its output and of the weight it reads:
    the batch dimension split is data parallelism, another split tensor parallelism, partial
    sums reduction parallelism, copies replication; ``stored``: the split layout a weight
    gathered where it is used is kept in (FSDP)."""
    parts = []
    if out.rank and out.degrees[0] > 1:
        parts.append(f"data parallel x{out.degrees[0]}")
    for d in range(1, out.rank):
        if out.degrees[d] > 1:
            parts.append(f"tensor parallel x{out.degrees[d]} (dim {d})")
    if out.sum_degree > 1:
        parts.append(f"reduction parallel x{out.sum_degree} (partial sums)")
    if out.copy_degree > 1:
        parts.append(f"replicated x{out.copy_degree}")
    text = ", ".join(parts) or "one device"
    if stored is not None and stored.num_shards > 1:
        split = [f"dim {d} x{k}" for d, k in enumerate(stored.degrees) if k > 1]
        text += f"; weights stored split {', '.join(split)}, gathered where used"
    elif weight is not None and weight.num_shards > 1:
        split = [f"dim {d} x{k}" for d, k in enumerate(weight.degrees) if k > 1]
        text += "; weights " + (f"split {', '.join(split)}" if split else "copied")
    return text


@dataclass(frozen=True)
class LayerRow:
    """One layer of a plan, or a run of alike ``layers`` (figures per layer)."""

    layers: tuple[str, ...]
    strategy: str
    sbp: str
    devices: int
    time_s: float
    memory_bytes: int
    collectives: tuple[tuple[str, int], ...]
    #: The devices its compute runs on (of all its layers, for a run: the machine mapping may
    #: run alike branches at once on different devices).
    device_set: frozenset[int] = frozenset()

    @property
    def count(self) -> int:
        return len(self.layers)

    @property
    def label(self) -> str:
        first, last = self.layers[0], self.layers[-1]
        return first if self.count == 1 else f"{first} .. {last} (x{self.count})"


def layer_rows(plan: Plan, model_names: Iterable[str]) -> list[LayerRow]:
    """The plan's layers in order, alike consecutive layers merged (module docstring)."""
    pcg, cost = plan.pcg, plan.cost
    layers = node_layers(pcg, model_names)
    offsets = plan.machine_mapping.offsets if plan.machine_mapping is not None else {}
    members: dict[str, list[Node]] = {}
    for n in pcg.nodes:
        members.setdefault(layers[n.name], []).append(n)
    rows: list[tuple[LayerRow, tuple]] = []
    for layer, nodes in members.items():
        compute = [n for n in nodes if n.spec.kind is OpKind.COMPUTE]
        if not compute and not any(cost.per_node[n.name].total_s for n in nodes):
            continue
        heaviest = max(compute, key=lambda n: cost.per_node[n.name].flops, default=None)
        words, sbp = "no computation", ""
        if heaviest is not None:
            weighted = [n for n in compute if _weight_input(pcg, n) is not None]
            main = max(weighted, key=lambda n: cost.per_node[n.name].flops, default=heaviest)
            out = pcg.output_shapes(main.name)[0]
            words = strategy_words(out, *(_weight_layouts(pcg, main) or (None,)))
            kinds = Counter(
                strategy_words(pcg.output_shapes(n.name)[0], *_weight_layouts(pcg, n))  # type: ignore[misc]
                for n in weighted
            )
            if len(kinds) > 1:
                words += f" (+{len(kinds) - 1} more)"
            sbp = str(sbp_of(out))
        devices = {d for n in compute for d in _node_devices(plan, offsets, n)}
        collectives = Counter(
            k.kind for n in nodes for k in cost.per_node[n.name].collectives if k.degree > 1
        )
        row = LayerRow(
            (layer,),
            words,
            sbp,
            len(devices) or 1,
            sum(cost.per_node[n.name].total_s for n in nodes),
            sum(cost.per_node[n.name].memory_bytes for n in nodes),
            tuple(sorted(collectives.items())),
            frozenset(devices),
        )
        alike = (
            _DIGITS.sub("#", layer),
            tuple(
                (
                    n.name[len(layer) :] if n.name.startswith(layer) else _DIGITS.sub("#", n.name),
                    n.op,
                    tuple(map(repr, pcg.output_shapes(n.name))),
                )
                for n in nodes
            ),
            row.strategy,
            row.devices,
            row.collectives,
            f"{row.time_s:.4g}",
            row.memory_bytes,
        )
        if rows and rows[-1][1] == alike:
            prev = rows[-1][0]
            merged = replace(
                prev, layers=(*prev.layers, layer), device_set=prev.device_set | row.device_set
            )
            rows[-1] = (merged, alike)
        else:
            rows.append((row, alike))
    return [r for r, _ in rows]


def repeated_layer_boxes(plan: Plan, model_names: Iterable[str]) -> dict[str, str]:
    """For a picture of the plan: every node of the second and later layers of a run of alike
    layers, mapped to one box that stands for them (:func:`pcgopt.render.to_dot`'s ``boxes``):
    the first layer of each run is drawn whole."""
    layers = node_layers(plan.pcg, model_names)
    boxes: dict[str, str] = {}
    for row in layer_rows(plan, model_names):
        if row.count > 1:
            rest = row.layers[1:]
            label = (
                f"{rest[0]} .. {rest[-1]}\n(x{len(rest)}, as {row.layers[0]})"
                if len(rest) > 1
                else f"{rest[0]}\n(as {row.layers[0]})"
            )
            hidden = set(rest)
            boxes.update({n: label for n, layer in layers.items() if layer in hidden})
    return boxes


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[k]) for r in (header, *rows)) for k in range(len(header))]
    lines = []
    for r in (header, *rows):
        cells = [
            c.rjust(w) if k in right else c.ljust(w)
            for k, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def headline(plan: Plan) -> list[str]:
    """The first lines: time, speedup over the best baseline and over the input, devices used."""
    c, s, m = plan.cost, plan.stats, plan.machine
    lines = [
        f"plan for {m.name} ({m.num_devices} x {m.device.name}): "
        f"{c.total_s * 1e3:.4g} ms per training iteration, found by {s.chosen}"
    ]
    baselines = {
        k: v for k, v in s.candidates.items() if k in BASELINE_CANDIDATES and v is not None
    }
    compared = []
    if baselines:
        # Ranked as the search ranks plans: those that fit first.
        name, best = min(baselines.items(), key=lambda kv: (kv[0] in s.infeasible, kv[1]))
        fits = ", does not fit" if name in s.infeasible else ""
        compared.append(
            f"{best / c.total_s:.3g}x the best baseline ({name}, {best * 1e3:.4g} ms{fits})"
            if c.total_s
            else f"the best baseline is {name}"
        )
    given = s.candidates.get("input as given")
    if given and c.total_s:
        compared.append(f"{given / c.total_s:.3g}x the input as given ({given * 1e3:.4g} ms)")
    if compared:
        lines.append("  speedup: " + "; ".join(compared))
    used = max(c.devices_used, len(_devices_used(plan)))
    idle = m.num_devices - used
    lines.append(
        f"  uses {used} of {m.num_devices} devices"
        + (f" ({idle} left idle)" if idle > 0 else "")
        + f"; compute {_fmt_s(c.compute_s)}, communication {_fmt_s(c.comm_s)} "
        f"({_fmt_bytes(c.comm_bytes)}; {_fmt_s(c.exposed_comm_s)} of it not hidden behind "
        f"compute), update {_fmt_s(c.update_s)} ({c.optimizer})" + branches_words(c.overlap_s)
    )
    lines.append(f"  runtime: {c.runtime!r}; all in sequence {_fmt_s(c.additive_s)}")
    lines.append(
        f"  memory per device {_fmt_bytes(c.memory_per_device)} of "
        f"{_fmt_bytes(c.memory_capacity)} ({'fits' if c.feasible else 'DOES NOT FIT'})"
        + (
            f"; gradients accumulated over {c.micro_batches} micro-batches"
            if c.micro_batches > 1
            else ""
        )
    )
    lines.append(f"  check: {plan.check}")
    return lines


def _node_devices(plan: Plan, offsets: Mapping[str, int], node: Node) -> range:
    """The devices ``node`` runs on: from where the machine mapping put it, one per shard."""
    start = offsets.get(node.name, 0)
    return range(start, start + plan.pcg.output_shapes(node.name)[0].num_shards)


def _devices_used(plan: Plan) -> set[int]:
    """Every device some compute node runs on, where the machine mapping placed it."""
    offsets = plan.machine_mapping.offsets if plan.machine_mapping is not None else {}
    return {
        d
        for n in plan.pcg.nodes
        if n.spec.kind is OpKind.COMPUTE
        for d in _node_devices(plan, offsets, n)
    }


def layer_table(rows: Sequence[LayerRow]) -> list[str]:
    if not rows:
        return []
    body = [
        (
            r.label,
            r.strategy,
            r.sbp,
            str(r.devices),
            _fmt_s(r.time_s),
            _fmt_bytes(r.memory_bytes),
            _collectives(r.collectives),
        )
        for r in rows
    ]
    header = (
        "layer",
        "strategy",
        "layout",
        "devices",
        "time",
        "memory",
        "collectives",
    )
    grouped = sum(r.count for r in rows) - len(rows)
    title = "layers, in order" + (
        " (alike consecutive layers share a row; its figures are one layer's)" if grouped else ""
    )
    return [title, *_table(header, body, {3, 4, 5})]


def devices_per_column(machine: Machine, max_columns: int) -> int:
    """How many devices a column of a device map stands for, so that there are at most
    ``max_columns``: one; else a node of the outermost level; else as many nodes as it takes;
    or, on a machine of one node, a block of its devices."""
    n, count = machine.num_devices, machine.levels[0].count
    if n <= max_columns:
        return 1
    want, node = -(-n // max_columns), n // count
    if count == 1:
        return want
    return node * -(-want // node)


def device_map(plan: Plan, rows: Sequence[LayerRow], *, width: int = 64) -> list[str]:
    """Which devices each layer runs on: a character per device (``#`` used, ``.`` idle), or,
    on machines of more than ``width`` devices, per node of the outermost level, or per group
    of them (``#`` all of its devices, ``+`` some, ``.`` none)."""
    m = plan.machine
    n = m.num_devices
    per = devices_per_column(m, width)
    cells = -(-n // per)
    node = n // m.levels[0].count
    if per == 1:
        unit = "device"
    elif per == node and m.levels[0].count > 1:
        unit = f"{m.levels[0].name} of {per} devices"
    else:
        unit = f"group of {per} devices"

    def line(used: frozenset[int]) -> str:
        out = []
        for k in range(cells):
            block = range(k * per, min(n, (k + 1) * per))
            hit = sum(d in used for d in block)
            out.append("#" if hit == len(block) else "+" if hit else ".")
        return "".join(out)

    if not rows:
        return []
    label_width = max(len(r.label) for r in rows)
    key = "# used, . idle" if per == 1 else "# all used, + some, . idle"
    lines = [f"device map (a character per {unit}, {cells} in all: {key})"]
    lines += [f"  {r.label.ljust(label_width)}  {line(r.device_set)}" for r in rows]
    return lines


def _collectives(counts: Sequence[tuple[str, int]]) -> str:
    """``all_reduce x18, all_gather x5``, the most frequent first."""
    ordered = sorted(counts, key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in ordered) or "-"


def node_table(plan: Plan, max_rows: int | None) -> list[str]:
    """The costliest nodes, the same node of alike layers grouped into one row."""
    pcg, c = plan.pcg, plan.cost
    groups: dict[tuple, list[str]] = {}
    times: dict[tuple, float] = {}
    for node in pcg.nodes:
        nc = c.per_node[node.name]
        if node.spec.kind is OpKind.SOURCE and not nc.memory_bytes:
            continue
        layout = " ".join(f"{sh!r} {sbp_of(sh)}" for sh in pcg.output_shapes(node.name))
        what = ", ".join(
            f"{k.kind}({k.purpose}, {k.degree} dev x {k.groups})" for k in nc.collectives
        )
        key = (_DIGITS.sub("#", node.name), node.op, layout, what, f"{nc.total_s:.4g}")
        groups.setdefault(key, []).append(node.name)
        times[key] = nc.total_s
    order = sorted(groups, key=lambda k: -times[k] * len(groups[k]))
    hidden = 0
    if max_rows is not None and len(order) > max_rows:
        hidden, order = len(order) - max_rows, order[:max_rows]
    shown = [_name_pattern(groups[k]) for k in order]
    width = max([24, *(min(64, len(s)) for s in shown)])
    lines = [
        "nodes, costliest first (one row for the same node of alike layers: their total, and "
        "the time of each)",
        f"  {'total':>10}  {'each':>10}  {'node':<{width}} {'op':<14} output layout / collectives",
    ]
    for key, name in zip(order, shown, strict=True):
        _, op, layout, what, _ = key
        shown_name = name if len(name) <= width else "..." + name[len(name) - width + 3 :]
        total = _fmt_s(times[key] * len(groups[key]))
        each = _fmt_s(times[key]) if len(groups[key]) > 1 else ""
        lines.append(f"  {total:>10}  {each:>10}  {shown_name:<{width}} {op:<14} {layout}")
        if what:
            lines.append(f"  {'':>10}  {'':>10}  {'':<{width}} {'':<14} {what}")
    if hidden:
        lines.append(f"  ... {hidden} more rows (max_rows=None shows all)")
    return lines


def _name_pattern(names: Sequence[str]) -> str:
    """``layer0/ffn1/w``, or ``layer{0..23}/ffn1/w (x24)`` for the same node of several layers."""
    if len(names) == 1:
        return names[0]
    first = names[0]
    numbers = [_DIGITS.findall(n) for n in names]
    pieces = _DIGITS.split(first)
    out = pieces[0]
    for k, piece in enumerate(pieces[1:]):
        values = {int(ns[k]) for ns in numbers if k < len(ns)}
        out += str(min(values)) if len(values) == 1 else f"{{{min(values)}..{max(values)}}}"
        out += piece
    return f"{out} (x{len(names)})"


def search_lines(plan: Plan) -> list[str]:
    s = plan.stats
    if not s.candidates:
        return [f"not searched: {s.chosen} plan, placed and mapped"]
    lines = [
        "how it was found",
        "  candidates (mapped time per iteration): "
        + ", ".join(
            f"{k} {v * 1e3:.4g} ms"
            if v is not None
            else f"{k} not placed (time budget)"
            if k in s.unplaced
            else f"{k} n/a"
            for k, v in s.candidates.items()
        ),
        "  search: "
        + (f"{s.segments} segments (graph splitting), " if s.segments > 1 else "")
        + f"{s.num_enodes:,} e-nodes, {s.num_eclasses:,} e-classes after "
        f"{s.iterations} iteration(s) ({s.stop_reason}); extraction {s.extraction}; "
        + ", ".join(f"{k} {v:.2f} s" for k, v in s.phase_seconds.items()),
    ]
    if plan.placement is not None:
        p = plan.placement
        where = (
            f"parallelism matrix {p.matrix.to_list()} on levels {list(p.matrix.hierarchy)} "
            f"(best of {p.considered}"
            + (f"; {p.untried} left untried, time limit)" if p.untried else ")")
            if p.matrix is not None
            else f"default (consecutive devices): {p.reason}"
        )
        lines.append(f"  placement: axes {list(p.axes)}, {where}")
    if plan.machine_mapping is not None:
        text = plan.machine_mapping.explain(max_rows=8).replace("\n", "\n  ")
        lines.append(f"  machine mapping: {text}")
    return lines


def pipeline_lines(plan: Plan) -> list[str]:
    """When the search found a faster pipelined plan (:attr:`Plan.pipeline`): it first, its
    stages, micro-batches and schedule; the rest of the text is the plan that runs as one
    program."""
    piped = plan.pipeline
    if piped is None:
        return []
    c = plan.cost
    return [
        f"PIPELINED: {piped.time_s * 1e3:.4g} ms per training iteration, "
        f"{c.total_s / piped.time_s:.3g}x the plan below ({c.total_s * 1e3:.4g} ms), which "
        "runs as one program (pipelined plans do not lower to JAX yet)",
        *piped.explain().splitlines(),
        "",
        "the plan as one program:",
    ]


def explain(plan: Plan, model_names: Iterable[str], *, max_rows: int | None = 40) -> str:
    """The whole text (module docstring); ``max_rows`` bounds the node table (None: all)."""
    rows = layer_rows(plan, model_names)
    sections = [
        pipeline_lines(plan),
        headline(plan),
        layer_table(rows),
        device_map(plan, rows),
        node_table(plan, max_rows),
        search_lines(plan),
        [LEGEND],
    ]
    return "\n\n".join("\n".join(s) for s in sections if s)


__all__ = [
    "BASELINE_CANDIDATES",
    "LEGEND",
    "LayerRow",
    "device_map",
    "devices_per_column",
    "explain",
    "layer_of",
    "layer_rows",
    "node_layers",
    "pipeline_lines",
    "repeated_layer_boxes",
    "strategy_words",
]
