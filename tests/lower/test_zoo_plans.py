"""Every zoo model's small variant, under each planner, on 2, 4 and 8 virtual CPU devices, run
as a JAX program: the loss and every weight's gradient equal the unsharded model's, the
forward equals the reference evaluator's, and XLA compiles the collectives the cost model
charges, in their SPMD forms (pcgopt.lower.collectives), with every difference explained, on
the cost model's device groups wherever the mesh's device order can honour them
(pcgopt.lower.placement).

Tolerance: float32 against float64 (the evaluator) or float32 in another order of summation
(the unsharded JAX model): ``|a - b| <= 1e-4 * max(1, max |b|)`` per tensor.

Data parallelism, Megatron and coordinate descent plans are built on a DGX-A100 node of
``n`` GPUs. ``saturate_and_extract`` plans take seconds each to search, so they were searched
once (on a machine of slow devices and fast links, where splitting even the small variants
pays) and are kept in ``sae_plans.json``: ``python tests/lower/test_zoo_plans.py`` searches
them again.

The model and its saturate_and_extract plans, placed and mapped on the nodes of 2 and 4 GPUs as
saturate_and_extract costs a candidate, where the machine mapping runs branches at once on
disjoint devices, also run as mapped (pcgopt.lower.mapped: a program per block of devices),
with the same checks of the loss and gradients (bench/lowering.py runs every planner's on 2, 4
and 8).

The checks take minutes of compiling; the suite runs them in a process of its own beside the
other tests (tests/lower/conftest.py).
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest

from pcgopt import evaluate
from pcgopt.errors import PCGError
from pcgopt.extract.costmodel.simulate import ADDITIVE
from pcgopt.extract.search.plan import Plan, machine_from_spec, mapped_plan
from pcgopt.extract.strategies.baselines import BaselineError, data_parallel, megatron
from pcgopt.extract.strategies.layerwise import coordinate_descent
from pcgopt.graph import PCG
from pcgopt.models import ZOO, build

pytest.importorskip("jax", reason="running plans needs the optional extra pcgopt[jax]")

from pcgopt.lower.jax import lower, reference_loss_and_grads
from pcgopt.lower.mapped import MappedLowered, concurrent_blocks

PLANNERS = ("data parallel", "megatron", "coordinate descent", "saturate_and_extract")
DEVICES = (2, 4, 8)
SAVED = Path(__file__).with_name("sae_plans.json")
RTOL = 1e-4


@functools.cache
def model(name: str) -> PCG:
    return build(name, small=True)


@functools.cache
def _saved() -> dict[str, dict]:
    return json.loads(SAVED.read_text())


def plan(name: str, planner: str, devices: int) -> PCG | None:
    """The plan ``planner`` makes for the small ``name`` on ``devices`` devices, or None when
    it has none (a batch of 2 split 4 ways)."""
    if planner == "saturate_and_extract":
        return PCG.from_dict(_saved()[f"{name}@{devices}"])
    machine = machine_from_spec(f"dgx-a100:1:{devices}")
    try:
        if planner == "data parallel":
            return data_parallel(model(name), machine)
        if planner == "megatron":
            return megatron(model(name), machine)
        # The additive model's plans: under the simulated one, vgg13's on 4 devices meets a
        # limit of the device order (test_a_narrowed_weights_sync_runs_on_the_plans_groups).
        return coordinate_descent(model(name), machine, runtime=ADDITIVE).pcg
    except (BaselineError, PCGError):
        return None


def _close(got, want) -> float:
    """Max |got - want| over the scale of ``want`` (at least 1)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want), initial=0.0) / max(1.0, np.max(np.abs(want))))


def distinct_plans(name: str) -> dict[PCG, list[str]]:
    """Each distinct plan of the model, with the planners and device counts that made it."""
    found: dict[PCG, list[str]] = {}
    for planner in PLANNERS:
        for devices in DEVICES:
            p = plan(name, planner, devices)
            if p is not None:
                found.setdefault(p, []).append(f"{planner} on {devices}")
    return found


@functools.cache
def reference(name: str) -> tuple:
    """The unsharded model's loss and gradients on the inputs and weights of seed 1."""
    feeds = lower(model(name), 1).random_sources(seed=1)
    return (*feeds, *reference_loss_and_grads(model(name), *feeds))


