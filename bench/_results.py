"""Shared by the bench scripts: replace one "## heading" section of bench/RESULTS.md."""

from __future__ import annotations

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


def publish(heading: str, lines: list[str], *, write: bool) -> None:
    """Prints the section ``heading`` followed by ``lines`` and, if ``write``, puts it in
    bench/RESULTS.md (:func:`write_section`)."""
    section = "\n".join([heading, "", *lines])
    print(section)
    if write:
        write_section(heading, section)
