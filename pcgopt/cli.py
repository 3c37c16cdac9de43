"""The ``pcgopt`` command line.

    pcgopt summary MODEL [--small] [--set KEY=VALUE ...] [--rows N] [--json OUT] [--dot OUT]
    pcgopt models
    pcgopt ops [NAME]
    pcgopt equivalent A.json B.json [--logical] [--trials N]
    pcgopt optimize MODEL [--machine PRESET[:NODES[:GPUS]]] [--budget S] [--deterministic]
                   [--json OUT] [--dot OUT] [--svg OUT] [--png OUT]
                   [--run [--devices N] [--steps K]]
    pcgopt run PLAN.json [--devices N] [--steps K] [--model MODEL] [--seed S] [--lr LR]
    pcgopt reductions --machine PRESET:NODES --axes 4,16 --reduce 0 [--bytes N] [--top K]

MODEL is a zoo name (``pcgopt models`` lists them), a PCG JSON file, or an ONNX file (with
``--dims NAME=SIZE`` binding its symbolic input dimensions, e.g. ``--dims batch=64``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pcgopt.arguments import non_negative_int, non_negative_number, positive_int, positive_number
from pcgopt.errors import NotEquivalentError, PCGError
from pcgopt.evaluate import assert_equivalent
from pcgopt.graph import PCG
from pcgopt.machine import PRESET_NAMES, MachineError
from pcgopt.models import ZOO
from pcgopt.ops import OPERATORS, get_op
from pcgopt.scaled import checkable_pair


class UsageError(Exception):
    """A mistake in the command line or its files; printed without a traceback."""


def load_model(
    spec: str,
    *,
    small: bool = False,
    overrides: Sequence[str] = (),
    dims: Sequence[str] | None = None,
) -> PCG:
    """A zoo model by name (with ``KEY=VALUE`` size overrides, values in JSON), a PCG file, or
    an ONNX file (``dims``: ``NAME=SIZE`` bindings of its symbolic dimensions)."""
    if not spec:
        raise UsageError(
            f"MODEL is empty; give a zoo model ({', '.join(ZOO)}), a PCG or plan JSON file, or "
            "an ONNX file"
        )
    path = Path(spec)
    if path.is_dir():
        raise UsageError(f"{spec} is a directory; MODEL is a zoo name or a file")
    if dims and path.suffix.lower() != ".onnx":
        raise UsageError("--dims applies to ONNX models (MODEL.onnx)")
    if path.suffix.lower() == ".onnx":
        if overrides or small:
            raise UsageError("--set and --small apply to zoo models, not to ONNX files")
        from pcgopt.frontend.model import load_model as import_model
        from pcgopt.frontend.model import parse_dims

        imported = import_model(path, dims=parse_dims(list(dims or ())))
        print(imported.summary(), file=sys.stderr)
        return imported.pcg
    if spec in ZOO:
        kwargs = {}
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep:
                raise UsageError(f"--set takes KEY=VALUE, got {item!r}")
            try:
                kwargs[key] = json.loads(value)
            except json.JSONDecodeError:
                kwargs[key] = value
            if isinstance(kwargs[key], list):
                kwargs[key] = tuple(kwargs[key])
        return ZOO[spec].build(small=small, **kwargs)
    if path.suffix == ".json" or path.exists():
        if overrides or small:
            raise UsageError("--set and --small apply to zoo models, not to PCG files")
        return load_plan(spec)[0]
    raise UsageError(f"{spec!r} is neither a zoo model ({', '.join(ZOO)}) nor a PCG JSON file")


def _output(path: str | None, flag: str) -> Path | None:
    """``path`` checked before any work: its folder exists and can be written, and it is not a
    folder itself (a search of minutes must not end in an unwritable path)."""
    if path is None:
        return None
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    if not path or out.is_dir():
        raise UsageError(f"{flag} {path!r}: not a file path")
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist")
    try:  # the one test that holds for every user, root included: write a file there
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{out.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write in {folder}: {e.strerror}") from None
    if out.exists() and not os.access(out, os.W_OK):
        raise UsageError(f"{flag} {path}: not writable")
    return out


def _picture_output(
    path: str | None, flag: str, suffixes: tuple[str, ...] | None = None
) -> Path | None:
    """A picture's path, checked before any work as :func:`_output` does, and that it can be
    drawn: its suffix is the flag's (or one of ``suffixes``), and matplotlib is installed."""
    out = _output(path, flag)
    if out is None:
        return None
    valid = suffixes or (flag.removeprefix("--"),)
    if out.suffix.lower().removeprefix(".") not in valid:
        raise UsageError(
            f"{flag} {path}: the file name must end in " + " or ".join(f".{v}" for v in valid)
        )
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"{flag} needs matplotlib: pip install 'pcgopt[plot]'")
    return out


