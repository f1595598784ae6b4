"""The cluster file: the ``cluster.toml`` schema, its checks, and byte sizes.

Plain Python; no MPI. The ``*Config`` dataclasses mirror the file; types and unknown
keys are checked by :mod:`conduit_hpc.config`'s loader, ranges here. The model built
from a checked file is :class:`~conduit_hpc.placement.cluster.ClusterModel`.

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
from dataclasses import dataclass

from conduit_hpc.config import require
from conduit_hpc.errors import ConfigError

__all__ = [
    "MAX_NODES",
    "MAX_PER_NODE",
    "MAX_RANKS",
    "ClusterFile",
    "LinkConfig",
    "LinkSpec",
    "NodeConfig",
    "expand_names",
    "parse_bytes",
]

#: bounds checked before anything is allocated (a cluster file cannot make the planner
#: grow without bound): nodes in all, ranks or GPUs of one kind per node, ranks in all.
#: The planner's cost model holds arrays over pairs of nodes (global sampling reads
#: every node from every learner node): at 2048 nodes a plan takes about 0.5 GB and
#: seconds, at 4096 1.5 GB, at 50,000 it asked for 37 GiB - on every rank that plans
MAX_NODES = 2048
MAX_PER_NODE = 4096
MAX_RANKS = 1 << 20
#: bytes of one location's tier (1 PB; a node holds far less), so that a cluster's sums
#: stay exact in int64 and finite in the planner's LP
MAX_TIER_BYTES = 10**15
#: link bandwidth (GB/s: 1 kB/s .. 1 PB/s) and one-way latency (s): beyond these a link
#: is a typo, and the LP's costs lose their precision
MIN_GBPS, MAX_GBPS, MAX_LATENCY_S = 1e-6, 1e6, 60.0

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
        return _at_most(int(value), key, value)
    m = _BYTES_RE.match(value)
    text = value.strip()
    if text.startswith("-"):
        raise ConfigError(f"{key} must be >= 0 bytes, got {value!r}", key=key)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{key} must be a number of bytes or a string like '16 GB' "
                          f"(units: {', '.join(u for u in _UNITS if u)}), got {value!r}",
                          key=key)
    number = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(number):
        raise ConfigError(f"{key} must be at most {MAX_TIER_BYTES} bytes (1 PB), got "
                          f"{value!r}", key=key)
    return _at_most(int(number), key, value)


def _at_most(n: int, key: str, value: object) -> int:
    if n > MAX_TIER_BYTES:
        raise ConfigError(f"{key} must be at most {MAX_TIER_BYTES} bytes (1 PB), got "
                          f"{value!r}", key=key)
    return n


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
        require(math.isfinite(self.bandwidth_gbps) and
                MIN_GBPS <= self.bandwidth_gbps <= MAX_GBPS, "bandwidth_gbps",
                self.bandwidth_gbps, f"a finite number > 0 (GB/s), between {MIN_GBPS:g} "
                f"and {MAX_GBPS:g}")
        require(math.isfinite(self.latency_s) and 0 <= self.latency_s <= MAX_LATENCY_S,
                "latency_s", self.latency_s, f"a finite number >= 0 (seconds), at most "
                f"{MAX_LATENCY_S:g}")

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
        require(1 <= self.count <= MAX_NODES, "count", self.count,
                f"between 1 and {MAX_NODES} (the nodes a plan can be computed for here)")
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
        require(nodes <= MAX_NODES, "nodes", f"{nodes} nodes", f"at most {MAX_NODES} nodes "
                f"(the planner's memory grows with the square of the nodes)")
        require(ranks <= MAX_RANKS, "nodes", f"{ranks} ranks",
                f"at most {MAX_RANKS} ranks in all (what a plan can be computed for here)")
        names: list[str] = []
        for n in self.nodes:
            names.extend(expand_names(n))
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


def expand_names(n: NodeConfig) -> list[str]:
    """The names of the nodes of one ``[[nodes]]`` entry (``name0 ..`` when count > 1)."""
    return [n.name] if n.count == 1 else [f"{n.name}{i}" for i in range(n.count)]
