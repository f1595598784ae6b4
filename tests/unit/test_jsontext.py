"""Strict JSON (issue 23, item 3): no NaN or Infinity in anything the project writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from conduit_hpc import jsontext
from conduit_hpc.plane.metrics import write_summary


def _strict_loads(text: str) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_become_null_at_any_depth() -> None:
    obj = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": (np.float32("nan"),),
           "e": np.array([1.0, np.nan]), "f": np.int64(3), "g": "NaN", "h": True}
    out = _strict_loads(jsontext.dumps(obj))
    assert out == {"a": None, "b": [1.0, None, {"c": None}], "d": [None], "e": [1.0, None],
                   "f": 3, "g": "NaN", "h": True}


def test_a_default_that_makes_nan_is_an_error_not_invalid_text() -> None:
    with pytest.raises(ValueError):
        jsontext.dumps({"x": object()}, default=lambda _: math.nan)


def test_summary_json_of_a_one_learner_run_is_json(tmp_path: Path) -> None:
    """The one-learner summary had ``"agree_mean_s": NaN`` and NaN in a list."""
    path = tmp_path / "summary.json"
    write_summary(path, {"agree_mean_s": math.nan,
                         "allreduce_mean_s_per_learner": [math.nan, 0.5],
                         "wall_s": np.float64(2.0)})
    out = _strict_loads(path.read_text())
    assert out == {"agree_mean_s": None, "allreduce_mean_s_per_learner": [None, 0.5],
                   "wall_s": 2.0}
