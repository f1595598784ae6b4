"""Re-placing a running job on the shards it has: job placement, plans on it, which rows
move where, heat from owners' reports (plain numpy; no MPI)."""

from __future__ import annotations

import numpy as np
import pytest

from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.adaptive import (
    AdaptiveKnobs,
    AdaptivePolicy,
    Telemetry,
    heat_bins,
    predict_placement,
)
from conduit_hpc.placement.cluster import ClusterModel, Roster
from conduit_hpc.placement.inplace import (
    HeldSample,
    heat_of,
    job_cluster,
    job_placement,
    moves_by_source,
    on_job_shards,
    plan_in_place,
    planned_rows,
    rows_moving,
)
from conduit_hpc.placement.model import Workload
from conduit_hpc.placement.placement import Placement, ShardPlacement, plan_round_robin
from conduit_hpc.placement.static import plan_static

LINK = {"bandwidth_gbps": 8.0, "latency_s": 1e-6}


def two_nodes(nic_gbps: float = 0.5) -> ClusterModel:
    nic = {"bandwidth_gbps": nic_gbps, "latency_s": 1e-4}
    return ClusterModel.from_dict({"name": "two", "nodes": [
        {"name": "a", "learners": 1, "buffers": 2, "buffer_host_bytes": "1 GB", "shm": LINK,
         "nic": nic},
        {"name": "b", "learners": 0, "buffers": 1, "actors": 2, "buffer_host_bytes": "1 GB",
         "shm": LINK, "nic": nic}]})


# world ranks: 0 learner (a), 1 2 buffers (a), 3 buffer (b), 4 5 actors (b)
NODE_OF = (0, 0, 0, 1, 1, 1)


def roster(cluster: ClusterModel) -> Roster:
    return Roster.from_ranks(cluster, NODE_OF, (0,), (1, 2, 3), (4, 5))


def start(cluster: ClusterModel, rows: int = 3000) -> Placement:
    rr = plan_round_robin(actor_ranks=(4, 5), buffer_ranks=(1, 2, 3), learner_ranks=(0,),
                          capacity_rows=rows)
    remote = Placement(shards=rr.shards, actor_shards={4: 2, 5: 2},
                       learner_shards=rr.learner_shards)
    return job_placement(remote, cluster, roster(cluster))


WORK = Workload(capacity_rows=2997, row_bytes=1000, batch_rows=64, update_rate_hz=200,
                actor_rows_per_s=100, compute_s=1e-4, sampling="prioritized",
                scope="global", tiers=("buffer_host",))


def test_job_placement_names_each_shard_by_its_owners_location() -> None:
    c = two_nodes()
    job = start(c)
    assert [s.location for s in job.shards] == ["a.buf0", "a.buf1", "b.buf0"]
    assert {s.tier for s in job.shards} == {"buffer_host"}
    assert job.learner_shards == {0: (0, 1, 2)}
    assert job.actor_shards == {4: 2, 5: 2}


def test_job_placement_needs_one_shard_per_buffer_rank() -> None:
    c = two_nodes()
    rr = plan_round_robin(actor_ranks=(4, 5), buffer_ranks=(1, 2, 3), learner_ranks=(0,),
                          capacity_rows=600, shards_per_buffer=2)
    with pytest.raises(ConfigError, match="exactly one shard per buffer rank"):
        job_placement(rr, c, roster(c))
    learner_owned = Placement(shards=(ShardPlacement(0, 0, "learner_host", 10),),
                              actor_shards={4: 0}, learner_shards={0: (0,)})
    with pytest.raises(ConfigError, match="world rank 0, which is not a buffer rank"):
        job_placement(learner_owned, c, roster(c))


