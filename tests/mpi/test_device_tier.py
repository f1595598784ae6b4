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
from scipy.stats import chi2

from conduit_hpc import ConfigError, ExperienceDataPlane, Role
from conduit_hpc.plane.control import C_ACTORS_DONE
from conduit_hpc.testing import checked_batch, make_config, row_consistent
from conduit_hpc.wait import wait_until

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
buffer_host_bytes = "64 MB"
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


def _cluster(shared_dir, nodes, gpu: str) -> str:
    text = 'name = "gpu-test"\n' + "".join(
        NODE.format(i=i, g=1 if lc else 0, l=lc, b=bc, a=ac, gpu=gpu if lc else "0")
        for i, (lc, bc, ac) in enumerate(nodes))
    path = shared_dir / f"cluster-gpu-{gpu.replace(' ', '')}.toml"
    if COMM.rank == 0:
        path.write_text(text)
    COMM.Barrier()
    return str(path)


def _config(shared_dir, *, mode: str = "sync", scope: str | None = None,
            gpu: str = "12 kB", tiers: tuple[str, ...] = ("learner_gpu", "buffer_host"),
            **sched):
    layout, default_scope, nodes = _layout()
    return make_config(
        layout=layout, storage={"capacity_rows": CAPACITY, "priority_exponent": 0.7},
        placement={"planner": "static", "cluster": _cluster(shared_dir, nodes, gpu),
                   "tiers": list(tiers), "scope": scope or default_scope},
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


@pytest.mark.mpi(min_size=3)
def test_the_device_mirrors_its_ring_exactly_once_under_concurrent_writers(shared_dir):
    cfg = _config(shared_dir)
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
            d = edp.learner.d
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
            for sid, dev in d.device_shards.items():
                dev.sync()
                ring, cap = dev.ring, dev.capacity
                slots, ids = dev.audit()
                # exactly once: one row per slot, ids distinct
                if len(set(ids.tolist())) != len(ids):
                    problems.append(f"shard {sid}: an id held twice")
                # every device row is the ring's row in that slot, intact, bytes equal
                if (ring.stamps_of(slots) != ids).any():
                    problems.append(f"shard {sid}: device rows the ring no longer holds")
                gate = min(ring.reserve_cursor(), ring.free_cursor() or 1 << 62)
                if (ids - 1 + cap < gate).any():
                    problems.append(f"shard {sid}: rows handed to a writer still held")
                host, _ = ring.gather(slots)
                for name, col in dev.store.gather(slots).items():
                    dt = host[name].dtype
                    if not np.array_equal(col.cpu().numpy().view(dt), host[name]):
                        problems.append(f"shard {sid}: column {name} differs")
                # every row the owner's index holds is on the device, same priority
                gens, mass = ring.leaves(np.arange(cap))
                live = np.flatnonzero(gens > 0)
                on_dev = dict(zip(slots.tolist(), ids.tolist(), strict=True))
                if any(on_dev.get(int(s)) != int(gens[s]) for s in live):
                    problems.append(f"shard {sid}: an indexed row is not on the device")
                dmass = dev.store.masses(live).cpu().numpy()
                if not np.allclose(dmass, mass[live], rtol=1e-9):
                    problems.append(f"shard {sid}: priorities differ from the owner's")
                if dev.rows_in - dev.evicted != len(ids) or dev.rows_in <= cap:
                    problems.append(f"shard {sid}: {dev.rows_in} in, {dev.evicted} evicted, "
                                    f"{len(ids)} held (cap {cap})")
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
            d = edp.learner.d
            _wait_actors_done(edp)
            for _ in range(30):  # give drawn rows varied priorities
                b = edp.next_batch()
                edp.update_priorities(b.indices, rng.uniform(0.2, 4.0, len(b)))
            edp.learner.run_on_thread(d.fence, "a fence")
            counts: dict[tuple[int, int, int], int] = {}
            draws = 0
            for _ in range(600):
                b = edp.next_batch()
                for s, slot, g in np.asarray(b.indices).tolist():
                    counts[(s, slot, g)] = counts.get((s, slot, g), 0) + 1
                draws += len(b)
            # expected: each row's mass (device shards from the device, others from the
            # owner's index, which holds the same values after the fence)
            mass: dict[tuple[int, int, int], float] = {}

            def collect() -> None:
                for sid, ring in d.rings.items():
                    dev = d.device_shards.get(sid)
                    if dev is not None:
                        dev.sync()
                        slots, ids = dev.audit()
                        m = dev.store.masses(slots).cpu().numpy()
                    elif ring.views is not None:
                        gens, lm = ring.leaves(np.arange(ring.capacity))
                        slots = np.flatnonzero(gens > 0)
                        ids, m = gens[slots], lm[slots]
                    else:
                        continue  # a remote shard: only the tier shares are checked
                    for s, i, x in zip(slots.tolist(), ids.tolist(), m.tolist(), strict=True):
                        mass[(sid, s, i)] = x

            edp.learner.run_on_thread(collect, "reading the masses")
            local = {k[0] for k in mass}
            drawn_local = sum(c for k, c in counts.items() if k[0] in local)
            total = sum(mass.values())
            # every drawn row of a readable shard is a held row
            stray = [k for k in counts if k[0] in local and k not in mass]
            if stray:
                verdict.append(f"drawn rows not held: {stray[:5]}")
            # tiers: device rows' share of draws against their share of the mass
            dev_ids = set(d.device_shards)
            for name, keys in (("device", [k for k in mass if k[0] in dev_ids]),
                               ("host", [k for k in mass if k[0] not in dev_ids])):
                p = sum(mass[k] for k in keys) / total
                got = sum(counts.get(k, 0) for k in keys)
                exp = p * drawn_local
                sd = max(np.sqrt(drawn_local * p * (1 - p)), 1.0)
                if abs(got - exp) > 5 * sd:
                    verdict.append(f"{name} tier: {got} draws, expected {exp:.0f} ± {sd:.0f}")
            # rows: chi-square over bins of about equal expected counts
            keys = sorted(mass, key=lambda k: mass[k])
            exp_all = np.array([mass[k] / total * drawn_local for k in keys])
            got_all = np.array([counts.get(k, 0) for k in keys], float)
            edges = np.searchsorted(np.cumsum(exp_all), np.linspace(0, exp_all.sum(), 21)[1:-1])
            e = np.array([x.sum() for x in np.split(exp_all, edges)])
            o = np.array([x.sum() for x in np.split(got_all, edges)])
            stat = float(((o - e) ** 2 / e).sum())
            p_value = float(chi2.sf(stat, len(e) - 1))
            if p_value < 1e-4:
                verdict.append(f"chi-square p = {p_value:.2g} (stat {stat:.1f})")
            if not d.device_shards or not drawn_local:
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
            if not set(edp.learner.d.device_shards) & seen:
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
            d = edp.learner.d
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
