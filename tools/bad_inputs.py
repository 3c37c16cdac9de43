"""Runs pcgopt's command lines on bad inputs and counts how each one ends.

    python tools/bad_inputs.py [--only SUBSTRING] [--timeout S] [--verbose]

Each case is a command line with what should happen: ``error`` (a one-line message on stderr
naming what is wrong, exit status 1 or 2, no traceback) or ``ok`` (exit 0). Outcomes:

- ``clean``: as expected;
- ``traceback``: a Python traceback reached the user;
- ``hang``: no answer within the timeout;
- ``accepted``: an error was expected and the command succeeded (a silent acceptance);
- ``wrong``: success was expected and the command failed, or the exit status was wrong;
- ``unclear``: an error of more than one line, or one that does not name the value at fault.

The suite's fuzz test (tests/test_bad_inputs.py) checks the same property on generated input;
this script is the fixed, held-out list, for before/after counts in a closing note.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PCGOPT = [sys.executable, "-m", "pcgopt"]


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    expect: str  # "error" or "ok"
    #: a word the error message must contain (the value or field at fault)
    names: str = ""
    stdin_head: bool = False  # pipe stdout into `head -1`
    interrupt_after_s: float = 0.0  # send SIGINT after this long


def _pcg(nodes: list[dict], outputs: list[str]) -> dict:
    return {"format": "pcgopt.pcg", "version": 1, "nodes": nodes, "outputs": outputs}


def _files(work: Path) -> dict[str, Path]:
    """Writes the malformed inputs the cases read."""
    run = [*PCGOPT, "summary", "mnist_mlp", "--small", "--json", str(work / "model.json")]
    subprocess.run(run, check=True, capture_output=True)
    good = json.loads((work / "model.json").read_text())
    x = {"name": "x", "op": "input", "inputs": [], "params": {"shape": [8, 12]}}
    w = {"name": "w", "op": "weight", "inputs": [], "params": {"shape": [12, 8]}}
    mm = {"name": "mm", "op": "matmul", "inputs": ["x", "w"], "params": {}}
    variants: dict[str, object] = {
        "empty_graph": _pcg([], []),
        "no_outputs": _pcg([x], []),
        "rank0": _pcg(
            [
                {**x, "params": {"shape": []}},
                {**w, "params": {"shape": []}},
                {"name": "a", "op": "add", "inputs": ["x", "w"], "params": {}},
            ],
            ["a"],
        ),
        "empty_name": _pcg([{**x, "name": ""}, w, {**mm, "inputs": ["", "w"]}], ["mm"]),
        "huge_dim": _pcg([{**x, "params": {"shape": [2**63, 12]}}, w, mm], ["mm"]),
        "big_dim": _pcg([{**x, "params": {"shape": [2**62 + 1, 12]}}, w, mm], ["mm"]),
        "negative_dim": _pcg([{**x, "params": {"shape": [-8, 12]}}, w, mm], ["mm"]),
        "float_dim": _pcg([{**x, "params": {"shape": [8.5, 12]}}, w, mm], ["mm"]),
        "unknown_op": _pcg([x, w, {**mm, "op": "matmull"}], ["mm"]),
        "missing_input": _pcg([x, w, {**mm, "inputs": ["x", "v"]}], ["mm"]),
        "cycle": _pcg([x, {**mm, "inputs": ["x", "mm"]}], ["mm"]),
        "bad_shapes": _pcg([x, {**w, "params": {"shape": [13, 8]}}, mm], ["mm"]),
        "unknown_output": _pcg([x, w, mm], ["nope"]),
        "duplicate_name": _pcg([x, w, mm, {**mm}], ["mm"]),
        "bad_param": _pcg(
            [x, {"name": "s", "op": "scale", "inputs": ["x"], "params": {"factor": "NaN"}}], ["s"]
        ),
        "nan_param": _pcg(
            [x, {"name": "s", "op": "scale", "inputs": ["x"], "params": {"factor": float("nan")}}],
            ["s"],
        ),
        "not_a_list": {"format": "pcgopt.pcg", "version": 1, "nodes": 3, "outputs": []},
        "wrong_version": {**good, "version": 99},
        "list_top": [1, 2, 3],
    }
    paths = {}
    for key, value in variants.items():
        path = work / f"{key}.json"
        path.write_text(json.dumps(value))
        paths[key] = path
    (work / "truncated.json").write_text((work / "model.json").read_text()[:100])
    paths["truncated"] = work / "truncated.json"
    (work / "machine.txt").write_text("summit")
    paths["machine_txt"] = work / "machine.txt"
    (work / "machine_bad.json").write_text(json.dumps({"name": "m", "levels": "x"}))
    paths["machine_bad"] = work / "machine_bad.json"
    (work / "machine.yaml").write_text("name: m\nlevels: []\n")
    paths["machine_yaml"] = work / "machine.yaml"
    readonly = work / "readonly"
    readonly.mkdir()
    readonly.chmod(0o500)
    paths["readonly"] = readonly
    return paths


def cases(f: dict[str, Path], work: Path) -> list[Case]:
    opt = ("optimize", "mnist_mlp", "--small", "--budget", "5", "--quiet")
    out = [
        Case("version", ("--version",), "ok"),
        Case("optimize ok", (*opt, "--json", str(work / "plan.json")), "ok"),
        # (root writes in a read-only folder: this case runs only for other users)
        *(
            [
                Case(
                    "json unwritable",
                    (*opt, "--json", str(f["readonly"] / "p.json")),
                    "error",
                    "p.json",
                )
            ]
            if os.geteuid() != 0
            else []
        ),
        # /proc takes no new files, even from root (for whom a read-only folder is writable)
        Case("json in /proc", (*opt, "--json", "/proc/p.json"), "error", "p.json"),
        Case("json no dir", (*opt, "--json", "/nonexistent/p.json"), "error", "nonexistent"),
        *(
            [
                Case(
                    "dot unwritable",
                    (*opt, "--dot", str(f["readonly"] / "p.dot")),
                    "error",
                    "p.dot",
                )
            ]
            if os.geteuid() != 0
            else []
        ),
        Case("machine empty", (*opt, "--machine", ""), "error", "machine"),
        Case("machine missing", (*opt, "--machine", str(work / "nope.json")), "error", "nope"),
        Case("machine dir", (*opt, "--machine", str(work)), "error", "director"),
        Case("machine suffix", (*opt, "--machine", str(f["machine_txt"])), "error", ".txt"),
        Case("machine bad json", (*opt, "--machine", str(f["machine_bad"])), "error", "device"),
        Case("machine yaml", (*opt, "--machine", str(f["machine_yaml"])), "error", "machine.yaml"),
        Case("machine huge", (*opt, "--machine", "summit:99999999999"), "error", "99999999999"),
        # Within the limit of 2^20 devices, a search of 5 s must end (it took minutes: the
        # layer-wise strategies and the mapping DP looped over every device count).
        Case("machine 600,000 GPUs", (*opt, "--machine", "summit:100000"), "ok"),
        Case("machine 2^20 GPUs", (*opt, "--machine", "dgx-a100:65536"), "ok"),
        Case("svg suffix", (*opt, "--svg", str(work / "map.png")), "error", "--svg"),
        Case("machine zero", (*opt, "--machine", "summit:0"), "error", "0"),
        Case("machine negative", (*opt, "--machine", "summit:-1"), "error", "-1"),
        Case("machine unknown", (*opt, "--machine", "sumit:2"), "error", "sumit"),
        Case("machine gpus 0", (*opt, "--machine", "summit:1:0"), "error", "0"),
        Case("budget inf", (*opt[:-3], "--budget", "inf", "--quiet"), "error", "inf"),
        Case("budget nan", (*opt[:-3], "--budget", "nan", "--quiet"), "error", "nan"),
        Case("budget negative", (*opt[:-3], "--budget", "-1", "--quiet"), "error", "-1"),
        Case("budget zero", (*opt[:-3], "--budget", "0", "--quiet"), "error", "0"),
        Case("rows negative", (*opt, "--rows", "-1"), "error", "-1"),
        Case(
            "set heads=7",
            ("summary", "bert_large", "--small", "--set", "heads=7"),
            "error",
            "heads",
        ),
        Case(
            "set layers=0",
            ("summary", "bert_large", "--small", "--set", "layers=0"),
            "error",
            "layers",
        ),
        Case("set hidden=nan", ("summary", "mnist_mlp", "--set", "hidden=NaN"), "error", "hidden"),
        Case("set hidden=-5", ("summary", "mnist_mlp", "--set", "hidden=-5"), "error", "hidden"),
        Case("set hidden=2.5", ("summary", "mnist_mlp", "--set", "hidden=2.5"), "error", "hidden"),
        Case("set unknown key", ("summary", "mnist_mlp", "--set", "nosuch=3"), "error", "nosuch"),
        Case("set no value", ("summary", "mnist_mlp", "--set", "hidden"), "error", "hidden"),
        Case("summary rows negative", ("summary", "mnist_mlp", "--rows", "-1"), "error", "-1"),
        Case("optimizer unknown", (*opt, "--optimizer", "adamw2"), "error", "adamw2"),
        Case("model empty", ("summary", ""), "error", "empty"),
        Case("model missing", ("summary", str(work / "none.json")), "error", "none.json"),
        Case("model directory", ("summary", str(work)), "error", "director"),
        Case("plan summary", ("summary", str(work / "plan.json")), "ok"),
        Case(
            "plan equivalent",
            ("equivalent", str(f["truncated"].parent / "model.json"), str(work / "plan.json")),
            "ok",
        ),
        Case(
            "trials 0",
            ("equivalent", str(work / "model.json"), str(work / "model.json"), "--trials", "0"),
            "error",
            "0",
        ),
        Case("run missing", ("run", str(work / "none.json")), "error", "none.json"),
        Case("run devices 0", ("run", str(work / "plan.json"), "--devices", "0"), "error", "0"),
        Case(
            "reductions axes 0",
            ("reductions", "--machine", "summit:2", "--axes", "0", "--reduce", "0"),
            "error",
            "0",
        ),
        Case(
            "reductions reduce oob",
            ("reductions", "--machine", "summit:2", "--axes", "4,3", "--reduce", "5"),
            "error",
            "5",
        ),
        Case(
            "reductions bytes nan",
            (
                "reductions",
                "--machine",
                "summit:2",
                "--axes",
                "4,3",
                "--reduce",
                "0",
                "--bytes",
                "nan",
            ),
            "error",
            "nan",
        ),
        Case(
            "reductions max-size 0",
            (
                "reductions",
                "--machine",
                "summit:2",
                "--axes",
                "4,3",
                "--reduce",
                "0",
                "--max-size",
                "0",
            ),
            "error",
            "0",
        ),
        Case(
            "reductions top -1",
            (
                "reductions",
                "--machine",
                "summit:2",
                "--axes",
                "4,3",
                "--reduce",
                "0",
                "--top",
                "-1",
            ),
            "error",
            "-1",
        ),
        Case("ops unknown", ("ops", "matmull"), "error", "matmull"),
        Case("models | head", ("models",), "ok", stdin_head=True),
        Case("ops | head", ("ops", "matmul"), "ok", stdin_head=True),
        Case(
            "ctrl-c",
            ("optimize", "bert_large", "--budget", "60", "--quiet"),
            "error",
            interrupt_after_s=8.0,
        ),
    ]
    for key in (
        "empty_graph",
        "no_outputs",
        "rank0",
        "empty_name",
        "huge_dim",
        "big_dim",
        "negative_dim",
        "float_dim",
        "unknown_op",
        "missing_input",
        "cycle",
        "bad_shapes",
        "unknown_output",
        "duplicate_name",
        "bad_param",
        "nan_param",
        "not_a_list",
        "wrong_version",
        "list_top",
        "truncated",
    ):
        expect = "ok" if key == "rank0" else "error"
        out.append(Case(f"pcg {key}", ("summary", str(f[key])), expect))
    for key in ("big_dim", "rank0"):
        out.append(
            Case(
                f"optimize pcg {key}",
                ("optimize", str(f[key]), "--budget", "5", "--quiet"),
                "error" if key != "rank0" else "ok",
            )
        )
    rules = [sys.executable, "-m", "pcgopt.rules"]
    out += [
        Case(
            "rules max-ops 0",
            (*rules, "generate", "--max-ops", "0", "--out", str(work / "r.json")),
            "error",
            "max-ops",
        ),
        Case(
            "rules max-ops -2",
            (*rules, "generate", "--max-ops", "-2", "--out", str(work / "r.json")),
            "error",
            "max-ops",
        ),
        Case(
            "rules ops unknown",
            (*rules, "generate", "--ops", "matmull", "--out", str(work / "r.json")),
            "error",
            "matmull",
        ),
        Case(
            "rules workers 0",
            (*rules, "generate", "--workers", "0", "--out", str(work / "r.json")),
            "error",
            "workers",
        ),
        Case(
            "rules coverage missing",
            (*rules, "coverage", "--peer", str(work / "none.json")),
            "error",
            "none.json",
        ),
    ]
    verify = [sys.executable, "-m", "pcgopt.verify"]
    refuted = work / "refuted.json"
    out += [
        Case("verify missing", (*verify, str(work / "none.json")), "error", "none.json"),
        Case("verify not json", (*verify, str(f["machine_txt"])), "error", "machine.txt"),
        Case("verify refuted rule", (*verify, str(refuted)), "error", "refuted"),
        Case("verify timeout 0", (*verify, str(refuted), "--timeout", "0"), "error", "timeout"),
    ]
    return out


def _refuted_rule_file(work: Path) -> None:
    """A rule file with one unsound rule: relu(x + y) = relu(x) + relu(y)."""
    rule = {
        "name": "unsound_relu_add",
        "lhs": "relu(add(x1, x2))",
        "rhs": "add(relu(x1), relu(x2))",
        "inputs": {"x1": "f32[a, b]", "x2": "f32[a, b]"},
        "example": {"a": 2, "b": 4},
    }
    data = {"format": "pcgopt.rules", "version": 1, "rules": [rule]}
    (work / "refuted.json").write_text(json.dumps(data))


def run_case(case: Case, timeout: float) -> tuple[str, str, float]:
    argv = list(case.argv)
    cmd = argv if argv[0] == sys.executable else [*PCGOPT, *argv]
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if case.stdin_head:
        shell = " ".join(map(_quote, cmd)) + " | head -1"
        proc = subprocess.run(
            ["bash", "-o", "pipefail", "-c", shell],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        code, err = proc.returncode, proc.stderr
        # head closing the pipe may end the writer with SIGPIPE (141) or 0; a traceback is bad
        code = 0 if code in (0, 141) else code
    else:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            if case.interrupt_after_s:
                time.sleep(case.interrupt_after_s)
                os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return "hang", "", time.perf_counter() - start
    seconds = time.perf_counter() - start
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if "Traceback (most recent call last)" in err:
        return "traceback", err.strip().splitlines()[-1], seconds
    if case.expect == "ok":
        return ("clean" if code == 0 else "wrong"), (lines[-1] if lines else ""), seconds
    if code == 0:
        return "accepted", "", seconds
    if code < 0 or (code > 2 and code != 130):
        return "wrong", f"exit {code}: {lines[-1] if lines else ''}", seconds
    message = lines[-1] if lines else ""
    # argparse's convention: the usage, then one line of error
    usage = [line for line in lines[:-1] if not (line.startswith("usage:") or line[:1] == " ")]
    if lines and lines[0].startswith("usage:") and not usage:
        lines = lines[-1:]
    if len(lines) != 1 or (case.names and case.names.lower() not in message.lower()):
        return "unclear", " / ".join(lines[-3:]), seconds
    return "clean", message, seconds


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="cases whose name contains this")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--verbose", action="store_true", help="print every case's message")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pcgopt-bad-"))
    try:
        files = _files(work)
        _refuted_rule_file(work)
        counts: Counter[str] = Counter()
        for case in cases(files, work):
            if args.only and args.only not in case.name:
                continue
            outcome, message, seconds = run_case(case, args.timeout)
            counts[outcome] += 1
            if outcome != "clean" or args.verbose:
                print(f"{outcome:<9} {case.name:<24} {seconds:5.1f}s  {message[:150]}")
        total = sum(counts.values())
        print(f"\n{total} cases: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    finally:
        (work / "readonly").chmod(0o700)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
