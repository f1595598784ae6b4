"""The cost model of the experience path: which bytes cross which link per superstep.

Plain Python and numpy; no MPI. Shared by the static planner (which minimises it), the
adaptive policy (which re-evaluates it from telemetry) and ``bench/scale.py``.

**Model.** Time is cut into supersteps of ``1 / update_rate_hz`` seconds. Per superstep
every learner reads ``batch_rows`` rows, each from the shard it samples it from, and every
actor writes ``actor_rows_per_s / update_rate_hz`` rows. A read from a location crosses the
links of its route (see :class:`Topology`); a write crosses the route from the actor's
node into the location. Concurrent transfers share a link: a link that carries ``b`` bytes
per superstep is busy ``b / bandwidth`` seconds (fluid sharing; every stream on it ends when
the link has carried them all). A learner's reads from different locations run in
parallel; one read takes its busiest link's time plus a round trip of the route's
latencies; the learner's **experience-path time** is its slowest read. The planner's
objective is the busiest link's time (every superstep's bytes must cross every link within
the superstep, ingest included), which bounds every learner's path time from below.

Reads within the learner's own GPU cross no link. Gathers from host memory count once
on the node's ``shm`` link (reads and ingest writes); copies into a GPU cross its ``h2d``
link; reads of another node's memory cross that node's ``nic_out``, any explicit link
between the two nodes, and the reader node's ``nic_in``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from conduit_hpc.config import (
    Config,
    SchedulerConfig,
    StorageConfig,
    read_toml,
    require,
    validate,
)
from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.cluster import TIERS, ClusterModel, LinkTable, Roster
from conduit_hpc.placement.placement import Bottleneck, LearnerPrediction, PlanPrediction

__all__ = [
    "INDEX_BYTES_PER_ROW",
    "SHARD_OVERHEAD_BYTES",
    "STAMP_BYTES_PER_ROW",
    "Allocation",
    "Evaluation",
    "Topology",
    "Workload",
    "evaluate",
    "predict",
    "sampling_of",
]

#: per row: the ring's generation stamp and initial priority (int64 + float64)
STAMP_BYTES_PER_ROW = 16
#: per row, prioritized replay: sum- and min-tree leaves and parents, generations, priority
INDEX_BYTES_PER_ROW = 80
#: per shard: ring header and the alignment padding of its blocks (<= 60 fields)
SHARD_OVERHEAD_BYTES = 4096

GPU, HOST, BUF = 0, 1, 2
KIND_TIER = {GPU: "learner_gpu", HOST: "learner_host", BUF: "buffer_host"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What the experience path must carry.

    Attributes:
        capacity_rows (int): replay capacity over all shards (rows).
        row_bytes (int): payload bytes of one row (the spec's ``row_bytes``).
        batch_rows (int): rows each learner samples per superstep.
        update_rate_hz (float): learner updates per second (superstep = 1 / rate).
        actor_rows_per_s (float): rows each actor ingests per second.
        sampling (str): ``uniform`` or ``prioritized`` (adds the priority index to each
            row's bytes, and allows ``heat``).
        scope (str): ``global`` (every learner samples every shard) or ``partitioned``
            (each learner samples its own partition of ``capacity_rows / learners`` rows,
            fed by the actors of its node, or by all actors when its node has none).
        compute_s (float): learner compute per superstep for the exposed latency; 0 means
            the superstep period.
        heat (tuple[tuple[float, float], ...]): prioritized only: bins of
            (share of rows, share of priority mass), e.g. ``[[0.1, 0.6], [0.9, 0.4]]``:
            the hottest 10 % of rows draw 60 % of the samples. Empty: mass follows rows.
        tiers (tuple[str, ...]): tiers the plan may use.
    """

    capacity_rows: int
    row_bytes: int
    batch_rows: int = 256
    update_rate_hz: float = 100.0
    actor_rows_per_s: float = 1000.0
    sampling: Literal["uniform", "prioritized"] = "uniform"
    scope: Literal["global", "partitioned"] = "global"
    compute_s: float = 0.0
    heat: tuple[tuple[float, ...], ...] = ()
    tiers: tuple[str, ...] = TIERS

    def __post_init__(self) -> None:
        require(self.capacity_rows > 0, "capacity_rows", self.capacity_rows, "> 0")
        require(self.row_bytes > 0, "row_bytes", self.row_bytes, "> 0")
        require(self.batch_rows > 0, "batch_rows", self.batch_rows, "> 0")
        require(np.isfinite(self.update_rate_hz) and self.update_rate_hz > 0,
                "update_rate_hz", self.update_rate_hz, "a finite number > 0")
        require(np.isfinite(self.actor_rows_per_s) and self.actor_rows_per_s >= 0,
                "actor_rows_per_s", self.actor_rows_per_s, "a finite number >= 0")
        require(np.isfinite(self.compute_s) and self.compute_s >= 0, "compute_s",
                self.compute_s, "a finite number >= 0 (0: the superstep period)")
        require(len(self.tiers) > 0 and set(self.tiers) <= set(TIERS)
                and len(set(self.tiers)) == len(self.tiers), "tiers", list(self.tiers),
                f"a non-empty list of distinct tiers from {list(TIERS)}")
        if self.heat:
            require(self.sampling == "prioritized", "heat", [list(b) for b in self.heat],
                    "empty unless sampling = 'prioritized' (uniform sampling draws rows "
                    "evenly)")
            ok = all(len(b) == 2 and b[0] > 0 and b[1] >= 0 for b in self.heat)
            require(ok, "heat", [list(b) for b in self.heat],
                    "a list of [row share > 0, mass share >= 0] pairs")
            rows = sum(b[0] for b in self.heat)
            mass = sum(b[1] for b in self.heat)
            require(abs(rows - 1) < 1e-6 and abs(mass - 1) < 1e-6, "heat",
                    [list(b) for b in self.heat], "row shares and mass shares that each sum "
                    "to 1")

    # -- derived ------------------------------------------------------------------
    @property
    def superstep_s(self) -> float:
        return 1.0 / self.update_rate_hz

    @property
    def effective_compute_s(self) -> float:
        return self.compute_s if self.compute_s > 0 else self.superstep_s

    @property
    def bytes_per_row(self) -> int:
        """Memory one row takes in a tier: payload, stamp and priority, and the priority
        index for prioritized replay."""
        extra = INDEX_BYTES_PER_ROW if self.sampling == "prioritized" else 0
        return self.row_bytes + STAMP_BYTES_PER_ROW + extra

    def bins(self) -> tuple[np.ndarray, np.ndarray]:
        """(row shares, mass shares) of the heat bins, hottest (by mass per row) first."""
        if not self.heat:
            return np.ones(1), np.ones(1)
        q = np.asarray([b[0] for b in self.heat], dtype=np.float64)
        m = np.asarray([b[1] for b in self.heat], dtype=np.float64)
        order = np.argsort(-(m / q), kind="stable")
        return q[order] / q.sum(), m[order] / m.sum()

    # -- loading ------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Workload:
        """Strict: unknown keys, wrong types and bad values raise ConfigError."""
        return validate(cls, raw)

    @classmethod
    def from_toml(cls, path: str | Path) -> tuple[Workload, list[str]]:
        """A workload from a TOML file: its ``[workload]`` table if it has one, else
        derived from the job config it is (loaded as ``Config.from_toml`` does, job
        sections included; see :meth:`from_job`).

        Returns:
            tuple[Workload, list[str]]: the workload and notes on assumed values.

        Raises:
            ConfigError: unreadable file, bad values (named).
        """
        p = Path(path)
        raw = read_toml(p, what="workload file")
        if "workload" in raw:
            try:
                return cls.from_dict(raw["workload"]), []
            except ConfigError as err:
                raise ConfigError(f"{p.name}: [workload] {err}", key=err.key) from err
        return cls.from_job(Config.from_toml(p))

    @classmethod
    def from_job(cls, cfg: Config) -> tuple[Workload, list[str]]:
        """Derive a workload from a job config; notes say what was assumed.

        Rows from ``[spec.*]``, capacity from ``[storage]``, the batch from
        ``[scheduler]``, sampling from ``scheduler.sampler`` and
        ``storage.priority_exponent`` (:func:`sampling_of`), the scope from
        ``[placement]``, and the actor rate from ``synthetic.actor_rate_rows_s`` when the
        job has it.
        """
        from conduit_hpc.spec import Spec

        if not cfg.spec:
            raise ConfigError("the job config has no [spec.*] fields to size rows from "
                              "(or give a [workload] table)", key="spec")
        notes = ["update_rate_hz = 100.0 (assumed; a job config does not say it)"]
        rate = float(getattr(getattr(cfg, "synthetic", None), "actor_rate_rows_s", 0.0))
        if rate <= 0:
            rate = 1000.0
            notes.append("actor_rows_per_s = 1000.0 (assumed)")
        return cls(capacity_rows=cfg.storage.capacity_rows,
                   row_bytes=Spec.from_config(cfg.spec).row_bytes,
                   batch_rows=cfg.scheduler.batch_rows, update_rate_hz=100.0,
                   actor_rows_per_s=rate,
                   sampling=sampling_of(cfg.scheduler, cfg.storage),
                   scope=cfg.placement.scope), notes


