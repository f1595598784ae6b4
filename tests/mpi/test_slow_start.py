"""A slow first ``import torch`` (a loaded node: 30-40 s at load 20 on 2 cores) is no
failure: the data plane's constructor must not count it against ``run.timeout_s``.

Seen in test_delivery_process.py::test_a_failed_learner_ends_its_delivery_rank at load
13-23: the learner imported torch inside the constructor's device agreement while the
other ranks waited for it there, and they raised CollectiveFailed ("a rank failed, left
without an error, or did not arrive") after run.timeout_s = 30 s.

Here every rank's first ``import torch`` statement after the hook is installed takes
``DELAY_S`` > ``run.timeout_s``, as a loaded node's would on every rank at once (the
module itself is loaded before, outside the test's timing: the hook delays the
statement)."""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator

import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD
TIMEOUT_S = 3.0
DELAY_S = 4.5


@pytest.fixture
def slow_torch_import() -> Iterator[None]:
    """The next ``import torch`` (or ``from torch ...``) of this process sleeps
    ``DELAY_S`` once, then imports as usual."""
    import torch  # noqa: F401 - the real import first: its own time varies by rank

    real = builtins.__import__
    pending = [True]

    def slow(name, *args, **kwargs):
        if pending[0] and (name == "torch" or name.startswith("torch.")):
            pending[0] = False
            time.sleep(DELAY_S)
        return real(name, *args, **kwargs)

    COMM.Barrier()  # every rank starts the constructor together
    builtins.__import__ = slow
    try:
        yield
    finally:
        builtins.__import__ = real


@pytest.mark.mpi(min_size=3)
def test_a_slow_first_torch_import_is_not_a_failed_rank(slow_torch_import):
    delivery = "process" if COMM.size >= 4 else "thread"  # a delivery rank needs 4 ranks
    cfg = make_config(layout={"learners": 1, "buffers": 1}, run={"timeout_s": TIMEOUT_S},
                      scheduler={"mode": "edp", "delivery": delivery},
                      checkpoint={"on_stop": False})
    try:
        with ExperienceDataPlane(cfg) as edp:
            role = edp.role.value
            if edp.serves:
                edp.serve()  # until every other rank is done (the delivery rank: its learner)
        got = "built"
    except Exception as err:  # any error is the finding
        role, got = "?", f"{type(err).__name__}: {err}"
    seen = COMM.allgather((role, got))
    assert all(g == "built" for _, g in seen), seen
