"""``next_batch`` called from two threads of one learner at once: the calls take turns
and each batch goes to one caller, in every mode.

Layouts: world rank 0 the learner, 1 the buffer, the rest actors (3 ranks and more);
with ``delivery = "process"`` rank 1 is the learner's delivery rank and 2 the buffer
(4 ranks and more)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import play
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["sync", "edp", "service", "process"])
def test_next_batch_from_two_threads_takes_turns(mode: str) -> None:
    """Two threads calling ``next_batch`` at once both took the same superstep: in
    ``edp`` one waited out ``run.timeout_s`` for a batch the other had taken, in
    ``service`` both did (a reply meant for one went to the other), and a delivery
    rank's batch went to both threads. Now the calls take turns: 20 calls, 20
    different supersteps, no error, well within the timeout."""
    if mode == "process" and COMM.size < 4:
        pytest.skip("a delivery rank needs 4 ranks")
    sch = {"mode": "edp" if mode == "process" else mode, "batch_rows": 32,
           "prefetch_depth": 2, "min_fill_rows": 64}
    if mode == "process":
        sch["delivery"] = "process"
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 1024},
                      run={"timeout_s": 10.0}, checkpoint={"on_stop": False}, scheduler=sch)
    supersteps: list[int] = []
    errors: list[str] = []

    def learn(edp) -> None:
        def work() -> None:
            try:
                for _ in range(10):
                    b = edp.next_batch()
                    supersteps.append(b.superstep)
                    edp.update_priorities(b.indices, np.ones(len(b)))
            except Exception as err:  # reported below, on every rank
                errors.append(repr(err)[:200])

        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)

    with ExperienceDataPlane(cfg) as edp:
        play(edp, learn, checked=16)
        results = COMM.allgather((edp.role.value, sorted(supersteps), errors))
    learner = [(s, e) for r, s, e in results if r == "learner"]
    assert learner == [(list(range(20)), [])], learner


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["edp", "sync"])
def test_a_flood_of_updates_from_another_thread_does_not_starve_next_batch(mode: str) -> None:
    """One thread sends priority updates as fast as it can while another takes batches.
    In ``edp`` the data-plane thread ran its prefetch step only when no call was queued,
    so the flood starved it: ``next_batch`` waited out ``run.timeout_s`` (10 s) for a
    batch it never started. The thread now takes a prefetch step between queued calls:
    20 batches come while the flood runs."""
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 1024},
                      run={"timeout_s": 10.0}, checkpoint={"on_stop": False},
                      scheduler={"mode": mode, "batch_rows": 32, "prefetch_depth": 2,
                                 "min_fill_rows": 64, "sampler": "prioritized"})
    errors: list[str] = []

    def learn(edp) -> int:
        got = 0
        first = edp.next_batch()
        stop = threading.Event()

        def flood() -> None:
            try:
                while not stop.is_set():
                    edp.update_priorities(first.indices, np.ones(len(first)))
            except Exception as err:  # reported below, on every rank
                errors.append(f"flood: {err!r:.200}")

        t = threading.Thread(target=flood)
        t.start()
        try:
            for _ in range(20):
                edp.next_batch()
                got += 1
        except Exception as err:
            errors.append(f"next_batch {got + 2}: {err!r:.200}")
        finally:
            stop.set()
            t.join(timeout=60)
        return got

    with ExperienceDataPlane(cfg) as edp:
        got = play(edp, learn, checked=16)
    problems = errors + ([f"{got} of 20 batches"] if edp.role is Role.LEARNER and got != 20
                         else [])
    assert COMM.allreduce(problems) == []
