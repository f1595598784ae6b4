"""Helpers of :mod:`conduit_hpc.tools.cli` that launch or check before a launch: the
rank-count check and a bounded ``mpirun``. Nothing here imports MPI."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from conduit_hpc.errors import ConduitError

__all__ = ["check_ranks", "run_bounded"]


def check_ranks(n: object, flag: str, *, zero_ok: bool = False) -> None:
    """Refuse a rank count the launch cannot take (negative, zero, over Open MPI's int),
    naming the flag, before anything starts."""
    from conduit_hpc.config.checks import MAX_COUNT
    from conduit_hpc.errors import ConfigError

    low = 0 if zero_ok else 1
    if isinstance(n, bool) or not isinstance(n, int) or not low <= n <= MAX_COUNT:
        raise ConfigError(f"{flag} must be a number of ranks between {low} and "
                          f"{MAX_COUNT}, got {n!r}", key=flag)


def run_bounded(cmd: list[str], env: dict[str, str], timeout_s: float) -> int:
    """Run an MPI launch in its own session; past ``timeout_s`` the whole session (the
    launcher and its ranks) is killed and a ConduitError names the command."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise ConduitError(f"{' '.join(cmd[:3])} did not finish within {timeout_s:.0f} s "
                           f"and was stopped (too many ranks for this machine?)") from None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise
