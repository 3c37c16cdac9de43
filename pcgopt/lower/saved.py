"""A plan read back from its JSON file
(:meth:`Plan.to_dict <pcgopt.extract.search.plan.Plan.to_dict>`),
with what running it needs: its graph, its device groups and its schedule (which branches run at
once on which devices). No JAX needed: the CLI reads it before JAX loads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pcgopt.errors import PCGError
from pcgopt.graph import PCG

__all__ = ["SavedPlan"]


@dataclass(frozen=True)
class SavedPlan:
    """A plan as its JSON file keeps it (:meth:`Plan.to_dict
    <pcgopt.extract.search.plan.Plan.to_dict>`): what running it needs, its schedule included."""

    pcg: PCG
    mapping: Mapping[str, Any]
    machine_mapping: Any  # .units: the schedule
    cost: Any  # .optimizer, .micro_batches, .zero_stage

    @classmethod
    def from_dict(cls, pcg: PCG, data: Mapping[str, Any]) -> SavedPlan | None:
        """The plan of a plan file's fields (``pcg`` already read), or None if the file keeps
        no schedule (a bare PCG, or a plan written before schedules were kept)."""
        from pcgopt.extract.search.mapping import DeviceBlock, MappedUnit

        schedule = (data.get("machine_mapping") or {}).get("units")
        if not schedule:
            return None
        try:
            units = tuple(
                MappedUnit(tuple(nodes), DeviceBlock(int(start), int(size)), float(a), float(b))
                for nodes, start, size, a, b in schedule
            )
            mapping = {
                k: tuple(tuple(int(d) for d in g) for g in v)
                for k, v in (data.get("mapping") or {}).items()
            }
        except (TypeError, ValueError) as err:
            raise PCGError(f"the plan file's schedule is malformed: {err}") from None
        cost = data.get("cost") or {}
        return cls(
            pcg,
            mapping,
            _Schedule(units),
            _Cost(
                cost.get("optimizer") or "adam",
                int(cost.get("micro_batches") or 1),
                int((cost.get("runtime") or {}).get("zero_stage") or 0),
            ),
        )


@dataclass(frozen=True)
class _Schedule:
    units: tuple[Any, ...]


@dataclass(frozen=True)
class _Cost:
    optimizer: str
    micro_batches: int
    zero_stage: int = 0
