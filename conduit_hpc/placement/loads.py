"""Allocations and their loads: bytes per link per superstep and memory per location.

Plain Python, numpy and scipy; no MPI. The model itself is described in
:mod:`conduit_hpc.placement.model`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from conduit_hpc.placement.topology import GPU, Topology
from conduit_hpc.placement.workload import SHARD_OVERHEAD_BYTES, Workload

__all__ = ["Allocation", "Evaluation", "evaluate", "ingest_matrix"]


@dataclass(frozen=True, slots=True)
class Allocation:
    """How much of each partition lives where (fluid; rows need not be integers).

    ``global`` scope has one partition (0) that every learner reads; ``partitioned``
    scope has one partition per learner (index into ``Topology.l_rank``).

    Attributes:
        scope (str): ``global`` or ``partitioned``.
        part (np.ndarray): partition of each entry.
        loc (np.ndarray): location of each entry.
        rows (np.ndarray): rows of each entry.
        mass (np.ndarray): share of its partition's samples drawn from the entry.
        part_rows (np.ndarray): rows of each partition (sums ``rows`` per partition).
        ingest (sp.csr_matrix): nodes x partitions: rows/s that each node's actors
            write into each partition.
    """

    scope: str
    part: np.ndarray
    loc: np.ndarray
    rows: np.ndarray
    mass: np.ndarray
    part_rows: np.ndarray
    ingest: sp.csr_matrix


def ingest_matrix(topo: Topology, workload: Workload) -> sp.csr_matrix:
    """Nodes x partitions: rows per second each node's actors write into each partition.

    ``global``: one partition. ``partitioned``: a node's actors feed its own learners'
    partitions evenly; actors of nodes without learners feed every partition evenly.
    """
    rate = workload.actor_rows_per_s * topo.node_actors.astype(np.float64)
    nn = topo.nodes
    if workload.scope == "global":
        return sp.csr_matrix(rate.reshape(nn, 1))
    nl = topo.n_learners
    rows_i, cols_i, vals = [], [], []
    orphan = 0.0
    for i in range(nn):
        ls = topo.node_learners[i]
        if not rate[i]:
            continue
        if ls:
            rows_i.extend([i] * len(ls))
            cols_i.extend(ls)
            vals.extend([rate[i] / len(ls)] * len(ls))
        else:
            orphan += rate[i]
            rows_i.extend([i] * nl)
            cols_i.extend(range(nl))
            vals.extend([rate[i] / nl] * nl)
    del orphan
    return sp.csr_matrix((np.asarray(vals, np.float64), (rows_i, cols_i)), shape=(nn, nl))


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Link loads of an allocation, per superstep.

    Attributes:
        read_bytes (np.ndarray): per link, bytes that learners' reads put on it.
        ingest_bytes (np.ndarray): per link, bytes that ingest puts on it.
        usage_bytes (np.ndarray): per location, bytes of memory used.
    """

    read_bytes: np.ndarray
    ingest_bytes: np.ndarray
    usage_bytes: np.ndarray

    @property
    def total_bytes(self) -> np.ndarray:
        return self.read_bytes + self.ingest_bytes


def _add(acc: np.ndarray, links: np.ndarray, weights: np.ndarray) -> None:
    """acc[links[e, j]] += weights[e] for every valid link."""
    if links.size == 0:
        return
    w = np.broadcast_to(weights[:, None], links.shape)
    ok = links >= 0
    acc += np.bincount(links[ok], weights=w[ok], minlength=len(acc))


