"""Re-placement of a running job onto the shards it already has. Plain Python; no MPI.

A running job does not create or free shards (windows are collective, and a learner's MPI
calls belong to its data-plane thread): every shard a plan can use exists from the start,
one per buffer rank, at that rank's location in the cluster model (``node.buf<j>``).
Re-placing is then (a) routing actors' rows to other shards and (b) moving rows between
the existing shards so that the hottest rows sit where learners read them fastest.

This module is the semantics of that, for :mod:`conduit_hpc.features.replace` (the composition
layer that runs it on MPI ranks):

* :func:`job_placement` - the job's placement as the cost model sees it (each shard at its
  owner's location, one global partition);
* :func:`job_cluster` - the cluster model with each buffer location's capacity set to its
  shard's, so that the static planner's plans fit the rings the job has;
* :func:`on_job_shards` - a plan of the static planner expressed on the job's shards (by
  location): their expected sample shares and the actors' row weights;
* :class:`HeldSample`, :func:`heat_of` - what an owner reports of the rows it holds
  (their sampling masses, hottest first, in at most a few thousand points) and the heat
  bins of the whole replay from those reports;
* :func:`plan_in_place` - which rows move where: the replay's hottest rows fill the shards
  where the plan puts the most mass per row, densest first, each up to its capacity; every
  other row stays where it is when it can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.cluster import ClusterModel, Roster
from conduit_hpc.placement.moves import Move
from conduit_hpc.placement.placement import Placement, ShardPlacement, ShardWeights
from conduit_hpc.placement.workload import SHARD_OVERHEAD_BYTES, Workload

__all__ = [
    "HeldSample",
    "heat_of",
    "job_cluster",
    "job_placement",
    "on_job_shards",
    "plan_in_place",
    "planned_rows",
]

Order = Literal["hottest", "oldest"]


def job_placement(placement: Placement, cluster: ClusterModel, roster: Roster) -> Placement:
    """The job's placement with each shard at its owner's buffer location
    (``<node>.buf<j>``, the cost model's name), tier ``buffer_host``, read by every
    learner (one global partition). Local; deterministic.

    Raises:
        ConfigError: a shard's owner is not a buffer rank of ``roster``, or a buffer rank
            owns more or fewer than one shard.
    """
    where: dict[int, str] = {}
    for i, bufs in enumerate(roster.buffers):
        for j, b in enumerate(bufs):
            where[b] = f"{cluster.nodes[i].name}.buf{j}"
    owners = [s.owner_rank for s in placement.shards]
    for s in placement.shards:
        if s.owner_rank not in where:
            raise ConfigError(f"shard {s.shard_id} is owned by world rank {s.owner_rank}, "
                              f"which is not a buffer rank; re-placing a running job moves "
                              f"rows between buffer ranks' shards", key="placement")
    counts = {b: owners.count(b) for b in where}
    bad = {b: n for b, n in counts.items() if n != 1}
    if bad:
        raise ConfigError(f"adaptive placement needs exactly one shard per buffer rank; "
                          f"shards per buffer rank: {bad}", key="storage.shards_per_buffer")
    shards = tuple(replace(s, tier="buffer_host", partition=-1, location=where[s.owner_rank])
                   for s in placement.shards)
    every = tuple(range(len(shards)))
    return Placement(shards=shards, actor_shards=dict(placement.actor_shards),
                     learner_shards={r: every for r in placement.learner_shards},
                     actor_weights=placement.actor_weights)


def job_cluster(cluster: ClusterModel, roster: Roster, placement: Placement,
                workload: Workload) -> ClusterModel:
    """``cluster`` with each node's ``buffer_host_bytes`` set so that a plan for
    :func:`planned_rows` rows never puts more rows at a location than its shard's ring
    has slots: ``capacity_rows x bytes_per_row`` plus the planner's rounding margin less
    one row (the LP then stays a row below the ring, and rounding adds at most one). The
    model has one buffer capacity per node: shards of one node that differ (round robin
    differs by a row at most) are modelled at the largest; :func:`plan_in_place` fills
    each shard only up to its own ring. Local.

    Args:
        placement (Placement): the job's placement (:func:`job_placement`).
    """
    rows_of = {s.owner_rank: s.capacity_rows for s in placement.shards}
    bpr = workload.bytes_per_row
    nodes = []
    for i, n in enumerate(cluster.nodes):
        caps = [rows_of[b] for b in roster.buffers[i] if b in rows_of]
        if caps:
            cap = max(caps) * bpr + SHARD_OVERHEAD_BYTES
            n = replace(n, buffer_host_bytes=cap)
        nodes.append(n)
    return ClusterModel(name=cluster.name, nodes=tuple(nodes), paths=cluster.paths,
                        source=cluster.source)


def planned_rows(job: Placement) -> int:
    """Rows the policy plans the replay for: every ring's slots less one row each (the
    static planner's rounding margin, see :func:`job_cluster`)."""
    return max(1, job.capacity_rows - len(job.shards))


def on_job_shards(plan: Placement, job: Placement) -> Placement:
    """A plan (from :func:`~conduit_hpc.placement.plan_static` on :func:`job_cluster`)
    on the job's own shards, matched by location: each shard's expected sample share
    and the actors' row weights. Capacities, owners and readers stay the job's. Local.

    Raises:
        ConfigError: the plan uses a location where the job has no shard.
    """
    by_loc = {s.location: s.shard_id for s in job.shards}

    def at(sid: int) -> int:
        loc = plan.shards[sid].location
        if loc not in by_loc:
            raise ConfigError(f"the plan puts shard {sid} at {loc!r}, where the job has no "
                              f"shard (job shards at {sorted(by_loc)})", key="placement")
        return by_loc[loc]

    share: dict[int, float] = {}
    for s in plan.shards:
        share[at(s.shard_id)] = share.get(at(s.shard_id), 0.0) + s.share
    shards = tuple(replace(s, share=share.get(s.shard_id, 0.0)) for s in job.shards)
    weights: dict[int, ShardWeights] = {}
    cache: dict[int, ShardWeights] = {}
    for a, w in (plan.actor_weights or {}).items():
        if id(w) not in cache:
            mapped: dict[int, float] = {}
            for sid, x in zip(w.shards, w.weights, strict=True):
                mapped[at(sid)] = mapped.get(at(sid), 0.0) + x
            cache[id(w)] = ShardWeights.of(mapped)
        weights[a] = cache[id(w)]
    actor_shards = {a: (weights[a].pick(0) if a in weights else sid)
                    for a, sid in job.actor_shards.items()}
    for a, sid in job.actor_shards.items():  # actors the plan does not route keep theirs
        weights.setdefault(a, ShardWeights.of({sid: 1.0}))
    return Placement(shards=shards, actor_shards=actor_shards,
                     learner_shards=dict(job.learner_shards), actor_weights=weights,
                     prediction=plan.prediction)


@dataclass(frozen=True, slots=True)
class HeldSample:
    """The rows one shard holds, by sampling mass, hottest first.

    Small shards list every row; larger ones are cut into ``max_points`` runs of
    consecutive rows (in mass order), each reported as its total mass and row count.

    Attributes:
        shard_id (int): the shard.
        mass (np.ndarray): float64 ``[k]``: total mass (``priority ** alpha``) per point,
            non-increasing in mass per row.
        rows (np.ndarray): int64 ``[k]``: rows per point (>= 1).
    """

    shard_id: int
    mass: np.ndarray
    rows: np.ndarray

    @classmethod
    def of(cls, shard_id: int, masses: np.ndarray, max_points: int = 4096) -> HeldSample:
        """From the mass of every held row (any order)."""
        if max_points < 1:
            raise ValueError(f"max_points must be >= 1, got {max_points!r}")
        m = np.sort(np.asarray(masses, np.float64).reshape(-1))[::-1]
        if len(m) <= max_points:
            return cls(int(shard_id), m.copy(), np.ones(len(m), np.int64))
        cuts = np.linspace(0, len(m), max_points + 1).round().astype(np.int64)
        cuts = np.unique(cuts)
        csum = np.concatenate([[0.0], np.cumsum(m)])
        return cls(int(shard_id), csum[cuts[1:]] - csum[cuts[:-1]],
                   np.diff(cuts).astype(np.int64))

    @property
    def held(self) -> int:
        return int(self.rows.sum())

    @property
    def total(self) -> float:
        return float(self.mass.sum())

    @property
    def density(self) -> np.ndarray:
        """Mass per row of each point."""
        return self.mass / np.maximum(self.rows, 1)


def _merged(samples: Sequence[HeldSample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(density, rows, shard) of every point, hottest first (ties: lower shard id)."""
    if not samples:
        z = np.zeros(0)
        return z, z.astype(np.int64), z.astype(np.int64)
    dens = np.concatenate([s.density for s in samples])
    rows = np.concatenate([s.rows for s in samples])
    shard = np.concatenate([np.full(len(s.rows), s.shard_id, np.int64) for s in samples])
    order = np.lexsort((shard, -dens))
    return dens[order], rows[order], shard[order]


def heat_of(samples: Sequence[HeldSample],
            row_edges: Sequence[float] = (0.01, 0.05, 0.2, 1.0)
            ) -> tuple[tuple[float, float], ...]:
    """Heat bins of the whole replay (:func:`~conduit_hpc.placement.adaptive.heat_bins`
    of every held row's mass) from the shards' reports; exact when every point is one
    row, interpolated within a point otherwise. Local.

    Returns:
        tuple: (row share, mass share) bins, hottest first; empty without mass.
    """
    dens, rows, _ = _merged(samples)
    n = int(rows.sum())
    total = float((dens * rows).sum())
    if n == 0 or total <= 0:
        return ()
    edges = [e for e in row_edges if 0 < e <= 1]
    if not edges or edges[-1] != 1.0:
        raise ConfigError(f"row_edges must end at 1.0, got {list(row_edges)!r}",
                          key="row_edges")
    rcum = np.concatenate([[0], np.cumsum(rows)])
    mcum = np.concatenate([[0.0], np.cumsum(dens * rows)])

    def mass_at(k: int) -> float:
        j = int(np.searchsorted(rcum, k, side="left"))  # rcum[j-1] < k <= rcum[j]
        if j == 0:
            return 0.0
        return float(mcum[j - 1] + (k - rcum[j - 1]) * dens[j - 1])

    bins, prev_k, prev_m = [], 0, 0.0
    for e in edges:
        k = max(prev_k + 1, min(n, round(e * n)))
        if k <= prev_k:
            continue
        m = mass_at(k)
        bins.append(((k - prev_k) / n, (m - prev_m) / total))
        prev_k, prev_m = k, m
        if k == n:
            break
    return tuple(bins)


def plan_in_place(plan: Placement, samples: Sequence[HeldSample], *,
                  order: Order = "hottest") -> tuple[Move, ...]:
    """Which rows of each shard move to which shard under ``plan`` (on the job's shards,
    :func:`on_job_shards`). Local; deterministic.

    Shards are filled densest first - by the plan's mass per row of capacity
    (``share / capacity_rows``; ties: lower shard id) - each with up to ``capacity_rows``
    rows: with ``order = "hottest"`` the hottest rows still unplaced, preferring (among
    equally hot ones) rows the shard already holds; with ``"oldest"`` (uniform sampling,
    every row equally hot) the rows it holds first, then others'. Each shard's rows are
    spread over the destinations in that same order, so the owner carries them out by
    taking its rows in ``order`` (:func:`~conduit_hpc.storage.migrate.select_rows`) and
    cutting them into consecutive runs, one per :class:`Move` of that source, in the
    order returned. Moves with ``src_shard == dst_shard`` are rows that stay.

    Args:
        plan (Placement): the new plan on the job's shards.
        samples (Sequence[HeldSample]): what every shard holds now.
        order (str): ``hottest`` (prioritized) or ``oldest``.

    Returns:
        tuple[Move, ...]: grouped by source shard (ascending), destinations in fill order.
    """
    cap = {s.shard_id: s.capacity_rows for s in plan.shards}
    dens_of = {s.shard_id: (s.share / s.capacity_rows if s.capacity_rows else 0.0)
               for s in plan.shards}
    dst_order = sorted(cap, key=lambda i: (-dens_of[i], i))
    dens, rows, shard = _merged(samples)
    if order == "oldest":
        dens = np.zeros_like(dens)
    left = rows.astype(np.int64).copy()
    ids = np.asarray(sorted({int(x) for x in shard}), np.int64)
    sent: dict[tuple[int, int], int] = {}
    for d in dst_order:
        room = cap[d]
        if room <= 0 or not left.any():
            continue
        # hottest first; among equally hot rows, the ones already here
        pick = np.lexsort((shard, shard != d, -dens))
        avail = left[pick]
        before = np.cumsum(avail) - avail
        take = np.clip(room - before, 0, avail)
        left[pick] -= take
        got = np.zeros(len(ids), np.int64)
        np.add.at(got, np.searchsorted(ids, shard[pick]), take)
        for src, n in zip(ids, got, strict=True):
            if n > 0:
                sent[(int(src), d)] = int(n)
    rank = {d: k for k, d in enumerate(dst_order)}
    moves = sorted(sent.items(), key=lambda kv: (kv[0][0], rank[kv[0][1]]))
    return tuple(Move(src, dst, n, order) for (src, dst), n in moves if n > 0)


def moves_by_source(moves: Sequence[Move]) -> dict[int, list[tuple[int, int]]]:
    """Moves grouped per source shard: ``src -> [(dst, rows), ...]`` in order."""
    out: dict[int, list[tuple[int, int]]] = {}
    for m in moves:
        out.setdefault(m.src_shard, []).append((m.dst_shard, m.rows))
    return out


def rows_moving(moves: Sequence[Move]) -> int:
    """Rows that change shard (stays excluded)."""
    return sum(m.rows for m in moves if m.src_shard != m.dst_shard)


def check_weights(weights: Mapping[int, ShardWeights], n_shards: int) -> None:
    """Raise ConfigError unless every actor's weights name shards in ``[0, n_shards)``."""
    for a, w in weights.items():
        if w.shards and not (w.shards[0] >= 0 and w.shards[-1] < n_shards):
            raise ConfigError(f"actor {a} writes shards {w.shards}, outside [0, {n_shards})",
                              key="actor_weights")


def with_shares(job: Placement, shares: Mapping[int, float]) -> Placement:
    """``job`` with the given expected sample shares (others 0)."""
    return replace(job, shards=tuple(
        ShardPlacement(shard_id=s.shard_id, owner_rank=s.owner_rank, tier=s.tier,
                       capacity_rows=s.capacity_rows, partition=s.partition,
                       location=s.location, share=float(shares.get(s.shard_id, 0.0)))
        for s in job.shards))
