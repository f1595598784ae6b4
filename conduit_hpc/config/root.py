"""The whole job configuration, :class:`Config`, and its cross-section checks.

A job is described by one :class:`Config` (sections ``[run]``, ``[layout]``, ``[spec.*]``,
``[storage]``, ``[transport]``, ...). Jobs that need sections of their own subclass
:class:`Config`, add fields and declare the class to the loader (``JOB_CONFIG``, see
:mod:`conduit_hpc.config.jobs`). Nothing here imports MPI; ``check_same_config`` (in
``plane.roles``) compares :meth:`Config.digest` across ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from conduit_hpc import jsontext
from conduit_hpc.config.checks import MAX_BYTES, MAX_COUNT, MAX_ROW_BYTES, FrozenDict, require
from conduit_hpc.config.feature_sections import CheckpointConfig, LongHaulConfig, PlacementConfig
from conduit_hpc.config.launch_world import LaunchWorld, require_bytes
from conduit_hpc.config.loader import load, to_plain, validate
from conduit_hpc.config.sections import (
    FieldConfig,
    LayoutConfig,
    RunConfig,
    SchedulerConfig,
    StorageConfig,
    TransportConfig,
)
from conduit_hpc.errors import ConfigError

__all__ = ["STAMP_AND_INDEX_BYTES_PER_ROW", "STAMP_AND_INDEX_MIN_BYTES_PER_ROW", "Config"]

T = TypeVar("T")

#: bytes a row takes beside its payload at most, and at least: the ring's six 8-byte
#: blocks (stamp, priorities, generation, marks) and the sum- and min-tree, 32 to 64 B a
#: row (``placement.workload``'s ``STAMP_BYTES_PER_ROW`` + ``INDEX_BYTES_PER_ROW``; the
#: config package may not import it, a unit test keeps them equal). 96 was neither bound:
#: the size check let through shards up to 17% past its limit (small rows), the memory
#: check refused some that fit
STAMP_AND_INDEX_BYTES_PER_ROW = 48 + 64
STAMP_AND_INDEX_MIN_BYTES_PER_ROW = 48 + 32


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
        _check_section_types(self)
        # a dict of its own that cannot change: checked here, read for the whole run
        object.__setattr__(self, "spec", FrozenDict(self.spec))
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
            require(self.longhaul.mode == "off", "longhaul.mode", self.longhaul.mode,
                    f"'off' {why} (long-haul places its edge and cloud shards itself and "
                    f"paces what crosses its link; re-placing them is not implemented)")
            ck = self.checkpoint
            require(ck.every_seconds == 0 and ck.every_supersteps == 0 and not ck.on_stop,
                    "checkpoint", {"every_seconds": ck.every_seconds,
                                   "every_supersteps": ck.every_supersteps,
                                   "on_stop": ck.on_stop},
                    f"off (every_seconds = 0, every_supersteps = 0, on_stop = false) {why}: "
                    f"a shard that rows moved out of holds a non-contiguous run of rows, "
                    f"which the checkpoint format does not store")
        self._check_frame_stacks()
        self._check_compression()
        if self.placement.device_rows:
            self._check_device_rows()
        if self.layout.learners_ingest:
            self._check_learners_ingest()
        self._check_sizes()
        if sch.delivery == "process":
            self._check_process_delivery()
        if self.longhaul.mode == "edge_replay":
            # rows must cross the link in the owner's replies, never be read in place
            require(sch.fetch == "owner" or sch.mode == "service", "scheduler.fetch",
                    sch.fetch, "'owner' with longhaul.mode = 'edge_replay' (the edge buffer "
                    "samples and sends the rows across the link)")

    def _check_frame_stacks(self) -> None:
        """Frame-stack declarations against the other fields (``[spec.NAME] stack`` and
        ``next_of``; see :class:`~conduit_hpc.config.sections.StackConfig`): a stack's
        stream is an integer scalar field that is no stack itself; a next stack follows
        one stacked field, of its dtype and shape, and no two follow the same one."""
        followed: dict[str, str] = {}
        for name, fc in self.spec.items():
            if fc.stack.enabled:
                key, stream = f"spec.{name}.stack.stream", fc.stack.stream
                others = ", ".join(n for n in self.spec if n != name) or "none"
                require(stream != name and stream in self.spec, key, stream,
                        f"another spec field (the stream's id; the fields: {others})")
                sf = self.spec[stream]
                require(sf.shape == () and sf.dtype.startswith(("int", "uint")), key, stream,
                        f"an integer scalar field (spec.{stream} is {sf.dtype} of shape "
                        f"{list(sf.shape)})")
                require(not sf.stack.enabled and not sf.next_of, key, stream,
                        f"a field that is not a frame stack itself (spec.{stream} is one)")
            if fc.next_of:
                key, of = f"spec.{name}.next_of", fc.next_of
                require(of != name and of in self.spec and self.spec[of].stack.enabled, key,
                        of, "a spec field declared a stack ([spec.NAME] stack = {axis = 0, "
                        "stream = ...}); stacked fields: "
                        + (", ".join(n for n, f in self.spec.items() if f.stack.enabled)
                           or "none"))
                src = self.spec[of]
                require(src.dtype == fc.dtype and src.shape == fc.shape, key, of,
                        f"a field of this one's dtype and shape ({fc.dtype} "
                        f"{list(fc.shape)}); spec.{of} is {src.dtype} {list(src.shape)}")
                require(of not in followed, key, of,
                        f"a stacked field that no other field follows (spec.{followed.get(of)}"
                        f" has next_of = {of!r} too)")
                followed[of] = name
        for name, fc in self.spec.items():
            if fc.stack.enabled:  # one row may bring a new frame per reference
                need = fc.shape[fc.stack.axis] * (2 if name in followed else 1)
                require(self.storage.capacity_rows >= need, "storage.capacity_rows",
                        self.storage.capacity_rows, f">= {need} with frame stacks (a row "
                        f"references {need} frames of spec.{name}, each new one a slot)")
        if any(fc.stack.enabled for fc in self.spec.values()):
            # a shard stores each frame once; a window of rows is not gathered that way
            require(self.scheduler.sampler != "sequence", "scheduler.sampler",
                    self.scheduler.sampler, "'uniform' or 'prioritized' with frame stacks "
                    "(spec.NAME.stack): the sequence sampler does not rebuild stacks yet")

    def _check_compression(self) -> None:
        """``checkpoint.compression`` names spec fields that own stored columns."""
        for name in self.checkpoint.compression:
            key = f"checkpoint.compression.{name}"
            require(name in self.spec, key, name,
                    f"a spec field (the fields: {', '.join(self.spec) or 'none'})")
            of = self.spec[name].next_of
            require(not of, key, name,
                    f"a field with columns of its own: spec.{name} is the next stack of "
                    f"spec.{of} (next_of), whose stored frames it shares; name {of!r}")

    def _check_process_delivery(self) -> None:
        """What ``scheduler.delivery = "process"`` supports (a delivery rank per learner
        owns the experience path; see :mod:`conduit_hpc.plane.delivery_rank`)."""
        why = "with scheduler.delivery = 'process'"
        require(self.layout.learners >= 1, "layout.learners", self.layout.learners,
                f">= 1 {why} (a delivery rank serves a learner)")
        ck = self.checkpoint
        require(ck.every_seconds == 0 and ck.every_supersteps == 0 and not ck.on_stop,
                "checkpoint", {"every_seconds": ck.every_seconds,
                               "every_supersteps": ck.every_supersteps,
                               "on_stop": ck.on_stop},
                f"off (every_seconds = 0, every_supersteps = 0, on_stop = false) {why}: the "
                f"cut's marker leaves the learner while its priority updates leave the "
                f"delivery rank, so the order the checkpoint protocol needs is not kept "
                f"(not implemented; use delivery = 'thread')")
        require(not self.placement.adaptive, "placement.adaptive", self.placement.adaptive,
                f"false {why} (live re-placement reads the learner's sampling; not "
                f"implemented for a delivery rank)")
        require(self.longhaul.mode == "off", "longhaul.mode", self.longhaul.mode,
                f"'off' {why} (long-haul places and paces the learner's own traffic; not "
                f"implemented for a delivery rank)")

    def _check_device_rows(self) -> None:
        """What promoting shards to a learner's device supports
        (:mod:`conduit_hpc.plane.device_policy`)."""
        why = f"with placement.device_rows = {self.placement.device_rows}"
        sch = self.scheduler
        require(sch.delivery == "thread", "scheduler.delivery", sch.delivery,
                f"'thread' {why} (a delivery rank gathers batches and has no device)")
        require(sch.sampler != "sequence", "scheduler.sampler", sch.sampler,
                f"'uniform' or 'prioritized' {why} (the sequence sampler cuts windows on "
                f"the ring's owner, not on the device)")
        require(not self.placement.adaptive, "placement.adaptive", self.placement.adaptive,
                f"false {why} (live re-placement moves shards between buffer ranks; the "
                f"two are not combined)")
        require(self.longhaul.mode != "edge_replay", "longhaul.mode", self.longhaul.mode,
                f"'off' or 'forward' {why} (edge_replay's replay stays at the edge and only "
                f"sampled batches cross the link; a device mirror would read it in place)")
        require(self.transport.shared_memory == "auto", "transport.shared_memory",
                self.transport.shared_memory,
                f"'auto' {why} (a mirror is synced from the node's shared memory; with "
                f"'never' no shard could be promoted)")

    def _check_learners_ingest(self) -> None:
        """What a rank that both ingests and learns cannot do: wait for itself."""
        why = "with layout.learners_ingest = true"
        sch = self.scheduler
        require(self.layout.learners >= 1, "layout.learners", self.layout.learners,
                f">= 1 {why}")
        require(sch.samples_per_insert == 0, "scheduler.samples_per_insert",
                sch.samples_per_insert, f"0 {why} (a learner held back from inserting "
                f"until it samples would wait for itself; its own loop sets the ratio)")
        require(sch.max_policy_lag == 0, "scheduler.max_policy_lag", sch.max_policy_lag,
                f"0 {why} (a learner's rows come from its own, current weights)")
        require(self.longhaul.mode == "off", "longhaul.mode", self.longhaul.mode,
                f"'off' {why} (the link's stations place and route actors' rows only)")
        require(not self.placement.adaptive, "placement.adaptive", self.placement.adaptive,
                f"false {why} (live re-placement routes actors' rows only)")
        require(sch.delivery == "thread", "scheduler.delivery", sch.delivery,
                f"'thread' {why} (the learner's own rows are written where its MPI calls "
                f"are made, the data-plane thread; a delivery rank has no such thread)")

    def _check_sizes(self) -> None:
        """Bytes a rank will allocate from these numbers must fit in int64."""
        row = sum(f.row_bytes for f in self.spec.values())
        require(row <= MAX_ROW_BYTES, "spec", {k: list(f.shape) for k, f in self.spec.items()},
                f"fields of at most {MAX_ROW_BYTES} bytes per row together (got {row})")
        per_row = row + STAMP_AND_INDEX_BYTES_PER_ROW
        st, sch = self.storage, self.scheduler
        require(st.capacity_rows * per_row <= MAX_BYTES, "storage.capacity_rows",
                st.capacity_rows, f"<= {MAX_BYTES // per_row} with rows of {per_row} bytes "
                f"(one shard's bytes must fit in a 64-bit integer)")
        require(sch.window <= st.capacity_rows, "scheduler.sequence_length",
                sch.sequence_length, f"a window (burn_in {sch.burn_in} + sequence_length) "
                f"of at most storage.capacity_rows ({st.capacity_rows}) rows: no sequence "
                f"would ever fit in the replay")
        if sch.mode == "service" or sch.fetch == "owner":  # a shard's owner sends the rows
            per_item = sch.window * row + 24  # rows, slot, generation, mass
            # (one message carries MAX_COUNT bytes: MPI's int count; past it MPI_ERR_ARG)
            require(sch.batch_rows * per_item + 48 <= MAX_COUNT, "scheduler.batch_rows",
                    sch.batch_rows, f"<= {(MAX_COUNT - 48) // per_item} with rows of "
                    f"{row} bytes (windows of {sch.window}): with scheduler.mode = "
                    f"{sch.mode!r} and fetch = {sch.fetch!r} an owner sends a batch's rows "
                    f"in one message, and one message carries at most 2**31 - 1 bytes "
                    f"(or use fetch = 'direct' in mode 'edp' or 'sync')")
        require(sch.min_fill_rows <= st.capacity_rows, "scheduler.min_fill_rows",
                sch.min_fill_rows, f"<= storage.capacity_rows ({st.capacity_rows}): the "
                f"replay never holds more rows, learners would wait forever")
        require(st.block_timeout_s < self.run.timeout_s, "storage.block_timeout_s",
                st.block_timeout_s, f"< run.timeout_s ({self.run.timeout_s:g}): writers held "
                f"on an undrawn row must be let go before their wait times out")
        batch = sch.batch_rows * sch.window * (sch.prefetch_depth + 1)
        require(batch * per_row <= MAX_BYTES, "scheduler.batch_rows", sch.batch_rows,
                f"a batch whose rows (x window {sch.window} x prefetch_depth + 1) fit in "
                f"2**62 bytes with rows of {per_row} bytes")
        require(self.longhaul.queue_rows * per_row <= MAX_BYTES, "longhaul.queue_rows",
                self.longhaul.queue_rows, f"<= {MAX_BYTES // per_row} with rows of "
                f"{per_row} bytes (the queue's bytes must fit in a 64-bit integer)")

    def check_runnable(self) -> None:
        """What a job's ranks need beyond a valid config, checked before they start: at
        least one ``[spec.NAME]`` field (a config without one is valid for the layout
        and placement tools). Local; pure.

        Raises:
            ConfigError: ``spec`` is empty.
        """
        require(bool(self.spec), "spec", dict(self.spec), "at least one field (a "
                "[spec.NAME] table with a dtype) for a job to run")

    def check_launch(self, world: LaunchWorld) -> None:
        """What the job's sections need of the world it is launched into, checked by
        ``conduit-hpc run`` before any rank starts (after the layout fits ``-n``). Here:
        a buffer rank's share of ``storage.capacity_rows`` (``round_robin`` placement)
        fits in a node's memory (the ranks check the free memory of each node again at
        start). A job's config class overrides it to refuse what its own sections would
        fail on only once every rank had started: sizes one
        rank cannot hold (:func:`~conduit_hpc.config.launch_world.require_bytes`),
        counts that must divide among the actors, the shapes its spec must have. Call
        ``Config.check_launch(self, world)`` first (``super()`` without arguments fails
        in a ``slots=True`` dataclass). Local; pure; deterministic.

        Raises:
            ConfigError: naming the field, the value and the limit.
        """
        st = self.storage
        if world.buffers and self.placement.planner == "round_robin" and \
                self.longhaul.mode == "off":
            shards = world.buffers * st.shards_per_buffer
            rows = -(-st.capacity_rows // shards) * st.shards_per_buffer
            # at least: a frame stack stores one frame a row, its next stack none
            per_row = sum(0 if f.next_of else f.row_bytes // f.shape[f.stack.axis]
                          if f.stack.enabled else f.row_bytes
                          for f in self.spec.values()) + STAMP_AND_INDEX_MIN_BYTES_PER_ROW
            require_bytes(world, "storage.capacity_rows", st.capacity_rows, rows * per_row,
                          f"on each buffer rank ({rows:,} rows of {per_row} bytes: its "
                          f"share over {world.buffers} buffer rank(s))")
        # a learner's batches: delivered whole (stacks rebuilt); in mode edp, with a
        # thread preparing them ahead, prefetch_depth + 1 at once (a delivery rank on its
        # node holds as many with delivery = 'process'). Before, a batch past a node's
        # memory (batch_rows = 2e9) started every rank and ended 'waited 15 s for batch 0'
        sch = self.scheduler
        learners = world.learners if world.learners is not None else self.layout.learners
        if learners:
            slots = sch.prefetch_depth + 1 if sch.mode == "edp" else 1
            row = sum(f.row_bytes for f in self.spec.values())
            require_bytes(world, "scheduler.batch_rows", sch.batch_rows,
                          sch.batch_rows * sch.window * row * slots,
                          f"on each learner ({slots} batch(es) of {sch.batch_rows:,} x "
                          f"{sch.window} rows of {row} bytes: scheduler.mode = "
                          f"{sch.mode!r}, prefetch_depth = {sch.prefetch_depth})")

    # -- loading -------------------------------------------------------------------
    @classmethod
    def from_toml(cls: type[T], path: str | Path, overrides: Sequence[str] = ()) -> T:
        """Load a config file, applying ``key=value`` overrides (TOML literals).

        On ``Config`` itself, a file with a job's own sections (``[synthetic]``) gives the
        job's config class, declared by the job script beside the file (see
        :mod:`conduit_hpc.config.jobs`); on a subclass, that subclass. Local; no MPI.

        Raises:
            ConfigError: unreadable file, bad TOML, unknown key, wrong type, bad range.
        """
        return load(cls, path, overrides)

    @classmethod
    def from_dict(cls: type[T], raw: Mapping[str, Any]) -> T:
        """Build from a plain mapping (as TOML would give), with the same checks."""
        return validate(cls, raw)

    # -- identity ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON- and TOML-compatible mapping of every value."""
        return typing.cast(dict[str, Any], to_plain(self))

    def digest(self) -> str:
        """SHA-256 of the canonical JSON form; equal configs have equal digests."""
        blob = jsontext.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def replace(self: T, **sections: Any) -> T:
        """A copy with whole sections replaced (``cfg.replace(run=...)``)."""
        return dataclasses.replace(self, **sections)  # type: ignore[type-var]


_SECTION_TYPES: dict[type, dict[str, Any]] = {}


def _section_types(cls: type) -> dict[str, Any]:
    """The declared type of each section of a config class (a job's subclass too)."""
    if cls not in _SECTION_TYPES:
        _SECTION_TYPES[cls] = typing.get_type_hints(cls)
    return _SECTION_TYPES[cls]


def _check_section_types(cfg: Config) -> None:
    """A ``Config`` built by hand (``Config(layout={...})``) holds section objects: refuse
    anything else by name (the range checks would fail on it with an AttributeError).
    ``Config.from_dict`` takes plain tables."""
    hints = _section_types(type(cfg))
    for f in dataclasses.fields(cfg):
        value, tp = getattr(cfg, f.name), hints.get(f.name)
        if f.name == "spec":
            ok = isinstance(value, dict) and all(
                isinstance(k, str) and isinstance(v, FieldConfig) for k, v in value.items())
            want = "a dict of field name to FieldConfig"
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            ok, want = isinstance(value, tp), f"a {tp.__name__}"
        else:
            continue
        if not ok:
            raise ConfigError(f"{f.name} must be {want}, got {type(value).__name__} "
                              f"{value!r:.80} (Config.from_dict takes plain tables)",
                              key=f.name)
