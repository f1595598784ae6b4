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


@pytest.mark.mpi(min_size=2)
def test_the_probe_module_writes_its_header_and_refuses_a_file_it_did_not_write(
        tmp_path_factory) -> None:
    """``python -m conduit_hpc.plane.probe --out``: the file it writes carries the header
    the --out check knows (so a later probe may write over it), and an existing file
    it did not write is refused on every rank before the collective probe."""
    import os
    from pathlib import Path

    from conduit_hpc.config.outfile import PROBE_HEADER, written_by
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.plane.probe import main

    comm = MPI.COMM_WORLD
    where = comm.bcast(str(tmp_path_factory.mktemp("probe")) if comm.rank == 0 else None)
    out = Path(where) / "cluster.toml"
    assert main(["--out", str(out), "--bytes", str(1 << 16)]) == 0
    comm.Barrier()
    assert written_by(out, PROBE_HEADER)
    assert ClusterModel.from_toml(out).name == "local"
    assert main(["--out", str(out), "--bytes", str(1 << 16)]) == 0  # its own: written over
    comm.Barrier()
    mine = Path(where) / "mine.toml"
    if comm.rank == 0:
        mine.write_text("precious\n")
    comm.Barrier()
    assert main(["--out", str(mine), "--bytes", str(1 << 16)]) == 2  # every rank
    assert mine.read_text() == "precious\n"
    comm.Barrier()
    if comm.rank == 0:
        os.remove(mine)


@pytest.mark.mpi(min_size=2)
def test_an_out_file_that_cannot_be_written_is_one_error_line(capfd) -> None:
    """--out on a full device: the model is printed, then rank 0 names the file and the
    error and returns 3 (it was an OSError traceback and MPI_Abort)."""
    from conduit_hpc.plane.probe import main

    comm = MPI.COMM_WORLD
    rc = main(["--out", "/dev/full", "--bytes", str(1 << 16)])
    out, err = capfd.readouterr()
    if comm.rank == 0:
        assert rc == 3 and "bandwidth_gbps" in out, (rc, out)
        assert "--out '/dev/full' could not be written: [Errno 28]" in err, err
    else:
        assert rc == 0

