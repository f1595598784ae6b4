"""SLURM wall-time limits (``sbatch --time``) and the preemption warning that must fit
in one. Pure Python.

The forms SLURM accepts: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M`` and ``D-H:M:S``;
minutes and seconds after a colon are below 60. ``0`` asks for no limit.
"""

from __future__ import annotations

import re

from conduit_hpc.config import require
from conduit_hpc.errors import ConfigError

__all__ = ["MAX_SIGNAL_S", "check_signal", "time_limit_s"]

#: the largest ``--signal=...@seconds`` SLURM takes (its field is 16 bits)
MAX_SIGNAL_S = 65535
_TIME = re.compile(r"^(?:(\d{1,5})-)?(\d{1,6})(?::(\d{1,2}))?(?::(\d{1,2}))?$")
_EXPECTED = ("a SLURM time such as 30, 02:00:00 or 1-12 (M, M:S, H:M:S, D-H, D-H:M or "
             "D-H:M:S; minutes and seconds below 60)")


def time_limit_s(time: str, flag: str = "--time") -> int:
    """The seconds of a SLURM time limit (0: none).

    Raises:
        ConfigError: not one of SLURM's forms, or minutes or seconds of 60 or more.
    """
    m = _TIME.match(time)
    if m is None:
        raise ConfigError(f"{flag} must be {_EXPECTED}, got {time!r}", key=flag)
    days, first, *rest = m.groups()
    fields = [int(first), *(int(v) for v in rest if v is not None)]
    if days is not None or len(fields) == 3:  # D-H, D-H:M, D-H:M:S, H:M:S
        h, mi, s = [*fields, 0, 0][:3]
        require(mi < 60 and s < 60, flag, time, _EXPECTED)
        return ((int(days or 0) * 24 + h) * 60 + mi) * 60 + s
    mi, s = [*fields, 0][:2]  # M or M:S
    require(len(fields) == 1 or s < 60, flag, time, _EXPECTED)
    return mi * 60 + s


def check_signal(signal_s: int, time: str) -> None:
    """Refuse a preemption warning SLURM cannot send or that would come before the job
    starts (a launch answers it with a checkpoint and a requeue: the job would requeue
    for ever).

    Raises:
        ConfigError: ``signal_s`` negative, over :data:`MAX_SIGNAL_S`, or not below the
            time limit, naming ``--signal-secs``.
    """
    require(0 <= signal_s <= MAX_SIGNAL_S, "--signal-secs", signal_s,
            f"between 0 and {MAX_SIGNAL_S} (SLURM's limit)")
    limit = time_limit_s(time)
    require(not limit or signal_s < limit, "--signal-secs", signal_s,
            f"below the --time limit {time} ({limit} s), or 0 for no warning: the warning "
            f"would come before the job starts and its requeue would repeat for ever")
