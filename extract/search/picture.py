"""A plan's device map as a picture (SVG or PNG): which devices each layer runs on, and how.

One row per layer of :func:`~pcgopt.extract.search.report.layer_rows` (alike consecutive layers
share a row, ``layer0 .. layer23 (x24)``), one column per device (per node of the outermost
level above :data:`MAX_COLUMNS` devices), lines between the machine's nodes. A cell is coloured
by the layer's kind of parallelism (data, tensor, reduction, their mixes, one device) where the
layer runs on that device, and left pale where the device is idle for it. To the right of each
row: its layout in SBP notation, its time per iteration and its strategy in words. The title
is the explanation's headline.

Drawn with matplotlib (``pip install pcgopt[plot]``), on a figure of its own (no pyplot, no
global state). Every cell run has an id (``cell-<row>-<first device>-<last device>-<kind>``)
in the SVG (the kind with dashes: ``data+tensor-parallel``, ``idle``), so that a reader (and a
test) can find what is drawn where.

>>> KINDS["data parallel"], kind_of("data parallel x4, tensor parallel x2 (dim 2)")
('#4c72b0', 'data + tensor parallel')
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.simulate import Timeline
from pcgopt.extract.search.report import LayerRow, devices_per_column, headline

if TYPE_CHECKING:
    from pcgopt.extract.search.plan import Plan

#: Above this many devices a column stands for a node of the outermost level.
MAX_COLUMNS = 256

#: The colour of each kind of parallelism a layer may use (colour-blind-safe, seaborn's
#: "deep" palette); idle devices are drawn in :data:`IDLE`.
KINDS = {
    "data parallel": "#4c72b0",
    "tensor parallel": "#dd8452",
    "reduction parallel": "#8172b3",
    "data + tensor parallel": "#55a868",
    "data + reduction parallel": "#64b5cd",
    "tensor + reduction parallel": "#c44e52",
    "data + tensor + reduction parallel": "#937860",
    "replicated": "#da8bc3",
    "one device": "#8c8c8c",
}
IDLE = "#f0f0f0"

#: What a picture may be written as.
SUFFIXES = (".svg", ".png")


class PictureError(PCGError):
    """A picture cannot be drawn or written (matplotlib missing, an unknown file type)."""


def kind_of(strategy: str) -> str:
    """The kind of parallelism named in a layer's strategy words (:data:`KINDS`' keys)."""
    found = [k for k in ("data", "tensor", "reduction") if f"{k} parallel" in strategy]
    if found:
        return " + ".join(found) + " parallel"
    return "replicated" if strategy.startswith("replicated") else "one device"


def _runs(used: Sequence[bool]) -> list[tuple[int, int, bool]]:
    """Maximal runs of equal values: (first, last, value)."""
    runs: list[tuple[int, int, bool]] = []
    for k, u in enumerate(used):
        if runs and runs[-1][2] == u and runs[-1][1] == k - 1:
            runs[-1] = (runs[-1][0], k, u)
        else:
            runs.append((k, k, u))
    return runs


def _column_unit(machine: Any) -> tuple[int, str]:
    """How many devices a column stands for (:func:`~pcgopt.extract.search.report.
    devices_per_column`), and what they are."""
    per = devices_per_column(machine, MAX_COLUMNS)
    n, count, level = machine.num_devices, machine.levels[0].count, machine.levels[0].name
    node = n // count
    if per == 1:
        return 1, "device"
    if count == 1:
        return per, f"{per} devices"
    if per == node:
        return per, f"{level} ({node} devices)"
    return per, f"{per // node} {level}s ({per} devices)"


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def device_map_figure(plan: Plan, rows: Sequence[LayerRow] | None = None) -> Any:
    """The device map of ``plan`` as a matplotlib ``Figure`` (module docstring); ``rows``: the
    plan's layer rows, if already computed."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        raise PictureError("drawing a plan needs matplotlib: pip install 'pcgopt[plot]'") from None
    if rows is None:
        rows = plan.layers()
    machine = plan.machine
    n = machine.num_devices
    node_size = n // machine.levels[0].count  # devices per node of the outermost level
    per, unit = _column_unit(machine)
    columns = -(-n // per)

    label_width = max((len(r.label) for r in rows), default=10)
    notes = [f"{r.sbp or '-'}  {_fmt_ms(r.time_s)}  {r.strategy}" for r in rows]
    note_width = max((len(t) for t in notes), default=10)
    cell = 0.22 if columns <= 64 else 0.06 if columns <= 256 else 0.03  # inches
    grid_w = max(columns * cell, 2.0)
    # In inches: text is about 0.07 per character at 8 pt, a row 0.28; the title above, the
    # device numbers and the legend below.
    fig_w = 0.075 * label_width + grid_w + 0.068 * note_width + 0.6
    title = [
        line
        for text in headline(plan)[:2]
        for line in textwrap.wrap(text, max(40, int(fig_w / 0.068)), subsequent_indent="  ")
    ]
    title_h, grid_h, below_h = 0.18 * len(title) + 0.2, 0.28 * len(rows), 0.75
    fig_h = title_h + grid_h + below_h
    fig = Figure(figsize=(fig_w, fig_h))
    left = (0.075 * label_width + 0.2) / fig_w
    ax = fig.add_axes((left, below_h / fig_h, grid_w / fig_w, grid_h / fig_h))
    ax.set_xlim(0, columns)
    ax.set_ylim(len(rows), 0)
    kinds_seen: dict[str, str] = {}
    for i, row in enumerate(rows):
        kind = kind_of(row.strategy)
        colour = KINDS[kind]
        if per == 1:
            share = [1.0 if d in row.device_set else 0.0 for d in range(columns)]
        else:
            share = [
                sum(d in row.device_set for d in range(c * per, min(n, (c + 1) * per)))
                / (min(n, (c + 1) * per) - c * per)
                for c in range(columns)
            ]
        used_any = False
        for first, last, used in _runs([s > 0 for s in share]):
            used_any |= used
            for c in range(first, last + 1) if used and per > 1 else [first]:
                span = (c, c) if used and per > 1 else (first, last)
                alpha = share[span[0]] if used and per > 1 else 1.0
                rect = Rectangle(
                    (span[0], i + 0.08),
                    span[1] - span[0] + 1,
                    0.84,
                    facecolor=colour if used else IDLE,
                    alpha=0.35 + 0.65 * alpha if used else 1.0,
                    edgecolor="white",
                    linewidth=0.4 if columns <= 64 else 0.0,
                )
                slug = (kind if used else "idle").replace(" + ", "+").replace(" ", "-")
                rect.set_gid(f"cell-{i}-{span[0]}-{span[1]}-{slug}")
                ax.add_patch(rect)
        if used_any:
            kinds_seen[kind] = colour
        ax.text(columns + 0.02 * columns + 0.2, i + 0.5, notes[i], va="center", fontsize=7.5)
    # Lines between the nodes of the outermost level.
    node_cols = node_size // per
    for c in range(node_cols, columns, node_cols) if per == 1 else ():
        ax.axvline(c, color="black", linewidth=0.8)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [r.label for r in rows], fontsize=8)
    level = machine.levels[0].name
    if per == 1:
        x_label = f"device; a line between {level}s"
    else:
        x_label = f"{unit}; the darker, the more of them the layer uses"
    step = max(1, columns // 16)
    ax.set_xticks([c + 0.5 for c in range(0, columns, step)], list(range(0, columns, step)))
    ax.tick_params(axis="x", labelsize=7, length=0)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel(x_label, fontsize=8)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    fig.text(0.01, 1 - 0.1 / fig_h, "\n".join(title), ha="left", va="top", fontsize=9)
    handles = [Patch(facecolor=c, label=k) for k, c in kinds_seen.items()]
    handles.append(Patch(facecolor=IDLE, edgecolor="#cccccc", label="idle"))
    fig.legend(
        handles=handles,
        loc="lower left",
        ncol=len(handles),
        fontsize=7.5,
        frameon=False,
        bbox_to_anchor=(0.0, 0.0),
    )
    return fig


def save_device_map(plan: Plan, path: str | Path, rows: Sequence[LayerRow] | None = None) -> Path:
    """Writes the device map of ``plan`` to ``path`` (``.svg`` or ``.png``, by its suffix);
    returns the path. SVG text stays text (searchable, and small)."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise PictureError(
            f"{path}: a picture is written as {' or '.join(SUFFIXES)}, not {path.suffix!r}"
        )
    return _save(device_map_figure(plan, rows), path)


def _save(fig: Any, path: Path) -> Path:
    from matplotlib import rc_context

    # Written beside its place and renamed into it: a full disk leaves no half picture.
    fmt = path.suffix.lower()[1:]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with rc_context({"svg.fonttype": "none", "svg.hashsalt": "pcgopt"}):
            fig.savefig(tmp, format=fmt, dpi=150, metadata={"Date": None} if fmt == "svg" else None)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise PictureError(f"{path}: cannot write the picture: {e.strerror or e}") from None
    return path


#: The colour of each phase of a timeline's tasks.
PHASES = {
    "forward": "#4c72b0",
    "backward": "#55a868",
    "sync": "#dd8452",
    "update": "#8172b3",
    "unit": "#8c8c8c",
}


def timeline_figure(timeline: Timeline, title: str = "") -> Any:
    """A Gantt chart of ``timeline`` as a matplotlib ``Figure``: one lane per stream of the
    first device of each block (device 0's compute and communication streams under the cost
    model's placement; a machine mapping's blocks; labelled with the widest block), time
    across, each task a bar coloured by its phase (:data:`PHASES`). Every lane's bars of one
    phase are one SVG group (``lane-<lane>-<phase>``)."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise PictureError(
            "drawing a timeline needs matplotlib: pip install 'pcgopt[plot]'"
        ) from None

    # A lane is a stream of the first device of a block: every task on it runs on that device.
    def lane_of(t: Any) -> tuple[int, bool]:
        return (t.first_device, t.stream != "compute")

    widest: dict[tuple[int, bool], int] = {}
    for t in timeline.tasks:
        widest[lane_of(t)] = max(widest.get(lane_of(t), 0), t.devices)
    lanes = sorted(widest)
    row = {lane: i for i, lane in enumerate(lanes)}
    labels = []
    for first, comm in lanes:
        what = "communication" if comm else "compute"
        count = widest[(first, comm)]
        where = f"devices {first}-{first + count - 1}" if count > 1 else f"device {first}"
        labels.append(f"{what}, {where}")
    fig = Figure(figsize=(10, 0.9 + 0.35 * max(1, len(lanes))))
    ax = fig.add_axes((0.22, 0.35 / fig.get_figheight() + 0.12, 0.75, 0.6))
    scale = 1e3  # ms
    for lane in lanes:
        for phase, colour in PHASES.items():
            bars = [
                (t.start_s * scale, t.seconds * scale)
                for t in timeline.tasks
                if lane_of(t) == lane and t.phase == phase
            ]
            if bars:
                drawn = ax.broken_barh(
                    bars,
                    (row[lane] + 0.1, 0.8),
                    facecolors=colour,
                    edgecolor="white",
                    linewidth=0.2,
                )
                drawn.set_gid(f"lane-{row[lane]}-{phase}")
    ax.set_ylim(len(lanes), 0)
    ax.set_xlim(0, timeline.time_s * scale)
    ax.set_yticks([i + 0.5 for i in range(len(lanes))], labels, fontsize=8)
    ax.set_xlabel("ms", fontsize=8)
    ax.tick_params(labelsize=7)
    phases = {t.phase for t in timeline.tasks}
    fig.legend(
        handles=[Patch(facecolor=c, label=p) for p, c in PHASES.items() if p in phases],
        loc="lower left",
        ncol=len(PHASES),
        fontsize=7.5,
        frameon=False,
    )
    heading = title or repr(timeline)
    fig.text(0.01, 0.98, heading, ha="left", va="top", fontsize=9)
    return fig


def save_timeline(timeline: Timeline, path: str | Path, title: str = "") -> Path:
    """Writes the Gantt chart of ``timeline`` (:func:`timeline_figure`) to ``path`` (``.svg``
    or ``.png``); returns the path."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise PictureError(
            f"{path}: a picture is written as {' or '.join(SUFFIXES)}, not {path.suffix!r}"
        )
    return _save(timeline_figure(timeline, title), path)


__all__ = [
    "IDLE",
    "KINDS",
    "MAX_COLUMNS",
    "PHASES",
    "PictureError",
    "device_map_figure",
    "kind_of",
    "save_device_map",
    "save_timeline",
    "timeline_figure",
]
