"""A rank that both ingests and learns (``layout.learners_ingest``, what an algorithm
process such as RLlib's needs): the guarantees of ``test_ingest`` and ``test_delivery``
hold for its rows too - every row committed exactly once, intact, delivered as written,
priority updates within the staleness bound - with or without actor ranks beside it."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role, SpecError
from conduit_hpc.testing import ZeroedRows, checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
MODES = ["edp", "sync", "service", "edp+owner"]


def config(mode: str, **sections):
    fetch = "direct"
    if mode == "edp+owner":
        mode, fetch = "edp", "owner"
    sch = {"mode": mode, "fetch": fetch, "batch_rows": 16, "prefetch_depth": 2,
           "min_fill_rows": 64, **sections.pop("scheduler", {})}
    return make_config(layout={"learners": 1, "buffers": 1, "actors": 0,
                               "learners_ingest": True},
                       storage={"capacity_rows": 100_000, "priority_exponent": 1.0,
                                **sections.pop("storage", {})},
                       scheduler=sch, **sections)


def check_held_exactly_once(held: dict, receipts: dict) -> int:
    """Every receipt's rows are in their shard exactly once, intact; nothing else is."""
    expected: dict[int, dict[int, tuple[int, int]]] = {}
    for writer, rs in receipts.items():
        for shard, first, wseq, n in rs:
            for i in range(n):
                assert first + i not in expected.setdefault(shard, {}), "seq handed out twice"
                expected[shard][first + i] = (writer, wseq + i)
    total = 0
    for shard, (seqs, cols, committed) in held.items():
        exp = expected.get(shard, {})
        assert committed == len(exp), "every reserved row was committed"
        assert seqs.tolist() == sorted(exp)  # capacity is ample: nothing evicted
        assert row_consistent(cols).all(), "a torn row"
        got = list(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True))
        assert got == [exp[s] for s in sorted(exp)]
        total += len(exp)
    assert total == sum(n for rs in receipts.values() for *_, n in rs)
    return total


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
def test_a_learner_that_ingests_gets_every_row_exactly_once_and_intact(mode: str) -> None:
    cfg = config(mode)
    depth = cfg.scheduler.prefetch_depth if mode.startswith("edp") else 0
    delivered, receipts = [], []
    with ExperienceDataPlane(cfg) as edp:
        me = edp.world_rank
        assert edp.roles.learner_ranks == (0,) and 0 in edp.roles.writer_ranks
        if edp.role is Role.LEARNER:
            wseq = 0
            for step in range(40):  # collect, then learn: an RLlib training step
                r = edp.ingest(checked_batch(me, wseq, 8))
                receipts.append((r.shard_id, r.first_seq, wseq, r.rows))
                wseq += 8
                if step < 8:  # the minimum fill (64 rows) is this rank's own rows
                    continue
                b = edp.next_batch()
                cols = {k: v.numpy() for k, v in b.data.items()}
                assert row_consistent(cols).all(), "a torn row was delivered"
                assert b.staleness <= depth
                assert (b.weights > 0).all() and b.weights.isfinite().all()
                delivered.append((b.indices.copy(), cols["writer"].copy(), cols["wseq"].copy()))
                edp.update_priorities(b.indices, np.abs(cols["wseq"] % 7) + 0.5)
            assert edp.ingest_stats.rows == wseq
        elif edp.role is Role.ACTOR:  # actors beside it (at 3+ ranks) write as usual
            wseq = 0
            while not edp.should_stop:
                if wseq >= 8 * 400:  # at most 3,200 rows each: the ring never laps
                    time.sleep(0.01)
                    continue
                r = edp.ingest(checked_batch(me, wseq, 8))
                receipts.append((r.shard_id, r.first_seq, wseq, r.rows))
                wseq += 8
        else:
            edp.serve()
        edp.done()
        held = {}
        for s in edp.owned_shards():
            seqs, cols, _ = s.ring.read_committed()
            held[s.shard_id] = (seqs, cols, s.committed)
        all_receipts = dict(edp.roles.world.allgather((me, receipts)))
        all_held: dict = {}
        for h in edp.roles.world.allgather(held):
            all_held.update(h)
        summary = edp.summary()
    total = check_held_exactly_once(all_held, all_receipts)
    assert summary["rows_ingested"] == total
    assert summary["actors"][0]["rows"] == 320  # the learner's ingest is counted
    rmap = {(shard, first + i): (w, wseq + i) for w, rs in all_receipts.items()
            for shard, first, wseq, n in rs for i in range(n)}
    for idx, writer, wseq in delivered:
        for (shard, _slot, gen), w, s in zip(idx, writer, wseq, strict=True):
            assert rmap[(int(shard), int(gen) - 1)] == (int(w), int(s))
    if COMM.Get_rank() == 0:
        assert len(delivered) == 32


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["edp", "sync"])
def test_priority_updates_of_a_learner_that_ingests_keep_the_staleness_bound(mode) -> None:
    depth = 2 if mode == "edp" else 0
    cfg = config(mode, storage={"capacity_rows": 256},
                 scheduler={"batch_rows": 16, "prefetch_depth": 2, "min_fill_rows": 128})
    favoured = None
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.LEARNER:
            for i in range(8):  # a fixed set of rows: nothing is overwritten afterwards
                edp.ingest(checked_batch(edp.world_rank, 16 * i, 16))
            b = edp.next_batch()
            keep = tuple(b.indices[0].tolist())
            probe = ZeroedRows(edp, keep, depth)
            for s in range(12):
                if s:
                    b = edp.next_batch()
                probe.step(s, b)
                # a bad batch mid-run is refused on the caller's thread, and the
                # data-plane thread (edp) goes on preparing batches
                with pytest.raises(SpecError):
                    edp.ingest({"writer": np.zeros(2, np.int32)})
            favoured = keep
        elif edp.role is Role.ACTOR:
            pass  # at 3+ ranks: an actor that writes nothing
        else:
            edp.serve()
        edp.done()
        favoured = next(f for f in edp.roles.world.allgather(favoured) if f is not None)
        if edp.serves:
            (shard,) = edp.owned_shards()
            _sid, slot, gen = favoured
            assert shard.index.gens[slot] == gen
            assert shard.index.priority[slot] == 5.0
        edp.summary()


@pytest.mark.mpi(min_size=2)
def test_a_learner_may_not_ingest_without_the_layout_option() -> None:
    cfg = make_config(layout={"learners": 1, "buffers": 1, "actors": 0},
                      scheduler={"mode": "sync", "batch_rows": 4})
    if COMM.Get_size() < 3:  # without the option a layout needs an actor rank
        from conduit_hpc import WorldTooSmall
        with pytest.raises(WorldTooSmall, match="1\\+ actors"):
            ExperienceDataPlane(cfg)
        return
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.LEARNER:
            assert edp.world_rank not in edp.roles.writer_ranks
            with pytest.raises(Exception, match="ingest\\(\\) is for actor ranks"):
                edp.ingest(checked_batch(0, 0, 1))
        elif edp.serves:
            edp.serve()
        edp.done()
