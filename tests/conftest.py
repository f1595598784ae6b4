import os

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# shared test cases (tests/transport_cases.py) get pytest's assertion messages too
pytest.register_assert_rewrite("transport_cases")
