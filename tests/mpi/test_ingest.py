"""Concurrent ingest from several actors into shared shards, under every transport."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role, SpecError
from conduit_hpc.errors import DataPlaneClosed
from conduit_hpc.testing import checked_batch, make_config, row_consistent
from conduit_hpc.wait import Deadline

COMM = MPI.COMM_WORLD


def merged(sections: dict, **more: dict) -> dict:
    out = {k: dict(v) for k, v in sections.items()}
    for k, v in more.items():
        out.setdefault(k, {}).update(v)
    return out


def ingest_ragged(edp: ExperienceDataPlane, batches: int, seed: int) -> list[tuple]:
    """Ingest batches of 1..17 rows; return (shard, first_seq, first_wseq, rows) each."""
    rng = np.random.default_rng(seed)
    receipts, wseq = [], 0
    for _ in range(batches):
        n = int(rng.integers(1, 18))
        r = edp.ingest(checked_batch(edp.world_rank, wseq, n))
        assert r.rows == n
        receipts.append((r.shard_id, r.first_seq, wseq, n))
        wseq += n
    return receipts


def held_rows(edp: ExperienceDataPlane) -> dict[int, tuple]:
    """On buffers: shard -> (seqs, columns, committed); elsewhere {}."""
    out = {}
    for s in edp.owned_shards():
        seqs, cols, _ = s.ring.read_committed()
        out[s.shard_id] = (seqs, cols, s.committed)
    return out


def run_job(cfg, batches: int):
    with ExperienceDataPlane(cfg) as edp:
        receipts = []
        if edp.role is Role.ACTOR:
            receipts = ingest_ragged(edp, batches, seed=edp.world_rank)
            edp.done()
        elif edp.serves:
            edp.serve()
        else:
            edp.done()
        held = held_rows(edp)
        all_receipts = edp.roles.world.allgather((edp.world_rank, receipts))
        all_held = {}
        for h in edp.roles.world.allgather(held):
            all_held.update(h)
        nshards = len(edp.placement.shards)
        caps = [s.capacity_rows for s in edp.placement.shards]
    return dict(all_receipts), all_held, nshards, caps


def expected_by_shard(receipts: dict) -> dict[int, dict[int, tuple[int, int]]]:
    """shard -> ring seq -> (writer, wseq), from the actors' receipts."""
    out: dict[int, dict[int, tuple[int, int]]] = {}
    for writer, rs in receipts.items():
        for shard, first, wseq, n in rs:
            for i in range(n):
                assert (first + i) not in out.setdefault(shard, {}), "seq handed out twice"
                out[shard][first + i] = (writer, wseq + i)
    return out


def check_exact(receipts, held, caps) -> None:
    expected = expected_by_shard(receipts)
    total = 0
    for shard, (seqs, cols, committed) in held.items():
        exp = expected.get(shard, {})
        assert committed == len(exp), "every reserved row was committed"
        # exactly the newest `capacity` rows, each exactly once, none torn
        want = sorted(s for s in exp if s >= committed - caps[shard])
        assert seqs.tolist() == want
        assert row_consistent(cols).all(), "a torn row"
        got = list(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True))
        assert got == [exp[s] for s in want]
        assert len(set(got)) == len(got), "a duplicated row"
        total += len(exp)
    assert total == sum(n for rs in receipts.values() for *_, n in rs)


@pytest.mark.mpi(min_size=3)
def test_concurrent_ingest_one_shard_every_row_once(transport_sections) -> None:
    cfg = make_config(**merged(transport_sections, layout={"learners": 0, "buffers": 1},
                               storage={"capacity_rows": 100_000}))
    receipts, held, nshards, caps = run_job(cfg, batches=60)
    assert nshards == 1
    check_exact(receipts, held, caps)
    (seqs, _, committed), = held.values()
    assert len(seqs) == committed  # nothing evicted: every row is found


@pytest.mark.mpi(min_size=4)
def test_concurrent_ingest_several_shards(transport_sections) -> None:
    cfg = make_config(**merged(transport_sections,
                               layout={"learners": 0, "buffers": 2},
                               storage={"capacity_rows": 40_000, "shards_per_buffer": 2}))
    receipts, held, nshards, caps = run_job(cfg, batches=40)
    assert nshards == 4 and set(held) == {0, 1, 2, 3}
    check_exact(receipts, held, caps)


