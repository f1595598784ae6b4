"""The cluster model: nodes, memory tiers and the links experience travels over.

Plain Python; no MPI. A :class:`ClusterModel` is loaded from a TOML file
(:meth:`ClusterModel.from_toml`) or built from numbers that a start-up probe measured
(:meth:`ClusterModel.from_measurements`; the measuring itself lives in
:mod:`conduit_hpc.transport.probe`).

Memory tiers (bytes set aside for experience):

* ``learner_gpu`` - memory of each learner's GPU (per GPU);
* ``learner_host`` - host memory of a node that has learners, mapped into every rank of
  the node as shared-memory windows (per node);
* ``buffer_host`` - host memory of each buffer rank (per buffer rank).

Links (bandwidth in GB/s = 10**9 bytes per second, **per direction**; latency one way):

* ``gpu_host`` - each GPU's own host link (PCIe): one ``h2d`` and one ``d2h`` link per GPU;
* ``shm`` - a node's host-memory bandwidth for gathers and copies, shared by all its ranks;
* ``nvlink`` - each GPU's NVLink/NVSwitch port (``out`` and ``in`` per GPU); without it,
  GPU-to-GPU copies go through host memory;
* ``nic`` - a node's network adapter(s) (``out`` and ``in`` per node); the fabric between
  adapters is assumed non-blocking;
* explicit ``[[links]]`` between two named nodes (e.g. a long-haul link) that traffic between
  them crosses in addition to both adapters.

Concurrent transfers over one link share it: a link that carries ``b`` bytes in a superstep
is busy ``b / bandwidth`` seconds of it (see :mod:`conduit_hpc.placement.model`).

The file's schema and checks (and :func:`parse_bytes`) live in
:mod:`conduit_hpc.placement.clusterfile`, the roles' world ranks per node
(:class:`Roster`) in :mod:`conduit_hpc.placement.roster`, the numbered directed links
(:class:`LinkTable`) in :mod:`conduit_hpc.placement.links`; all importable from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conduit_hpc.config import load, require, to_toml, validate
from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.clusterfile import (
    MAX_NODES,
    MAX_PER_NODE,
    MAX_RANKS,
    ClusterFile,
    LinkConfig,
    LinkSpec,
    NodeConfig,
    expand_names,
    parse_bytes,
)
from conduit_hpc.placement.links import LinkTable
from conduit_hpc.placement.roster import Roster

__all__ = [
    "MAX_NODES",
    "MAX_PER_NODE",
    "MAX_RANKS",
    "TIERS",
    "ClusterFile",
    "ClusterModel",
    "LinkConfig",
    "LinkSpec",
    "LinkTable",
    "NodeConfig",
    "NodeSpec",
    "Roster",
    "parse_bytes",
]

TIERS = ("learner_gpu", "learner_host", "buffer_host")


# ---------------------------------------------------------------------------------
# the model


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of the model (capacities in bytes).

    Attributes:
        name (str): unique node name.
        gpus (int): GPUs.
        learners (int), buffers (int), actors (int): ranks of each role.
        learner_gpu_bytes (int): per learner GPU; learner_host_bytes (int): per node;
            buffer_host_bytes (int): per buffer rank.
        gpu_host, shm, nvlink, nic (LinkSpec | None): link kinds.
    """

    name: str
    gpus: int
    learners: int
    buffers: int
    actors: int
    learner_gpu_bytes: int
    learner_host_bytes: int
    buffer_host_bytes: int
    gpu_host: LinkSpec | None
    shm: LinkSpec
    nvlink: LinkSpec | None
    nic: LinkSpec | None

    def signature(self) -> tuple[Any, ...]:
        """Everything but the name: nodes with equal signatures are interchangeable."""
        return (self.gpus, self.learners, self.buffers, self.actors, self.learner_gpu_bytes,
                self.learner_host_bytes, self.buffer_host_bytes, self.gpu_host, self.shm,
                self.nvlink, self.nic)


@dataclass(frozen=True, slots=True)
class PathSpec:
    """An explicit link between two nodes (indices into :attr:`ClusterModel.nodes`)."""

    a: int
    b: int
    link: LinkSpec


