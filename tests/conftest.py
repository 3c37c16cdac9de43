import os

from hypothesis import HealthCheck, settings

# "ci": the default profile, sized so the whole suite stays within minutes on 2 cores.
# "thorough": many more examples, for a long local run (HYPOTHESIS_PROFILE=thorough).
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
