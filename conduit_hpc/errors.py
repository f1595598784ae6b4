"""The conduit_hpc error hierarchy.

Every error the library raises on purpose is a :class:`ConduitError`. Input errors are
also ``ValueError`` so that callers who only know the standard library can catch them.
Messages name the field, the value and what was expected.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CheckpointMismatch",
    "CollectiveMismatch",
    "ConduitError",
    "ConfigError",
    "ConfigMismatch",
    "DataPlaneClosed",
    "DataPlaneTimeout",
    "IngestAbandoned",
    "PlacementInfeasible",
    "RateLimitDeadlock",
    "RemoteFailure",
    "RoundingOver",
    "SpecError",
    "TransportError",
    "UsedAfterClose",
    "WorldTooSmall",
]


class ConduitError(Exception):
    """Base class of every error raised by conduit_hpc."""


class ConfigError(ConduitError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range.

    Attributes:
        key (str): the dotted key at fault (``storage.capacity_rows``), or ``""``.
    """

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class ConfigMismatch(ConduitError):
    """Ranks of one job hold different configurations (raised on every rank)."""


class WorldTooSmall(ConduitError):
    """The world has too few ranks for the requested layout (raised on every rank)."""


class SpecError(ConduitError, ValueError):
    """A batch does not match the experience :class:`~conduit_hpc.spec.Spec`."""


class TransportError(ConduitError):
    """A transport operation failed or was used outside its lifetime."""


class DataPlaneTimeout(ConduitError, TimeoutError):
    """A blocking wait of the data plane ran past its ``timeout_s``."""


class DataPlaneClosed(ConduitError):
    """The data plane has ended: every actor finished while a learner waited for rows,
    or a call came after ``close()``/``done()`` (:class:`UsedAfterClose`)."""


class IngestAbandoned(ConduitError):
    """A write reserved slots of a shard's ring and failed before committing them (its
    first error says why): commits are in order, so no later row of that shard can
    become visible and the job stops - later writes of the rank raise this, the other
    ranks :class:`RemoteFailure` naming it."""


class UsedAfterClose(DataPlaneClosed):
    """A data-plane call after ``close()`` or ``done()`` on this rank (a
    :class:`DataPlaneClosed`, so code catching that still does; code that ends a loop
    on "the actors finished" can tell this mistake apart)."""


class RateLimitDeadlock(ConduitError):
    """The rate-limiter settings make progress impossible."""


class RemoteFailure(ConduitError):
    """Another rank of the job reported a failure; this rank stops too."""


class CollectiveFailed(TransportError, RemoteFailure):
    """A collective among ranks did not complete: a peer failed, left, or did not arrive
    within the timeout - usually the consequence of another rank's own error, which
    ``conduit-hpc run`` therefore reports in preference to this one."""


class CollectiveMismatch(ConduitError, ValueError):
    """The ranks of a collective called it with arguments it cannot take together: other
    operations at the same point, other tensor counts, shapes, dtypes or order, or a
    tensor it cannot move (sparse, bool, a value out of range) on some rank. Raised on
    every rank, naming the ranks and what each passed; nothing was exchanged."""


class PlacementInfeasible(ConduitError):
    """No placement satisfies the capacity limits (names the tier and the shortfall).

    Attributes:
        tier (str): the tier (or ``+``-joined tiers) that cannot hold the replay.
        shortfall_bytes (int): bytes missing (0 when not a matter of total size).
    """

    def __init__(self, message: str, *, tier: str = "", shortfall_bytes: int = 0) -> None:
        super().__init__(message)
        self.tier = tier
        self.shortfall_bytes = shortfall_bytes


class RoundingOver(PlacementInfeasible):
    """The planner's rounding of an LP solution went past a capacity by the solver's
    tolerance (internal: :func:`~conduit_hpc.placement.static.plan_static` solves once
    more with a slack before it lets this out)."""


class CheckpointError(ConduitError):
    """A checkpoint is incomplete, damaged, foreign or from an unknown schema."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint that is not damaged but that this job cannot use: another spec, a
    schema version from the future, not a conduit_hpc checkpoint. A resume falling back
    past it does not mark it damaged."""
