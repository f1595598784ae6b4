"""What a learner's transform returns goes to torch without a copy unless something else
holds its memory (:func:`~conduit_hpc.plane.transform.private_columns`): the batch path
copies nothing for the common transforms (in place on the batch's columns, views of
them, new arrays), and copies what a transform keeps (tests/mpi/test_transform_output_kept.py
shows what went wrong before)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from conduit_hpc.plane.transform import private_columns

COLS = {"obs": np.zeros((4, 3)), "act": np.zeros(4)}
KEPT = np.zeros((4, 3))  # a transform's own buffer
KEPT_BIG = np.zeros((8, 3))


def _split(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"obs": x[:, :3], "act": x[:, 3]}


CASES: dict[str, tuple[Callable[[], dict[str, np.ndarray]], set[str]]] = {
    "the columns": (lambda: dict(COLS), set()),
    "views of the columns": (lambda: {"obs": COLS["obs"][:, :2], "act": COLS["act"][:]},
                             set()),
    "a new array": (lambda: {"obs": COLS["obs"].astype(np.float32), "act": COLS["act"]},
                    set()),
    "views of one new array": (lambda: _split(np.ones((4, 4))), set()),
    "a buffer it keeps": (lambda: {"obs": KEPT, "act": COLS["act"]}, {"obs"}),
    "a view of a buffer it keeps": (lambda: {"obs": KEPT_BIG[:4], "act": COLS["act"]},
                                    {"obs"}),
    "a tensor's memory": (lambda: {"obs": torch.ones(4, 3).numpy(), "act": COLS["act"]},
                          {"obs"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_only_what_something_else_holds_is_copied(case: str) -> None:
    make, want = CASES[case]
    data = make()
    given = {k: id(v) for k, v in data.items()}
    before = {k: v.copy() for k, v in data.items()}
    out = private_columns(data, COLS)
    copied = {k for k, v in out.items() if id(v) != given[k]}
    assert copied == want
    for k, v in out.items():
        np.testing.assert_array_equal(v, before[k])
        if k in want:
            assert not np.shares_memory(v, data[k])
