"""Starts the zoo plans' checks (tests/lower/test_zoo_plans.py) in a process of their own as soon
as they are collected, so that their minutes of compiling run beside the rest of the suite on
the second core; ``zoo_results(name)`` waits for a model's result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ZOO_TESTS = "test_zoo_plans.py::test_every_plan_of_the_small_model"
_worker: dict[str, object] = {}


def pytest_collection_modifyitems(session, config, items):
    if _worker or not any(ZOO_TESTS in item.nodeid for item in items):
        return
    # The suite reads their results last, when the worker has had the whole run to finish
    # them, instead of waiting for it in the middle.
    items[:] = [i for i in items if ZOO_TESTS not in i.nodeid] + [
        i for i in items if ZOO_TESTS in i.nodeid
    ]
    folder = Path(tempfile.mkdtemp(prefix="pcgopt-zoo-"))
    out, log = folder / "results.json", folder / "worker.log"
    script = Path(__file__).with_name("test_zoo_plans.py")
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, str(script), "--check", str(out)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )
    # One core for it: its compiler's threads would otherwise take both from the suite.
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) > 1:
        os.sched_setaffinity(process.pid, {cores[-1]})
    _worker.update(process=process, out=out, log=log)


def pytest_sessionfinish(session, exitstatus):
    process = _worker.get("process")
    if isinstance(process, subprocess.Popen) and process.poll() is None:
        process.kill()


@pytest.fixture(scope="session")
def zoo_results():
    """``wait(name)``: the worker's result for the model (None: no worker, check in-process)."""
    if not _worker:
        return None
    process, out, log = _worker["process"], _worker["out"], _worker["log"]

    def wait(name: str) -> dict:
        while True:
            if out.exists():
                found = json.loads(out.read_text())
                if name in found:
                    return found[name]
            if process.poll() is not None and not (
                out.exists() and name in json.loads(out.read_text())
            ):
                return {
                    "ok": False,
                    "error": f"the checking process ended: {log.read_text()[-3000:]}",
                }
            time.sleep(0.5)

    return wait
