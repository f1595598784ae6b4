"""What a job's own sections are checked against before any rank starts.

``conduit-hpc run`` loads the job's config class (``JOB_CONFIG``) on the launching
machine, builds a :class:`LaunchWorld` from ``-n``, ``[layout]`` and this machine's
memory, and calls :meth:`Config.check_launch <conduit_hpc.config.Config.check_launch>`
with it before ``mpirun`` starts. A job overrides that method to refuse, with the
field, the value and the limit, what its ranks would fail on only after every rank had
started: sizes whose allocation on one rank cannot fit in a node's memory
(:func:`require_bytes`), counts that must divide among the actors, shapes its spec must
have. Pure; no MPI; nothing here probes hardware (the launcher passes the memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from conduit_hpc.config.checks import MAX_BYTES
from conduit_hpc.errors import ConfigError

__all__ = ["LaunchWorld", "require_bytes"]


@dataclass(frozen=True, slots=True)
class LaunchWorld:
    """The world a job is about to be launched into, as the launcher knows it.

    Attributes:
        ranks (int): world size (``-n``).
        learners (int | None): learner ranks; ``None`` with ``layout.per_node = true``
            (the ranks count the roles per node, which the launcher cannot know).
        buffers (int | None): buffer ranks (``None`` as above).
        actors (int | None): actor ranks (``None`` as above).
        memory_bytes (int | None): the physical memory of one node, taken as the
            launching machine's (``conduit-hpc run`` runs on the job's first node under
            SLURM); ``None`` when unknown, and then only the 64-bit bound applies.
    """

    ranks: int
    learners: int | None = None
    buffers: int | None = None
    actors: int | None = None
    memory_bytes: int | None = None


def require_bytes(world: LaunchWorld, key: str, value: object, nbytes: int,
                  what: str) -> None:
    """Refuse a job-section value whose allocation on one rank is larger than a node's
    memory (or than 2**62 bytes when the memory is unknown): the rank would fail with a
    MemoryError, or swap the node to a standstill, only after every rank had started.

    Args:
        key (str): the dotted key (``synthetic.batch_rows``).
        value (object): its value, as written.
        nbytes (int): the bytes one rank allocates for it at least.
        what (str): what those bytes are, on which role (``"on each actor: 4 batches
            of random rows"``).

    Raises:
        ConfigError: naming ``key``, ``value``, the bytes and the limit.
    """
    limit = world.memory_bytes if world.memory_bytes is not None else MAX_BYTES
    where = ("the memory of this machine (a node of the job)"
             if world.memory_bytes is not None else "2**62 bytes")
    if nbytes > limit:
        raise ConfigError(f"{key} = {value!r} needs {_gb(nbytes)} {what}, more than "
                          f"{where}: {_gb(limit)}; lower {key}", key=key)


def _gb(n: int) -> str:
    return f"{n / 1e9:.3g} GB"
