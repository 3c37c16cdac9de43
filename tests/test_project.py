"""The README is what CI runs, and its example works; a plain install ships every package."""

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_gives_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "pcgopt optimize" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci


def test_readme_examples_run():
    blocks = re.findall(r"```python\n(.+?)\n```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})


@pytest.mark.slow
def test_plain_install_contains_every_package_and_data_file(tmp_path):
    """A wheel (what `pip install .` installs) holds every subpackage, the top-level folders
    mapped into pcgopt.*, and every data file in them."""
    # Build from a copy: setuptools reuses a build/ folder, which would hide a missing package.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = tmp_path.glob("pcgopt-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    folders = {
        "pcgopt": "pcgopt",
        "egraph": "pcgopt/egraph",
        "rules": "pcgopt/rules",
        "verify": "pcgopt/verify",
        "extract": "pcgopt/extract",
    }
    for src, dst in folders.items():
        for f in (ROOT / src).rglob("*"):
            if f.is_file() and (f.suffix in (".py", ".json")) and "__pycache__" not in f.parts:
                assert f"{dst}/{f.relative_to(ROOT / src).as_posix()}" in names, f


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_code_is_ruff_clean(command):
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, str(ROOT)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
