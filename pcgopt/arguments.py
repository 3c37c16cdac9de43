"""Argument types shared by the command lines (``pcgopt``, ``python -m pcgopt.rules``,
``python -m pcgopt.verify``): a bad number is refused by argparse with one line that names the
option and the value, before any work starts."""

from __future__ import annotations

import argparse
import math


def _integer(text: str, least: int, valid: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {valid}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {valid}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _integer(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    return _integer(text, 0, "an integer >= 0")


def _number(text: str, zero: bool) -> float:
    """A finite number > 0, or >= 0 when ``zero`` is allowed."""
    valid = "a number >= 0" if zero else "a positive number"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {valid}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        finite = "a finite number >= 0" if zero else "a positive, finite number"
        raise argparse.ArgumentTypeError(f"expected {finite}, got {text}")
    return value


def positive_number(text: str) -> float:
    """A finite number > 0 (not NaN, not infinity)."""
    return _number(text, zero=False)


def non_negative_number(text: str) -> float:
    """A finite number >= 0."""
    return _number(text, zero=True)
