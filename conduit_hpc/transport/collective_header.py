"""The header every collective of :mod:`conduit_hpc.transport.collectives` starts with:
what a rank may pass that no collective moves, and how the ranks' rows read in errors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from conduit_hpc.errors import RemoteFailure

__all__ = ["OPS", "PROBLEMS", "int64_or", "listing", "peer_left", "problem_of"]

#: the operations, as numbered in the header every collective starts with
OPS = ("", "allreduce_mean_", "allreduce_max", "broadcast_", "all_to_all")
#: what a rank may pass that no collective moves, as numbered in the header
PROBLEMS = ("", "not a torch.Tensor", "a sparse tensor", "a bool tensor",
            "a value that is not an int64", "src must be a rank of the group; got",
            "not one block per rank; got", "a block of other dtype or row shape than "
            "block 0 at position")


def problem_of(tensors: Sequence[Any]) -> tuple[int, int]:
    """(code in :data:`PROBLEMS`, position) of the first tensor no collective moves."""
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            return 1, i
        if t.layout != torch.strided:
            return 2, i
        if t.dtype == torch.bool:
            return 3, i
    return 0, 0


def int64_or(v: Any, default: int) -> int:
    """``v`` as an int64 if it is an integer that fits, else ``default``."""
    ok = isinstance(v, int | np.integer) and -(2 ** 63) <= int(v) < 2 ** 63
    return int(v) if ok else default


def listing(per_rank: dict[int, Any]) -> str:
    """``rank 0: x, rank 1: y`` - at most 8 ranks, then how many more."""
    items = [f"rank {r}: {v}" for r, v in sorted(per_rank.items())]
    return ", ".join(items[:8]) + (f" and {len(items) - 8} more" if len(items) > 8 else "")


def peer_left(peers: Callable[[], object] | None) -> str:
    """What ``peers`` says about a rank that left (its RemoteFailure's text), or ""."""
    if peers is None:
        return ""
    try:
        peers()
    except RemoteFailure as err:
        return str(err)
    except Exception:  # the record itself unreadable: the collective's own error stands
        return ""
    return ""
