"""The machine model: presets from public figures, device numbering, which link a group uses,
and descriptions read from JSON with errors that name the field at fault."""

import dataclasses
import json
import pickle
import sys

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import pcgopt
from pcgopt import DType
from pcgopt.machine import (
    PRESET_NAMES,
    DeviceSpec,
    GroupLevel,
    Level,
    Link,
    Machine,
    MachineError,
)

GB = 1e9


def tiny_device() -> DeviceSpec:
    return DeviceSpec("toy", {"f32": 1e12}, memory_bandwidth_Bps=1e11, memory_bytes=2**30)


# --- Presets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "nodes", "devices_per_node", "num_devices"),
    [
        ("summit", 1, None, 6),
        ("summit", 4, None, 24),
        ("summit", 32, None, 192),  # Unity's largest run: 192 GPUs on 32 nodes
        ("dgx-a100", 2, None, 32),
        ("dgx-a100", 4, None, 64),
        ("v100-ring", 2, None, 16),
        ("v100-ring", 4, None, 32),
        ("dgx-h100", 2, None, 16),
        ("summit", 2, 3, 6),
        ("summit", 3, 1, 3),
        ("dgx-a100", 2, 8, 16),
        ("dgx-h100", 1, 4, 4),
        ("piz-daint", 64, None, 64),  # AutoDDL's Transformer run on 64 nodes
    ],
)
def test_preset_device_counts(name, nodes, devices_per_node, num_devices):
    m = Machine.preset(name, nodes=nodes, devices_per_node=devices_per_node)
    assert m.num_devices == num_devices
    assert m.levels[0].name == "node" and m.levels[0].count == nodes


def test_every_preset_name_is_listed_and_builds():
    assert set(PRESET_NAMES) == {"summit", "dgx-a100", "v100-ring", "dgx-h100", "piz-daint"}
    assert Machine.preset_names() == PRESET_NAMES
    for name in PRESET_NAMES:
        assert Machine.preset(name).name == name


def test_summit_is_nodes_of_two_sockets_of_three_v100():
    m = Machine.preset("summit", nodes=4)
    assert [(level.name, level.count) for level in m.levels] == [
        ("node", 4),
        ("socket", 2),
        ("gpu", 3),
    ]
    assert m.device.name == "V100-SXM2-16GB"
    assert m.peak_flops("f32") == 15.7e12
    assert m.peak_flops(DType.F16) == 125e12
    assert m.device.memory_bytes == 16 * 2**30
    assert m.device.memory_bandwidth_Bps == 900 * GB


def test_p2_machines_use_the_p2_simulator_bandwidths():
    """P^2 section 5: 8 GB/s effective per NIC, 270 GB/s per A100 through the NVSwitch, 135 GB/s
    each way on the V100 NVLink ring; hierarchies [nodes 16] and [nodes 8]."""
    a100 = Machine.preset("dgx-a100", nodes=2)
    assert a100.counts == (2, 16)
    assert a100.levels[0].link.bandwidth_Bps == 8 * GB
    assert a100.levels[1].link == Link(270 * GB, a100.levels[1].link.latency_s, "switched")
    ring = Machine.preset("v100-ring", nodes=4)
    assert ring.counts == (4, 8)
    assert ring.levels[1].link.topology == "ring"
    assert ring.levels[1].link.bandwidth_Bps == 135 * GB
    assert ring.levels[0].link.bandwidth_Bps == 8 * GB


def test_dgx_h100_has_eight_ndr_ports_and_nvlink4_per_node():
    m = Machine.preset("dgx-h100", nodes=2)
    assert m.counts == (2, 8)
    assert m.levels[0].link.bandwidth_Bps == 8 * 400e9 / 8  # 8 x 400 Gb/s
    assert m.levels[1].link.bandwidth_Bps == 450 * GB  # 900 GB/s both ways
    assert m.peak_flops("bf16") == 989.4e12
    assert m.device.memory_bytes == 80 * 2**30


def test_preset_links_get_slower_outward():
    for name in PRESET_NAMES:
        bandwidths = [level.link.bandwidth_Bps for level in Machine.preset(name).levels]
        assert bandwidths == sorted(bandwidths), name


# --- Numbering and links ----------------------------------------------------------------------


def test_devices_are_numbered_closest_first():
    m = Machine.preset("summit", nodes=2)
    assert [m.coordinates(d) for d in (0, 2, 3, 5, 6, 7, 11)] == [
        (0, 0, 0),
        (0, 0, 2),
        (0, 1, 0),
        (0, 1, 2),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 2),
    ]


