"""Alpha and beta of the communication model, fitted to measured collective timings.

AutoDDL (section 3.2) does not trust the vendors' peak latency and bandwidth: it times AllReduce,
AllGather, ReduceScatter and AllToAll at many message sizes and group sizes, writes one linear
equation ``seconds = a * alpha + b * beta`` per measurement with the coefficients of its algorithm,
and solves for alpha and beta by least squares, once per network. This module does the same, with
the very coefficients the cost model charges
(:func:`pcgopt.extract.costmodel.cost.flat_coefficients`), so a fitted pair reproduces the
measurements through :func:`~pcgopt.extract.costmodel.cost.collective_cost`.

Measurements come as a CSV file with the columns ``collective, group_size, bytes, seconds`` and
optionally ``level`` (the machine level the groups span, e.g. ``node`` or ``gpu``)::

    collective,group_size,bytes,seconds,level
    all_reduce,8,1048576,0.000041,gpu
    all_reduce,2,1048576,0.000270,node

``bytes`` is the per-device message as :func:`~pcgopt.extract.costmodel.cost.flat_coefficients`
defines it (the vector of an AllReduce, the gathered output of an AllGather, the input of a
ReduceScatter, each device's buffer of an AllToAll). Rows are fitted per level where a level is
given, else per group size. :func:`calibrated` puts the fitted links into a machine.

>>> rows = [Measurement("all_reduce", p, n, 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * n / 20e9)
...         for p in (2, 4, 8) for n in (1e3, 1e6, 1e8)]
>>> fits = fit_alpha_beta(rows)
>>> list(fits), round(fits[8].alpha_s * 1e6, 6), round(fits[8].bandwidth_Bps / 1e9, 6)
([2, 4, 8], 5.0, 20.0)
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pcgopt.extract.costmodel.cost import COLLECTIVES, flat_coefficients
from pcgopt.machine import Level, Link, Machine, Topology

__all__ = [
    "COLUMNS",
    "AlphaBeta",
    "CalibrationError",
    "Measurement",
    "calibrated",
    "fit_alpha_beta",
    "load_csv",
]

#: Required CSV columns, then the optional one.
COLUMNS: tuple[str, ...] = ("collective", "group_size", "bytes", "seconds")
_OPTIONAL = ("level",)


class CalibrationError(ValueError):
    """Measurements that cannot be read or fitted. ``row`` (1-based line of the file, or index
    in the list given), ``column`` and ``source`` locate the fault when known; the message
    starts with them."""

    def __init__(
        self,
        reason: str,
        *,
        row: int | None = None,
        column: str | None = None,
        source: str | None = None,
    ) -> None:
        where = []
        if source:
            where.append(source)
        if row is not None:
            where.append(f"row {row}")
        if column:
            where.append(f"column {column!r}")
        super().__init__(": ".join([*where, reason]))
        self.reason = reason
        self.row = row
        self.column = column
        self.source = source


# Accepted spellings: "all_reduce", "AllReduce", "allreduce", "all-reduce", "bcast".
_ALIASES = {name.replace("_", ""): name for name in COLLECTIVES} | {"bcast": "broadcast"}


def _collective(value: Any) -> str:
    key = str(value).strip().lower().replace("_", "").replace("-", "").replace(" ", "")
    if key not in _ALIASES:
        raise CalibrationError(
            f"unknown collective {value!r}; valid: {', '.join(COLLECTIVES)}", column="collective"
        )
    return _ALIASES[key]


def _number(value: Any, column: str, *, positive: bool) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise CalibrationError(f"not a number: {value!r}", column=column) from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CalibrationError(f"must be a finite number, got {value!r}", column=column)
    if value < 0 or (positive and value == 0):
        raise CalibrationError(
            f"must be {'> 0' if positive else '>= 0'}, got {value!r}", column=column
        )
    return float(value)


def _group_size(value: Any) -> int:
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            raise CalibrationError(f"must be an integer >= 2, got {value!r}", column="group_size")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise CalibrationError(
            f"must be an integer >= 2 (one device communicates with nobody), got {value!r}",
            column="group_size",
        )
    return value


@dataclass(frozen=True, slots=True)
class Measurement:
    """One timing: ``collective`` among ``group_size`` devices with a per-device message of
    ``nbytes`` took ``seconds``; ``level``, if known, is the machine level the groups span."""

    collective: str
    group_size: int
    nbytes: float
    seconds: float
    level: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "collective", _collective(self.collective))
        object.__setattr__(self, "group_size", _group_size(self.group_size))
        object.__setattr__(self, "nbytes", _number(self.nbytes, "bytes", positive=False))
        object.__setattr__(self, "seconds", _number(self.seconds, "seconds", positive=True))
        if self.level is not None and (not isinstance(self.level, str) or not self.level.strip()):
            raise CalibrationError(
                f"must be a level name or absent, got {self.level!r}", column="level"
            )

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> Measurement:
        """From a dict with the CSV's columns (``level`` optional; empty means absent)."""
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise CalibrationError("missing", column=missing[0])
        unknown = sorted(set(row) - set(COLUMNS) - set(_OPTIONAL))
        if unknown:
            valid = ", ".join((*COLUMNS, *_OPTIONAL))
            raise CalibrationError(f"unknown column; valid columns: {valid}", column=unknown[0])
        level = row.get("level")
        if isinstance(level, str) and not level.strip():
            level = None
        return cls(
            collective=row["collective"],
            group_size=row["group_size"],
            nbytes=row["bytes"],
            seconds=row["seconds"],
            level=level.strip() if isinstance(level, str) else level,
        )


