"""The machine a PCG runs on: a hierarchy of levels, the links that join them, and the device.

A machine is a tree described level by level, from the outermost (nodes of a cluster) to the
innermost (the devices themselves). A :class:`Level` names a kind of unit, says how many of
those units each unit of the enclosing level holds (``count``; for the outermost level, how many
the machine holds), and gives the :class:`Link` that joins those sibling units. Summit, in
P^2's notation ``[nodes 2 3]``, is::

    Level("node", N, dual-rail EDR InfiniBand)   N nodes, joined by the network
    Level("socket", 2, X-Bus)                    2 sockets in a node, joined by the X-Bus
    Level("gpu", 3, NVLink 2.0)                  3 GPUs in a socket, joined by NVLink

Devices are numbered so that consecutive numbers are closest: a device's number is its
coordinates (one digit per level, outermost most significant) read in mixed radix. On two
Summit nodes::

    device  0 1 2 | 3 4 5 || 6 7 8 | 9 10 11
    socket  0     | 1     || 0     | 1
    node    0             || 1

Two devices talk over the link of the outermost level at which their coordinates differ
(:meth:`Machine.level_of`): 0 and 2 over NVLink, 0 and 4 over the X-Bus, 0 and 7 over
InfiniBand. A group of devices spans every level at which two of its members differ
(:meth:`Machine.group_levels`, with how many units of that level it occupies, which is what a
hierarchical collective needs). A message between two devices climbs from the device through
the link of every level up to the one that separates them (P^2's "communication over
S0/S1/S2"), so a flat collective on the group is limited by the slowest of those links
(:meth:`Machine.slowest_link`); on every preset, links get slower outward and that is the link of
the outermost level the group spans. The bandwidth of a link is what *one* unit of its level can
send in each direction: per GPU for the innermost level, per node (shared by all the node's
devices) for the network.

>>> m = Machine.preset("summit", nodes=2)
>>> m.num_devices
12
>>> m.level_of(0, 4).name
'socket'
>>> m.slowest_link([0, 1, 2])
Link(50 GB/s, 3.4 µs, switched)
>>> [(g.level.name, g.participants) for g in m.group_levels([0, 1, 2, 6, 7, 8])]
[('node', 2), ('gpu', 3)]

Presets (:meth:`Machine.preset`) describe the machines of the papers and current ones, each
number with its public source next to it; :meth:`Machine.from_dict` and :meth:`Machine.load`
read a user's own cluster from JSON (or YAML, with PyYAML installed).
"""

from __future__ import annotations

import json
import math
import operator
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from pcgopt.shapes import DType

__all__ = [
    "A100_SXM4_40GB",
    "H100_SXM5_80GB",
    "PRESET_NAMES",
    "V100_SXM2_16GB",
    "DeviceSpec",
    "GroupLevel",
    "Level",
    "Link",
    "Machine",
    "MachineError",
    "Topology",
]

Topology = Literal["switched", "ring"]
_TOPOLOGIES: tuple[str, ...] = get_args(Topology)

FORMAT = "pcgopt.machine"
VERSION = 1


class MachineError(ValueError):
    """A machine description is invalid, or a question about it makes no sense.

    ``field`` is the path of the field at fault when there is one (``levels[1].link.latency_s``),
    ``source`` the file it was read from; the message starts with them.
    """

    def __init__(self, reason: str, *, field: str | None = None, source: str | None = None) -> None:
        where = [part for part in (source, field) if part]
        super().__init__(": ".join([*where, reason]))
        self.reason = reason
        self.field = field
        self.source = source

    def within(self, prefix: str) -> MachineError:
        """The same error, with ``prefix`` (the path of the enclosing object) before its field."""
        if self.field is None:
            path = prefix
        elif self.field.startswith("["):
            path = f"{prefix}{self.field}"
        else:
            path = f"{prefix}.{self.field}"
        return MachineError(self.reason, field=path, source=self.source)


# --- Validation -------------------------------------------------------------------------------
# Each check takes the path of the value, so that the same code serves the dataclass constructors
# (path "bandwidth_Bps") and from_dict (path "levels[1].link.bandwidth_Bps").


