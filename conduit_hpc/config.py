"""Typed, frozen job configuration loaded from TOML.

A job is described by one :class:`Config` (sections ``[run]``, ``[layout]``, ``[spec.*]``,
``[storage]``, ``[transport]``, ...). Jobs that need sections of their own subclass
:class:`Config` and add fields; :meth:`Config.from_toml` works on the subclass.

Loading is strict: an unknown key, a value of the wrong type or one out of range raises
:class:`~conduit_hpc.errors.ConfigError` naming the dotted key, the value and what was
expected. Nothing here imports MPI; :func:`check_same_config` (in ``roles``) compares
:meth:`Config.digest` across ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

from conduit_hpc.errors import ConfigError

__all__ = [
    "CheckpointConfig",
    "Config",
    "FieldConfig",
    "LayoutConfig",
    "LongHaulConfig",
    "PlacementConfig",
    "RunConfig",
    "SchedulerConfig",
    "StorageConfig",
    "TransportConfig",
    "config_from_dict",
    "parse_override",
    "require",
    "to_toml",
]

T = TypeVar("T")

_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)


def require(ok: bool, key: str, value: object, expected: str) -> None:
    """Raise :class:`ConfigError` naming ``key``, ``value`` and ``expected`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} must be {expected}, got {value!r}", key=key)


def _finite(v: float) -> bool:
    return math.isfinite(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """``[run]``: identity of the job and its global limits.

    Attributes:
        name (str): job name, used for run directories.
        seed (int): base seed; rank ``r`` seeds with ``seed + world_rank``.
        timeout_s (float): bound on every blocking wait of the data plane.
        duration_s (float): wall-time budget of a job's main loop (0 = job decides).
    """

    name: str = "conduit"
    seed: int = 0
    timeout_s: float = 120.0
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        require(bool(self.name) and self.name.replace("-", "").replace("_", "").isalnum(),
                "name", self.name, "a non-empty name of letters, digits, '-' and '_'")
        require(self.seed >= 0, "seed", self.seed, ">= 0")
        require(_finite(self.timeout_s) and self.timeout_s > 0, "timeout_s", self.timeout_s,
                "a finite number > 0")
        require(_finite(self.duration_s) and self.duration_s >= 0, "duration_s",
                self.duration_s, "a finite number >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutConfig:
    """``[layout]``: how ``COMM_WORLD`` splits into roles.

    With ``per_node = false`` the counts are for the whole world: world ranks
    ``0 .. learners-1`` are learners, the next ``buffers`` are buffers, the rest actors.
    With ``per_node = true`` the counts are per node (node-local ranks in that order).
    ``actors = 0`` means "every remaining rank".

    Attributes:
        learners (int): learner ranks (per node when ``per_node``).
        buffers (int): buffer ranks (per node when ``per_node``).
        actors (int): actor ranks, 0 for all the remaining ranks.
        per_node (bool): counts are per node rather than for the world.
        emulate_nodes (int): when > 0, treat the world as this many nodes of consecutive
            ranks (for tests of multi-node paths on one machine); 0 uses the real nodes.
    """

    learners: int = 1
    buffers: int = 1
    actors: int = 0
    per_node: bool = False
    emulate_nodes: int = 0

    def __post_init__(self) -> None:
        require(self.learners >= 0, "learners", self.learners, ">= 0")
        require(self.buffers >= 1, "buffers", self.buffers, ">= 1")
        require(self.actors >= 0, "actors", self.actors, ">= 0 (0 = all remaining ranks)")
        require(self.emulate_nodes >= 0, "emulate_nodes", self.emulate_nodes, ">= 0")

    @property
    def fixed_ranks(self) -> int:
        """Ranks the layout needs (per node when ``per_node``), counting one actor for 0."""
        return self.learners + self.buffers + max(self.actors, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldConfig:
    """``[spec.NAME]``: one field of the experience spec.

    Attributes:
        dtype (str): numpy dtype name (``float32``, ``uint8``, ...).
        shape (tuple[int, ...]): per-row shape, ``[]`` for a scalar.
        allow_nan (bool): when false, a NaN in this field is refused at ingest.
    """

    dtype: str
    shape: tuple[int, ...] = ()
    allow_nan: bool = True

    def __post_init__(self) -> None:
        require(self.dtype in _DTYPES, "dtype", self.dtype, f"one of {', '.join(_DTYPES)}")
        for d in self.shape:
            require(d > 0, "shape", self.shape, "a list of positive integers")


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageConfig:
    """``[storage]``: replay capacity and sharding.

    Attributes:
        capacity_rows (int): total replay capacity over all shards (rows).
        shards_per_buffer (int): shards held by each buffer rank.
        initial_priority (float): priority of a row inserted without one, until a
            larger priority has been seen (new rows enter at the running maximum).
        priority_exponent (float): alpha in p**alpha (0 = uniform).
    """

    capacity_rows: int = 100_000
    shards_per_buffer: int = 1
    initial_priority: float = 1.0
    priority_exponent: float = 0.6

    def __post_init__(self) -> None:
        require(self.capacity_rows > 0, "capacity_rows", self.capacity_rows, "> 0")
        require(self.shards_per_buffer >= 1, "shards_per_buffer", self.shards_per_buffer,
                ">= 1")
        require(_finite(self.initial_priority) and self.initial_priority > 0,
                "initial_priority", self.initial_priority, "a finite number > 0")
        require(_finite(self.priority_exponent) and self.priority_exponent >= 0,
                "priority_exponent", self.priority_exponent, "a finite number >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """``[transport]``: how bytes move.

    Attributes:
        shared_memory (str): ``auto`` reads and writes windows of ranks on the same node
            with plain numpy; ``never`` forces MPI RMA for every access (what ranks on
            different nodes do).
        poll_interval_s (float): sleep between polls of a waiting loop.
    """

    shared_memory: Literal["auto", "never"] = "auto"
    poll_interval_s: float = 0.0002

    def __post_init__(self) -> None:
        require(_finite(self.poll_interval_s) and 0 <= self.poll_interval_s <= 0.1,
                "poll_interval_s", self.poll_interval_s, "between 0 and 0.1")


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """``[scheduler]``: delivery to learners and the RL semantics it keeps.

    Attributes:
        mode (str): ``edp`` (a data-plane thread prepares batches ahead of the learner),
            ``sync`` (the learner samples and gathers inline, as a framework-embedded
            buffer does) or ``service`` (the learner asks buffer ranks for a batch and
            waits for the reply, as a replay server does).
        batch_rows (int): rows per learner batch.
        prefetch_depth (int): batches prepared ahead in ``edp`` mode; priorities used
            for a batch are at most this many supersteps stale.
        sampler (str): ``uniform``, ``prioritized`` or ``sequence``.
        beta, beta_final (float): importance-weight exponent, annealed linearly over
            ``beta_anneal_supersteps`` (0: constant).
        min_fill_rows (int): rows held before any learner samples.
        samples_per_insert (float): Reverb's ``SampleToInsertRatio``; 0 disables it.
        error_buffer (float): tolerance of the ratio, in sampled rows.
        max_insert_batch (int): largest ingest batch (rows); with the ratio on, larger
            batches are refused and the tolerance is checked against it.
        max_policy_lag (int): actors may fall at most this many learner supersteps
            behind the published weights before ingest waits for new ones (0: unbounded).
        weights_every (int): supersteps between weight publications.
        sequence_length, burn_in (int): window of the ``sequence`` sampler.
        cross_episode (bool): sequence windows may span episode ends.
        episode_field, stream_field (str): spec fields that mark episode ends and the
            writer's stream (sequence sampler).
        device (str): ``auto`` (the node-local GPU if any, else CPU), ``cpu``, ``cuda``.
        fetch (str): how ``edp`` and ``sync`` get rows: ``direct`` (search and copy
            shards in shared memory, RMA otherwise) or ``owner`` (the shard's owner
            samples and sends the rows, as in ``service`` - for shards behind a slow link,
            where ``edp`` then prefetches those replies ahead of the learner).
    """

    mode: Literal["edp", "sync", "service"] = "edp"
    batch_rows: int = 256
    prefetch_depth: int = 2
    sampler: Literal["uniform", "prioritized", "sequence"] = "prioritized"
    beta: float = 0.4
    beta_final: float = 1.0
    beta_anneal_supersteps: int = 0
    min_fill_rows: int = 1
    samples_per_insert: float = 0.0
    error_buffer: float = 0.0
    max_insert_batch: int = 1024
    max_policy_lag: int = 0
    weights_every: int = 1
    sequence_length: int = 1
    burn_in: int = 0
    cross_episode: bool = False
    episode_field: str = ""
    stream_field: str = ""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    fetch: Literal["direct", "owner"] = "direct"

    def __post_init__(self) -> None:
        require(self.batch_rows >= 1, "batch_rows", self.batch_rows, ">= 1")
        require(self.prefetch_depth >= 0, "prefetch_depth", self.prefetch_depth, ">= 0")
        require(_finite(self.beta) and self.beta >= 0, "beta", self.beta, ">= 0")
        require(_finite(self.beta_final) and self.beta_final >= 0, "beta_final",
                self.beta_final, ">= 0")
        require(self.beta_anneal_supersteps >= 0, "beta_anneal_supersteps",
                self.beta_anneal_supersteps, ">= 0")
        require(self.min_fill_rows >= 1, "min_fill_rows", self.min_fill_rows, ">= 1")
        require(_finite(self.samples_per_insert) and self.samples_per_insert >= 0,
                "samples_per_insert", self.samples_per_insert, ">= 0 (0 disables it)")
        require(_finite(self.error_buffer) and self.error_buffer >= 0, "error_buffer",
                self.error_buffer, ">= 0")
        require(self.max_insert_batch >= 1, "max_insert_batch", self.max_insert_batch, ">= 1")
        require(self.max_policy_lag >= 0, "max_policy_lag", self.max_policy_lag,
                ">= 0 (0: unbounded)")
        require(self.weights_every >= 1, "weights_every", self.weights_every, ">= 1")
        require(self.sequence_length >= 1, "sequence_length", self.sequence_length, ">= 1")
        require(self.burn_in >= 0, "burn_in", self.burn_in, ">= 0")
        if self.max_policy_lag:
            require(self.max_policy_lag >= self.weights_every, "max_policy_lag",
                    self.max_policy_lag, f">= weights_every ({self.weights_every}), or "
                    f"actors would wait for weights that are never published in time")
        if self.samples_per_insert > 0:
            need = self.samples_per_insert * self.max_insert_batch + self.batch_rows
            require(2 * self.error_buffer >= need, "error_buffer", self.error_buffer,
                    f">= (samples_per_insert * max_insert_batch + batch_rows) / 2 = "
                    f"{need / 2:g}; narrower, actors and learners can each wait for the "
                    f"other forever")
        if self.sampler == "sequence":
            require(self.sequence_length + self.burn_in >= 2, "sequence_length",
                    self.sequence_length, ">= 2 (with burn_in) for the sequence sampler")

    @property
    def window(self) -> int:
        """Rows per sampled item (``burn_in + sequence_length`` for sequences, else 1)."""
        return self.burn_in + self.sequence_length if self.sampler == "sequence" else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementConfig:
    """``[placement]``: who decides where shards live, and when they may move.

    Attributes:
        planner (str): ``round_robin`` (shards on buffer ranks, capacity split evenly) or
            ``static`` (the capacity-constrained, bandwidth-aware planner).
        cluster (str): cluster model TOML for the static planner; "" measures one with
            the start-up probe.
        scope (str): ``global`` (every learner samples every shard) or ``partitioned``
            (each learner samples its own partition).
        sampling (str): ``uniform`` or ``prioritized``.
        tiers (tuple[str, ...]): memory tiers shards may use.
        adaptive (bool): re-place shards at superstep boundaries from telemetry.
        interval_supersteps (int): supersteps between two looks of the adaptive policy.
        min_gain (float): least relative gain in predicted exposed (or path) time
            that justifies a move.
        payback_supersteps (int): a move must pay for its data movement within this
            many supersteps of predicted gain.
        patience (int): consecutive looks that must all call for a move before it happens.
        cooldown_supersteps (int): no move within this many supersteps of the last one.
    """

    planner: Literal["round_robin", "static"] = "round_robin"
    cluster: str = ""
    scope: Literal["global", "partitioned"] = "global"
    sampling: Literal["uniform", "prioritized"] = "uniform"
    tiers: tuple[str, ...] = ("learner_gpu", "learner_host", "buffer_host")
    adaptive: bool = False
    interval_supersteps: int = 100
    min_gain: float = 0.1
    payback_supersteps: int = 1000
    patience: int = 3
    cooldown_supersteps: int = 500

    def __post_init__(self) -> None:
        tiers = ("learner_gpu", "learner_host", "buffer_host")
        require(len(self.tiers) > 0 and set(self.tiers) <= set(tiers)
                and len(set(self.tiers)) == len(self.tiers), "tiers", list(self.tiers),
                f"a non-empty list of distinct tiers from {list(tiers)}")
        require(self.interval_supersteps >= 1, "interval_supersteps",
                self.interval_supersteps, ">= 1")
        require(_finite(self.min_gain) and 0 <= self.min_gain < 1, "min_gain",
                self.min_gain, "a number in [0, 1)")
        require(self.payback_supersteps >= 1, "payback_supersteps", self.payback_supersteps,
                ">= 1")
        require(self.patience >= 1, "patience", self.patience, ">= 1")
        require(self.cooldown_supersteps >= 0, "cooldown_supersteps",
                self.cooldown_supersteps, ">= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig:
    """``[checkpoint]``: HDF5 experience checkpoints (see ``features.checkpointing``).

    Attributes:
        directory (str): checkpoint root; relative paths are under the run directory
            (``--resume`` also looks in earlier runs of the same job beside it).
        every_supersteps (int): learners request a checkpoint at every N-th superstep
            boundary (0: never).
        every_seconds (float): the buffer side starts one this often (0: never).
        keep (int): complete checkpoints kept (0: all).
        on_stop (bool): write a final checkpoint when the job is asked to stop
            (SIGTERM / SIGUSR1).
    """

    directory: str = "checkpoints"
    every_supersteps: int = 0
    every_seconds: float = 0.0
    keep: int = 3
    on_stop: bool = True

    def __post_init__(self) -> None:
        require(bool(self.directory.strip()), "directory", self.directory,
                "a non-empty path")
        require(self.every_supersteps >= 0, "every_supersteps", self.every_supersteps,
                ">= 0 (0 = never)")
        require(_finite(self.every_seconds) and self.every_seconds >= 0, "every_seconds",
                self.every_seconds, "a finite number >= 0 (0 = never)")
        require(self.keep >= 0, "keep", self.keep, ">= 0 (0 = keep all)")


@dataclass(frozen=True, slots=True, kw_only=True)
class LongHaulConfig:
    """``[longhaul]``: actors and a buffer at the edge, the learner in a data centre,
    joined by one long link (see ``docs/longhaul.md``).

    Attributes:
        mode (str): ``off``; ``forward`` (the edge buffer forwards every experience,
            FIFO, across the link into the replay beside the learner; what the link
            cannot carry queues, up to ``queue_rows``, and the oldest is dropped and
            counted); ``edge_replay`` (the prioritized replay stays on the edge buffer;
            only the learner's sampled batches cross, priority updates flow back).
        bandwidth_gbps (float): the link's bandwidth per direction in GB/s (10**9 bytes
            per second), as in the cluster model's ``[[links]]``.
        latency_s (float): one-way latency every message crossing the link pays.
        burst_bytes (int): token-bucket depth of the link (0: a plain serializer).
        edge_ranks (tuple[int, ...]): world ranks at the edge; empty: every actor and the
            last buffer rank. The other ranks are in the data centre.
        queue_rows (int): ``forward``: rows the edge buffer holds for the link at most.
        forward_rows (int): ``forward``: rows per forwarded message.
        publish_every_s (float): how often buffer ranks publish their link counters for
            the learner's per-superstep metrics and append to ``link-<rank>.csv``.
    """

    mode: Literal["off", "forward", "edge_replay"] = "off"
    bandwidth_gbps: float = 0.001
    latency_s: float = 0.01
    burst_bytes: int = 0
    edge_ranks: tuple[int, ...] = ()
    queue_rows: int = 4096
    forward_rows: int = 64
    publish_every_s: float = 0.02

    def __post_init__(self) -> None:
        require(_finite(self.bandwidth_gbps) and self.bandwidth_gbps > 0, "bandwidth_gbps",
                self.bandwidth_gbps, "a finite number > 0 (GB/s per direction)")
        require(_finite(self.latency_s) and self.latency_s >= 0, "latency_s", self.latency_s,
                "a finite number >= 0 (seconds, one way)")
        require(self.burst_bytes >= 0, "burst_bytes", self.burst_bytes, ">= 0")
        require(all(r >= 0 for r in self.edge_ranks)
                and len(set(self.edge_ranks)) == len(self.edge_ranks), "edge_ranks",
                self.edge_ranks, "distinct world ranks >= 0 (empty: actors + last buffer)")
        require(self.queue_rows >= 1, "queue_rows", self.queue_rows, ">= 1")
        require(1 <= self.forward_rows <= self.queue_rows, "forward_rows", self.forward_rows,
                f"between 1 and queue_rows ({self.queue_rows})")
        require(_finite(self.publish_every_s) and 0 < self.publish_every_s <= 10,
                "publish_every_s", self.publish_every_s, "between 0 (excluded) and 10")

    @property
    def bytes_per_s(self) -> float:
        """The bandwidth in bytes per second."""
        return self.bandwidth_gbps * 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The whole job configuration; every rank must hold an equal one."""

    run: RunConfig = field(default_factory=RunConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    spec: dict[str, FieldConfig] = field(default_factory=dict)
    storage: StorageConfig = field(default_factory=StorageConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    longhaul: LongHaulConfig = field(default_factory=LongHaulConfig)

    def __post_init__(self) -> None:
        for name in self.spec:
            require(name.isidentifier(), "spec", name, "field names that are identifiers")
        sch = self.scheduler
        for key in ("episode_field", "stream_field"):
            name = getattr(sch, key)
            require(not name or name in self.spec, f"scheduler.{key}", name,
                    f"empty or one of the spec fields ({', '.join(self.spec)})")
        if self.placement.adaptive:  # what re-placing a running job supports (replace/)
            why = "with placement.adaptive = true"
            require(self.placement.scope == "global", "placement.scope", self.placement.scope,
                    f"'global' {why} (partitioned re-placement is not implemented)")
            require(sch.sampler != "sequence", "scheduler.sampler", sch.sampler,
                    f"'uniform' or 'prioritized' {why} (moving rows would cut sequences)")
            require(self.storage.shards_per_buffer == 1, "storage.shards_per_buffer",
                    self.storage.shards_per_buffer, f"1 {why} (one shard per buffer rank)")
            require(self.layout.learners >= 1, "layout.learners", self.layout.learners,
                    f">= 1 {why} (the lead learner reports the telemetry)")
            ck = self.checkpoint
            require(ck.every_seconds == 0 and ck.every_supersteps == 0 and not ck.on_stop,
                    "checkpoint", {"every_seconds": ck.every_seconds,
                                   "every_supersteps": ck.every_supersteps,
                                   "on_stop": ck.on_stop},
                    f"off (every_seconds = 0, every_supersteps = 0, on_stop = false) {why}: "
                    f"a shard that rows moved out of holds a non-contiguous run of rows, "
                    f"which the checkpoint format does not store")
        if self.longhaul.mode == "edge_replay":
            # rows must cross the link in the owner's replies, never be read in place
            require(sch.fetch == "owner" or sch.mode == "service", "scheduler.fetch",
                    sch.fetch, "'owner' with longhaul.mode = 'edge_replay' (the edge buffer "
                    "samples and sends the rows across the link)")

    # -- loading -------------------------------------------------------------------
    @classmethod
    def from_toml(cls: type[T], path: str | Path, overrides: Sequence[str] = ()) -> T:
        """Load a config file, applying ``key=value`` overrides (TOML literals).

        Raises:
            ConfigError: unreadable file, bad TOML, unknown key, wrong type, bad range.
        """
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError as err:
            raise ConfigError(f"config file {str(p)!r} does not exist", key="") from err
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {err}",
                              key="") from err
        for ov in overrides:
            key, value = parse_override(ov)
            _set_dotted(raw, key, value)
        return config_from_dict(cls, raw)

    @classmethod
    def from_dict(cls: type[T], raw: Mapping[str, Any]) -> T:
        """Build from a plain mapping (as TOML would give), with the same checks."""
        return config_from_dict(cls, raw)

    # -- identity ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON- and TOML-compatible mapping of every value."""
        return _to_plain(self)

    def digest(self) -> str:
        """SHA-256 of the canonical JSON form; equal configs have equal digests."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def replace(self: T, **sections: Any) -> T:
        """A copy with whole sections replaced (``cfg.replace(run=...)``)."""
        return dataclasses.replace(self, **sections)  # type: ignore[type-var]


# ---------------------------------------------------------------------------------
# generic strict conversion


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=value`` and read value as a TOML literal (a bare word stays a string).

    Raises:
        ConfigError: no ``=`` or an empty key.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value", key=text)
    key, _, value = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key", key=text)
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key, parsed


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {'.'.join(parts[: i + 1])} is not a table",
                              key=key)
        node = child
    node[parts[-1]] = value


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [_to_plain(v) for v in obj]
    return obj


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (tuple, list):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin in (dict, Mapping):
        return "a table"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a table"
    if tp is type(None):
        return "nothing"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a table, got {value!r}", key=key)
        return _build(tp, value, key)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}", key=key)
        return value
    if origin in (typing.Union, types.UnionType):
        real = [a for a in get_args(tp) if a is not type(None)]
        if len(real) == 1 and value is not None:  # X | None: X's own error says more
            return _convert(real[0], value, key)
        last: ConfigError | None = None
        for arg in get_args(tp):
            if arg is type(None):
                if value is None:
                    return None
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError as err:
                last = err
        raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}",
                          key=key) from last
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}", key=key)
        (elem,) = get_args(tp)[:1]
        return tuple(_convert(elem, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a table, got {value!r}", key=key)
        _, vt = get_args(tp)
        return {str(k): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}", key=key)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}", key=key)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {value!r}", key=key)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}", key=key)
        return value
    raise TypeError(f"config field {key} has unsupported type {tp!r}")  # programming error


def _build(cls: type[T], raw: Mapping[str, Any], prefix: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        where = f"[{prefix}]" if prefix else "the top level"
        known = ", ".join(sorted(fields))
        raise ConfigError(
            f"unknown key {_join(prefix, unknown[0])!r} in {where} (known keys: {known})",
            key=_join(prefix, unknown[0]))
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in raw:
            kwargs[name] = _convert(hints[name], raw[name], _join(prefix, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{_join(prefix, name)} is required (expected "
                              f"{_type_name(hints[name])})", key=_join(prefix, name))
    try:
        return cls(**kwargs)
    except ConfigError as err:
        full = _join(prefix, err.key) if err.key else prefix
        msg = str(err)
        if err.key and prefix and msg.startswith(err.key):
            msg = full + msg[len(err.key):]
        raise ConfigError(msg, key=full) from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def config_from_dict(cls: type[T], raw: Mapping[str, Any]) -> T:
    """Build any config dataclass tree from a mapping with strict checks.

    Raises:
        ConfigError: naming the dotted key, the value and what was expected.
    """
    return _build(cls, raw, "")




def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as a TOML value")


def to_toml(data: Mapping[str, Any]) -> str:
    """Write a nested mapping of scalars and lists as TOML (tables for mappings)."""
    lines: list[str] = []

    def table(prefix: str, d: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, Mapping)}
        subs = {k: v for k, v in d.items() if isinstance(v, Mapping)}
        if prefix and (scalars or not subs):
            lines.append(f"\n[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {_toml_value(v)}")
        for k, v in subs.items():
            table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    return "\n".join(lines).lstrip("\n") + "\n"
