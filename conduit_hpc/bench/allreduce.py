"""Gradient all-reduce per superstep: the learners' torch.distributed group against MPI.

    conduit-hpc bench allreduce [--smoke] [--ranks 2,4] [--floats 17410,1000000]
                                [--iterations 200] [--backend auto]

For each rank count, ``mpirun -n N`` ranks form a
:class:`~conduit_hpc.transport.collectives.Collectives` group from MPI (as the learners of
the DQN job do) and time, per vector of ``--floats`` float32 values (17,410 = the
CartPole Q network's parameters, 128x128 hidden):

* ``allreduce_mean_``: the gradient average of one superstep (one flat bucket);
* ``agree``: the one-integer all-reduce (max) with which the learners agree each superstep
  to go on;
* ``mpi_allreduce``: MPI's ``Allreduce`` of the same float32 buffer (SUM), for comparison;
* ``broadcast_``: rank 0's vector to every rank through the same group (weights to actors
  as a collective), against
* ``rma_board``: what the jobs do today - rank 0 publishes into its
  :class:`~conduit_hpc.plane.weights.WeightsBoard` (a seqlocked shared-memory / RMA
  window) and every other rank pulls until it has the new version.

Median and p90 over ``--iterations`` timed calls (after 10 untimed ones), the slowest
rank's time per call. One JSON line per figure, with ``model_us``: the ring
all-reduce term (:func:`ring_allreduce_s`) on the shared-memory link of the
``--cluster`` file's first node (``jobs/cluster-local.toml``: this machine), so that the
term a scale model would add can be checked against what the collectives measure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import whole, wholes
from conduit_hpc.bench.common import git_sha, repo_path, worker_command

CARTPOLE_PARAMS = 4 * 128 + 128 + 128 * 128 + 128 + 128 * 2 + 2  # QNetwork(4, 2, (128, 128))


def ring_allreduce_s(nbytes: float, ranks: int, bandwidth_gbps: float,
                     latency_s: float) -> float:
    """Time of a ring all-reduce of ``nbytes`` over ``ranks`` ranks: ``2 (p-1)`` steps,
    each one latency plus ``nbytes / p`` over the link (``bandwidth_gbps``, GB/s). 0 for
    one rank."""
    if ranks <= 1:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps * (latency_s + nbytes / ranks / (bandwidth_gbps * 1e9))


def _timed(fn: Any, comm: Any, iterations: int) -> list[float]:
    for _ in range(10):
        fn()
    out = []
    for _ in range(iterations):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def worker(args: argparse.Namespace) -> None:
    import torch
    from mpi4py import MPI

    from conduit_hpc.plane.weights import WeightsBoard
    from conduit_hpc.transport.collectives import Collectives
    from conduit_hpc.transport.rma import RmaWindow

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    coll = Collectives.open(comm, args.backend, timeout_s=60.0)
    node: MPI.Intracomm = comm.Split_type(MPI.COMM_TYPE_SHARED)  # type: ignore[assignment]
    for n in [int(x) for x in args.floats.split(",")]:
        grads = [torch.randn(n, generator=torch.Generator().manual_seed(comm.rank))]
        buf = grads[0].numpy().copy()
        out = np.empty_like(buf)
        win = RmaWindow(comm, 64 + 4 * n, node_comm=node)
        board = WeightsBoard(win, 0, n)
        figures = {
            "allreduce_mean_": lambda g=grads: coll.allreduce_mean_(g),
            "agree": lambda: coll.allreduce_max([0]),
            "mpi_allreduce": lambda b=buf, o=out: comm.Allreduce(b, o, op=MPI.SUM),
            "broadcast_": lambda g=grads: coll.broadcast_(g, 0),
            "rma_board": lambda b=board, f=buf, k=[0]: _board_round(b, f, comm.rank, k),
        }
        for name, fn in figures.items():
            times = np.array(_timed(fn, comm, args.iterations))
            slowest = np.empty_like(times)
            comm.Allreduce(times, slowest, op=MPI.MAX)
            if comm.rank == 0:
                print(jsontext.dumps({
                    "bench": "allreduce", "op": name, "ranks": comm.size,
                    "backend": coll.backend, "floats": n if name != "agree" else 1,
                    "median_us": float(np.median(slowest) * 1e6),
                    "p90_us": float(np.percentile(slowest, 90) * 1e6),
                    "iterations": args.iterations, "git_sha": args.sha}), flush=True)
        comm.Barrier()
        win.close()
    node.Free()
    coll.close()


def _board_round(board: Any, flat: np.ndarray, rank: int, rounds: list[int]) -> None:
    """Round ``k``: rank 0 publishes version ``2k``; every other rank pulls until it holds
    that version or a newer one (the board keeps only the newest)."""
    rounds[0] += 1
    if rank == 0:
        board.publish(flat, rounds[0])
        return
    end = time.monotonic() + 30.0
    while board.seen_version < 2 * rounds[0]:
        board.pull()
        if time.monotonic() > end:
            raise TimeoutError("rma_board: no new version within 30 s")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench allreduce")
    p.add_argument("--smoke", action="store_true", help="2 ranks, 20 iterations")
    p.add_argument("--ranks", type=wholes(1, 256), default="2,4")
    p.add_argument("--floats", type=wholes(1, 10**10), default=f"{CARTPOLE_PARAMS},1000000")
    p.add_argument("--iterations", type=whole(1, 10**7), default=200)
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--cluster", default=str(repo_path("jobs/cluster-local.toml")),
                   help="cluster model whose first node's shm link the model uses")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sha", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    if args.smoke:
        args.ranks, args.iterations, args.floats = "2", 20, str(CARTPOLE_PARAMS)
    from conduit_hpc.placement.cluster import ClusterModel
    from conduit_hpc.testing import mpirun

    shm = ClusterModel.from_toml(args.cluster).nodes[0].shm
    results: list[dict[str, Any]] = []
    for n in [int(x) for x in args.ranks.split(",")]:
        proc = mpirun(n, worker_command("conduit_hpc.bench.allreduce", "--worker",
                                        "--floats", args.floats, "--iterations",
                                        str(args.iterations), "--backend", args.backend,
                                        "--sha", git_sha()),
                      timeout_s=600.0)
        if proc.returncode != 0:
            raise SystemExit(f"bench allreduce: mpirun -n {n} failed (exit "
                             f"{proc.returncode}): {proc.stderr.strip()[-800:]}")
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                r["model_us"] = 1e6 * ring_allreduce_s(4.0 * r["floats"], r["ranks"],
                                                       shm.bandwidth_gbps, shm.latency_s) \
                    if r["op"] in ("allreduce_mean_", "agree", "mpi_allreduce") else None
                results.append(r)
                print(jsontext.dumps(r), flush=True)
    return {"results": results}


if __name__ == "__main__":
    main(sys.argv[1:])