def write_atomically(path: Path, text: str) -> None:
    """Writes ``text`` to a temporary file beside ``path`` and renames it into place, so that a
    full disk or an interruption never leaves half a file."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(e, OSError):
            raise UsageError(f"cannot write {path}: {e.strerror}") from None
        raise


def _summary(args: argparse.Namespace) -> int:
    json_out, dot_out = _output(args.json, "--json"), _output(args.dot, "--dot")
    pcg = load_model(args.model, small=args.small, overrides=args.set, dims=args.dims)
    print(pcg.summary(max_rows=args.rows))
    if json_out:
        write_atomically(json_out, pcg.to_json())
        print(f"wrote {args.json}")
    if dot_out:
        write_atomically(dot_out, pcg.to_dot())
        print(f"wrote {args.dot}")
    return 0


def _models(args: argparse.Namespace) -> int:
    if args.name:
        entry = ZOO.get(args.name)
        if entry is None:
            raise UsageError(f"unknown model {args.name!r}; the zoo has: {', '.join(ZOO)}")
        doc = inspect.cleandoc(entry.builder.__doc__ or "")
        print(f"{entry.name} ({entry.source}; trained with {entry.optimizer})\n\n{doc}\n")
        print("sizes (--set KEY=VALUE; --small uses the small variant's):")
        sizes = entry.sizes()
        width = max(map(len, sizes))
        for key, (kind, default) in sizes.items():
            small = f", small {entry.small[key]!r}" if key in entry.small else ""
            print(f"  {key.ljust(width)}  {kind}, default {default!r}{small}")
        return 0
    width = max(map(len, ZOO))
    for name, entry in ZOO.items():
        doc = inspect.cleandoc(entry.builder.__doc__ or "").splitlines()[0]
        print(f"{name.ljust(width)}  {entry.source}: {doc}")
    return 0


def _ops(args: argparse.Namespace) -> int:
    if args.name:
        spec = get_op(args.name)
        print(
            f"{spec.name} ({spec.kind.value}), inputs: {', '.join(spec.input_names) or 'none'}"
            f"{' ...' if spec.variadic else ''}"
        )
        for p in spec.params:
            default = "required" if p.required else f"default {p.default!r}"
            print(
                f"  {p.name}: {p.type.value}, {default}"
                + (f"; one of {p.choices}" if p.choices else "")
            )
        print()
        print(spec.doc)
        return 0
    for kind in ("source", "compute", "parallel"):
        names = [n for n, s in OPERATORS.items() if s.kind.value == kind]
        print(f"{kind} ({len(names)}): {', '.join(names)}")
    return 0


def _equivalent(args: argparse.Namespace) -> int:
    a, b = load_model(args.a), load_model(args.b)
    # Too large for the evaluator (BERT-Large takes tens of GB in float64): compare a scaled-
    # down instance of both, as saturate_and_extract's own check does.
    pair = checkable_pair(a, b)
    if pair.skipped is not None:
        raise UsageError(f"cannot compare the two: {pair.skipped}")
    try:
        assert_equivalent(
            *pair.pcgs, trials=args.trials, compare="logical" if args.logical else "parallel"
        )
    except NotEquivalentError as e:
        print(f"not equivalent{pair.where}: {e}")
        return 1
    print(f"equivalent on {args.trials} random input(s){pair.where}")
    return 0


def _optimize(args: argparse.Namespace) -> int:
    # The optimizer is the top layer; the CLI loads it only for this command.
    from pcgopt.extract.costmodel.cost import OPTIMIZERS
    from pcgopt.extract.costmodel.simulate import PRECISIONS, Runtime
    from pcgopt.extract.search.plan import default_machine, machine_from_spec, saturate_and_extract

    optimizer = args.optimizer or (ZOO[args.model].optimizer if args.model in ZOO else "adam")
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer: unknown {optimizer!r}; valid: {', '.join(OPTIMIZERS)}")
    json_out, dot_out = _output(args.json, "--json"), _output(args.dot, "--dot")
    pictures = [
        p for p in (_picture_output(args.svg, "--svg"), _picture_output(args.png, "--png")) if p
    ]
    timeline_out = _picture_output(args.timeline, "--timeline", ("svg", "png"))
    precision = args.precision or (ZOO[args.model].precision if args.model in ZOO else "f32")
    if precision not in PRECISIONS:
        raise UsageError(f"--precision: unknown {precision!r}; valid: {', '.join(PRECISIONS)}")
    runtime = Runtime(
        overlap=not args.no_overlap,
        bucket_bytes=round(args.bucket_mb * 2**20),
        precision=precision,
        zero_stage=args.zero_stage,
    )
    machine = machine_from_spec(args.machine) if args.machine is not None else default_machine()
    pcg = load_model(args.model, small=args.small, overrides=args.set, dims=args.dims)
    plan = saturate_and_extract(
        pcg,
        machine,
        time_budget_s=args.budget,
        memory_budget=int(args.memory * 2**30),
        check=not args.no_check,
        progress=not args.quiet,
        optimizer=optimizer,
        runtime=runtime,
        deterministic=args.deterministic,
        pipeline=not args.no_pipeline,
    )
    print(plan.explain(max_rows=args.rows))
    if timeline_out:
        plan.save_timeline(timeline_out)
    if json_out:
        write_atomically(json_out, plan.to_json())
    if dot_out:
        write_atomically(dot_out, plan.to_dot())
    for picture in pictures:
        plan.save_device_map(picture)
    if args.run_plan:
        print()
        piped = plan.pipeline is not None and not args.one_program
        _run_and_print(plan.pipeline if piped else plan, plan.pcg, args, model=pcg)
    return 0


def load_plan(spec: str) -> tuple[PCG, dict]:
    """A plan file (``pcgopt optimize --json``: the PCG under ``"pcg"``, its cost under
    ``"cost"``) or a bare PCG file, with the plan's fields (empty for a bare PCG)."""
    path = Path(spec)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"cannot read {spec}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{spec} is not JSON: {e}") from None
    except RecursionError:
        raise UsageError(f"{spec}: JSON nested too deeply") from None
    try:
        if isinstance(data, dict) and isinstance(data.get("pcg"), dict):
            return PCG.from_dict(data["pcg"]), data
        return PCG.from_dict(data), {}
    except PCGError as e:
        raise UsageError(f"{spec}: {e}") from None


