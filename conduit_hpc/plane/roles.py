"""Split the world into actor, buffer, learner (and delivery) ranks.

:func:`split_roles` takes a private duplicate of the given communicator (never
``COMM_WORLD`` itself) and splits it by a :class:`~conduit_hpc.config.LayoutConfig`:
counts for the whole world, or counts per node (the rule itself, MPI-free, is
:func:`conduit_hpc.config.layout_rule.assign_roles`). Every check that can fail is decided
from values all ranks know, so every rank raises the same error together; nothing here
can hang on a layout that does not fit.
"""

from __future__ import annotations

import enum
import os
import socket
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from mpi4py import MPI

from conduit_hpc.config import Config, LayoutConfig
from conduit_hpc.config.layout_rule import assign_roles, emulated_nodes_problem
from conduit_hpc.errors import ConfigError, ConfigMismatch
from conduit_hpc.transport.objects import allgather_json, bounded_barrier
from conduit_hpc.transport.rma import shared_memory_dir
from conduit_hpc.wait import NO_HOSTS, Hosts

__all__ = ["Role", "RoleComms", "agree", "check_same_config", "split_roles"]


class Role(enum.Enum):
    """What a rank does."""

    ACTOR = "actor"
    BUFFER = "buffer"
    LEARNER = "learner"
    #: owns one learner's experience path (``scheduler.delivery = "process"``)
    DELIVERY = "delivery"


@dataclass(frozen=True, eq=False)
class RoleComms:
    """The communicators of one rank.

    Attributes:
        world (MPI.Intracomm): private duplicate of the job's communicator.
        node (MPI.Intracomm): the ranks of ``world`` on this rank's node (real or emulated).
        role (Role): this rank's role.
        actor (MPI.Intracomm | None): all actor ranks (``None`` unless an actor); likewise
            ``buffer`` and ``learner``.
        actor_ranks (tuple[int, ...]): world ranks of actors; likewise the others.
        node_of (tuple[int, ...]): node index of each world rank.
        delivery_ranks (tuple[int, ...]): world ranks of delivery ranks (empty unless
            ``scheduler.delivery = "process"``); they have no role communicator.
        delivery_of (dict[int, int]): learner world rank -> its delivery rank.
        writer_ranks (tuple[int, ...]): world ranks that ingest: the actors, then the
            learners when ``layout.learners_ingest``.
        hosts (Hosts): each world rank's hostname, for errors that name a rank waited on.
    """

    world: MPI.Intracomm
    node: MPI.Intracomm
    role: Role
    actor: MPI.Intracomm | None
    buffer: MPI.Intracomm | None
    learner: MPI.Intracomm | None
    actor_ranks: tuple[int, ...]
    buffer_ranks: tuple[int, ...]
    learner_ranks: tuple[int, ...]
    node_of: tuple[int, ...]
    delivery_ranks: tuple[int, ...] = ()
    delivery_of: dict[int, int] = field(default_factory=dict)
    writer_ranks: tuple[int, ...] = ()
    hosts: Hosts = NO_HOSTS

    @cached_property
    def world_rank(self) -> int:  # kept: errors name it after close() freed the comm
        return self.world.Get_rank()

    @property
    def world_size(self) -> int:
        return self.world.Get_size()

    @property
    def node_rank(self) -> int:
        return self.node.Get_rank()

    @property
    def role_comm(self) -> MPI.Intracomm:
        """The communicator of this rank's role."""
        c = {Role.ACTOR: self.actor, Role.BUFFER: self.buffer, Role.LEARNER: self.learner}
        comm = c.get(self.role)
        if comm is None:
            raise ValueError(f"a {self.role.value} rank has no role communicator")
        return comm

    @property
    def role_rank(self) -> int:
        """Index of this rank among the ranks of its role."""
        return self.role_comm.Get_rank()

    def ranks_of(self, role: Role) -> tuple[int, ...]:
        return {Role.ACTOR: self.actor_ranks, Role.BUFFER: self.buffer_ranks,
                Role.LEARNER: self.learner_ranks, Role.DELIVERY: self.delivery_ranks}[role]

    @property
    def sampler_ranks(self) -> tuple[int, ...]:
        """The ranks that draw samples from the shards: the delivery ranks when there
        are any, else the learners."""
        return self.delivery_ranks or self.learner_ranks

    def learner_of(self, delivery_rank: int) -> int:
        """The learner a delivery rank serves."""
        return next(lo for lo, d in self.delivery_of.items() if d == delivery_rank)

    def role_of(self, world_rank: int) -> Role:
        for role in Role:
            if world_rank in self.ranks_of(role):
                return role
        raise ValueError(f"world rank {world_rank} has no role")

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of[a] == self.node_of[b]

    def close(self) -> None:
        """Free every communicator. **Collective** on ``world``, in the same order
        on every rank."""
        for c in (self.actor, self.buffer, self.learner):
            if c is not None:
                c.Free()
        self.node.Free()
        self.world.Free()


