"""``[placement] planner = "static"`` with a cluster file: the plan a job executes is the
plan it writes (``plan.json``), read back from the running plane - every shard's owner
rank, tier and ring capacity, which buffer rank serves it - and rows flow through it.

Layouts (one per world size; other sizes skip): 3 ranks on one node; 4 ranks on two
emulated nodes (the learner and one buffer on the first, a buffer and the actor on the
second); 6 ranks on two emulated nodes with a learner, a buffer and an actor on each.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import play
from mpi4py import MPI

from conduit_hpc import ConfigError, ExperienceDataPlane, Role
from conduit_hpc.testing import make_config, row_consistent
from conduit_hpc.tools.report.plan_check import learner_reads

COMM = MPI.COMM_WORLD

NODE = """
[[nodes]]
name = "{name}"
gpus = 0
learners = {l}
buffers = {b}
actors = {a}
learner_host_bytes = "{host}"
buffer_host_bytes = "64 MB"
shm = {{ bandwidth_gbps = 8.0, latency_s = 1.5e-6 }}
nic = {{ bandwidth_gbps = 1.0, latency_s = 5e-6 }}
"""

# world size -> (layout, per-node (learners, buffers, actors))
LAYOUTS = {
    3: ({"learners": 1, "buffers": 1}, [(1, 1, 1)]),
    4: ({"learners": 1, "buffers": 2, "emulate_nodes": 2}, [(1, 1, 0), (0, 1, 1)]),
    6: ({"learners": 1, "buffers": 1, "per_node": True, "emulate_nodes": 2},
        [(1, 1, 1), (1, 1, 1)]),
}


def cluster_file(shared_dir, nodes, host: str) -> str:
    text = 'name = "test"\n' + "".join(
        NODE.format(name=f"n{i}", l=lc, b=bc, a=ac, host=host)
        for i, (lc, bc, ac) in enumerate(nodes))
    path = shared_dir / f"cluster-{host.replace(' ', '')}.toml"
    if COMM.rank == 0:
        path.write_text(text)
    COMM.Barrier()
    return str(path)


def static_config(layout: dict, cluster: str, tiers: list[str], **sched):
    return make_config(
        layout=layout, storage={"capacity_rows": 2048, "priority_exponent": 1.0},
        placement={"planner": "static", "cluster": cluster, "tiers": tiers},
        scheduler={"mode": "sync", "batch_rows": 16, "min_fill_rows": 32, **sched})


def _layout_or_skip():
    if COMM.size not in LAYOUTS:
        pytest.skip(f"no layout for {COMM.size} ranks (the static-plan test runs at "
                    f"{sorted(LAYOUTS)} ranks; 2 ranks cannot hold a learner, a buffer and "
                    f"an actor)")
    return LAYOUTS[COMM.size]


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("tiers,host", [(["learner_host", "buffer_host"], "96 kB"),
                                        (["learner_host"], "4 MB"),
                                        (["learner_host", "buffer_host"], "probe")])
def test_executed_plan_equals_printed_plan(shared_dir, tiers, host) -> None:
    layout, nodes = _layout_or_skip()
    # "probe": no cluster file; the start-up probe measures this machine (collective)
    cluster = "" if host == "probe" else cluster_file(shared_dir, nodes, host)
    cfg = static_config(layout, cluster, tiers)
    run_dir = shared_dir / f"run-{len(tiers)}-{host.replace(' ', '')}"
    with ExperienceDataPlane(cfg, run_dir=run_dir) as edp:
        doc = json.loads((run_dir / "plan.json").read_text())
        roles = edp.roles
        plan = doc["placement"]
        assert doc["planner"] == "static" and doc["prediction"] is not None
        assert ("start-up probe" in doc["cluster"]) == (host == "probe")
        # the plane executes exactly what plan.json says
        assert edp.placement.to_dict() == plan
        assert sum(s["capacity_rows"] for s in plan["shards"]) == 2048
        assert {s["tier"] for s in plan["shards"]} <= set(tiers)
        if tiers == ["learner_host"]:
            assert {s["tier"] for s in plan["shards"]} == {"learner_host"}
        # read back from the running plane: ring owner and capacity of every shard ...
        for s in plan["shards"]:
            ring = edp.rings[s["shard_id"]]
            assert (ring.owner, ring.capacity) == (s["owner_rank"], s["capacity_rows"])
            # ... every shard served by a buffer rank; learner_host ones on a learner's node
            assert s["owner_rank"] in roles.buffer_ranks
            if s["tier"] == "learner_host":
                assert roles.node_of[s["owner_rank"]] in {
                    roles.node_of[r] for r in roles.learner_ranks}
        # ... and which buffer rank holds which shard, with its index size
        held = [(o.shard_id, o.ring.capacity, o.index.capacity) for o in edp.owned_shards()]
        every = roles.world.allgather((roles.world_rank, held))
        served = {sid: (r, cap, icap) for r, h in every for sid, cap, icap in h}
        assert served == {s["shard_id"]: (s["owner_rank"], s["capacity_rows"],
                                          s["capacity_rows"]) for s in plan["shards"]}
        # predicted path time per learner is in the file, for `conduit-hpc report`
        assert set(doc["prediction"]["learners"]) == {str(r) for r in roles.learner_ranks}
        # and rows flow through the plan
        def learn(edp) -> None:
            for _ in range(4):
                b = edp.next_batch()
                cols = {k: v.numpy() for k, v in b.data.items()}
                assert row_consistent(cols).all()
                assert set(np.asarray(b.indices)[:, 0].tolist()) <= set(
                    learner_reads(doc)[str(edp.world_rank)])

        play(edp, learn, checked=8)


@pytest.mark.mpi(min_size=3)
def test_a_plan_the_job_cannot_serve_fails_every_rank(shared_dir) -> None:
    layout, nodes = _layout_or_skip()
    bad = shared_dir / "missing.toml"
    cfg = static_config(layout, str(bad), ["buffer_host"])
    with pytest.raises(ConfigError, match=r"no executable plan.*missing\.toml") as err:
        ExperienceDataPlane(cfg)
    assert err.value.key == "placement.cluster"
    # too small: the tiers cannot hold the replay
    cfg = static_config(layout, cluster_file(shared_dir, nodes, "8 kB"), ["learner_host"])
    with pytest.raises(ConfigError, match="learner_host cannot hold the replay"):
        ExperienceDataPlane(cfg)


@pytest.mark.mpi(min_size=4)
def test_adaptive_replacement_starts_from_the_static_plan(shared_dir) -> None:
    """4 ranks on two emulated nodes, one buffer rank each: the static plan (buffer tier
    only, each buffer too small for the whole replay) puts one shard on each; the
    adaptive policy's job placement has the plan's capacities and expected shares, and
    each actor routes by the plan's row weights before any move."""
    if COMM.size != 4:
        pytest.skip("the layout needs exactly 4 ranks")
    layout, nodes = LAYOUTS[4]
    text = Path(cluster_file(shared_dir, nodes, "96 kB")).read_text()
    small = shared_dir / "cluster-small-buffers.toml"
    COMM.Barrier()
    if COMM.rank == 0:
        small.write_text(text.replace('buffer_host_bytes = "64 MB"',
                                      'buffer_host_bytes = "250 kB"'))
    COMM.Barrier()
    cfg = make_config(
        layout=layout, storage={"capacity_rows": 2048, "priority_exponent": 1.0},
        placement={"planner": "static", "cluster": str(small), "tiers": ["buffer_host"],
                   "adaptive": True, "interval_supersteps": 1000},
        scheduler={"mode": "sync", "batch_rows": 16, "min_fill_rows": 32},
        checkpoint={"on_stop": False})
    with ExperienceDataPlane(cfg) as edp:
        plan = edp.placement
        assert sorted(s.owner_rank for s in plan.shards) == [1, 2]  # both buffers used
        rep = edp.feature("replacement")
        assert rep is not None
        job = rep.job
        assert [(s.owner_rank, s.capacity_rows, s.share) for s in job.shards] == [
            (s.owner_rank, s.capacity_rows, s.share) for s in plan.shards]
        assert job.actor_weights == plan.actor_weights
        if edp.role is Role.ACTOR:
            assert rep.router.weights == plan.actor_weights[edp.world_rank]
            picks = {rep.route(k) for k in range(64)}
            assert picks == set(plan.actor_weights[edp.world_rank].shards)
        edp.done()


@pytest.mark.mpi(min_size=3)
def test_ranks_that_plan_differently_fail_together(monkeypatch) -> None:
    """The agreement check itself: rank 0's planner returns another plan (as a rank
    with a different cluster file or library would); every rank raises, none hangs."""
    import conduit_hpc.plane.planning as planning

    real = planning.plan_round_robin
    if COMM.rank == 0:
        def skewed(**kw):
            kw["capacity_rows"] += 1
            return real(**kw)
        monkeypatch.setattr(planning, "plan_round_robin", skewed)
    cfg = make_config(layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 256})
    with pytest.raises(ConfigError, match=r"ranks planned different placements.*\[\[0\]"):
        ExperienceDataPlane(cfg)
