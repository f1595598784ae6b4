"""Moving from one placement to another: which rows of each old shard go to which new
shard (:func:`plan_moves`, :class:`Move`), hottest rows first into the fastest tier when
the replay is prioritized (:func:`hot_counts`). Plain Python and numpy; no MPI, no cost
model (what moving costs is :func:`~conduit_hpc.placement.adaptive.migration_seconds`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.placement import Placement

__all__ = ["TIER_SPEED", "Move", "hot_counts", "plan_moves"]

#: tiers fastest first: moves fill the fastest new shard first
TIER_SPEED = {"learner_gpu": 0, "learner_host": 1, "buffer_host": 2}


@dataclass(frozen=True, slots=True)
class Move:
    """Rows to carry from one shard of the old plan to one of the new.

    Attributes:
        src_shard (int): shard id in the old placement.
        dst_shard (int): shard id in the new placement.
        rows (int): how many of the source's rows (at most; fewer if fewer are held).
        order (str): which rows first: ``hottest`` (prioritized) or ``oldest``.
    """

    src_shard: int
    dst_shard: int
    rows: int
    order: Literal["hottest", "oldest"]


def hot_counts(priorities: Mapping[int, np.ndarray], top: int) -> dict[int, int]:
    """How many of the partition-wide ``top`` hottest rows each shard holds (ties go to
    the lower shard id). ``priorities``: shard id -> priorities of its held rows."""
    if top <= 0 or not priorities:
        return dict.fromkeys(priorities, 0)
    ids = sorted(priorities)
    allp = np.concatenate([np.asarray(priorities[i], np.float64) for i in ids])
    owner = np.concatenate([np.full(len(priorities[i]), i) for i in ids])
    pick = np.lexsort((owner, -allp))[:top]
    got = np.bincount(np.searchsorted(ids, owner[pick]), minlength=len(ids))
    return {i: int(n) for i, n in zip(ids, got, strict=True)}


def plan_moves(old: Placement, new: Placement, held: Mapping[int, int] | None = None, *,
               hot_first: bool = False, hot: Mapping[int, int] | None = None
               ) -> tuple[Move, ...]:
    """Which rows of each old shard go to which new shard. Deterministic.

    Per partition (or for the one global partition), every old shard spreads its held
    rows over the partition's new shards in proportion to their capacities (largest
    remainder), fastest tier first; with ``hot_first`` each old shard sends its hottest
    rows to the fastest new shard, so that the hottest rows of the partition end up in
    its fastest tier. Rows beyond the new capacity (a shrinking partition) are not
    moved: the oldest are dropped first, and :func:`plan_moves` says so by moving fewer.

    Args:
        old (Placement), new (Placement): the plans.
        held (Mapping[int, int] | None): rows each old shard holds (default: full).
        hot_first (bool): order rows by priority instead of age.
        hot (Mapping[int, int] | None): with ``hot_first``, how many of the partition's
            hottest rows each old shard holds (:func:`hot_counts`): those fill the
            fastest new shards first, so the partition's hottest rows land there exactly.
    """
    order: Literal["hottest", "oldest"] = "hottest" if hot_first else "oldest"
    held = held or {s.shard_id: s.capacity_rows for s in old.shards}

    def groups(p: Placement) -> dict[int, list[int]]:
        g: dict[int, list[int]] = {}
        for s in p.shards:
            g.setdefault(s.partition, []).append(s.shard_id)
        return g

    og, ng = groups(old), groups(new)
    if set(og) != set(ng):
        raise ConfigError(f"the plans partition the replay differently: old partitions "
                          f"{sorted(og)}, new {sorted(ng)}", key="placement")
    moves: list[Move] = []
    for part in sorted(og):
        dst = sorted(ng[part], key=lambda i: (TIER_SPEED[new.shards[i].tier], i))
        room = {i: new.shards[i].capacity_rows for i in dst}
        src = sorted(og[part], key=lambda i: (TIER_SPEED[old.shards[i].tier], i))
        total_room = sum(room.values())
        total_held = sum(min(held.get(i, 0), old.shards[i].capacity_rows) for i in src)
        keep = min(total_room, total_held)
        # how many rows each source keeps (a shrinking partition drops oldest rows)
        quota = _split(keep, [min(held.get(i, 0), old.shards[i].capacity_rows) for i in src])
        sent: dict[tuple[int, int], int] = {}
        if hot_first and hot:
            # the partition's hottest rows fill the fastest new shards first
            hot_q = [min(hot.get(i, 0), q) for i, q in zip(src, quota, strict=True)]
            for d in dst:
                take = _split(min(room[d], sum(hot_q)), hot_q, limit=hot_q)
                for j, (i, n) in enumerate(zip(src, take, strict=True)):
                    if n > 0:
                        sent[(i, d)] = sent.get((i, d), 0) + n
                        hot_q[j] -= n
                        quota[j] -= n
                        room[d] -= n
        for i, q in zip(src, quota, strict=True):
            if q <= 0:
                continue
            caps = [room[d] for d in dst]
            share = _split(q, caps, limit=caps)
            for d, n in zip(dst, share, strict=True):
                if n > 0:
                    sent[(i, d)] = sent.get((i, d), 0) + n
                    room[d] -= n
        # one move per (source, destination); a source's moves go fastest tier first,
        # so with "hottest" order its hottest rows are the ones that reach it
        for (i, d), n in sorted(sent.items(), key=lambda kv: (
                kv[0][0], TIER_SPEED[new.shards[kv[0][1]].tier], kv[0][1])):
            moves.append(Move(i, d, n, order))
    return tuple(moves)


def _split(n: int, weights: Sequence[float], limit: Sequence[int] | None = None) -> list[int]:
    """``n`` split in proportion to ``weights`` (largest remainder), each <= limit."""
    w = np.asarray(weights, np.float64)
    out = np.zeros(len(w), np.int64)
    if n <= 0 or w.sum() <= 0:
        return out.tolist()
    lim = np.asarray(limit if limit is not None else [n] * len(w), np.int64)
    exact = n * w / w.sum()
    out = np.minimum(np.floor(exact).astype(np.int64), lim)
    left = n - int(out.sum())
    for i in np.lexsort((np.arange(len(w)), -(exact - out))):
        if left <= 0:
            break
        if out[i] < lim[i]:
            out[i] += 1
            left -= 1
    i = 0
    while left > 0 and i < len(w):  # limits hit: fill wherever there is room
        add = min(left, int(lim[i] - out[i]))
        out[i] += add
        left -= add
        i += 1
    return out.tolist()
