"""Each frame stored once, across ranks: actors of several streams each write interleaved
into shared shards that lap; every stack delivered (to a learner, to readers on other
ranks, in the owner's committed rows) is exactly the one its actor produced."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import FRAME_SPEC, frame_rows, frame_stacks_of, make_config

COMM = MPI.COMM_WORLD
ENVS = 3  # streams per actor


def config(transport: str, learners: int, device_rows: int = 0, **sch):
    return make_config(spec=FRAME_SPEC, layout={"learners": learners, "buffers": 1},
                       storage={"capacity_rows": 192, "priority_exponent": 0.6},
                       transport={"shared_memory": transport},
                       placement={"device_rows": device_rows, "interval_supersteps": 1,
                                  "patience": 1},
                       scheduler={"batch_rows": 16, "prefetch_depth": 2,
                                  "min_fill_rows": 48, **sch})


def produce(edp: ExperienceDataPlane, rounds: int, seed: int,
            each_round: Callable[[], None] | None = None) -> set[tuple[int, int, int]]:
    """Ingest ``rounds`` rounds of 1-4 rows of each of this actor's streams (their
    episodes of random length, one after another), or (after 40) until asked to stop;
    returns the (env, episode, step) of every row written. ``each_round`` runs after
    each round."""
    rng = np.random.default_rng(seed)
    envs = [edp.world_rank * ENVS + e for e in range(ENVS)]
    episode = dict.fromkeys(envs, 0)
    rows = {e: frame_rows(e, 0, int(rng.integers(5, 40))) for e in envs}
    pos = dict.fromkeys(envs, 0)
    made: set[tuple[int, int, int]] = set()
    for r in range(rounds):
        if r >= 40 and edp.should_stop:  # 40 rounds first: the 192-slot ring laps
            break
        for e in rng.permutation(envs):
            e = int(e)
            k = min(int(rng.integers(1, 5)), len(rows[e]["env"]) - pos[e])
            part = {n: c[pos[e]:pos[e] + k] for n, c in rows[e].items()}
            edp.ingest(part)
            made.update(zip(part["env"].tolist(), part["episode"].tolist(),
                            part["step"].tolist(), strict=True))
            pos[e] += k
            if pos[e] == len(rows[e]["env"]):  # the episode ended: the next one
                episode[e] += 1
                rows[e] = frame_rows(e, episode[e], int(rng.integers(5, 40)))
                pos[e] = 0
        if each_round is not None:
            each_round()
    return made


def produce_hostile(edp: ExperienceDataPlane, rounds: int, seed: int) -> set[tuple[int, int, int]]:
    """Every actor writes the same few stream ids (negative, zero, past 2**32) at once,
    each id's episodes one after another (an id reused as soon as its episode ends, or
    cut short mid-episode: a restart), many of one or two steps: rows of one id from
    several actors (their episodes differ) interleave in one lapping shard."""
    rng = np.random.default_rng(seed)
    made: set[tuple[int, int, int]] = set()
    for r in range(rounds):
        env = int(rng.choice([-5, 0, 2**40]))
        episode = edp.world_rank * 100_000 + r  # unique to this actor
        rows = frame_rows(env, episode, int(rng.choice([1, 1, 2, 3, 17])))
        end = len(rows["env"]) if rng.random() < 0.7 else int(rng.integers(1, 1 + len(
            rows["env"])))  # a restart: the rest of the episode is never written
        for a in range(0, end, 3):
            part = {n: c[a:min(a + 3, end)] for n, c in rows.items()}
            edp.ingest(part)
            made.update(keys(part))
    return made


def keys(cols) -> list[tuple[int, int, int]]:
    return list(zip(cols["env"].tolist(), cols["episode"].tolist(), cols["step"].tolist(),
                    strict=True))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("transport", ["auto", "never"])
def test_readers_on_every_rank_see_exact_stacks(transport: str) -> None:
    """No learner: actors write and, between writes, read random slots of the shard as
    another rank's reader would (shared memory or RMA gets); the owner's committed rows
    at the end. Every intact row: exact stacks, a row some actor made."""
    cfg = config(transport, learners=0)
    seen: list[tuple[int, int, int]] = []
    with ExperienceDataPlane(cfg) as edp:
        made: set[tuple[int, int, int]] = set()
        if edp.role is Role.ACTOR:
            rng = np.random.default_rng(100 + edp.world_rank)
            ring = edp.actor.rings[0]

            def read() -> None:
                slots = rng.integers(0, ring.capacity, 48)
                gens = ring.stamps_of(slots)  # the seqs the slots held before the copy
                cols, cursor = ring.gather(slots)
                good = ring.intact(gens, cursor)
                rows = {k: v[good] for k, v in cols.items()}
                assert frame_stacks_of(rows).all(), "a stack read by another rank differs"
                seen.extend(keys(rows))

            made = produce(edp, 40, seed=edp.world_rank, each_round=read)
        else:
            edp.serve()
        edp.done()
        committed = []
        for s in edp.owned_shards():
            _seqs, cols, _ = s.ring.read_committed()
            assert frame_stacks_of(cols).all(), "a committed row's stacks differ"
            assert len(cols["env"]) > 0 and s.committed > s.ring.capacity  # it lapped
            committed += keys(cols)
        all_made = set().union(*COMM.allgather(made))
        everything = seen + committed
    assert set(everything) <= all_made
    assert COMM.allreduce(len(seen)) > 0


@pytest.mark.mpi(min_size=2)
def test_bytes_ingested_are_the_bytes_the_shards_took() -> None:
    """The summary's bytes_ingested (and each actor's ``bytes``, 'payload bytes written')
    counted every row's whole stacks (Spec.row_bytes: 272 B of this spec a row) though a
    shard holds each frame once (Spec.stored_row_bytes a slot, 134 B): 2x over here,
    7.9x for the Atari spec. Now the slots the writes took (frames-only slots included)
    times the stored bytes: what the shards' reserve cursors say was written."""
    from conduit_hpc.spec import Spec

    cfg = config("auto", learners=0)
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            produce(edp, 40, seed=edp.world_rank)
        else:
            edp.serve()
        edp.done()
        summary = edp.summary()
        slots = COMM.allreduce(sum(s.ring.reserve_cursor() for s in edp.owned_shards()))
    spec = Spec.from_config(cfg.spec)
    assert spec.stored_row_bytes < spec.row_bytes
    assert summary["bytes_ingested"] == slots * spec.stored_row_bytes, (summary, slots)
    assert summary["rows_ingested"] <= slots


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("transport", ["auto", "never"])
def test_hostile_stream_ids_deliver_exact_stacks(transport: str) -> None:
    """Stream ids shared by every actor, reused, restarted and of one-step episodes, in a
    shard that laps: every row a learner draws (or, at 2 ranks, every committed row) is
    exactly the one an actor made."""
    learners = 1 if COMM.Get_size() >= 3 else 0
    cfg = config(transport, learners)
    delivered: list[tuple[int, int, int]] = []
    made: set[tuple[int, int, int]] = set()
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            made = produce_hostile(edp, 150, seed=edp.world_rank)
        elif edp.role is Role.LEARNER:
            for _ in range(10):
                cols = {k: v.numpy() for k, v in edp.next_batch().data.items()}
                assert frame_stacks_of(cols).all(), "a delivered stack differs"
                delivered += keys(cols)
        else:
            edp.serve()
        edp.done()
        delivered += delivered_rows(edp)
        all_made = set().union(*COMM.allgather(made))
    assert delivered and set(delivered) <= all_made


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize(("transport", "mode", "fetch", "device_rows"), [
    ("auto", "edp", "direct", 0), ("never", "edp", "direct", 0), ("auto", "edp", "owner", 0),
    ("auto", "service", "direct", 0), ("auto", "edp", "direct", 192)])
