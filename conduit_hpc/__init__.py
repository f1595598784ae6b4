"""conduit_hpc: an experience data plane for distributed RL on HPC clusters.

Importing this package has no side effects: it does not initialise MPI's communicators
beyond what ``mpi4py`` does on import, probes no hardware and starts nothing.
"""

from typing import TYPE_CHECKING

from conduit_hpc.config import (
    CheckpointConfig,
    Config,
    FieldConfig,
    LayoutConfig,
    RunConfig,
    StorageConfig,
    TransportConfig,
)
from conduit_hpc.errors import (
    CheckpointError,
    ConduitError,
    ConfigError,
    ConfigMismatch,
    DataPlaneClosed,
    DataPlaneTimeout,
    IngestAbandoned,
    PlacementInfeasible,
    RateLimitDeadlock,
    RemoteFailure,
    SpecError,
    TransportError,
    UsedAfterClose,
    WorldTooSmall,
)
from conduit_hpc.spec import Field, Spec

if TYPE_CHECKING:  # loaded on first use (they import mpi4py.MPI, which initialises MPI)
    from conduit_hpc.plane.front import ExperienceDataPlane
    from conduit_hpc.plane.roles import Role

__version__ = "0.1.0"

__all__ = [
    "CheckpointConfig",
    "CheckpointError",
    "ConduitError",
    "Config",
    "ConfigError",
    "ConfigMismatch",
    "DataPlaneClosed",
    "DataPlaneTimeout",
    "ExperienceDataPlane",
    "Field",
    "FieldConfig",
    "IngestAbandoned",
    "LayoutConfig",
    "PlacementInfeasible",
    "RateLimitDeadlock",
    "RemoteFailure",
    "Role",
    "RunConfig",
    "Spec",
    "SpecError",
    "StorageConfig",
    "TransportConfig",
    "TransportError",
    "UsedAfterClose",
    "WorldTooSmall",
    "__version__",
]


def __getattr__(name: str) -> object:
    # ExperienceDataPlane and Role import mpi4py.MPI (which initialises MPI); load them
    # on first use so that `import conduit_hpc` stays cheap on a login node.
    if name == "ExperienceDataPlane":
        import conduit_hpc.features  # noqa: F401 - registers the built-in features
        from conduit_hpc.plane.front import ExperienceDataPlane

        return ExperienceDataPlane
    if name == "Role":
        from conduit_hpc.plane.roles import Role

        return Role
    raise AttributeError(f"module 'conduit_hpc' has no attribute {name!r}")
