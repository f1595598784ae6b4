"""The job's shard memory on this rank: one RMA window holding every shard this rank
owns (preceded by the owners' priority-update acknowledgements), the control block's
window, and a ring client per shard.

Laid out from the placement once, the same on every rank; checked against the nodes'
free memory before anything is allocated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import numpy as np
from mpi4py import MPI

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.placement import Placement
from conduit_hpc.plane.control import ControlBlock, control_bytes
from conduit_hpc.plane.owner_block import OwnerBlock
from conduit_hpc.plane.roles import Role, RoleComms
from conduit_hpc.plane.shard import OwnedShard
from conduit_hpc.plane.staging_ring import StagingLayout
from conduit_hpc.sampling import Sampler
from conduit_hpc.spec import Spec
from conduit_hpc.storage import tree_kernels
from conduit_hpc.storage.priority import PriorityIndex, index_buffers
from conduit_hpc.storage.ring import ShardLayout, ShardRing
from conduit_hpc.storage.snapshot import SnapshotStaging
from conduit_hpc.transport.objects import bounded_allgather, bounded_barrier, register_board
from conduit_hpc.transport.rma import PAGE, RmaWindow, free_bytes, shared_memory_dir

__all__ = ["ShardMemory", "free_memory_bytes"]


class ShardMemory:
    """The windows and ring clients of one rank. **Collective** on ``roles.world``
    (construction, :meth:`close`).

    Attributes:
        window (RmaWindow): every rank's shards (this rank's segment: its own).
        control (ControlBlock): the job-wide counters (on the first buffer rank).
        rings (dict[int, ShardRing]): a client of every shard; the owner maps its own.
        block (OwnerBlock): the block before the first shard of each owner's segment
            (acknowledgements and read pins, :mod:`conduit_hpc.plane.owner_block`).
        ack_bytes (int): its size in bytes.

    Raises:
        ConfigError: the shards of some node do not fit in its free memory (on every
            rank together, before any window exists).
    """

    def __init__(self, config: Config, spec: Spec, roles: RoleComms,
                 placement: Placement) -> None:
        me, timeout_s = roles.world_rank, config.run.timeout_s
        # every rank reached the memory step (bounded; the kernels' load below is local
        # and can take seconds on a cold cache, so the check's first collective absorbs it)
        bounded_barrier(roles.world, timeout_s, "the data plane's constructor (the memory)")
        if roles.role is not Role.ACTOR:
            # the ranks that search and update priority trees load their compiled kernels
            # (numba: ~0.7 s, seconds on a first compile) before the windows' collective,
            # so that no owner is still loading them while actors already write
            tree_kernels.warm()
        layouts = [ShardLayout(spec, s.capacity_rows) for s in placement.shards]
        self.block = OwnerBlock(roles.world_size)
        self.ack_bytes = self.block.nbytes
        bases: dict[int, int] = {}
        used: dict[int, int] = {}
        for s, lay in zip(placement.shards, layouts, strict=True):
            bases[s.shard_id] = used.get(s.owner_rank, self.ack_bytes)
            used[s.owner_rank] = bases[s.shard_id] + lay.nbytes
        staged = {s.owner_rank: 0 for s in placement.shards}
        for s, lay in zip(placement.shards, layouts, strict=True):
            staged[s.owner_rank] += SnapshotStaging.bytes_for(lay.stored.row_bytes,
                                                           s.capacity_rows)
        _check_memory(config, spec, roles, used,
                      staged.get(me, 0) if config.checkpoint.writes else 0)
        shared = config.transport.shared_memory == "auto"
        self.window = RmaWindow(roles.world, used.get(me, 0), node_comm=roles.node,
                                shared=shared, timeout_s=timeout_s,
                                what="the data plane's constructor (the shard window)")
        self.control_owner = roles.buffer_ranks[0]
        n = roles.world_size
        self._control_window = RmaWindow(roles.world,
                                         control_bytes(n) if me == self.control_owner else 0,
                                         node_comm=roles.node, shared=shared,
                                         timeout_s=timeout_s, what="the data plane's "
                                         "constructor (the control window)")
        # the arrival board only where every rank shares the block owner's node: an
        # atomic to another node's segment waits for that node's MPI progress, and the
        # board must not add such waits to every bounded collective (make hosts)
        one_node = all(roles.same_node(r, self.control_owner) for r in range(n))
        self.control = ControlBlock(self._control_window, self.control_owner,
                                    local=roles.same_node(me, self.control_owner),
                                    world_size=n if one_node else 0)
        # a bounded collective of the world that gives up names the ranks that never came
        self._unboard = register_board(roles.world, partial(self.control.arrive, me),
                                       self.control.behind)
        self.rings: dict[int, ShardRing] = {
            s.shard_id: ShardRing(self.window, s.owner_rank, bases[s.shard_id], lay,
                                  timeout_s=config.run.timeout_s,
                                  poll_interval_s=config.transport.poll_interval_s)
            for s, lay in zip(placement.shards, layouts, strict=True)}
        self.control.hosts = roles.hosts
        for ring in self.rings.values():  # a write that fails after reserving stops the job
            ring.on_abandon = partial(self.control.mark_failed, me)
            ring.hosts = roles.hosts
        # the owner always maps its own memory, whatever the sharing policy
        for s in placement.shards_of(me):
            ring = self.rings[s.shard_id]
            if ring.views is None:
                ring.views = ring.layout.views(self.window.own_segment(), ring.base)

    def owned_shards(self, config: Config, roles: RoleComms, placement: Placement,
                     sampler: Sampler) -> list[OwnedShard]:
        """The shards this (buffer) rank owns, with their priority indexes and drawers
        (the whole index lives in the window: node-local learners search it under the
        shard's seqlock, and write their priority updates into it under its lock).
        Local."""
        seg = self.window.own_segment()
        # read pins (none on a buffer rank that holds no shard: its segment is empty)
        pins = self.block.pins(seg)
        learners = bool(roles.learner_ranks)
        storage = config.storage
        owned = []
        for s in placement.shards_of(roles.world_rank):
            ring = self.rings[s.shard_id]
            views = ring.views
            assert views is not None
            index = PriorityIndex(s.capacity_rows, alpha=sampler.alpha,
                                  initial_priority=storage.initial_priority,
                                  buffers=index_buffers(views))
            drawer = sampler.drawer(views.columns, ring.capacity,
                                    lambda v=views: int(v.header[1]))
            owned.append(OwnedShard(
                s.shard_id, ring, index, drawer, guarded=learners, pins=pins,
                guard_s=storage.guard_s,
                # a pass rows (and writers) wait for stays well inside every bounded wait
                commit_interval_s=min(storage.commit_interval_s, config.run.timeout_s / 10),
                block=storage.ingest_policy == "block" and learners,
                block_timeout_s=storage.block_timeout_s,
                # a learner's device mirror drops the rows the guard band hides and
                # does not take them back (plane/device_tier.py): keep them hidden there
                restore_idle=s.tier != "learner_gpu" and config.placement.device_rows == 0))
        return owned

    def acks_of(self, rank: int, world_size: int) -> np.ndarray | None:
        """``rank``'s acknowledgement counters if this process maps its segment."""
        view = self.window.local_view(rank)
        return None if view is None else self.block.acks(view)

    def close(self) -> None:
        """Free both windows. **Collective**; after the last one-sided access."""
        self._unboard()
        self._control_window.close()
        self.window.close()


def _staging_bytes(config: Config, spec: Spec, roles: RoleComms) -> int:
    """Bytes of the staging ring this rank allocates (a delivery rank's, with
    ``scheduler.delivery = "process"``; 0 elsewhere)."""
    if roles.world_rank not in roles.delivery_ranks:
        return 0
    sch = config.scheduler
    return StagingLayout(spec, sch.batch_rows, sch.window, sch.prefetch_depth + 1,
                         queue_rows=max(256, sch.batch_rows)).nbytes


def _check_memory(config: Config, spec: Spec, roles: RoleComms,
                  used: Mapping[int, int], staged: int = 0) -> None:
    """Refuse, on every rank together and before any window exists, the shard windows
    and staging rings that some node cannot hold - summed over the ranks of each real
    node (emulated nodes of one machine share its memory): more than it has free or,
    where less, what this process's memory cgroup still allows (a SLURM job's ``--mem``,
    a container's limit: past it the kernel kills the job); and, where they are
    shared-memory windows (``transport.shared_memory = "auto"``, or every rank on one
    node, where MPI backs any window with a file there), more than the free space of the
    file system that backs them (``/dev/shm``, :func:`~conduit_hpc.transport.rma.
    shared_memory_dir`): past it, a rank dies of SIGBUS on first touch, or MPI fails
    with an internal error on one rank while the others wait. ``staged``: this rank's
    checkpoint staging (heap memory beside its shards, allocated and touched when the
    job's checkpoint agent is made; the kernel killed the buffer rank there). **Collective**
    on the world (a split, an Allreduce and a bounded Allgather)."""
    world, me = roles.world, roles.world_rank
    real = world.Split_type(MPI.COMM_TYPE_SHARED, key=me)
    try:
        one_node = bool(world.allreduce(real.Get_size() == world.Get_size(), op=MPI.LAND))
        mine, staging = used.get(me, 0), _staging_bytes(config, spec, roles)
        # a page per segment: what the MPI library adds (rounding, its own header)
        sums = np.zeros(3, np.int64)
        real.Allreduce(np.array([mine + PAGE if mine else 0,
                                 staging + PAGE if staging else 0, staged], np.int64), sums,
                       op=MPI.SUM)
    finally:
        real.Free()
    shards, ring, cut = int(sums[0]), int(sums[1]), int(sums[2])
    free = free_memory_bytes()
    directory = shared_memory_dir()
    room = free_bytes(directory) if directory is not None else -1
    in_shm = ring + (shards if config.transport.shared_memory == "auto" or one_node else 0)
    row = np.array([shards + ring + cut, -1 if free is None else free, in_shm, room, shards,
                    ring, cut], np.int64)
    rows = np.zeros((world.Get_size(), len(row)), np.int64)
    # every rank builds the same verdict from the same rows; bounded: the file-system
    # calls before it (cgroup files, statvfs of /dev/shm) can stall on one rank
    bounded_allgather(world, row, rows, config.run.timeout_s,
                      "the data plane's constructor (the memory check)")
    for rank, (need, ram, shm_need, shm_room, shards_b, ring_b, cut_b) in enumerate(
            rows.tolist()):
        if 0 <= ram < need:
            what, have = "its free memory (or its memory cgroup's room)", ram
        elif 0 <= shm_room < shm_need:
            what, have = (f"the free space of {directory} (where MPI keeps shared-memory "
                          f"windows)", shm_room)
            need, cut_b = shm_need, 0  # the staging copies are not in shared memory
        else:
            continue
        keys = [f"storage.capacity_rows = {config.storage.capacity_rows}"
                f" ({shards_b} bytes of shards)"] if shards_b else []
        if ring_b:
            sch = config.scheduler
            keys.append(f"scheduler.delivery = 'process' with scheduler.batch_rows = "
                        f"{sch.batch_rows} x (scheduler.prefetch_depth = "
                        f"{sch.prefetch_depth} + 1) ({ring_b} bytes of staging rings)")
        if cut_b:
            keys.append(f"checkpoints (checkpoint.on_stop, every_seconds or "
                        f"every_supersteps: a cut copies every shard into a staging copy "
                        f"beside it; {cut_b} bytes)")
        verb = "needs" if len(keys) == 1 else "need"
        raise ConfigError(
            f"{' and '.join(keys)} {verb} {need} bytes ({need / 1e9:.3g} GB) on the node of "
            f"rank {rank}, more than is free there: {have} bytes ({have / 1e9:.3g} GB), "
            f"{what}; lower them, or add buffer ranks on other nodes (or give the job a "
            f"larger {directory or '/dev/shm'})",
            key="storage.capacity_rows" if shards_b else "scheduler.batch_rows")


def free_memory_bytes(proc_cgroup: Path = Path("/proc/self/cgroup"),
                      cgroup_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes this process can still have: the node's free memory, or less where its
    memory cgroup (or one above it; v1 or v2) leaves less - its limit less what it uses,
    page cache it can drop (inactive files) not counted. ``None``: nothing known. Local."""
    try:
        free: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError):  # not on this platform
        free = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return free
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: one hierarchy
            base, names = cgroup_root, ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own
            base, names = cgroup_root / "memory", ("memory.limit_in_bytes",
                                                   "memory.usage_in_bytes",
                                                   "total_inactive_file")
        else:
            continue
        rel = Path(path.strip().lstrip("/"))
        for d in (rel, *rel.parents):  # the cgroup, then each one above it
            room = _cgroup_room(base / d, *names)
            if room is not None:
                free = room if free is None else min(free, room)
    return free


def _cgroup_room(d: Path, limit_name: str, usage_name: str, inactive_key: str) -> int | None:
    """What cgroup directory ``d`` still allows (``None``: no limit, or not there)."""
    try:
        limit_text = (d / limit_name).read_text().strip()
        used = int((d / usage_name).read_text())
    except (OSError, ValueError):
        return None
    if limit_text == "max" or not limit_text.isdigit() or int(limit_text) >= 1 << 60:
        return None  # v2 "max"; v1's "no limit" is 2**63 rounded down to pages
    inactive = 0
    try:
        for stat in (d / "memory.stat").read_text().splitlines():
            key, _, value = stat.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    except (OSError, ValueError):
        pass
    return max(0, int(limit_text) - max(0, used - inactive))
