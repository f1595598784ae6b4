"""The long-haul deployment end to end at a tight link budget, in both placements.

World rank 0 is the learner, 1 the data-centre buffer, 2 the edge buffer, the rest are
actors at the edge; every channel message between the sides crosses the emulated link.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import CheckpointError, ExperienceDataPlane, Role
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.features.longhaul import CLOUD_SHARD, EDGE_SHARD
from conduit_hpc.protocol.forward import FORWARD_HEAD
from conduit_hpc.testing import checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
RATE = 60_000.0  # bytes/s per direction: far less than the actors produce
LATENCY = 0.004


def config(mode: str, run: dict | None = None, **longhaul):
    return make_config(
        run=run or {},
        layout={"learners": 1, "buffers": 2},
        storage={"capacity_rows": 2048, "priority_exponent": 1.0},
        scheduler={"mode": "edp", "fetch": "owner", "batch_rows": 16, "prefetch_depth": 2,
                   "min_fill_rows": 64},
        longhaul={"mode": mode, "bandwidth_gbps": RATE / 1e9, "latency_s": LATENCY,
                  "queue_rows": 256, "forward_rows": 32, "publish_every_s": 0.005,
                  **longhaul})


def actor_ingest(edp, rows=16, max_batches=100_000):
    """Checked rows with priority = 1 + wseq % 7 until the learner stops."""
    wseq = 0
    for _ in range(max_batches):
        if edp.should_stop:
            break
        edp.ingest(checked_batch(edp.world_rank, wseq, rows),
                   priorities=1.0 + (np.arange(wseq, wseq + rows) % 7))
        wseq += rows
        time.sleep(0.0005)  # leave the 2 cores some room; still far above the link
    return wseq


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("compression", ["none", "zlib"])
def test_forward_drops_exactly_what_the_link_could_not_carry(compression: str) -> None:
    cfg = config("forward", compression=compression)
    t0 = time.monotonic()
    t_span = 0.0
    with ExperienceDataPlane(cfg) as edp:
        row_bytes = edp.spec.row_bytes
        n_actors = len(edp.roles.actor_ranks)
        assert edp.placement.learner_shards == {0: (CLOUD_SHARD,)}
        assert set(edp.placement.actor_shards.values()) == {EDGE_SHARD}
        cloud_rows = None
        if edp.role is Role.ACTOR:
            actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            steps = 0
            # at least 30 supersteps, and on until the edge had to drop rows
            while steps < 30 or edp.feature("longhaul").snapshot().dropped == 0:
                b = edp.next_batch()
                cols = {k: v.numpy() for k, v in b.data.items()}
                assert row_consistent(cols).all(), "a torn row reached the learner"
                assert (b.indices[:, 0] == CLOUD_SHARD).all()
                edp.update_priorities(b.indices, np.ones(len(b)))
                steps += 1
                assert steps < 20_000
        else:
            edp.serve()
            t_span = time.monotonic() - t0
            if edp.world_rank == 1:  # the data-centre replay: what crossed, in order
                (shard,) = edp.owned_shards()
                _, cols, prio = shard.ring.read_committed()
                cloud_rows = (cols["writer"], cols["wseq"], prio, row_consistent(cols).all())
        edp.done()
        summary = edp.summary()
        spans = edp.roles.world.allgather(t_span)
        cloud_rows = next(c for c in edp.roles.world.allgather(cloud_rows) if c is not None)
    lh = summary["longhaul"]
    # every row committed at the edge was forwarded, dropped or still queued at the end
    assert lh["edge_rows_committed"] == (lh["rows_forwarded"] + lh["rows_dropped"]
                                         + lh["rows_unsent"])
    assert lh["rows_dropped"] > 0, lh  # the link carries less than the actors produce
    # what was forwarded arrived, every byte of it, and nothing else crossed that way
    assert lh["rows_received"] == lh["rows_forwarded"] == lh["rows_crossed"] > 0
    assert lh["e2c_received_bytes"] == lh["e2c_bytes"]
    forward_messages = lh["e2c_messages"] - n_actors  # actors' zero-byte DONE messages
    nominal = (lh["rows_forwarded"] * (row_bytes + 8)
               + FORWARD_HEAD * (forward_messages - 1))  # the end marker is not counted
    assert lh["forwarded_nominal_bytes"] == nominal
    if compression == "none":
        assert lh["e2c_bytes"] == nominal + FORWARD_HEAD
    else:  # the link carried (and was charged with) the compressed bytes
        assert lh["e2c_bytes"] < 0.9 * (nominal + FORWARD_HEAD), lh
    # pacing: bytes reached the data centre no faster than the link's rate since the
    # link was set up (the bucket starts empty with burst_bytes = 0)
    assert lh["e2c_bytes"] <= RATE * spans[2]
    # the priorities that crossed are the actors' (1 .. 7), carried with the rows
    assert 1.0 <= lh["priority_mean_crossed"] <= 7.0
    writer, wseq, prio, intact = cloud_rows
    assert intact
    np.testing.assert_array_equal(prio, 1.0 + wseq % 7)
    # FIFO: each actor's rows reach the data centre in the order it wrote them
    for w in np.unique(writer):
        assert (np.diff(wseq[writer == w]) > 0).all()
    assert len(writer) == min(lh["rows_received"], cfg.storage.capacity_rows)


@pytest.mark.mpi(min_size=4)
def test_edge_replay_priority_updates_cross_back_to_the_right_rows() -> None:
    cfg = config("edge_replay")
    depth = cfg.scheduler.prefetch_depth
    with ExperienceDataPlane(cfg) as edp:
        assert edp.placement.learner_shards == {0: (EDGE_SHARD,)}
        favoured, delivered = None, 0
        if edp.role is Role.ACTOR:
            # a fixed set of rows, then stop: nothing is overwritten afterwards
            n_actors = len(edp.roles.actor_ranks)
            for i in range(128 // 16 // n_actors + 1):
                edp.ingest(checked_batch(edp.world_rank, 16 * i, 16),
                           priorities=np.full(16, 2.0))
        elif edp.role is Role.LEARNER:
            b = edp.next_batch()
            keep = tuple(b.indices[0].tolist())
            for s in range(12):
                if s:
                    b = edp.next_batch()
                assert b.staleness <= depth
                assert (b.indices[:, 0] == EDGE_SHARD).all()
                assert row_consistent({k: v.numpy() for k, v in b.data.items()}).all()
                delivered += len(b)
                edp.update_priorities(b.indices, np.full(len(b), 0.5))
                edp.update_priorities(np.array([keep]), [5.0])
            favoured = keep
        else:
            edp.serve()
        edp.done()
        summary = edp.summary()
        favoured = next(f for f in edp.roles.world.allgather(favoured) if f is not None)
        delivered = max(edp.roles.world.allgather(delivered))
        if edp.world_rank == 2:  # the edge buffer holds the replay and its priorities
            (shard,) = edp.owned_shards()
            _sid, slot, gen = favoured
            assert shard.index.gens[slot] == gen
            assert shard.index.priority[slot] == 5.0  # crossed back to that very row
            assert shard.index.applied_updates >= 12 * 17
            held = shard.index.priority[shard.index.gens > 0]
            assert set(np.unique(held)) <= {0.5, 2.0, 5.0}
        if edp.world_rank == 1:
            assert not edp.owned_shards()  # nothing lives in the data centre
    lh = summary["longhaul"]
    # only sampled batches crossed: the ones delivered and at most `depth` prefetched
    assert delivered <= lh["rows_crossed"] <= delivered + depth * 16
    assert lh["rows_forwarded"] == lh["rows_dropped"] == lh["rows_received"] == 0
    # bytes: both directions were used and arrived in full
    assert lh["e2c_bytes"] == lh["e2c_received_bytes"] > 0
    assert lh["c2e_bytes"] == lh["c2e_received_bytes"] > 0
    # crossing priorities were the actors' 2.0, the learner's 0.5 or the favoured 5.0
    assert 0.5 <= lh["priority_mean_crossed"] <= 5.0


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("mode", ["forward", "edge_replay"])
def test_no_rank_is_left_waiting_when_the_job_ends(mode: str) -> None:
    # a long latency relative to the job: the last messages are still held by the link
    # when ranks finish; every rank must still get past done(), summary() and close()
    cfg = config(mode, latency_s=0.05)
    t0 = time.monotonic()
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            for _ in range(5):
                b = edp.next_batch()
                edp.update_priorities(b.indices, np.ones(len(b)))
        else:
            edp.serve()
        edp.done()
        held_after_done = edp.feature("longhaul").link.held
        summary = edp.summary()
    took = COMM.allgather(time.monotonic() - t0)
    assert held_after_done == 0  # done()/serve() released everything for the link
    assert summary["longhaul"]["e2c_received_bytes"] == summary["longhaul"]["e2c_bytes"]
    assert max(took) < cfg.run.timeout_s


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("mode", ["forward", "edge_replay"])
def test_a_checkpoint_in_flight_at_the_end_completes_across_the_link(shared_dir,
                                                                      mode: str) -> None:
    """A checkpoint still being cut when the job ends: the edge buffer's part crosses the
    link to the leader in the data centre. Before: ``CheckpointAgent.finish`` entered its
    barrier with that part still held for the link, so the leader waited ``run.timeout_s``
    for it, dropped the checkpoint, and the ranks' next collective failed."""
    # the part is held for the link for the latency; the leader waits run.timeout_s
    cfg = config(mode, run={"timeout_s": 20.0}, latency_s=0.5)
    with ExperienceDataPlane(cfg) as edp:
        agent = CheckpointAgent(edp, shared_dir, keep=0)
        leader = edp.roles.buffer_ranks[0]
        assert edp.feature("longhaul").topology.side(leader) == "cloud"
        if edp.role is Role.ACTOR:
            actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            for _ in range(3):
                b = edp.next_batch()
                edp.update_priorities(b.indices, np.ones(len(b)))
            agent.request()
            end = time.monotonic() + 60
            while not list(shared_dir.glob(ck.TMP_PREFIX + "ckpt-*")):
                assert time.monotonic() < end, "the leader never started the checkpoint"
                time.sleep(0.005)
        else:
            edp.serve()
        edp.done()
        agent.finish()
        outcome = COMM.allgather((list(agent.completed), list(agent.failed)))
        edp.roles.world.Barrier()  # the next collective: every rank reaches it
    completed, failed = outcome[leader]
    assert failed == [] and len(completed) == 1, outcome[leader]
    c = ck.open_checkpoint(shared_dir / "ckpt-000001", spec=edp.spec)
    c.verify()
    assert {1, 2} <= set(c.counters)  # both buffers' parts, the edge one across the link
    assert c.shards[EDGE_SHARD].rows > 0


