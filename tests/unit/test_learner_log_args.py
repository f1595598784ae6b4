"""``edp.log(name=value)`` takes one real number per name of the job's own: a tensor with
a graph, a 0-d array or NaN become floats; a string, None, several values, a complex
number or a column the data plane writes itself (``time_s``: it was silently overwritten
in the metrics row) are refused by name, and nothing of the call is logged."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from conduit_hpc.errors import SpecError
from conduit_hpc.plane.learner import LearnerEndpoint


def log(**values: Any) -> dict[str, Any]:
    learner = SimpleNamespace(_extra={})
    LearnerEndpoint.log(learner, **values)  # type: ignore[arg-type]
    return learner._extra


def test_numbers_of_any_kind_become_floats() -> None:
    got = log(loss=torch.tensor(0.5, requires_grad=True) * 2, td=np.float32(0.25),
              n=np.array([3]), ret=math.nan)
    assert got["loss"] == 1.0 and got["td"] == 0.25 and got["n"] == 3.0
    assert math.isnan(got["ret"]) and all(type(v) is float for v in got.values())


@pytest.mark.parametrize(("values", "match"), [
    ({"time_s": 1.0}, "'time_s' is a column the data plane writes itself"),
    ({"loss": 1.0, "note": "diverged"}, "note = 'diverged' must be one real number"),
    ({"loss": None}, "loss = None must be one real number"),
    ({"loss": torch.ones(2)}, "must be one real number"),
    ({"loss": 1 + 2j}, "must be one real number"),
])
def test_what_is_not_one_number_of_the_jobs_own_is_refused(values: dict[str, Any],
                                                           match: str) -> None:
    learner = SimpleNamespace(_extra={})
    with pytest.raises(SpecError, match=match):
        LearnerEndpoint.log(learner, **values)  # type: ignore[arg-type]
    assert learner._extra == {}