def load_csv(path: str | os.PathLike[str]) -> list[Measurement]:
    """The measurements in a CSV file (module docstring). A CalibrationError names the file, the
    line and the column at fault."""
    source = os.fspath(path)
    with Path(path).open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if not header:
            raise CalibrationError(
                f"empty file; expected a header with {', '.join(COLUMNS)}", source=source
            )
        names = [h.strip() for h in header]
        for column in COLUMNS:
            if column not in names:
                raise CalibrationError(
                    "missing from the header", row=1, column=column, source=source
                )
        for name in names:
            if name not in COLUMNS and name not in _OPTIONAL:
                valid = ", ".join((*COLUMNS, *_OPTIONAL))
                raise CalibrationError(
                    f"unknown column; valid columns: {valid}", row=1, column=name, source=source
                )
        rows = []
        for raw in reader:
            line = reader.line_num
            if None in raw or any(v is None for v in raw.values()):
                raise CalibrationError(
                    f"has {len([v for v in raw.values() if v is not None])} fields, the header "
                    f"{len(names)}",
                    row=line,
                    source=source,
                )
            if all(not str(v).strip() for v in raw.values()):
                continue  # a blank line
            values = {k.strip(): v for k, v in raw.items()}
            try:
                rows.append(Measurement.from_mapping(values))
            except CalibrationError as e:
                raise CalibrationError(e.reason, row=line, column=e.column, source=source) from None
    if not rows:
        raise CalibrationError("no measurements after the header", source=source)
    return rows


@dataclass(frozen=True, slots=True)
class AlphaBeta:
    """A fitted link: ``alpha_s`` (seconds per message step), ``beta_s_per_byte`` (seconds per
    byte, one over the bandwidth), from ``rows`` measurements with root-mean-square error
    ``rms_error_s``."""

    alpha_s: float
    beta_s_per_byte: float
    rows: int
    rms_error_s: float

    @property
    def bandwidth_Bps(self) -> float:
        return 1.0 / self.beta_s_per_byte

    def link(self, topology: Topology = "switched") -> Link:
        return Link(self.bandwidth_Bps, self.alpha_s, topology)

    def __repr__(self) -> str:
        return (
            f"AlphaBeta(alpha {_fmt_s(self.alpha_s)}, {self.bandwidth_Bps / 1e9:.4g} GB/s, "
            f"{self.rows} rows, rms {_fmt_s(self.rms_error_s)})"
        )