def cloud_replay(edp) -> tuple | None:
    """The data-centre replay's rows on every rank: ((writer, wseq) ..., priorities)."""
    out = None
    if edp.world_rank == 1:
        (shard,) = edp.owned_shards()
        shard.poll()
        seqs, cols, _ = shard.ring.read_committed()
        out = (list(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True)),
               shard.index.priority[seqs % shard.ring.capacity].tolist())
    return next(c for c in edp.roles.world.allgather(out) if c is not None)


@pytest.mark.mpi(min_size=4)
def test_a_resumed_forward_run_sends_no_restored_row_twice(shared_dir) -> None:
    """Resuming ``forward`` from a checkpoint: the rows restored into the edge's FIFO
    are the earlier run's (forwarded - the cloud replay restored them too -, dropped or
    unsent there); none is sent again nor counted again, and the cloud replay comes back
    row for row with its priorities. Before: the forwarder started at seq 0, sent the
    newest ``queue_rows`` restored rows a second time (duplicates in the replay) and
    counted every other restored row as dropped. A forward checkpoint is refused, on
    every rank, by a job of another shard layout (it would hold forwarded rows twice)."""
    cfg = config("forward", run={"timeout_s": 30.0})
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            actor_ingest(edp)
        elif edp.role is Role.LEARNER:
            while edp.feature("longhaul").snapshot().dropped == 0:  # the FIFO is full
                edp.next_batch()
        else:
            edp.serve()
        edp.done()
        saved = cloud_replay(edp)
        save_checkpoint(edp, shared_dir, keep=0)
    assert len(saved[0]) == len(set(saved[0])) > 0
    with ExperienceDataPlane(cfg) as edp:
        res = restore_data_plane(edp, "latest", roots=[shared_dir])
        assert res is not None and not res.resharded
        if edp.serves:
            edp.serve()
        edp.done()  # nothing new is ingested: nothing may cross
        restored = cloud_replay(edp)
        lh = edp.summary()["longhaul"]
    assert restored == saved  # the same rows, in the same order, with their priorities
    assert lh["rows_forwarded"] == lh["rows_dropped"] == lh["rows_unsent"] == 0, lh
    assert lh["edge_rows_committed"] == 0  # this run's rows
    elsewhere = config("edge_replay", run={"timeout_s": 30.0})
    with ExperienceDataPlane(elsewhere) as edp:
        with pytest.raises(CheckpointError, match=r"longhaul.mode = 'forward' \(shards of "
                                                  r"\[2048, 2048\].*'edge_replay' and shards "
                                                  r"of \[2048\]"):
            restore_data_plane(edp, ck.list_checkpoints(shared_dir)[-1])
        assert ck.damage_of(ck.list_checkpoints(shared_dir)[-1]) is None
        edp.done()
        if edp.serves:
            edp.serve()
