"""Stratified global sampling across shards and importance weights. Plain numpy.

The data plane samples in two steps. The learner sees each shard's total mass ``T_k``
(sum of ``priority ** alpha`` over its held rows), row count and minimum, and draws
``B`` stratified targets over ``[0, sum_k T_k)`` - target ``i`` uniform in segment
``i`` of ``B`` equal segments, as Schaul et al. do over one sum-tree. Each target falls in
one shard; the shard's owner finds the row by prefix search in its own tree. Laid end to
end, the shards' trees are one tree, so the distribution is exactly that of a single
buffer holding every row. Uniform sampling is the same with ``alpha = 0`` (every held row
has mass 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conduit_hpc.storage import tree_kernels

__all__ = ["ShardStats", "allocate_targets", "beta_at", "importance_weights"]


@dataclass(frozen=True, slots=True)
class ShardStats:
    """What a learner knows of one shard when it samples.

    Attributes:
        total (float): sum of ``priority ** alpha`` over held rows.
        count (int): held rows.
        min (float): smallest ``priority ** alpha`` of a held row (inf if none).
    """

    total: float
    count: int
    min: float


def allocate_targets(totals: np.ndarray, batch: int, rng: np.random.Generator, *,
                     compiled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Stratified targets over the shards laid end to end.

    Args:
        totals (np.ndarray): mass of each shard (>= 0, at least one > 0).
        batch (int): rows to draw.
        rng (np.random.Generator): source of randomness.
        compiled (bool): one compiled loop where numba is there
            (:mod:`conduit_hpc.storage.tree_kernels`; the same draws and float steps),
            else numpy (the reference).

    Returns:
        tuple[np.ndarray, np.ndarray]: the shard of each target and the target's mass
        offset inside that shard, in draw order.

    Raises:
        ValueError: every shard is empty, or ``batch`` < 1.
    """
    totals = np.asarray(totals, dtype=np.float64)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch!r}")
    # one shard: its total (numpy's sum of one element, without the call)
    grand = float(totals[0]) if totals.shape == (1,) else float(totals.sum())
    if not grand > 0:
        raise ValueError("cannot sample: every shard is empty")
    rand = rng.random(batch)
    if grand < _TINY:
        # masses so small (subnormal priorities ** alpha) that the stratum width
        # grand / batch is rounded to a few units of the last place, or to 0 (every
        # target then fell on the first row): draw over the totals scaled by a power of
        # two (exact), then scale the targets back onto the shards' own masses, rounded
        # down onto the subnormal grid (to nearest, the first row of a shard got half a
        # unit's share and the last one and a half): each unit of mass keeps its share
        shard, scaled = _allocate(totals * _SCALE, grand * _SCALE, rand, compiled)
        local = scaled / _SCALE
        up = local * _SCALE > scaled  # exact: a power of two times a subnormal
        local[up] = np.nextafter(local[up], 0.0)
        return shard, np.minimum(local, np.nextafter(totals[shard], 0.0))
    return _allocate(totals, grand, rand, compiled)


def _allocate(totals: np.ndarray, grand: float, rand: np.ndarray, compiled: bool
              ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`allocate_targets` after its checks (``rand``: the batch's uniforms)."""
    batch = len(rand)
    if compiled:
        found = tree_kernels.allocate(totals, grand, rand)
        if found is not None:
            return found
    u = (np.arange(batch) + rand) * (grand / batch)
    cum = np.cumsum(totals)
    shard = np.searchsorted(cum, u, side="right")
    # rounding can push the last target to the end: give it to the last non-empty shard
    last = int(np.flatnonzero(totals > 0)[-1])
    shard = np.minimum(shard, last)
    # a target landing in an empty shard (zero width) moves to the next non-empty one
    empty = totals[shard] <= 0
    if empty.any():
        nonempty = np.flatnonzero(totals > 0)
        shard[empty] = nonempty[np.searchsorted(nonempty, shard[empty]).clip(
            max=len(nonempty) - 1)]
    start = cum[shard] - totals[shard]
    local = np.clip(u - start, 0.0, np.nextafter(totals[shard], 0.0))
    return shard.astype(np.int64), local


#: a total mass below this is scaled by :data:`_SCALE` before targets are drawn over it
_TINY = 2.0 ** -900
_SCALE = 2.0 ** 600


def importance_weights(p: np.ndarray, stats: list[ShardStats] | tuple[ShardStats, ...],
                       beta: float, *, compiled: bool = True) -> np.ndarray:
    """Importance-sampling weights ``(N * P(i)) ** -beta`` normalised by the largest
    possible weight (that of the smallest-priority row held anywhere: the smallest of
    the shards' published minima and the sampled rows' own masses).

    The rows' masses are read after the statistics: a priority lowered in between (by
    another learner, or an update of this one the owner applied meanwhile) can make a
    drawn row lighter than every published minimum. It is then the lightest row known
    and weighs 1, never more (normalised by a stale minimum, such a row weighed up to
    ``(pmin / p) ** beta``: 174 measured with two learners).

    Args:
        p (np.ndarray): ``priority ** alpha`` of each sampled row.
        stats: per-shard statistics of every shard sampled from.
        beta (float): exponent, 0 gives weights of 1.
        compiled (bool): one compiled loop where numba is there (the same float steps,
            element by element), else numpy (the reference).

    Returns:
        np.ndarray: float32 weights in ``(0, 1]``.
    """
    p = np.asarray(p, dtype=np.float64)
    if beta == 0:
        return np.ones(len(p), dtype=np.float32)
    pmin = min((s.min for s in stats if s.count), default=float("inf"))
    if compiled:  # the steps below in one compiled loop
        out = tree_kernels.is_weights(p, pmin, beta, _LEAST_WEIGHT)
        if out is not None:
            return out
    if len(p):
        drawn = float(p.min())
        if not drawn > 0:  # a row of mass 0 is never drawn: ignore one here
            pos = p[p > 0]
            drawn = float(pos.min()) if len(pos) else float("inf")
        pmin = min(pmin, drawn)
    # (N p / total) ** -beta / (N pmin / total) ** -beta = (p / pmin) ** -beta, in
    # logs: nothing underflows to 0 ** -beta (inf, or ZeroDivisionError) for a tiny
    # priority or overflows for a large ratio
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        out = np.exp(-beta * (np.log(p) - np.log(pmin))).astype(np.float32)
    # a ratio past float32's range (priorities 1e30 and 1e-20 may both be held) made a
    # weight 0, outside (0, 1] (a loss that divides by it, or takes its log, got inf):
    # the smallest normal float32 instead
    return np.maximum(out, _LEAST_WEIGHT, out=out)


_LEAST_WEIGHT = np.float32(np.finfo(np.float32).tiny)


def beta_at(superstep: int, beta: float, beta_final: float, anneal_supersteps: int) -> float:
    """Linear annealing of beta from ``beta`` to ``beta_final`` over
    ``anneal_supersteps`` supersteps (0: constant ``beta``)."""
    if anneal_supersteps <= 0:
        return beta
    frac = min(1.0, max(0, superstep) / anneal_supersteps)
    return beta + (beta_final - beta) * frac