def check(pcg: PCG, name: str, where: str) -> dict:
    """Runs one plan as one SPMD program and checks it; returns what was measured."""
    lowered = lower(pcg, 8)
    inputs, weights, ref_loss, ref_grads = reference(name)
    # One program gives the loss, the gradients and the outputs (one compilation a plan).
    loss, grads, outputs = lowered.loss_grads_and_outputs(inputs, weights)
    errors = {"loss": _close(loss, ref_loss)}
    errors |= {w: _close(grads[w], ref_grads[w]) for w in lowered.weight_names}
    evaluated = evaluate(pcg, {**inputs, **weights}).outputs
    errors |= {
        f"output {k}": _close(o, e.logical())
        for k, (o, e) in enumerate(zip(outputs, evaluated, strict=True))
    }
    worst = max(errors, key=errors.get)
    assert errors[worst] <= RTOL, f"{name} ({where}): {worst} differs by {errors[worst]:.3g}"
    report = lowered.collectives()
    # XLA runs every planned collective it keeps in its SPMD form, bytes and all.
    for planned, compiled in report.matched:
        assert compiled.bytes == planned.spmd_bytes, (name, where, planned, compiled)
    # What it compiles beyond them: the loss's scalar sums, and sums of weight gradients over
    # copies the plan discards (DiscardCopies moves nothing; JAX still types them as copies).
    for compiled in report.extra:
        assert (compiled.kind, compiled.scope) == ("all-reduce", ""), (name, where, compiled)
    # What it drops: sums XLA proves are of equal values, gathers it cancels against slices.
    for planned in report.missing:
        assert planned.spmd_kind in ("all-reduce", "all-gather", "reduce-scatter"), planned
    # The cost model's device groups (a bare PCG: consecutive devices): every node the mesh's
    # device order honours runs its compiled collectives on them.
    groups = lowered.group_checks(report)
    honoured = set(lowered.placement.honoured)
    for g in groups:
        assert g.agrees or g.node not in honoured, (name, where, g)
    return {
        "error": errors[worst],
        "collectives": report,
        "devices": lowered.mesh.size,
        "groups": groups,
        "placement": lowered.placement,
    }


def mapped_plans(
    name: str, planners: tuple[str, ...] = PLANNERS, devices_of: tuple[int, ...] = DEVICES
) -> dict[tuple, tuple[Plan, list[str]]]:
    """The model and each of its plans (of ``planners``) placed and mapped on a DGX-A100 node
    of 2, 4 and 8 GPUs (``devices_of``) as saturate_and_extract costs a candidate, where the
    mapping runs branches at once on disjoint devices; distinct by graph and schedule."""
    found: dict[tuple, tuple[Plan, list[str]]] = {}
    for devices in devices_of:
        machine = machine_from_spec(f"dgx-a100:1:{devices}")
        candidates = [("the model", model(name))]
        candidates += [(p, plan(name, p, devices)) for p in planners]
        for planner, pcg in candidates:
            if pcg is None:
                continue
            mapped = mapped_plan(pcg, machine, optimizer="sgd", found_by=planner)
            if not concurrent_blocks(mapped):
                continue
            units = mapped.machine_mapping.units
            key = (pcg, tuple((u.nodes, u.block.start, u.block.size) for u in units))
            found.setdefault(key, (mapped, []))[1].append(f"{planner} mapped on {devices}")
    return found


def check_mapped(mapped: Plan, name: str, where: str) -> dict:
    """Runs a mapped plan (its branches on their own devices) and checks it."""
    program = lower(mapped, 8)
    assert isinstance(program, MappedLowered), (name, where, program.note)
    inputs, weights, ref_loss, ref_grads = reference(name)
    loss, grads = program.loss_and_grads(inputs, weights)
    errors = {"loss": _close(loss, ref_loss)}
    errors |= {w: _close(grads[w], ref_grads[w]) for w in program.weight_names}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= RTOL, f"{name} ({where}): {worst} differs by {errors[worst]:.3g}"
    groups = program.group_checks()
    honoured = set(program.placement.honoured)
    for g in groups:
        assert g.agrees or g.node not in honoured, (name, where, g)
    return {"error": errors[worst], "pieces": len(program.pieces), "groups": groups}


