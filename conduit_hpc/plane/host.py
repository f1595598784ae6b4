"""What a feature may use of the data plane it is attached to: :class:`FeatureHost`.

A typed protocol, so that ``mypy`` holds every feature (``conduit_hpc/features``) to it
rather than to the front object; the front object implements it (checked where it is
built). Its own module: it names the endpoints, whose modules import
:mod:`conduit_hpc.plane.extensions`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from conduit_hpc.config import Config
    from conduit_hpc.placement.placement import Placement
    from conduit_hpc.plane.actor import ActorEndpoint
    from conduit_hpc.plane.buffer import BufferServer, OwnedShard
    from conduit_hpc.plane.control import ControlBlock
    from conduit_hpc.plane.learner import LearnerEndpoint
    from conduit_hpc.plane.roles import Role, RoleComms
    from conduit_hpc.spec import Spec
    from conduit_hpc.storage.ring import ShardRing
    from conduit_hpc.transport.channel import Channel

__all__ = ["FeatureHost"]


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

