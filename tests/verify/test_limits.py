"""Z3's limits count its work, not the clock (pcgopt.verify.limits): a rule gets the same
verdict however loaded the machine is, and a verdict the wall-clock cap decided says so."""

import z3

from pcgopt.rewrite import Rule
from pcgopt.verify import limits, verify_rule

MATMUL_REDUCE = Rule.parse(
    "matmul_reduce",
    "matmul(reduce(x, degree=k), y)",
    "reduce(matmul(x, replicate(y, degree=k)), degree=k)",
    {"x": "[m, n]", "y": "[n, p]"},
)


def _hard_query() -> z3.Solver:
    # No positive cubes sum to a cube: Z3 searches a long time without an answer.
    # In a context of its own: Z3 counts work per context.
    ctx = z3.Context()
    x, y, z = z3.Ints("x y z", ctx)
    s = z3.Solver(ctx=ctx)
    s.add(x * x * x + y * y * y == z * z * z, x > 0, y > 0, z > 0)
    return s


def test_a_check_stops_at_its_work_and_the_clock_is_not_what_stopped_it():
    before = limits.clock_stops
    s = _hard_query()
    assert limits.check(s, 0.01) == z3.unknown
    used = s.statistics().get_key_value("rlimit count")
    # Z3 checks its count between steps: it stops a little past the limit, not far.
    assert 0.01 * limits.UNITS_PER_SECOND <= used <= 2 * 0.01 * limits.UNITS_PER_SECOND
    assert limits.clock_stops == before


def test_the_work_limit_decides_however_much_time_is_left(monkeypatch):
    assert verify_rule(MATMUL_REDUCE, timeout_s=10).status == "proved"
    # Too few units for the proof, with ample wall time: unknown, as on any machine.
    monkeypatch.setattr(limits, "UNITS_PER_SECOND", 10)
    v = verify_rule(MATMUL_REDUCE, timeout_s=10)
    assert v.status == "unknown" and v.seconds < 1
    assert not any("wall-clock cap" in n for n in v.notes) and not v.clock_stopped


def test_a_verdict_the_clock_decided_says_so(monkeypatch):
    # Units without end and a cap of a millisecond: the clock ends the value proof.
    monkeypatch.setattr(limits, "UNITS_PER_SECOND", 10**12)
    monkeypatch.setattr(limits, "WALL_CAP_FACTOR", 1e-4)
    before = limits.clock_stops
    v = verify_rule(MATMUL_REDUCE, timeout_s=10)
    assert limits.clock_stops > before
    assert v.status == "unknown"
    assert any("wall-clock cap" in n and "may differ" in n for n in v.notes) and v.clock_stopped