def check_model(name: str) -> dict:
    """Checks every distinct plan of the model, and every distinct mapped one; what was
    measured."""
    plans = distinct_plans(name)
    assert plans, f"no planner made a plan for {name}"
    worst = max(check(pcg, name, ", ".join(where))["error"] for pcg, where in plans.items())
    # The suite checks the model's and saturate_and_extract's mapped plans on 2 and 4 devices
    # (Inception's have dozens of pieces, each compiled); bench/lowering.py checks them all.
    mapped = mapped_plans(name, ("saturate_and_extract",), (2, 4))
    for plan_, where in mapped.values():
        worst = max(worst, check_mapped(plan_, name, ", ".join(where))["error"])
    return {
        "ok": True,
        "plans": len(plans),
        "runs": sum(map(len, plans.values())),
        "mapped": len(mapped),
        "worst": worst,
    }


@pytest.mark.parametrize("name", list(ZOO))
def test_every_plan_of_the_small_model_runs_and_equals_the_unsharded_model(name, zoo_results):
    """The checks run in a process of their own, started when the tests were collected
    (tests/lower/conftest.py), beside the rest of the suite: compiling about a hundred programs
    takes minutes of one core. Without it (the file run alone), they run here."""
    found = zoo_results(name) if zoo_results is not None else check_model(name)
    assert found["ok"], found["error"]
    assert found["plans"] >= 1 and found["worst"] <= RTOL


def check_all(out: Path) -> None:
    """The checks of every model, written to ``out`` (JSON, one entry a model, as each ends)."""
    results: dict[str, dict] = {}
    for name in ZOO:
        try:
            results[name] = check_model(name)
        except Exception as err:  # reported by the test of the model
            results[name] = {"ok": False, "error": "".join(traceback.format_exception(err))}
        partial = out.with_suffix(".tmp")
        partial.write_text(json.dumps(results))
        partial.replace(out)


def search_saved(budget_s: float = 2.0) -> None:
    """Searches every model on every device count with ``saturate_and_extract`` and writes
    ``sae_plans.json``."""
    from pcgopt.extract.search.plan import saturate_and_extract
    from pcgopt.testing.strategies import flat_machine

    out = {}
    for name in ZOO:
        for devices in DEVICES:
            machine = flat_machine(devices, bandwidth=1e12, latency=1e-9, peak_flops=1e7)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                found = saturate_and_extract(model(name), machine, time_budget_s=budget_s)
            out[f"{name}@{devices}"] = found.pcg.to_dict()
            print(f"{name} on {devices}: {found.stats.chosen}", file=sys.stderr)
    SAVED.write_text(json.dumps(out, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        check_all(Path(sys.argv[2]))
    else:
        search_saved()


@pytest.mark.xfail(
    strict=True,
    reason="known limit of the device order: a weight replicated over a narrowed data-parallel "
    "part (2 of 4 devices) is said honoured, but XLA sums its gradient over other pairs",
)
def test_a_narrowed_weights_sync_runs_on_the_plans_groups():
    machine = machine_from_spec("dgx-a100:1:4")
    plan_ = coordinate_descent(model("vgg13"), machine).pcg  # data x tensor parallel fc layers
    lowered = lower(plan_, 8)
    honoured = set(lowered.placement.honoured)
    wrong = [g for g in lowered.group_checks() if not g.agrees and g.node in honoured]
    assert not wrong, wrong


@pytest.mark.parametrize("name", ["transformer", "bert_large"])
def test_megatron_with_sequence_parallelism_runs_and_equals_the_unsharded_model(name):
    machine = machine_from_spec("dgx-a100:1:4")
    pcg = megatron(model(name), machine, sequence_parallel=True)
    assert any(n.op == "reduce_scatter" for n in pcg.nodes)
    found = check(pcg, name, "megatron-sp on 4")
    # XLA compiles every reduce-scatter the plan asks for, in the bytes the cost model charges.
    kinds = [planned.spmd_kind for planned, _ in found["collectives"].matched]
    assert "reduce-scatter" in kinds and not found["collectives"].missing
