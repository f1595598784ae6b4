"""Actors -> buffers -> learners end to end, in every delivery mode."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import DataPlaneClosed, DataPlaneTimeout, ExperienceDataPlane, Role
from conduit_hpc.errors import ConfigError
from conduit_hpc.testing import ZeroedRows, checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
MODES = ["edp", "sync", "service"]


def config(mode: str, transport: str = "auto", **sections):
    fetch = "direct"
    if mode == "edp+owner":  # prefetch through the owners, as across a long link
        mode, fetch = "edp", "owner"
    sch = {"mode": mode, "fetch": fetch, "batch_rows": 32, "prefetch_depth": 2, "min_fill_rows": 64,
           **sections.pop("scheduler", {})}
    return make_config(layout={"learners": 1, "buffers": 1, **sections.pop("layout", {})},
                       storage={"capacity_rows": 4096, "priority_exponent": 1.0,
                                **sections.pop("storage", {})},
                       transport={"shared_memory": transport}, scheduler=sch, **sections)


def actor_ingest(edp, rows_per_batch=16, max_batches=10_000, until_stop=True):
    receipts, wseq = [], 0
    for _ in range(max_batches):
        if until_stop and edp.should_stop:
            break
        r = edp.ingest(checked_batch(edp.world_rank, wseq, rows_per_batch))
        receipts.append((r.shard_id, r.first_seq, wseq, r.rows))
        wseq += rows_per_batch
    return receipts


def ring_map(all_receipts):
    out = {}
    for writer, rs in all_receipts:
        for shard, first, wseq, n in rs:
            for i in range(n):
                out[(shard, first + i)] = (writer, wseq + i)
    return out


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", [*MODES, "edp+owner"])
@pytest.mark.parametrize("transport", ["auto", "never"])
def test_every_delivered_row_was_ingested_and_committed(mode: str, transport: str) -> None:
    cfg = config(mode, transport)
    delivered = []
    with ExperienceDataPlane(cfg) as edp:
        receipts = []
        if edp.role is Role.ACTOR:
            receipts = actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            for _ in range(25):
                b = edp.next_batch()
                cols = {k: v.numpy() for k, v in b.data.items()}
                assert row_consistent(cols).all(), "a torn row was delivered"
                assert b.staleness <= cfg.scheduler.prefetch_depth
                assert b.weights.shape == (32,) and (b.weights > 0).all()
                assert (b.weights <= 1.0 + 1e-6).all()
                delivered.append((b.indices.copy(), cols["writer"].copy(),
                                  cols["wseq"].copy()))
        else:
            edp.serve()
        edp.done()
        all_receipts = edp.roles.world.allgather((edp.world_rank, receipts))
        summary = edp.summary()
    rmap = ring_map(all_receipts)
    for idx, writer, wseq in delivered:
        for (shard, _slot, gen), w, s in zip(idx, writer, wseq, strict=True):
            # the row at (shard, seq) is exactly the row the actor's receipt says
            assert rmap[(int(shard), int(gen) - 1)] == (int(w), int(s))
    if delivered:
        assert len(delivered) == 25
    assert summary["rows_ingested"] >= 64


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", MODES)
def test_priority_updates_reach_the_right_rows_within_the_staleness_bound(mode: str) -> None:
    depth = 2 if mode == "edp" else 0
    cfg = config(mode, storage={"capacity_rows": 256},
                 scheduler={"batch_rows": 16, "prefetch_depth": 2, "min_fill_rows": 128})
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            # a fixed set of rows, then stop: nothing is overwritten afterwards
            for i in range(128 // 16 // len(edp.roles.actor_ranks) + 1):
                edp.ingest(checked_batch(edp.world_rank, 16 * i, 16))
            favoured = None
        elif edp.role is Role.LEARNER:
            b = edp.next_batch()
            keep = tuple(b.indices[0].tolist())  # keeps its mass; every other row -> 0
            probe = ZeroedRows(edp, keep, depth)
            for s in range(12):
                if s:
                    b = edp.next_batch()
                probe.step(s, b)
            if mode != "edp":  # inline modes: once zeroed, never again
                assert depth == 0
            favoured = keep
        else:
            edp.serve()
            favoured = None
        edp.done()
        favoured = next(f for f in edp.roles.world.allgather(favoured) if f is not None)
        if edp.serves:
            (shard,) = edp.owned_shards()
            _sid, slot, gen = favoured
            assert shard.index.gens[slot] == gen
            assert shard.index.priority[slot] == 5.0  # the update landed on that row
            assert shard.index.applied_updates > 0
        edp.summary()


@pytest.mark.mpi(min_size=3)
def test_late_update_for_overwritten_row_is_dropped_and_counted() -> None:
    cfg = config("sync", storage={"capacity_rows": 64},
                 scheduler={"batch_rows": 8, "min_fill_rows": 64})
    with ExperienceDataPlane(cfg) as edp:
        lapped = None
        if edp.role is Role.ACTOR:
            actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            stale = edp.next_batch().indices.copy()
            deadline = time.monotonic() + 60
            while True:  # until the ring has overwritten every stale row
                newest = int(edp.next_batch().indices[:, 2].max())
                if newest - int(stale[:, 2].max()) > 64:
                    break
                assert time.monotonic() < deadline, "the actors never lapped the ring"
            edp.update_priorities(stale, np.full(len(stale), 3.0))
            edp.next_batch()  # the update is applied before this sample is served
            lapped = len(stale)
        else:
            edp.serve()
        edp.done()
        summary = edp.summary()
        lapped = next(x for x in edp.roles.world.allgather(lapped) if x is not None)
    dropped = sum(s["dropped_updates"] for s in summary["shards"].values())
    assert dropped == lapped == 8  # every one of them, and none applied to the new rows


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", MODES)
def test_ends_cleanly_when_actors_stop_first(mode: str) -> None:
    # the actors ingest 4 batches of 16 rows each (above the fill of 32), are done and
    # leave; the learner keeps sampling what is held - every batch comes (the stream is
    # not closed: the fill was reached), made only of rows the actors ingested - and the
    # job ends on every rank
    cfg = config(mode, scheduler={"min_fill_rows": 32})
    problems: list[str] = []
    receipts: list = []
    delivered = []
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            receipts = actor_ingest(edp, max_batches=4, until_stop=False)
            edp.done()  # actors leave early
        elif edp.role is Role.LEARNER:
            n_actors = len(edp.roles.actor_ranks)
            try:
                # first until a row of every actor's last batch came: they all finished
                # (bounded in time, not in batches: on oversubscribed cores an actor may
                # not even have started while thousands of batches go by)
                finished: set[int] = set()
                end = time.monotonic() + 90
                while len(finished) < n_actors and time.monotonic() < end:
                    writer, wseq = (edp.next_batch().data[k].numpy() for k in ("writer",
                                                                                "wseq"))
                    finished.update(writer[wseq >= 48].tolist())
                if len(finished) < n_actors:
                    problems.append(f"saw the last batch of only {sorted(finished)}")
                for _ in range(40):  # ... then from what they left behind
                    b = edp.next_batch()
                    cols = {k: v.numpy() for k, v in b.data.items()}
                    if len(b) != 32 or not row_consistent(cols).all():
                        problems.append(f"a batch of {len(b)} rows, torn or short")
                    delivered.append((b.indices.copy(), cols["writer"].copy(),
                                      cols["wseq"].copy()))
            except DataPlaneClosed as err:
                problems.append(f"the learner's stream closed: {err}")
        else:
            edp.serve()
        edp.done()
        all_receipts = edp.roles.world.allgather((edp.world_rank, receipts))
        summary = edp.summary()
        actors = len(edp.roles.actor_ranks)
    rmap = ring_map(all_receipts)
    for idx, writer, wseq in delivered:
        for (shard, _slot, gen), w, q in zip(idx, writer, wseq, strict=True):
            if rmap.get((int(shard), int(gen) - 1)) != (int(w), int(q)):
                problems.append(f"row {(int(shard), int(gen) - 1)} is not what was ingested")
    if summary["rows_ingested"] != actors * 4 * 16:
        problems.append(f"{summary['rows_ingested']} rows ingested")
    held = sum(s["held"] for s in summary["shards"].values())
    if held != actors * 4 * 16:
        problems.append(f"{held} rows held at the end")
    # every rank got here (the data plane closed everywhere) and sees every rank's verdict
    verdict = COMM.allreduce([f"rank {COMM.Get_rank()}: {p}" for p in problems[:5]])
    assert verdict == []
    assert COMM.allreduce(len(delivered)) == 40


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", [*MODES, "edp+owner"])
def test_actors_that_stop_below_the_fill_close_the_stream_and_the_rank_stays_usable(
        mode: str) -> None:
    # e.g. a stop request before the buffer filled: the learner's next_batch() raises
    # DataPlaneClosed (in edp mode from the data-plane thread), and the learner can still
    # end the run with everyone (done, summary, a collective)
    cfg = config(mode, scheduler={"min_fill_rows": 4096})  # the whole capacity
    closed = ""
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            actor_ingest(edp, max_batches=2, until_stop=False)
        elif edp.role is Role.LEARNER:
            with pytest.raises(DataPlaneClosed, match="every actor finished") as info:
                edp.next_batch()
            closed = str(info.value)
            with pytest.raises(DataPlaneClosed):  # it stays closed
                edp.next_batch()
        else:
            edp.serve()
        edp.done()
        summary = edp.summary()
        anyone = edp.roles.world.allreduce(closed, op=MPI.MAX)
    actors = COMM.Get_size() - 2
    assert summary["rows_ingested"] == actors * 2 * 16
    assert f"with {actors * 2 * 16} rows held" in anyone


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", MODES)
def test_rate_limiter_holds_the_ratio_and_releases_actors_when_learner_stops(mode) -> None:
    spi, err = 2.0, 200.0
    cfg = config(mode, scheduler={"samples_per_insert": spi, "error_buffer": err,
                                  "max_insert_batch": 16, "min_fill_rows": 64,
                                  "batch_rows": 32})
    from conduit_hpc.plane.control import C_INSERTS, C_SAMPLES

    with ExperienceDataPlane(cfg) as edp:
        lim = edp.limiter
        if edp.role is Role.ACTOR:
            actor_ingest(edp)  # until the learner stops: limiter waits must be released
        elif edp.role is Role.LEARNER:
            for _ in range(30):
                edp.next_batch()
                # (read where this rank's MPI calls are made: the data-plane thread)
                inserts, samples = edp.learner.run_on_thread(
                    lambda: (edp.control.read(C_INSERTS), edp.control.read(C_SAMPLES)),
                    "counters")
                # the learner never samples ahead of what was inserted
                assert inserts * spi - samples >= lim.min_diff
        else:
            edp.serve()
        edp.done()
        summary = edp.summary()
        counts = edp.control.read(C_INSERTS), edp.control.read(C_SAMPLES)
        counts = edp.roles.world.bcast(counts if edp.serves else None,
                                       root=edp.roles.buffer_ranks[0])
    inserts, samples = counts
    assert inserts == summary["rows_ingested"]
    assert samples >= 30 * 32
    # actors were held back: once the learner stopped, each actor could add at most
    # the one batch it was waiting with
    slack = spi * 16 * len(summary["actors"])
    assert inserts * spi - samples <= lim.max_diff + slack


@pytest.mark.mpi(min_size=5)
def test_two_learners_each_get_their_own_batches() -> None:
    cfg = config("edp", layout={"learners": 2})
    with ExperienceDataPlane(cfg) as edp:
        got = 0
        if edp.role is Role.ACTOR:
            actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            for _ in range(10):
                b = edp.next_batch()
                got += len(b)
                edp.update_priorities(b.indices, np.ones(len(b)))
        else:
            edp.serve()
        edp.done()
        counts = edp.roles.world.allgather((edp.role.value, got))
        edp.summary()
    assert [c for r, c in counts if r == "learner"] == [320, 320]


@pytest.mark.mpi(min_size=3)
def test_sequence_windows_stay_inside_one_actors_episode() -> None:
    spec = {"actor": {"dtype": "int32"}, "t": {"dtype": "int64"}, "done": {"dtype": "bool"}}
    cfg = make_config(spec=spec, layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 2048},
                      scheduler={"mode": "edp", "sampler": "sequence", "sequence_length": 4,
                                 "batch_rows": 16, "min_fill_rows": 64,
                                 "episode_field": "done", "stream_field": "actor"})
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            rng = np.random.default_rng(edp.world_rank)
            t = 0
            while not edp.should_stop:
                n = int(rng.integers(2, 9))  # an episode of n steps, ingested in one call
                edp.ingest({"actor": np.full(n, edp.world_rank, np.int32),
                            "t": np.arange(t, t + n), "done": np.arange(n) == n - 1})
                t += n
        elif edp.role is Role.LEARNER:
            for _ in range(20):
                b = edp.next_batch()
                a, t, done = (b.data[k].numpy() for k in ("actor", "t", "done"))
                assert a.shape == (16, 4)
                assert (a == a[:, :1]).all(), "window mixes actors"
                assert (np.diff(t, axis=1) == 1).all(), "window is not consecutive"
                assert not done[:, :-1].any(), "window crosses an episode end"
        else:
            edp.serve()
        edp.done()
        edp.summary()


@pytest.mark.mpi(min_size=3)
def test_a_sequence_window_longer_than_a_shard_is_refused_on_every_rank() -> None:
    """A window never spans two shards: with every shard smaller than it, the learner
    waited out its timeout, told that every row had priority 0. Now every rank refuses
    the plan, naming the field, the window and the shard."""
    spec = {"actor": {"dtype": "int32"}, "done": {"dtype": "bool"}}
    cfg = make_config(spec=spec, layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 100, "shards_per_buffer": 2},
                      scheduler={"mode": "sync", "sampler": "sequence", "sequence_length": 51,
                                 "batch_rows": 4, "min_fill_rows": 8,
                                 "episode_field": "done", "stream_field": "actor"})
    with pytest.raises(ConfigError, match=r"scheduler.sequence_length = 51 \(a window of 51 "
                       r"rows with burn_in 0\) does not fit in shard 0 of 50 rows"):
        ExperienceDataPlane(cfg)


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(COMM.size != 3, reason="one rank count (make test's time)")
def test_a_sequence_window_of_half_a_shard_is_delivered_while_writers_write() -> None:
    """A window of as many rows as half the shard (the most the plan lets through: the
    owner hides up to the other half ahead of the writers) is delivered whole while an
    actor keeps writing. A window as long as the shard (4 of 4 rows) was never whole
    while writers wrote, and the learner waited out its timeout (it said why); that
    config, and any window past half the shard, is now refused with the plan on every
    rank (tests/unit/test_planner.py), and so is a window of 9 rows of 16 here."""
    cap, window = 16, 8
    spec = {"writer": {"dtype": "int32"}, "wseq": {"dtype": "int64"},
            "done": {"dtype": "bool"}}

    def cfg(length: int):
        return make_config(spec=spec, layout={"learners": 1, "buffers": 1},
                           storage={"capacity_rows": cap}, run={"timeout_s": 10.0},
                           scheduler={"mode": "sync", "sampler": "sequence",
                                      "sequence_length": length, "batch_rows": 2,
                                      "min_fill_rows": cap, "episode_field": "done",
                                      "stream_field": "writer"})
    with pytest.raises(ConfigError, match=r"scheduler.sequence_length = 9 \(a window of 9 "
                       r"rows with burn_in 0\) is never sure to be whole in shard 0 of 16 "
                       r"rows while writers write it .* use a window of at most 8 rows"):
        ExperienceDataPlane(cfg(window + 1))
    got: list[object] = []
    with ExperienceDataPlane(cfg(window)) as edp:
        if edp.role is Role.ACTOR:
            w = 0
            while not edp.should_stop:
                edp.ingest({"writer": np.full(2, edp.world_rank, np.int32),
                            "wseq": np.arange(w, w + 2), "done": np.zeros(2, bool)})
                w += 2
        elif edp.role is Role.LEARNER:
            for _ in range(20):
                try:
                    cols = {k: v.numpy() for k, v in edp.next_batch().data.items()}
                except DataPlaneTimeout as err:
                    got.append(f"DataPlaneTimeout: {err}")
                    break
                whole = (np.diff(cols["wseq"], axis=1) == 1).all() and (
                    cols["writer"] == cols["writer"][:, :1]).all()
                got.append(bool(whole) and cols["wseq"].shape == (2, window))
        else:
            edp.serve()
        edp.done()
        every = edp.roles.world.allgather(got)
    learner = every[edp.roles.learner_ranks[0]]
    assert learner == [True] * 20, learner


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["sync", "edp", "edp+owner", "service"])
def test_a_transform_that_raises_reaches_the_learner_which_may_end_cleanly(mode: str) -> None:
    """A learner's transform raising is the learner's error, in every inline mode: its
    ``next_batch`` raises it (from the data-plane thread in ``edp``), it stays raised at
    the next call, and a learner that takes it and calls ``done`` ends the job cleanly
    (``edp`` re-raised it from ``done``, so the rank aborted the whole job)."""
    seen = [0]

    def transform(batch):
        seen[0] += 1
        if seen[0] > 3:
            raise ValueError(f"my transform refused batch {seen[0]}")
        return batch

    cfg = config(mode, run={"timeout_s": 30.0}, checkpoint={"on_stop": False})
    got = None
    with ExperienceDataPlane(cfg, transform=transform) as edp:
        if edp.role is Role.ACTOR:
            actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            with pytest.raises(ValueError, match="my transform refused batch 4") as info:
                for _ in range(50):
                    b = edp.next_batch()
                    edp.update_priorities(b.indices, np.ones(len(b.indices)))
            with pytest.raises(ValueError, match="my transform refused") as again:
                edp.next_batch()  # the experience path does not come back by itself
            got = str(info.value)
            if mode.startswith("edp"):  # the thread's error again, saying it is not new
                assert "[raised again: the data-plane thread stopped" in str(again.value)
        else:
            edp.serve()
        edp.done()
        results = COMM.allgather((edp.role.value, got))
    assert [g for r, g in results if r == "learner"] == ["my transform refused batch 4"]


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(COMM.size != 3, reason="one rank count (make test's time): a rule of the"
                    " timeout's message, waited out (3 s) at each count")
def test_a_wait_on_rows_that_all_have_priority_zero_says_so_when_it_times_out() -> None:
    # rows held, the fill reached, but every priority 0: nothing can be drawn, and the
    # timeout blamed only the rate limiter (held=64 >= min_size_to_sample=64; a hostile
    # test, stop 35); now it names the mass
    cfg = config("sync", run={"timeout_s": 3.0}, scheduler={"sampler": "prioritized"})
    said = ""
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            edp.ingest(checked_batch(edp.world_rank, 0, 64), priorities=np.zeros(64))
            while not edp.should_stop:
                time.sleep(0.01)
        elif edp.role is Role.LEARNER:
            with pytest.raises(DataPlaneTimeout) as info:
                edp.next_batch()
            said = str(info.value)
        else:
            edp.serve()
        edp.done()
        said = edp.roles.world.allreduce(said, op=MPI.MAX)
    assert "total priority mass 0 (every row held has priority 0: none can be drawn)" in said