def test_plans_on_the_job_cluster_fit_the_rings_the_job_has() -> None:
    rng = np.random.default_rng(3)
    c = two_nodes()
    for _ in range(20):
        a, b = (int(x) for x in rng.integers(200, 5000, 2))
        caps = np.array([a, a, b])  # the model has one buffer capacity per node
        rr = plan_round_robin(actor_ranks=(4, 5), buffer_ranks=(1, 2, 3),
                              learner_ranks=(0,), capacity_rows=int(caps.sum()))
        job0 = Placement(shards=tuple(
            ShardPlacement(i, 1 + i, "buffer_host", int(caps[i])) for i in range(3)),
            actor_shards={4: 2, 5: 2}, learner_shards=rr.learner_shards)
        job = job_placement(job0, c, roster(c))
        w = Workload(capacity_rows=planned_rows(job), row_bytes=int(rng.integers(50, 5000)),
                     batch_rows=64, sampling="prioritized", scope="global",
                     tiers=("buffer_host",), heat=((0.1, 0.8), (0.9, 0.2)))
        jc = job_cluster(c, roster(c), job, w)
        plan = plan_static(jc, w, roster=roster(c))
        on = on_job_shards(plan, job)
        # every row of the replay fits, and no location gets more rows than its ring
        by_loc = {s.location: s.capacity_rows for s in job.shards}
        for s in plan.shards:
            assert s.capacity_rows <= by_loc[s.location]
        assert sum(s.capacity_rows for s in plan.shards) == w.capacity_rows
        assert [s.capacity_rows for s in on.shards] == caps.tolist()
        assert sum(s.share for s in on.shards) == pytest.approx(1.0)
        for wts in (on.actor_weights or {}).values():
            assert set(wts.shards) <= {0, 1, 2}


def test_a_plan_in_a_place_the_job_lacks_is_refused() -> None:
    c = two_nodes()
    job = start(c)
    other = Placement(shards=(ShardPlacement(0, 9, "buffer_host", 10, location="z.buf0"),),
                      actor_shards={4: 0}, learner_shards={0: (0,)})
    with pytest.raises(ConfigError, match=r"'z\.buf0', where the job has no shard"):
        on_job_shards(other, job)


def test_heat_from_reports_equals_heat_of_every_row() -> None:
    rng = np.random.default_rng(0)
    m = rng.pareto(1.2, 3000)
    parts = [HeldSample.of(0, m[:1000]), HeldSample.of(1, m[1000:2500]),
             HeldSample.of(2, m[2500:])]
    flat = np.ravel
    assert flat(heat_of(parts)) == pytest.approx(flat(heat_bins(m)))
    # summarised reports keep every row and all the mass; the bins stay close
    small = [HeldSample.of(i, p.mass, 64) for i, p in enumerate(parts)]
    assert sum(s.held for s in small) == 3000
    assert sum(s.total for s in small) == pytest.approx(m.sum())
    approx = heat_of(small)
    assert sum(b[0] for b in approx) == pytest.approx(1.0)
    assert sum(b[1] for b in approx) == pytest.approx(1.0)
    assert approx[-1][1] == pytest.approx(heat_bins(m)[-1][1], abs=0.05)
    assert approx[0][1] == pytest.approx(heat_bins(m)[0][1], abs=0.15)
    assert heat_of([HeldSample.of(0, np.zeros(5))]) == ()


def reference_fill(plan: Placement, masses: dict[int, np.ndarray]) -> dict[tuple[int, int],
                                                                           int]:
    """Row by row: densest shard first, each takes the hottest rows left (own first)."""
    rows = [(float(x), sid) for sid, ms in masses.items() for x in ms]
    left = list(range(len(rows)))
    dens = {s.shard_id: s.share / s.capacity_rows for s in plan.shards}
    out: dict[tuple[int, int], int] = {}
    for s in sorted(plan.shards, key=lambda s: (-dens[s.shard_id], s.shard_id)):
        left.sort(key=lambda i: (-rows[i][0], rows[i][1] != s.shard_id, rows[i][1]))
        take, left = left[:s.capacity_rows], left[s.capacity_rows:]
        for i in take:
            key = (rows[i][1], s.shard_id)
            out[key] = out.get(key, 0) + 1
    return out


