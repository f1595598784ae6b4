"""The static planner's LP variables: partitions and the placement patterns (columns) the
LP combines - per (partition, location) for the flat LP, or per class of
interchangeable learners for the symmetric one (see :mod:`conduit_hpc.placement.static`
for why that is exact). Plain Python and numpy; no MPI, no solver.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.topology import BUF, GPU, HOST, KIND_TIER, Topology
from conduit_hpc.placement.workload import Workload

__all__ = ["Column", "available_locations", "flat_columns", "node_classes", "partition_rows",
           "symmetric_columns"]


@dataclass(frozen=True, slots=True)
class Column:
    """One LP variable: a unit placement pattern of one heat bin of a group of partitions.

    Attributes:
        group (int): equality group (the columns of a group sum to 1).
        part (np.ndarray), loc (np.ndarray): entries (partition, location).
        rows (np.ndarray), mass (np.ndarray): rows and sample share of each entry when
            the variable is 1.
        label (str): what the pattern is, for reports.
    """

    group: int
    part: np.ndarray
    loc: np.ndarray
    rows: np.ndarray
    mass: np.ndarray
    label: str


def partition_rows(topo: Topology, workload: Workload) -> np.ndarray:
    """Rows of each partition: all of them (global) or an even split over learners."""
    if workload.scope == "global":
        return np.asarray([float(workload.capacity_rows)])
    n = topo.n_learners
    if n == 0:
        raise ConfigError("scope = 'partitioned' needs at least one learner; the cluster "
                          "has none", key="scope")
    if workload.capacity_rows < n:
        raise ConfigError(f"capacity_rows must be >= the number of learners ({n}) for "
                          f"partitioned sampling, got {workload.capacity_rows}",
                          key="capacity_rows")
    base, extra = divmod(workload.capacity_rows, n)
    return np.asarray([base + (1 if i < extra else 0) for i in range(n)], dtype=np.float64)


def node_classes(topo: Topology) -> list[list[int]]:
    """Interchangeable nodes: equal hardware and role counts, no explicit links."""
    special = {p.a for p in topo.cluster.paths} | {p.b for p in topo.cluster.paths}
    groups: dict[object, list[int]] = {}
    for i, n in enumerate(topo.cluster.nodes):
        key: object = ("node", i) if i in special else (
            n.signature(), len(topo.roster.learners[i]), len(topo.roster.buffers[i]),
            len(topo.roster.actors[i]))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def available_locations(topo: Topology) -> np.ndarray:
    return topo.o_cap > 0


def symmetric_columns(topo: Topology, workload: Workload, avail: np.ndarray) -> list[Column]:
    """Pattern columns per class of interchangeable learners (see the module doc)."""
    q, m = workload.bins()
    prows = partition_rows(topo, workload)
    classes = node_classes(topo)
    cols: list[Column] = []
    if workload.scope == "global":
        for j in range(len(q)):
            for ci, nodes in enumerate(classes):
                for kind in (GPU, HOST, BUF):
                    locs = np.flatnonzero(np.isin(topo.o_node, nodes) & (topo.o_kind == kind)
                                          & avail)
                    if len(locs) == 0:
                        continue
                    w = 1.0 / len(locs)
                    cols.append(Column(j, np.zeros(len(locs), np.int64), locs,
                                       np.full(len(locs), q[j] * prows[0] * w),
                                       np.full(len(locs), m[j] * w),
                                       f"bin{j}:{KIND_TIER[kind]}@class{ci}"))
        return cols
    # tables: learner index at (node, k), buffer locations at (node, j); -1 padded
    nn = topo.nodes
    max_l = max(int(topo.node_l.max(initial=0)), 1)
    max_b = max((len(b) for b in topo.node_buf_locs), default=0)
    learner_at = np.full((nn, max_l), -1, np.int64)
    for i, ls in enumerate(topo.node_learners):
        learner_at[i, :len(ls)] = ls
    buf_at = np.full((nn, max(max_b, 1)), -1, np.int64)
    for i, bs in enumerate(topo.node_buf_locs):
        buf_at[i, :len(bs)] = bs
    gpu_of = np.where(learner_at >= 0, topo.l_gpu_loc[np.maximum(learner_at, 0)], -1)
    group = 0
    for ci, nodes in enumerate(classes):
        nlc = int(topo.node_l[nodes[0]])
        if nlc == 0:
            continue
        mc = len(nodes)
        node_arr = np.asarray(nodes, np.int64)
        pos = np.repeat(np.arange(mc), nlc)
        k = np.tile(np.arange(nlc), mc)
        node = node_arr[pos]
        li = learner_at[node, k]
        kc = pos * nlc + k
        patterns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

        def put(name: str, cand: np.ndarray, li: np.ndarray = li,
                patterns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = patterns
                ) -> None:
            """cand: learners x options location table (-1: none)."""
            ok = (cand >= 0) & avail[np.maximum(cand, 0)]
            count = ok.sum(axis=1)
            if (count == 0).any():
                return  # not available to every learner of the class
            rows_i, cols_i = np.nonzero(ok)
            patterns[name] = (li[rows_i], cand[rows_i, cols_i], 1.0 / count[rows_i])

        put("gpu_self", topo.l_gpu_loc[li][:, None])
        if nlc >= 2:
            put("gpu_peer", gpu_of[node, (k + 1) % nlc][:, None])
        put("host_self", topo.node_host_loc[node][:, None])
        put("buf_local", buf_at[node])
        for di, dnodes in enumerate(classes):
            md = len(dnodes)
            darr = np.asarray(dnodes, np.int64)
            if di == ci:
                if mc < 2:
                    continue
                target = node_arr[(pos + 1 + (k % (mc - 1))) % mc]
                gk = k
            else:
                target = darr[kc % md]
                gk = kc // md
            nld = int(topo.node_l[dnodes[0]])
            if nld:
                put(f"gpu@class{di}", gpu_of[target, gk % nld][:, None])
            put(f"host@class{di}", topo.node_host_loc[target][:, None])
            put(f"buf@class{di}", buf_at[target])
        for j in range(len(q)):
            for name, (part, loc, wt) in patterns.items():
                cols.append(Column(group, part, loc, q[j] * prows[part] * wt, m[j] * wt,
                                   f"bin{j}:{name}@class{ci}"))
            group += 1
    return cols


def flat_columns(topo: Topology, workload: Workload, avail: np.ndarray) -> list[Column]:
    """One column per (partition, location, heat bin): exact for any cluster."""
    q, m = workload.bins()
    prows = partition_rows(topo, workload)
    locs = np.flatnonzero(avail)
    cols: list[Column] = []
    one = np.ones(1)
    for p in range(len(prows)):
        for j in range(len(q)):
            g = p * len(q) + j
            for o in locs:
                cols.append(Column(g, np.asarray([p]), np.asarray([o]),
                                   q[j] * prows[p] * one, m[j] * one,
                                   f"bin{j}:{topo.o_name[o]}"))
    return cols
