"""``scheduler.delivery = "process"``: a delivery rank per learner samples, gathers and
transforms, and hands batches to its learner through the node-shared staging ring.

Layouts: world rank 0 the learner, 1 its delivery rank, 2 the buffer, the rest actors
(4 ranks and more); at 3 ranks only the refusal of a world too small runs."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.errors import ConduitError, ConfigError, RemoteFailure, WorldTooSmall
from conduit_hpc.plane.delivery_rank import ProcessMode
from conduit_hpc.testing import ZeroedRows, checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD


def config(fetch: str = "direct", **sections):
    sch = {"mode": "edp", "delivery": "process", "fetch": fetch, "batch_rows": 32,
           "prefetch_depth": 2, "min_fill_rows": 64, **sections.pop("scheduler", {})}
    return make_config(layout={"learners": 1, "buffers": 1, **sections.pop("layout", {})},
                       storage={"capacity_rows": 4096, "priority_exponent": 1.0,
                                **sections.pop("storage", {})},
                       checkpoint={"on_stop": False}, scheduler=sch, **sections)


def actor_ingest(edp, rows=16):
    receipts, wseq = [], 0
    while not edp.should_stop:
        r = edp.ingest(checked_batch(edp.world_rank, wseq, rows))
        receipts.append((r.shard_id, r.first_seq, wseq, r.rows))
        wseq += rows
    return receipts


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("fetch", ["direct", "owner"])
def test_batches_arrive_in_order_with_intact_rows(fetch: str) -> None:
    cfg = config(fetch)
    delivered, receipts = [], []
    with ExperienceDataPlane(cfg) as edp:
        assert edp.roles.role.value == ("learner", "delivery", "buffer")[min(edp.world_rank, 2)] \
            or edp.roles.role is Role.ACTOR
        assert edp.serves is (edp.role in (Role.BUFFER, Role.DELIVERY))
        if edp.role is Role.ACTOR:
            receipts = actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            # the learner reads the staging ring: no experience path of its own
            assert isinstance(edp.learner.mode, ProcessMode)
            assert not hasattr(edp.learner.mode, "d")
            for s in range(40):
                b = edp.next_batch()
                assert b.superstep == s  # in order, none skipped
                assert b.staleness <= cfg.scheduler.prefetch_depth
                cols = {k: v.numpy() for k, v in b.data.items()}
                assert row_consistent(cols).all(), "a torn row was delivered"
                assert b.weights.shape == (32,) and (b.weights > 0).all()
                delivered.append((b.indices.copy(), cols["writer"].copy(), cols["wseq"].copy()))
                edp.update_priorities(b.indices, np.full(len(b), 1.0 + s % 3))
        else:
            # the buffer, and the delivery rank: each says what it is, and both serve
            assert edp.serves and edp.role is (Role.DELIVERY if edp.world_rank == 1
                                               else Role.BUFFER)
            edp.serve()
        edp.done()
        rmap = {}
        for writer, rs in edp.roles.world.allgather((edp.world_rank, receipts)):
            for shard, first, wseq, n in rs:
                for i in range(n):
                    rmap[(shard, first + i)] = (writer, wseq + i)
        summary = edp.summary()
    for idx, writer, wseq in delivered:
        for (shard, _slot, gen), w, q in zip(idx, writer, wseq, strict=True):
            assert rmap[(int(shard), int(gen) - 1)] == (int(w), int(q))
    assert len(delivered) == (40 if COMM.rank == 0 else 0)
    assert summary["learners"][0]["supersteps"] == 40
    # the delivery rank's counters reach the learner's summary
    assert summary["learners"][0]["priority_rows_direct"] + \
        summary["learners"][0]["priority_rows_messaged"] == 40 * 32
    # every update row the learner queued was carried by the delivery rank into the
    # shard's index (written there directly: the shard is in the node's shared memory)
    # and applied, or (rows overwritten since they were drawn: unthrottled actors can
    # turn a ring over within a superstep) dropped as stale - each exactly once
    assert sum(s["applied_updates"] + s["dropped_updates"]
               for s in summary["shards"].values()) == 40 * 32


@pytest.mark.mpi(min_size=4)
def test_priority_updates_take_effect_within_the_staleness_bound() -> None:
    depth = 2
    cfg = config(storage={"capacity_rows": 256},
                 scheduler={"batch_rows": 16, "prefetch_depth": depth, "min_fill_rows": 128})
    with ExperienceDataPlane(cfg) as edp:
        favoured = None
        if edp.role is Role.ACTOR:
            # a fixed set of rows, then stop: nothing is overwritten afterwards
            for i in range(128 // 16 // len(edp.roles.actor_ranks) + 1):
                edp.ingest(checked_batch(edp.world_rank, 16 * i, 16))
        elif edp.role is Role.LEARNER:
            b = edp.next_batch()
            keep = tuple(b.indices[0].tolist())  # keeps mass; every other row -> 0
            probe = ZeroedRows(edp, keep, depth)
            for s in range(10):
                if s:
                    b = edp.next_batch()
                probe.step(s, b)
            # one row at a huge priority: once the prefetched batches are through,
            # it is (nearly) every row drawn
            edp.update_priorities(np.array([keep]), [1e9])
            for _ in range(depth + 1):
                edp.next_batch()
            for _ in range(3):
                b = edp.next_batch()
                hits = sum(tuple(r) == keep for r in b.indices.tolist())
                assert hits >= 0.9 * len(b), f"the favoured row was {hits}/{len(b)} draws"
            favoured = keep
        else:
            edp.serve()
        edp.done()
        favoured = next(f for f in edp.roles.world.allgather(favoured) if f is not None)
        if edp.roles.role is Role.BUFFER:
            (shard,) = edp.owned_shards()
            _sid, slot, gen = favoured
            assert shard.index.gens[slot] == gen
            assert shard.index.priority[slot] == 1e9  # the last update landed on that row
        edp.summary()


@pytest.mark.mpi(min_size=3)
def test_bad_combinations_are_refused_on_every_rank_together() -> None:
    # a world one rank short once the delivery rank is counted
    cfg = config(layout={"actors": COMM.size - 2})
    try:
        ExperienceDataPlane(cfg)
        got = "none"
    except WorldTooSmall as err:
        got = "delivery" in str(err) and str(COMM.size + 1) in str(err)
    assert COMM.allgather(got) == [True] * COMM.size
    # the inline modes have no experience path to move: refused when loaded, everywhere
    try:
        config(scheduler={"mode": "sync"})
        got = "none"
    except ConfigError as err:
        got = err.key == "scheduler.delivery"
    assert COMM.allgather(got) == [True] * COMM.size


def _only_up_to_4_ranks() -> None:
    if COMM.size > 4:  # the same paths as at 4 ranks; more actors change nothing here
        pytest.skip("runs at 4 ranks")


def _failing_transform(after: int):
    seen = [0]

    def transform(batch):
        seen[0] += 1
        if seen[0] > after:
            raise RuntimeError(f"transform broke at batch {seen[0]}")
        return batch

    return transform


class _Leave(Exception):
    """Leaves a with-block of the data plane as a failing job would."""


def _ingest_until_stopped(edp) -> str | None:
    """An actor's ingest until the run stops; a failing learner marks itself, so the
    actor stops, or one of its waits raises: that error's text (None: it stopped)."""
    try:
        actor_ingest(edp)
    except RemoteFailure as err:
        return str(err)
    return None


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("learner_ends", ["cleanly", "failing"])
def test_a_failed_delivery_rank_ends_its_learner_with_its_error(learner_ends: str) -> None:
    """The learner gets the delivery rank's error at its next call. A learner that
    takes it and ends (``done``) ends the job cleanly, as it may in sync and thread
    delivery (the delivery rank's ``serve`` returns); one that fails makes the delivery
    rank raise its own error: every rank fails together."""
    _only_up_to_4_ranks()
    cfg = config(run={"timeout_s": 30.0})
    got, role = None, ""
    try:
        with ExperienceDataPlane(cfg, transform=_failing_transform(5)) as edp:
            role = edp.roles.role.value
            if edp.role is Role.ACTOR:
                got = _ingest_until_stopped(edp)
            elif edp.role is Role.LEARNER:
                with pytest.raises(RemoteFailure) as info:
                    for _ in range(50):
                        edp.next_batch()
                got = str(info.value)
                if learner_ends == "failing":  # what leaving the with-block on it does
                    edp.__exit__(RemoteFailure, info.value, None)
            else:
                try:
                    edp.serve()
                    got = "returned"
                except RuntimeError as err:  # the delivery rank: its own error
                    got = f"raised {err}"
                except RemoteFailure as err:  # the buffer, once the learner failed
                    got = f"stopped: {err}"
            edp.done()
            if learner_ends == "failing":  # every rank leaves as a failing job's would:
                raise _Leave  # no close() (a collective the failed rank never joins)
    except _Leave:
        pass
    results = COMM.allgather((role, got))
    by_role = dict(results[:2])
    assert "delivery rank (world rank 1)" in by_role["learner"]
    assert "transform broke at batch 6" in by_role["learner"]
    assert by_role["delivery"] == ("returned" if learner_ends == "cleanly"
                                   else "raised transform broke at batch 6")
    # actors and buffers stopped by the failure say who left first: the learner leaves
    # on the RemoteFailure (not marked: a peer's failure), so the first marked is the
    # delivery rank or the learner, whichever of their _Leave comes first
    named = [f"world rank {r} left" for r, (who, _) in enumerate(results)
             if who in ("learner", "delivery")]
    for who, what in results:
        assert who not in ("actor", "buffer") or what in (None, "returned") or (
            learner_ends == "failing" and any(n in what for n in named)), what


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("updates", [0, 60])
def test_a_failed_learner_ends_its_delivery_rank(updates: int) -> None:
    """``updates``: update-queue entries the learner queues just before it fails, so
    that its failure and its stop may both come while the delivery rank forwards them
    (it then read the stop as a clean one, and its serve() returned: 4 runs in 15)."""
    _only_up_to_4_ranks()
    cfg = config(run={"timeout_s": 30.0})
    got = None
    try:
        with ExperienceDataPlane(cfg) as edp:
            if edp.role is Role.ACTOR:
                got = _ingest_until_stopped(edp)
            elif edp.role is Role.LEARNER:
                for _ in range(3):
                    b = edp.next_batch()
                for _ in range(updates):  # 256 rows each: one queue entry
                    edp.update_priorities(np.repeat(b.indices, 8, axis=0), np.ones(256))
                # what leaving the data plane's with-block on an exception does
                edp.__exit__(RuntimeError, RuntimeError("loss is NaN"), None)
            elif edp.roles.role is Role.DELIVERY:
                with pytest.raises(RemoteFailure) as info:
                    edp.serve()
                got = str(info.value)
            else:
                try:  # the buffer raises once idle (unless every DONE came first)
                    edp.serve()
                except RemoteFailure as err:
                    got = str(err)
            edp.done()
            raise _Leave  # as a failing job's ranks would: no close()
    except _Leave:
        pass
    results = COMM.allgather(got)
    assert "the learner (world rank 0) failed: RuntimeError: loss is NaN" in results[1]
    assert all(r is None or "world rank 0 left the data plane" in r for r in results[2:])


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("slow_mark", [False, True])
def test_a_delivery_rank_failing_outside_serve_names_itself_to_its_learner(
        slow_mark: bool, monkeypatch) -> None:
    """The delivery rank raises in the job's code before serve(), caught outside the
    with-block: its learner raises RemoteFailure with that error at once (it waited out
    run.timeout_s for batch 0 and raised DataPlaneTimeout). Every other rank is told
    that the delivery rank left, also when it marks the job's control block only after
    its learner has left on its error (``slow_mark``, as a descheduled rank does: the
    learner, marked first, was named instead - 1 run in 10 under load)."""
    _only_up_to_4_ranks()
    if slow_mark and COMM.rank == 1:
        from conduit_hpc.plane.control import ControlBlock

        mark = ControlBlock.left_on_error

        def late(self, rank, exc, done):  # after its learner told it and left
            time.sleep(1.0)
            mark(self, rank, exc, done)

        monkeypatch.setattr(ControlBlock, "left_on_error", late)
    got = None
    try:
        with ExperienceDataPlane(config(run={"timeout_s": 30.0})) as edp:
            if edp.role is Role.DELIVERY:
                raise _Leave("the job's setup broke")
            if edp.role is Role.ACTOR:
                got = _ingest_until_stopped(edp)
            elif edp.role is Role.LEARNER:
                try:
                    edp.next_batch()
                except ConduitError as err:
                    got = f"{type(err).__name__}: {err}"
            else:
                try:
                    edp.serve()
                except RemoteFailure as err:
                    got = str(err)
            edp.done()
            raise _Leave
    except _Leave:
        pass
    results = COMM.allgather(got)
    assert results[0] == ("RemoteFailure: the delivery rank (world rank 1) of this learner "
                          "failed: _Leave: the job's setup broke"), results[0]
    assert all(r is None or "world rank 1 left the data plane" in r for r in results[2:])


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("layout", [{"learners": 1, "buffers": 1, "actors": 0},
                                    {"learners": 1, "buffers": 1, "actors": 0,
                                     "emulate_nodes": 2},
                                    {"learners": 2, "buffers": 1, "actors": 0}])
