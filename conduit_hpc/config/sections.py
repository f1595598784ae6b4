"""The core sections of a job config: ``[run]``, ``[layout]``, ``[spec.*]``,
``[storage]``, ``[transport]`` and ``[scheduler]``.

Frozen stdlib dataclasses; :mod:`conduit_hpc.config.loader` validates a TOML mapping into
them (types, unknown keys) and each ``__post_init__`` checks ranges with
:func:`~conduit_hpc.config.checks.require`, naming the key, the value and the expectation.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Literal

from conduit_hpc.config.checks import (
    DTYPES,
    MAX_COUNT,
    MAX_NAME_BYTES,
    MAX_PRIORITY,
    MAX_ROW_BYTES,
    MAX_ROWS,
    MAX_SECONDS,
    METRICS_FULL_ROWS,
    finite,
    itemsize,
    require,
    require_types,
)

__all__ = [
    "FieldConfig",
    "LayoutConfig",
    "RunConfig",
    "SchedulerConfig",
    "StackConfig",
    "StorageConfig",
    "TransportConfig",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """``[run]``: identity of the job and its global limits.

    Attributes:
        name (str): job name, used for run directories.
        seed (int): base seed; rank ``r`` seeds with ``seed + world_rank``.
        timeout_s (float): bound on every blocking wait of the data plane.
        duration_s (float): wall-time budget of a job's main loop (0 = job decides).
        tensorboard (bool): also write TensorBoard scalars under
            ``RUN_DIR/tensorboard/<role>-<rank>`` (needs the ``tensorboard`` extra:
            ``pip install 'conduit-hpc[tensorboard]'``).
        tensorboard_every_s (float): a learner writes, once this many seconds, the mean of
            each column over the supersteps since its last write (at the last one's step):
            one scalar a superstep cost ~0.45 ms a superstep and ~600 bytes of event file
            (3 GB an hour at 5,000 supersteps a second). 0: every superstep.
        metrics_full_rows (int): a learner's ``metrics/learner-<rank>.csv`` holds a row
            for each of its first this many supersteps, then this many rows of a sample
            at each spacing (one row per 2, then per 4, 8, ... supersteps, its
            ``weight`` column saying how many): the file grows by this many rows each
            time the run doubles, where a row a superstep grew by ~2 GB an hour
            (:class:`~conduit_hpc.plane.sampled_rows.RowThinning`). 0: a row for every
            superstep. ``summary.json`` counts every superstep either way.
        gc_freeze (bool): while the data plane runs, the objects alive when it was built
            are left out of Python's cyclic garbage collector's passes (``gc.freeze``,
            undone when it closes; :mod:`~conduit_hpc.plane.collector`): a full pass
            over them (torch's ~280,000 objects) takes 80-180 ms, and one often fell
            in the first second of the loop. False: the collector as the process had it.
    """

    name: str = "conduit"
    seed: int = 0
    timeout_s: float = 120.0
    duration_s: float = 0.0
    tensorboard: bool = False
    tensorboard_every_s: float = 1.0
    metrics_full_rows: int = METRICS_FULL_ROWS
    gc_freeze: bool = True

    def __post_init__(self) -> None:
        require_types(self)
        require(bool(self.name) and self.name.replace("-", "").replace("_", "").isalnum(),
                "name", self.name, "a non-empty name of letters, digits, '-' and '_'")
        # it names the run directory (NAME-YYYYmmdd-HHMMSS-ffffff): past NAME_MAX (255
        # bytes) the launcher failed making it with an OSError traceback
        require(len(self.name.encode()) <= MAX_NAME_BYTES, "name",
                f"{self.name[:40]}... ({len(self.name.encode())} bytes)",
                f"a name of at most {MAX_NAME_BYTES} bytes in UTF-8 (it names the run "
                f"directory, with a 23-character time stamp, and a file name holds at "
                f"most 255 bytes)")
        require(0 <= self.seed < 2**32, "seed", self.seed, "in [0, 2**32)")
        require(finite(self.timeout_s) and 0 < self.timeout_s <= MAX_SECONDS, "timeout_s",
                self.timeout_s, f"a finite number > 0 and <= {MAX_SECONDS:g} (seconds)")
        require(finite(self.duration_s) and 0 <= self.duration_s <= MAX_SECONDS, "duration_s",
                self.duration_s, f"a finite number >= 0 and <= {MAX_SECONDS:g} (seconds)")
        require(finite(self.tensorboard_every_s) and 0 <= self.tensorboard_every_s <= 3600,
                "tensorboard_every_s", self.tensorboard_every_s,
                "a finite number >= 0 (0: every superstep) and <= 3600 (seconds)")
        require(0 <= self.metrics_full_rows <= MAX_COUNT, "metrics_full_rows",
                self.metrics_full_rows, f"an integer >= 0 (0: a row for every superstep) "
                f"and <= {MAX_COUNT}")


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
            At most the world's ranks (checked when the data plane starts, on every rank).
        learners_ingest (bool): learner ranks also ingest, each into a home shard of its
            own, as an algorithm process that both collects and learns does (RLlib's);
            then a layout needs no actor rank (``actors = 0``: the remaining ranks, maybe
            none). See ``Config`` for what it cannot be combined with.
    """

    learners: int = 1
    buffers: int = 1
    actors: int = 0
    per_node: bool = False
    emulate_nodes: int = 0
    learners_ingest: bool = False

    def __post_init__(self) -> None:
        require_types(self)
        require(0 <= self.learners <= MAX_COUNT, "learners", self.learners,
                f">= 0 and <= {MAX_COUNT}")
        require(1 <= self.buffers <= MAX_COUNT, "buffers", self.buffers,
                f">= 1 and <= {MAX_COUNT}")
        require(0 <= self.actors <= MAX_COUNT, "actors", self.actors,
                f">= 0 (0 = all remaining ranks) and <= {MAX_COUNT}")
        require(0 <= self.emulate_nodes <= MAX_COUNT, "emulate_nodes", self.emulate_nodes,
                f">= 0 and <= {MAX_COUNT}")

    @property
    def min_actors(self) -> int:
        """Actor ranks the layout needs at least (per node when ``per_node``): with
        ``actors = 0``, one - none when learners ingest."""
        return self.actors if self.actors or self.learners_ingest else 1

    @property
    def fixed_ranks(self) -> int:
        """Ranks the layout needs (per node when ``per_node``)."""
        return self.learners + self.buffers + self.min_actors


@dataclass(frozen=True, slots=True, kw_only=True)
class StackConfig:
    """``[spec.NAME] stack = {axis = 0, stream = "env_id"}``: the field is a stack of the
    previous ``shape[axis]`` frames of one stream (an environment), the newest last.

    Optional; off (``stream = ""``) by default, the plain layout, where every row holds
    its whole stack. With it, the replay's shards store each frame once and rebuild the
    stacks when rows are gathered: see ``docs/frame-stacks.md``.

    Attributes:
        stream (str): the spec field that names the stream each row comes from (an
            integer scalar field); ``""``: not a stack.
        axis (int): the axis of the field's shape along which the frames are stacked
            (``0 <= axis < len(shape)``); the depth is ``shape[axis]``.
    """

    stream: str = ""
    axis: int = 0

    def __post_init__(self) -> None:
        require_types(self)
        require(self.stream == "" or self.stream.isidentifier(), "stream", self.stream,
                "the name of a spec field, or empty (not a stack)")
        require(0 <= self.axis <= 31, "axis", self.axis,
                "an axis of the field's shape (>= 0 and < its number of dimensions)")

    @property
    def enabled(self) -> bool:
        """Whether the field is declared a stack."""
        return bool(self.stream)


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldConfig:
    """``[spec.NAME]``: one field of the experience spec.

    Attributes:
        dtype (str): numpy dtype name (``float32``, ``uint8``, ...).
        shape (tuple[int, ...]): per-row shape, ``[]`` for a scalar.
        allow_nan (bool): when false, a NaN in this field is refused at ingest.
        cast (str): which input dtypes ingest converts: ``safe`` (default: only casts
            that lose nothing, e.g. int32 -> int64, float32 -> float64) or ``same_kind``
            (also float64 -> float32 and the like, which may round: what Gymnasium's
            float64 rewards need for a float32 field).
        description (str): what the field means (written as an attribute of its
            checkpoint datasets; e.g. "n-step discounted return, n = 3, gamma = 0.99").
        units (str): its units ("" when it has none).
        stack (StackConfig): declares the field a stack of the previous frames of one
            stream (default: not a stack, the plain layout).
        next_of (str): declares the field the *next* stack of the stacked field it names
            (``next_obs`` of ``obs``: the same stream, one step on; same dtype and
            shape); ``""``: none. Checked against the other fields by ``Config``.
    """

    dtype: str
    shape: tuple[int, ...] = ()
    allow_nan: bool = True
    cast: Literal["safe", "same_kind"] = "safe"
    description: str = ""
    units: str = ""
    stack: StackConfig = field(default_factory=StackConfig)
    next_of: str = ""

    def __post_init__(self) -> None:
        require_types(self)
        require(isinstance(self.stack, StackConfig), "stack", self.stack, "a StackConfig")
        require(self.dtype in DTYPES, "dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        require(len(self.shape) <= 32, "shape", self.shape, "at most 32 dimensions")
        require(self.next_of == "" or self.next_of.isidentifier(), "next_of", self.next_of,
                "the name of a stacked spec field, or empty")
        if self.stack.enabled:
            require(not self.next_of, "stack", to_plain_stack(self.stack),
                    f"unset on a field with next_of = {self.next_of!r} (a next stack "
                    f"has the stack of the field it follows)")
            require(self.stack.axis < len(self.shape), "stack.axis", self.stack.axis,
                    f"an axis of shape {list(self.shape)} (>= 0 and < {len(self.shape)})")
            depth = self.shape[self.stack.axis]
            require(depth >= 1, "stack", to_plain_stack(self.stack),
                    f"a stack of at least one frame (shape[{self.stack.axis}] = {depth})")
        for name in ("description", "units"):
            text = getattr(self, name)
            require(len(text) <= 1000 and text.isprintable(), name, text,
                    "printable text of at most 1,000 characters")
        for d in self.shape:
            require(0 < d <= MAX_COUNT, "shape", self.shape,
                    f"a list of positive integers <= {MAX_COUNT}")
        require(self.row_bytes <= MAX_ROW_BYTES, "shape", self.shape,
                f"a shape of at most {MAX_ROW_BYTES} bytes per row "
                f"({itemsize(self.dtype)} bytes per {self.dtype} element)")

    @property
    def row_bytes(self) -> int:
        """Bytes of this field in one row."""
        return math.prod(self.shape) * itemsize(self.dtype)


def to_plain_stack(stack: StackConfig) -> dict[str, object]:
    """A stack declaration as it is written in TOML (for messages)."""
    return {"axis": stack.axis, "stream": stack.stream}


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageConfig:
    """``[storage]``: replay capacity and sharding.

    Attributes:
        capacity_rows (int): total replay capacity over all shards (rows).
        shards_per_buffer (int): shards held by each buffer rank.
        initial_priority (float): priority of a row inserted without one, until a
            larger priority has been seen (new rows enter at the running maximum).
        priority_exponent (float): alpha in p**alpha (0 = uniform).
        ingest_policy (str): what writers do when they reach rows that no learner has
            drawn yet: ``overwrite`` them (oldest first; counted per shard as
            ``overwritten_unsampled``) or ``block`` - wait until a learner has drawn
            them, at most ``block_timeout_s`` per row before it is overwritten anyway
            (waits counted in the actors' ``ring_wait_s``). With uniform sampling of a
            large ring a given row waits about ``capacity / batch_rows`` batches to be
            drawn: ``block`` suits rings that learners sample through quickly.
        block_timeout_s (float): longest time writers are held on one undrawn row.
        guard_s (float): safety time of the guard band: rows that writers will reach
            within this time (at the measured insert rate, plus the buffer loop's pass
            time) are hidden from sampling before they are overwritten (at most half
            of a shard).
        commit_interval_s (float): in a job with learners, how long the buffer loop may
            let committed rows wait before it makes them drawable, while fewer than 4096
            of them wait and no writer waits for the free cursor: each pass that does so
            takes the shard's index lock and rewrites its tree, and a node-local learner
            that samples meanwhile waits for the lock or searches again (with actors
            inserting, a spinning loop did so on nearly every pass). 0: every pass
            commits. At most a tenth of ``run.timeout_s`` is used.
    """

    capacity_rows: int = 100_000
    shards_per_buffer: int = 1
    initial_priority: float = 1.0
    priority_exponent: float = 0.6
    ingest_policy: Literal["overwrite", "block"] = "overwrite"
    block_timeout_s: float = 1.0
    guard_s: float = 0.005
    commit_interval_s: float = 0.002

    def __post_init__(self) -> None:
        require_types(self)
        require(self.capacity_rows > 0, "capacity_rows", self.capacity_rows, "> 0")
        require(self.capacity_rows <= MAX_ROWS, "capacity_rows", self.capacity_rows,
                f"<= 2**40 ({MAX_ROWS}) rows")
        require(1 <= self.shards_per_buffer <= min(self.capacity_rows, 2**20),
                "shards_per_buffer", self.shards_per_buffer,
                f">= 1 and <= min(capacity_rows, 2**20) ({min(self.capacity_rows, 2**20)})")
        require(finite(self.initial_priority) and 0 < self.initial_priority <= MAX_PRIORITY,
                "initial_priority", self.initial_priority,
                f"a finite number > 0 and <= {MAX_PRIORITY:g}")
        require(finite(self.priority_exponent) and 0 <= self.priority_exponent <= 10,
                "priority_exponent", self.priority_exponent, "a number in [0, 10]")
        # every priority is <= MAX_PRIORITY: its mass summed over the whole replay must
        # stay finite (a sum-tree's total of inf makes every draw meaningless)
        top = math.floor((math.log(sys.float_info.max) - math.log(self.capacity_rows))
                         / math.log(MAX_PRIORITY) * 1000) / 1000
        require(self.priority_exponent <= top, "priority_exponent", self.priority_exponent,
                f"<= {top:g} with capacity_rows = "
                f"{self.capacity_rows} (priorities up to {MAX_PRIORITY:g} raised to it, "
                f"summed over the replay, must stay finite in float64)")
        # rows inserted without a priority get this mass: one that underflows float64
        # makes every such row undrawable (learners then wait out their timeout)
        mass = self.initial_priority ** self.priority_exponent
        require(mass >= sys.float_info.min, "initial_priority", self.initial_priority,
                f"such that initial_priority ** priority_exponent ({self.priority_exponent:g})"
                f" is a normal float64 (>= {sys.float_info.min:.3g}; it is {mass:.3g} here, "
                f"so rows inserted without a priority could never be drawn)")
        require(finite(self.block_timeout_s) and 0 < self.block_timeout_s <= MAX_SECONDS,
                "block_timeout_s", self.block_timeout_s,
                f"a finite number > 0 and <= {MAX_SECONDS:g} (seconds)")
        require(finite(self.guard_s) and 0 <= self.guard_s <= 10, "guard_s", self.guard_s,
                "between 0 and 10 (seconds)")
        require(finite(self.commit_interval_s) and 0 <= self.commit_interval_s <= 1,
                "commit_interval_s", self.commit_interval_s, "between 0 and 1 (seconds)")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """``[transport]``: how bytes move.

    Attributes:
        shared_memory (str): ``auto`` reads and writes windows of ranks on the same node
            with plain numpy; ``never`` forces MPI RMA for every access (what ranks on
            different nodes do).
        poll_interval_s (float): sleep between polls of a waiting loop.
        collectives (str): backend of the learners' ``torch.distributed`` group
            (gradient all-reduce with several learners): ``auto`` (NCCL when every
            learner has a GPU of its own, else gloo), ``gloo`` or ``nccl``.
    """

    shared_memory: Literal["auto", "never"] = "auto"
    poll_interval_s: float = 0.0002
    collectives: Literal["auto", "gloo", "nccl"] = "auto"

    def __post_init__(self) -> None:
        require_types(self)
        require(finite(self.poll_interval_s) and 0 <= self.poll_interval_s <= 0.1,
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
        delivery (str): where ``edp`` mode's experience path runs: ``thread`` (a
            data-plane thread in the learner's process) or ``process`` (a delivery rank
            per learner, on the learner's node, that samples, gathers and transforms and
            hands ready batches over through a node-shared staging ring; the layout gets
            one extra rank per learner, see :mod:`conduit_hpc.config.layout_rule`).
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
    delivery: Literal["thread", "process"] = "thread"

    def __post_init__(self) -> None:
        require_types(self)
        require(1 <= self.batch_rows <= MAX_COUNT, "batch_rows", self.batch_rows,
                f">= 1 and <= {MAX_COUNT}")
        require(0 <= self.prefetch_depth <= 1024, "prefetch_depth", self.prefetch_depth,
                ">= 0 and <= 1024")
        require(finite(self.beta) and 0 <= self.beta <= 1e3, "beta", self.beta,
                ">= 0 and <= 1000")
        require(finite(self.beta_final) and 0 <= self.beta_final <= 1e3, "beta_final",
                self.beta_final, ">= 0 and <= 1000")
        require(0 <= self.beta_anneal_supersteps <= MAX_ROWS, "beta_anneal_supersteps",
                self.beta_anneal_supersteps, f">= 0 and <= {MAX_ROWS}")
        require(1 <= self.min_fill_rows <= MAX_ROWS, "min_fill_rows", self.min_fill_rows,
                f">= 1 and <= {MAX_ROWS}")
        require(finite(self.samples_per_insert) and 0 <= self.samples_per_insert <= 1e9,
                "samples_per_insert", self.samples_per_insert,
                ">= 0 (0 disables it) and <= 1e9")
        require(finite(self.error_buffer) and 0 <= self.error_buffer <= 1e18, "error_buffer",
                self.error_buffer, ">= 0 and <= 1e18")
        require(1 <= self.max_insert_batch <= MAX_COUNT, "max_insert_batch",
                self.max_insert_batch, f">= 1 and <= {MAX_COUNT}")
        require(0 <= self.max_policy_lag <= MAX_ROWS, "max_policy_lag", self.max_policy_lag,
                f">= 0 (0: unbounded) and <= {MAX_ROWS}")
        require(1 <= self.weights_every <= MAX_ROWS, "weights_every", self.weights_every,
                f">= 1 and <= {MAX_ROWS}")
        require(1 <= self.sequence_length <= 2**20, "sequence_length", self.sequence_length,
                ">= 1 and <= 2**20")
        require(0 <= self.burn_in <= 2**20, "burn_in", self.burn_in, ">= 0 and <= 2**20")
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
        require(self.delivery == "thread" or self.mode == "edp", "delivery", self.delivery,
                f"'thread' with mode = {self.mode!r} ('process' moves the prefetching "
                f"data-plane thread of mode = 'edp' into a rank of its own; the inline "
                f"modes have no experience path to move)")
        if self.sampler == "sequence":
            require(self.sequence_length + self.burn_in >= 2, "sequence_length",
                    self.sequence_length, ">= 2 (with burn_in) for the sequence sampler")

    @property
    def window(self) -> int:
        """Rows per sampled item (``burn_in + sequence_length`` for sequences, else 1)."""
        return self.burn_in + self.sequence_length if self.sampler == "sequence" else 1