def test_plan_in_place_matches_a_row_by_row_reference() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.integers(2, 5))
        caps = rng.integers(5, 60, n)
        share = rng.dirichlet(np.ones(n))
        plan = Placement(shards=tuple(
            ShardPlacement(i, i, "buffer_host", int(caps[i]), share=float(share[i]))
            for i in range(n)), actor_shards={}, learner_shards={0: tuple(range(n))})
        masses = {i: rng.choice([0.5, 1.0, 3.0, 40.0], int(rng.integers(0, caps[i] + 1)))
                  for i in range(n)}
        got = plan_in_place(plan, [HeldSample.of(i, m) for i, m in masses.items()])
        assert {(m.src_shard, m.dst_shard): m.rows for m in got} == reference_fill(plan,
                                                                                   masses)
        # every row has one place; no shard gets more than its ring holds
        for i, m in masses.items():
            assert sum(r for d, r in moves_by_source(got).get(i, [])) == len(m)
        into: dict[int, int] = {}
        for m in got:
            into[m.dst_shard] = into.get(m.dst_shard, 0) + m.rows
        assert all(into[d] <= caps[d] for d in into)


def test_hottest_rows_go_where_the_plan_puts_the_mass_and_the_rest_stays() -> None:
    plan = Placement(shards=(ShardPlacement(0, 1, "buffer_host", 100, share=0.8),
                             ShardPlacement(1, 3, "buffer_host", 100, share=0.2)),
                     actor_shards={}, learner_shards={0: (0, 1)})
    local = np.r_[np.full(80, 1.0), np.full(20, 2.0)]  # full, lukewarm
    remote = np.r_[np.full(30, 9.0), np.full(40, 0.5)]  # 30 hot rows
    moves = plan_in_place(plan, [HeldSample.of(0, local), HeldSample.of(1, remote)])
    runs = moves_by_source(moves)
    # the 30 hot rows come in; the 30 coldest local rows make room (a swap)
    assert runs[1] == [(0, 30), (1, 40)]
    assert runs[0] == [(0, 70), (1, 30)]
    assert rows_moving(moves) == 60
    # uniform sampling: rows stay where they are as far as capacity allows
    stay = plan_in_place(plan, [HeldSample.of(0, np.ones(50)), HeldSample.of(1, np.ones(70))],
                         order="oldest")
    assert moves_by_source(stay) == {0: [(0, 50)], 1: [(0, 50), (1, 20)]}
    assert {m.order for m in stay} == {"oldest"}


def test_policy_on_measured_telemetry_brings_the_hot_rows_to_the_learners_node() -> None:
    c = two_nodes(nic_gbps=0.05)
    job = start(c)
    jc = job_cluster(c, roster(c), job, WORK)
    pol = AdaptivePolicy(jc, WORK, job, knobs=AdaptiveKnobs(patience=1, cooldown_supersteps=0),
                         roster=roster(c))
    rng = np.random.default_rng(1)
    remote = rng.choice([1.0, 60.0], 1000, p=[0.95, 0.05])  # every row on node b
    samples = [HeldSample.of(0, []), HeldSample.of(1, []), HeldSample.of(2, remote)]
    t = Telemetry(50, shard_sample_share={0: 0.0, 1: 0.0, 2: 1.0}, compute_s=1e-4,
                  actor_rows_per_s=100, heat=heat_of(samples))
    d = pol.observe(t)
    assert d.action == "move", d.reason
    assert d.placement is not None
    new = on_job_shards(d.placement, job)
    local = sum(s.share for s in new.shards if s.location.startswith("a."))
    assert local > 0.6
    moves = plan_in_place(new, samples)
    # the remote rows move to node a, hottest first; nothing moves the other way
    assert all(m.src_shard == 2 for m in moves)
    assert sum(m.rows for m in moves if m.dst_shard != 2) >= 50
    # and, measured as planned, the new plan is predicted faster than the old one
    after = predict_placement(jc, WORK, new, roster=roster(c))
    assert after.max_path_s < d.current_s + WORK.compute_s
