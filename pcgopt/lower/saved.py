"""A plan read back from its JSON file
(:meth:`Plan.to_dict <pcgopt.extract.search.plan.Plan.to_dict>`),
with what running it needs: its graph, its device groups and its schedule (which branches run at
once on which devices), or its pipeline (each stage's plan on its block of devices, the
micro-batches). No JAX needed: the CLI reads it before JAX loads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pcgopt.errors import PCGError
from pcgopt.graph import PCG

__all__ = ["SavedPipeline", "SavedPlan", "SavedStage"]


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


@dataclass(frozen=True)
class SavedStage:
    """One stage of a :class:`SavedPipeline`: its ``plan`` (a PCG whose input ``entry`` is what
    the stage before hands on; None for the first stage) on the devices ``devices``."""

    index: int
    devices: range
    plan: PCG = field(repr=False)
    entry: str | None

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.plan.nodes)


@dataclass(frozen=True)
class SavedPipeline:
    """A pipelined plan as its plan file keeps it (:meth:`PipelinePlan.to_dict
    <pcgopt.extract.strategies.pipeline.PipelinePlan.to_dict>`, the file's ``pipeline``
    field): what :func:`pcgopt.lower.pipelined.lower_pipeline` runs. ``model``: the
    computation the stages cut (the input model, or the file's one-program plan, which
    computes the same); ``time_s``: the iteration the cost model predicted."""

    stages: tuple[SavedStage, ...]
    micro_batches: int
    schedule: str
    optimizer: str
    time_s: float
    model: PCG = field(repr=False)

    @classmethod
    def from_dict(cls, model: PCG, data: Mapping[str, Any]) -> SavedPipeline:
        """The pipeline of a plan file's ``pipeline`` field. Raises :class:`PCGError` naming
        the field at fault: stages that do not tile consecutive devices from 0, an entry that
        is not an input of its stage's plan, a stage after the first without one."""
        if not isinstance(data, Mapping):
            raise PCGError(f"the plan file's pipeline must be an object, got {type(data).__name__}")
        m = data.get("micro_batches")
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise PCGError(
                f"the plan file's pipeline.micro_batches must be a positive integer, got {m!r}"
            )
        schedule, optimizer = data.get("schedule"), data.get("optimizer") or "adam"
        if not isinstance(schedule, str) or not isinstance(optimizer, str):
            raise PCGError("the plan file's pipeline.schedule and .optimizer must be strings")
        raw = data.get("stages")
        if not isinstance(raw, list) or not raw:
            raise PCGError("the plan file's pipeline.stages must be a non-empty list")
        stages = tuple(_stage(k, s) for k, s in enumerate(raw))
        for k, stage in enumerate(stages):
            start = stages[k - 1].devices.stop if k else 0
            if stage.devices.start != start:
                raise PCGError(
                    f"the plan file's pipeline.stages[{k}].devices must start at device {start}, "
                    f"where {'stage ' + str(k - 1) + ' ends' if k else 'the machine begins'}; "
                    f"got {stage.devices.start}"
                )
        time_s = data.get("time_s")
        return cls(
            stages,
            m,
            schedule,
            optimizer,
            float(time_s) if isinstance(time_s, int | float) else float("nan"),
            model,
        )


def _stage(k: int, data: Any) -> SavedStage:
    where = f"the plan file's pipeline.stages[{k}]"
    if not isinstance(data, Mapping):
        raise PCGError(f"{where} must be an object, got {type(data).__name__}")
    devices = data.get("devices")
    if not (
        isinstance(devices, list)
        and len(devices) == 2
        and all(isinstance(d, int) and not isinstance(d, bool) for d in devices)
        and 0 <= devices[0] < devices[1]
    ):
        raise PCGError(
            f"{where}.devices must be [first, stop) with 0 <= first < stop, got {devices!r}"
        )
    if not isinstance(data.get("pcg"), Mapping):
        raise PCGError(f"{where}.pcg must be a PCG object (pcgopt.serialize.pcg_to_dict)")
    try:
        plan = PCG.from_dict(data["pcg"])
    except PCGError as err:
        raise PCGError(f"{where}.pcg: {err}", node=err.node) from None
    entry = data.get("entry")
    inputs = {n.name for n in plan.nodes if n.op == "input"}
    if k == 0 and entry is not None:
        raise PCGError(f"{where}.entry must be null: the first stage reads the model's inputs")
    if k > 0 and entry not in inputs:
        raise PCGError(
            f"{where}.entry must name the input of its plan that stage {k - 1} hands on "
            f"(one of {sorted(inputs)}), got {entry!r}"
        )
    return SavedStage(k, range(devices[0], devices[1]), plan, entry)
