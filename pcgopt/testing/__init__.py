"""Test support for pcgopt and for code that consumes PCGs: hypothesis strategies in
:mod:`pcgopt.testing.strategies` (needs the ``test`` extra: ``pip install pcgopt[test]``)."""
