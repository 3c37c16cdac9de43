"""Bad input never ends in a traceback: fuzzed PCG files, plan files, machine files and command
lines each give a valid result or one line of error from a pcgopt error type, quickly
(hypothesis' deadline catches a hang). tools/bad_inputs.py runs a fixed list of bad command
lines as subprocesses, for before/after counts."""

import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcgopt import PCG, Machine
from pcgopt.cli import main
from pcgopt.errors import PCGError
from pcgopt.extract.search.plan import saturate_and_extract
from pcgopt.machine import MachineError
from pcgopt.models import ZOO
from pcgopt.testing.strategies import ODD_JSON_VALUES, json_mutations

MODEL = ZOO["mnist_mlp"].build(small=True).to_dict()
MACHINE = Machine.preset("summit", nodes=2).to_dict()
FUZZ = settings(
    max_examples=150,
    deadline=2000,  # milliseconds: a hang or an O(size) loop over an absurd size fails here
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _one_line_error(capsys, code: int) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, code
    assert len(err) == 1 and ": error: " in err[0], err


@FUZZ
@given(json_mutations(MODEL))
def test_a_malformed_pcg_document_is_a_pcg_or_a_pcg_error(document):
    try:
        pcg = PCG.from_dict(document)
    except PCGError as e:
        assert "\n" not in str(e)
        return
    pcg.summary()  # whatever was accepted can be shown
    assert PCG.from_json(pcg.to_json()) == pcg


@FUZZ
@given(document=json_mutations(MODEL), as_plan=st.booleans())
def test_the_cli_reads_a_malformed_model_or_plan_file_with_one_line_of_error(
    document, as_plan, tmp_path, capsys
):
    capsys.readouterr()
    path = tmp_path / "model.json"
    data = {"pcg": document, "cost": {}} if as_plan else document
    path.write_text(json.dumps(data))
    code = main(["summary", str(path), "--rows", "2"])
    if code != 0:
        _one_line_error(capsys, code)


@FUZZ
@given(json_mutations(MACHINE))
def test_a_malformed_machine_document_is_a_machine_or_a_machine_error(document):
    try:
        machine = Machine.from_dict(document)
    except MachineError as e:
        assert "\n" not in str(e)
        return
    assert machine.num_devices >= 1 and Machine.from_dict(machine.to_dict()) == machine


def _value(work: bool = False):
    """An option's value: odd ones, small integers, random text. ``work``: the value is an
    amount of work (trials), so no huge integers: a user who asks for 10^18 trials gets them."""
    odd = [str(v) for v in ODD_JSON_VALUES if not isinstance(v, list | dict)]
    odd += ["nan", "-inf", "1e308", "0x10", "summit:0", "99999999999"]
    if work:
        odd = [v for v in odd if not v.lstrip("-").isdigit() or len(v) < 3]
    return st.one_of(st.sampled_from(odd), st.integers(-3, 12).map(str), st.text(max_size=8))


@st.composite
def command_lines(draw) -> list[str]:
    """A command with some of its options, each given a random value."""
    command = draw(st.sampled_from(["summary", "models", "ops", "equivalent", "reductions"]))
    argv = [command]
    if command == "summary":
        argv.append(draw(st.sampled_from(["mnist_mlp", "bert_large", "nosuch", "", "x.json"])))
        argv += ["--small"] if draw(st.booleans()) else []
        for _ in range(draw(st.integers(0, 2))):
            key = draw(st.sampled_from(["hidden", "layers", "heads", "batch", "nosuch", ""]))
            argv += ["--set", f"{key}={draw(_value())}"]
        options = ["--rows"]
    elif command == "ops":
        argv += [draw(st.sampled_from(["matmul", "relu", "nosuch", ""]))]
        options = []
    elif command == "equivalent":
        argv += ["mnist_mlp", draw(st.sampled_from(["mnist_mlp", "mlp", ""]))]
        options = ["--trials"]
    elif command == "reductions":
        argv += ["--machine", draw(st.sampled_from(["summit:2", "dgx-a100", "", "summit:0"]))]
        argv += ["--axes", draw(st.sampled_from(["4,3", "0", "-2", "", "a"]))]
        argv += ["--reduce", draw(st.sampled_from(["0", "5", "-1", ""]))]
        options = ["--bytes", "--max-size", "--top"]
    else:
        options = []
    if options:
        for option in draw(st.lists(st.sampled_from(options), max_size=2, unique=True)):
            argv += [option, draw(_value(work=option == "--trials"))]
    return argv


@settings(
    max_examples=100,
    deadline=10_000,  # a small model's equivalence check or a reduction search take a while
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(argv=command_lines())
def test_a_random_command_line_succeeds_or_says_what_is_wrong_in_one_line(argv, capsys):
    capsys.readouterr()  # the fixture is shared by the examples: drop the last one's output
    try:
        code = main(argv)
    except SystemExit as e:  # argparse: --help, or a usage error (usage, then one line)
        assert e.code in (0, 2), argv
        if e.code == 2:
            assert capsys.readouterr().err.strip().splitlines()[-1].startswith("pcgopt")
        return
    if code == 1 and argv[0] == "equivalent":  # an answer: the two models differ
        assert capsys.readouterr().out.startswith("not equivalent")
    elif code != 0:
        _one_line_error(capsys, code)


@pytest.mark.parametrize("budget", ["inf", "nan", "-1", "0", "1e400"], ids=lambda b: f"budget={b}")
def test_a_budget_that_is_not_a_positive_finite_number_is_refused_before_the_search(budget, capsys):
    with pytest.raises(SystemExit) as e:
        main(["optimize", "mnist_mlp", "--small", "--budget", budget])
    assert e.value.code == 2
    assert "expected a positive, finite number" in capsys.readouterr().err


def _document(nodes, outputs=("a",)):
    return {"format": "pcgopt.pcg", "version": 1, "nodes": nodes, "outputs": list(outputs)}


X = {"name": "x", "op": "input", "inputs": [], "params": {"shape": [8, 4]}}
NAN = math.nan


@pytest.mark.parametrize(
    ("document", "said"),
    [
        (_document([], []), "'nodes' must be a non-empty list"),
        (_document([X], []), "'outputs' is empty"),
        (_document([{**X, "params": {"shape": [2**63, 4]}}], ["x"]), "each at most 2^62"),
        (
            _document(
                [X, {"name": "a", "op": "scale", "inputs": ["x"], "params": {"factor": math.nan}}]
            ),
            "parameter 'factor' must be a number, got nan",
        ),
        (_document([{**X, "name": ""}], [""]), "'name' must be a non-empty string"),
    ],
    ids=["empty", "no outputs", "dimension over 2^62", "NaN parameter", "empty name"],
)
def test_edge_graphs_are_refused_with_the_field_at_fault(document, said):
    with pytest.raises(PCGError, match=re.escape(said)):
        PCG.from_dict(document)


def test_a_model_of_rank_0_tensors_is_optimized():
    scalar = {**X, "params": {"shape": []}}
    weight = {"name": "w", "op": "weight", "inputs": [], "params": {"shape": []}}
    add = {"name": "a", "op": "add", "inputs": ["x", "w"], "params": {}}
    pcg = PCG.from_dict(_document([scalar, weight, add]))
    plan = saturate_and_extract(pcg, Machine.preset("summit", devices_per_node=2), time_budget_s=3)
    assert plan.check.startswith("equivalent") and plan.pcg.shape("a").rank == 0
