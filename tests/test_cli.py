"""The pcgopt command line."""

import json
import re
import subprocess
import sys

import pytest

from pcgopt import PCG
from pcgopt.cli import main


def test_summary_of_a_zoo_model(capsys):
    assert main(["summary", "bert_large", "--small", "--rows", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PCG: 99 nodes")
    assert "... 96 more nodes" in out


def test_summary_with_overrides_and_outputs(tmp_path, capsys):
    j, d = tmp_path / "g.json", tmp_path / "g.dot"
    assert (
        main(["summary", "mnist_mlp", "--set", "batch=8", "--json", str(j), "--dot", str(d)]) == 0
    )
    g = PCG.from_json(j.read_text())
    assert repr(g.shape("x")) == "f32[8, 784]"
    assert d.read_text().startswith("digraph")
    assert main(["summary", str(j)]) == 0
    assert "f32[8, 784]" in capsys.readouterr().out


def test_errors_are_one_line_without_a_traceback(tmp_path, capsys):
    assert main(["summary", "gpt5"]) == 2
    assert "'gpt5' is neither a zoo model" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "format": "pcgopt.pcg",
                "version": 1,
                "nodes": [{"name": "x", "op": "relu", "inputs": ["y"]}],
            }
        )
    )
    assert main(["summary", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pcgopt summary: error: {bad}: node 'x' (relu): input 0 reads y")
    assert main(["summary", "mnist_mlp", "--set", "depth=3"]) == 2
    assert "mnist_mlp has no size 'depth'; its sizes: batch, in_features" in (
        capsys.readouterr().err
    )
    assert main(["summary", "bert_large", "--small", "--set", "heads=3"]) == 2
    assert capsys.readouterr().err == (
        "pcgopt summary: error: bert_large: hidden size 8 is not divisible by 3 heads\n"
    )
    assert main(["summary", "bert_large", "--set", "layers=0"]) == 2
    assert "bert_large: layers must be a positive integer, got 0" in capsys.readouterr().err
    assert main(["summary", "bert_large", "--set", "layers=99999999999"]) == 2
    assert "layers must be at most 1024, got 99999999999" in capsys.readouterr().err


def test_models_and_ops(capsys):
    assert main(["models"]) == 0
    assert "resnext50" in capsys.readouterr().out
    assert main(["models", "bert_large"]) == 0
    out = capsys.readouterr().out
    assert "  heads    int, default 16, small 2" in out and "--set KEY=VALUE" in out
    assert main(["models", "gpt5"]) == 2
    assert main(["ops"]) == 0
    assert "parallel (13): partition, combine" in capsys.readouterr().out
    assert main(["ops", "partition"]) == 0
    assert "degree: a positive int, required" in capsys.readouterr().out


def test_equivalent(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    main(["summary", "mnist_mlp", "--small", "--json", str(a)])
    main(["summary", "mnist_mlp", "--small", "--set", "hidden=9", "--json", str(b)])
    capsys.readouterr()
    assert main(["equivalent", str(a), str(a)]) == 0
    assert main(["equivalent", str(a), str(b)]) == 1
    assert "not equivalent" in capsys.readouterr().out
    assert main(["equivalent", str(a), str(b), "--trials", "0"]) == 2  # compared nothing
    assert "trials must be a positive int" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["-m", "pcgopt", "models"]])
def test_module_entry_point(args):
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True)
    assert "mnist_mlp" in done.stdout


