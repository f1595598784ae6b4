"""The sections of the library's features: ``[placement]``, ``[checkpoint]`` and
``[longhaul]`` (frozen dataclasses, ranges checked in ``__post_init__``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from conduit_hpc.config.checks import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_ROWS,
    MAX_SECONDS,
    finite,
    require,
    require_types,
)

__all__ = ["CHECKPOINT_CODECS", "CheckpointConfig", "LongHaulConfig", "PlacementConfig"]

#: lossless codecs of checkpoint columns: the filters h5py has built in, no plugin
#: ("gzip" is "gzip-1", which every HDF5 reader decodes; "lzf" is h5py's own). README,
#: "Checkpoints", gives the measurement that chose them.
CHECKPOINT_CODECS = ("none", "lzf", "gzip", *(f"gzip-{n}" for n in range(1, 10)))


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
        tiers (tuple[str, ...]): memory tiers shards may use.
        adaptive (bool): re-place shards at superstep boundaries from telemetry.
        interval_supersteps (int): supersteps between two looks of the adaptive policy.
        min_gain (float): least relative gain in predicted exposed (or path) time
            that justifies a move.
        payback_supersteps (int): a move must pay for its data movement within this
            many supersteps of predicted gain.
        patience (int): consecutive looks that must all call for a move before it happens.
        cooldown_supersteps (int): no move within this many supersteps of the last one.
        device_rows (int): rows of shards a learner's device may mirror beyond the
            plan's own ``learner_gpu`` shards (0: off): the learner promotes its hottest
            shards (mass per row) to its device and demotes them again, looked at every
            ``interval_supersteps``, changed after ``patience`` looks agree (see
            :mod:`conduit_hpc.plane.device_policy`).
    """

    planner: Literal["round_robin", "static"] = "round_robin"
    cluster: str = ""
    scope: Literal["global", "partitioned"] = "global"
    tiers: tuple[str, ...] = ("learner_gpu", "learner_host", "buffer_host")
    adaptive: bool = False
    interval_supersteps: int = 100
    min_gain: float = 0.1
    payback_supersteps: int = 1000
    patience: int = 3
    cooldown_supersteps: int = 500
    device_rows: int = 0

    def __post_init__(self) -> None:
        require_types(self)
        tiers = ("learner_gpu", "learner_host", "buffer_host")
        require(len(self.tiers) > 0 and set(self.tiers) <= set(tiers)
                and len(set(self.tiers)) == len(self.tiers), "tiers", list(self.tiers),
                f"a non-empty list of distinct tiers from {list(tiers)}")
        require(1 <= self.interval_supersteps <= MAX_ROWS, "interval_supersteps",
                self.interval_supersteps, f">= 1 and <= {MAX_ROWS}")
        require(finite(self.min_gain) and 0 <= self.min_gain < 1, "min_gain",
                self.min_gain, "a number in [0, 1)")
        require(1 <= self.payback_supersteps <= MAX_ROWS, "payback_supersteps",
                self.payback_supersteps, f">= 1 and <= {MAX_ROWS}")
        require(1 <= self.patience <= MAX_COUNT, "patience", self.patience,
                f">= 1 and <= {MAX_COUNT}")
        require(0 <= self.cooldown_supersteps <= MAX_ROWS, "cooldown_supersteps",
                self.cooldown_supersteps, f">= 0 and <= {MAX_ROWS}")
        require(0 <= self.device_rows <= MAX_ROWS, "device_rows", self.device_rows,
                f">= 0 and <= {MAX_ROWS} (0: no promotion to the learner's device)")


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
        compression (dict[str, str]): spec field -> lossless codec of its checkpoint
            datasets, one of :data:`CHECKPOINT_CODECS` (``"gzip"`` = ``"gzip-1"``);
            fields not named are stored uncompressed. A stacked field's codec applies to
            its stored frames and references (a ``next_of`` field has no columns of its
            own and is refused here; the root config checks the names).
        timeout_s (float): bound on a checkpoint's reads and writes: how long ranks wait
            for the slowest rank to write (or, at a restore, read) its part and for the
            manifest; the waits that cover that work last ``max(run.timeout_s,
            checkpoint.timeout_s)``, every other wait ``run.timeout_s``. A large replay
            on a slow or compressing file system takes minutes to write: with the stall
            bound alone, each such checkpoint was dropped (or a final one failed the
            job). A rank that stops while it writes is found after this long.
    """

    directory: str = "checkpoints"
    every_supersteps: int = 0
    every_seconds: float = 0.0
    keep: int = 3
    on_stop: bool = True
    compression: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        require_types(self)
        require(bool(self.directory.strip()), "directory", self.directory,
                "a non-empty path")
        require(0 <= self.every_supersteps <= MAX_ROWS, "every_supersteps",
                self.every_supersteps, f">= 0 (0 = never) and <= {MAX_ROWS}")
        require(finite(self.every_seconds) and 0 <= self.every_seconds <= MAX_SECONDS,
                "every_seconds", self.every_seconds,
                f"a finite number >= 0 (0 = never) and <= {MAX_SECONDS:g}")
        require(0 <= self.keep <= MAX_COUNT, "keep", self.keep,
                f">= 0 (0 = keep all) and <= {MAX_COUNT}")
        require(finite(self.timeout_s) and 0 < self.timeout_s <= MAX_SECONDS, "timeout_s",
                self.timeout_s, f"a finite number > 0 and <= {MAX_SECONDS:g} (seconds)")
        for name, codec in self.compression.items():
            require(codec in CHECKPOINT_CODECS, f"compression.{name}", codec,
                    f"one of {', '.join(CHECKPOINT_CODECS)}")

    @property
    def writes(self) -> bool:
        """Whether a run cuts checkpoints: periodic ones, or a final one on a stop (a
        resume without checkpoints of its own only reads its root)."""
        return self.on_stop or self.every_seconds > 0 or self.every_supersteps > 0


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
        compression (str): ``forward``: ``zlib`` compresses the rows of each forwarded
            message (level 1; header and priorities stay plain) and the link is charged
            with the bytes sent; ``none`` sends them as they are. Worth it while the
            link is slower than zlib (~0.27 GB/s of Atari rows on one core here; see
            ``docs/longhaul.md``).
    """

    mode: Literal["off", "forward", "edge_replay"] = "off"
    bandwidth_gbps: float = 0.001
    latency_s: float = 0.01
    burst_bytes: int = 0
    edge_ranks: tuple[int, ...] = ()
    queue_rows: int = 4096
    forward_rows: int = 64
    publish_every_s: float = 0.02
    compression: Literal["none", "zlib"] = "none"

    def __post_init__(self) -> None:
        require_types(self)
        require(finite(self.bandwidth_gbps) and 1e-12 <= self.bandwidth_gbps <= 1e6,
                "bandwidth_gbps", self.bandwidth_gbps,
                "a finite number > 0 (GB/s per direction) in [1e-12, 1e6]")
        require(finite(self.latency_s) and 0 <= self.latency_s <= 3600, "latency_s",
                self.latency_s, "a finite number >= 0 (seconds, one way) and <= 3600")
        require(0 <= self.burst_bytes <= MAX_BYTES, "burst_bytes", self.burst_bytes,
                f">= 0 and <= 2**62 ({MAX_BYTES})")
        require(all(0 <= r <= MAX_COUNT for r in self.edge_ranks)
                and len(set(self.edge_ranks)) == len(self.edge_ranks), "edge_ranks",
                self.edge_ranks,
                f"distinct world ranks in [0, {MAX_COUNT}] (empty: actors + last buffer)")
        require(1 <= self.queue_rows <= MAX_ROWS, "queue_rows", self.queue_rows,
                f">= 1 and <= 2**40 ({MAX_ROWS})")
        require(1 <= self.forward_rows <= self.queue_rows, "forward_rows", self.forward_rows,
                f"between 1 and queue_rows ({self.queue_rows})")
        require(finite(self.publish_every_s) and 0 < self.publish_every_s <= 10,
                "publish_every_s", self.publish_every_s, "between 0 (excluded) and 10")
        require(self.compression == "none" or self.mode == "forward", "compression",
                self.compression, f"'none' with mode = {self.mode!r} (only the rows that "
                f"'forward' sends are compressed)")

    @property
    def bytes_per_s(self) -> float:
        """The bandwidth in bytes per second."""
        return self.bandwidth_gbps * 1e9