def test_every_delivered_stack_is_what_its_actor_produced(transport: str, mode: str,
                                                          fetch: str, device_rows: int) -> None:
    """A learner draws prioritized batches (prefetched with direct reads over shared
    memory or RMA, or through the owner; or asking the buffer each time; or from the
    shard mirrored on its device, whole stacks there) while the actors lap the shard:
    every stack in every batch is exact and was made."""
    cfg = config(transport, 1, device_rows, mode=mode, fetch=fetch)
    delivered: list[tuple[int, int, int]] = []
    made: set[tuple[int, int, int]] = set()
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            made = produce(edp, 10_000, seed=edp.world_rank)
        elif edp.role is Role.LEARNER:
            for _ in range(30):
                b = edp.next_batch()
                cols = {k: v.numpy() for k, v in b.data.items()}
                assert frame_stacks_of(cols).all(), "a delivered stack differs"
                delivered += keys(cols)
                edp.update_priorities(b.indices, np.random.default_rng(0).uniform(
                    0.1, 2.0, len(b.indices)))
        else:
            edp.serve()
        edp.done()
        for s in edp.owned_shards():
            assert s.committed > s.ring.capacity  # the ring lapped
        all_made = set().union(*COMM.allgather(made))
        summary = edp.summary()
    assert set(delivered) <= all_made
    if edp.role is Role.LEARNER:
        assert len(delivered) == 30 * 16
    assert summary["rows_ingested"] >= 48
    if device_rows:  # the shard was mirrored on the device and batches drawn from it
        assert sum(v["device_rows_drawn"] for v in summary["learners"].values()) > 0


def delivered_rows(edp: ExperienceDataPlane) -> list[tuple[int, int, int]]:
    """Every row the buffers would deliver (exact stacks asserted), on every rank."""
    mine = []
    for s in edp.owned_shards():
        s.poll()
        _seqs, cols, _ = s.ring.read_committed()
        assert frame_stacks_of(cols).all(), "a held row's stacks differ"
        mine += keys(cols)
    return sorted(r for part in edp.roles.world.allgather(mine) for r in part)