def test_level_of_two_devices_on_summit():
    m = Machine.preset("summit", nodes=2)
    assert m.level_of(0, 2).name == "gpu"  # same socket: NVLink
    assert m.level_of(2, 3).name == "socket"  # neighbours in numbering, other socket: X-Bus
    assert m.level_of(5, 6).name == "node"  # other node: InfiniBand
    assert m.level_of(11, 0).name == "node"


@pytest.mark.parametrize(
    ("group", "bandwidth", "level"),
    [
        ([0, 1, 2], 50 * GB, "gpu"),  # within a socket's triad: NVLink 2.0
        ([0, 1], 50 * GB, "gpu"),
        ([0, 3], 32 * GB, "socket"),  # across the sockets of a node: X-Bus
        ([0, 1, 2, 3, 4, 5], 32 * GB, "socket"),
        ([0, 6], 25 * GB, "node"),  # across nodes: dual-rail EDR InfiniBand
        ([2, 3, 6], 25 * GB, "node"),
        (range(12), 25 * GB, "node"),
    ],
)
def test_slowest_link_on_summit(group, bandwidth, level):
    m = Machine.preset("summit", nodes=2)
    link = m.slowest_link(group)
    assert link.bandwidth_Bps == bandwidth
    assert link == next(lv.link for lv in m.levels if lv.name == level)


def test_group_levels_say_how_many_units_a_group_uses_at_each_level():
    m = Machine.preset("summit", nodes=2)
    spans = m.group_levels([0, 1, 2, 6, 7, 8])  # socket 0 of both nodes
    assert spans == (GroupLevel(0, m.levels[0], 2), GroupLevel(2, m.levels[2], 3))
    assert [(g.level.name, g.participants) for g in m.group_levels([0, 3])] == [("socket", 2)]
    assert [(g.level.name, g.participants) for g in m.group_levels(range(12))] == [
        ("node", 2),
        ("socket", 2),
        ("gpu", 3),
    ]
    assert m.group_levels([4]) == ()
    assert m.group_levels([4, 4]) == ()


def test_a_message_goes_through_the_inner_links_on_its_way_out():
    """P^2 section 2.1: a reduction across CPUs "requires communication over S0/S1/S2". Here the
    outer link is faster than the inner one, so the inner one limits a pair across the outer."""
    slow_inside = Machine(
        (Level("node", 2, Link(100e9, 0)), Level("gpu", 2, Link(10e9, 0))), tiny_device()
    )
    assert slow_inside.level_of(0, 2).name == "node"
    assert slow_inside.slowest_link([0, 2]) == Link(10e9, 0)
    assert slow_inside.slowest_link([0, 1, 2]) == Link(10e9, 0)


def test_a_single_device_crosses_no_link():
    m = Machine.preset("summit")
    with pytest.raises(MachineError, match=r"single device"):
        m.slowest_link([3])
    with pytest.raises(MachineError, match=r"same device"):
        m.level_of(3, 3)


def test_devices_out_of_range_are_reported_with_the_range():
    m = Machine.preset("summit", nodes=2)
    with pytest.raises(MachineError, match=r"device 12 is out of range.*12 devices \(0\.\.11\)"):
        m.level_of(0, 12)
    with pytest.raises(MachineError, match=r"out of range"):
        m.slowest_link([0, -1])
    with pytest.raises(MachineError, match=r"integer index"):
        m.coordinates(1.5)


# --- devices_per_node -------------------------------------------------------------------------


def test_devices_per_node_takes_the_closest_devices_of_each_node():
    m = Machine.preset("summit", nodes=2, devices_per_node=3)
    assert m.counts == (2, 1, 3)  # one socket's triad per node
    assert m.slowest_link([0, 1, 2]).bandwidth_Bps == 50 * GB  # all on NVLink
    assert m.level_of(2, 3).name == "node"
    two = Machine.preset("summit", nodes=1, devices_per_node=2)
    assert two.counts == (1, 1, 2)
    assert Machine.preset("summit", nodes=2, devices_per_node=6) == Machine.preset(
        "summit", nodes=2
    )


