"""``conduit-hpc info`` on MPI ranks: the MPI library, thread level, roles and nodes.

Run as ``mpirun -n N python -m mpi4py -m conduit_hpc.plane.info [--config JOB.toml]``
(``conduit-hpc info -n N`` does this). **Collective** over ``COMM_WORLD``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mpi4py import MPI

from conduit_hpc.config import Config, LayoutConfig
from conduit_hpc.errors import ConduitError
from conduit_hpc.plane.roles import split_roles
from conduit_hpc.transport.objects import gather_json

__all__ = ["print_info"]


def print_info(config: str = "") -> int:
    """Print the table on world rank 0. **Collective** over ``COMM_WORLD``; returns 0."""

    comm = MPI.COMM_WORLD
    layout = Config.from_toml(config).layout if config else LayoutConfig(
        learners=0 if comm.Get_size() < 3 else 1, buffers=1)
    roles = split_roles(comm, layout)
    host = MPI.Get_processor_name()
    rows = gather_json(roles.world, [roles.world_rank, roles.role.value, roles.node_of[
        roles.world_rank], roles.node_rank, host], root=0)
    if roles.world_rank == 0:
        level = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                 MPI.THREAD_SERIALIZED: "serialized",
                 MPI.THREAD_MULTIPLE: "multiple"}[MPI.Query_thread()]
        print(f"MPI library   : {MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"MPI standard  : {'.'.join(map(str, MPI.Get_version()))}")
        print(f"thread level  : {level}")
        print(f"world size    : {roles.world_size}")
        print(f"nodes         : {len(set(roles.node_of))}")
        print("world_rank  role     node  node_rank  host")
        assert rows is not None
        for r, role, node, nr, h in rows:
            print(f"{r:>10}  {role:<7}  {node:>4}  {nr:>9}  {h}")
        groups: dict[int, list[int]] = {}
        for r, node in enumerate(roles.node_of):
            groups.setdefault(node, []).append(r)
        for node, ranks in sorted(groups.items()):
            print(f"node {node} shares memory among world ranks {ranks}")
    roles.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Every rank: :func:`print_info`, or, when the config or its layout is refused (on
    every rank alike: the same file, the same world), one ``conduit-hpc: error`` line
    from world rank 0 and exit status 2 everywhere, as ``conduit-hpc`` itself reports
    it (not a traceback per rank)."""
    p = argparse.ArgumentParser(prog="conduit_hpc.plane.info")
    p.add_argument("--config", default="")
    try:
        return print_info(p.parse_args(argv).config)
    except ConduitError as err:
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"conduit-hpc: error: {type(err).__name__}: {err}", file=sys.stderr,
                  flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