@pytest.mark.mpi(min_size=3)
def test_overflow_keeps_exactly_the_newest_capacity_rows(transport_sections) -> None:
    # 37 slots, ~9 rows a batch from every actor: the ring laps many times while
    # writers race, so lapped-writer waits and eviction are both exercised
    cfg = make_config(**merged(transport_sections, layout={"learners": 0, "buffers": 1},
                               storage={"capacity_rows": 37}))
    receipts, held, _, caps = run_job(cfg, batches=150)
    check_exact(receipts, held, caps)
    (seqs, _, committed), = held.values()
    assert len(seqs) == 37 and committed > 37 * 10


@pytest.mark.mpi(min_size=3)
def test_bad_batch_leaves_shard_exactly_as_it_was() -> None:
    cfg = make_config(layout={"learners": 0, "buffers": 1}, storage={"capacity_rows": 64})
    with ExperienceDataPlane(cfg) as edp:
        world = edp.roles.world
        if edp.role is Role.ACTOR:
            ingest_ragged(edp, 10, seed=edp.world_rank)
            world.Ibarrier().Wait()
        else:  # the owner's passes (commits, freeing slots) until every actor wrote
            written = world.Ibarrier()
            (shard,) = edp.owned_shards()
            deadline = Deadline(60.0, "the actors' rows")
            while not written.Test():
                deadline.check()
                shard.poll()
        world.Barrier()

        def snapshot():
            if not edp.serves:
                return None
            (s,) = edp.owned_shards()
            s.poll()
            v = s.ring.views
            return (v.header.copy(), v.stamps.copy(), v.priority.copy(),
                    {k: c.copy() for k, c in v.columns.items()}, s.index.priority.copy())

        before = snapshot()
        world.Barrier()
        if edp.role is Role.ACTOR:
            good = checked_batch(edp.world_rank, 10_000, 5)
            bad = [
                {k: v for k, v in good.items() if k != "check"},
                {**good, "extra": np.zeros(5)},
                {**good, "payload": good["payload"].astype(np.float64)},
                {**good, "payload": good["payload"][:, :5]},
                {**good, "wseq": good["wseq"][:4]},
            ]
            for b in bad:
                with pytest.raises(SpecError):
                    edp.ingest(b)
            with pytest.raises(SpecError, match="priorities"):
                edp.ingest(good, priorities=np.array([1, 2, np.nan, 4, 5.0]))
            with pytest.raises(SpecError, match="priorities"):
                edp.ingest(good, priorities=np.ones(4))
            with pytest.raises(SpecError, match="exceeds the shard capacity"):
                edp.ingest(checked_batch(edp.world_rank, 0, 65))
        world.Barrier()
        after = snapshot()
        if before is not None:
            for a, b in zip(before[:3], after[:3], strict=True):
                np.testing.assert_array_equal(a, b)
            for k in before[3]:
                np.testing.assert_array_equal(before[3][k], after[3][k])
            np.testing.assert_array_equal(before[4], after[4])
        if edp.role is Role.ACTOR:  # after done(), even a good batch is refused
            edp.done()
            with pytest.raises(DataPlaneClosed, match=r"ingest\(\) called after done\(\)"):
                edp.ingest(checked_batch(edp.world_rank, 20_000, 5))
        else:
            edp.serve()


@pytest.mark.mpi(min_size=3)
def test_initial_priorities_reach_the_index() -> None:
    cfg = make_config(layout={"learners": 0, "buffers": 1},
                      storage={"capacity_rows": 1000, "priority_exponent": 1.0})
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            r = edp.world_rank
            edp.ingest(checked_batch(r, 0, 4), priorities=np.full(4, float(r)))
            edp.ingest(checked_batch(r, 4, 2))  # no priority: the running max at commit
            edp.done()
        else:
            edp.serve()
            (s,) = edp.owned_shards()
            seqs, cols, _ = s.ring.read_committed()
            prio = s.index.priority[seqs % s.ring.capacity]
            given = cols["wseq"] < 4
            np.testing.assert_array_equal(prio[given], cols["writer"][given].astype(float))
            assert (prio[~given] >= 1.0).all()
            assert s.index.total == pytest.approx(prio.sum())
