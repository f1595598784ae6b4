"""The directed links of a cluster, numbered: the arrays the cost model indexes.

Plain Python and numpy; no MPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from conduit_hpc.placement.clusterfile import LinkSpec

if TYPE_CHECKING:
    from conduit_hpc.placement.shape import ClusterShape

__all__ = ["LinkTable"]


class LinkTable:
    """Every directed link of a cluster, numbered; arrays of bandwidth and latency.

    Link ids: ``h2d[gpu]``, ``d2h[gpu]``, ``nvl_out[gpu]``, ``nvl_in[gpu]`` per GPU (global
    GPU numbering: node by node), ``shm[node]``, ``nic_out[node]``, ``nic_in[node]`` per
    node, and one per direction of each explicit node-to-node link. A missing link kind
    gets id -1.

    Args:
        cluster (ClusterShape): the model.
    """

    KINDS = ("h2d", "d2h", "nvl_out", "nvl_in", "shm", "nic_out", "nic_in", "path")

    def __init__(self, cluster: ClusterShape) -> None:
        self.cluster = cluster
        names: list[str] = []
        kinds: list[int] = []
        nodes: list[int] = []
        bw: list[float] = []
        lat: list[float] = []
        gpu_offset = [0]
        for n in cluster.nodes:
            gpu_offset.append(gpu_offset[-1] + n.gpus)
        self.gpu_offset = np.asarray(gpu_offset, dtype=np.int64)
        ngpu = int(self.gpu_offset[-1])
        self.gpu_node = np.repeat(np.arange(len(cluster.nodes)), [n.gpus for n in cluster.nodes])
        self.h2d = np.full(ngpu, -1, np.int64)
        self.d2h = np.full(ngpu, -1, np.int64)
        self.nvl_out = np.full(ngpu, -1, np.int64)
        self.nvl_in = np.full(ngpu, -1, np.int64)
        nn = len(cluster.nodes)
        self.shm = np.full(nn, -1, np.int64)
        self.nic_out = np.full(nn, -1, np.int64)
        self.nic_in = np.full(nn, -1, np.int64)
        self.has_nvlink = np.zeros(nn, dtype=bool)

        def add(name: str, kind: str, node: int, spec: LinkSpec) -> int:
            names.append(name)
            kinds.append(self.KINDS.index(kind))
            nodes.append(node)
            bw.append(spec.bytes_per_s)
            lat.append(spec.latency_s)
            return len(names) - 1

        for i, n in enumerate(cluster.nodes):
            self.shm[i] = add(f"{n.name}.shm", "shm", i, n.shm)
            if n.nic is not None:
                self.nic_out[i] = add(f"{n.name}.nic.out", "nic_out", i, n.nic)
                self.nic_in[i] = add(f"{n.name}.nic.in", "nic_in", i, n.nic)
            self.has_nvlink[i] = n.nvlink is not None and n.gpus > 1
            for g in range(n.gpus):
                gg = int(self.gpu_offset[i]) + g
                assert n.gpu_host is not None
                self.h2d[gg] = add(f"{n.name}.gpu{g}.h2d", "h2d", i, n.gpu_host)
                self.d2h[gg] = add(f"{n.name}.gpu{g}.d2h", "d2h", i, n.gpu_host)
                if self.has_nvlink[i]:
                    assert n.nvlink is not None
                    self.nvl_out[gg] = add(f"{n.name}.gpu{g}.nvlink.out", "nvl_out", i,
                                           n.nvlink)
                    self.nvl_in[gg] = add(f"{n.name}.gpu{g}.nvlink.in", "nvl_in", i,
                                          n.nvlink)
        self.path: dict[tuple[int, int], int] = {}
        for p in cluster.paths:
            for a, b in ((p.a, p.b), (p.b, p.a)):
                self.path[(a, b)] = add(f"{cluster.nodes[a].name}->{cluster.nodes[b].name}",
                                        "path", a, p.link)
        # the explicit links, sorted by a * nodes + b: memory grows with the links given,
        # not with nodes**2 (a dense matrix of 50,000 nodes was 18.6 GiB on every rank)
        self._nn = nn
        order = sorted((a * nn + b, k) for (a, b), k in self.path.items())
        self._path_keys = np.asarray([key for key, _ in order], dtype=np.int64)
        self._path_ids = np.asarray([k for _, k in order], dtype=np.int64)
        self.names = tuple(names)
        self.kind = np.asarray(kinds, dtype=np.int64)
        self.node = np.asarray(nodes, dtype=np.int64)
        self.bytes_per_s = np.asarray(bw, dtype=np.float64)
        self.latency_s = np.asarray(lat, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.names)

    def path_between(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The explicit link from node ``a`` to node ``b``, element-wise (-1: none)."""
        a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
        q = a * self._nn + b
        if not len(self._path_keys):
            return np.full(q.shape, -1, np.int64)
        i = np.minimum(np.searchsorted(self._path_keys, q), len(self._path_keys) - 1)
        return np.where(self._path_keys[i] == q, self._path_ids[i], -1)

    def kind_name(self, link: int) -> str:
        return self.KINDS[int(self.kind[link])]