def _node_split(world: MPI.Intracomm, emulate_nodes: int) -> tuple[MPI.Intracomm, tuple[int, ...]]:
    rank, size = world.Get_rank(), world.Get_size()
    if emulate_nodes > 0:
        nodes = emulate_nodes
        color = rank * nodes // size
        node: MPI.Intracomm = world.Split(color, rank)  # type: ignore[assignment]
    else:
        node = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)  # type: ignore[assignment]
        leader = node.allreduce(rank, op=MPI.MIN)
        leaders = sorted(set(allgather_json(world, int(leader))))
        color = leaders.index(leader)
    return node, tuple(int(c) for c in allgather_json(world, int(color)))


def split_roles(comm: MPI.Intracomm, layout: LayoutConfig, delivery: str = "thread",
                timeout_s: float | None = None, hosts: Hosts = NO_HOSTS) -> RoleComms:
    """Split a private duplicate of ``comm`` into role communicators.

    **Collective** on ``comm``. Blocks until every rank of ``comm`` calls it; with
    ``timeout_s``, at most that long at the ``Dup`` and at the role splits (a bounded
    ``Ibarrier`` before each: neither has a non-blocking form to wait on). ``hosts``:
    :func:`check_same_config`'s, kept on the result.

    Raises:
        WorldTooSmall: fewer ranks (per node) than the layout needs - on every rank.
        ConfigError: more ranks than a layout with fixed counts uses, or more emulated
            nodes than ranks - on every rank.
        CollectiveFailed: with ``timeout_s``, a rank did not reach the split in time
            (it stopped, hangs or died before it) - on every rank that did.
    """
    bad = emulated_nodes_problem(layout, comm.Get_size())
    if bad is not None:  # the same verdict on every rank (one config, one world)
        raise bad
    if timeout_s is not None:
        bounded_barrier(comm, timeout_s, "the data plane's constructor (the role split)")
    world = comm.Dup()
    node, node_of = _node_split(world, layout.emulate_nodes)
    got, err = assign_roles(layout, node_of, delivery)
    if timeout_s is not None and err is None:  # Split has no non-blocking form
        bounded_barrier(world, timeout_s, "the data plane's constructor (the role "
                        "communicators)")  # raised: not freed (no collective after a failure)
    if err is not None or got is None:
        node.Free()
        world.Free()
        assert err is not None
        raise err
    me = got.roles[world.Get_rank()]
    ranks = {name: got.ranks(name) for name in ("actor", "buffer", "learner", "delivery")}
    subs: dict[str, MPI.Intracomm | None] = {}
    for i, name in enumerate(("actor", "buffer", "learner")):
        color = i if me == name else MPI.UNDEFINED
        c: MPI.Intracomm = world.Split(color, world.Get_rank())  # type: ignore[assignment]
        subs[name] = None if c == MPI.COMM_NULL else c
    return RoleComms(world=world, node=node, role=Role(me), actor=subs["actor"],
                     buffer=subs["buffer"], learner=subs["learner"],
                     actor_ranks=ranks["actor"], buffer_ranks=ranks["buffer"],
                     learner_ranks=ranks["learner"], node_of=node_of,
                     delivery_ranks=ranks["delivery"], delivery_of=got.delivery_of,
                     writer_ranks=ranks["actor"] + (ranks["learner"] if layout.learners_ingest
                                                    else ()), hosts=hosts)


def agree(comm: MPI.Intracomm, ok: bool) -> bool:
    """True on every rank iff ``ok`` is true on every rank. **Collective**."""
    return bool(comm.allreduce(bool(ok), op=MPI.LAND))