def _run_and_print(
    plan: object, pcg: PCG, args: argparse.Namespace, *, model: PCG | None = None, meta=None
) -> None:
    """Runs a plan's training steps on JAX and prints the report (``pcgopt run``)."""
    from pcgopt.lower.run import host_devices, plan_devices

    meta = meta or {}
    cost = meta.get("cost") or {}
    needed = plan_devices(plan)
    devices = args.devices or needed
    if devices < needed:
        raise UsageError(
            f"--devices {devices}: the plan needs {needed} devices (its widest tensor's shards, "
            "or the mesh its splits need)"
        )
    host_devices(devices)  # before JAX loads
    try:
        from pcgopt.lower.run import run_plan
    except ImportError as e:
        raise UsageError(
            f"running plans needs the jax extra: pip install 'pcgopt[jax]' ({e})"
        ) from None
    report = run_plan(
        plan,
        model=model,
        devices=devices,
        steps=args.steps,
        seed=getattr(args, "seed", 0),
        optimizer=getattr(args, "train_optimizer", None) or cost.get("optimizer"),
        micro_batches=cost.get("micro_batches"),
        learning_rate=getattr(args, "lr", None),
        say=None if getattr(args, "quiet", False) else _say,
    )
    print(report.summary(max_rows=args.rows))


