"""Operator parameters as data: declared per operator, checked and canonicalized in one place."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pcgopt.errors import ParameterError
from pcgopt.shapes import DType


class ParamType(enum.Enum):
    """What values a parameter takes. Values are stored canonically (tuples, DType, ...)."""

    INT = "an int"
    POS_INT = "a positive int"
    NONNEG_INT = "a non-negative int"
    FLOAT = "a number"
    BOOL = "a bool"
    STR = "a string"  # one of Param.choices
    INTS = "a list of ints"
    SHAPE = "a list of positive ints (each at most 2^62)"
    PAIR = "a non-negative int or a pair of them"  # an int n is read as (n, n)
    POS_PAIR = "a positive int or a pair of them"
    DTYPE = "a dtype name such as 'f32'"
    # An axis index; negative counts from the end and is normalized when the node is made.
    AXIS = "an axis index (an int; negative counts from the end)"
    AXES = "a list of axis indices"

    def __repr__(self) -> str:
        return self.name


_REQUIRED = object()


@dataclass(frozen=True, slots=True)
class Param:
    """A declared parameter: name, type, default (absent: required), allowed choices, doc."""

    name: str
    type: ParamType
    default: Any = _REQUIRED
    choices: tuple[Any, ...] | None = None
    doc: str = ""
    #: A number the generated rules are lifted over (a symbol: the rule enumerated with a scale
    #: factor of 0.5 holds for every factor). False for numerical constants such as an epsilon,
    #: which the verifier cannot draw at random (a negative one makes a square root NaN):
    #: their rules keep the enumerated value, the operator's default.
    lifted: bool = True

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def convert(self, value: Any) -> Any:
        """The canonical form of ``value``; raises ParameterError saying what would be valid."""
        t = self.type
        if value is None and self.default is None:
            return None
        try:
            out = _CONVERT[t](value)
        except (TypeError, ValueError):
            raise ParameterError(
                f"parameter {self.name!r} must be {t.value}, got {value!r}"
            ) from None
        if self.choices is not None and out not in self.choices:
            raise ParameterError(
                f"parameter {self.name!r} must be one of {', '.join(map(repr, self.choices))}, "
                f"got {value!r}"
            )
        return out


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError
    return v


def _pos_int(v: Any) -> int:
    v = _int(v)
    if v <= 0:
        raise ValueError
    return v


def _nonneg_int(v: Any) -> int:
    v = _int(v)
    if v < 0:
        raise ValueError
    return v


def _float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError
    if math.isnan(v):  # no operator's parameter means NaN (-inf pads a max, though)
        raise ValueError
    return float(v)


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError
    return v


def _ints(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list | tuple):
        raise TypeError
    return tuple(_int(x) for x in v)


#: The largest dimension a shape may have: sizes are 64-bit integers in the e-graph (egglog's
#: i64), with room for the products the rules form.
MAX_DIMENSION = 1 << 62


def _shape(v: Any) -> tuple[int, ...]:
    if not isinstance(v, list | tuple):
        raise TypeError
    out = tuple(_pos_int(x) for x in v)
    if any(x > MAX_DIMENSION for x in out):
        raise ValueError
    return out


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v, v)
    out = _ints(v)
    if len(out) != 2 or min(out) < 0:
        raise ValueError
    return out  # type: ignore[return-value]


def _pos_pair(v: Any) -> tuple[int, int]:
    out = _pair(v)
    if min(out) <= 0:
        raise ValueError
    return out


def _dtype(v: Any) -> DType:
    if isinstance(v, DType):
        return v
    return DType(_str(v))


_CONVERT = {
    ParamType.INT: _int,
    ParamType.POS_INT: _pos_int,
    ParamType.NONNEG_INT: _nonneg_int,
    ParamType.FLOAT: _float,
    ParamType.BOOL: _bool,
    ParamType.STR: _str,
    ParamType.INTS: _ints,
    ParamType.SHAPE: _shape,
    ParamType.PAIR: _pair,
    ParamType.POS_PAIR: _pos_pair,
    ParamType.DTYPE: _dtype,
    ParamType.AXIS: _int,
    ParamType.AXES: _ints,
}


class Params(Mapping[str, Any]):
    """An immutable, hashable parameter mapping in declaration order.

    ``repr`` reads like ``{dim=0, degree=2}``."""

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items: tuple[tuple[str, Any], ...] = tuple(
            (k, _freeze(v)) for k, v in (items or {}).items()
        )
        self._hash = hash(self._items)

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # Rebuilt, not restored: a string's hash differs between processes, so a cached hash
        # must not travel in a pickle (to a worker, or in a cache file).
        return (Params, (dict(self._items),))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Params):
            return self._items == other._items
        return NotImplemented

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._items) + "}"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values: tuples become lists, dtypes their short names."""
        return {k: _json_value(v) for k, v in self._items}


def _freeze(v: Any) -> Any:
    """Lists (as JSON gives them) become tuples, so parameters can be hashed."""
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        raise ParameterError(f"parameter values cannot be mappings, got {v!r}")
    return v


def _json_value(v: Any) -> Any:
    if isinstance(v, DType):
        return v.value
    if isinstance(v, tuple):
        return [_json_value(x) for x in v]
    return v


def canonical_params(declared: tuple[Param, ...], raw: Mapping[str, Any], op: str) -> Params:
    """Checks ``raw`` against the declaration: unknown names, missing required ones, types."""
    known = {p.name for p in declared}
    unknown = sorted(set(raw) - known)
    if unknown:
        valid = ", ".join(sorted(known)) or "none"
        raise ParameterError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"for {op}; valid: {valid}"
        )
    out = {}
    for p in declared:
        if p.name in raw:
            out[p.name] = p.convert(raw[p.name])
        elif p.required:
            raise ParameterError(f"{op} needs parameter {p.name!r} ({p.type.value})")
        else:
            out[p.name] = p.default
    return Params(out)


def normalize_axes(declared: tuple[Param, ...], params: Params, rank: int) -> Params:
    """Rewrites AXIS / AXES parameters as non-negative indices into a tensor of ``rank``, so that
    equal operators have equal parameters (``axis=-1`` and ``axis=1`` on a matrix are one node)."""
    out = dict(params)
    for p in declared:
        value = out.get(p.name)
        if value is None or p.type not in (ParamType.AXIS, ParamType.AXES):
            continue
        axes = (value,) if p.type is ParamType.AXIS else value
        fixed = []
        for a in axes:
            if not -rank <= a < rank:
                raise ParameterError(
                    f"parameter {p.name!r}: axis {a} is out of range for an input of rank {rank} "
                    f"(valid: {-rank} to {rank - 1})"
                )
            fixed.append(a % rank)
        out[p.name] = fixed[0] if p.type is ParamType.AXIS else tuple(fixed)
    return Params(out)