def test_optimize_a_zoo_model_writes_the_plan(tmp_path, capsys):
    j, d = tmp_path / "plan.json", tmp_path / "plan.dot"
    argv = ["optimize", "mnist_mlp", "--small", "--machine", "summit:1:2", "--budget", "5"]
    svg, png = tmp_path / "map.svg", tmp_path / "map.png"
    flags = ["--json", str(j), "--dot", str(d), "--svg", str(svg), "--png", str(png)]
    assert main([*argv, *flags, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan for summit (2 x V100")
    plan = json.loads(j.read_text())
    assert plan["machine"]["num_devices"] == 2 and plan["cost"]["feasible"]
    assert d.read_text().startswith("digraph")
    assert svg.read_text().lstrip().startswith("<?xml") and 'id="cell-' in svg.read_text()
    assert png.read_bytes().startswith(b"\x89PNG")


def test_optimize_costs_the_update_of_the_optimizer_the_model_is_trained_with(tmp_path, capsys):
    j = tmp_path / "plan.json"
    argv = ["optimize", "dlrm", "--small", "--machine", "summit:1:2", "--budget", "5", "--quiet"]
    assert main([*argv, "--json", str(j), "--no-check"]) == 0
    # Unity trains DLRM with SGD
    assert re.search(r"update [\d.]+ (ms|µs|s) \(sgd\)", capsys.readouterr().out)
    assert json.loads(j.read_text())["cost"]["optimizer"] == "sgd"
    assert main([*argv, "--json", str(j), "--no-check", "--optimizer", "adam"]) == 0
    assert json.loads(j.read_text())["cost"]["optimizer"] == "adam"
    assert main([*argv, "--optimizer", "lamb"]) == 2
    assert "--optimizer: unknown 'lamb'; valid: sgd, momentum, adam" in capsys.readouterr().err


def test_optimize_takes_the_runtime_it_costs_plans_for_and_draws_its_timeline(tmp_path, capsys):
    j, t = tmp_path / "plan.json", tmp_path / "timeline.svg"
    argv = ["optimize", "mnist_mlp", "--small", "--machine", "summit:1:2", "--budget", "5"]
    flags = ["--quiet", "--no-check", "--json", str(j), "--timeline", str(t)]
    assert (
        main([*argv, *flags, "--no-overlap", "--bucket-mb", "0", "--precision", "f16-mixed"]) == 0
    )
    assert "runtime: Runtime(additive, f16-mixed)" in capsys.readouterr().out
    cost = json.loads(j.read_text())["cost"]
    assert cost["runtime"] == {
        "overlap": False,
        "bucket_bytes": 0,
        "precision": "f16-mixed",
        "zero_stage": 0,
    }
    assert cost["total_s"] == cost["additive_s"]
    assert 'id="lane-0-forward"' in t.read_text()
    assert main([*argv, "--precision", "bf16-mixed", "--quiet"]) == 2  # V100s have no bf16
    assert "precision 'bf16-mixed' computes in bf16" in capsys.readouterr().err
    assert main([*argv, "--precision", "fp8"]) == 2
    assert "--precision: unknown 'fp8'" in capsys.readouterr().err
    assert main([*argv, "--timeline", str(tmp_path / "t.pdf")]) == 2
    assert "--timeline" in capsys.readouterr().err
    z = tmp_path / "zero.json"
    assert main([*argv, "--quiet", "--no-check", "--json", str(z), "--zero-stage", "2"]) == 0
    assert ", ZeRO-2)" in capsys.readouterr().out
    assert json.loads(z.read_text())["cost"]["runtime"]["zero_stage"] == 2
    with pytest.raises(SystemExit):
        main([*argv, "--zero-stage", "3"])
    assert "invalid choice: 3" in capsys.readouterr().err


def test_optimize_deterministic_writes_the_same_plan_twice(tmp_path, capsys):
    argv = ["optimize", "mnist_mlp", "--small", "--machine", "summit:1:2", "--deterministic"]
    plans = []
    for k in range(2):
        j = tmp_path / f"plan{k}.json"
        assert main([*argv, "--budget", str(0.001 * (k + 1)), "--json", str(j), "--quiet"]) == 0
        found = json.loads(j.read_text())
        stats = found.pop("stats")  # seconds and memory are the run's
        plans.append((found, stats["candidates"], stats["chosen"], stats["num_enodes"]))
    capsys.readouterr()
    assert plans[0] == plans[1]
    assert plans[0][3] > 0  # the e-graph was searched: the budget was not the limit


def test_optimize_prints_nothing_of_a_library_on_standard_output():
    # In a process of its own: HiGHS prints its licence banner to file descriptor 1 when the
    # first solver of a process is made, which the exact extraction does here.
    # Deterministic, so that the e-graph is searched (under a small time budget the rules'
    # load could leave it no time), on one GPU and with two iterations (a third grows it to
    # 5,192 e-nodes), so that it is small enough to extract exactly.
    argv = ["optimize", "mnist_mlp", "--small", "--machine", "summit:1:1", "--deterministic"]
    two_iterations = (
        "import sys, dataclasses, pcgopt.extract.search.plan as p; "
        "p.DETERMINISTIC_BUDGET = dataclasses.replace(p.DETERMINISTIC_BUDGET, iterations=2); "
        "from pcgopt.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", two_iterations, *argv, "--quiet", "--no-check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("plan for summit"), done.stdout[:300]
    assert "extraction Extraction(ilp" in done.stdout  # a HiGHS solver was made
    assert "HiGHS" not in done.stdout


def test_optimize_names_a_bad_machine(capsys):
    assert main(["optimize", "mnist_mlp", "--machine", "summit:two"]) == 2
    assert "machine spec 'summit:two'" in capsys.readouterr().err


def test_reductions_lists_placements_and_their_best_programs(capsys):
    argv = ["reductions", "--machine", "dgx-a100:4", "--axes", "4,16", "--reduce", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "3 parallelism matrices, 99 valid programs in total" in out
    assert "matrix 1: [[2, 2], [2, 8]]  93 programs" in out
    assert "ReduceScatter[gpu] ; AllReduce[node] ; AllGather[gpu]" in out
    assert main(["reductions", "--machine", "dgx-a100:4", "--axes", "4,15", "--reduce", "0"]) == 2
    assert "multiply to 60 but the hierarchy [4, 16] has 64 devices" in capsys.readouterr().err
    assert main(["reductions", "--machine", "dgx-a100:2", "--axes", "4,x", "--reduce", "0"]) == 2
    assert "comma-separated integers" in capsys.readouterr().err


def _plan_file(tmp_path, name="plan.json"):
    from pcgopt.extract.search.plan import machine_from_spec
    from pcgopt.extract.strategies.baselines import megatron
    from pcgopt.models import build

    path = tmp_path / name
    plan = megatron(build("mnist_mlp", small=True), machine_from_spec("dgx-a100:1:2"))
    path.write_text(plan.to_json())
    return path


def test_run_trains_a_plan_on_virtual_devices_and_compares_it(tmp_path, capsys):
    pytest.importorskip("jax", reason="pcgopt run needs the optional extra pcgopt[jax]")
    path = _plan_file(tmp_path)
    # The full-size model is not the one the plan was made from.
    assert main(["run", str(path), "--steps", "2", "--model", "mnist_mlp", "--quiet"]) == 2
    assert "the model's inputs and weights differ from the plan's (3: w1" in capsys.readouterr().err
    small = tmp_path / "small.json"
    assert main(["summary", "mnist_mlp", "--small", "--json", str(small)]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--steps", "2", "--model", str(small), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "on a mesh of 2 CPU devices" in out
    assert "first step against the input model evaluated unsharded" in out
    assert "step 2: loss" in out
    assert "collectives: 2 planned by the cost model" in out


def test_run_names_bad_files_and_too_few_devices(tmp_path, capsys):
    pytest.importorskip("jax", reason="pcgopt run needs the optional extra pcgopt[jax]")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["run", str(bad)]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["run", str(_plan_file(tmp_path)), "--devices", "1"]) == 2
    assert "--devices 1: the plan needs 2 devices" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", str(bad), "--steps", "0"])
    assert "expected a positive integer" in capsys.readouterr().err


def test_output_paths_are_checked_before_the_search_and_written_whole(
    tmp_path, capsys, monkeypatch
):
    from pcgopt.extract.search import plan as plan_module

    def no_search(*args, **kwargs):
        raise AssertionError("the search ran before the output path was checked")

    monkeypatch.setattr(plan_module, "saturate_and_extract", no_search)
    for flag in ("--json", "--dot"):
        argv = ["optimize", "mnist_mlp", "--small", flag, str(tmp_path / "no" / "plan.out")]
        assert main(argv) == 2
        assert f"{flag} {tmp_path / 'no' / 'plan.out'}: the folder" in capsys.readouterr().err
    assert main(["optimize", "mnist_mlp", "--svg", str(tmp_path / "map.png")]) == 2
    assert "--svg" in capsys.readouterr().err.splitlines()[-1]
    assert main(["optimize", "mnist_mlp", "--json", "/proc/plan.json"]) == 2
    assert "cannot write in /proc" in capsys.readouterr().err
    assert main(["summary", "mnist_mlp", "--json", str(tmp_path)]) == 2
    assert "not a file path" in capsys.readouterr().err
    # Written through a temporary file: nothing is left beside the result.
    assert main(["summary", "mnist_mlp", "--json", str(tmp_path / "m.json")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_an_interrupted_search_says_so_in_one_line(capsys, monkeypatch):
    from pcgopt.extract.search import plan as plan_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_module, "saturate_and_extract", interrupted)
    assert main(["optimize", "mnist_mlp", "--small"]) == 130
    assert capsys.readouterr().err == "pcgopt optimize: interrupted\n"


def test_a_closed_pipe_ends_the_output_quietly():
    # `pcgopt ops matmul | head -1`: the rest of the output has no reader.
    done = subprocess.run(
        f"{sys.executable} -m pcgopt ops matmul | head -1",
        shell=True,
        capture_output=True,
        text=True,
    )
    assert done.stdout.startswith("matmul") and done.stderr == ""


def test_version_and_the_numbers_the_cli_refuses(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("pcgopt ")
    for argv, said in [
        (["summary", "mnist_mlp", "--rows", "-1"], "--rows: expected an integer >= 0, got -1"),
        (["optimize", "mnist_mlp", "--memory", "0"], "--memory: expected a positive"),
        (
            ["reductions", "--machine", "summit", "--axes", "6", "--reduce", "0", "--top", "-2"],
            "--top: expected an integer >= 0",
        ),
    ]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and said in capsys.readouterr().err
    assert main(["summary", ""]) == 2
    assert "MODEL is empty" in capsys.readouterr().err
    assert main(["optimize", "mnist_mlp", "--machine", ""]) == 2
    assert "a machine spec must be a non-empty string" in capsys.readouterr().err
    assert main(["optimize", "mnist_mlp", "--machine", "summit:99999999999"]) == 2
    assert "more than pcgopt plans for (1,048,576)" in capsys.readouterr().err


def test_a_plan_file_reads_as_its_pcg(tmp_path, capsys):
    model, plan = tmp_path / "model.json", tmp_path / "plan.json"
    assert main(["summary", "mnist_mlp", "--small", "--json", str(model)]) == 0
    argv = ["optimize", "mnist_mlp", "--small", "--machine", "summit:1:2", "--budget", "3"]
    assert main([*argv, "--quiet", "--json", str(plan)]) == 0
    capsys.readouterr()
    assert main(["summary", str(plan)]) == 0
    assert "parallel)" in capsys.readouterr().out
    assert main(["equivalent", str(model), str(plan)]) == 0
    assert capsys.readouterr().out.startswith("equivalent on 3 random input(s)")


def test_equivalent_compares_full_size_models_on_a_scaled_down_instance(tmp_path, capsys):
    from pcgopt import Machine
    from pcgopt.extract.strategies.baselines import data_parallel
    from pcgopt.models import build

    model = build("bert_large", layers=2)  # full width: 1.2e10 forward FLOPs
    plan = data_parallel(model, Machine.preset("dgx-a100"))
    a, b, wrong = tmp_path / "model.json", tmp_path / "plan.json", tmp_path / "wrong.json"
    a.write_text(model.to_json())
    b.write_text(plan.to_json())
    swap = {"layer0/ffn1/b": "layer1/ffn1/b", "layer1/ffn1/b": "layer0/ffn1/b"}
    wrong.write_text(plan.renamed({n.name: swap.get(n.name, n.name) for n in plan.nodes}).to_json())
    assert main(["equivalent", str(a), str(b)]) == 0
    assert "scaled down from full size (30522 to" in capsys.readouterr().out
    assert main(["equivalent", str(a), str(wrong)]) == 1
    assert capsys.readouterr().out.startswith("not equivalent of an instance scaled down")


def test_optimize_reports_every_phase_with_the_time_since_it_began(capsys):
    argv = ["optimize", "mnist_mlp", "--small", "--machine", "summit:1:2", "--budget", "6"]
    assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    stamped = re.compile(r"^\[pcgopt +\d+\.\d s\] ")
    bar = re.compile(r"^saturate \[#* *\] iteration \d+: [\d,]+ e-nodes, [\d.]+ s of \d+ s")
    assert all(stamped.match(line) or bar.match(line) for line in lines), lines
    text = "\n".join(lines)
    for phase in (
        "coordinate descent",
        "building the baselines",
        "saturating",
        "extracted",
        "placing and mapping",
        "chose ",
        "checking the plan",
    ):
        assert phase in text, phase
    times = [float(m.group(1)) for line in lines if (m := re.match(r"^\[pcgopt +([\d.]+) s", line))]
    assert times == sorted(times) and len(times) >= 7


def test_run_runs_a_plan_files_pipeline_unless_asked_for_its_one_program_plan(tmp_path, capsys):
    """A plan file whose fastest plan is a pipeline (its ``pipeline`` field) runs as that
    pipeline: its stages' plans on their blocks, checked against the unsharded model."""
    pytest.importorskip("jax", reason="pcgopt run needs the optional extra pcgopt[jax]")
    from pcgopt.extract.search.plan import machine_from_spec
    from pcgopt.extract.strategies.pipeline import pipeline_search
    from pcgopt.models import build
    from pcgopt.serialize import pcg_to_dict

    # One layer, 2 micro-batches: the run compiles each stage's pieces (4 micro-batches of 2
    # layers took 7 s more).
    model = build("bert_large", batch=8, seq=4, hidden=8, layers=1, heads=2, vocab=11, loss=True)
    piped = pipeline_search(
        model, machine_from_spec("dgx-a100:2:2"), stage_counts=[2], micro_batches=[2], min_ops=4
    )
    path = tmp_path / "piped.json"
    path.write_text(json.dumps({"pcg": pcg_to_dict(model), "pipeline": piped.to_dict()}))
    assert main(["run", str(path), "--steps", "1", "--rows", "0", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "running the plan's pipeline (2 stages x 2 micro-batches" in captured.err
    assert "as a pipeline of 2 stages on blocks of 4 CPU devices" in captured.out
    assert "2 micro-batches" in captured.out and "step 1: loss" in captured.out
    relative = re.search(r"gradients max \|difference\| \S+ \(relative (\S+)\)", captured.out)
    assert relative is not None and float(relative.group(1)) < 1e-4, captured.out
    assert main(["run", str(path), "--steps", "1", "--rows", "0", "--quiet", "--one-program"]) == 0
    captured = capsys.readouterr()
    assert "pipeline" not in captured.err and "on a mesh of 1 CPU devices" in captured.out
