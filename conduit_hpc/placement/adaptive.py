"""Adaptive placement: re-place shards at superstep boundaries when the telemetry says
it pays. Plain Python; no MPI.

Every ``interval_supersteps`` the data plane hands :meth:`AdaptivePolicy.observe` what it
measured (:class:`Telemetry`: bandwidth per link kind, each shard's share of the samples,
ingest rate, compute time and - for prioritized replay - how concentrated the priority
mass is, :func:`heat_bins`). The policy

1. predicts the current plan under the measured numbers (its shards, the measured sample
   shares) with the cost model of :mod:`.model`;
2. re-solves the static LP with the measured numbers; with prioritized replay its heat
   bins put the hottest rows in each learner's fastest tier (the moves carry rows hottest
   first into the fastest new shard, :func:`plan_moves`);
3. moves only if the predicted gain per superstep in the learners' wait (exposed latency,
   or path time when ``use_path``) is at least ``min_gain`` of the current wait **and**
   pays back the predicted time of moving the rows within ``payback_supersteps`` - or,
   after a first move, within half the time that move's gain lasted (drift-aware: a hot
   set that drifts fast is not worth chasing) - on ``patience`` consecutive looks, and
   not within ``cooldown_supersteps`` of the last move.

The thresholds are the hysteresis: once moved, the new plan is the optimum of the numbers
that caused the move, so moving back needs the numbers to change by more than
``min_gain`` again; noise around a threshold cannot make it oscillate, because a move
needs ``patience`` agreeing looks and is followed by a cooldown.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from conduit_hpc.errors import ConfigError
from conduit_hpc.placement.cluster import ClusterModel, Roster
from conduit_hpc.placement.columns import partition_rows
from conduit_hpc.placement.loads import Allocation, ingest_matrix
from conduit_hpc.placement.model import predict
from conduit_hpc.placement.moves import Move, hot_counts, plan_moves
from conduit_hpc.placement.placement import Placement, PlanPrediction
from conduit_hpc.placement.static import plan_static
from conduit_hpc.placement.topology import BUF, GPU, Topology
from conduit_hpc.placement.workload import Workload

__all__ = [
    "HISTORY_KEEP",
    "AdaptiveKnobs",
    "AdaptivePolicy",
    "Decision",
    "Move",
    "Telemetry",
    "heat_bins",
    "hot_counts",
    "migration_seconds",
    "plan_moves",
    "predict_placement",
]

#: the looks whose decisions :attr:`AdaptivePolicy.history` keeps (the latest)
HISTORY_KEEP = 1000

def heat_bins(masses: np.ndarray, row_edges: Sequence[float] = (0.01, 0.05, 0.2, 1.0)
              ) -> tuple[tuple[float, float], ...]:
    """How concentrated priority mass is: (row share, mass share) bins of the hottest
    rows first, cut at the cumulative row shares ``row_edges`` (last must be 1).

    Args:
        masses (np.ndarray): sampling mass of each held row (``priority ** alpha``).

    Returns:
        tuple: bins usable as :attr:`Workload.heat` (empty when there is no mass).
    """
    m = np.sort(np.asarray(masses, np.float64).reshape(-1))[::-1]
    total = float(m.sum())
    if len(m) == 0 or total <= 0:
        return ()
    edges = [e for e in row_edges if 0 < e <= 1]
    if not edges or edges[-1] != 1.0:
        raise ConfigError(f"row_edges must end at 1.0, got {list(row_edges)!r}",
                          key="row_edges")
    cum = np.concatenate([[0.0], np.cumsum(m)])
    bins, prev_r, prev_k = [], 0.0, 0
    for e in edges:
        k = max(prev_k + 1, min(len(m), round(e * len(m))))
        if k <= prev_k:
            continue
        r = k / len(m)
        bins.append((r - prev_r, float(cum[k] - cum[prev_k]) / total))
        prev_r, prev_k = r, k
        if k == len(m):
            break
    return tuple(bins)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """What the data plane measured since the last look (plain numbers).

    Attributes:
        superstep (int): the superstep of this look.
        link_bandwidth_gbps (Mapping[str, float]): measured GB/s per link kind
            (``nic``, ``shm``, ``gpu_host``, ``nvlink``) or per ``node.kind``.
        shard_sample_share (Mapping[int, float]): shard id -> its share of its
            partition's samples (of all samples with global scope).
        actor_rows_per_s (float | None): measured ingest rate per actor.
        compute_s (float | None): measured learner compute per superstep.
        heat (tuple[tuple[float, float], ...] | None): prioritized replay: the priority
            mass concentration (:func:`heat_bins`).
    """

    superstep: int
    link_bandwidth_gbps: Mapping[str, float] = field(default_factory=dict)
    shard_sample_share: Mapping[int, float] = field(default_factory=dict)
    actor_rows_per_s: float | None = None
    compute_s: float | None = None
    heat: tuple[tuple[float, float], ...] | None = None


@dataclass(frozen=True, slots=True)
class AdaptiveKnobs:
    """Hysteresis of the policy (``[placement]`` has the same names).

    Attributes:
        min_gain (float): least relative gain in the learners' wait to move.
        payback_supersteps (int): the move's time must be repaid within this many
            supersteps of predicted gain.
        patience (int): consecutive looks that must call for a move.
        cooldown_supersteps (int): no move within this many supersteps of the last.
        use_path (bool): judge by path time instead of exposed latency (for when the
            path is hidden but a faster one would free resources).
    """

    min_gain: float = 0.1
    payback_supersteps: int = 1000
    patience: int = 3
    cooldown_supersteps: int = 500
    use_path: bool = False

    @classmethod
    def from_config(cls, cfg: object) -> AdaptiveKnobs:
        """From a :class:`~conduit_hpc.config.PlacementConfig`."""
        return cls(min_gain=cfg.min_gain, payback_supersteps=cfg.payback_supersteps,  # type: ignore[attr-defined]
                   patience=cfg.patience, cooldown_supersteps=cfg.cooldown_supersteps)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Decision:
    """What the policy decided at one look.

    Attributes:
        action (str): ``hold`` or ``move``.
        reason (str): why, in words.
        current_s (float): the current plan's predicted wait per superstep.
        proposed_s (float): the best plan's predicted wait per superstep.
        move_s (float): predicted seconds to move the rows.
        placement (Placement | None): the new plan (``move`` only).
        moves (tuple[Move, ...]): the rows to carry (``move`` only).
    """

    action: Literal["hold", "move"]
    reason: str
    current_s: float
    proposed_s: float
    move_s: float = 0.0
    placement: Placement | None = None
    moves: tuple[Move, ...] = ()

    @property
    def gain_s(self) -> float:
        return self.current_s - self.proposed_s


# ---------------------------------------------------------------------------------
# evaluating a given placement, and what moving to another costs


def _locations(topo: Topology, placement: Placement) -> np.ndarray:
    index = {n: i for i, n in enumerate(topo.o_name)}
    buf_of_rank = {int(topo.o_rank[i]): i for i in np.flatnonzero(topo.o_kind == BUF)}
    out = np.empty(len(placement.shards), np.int64)
    for s in placement.shards:
        if s.location in index:
            out[s.shard_id] = index[s.location]
        elif s.tier == "buffer_host" and s.owner_rank in buf_of_rank:
            out[s.shard_id] = buf_of_rank[s.owner_rank]
        else:
            raise ConfigError(f"shard {s.shard_id} at {s.location or '?'} (owner rank "
                              f"{s.owner_rank}, {s.tier}) is not a location of cluster "
                              f"{topo.cluster.name!r}", key="placement")
    return out


def placement_allocation(topo: Topology, workload: Workload, placement: Placement,
                         shares: Mapping[int, float] | None = None) -> Allocation:
    """The cost model's view of an existing placement; sample shares from ``shares``
    (measured) or the plan's own."""
    loc = _locations(topo, placement)
    learner_of = {int(r): i for i, r in enumerate(topo.l_rank)}
    part = np.asarray([learner_of[s.partition] if s.partition >= 0 else 0
                       for s in placement.shards], np.int64)
    if workload.scope == "partitioned" and any(s.partition < 0 for s in placement.shards):
        raise ConfigError("the placement has shards every learner reads; evaluate it with "
                          "scope = 'global'", key="scope")
    rows = np.asarray([s.capacity_rows for s in placement.shards], np.float64)
    share = np.asarray([(shares or {}).get(s.shard_id, s.share if s.share > 0 else math.nan)
                        for s in placement.shards], np.float64)
    nparts = max(int(part.max(initial=0)) + 1, 1)
    prow = np.bincount(part, weights=rows, minlength=nparts)
    share = np.where(np.isnan(share), rows / prow[part], share)
    tot = np.bincount(part, weights=share, minlength=nparts)
    mass = np.where(tot[part] > 0, share / np.where(tot[part] > 0, tot[part], 1.0), 0.0)
    prows = partition_rows(topo, workload)
    if len(prows) != nparts and workload.scope == "partitioned":
        prows = prow
    return Allocation(workload.scope, part, loc, rows, mass,
                      prow if workload.scope == "global" else prows,
                      ingest_matrix(topo, workload))


