"""Divisors of device counts and sizes (pcgopt.divisors), in time that does not grow with them."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcgopt.divisors import divisors, largest_divisor


@given(st.integers(1, 5000), st.none() | st.integers(1, 6000))
def test_divisors_are_every_divisor_up_to_the_limit_in_order(n, limit):
    top = n if limit is None else min(n, limit)
    assert divisors(n, limit) == tuple(d for d in range(1, top + 1) if n % d == 0)


@given(st.integers(1, 5000), st.integers(1, 6000))
def test_the_largest_divisor_is_the_last_one_up_to_the_limit(n, limit):
    assert largest_divisor(n, limit) == max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def test_a_size_of_2_to_the_62_over_a_million_devices_takes_at_most_a_million_steps():
    # A loop up to the number would not end; up to its square root, 2^31 steps.
    assert divisors(2**62, 2**20)[-1] == 2**20
    assert divisors(2**61 - 1, 2**20) == (1,)  # a Mersenne prime


def test_a_non_positive_number_is_refused():
    with pytest.raises(ValueError, match="not a positive int"):
        divisors(0)
