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

TOML format (see ``jobs/cluster-*.toml``)::

    name = "dgx-h100"
    [[nodes]]
    name = "dgx"            # count > 1 names the nodes dgx0, dgx1, ...
    count = 1
    gpus = 8
    learners = 8            # learner ranks (one per GPU; default: gpus, or 1 without GPUs)
    buffers = 1
    actors = 32
    learner_gpu_bytes = "16 GB"     # integers (bytes) or strings with a unit
    learner_host_bytes = "1 TB"
    buffer_host_bytes = "512 GB"
    gpu_host = { bandwidth_gbps = 55.0, latency_s = 2e-6 }
    shm = { bandwidth_gbps = 200.0, latency_s = 5e-7 }
    nvlink = { bandwidth_gbps = 450.0, latency_s = 2e-6 }
    nic = { bandwidth_gbps = 400.0, latency_s = 3e-6 }
    [[links]]
    between = ["edge0", "cloud0"]
    bandwidth_gbps = 0.125
    latency_s = 0.02
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc.config import load, require, to_toml, validate
from conduit_hpc.errors import ConfigError

__all__ = [
    "TIERS",
    "ClusterModel",
    "LinkConfig",
    "LinkSpec",
    "LinkTable",
    "NodeConfig",
    "NodeSpec",
    "Roster",
    "parse_bytes",
]

#: bounds checked before anything is allocated (a cluster file cannot make the planner
#: grow without bound): nodes in all, ranks or GPUs of one kind per node, ranks in all
MAX_NODES = 100_000
MAX_PER_NODE = 4096
MAX_RANKS = 1 << 20

