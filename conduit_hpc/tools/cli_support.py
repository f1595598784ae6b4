"""Helpers of :mod:`conduit_hpc.tools.cli` that launch or check before a launch: the
rank-count check and a bounded ``mpirun`` (:func:`run_bounded`, from
:mod:`conduit_hpc.tools.mpi_start`: it tries a launch that Open MPI failed to start
again). Nothing here imports MPI."""

from __future__ import annotations

import os
from collections.abc import Mapping

from conduit_hpc.errors import ConfigError
from conduit_hpc.tools.mpi_start import run_bounded

__all__ = ["RANK_FLOOR_BYTES", "check_ranks", "local_ranks_problem", "run_bounded"]

#: the least memory a rank takes on its machine: a Python process with numpy, mpi4py and
#: this package imported (measured ~100 MB resident, ~40 MB of it shared libraries)
RANK_FLOOR_BYTES = 48 << 20
#: set by batch systems whose allocation (or by a hostfile, see below) mpirun may place
#: ranks on other machines with
_ALLOCATIONS = ("SLURM_JOB_ID", "PBS_NODEFILE", "LSB_HOSTS", "LSB_MCPU_HOSTS",
                "PE_HOSTFILE", "OAR_NODEFILE", "COBALT_NODEFILE")


def check_ranks(n: object, flag: str, *, zero_ok: bool = False) -> None:
    """Refuse a rank count the launch cannot take (negative, zero, over Open MPI's int),
    naming the flag, before anything starts."""
    from conduit_hpc.config.checks import MAX_COUNT
    from conduit_hpc.errors import ConfigError

    low = 0 if zero_ok else 1
    if isinstance(n, bool) or not isinstance(n, int) or not low <= n <= MAX_COUNT:
        raise ConfigError(f"{flag} must be a number of ranks between {low} and "
                          f"{MAX_COUNT}, got {n!r}", key=flag)


def local_ranks_problem(n: int, flag: str,
                        env: Mapping[str, str] | None = None) -> ConfigError | None:
    """A rank count that cannot fit on this machine, when ``mpirun -n n`` would start
    every rank here: the pip wheel's MPI (``CONDUIT_MPI`` not ``site``) with no batch
    allocation and no hostfile in the environment. That environment lets Open MPI
    oversubscribe, so ``-n 99999`` started processes until the machine stood still.
    Refused when ``n`` ranks at :data:`RANK_FLOOR_BYTES` each pass its physical memory.
    ``None`` when they fit, or when mpirun may place ranks elsewhere (then the
    allocation or the hostfile bounds them). Local; no MPI."""
    env = os.environ if env is None else env
    if (env.get("CONDUIT_MPI", "") == "site" or any(env.get(k) for k in _ALLOCATIONS)
            or any("HOSTFILE" in k.upper() or k.upper().endswith("_MCA_HOSTS") for k in env)):
        return None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on this platform
        return None
    if n * RANK_FLOOR_BYTES <= memory:
        return None
    return ConfigError(
        f"{flag} {n}: mpirun would start all {n:,} ranks on this machine (no batch "
        f"allocation or hostfile in the environment), and they need at least "
        f"{n * RANK_FLOOR_BYTES / 1e9:,.1f} GB ({RANK_FLOOR_BYTES >> 20} MiB a rank), more "
        f"than its {memory / 1e9:,.1f} GB of memory: at most {memory // RANK_FLOOR_BYTES:,} "
        f"ranks here; run across nodes (a SLURM allocation, or a hostfile) for more",
        key=flag)
