"""``conduit-hpc plan``'s output: a sparse JSON that stays small for 128 x 8, shares that
sum to the whole, and the planner's floor on shard size."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pytest

from conduit_hpc.errors import ConfigError, PlacementInfeasible
from conduit_hpc.placement.cluster import ClusterModel, Roster
from conduit_hpc.placement.model import Workload
from conduit_hpc.placement.static import plan_static
from conduit_hpc.testing import REPO
from conduit_hpc.tools.report.plan import plan_command

CLUSTER = REPO / "jobs" / "cluster-128x8.toml"
DQN = REPO / "jobs" / "dqn_cartpole.toml"


def test_128x8_plan_json_is_sparse_and_small() -> None:
    out = io.StringIO()
    assert plan_command(str(CLUSTER), None, as_json=True, out=out) == 0
    text = out.getvalue()
    assert len(text.encode()) < 5_000_000  # was 155 MB with a dense actor x shard table
    plan = json.loads(text)["plan"]
    cluster = ClusterModel.from_toml(CLUSTER)
    groups = plan["actor_weights"]
    actors = sorted(a for g in groups for a in g["actors"])
    assert len(actors) == cluster.actors == len(set(actors))  # every actor, once
    for g in groups:
        assert len(g["shards"]) == len(g["weights"])
        assert sum(g["weights"]) == pytest.approx(1.0)
    readers = sorted(r for g in plan["learner_shards"] for r in g["learners"])
    assert len(readers) == cluster.learners
    shares = [s["share"] for s in plan["shards"]]
    assert min(shares) > 0 and sum(shares) == pytest.approx(1.0)  # global: one partition


def test_sparse_json_says_what_the_placement_says() -> None:
    cluster = ClusterModel.from_toml(CLUSTER)
    w, _ = Workload.from_toml(DQN)
    placement = plan_static(cluster, w, roster=Roster.block(cluster))
    d = json.loads(json.dumps(placement.to_dict()))
    for g in d["actor_weights"]:
        for a in g["actors"][:3]:
            assert tuple(g["shards"]) == placement.actor_weights[a].shards
            assert tuple(g["weights"]) == pytest.approx(placement.actor_weights[a].weights)
    for g in d["learner_shards"]:
        for r in g["learners"]:
            assert tuple(g["shards"]) == placement.learner_shards[r]


def test_shares_are_printed_with_their_digits() -> None:
    out = io.StringIO()
    plan_command(str(CLUSTER), None, as_json=False, top=4, out=out)
    text = out.getvalue()
    assert "0.000763%" in text  # a GPU shard's share of the draws, not 0.000
    assert "share of draws:" in text  # and what it is a share of


def test_a_job_workload_never_plans_one_row_shards() -> None:
    cluster = ClusterModel.from_toml(CLUSTER)
    w, _ = Workload.from_toml(DQN)
    assert w.min_shard_rows == w.batch_rows == 64
    plan = plan_static(cluster, w, roster=Roster.block(cluster))
    sizes = [s.capacity_rows for s in plan.shards]
    assert min(sizes) >= w.batch_rows
    assert sum(sizes) == w.capacity_rows
    assert sum(s.share for s in plan.shards) == pytest.approx(1.0)
    unfloored = plan_static(cluster, replace(w, min_shard_rows=0),
                            roster=Roster.block(cluster))
    assert min(s.capacity_rows for s in unfloored.shards) < w.batch_rows  # the floor acts


def test_floor_larger_than_the_replay_gives_one_shard_per_partition() -> None:
    cluster = ClusterModel.from_toml(CLUSTER)
    w, _ = Workload.from_toml(DQN)
    plan = plan_static(cluster, replace(w, min_shard_rows=10 ** 9),
                       roster=Roster.block(cluster))
    assert [s.capacity_rows for s in plan.shards] == [w.capacity_rows]


def test_floor_is_validated_and_an_impossible_one_is_named() -> None:
    w, _ = Workload.from_toml(DQN)
    with pytest.raises(ConfigError, match="min_shard_rows must be >= 0"):
        replace(w, min_shard_rows=-1)
    tiny = ClusterModel.from_dict({"name": "tiny", "nodes": [
        {"name": "n", "count": 2, "gpus": 1, "buffers": 0, "actors": 1,
         "learner_gpu_bytes": 0, "learner_host_bytes": 120_000, "buffer_host_bytes": 0,
         "shm": {"bandwidth_gbps": 10, "latency_s": 1e-6},
         "nic": {"bandwidth_gbps": 10, "latency_s": 1e-6},
         "gpu_host": {"bandwidth_gbps": 10, "latency_s": 1e-6}}]})
    small = Workload(capacity_rows=600, row_bytes=88, batch_rows=32, min_shard_rows=0,
                     tiers=("learner_host",))
    plan = plan_static(tiny, small)
    assert len(plan.shards) == 2  # half the replay on each node's host memory
    with pytest.raises(PlacementInfeasible, match="min_shard_rows = 600"):
        plan_static(tiny, replace(small, min_shard_rows=600))


def test_the_floor_grows_a_small_shard_when_the_big_one_sits_at_its_brim() -> None:
    """What a probe-measured one-node cluster gave: the LP fills the learner's host memory
    to the brim (within its tolerance) and puts 4 rows on the buffer's. Dropping those 4
    rows into the full location cannot fit; the small shard grows to the floor instead,
    taking the rows from the big one: the partition keeps its rows and priority mass."""
    from conduit_hpc.placement.static import apply_floor

    bpr, cap = 1016, np.array([3_159_493_640.0, 3_159_493_640.0])
    rows = np.array([cap[0] / bpr + 1e-3, 4.165])
    part, loc, mass = np.array([0, 0]), np.array([0, 1]), rows.copy()
    prows = np.array([rows.sum()])
    _, l2, r2, m2 = apply_floor(part, loc, rows, mass, prows, 256, None, cap, bpr)  # type: ignore[arg-type]
    assert list(l2) == [0, 1] and r2[1] == pytest.approx(256)
    assert r2.sum() == pytest.approx(prows[0]) and m2.sum() == pytest.approx(mass.sum())
    assert (np.bincount(l2, weights=r2 * bpr) <= cap + 1).all()