TIERS = ("learner_gpu", "learner_host", "buffer_host")

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: float | int | str, key: str) -> int:
    """Bytes from an integer or a string such as ``"16 GB"`` / ``"512MiB"``.

    Raises:
        ConfigError: naming ``key``, for a negative, non-finite or unparsable value.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be a number of bytes or a string like '16 GB', got "
                          f"{value!r}", key=key)
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{key} must be >= 0 bytes, got {value!r}", key=key)
        return int(value)
    m = _BYTES_RE.match(value)
    text = value.strip()
    if text.startswith("-"):
        raise ConfigError(f"{key} must be >= 0 bytes, got {value!r}", key=key)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{key} must be a number of bytes or a string like '16 GB' "
                          f"(units: {', '.join(u for u in _UNITS if u)}), got {value!r}",
                          key=key)
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


# ---------------------------------------------------------------------------------
# the TOML file, checked strictly (types and unknown keys by conduit_hpc.config's loader,
# ranges here)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """Bandwidth and latency of one kind of link.

    Attributes:
        bandwidth_gbps (float): GB/s (10**9 bytes per second) per direction, > 0.
        latency_s (float): one-way latency in seconds, >= 0.
    """

    bandwidth_gbps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        require(math.isfinite(self.bandwidth_gbps) and self.bandwidth_gbps > 0,
                "bandwidth_gbps", self.bandwidth_gbps, "a finite number > 0 (GB/s)")
        require(math.isfinite(self.latency_s) and self.latency_s >= 0, "latency_s",
                self.latency_s, "a finite number >= 0 (seconds)")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """One ``[[nodes]]`` entry: ``count`` identical nodes.

    Attributes:
        name (str): node name; with ``count > 1`` the nodes are ``name0 .. name{count-1}``.
        count (int): how many such nodes.
        gpus (int): GPUs per node.
        learners (int): learner ranks per node (-1: one per GPU, or 1 without GPUs).
        buffers (int): buffer ranks per node.
        actors (int): actor ranks per node.
        learner_gpu_bytes, learner_host_bytes, buffer_host_bytes (float | str): tier
            capacities (per GPU, per node, per buffer rank).
        gpu_host, shm, nvlink, nic (LinkSpec | None): the node's links.
    """

    name: str
    count: int = 1
    gpus: int = 0
    learners: int = -1
    buffers: int = 0
    actors: int = 0
    learner_gpu_bytes: float | str = 0
    learner_host_bytes: float | str = 0
    buffer_host_bytes: float | str = 0
    gpu_host: LinkSpec | None = None
    shm: LinkSpec | None = None
    nvlink: LinkSpec | None = None
    nic: LinkSpec | None = None

    def __post_init__(self) -> None:
        require(bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", self.name)), "name", self.name,
                "a name of letters, digits, '_', '-', '.' starting with a letter")
        require(1 <= self.count <= MAX_NODES, "count", self.count, f"between 1 and {MAX_NODES}")
        require(0 <= self.gpus <= MAX_PER_NODE, "gpus", self.gpus, f"between 0 and {MAX_PER_NODE}")
        require(-1 <= self.learners <= MAX_PER_NODE, "learners", self.learners,
                f"between 0 and {MAX_PER_NODE} (or -1: one per GPU)")
        if self.gpus > 0:
            require(self.learners <= self.gpus, "learners", self.learners,
                    f"<= gpus ({self.gpus}): a learner owns one GPU")
        require(0 <= self.buffers <= MAX_PER_NODE, "buffers", self.buffers,
                f"between 0 and {MAX_PER_NODE}")
        require(0 <= self.actors <= MAX_PER_NODE, "actors", self.actors,
                f"between 0 and {MAX_PER_NODE}")
        for key in ("learner_gpu_bytes", "learner_host_bytes", "buffer_host_bytes"):
            parse_bytes(getattr(self, key), key)
        require(self.shm is not None, "shm", self.shm,
                "a table {bandwidth_gbps, latency_s}: every node has host memory")
        if self.gpus > 0:
            require(self.gpu_host is not None, "gpu_host", self.gpu_host,
                    "a table {bandwidth_gbps, latency_s} on a node with GPUs")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkConfig:
    """One ``[[links]]`` entry: a link between two named nodes (both directions).

    Attributes:
        between (tuple[str, ...]): the two node names.
        bandwidth_gbps (float): GB/s per direction.
        latency_s (float): one-way latency.
    """

    between: tuple[str, ...]
    bandwidth_gbps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        require(len(self.between) == 2 and self.between[0] != self.between[1], "between",
                list(self.between), "two different node names")
        LinkSpec(bandwidth_gbps=self.bandwidth_gbps, latency_s=self.latency_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterFile:
    """The whole ``cluster.toml``."""

    name: str = "cluster"
    nodes: tuple[NodeConfig, ...] = ()
    links: tuple[LinkConfig, ...] = ()

    def __post_init__(self) -> None:
        require(len(self.nodes) >= 1, "nodes", list(self.nodes), "at least one [[nodes]] entry")
        ranks = sum(n.count * (max(n.learners, n.gpus) + n.buffers + n.actors)
                    for n in self.nodes)
        nodes = sum(n.count for n in self.nodes)
        require(nodes <= MAX_NODES, "nodes", f"{nodes} nodes", f"at most {MAX_NODES} nodes")
        require(ranks <= MAX_RANKS, "nodes", f"{ranks} ranks",
                f"at most {MAX_RANKS} ranks in all (what a plan can be computed for here)")
        names: list[str] = []
        for n in self.nodes:
            names.extend(_expand_names(n))
        seen: set[str] = set()
        for i, nm in enumerate(names):
            if nm in seen:
                raise ConfigError(f"nodes: node name {nm!r} is defined twice (entry "
                                  f"{i}); names must be unique", key="nodes")
            seen.add(nm)
        multi = len(names) > 1
        if multi:
            for i, n in enumerate(self.nodes):
                require(n.nic is not None, f"nodes[{i}].nic", None,
                        "a table {bandwidth_gbps, latency_s} in a cluster of several nodes")
        pairs: set[frozenset[str]] = set()
        for i, ln in enumerate(self.links):
            for j, nm in enumerate(ln.between):
                if nm not in seen:
                    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
                    raise ConfigError(
                        f"links[{i}].between[{j}] names node {nm!r}, which is not defined "
                        f"in [[nodes]] (nodes: {shown})", key=f"links[{i}].between")
            pair = frozenset(ln.between)
            if pair in pairs:
                raise ConfigError(f"links[{i}].between {list(ln.between)!r}: these two nodes "
                                  f"already have a link", key=f"links[{i}].between")
            pairs.add(pair)


def _expand_names(n: NodeConfig) -> list[str]:
    return [n.name] if n.count == 1 else [f"{n.name}{i}" for i in range(n.count)]


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
            for nm in _expand_names(n):
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


# ---------------------------------------------------------------------------------
# ranks


@dataclass(frozen=True, slots=True)
class Roster:
    """Which world ranks play which role on each node of a :class:`ClusterModel`.

    Attributes:
        learners (tuple[tuple[int, ...], ...]): per node, learner world ranks (learner
            ``i`` of a node owns GPU ``i``).
        buffers (tuple[tuple[int, ...], ...]): per node, buffer world ranks.
        actors (tuple[tuple[int, ...], ...]): per node, actor world ranks.
    """

    learners: tuple[tuple[int, ...], ...]
    buffers: tuple[tuple[int, ...], ...]
    actors: tuple[tuple[int, ...], ...]

    @classmethod
    def block(cls, cluster: ClusterModel) -> Roster:
        """Node-major world ranks: on each node its learners, then buffers, then actors
        (what ``[layout] per_node = true`` gives with ranks placed node by node)."""
        learners, buffers, actors = [], [], []
        r = 0
        for n in cluster.nodes:
            learners.append(tuple(range(r, r + n.learners)))
            r += n.learners
            buffers.append(tuple(range(r, r + n.buffers)))
            r += n.buffers
            actors.append(tuple(range(r, r + n.actors)))
            r += n.actors
        return cls(tuple(learners), tuple(buffers), tuple(actors))

    @classmethod
    def from_ranks(cls, cluster: ClusterModel, node_of: Sequence[int],
                   learner_ranks: Sequence[int], buffer_ranks: Sequence[int],
                   actor_ranks: Sequence[int]) -> Roster:
        """From a running job's role split (``RoleComms``): ``node_of[r]`` is the node
        index of world rank ``r``.

        Raises:
            ConfigError: the job's nodes do not match the model (count, or more learners
                on a node than it has GPUs).
        """
        nn = len(cluster.nodes)
        if node_of and max(node_of) >= nn:
            raise ConfigError(f"the job runs on {max(node_of) + 1} nodes but cluster "
                              f"{cluster.name!r} describes {nn}", key="placement.cluster")
        per: list[list[list[int]]] = [[[], [], []] for _ in range(nn)]
        for k, ranks in enumerate((learner_ranks, buffer_ranks, actor_ranks)):
            for r in ranks:
                per[node_of[r]][k].append(int(r))
        for i, (ls, _, _) in enumerate(per):
            g = cluster.nodes[i].gpus
            if g and len(ls) > g:
                raise ConfigError(f"node {cluster.nodes[i].name!r} runs {len(ls)} learners "
                                  f"but has {g} GPUs", key="placement.cluster")
        return cls(tuple(tuple(sorted(p[0])) for p in per),
                   tuple(tuple(sorted(p[1])) for p in per),
                   tuple(tuple(sorted(p[2])) for p in per))

    @property
    def all_learners(self) -> tuple[int, ...]:
        return tuple(r for ls in self.learners for r in ls)

    @property
    def all_buffers(self) -> tuple[int, ...]:
        return tuple(r for bs in self.buffers for r in bs)

    @property
    def all_actors(self) -> tuple[int, ...]:
        return tuple(r for a in self.actors for r in a)


# ---------------------------------------------------------------------------------
# the directed links, numbered


class LinkTable:
    """Every directed link of a cluster, numbered; arrays of bandwidth and latency.

    Link ids: ``h2d[gpu]``, ``d2h[gpu]``, ``nvl_out[gpu]``, ``nvl_in[gpu]`` per GPU (global
    GPU numbering: node by node), ``shm[node]``, ``nic_out[node]``, ``nic_in[node]`` per
    node, and one per direction of each explicit node-to-node link. A missing link kind
    gets id -1.

    Args:
        cluster (ClusterModel): the model.
    """

    KINDS = ("h2d", "d2h", "nvl_out", "nvl_in", "shm", "nic_out", "nic_in", "path")

    def __init__(self, cluster: ClusterModel) -> None:
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
        self.path_matrix = np.full((nn, nn), -1, dtype=np.int64)
        for (a, b), k in self.path.items():
            self.path_matrix[a, b] = k
        self.names = tuple(names)
        self.kind = np.asarray(kinds, dtype=np.int64)
        self.node = np.asarray(nodes, dtype=np.int64)
        self.bytes_per_s = np.asarray(bw, dtype=np.float64)
        self.latency_s = np.asarray(lat, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.names)

    def kind_name(self, link: int) -> str:
        return self.KINDS[int(self.kind[link])]