def _fit(rows: list[tuple[int, Measurement]], key: str | int) -> AlphaBeta:
    what = f"level {key!r}" if isinstance(key, str) else f"group size {key}"
    coeffs = np.array(
        [flat_coefficients(m.collective, m.group_size, m.nbytes) for _, m in rows], dtype=float
    )
    seconds = np.array([m.seconds for _, m in rows], dtype=float)
    # Relative least squares: timings span microseconds to seconds, and absolute errors would
    # let the largest messages decide alone, leaving alpha to noise.
    weight = 1.0 / seconds
    a, y = coeffs * weight[:, None], seconds * weight
    if len(rows) < 2 or np.linalg.matrix_rank(a) < 2:
        raise CalibrationError(
            f"{what}: {len(rows)} measurement(s) cannot separate alpha from beta; time at least "
            "two message sizes"
        )
    (alpha, beta), *_ = np.linalg.lstsq(a, y, rcond=None)
    if alpha < 0:
        # Latency below the resolution of the measurements: fit the bandwidth alone.
        alpha = 0.0
        beta = float(a[:, 1] @ y / (a[:, 1] @ a[:, 1]))
    if not beta > 0:
        raise CalibrationError(
            f"{what}: the times do not grow with the message size (fitted beta {beta:.3g} s/B); "
            "check the bytes column"
        )
    predicted = coeffs @ np.array([alpha, beta])
    rms = float(np.sqrt(np.mean((predicted - seconds) ** 2)))
    return AlphaBeta(float(alpha), float(beta), len(rows), rms)


def fit_alpha_beta(
    rows: Iterable[Measurement | Mapping[str, Any]],
) -> dict[str | int, AlphaBeta]:
    """Alpha and beta by least squares (relative error), one pair per level for rows that name
    one, else per group size; keys in the order first seen.

    Every row contributes ``seconds = a * alpha + b * beta`` with ``(a, b)`` the flat
    algorithm's coefficients for its collective, group size and bytes. Rows are
    :class:`Measurement` or mappings with the CSV's columns. A negative fitted alpha is set to 0
    (the latency is below what the data resolve) and beta refitted; a non-positive beta, or a
    key whose rows all have one message size and one group size, is a CalibrationError.
    """
    groups: dict[str | int, list[tuple[int, Measurement]]] = {}
    for i, row in enumerate(rows):
        if isinstance(row, Measurement):
            m = row
        elif isinstance(row, Mapping):
            try:
                m = Measurement.from_mapping(row)
            except CalibrationError as e:
                raise CalibrationError(e.reason, row=i, column=e.column) from None
        else:
            raise CalibrationError(
                f"a measurement is a Measurement or a mapping, got {type(row).__name__}", row=i
            )
        key: str | int = m.level if m.level is not None else m.group_size
        groups.setdefault(key, []).append((i, m))
    if not groups:
        raise CalibrationError("no measurements to fit")
    return {key: _fit(members, key) for key, members in groups.items()}


def calibrated(machine: Machine, fits: Mapping[str | int, AlphaBeta]) -> Machine:
    """``machine`` with the link of every level named in ``fits`` replaced by its fitted alpha
    and bandwidth (the topology is kept). Fits keyed by group size name no level: an error."""
    names = [level.name for level in machine.levels]
    for key in fits:
        if not isinstance(key, str):
            raise CalibrationError(
                f"the fit for group size {key!r} names no level; give the rows a level column"
            )
        if key not in names:
            raise CalibrationError(
                f"machine {machine.name!r} has no level {key!r}; its levels: {', '.join(names)}"
            )
    levels = tuple(
        Level(level.name, level.count, fits[level.name].link(level.link.topology))
        if level.name in fits
        else level
        for level in machine.levels
    )
    return Machine(levels, machine.device, machine.name)


def _fmt_s(value: float) -> str:
    if value == 0:
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-9:.4g} ns"