def predict_placement(cluster: ClusterModel, workload: Workload, placement: Placement, *,
                      roster: Roster | None = None,
                      shares: Mapping[int, float] | None = None) -> PlanPrediction:
    """Predict an existing placement (any planner's) under ``cluster`` and ``workload``."""
    topo = Topology(cluster, roster, ("learner_gpu", "learner_host", "buffer_host"))
    return predict(topo, workload, placement_allocation(topo, workload, placement, shares),
                   method="evaluated")


def migration_seconds(cluster: ClusterModel, old: Placement, new: Placement,
                      moves: Sequence[Move], row_bytes: int, *,
                      roster: Roster | None = None) -> float:
    """Predicted wall time of carrying ``moves``: each row is read at its old location and
    written at its new one; concurrent copies share links (busiest link's time plus the
    longest route's latency)."""
    topo = Topology(cluster, roster, ("learner_gpu", "learner_host", "buffer_host"))
    lt = topo.links
    src_loc, dst_loc = _locations(topo, old), _locations(topo, new)
    load = np.zeros(len(lt))
    lat = 0.0
    for mv in moves:
        a, b = int(src_loc[mv.src_shard]), int(dst_loc[mv.dst_shard])
        nbytes = mv.rows * row_bytes
        links: list[int] = []
        for loc, out in ((a, True), (b, False)):
            if topo.o_kind[loc] == GPU:
                links.append(int((lt.d2h if out else lt.h2d)[topo.o_gpu[loc]]))
            else:
                links.append(int(lt.shm[topo.o_node[loc]]))
        if a != b and topo.o_node[a] != topo.o_node[b]:
            links.extend(int(k) for k in topo.network_links(
                np.asarray([topo.o_node[a]]), np.asarray([topo.o_node[b]]))[0])
        for k in set(links):
            if k >= 0:
                load[k] += nbytes
        lat = max(lat, sum(float(lt.latency_s[k]) for k in links if k >= 0))
    return float((load / lt.bytes_per_s).max(initial=0.0)) + lat


