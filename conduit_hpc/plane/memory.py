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
from conduit_hpc.plane.control import ControlBlock
from conduit_hpc.plane.owner_block import OwnerBlock
from conduit_hpc.plane.roles import Role, RoleComms
from conduit_hpc.plane.shard import OwnedShard
from conduit_hpc.sampling import Sampler
from conduit_hpc.spec import Spec
from conduit_hpc.storage import tree_kernels
from conduit_hpc.storage.priority import PriorityIndex, index_buffers
from conduit_hpc.storage.ring import ShardLayout, ShardRing
from conduit_hpc.transport.rma import RmaWindow

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
        me = roles.world_rank
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
        _check_memory(config, roles, used)
        shared = config.transport.shared_memory == "auto"
        self.window = RmaWindow(roles.world, used.get(me, 0), node_comm=roles.node,
                                shared=shared)
        self.control_owner = roles.buffer_ranks[0]
        self._control_window = RmaWindow(roles.world, 64 if me == self.control_owner else 0,
                                         node_comm=roles.node, shared=shared)
        self.control = ControlBlock(self._control_window, self.control_owner,
                                    local=roles.same_node(me, self.control_owner))
        self.rings: dict[int, ShardRing] = {
            s.shard_id: ShardRing(self.window, s.owner_rank, bases[s.shard_id], lay,
                                  timeout_s=config.run.timeout_s,
                                  poll_interval_s=config.transport.poll_interval_s)
            for s, lay in zip(placement.shards, layouts, strict=True)}
        for ring in self.rings.values():  # a write that fails after reserving stops the job
            ring.on_abandon = partial(self.control.mark_failed, me)
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
        self._control_window.close()
        self.window.close()


def _check_memory(config: Config, roles: RoleComms, used: Mapping[int, int]) -> None:
    """Refuse, on every rank together, shards that the free memory of some node cannot
    hold - summed over the ranks of each real node (emulated nodes of one machine share
    its memory), against what the node has free or, where less, what this process's
    memory cgroup still allows (a SLURM job's ``--mem``, a container's limit: past it the
    kernel kills the job). **Collective** on the world (Allreduces)."""
    me = roles.world_rank
    real = (roles.world.Split_type(MPI.COMM_TYPE_SHARED, key=me)
            if config.layout.emulate_nodes else roles.node)
    need_here = np.zeros(1, dtype=np.int64)
    try:
        real.Allreduce(np.array([used.get(me, 0)], dtype=np.int64), need_here, op=MPI.SUM)
    finally:
        if real is not roles.node:
            real.Free()
    need = int(need_here[0])
    free = free_memory_bytes()
    avail = need if free is None else free  # nothing to check against: no refusal
    mine = np.array([need if need > avail else 0], dtype=np.int64)
    worst = np.zeros(1, dtype=np.int64)
    roles.world.Allreduce(mine, worst, op=MPI.MAX)
    if worst[0] > 0:
        raise ConfigError(
            f"storage.capacity_rows = {config.storage.capacity_rows} needs "
            f"{int(worst[0]) / 1e9:.3g} GB of shard memory on one node, more than is free "
            f"there ({int(avail) / 1e9:.3g} GB on this rank's node, or its memory cgroup's "
            f"room); lower it or add buffer ranks on other nodes", key="storage.capacity_rows")


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
