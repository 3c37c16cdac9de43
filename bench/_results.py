"""Shared by the bench scripts: replace one "## heading" section of bench/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def write_section(heading: str, section: str) -> None:
    """Replaces the section that starts at ``heading`` (up to the next ``## ``), or appends."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n"
    if heading in text:
        before, _, rest = text.partition(heading)
        after = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
        text = before + section + ("\n" + after if after else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)


def run_child(code: str, *args: object) -> dict | str:
    """Runs ``python -c code args...`` in bench/ (its own process, so its peak memory is its
    own) and returns the JSON its last output line holds, or the last line of its errors."""
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    )
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        return out.stderr.splitlines()[-1] if out.stderr else f"exit {out.returncode}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def command_sentence(started: float) -> str:
    """A section's "Command:" line: how this bench script was run (``--no-write`` left out: it
    changes only whether the section is written) and the minutes since ``started``
    (``time.perf_counter()``)."""
    args = [a for a in sys.argv[1:] if a != "--no-write"]
    command = " ".join(["python", f"bench/{Path(sys.argv[0]).name}", *args])
    minutes = (time.perf_counter() - started) / 60
    return f"Command: `{command}` ({minutes:.0f} min on the development machine, 2 cores)."


def publish(heading: str, lines: list[str], *, write: bool) -> None:
    """Prints the section ``heading`` followed by ``lines`` and, if ``write``, puts it in
    bench/RESULTS.md (:func:`write_section`)."""
    section = "\n".join([heading, "", *lines]) + "\n"
    print(section)
    if write:
        write_section(heading, section)


def check_kind(check: str) -> str:
    """How a Plan was checked (``Plan.check``), in a table cell: at full size, on a scaled-down
    instance, skipped or not checked."""
    if check.startswith("equivalent"):
        return "scaled down" if "scaled down" in check else "full size"
    return check.split(":")[0]
