"""How long Z3 may work on a query: a limit in Z3's own work units, with a wall-clock cap.

Every limit in :mod:`pcgopt.verify` is given in seconds, and every solver gets it through
:func:`limit`, which turns it into Z3's resource limit (``rlimit``): units of work Z3 counts as
it searches. The same query with the same limit gets the same answer on any machine at any
load, which wall time cannot give: a proof that needs close to its limit would fail on a busy
machine, and the rule file would differ from run to run. A wall-clock cap beside it
(``WALL_CAP_FACTOR`` times the seconds) stops a query whose units run unusually slowly; a
query stopped by the cap, not by its units, has an answer that depends on the machine, and
:func:`check` counts it in ``clock_stops``.
"""

from __future__ import annotations

import time

import z3

__all__ = ["UNITS_PER_SECOND", "WALL_CAP_FACTOR", "check", "clock_stops", "limit"]

#: Z3 resource units that stand for one second of a limit: about the median rate of the value
#: proofs of rule generation on the development machine (2.18 million units a second over the
#: 695 of its queries that ran longer than 50 ms; the 10th and 90th percentiles were 1.38 and
#: 2.82 million). The hardest proof that job made took 3.6 million units.
UNITS_PER_SECOND = 2_000_000
#: The wall-clock cap, in multiples of a limit's seconds. At 4, a run of the matrix preset
#: beside other work (four busy processes on two cores) had 12 verdicts decided by the cap
#: (unknown either way: the file was the same), none on a quiet machine; the slowest tenth of
#: queries run at 0.7 of the nominal rate, so 10 leaves room for several times the load.
WALL_CAP_FACTOR = 10


def limit(solver: z3.Solver, seconds: float) -> None:
    """Limits each ``check`` of ``solver`` to ``seconds`` of work (module docstring)."""
    solver.set("rlimit", max(1, round(seconds * UNITS_PER_SECOND)))
    solver.set("timeout", max(1, round(seconds * WALL_CAP_FACTOR * 1000)))


#: Checks in this process that the wall-clock cap ended (a verifier compares the count before
#: and after a rule to say its verdict depended on the machine).
clock_stops = 0


def check(solver: z3.Solver, seconds: float, *assumptions: z3.BoolRef) -> z3.CheckSatResult:
    """``solver.check(*assumptions)`` within ``seconds`` of work (see :func:`limit`); counts
    the check in ``clock_stops`` when the clock, not the work limit, ended it."""
    global clock_stops
    limit(solver, seconds)
    start = time.perf_counter()
    result = solver.check(*assumptions)
    # Z3 reports both limits alike ("canceled"); only the clock's ends at its cap.
    if result == z3.unknown and time.perf_counter() - start >= 0.99 * seconds * WALL_CAP_FACTOR:
        clock_stops += 1
    return result