def sampling_of(scheduler: SchedulerConfig, storage: StorageConfig
                ) -> Literal["uniform", "prioritized"]:
    """The cost model's sampling of a job: ``prioritized`` when the scheduler samples by
    priority with an exponent > 0 (the priority index then takes memory), else
    ``uniform``."""
    prioritized = scheduler.sampler == "prioritized" and storage.priority_exponent > 0
    return "prioritized" if prioritized else "uniform"


# ---------------------------------------------------------------------------------
# topology: learners, locations and routes


def _at(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``table[idx]`` with -1 wherever ``idx`` is -1 (or the table is empty)."""
    idx = np.asarray(idx, np.int64)
    if len(table) == 0:
        return np.full(idx.shape, -1, np.int64)
    return np.where(idx >= 0, table[np.maximum(idx, 0)], -1)


class Topology:
    """Learners, the locations shards can live in, and the routes between them.

    Locations: one ``learner_gpu`` per learner on a GPU node, one ``learner_host`` per
    node that has learners, one ``buffer_host`` per buffer rank. Tiers not in ``tiers``
    get capacity 0.

    Args:
        cluster (ClusterModel): the model.
        roster (Roster | None): world ranks per node (default: :meth:`Roster.block`).
        tiers (tuple[str, ...]): tiers shards may use.
    """

    def __init__(self, cluster: ClusterModel, roster: Roster | None = None,
                 tiers: tuple[str, ...] = TIERS) -> None:
        roster = roster or Roster.block(cluster)
        if len(roster.learners) != len(cluster.nodes):
            raise ConfigError(f"the roster has {len(roster.learners)} nodes but cluster "
                              f"{cluster.name!r} has {len(cluster.nodes)}", key="roster")
        self.cluster = cluster
        self.roster = roster
        self.links = lt = LinkTable(cluster)
        nn = len(cluster.nodes)
        l_rank: list[int] = []
        l_node: list[int] = []
        l_gpu: list[int] = []
        l_local: list[int] = []
        o_kind: list[int] = []
        o_node: list[int] = []
        o_gpu: list[int] = []
        o_rank: list[int] = []
        o_cap: list[int] = []
        o_name: list[str] = []
        self.node_learners: list[list[int]] = [[] for _ in range(nn)]
        self.node_host_loc = np.full(nn, -1, np.int64)
        self.node_buf_locs: list[list[int]] = [[] for _ in range(nn)]
        gpu_locs: list[int] = []
        for i, node in enumerate(cluster.nodes):
            ls = roster.learners[i]
            if node.gpus and len(ls) > node.gpus:
                raise ConfigError(f"node {node.name!r} has {len(ls)} learners but "
                                  f"{node.gpus} GPUs", key="roster")
            for k, r in enumerate(ls):
                self.node_learners[i].append(len(l_rank))
                l_rank.append(r)
                l_node.append(i)
                l_local.append(k)
                g = int(lt.gpu_offset[i]) + k if node.gpus else -1
                l_gpu.append(g)
                if g >= 0:
                    gpu_locs.append(len(o_kind))
                    o_kind.append(GPU)
                    o_node.append(i)
                    o_gpu.append(g)
                    o_rank.append(r)
                    o_cap.append(node.learner_gpu_bytes if "learner_gpu" in tiers else 0)
                    o_name.append(f"{node.name}.gpu{k}")
                else:
                    gpu_locs.append(-1)
            if ls:
                self.node_host_loc[i] = len(o_kind)
                o_kind.append(HOST)
                o_node.append(i)
                o_gpu.append(-1)
                o_rank.append(ls[0])
                o_cap.append(node.learner_host_bytes if "learner_host" in tiers else 0)
                o_name.append(f"{node.name}.host")
            for j, b in enumerate(roster.buffers[i]):
                self.node_buf_locs[i].append(len(o_kind))
                o_kind.append(BUF)
                o_node.append(i)
                o_gpu.append(-1)
                o_rank.append(b)
                o_cap.append(node.buffer_host_bytes if "buffer_host" in tiers else 0)
                o_name.append(f"{node.name}.buf{j}")
        self.l_rank = np.asarray(l_rank, np.int64)
        self.l_node = np.asarray(l_node, np.int64)
        self.l_gpu = np.asarray(l_gpu, np.int64)
        self.l_local = np.asarray(l_local, np.int64)
        self.l_gpu_loc = np.asarray(gpu_locs, np.int64)
        self.o_kind = np.asarray(o_kind, np.int64)
        self.o_node = np.asarray(o_node, np.int64)
        self.o_gpu = np.asarray(o_gpu, np.int64)
        self.o_rank = np.asarray(o_rank, np.int64)
        self.o_cap = np.asarray(o_cap, np.float64)
        self.o_name = tuple(o_name)
        self.o_tier = tuple(KIND_TIER[k] for k in o_kind)
        self.node_actors = np.asarray([len(a) for a in roster.actors], np.int64)
        self.node_l = np.asarray([len(x) for x in self.node_learners], np.int64)
        self.nodes = nn

    @property
    def n_learners(self) -> int:
        return len(self.l_rank)

    @property
    def n_locations(self) -> int:
        return len(self.o_kind)

    # -- routes -------------------------------------------------------------------
    def read_routes(self, loc: np.ndarray, learner: np.ndarray) -> np.ndarray:
        """Links (``E x 5``, -1 padded) a read of location ``loc[e]`` by learner
        ``learner[e]`` crosses."""
        lt = self.links
        loc = np.asarray(loc, np.int64)
        learner = np.asarray(learner, np.int64)
        e = len(loc)
        out = np.full((e, 5), -1, np.int64)
        kind = self.o_kind[loc]
        sn, rn = self.o_node[loc], self.l_node[learner]
        sg, rg = self.o_gpu[loc], self.l_gpu[learner]
        same = sn == rn
        is_gpu = kind == GPU
        own = is_gpu & (sg == rg)
        nvl = lt.has_nvlink[sn]
        peer = is_gpu & same & ~own
        remote = ~same

        # source link
        out[:, 0] = np.where(is_gpu, np.where(peer & nvl, _at(lt.nvl_out, sg), _at(lt.d2h, sg)),
                             lt.shm[sn])
        out[own, 0] = -1
        # GPU-to-GPU without NVLink stages through host memory
        out[:, 1] = np.where(peer & ~nvl, lt.shm[sn], np.where(remote, lt.nic_out[sn], -1))
        out[:, 2] = np.where(remote, lt.path_matrix[sn, rn], -1)
        out[:, 3] = np.where(remote, lt.nic_in[rn], -1)
        out[:, 4] = np.where(own, -1, np.where(peer & nvl, _at(lt.nvl_in, rg), _at(lt.h2d, rg)))
        return out

    def ingest_sink(self, loc: np.ndarray) -> np.ndarray:
        """The link that ingest into ``loc`` ends on (``h2d`` of a GPU, ``shm`` of a node)."""
        lt = self.links
        loc = np.asarray(loc, np.int64)
        g = self.o_gpu[loc]
        return np.where(self.o_kind[loc] == GPU, _at(lt.h2d, g), lt.shm[self.o_node[loc]])

    def network_links(self, src_node: np.ndarray, dst_node: np.ndarray) -> np.ndarray:
        """Links (``E x 3``: nic_out, path, nic_in; -1 where absent or same node)."""
        lt = self.links
        a, b = np.asarray(src_node, np.int64), np.asarray(dst_node, np.int64)
        far = a != b
        out = np.full((len(a), 3), -1, np.int64)
        out[:, 0] = np.where(far, lt.nic_out[a], -1)
        out[:, 1] = np.where(far, lt.path_matrix[a, b], -1)
        out[:, 2] = np.where(far, lt.nic_in[b], -1)
        return out


# ---------------------------------------------------------------------------------
# allocations and their loads


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
    rb = workload.row_bytes
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


# ---------------------------------------------------------------------------------
# predictions


def _times(topo: Topology, ev: Evaluation) -> np.ndarray:
    return ev.total_bytes / topo.links.bytes_per_s


def _learner_paths_partitioned(topo: Topology, workload: Workload, alloc: Allocation,
                               t: np.ndarray) -> tuple[np.ndarray, list[dict[str, float]],
                                                       list[str]]:
    lt = topo.links
    nl = topo.n_learners
    bb = workload.batch_rows * workload.row_bytes
    path = np.zeros(nl)
    slow = np.full(nl, -1, np.int64)
    per: list[dict[str, float]] = [{} for _ in range(nl)]
    live = alloc.mass > 0
    if live.any():
        part, loc, mass = alloc.part[live], alloc.loc[live], alloc.mass[live]
        routes = topo.read_routes(loc, part)
        ok = routes >= 0
        tt = np.where(ok, t[np.maximum(routes, 0)], -1.0)
        lat = np.where(ok, lt.latency_s[np.maximum(routes, 0)], 0.0).sum(axis=1)
        busiest = tt.max(axis=1)
        te = np.maximum(busiest, 0.0) + 2.0 * lat
        which = np.where(busiest >= 0, routes[np.arange(len(routes)), tt.argmax(axis=1)], -1)
        order = np.lexsort((-te, part))  # per partition, slowest entry first
        first = np.ones(len(order), bool)
        first[1:] = part[order][1:] != part[order][:-1]
        top = order[first]
        path[part[top]] = te[top]
        slow[part[top]] = which[top]
        names = lt.names
        for e in range(len(part)):
            d = per[int(part[e])]
            for k in routes[e]:
                if k >= 0:
                    d[names[k]] = d.get(names[k], 0.0) + bb * float(mass[e])
    return path, per, [lt.names[k] if k >= 0 else "" for k in slow]


def _learner_paths_global(topo: Topology, workload: Workload, alloc: Allocation,
                          t: np.ndarray) -> tuple[np.ndarray, list[dict[str, float]],
                                                  list[str]]:
    lt = topo.links
    nl, nnodes = topo.n_learners, topo.nodes
    bb = workload.batch_rows * workload.row_bytes
    s = np.bincount(alloc.loc, weights=alloc.mass, minlength=topo.n_locations)
    kind, node = topo.o_kind, topo.o_node
    lat = lt.latency_s
    ln, lg = topo.l_node, topo.l_gpu
    has_gpu = lg >= 0

    def tl(ids: np.ndarray) -> np.ndarray:
        return np.where(ids >= 0, t[np.maximum(ids, 0)], 0.0)

    def ll(ids: np.ndarray) -> np.ndarray:
        return np.where(ids >= 0, lat[np.maximum(ids, 0)], 0.0)

    h2d = _at(lt.h2d, lg)
    nvl_in = _at(lt.nvl_in, lg)
    path = np.zeros(nl)
    slow = np.full(nl, -1, np.int64)

    def offer(cand: np.ndarray, link: np.ndarray) -> None:
        better = cand > path
        path[better] = cand[better]
        slow[better] = link[better]

    # local host / buffer sources
    src = ~(kind == GPU) & (s > 0)
    has_local = np.bincount(node[src], minlength=nnodes)[ln] > 0
    shm = lt.shm[ln]
    cand = np.maximum(tl(shm), tl(h2d)) + 2 * (ll(shm) + ll(h2d))
    offer(np.where(has_local, cand, 0.0), np.where(tl(shm) >= tl(h2d), shm, h2d))
    # peer GPUs on the node: the best live source other than the learner's own GPU
    glive = np.flatnonzero((kind == GPU) & (s > 0))
    if len(glive):
        gnode, gg = node[glive], topo.o_gpu[glive]
        out_link = np.where(lt.has_nvlink[gnode], _at(lt.nvl_out, gg), _at(lt.d2h, gg))
        t_out = tl(out_link)
        order = np.lexsort((gg, -t_out, gnode))
        first = np.ones(len(order), bool)
        first[1:] = gnode[order][1:] != gnode[order][:-1]
        b1 = np.full(nnodes, -1, np.int64)
        b1[gnode[order[first]]] = order[first]
        second = np.zeros(len(order), bool)
        second[1:] = first[:-1] & ~first[1:]
        b2 = np.full(nnodes, -1, np.int64)
        b2[gnode[order[second]]] = order[second]
        cand1, cand2 = b1[ln], b2[ln]
        own_first = (cand1 >= 0) & (gg[np.maximum(cand1, 0)] == lg)
        pick = np.where(own_first, cand2, cand1)
        ok = (pick >= 0) & has_gpu
        if ok.any():
            li = np.flatnonzero(ok)
            pk = pick[li]
            nv = lt.has_nvlink[ln[li]]
            sink = np.where(nv, nvl_in[li], h2d[li])
            mid = np.where(nv, -1, lt.shm[ln[li]])
            src = out_link[pk]
            times = np.stack([t_out[pk], tl(sink), tl(mid)], axis=1)
            links = np.stack([src, sink, mid], axis=1)
            cand = times.max(axis=1) + 2 * (ll(src) + ll(sink) + ll(mid))
            better = cand > path[li]
            upd = li[better]
            path[upd] = cand[better]
            slow[upd] = links[better][np.arange(len(upd)), times[better].argmax(axis=1)]
    # remote nodes
    if nnodes > 1:
        src_link = np.where(kind == GPU, _at(lt.d2h, topo.o_gpu), lt.shm[node])
        live = s > 0
        a_term = np.full(nnodes, -np.inf)
        b_term = np.zeros(nnodes)
        np.maximum.at(a_term, node[live], tl(src_link[live]) + 2 * ll(src_link[live]))
        np.maximum.at(b_term, node[live], 2 * ll(src_link[live]))
        served = np.isfinite(a_term)
        # per node, the source link with the most time (for naming the slowest link)
        src_t = np.full(nnodes, -1.0)
        src_l = np.full(nnodes, -1, np.int64)
        for o in np.flatnonzero(live):
            tt = float(tl(src_link[o:o + 1])[0])
            if tt > src_t[node[o]]:
                src_t[node[o]], src_l[node[o]] = tt, src_link[o]
        for a in np.flatnonzero(served):
            far = ln != a
            if not far.any():
                continue
            idx = np.flatnonzero(far)
            net = topo.network_links(np.full(len(idx), a), ln[idx])
            x = np.maximum(tl(net).max(axis=1), tl(h2d[idx]))
            y = 2 * (ll(net).sum(axis=1) + ll(h2d[idx]))
            cand = np.maximum(a_term[a], x + b_term[a]) + y
            better = cand > path[idx]
            upd = idx[better]
            path[upd] = cand[better]
            cands = np.hstack([np.full((len(upd), 1), src_l[a]), net[better],
                               h2d[upd][:, None]])
            ct = np.where(cands >= 0, tl(cands), -1.0)
            slow[upd] = cands[np.arange(len(upd)), ct.argmax(axis=1)]
    # bytes per link, per learner
    s_node = np.bincount(node, weights=s, minlength=nnodes)
    sgpu_node = np.bincount(node[kind == GPU], weights=s[kind == GPU], minlength=nnodes)
    shost_node = s_node - sgpu_node
    s_own = np.where(topo.l_gpu_loc >= 0, s[np.maximum(topo.l_gpu_loc, 0)], 0.0)
    total = float(s.sum())
    per: list[dict[str, float]] = []
    names = lt.names
    for lx in range(nl):
        ni = int(ln[lx])
        d: dict[str, float] = {}
        if shost_node[ni] > 0:
            d[names[lt.shm[ni]]] = bb * float(shost_node[ni])
        peer = float(sgpu_node[ni] - s_own[lx])
        nvl_here = bool(lt.has_nvlink[ni])
        if has_gpu[lx]:
            via_h2d = total - float(s_own[lx]) - (peer if nvl_here else 0.0)
            if via_h2d > 1e-15:
                d[names[h2d[lx]]] = bb * via_h2d
            if nvl_here and peer > 1e-15:
                d[names[nvl_in[lx]]] = bb * peer
        if peer > 1e-15:
            d["peers.nvlink.out" if nvl_here else "peers.d2h"] = bb * peer
        rem = total - float(s_node[ni])
        if rem > 1e-15 and lt.nic_in[ni] >= 0:
            d[names[lt.nic_in[ni]]] = bb * rem
            d["remote.nic.out"] = bb * rem
        per.append(d)
    return path, per, [names[k] if k >= 0 else "" for k in slow]


def predict(topo: Topology, workload: Workload, alloc: Allocation, *, method: str = "",
            planning_s: float = 0.0, ev: Evaluation | None = None) -> PlanPrediction:
    """The full prediction of an allocation: per learner, bottleneck, tier usage."""
    ev = ev or evaluate(topo, workload, alloc)
    t = _times(topo, ev)
    lt = topo.links
    if alloc.scope == "partitioned":
        path, per, slow = _learner_paths_partitioned(topo, workload, alloc, t)
    else:
        path, per, slow = _learner_paths_global(topo, workload, alloc, t)
    compute = workload.effective_compute_s
    bb = workload.batch_rows * workload.row_bytes
    names = [topo.cluster.nodes[int(n)].name for n in topo.l_node]
    learners = tuple(
        LearnerPrediction(rank=int(topo.l_rank[i]), node=names[i], path_s=float(path[i]),
                          exposed_s=float(max(0.0, path[i] - compute)), read_bytes=float(bb),
                          bytes_per_link=per[i], slowest_link=slow[i])
        for i in range(topo.n_learners))
    k = int(np.argmax(t)) if len(t) else 0
    step = workload.superstep_s
    bottleneck = Bottleneck(link=lt.names[k], kind=lt.kind_name(k), time_s=float(t[k]),
                            utilisation=float(t[k] / step), read_bytes=float(ev.read_bytes[k]),
                            ingest_bytes=float(ev.ingest_bytes[k]))
    tier_bytes: dict[str, tuple[int, int]] = {}
    for tier_kind, tier in KIND_TIER.items():
        sel = topo.o_kind == tier_kind
        tier_bytes[tier] = (int(ev.usage_bytes[sel].sum()), int(topo.o_cap[sel].sum()))
    busy = np.flatnonzero(t > 0)
    return PlanPrediction(superstep_s=step, compute_s=compute, objective_s=float(t.max(initial=0)),
                          learners=learners, bottleneck=bottleneck, tier_bytes=tier_bytes,
                          link_time_s={lt.names[i]: float(t[i]) for i in busy}, method=method,
                          planning_s=planning_s)
