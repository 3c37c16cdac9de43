"""A plan's device map as a picture (pcgopt.extract.search.picture), checked as a person would
look at it: the rendered SVG names every layer and colours exactly the devices each runs on;
the rendered PNG shows those colours where the cells are."""

import sys
import xml.etree.ElementTree as ET

import matplotlib.image
import numpy as np
import pytest

from pcgopt import Machine
from pcgopt.extract.search.picture import (
    IDLE,
    KINDS,
    PictureError,
    device_map_figure,
    kind_of,
)
from pcgopt.extract.search.plan import mapped_plan
from pcgopt.extract.strategies.baselines import data_parallel, megatron
from pcgopt.models import ZOO

SVG = "{http://www.w3.org/2000/svg}"
FOUR = Machine.preset("dgx-a100", devices_per_node=4)
SIX = Machine.preset("summit")


def _cells(svg_path) -> dict[int, dict[str, set[int]]]:
    """Row -> kind -> the devices its cells cover, read back from the SVG's ids; each cell is
    filled with its kind's colour."""
    colours = {k.replace(" + ", "+").replace(" ", "-"): c for k, c in KINDS.items()}
    colours["idle"] = IDLE
    rows: dict[int, dict[str, set[int]]] = {}
    for el in ET.parse(svg_path).iter():
        gid = el.get("id", "")
        if gid.startswith("cell-"):
            _, row, first, last, kind = gid.split("-", 4)
            (path,) = el.iter(f"{SVG}path")
            assert f"fill: {colours[kind]}" in path.get("style"), (gid, path.get("style"))
            devices = set(range(int(first), int(last) + 1))
            rows.setdefault(int(row), {}).setdefault(kind, set()).update(devices)
    return rows


def _texts(svg_path) -> list[str]:
    return [el.text or "" for el in ET.parse(svg_path).iter(f"{SVG}text")]


def test_the_svg_names_every_layer_and_colours_exactly_the_devices_it_runs_on(tmp_path):
    # Unsplit DLRM on a Summit node: the mapping runs each embedding bag on a device of its own.
    model = ZOO["dlrm"].build(small=True)
    plan = mapped_plan(model, SIX)
    rows = plan.layers()
    path = plan.save_device_map(tmp_path / "dlrm.svg")
    texts = _texts(path)
    assert any(t.startswith("plan for summit (6 x V100") for t in texts)
    for row in rows:
        assert row.label in texts
    cells = _cells(path)
    assert sorted(cells) == list(range(len(rows)))
    for i, row in enumerate(rows):
        used = {d for kind, ds in cells[i].items() if kind != "idle" for d in ds}
        assert used == set(row.device_set)
        assert cells[i].get("idle", set()) == set(range(6)) - used
    assert len({d for r in rows for d in r.device_set}) > 1  # several devices, several rows
    assert "one device" in texts and "idle" in texts  # the legend


def test_the_png_shows_each_kinds_colour_where_its_cells_are(tmp_path):
    model = ZOO["bert_large"].build(small=True, layers=3, batch=4)
    plan = mapped_plan(megatron(model, FOUR), FOUR)
    rows = plan.layers()
    fig = device_map_figure(plan)
    path = plan.save_device_map(tmp_path / "bert.png")
    image = matplotlib.image.imread(path)  # RGBA floats, row 0 at the top
    scale = 150 / fig.dpi  # save_device_map's resolution
    ax = fig.axes[0]
    seen = set()
    for i, row in enumerate(rows):
        for device in range(4):
            x, y = ax.transData.transform((device + 0.5, i + 0.5)) * scale
            pixel = image[int(image.shape[0] - y), int(x), :3]
            used = device in row.device_set
            want = KINDS[kind_of(row.strategy)] if used else IDLE
            rgb = np.array([int(want[k : k + 2], 16) / 255 for k in (1, 3, 5)])
            assert np.allclose(pixel, rgb, atol=0.02), (row.label, device, pixel, want)
            seen.add(want)
    assert KINDS["tensor parallel"] in seen or KINDS["data + tensor parallel"] in seen