def test_split_roles_gives_what_the_layout_rule_says(layout) -> None:
    from conduit_hpc.config import LayoutConfig
    from conduit_hpc.config.layout_rule import assign_roles
    from conduit_hpc.plane.roles import split_roles

    lay = LayoutConfig(**layout)
    if COMM.size < lay.fixed_ranks + lay.learners:
        pytest.skip("too few ranks for this layout")
    roles = split_roles(COMM, lay, "process")
    try:
        want, err = assign_roles(lay, roles.node_of, "process")
        assert err is None and want is not None
        assert roles.role.value == want.roles[COMM.rank]
        assert roles.delivery_ranks == want.ranks("delivery")
        assert roles.delivery_of == want.delivery_of
        assert roles.sampler_ranks == roles.delivery_ranks
        for lo, d in roles.delivery_of.items():
            assert roles.learner_of(d) == lo
    finally:
        roles.close()


@pytest.mark.mpi(min_size=4)
def test_a_job_written_for_buffers_ends_with_a_delivery_rank_that_only_serves() -> None:
    """``edp.serves`` promises that a job dispatching ``elif edp.serves: edp.serve()``
    runs unchanged with a delivery rank. A buffer needs no ``done()`` after ``serve()``;
    a delivery rank did: its serve() returned when its learner stopped, but the buffers
    were never told, so a ``summary()`` right after it waited out ``run.timeout_s`` on
    every rank and failed ("world rank 2 had not arrived": the buffer, still serving -
    the stress sweep, 3 of 3 runs). Now serve() on a delivery rank ends with its done."""
    cfg = config(run={"timeout_s": 5.0})
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            actor_ingest(edp)
            edp.done()
        elif edp.role is Role.LEARNER:
            for _ in range(5):
                edp.next_batch()
            edp.done()
        elif edp.serves:
            edp.serve()  # and nothing else, as on a buffer
        summary = edp.summary()
    assert summary["learners"][0]["supersteps"] == 5