def test_devices_per_node_must_fill_whole_units():
    with pytest.raises(MachineError) as info:
        Machine.preset("summit", nodes=2, devices_per_node=4)
    message = str(info.value)
    assert message.startswith("devices_per_node:")
    assert "valid values: 1, 2, 3, 6" in message
    with pytest.raises(MachineError, match=r"valid values: 1, 2, .*, 16$"):
        Machine.preset("dgx-a100", devices_per_node=17)
    with pytest.raises(MachineError, match=r"devices_per_node: must be >= 1, got 0"):
        Machine.preset("dgx-a100", devices_per_node=0)


def test_a_cut_ring_stays_a_ring():
    m = Machine.preset("v100-ring", nodes=2, devices_per_node=4)
    assert m.counts == (2, 4)
    assert m.levels[1].link.topology == "ring"


# --- Preset errors ----------------------------------------------------------------------------


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(MachineError) as info:
        Machine.preset("dgx-b200")
    assert "'dgx-b200'" in str(info.value)
    assert "dgx-a100, dgx-h100, piz-daint, summit, v100-ring" in str(info.value)


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        (0, r"^nodes: must be >= 1, got 0$"),
        (-2, r"^nodes: must be >= 1, got -2$"),
        (2.5, r"^nodes: must be a positive integer, got 2\.5$"),
        ("4", r"^nodes: must be a positive integer, got '4'$"),
        (True, r"^nodes: must be a positive integer, got True$"),
    ],
)
def test_bad_node_counts_are_rejected(nodes, message):
    with pytest.raises(MachineError, match=message):
        Machine.preset("summit", nodes=nodes)


def test_machine_error_is_a_value_error_and_exported():
    assert issubclass(MachineError, ValueError)
    assert pcgopt.Machine is Machine
    assert pcgopt.MachineError is MachineError
    assert (pcgopt.Level, pcgopt.Link, pcgopt.DeviceSpec) == (Level, Link, DeviceSpec)


# --- Device -----------------------------------------------------------------------------------


def test_unknown_dtype_names_the_device_and_the_known_ones():
    m = Machine.preset("summit")
    with pytest.raises(MachineError) as info:
        m.peak_flops("bf16")  # Volta has no bf16
    assert str(info.value) == (
        "device 'V100-SXM2-16GB' has no peak FLOP/s for dtype 'bf16'; it has: f16, f32, f64"
    )
    assert Machine.preset("dgx-a100").peak_flops(DType.BF16) == 312e12


def test_peak_flops_accepts_dtype_keys_and_cannot_be_changed():
    spec = DeviceSpec("toy", {DType.F32: 2e12}, 1e11, 2**30)
    assert spec.peak_flops == {"f32": 2e12}
    with pytest.raises(TypeError):
        spec.peak_flops["f32"] = 1.0  # type: ignore[index]


# --- Value types ------------------------------------------------------------------------------


def test_values_are_immutable_hashable_and_picklable():
    m = Machine.preset("summit", nodes=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.name = "other"  # type: ignore[misc]
    assert {m: 1}[Machine.preset("summit", nodes=2)] == 1
    assert pickle.loads(pickle.dumps(m)) == m
    assert pickle.loads(pickle.dumps(m)).level_of(0, 7).name == "node"


def test_reprs_are_readable():
    assert repr(Link(25e9, 9.6e-6)) == "Link(25 GB/s, 9.6 µs, switched)"
    assert repr(Level("gpu", 8, Link(135e9, 3.4e-6, "ring"))) == (
        "Level('gpu', 8, Link(135 GB/s, 3.4 µs, ring))"
    )
    assert repr(Machine.preset("summit", nodes=4)) == (
        "Machine('summit', node 4 x socket 2 x gpu 3 = 24 x V100-SXM2-16GB)"
    )
    assert "16 GiB at 900 GB/s" in repr(Machine.preset("summit").device)
    table = Machine.preset("summit", nodes=2).describe()
    assert "socket" in table and "32 GB/s" in table and "ring" not in table


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Link(-3, 1e-6), r"^bandwidth_Bps: must be > 0, got -3$"),
        (lambda: Link(1e9, -1e-6), r"^latency_s: must be >= 0"),
        (lambda: Link(float("inf"), 0), r"^bandwidth_Bps: must be finite"),
        (lambda: Link(1e9, 0, "mesh"), r"^topology: must be one of switched, ring; got 'mesh'$"),
        (lambda: Level("gpu", 0, Link(1e9, 0)), r"^count: must be >= 1, got 0$"),
        (lambda: Level("", 2, Link(1e9, 0)), r"^name: must be a non-empty string"),
        (lambda: Machine((), tiny_device()), r"^levels: must hold at least one level$"),
        (
            lambda: Machine((Level("gpu", 2, Link(1e9, 0)),) * 2, tiny_device()),
            r"^levels\[1\]\.name: level name 'gpu' is already used by levels\[0\]",
        ),
        (
            lambda: DeviceSpec("toy", {"f32": 0}, 1e11, 2**30),
            r"^peak_flops\.f32: must be > 0, got 0$",
        ),
        (lambda: DeviceSpec("toy", {}, 1e11, 2**30), r"^peak_flops: must be a non-empty mapping"),
        (lambda: DeviceSpec("toy", {"f32": 1e12}, 1e11, 0.5), r"^memory_bytes: must be a pos"),
    ],
)
def test_constructors_name_the_field_at_fault(build, message):
    with pytest.raises(MachineError, match=message):
        build()