@dataclass(frozen=True, slots=True)
class ClusterModel:
    """Nodes, tiers and links. Immutable; plain Python.

    Attributes:
        name (str): cluster name.
        nodes (tuple[NodeSpec, ...]): every node, in file order.
        paths (tuple[PathSpec, ...]): explicit node-to-node links.
        source (str): the file it came from, or ``"probe"``.
    """

    name: str
    nodes: tuple[NodeSpec, ...]
    paths: tuple[PathSpec, ...] = ()
    source: str = ""
    _index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update({n.name: i for i, n in enumerate(self.nodes)})

    # -- loading -------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | Path) -> ClusterModel:
        """Load ``cluster.toml``. Local; no MPI.

        Raises:
            ConfigError: missing/unparsable file, unknown key, bad value (named), or a
                link to a node that is not defined.
        """
        p = Path(path)
        f = load(ClusterFile, p, what="cluster file", discover=False)
        return cls._from_file(f, source=str(p))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, source: str = "") -> ClusterModel:
        """Build from a mapping shaped like the TOML file (same strict checks)."""
        return cls._from_file(validate(ClusterFile, raw), source=source)

    @classmethod
    def _from_file(cls, f: ClusterFile, *, source: str) -> ClusterModel:
        nodes: list[NodeSpec] = []
        for i, n in enumerate(f.nodes):
            learners = n.learners if n.learners >= 0 else (n.gpus if n.gpus > 0 else 1)
            assert n.shm is not None  # checked in NodeConfig
            for nm in expand_names(n):
                nodes.append(NodeSpec(
                    name=nm, gpus=n.gpus, learners=learners, buffers=n.buffers,
                    actors=n.actors,
                    learner_gpu_bytes=parse_bytes(n.learner_gpu_bytes,
                                                  f"nodes[{i}].learner_gpu_bytes"),
                    learner_host_bytes=parse_bytes(n.learner_host_bytes,
                                                   f"nodes[{i}].learner_host_bytes"),
                    buffer_host_bytes=parse_bytes(n.buffer_host_bytes,
                                                  f"nodes[{i}].buffer_host_bytes"),
                    gpu_host=n.gpu_host, shm=n.shm, nvlink=n.nvlink, nic=n.nic))
        index = {n.name: i for i, n in enumerate(nodes)}
        paths = tuple(PathSpec(index[ln.between[0]], index[ln.between[1]],
                               LinkSpec(bandwidth_gbps=ln.bandwidth_gbps,
                                        latency_s=ln.latency_s)) for ln in f.links)
        return cls(name=f.name, nodes=tuple(nodes), paths=paths, source=source)

    @classmethod
    def from_measurements(cls, *, name: str = "probed", nodes: int, gpus_per_node: int,
                          learners_per_node: int, buffers_per_node: int,
                          actors_per_node: int, shm_gbps: float, shm_latency_s: float,
                          nic_gbps: float = 0.0, nic_latency_s: float = 0.0,
                          gpu_host_gbps: float = 0.0, gpu_host_latency_s: float = 0.0,
                          nvlink_gbps: float = 0.0, nvlink_latency_s: float = 0.0,
                          host_bytes: int, gpu_bytes: int = 0,
                          experience_fraction: float = 0.25,
                          per_node: Sequence[tuple[int, int, int]] | None = None
                          ) -> ClusterModel:
        """A homogeneous model from numbers a probe measured (no MPI here).

        ``experience_fraction`` of each node's host memory is set aside for experience,
        split evenly between the learner-host tier and the buffer ranks; of each GPU's
        memory likewise. Zero bandwidth means "not present". ``per_node`` gives
        (learners, buffers, actors) of each node when they differ between nodes.

        Raises:
            ConfigError: a measurement that cannot describe a cluster (named).
        """
        require(nodes >= 1, "nodes", nodes, ">= 1")
        require(0 < experience_fraction <= 1, "experience_fraction", experience_fraction,
                "in (0, 1]")
        require(host_bytes > 0, "host_bytes", host_bytes, "> 0")

        def link(bw: float, lat: float) -> LinkSpec | None:
            return LinkSpec(bandwidth_gbps=bw, latency_s=max(lat, 0.0)) if bw > 0 else None

        shm = link(shm_gbps, shm_latency_s)
        require(shm is not None, "shm_gbps", shm_gbps, "> 0 (measured memcpy bandwidth)")
        nic = link(nic_gbps, nic_latency_s)
        require(nodes == 1 or nic is not None, "nic_gbps", nic_gbps,
                "> 0 when there are several nodes")
        has_gpu = gpus_per_node > 0
        budget = int(host_bytes * experience_fraction)
        host_share = budget // 2 if learners_per_node > 0 else 0
        buf_share = (budget - host_share) // max(buffers_per_node, 1)
        raw_node: dict[str, Any] = {
            "name": "node", "count": nodes, "gpus": gpus_per_node,
            "learners": learners_per_node, "buffers": buffers_per_node,
            "actors": actors_per_node,
            "learner_gpu_bytes": int(gpu_bytes * experience_fraction) if has_gpu else 0,
            "learner_host_bytes": host_share,
            "buffer_host_bytes": buf_share if buffers_per_node else 0,
        }
        for key, spec in (("shm", shm), ("nic", nic),
                          ("gpu_host", link(gpu_host_gbps, gpu_host_latency_s)),
                          ("nvlink", link(nvlink_gbps, nvlink_latency_s))):
            if spec is not None:
                raw_node[key] = {"bandwidth_gbps": spec.bandwidth_gbps,
                                 "latency_s": spec.latency_s}
        if per_node is None:
            return cls.from_dict({"name": name, "nodes": [raw_node]}, source="probe")
        require(len(per_node) == nodes, "per_node", list(per_node),
                f"{nodes} (learners, buffers, actors) entries, one per node")
        entries = []
        for i, (nl, nb, na) in enumerate(per_node):
            host_i = budget // 2 if nl > 0 else 0
            entries.append({**raw_node, "name": f"node{i}", "count": 1, "learners": nl,
                            "buffers": nb, "actors": na, "learner_host_bytes": host_i,
                            "buffer_host_bytes": (budget - host_i) // max(nb, 1) if nb else 0,
                            "gpus": gpus_per_node if nl <= gpus_per_node else 0,
                            "learner_gpu_bytes": raw_node["learner_gpu_bytes"]
                            if nl <= gpus_per_node else 0})
            if entries[-1]["gpus"] == 0:
                entries[-1].pop("gpu_host", None)
                entries[-1].pop("nvlink", None)
        return cls.from_dict({"name": name, "nodes": entries}, source="probe")

    # -- introspection -------------------------------------------------------------
    def node_index(self, name: str) -> int:
        """Index of a node by name.

        Raises:
            ConfigError: no such node.
        """
        try:
            return self._index[name]
        except KeyError:
            raise ConfigError(f"no node named {name!r} in cluster {self.name!r}",
                              key="node") from None

    @property
    def learners(self) -> int:
        return sum(n.learners for n in self.nodes)

    @property
    def buffers(self) -> int:
        return sum(n.buffers for n in self.nodes)

    @property
    def actors(self) -> int:
        return sum(n.actors for n in self.nodes)

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def tier_capacity(self, roster: Roster | None = None) -> dict[str, int]:
        """Total bytes of each tier over the cluster (for the roles in ``roster``)."""
        r = roster or Roster.block(self)
        out = dict.fromkeys(TIERS, 0)
        for i, n in enumerate(self.nodes):
            nl, nb = len(r.learners[i]), len(r.buffers[i])
            if n.gpus > 0:
                out["learner_gpu"] += n.learner_gpu_bytes * nl
            if nl:
                out["learner_host"] += n.learner_host_bytes
            out["buffer_host"] += n.buffer_host_bytes * nb
        return out

    def to_dict(self) -> dict[str, Any]:
        """A mapping in the TOML file's shape (one ``[[nodes]]`` entry per node)."""
        def lk(s: LinkSpec | None) -> dict[str, float] | None:
            return None if s is None else {"bandwidth_gbps": s.bandwidth_gbps,
                                           "latency_s": s.latency_s}
        nodes = []
        for n in self.nodes:
            d: dict[str, Any] = {
                "name": n.name, "gpus": n.gpus, "learners": n.learners,
                "buffers": n.buffers, "actors": n.actors,
                "learner_gpu_bytes": n.learner_gpu_bytes,
                "learner_host_bytes": n.learner_host_bytes,
                "buffer_host_bytes": n.buffer_host_bytes}
            for key in ("gpu_host", "shm", "nvlink", "nic"):
                v = lk(getattr(n, key))
                if v is not None:
                    d[key] = v
            nodes.append(d)
        links = [{"between": [self.nodes[p.a].name, self.nodes[p.b].name],
                  "bandwidth_gbps": p.link.bandwidth_gbps, "latency_s": p.link.latency_s}
                 for p in self.paths]
        out: dict[str, Any] = {"name": self.name, "nodes": nodes}
        if links:
            out["links"] = links
        return out

    def to_toml(self) -> str:
        """The model as a ``cluster.toml`` (one ``[[nodes]]`` entry per node; written by
        ``tomli-w``, read back by :meth:`from_toml`)."""
        return to_toml(self.to_dict())

    def with_bandwidth(self, overrides: Mapping[str, float]) -> ClusterModel:
        """A copy with measured bandwidths (GB/s) for link kinds, keyed ``kind`` (all
        nodes) or ``node.kind`` (one node); used by the adaptive policy.

        Raises:
            ConfigError: an unknown kind or node, or a bandwidth <= 0.
        """
        kinds = ("gpu_host", "shm", "nvlink", "nic")
        per_node: dict[int, dict[str, float]] = {}
        for key, bw in overrides.items():
            node_name, _, kind = key.rpartition(".")
            if kind not in kinds:
                raise ConfigError(f"bandwidth override {key!r}: link kind must be one of "
                                  f"{kinds}", key=key)
            require(math.isfinite(bw) and bw > 0, key, bw, "a bandwidth > 0 (GB/s)")
            targets = range(len(self.nodes)) if not node_name else [self.node_index(node_name)]
            for i in targets:
                per_node.setdefault(i, {})[kind] = bw
        nodes = list(self.nodes)
        for i, kv in per_node.items():
            n = nodes[i]
            changes: dict[str, Any] = {}
            for kind, bw in kv.items():
                old = getattr(n, kind)
                if old is not None:
                    changes[kind] = LinkSpec(bandwidth_gbps=bw, latency_s=old.latency_s)
            nodes[i] = _replace_node(n, changes)
        return ClusterModel(name=self.name, nodes=tuple(nodes), paths=self.paths,
                            source=self.source)


def _replace_node(n: NodeSpec, changes: Mapping[str, Any]) -> NodeSpec:
    values = {k: getattr(n, k) for k in NodeSpec.__slots__}
    values.update(changes)
    return NodeSpec(**values)
