"""python -m pcgopt.verify."""

import json
import subprocess
import sys

import pytest

from pcgopt.rewrite import Rule, dump_rules
from pcgopt.verify.__main__ import main


def rule_file(tmp_path):
    rules = [
        Rule.parse(
            "relu_rows",
            "relu(partition(x, dim=0, degree=k))",
            "partition(relu(x), dim=0, degree=k)",
            {"x": "[m, n]"},
        ),
        Rule.parse(
            "relu_additive",
            "relu(add(x, y))",
            "add(relu(x), relu(y))",
            {"x": "[m, n]", "y": "[m, n]"},
        ),
    ]
    path = tmp_path / "rules.json"
    path.write_text(dump_rules(rules))
    return path


def test_summary_and_json(tmp_path, capsys):
    out = tmp_path / "verdicts.json"
    # One rule of the two is refuted: the exit status says so.
    assert (
        main([str(rule_file(tmp_path)), "--workers", "1", "--timeout", "2", "--json", str(out)])
        == 1
    )
    text = capsys.readouterr().out
    assert "proved                1" in text
    assert "refuted               1" in text
    assert "relu_additive: at {x:" in text
    verdicts = json.loads(out.read_text())["verdicts"]
    assert [v["status"] for v in verdicts] == ["proved", "refuted"]


def test_parallel_workers_and_fixed_symbols(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pcgopt.verify",
            str(rule_file(tmp_path)),
            "--workers",
            "2",
            "--timeout",
            "2",
            "--fix",
            "k=3",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stderr  # relu_additive is refuted
    assert "proved                1" in done.stdout
    assert "2/2" in done.stderr  # the progress display


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert main([str(bad)]) == 2
    assert "not a pcgopt rule file" in capsys.readouterr().err


def test_a_file_of_sound_rules_exits_zero(tmp_path, capsys):
    path = tmp_path / "sound.json"
    sound = Rule.parse(
        "relu_rows",
        "relu(partition(x, dim=0, degree=k))",
        "partition(relu(x), dim=0, degree=k)",
        {"x": "[m, n]"},
    )
    path.write_text(dump_rules([sound]))
    assert main([str(path), "--workers", "1", "--timeout", "2"]) == 0
    assert "refuted               0" in capsys.readouterr().out


def test_numbers_that_would_hang_or_mean_nothing_are_refused(tmp_path, capsys):
    from pcgopt.rules.__main__ import main as rules_main

    path = rule_file(tmp_path)
    for argv, run, said in [
        ([str(path), "--timeout", "0"], main, "--timeout: expected a positive, finite number"),
        ([str(path), "--workers", "0"], main, "--workers: expected a positive integer, got 0"),
        (["generate", "--max-ops", "0", "--out", "r.json"], rules_main, "--max-ops: expected"),
        (["generate", "--workers", "-2", "--out", "r.json"], rules_main, "--workers: expected"),
    ]:
        with pytest.raises(SystemExit) as e:
            run(argv)
        assert e.value.code == 2 and said in capsys.readouterr().err
    assert main([str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.startswith("python -m pcgopt.verify: error: cannot read")