def machine_identity() -> tuple[str, str]:
    """``(hostname, machine)``: ``machine`` is the same for two processes exactly when
    they can share memory - the kernel's boot id and the file system that backs shared
    memory (``/dev/shm``: a container or a test host with its own tmpfs has another).
    Local."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    directory = shared_memory_dir()
    try:
        dev = str(os.stat(directory).st_dev) if directory is not None else ""
    except OSError:
        dev = ""
    return socket.gethostname(), f"{boot}:{dev}"


def check_same_config(comm: MPI.Intracomm, config: Config) -> Hosts:
    """Raise :class:`ConfigMismatch` on every rank unless all ranks hold equal configs,
    and :class:`~conduit_hpc.errors.ConfigError` where one hostname is shared by several
    machines (:func:`machine_identity`: MPI would take them for one node).

    **Collective** on ``comm`` (one all-gather of a 64-character digest and each rank's
    hostname and machine), after a barrier, both bounded by ``run.timeout_s``: a rank that
    never comes (it left before the constructor) makes the others raise
    :class:`~conduit_hpc.errors.CollectiveFailed`. Returns each rank's hostname (from that
    all-gather), for errors that name a rank waited on.
    """
    bounded_barrier(comm, config.run.timeout_s, "the data plane's constructor")
    # bounded too, and before any blocking collective: two machines with one hostname are
    # one node to Open MPI, whose blocking collectives then pick different algorithms on
    # different ranks and wait for each other for ever (docs/hosts.md)
    seen = allgather_json(comm, [config.digest(), *machine_identity()], config.run.timeout_s,
                          "the data plane's constructor (the config digests)")
    digests = [d for d, _, _ in seen]
    machines: dict[str, dict[str, list[int]]] = {}
    for r, (_, host, machine) in enumerate(seen):
        machines.setdefault(host, {}).setdefault(machine, []).append(r)
    shared = {h: m for h, m in machines.items() if len(m) > 1}
    if shared:
        host, by_machine = next(iter(shared.items()))
        raise ConfigError(f"hostname {host!r} is shared by {len(by_machine)} machines (world "
                          f"ranks by machine: {sorted(by_machine.values())}): MPI tells nodes "
                          f"apart by hostname and would take them for one node (shared "
                          f"memory that is not shared; collectives that never end); give "
                          f"every node its own hostname", key="layout")
    if len(set(digests)) > 1:
        groups: dict[str, list[int]] = {}
        for r, d in enumerate(digests):
            groups.setdefault(d, []).append(r)
        parts = "; ".join(f"ranks {v} hold config {k[:12]}" for k, v in groups.items())
        raise ConfigMismatch(f"ranks hold different configurations: {parts}")
    return Hosts([host for _, host, _ in seen])


def check_arguments(config: object, comm: object, transform: object = None,
                    placement: object = None, run_dir: object = None) -> None:
    """Refuse what is not a :class:`Config`, an intracommunicator, a callable transform,
    a :class:`~conduit_hpc.placement.placement.Placement` or a run directory this rank
    can make, naming it, before anything collective (every rank given the same
    arguments raises alike; each makes ``run_dir`` for its own metrics). Local.

    Raises:
        ConfigError: naming the argument, the value given and what was expected.
    """
    from conduit_hpc.placement.placement import Placement

    if placement is not None and not isinstance(placement, Placement):
        raise ConfigError(f"placement must be a conduit_hpc Placement or None, got "
                          f"{type(placement).__name__} {placement!r:.80}", key="placement")
    if run_dir is not None:
        if not isinstance(run_dir, str | os.PathLike) or not str(run_dir):
            raise ConfigError(f"run_dir must be a path (str or os.PathLike) or None, got "
                              f"{type(run_dir).__name__} {run_dir!r:.80}", key="run_dir")
        try:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(f"run_dir {str(run_dir)!r} cannot be made: "
                              f"{err.strerror or err}; expected a writable directory",
                              key="run_dir") from err
    if transform is not None and not callable(transform):
        raise ConfigError(f"transform must be a callable (a dict of numpy arrays -> such "
                          f"a dict) or None, got {type(transform).__name__} "
                          f"{transform!r:.80}", key="transform")
    if not isinstance(config, Config):
        raise ConfigError(f"config must be a conduit_hpc.Config (Config.from_toml or "
                          f"Config.from_dict), got {type(config).__name__} "
                          f"{config!r:.80}", key="config")
    if not isinstance(comm, MPI.Intracomm):
        raise ConfigError(f"comm must be an mpi4py intracommunicator, got "
                          f"{type(comm).__name__} {comm!r:.80}", key="comm")