# --- Serialization ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_to_dict_from_dict_round_trip(name):
    m = Machine.preset(name, nodes=3)
    data = m.to_dict()
    assert data["format"] == "pcgopt.machine" and data["version"] == 1
    assert Machine.from_dict(data) == m
    assert Machine.from_dict(json.loads(json.dumps(data))) == m


def test_load_a_users_cluster_from_json(tmp_path):
    cluster = {
        "name": "lab",
        "levels": [
            {"name": "node", "count": 2, "link": {"bandwidth_Bps": 12.5e9, "latency_s": 5e-6}},
            {
                "name": "gpu",
                "count": 4,
                "link": {"bandwidth_Bps": 32e9, "latency_s": 2e-6, "topology": "ring"},
            },
        ],
        "device": {
            "name": "toy",
            "peak_flops": {"f32": 1e13, "f16": 4e13},
            "memory_bandwidth_Bps": 5e11,
            "memory_bytes": 24 * 2**30,
        },
    }
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(cluster))
    m = Machine.load(path)
    assert m.name == "lab" and m.num_devices == 8
    assert m.levels[0].link.topology == "switched"  # the default
    assert m.slowest_link([0, 1, 2, 3]) == Link(32e9, 2e-6, "ring")
    assert m.device.launch_overhead_s == 0.0
    preset = Machine.preset("summit", nodes=2)
    saved = tmp_path / "summit.json"
    saved.write_text(json.dumps(preset.to_dict()))
    assert Machine.load(str(saved)) == preset


def test_yaml_without_pyyaml_says_to_use_json(tmp_path, monkeypatch):
    path = tmp_path / "cluster.yaml"
    path.write_text("name: lab\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(
        MachineError, match=r"needs PyYAML \(pip install pyyaml\); or write .* JSON"
    ):
        Machine.load(path)


def test_load_reports_bad_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{levels: ")
    with pytest.raises(MachineError, match=r"bad\.json: not valid JSON"):
        Machine.load(bad)
    other = tmp_path / "cluster.toml"
    other.write_text("")
    with pytest.raises(MachineError, match=r"unknown file type '\.toml'; a machine file ends"):
        Machine.load(other)
    with pytest.raises(MachineError, match=r"cannot read machine file .*none\.json: No such"):
        Machine.load(tmp_path / "none.json")
    with pytest.raises(MachineError, match=r"is a directory, not a machine file"):
        Machine.load(tmp_path)
    wrong = Machine.preset("summit").to_dict()
    wrong["levels"][1]["link"]["bandwidth_Bps"] = -3
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps(wrong))
    with pytest.raises(MachineError) as info:
        Machine.load(path)
    assert str(info.value) == f"{path}: levels[1].link.bandwidth_Bps: must be > 0, got -3"
    assert info.value.field == "levels[1].link.bandwidth_Bps"
    assert info.value.source == str(path)