def _number(value: Any, path: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MachineError(f"must be a number, got {value!r}", field=path)
    if not math.isfinite(value):
        raise MachineError(f"must be finite, got {value!r}", field=path)
    if positive and value <= 0:
        raise MachineError(f"must be > 0, got {value!r}", field=path)
    if not positive and value < 0:
        raise MachineError(f"must be >= 0, got {value!r}", field=path)
    return float(value)


def _positive_int(value: Any, path: str) -> int:
    # Accept 16e9 (as a YAML or JSON writer may produce) but not 2.5 or True.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MachineError(f"must be a positive integer, got {value!r}", field=path)
    if value < 1:
        raise MachineError(f"must be >= 1, got {value!r}", field=path)
    return value


def _name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise MachineError(f"must be a non-empty string, got {value!r}", field=path)
    return value


def _device_index(value: Any, num_devices: int) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        index = operator.index(value)
    except TypeError:
        raise MachineError(f"a device is an integer index, got {value!r}") from None
    if not 0 <= index < num_devices:
        raise MachineError(
            f"device {index} is out of range: this machine has {num_devices} devices "
            f"(0..{num_devices - 1})"
        )
    return index


# --- Readable numbers -------------------------------------------------------------------------


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def _seconds(value: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return "0 s" if value == 0 else f"{value:.3g} s"


def _bytes(value: int) -> str:
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value} B"


# --- Value types ------------------------------------------------------------------------------


class _FrozenMapping(Mapping[str, float]):
    """A read-only, hashable dict, so that a DeviceSpec (and a Machine) can key a cache."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, float]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> float:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return repr(self._data)


@dataclass(frozen=True, slots=True)
class Link:
    """What joins the sibling units of a level.

    ``bandwidth_Bps``: bytes per second that one unit can send in each direction (and receive at
    the same time). ``latency_s``: the per-message start-up time (alpha of the alpha-beta model).
    ``topology``: ``"switched"`` (any unit reaches any other at full bandwidth, all at once:
    NVSwitch, a non-blocking fat tree, a fully connected triad) or ``"ring"`` (each unit is wired
    to two neighbours; ring collectives run at full bandwidth, other patterns are slower).
    """

    bandwidth_Bps: float
    latency_s: float
    topology: Topology = "switched"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "bandwidth_Bps", _number(self.bandwidth_Bps, "bandwidth_Bps", positive=True)
        )
        object.__setattr__(self, "latency_s", _number(self.latency_s, "latency_s", positive=False))
        if self.topology not in _TOPOLOGIES:
            valid = ", ".join(_TOPOLOGIES)
            raise MachineError(f"must be one of {valid}; got {self.topology!r}", field="topology")

    def __repr__(self) -> str:
        return (
            f"Link({_si(self.bandwidth_Bps, 'B/s')}, {_seconds(self.latency_s)}, {self.topology})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "bandwidth_Bps": self.bandwidth_Bps,
            "latency_s": self.latency_s,
            "topology": self.topology,
        }


@dataclass(frozen=True, slots=True)
class Level:
    """``count`` units named ``name`` inside each unit of the enclosing level (for the outermost
    level: in the machine), joined by ``link``."""

    name: str
    count: int
    link: Link

    def __post_init__(self) -> None:
        _name(self.name, "name")
        object.__setattr__(self, "count", _positive_int(self.count, "count"))
        if not isinstance(self.link, Link):
            raise MachineError(f"must be a Link, got {self.link!r}", field="link")

    def __repr__(self) -> str:
        return f"Level({self.name!r}, {self.count}, {self.link!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "link": self.link.to_dict()}


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One accelerator: what the roofline of the cost model needs.

    ``peak_flops`` maps a dtype name (``"f32"``, ``"f16"``, ``"bf16"``, ... as in
    :class:`pcgopt.DType`; extra names such as ``"tf32"`` are allowed) to FLOP/s. A dtype the
    device has no rate for is left out, and :meth:`peak_flops_for` says so.
    """

    name: str
    peak_flops: Mapping[str, float]
    memory_bandwidth_Bps: float
    memory_bytes: int
    launch_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        _name(self.name, "name")
        if not isinstance(self.peak_flops, Mapping) or not self.peak_flops:
            raise MachineError(
                f"must be a non-empty mapping from dtype name to FLOP/s, got {self.peak_flops!r}",
                field="peak_flops",
            )
        rates: dict[str, float] = {}
        for key, value in self.peak_flops.items():
            dtype = key.value if isinstance(key, DType) else key
            if not isinstance(dtype, str) or not dtype:
                raise MachineError(
                    f"keys must be dtype names such as 'f32', got {key!r}", field="peak_flops"
                )
            rates[dtype] = _number(value, f"peak_flops.{dtype}", positive=True)
        object.__setattr__(self, "peak_flops", _FrozenMapping(dict(sorted(rates.items()))))
        object.__setattr__(
            self,
            "memory_bandwidth_Bps",
            _number(self.memory_bandwidth_Bps, "memory_bandwidth_Bps", positive=True),
        )
        object.__setattr__(self, "memory_bytes", _positive_int(self.memory_bytes, "memory_bytes"))
        object.__setattr__(
            self,
            "launch_overhead_s",
            _number(self.launch_overhead_s, "launch_overhead_s", positive=False),
        )

    def peak_flops_for(self, dtype: DType | str) -> float:
        """FLOP/s for ``dtype``; a MachineError lists the dtypes this device has rates for."""
        key = dtype.value if isinstance(dtype, DType) else dtype
        try:
            return self.peak_flops[key]
        except (KeyError, TypeError):
            known = ", ".join(self.peak_flops)
            raise MachineError(
                f"device {self.name!r} has no peak FLOP/s for dtype {key!r}; it has: {known}"
            ) from None

    def __repr__(self) -> str:
        rates = ", ".join(f"{k}={_si(v, 'FLOP/s')}" for k, v in self.peak_flops.items())
        return (
            f"DeviceSpec({self.name!r}, {rates}, memory {_bytes(self.memory_bytes)} at "
            f"{_si(self.memory_bandwidth_Bps, 'B/s')}, launch {_seconds(self.launch_overhead_s)})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "peak_flops": dict(self.peak_flops),
            "memory_bandwidth_Bps": self.memory_bandwidth_Bps,
            "memory_bytes": self.memory_bytes,
            "launch_overhead_s": self.launch_overhead_s,
        }


@dataclass(frozen=True, slots=True)
class GroupLevel:
    """A level a device group spans: ``index`` into ``Machine.levels``, the level, and
    ``participants``, the most units of that level the group occupies inside one unit of the
    enclosing level (2 for a group on two nodes; 3 for the GPUs of one Summit socket)."""

    index: int
    level: Level
    participants: int

    def __repr__(self) -> str:
        return f"GroupLevel({self.index}, {self.level.name!r}, participants={self.participants})"


#: The most devices a machine may have: the largest clusters hold about 10^5 accelerators, and
#: the searches' loops over devices and their divisors must stay within a time budget.
MAX_DEVICES = 1 << 20


@dataclass(frozen=True, slots=True)
class Machine:
    """A hierarchy of levels, outermost first, of identical devices. See the module docstring
    for the numbering of devices and which link a group uses."""

    levels: tuple[Level, ...]
    device: DeviceSpec
    name: str = "custom"
    # Mixed-radix place value of each level's digit in a device number.
    _strides: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # Derived once: the cost model asks for these per collective, in its hot loop.
    _num_devices: int = field(init=False, repr=False, compare=False)
    _group_levels: dict[tuple[int, ...], tuple[GroupLevel, ...]] = field(
        init=False, repr=False, compare=False
    )
    _coordinates: tuple[tuple[int, ...], ...] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _name(self.name, "name")
        if isinstance(self.levels, Level) or not isinstance(self.levels, Iterable):
            raise MachineError(
                f"must be a sequence of Level, outermost first; got {self.levels!r}",
                field="levels",
            )
        levels = tuple(self.levels)
        if not levels:
            raise MachineError("must hold at least one level", field="levels")
        seen: dict[str, int] = {}
        for i, level in enumerate(levels):
            if not isinstance(level, Level):
                raise MachineError(f"must be a Level, got {level!r}", field=f"levels[{i}]")
            if level.name in seen:
                raise MachineError(
                    f"level name {level.name!r} is already used by levels[{seen[level.name]}]; "
                    "level names must be unique",
                    field=f"levels[{i}].name",
                )
            seen[level.name] = i
        if not isinstance(self.device, DeviceSpec):
            raise MachineError(f"must be a DeviceSpec, got {self.device!r}", field="device")
        object.__setattr__(self, "levels", levels)
        strides = [1] * len(levels)
        for i in range(len(levels) - 2, -1, -1):
            strides[i] = strides[i + 1] * levels[i + 1].count
        object.__setattr__(self, "_strides", tuple(strides))
        num_devices = math.prod(level.count for level in levels)
        if num_devices > MAX_DEVICES:
            raise MachineError(
                f"{num_devices:,} devices ({' x '.join(str(lv.count) for lv in levels)}) is "
                f"more than pcgopt plans for ({MAX_DEVICES:,}); the searches enumerate devices "
                "and their divisors",
                field="levels",
            )
        object.__setattr__(self, "_num_devices", num_devices)
        object.__setattr__(self, "_group_levels", {})
        table = None
        if self._num_devices <= 1 << 16:
            table = tuple(
                tuple(
                    (d // stride) % level.count
                    for stride, level in zip(strides, levels, strict=True)
                )
                for d in range(self._num_devices)
            )
        object.__setattr__(self, "_coordinates", table)

    # --- Shape of the machine --------------------------------------------------------------

    @property
    def num_devices(self) -> int:
        return self._num_devices

    @property
    def counts(self) -> tuple[int, ...]:
        """The count of every level, outermost first (P^2's system hierarchy)."""
        return tuple(level.count for level in self.levels)

    def one_node(self) -> Machine | None:
        """One unit of the outermost level (a node), with the levels below it; None when the
        machine has one level or one node, or when a node is one device. A plan for one node
        is a plan for the whole machine with the other nodes idle, and the one to pick where
        crossing nodes costs more than it gains.

        >>> Machine.preset("summit", nodes=4).one_node().num_devices
        6
        """
        if len(self.levels) < 2 or self.levels[0].count == 1:
            return None
        node = Machine((replace(self.levels[0], count=1), *self.levels[1:]), self.device, self.name)
        return node if node.num_devices > 1 else None

    def level_degrees(self) -> tuple[int, ...]:
        """The degrees that take whole levels of the hierarchy: the products of the counts of
        any levels, above 1, ascending. P^2 places each parallelism axis on levels of the
        machine; a search restricted to these degrees (``saturate(..., degrees=...)``) keeps
        Megatron's tensor parallelism within a node and data parallelism across nodes, and
        leaves out splits of a node into parts.

        >>> Machine.preset("dgx-a100", nodes=4).level_degrees()
        (4, 16, 64)
        """
        products = {1}
        for count in self.counts:
            products |= {p * count for p in products}
        return tuple(sorted(p for p in products if p > 1))

    def coordinates(self, device: int) -> tuple[int, ...]:
        """The unit of each level (outermost first) that holds ``device``.

        >>> Machine.preset("summit", nodes=2).coordinates(7)
        (1, 0, 1)
        """
        d = _device_index(device, self._num_devices)
        if self._coordinates is not None:
            return self._coordinates[d]
        return tuple(
            (d // stride) % level.count
            for stride, level in zip(self._strides, self.levels, strict=True)
        )

    def device_at(self, coordinates: Iterable[int]) -> int:
        """The device at ``coordinates`` (one unit per level, outermost first): the inverse of
        :meth:`coordinates`.

        >>> Machine.preset("summit", nodes=2).device_at((1, 0, 1))
        7
        """
        coords = tuple(coordinates)
        if len(coords) != len(self.levels) or any(
            isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < level.count
            for c, level in zip(coords, self.levels, strict=False)
        ):
            raise MachineError(
                f"coordinates must be one unit per level, within {list(self.counts)}; got "
                f"{list(coords)}"
            )
        return sum(c * stride for c, stride in zip(coords, self._strides, strict=True))

    def peak_flops(self, dtype: DType | str) -> float:
        """The device's peak FLOP/s for ``dtype`` (a :class:`DType` or its name)."""
        return self.device.peak_flops_for(dtype)

    # --- Which links devices use ------------------------------------------------------------

    def _level_index_of(self, a: int, b: int) -> int:
        ca, cb = self.coordinates(a), self.coordinates(b)
        if ca == cb:
            raise MachineError(f"devices {a} and {b} are the same device; no link joins them")
        return next(i for i, (x, y) in enumerate(zip(ca, cb, strict=True)) if x != y)

    def level_of(self, a: int, b: int) -> Level:
        """The outermost level whose link devices ``a`` and ``b`` must cross to talk."""
        return self.levels[self._level_index_of(a, b)]

    def group_levels(self, devices: Iterable[int]) -> tuple[GroupLevel, ...]:
        """The levels a group of devices spans, outermost first, with how many units of each it
        occupies (see :class:`GroupLevel`). A single device spans none.

        For a regular group (the same layout inside every unit it occupies, as every group of a
        parallelism axis placed on the hierarchy is), the product of the participants is the
        size of the group.
        """
        members = tuple(sorted({_device_index(d, self._num_devices) for d in devices}))
        if not members:
            raise MachineError("a device group must hold at least one device")
        cached = self._group_levels.get(members)
        if cached is not None:
            return cached
        coords = [self.coordinates(d) for d in members]
        spans = []
        for i, level in enumerate(self.levels):
            children: dict[tuple[int, ...], set[int]] = {}
            for c in coords:
                children.setdefault(c[:i], set()).add(c[i])
            participants = max(len(units) for units in children.values())
            if participants > 1:
                spans.append(GroupLevel(i, level, participants))
        if len(self._group_levels) < 100_000:  # bounded: groups are few per plan
            self._group_levels[members] = tuple(spans)
        return tuple(spans)

    def slowest_link(self, devices: Iterable[int]) -> Link:
        """The slowest link a flat collective on the group goes through: the slowest among the
        outermost level the group spans and every level inside it (a message climbs through all
        of them; see the module docstring). Ties go to the outer level.

        On every preset links get slower outward, so this is the link of the outermost level the
        group spans. On a machine with a faster outer link it is the slower inner one, and a
        group never gets a faster link by growing.
        """
        members = list(devices)
        spans = self.group_levels(members)
        if not spans:
            raise MachineError(
                f"the group {sorted(set(members))} is a single device and crosses no link"
            )
        on_the_way = range(spans[0].index, len(self.levels))
        slowest = min(on_the_way, key=lambda i: (self.levels[i].link.bandwidth_Bps, i))
        return self.levels[slowest].link

    # --- Presets ---------------------------------------------------------------------------

    @classmethod
    def preset(cls, name: str, *, nodes: int = 1, devices_per_node: int | None = None) -> Machine:
        """A machine of ``nodes`` nodes of a known kind (see ``PRESET_NAMES``).

        ``devices_per_node=None`` uses whole nodes. Otherwise each node contributes its first
        ``devices_per_node`` devices (the closest together), which must fill whole units of one
        level: ``m`` units, ``1 <= m <= count``, of some level inside the node. On Summit (2
        sockets of 3 GPUs) that allows 1, 2 or 3 GPUs of one socket, or 6; 4 or 5 would fill one
        socket and part of the other, so they are rejected with the valid values listed. A ring
        level cut to fewer units keeps ``"ring"``: a path of GPUs on a bidirectional ring still
        runs a ring collective at the ring's per-direction bandwidth.

        >>> Machine.preset("summit", nodes=4).num_devices
        24
        >>> Machine.preset("summit", nodes=2, devices_per_node=3).counts
        (2, 1, 3)
        """
        builder = _PRESETS.get(name) if isinstance(name, str) else None
        if builder is None:
            raise MachineError(
                f"unknown machine preset {name!r}; valid presets: {', '.join(PRESET_NAMES)}"
            )
        nodes = _positive_int(nodes, "nodes")
        machine = builder(nodes)
        if devices_per_node is None:
            return machine
        node, *inside = machine.levels
        return cls(
            (node, *_restrict_node(inside, devices_per_node, name)), machine.device, machine.name
        )

    @staticmethod
    def preset_names() -> tuple[str, ...]:
        return PRESET_NAMES

    # --- Serialization ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description; :meth:`from_dict` reads it back to an equal machine."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "name": self.name,
            "levels": [level.to_dict() for level in self.levels],
            "device": self.device.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Machine:
        """A machine from its description (:meth:`to_dict`'s format; ``format`` and ``version``
        may be left out). Errors name the field at fault, e.g. ``levels[1].link.bandwidth_Bps``.
        """
        _check_object(data, "", required={"levels", "device"}, optional=_MACHINE_OPTIONAL)
        if "format" in data and data["format"] != FORMAT:
            raise MachineError(
                f"this is not a machine description: expected {FORMAT!r}, got {data['format']!r}",
                field="format",
            )
        if "version" in data:
            version = data["version"]
            if isinstance(version, bool) or not isinstance(version, int) or version > VERSION:
                raise MachineError(
                    f"this pcgopt reads machine format versions up to {VERSION}, got {version!r}",
                    field="version",
                )
        raw_levels = data["levels"]
        if not isinstance(raw_levels, list | tuple) or not raw_levels:
            raise MachineError(
                f"must be a non-empty list of levels, outermost first; got {raw_levels!r}",
                field="levels",
            )
        levels = [_level_from_dict(raw, f"levels[{i}]") for i, raw in enumerate(raw_levels)]
        device = _device_from_dict(data["device"], "device")
        return cls(levels=tuple(levels), device=device, name=data.get("name", "custom"))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Machine:
        """Read a machine from a ``.json`` file, or ``.yaml``/``.yml`` if PyYAML is installed."""
        suffix = Path(path).suffix.lower()
        if Path(path).is_dir():
            raise MachineError(f"{os.fspath(path)} is a directory, not a machine file")
        if suffix not in (".json", ".yaml", ".yml"):
            raise MachineError(
                f"{os.fspath(path)}: unknown file type {suffix or '(none)'!r}; a machine file "
                "ends in .json, .yaml or .yml"
            )
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise MachineError(f"cannot read machine file {os.fspath(path)}: {why}") from None
        if suffix in (".yaml", ".yml"):
            try:
                import yaml  # type: ignore[import-untyped]
            except ImportError:
                raise MachineError(
                    f"{os.fspath(path)}: reading YAML needs PyYAML (pip install pyyaml); "
                    "or write the machine as JSON"
                ) from None
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise MachineError(f"{os.fspath(path)}: not valid YAML: {e}") from None
        elif suffix == ".json":
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise MachineError(f"{os.fspath(path)}: not valid JSON: {e}") from None
        if not isinstance(data, Mapping):
            raise MachineError(
                f"{os.fspath(path)}: a machine file holds an object with 'levels' and "
                f"'device', got {type(data).__name__}"
            )
        try:
            return cls.from_dict(data)
        except MachineError as e:
            raise MachineError(e.reason, field=e.field, source=os.fspath(path)) from None

    # --- Display ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        shape = " x ".join(f"{level.name} {level.count}" for level in self.levels)
        return f"Machine({self.name!r}, {shape} = {self.num_devices} x {self.device.name})"

    def describe(self) -> str:
        """A table of the levels and the device, for people."""
        width = max(len(level.name) for level in self.levels)
        lines = [f"{self.name}: {self.num_devices} devices, {self.device!r}"]
        for level in self.levels:
            link = level.link
            lines.append(
                f"  {level.name:<{width}}  x{level.count:<4} {link.topology:<8}  "
                f"{_si(link.bandwidth_Bps, 'B/s'):>11}  {_seconds(link.latency_s):>8}"
            )
        return "\n".join(lines)


# --- from_dict helpers ------------------------------------------------------------------------

_MACHINE_OPTIONAL = {"format", "version", "name"}


def _check_object(
    data: Any, path: str, *, required: set[str], optional: Iterable[str] = ()
) -> None:
    where = path or "machine"
    optional = set(optional)
    if not isinstance(data, Mapping):
        raise MachineError(
            f"must be an object with {', '.join(sorted(required))}, got {data!r}", field=where
        )
    missing = sorted(required - data.keys())
    if missing:
        raise MachineError(f"missing field {missing[0]!r}", field=where)
    unknown = sorted(set(data) - required - optional)
    if unknown:
        valid = ", ".join(sorted(required | optional))
        raise MachineError(f"unknown field {unknown[0]!r}; valid fields: {valid}", field=where)


def _located(path: str, build: Any, /, **kwargs: Any) -> Any:
    try:
        return build(**kwargs)
    except MachineError as e:
        raise e.within(path) from None


def _level_from_dict(data: Any, path: str) -> Level:
    _check_object(data, path, required={"name", "count", "link"})
    raw_link = data["link"]
    _check_object(
        raw_link, f"{path}.link", required={"bandwidth_Bps", "latency_s"}, optional={"topology"}
    )
    link = _located(f"{path}.link", Link, **raw_link)
    return _located(path, Level, name=data["name"], count=data["count"], link=link)


def _device_from_dict(data: Any, path: str) -> DeviceSpec:
    _check_object(
        data,
        path,
        required={"name", "peak_flops", "memory_bandwidth_Bps", "memory_bytes"},
        optional={"launch_overhead_s"},
    )
    return _located(path, DeviceSpec, **data)


def _restrict_node(inside: list[Level], devices_per_node: int, preset: str) -> list[Level]:
    """The levels inside a node cut to its first ``devices_per_node`` devices (whole units of
    one level; see Machine.preset)."""
    devices_per_node = _positive_int(devices_per_node, "devices_per_node")
    valid: set[int] = set()
    inner = 1  # devices in one unit of level j
    for j in range(len(inside) - 1, -1, -1):
        count = inside[j].count
        valid.update(m * inner for m in range(1, count + 1))
        if devices_per_node % inner == 0 and devices_per_node // inner <= count:
            cut = [Level(level.name, 1, level.link) for level in inside[:j]]
            cut.append(Level(inside[j].name, devices_per_node // inner, inside[j].link))
            return cut + inside[j + 1 :]
        inner *= count
    listed = ", ".join(str(v) for v in sorted(valid))
    raise MachineError(
        f"{preset!r} cannot use {devices_per_node} devices per node: the devices must fill whole "
        f"units of one level of the node; valid values: {listed}",
        field="devices_per_node",
    )


# --- Presets ----------------------------------------------------------------------------------
# Bandwidths are in bytes per second (decimal: 1 GB/s = 1e9 B/s), per direction, per unit of the
# level (see Link). Memory capacities are the vendors' "GB", which for HBM are GiB; the driver
# keeps a little of it, so a plan that fills the last percent may still not fit.

_GiB = 2**30

# Per-message latencies (alpha) are NCCL's own estimates, not hardware specifications: NCCL's
# cost model (src/graph/tuning.cc, table hwLat, Ring algorithm, Simple protocol, the one used for
# large messages) charges 3.4 µs per step over NVLink, 5.7 µs over PCI (NCCL's class for paths
# through the host, used here for Summit's X-Bus) and 9.6 µs over the network (later NCCL
# releases say 14 µs). They are rough; fit them to measurements with
# pcgopt.extract.costmodel.calibrate.
_NVLINK_LATENCY_S = 3.4e-6
_HOST_LATENCY_S = 5.7e-6
_NETWORK_LATENCY_S = 9.6e-6

# Kernel launch overhead: no datasheet gives it. A few microseconds per launch is the order of
# magnitude NVIDIA describes (blog "Getting Started with CUDA Graphs", 2019, on V100); 5 µs is
# an assumption for every preset device, to calibrate.
_LAUNCH_OVERHEAD_S = 5e-6

# NVIDIA Tesla V100 SXM2 16 GB (NVIDIA V100 datasheet): 7.8 TFLOP/s fp64, 15.7 TFLOP/s fp32,
# 125 TFLOP/s on tensor cores (fp16 in, fp32 accumulate), 900 GB/s HBM2, 16 GB. Volta has no bf16,
# so no bf16 rate. ORNL's Summit overview (Papatheodore, "Summit Architecture Overview", 2019)
# rounds the same part to 7.5 / 15 / 120 TFLOP/s, 16 GB HBM2 at 900 GB/s. GCP's V100s, on which
# P^2 ran Figure 9b, are this 16 GB part too.
V100_SXM2_16GB = DeviceSpec(
    name="V100-SXM2-16GB",
    peak_flops={"f64": 7.8e12, "f32": 15.7e12, "f16": 125e12},
    memory_bandwidth_Bps=900e9,
    memory_bytes=16 * _GiB,
    launch_overhead_s=_LAUNCH_OVERHEAD_S,
)

# NVIDIA Tesla P100 PCIe 16 GB (NVIDIA Tesla P100 datasheet): 4.7 TFLOP/s fp64, 9.3 TFLOP/s
# fp32, 18.7 TFLOP/s fp16, 732 GB/s HBM2, 16 GB. The GPU of a Piz Daint XC50 node (AutoDDL
# section 5.2: "one NVIDIA P100 GPU with 16 GB global memory").
P100_PCIE_16GB = DeviceSpec(
    name="P100-PCIe-16GB",
    peak_flops={"f64": 4.7e12, "f32": 9.3e12, "f16": 18.7e12},
    memory_bandwidth_Bps=732e9,
    memory_bytes=16 * _GiB,
    launch_overhead_s=_LAUNCH_OVERHEAD_S,
)

# NVIDIA A100 SXM4 40 GB (NVIDIA A100 datasheet): 9.7 TFLOP/s fp64, 19.5 TFLOP/s fp32, 156
# TFLOP/s tf32 and 312 TFLOP/s fp16/bf16 on tensor cores (dense; the datasheet's doubled figures
# assume structured sparsity), 1,555 GB/s HBM2, 40 GB. AutoDDL section 5 confirms 40 GB A100s
# on the same Google Cloud 16-GPU machines P^2 used. "f32" is the non-tensor rate: frameworks
# do not use tf32 for fp32 matmuls unless asked.
A100_SXM4_40GB = DeviceSpec(
    name="A100-SXM4-40GB",
    peak_flops={"f64": 9.7e12, "f32": 19.5e12, "tf32": 156e12, "f16": 312e12, "bf16": 312e12},
    memory_bandwidth_Bps=1555e9,
    memory_bytes=40 * _GiB,
    launch_overhead_s=_LAUNCH_OVERHEAD_S,
)

# NVIDIA H100 SXM5 80 GB (NVIDIA H100 Tensor Core GPU architecture whitepaper, dense rates):
# 33.5 TFLOP/s fp64 (vector), 66.9 TFLOP/s fp32, 494.7 TFLOP/s tf32 and 989.4 TFLOP/s fp16/bf16
# on tensor cores (the datasheet's 989 / 1,979 TFLOP/s assume sparsity), 3.35 TB/s HBM3, 80 GB.
H100_SXM5_80GB = DeviceSpec(
    name="H100-SXM5-80GB",
    peak_flops={
        "f64": 33.5e12,
        "f32": 66.9e12,
        "tf32": 494.7e12,
        "f16": 989.4e12,
        "bf16": 989.4e12,
    },
    memory_bandwidth_Bps=3.35e12,
    memory_bytes=80 * _GiB,
    launch_overhead_s=_LAUNCH_OVERHEAD_S,
)


def _summit(nodes: int) -> Machine:
    """Summit (OLCF), the machine of Unity's evaluation (Unity section 8: 6 V100 per node, three
    per POWER9 CPU joined by NVLink, nodes on Mellanox EDR InfiniBand; Figure 7a)."""
    return Machine(
        name="summit",
        device=V100_SXM2_16GB,
        levels=(
            # Dual-rail EDR InfiniBand, non-blocking fat tree: 2 x 100 Gb/s = 25 GB/s per node
            # each way (Mellanox, "What does it mean to Summit?", 2017: "dual-rail EDR InfiniBand
            # ... 200Gb/s bandwidth between nodes"). The OLCF user guide quotes a node injection
            # bandwidth of about 23 GB/s, what MPI sustains. Unity's text says only "EDR 100Gb".
            Level("node", nodes, Link(25e9, _NETWORK_LATENCY_S, "switched")),
            # IBM X-Bus between the two POWER9 sockets: the OLCF Summit node diagram labels it
            # 64 GB/s; WikiChip (supercomputers/summit) describes "a 4-byte 16 GT/s link providing
            # 64 GB/s of bidirectional bandwidth", i.e. 32 GB/s each way, which is what a Link
            # holds. Uncertain: if the 64 GB/s were per direction, the X-Bus would be faster than
            # a GPU's 50 GB/s NVLink to its CPU. The three GPUs of a socket share it.
            Level("socket", 2, Link(32e9, _HOST_LATENCY_S, "switched")),
            # NVLink 2.0 inside a socket's triad (2 GPUs + the CPU, fully connected): a V100 has 6
            # links of 25 GB/s each way (ORNL overview: "150+150 GB/s total BW (NVLink v2.0)"),
            # 2 links to each of its 3 peers, so 50 GB/s each way between two GPUs.
            Level("gpu", 3, Link(50e9, _NVLINK_LATENCY_S, "switched")),
        ),
    )


def _dgx_a100(nodes: int) -> Machine:
    """P^2's Figure 9a: nodes of 16 A100 sharing one NVSwitch and one NIC to the data-center
    network (Google Cloud's 16-GPU A100 machines, which AutoDDL also used). P^2 section 4 puts
    them in the hierarchy [nodes 16]. The bandwidths are the ones P^2's simulator assumes
    (section 5), so that its predictions can be reproduced; they are effective, not nominal."""
    return Machine(
        name="dgx-a100",
        device=A100_SXM4_40GB,
        levels=(
            # P^2 section 5: "100Gbps NICS, which we assume were utilized at 60%, yielding an
            # effective 8GB/s" (100 Gb/s = 12.5 GB/s nominal; AutoDDL section 5 also gives a
            # 100 Gb/s peak between these servers). One NIC per node.
            Level("node", nodes, Link(8e9, _NETWORK_LATENCY_S, "switched")),
            # P^2 section 5: "For the A100 NVLink switch, we assume 270GB/s uni-directional
            # bandwidth - again 90% of the nominal value (300GB/s in each direction)" (AutoDDL:
            # 600 GB/s peak, both directions together).
            Level("gpu", 16, Link(270e9, _NVLINK_LATENCY_S, "switched")),
        ),
    )


def _v100_ring(nodes: int) -> Machine:
    """P^2's Figure 9b: nodes of 8 V100 forming a ring via NVLink, one NIC per node. P^2 puts
    the 8 GPUs in one level ([nodes 8]) because the NVLink ring is much faster than the PCIe
    switches between the two CPUs' halves; so do we. Bandwidths as P^2's simulator assumes."""
    return Machine(
        name="v100-ring",
        device=V100_SXM2_16GB,
        levels=(
            # P^2 section 5: 100 Gb/s NIC at 60% utilization, "an effective 8GB/s".
            Level("node", nodes, Link(8e9, _NETWORK_LATENCY_S, "switched")),
            # P^2 section 5: "For the V100 NVLink ring we assume 135GB/s in each direction - an
            # optimistic 90% of the nominal uni-directional bandwidth (150GB/s)".
            Level("gpu", 8, Link(135e9, _NVLINK_LATENCY_S, "ring")),
        ),
    )


def _piz_daint(nodes: int) -> Machine:
    """AutoDDL's Multi-Node-Single-GPU system (section 5.2): Piz Daint's Cray XC50 nodes, one
    P100 each, on the Cray Aries network (Dragonfly). AutoDDL fits alpha and beta for it but does
    not publish them; the bandwidth here is an assumed effective figure, to calibrate."""
    return Machine(
        name="piz-daint",
        device=P100_PCIE_16GB,
        levels=(
            # Assumption: about 10 GB/s per node each way over Aries (its NIC sits on PCIe 3.0
            # x16, 16 GB/s nominal; MPI sustains less). Not a measured or published figure.
            Level("node", nodes, Link(10e9, _NETWORK_LATENCY_S, "switched")),
            Level("gpu", 1, Link(10e9, _NETWORK_LATENCY_S, "switched")),
        ),
    )


def _dgx_h100(nodes: int) -> Machine:
    """NVIDIA DGX H100: 8 H100 SXM5 joined by 4 NVSwitches (NVLink 4), 8 InfiniBand NDR ports
    per node. Nominal figures (NVIDIA DGX H100 datasheet and user guide)."""
    return Machine(
        name="dgx-h100",
        device=H100_SXM5_80GB,
        levels=(
            # DGX H100 datasheet: 8 single-port ConnectX-7 adapters, up to 400 Gb/s InfiniBand
            # NDR each: 8 x 50 GB/s = 400 GB/s per node each way (one NIC per GPU).
            Level("node", nodes, Link(400e9, _NETWORK_LATENCY_S, "switched")),
            # H100 SXM5: 18 NVLink 4 links, 900 GB/s per GPU both directions together (H100
            # datasheet), so 450 GB/s each way, to any GPU through the NVSwitches.
            Level("gpu", 8, Link(450e9, _NVLINK_LATENCY_S, "switched")),
        ),
    )


_PRESETS = {
    "dgx-a100": _dgx_a100,
    "dgx-h100": _dgx_h100,
    "piz-daint": _piz_daint,
    "summit": _summit,
    "v100-ring": _v100_ring,
}
PRESET_NAMES: tuple[str, ...] = tuple(sorted(_PRESETS))
