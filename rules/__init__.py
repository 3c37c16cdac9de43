"""pcgopt.rules: the offline rule-generation job and the shipped, verified rule set.

``load()`` returns the shipped rules (``rules.json`` in this package, written by
``python -m pcgopt.rules generate``); every one was proved by :func:`pcgopt.verify.verify_rule`
for all parallel degrees. See :mod:`pcgopt.rules.generate` for how they are found.

>>> rules = load()
>>> all(meta["verdict"]["status"] == "proved" for _, meta in load_records())
True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pcgopt.rewrite import Rule, load_rules

#: The shipped rule file.
RULES_FILE = Path(__file__).with_name("rules.json")


def load_records(path: Path | None = None) -> list[tuple[Rule, dict[str, Any]]]:
    """Every rule of a rule file (default: the shipped one) with its record: kind
    ("algebraic" or "parallel"), the size it was found at, and the verifier's verdict."""
    path = path or RULES_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"no rule file at {path}; run `python -m pcgopt.rules generate --out {path}`"
        )
    return load_rules(path.read_text())


def load(path: Path | None = None) -> list[Rule]:
    """The rules of a rule file (default: the shipped one)."""
    return [rule for rule, _ in load_records(path)]


__all__ = ["RULES_FILE", "load", "load_records"]
