"""Adaptive placement acting in a running job: the policy re-places shards mid-run while
actors ingest and the learner samples and updates priorities; afterwards every row is held
exactly once, at the priority the learner last gave it, and the learner's samples follow
the priorities."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import bounded_barrier
from mpi4py import MPI
from scipy.stats import chisquare

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.placement import Placement, plan_round_robin
from conduit_hpc.plane.control import C_ACTORS_DONE
from conduit_hpc.storage.migrate import held_slots
from conduit_hpc.testing import checked_batch, make_config, row_consistent

SHARD_ROWS = 16_384
INGEST = 8  # rows per ingest call
AFTER_MOVE_ROWS = 160  # rows each actor writes after the move is complete
BATCH = 64
PHASE_B = 220  # batches sampled without updates at the end
SKIP = 12  # of them, prepared before the last updates landed

# two emulated nodes; the link between them is slow, so the learner (node 0) waits for
# rows that live on node 1, and a plan with the hottest rows on node 0 is far better
CLUSTER = """name = "two-emulated-nodes"
[[nodes]]
name = "n0"
learners = 1
buffers = 1
buffer_host_bytes = "1 GB"
shm = { bandwidth_gbps = 8.0, latency_s = 1e-6 }
nic = { bandwidth_gbps = 0.0001, latency_s = 0.001 }
[[nodes]]
name = "n1"
learners = 0
buffers = 1
actors = 1
buffer_host_bytes = "1 GB"
shm = { bandwidth_gbps = 8.0, latency_s = 1e-6 }
nic = { bandwidth_gbps = 0.0001, latency_s = 0.001 }
"""


def base_priority(writer: np.ndarray, wseq: np.ndarray) -> np.ndarray:
    """Skewed: one row in ten is 50x hotter."""
    hot = (np.asarray(writer, np.int64) * 7 + np.asarray(wseq, np.int64)) % 10 == 0
    return np.where(hot, 50.0, 1.0)


def start_placement(cfg, size: int) -> Placement:
    """Round robin over the buffer ranks, but every actor writes the shard on node 1
    (buffers placed beside the actors): what the policy should undo."""
    nb = cfg.layout.buffers
    learners, buffers = (0,), tuple(range(1, 1 + nb))
    actors = tuple(range(1 + nb, size))
    rr = plan_round_robin(actor_ranks=actors, buffer_ranks=buffers, learner_ranks=learners,
                          capacity_rows=cfg.storage.capacity_rows)
    remote = nb - 1  # the last buffer rank is the first rank of node 1
    return Placement(shards=rr.shards, actor_shards=dict.fromkeys(actors, remote),
                     learner_shards=rr.learner_shards)


def config(size: int, cluster: str):
    nb = (size + 1) // 2  # buffer ranks 1 .. nb: the last one is node 1's first rank
    return make_config(
        run={"timeout_s": 60.0, "seed": 7},
        layout={"learners": 1, "buffers": nb, "emulate_nodes": 2},
        storage={"capacity_rows": SHARD_ROWS * nb, "priority_exponent": 1.0},
        scheduler={"mode": "edp", "batch_rows": BATCH, "prefetch_depth": 2,
                   "sampler": "prioritized", "min_fill_rows": 64, "samples_per_insert": 2.0,
                   "error_buffer": 64.0, "max_insert_batch": INGEST},
        placement={"adaptive": True, "cluster": cluster, "interval_supersteps": 5,
                   "min_gain": 0.0, "patience": 1, "cooldown_supersteps": 1_000_000,
                   "payback_supersteps": 1_000_000},
        checkpoint={"on_stop": False})


def run_actor(edp: ExperienceDataPlane) -> list[tuple[int, int]]:
    rank = edp.world_rank
    wseq, moved_at = 0, None
    deadline = time.monotonic() + 90.0
    while wseq < 4_800 and time.monotonic() < deadline:
        batch = checked_batch(rank, wseq, INGEST)
        edp.ingest(batch, priorities=base_priority(batch["writer"], batch["wseq"]))
        wseq += INGEST
        rep = edp.feature("replacement")
        assert rep is not None and rep.router is not None
        # the move is complete and this actor has seen the new routing
        if (moved_at is None and wseq % (10 * INGEST) == 0 and rep.router.version >= 1
                and rep.moves_done() >= 1):
            moved_at = wseq
        if moved_at is not None and wseq - moved_at >= AFTER_MOVE_ROWS:
            break
    edp.done()
    return [(rank, w) for w in range(wseq)]


def run_learner(edp: ExperienceDataPlane, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    n_actors = len(edp.roles.actor_ranks)
    rep = edp.feature("replacement")
    assert rep is not None
    remote = len(edp.roles.buffer_ranks) - 1  # the shard on node 1
    last: dict[tuple[int, int], float] = {}
    # Late updates, sent by the indices rows had on node 1 once they have moved (their
    # old owner must forward them): for the first batch's rows, which get no other
    # update; and for the second batch's, updated as usual meanwhile - where one of
    # those reached a row at its new place, it stands (it is for a later batch)
    late: list[tuple[np.ndarray, np.ndarray, list]] = []
    frozen: set[tuple[int, int]] = set()
    at_new_place: set[tuple[int, int]] = set()
    steps, moved_at, late_rows = 0, -1, 0
    superseded: set[tuple[int, int]] = set()
    while True:  # phase A: sample and update while the actors ingest
        b = edp.next_batch()
        cols = {k: v.numpy() for k, v in b.data.items()}
        assert row_consistent(cols).all(), "a torn row was delivered"
        keys = list(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True))
        p = base_priority(cols["writer"], cols["wseq"]) * rng.uniform(0.5, 2.0, len(b))
        if len(late) < 2:
            late.append((b.indices.copy(), p * 1.5, keys))
            frozen |= set(keys) if not late[1:] else set()
        keep = np.array([k not in frozen for k in keys])
        edp.update_priorities(b.indices[keep], p[keep])
        for (k, x, ok), sid in zip(zip(keys, p, keep, strict=True), b.indices[:, 0],
                                   strict=True):
            if ok:
                last[k] = float(x)
                if sid != remote:
                    at_new_place.add(k)
        steps += 1
        if steps % 10 == 0:
            done, moved = edp.learner.run_on_thread(
                lambda: (edp.control.read(C_ACTORS_DONE), rep.moves_done()),
                "the actors' done count")
            if moved and moved_at < 0:
                moved_at = steps
            if moved_at >= 0 and not late_rows and steps >= moved_at + 20:
                superseded = {k for _, _, ks in late[1:] for k in ks} & at_new_place
                for idx, lp, lkeys in late:
                    edp.update_priorities(idx, lp)
                    last.update((k, float(x)) for k, x in zip(lkeys, lp, strict=True)
                                if k not in at_new_place)
                    late_rows += len(lkeys)
            if done >= n_actors and late_rows:
                break
        assert steps < 20_000, "the actors never finished"
    drawn: Counter[tuple[int, int]] = Counter()
    per_shard: Counter[int] = Counter()
    for k in range(PHASE_B):  # phase B: sample only, against fixed priorities
        b = edp.next_batch()
        if k < SKIP:
            continue
        cols = {k2: v.numpy() for k2, v in b.data.items()}
        assert row_consistent(cols).all(), "a torn row was delivered"
        drawn.update(zip(cols["writer"].tolist(), cols["wseq"].tolist(), strict=True))
        per_shard.update(b.indices[:, 0].tolist())
    edp.done()
    return {"last": last, "drawn": drawn, "per_shard": per_shard, "phase_a": steps,
            "late_rows": late_rows, "superseded": len(superseded)}


def audit(edp: ExperienceDataPlane) -> dict:
    held: dict[tuple[int, int], tuple[int, float]] = {}
    torn = 0
    for s in edp.owned_shards():
        s.poll()
        slots, _ = held_slots(s.ring, s.index)
        rows, _ = s.ring.gather(slots)
        torn += int(np.count_nonzero(~row_consistent(rows)))
        for w, q, p in zip(rows["writer"], rows["wseq"], s.index.priority[slots],
                           strict=True):
            key = (int(w), int(q))
            assert key not in held, f"{key} held twice by shard {s.shard_id}"
            held[key] = (s.shard_id, float(p))
    return {"held": held, "torn": torn}


@pytest.mark.mpi(min_size=4)
def test_running_job_replaces_shards_exactly_once_and_samples_by_priority() -> None:
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    with shared_file(comm, CLUSTER) as cluster:
        cfg = config(size, cluster)
        run_and_check(cfg, size)


@contextmanager
def shared_file(comm: MPI.Intracomm, text: str) -> Iterator[str]:
    """A file rank 0 writes, its path on every rank (one node); removed at the end."""
    tmp = tempfile.mkdtemp(prefix="conduit-replace-") if comm.Get_rank() == 0 else None
    if tmp:
        (Path(tmp) / "cluster.toml").write_text(text)
    tmp = comm.bcast(tmp, root=0)
    try:
        yield str(Path(tmp) / "cluster.toml")
    finally:
        bounded_barrier(comm)  # not a Barrier: after a failure others may never come
        if comm.Get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)


def run_and_check(cfg, size: int) -> None:
    mine: dict = {}
    with ExperienceDataPlane(cfg, placement=start_placement(cfg, size)) as edp:
        if edp.role is Role.ACTOR:
            mine = {"written": run_actor(edp)}
        elif edp.role is Role.LEARNER:
            mine = run_learner(edp, seed=11)
        else:
            edp.serve()
            mine = audit(edp)
        summary = edp.summary()
        everything = edp.roles.world.allgather(mine)
        node_of = edp.roles.node_of
        buffers = edp.roles.buffer_ranks
    written = [k for d in everything for k in d.get("written", [])]
    held = {k: v for d in everything for k, v in d.get("held", {}).items()}
    learner = next(d for d in everything if "drawn" in d)
    # the policy moved, mid-run: actors wrote and the learner sampled before and after
    rep = summary["replacement"]
    history = rep[buffers[0]]["history"]
    moves = [h for h in history if h["action"] == "move"]
    assert len(moves) == 1, history
    mv = moves[0]
    assert mv["moved_rows"] > 0 and mv["planned_rows"] > 0
    assert 0 < mv["inserts_at_start"] < summary["rows_ingested"]
    assert mv["samples_at_start"] > 0
    assert mv["samples_at_end"] < BATCH * (learner["phase_a"] + PHASE_B)
    assert all(r.get("routing_version", 1) >= 1 for r in rep.values()), rep
    # the late updates for rows that had moved were forwarded to their new owner; those
    # for rows updated at their new place meanwhile gave way
    count = Counter()
    for r in rep.values():
        count.update(r.get("counters", {}))
    assert count["forwarded"] > 0 and learner["late_rows"] > 0, rep
    assert count["forward_superseded"] > 0 and learner["superseded"] > 0, rep
    # every row written is held exactly once, untorn, at the priority the learner last
    # gave it (late updates for moved rows were forwarded), or its initial one
    assert len(written) == len(set(written))
    assert sum(d.get("torn", 0) for d in everything) == 0
    assert set(held) == set(written), (len(held), len(written))
    last = learner["last"]
    for key, (_, p) in held.items():
        want = last.get(key, float(base_priority(np.array([key[0]]), np.array([key[1]]))[0]))
        assert p == pytest.approx(want), (key, p, want)
    # the hottest rows now live on the learner's node: most samples come from there
    local = {s for s, (r) in enumerate(buffers) if node_of[r] == node_of[0]}
    mass = Counter()
    for _key, (sid, p) in held.items():
        mass[sid] += p
    total_mass = sum(mass.values())
    per_shard = learner["per_shard"]
    n = sum(per_shard.values())
    assert n == BATCH * (PHASE_B - SKIP)
    assert sum(per_shard[s] for s in local) > 0.5 * n
    for sid, m in mass.items():  # shares of the samples follow the shards' masses
        exp = n * m / total_mass
        assert abs(per_shard[sid] - exp) <= 5 * np.sqrt(exp + 1) + 2, (sid, per_shard, mass)
    # and row by row: chi-square against the priorities held (bins of >= 20 expected)
    keys = sorted(held)
    p = np.array([held[k][1] for k in keys])
    expected = n * p / p.sum()
    observed = np.array([learner["drawn"].get(k, 0) for k in keys], np.float64)
    order = np.argsort(expected)
    e_sorted, o_sorted = expected[order], observed[order]
    cuts = np.flatnonzero(np.diff(np.floor(np.cumsum(e_sorted) / 20.0)) > 0) + 1
    e_bins = np.add.reduceat(e_sorted, np.r_[0, cuts])
    o_bins = np.add.reduceat(o_sorted, np.r_[0, cuts])
    assert len(e_bins) > 50
    stat = chisquare(o_bins, e_bins * o_bins.sum() / e_bins.sum())
    assert stat.pvalue > 1e-4, (stat, len(e_bins))


@pytest.mark.mpi(min_size=4)
def test_a_cluster_model_that_does_not_describe_the_job_is_refused_on_every_rank() -> None:
    comm = MPI.COMM_WORLD
    one_node = CLUSTER[:CLUSTER.index("[[nodes]]", CLUSTER.index("[[nodes]]") + 1)]
    with shared_file(comm, one_node) as cluster:
        cfg = config(comm.Get_size(), cluster)
        with pytest.raises(ConfigError, match="the job runs on 2 nodes but cluster"):
            ExperienceDataPlane(cfg, placement=start_placement(cfg, comm.Get_size()))


@pytest.mark.mpi(min_size=4)
def test_the_coordinator_keeps_the_latest_looks_and_counts_them_all(monkeypatch) -> None:
    # a look every interval_supersteps for the whole run: every look's record was kept
    # (and went into the job's summary), growing for as long as the job ran
    from conduit_hpc.features.replace import coordinator
    from conduit_hpc.placement import adaptive

    monkeypatch.setattr(coordinator, "HISTORY_KEEP", 5, raising=False)
    monkeypatch.setattr(adaptive, "HISTORY_KEEP", 5, raising=False)
    comm = MPI.COMM_WORLD
    with shared_file(comm, CLUSTER) as cluster:
        cfg = config(comm.Get_size(), cluster)
        cfg = make_config(**{**cfg.to_dict(), "placement": {
            **cfg.to_dict()["placement"], "interval_supersteps": 1, "min_gain": 0.99,
            "cooldown_supersteps": 1, "patience": 1000}})  # a look each superstep, no move
        with ExperienceDataPlane(cfg, placement=start_placement(cfg, comm.Get_size())) as edp:
            if edp.role is Role.ACTOR:
                wseq = 0
                while not edp.should_stop:
                    edp.ingest(checked_batch(edp.world_rank, wseq, INGEST))
                    wseq += INGEST
            elif edp.role is Role.LEARNER:
                for _ in range(150):
                    edp.next_batch()
            else:
                edp.serve()
            edp.done()
            rep = edp.summary()["replacement"][edp.roles.buffer_ranks[0]]
            feature = edp.feature("replacement")
            coord = None if feature is None else feature.coordinator
    if coord is not None:  # the coordinator's rank: the records themselves
        assert len(coord.history) == 5 and len(coord.policy.history) == 5
    assert rep["looks"] > 5 and len(rep["history"]) == 5, rep
    assert rep["history"][-1]["look"] == rep["looks"]
