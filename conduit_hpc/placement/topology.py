"""The topology of the cost model: learners, the locations shards can live in, and the
routes (links) between them.

Plain Python and numpy; no MPI.
"""

from __future__ import annotations

import numpy as np

from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.cluster import TIERS, ClusterModel, Roster
from conduit_hpc.placement.links import LinkTable

__all__ = ["BUF", "GPU", "HOST", "KIND_TIER", "Topology", "take_ids"]

#: location kinds
GPU, HOST, BUF = 0, 1, 2
KIND_TIER = {GPU: "learner_gpu", HOST: "learner_host", BUF: "buffer_host"}


def take_ids(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
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
        out[:, 0] = np.where(is_gpu, np.where(peer & nvl, take_ids(lt.nvl_out, sg),
                                              take_ids(lt.d2h, sg)),
                             lt.shm[sn])
        out[own, 0] = -1
        # GPU-to-GPU without NVLink stages through host memory
        out[:, 1] = np.where(peer & ~nvl, lt.shm[sn], np.where(remote, lt.nic_out[sn], -1))
        out[:, 2] = np.where(remote, lt.path_between(sn, rn), -1)
        out[:, 3] = np.where(remote, lt.nic_in[rn], -1)
        out[:, 4] = np.where(own, -1, np.where(peer & nvl, take_ids(lt.nvl_in, rg),
                                               take_ids(lt.h2d, rg)))
        return out

    def ingest_sink(self, loc: np.ndarray) -> np.ndarray:
        """The link that ingest into ``loc`` ends on (``h2d`` of a GPU, ``shm`` of a node)."""
        lt = self.links
        loc = np.asarray(loc, np.int64)
        g = self.o_gpu[loc]
        return np.where(self.o_kind[loc] == GPU, take_ids(lt.h2d, g), lt.shm[self.o_node[loc]])

    def network_links(self, src_node: np.ndarray, dst_node: np.ndarray) -> np.ndarray:
        """Links (``E x 3``: nic_out, path, nic_in; -1 where absent or same node)."""
        lt = self.links
        a, b = np.asarray(src_node, np.int64), np.asarray(dst_node, np.int64)
        far = a != b
        out = np.full((len(a), 3), -1, np.int64)
        out[:, 0] = np.where(far, lt.nic_out[a], -1)
        out[:, 1] = np.where(far, lt.path_between(a, b), -1)
        out[:, 2] = np.where(far, lt.nic_in[b], -1)
        return out
