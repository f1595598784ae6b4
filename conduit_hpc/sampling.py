"""Sampling semantics: stratified global sampling across shards, importance weights,
sequence windows and n-step returns. Plain numpy; no MPI.

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

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ShardStats",
    "allocate_targets",
    "beta_at",
    "importance_weights",
    "nstep_returns",
    "valid_sequence_starts",
]


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


def allocate_targets(totals: np.ndarray, batch: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Stratified targets over the shards laid end to end.

    Args:
        totals (np.ndarray): mass of each shard (>= 0, at least one > 0).
        batch (int): rows to draw.
        rng (np.random.Generator): source of randomness.

    Returns:
        tuple[np.ndarray, np.ndarray]: the shard of each target and the target's mass
        offset inside that shard, in draw order.

    Raises:
        ValueError: every shard is empty, or ``batch`` < 1.
    """
    totals = np.asarray(totals, dtype=np.float64)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch!r}")
    grand = float(totals.sum())
    if not grand > 0:
        raise ValueError("cannot sample: every shard is empty")
    u = (np.arange(batch) + rng.random(batch)) * (grand / batch)
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


def importance_weights(p: np.ndarray, stats: list[ShardStats] | tuple[ShardStats, ...],
                       beta: float) -> np.ndarray:
    """Importance-sampling weights ``(N * P(i)) ** -beta`` normalised by the largest
    possible weight (that of the smallest-priority row held anywhere).

    Args:
        p (np.ndarray): ``priority ** alpha`` of each sampled row.
        stats: per-shard statistics of every shard sampled from.
        beta (float): exponent, 0 gives weights of 1.

    Returns:
        np.ndarray: float32 weights in ``(0, 1]``.
    """
    p = np.asarray(p, dtype=np.float64)
    if beta == 0:
        return np.ones(len(p), dtype=np.float32)
    total = sum(s.total for s in stats)
    n = sum(s.count for s in stats)
    pmin = min((s.min for s in stats if s.count), default=float("inf"))
    prob = p / total
    w = np.power(n * prob, -beta)
    wmax = (n * pmin / total) ** (-beta)
    return (w / wmax).astype(np.float32)


def beta_at(superstep: int, beta: float, beta_final: float, anneal_supersteps: int) -> float:
    """Linear annealing of beta from ``beta`` to ``beta_final`` over
    ``anneal_supersteps`` supersteps (0: constant ``beta``)."""
    if anneal_supersteps <= 0:
        return beta
    frac = min(1.0, max(0, superstep) / anneal_supersteps)
    return beta + (beta_final - beta) * frac


def valid_sequence_starts(held: np.ndarray, length: int, *, episode_end: np.ndarray | None,
                          stream: np.ndarray | None, cross_episode: bool = False
                          ) -> np.ndarray:
    """Positions ``s`` such that rows ``s .. s+length-1`` (in sequence order) form a
    valid window.

    A window is valid when every row is held, every row comes from the same stream
    (e.g. the same actor), and - unless ``cross_episode`` - no row but the last ends an
    episode.

    Args:
        held (np.ndarray): bool per position, whether a committed row is held there.
        length (int): window length (>= 1).
        episode_end (np.ndarray | None): bool per position, the row ends an episode.
        stream (np.ndarray | None): stream id per position.
        cross_episode (bool): allow windows that span episode ends.

    Returns:
        np.ndarray: int64 start positions, ascending.
    """
    held = np.asarray(held, dtype=bool)
    n = len(held)
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length!r}")
    if n < length:
        return np.zeros(0, dtype=np.int64)
    starts = n - length + 1

    def window_all(ok: np.ndarray, span: int) -> np.ndarray:
        # ok[s .. s+span-1] all true, for s in [0, starts)
        if span <= 0:
            return np.ones(starts, dtype=bool)
        bad = np.concatenate(([0], np.cumsum(~ok)))
        return (bad[span:span + starts] - bad[:starts]) == 0

    valid = window_all(held, length)
    if stream is not None and length > 1:
        s = np.asarray(stream)
        same = s[1:] == s[:-1]  # position j: rows j and j+1 share a stream
        valid &= window_all(same, length - 1)
    if episode_end is not None and not cross_episode and length > 1:
        e = np.asarray(episode_end, dtype=bool)
        valid &= window_all(~e[:-1], length - 1)
    return np.flatnonzero(valid).astype(np.int64)


def nstep_returns(rewards: np.ndarray, terminated: np.ndarray, gamma: float,
                  truncated: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """n-step discounted returns of windows of ``n`` consecutive steps, cut at the first
    episode end.

    Args:
        rewards (np.ndarray): ``[B, n]`` rewards of steps ``t .. t+n-1``.
        terminated (np.ndarray): ``[B, n]`` step ends the episode in a terminal state.
        gamma (float): discount.
        truncated (np.ndarray | None): ``[B, n]`` step ends the episode by a time limit
            (the return stops there but the state is not terminal: bootstrap).

    Returns:
        tuple: ``returns [B]`` (sum of ``gamma**k r_{t+k}`` up to and including the first
        end), ``discount [B]`` (``gamma**k`` for bootstrapping from the state after the
        last step counted, 0 if that step was terminal), and ``last [B]`` (index of the
        last step counted, whose next observation to bootstrap from).
    """
    r = np.asarray(rewards, dtype=np.float64)
    term = np.asarray(terminated, dtype=bool)
    trunc = np.zeros_like(term) if truncated is None else np.asarray(truncated, dtype=bool)
    b, n = r.shape
    ends = term | trunc
    any_end = ends.any(axis=1)
    last = np.where(any_end, ends.argmax(axis=1), n - 1)
    k = np.arange(n)
    counted = k[None, :] <= last[:, None]
    disc = gamma ** k
    returns = (r * disc[None, :] * counted).sum(axis=1)
    boot = gamma ** (last + 1)
    boot = np.where(term[np.arange(b), last], 0.0, boot)
    return returns.astype(np.float32), boot.astype(np.float32), last.astype(np.int64)


def nstep_transform(batch: Mapping[str, np.ndarray], *, gamma: float, reward: str = "reward",
                    terminated: str = "terminated", truncated: str | None = "truncated",
                    obs: str = "obs", next_obs: str = "next_obs", action: str = "action"
                    ) -> dict[str, np.ndarray]:
    """Turn sampled windows ``[B, n, ...]`` of 1-step transitions into n-step
    transitions: ``obs`` and ``action`` of the first step, the n-step ``return``, the
    ``next_obs`` after the last counted step and its bootstrap ``discount``.
    """
    ret, disc, last = nstep_returns(batch[reward], batch[terminated], gamma,
                                    batch[truncated] if truncated and truncated in batch
                                    else None)
    rows = np.arange(len(last))
    return {"obs": batch[obs][:, 0], "action": batch[action][:, 0], "return": ret,
            "next_obs": batch[next_obs][rows, last], "discount": disc}
