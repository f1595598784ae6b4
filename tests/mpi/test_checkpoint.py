"""Checkpoints of a running data plane: cut under concurrent ingest, restore at the same
and at a different number of buffer ranks, stop agreement with a final checkpoint,
fallback past refused checkpoints."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import CheckpointError, ExperienceDataPlane, Role, job
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing import SaveResult, restore_data_plane, save_checkpoint
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.features.checkpointing.stopping import StopCoordinator
from conduit_hpc.placement import Placement, plan_round_robin
from conduit_hpc.plane.extensions import BufferExtension
from conduit_hpc.protocol import JOB_TAGS, Tag
from conduit_hpc.testing import checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
T = TypeVar("T")


def prio_of(writer: np.ndarray, wseq: np.ndarray) -> np.ndarray:
    return 0.25 + ((np.asarray(writer) * 7919 + np.asarray(wseq)) % 13).astype(float)


def ingest(edp: ExperienceDataPlane, first: int, batches: int, rows: int = 3,
           pause_s: float = 0.0) -> list[tuple[int, int, int, int]]:
    """Batches of ``rows`` rows with priorities; (shard, first_seq, first_wseq, rows) each."""
    out = []
    w = first
    for _ in range(batches):
        b = checked_batch(edp.world_rank, w, rows)
        r = edp.ingest(b, priorities=prio_of(b["writer"], b["wseq"]))
        out.append((r.shard_id, r.first_seq, w, rows))
        w += rows
        if pause_s:
            time.sleep(pause_s)
    return out


def held(edp: ExperienceDataPlane) -> list[tuple[int, int, int, float, int]]:
    """Every row the buffers hold: (writer, wseq, shard, priority, seq), all ranks."""
    mine = []
    for s in edp.owned_shards():
        s.poll()
        seqs, cols, _ = s.ring.read_committed()
        assert row_consistent(cols).all(), "a torn row"
        visible = s.index.gens[seqs % s.ring.capacity] == seqs + 1
        p = s.index.priority[seqs % s.ring.capacity]
        mine += [(int(w), int(q), s.shard_id, float(pp), int(sq)) for w, q, pp, sq, v in
                 zip(cols["writer"], cols["wseq"], p, seqs, visible, strict=True) if v]
    return sorted(r for part in edp.roles.world.allgather(mine) for r in part)


def cfg_for(buffers: int, per_buffer: int, capacity: int = 8000, **more):
    return make_config(layout={"learners": 0, "buffers": buffers},
                       storage={"capacity_rows": capacity, "shards_per_buffer": per_buffer,
                                "priority_exponent": 0.6}, **more)


def wait_for(path: Path, timeout_s: float = 60.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("shared_memory", ["auto", "never"])
def test_cut_under_ingest_restores_every_row_before_it_once(shared_dir, shared_memory) -> None:
    root = shared_dir
    # phase 1: one buffer rank, two shards; actors ingest while the buffer side checkpoints
    # (over RMA, the periodic writer compresses two columns: the restores read them back)
    codecs = {"payload": "gzip", "check": "lzf"} if shared_memory == "never" else {}
    cfg = cfg_for(1, 2, transport={"shared_memory": shared_memory},
                  checkpoint={"compression": codecs})
    with ExperienceDataPlane(cfg) as edp:
        agent = CheckpointAgent(edp, root, keep=0)
        receipts: list = []
        after_done: list = []
        if edp.role is Role.ACTOR:
            actors = edp.roles.actor
            first_actor = actors.Get_rank() == 0
            receipts = ingest(edp, 0, 20)
            if first_actor:
                agent.request(reason="test")
            receipts += ingest(edp, 60, 30, pause_s=0.001)  # races with the cut and write
            if first_actor:  # rows written after the checkpoint is complete: after the cut
                assert wait_for(root / "ckpt-000001" / ck.DONE), "no checkpoint appeared"
                after_done = ingest(edp, 1000, 5)
            edp.done()
        else:
            edp.serve()
        agent.finish()
        world = edp.roles.world
        all_receipts = [r for part in world.allgather(receipts) for r in part]
        writers = world.allgather((edp.world_rank, receipts + after_done))
        late = {(w, ws + i) for w, rs in world.allgather((edp.world_rank, after_done))
                for _, _, ws, n in rs for i in range(n)}
        live = held(edp)
    assert all_receipts and len(live) == sum(n for rs in [r for _, r in writers]
                                             for *_, n in rs)
    c = ck.open_checkpoint(root / "ckpt-000001", spec=edp.spec)
    # the expected content of the cut: every row with seq < the shard's commit cursor
    expected = set()
    for w, rs in writers:
        for shard, first, ws, n in rs:
            for i in range(n):
                if first + i < c.shards[shard].commit:
                    expected.add((w, ws + i, shard, first + i))
    assert 0 < len(expected) < len(live), "the cut was not taken during ingest"
    assert not {(w, q) for w, q, *_ in expected} & late
    stored = set()
    for s in c.shards:
        snap = c.read_shard(s.shard_id)
        assert row_consistent(snap.columns).all()
        np.testing.assert_array_equal(snap.priority, prio_of(snap.columns["writer"],
                                                             snap.columns["wseq"]))
        stored |= {(int(w), int(q), s.shard_id, int(sq)) for w, q, sq in zip(
            snap.columns["writer"], snap.columns["wseq"], snap.seqs, strict=True)}
    assert stored == expected
    with h5py.File(root / "ckpt-000001" / "buffer-0000.h5", "r") as f:
        # a shard the cut found empty stores its columns plain (nothing to chunk): the
        # codecs are checked on the shards that hold rows (one at least, above)
        full = [s.shard_id for s in c.shards if len(f[f"/shards/{s.shard_id}/columns/wseq"])]
        assert full
        for sid in full:
            cols = f[f"/shards/{sid}/columns"]
            assert cols["payload"].attrs.get("compression") == codecs.get("payload")
            assert cols["check"].attrs.get("compression") == codecs.get("check")
            assert "compression" not in cols["wseq"].attrs
    with h5py.File(root / "ckpt-000001" / ck.MANIFEST, "r") as f:  # the global view
        assert len(f["experience/wseq"]) == len(expected)
        assert set(zip(f["experience/writer"][:].tolist(), f["experience/wseq"][:].tolist(),
                       strict=True)) == {(w, q) for w, q, *_ in expected}

    want = sorted((w, q, prio_of(w, q).item()) for w, q, *_ in expected)

    def restore_and_check(cfg, resharded: bool) -> list:
        with ExperienceDataPlane(cfg) as edp2:
            res = restore_data_plane(edp2, root / "ckpt-000001")
            assert res is not None and res.resharded is resharded and res.rows == len(want)
            rows = held(edp2)
            got = sorted((w, q, p) for w, q, _, p, _ in rows)
            assert got == want, "every row before the cut exactly once, with its priority"
            # the restored plane goes on: more rows come in and are kept with the others
            extra = ingest(edp2, 5000, 4) if edp2.role is Role.ACTOR else []
            edp2.done()
            if edp2.serves:
                edp2.serve()
            n_extra = sum(n for part in edp2.roles.world.allgather(extra) for *_, n in part)
            after = held(edp2)
            assert len(after) == len(want) + n_extra
        return rows

    # the same shard capacities on another number of buffer ranks: shard by shard
    rows = restore_and_check(cfg_for(2, 1, transport={"shared_memory": shared_memory}), False)
    assert {r[2] for r in rows} <= {0, 1}
    # another shard layout: resharded, priorities kept
    rows = restore_and_check(cfg_for(2, 2), True)
    per_shard = np.bincount([r[2] for r in rows], minlength=4)
    assert per_shard.max() - per_shard.min() <= 1, per_shard  # dealt evenly
    # the same layout: identical cursors and slots
    with ExperienceDataPlane(cfg) as edp3:
        restore_data_plane(edp3, root / "ckpt-000001")
        for s in edp3.owned_shards():
            assert s.committed == c.shards[s.shard_id].commit
        rows = held(edp3)
        assert sorted((w, q, sh, sq) for w, q, sh, _, sq in rows) == sorted(expected)
        edp3.done()
        if edp3.serves:
            edp3.serve()


@pytest.mark.mpi(min_size=3)
def test_a_stop_request_before_the_coordinator_exists_is_not_lost() -> None:
    # job_main's handler records a SIGUSR1 that comes while the data plane is being set
    # up; the StopCoordinator built after it must count it (else the job runs on)
    cfg = cfg_for(1, 1, capacity=1000)
    old = signal.getsignal(signal.SIGUSR1)
    job.install_stop_handler()
    try:
        with ExperienceDataPlane(cfg) as edp:
            if edp.world_rank == edp.roles.actor_ranks[-1]:
                os.kill(os.getpid(), signal.SIGUSR1)  # the launcher's forwarded request
            stop = StopCoordinator(edp)
            t0 = time.monotonic()
            if edp.role is Role.ACTOR:
                while not stop.requested():
                    assert time.monotonic() - t0 < 60, "the stop never arrived"
                    time.sleep(0.01)
                edp.done()
            else:
                edp.serve()
            stopped = stop.agree()
            stop.close()
    finally:
        signal.signal(signal.SIGUSR1, old)
        job._STOP["signal"] = 0
    assert stopped


@pytest.mark.mpi(min_size=3)
def test_signal_on_one_rank_stops_all_and_final_checkpoint_round_trips(shared_dir) -> None:
    root = shared_dir
    cfg = cfg_for(1, 1, capacity=100_000)
    with ExperienceDataPlane(cfg) as edp:
        stop = StopCoordinator(edp)
        agent = CheckpointAgent(edp, root)
        rank = edp.world_rank
        last_actor = edp.roles.actor_ranks[-1]
        t0 = time.monotonic()
        batches = 0
        if edp.role is Role.ACTOR:
            while not stop.requested():
                ingest(edp, 3 * batches, 1)
                batches += 1
                if rank == last_actor and batches == 20:
                    os.kill(os.getpid(), signal.SIGTERM)  # as SLURM or mpirun would
                assert time.monotonic() - t0 < 60, "the stop never arrived"
            edp.done()
        else:
            edp.serve()
        agent.finish()
        assert stop.agree()
        gen = np.random.default_rng(100 + rank)
        gen.random(rank + 1)
        model = {"model/w": np.arange(6.0).reshape(2, 3) * rank, "optimizer/step": np.int64(9)}
        if edp.serves:  # a learner's priority updates, before the save
            (s,) = edp.owned_shards()
            s.poll()
            slots = np.arange(0, s.index.count, 3)
            s.index.update(slots, s.index.gens[slots], np.full(len(slots), 11.0))
            before = {"sum": s.index.sum._tree.copy(), "min": s.index.min._tree.copy(),
                      "max": s.index.max_priority, "commit": s.committed}
        result = save_checkpoint(edp, root, rng=ck.rng_to_json(gen), counters={"batches": batches},
                                extra_state=model if edp.serves else None,
                                agent=agent)
        stop.close()
        everyone_batches = edp.roles.world.allgather(batches)
    assert result.path.name == "ckpt-000001" and (result.path / ck.DONE).exists()
    assert sum(everyone_batches) > 0
    c = ck.open_checkpoint(result.path, spec=edp.spec)
    assert c.rows == 3 * sum(everyone_batches)
    assert set(c.rng) == set(range(COMM.size))
    assert c.counters[COMM.rank]["batches"] == batches
    # restore: identical trees, this rank's RNG and the arrays come back
    with ExperienceDataPlane(cfg) as edp2:
        res = restore_data_plane(edp2, "latest", roots=[root])
        assert res is not None and res.path == result.path and not res.resharded
        restored = ck.rng_from_json(res.rng_state)
        np.testing.assert_array_equal(restored.random(4), gen.random(4))
        if edp2.serves:
            (s,) = edp2.owned_shards()
            np.testing.assert_array_equal(s.index.sum._tree, before["sum"])
            np.testing.assert_array_equal(s.index.min._tree, before["min"])
            assert s.index.max_priority == before["max"] >= 11.0
            assert s.committed == before["commit"]
            assert set(res.extra_state) == {"model/w", "optimizer/step"}
            np.testing.assert_array_equal(res.extra_state["model/w"], model["model/w"])
        else:
            assert res.extra_state == {}
        edp2.done()
        if edp2.serves:
            edp2.serve()


def one_cycle(root: Path, rows_per_actor: int, compression: dict | None = None) -> None:
    """A short job: actors ingest, then everyone writes a checkpoint (its columns through
    the ``checkpoint.compression`` codecs given)."""
    more = {"checkpoint": {"compression": compression}} if compression else {}
    with ExperienceDataPlane(cfg_for(1, 1, capacity=1000, **more)) as edp:
        if edp.role is Role.ACTOR:
            ingest(edp, 0, rows_per_actor, rows=1)
            edp.done()
        else:
            edp.serve()
        save_checkpoint(edp, root)


@pytest.mark.mpi(min_size=2)
def test_a_restore_failing_on_one_rank_for_another_reason_fails_on_every_rank(
        shared_dir, monkeypatch) -> None:
    """Reading a checkpoint fails on one rank with an error that is not the checkpoint's
    (out of memory, a bug): every rank raises a CheckpointError naming that rank and the
    error, no rank waits for the others for ever, and the checkpoint is neither skipped
    nor marked damaged (before: that rank raised alone and the others hung in the
    agreement)."""
    from conduit_hpc.features.checkpointing import resume

    one_cycle(shared_dir, 2)
    path = ck.list_checkpoints(shared_dir)[-1]
    last = COMM.size - 1
    real = resume._load_shards

    def load(edp, ckpt):
        if edp.world_rank == last:
            raise MemoryError("cannot allocate 1.00 TiB")
        return real(edp, ckpt)

    monkeypatch.setattr(resume, "_load_shards", load)
    with ExperienceDataPlane(cfg_for(1, 1, capacity=1000)) as edp:
        for source in (path, "latest"):
            with pytest.raises(CheckpointError, match=rf"world rank {last}: MemoryError: "
                                                      r"cannot allocate 1.00 TiB"):
                restore_data_plane(edp, source, roots=[shared_dir])
        assert ck.damage_of(path) is None
        edp.done()
        if edp.serves:
            edp.serve()


@pytest.mark.mpi(min_size=3)
def test_resume_latest_falls_back_past_refused_checkpoints(shared_dir) -> None:
    root = shared_dir
    gzip = {"payload": "gzip", "check": "lzf"}
    for k in range(1, 7):  # 1 and 5 with compressed columns
        one_cycle(root, k, gzip if k in (1, 5) else None)
    COMM.Barrier()
    if COMM.rank == 0:
        f6 = root / "ckpt-000006" / "buffer-0000.h5"
        with h5py.File(f6, "r") as f:  # a dataset's object header (metadata) damaged
            addr = h5py.h5o.get_info(f["/shards/0/seq"].id).addr
        with open(f6, "r+b") as fh:
            fh.seek(addr + 8)
            b = fh.read(16)
            fh.seek(addr + 8)
            fh.write(bytes(x ^ 0xFF for x in b))
        f5 = root / "ckpt-000005" / "buffer-0000.h5"
        with h5py.File(f5, "r") as f:  # bytes flipped inside a compressed block
            chunk = f["/shards/0/columns/payload"].id.get_chunk_info(0)
        with open(f5, "r+b") as fh:
            fh.seek(chunk.byte_offset + chunk.size // 2)
            b = fh.read(4)
            fh.seek(chunk.byte_offset + chunk.size // 2)
            fh.write(bytes(x ^ 0xFF for x in b))
        (root / "ckpt-000002" / ck.DONE).unlink()  # killed before DONE
        f3 = root / "ckpt-000003" / "buffer-0000.h5"
        with open(f3, "r+b") as fh:  # truncated
            fh.truncate(f3.stat().st_size - 100)
        f4 = root / "ckpt-000004" / "buffer-0000.h5"
        with h5py.File(f4, "r") as f:  # one flipped bit, found only when the data is read
            off = f["/shards/0/columns/payload"].id.get_offset()
        with open(f4, "r+b") as fh:
            fh.seek(off + 5)
            b = fh.read(1)
            fh.seek(off + 5)
            fh.write(bytes([b[0] ^ 1]))
    COMM.Barrier()
    actors = COMM.size - 1
    with ExperienceDataPlane(cfg_for(1, 1, capacity=1000)) as edp:
        res = restore_data_plane(edp, "latest", roots=[root])
        assert res is not None and res.path.name == "ckpt-000001"
        assert res.rows == actors
        assert len(res.skipped) == 5
        assert ("ckpt-000006/buffer-0000.h5: dataset /shards/0/seq cannot be read; the "
                "file is damaged (KeyError" in res.skipped.pop(0)), res.skipped
        assert ("ckpt-000005/buffer-0000.h5: dataset /shards/0/columns/payload cannot be "
                "read (a compressed block is damaged" in res.skipped[0]), res.skipped[0]
        assert "buffer-0000.h5" in res.skipped[1] and "fails its checksum" in res.skipped[1]
        assert "buffer-0000.h5 is truncated" in res.skipped[2]
        assert "ckpt-000002: no DONE marker" in res.skipped[3]
        assert len(held(edp)) == actors
        # the complete ones refused are marked damaged (kept as evidence), not the one
        # without DONE; retention neither counts nor deletes them
        marked = {p.name: ck.damage_of(p) for p in ck.list_checkpoints(root)}
        assert [n for n, why in marked.items() if why] == [
            "ckpt-000003", "ckpt-000004", "ckpt-000005", "ckpt-000006"], marked
        assert "fails its checksum" in str(marked["ckpt-000004"])
        COMM.Barrier()
        if edp.world_rank == edp.roles.buffer_ranks[0]:
            assert not ck.prune(root, 1)  # the one good checkpoint is the one kept
        COMM.Barrier()
        assert len(ck.list_checkpoints(root)) == 6  # before: ckpt-000006 (damaged) alone
        # a given checkpoint is refused without fallback, on every rank alike
        with pytest.raises(CheckpointError, match="fails its checksum"):
            restore_data_plane(edp, root / "ckpt-000004")
        with pytest.raises(CheckpointError, match="a compressed block is damaged"):
            restore_data_plane(edp, root / "ckpt-000005")
        with pytest.raises(CheckpointError, match="no DONE marker"):
            restore_data_plane(edp, root / "ckpt-000002")
        with pytest.raises(CheckpointError, match="/shards/0/seq cannot be read; the file"):
            restore_data_plane(edp, root / "ckpt-000006")
        edp.done()
        if edp.serves:
            edp.serve()
    with ExperienceDataPlane(cfg_for(1, 1, capacity=1000)) as edp:
        assert restore_data_plane(edp, "latest", roots=[root / "nothing-here"]) is None
        edp.done()
        if edp.serves:
            edp.serve()


@pytest.mark.mpi(min_size=3)
def test_learner_requested_checkpoint_holds_the_learners_state(shared_dir) -> None:
    root = shared_dir
    cfg = make_config(layout={"learners": 1, "buffers": 1}, storage={"capacity_rows": 1000})
    arrays = {"model/w": np.linspace(0, 1, 12).reshape(3, 4), "optimizer/step": np.int64(7)}
    gen = np.random.default_rng(5)
    with ExperienceDataPlane(cfg) as edp:
        agent = CheckpointAgent(edp, root, keep=0)
        if edp.role is Role.LEARNER:  # at the boundary of superstep 7
            agent.request(parts_from=[edp.world_rank], superstep=7)
            end = time.monotonic() + 60
            while not agent.contribute(lambda: {"rng": ck.rng_to_json(gen),
                                                "counters": {"superstep": 7},
                                                "extra_state": arrays}):
                assert time.monotonic() < end, "the leader never asked for the part"
                time.sleep(0.005)
            edp.done()
        elif edp.role is Role.ACTOR:
            ingest(edp, 0, 5)
            edp.done()
        else:
            edp.serve()
        agent.finish()
        learner, leader = edp.roles.learner_ranks[0], edp.roles.buffer_ranks[0]
    c = ck.open_checkpoint(root / "ckpt-000001", spec=edp.spec)
    assert c.counters[learner] == {"role": "learner", "superstep": 7}
    assert c.counters[leader]["request.superstep"] == 7
    assert set(c.rng) == {learner}
    np.testing.assert_array_equal(ck.rng_from_json(c.rng[learner]).random(3),
                                  np.random.default_rng(5).random(3))
    extra = c.extra_state()
    np.testing.assert_array_equal(extra["model/w"], arrays["model/w"])
    assert extra["optimizer/step"] == 7


TEST_UPDATE = JOB_TAGS.start  # stands in for the scheduler's priority-update message
TEST_INGESTED = JOB_TAGS.start + 1  # an actor tells the learner it is done writing


@pytest.mark.mpi(min_size=4)
def test_superstep_boundary_cut_sees_every_update_sent_before_the_marker(shared_dir) -> None:
    root = shared_dir
    cfg = make_config(layout={"learners": 1, "buffers": 2},
                      storage={"capacity_rows": 4000, "shards_per_buffer": 1})
    # world rank 0 learns, 1 and 2 buffer; the first actor writes to the shard of rank 2
    actors = range(3, COMM.size)
    base = plan_round_robin(actor_ranks=actors, buffer_ranks=(1, 2), learner_ranks=(0,),
                            capacity_rows=4000)
    placement = Placement(shards=base.shards, learner_shards=base.learner_shards,
                          actor_shards={a: (i + 1) % 2 for i, a in enumerate(actors)})
    with ExperienceDataPlane(cfg, placement=placement) as edp:
        agent = CheckpointAgent(edp, root, keep=0)
        learner = edp.roles.learner_ranks[0]
        if edp.server is not None:
            class OnUpdate(BufferExtension):  # every held row of this rank gets priority p
                tags = frozenset({TEST_UPDATE})

                def on_message(self, msg) -> None:
                    (p,) = msg.view(np.float64)
                    for s in edp.owned_shards():
                        s.poll()
                        slots = np.flatnonzero(s.index.gens > 0)
                        s.index.update(slots, s.index.gens[slots], np.full(len(slots), p))

            edp.server.add_extension(OnUpdate())
            edp.serve()
        elif edp.role is Role.ACTOR:
            ingest(edp, 0, 10)
            edp.channel.isend(learner, TEST_INGESTED, np.zeros(0, np.uint8))
            edp.done()
        else:
            for _ in edp.roles.actor_ranks:  # rows are all written (not yet committed)
                edp.channel.recv(tag=TEST_INGESTED, timeout_s=60, what="an actor")
            first, late = edp.roles.buffer_ranks
            for b in (first, late):  # superstep 1
                edp.channel.isend(b, TEST_UPDATE, np.array([3.0]))
            # superstep 2, then its marker behind the update on each channel; the
            # second buffer hears of both only after the leader has started the cut
            marker = np.frombuffer(json.dumps({"mark": 2, "part": True}).encode(), np.uint8)
            for b in (first, late):
                edp.channel.isend(b, TEST_UPDATE, np.array([7.5]))
                edp.channel.isend(b, Tag.CKPT_MARK, marker)  # what agent.mark(2) sends
                time.sleep(0.5)
            end = time.monotonic() + 60
            while not agent.contribute(lambda: {"counters": {"superstep": 2}}):
                assert time.monotonic() < end, "the checkpoint never started"
                time.sleep(0.005)
            edp.done()
        agent.finish()
        rows = 10 * 3 * len(edp.roles.actor_ranks)
    c = ck.open_checkpoint(root / "ckpt-000001", spec=edp.spec)
    assert c.rows == rows
    assert c.shards[1].rows > 0  # the late buffer holds rows
    for s in c.shards:  # every row carries the update of superstep 2, on both buffers
        np.testing.assert_array_equal(c.priorities(s.shard_id), np.full(s.rows, 7.5))
    assert c.counters[learner]["superstep"] == 2
    assert c.counters[edp.roles.buffer_ranks[0]]["request.superstep"] == 2


def _three_batches_then_save(cfg, root: Path, actor: Callable[[ExperienceDataPlane], object],
                             then: Callable[[ExperienceDataPlane], T]
                             ) -> tuple[SaveResult, T]:
    """A job whose actors run ``actor(edp)`` while the learner takes three batches, then
    a checkpoint under ``root`` once every rank is done; returns it with ``then(edp)``
    (collective if ``then`` is)."""
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            actor(edp)
        elif edp.role is Role.LEARNER:
            for _ in range(3):
                edp.next_batch()
        else:
            edp.serve()
        edp.done()
        return save_checkpoint(edp, root), then(edp)


@pytest.mark.mpi(min_size=3)
def test_a_checkpoint_after_the_writers_finished_holds_every_row_held(shared_dir) -> None:
    """A checkpoint cut right after the last writer finished (a job's final one) left
    out the guard band's rows - hidden ahead of writers that were writing fast a moment
    before, given back to sampling only once the owner had seen them idle for idle_s:
    the synthetic job stopped by SIGTERM held 6,000 rows and its final checkpoint had
    5,666 (inspect's rows against summary.json's rows_held). With every writer done,
    the cut now gives the band back first: the checkpoint holds every row held."""
    cap = 600
    cfg = make_config(layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": cap, "priority_exponent": 0.6},
                      scheduler={"batch_rows": 32, "min_fill_rows": cap})
    def flat_out(edp: ExperienceDataPlane) -> None:  # until the learners are done
        w = 0
        while not edp.should_stop and w < 5_000_000:
            edp.ingest(checked_batch(edp.world_rank, w, 30))
            w += 30

    result, summary = _three_batches_then_save(cfg, shared_dir / "ckpt", flat_out,
                                               ExperienceDataPlane.summary)
    held_rows = sum(s["held"] for s in summary["shards"].values())
    with h5py.File(result.path / "manifest.h5", "r") as f:
        rows = len(f["index/seq"])
    assert summary["rows_ingested"] > cap
    assert rows == held_rows == cap, (rows, held_rows, summary["shards"])


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(COMM.size != 3, reason="a rule of the checkpoint's contents, not of "
                                           "concurrency: one rank count (make test's time)")
def test_a_resumed_job_keeps_its_rate_limiter_counts(shared_dir) -> None:
    """The job's rows inserted and sampled (the rate limiter's counts, the control
    block's) were not in a checkpoint: a resumed job started them at 0 beside a full
    replay, so a samples-per-insert learner waited for the actors to insert its whole
    error buffer again, and a TorchRL buffer's ``len()`` (rows inserted) said 0. They are
    kept in the checkpoint now and come back with it."""
    from conduit_hpc.plane.control import C_INSERTS, C_RESERVED, C_SAMPLES

    cfg = make_config(layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 600, "priority_exponent": 0.6},
                      scheduler={"batch_rows": 32, "min_fill_rows": 64})
    result, saved = _three_batches_then_save(
        cfg, shared_dir / "ckpt", lambda edp: ingest(edp, 0, 10, rows=30),
        lambda edp: [edp.control.read(c) for c in (C_INSERTS, C_SAMPLES)])
    # (a prefetching learner may have drawn a batch more than it took)
    assert saved[0] == 300 * (COMM.size - 2) and saved[1] >= 96, saved
    with ExperienceDataPlane(cfg) as edp:
        restore_data_plane(edp, result.path)
        back = [edp.control.read(c) for c in (C_INSERTS, C_RESERVED, C_SAMPLES)]
        if edp.serves:
            edp.serve()
        else:
            edp.done()
    assert back == [saved[0], saved[0], saved[1]], (back, saved)