def _say(text: str) -> None:
    print(f"run: {text}", file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    pcg, meta = load_plan(args.plan)
    model = load_model(args.model) if args.model else None
    plan: object = pcg
    if meta.get("pipeline") and not args.one_program:
        from pcgopt.lower.saved import SavedPipeline

        try:
            # The stages cut the model; the one-program plan computes the same.
            plan = SavedPipeline.from_dict(model or pcg, meta["pipeline"])
        except PCGError as e:
            raise UsageError(f"{args.plan}: {e}") from None
        # The one-program plan's cost (its micro-batches) is not the pipeline's: the pipeline
        # runs its own micro-batches with the optimizer it was costed with.
        meta = {**meta, "cost": {}}
        print(
            f"running the plan's pipeline ({len(plan.stages)} stages x {plan.micro_batches} "
            "micro-batches; --one-program runs its one-program plan instead)",
            file=sys.stderr,
        )
    elif meta.get("machine_mapping"):
        from pcgopt.lower.saved import SavedPlan

        plan = SavedPlan.from_dict(pcg, meta) or pcg
    _run_and_print(plan, pcg, args, model=model, meta=meta)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    out = _output(args.out, "--out")
    assert out is not None  # required
    if args.measure:
        from pcgopt.lower.run import host_devices

        host_devices(args.devices)  # before JAX loads: N virtual devices on a CPU
        from pcgopt.lower.measure import measure_machine

        say = (lambda line: print(line, file=sys.stderr, flush=True)) if not args.quiet else None
        measured = measure_machine(
            devices=args.devices, repeats=args.repeats, quick=args.quick, say=say
        )
        machine = measured.machine
        print(measured.summary())
    else:
        from pcgopt.extract.costmodel.calibrate import (
            CalibrationError,
            calibrated,
            fit_alpha_beta,
            load_csv,
        )
        from pcgopt.extract.search.plan import machine_from_spec

        if args.machine is None:
            raise UsageError("--csv needs --machine: the machine whose links the fit replaces")
        try:
            fits = fit_alpha_beta(load_csv(args.csv))
            machine = calibrated(machine_from_spec(args.machine), fits)
        except CalibrationError as e:
            raise UsageError(f"--csv {args.csv}: {e}") from None
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise UsageError(f"--csv {args.csv}: cannot read it: {why}") from None
        for key, fit in fits.items():
            print(f"{key}: {fit!r}")
    write_atomically(out, json.dumps(machine.to_dict(), indent=2) + "\n")
    print(f"wrote {out} (use it with --machine {out})")
    return 0


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(
            f"{what} takes comma-separated integers, e.g. 4,16; got {text!r}"
        ) from None
    if not values:
        raise UsageError(f"{what} needs at least one integer")
    return values


def _reductions(args: argparse.Namespace) -> int:
    from pcgopt.extract.search.plan import machine_from_spec
    from pcgopt.extract.strategies.placement import PlacementError
    from pcgopt.extract.strategies.reduction import explore

    machine = machine_from_spec(args.machine)
    axes = _int_list(args.axes, "--axes")
    reduce_axes = _int_list(args.reduce, "--reduce")
    try:
        reports = explore(
            machine,
            axes,
            reduce_axes,
            bytes_per_device=args.bytes,
            max_size=args.max_size,
            target=args.target,
        )
    except PlacementError as e:
        raise UsageError(str(e)) from None
    names = " x ".join(f"{level.name} {level.count}" for level in machine.levels)
    print(
        f"{machine.name}: hierarchy [{names}]; axes {axes}, {args.target} over axes "
        f"{reduce_axes}; {args.bytes:,.0f} bytes per device; programs of at most "
        f"{args.max_size} steps"
    )
    total = sum(len(r.programs) for r in reports)
    print(f"{len(reports)} parallelism matrices, {total} valid programs in total\n")
    for i, r in enumerate(reports):
        best = r.best
        print(
            f"matrix {i}: {r.matrix.to_list()}  {len(r.programs)} programs; one "
            f"{'AllReduce' if args.target == 'all_reduce' else 'Reduce'} "
            f"{r.allreduce_seconds * 1e3:.3f} ms, best {best.seconds * 1e3:.3f} ms "
            f"({best.speedup:.2f}x)"
        )
        for program, seconds in r.programs[: args.top]:
            print(f"    {seconds * 1e3:10.3f} ms  {program.describe(machine)}")
    return 0


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--devices",
        type=positive_int,
        metavar="N",
        help="devices to run on (default: as many as the plan needs); without accelerators, "
        "N virtual CPU devices",
    )
    p.add_argument("--steps", type=positive_int, default=3, help="training steps (default 3)")
    p.add_argument(
        "--one-program",
        action="store_true",
        help="of a plan whose fastest form is a pipeline, run the plan that runs as one program "
        "instead (by default the pipeline runs: its stages on their blocks of devices)",
    )


def _dims_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dims",
        nargs="+",
        metavar="NAME=SIZE",
        help="sizes of an ONNX model's symbolic input dimensions, e.g. --dims batch=64",
    )


