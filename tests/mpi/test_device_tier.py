"""The ``learner_gpu`` tier in a running job (``plane/device_tier.py``; the CPU device
here, the same code as ``cuda:i``): a static plan over a cluster file whose learner nodes
have a GPU puts some rows in a ``learner_gpu`` shard, its learner mirrors that shard's ring
on its device, and batches draw across the device and host tiers.

* the executed plan has both tiers, and the device shard's ring is owned by a buffer rank
  on the learner's node;
* under concurrent actors that lap the rings several times, with priority updates, the
  device holds every live row of its ring exactly once - same slot, same generation,
  same bytes, same priority as the owner's index (updates are written back) - and
  nothing the ring has handed to a writer;
* sampling across tiers is exact: with writes stopped, each tier's share of many draws
  matches its share of the total mass (chi-square), and so does each row's count;
* rows of the device tier pass a numpy transform (they come to the host for it);
* a plan whose ``learner_gpu`` shard several learners read is refused on every rank.

Layouts as in ``test_plan_applied.py``: 3 ranks (one node), 4 ranks (two emulated
nodes), 6 ranks (two learners, one per emulated node, partitioned scope).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ConfigError, ExperienceDataPlane, Role
from conduit_hpc.plane.control import C_ACTORS_DONE
from conduit_hpc.testing import checked_batch, make_config, row_consistent
from conduit_hpc.wait import wait_until
from tests.mpi.tier_checks import draw_problems, masses, mirror_problems

COMM = MPI.COMM_WORLD

NODE = """
[[nodes]]
name = "n{i}"
gpus = {g}
learners = {l}
buffers = {b}
actors = {a}
learner_gpu_bytes = "{gpu}"
learner_host_bytes = "1 MB"
buffer_host_bytes = "{bh}"
gpu_host = {{ bandwidth_gbps = 25.0, latency_s = 1e-5 }}
shm = {{ bandwidth_gbps = 8.0, latency_s = 1.5e-6 }}
nic = {{ bandwidth_gbps = 1.0, latency_s = 5e-6 }}
"""

# world size -> (layout, scope, per-node (learners, buffers, actors))
LAYOUTS = {
    3: ({"learners": 1, "buffers": 1}, "global", [(1, 1, 1)]),
    4: ({"learners": 1, "buffers": 2, "emulate_nodes": 2}, "global", [(1, 1, 0), (0, 1, 1)]),
    6: ({"learners": 1, "buffers": 1, "per_node": True, "emulate_nodes": 2}, "partitioned",
        [(1, 1, 1), (1, 1, 1)]),
}
CAPACITY = 1024


def _layout():
    if COMM.size not in LAYOUTS:
        pytest.skip(f"no layout for {COMM.size} ranks (runs at {sorted(LAYOUTS)})")
    return LAYOUTS[COMM.size]


def _cluster(shared_dir, nodes, gpu: str, learner_buffer: str = "64 MB") -> str:
    text = 'name = "gpu-test"\n' + "".join(
        NODE.format(i=i, g=1 if lc else 0, l=lc, b=bc, a=ac, gpu=gpu if lc else "0",
                    bh=learner_buffer if lc else "64 MB")
        for i, (lc, bc, ac) in enumerate(nodes))
    path = shared_dir / f"cluster-gpu-{gpu.replace(' ', '')}-{learner_buffer[:-3]}.toml"
    if COMM.rank == 0:
        path.write_text(text)
    COMM.Barrier()
    return str(path)


def _config(shared_dir, *, mode: str = "sync", scope: str | None = None,
            gpu: str = "12 kB", tiers: tuple[str, ...] = ("learner_gpu", "buffer_host"),
            learner_buffer: str = "64 MB", placement: dict | None = None, **sched):
    layout, default_scope, nodes = _layout()
    return make_config(
        layout=layout, storage={"capacity_rows": CAPACITY, "priority_exponent": 0.7},
        placement={"planner": "static",
                   "cluster": _cluster(shared_dir, nodes, gpu, learner_buffer),
                   "tiers": list(tiers), "scope": scope or default_scope,
                   **(placement or {})},
        scheduler={"mode": mode, "batch_rows": 16, "min_fill_rows": 32, **sched},
        checkpoint={"on_stop": False})


def _verdict(ok: bool) -> bool:
    """Every rank's verdict (a rank that failed makes every rank fail)."""
    return bool(COMM.allreduce(int(ok), op=MPI.MIN))


def _actor(edp, rows: int) -> None:
    w = 0
    while w < rows and not edp.should_stop:
        edp.ingest(checked_batch(edp.world_rank, w, 8))
        w += 8


