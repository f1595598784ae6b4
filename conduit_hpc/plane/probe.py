"""The start-up probe: measure this job's machine and describe it as a cluster model.

Composition layer: runs the transport's measurements (:mod:`conduit_hpc.transport.probe`)
over the job's role split and hands plain numbers to
:meth:`~conduit_hpc.placement.cluster.ClusterModel.from_measurements`. Used when
``[placement] planner = "static"`` has no ``cluster`` file, and by ``conduit-hpc probe``.

    mpirun -n 4 python -m mpi4py -m conduit_hpc.plane.probe --out cluster.toml
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from mpi4py import MPI

from conduit_hpc import jsontext
from conduit_hpc.config import LayoutConfig
from conduit_hpc.config.outfile import PROBE_HEADER, check_out_file
from conduit_hpc.placement.cluster import ClusterModel, Roster
from conduit_hpc.plane.roles import RoleComms, split_roles
from conduit_hpc.transport.objects import allgather_json, bcast_json
from conduit_hpc.transport.probe import LinkMeasurements, measure_links

__all__ = ["probe_cluster"]


def _host_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 << 30


def _gpu_bytes() -> int:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.get_device_properties(0).total_memory)


def probe_cluster(roles: RoleComms, *, nbytes: int = 8 << 20,
                  experience_fraction: float = 0.25, name: str = "probed"
                  ) -> tuple[ClusterModel, Roster, LinkMeasurements]:
    """Measure the links and build a model of the job's nodes.

    **Collective** on ``roles.world``; blocks for about a second. The same model on every
    rank (built from broadcast numbers).

    Returns:
        tuple: the model, the job's roster on it, and the raw measurements.
    """
    m = measure_links(roles.world, roles.node, nbytes=nbytes)
    nodes = max(roles.node_of) + 1
    per_node = [(sum(roles.node_of[r] == i for r in roles.learner_ranks),
                 sum(roles.node_of[r] == i for r in roles.buffer_ranks),
                 sum(roles.node_of[r] == i for r in roles.actor_ranks)) for i in range(nodes)]
    host = min(allgather_json(roles.world, int(_host_bytes())))
    gpu = bcast_json(roles.world, int(_gpu_bytes()) if roles.world_rank == 0 else 0, root=0)
    shm_gbps = max(m.memcpy_gbps, m.shm_get_gbps)
    nic_gbps = min(m.net_put_gbps, m.net_get_gbps) if nodes > 1 else 0.0
    gpus = m.gpus_per_node
    cluster = ClusterModel.from_measurements(
        name=name, nodes=nodes, gpus_per_node=gpus,
        learners_per_node=per_node[0][0], buffers_per_node=per_node[0][1],
        actors_per_node=per_node[0][2], shm_gbps=shm_gbps,
        shm_latency_s=m.shm_latency_s / 2, nic_gbps=nic_gbps,
        nic_latency_s=m.net_latency_s / 2,
        gpu_host_gbps=min(m.gpu_h2d_gbps, m.gpu_d2h_gbps), gpu_host_latency_s=m.gpu_latency_s,
        nvlink_gbps=m.nvlink_gbps, host_bytes=host, gpu_bytes=gpu,
        experience_fraction=experience_fraction,
        per_node=None if len(set(per_node)) == 1 else per_node)
    roster = Roster.from_ranks(cluster, roles.node_of, roles.learner_ranks, roles.buffer_ranks,
                               roles.actor_ranks)
    return cluster, roster, m


def main(argv: Sequence[str] | None = None) -> int:
    """``conduit-hpc probe`` on the ranks mpirun started: rank 0 prints (and writes) it."""
    p = argparse.ArgumentParser(prog="conduit-hpc probe")
    p.add_argument("--out", default="", help="write the model as a cluster TOML here")
    p.add_argument("--learners", type=int, default=1, help="learner ranks in the layout")
    p.add_argument("--buffers", type=int, default=1, help="buffer ranks in the layout")
    p.add_argument("--emulate-nodes", type=int, default=0, help="treat ranks as N nodes")
    p.add_argument("--bytes", type=int, default=8 << 20, help="transfer size")
    p.add_argument("--force", action="store_true", help="let --out write over an existing "
                   "file that an earlier probe did not write")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    if args.out:  # checked once, before the collective probe; every rank leaves on it
        problem = ""
        if comm.Get_rank() == 0:
            try:
                check_out_file(args.out, "--out", marker=PROBE_HEADER, force=args.force)
            except Exception as err:
                problem = str(err)
        problem = bcast_json(comm, problem, 0)
        if problem:
            if comm.Get_rank() == 0:
                print(f"conduit-hpc probe: error: {problem}", file=sys.stderr)
            return 2
    learners = min(args.learners, max(comm.Get_size() - 2, 0))
    layout = LayoutConfig(learners=learners, buffers=1 if comm.Get_size() < 3 else
                          args.buffers, emulate_nodes=args.emulate_nodes)
    roles = split_roles(comm, layout)
    try:
        cluster, _, m = probe_cluster(roles, nbytes=args.bytes, name="local")
    finally:
        roles.close()
    if comm.Get_rank() == 0:
        print(jsontext.dumps({"measurements": m.as_dict()}))
        print(cluster.to_toml(), end="")
        if args.out:
            try:
                with open(args.out, "w") as f:
                    f.write(PROBE_HEADER + "\n" + cluster.to_toml())
            except OSError as err:  # (the model is printed above: nothing measured is lost)
                print(f"conduit-hpc probe: error: --out {args.out!r} could not be written: "
                      f"{err}", file=sys.stderr)
                return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