def _add_summary(sub: argparse._SubParsersAction) -> None:
    """`pcgopt summary`: a PCG's summary."""
    p = sub.add_parser("summary", help="build or load a PCG and print its summary")
    p.add_argument("model", help="zoo name, PCG JSON file or ONNX file")
    _dims_option(p)
    p.add_argument("--small", action="store_true", help="the zoo model's small test variant")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a zoo model size, e.g. --set layers=2 (repeatable)",
    )
    p.add_argument(
        "--rows", type=non_negative_int, default=40, help="node rows to print (default 40)"
    )
    p.add_argument("--json", metavar="OUT", help="also write the PCG as JSON")
    p.add_argument("--dot", metavar="OUT", help="also write a Graphviz picture description")
    p.set_defaults(run=_summary)


def _add_optimize(sub: argparse._SubParsersAction) -> None:
    """`pcgopt optimize`: the search, its budget, runtime and outputs."""
    p = sub.add_parser(
        "optimize", help="find a fast equivalent parallel plan for a model on a machine"
    )
    p.add_argument("model", help="zoo name, PCG JSON file or ONNX file")
    _dims_option(p)
    p.add_argument(
        "--machine",
        metavar="PRESET[:NODES[:GPUS]]",
        help=f"a preset ({', '.join(PRESET_NAMES)}) with a node count, or a machine "
        "JSON/YAML file (default: $PCGOPT_MACHINE, else one dgx-h100 node)",
    )
    p.add_argument(
        "--budget",
        type=positive_number,
        default=60.0,
        help="wall-time limit of the whole search and check, in seconds (default 60)",
    )
    p.add_argument(
        "--memory",
        type=positive_number,
        default=4.0,
        metavar="GIB",
        help="memory limit of the search's e-graphs, in GiB (default 4); saturation stops "
        "before it",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="limit the search by work (iterations, e-nodes, evaluations) instead of --budget, "
        "so that the same model and machine give the same plan",
    )
    p.add_argument(
        "--optimizer",
        metavar="NAME",
        help="the training optimizer the update is costed for: sgd, momentum or adam (default: "
        "the one the zoo model's source trains it with, e.g. sgd for dlrm; adam for files)",
    )
    p.add_argument(
        "--no-overlap",
        action="store_true",
        help="cost plans as if collectives never ran beside computation (default: they do, as "
        "in PyTorch DDP)",
    )
    p.add_argument(
        "--bucket-mb",
        type=non_negative_number,
        default=25.0,
        metavar="MIB",
        help="gradients are all-reduced in buckets of at least this many MiB (default 25, "
        "PyTorch DDP's; 0: each gradient alone)",
    )
    p.add_argument(
        "--precision",
        metavar="NAME",
        help="what training computes in: f32, bf16-mixed or f16-mixed (automatic mixed "
        "precision, float32 master weights; default: the zoo model's, f32 for files)",
    )
    p.add_argument(
        "--zero-stage",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="shard the optimizer state (1) and also the gradients (2) of every weight kept in "
        "copies over its copies, as ZeRO does, for every plan (default 0: the search also tries "
        "ZeRO-1 and ZeRO-2 on the data-parallel plan)",
    )
    p.add_argument(
        "--no-pipeline",
        action="store_true",
        help="do not cut the model into pipeline stages (by default, on a machine of several "
        "devices, a pipelined plan faster than the plan is shown first)",
    )
    p.add_argument("--small", action="store_true", help="the zoo model's small test variant")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--rows", type=non_negative_int, default=30, help="node rows to explain (default 30)"
    )
    p.add_argument(
        "--timeline",
        metavar="OUT",
        help="draw one iteration's tasks over time, as the cost model simulates them, as SVG or "
        "PNG (needs pcgopt[plot])",
    )
    p.add_argument("--json", metavar="OUT", help="write the plan as JSON")
    p.add_argument("--dot", metavar="OUT", help="write the plan's PCG as Graphviz")
    p.add_argument(
        "--svg", metavar="OUT", help="draw the plan's device map as SVG (needs pcgopt[plot])"
    )
    p.add_argument(
        "--png", metavar="OUT", help="draw the plan's device map as PNG (needs pcgopt[plot])"
    )
    p.add_argument("--no-check", action="store_true", help="skip the equivalence check")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--run",
        dest="run_plan",
        action="store_true",
        help="then run the plan's training steps on JAX (as pcgopt run; needs pcgopt[jax])",
    )
    _run_options(p)
    p.set_defaults(run=_optimize)