@pytest.mark.mpi(min_size=2)
def test_checkpoint_restores_the_same_rows_and_reshards(shared_dir) -> None:
    """A lapped frame-once shard checkpointed (HDF5, frames once), restored into the same
    shard (the same rows, exact) and into two shards on a different layout (a reshard:
    each frame stored once again; rows exact, none twice); writing goes on after."""
    from conduit_hpc import checkpoint as ck
    from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint

    def cfg(shards: int, capacity: int):
        return make_config(spec=FRAME_SPEC, layout={"learners": 0, "buffers": 1},
                           storage={"capacity_rows": capacity, "shards_per_buffer": shards,
                                    "priority_exponent": 0.6})

    with ExperienceDataPlane(cfg(1, 192)) as edp:
        if edp.role is Role.ACTOR:
            produce(edp, 40, seed=edp.world_rank)
            edp.done()
        else:
            edp.serve()
        before = delivered_rows(edp)
        result = save_checkpoint(edp, shared_dir)
    c = ck.open_checkpoint(result.path)
    assert "obs__frame" in c.spec.names and "obs" not in c.spec.names  # frames once
    assert before and len(set(before)) == len(before)
    for shards, capacity, resharded in ((1, 192, False), (2, 300, True)):
        with ExperienceDataPlane(cfg(shards, capacity)) as edp2:
            res = restore_data_plane(edp2, result.path)
            assert res is not None and res.resharded is resharded
            # the checkpoint's slots that are transitions: the rows it delivered (the
            # resume message said only slots, as if each were a row)
            assert res.transitions == len(before) < res.rows + res.dropped
            after = delivered_rows(edp2)
            if not resharded:
                assert after == before
            else:
                assert set(after) <= set(before) and len(set(after)) == len(after)
                assert len(after) >= 0.9 * len(before)
            if edp2.role is Role.ACTOR:
                produce(edp2, 10, seed=50 + edp2.world_rank)
                edp2.done()
            else:
                edp2.serve()
            delivered_rows(edp2)  # still exact after more writes


@pytest.mark.mpi(min_size=2)
def test_a_checkpoint_of_other_stack_depths_is_refused_on_every_rank(shared_dir) -> None:
    """A checkpoint of obs and next_obs stacks of 4 frames into a job whose obs is a
    stack of 8 with no next stack (the same stored columns): refused on every rank,
    naming the field and both depths, never restored into stacks it does not hold; the
    newest-first search skips it without marking it damaged."""
    from conduit_hpc import CheckpointError
    from conduit_hpc import checkpoint as ck
    from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint

    def cfg(spec):
        return make_config(spec=spec, layout={"learners": 0, "buffers": 1},
                           storage={"capacity_rows": 96})

    with ExperienceDataPlane(cfg(FRAME_SPEC)) as edp:
        if edp.role is Role.ACTOR:
            produce(edp, 5, seed=edp.world_rank)
            edp.done()
        else:
            edp.serve()
        result = save_checkpoint(edp, shared_dir)
    deeper = {n: f for n, f in FRAME_SPEC.items() if n != "next_obs"}
    deeper["obs"] = dict(FRAME_SPEC["obs"], shape=[8, 6, 5])
    with ExperienceDataPlane(cfg(deeper)) as edp2:
        with pytest.raises(CheckpointError, match=r"spec\.obs as a stack of 4 frames with "
                                                  r"its next stack next_obs, this job "
                                                  r"declares 8 frames"):
            restore_data_plane(edp2, result.path)
        with pytest.raises(CheckpointError, match="no usable checkpoint"):
            restore_data_plane(edp2, "latest", roots=[result.path.parent])
        assert ck.damage_of(result.path) is None



@pytest.mark.mpi(min_size=2)
def test_a_restore_after_ingest_is_refused_on_every_rank(shared_dir) -> None:
    """restore_data_plane after rows were written: refused on every rank, naming the
    shard, the rows kept (before: it overwrote them, and the actors' frame writers kept
    references to slots the restore refilled: later rows delivered other frames)."""
    from conduit_hpc import CheckpointError
    from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint

    cfg = make_config(spec=FRAME_SPEC, layout={"learners": 0, "buffers": 1},
                      storage={"capacity_rows": 400})
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            edp.ingest(frame_rows(100, 1, 30))
        path = save_checkpoint(edp, shared_dir).path
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            edp.ingest(frame_rows(edp.world_rank, 0, 20))
        COMM.Barrier()
        with pytest.raises(CheckpointError, match=r"before any ingest.*shard\(s\) 0 \("):
            restore_data_plane(edp, path)
        actors = [r for r in range(COMM.size) if r != edp.roles.buffer_ranks[0]]
        assert delivered_rows(edp) == sorted((a, 0, t) for a in actors for t in range(20))
