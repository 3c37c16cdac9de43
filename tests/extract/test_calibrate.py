"""Fitting alpha and beta to measured collective timings (AutoDDL section 3.2)."""

import numpy as np
import pytest

from pcgopt import Level, Link, Machine
from pcgopt.extract import (
    CalibrationError,
    Measurement,
    calibrated,
    collective_cost,
    fit_alpha_beta,
    flat_coefficients,
    load_csv,
)
from pcgopt.machine import V100_SXM2_16GB

# Two links to recover: NVLink-like inside a node, a network between nodes.
TRUTH = {"gpu": (3e-6, 1 / 150e9), "node": (12e-6, 1 / 10e9)}
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES = (2**10, 2**16, 2**20, 2**24, 2**28)


def synthetic(noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for level, (alpha, beta) in TRUTH.items():
        for kind in KINDS:
            for p in (2, 4, 8):
                for n in SIZES:
                    a, b = flat_coefficients(kind, p, n)
                    t = (a * alpha + b * beta) * (1 + noise * rng.standard_normal())
                    rows.append(Measurement(kind, p, n, t, level))
    return rows


def test_recovers_alpha_and_beta_exactly_from_exact_timings():
    fits = fit_alpha_beta(synthetic())
    assert list(fits) == ["gpu", "node"]
    for level, (alpha, beta) in TRUTH.items():
        assert fits[level].alpha_s == pytest.approx(alpha, rel=1e-9)
        assert fits[level].beta_s_per_byte == pytest.approx(beta, rel=1e-9)
        assert fits[level].rows == len(KINDS) * 3 * len(SIZES)
        assert fits[level].rms_error_s < 1e-15


def test_recovers_alpha_and_beta_within_a_few_percent_from_noisy_timings():
    fits = fit_alpha_beta(synthetic(noise=0.02, seed=1))
    for level, (alpha, beta) in TRUTH.items():
        assert fits[level].alpha_s == pytest.approx(alpha, rel=0.05)
        assert fits[level].bandwidth_Bps == pytest.approx(1 / beta, rel=0.02)


def test_a_fitted_machine_reproduces_the_measurements():
    base = Machine(
        (Level("node", 2, Link(1e9, 1e-3)), Level("gpu", 8, Link(1e9, 1e-3))), V100_SXM2_16GB
    )
    machine = calibrated(base, fit_alpha_beta(synthetic()))
    assert [lv.link.latency_s for lv in machine.levels] == pytest.approx([12e-6, 3e-6])
    assert machine.levels[0].link.bandwidth_Bps == pytest.approx(10e9)
    m = Measurement("all_reduce", 8, 2**24, 0.0 + 1e-3)  # only its shape is used
    within_node = collective_cost(m.collective, [tuple(range(8))], m.nbytes, machine)
    a, b = flat_coefficients("all_reduce", 8, 2**24)
    assert within_node.seconds == pytest.approx(a * 3e-6 + b / 150e9)


def test_rows_without_a_level_are_fitted_per_group_size():
    rows = [
        {
            "collective": "AllReduce",
            "group_size": p,
            "bytes": n,
            "seconds": 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * n / 20e9,
        }
        for p in (2, 4)
        for n in (1e3, 1e6, 1e9)
    ]
    fits = fit_alpha_beta(rows)
    assert list(fits) == [2, 4]
    assert fits[4].alpha_s == pytest.approx(5e-6) and fits[4].bandwidth_Bps == pytest.approx(20e9)
    assert repr(fits[2]).startswith("AlphaBeta(alpha 5 µs, 20 GB/s, 3 rows")


def test_a_latency_below_resolution_is_zero_not_negative():
    rows = [
        Measurement("all_gather", 4, n, 3 / 4 * n / 1e10 * f)
        for n, f in ((1e6, 0.95), (1e7, 1.0), (1e8, 1.0))
    ]
    (fit,) = fit_alpha_beta(rows).values()
    assert fit.alpha_s == 0.0
    assert fit.bandwidth_Bps == pytest.approx(1e10, rel=0.02)


def test_fit_errors_say_which_group_and_why():
    one_size = [Measurement("all_reduce", 2, 1e6, 1e-4, "node")] * 3
    with pytest.raises(
        CalibrationError, match=r"level 'node': 3 measurement.* cannot separate alpha from beta"
    ):
        fit_alpha_beta(one_size)
    shrinking = [
        Measurement("all_reduce", 2, n, t) for n, t in ((1e3, 1e-3), (1e6, 1e-4), (1e9, 1e-5))
    ]
    with pytest.raises(
        CalibrationError, match="group size 2: the times do not grow with the message size"
    ):
        fit_alpha_beta(shrinking)
    with pytest.raises(CalibrationError, match="row 1: column 'seconds': must be > 0"):
        fit_alpha_beta(
            [one_size[0], {"collective": "reduce", "group_size": 2, "bytes": 1, "seconds": 0}]
        )
    with pytest.raises(CalibrationError, match="no measurements"):
        fit_alpha_beta([])


def test_calibrated_needs_level_names_of_the_machine():
    fits = fit_alpha_beta(synthetic())
    machine = Machine.preset("dgx-a100")
    assert calibrated(machine, fits).levels[1].link.bandwidth_Bps == pytest.approx(150e9)
    summit = Machine.preset("summit")
    assert calibrated(summit, {"gpu": fits["gpu"]}).levels[1] == summit.levels[1]
    with pytest.raises(
        CalibrationError,
        match="machine 'summit' has no level 'rack'; its levels: node, socket, gpu",
    ):
        calibrated(summit, {"rack": fits["gpu"]})
    with pytest.raises(CalibrationError, match="group size 8 names no level"):
        calibrated(summit, {8: fits["gpu"]})


# --- CSV ------------------------------------------------------------------------------------------


def write(tmp_path, text):
    path = tmp_path / "timings.csv"
    path.write_text(text)
    return path


def test_load_csv_reads_rows_with_and_without_a_level(tmp_path):
    path = write(
        tmp_path,
        "collective,group_size,bytes,seconds,level\n"
        "all_reduce,8,1048576,4.1e-05,gpu\n"
        "\n"
        "all-gather, 2 ,1e6,0.00027,\n",
    )
    assert load_csv(path) == [
        Measurement("all_reduce", 8, 1048576, 4.1e-05, "gpu"),
        Measurement("all_gather", 2, 1e6, 0.00027, None),
    ]


def test_load_csv_without_the_optional_column(tmp_path):
    path = write(tmp_path, "seconds,bytes,group_size,collective\n1e-3,1024,4,bcast\n")
    assert load_csv(path) == [Measurement("broadcast", 4, 1024, 1e-3)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "",
            "timings.csv: empty file; expected a header with collective, group_size, bytes, "
            "seconds",
        ),
        (
            "collective,group_size,bytes\nall_reduce,2,1\n",
            "timings.csv: row 1: column 'seconds': missing from the header",
        ),
        (
            "collective,group_size,bytes,seconds,note\n",
            "row 1: column 'note': unknown column; valid columns: collective, group_size, bytes, "
            "seconds, level",
        ),
        ("collective,group_size,bytes,seconds\n", "timings.csv: no measurements after the header"),
        (
            "collective,group_size,bytes,seconds\nall_reduce,2,1,1e-5\nall_reduce,2,1,fast\n",
            "row 3: column 'seconds': not a number: 'fast'",
        ),
        (
            "collective,group_size,bytes,seconds\nallsum,2,1,1e-5\n",
            "row 2: column 'collective': unknown collective 'allsum'; valid: all_reduce,",
        ),
        (
            "collective,group_size,bytes,seconds\nreduce,1,1,1e-5\n",
            "row 2: column 'group_size': must be an integer >= 2",
        ),
        (
            "collective,group_size,bytes,seconds\nreduce,2.5,1,1e-5\n",
            "row 2: column 'group_size': must be an integer >= 2, got '2.5'",
        ),
        (
            "collective,group_size,bytes,seconds\nreduce,2,-1,1e-5\n",
            "row 2: column 'bytes': must be >= 0",
        ),
        ("collective,group_size,bytes,seconds\nreduce,2,1\n", "row 2: has 3 fields, the header 4"),
        (
            "collective,group_size,bytes,seconds\nreduce,2,1,1e-5,gpu\n",
            "row 2: has 5 fields, the header 4",
        ),
    ],
)
def test_load_csv_errors_name_the_row_and_column(tmp_path, text, message):
    with pytest.raises(CalibrationError) as info:
        load_csv(write(tmp_path, text))
    assert message in str(info.value)