def test_on_a_large_machine_a_column_stands_for_a_node(tmp_path):
    model = ZOO["mlp"].build(small=True, batch=64)
    four_nodes = data_parallel(model, Machine.preset("summit", nodes=4))
    plan = mapped_plan(four_nodes, Machine.preset("summit", nodes=64))  # 384 GPUs, 24 used
    path = plan.save_device_map(tmp_path / "big.svg")
    cells = _cells(path)
    for i, row in enumerate(plan.layers()):
        columns = set().union(*cells[i].values())
        assert columns == set(range(64))  # one column per node of 6 devices
        used = {c for kind, cs in cells[i].items() if kind != "idle" for c in cs}
        assert used == {d // 6 for d in row.device_set}
        assert 1 <= len(used) < 64
    assert any("node (6 devices)" in t for t in _texts(path))


def test_the_kind_of_parallelism_is_read_from_the_strategy():
    assert kind_of("data parallel x4; weights copied") == "data parallel"
    assert kind_of("tensor parallel x2 (dim 1), replicated x2") == "tensor parallel"
    assert kind_of("data parallel x2, reduction parallel x2 (partial sums)") == (
        "data + reduction parallel"
    )
    assert kind_of("replicated x4; weights copied") == "replicated"
    assert kind_of("one device") == kind_of("no computation") == "one device"


def test_a_picture_of_an_unknown_kind_or_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    plan = mapped_plan(ZOO["mlp"].build(small=True), SIX)
    with pytest.raises(PictureError, match=r"map\.pdf: a picture is written as \.svg or \.png"):
        plan.save_device_map(tmp_path / "map.pdf")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(PictureError, match=r"pip install 'pcgopt\[plot\]'"):
        plan.save_device_map(tmp_path / "map.svg")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("machine", ["summit:20000", "flat:1000"])
def test_a_picture_never_has_more_columns_than_it_can_show(tmp_path, machine):
    # Found in review: 20,000 Summit nodes drew 20,000 columns (a PNG 90,868 pixels wide).
    from pcgopt.extract.search.picture import MAX_COLUMNS
    from pcgopt.testing.strategies import flat_machine

    name, count = machine.split(":")
    m = (
        Machine.preset("summit", nodes=int(count))
        if name == "summit"
        else flat_machine(int(count), bandwidth=10e9, latency=5e-6)
    )
    plan = mapped_plan(ZOO["mlp"].build(small=True), m)
    cells = _cells(plan.save_device_map(tmp_path / "map.svg"))
    columns = set().union(*(c for row in cells.values() for c in row.values()))
    assert 1 < len(columns) <= MAX_COLUMNS


def test_the_timeline_draws_each_stream_and_phase_where_the_simulation_put_it(tmp_path):
    plan = mapped_plan(data_parallel(ZOO["mnist_mlp"].build(small=True), FOUR), FOUR)
    timeline = plan.cost.timeline()
    path = plan.save_timeline(tmp_path / "timeline.svg")
    texts = _texts(path)
    assert "compute, devices 0-3" in texts and "communication, devices 0-3" in texts
    groups = {el.get("id") for el in ET.parse(path).iter() if el.get("id", "").startswith("lane-")}
    # One group per lane and phase the timeline has: forward and backward kernels, the
    # update on the compute lane; the gradient buckets (and the output's Combine) on the other.
    drawn = {tuple(g.split("-")[1:]) for g in groups}
    expected = {(str(int(t.stream == "comm")), t.phase) for t in timeline.tasks}
    assert expected == drawn and ("1", "sync") in drawn
    with pytest.raises(PictureError, match=r"not '\.pdf'"):
        plan.save_timeline(tmp_path / "timeline.pdf")
