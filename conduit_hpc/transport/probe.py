"""A short start-up probe of how fast bytes move: memcpy, RMA within a node, RMA between
nodes, and host<->GPU copies when there is a GPU.

Knows nothing of experience or roles: it measures bytes per second and latencies and
returns plain numbers (:class:`LinkMeasurements`), the same on every rank. The composition
layer (:mod:`conduit_hpc.plane.probe`) turns them into a
:class:`~conduit_hpc.placement.cluster.ClusterModel`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
from mpi4py import MPI

from conduit_hpc.transport.objects import allgather_json, bcast_json
from conduit_hpc.transport.rma import RmaWindow

__all__ = ["LinkMeasurements", "measure_gpu", "measure_links", "measure_memcpy"]


@dataclass(frozen=True, slots=True)
class LinkMeasurements:
    """Measured numbers (0 where not measured).

    Attributes:
        memcpy_gbps (float): single-core numpy copy bandwidth (median over ranks' nodes).
        shm_put_gbps (float), shm_get_gbps (float): MPI RMA within a node.
        shm_latency_s (float): round trip of an 8-byte RMA get within a node.
        net_put_gbps (float), net_get_gbps (float): MPI RMA between two nodes.
        net_latency_s (float): round trip of an 8-byte RMA get between two nodes.
        gpu_h2d_gbps (float), gpu_d2h_gbps (float), gpu_latency_s (float): pinned host
            <-> GPU copies on one GPU.
        nvlink_gbps (float): GPU-to-GPU copy bandwidth (two GPUs of a node).
        nodes (int): nodes seen (real or emulated).
        gpus_per_node (int): CUDA devices visible on rank 0.
        bytes (int): transfer size used.
    """

    memcpy_gbps: float = 0.0
    shm_put_gbps: float = 0.0
    shm_get_gbps: float = 0.0
    shm_latency_s: float = 0.0
    net_put_gbps: float = 0.0
    net_get_gbps: float = 0.0
    net_latency_s: float = 0.0
    gpu_h2d_gbps: float = 0.0
    gpu_d2h_gbps: float = 0.0
    gpu_latency_s: float = 0.0
    nvlink_gbps: float = 0.0
    nodes: int = 1
    gpus_per_node: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def measure_memcpy(nbytes: int = 32 << 20, repeats: int = 5) -> float:
    """Best-of single-core copy bandwidth in GB/s. Local."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def measure_gpu(nbytes: int = 64 << 20, repeats: int = 5) -> tuple[float, float, float,
                                                                   float, int]:
    """(h2d GB/s, d2h GB/s, small-copy latency s, GPU-to-GPU GB/s, devices), zeros
    without CUDA. Local; imports torch lazily."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0.0, 0.0, 0.0, 0.0, 0
    if not torch.cuda.is_available():
        return 0.0, 0.0, 0.0, 0.0, 0
    ndev = torch.cuda.device_count()
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")

    def best(fn: object) -> float:
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return min(times)

    h2d = nbytes / best(lambda: dev.copy_(host, non_blocking=True)) / 1e9
    d2h = nbytes / best(lambda: host.copy_(dev, non_blocking=True)) / 1e9
    small_h, small_d = host[:8], dev[:8]
    lat = best(lambda: small_d.copy_(small_h, non_blocking=True))
    p2p = 0.0
    if ndev > 1:
        other = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
        p2p = nbytes / best(lambda: other.copy_(dev, non_blocking=True)) / 1e9
    return h2d, d2h, lat, p2p, ndev


#: seconds of timed transfers per direction and pair beyond the warm-up (fewer repeats on
#: a slow link: 8 MiB over 100 Mbit/s takes 0.7 s)
PAIR_BUDGET_S = 1.0


def _pair_rma(win: RmaWindow, origin: int, target: int, me: int, nbytes: int,
              repeats: int) -> tuple[float, float, float]:
    """(put GB/s, get GB/s, 8-byte get round trip s) from ``origin`` to ``target``,
    measured on ``origin`` (0 elsewhere)."""
    if me != origin:
        return 0.0, 0.0, 0.0
    buf = np.ones(nbytes, dtype=np.uint8)
    small = np.zeros(8, dtype=np.uint8)

    def best(fn: object, n: int) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            times.append(time.perf_counter() - t0)
        return min(times)

    def put() -> None:
        win.put(target, 0, buf)
        win.flush(target)

    def get() -> None:
        win.get(target, 0, buf)
        win.flush(target)

    def tiny() -> None:
        win.get(target, 0, small)
        win.flush(target)

    # the warm-up transfers also size the timed ones: on a slow link (a shaped or long
    # one) as many as fit in PAIR_BUDGET_S per direction, at least one
    t0 = time.perf_counter()
    put()
    t1 = time.perf_counter()
    get()
    t2 = time.perf_counter()
    put_s = best(put, max(1, min(repeats, int(PAIR_BUDGET_S / max(t1 - t0, 1e-9)))))
    get_s = best(get, max(1, min(repeats, int(PAIR_BUDGET_S / max(t2 - t1, 1e-9)))))
    lats = []
    for _ in range(50):
        t0 = time.perf_counter()
        tiny()
        lats.append(time.perf_counter() - t0)
    return nbytes / put_s / 1e9, nbytes / get_s / 1e9, statistics.median(lats)


def measure_links(comm: MPI.Intracomm, node_comm: MPI.Intracomm, *, nbytes: int = 8 << 20,
                  repeats: int = 5, gpu: bool = True) -> LinkMeasurements:
    """Measure memcpy, RMA within a node and between two nodes, and GPU copies.

    **Collective** on ``comm`` (and ``node_comm``, the ranks of ``comm`` on this rank's
    node, real or emulated). Blocks for a fraction of a second to a few seconds. The
    result is the same on every rank (broadcast from rank 0).

    Args:
        comm (MPI.Intracomm): the job's ranks.
        node_comm (MPI.Intracomm): ranks of ``comm`` that share this rank's node.
        nbytes (int): transfer size for bandwidths.
        repeats (int): timed repetitions (best is kept).
        gpu (bool): also measure host<->GPU copies on rank 0 when CUDA is available.
    """
    rank = comm.Get_rank()
    node_leader = node_comm.allreduce(rank, op=MPI.MIN)
    leaders = sorted(set(allgather_json(comm, int(node_leader))))
    # memcpy: every node leader measures, then the median
    mine = measure_memcpy(max(nbytes, 8 << 20)) if rank == node_leader else -1.0
    memcpys = [x for x in allgather_json(comm, float(mine)) if x >= 0]
    memcpy = statistics.median(memcpys) if memcpys else 0.0
    # a window over the whole comm, without shared memory: every access is MPI RMA
    win = RmaWindow(comm, nbytes, node_comm=None, shared=False)
    try:
        node_ranks = allgather_json(comm, int(node_leader))
        first_node = [r for r in range(comm.Get_size()) if node_ranks[r] == leaders[0]]
        shm = (0.0, 0.0, 0.0)
        if len(first_node) >= 2:
            shm = _pair_rma(win, first_node[0], first_node[1], rank, nbytes, repeats)
        comm.Barrier()  # the target keeps progressing inside the barrier
        net = (0.0, 0.0, 0.0)
        if len(leaders) >= 2:
            net = _pair_rma(win, leaders[0], leaders[1], rank, nbytes, repeats)
        comm.Barrier()
    finally:
        win.close()
    g = measure_gpu() if (gpu and rank == 0) else (0.0, 0.0, 0.0, 0.0, 0)
    shm = tuple(bcast_json(comm, list(shm), root=first_node[0]))
    net = tuple(bcast_json(comm, list(net), root=leaders[0]))
    g = tuple(bcast_json(comm, list(g), root=0))
    return LinkMeasurements(
        memcpy_gbps=memcpy, shm_put_gbps=shm[0], shm_get_gbps=shm[1], shm_latency_s=shm[2],
        net_put_gbps=net[0], net_get_gbps=net[1], net_latency_s=net[2],
        gpu_h2d_gbps=g[0], gpu_d2h_gbps=g[1], gpu_latency_s=g[2], nvlink_gbps=g[3],
        nodes=len(leaders), gpus_per_node=int(g[4]), bytes=nbytes)