def _wait_actors_done(edp) -> None:
    n = len(edp.roles.writer_ranks)
    wait_until(lambda: edp.control.read(C_ACTORS_DONE) >= n, timeout_s=60,
               what="the actors to finish")


def _wait_bands_given_back(edp) -> None:
    """Until every host shard's owner has given its guard band back (it does once the
    writers have been idle ``idle_s``): rows that became drawable in the middle of the
    counted draws were drawn less than their mass says (make test failed the chi-square
    once, p = 4e-5, at 3 ranks). Device mirrors keep their band (not waited for)."""
    d = edp.learner.mode.d

    def given_back() -> bool:
        return all(ring.read_stats()[0] >= min(ring.commit_cursor(), ring.capacity)
                   for sid, ring in d.rings.items() if sid not in d.device_shards)

    wait_until(lambda: edp.learner.run_on_thread(given_back, "reading the shards' stats"),
               timeout_s=60, what="the owners to give their guard bands back")


@pytest.mark.mpi(min_size=3)
def test_the_device_mirrors_its_ring_exactly_once_under_concurrent_writers(shared_dir):
    # the rate limiter keeps the actors within 64 rows of what the learner draws, so the
    # mirror (synced at every draw) sees the ring lapped whatever the machine's speed:
    # unpaced, a GPU node's actors finished before the learner's first syncs (the first
    # run on a GPU: 25 rows in, capacity 47)
    cfg = _config(shared_dir, samples_per_insert=1.0, error_buffer=64.0, max_insert_batch=8)
    problems: list[str] = []
    with ExperienceDataPlane(cfg) as edp:
        tiers = {s.tier for s in edp.placement.shards}
        assert tiers == {"learner_gpu", "buffer_host"}, edp.placement
        roles = edp.roles
        for s in edp.placement.shards:
            if s.tier == "learner_gpu":
                readers = [r for r, got in edp.placement.learner_shards.items()
                           if s.shard_id in got]
                assert len(readers) == 1 and s.owner_rank in roles.buffer_ranks
                assert roles.node_of[s.owner_rank] == roles.node_of[readers[0]]
        if edp.role is Role.ACTOR:
            _actor(edp, 6 * CAPACITY)  # laps every ring several times
        elif edp.role is Role.LEARNER:
            rng = np.random.default_rng(edp.world_rank)
            d = edp.learner.mode.d
            assert d.device_shards, "this learner reads no learner_gpu shard"
            tiers_seen = set()
            steps = 0
            while steps < 40 or edp.control.read(C_ACTORS_DONE) < len(roles.writer_ranks):
                b = edp.next_batch()
                cols = {k: v.cpu().numpy() for k, v in b.data.items()}
                if not row_consistent(cols).all():
                    problems.append(f"torn rows in batch {steps}")
                tiers_seen |= set(np.asarray(b.indices)[:, 0].tolist())
                edp.update_priorities(b.indices, rng.uniform(0.1, 5.0, len(b)))
                steps += 1
                assert steps < 20000, "the actors never finished"
            _wait_actors_done(edp)
            assert set(d.device_shards) <= tiers_seen, "no row was drawn from the device"
            d.fence()  # the owners committed everything and applied every write-back
            problems += mirror_problems(d)  # exactly once, bytes and masses equal
            for sid, dev in d.device_shards.items():
                if dev.rows_in <= dev.capacity:
                    problems.append(f"shard {sid}: the ring was not lapped ({dev.rows_in} "
                                    f"rows in, capacity {dev.capacity})")
        else:
            edp.serve()
        edp.done()
    assert _verdict(not problems), problems


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["sync", "edp"])
def test_sampling_across_tiers_is_exact(shared_dir, mode):
    """Writes stop; priorities are set to known values; then many draws without
    updates. Each row's count and each tier's share of the draws match ``mass /
    total`` over every shard the learner reads (chi-square, p > 1e-4)."""
    cfg = _config(shared_dir, mode=mode, prefetch_depth=1)
    verdict: list[str] = []
    with ExperienceDataPlane(cfg) as edp:
        if edp.role is Role.ACTOR:
            _actor(edp, 3 * CAPACITY)
        elif edp.role is Role.LEARNER:
            rng = np.random.default_rng(7)
            d = edp.learner.mode.d
            _wait_actors_done(edp)
            for _ in range(30):  # give drawn rows varied priorities
                b = edp.next_batch()
                edp.update_priorities(b.indices, rng.uniform(0.2, 4.0, len(b)))
            _wait_bands_given_back(edp)  # every row held is drawable before the count
            edp.learner.run_on_thread(d.fence, "a fence")
            counts: dict[tuple[int, int, int], int] = {}
            for _ in range(600):
                b = edp.next_batch()
                for key in map(tuple, np.asarray(b.indices).tolist()):
                    counts[key] = counts.get(key, 0) + 1
            # expected: each row's mass (device shards from the device, others from the
            # owner's index, which holds the same values after the fence); shards on
            # another node are left out (the shares are of the draws that landed here)
            mass = edp.learner.run_on_thread(lambda: masses(d), "reading the masses")
            verdict += draw_problems(counts, mass, set(d.device_shards))
            if not any(counts.get(k) for k in mass if k[0] in d.device_shards):
                verdict.append("nothing drawn from a device shard")
        else:
            edp.serve()
        edp.done()
    assert _verdict(not verdict), verdict