# ---------------------------------------------------------------------------------
# the policy


class AdaptivePolicy:
    """Decides, look by look, whether to re-place shards. Local; plain Python.

    The same inputs give the same decisions on every rank; in a job one rank runs it on
    telemetry all ranks agreed on and broadcasts the decision (see the module docstring
    of :mod:`conduit_hpc.placement.adaptive`).

    Args:
        cluster (ClusterModel): the configured or probed model.
        workload (Workload): the planned-for workload.
        placement (Placement): the plan the job runs now.
        knobs (AdaptiveKnobs): hysteresis.
        roster (Roster | None): world ranks per node.
    """

    def __init__(self, cluster: ClusterModel, workload: Workload, placement: Placement, *,
                 knobs: AdaptiveKnobs | None = None, roster: Roster | None = None) -> None:
        self.cluster = cluster
        self.workload = workload
        self.placement = placement
        self.knobs = knobs or AdaptiveKnobs()
        self.roster = roster
        self.last_move_superstep: int | None = None
        self.lifetime: int | None = None  # supersteps the last move stayed good enough
        self.streak = 0
        # the latest looks' decisions (every one was kept: a look every
        # interval_supersteps for the whole run, each move's with its placement)
        self.history: deque[Decision] = deque(maxlen=HISTORY_KEEP)
        self.moves_made = 0

    def _measured(self, t: Telemetry) -> tuple[ClusterModel, Workload]:
        cluster = (self.cluster.with_bandwidth(t.link_bandwidth_gbps)
                   if t.link_bandwidth_gbps else self.cluster)
        w = self.workload
        if t.actor_rows_per_s is not None:
            w = replace(w, actor_rows_per_s=float(t.actor_rows_per_s))
        if t.compute_s is not None:
            w = replace(w, compute_s=float(t.compute_s))
        if t.heat and w.sampling == "prioritized":
            w = replace(w, heat=tuple(tuple(b) for b in t.heat))
        return cluster, w

    def _cost(self, pred: PlanPrediction) -> float:
        return pred.max_path_s if self.knobs.use_path else pred.max_exposed_s

    def observe(self, t: Telemetry) -> Decision:
        """Look at one interval's telemetry and decide. Local; deterministic.

        After a ``move`` decision the policy takes the new plan as current (the caller
        carries the moves out at the boundary).
        """
        k = self.knobs
        cluster, w = self._measured(t)
        cur = predict_placement(cluster, w, self.placement, roster=self.roster,
                                shares=t.shard_sample_share or None)
        best = plan_static(cluster, w, roster=self.roster)
        assert best.prediction is not None
        cur_s, new_s = self._cost(cur), self._cost(best.prediction)
        gain = cur_s - new_s

        def hold(reason: str, move_s: float = 0.0, *, keep_streak: bool = False) -> Decision:
            if not keep_streak:
                self.streak = 0
            d = Decision("hold", reason, cur_s, new_s, move_s)
            self.history.append(d)
            return d

        if (self.last_move_superstep is not None
                and t.superstep - self.last_move_superstep < k.cooldown_supersteps):
            return hold(f"cooling down: last move at superstep {self.last_move_superstep}")
        if cur_s <= 0:
            return hold("the learners do not wait: the experience path is hidden")
        if gain < k.min_gain * cur_s:
            return hold(f"predicted gain {gain * 1e3:.4g} ms per superstep is below "
                        f"{k.min_gain:.0%} of the current {cur_s * 1e3:.4g} ms")
        # the gain of the last move faded after `lifetime` supersteps: expect this one's to
        # fade alike (linearly), so it must repay within half of that
        if self.last_move_superstep is not None and self.lifetime is None:
            self.lifetime = max(t.superstep - self.last_move_superstep, 1)
        horizon = k.payback_supersteps if self.lifetime is None else min(
            k.payback_supersteps, self.lifetime // 2)
        hot = w.sampling == "prioritized"
        moves = plan_moves(self.placement, best, hot_first=hot)
        move_s = migration_seconds(cluster, self.placement, best, moves, w.bytes_per_row,
                                   roster=self.roster)
        if gain * horizon < move_s:
            return hold(f"moving takes {move_s * 1e3:.4g} ms, more than "
                        f"{horizon} supersteps of gain ({gain * 1e3:.4g} ms each) repay",
                        move_s)
        self.streak += 1
        if self.streak < k.patience:
            return hold(f"gain {gain * 1e3:.4g} ms per superstep; waiting for patience "
                        f"({self.streak} of {k.patience} looks)", move_s, keep_streak=True)
        self.streak = 0
        self.last_move_superstep = t.superstep
        self.lifetime = None
        self.placement = best
        d = Decision("move", f"re-placing: {cur_s * 1e3:.4g} -> {new_s * 1e3:.4g} ms per "
                     f"superstep, moving takes {move_s * 1e3:.4g} ms", cur_s, new_s, move_s,
                     best, moves)
        self.history.append(d)
        self.moves_made += 1
        return d

    def tier_rows(self) -> dict[str, int]:
        return self.placement.tier_rows()
