import os

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# shared test cases (tests/transport_cases.py) get pytest's assertion messages too
pytest.register_assert_rewrite("transport_cases")

# hypothesis: bounded by default so the suite stays fast; `--hypothesis-profile=long` for
# a long local fuzzing run (tests that fuzz an input surface take their example count
# from the profile)
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("default", max_examples=120, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