@pytest.mark.mpi(min_size=3)
def test_device_rows_pass_a_numpy_transform(shared_dir):
    bad: list[str] = []

    def tag(batch):  # sees the device rows on the host, in place, before the copy
        if not row_consistent(batch).all():
            bad.append("the transform saw rows that are not the drawn ones")
        out = dict(batch)
        out["payload"] = batch["payload"] + 1
        out["check"] = batch["check"]
        return out

    cfg = _config(shared_dir, mode="edp")
    with ExperienceDataPlane(cfg, transform=tag) as edp:
        if edp.role is Role.ACTOR:
            _actor(edp, 1 << 30)
        elif edp.role is Role.LEARNER:
            seen = set()
            for _ in range(60):
                b = edp.next_batch()
                cols = {k: v.cpu().numpy() for k, v in b.data.items()}
                cols["payload"] = cols["payload"] - 1
                if not row_consistent(cols).all():
                    bad.append("torn or wrong rows")
                seen |= set(np.asarray(b.indices)[:, 0].tolist())
            if not set(edp.learner.mode.d.device_shards) & seen:
                bad.append("no device row drawn")
        else:
            edp.serve()
        edp.done()
    assert _verdict(not bad), bad


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["sync", "edp"])
def test_every_row_on_the_device(shared_dir, mode):
    """``tiers = ["learner_gpu"]`` and room for the whole replay: the minimum fill and
    the rate limiter count the device shard's rows, and every batch comes from it."""
    cfg = _config(shared_dir, mode=mode, gpu="64 MB", tiers=("learner_gpu",))
    bad: list[str] = []
    with ExperienceDataPlane(cfg) as edp:
        if {s.tier for s in edp.placement.shards} != {"learner_gpu"}:
            bad.append(f"tiers {[s.tier for s in edp.placement.shards]}")
        if edp.role is Role.ACTOR:
            _actor(edp, 2 * CAPACITY)  # finishes: the learner then runs on what is held
        elif edp.role is Role.LEARNER:
            d = edp.learner.mode.d
            for _ in range(40):
                b = edp.next_batch()
                if not set(np.asarray(b.indices)[:, 0].tolist()) <= set(d.device_shards):
                    bad.append("a row from outside the device tier")
                if not row_consistent({k: v.cpu().numpy() for k, v in b.data.items()}).all():
                    bad.append("torn rows")
                edp.update_priorities(b.indices, np.full(len(b), 2.0))
        else:
            edp.serve()
        edp.done()
    assert _verdict(not bad), bad


@pytest.mark.mpi(min_size=6)
def test_a_learner_gpu_shard_read_by_several_learners_is_refused_everywhere(shared_dir):
    if COMM.size != 6:
        pytest.skip("two learners: the 6-rank layout")
    cfg = _config(shared_dir, scope="global")
    with pytest.raises(ConfigError, match="learner_gpu shard") as err:
        ExperienceDataPlane(cfg)
    assert err.value.key == "placement.scope"


@pytest.mark.mpi(min_size=4)
def test_adaptive_re_placement_of_a_learner_gpu_shard_is_refused_everywhere(shared_dir):
    """A move hides rows in the owner's index only: the learner's device mirror, which
    drops rows in the ring's FIFO order, would keep them drawable beside their new place.
    The 4-rank plan (no buffer memory on the learner's node but the device's shard: one
    shard per buffer rank, which adaptive placement needs) is refused before any window."""
    if COMM.size != 4:
        pytest.skip("one shard per buffer rank: the 4-rank layout")
    cfg = _config(shared_dir, mode="edp", learner_buffer="1 kB",
                  placement={"adaptive": True, "interval_supersteps": 5, "min_gain": 0.0,
                             "patience": 1})
    with pytest.raises(ConfigError, match="learner_gpu tier") as err:
        ExperienceDataPlane(cfg)
    assert err.value.key == "placement.adaptive"
    assert "placement.tiers without 'learner_gpu'" in str(err.value)
