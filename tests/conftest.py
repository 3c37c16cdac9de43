import atexit
import os
import shutil
import tempfile
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings

from pcgopt.lower.run import host_devices

# Plans run on 8 virtual CPU devices (tests/lower); JAX reads this once, when it loads, so it
# is set before any test imports it. The tests compile about a hundred small programs and run
# each once: XLA's cheaper code generation compiles them about a fifth faster.
host_devices(8)
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += (
        " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    )

# The shipped rules' translation (pcgopt.egraph.rule_cache) cached for this run only, in a
# directory of its own: the tests' child processes read what the first one wrote, and nothing
# is left in the user's cache.
if "PCGOPT_CACHE_DIR" not in os.environ:
    os.environ["PCGOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="pcgopt-test-cache-")
    atexit.register(shutil.rmtree, os.environ["PCGOPT_CACHE_DIR"], ignore_errors=True)

# "ci": the default profile, sized so the whole suite stays within minutes on 2 cores.
# "thorough": many more examples, for a long local run (HYPOTHESIS_PROFILE=thorough).
settings.register_profile(
    "ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _pin_two_iterations(patch: pytest.MonkeyPatch) -> None:
    import pcgopt.extract.search.plan as plan_module

    budget = replace(plan_module.DETERMINISTIC_BUDGET, iterations=2)
    patch.setattr(plan_module, "DETERMINISTIC_BUDGET", budget)


@pytest.fixture
def two_iterations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deterministic search's limits with two saturation iterations instead of the
    shipped three: for the tests of other behaviour, which the third makes about twice as
    slow (the deterministic-search tests and bench/ablation.py keep the shipped limits)."""
    _pin_two_iterations(monkeypatch)


@pytest.fixture(scope="module")
def two_iterations_in_module():
    """:func:`two_iterations` for a module's fixtures."""
    with pytest.MonkeyPatch.context() as patch:
        _pin_two_iterations(patch)
        yield
