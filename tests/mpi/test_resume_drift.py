"""Resuming from a checkpoint into a job whose configuration or world changed: what was
stored comes back exactly (rows, priorities, every learner's schedule), or the resume is
refused on every rank together."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import CheckpointError, ExperienceDataPlane, Role
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD
STEPS = 7


def config(**layout: Any):
    return make_config(layout=layout, storage={"capacity_rows": 4096,
                                               "priority_exponent": 1.0},
                       scheduler={"mode": "sync", "batch_rows": 16, "min_fill_rows": 64})


def held(edp: ExperienceDataPlane) -> list[tuple[int, int, float]]:
    """(writer, wseq, priority) of every row the buffers hold, on every rank."""
    mine = []
    for s in edp.owned_shards():
        s.poll()
        seqs, cols, _ = s.ring.read_committed()
        slots = seqs % s.ring.capacity
        mine += [(int(w), int(q), float(p)) for w, q, p in zip(
            cols["writer"], cols["wseq"], s.index.priority[slots], strict=True)]
    return sorted(r for part in edp.roles.world.allgather(mine) for r in part)


def train_and_save(root, cfg) -> None:
    """Actors ingest, every learner takes STEPS batches and sends priorities, then a
    checkpoint is written (as the jobs write their final one)."""
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            for k in range(20):
                edp.ingest(checked_batch(edp.world_rank, 8 * k, 8))
        elif edp.role is Role.LEARNER:
            for s in range(STEPS):
                b = edp.next_batch()
                edp.update_priorities(b.indices, 1.0 + b.indices[:, 2] % 17 + s)
        edp.done()
        if edp.serves:
            edp.serve()
        save_checkpoint(edp, root)


def resume_learners(root, cfg) -> list[tuple[int, dict[str, Any], int]]:
    """Resume; every learner's (world rank, sampler state, first superstep), on every
    rank; the rows held are those stored, with their priorities."""
    with ExperienceDataPlane(cfg) as edp:
        res = restore_data_plane(edp, "latest", roots=[root])
        assert res is not None
        rows = held(edp)
        mine = None
        if edp.role is Role.LEARNER:
            state = edp.learner.sampler_state(0)
            mine = (edp.world_rank, state, edp.next_batch().superstep)
        edp.done()
        if edp.serves:
            edp.serve()
        c = ck.open_checkpoint(res.path, spec=edp.spec)
    stored = []
    for s in c.shards:
        snap = c.read_shard(s.shard_id)
        stored += [(int(w), int(q), float(p)) for w, q, p in zip(
            snap.columns["writer"], snap.columns["wseq"], snap.priority, strict=True)]
    assert rows == sorted(stored), "the rows and priorities stored, exactly"
    return [x for x in COMM.allgather(mine) if x is not None]


@pytest.mark.mpi(min_size=4)
def test_a_learner_added_on_resume_continues_the_schedule_with_the_others(
        shared_dir) -> None:
    """One learner wrote the checkpoint; the job resumes with two. Before: the second
    learner (world rank 1, the old buffer, which stored no sampler state) restarted its
    schedule at superstep 0 (beta from its start) while the first went on at 7."""
    train_and_save(shared_dir, config(learners=1, buffers=1))
    got = resume_learners(shared_dir, config(learners=2, buffers=1))
    assert [(r, st["superstep_offset"], first) for r, st, first in got] == [
        (0, STEPS, STEPS), (1, STEPS, STEPS)], got
    assert got[0][1]["rng"] != got[1][1]["rng"], "one stream drawn twice"


@pytest.mark.mpi(min_size=6)
def test_learners_that_moved_to_other_world_ranks_take_their_own_state(shared_dir) -> None:
    """Two nodes with a learner each (world ranks 0 and 3 or 4) wrote the checkpoint; the
    job resumes with its learners at world ranks 0 and 1 (another layout of the same
    world). Before: the second learner looked for its state under world rank 1 (a
    buffer's: none) and restarted at superstep 0 with a fresh random state."""
    old = config(learners=1, buffers=1, per_node=True, emulate_nodes=2)
    with ExperienceDataPlane(old) as edp:
        old_learners = edp.roles.learner_ranks
        edp.done()
        if edp.serves:
            edp.serve()
    train_and_save(shared_dir, old)
    c = ck.open_checkpoint(ck.list_checkpoints(shared_dir)[-1])
    assert sorted(c.sampler) == list(old_learners) and old_learners[1] > 1
    got = resume_learners(shared_dir, config(learners=2, buffers=1))
    assert [(r, first) for r, _, first in got] == [(0, STEPS), (1, STEPS)], got
    for (_, state, _), was in zip(got, old_learners, strict=True):  # the same world:
        assert state == c.sampler[was]  # each learner's own random state and offset


@pytest.mark.mpi(min_size=3)
def test_a_rank_that_sees_another_checkpoint_than_the_others_stops_every_rank(
        shared_dir, monkeypatch) -> None:
    """The second buffer rank's view of the chosen checkpoint directory is another
    complete checkpoint (a stale client cache of a parallel file system, the directory
    replaced between the ranks' reads): each file passes its own checks. Before: each
    rank restored what it saw - shard 0 from one checkpoint, shard 1 from another, with
    no word. Now every rank raises, naming the rank and both manifests."""
    cfg = make_config(layout={"learners": 0, "buffers": 2}, storage={"capacity_rows": 1000})
    root = shared_dir / "checkpoints"
    for k in range(2):  # ckpt-000001 and ckpt-000002: other rows in every shard
        with ExperienceDataPlane(cfg) as edp:
            if edp.role is Role.ACTOR:
                for i in range(4):
                    edp.ingest(checked_batch(edp.world_rank, 100 * k + 10 * i, 3 + k))
            edp.done()
            if edp.serves:
                edp.serve()
            save_checkpoint(edp, root)
            other = edp.roles.buffer_ranks[1]
    chosen = root / "ckpt-000002"
    stale = shared_dir / "stale" / chosen.name
    if COMM.rank == other:
        shutil.copytree(root / "ckpt-000001", stale)
        real = ck.open_checkpoint

        def seen_here(path, **kw):
            return real(stale if Path(path) == chosen else path, **kw)

        monkeypatch.setattr(ck, "open_checkpoint", seen_here)
    COMM.Barrier()
    with ExperienceDataPlane(cfg) as edp:
        with pytest.raises(CheckpointError, match=rf"failed on world rank {other}: the "
                                                     r"checkpoint changed while"):
            restore_data_plane(edp, "latest", roots=[root])
        with pytest.raises(CheckpointError, match=rf"failed on world rank {other}"):
            restore_data_plane(edp, chosen)
        edp.done()
        if edp.serves:
            edp.serve()
    assert ck.damage_of(chosen) is None  # not damaged: nothing to fall back past


def sequence_config(**storage: Any):
    return make_config(spec={"actor": {"dtype": "int32"}, "t": {"dtype": "int64"},
                             "done": {"dtype": "bool"}},
                       layout={"learners": 1, "buffers": 1},
                       storage={"capacity_rows": 2048, **storage},
                       scheduler={"mode": "sync", "sampler": "sequence",
                                  "sequence_length": 4, "batch_rows": 16,
                                  "min_fill_rows": 64, "episode_field": "done",
                                  "stream_field": "actor"})


@pytest.mark.mpi(min_size=3)
def test_a_sequence_job_refuses_a_resume_that_would_break_its_windows(shared_dir) -> None:
    """Episodes of 7 steps in one shard; the job resumes with two shards. Before: the
    rows were dealt to the new shards one by one, and every window the learner drew held
    every other step ([10, 12, 14, 16]) across episode ends. Now it is refused on every
    rank, naming the shard layouts and the fields; one shard into a smaller one keeps
    the order, and every window is consecutive steps of one episode."""
    with ExperienceDataPlane(sequence_config()) as edp:
        if edp.role is Role.ACTOR:
            for e in range(30):
                edp.ingest({"actor": np.full(7, edp.world_rank, np.int32),
                            "t": np.arange(7 * e, 7 * e + 7), "done": np.arange(7) == 6})
        edp.done()
        if edp.serves:
            edp.serve()
        save_checkpoint(edp, shared_dir)
    with ExperienceDataPlane(sequence_config(shards_per_buffer=2)) as edp:
        with pytest.raises(CheckpointError, match=r"holds 1 shard\(s\) of \[2048\] rows, "
                           r"this job has 2 of \[1024, 1024\] .*storage.shards_per_buffer = "
                           r"2\), and scheduler.sampler = 'sequence' draws windows of 4"):
            restore_data_plane(edp, "latest", roots=[shared_dir])
        edp.done()
        if edp.serves:
            edp.serve()
    with ExperienceDataPlane(sequence_config(capacity_rows=100)) as edp:
        res = restore_data_plane(edp, "latest", roots=[shared_dir])
        assert res is not None and res.resharded and res.rows == 100
        if edp.role is Role.LEARNER:
            for _ in range(5):
                b = edp.next_batch()
                a, t, done = (b.data[k].numpy() for k in ("actor", "t", "done"))
                assert (a == a[:, :1]).all() and (np.diff(t, axis=1) == 1).all(), t
                assert not done[:, :-1].any()
        edp.done()
        if edp.serves:
            edp.serve()


@pytest.mark.mpi(min_size=3)
def test_a_resume_with_another_run_seed_draws_anew(shared_dir) -> None:
    """run.seed changed on resume (two runs forked from one checkpoint with other seeds).
    Before: the stored random states came back whatever the seed - the learner's sampler
    drew the same batches in every fork, and each rank's RNG (RestoreResult.rng_state)
    was the stored one. Now they start from the new seed; the position (superstep
    offset) and the rows still come back. With the seed unchanged the draws continue."""
    cfg = config(learners=1, buffers=1)
    train_and_save(shared_dir, cfg)
    c = ck.open_checkpoint(ck.list_checkpoints(shared_dir)[-1])
    lead = 0
    for seed, same in ((cfg.run.seed, True), (cfg.run.seed + 1, False)):
        raw = cfg.to_dict()
        raw["run"]["seed"] = seed
        with ExperienceDataPlane(type(cfg).from_dict(raw)) as edp:
            res = restore_data_plane(edp, "latest", roots=[shared_dir])
            assert res is not None
            assert res.rng_state == (c.rng.get(edp.world_rank) if same else None)
            if edp.role is Role.LEARNER:
                state = edp.learner.sampler_state(0)
                assert state["superstep_offset"] == STEPS
                assert (state["rng"] == c.sampler[lead]["rng"]) is same, seed
            edp.done()
            if edp.serves:
                edp.serve()


@pytest.mark.mpi(min_size=3)
def test_a_stored_sampler_state_the_learner_refuses_is_agreed_on_every_rank(
        shared_dir) -> None:
    """The newest checkpoint's manifest (DONE's digest made to match, as a hand-made or
    foreign checkpoint would) holds a sampler state whose RNG is not one. Before: the
    learner raised after the ranks had agreed the restore, alone, while the others
    returned from it and went on (a job's next collective hung). Now the read fails on
    every rank together and the resume falls back to the older checkpoint."""
    import hashlib
    import json

    import h5py

    cfg = config(learners=1, buffers=1)
    train_and_save(shared_dir, cfg)
    train_and_save(shared_dir, cfg)
    bad = ck.list_checkpoints(shared_dir)[-1]
    if COMM.rank == 0:
        with h5py.File(bad / ck.MANIFEST, "r+") as f:
            name = next(iter(f["sampler"]))
            del f["sampler"][name]
            f["sampler"][name] = json.dumps({"sampler": "prioritized", "rng": "garbage",
                                             "superstep_offset": STEPS})
        done = json.loads((bad / ck.DONE).read_text())
        done["manifest_sha256"] = hashlib.sha256((bad / ck.MANIFEST).read_bytes()).hexdigest()
        done["files"][ck.MANIFEST] = (bad / ck.MANIFEST).stat().st_size
        (bad / ck.DONE).write_text(json.dumps(done))
    COMM.Barrier()
    with ExperienceDataPlane(cfg) as edp:
        try:
            res = restore_data_plane(edp, "latest", roots=[shared_dir])
            outcome = (res.path.name, any("sampler state 'rng'" in s for s in res.skipped))
        except Exception as err:  # what each rank saw, compared below
            outcome = (type(err).__name__, str(err)[:200])
        if edp.role is Role.LEARNER and outcome[0] == "ckpt-000001":
            good = ck.open_checkpoint(shared_dir / "ckpt-000001")
            assert edp.learner.sampler_state(0) == good.sampler[edp.world_rank]
        every = COMM.allgather(outcome)
        edp.done()
        if edp.serves:
            edp.serve()
    assert every == [("ckpt-000001", True)] * COMM.size, every