def evaluate(topo: Topology, workload: Workload, alloc: Allocation, *,
             overhead: bool = True) -> Evaluation:
    """Bytes per superstep on every link, and memory per location. Pure; linear in the
    allocation's rows and masses (with ``overhead=False``)."""
    nlinks = len(topo.links)
    read = np.zeros(nlinks)
    ingest = np.zeros(nlinks)
    bb = workload.batch_rows * workload.row_bytes
    step = workload.superstep_s
    rb = workload.stored_bytes  # actors write stored columns (frames once)
    # -- reads
    if alloc.scope == "partitioned":
        routes = topo.read_routes(alloc.loc, alloc.part)
        _add(read, routes, bb * alloc.mass)
    elif topo.n_learners:
        _global_reads(topo, alloc, bb, read)
    # -- ingest: the sink of each entry, then node-to-node traffic
    part_rate = np.asarray(alloc.ingest.sum(axis=0)).reshape(-1)  # rows/s per partition
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(alloc.part_rows[alloc.part] > 0,
                        alloc.rows / alloc.part_rows[alloc.part], 0.0)
    into = part_rate[alloc.part] * frac * rb * step  # bytes per superstep into each entry
    sink = topo.ingest_sink(alloc.loc)
    ingest += np.bincount(sink, weights=into, minlength=nlinks)
    nn = topo.nodes
    if nn > 1 and alloc.ingest.nnz:
        fr = sp.csr_matrix((frac, (alloc.part, topo.o_node[alloc.loc])),
                           shape=(alloc.ingest.shape[1], nn))
        w = (alloc.ingest @ fr).tocoo()  # nodes x nodes: rows/s
        far = w.row != w.col
        if far.any():
            net = topo.network_links(w.row[far], w.col[far])
            _add(ingest, net, w.data[far] * rb * step)
    # -- memory
    bpr = workload.bytes_per_row
    per_entry = alloc.rows * bpr + (SHARD_OVERHEAD_BYTES * (alloc.rows > 0) if overhead else 0)
    usage = np.bincount(alloc.loc, weights=per_entry, minlength=topo.n_locations)
    return Evaluation(read, ingest, usage)


def _global_reads(topo: Topology, alloc: Allocation, bb: float, read: np.ndarray) -> None:
    """Read loads when every learner samples every location (aggregated per node)."""
    lt = topo.links
    nl = topo.n_learners
    s = np.bincount(alloc.loc, weights=alloc.mass, minlength=topo.n_locations)
    kind, node = topo.o_kind, topo.o_node
    nnodes = topo.nodes
    node_l = topo.node_l.astype(np.float64)
    s_node = np.bincount(node, weights=s, minlength=nnodes)
    is_gpu = kind == GPU
    gl = np.flatnonzero(is_gpu & (s > 0))
    hl = np.flatnonzero(~is_gpu & (s > 0))
    # sources: host/buffer gathers serve every learner
    read += np.bincount(lt.shm[node[hl]], weights=nl * bb * s[hl], minlength=len(read))
    # GPU sources: peers on the node (NVLink, or d2h + shm), remote readers (d2h)
    gn = node[gl]
    peers = node_l[gn] - 1
    remote = nl - node_l[gn]
    nvl = lt.has_nvlink[gn]
    g = topo.o_gpu[gl]
    np.add.at(read, lt.nvl_out[g[nvl]], peers[nvl] * bb * s[gl][nvl])
    d2h_w = (np.where(nvl, 0.0, peers) + remote) * bb * s[gl]
    np.add.at(read, lt.d2h[g], d2h_w)
    np.add.at(read, lt.shm[gn[~nvl]], peers[~nvl] * bb * s[gl][~nvl])
    # network: node a serves the learners of every other node b
    if nnodes > 1:
        a, b = np.nonzero((s_node[:, None] > 0) & (node_l[None, :] > 0))
        far = a != b
        a, b = a[far], b[far]
        _add(read, topo.network_links(a, b), bb * s_node[a] * node_l[b])
    # sinks: each learner's own links
    has_gpu = topo.l_gpu >= 0
    ln = topo.l_node
    sgpu_node = np.bincount(node[is_gpu], weights=s[is_gpu], minlength=nnodes)
    s_own = np.where(topo.l_gpu_loc >= 0, s[np.maximum(topo.l_gpu_loc, 0)], 0.0)
    lnvl = lt.has_nvlink[ln]
    total = float(s.sum())  # 1 for a whole plan; less for one LP column (stays linear)
    h2d_w = np.where(lnvl, total - sgpu_node[ln], total - s_own) * bb
    idx = np.flatnonzero(has_gpu)
    np.add.at(read, lt.h2d[topo.l_gpu[idx]], np.maximum(h2d_w[idx], 0.0))
    idx = np.flatnonzero(has_gpu & lnvl)
    np.add.at(read, lt.nvl_in[topo.l_gpu[idx]],
              np.maximum((sgpu_node[ln] - s_own)[idx], 0.0) * bb)
