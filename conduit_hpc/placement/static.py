"""The static planner: a capacity-constrained, bandwidth-aware placement at start-up.

Plain Python, numpy and scipy; no MPI. :func:`plan_static` decides how much of the replay
(of each learner's partition, with ``scope = "partitioned"``) lives in each location -
a learner's GPU, a learner node's host memory, a buffer rank - and returns an immutable
:class:`~conduit_hpc.placement.Placement` with its
:class:`~conduit_hpc.placement.PlanPrediction`.

**The problem** (an LP). Variables: the fraction of each partition's rows (per heat bin)
in each location. Link loads and memory use are linear in them
(:func:`~conduit_hpc.placement.model.evaluate`). Minimise ``T`` subject to
``load_k / bandwidth_k <= T`` for every link ``k`` (reads and ingest), every location's
bytes ``<=`` its capacity (less a rounding margin), and each partition placed whole.
A second LP keeps ``T`` within 1e-6 of its optimum and minimises the sum of link busy
times, which breaks ties towards the faster tiers. Solved with HiGHS (``scipy.optimize.
linprog``); capacities are then rounded to whole rows per shard (largest remainder) inside
the margin, so that no tier is ever over its budget (where the solver's tolerance puts a
location over it anyway, the LP is solved again with 1e-6 of each budget kept free).

**Symmetry** (why the 1,024-learner plan is small). Nodes with equal hardware, equal role
counts and no explicit links are interchangeable, and so are a node's learners; the LP is
convex and invariant under these permutations, so averaging an optimal solution over them
keeps it optimal. ``method="symmetric"`` therefore solves over placement *patterns* per
class of learners (own GPU, a peer GPU, own host, local buffers, and GPU / host / buffer
of a node of each class, by a balanced rotation): a handful of variables however many
nodes there are, optimal among all fractional placements where the rotation balances
exactly (counts divide evenly), else among the patterns. ``method="flat"`` solves over
every (partition, location) pair: exact for any cluster (small ones; tests, brute force).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from conduit_hpc.errors import ConfigError, PlacementInfeasible, RoundingOver
from conduit_hpc.placement.cluster import TIERS, ClusterModel, Roster
from conduit_hpc.placement.columns import (
    Column,
    available_locations,
    flat_columns,
    node_classes,
    partition_rows,
    symmetric_columns,
)
from conduit_hpc.placement.loads import Allocation, evaluate, ingest_matrix
from conduit_hpc.placement.model import predict
from conduit_hpc.placement.placement import Placement, ShardPlacement, ShardWeights, _fmt_bytes
from conduit_hpc.placement.topology import BUF, GPU, HOST, KIND_TIER, Topology
from conduit_hpc.placement.workload import SHARD_OVERHEAD_BYTES, Workload

__all__ = ["Column", "LpSolution", "allocation_to_placement", "plan_static", "solve_columns"]

Method = Literal["auto", "symmetric", "flat"]
#: flat LP when partitions x locations x heat bins is at most this (and method="auto")
FLAT_LIMIT = 256
LP_TOLERANCE = 1e-6  #: a budget's share kept free for the LP solver's tolerance


@dataclass(frozen=True, slots=True)
class LpSolution:
    """The optimum of :func:`solve_columns`.

    Attributes:
        x (np.ndarray): value of each column (per group summing to 1).
        objective_s (float): the busiest link's predicted seconds per superstep.
    """

    x: np.ndarray
    objective_s: float


# ---------------------------------------------------------------------------------
# the LP


def _column_alloc(col: Column, scope: str, prows: np.ndarray,
                  ingest: sp.csr_matrix) -> Allocation:
    return Allocation(scope, col.part, col.loc, col.rows, col.mass, prows, ingest)


def solve_columns(topo: Topology, workload: Workload, cols: Sequence[Column],
                  cap_bytes: np.ndarray) -> LpSolution:
    """Minimise the busiest link's time over combinations of ``cols`` (two-stage LP).

    Raises:
        PlacementInfeasible: no combination fits ``cap_bytes``.
    """
    prows = partition_rows(topo, workload)
    ingest = ingest_matrix(topo, workload)
    n = len(cols)
    if n == 0:
        raise PlacementInfeasible("no location can hold experience: every allowed tier "
                                  "has 0 bytes", tier="+".join(workload.tiers),
                                  shortfall_bytes=workload.capacity_rows
                                  * workload.bytes_per_row)
    bw = topo.links.bytes_per_s
    load = np.empty((len(bw), n))
    use = np.empty((topo.n_locations, n))
    for c, col in enumerate(cols):
        ev = evaluate(topo, workload, _column_alloc(col, workload.scope, prows, ingest),
                      overhead=False)
        load[:, c] = ev.total_bytes / bw
        use[:, c] = ev.usage_bytes
    groups = np.asarray([c.group for c in cols])
    ng = int(groups.max()) + 1
    a_eq = np.zeros((ng, n + 1))
    a_eq[groups, np.arange(n)] = 1.0
    b_eq = np.ones(ng)
    # link rows, scaled so that the largest coefficient is 1, then de-duplicated
    lrows = load[np.any(load > 0, axis=1)]
    scale = float(lrows.max()) if lrows.size else 1.0
    lrows = _dedupe(lrows / scale)
    urow_mask = np.any(use > 0, axis=1)
    with np.errstate(divide="ignore"):
        urows = use[urow_mask] / cap_bytes[urow_mask, None]
    urows = _dedupe(urows)
    a_ub = np.vstack([np.hstack([lrows, -np.ones((len(lrows), 1))]),
                      np.hstack([urows, np.zeros((len(urows), 1))])])
    b_ub = np.concatenate([np.zeros(len(lrows)), np.ones(len(urows))])
    c1 = np.zeros(n + 1)
    c1[-1] = 1.0
    bounds = [(0.0, None)] * n + [(0.0, None)]
    r1 = linprog(c1, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds,
                 method="highs")
    if r1.status == 2:
        raise PlacementInfeasible("the placement LP is infeasible: no split of the replay "
                                  "fits every location's capacity",
                                  tier="+".join(workload.tiers), shortfall_bytes=0)
    if r1.status != 0:  # pragma: no cover - numerical trouble in HiGHS
        raise PlacementInfeasible(f"the placement LP failed: {r1.message}",
                                  tier="+".join(workload.tiers), shortfall_bytes=0)
    t_star = float(r1.x[-1])
    # stage 2: keep the optimum, prefer fewer link-seconds overall (faster tiers)
    c2 = np.concatenate([load.sum(axis=0) / scale, [0.0]])
    bounds2 = [(0.0, None)] * n + [(0.0, t_star * (1 + 1e-6) + 1e-9)]
    r2 = linprog(c2, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds2,
                 method="highs")
    x = (r2.x if r2.status == 0 else r1.x)[:n]
    x = np.clip(x, 0.0, None)
    x[x < 1e-12] = 0.0
    sums = np.bincount(groups, weights=x, minlength=ng)
    x = x / sums[groups]
    return LpSolution(x=x, objective_s=float((load @ x).max(initial=0.0)))


def _dedupe(rows: np.ndarray) -> np.ndarray:
    if len(rows) <= 1:
        return rows
    rounded = np.round(rows, 12)
    _, idx = np.unique(rounded, axis=0, return_index=True)
    return rows[np.sort(idx)]


# ---------------------------------------------------------------------------------
# from the LP to shards


def combine(cols: Sequence[Column], x: np.ndarray, nloc: int) -> tuple[np.ndarray, ...]:
    """Sum the chosen columns into (part, loc, rows, mass) entries, sorted."""
    parts, locs, rows, mass = [], [], [], []
    for col, v in zip(cols, x, strict=True):
        if v > 0:
            parts.append(col.part)
            locs.append(col.loc)
            rows.append(col.rows * v)
            mass.append(col.mass * v)
    part = np.concatenate(parts)
    loc = np.concatenate(locs)
    key = part * nloc + loc
    uk, inv = np.unique(key, return_inverse=True)
    r = np.bincount(inv, weights=np.concatenate(rows))
    mm = np.bincount(inv, weights=np.concatenate(mass))
    return uk // nloc, uk % nloc, r, mm


def _raise_to_floor(small: np.ndarray, kept: np.ndarray, rows: np.ndarray, mass: np.ndarray,
                    loc: np.ndarray, used: np.ndarray, cap: np.ndarray, floor: float,
                    bytes_per_row: int) -> bool:
    """When the kept entries' locations cannot take the ``small`` entries' rows (the LP
    filled them to the brim), grow the small entries to ``floor`` instead, taking the rows
    (and their share of priority mass) from the largest kept entry; in place. Whether it
    did (False: dropping them fits, or growing them does not)."""
    room = np.maximum(cap[loc[kept]] - used[loc[kept]], 0.0) / bytes_per_row
    if room.sum() >= rows[small].sum():
        return False
    need = floor - rows[small]
    big = kept[int(np.argmax(rows[kept]))]
    if rows[big] - need.sum() < floor or np.any(
            cap[loc[small]] - used[loc[small]] < need * bytes_per_row - 0.5):
        return False
    per_row = mass[big] / rows[big] if rows[big] > 0 else 0.0
    np.add.at(used, loc[small], need * bytes_per_row)
    used[loc[big]] -= need.sum() * bytes_per_row
    rows[small] += need
    mass[small] += need * per_row
    rows[big] -= need.sum()
    mass[big] -= need.sum() * per_row
    return True


def apply_floor(part: np.ndarray, loc: np.ndarray, rows: np.ndarray, mass: np.ndarray,
                prows: np.ndarray, floor_rows: int, topo: Topology, cap: np.ndarray,
                bytes_per_row: int) -> tuple[np.ndarray, ...]:
    """No shard under ``floor_rows`` (at most the partition's rows): per partition, the
    smallest entries are dropped until every remaining one, scaled up to hold the
    partition's rows (and priority mass), has at least the floor. Local.

    Raises:
        PlacementInfeasible: a location cannot hold what the floor moves into it.
    """
    if floor_rows <= 1:
        return part, loc, rows, mass
    keep = np.ones(len(rows), dtype=bool)
    rows, mass = rows.astype(np.float64).copy(), mass.astype(np.float64).copy()
    used = np.bincount(loc, weights=rows * bytes_per_row, minlength=len(cap))
    used0 = used.copy()  # what the LP put there (within its own tolerance of cap)
    for p in np.unique(part):
        sel = np.flatnonzero(part == p)
        total, mtotal = float(rows[sel].sum()), float(mass[sel].sum())
        floor = min(float(floor_rows), float(prows[p]))
        order = sel[np.lexsort((sel, rows[sel]))]  # ascending rows, ties by entry
        suffix = np.cumsum(rows[order][::-1])[::-1]
        # the first i whose entry, scaled to hold the partition, reaches the floor
        ok = rows[order] * total >= (floor - 1e-9) * np.maximum(suffix, 1e-300)
        first = int(np.argmax(ok)) if ok.any() else len(order) - 1
        dropped, kept = order[:first], order[first:]
        if not len(dropped):
            continue
        if _raise_to_floor(dropped, kept, rows, mass, loc, used, cap, floor, bytes_per_row):
            continue  # the kept entries had no room: the small ones grew instead
        keep[dropped] = False
        np.subtract.at(used, loc[dropped], rows[dropped] * bytes_per_row)
        # first lift every kept entry to the floor, then hand the rest of the dropped
        # rows to the kept entries by their location's free bytes (so a location that
        # the LP filled to the brim is not pushed over it); scaled as a last resort
        free_rows = float(rows[dropped].sum())
        lift = np.maximum(floor - rows[kept], 0.0)
        lift *= min(1.0, free_rows / lift.sum()) if lift.sum() > 0 else 0.0
        rows[kept] += lift
        np.add.at(used, loc[kept], lift * bytes_per_row)
        rest = free_rows - float(lift.sum())
        room = np.maximum(cap[loc[kept]] - used[loc[kept]], 0.0) / bytes_per_row
        if rest > 0 and room.sum() >= rest:
            add = rest * room / room.sum()
        else:
            add = rows[kept] * (rest / rows[kept].sum()) if rest > 0 else rows[kept] * 0.0
        rows[kept] += add
        np.add.at(used, loc[kept], add * bytes_per_row)
        mkept = mass[kept].sum()
        mass[kept] = mass[kept] * (mtotal / mkept) if mkept > 0 else mtotal / len(kept)
    part, loc, rows, mass = part[keep], loc[keep], rows[keep], mass[keep]
    used = np.bincount(loc, weights=rows * bytes_per_row, minlength=len(cap))
    # only what the floor moved in counts against a location: the LP's solution may sit
    # a solver tolerance above a brim-full location's capacity
    over = np.flatnonzero((used > cap + 0.5) & (used > used0 + 0.5))
    if len(over):
        o = int(over[0])
        raise PlacementInfeasible(
            f"min_shard_rows = {floor_rows}: gathering the replay into shards of at least "
            f"that many rows puts {used[o]:,.0f} bytes into {topo.o_name[o]}, which "
            f"holds {cap[o]:,.0f}; lower min_shard_rows", tier=topo.o_tier[o],
            shortfall_bytes=int(
                used[o] - cap[o]))
    return part, loc, rows, mass


def round_rows(part: np.ndarray, rows: np.ndarray, prows: np.ndarray) -> np.ndarray:
    """Whole rows per entry, each partition summing exactly to its rows; each entry
    moves by less than one row (largest remainder, ties by entry order)."""
    out = np.floor(rows + 1e-9).astype(np.int64)
    out = np.minimum(out, np.ceil(rows - 1e-9).astype(np.int64))
    short = prows.astype(np.int64) - np.bincount(part, weights=out,
                                                 minlength=len(prows)).astype(np.int64)
    frac = rows - out
    order = np.lexsort((np.arange(len(rows)), -frac, part))
    taken = np.zeros(len(prows), np.int64)
    for e in order:
        p = part[e]
        if taken[p] < short[p]:
            out[e] += 1
            taken[p] += 1
    return out


def allocation_to_placement(topo: Topology, workload: Workload, part: np.ndarray,
                            loc: np.ndarray, rows: np.ndarray, mass: np.ndarray, *,
                            method: str, t0: float) -> Placement:
    """Build the :class:`Placement` (shards, actor weights, learner shards, prediction)
    from whole-row entries."""
    keep = rows > 0
    part, loc, rows, mass = part[keep], loc[keep], rows[keep], mass[keep]
    prows = partition_rows(topo, workload)
    msum = np.bincount(part, weights=mass, minlength=len(prows))
    mass = np.where(msum[part] > 0, mass / np.where(msum[part] > 0, msum[part], 1), 0.0)
    tier_order = np.asarray([{GPU: 0, HOST: 1, BUF: 2}[k] for k in topo.o_kind[loc]])
    order = np.lexsort((loc, tier_order, part))
    part, loc, rows, mass = part[order], loc[order], rows[order], mass[order]
    partitioned = workload.scope == "partitioned"
    shards = []
    for sid in range(len(part)):
        o, p = int(loc[sid]), int(part[sid])
        owner = int(topo.o_rank[o])
        if partitioned and topo.o_kind[o] == HOST and topo.o_node[o] == topo.l_node[p]:
            owner = int(topo.l_rank[p])
        shards.append(ShardPlacement(
            shard_id=sid, owner_rank=owner, tier=KIND_TIER[int(topo.o_kind[o])],
            capacity_rows=int(rows[sid]),
            partition=int(topo.l_rank[p]) if partitioned else -1,
            location=topo.o_name[o], share=float(mass[sid])))
    # which shards each partition has, and each one's share of the partition's rows
    by_part: dict[int, list[int]] = {}
    for sid in range(len(part)):
        by_part.setdefault(int(part[sid]), []).append(sid)
    ingest = ingest_matrix(topo, workload).tocsr()
    actor_weights: dict[int, ShardWeights] = {}
    actor_shards: dict[int, int] = {}
    cache: dict[tuple[int, ...], ShardWeights] = {}
    for i in range(topo.nodes):
        actors = topo.roster.actors[i]
        if not actors:
            continue
        row = ingest.getrow(i)
        feeds = tuple(int(c) for c in row.indices)
        if not feeds:
            continue
        sw = cache.get(feeds)
        if sw is None:
            weights: dict[int, float] = {}
            for p, rate in zip(row.indices, row.data, strict=True):
                for sid in by_part.get(int(p), []):
                    weights[sid] = weights.get(sid, 0.0) + float(rate) * rows[sid] / prows[p]
            sw = cache[feeds] = ShardWeights.of(weights)
        for q, a in enumerate(actors):
            actor_weights[a] = sw
            actor_shards[a] = sw.pick(q + i)
    if partitioned:
        learner_shards = {int(topo.l_rank[p]): tuple(by_part.get(p, ()))
                          for p in range(topo.n_learners)}
    else:
        every = tuple(range(len(shards)))
        learner_shards = {int(r): every for r in topo.l_rank}
    alloc = Allocation(workload.scope, part, loc, rows.astype(np.float64), mass, prows,
                       ingest)
    ev = evaluate(topo, workload, alloc)
    over = ev.usage_bytes > topo.o_cap + 0.5
    if over.any():  # the LP solver's tolerance (plan_static solves again)
        o = int(np.flatnonzero(over)[0])
        raise RoundingOver(
            f"internal: rounding put {ev.usage_bytes[o]:.0f} bytes into {topo.o_name[o]} "
            f"whose capacity is {topo.o_cap[o]:.0f}", tier=topo.o_tier[o],
            shortfall_bytes=int(ev.usage_bytes[o] - topo.o_cap[o]))
    pred = predict(topo, workload, alloc, method=method,
                   planning_s=time.perf_counter() - t0, ev=ev)
    return Placement(shards=tuple(shards), actor_shards=actor_shards,
                     learner_shards=learner_shards, actor_weights=actor_weights,
                     prediction=pred)


# ---------------------------------------------------------------------------------
# infeasibility


def _check_total(topo: Topology, workload: Workload, cap: np.ndarray) -> None:
    need = workload.capacity_rows * workload.bytes_per_row
    have = float(cap.sum())
    if need <= have:
        return
    parts = []
    for tier in workload.tiers:
        sel = np.asarray([t == tier for t in topo.o_tier], dtype=bool)
        n = int(sel.sum())
        raw = float(topo.o_cap[sel].sum())
        each = float(topo.o_cap[sel].max()) if n else 0.0
        parts.append(f"{tier}: {n} x {_fmt_bytes(each)} = {_fmt_bytes(raw)}")
    tiers = " + ".join(workload.tiers)
    short = math.ceil(need - have)
    max_rows = int(have // workload.bytes_per_row)
    word = "tier" if len(workload.tiers) == 1 else "tiers"
    raise PlacementInfeasible(
        f"{word} {tiers} cannot hold the replay: {workload.capacity_rows:,} rows x "
        f"{workload.bytes_per_row} bytes/row = {_fmt_bytes(need)} needed, "
        f"{_fmt_bytes(have)} usable ({'; '.join(parts)}, less per-shard overhead); short "
        f"by {short:,} bytes ({_fmt_bytes(short)}). Raise the tier capacities in the "
        f"cluster file, allow more tiers, or lower capacity_rows to at most {max_rows:,}",
        tier=tiers, shortfall_bytes=short)



def plan_static(cluster: ClusterModel, workload: Workload, *, roster: Roster | None = None,
                method: Method = "auto") -> Placement:
    """Plan where every shard lives. Local, deterministic (same input, same plan); no MPI.

    Args:
        cluster (ClusterModel): the cluster model.
        workload (Workload): what the experience path carries.
        roster (Roster | None): world ranks per node (default: :meth:`Roster.block`).
        method (str): ``symmetric`` (pattern LP over classes of interchangeable
            learners), ``flat`` (every partition-location pair; exact, for small
            clusters) or ``auto`` (flat when small, else symmetric).

    Returns:
        Placement: shards (owner rank, tier, capacity), actor weights, learner shards and
        the :class:`~conduit_hpc.placement.PlanPrediction`.

    Raises:
        PlacementInfeasible: the allowed tiers cannot hold the replay (names the tiers
            and the shortfall in bytes).
        ConfigError: partitioned sampling without learners, or fewer rows than learners.
    """
    t0 = time.perf_counter()
    if method not in ("auto", "symmetric", "flat"):
        raise ConfigError(f"method must be 'auto', 'symmetric' or 'flat', got {method!r}",
                          key="method")
    topo = Topology(cluster, roster, workload.tiers)
    prows = partition_rows(topo, workload)
    if method == "auto":
        # one class of interchangeable nodes: the patterns balance exactly, so the
        # symmetric LP is optimal and small; several classes: exact flat LP when small
        size = len(prows) * topo.n_locations * len(workload.bins()[0])
        several = len(node_classes(topo)) > 1
        method = "flat" if several and size <= FLAT_LIMIT else "symmetric"
    avail = available_locations(topo)
    make = symmetric_columns if method == "symmetric" else flat_columns
    cols = make(topo, workload, avail)
    # rounding margin: one row and one shard header for every partition that may land
    margin = np.zeros(topo.n_locations)
    if cols:
        pairs = np.unique(np.concatenate([c.part * topo.n_locations + c.loc for c in cols]))
        per_loc = np.bincount(pairs % topo.n_locations, minlength=topo.n_locations)
        margin = (per_loc * (workload.bytes_per_row + SHARD_OVERHEAD_BYTES)).astype(np.float64)
    cap = np.where(avail, np.maximum(topo.o_cap - margin, 0.0), 0.0)
    _check_total(topo, workload, cap)
    if (avail & (cap <= 0)).any():  # locations too small for their margin: drop them
        avail = avail & (cap > 0)
        cols = make(topo, workload, avail)
    label = (f"{method} LP (HiGHS): {len(cols)} variables"
             + (f", {len(node_classes(topo))} node classes" if method == "symmetric" else ""))
    for slack in (0.0, LP_TOLERANCE):  # (HiGHS went 4 kB over 64 GB: more than a row)
        c = np.maximum(cap - slack * topo.o_cap, 0.0)
        sol = solve_columns(topo, workload, cols, np.where(c > 0, c, 1.0))
        part, loc, rows, mass = combine(cols, sol.x, topo.n_locations)
        part, loc, rows, mass = apply_floor(part, loc, rows, mass, prows,
                                            workload.min_shard_rows, topo, c,
                                            workload.bytes_per_row)
        try:
            return allocation_to_placement(topo, workload, part, loc, round_rows(
                part, rows, prows), mass, method=label, t0=t0)
        except RoundingOver:
            if slack:
                raise
    raise AssertionError("unreachable")


def plan_tiers(cluster: ClusterModel, workload: Workload, tiers: Sequence[str],
               **kw: object) -> Placement:
    """:func:`plan_static` restricted to ``tiers`` (a convenience for comparisons)."""
    from dataclasses import replace

    bad = [t for t in tiers if t not in TIERS]
    if bad:
        raise ConfigError(f"tiers must be from {TIERS}, got {bad!r}", key="tiers")
    return plan_static(cluster, replace(workload, tiers=tuple(tiers)), **kw)  # type: ignore[arg-type]
