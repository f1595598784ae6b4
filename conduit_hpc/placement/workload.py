"""The workload: what the experience path must carry, and its loading from a job.

Plain Python and numpy; no MPI. The cost model that prices a workload on a cluster is
:mod:`conduit_hpc.placement.model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from conduit_hpc.config import (
    Config,
    SchedulerConfig,
    StorageConfig,
    read_toml,
    require,
    validate,
)
from conduit_hpc.config.checks import MAX_BYTES, MAX_COUNT, MAX_ROW_BYTES, MAX_ROWS, MAX_SECONDS
from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.cluster import TIERS

__all__ = [
    "INDEX_BYTES_PER_ROW",
    "SHARD_OVERHEAD_BYTES",
    "STAMP_BYTES_PER_ROW",
    "Workload",
    "sampling_of",
]

#: per row: the ring's blocks beside the payload (``storage.layout.ShardLayout``): stamp,
#: initial priority, generation, sampled mark, raw priority and hidden flag, 8 B each
STAMP_BYTES_PER_ROW = 48
#: per row at most: the sum- and min-tree, 2 x 2P float64 nodes for P the power of two
#: >= the shard's rows (32 B a row when they are a power of two, up to 64 just above
#: one). Every shard lays them out, whatever the sampler
INDEX_BYTES_PER_ROW = 64
#: per shard: ring header and the alignment padding of its blocks (<= 60 fields)
SHARD_OVERHEAD_BYTES = 4096
#: learner updates per second a plan is computed for (a superstep of 1 us .. ~11.6 days;
#: beyond, the cost model's per-superstep loads overflow or vanish in float64)
MIN_RATE_HZ, MAX_RATE_HZ = 1e-6, 1e6
#: rows each actor ingests per second (with 4 GiB rows, bytes/s stay finite sums)
MAX_ACTOR_ROWS_PER_S = 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What the experience path must carry.

    Attributes:
        capacity_rows (int): replay capacity over all shards (rows).
        row_bytes (int): payload bytes of one row as a batch carries it (the spec's
            ``row_bytes``: a gather copies every frame of a stack).
        stored_row_bytes (int): bytes one row takes in a tier's memory and in an
            actor's ingest (the spec's ``stored_row_bytes``: with frame stacks, each
            frame once); 0: ``row_bytes``.
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
        min_shard_rows (int): no shard smaller than this many rows (a location whose
            share would be smaller gets none; its rows go to the partition's other
            shards); 0: no floor. A partition smaller than the floor is one shard.
            A workload derived from a job (:meth:`from_job`) uses the batch.
    """

    capacity_rows: int
    row_bytes: int
    stored_row_bytes: int = 0
    batch_rows: int = 256
    update_rate_hz: float = 100.0
    actor_rows_per_s: float = 1000.0
    sampling: Literal["uniform", "prioritized"] = "uniform"
    scope: Literal["global", "partitioned"] = "global"
    compute_s: float = 0.0
    heat: tuple[tuple[float, ...], ...] = ()
    tiers: tuple[str, ...] = TIERS
    min_shard_rows: int = 0

    def __post_init__(self) -> None:
        require(0 < self.capacity_rows <= MAX_ROWS, "capacity_rows", self.capacity_rows,
                f"between 1 and {MAX_ROWS}")
        require(0 < self.row_bytes <= MAX_ROW_BYTES, "row_bytes", self.row_bytes,
                f"between 1 and {MAX_ROW_BYTES} (4 GiB)")
        require(0 <= self.stored_row_bytes <= self.row_bytes, "stored_row_bytes",
                self.stored_row_bytes, f">= 0 (0: row_bytes) and <= row_bytes "
                f"({self.row_bytes})")
        total = self.capacity_rows * (self.stored_bytes + STAMP_BYTES_PER_ROW
                                      + INDEX_BYTES_PER_ROW)
        require(total <= MAX_BYTES, "capacity_rows", self.capacity_rows,
                f"at most {MAX_BYTES} bytes of replay in all with row_bytes = "
                f"{self.row_bytes} (int64 sums), got {total} bytes")
        require(0 < self.batch_rows <= MAX_COUNT, "batch_rows", self.batch_rows,
                f"between 1 and {MAX_COUNT}")
        require(np.isfinite(self.update_rate_hz) and
                MIN_RATE_HZ <= self.update_rate_hz <= MAX_RATE_HZ, "update_rate_hz",
                self.update_rate_hz, f"between {MIN_RATE_HZ:g} and {MAX_RATE_HZ:g} updates "
                f"per second")
        require(np.isfinite(self.actor_rows_per_s) and
                0 <= self.actor_rows_per_s <= MAX_ACTOR_ROWS_PER_S, "actor_rows_per_s",
                self.actor_rows_per_s, f"between 0 and {MAX_ACTOR_ROWS_PER_S:g} rows per "
                f"second")
        require(0 <= self.min_shard_rows <= MAX_ROWS, "min_shard_rows",
                self.min_shard_rows, f">= 0 (0: no floor) and <= {MAX_ROWS}")
        require(np.isfinite(self.compute_s) and 0 <= self.compute_s <= MAX_SECONDS,
                "compute_s", self.compute_s, f"between 0 and {MAX_SECONDS:g} seconds (0: "
                f"the superstep period)")
        require(len(self.tiers) > 0 and set(self.tiers) <= set(TIERS)
                and len(set(self.tiers)) == len(self.tiers), "tiers", list(self.tiers),
                f"a non-empty list of distinct tiers from {list(TIERS)}")
        if self.heat:
            require(self.sampling == "prioritized", "heat", [list(b) for b in self.heat],
                    "empty unless sampling = 'prioritized' (uniform sampling draws rows "
                    "evenly)")
            ok = all(len(b) == 2 and 0 < b[0] <= 1 and 0 <= b[1] <= 1 for b in self.heat)
            require(ok, "heat", [list(b) for b in self.heat],
                    "a list of [row share in (0, 1], mass share in [0, 1]] pairs")
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
    def stored_bytes(self) -> int:
        """Payload bytes one row takes in memory and in ingest (:attr:`stored_row_bytes`,
        or :attr:`row_bytes` when that is 0)."""
        return self.stored_row_bytes or self.row_bytes

    @property
    def bytes_per_row(self) -> int:
        """Memory one row takes in a tier at most: stored payload, the ring's stamp and
        priority blocks and the priority index (a shard lays the index out whatever the
        sampler: uniform sampling takes the memory too). At most: the trees take 32 B a
        row less in a shard whose rows are a power of two."""
        return self.stored_bytes + STAMP_BYTES_PER_ROW + INDEX_BYTES_PER_ROW

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
            try:  # through a table of its own: keys named workload.KEY, [workload]
                return validate(_WorkloadFile, {"workload": raw["workload"]}).workload, []
            except ConfigError as err:
                raise ConfigError(f"{p.name}: {err}", key=err.key) from err
        return cls.from_job(Config.from_toml(p))

    @classmethod
    def from_job(cls, cfg: Config) -> tuple[Workload, list[str]]:
        """Derive a workload from a job config; notes say what was assumed.

        Rows from ``[spec.*]``, capacity from ``[storage]``, the batch from
        ``[scheduler]`` (also the smallest shard, ``min_shard_rows``), sampling from
        ``scheduler.sampler`` and
        ``storage.priority_exponent`` (:func:`sampling_of`), the scope from
        ``[placement]``, and the actor rate from ``synthetic.actor_rate_rows_s`` when the
        job has it.
        """
        from conduit_hpc.spec import Spec

        if not cfg.spec:
            raise ConfigError("the job config has no [spec.*] fields to size rows from "
                              "(or give a [workload] table)", key="spec")
        notes = ["update_rate_hz = 100.0 (assumed; a job config does not say it)",
                 f"min_shard_rows = {cfg.scheduler.batch_rows} (the batch; "
                 f"--min-shard-rows to change)"]
        rate = float(getattr(getattr(cfg, "synthetic", None), "actor_rate_rows_s", 0.0))
        if rate <= 0:
            rate = 1000.0
            notes.append("actor_rows_per_s = 1000.0 (assumed)")
        spec = Spec.from_config(cfg.spec)
        return cls(capacity_rows=cfg.storage.capacity_rows,
                   row_bytes=spec.row_bytes, stored_row_bytes=spec.stored_row_bytes,
                   batch_rows=cfg.scheduler.batch_rows, update_rate_hz=100.0,
                   min_shard_rows=cfg.scheduler.batch_rows,
                   actor_rows_per_s=rate,
                   sampling=sampling_of(cfg.scheduler, cfg.storage),
                   scope=cfg.placement.scope), notes


@dataclass(frozen=True, slots=True, kw_only=True)
class _WorkloadFile:
    """The ``[workload]`` table of a TOML file (the file's other tables are not read)."""

    workload: Workload


def sampling_of(scheduler: SchedulerConfig, storage: StorageConfig
                ) -> Literal["uniform", "prioritized"]:
    """The cost model's sampling of a job: ``prioritized`` when the scheduler samples by
    priority with an exponent > 0 (the priority index then takes memory), else
    ``uniform``."""
    prioritized = scheduler.sampler == "prioritized" and storage.priority_exponent > 0
    return "prioritized" if prioritized else "uniform"
