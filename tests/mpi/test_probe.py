"""The start-up probe measures real RMA and builds a model every rank agrees on."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from conduit_hpc.config import LayoutConfig
from conduit_hpc.placement.model import Workload
from conduit_hpc.placement.static import plan_static
from conduit_hpc.plane.probe import probe_cluster
from conduit_hpc.plane.roles import split_roles


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("emulate", [0, 2])
def test_probe_builds_a_model_and_a_plan(emulate: int) -> None:
    comm = MPI.COMM_WORLD
    roles = split_roles(comm, LayoutConfig(learners=1, buffers=1, emulate_nodes=emulate))
    try:
        cluster, roster, m = probe_cluster(roles, nbytes=1 << 20)
        same = roles.world.allgather((cluster.to_dict(), m.as_dict()))
        assert all(s == same[0] for s in same)
        assert m.memcpy_gbps > 0 and m.shm_latency_s >= 0
        assert len(cluster.nodes) == max(1, emulate)
        if emulate:
            assert m.net_get_gbps > 0 and m.net_latency_s > 0
            assert all(n.nic is not None for n in cluster.nodes)
        assert roster.all_learners == roles.learner_ranks
        assert roster.all_buffers == roles.buffer_ranks
        plan = plan_static(cluster, Workload(capacity_rows=10_000, row_bytes=64),
                           roster=roster)
        assert plan.capacity_rows == 10_000
        assert {s.owner_rank for s in plan.shards} <= set(roles.learner_ranks) | set(
            roles.buffer_ranks)
    finally:
        roles.close()
