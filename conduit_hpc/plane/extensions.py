"""The plane's extension interfaces: how features plug in without the plane knowing them.

Three interfaces, modelled on Reverb's ``TableExtension``
(``reverb/cc/table_extensions/interface.h``: named events, one stated locking rule):

* :class:`BufferExtension` - work a feature adds to a buffer rank's progress loop;
* :class:`LearnerHook` - what a feature does at a learner's superstep boundaries;
* :class:`Feature` - a feature of the whole job (checkpointing, live re-placement,
  long-haul): it may decide the placement and the channel before any window exists,
  attaches its extensions and hooks once the plane is built, and adds to the summary.

**The rule on blocking.** Every event of :class:`BufferExtension` runs on the buffer
rank's loop thread, one at a time, between passes over the shards: it must not block -
no collective, no wait for another rank's message, no sleep; sends are ``isend``; slow
work (writing a file) goes to a thread of the extension's own, polled in
:meth:`BufferExtension.on_pass`. :class:`LearnerHook` events run in the learner's own
thread and must not make MPI calls: they hand such work to
:meth:`~conduit_hpc.plane.learner.LearnerEndpoint.post`, which runs it where the rank's
MPI calls are made (the data-plane thread in ``edp`` mode).

Features register a factory with :func:`register_feature`; the plane builds those whose
:meth:`Feature.wanted` says the config asks for them. ``conduit_hpc.features`` registers
the built-in ones when imported (``conduit_hpc.ExperienceDataPlane`` imports it). The
plane imports no feature.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from mpi4py import MPI

    from conduit_hpc.config import Config
    from conduit_hpc.placement.placement import Placement
    from conduit_hpc.plane.actor import ActorEndpoint
    from conduit_hpc.plane.buffer import BufferServer, OwnedShard
    from conduit_hpc.plane.control import ControlBlock
    from conduit_hpc.plane.learner import LearnerEndpoint
    from conduit_hpc.plane.roles import Role, RoleComms
    from conduit_hpc.plane.staging import Batch
    from conduit_hpc.protocol import PriorityUpdate
    from conduit_hpc.spec import Spec
    from conduit_hpc.storage.ring import ShardRing
    from conduit_hpc.transport.channel import Channel, Message

__all__ = ["BufferExtension", "Feature", "FeatureHost", "LearnerHook", "feature_factories",
           "register_feature"]


class FeatureHost(Protocol):
    """What a feature may use of the data plane it is attached to - the whole of it
    (``mypy`` holds features to it; the plane's front object implements it). The
    endpoints are ``None`` on ranks without that role."""

    config: Config
    spec: Spec
    roles: RoleComms
    placement: Placement
    channel: Channel
    control: ControlBlock
    rings: dict[int, ShardRing]
    run_dir: Path | None
    #: this rank's endpoints (``None`` where the rank has not that role)
    server: BufferServer | None
    learner: LearnerEndpoint | None
    actor: ActorEndpoint | None

    @property
    def role(self) -> Role: ...

    @property
    def world_rank(self) -> int: ...

    def owned_shards(self) -> list[OwnedShard]: ...

    def log(self, **values: float) -> None: ...


class BufferExtension:
    """Work added to a buffer rank's progress loop (see the module's rule on blocking).

    Events, in the order a pass makes them: the loop commits new rows, then for every
    message that arrived asks each extension's :meth:`intercept` (the first that returns
    True takes the message), dispatches the rest by tag (:attr:`tags` ->
    :meth:`on_message`), then calls :meth:`on_pass`. :meth:`on_peer_done` follows a
    peer's last message; the loop runs until every peer is done and no extension's
    :meth:`keep_open` is true, then calls :meth:`on_finish` once.
    """

    #: message tags this extension handles (from its feature's range in ``protocol``)
    tags: ClassVar[frozenset[int]] = frozenset()

    def on_message(self, msg: Message) -> None:
        """A message with one of :attr:`tags`."""
        raise NotImplementedError(f"{type(self).__name__} declares tags it does not handle")

    def intercept(self, msg: Message) -> bool:
        """Take ``msg`` before it is dispatched (e.g. to hold it until a checkpoint's
        cut); the extension later hands it back with ``server.dispatch(msg)``."""
        return False

    def on_pass(self) -> int:
        """After each pass; returns work done (0: idle)."""
        return 0

    def on_priority_update(self, update: PriorityUpdate) -> None:
        """A learner's priority update was applied where its rows are now (rows it
        names that were overwritten, or moved away, kept their priority)."""

    def on_peer_done(self, rank: int) -> None:
        """``rank`` said it is done."""

    def keep_open(self) -> bool:
        """True while the loop must go on after every peer is done."""
        return False

    def on_finish(self) -> None:
        """The loop ends (once)."""


class LearnerHook:
    """What a feature does at a learner's superstep boundaries (learner's own thread; no
    MPI calls - hand those to ``endpoint.post``)."""

    def on_boundary(self, superstep: int) -> None:
        """``next_batch`` for ``superstep`` was called: superstep ``superstep - 1`` has
        ended (its priority updates are queued), before the batch is requested."""

    def on_superstep(self, superstep: int, batch: Batch, exposed_s: float) -> None:
        """``next_batch`` returns ``batch`` after ``exposed_s`` seconds of waiting."""

    def on_stop(self) -> None:
        """The learner is done; runs before its MPI thread stops (``post`` still works)."""


class Feature(abc.ABC):
    """A job-wide feature. The plane calls, on every rank, in this order:

    1. :meth:`placement`, :meth:`check` and :meth:`channel` while it is being built
       (before any window);
    2. :meth:`attach` once the endpoints exist (**collective** if the feature makes
       windows);
    3. :meth:`route` on actors for every ingest (the shard to write to);
    4. :meth:`before_done` when a non-buffer rank says it is done;
    5. :meth:`summary` locally and :meth:`merge` over every rank's summary;
    6. :meth:`close` (**collective**) as the plane closes, before its windows go.
    """

    #: the key of ``ExperienceDataPlane.summary()`` this feature fills
    name: ClassVar[str]
    #: its buffer extensions must see every priority update (``on_priority_update``):
    #: learners then send them to the owners as messages instead of writing node-local
    #: indexes directly (:mod:`conduit_hpc.plane.priority_write`)
    priority_messages: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def wanted(cls, config: Config) -> bool:
        """Whether ``config`` asks for this feature."""

    def placement(self, default: Placement | None) -> Placement | None:
        """The job's placement (``None``: keep ``default``). Local; deterministic."""
        return None

    def check(self, placement: Placement, spec: Spec) -> None:  # noqa: B027
        """Before any window: check the job's placement against the feature. Raises the
        same error on every rank (decide from shared data); **collective** only if it
        measures (then on every rank alike)."""

    def channel(self, comm: MPI.Intracomm, poll_interval_s: float) -> Channel | None:
        """A channel to use instead of the plain one (**collective** when it builds one)."""
        return None

    @abc.abstractmethod
    def attach(self, plane: FeatureHost) -> None:
        """Register extensions and hooks on ``plane``'s endpoints (the data plane being
        built; a feature uses nothing of it beyond :class:`FeatureHost`)."""

    def route(self, batches: int) -> int | None:
        """Actors: the shard of the next ingest (``None``: the placement's)."""
        return None

    def before_done(self) -> None:  # noqa: B027
        """This non-buffer rank will send nothing more (e.g. flush held messages)."""

    def summary(self) -> dict[str, Any] | None:
        """This rank's part of the job summary (JSON-able) or ``None``."""
        return None

    def merge(self, parts: list[dict[str, Any] | None]) -> Any:
        """The job's figure from every rank's :meth:`summary` (same on every rank)."""
        return {i: p for i, p in enumerate(parts) if p is not None}

    def close(self) -> None:  # noqa: B027 - optional, default has nothing to free
        """Free what :meth:`attach` made. **Collective**."""


FeatureFactory = Callable[["Config", "RoleComms"], Feature]
_FACTORIES: dict[str, tuple[type[Feature], FeatureFactory]] = {}


def register_feature(cls: type[Feature], factory: FeatureFactory | None = None) -> None:
    """Make the plane build ``cls`` (with ``factory(config, roles)``, default
    ``cls(config, roles)``) wherever ``cls.wanted(config)``. Idempotent per name."""
    _FACTORIES[cls.name] = (cls, factory or cls)


def feature_factories() -> dict[str, tuple[type[Feature], FeatureFactory]]:
    """Registered features by name (a copy)."""
    return dict(_FACTORIES)