def _add_run(sub: argparse._SubParsersAction) -> None:
    """`pcgopt run`: a plan's training steps on JAX."""
    p = sub.add_parser(
        "run",
        help="run a plan's training steps on JAX devices, checked against the unsharded model",
        description="Lowers a plan to a JAX shard_map program and runs K training steps on N "
        "devices (virtual CPU devices when there is no accelerator), printing the loss per "
        "step, the first step's difference from the unsharded model, and the collectives XLA "
        "compiled beside the cost model's. Needs the jax extra: pip install 'pcgopt[jax]'.",
    )
    p.add_argument("plan", help="a plan JSON (pcgopt optimize --json) or a PCG JSON file")
    p.add_argument(
        "--model",
        metavar="MODEL",
        help="the input model (zoo name or PCG JSON) to compare with (default: the plan's own "
        "computation without its parallel operators)",
    )
    p.add_argument("--seed", type=int, default=0, help="random inputs and weights (default 0)")
    p.add_argument("--lr", type=float, help="learning rate (default 1e-3)")
    p.add_argument(
        "--optimizer",
        dest="train_optimizer",
        metavar="NAME",
        help="sgd, momentum or adam (default: the one the plan was costed with, else adam)",
    )
    p.add_argument(
        "--rows", type=non_negative_int, default=12, help="collective rows to list (default 12)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _run_options(p)
    p.set_defaults(run=_run)


def _add_reductions(sub: argparse._SubParsersAction) -> None:
    """`pcgopt reductions`: P^2's placements and reduction programs."""
    p = sub.add_parser(
        "reductions",
        help="placements of parallelism axes and the best reduction programs for them (P^2)",
    )
    p.add_argument(
        "--machine", required=True, metavar="PRESET[:NODES[:GPUS]]", help="preset or file"
    )
    p.add_argument("--axes", required=True, help="parallelism axis sizes, e.g. 4,16")
    p.add_argument("--reduce", required=True, help="the axes to reduce over, e.g. 0 or 0,2")
    p.add_argument(
        "--bytes", type=positive_number, default=2.0**31, help="bytes per device (default 2 GiB)"
    )
    p.add_argument("--max-size", type=positive_int, default=5, help="longest program (default 5)")
    p.add_argument("--top", type=non_negative_int, default=3, help="programs to show per matrix")
    p.add_argument("--target", choices=("all_reduce", "reduce"), default="all_reduce")
    p.set_defaults(run=_reductions)


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    """`pcgopt calibrate`: a machine file, measured or fitted."""
    p = sub.add_parser(
        "calibrate",
        help="fit a machine file: measure the local devices with JAX, or fit collective timings",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--measure",
        action="store_true",
        help="time matmuls, convolutions, memory passes and collectives on the local JAX "
        "devices (needs pcgopt[jax]; on a CPU, --devices virtual ones)",
    )
    source.add_argument(
        "--csv",
        metavar="FILE",
        help="collective timings: collective,group_size,bytes,seconds[,level]",
    )
    p.add_argument("--out", required=True, metavar="OUT", help="the machine file to write (.json)")
    p.add_argument("--devices", type=positive_int, default=8, help="devices to measure (default 8)")
    p.add_argument(
        "--repeats", type=positive_int, default=5, help="timings per measurement (default 5)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="with --measure: time smaller matmuls and convolutions (seconds; a rougher peak)",
    )
    p.add_argument(
        "--machine",
        metavar="PRESET[:NODES[:GPUS]]",
        help="with --csv: the machine whose levels' links the fit replaces",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=_calibrate)


def _add_listings(sub: argparse._SubParsersAction) -> None:
    """`pcgopt models`, `ops` and `equivalent`: the zoo, the operators, two PCGs compared."""
    p = sub.add_parser("models", help="list the model zoo, or show one model's sizes")
    p.add_argument("name", nargs="?", help="a zoo model: its sizes, for --set")
    p.set_defaults(run=_models)

    p = sub.add_parser("ops", help="list operators, or describe one")
    p.add_argument("name", nargs="?")
    p.set_defaults(run=_ops)

    p = sub.add_parser("equivalent", help="check two PCGs compute the same outputs")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument(
        "--logical", action="store_true", help="compare values only, not how they are distributed"
    )
    p.add_argument("--trials", type=int, default=3)
    p.set_defaults(run=_equivalent)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pcgopt", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"pcgopt {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_summary(sub)
    _add_optimize(sub)
    _add_run(sub)
    _add_reductions(sub)
    _add_calibrate(sub)
    _add_listings(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pcgopt")
    except PackageNotFoundError:
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (UsageError, PCGError, MachineError) as e:
        print(f"pcgopt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pcgopt {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # The reader went away (`pcgopt ops | head`): stop quietly, as a filter does.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