def summit_dict_with(edit):
    data = Machine.preset("summit").to_dict()
    edit(data)
    return data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["levels"][1]["link"].update(bandwidth_Bps=-3),
            "levels[1].link.bandwidth_Bps: must be > 0, got -3",
        ),
        (
            lambda d: d["levels"][2]["link"].update(topology="torus"),
            "levels[2].link.topology: must be one of switched, ring; got 'torus'",
        ),
        (lambda d: d["levels"][0].update(count=0), "levels[0].count: must be >= 1, got 0"),
        (
            lambda d: d["levels"][0]["link"].pop("latency_s"),
            "levels[0].link: missing field 'latency_s'",
        ),
        (
            lambda d: d["levels"][0]["link"].update(bandwith_Bps=1),
            "levels[0].link: unknown field 'bandwith_Bps'; valid fields: bandwidth_Bps, "
            "latency_s, topology",
        ),
        (
            lambda d: d["device"]["peak_flops"].update(f16="fast"),
            "device.peak_flops.f16: must be a number, got 'fast'",
        ),
        (
            lambda d: d["device"].update(memory_bytes=-1),
            "device.memory_bytes: must be >= 1, got -1",
        ),
        (lambda d: d.update(levels=[]), "levels: must be a non-empty list of levels"),
        (lambda d: d.pop("device"), "machine: missing field 'device'"),
        (lambda d: d.update(version=7), "version: this pcgopt reads machine format versions up"),
        (lambda d: d.update(format="pcgopt.pcg"), "format: this is not a machine description"),
        (lambda d: d["levels"].__setitem__(1, 5), "levels[1]: must be an object"),
    ],
)
def test_from_dict_errors_name_the_field_and_what_is_valid(edit, message):
    with pytest.raises(MachineError) as info:
        Machine.from_dict(summit_dict_with(edit))
    assert str(info.value).startswith(message)


# --- Properties -------------------------------------------------------------------------------


@st.composite
def machines(draw):
    """Small machines with arbitrary counts and bandwidths (not necessarily slower outward)."""
    depth = draw(st.integers(1, 4))
    levels = tuple(
        Level(
            f"l{i}",
            draw(st.integers(1, 4)),
            Link(
                draw(st.floats(1e6, 1e12)),
                draw(st.floats(0, 1e-4)),
                draw(st.sampled_from(["switched", "ring"])),
            ),
        )
        for i in range(depth)
    )
    return Machine(levels, tiny_device(), name="drawn")


@st.composite
def machine_and_nested_groups(draw):
    m = draw(machines())
    assume(m.num_devices >= 2)
    devices = st.integers(0, m.num_devices - 1)
    sub = draw(st.sets(devices, min_size=2, max_size=m.num_devices))
    extra = draw(st.sets(devices, max_size=m.num_devices))
    return m, sub, sub | extra


@given(machine_and_nested_groups())
def test_a_group_is_never_on_a_faster_link_than_its_subgroups(case):
    m, sub, group = case
    assert m.slowest_link(group).bandwidth_Bps <= m.slowest_link(sub).bandwidth_Bps
    assert {g.index for g in m.group_levels(sub)} <= {g.index for g in m.group_levels(group)}


@given(machines(), st.data())
def test_level_of_is_symmetric_and_is_the_outermost_level_a_pair_spans(m, data):
    assume(m.num_devices >= 2)
    a, b = data.draw(
        st.lists(st.integers(0, m.num_devices - 1), min_size=2, max_size=2, unique=True)
    )
    assert m.level_of(a, b) == m.level_of(b, a)
    (span,) = m.group_levels([a, b])
    assert span.level == m.level_of(a, b) and span.participants == 2
    assert m.slowest_link([a, b]).bandwidth_Bps <= m.level_of(a, b).link.bandwidth_Bps


@given(machines(), st.data())
def test_when_links_get_slower_outward_the_outermost_spanned_link_is_the_slowest(m, data):
    bandwidths = sorted(level.link.bandwidth_Bps for level in m.levels)  # outermost slowest
    m = Machine(
        tuple(
            Level(level.name, level.count, dataclasses.replace(level.link, bandwidth_Bps=bw))
            for level, bw in zip(m.levels, bandwidths, strict=True)
        ),
        m.device,
    )
    assume(m.num_devices >= 2)
    group = data.draw(st.sets(st.integers(0, m.num_devices - 1), min_size=2))
    assert m.slowest_link(group) == m.group_levels(group)[0].level.link


@given(machines())
def test_coordinates_number_the_devices_in_mixed_radix(m):
    seen = [m.coordinates(d) for d in range(m.num_devices)]
    assert seen == sorted(seen) and len(set(seen)) == m.num_devices
    assert all(
        0 <= c < level.count for coords in seen for c, level in zip(coords, m.levels, strict=True)
    )


@given(machines())
def test_the_whole_machine_spans_every_level_with_more_than_one_unit(m):
    if m.num_devices == 1:
        assert m.group_levels([0]) == ()
        return
    spans = m.group_levels(range(m.num_devices))
    assert [(g.level, g.participants) for g in spans] == [
        (level, level.count) for level in m.levels if level.count > 1
    ]


@given(machines())
def test_round_trip_of_any_machine(m):
    assert Machine.from_dict(json.loads(json.dumps(m.to_dict()))) == m
