"""Divisors of device counts and tensor sizes, in time that does not grow with the count.

Every search over degrees enumerates divisors: of the device count (the degrees a rewrite may
choose), of a layer's batch, columns and contraction (its SBP strategies). A loop up to the
count takes seconds per call on a machine of a million devices (``summit:100000``) and minutes
where a search calls it per layer and per device count; these take at most the square root of
the number, and at most ``limit`` steps where only divisors up to ``limit`` are wanted (a
dimension of 2^62 split over at most 2^20 devices).

>>> divisors(12)
(1, 2, 3, 4, 6, 12)
>>> divisors(10**12 + 39, limit=100)  # a large prime: no divisor but 1 up to 100
(1,)
>>> largest_divisor(1024, 12)
8
"""

from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["divisors", "largest_divisor"]


@lru_cache(maxsize=4096)
def divisors(n: int, limit: int | None = None) -> tuple[int, ...]:
    """The divisors of ``n`` (a positive int) up to ``limit`` (default: all), ascending."""
    if n < 1:
        raise ValueError(f"divisors: {n!r} is not a positive int")
    top = n if limit is None else min(n, limit)
    small, large = [], []
    # A divisor above sqrt(n) is n // i for a divisor i below it; if sqrt(n) exceeds the limit,
    # no such cofactor is within it, and the divisors up to the limit are the small ones.
    for i in range(1, min(math.isqrt(n), top) + 1):
        if n % i == 0:
            small.append(i)
            j = n // i
            if j != i and j <= top:
                large.append(j)
    return tuple(small + large[::-1])


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (at least 1)."""
    return divisors(n, max(1, limit))[-1]
