"""The public API as a hostile user calls it, where earlier sweeps left gaps (stop 48):
a delivery rank's own exception, calls after close on a delivery rank, a collective
called by some ranks only.

Layout: world rank 0 the learner, 1 its delivery rank (``delivery = "process"``), 2 the
buffer, the rest actors (4 ranks and more); without a delivery rank, 1 is the buffer.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL_SPEC as SPEC
from conftest import play, verdict
from conftest import small_rows as rows
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.errors import CollectiveFailed, RemoteFailure, UsedAfterClose
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD


def config(timeout_s: float = 6.0, delivery: str = "process"):
    return make_config(spec=SPEC, run={"timeout_s": timeout_s},
                       layout={"learners": 1, "buffers": 1},
                       storage={"capacity_rows": 64}, checkpoint={"on_stop": False},
                       scheduler={"batch_rows": 8, "min_fill_rows": 16, "mode": "edp",
                                  "delivery": delivery})


class _OwnBug(Exception):
    """The job's own error, raised on the delivery rank inside its with-block."""


@pytest.mark.mpi(min_size=4)
def test_a_delivery_rank_leaving_on_its_own_error_fails_its_learner_naming_it() -> None:
    """The delivery rank raised in its ``with`` block before ``serve()``: every other
    rank stopped with RemoteFailure, but its learner waited out ``run.timeout_s`` for
    batch 0 and raised DataPlaneTimeout ("waited 6.0 s for batch 0 from the delivery
    rank"), as if the rank were slow. Now the learner raises RemoteFailure naming the
    delivery rank and its error, as a delivery rank's failure inside serve() does."""
    seen = "nothing"
    try:
        with ExperienceDataPlane(config()) as edp:
            if edp.role is Role.DELIVERY:
                raise _OwnBug("own bug on the delivery rank")
            play(edp, ExperienceDataPlane.next_batch)
    except _OwnBug:
        seen = "left"
    except Exception as err:  # what each rank saw is checked below, on every rank
        seen = f"{type(err).__name__}: {err}"
    ok = {0: seen.startswith("RemoteFailure: the delivery rank (world rank 1)")
          and "_OwnBug: own bug on the delivery rank" in seen,
          1: seen == "left"}.get(COMM.rank, seen.startswith("RemoteFailure") and
                                 "world rank 1 left" in seen)
    assert verdict(ok), (COMM.rank, seen)


@pytest.mark.mpi(min_size=4)
def test_serve_after_close_on_a_delivery_rank_is_refused_naming_the_rank() -> None:
    """serve() after close() returned silently on a delivery rank (a buffer raised
    UsedAfterClose): the plane's check came after the delivery rank's branch. And a
    with-block entered again after close() is refused."""
    with ExperienceDataPlane(config(10.0)) as edp:
        play(edp, lambda e: [e.next_batch() for _ in range(3)])
    got = "nothing"
    try:
        edp.serve()
    except UsedAfterClose as err:
        got = str(err)
    want = f"serve() called after close() on world rank {COMM.rank}"
    ok = got == want if edp.serves else got.startswith("serve() called after close()")
    # a with-block entered again after close() was entered silently (every call in it
    # then raised): now refused at once, on every role
    with pytest.raises(UsedAfterClose, match=rf"entering the with-block called after "
                                             rf"close\(\) on world rank {COMM.rank}"):
        edp.__enter__()
    assert verdict(ok), (COMM.rank, edp.role, got)


@pytest.mark.mpi(min_size=3)
def test_a_collective_called_while_a_buffer_serves_ends_every_rank() -> None:
    """summary() is collective; the learner called it while the buffer was still in
    serve(). The learner and the actors ended in CollectiveFailed (summary, close) and
    left their with-blocks, but a timed-out collective was not marked in the control
    block, and the buffer's serve() - which waits on no deadline - waited for the
    learner's "done" for ever. Now every rank ends: the buffer with RemoteFailure
    naming the rank that timed out first."""
    seen = "nothing"
    try:
        with ExperienceDataPlane(config(3.0, "thread")) as edp:
            if edp.role is Role.LEARNER:
                edp.summary()  # the buffer never comes: it serves until all are done
            elif edp.serves:
                edp.serve()
            edp.done()
    except CollectiveFailed as err:
        seen = f"CollectiveFailed: {err}"
    except RemoteFailure as err:
        seen = f"RemoteFailure: {err}"
    want = {0: "CollectiveFailed: waited 3.0 s for every rank of " f"{COMM.size} to reach "
            "summary()", 1: "RemoteFailure: world rank "}.get(COMM.rank, "")
    assert verdict(seen.startswith(want) and seen != "nothing"), (COMM.rank, seen)


@pytest.mark.mpi(min_size=3)
def test_save_checkpoint_refuses_ranks_that_disagree_on_root_keep_or_extra_state(
        tmp_path_factory) -> None:
    """save_checkpoint() is collective, and the leader alone used its own root and keep:
    a rank that gave root/0 got a SaveResult under root/1 (silently), and extra_state
    given on every rank ended in "cannot write checkpoint file learner.h5: [Errno 11]
    Resource temporarily unavailable". Now both are refused on every rank with a
    CheckpointError naming the ranks and their values; nothing is written, and the next
    call that agrees saves."""
    from conduit_hpc.errors import CheckpointError
    from conduit_hpc.features.checkpointing import save_checkpoint

    root = COMM.bcast(str(tmp_path_factory.mktemp("ckpt")) if COMM.rank == 0 else None)
    got: list[str] = []
    with ExperienceDataPlane(config(10.0, "thread")) as edp:
        if edp.role is Role.ACTOR:
            edp.ingest(rows())
        for kwargs in ({"root": f"{root}/{COMM.rank}"}, {"keep": COMM.rank},
                       {"extra_state": {"w": np.ones(2)}}):
            try:
                save_checkpoint(edp, kwargs.pop("root", root), **kwargs)  # type: ignore[arg-type]
                got.append("saved")
            except CheckpointError as err:
                got.append(str(err))
        got.append(str(save_checkpoint(edp, root).path.parent))
        if edp.serves:
            edp.serve()
        edp.done()
    ranks = ", ".join(f"rank {r}: '{root}/{r}'" for r in range(COMM.size))
    keeps = ", ".join(f"rank {r}: '{r}'" for r in range(COMM.size))
    want = [f"save_checkpoint(): every rank must give the same root, got {ranks}",
            f"save_checkpoint(): every rank must give the same keep, got {keeps}",
            f"save_checkpoint(): extra_state given on world ranks {list(range(COMM.size))}; "
            "give it on one rank only (the learner's model)", root]
    assert verdict(got == want), (COMM.rank, got)


@pytest.mark.mpi(min_size=2)
def test_ingest_stats_is_a_snapshot_the_caller_cannot_change() -> None:
    """``edp.ingest_stats`` returned the actor's live counters: a snapshot kept for later
    changed under its holder, and writing to it (``stats.rows = -1``) changed the counts
    the actor reports in its summary. It is a copy now."""
    cfg = make_config(spec=SPEC, layout={"learners": 0, "buffers": 1},
                      storage={"capacity_rows": 64}, checkpoint={"on_stop": False})
    ok = True
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            edp.ingest(rows(8))
            first = edp.ingest_stats
            first.rows = -1
            edp.ingest(rows(8))
            now = edp.ingest_stats
            ok = first.rows == -1 and first.batches == 1 and (now.rows, now.batches) == (16, 2)
            edp.done()
        else:
            edp.serve()
    assert verdict(ok)
