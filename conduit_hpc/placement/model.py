"""The cost model of the experience path: which bytes cross which link per superstep.

Plain Python and numpy; no MPI. Shared by the static planner (which minimises it), the
adaptive policy (which re-evaluates it from telemetry) and ``bench/scale.py``.

**Model.** Time is cut into supersteps of ``1 / update_rate_hz`` seconds. Per superstep
every learner reads ``batch_rows`` rows, each from the shard it samples it from, and every
actor writes ``actor_rows_per_s / update_rate_hz`` rows. A read from a location crosses the
links of its route (see :class:`Topology`); a write crosses the route from the actor's
node into the location. Concurrent transfers share a link: a link that carries ``b`` bytes
per superstep is busy ``b / bandwidth`` seconds (fluid sharing; every stream on it ends when
the link has carried them all). A learner's reads from different locations run in
parallel; one read takes its busiest link's time plus a round trip of the route's
latencies; the learner's **experience-path time** is its slowest read. The planner's
objective is the busiest link's time (every superstep's bytes must cross every link within
the superstep, ingest included), which bounds every learner's path time from below.

Reads within the learner's own GPU cross no link. Gathers from host memory count once
on the node's ``shm`` link (reads and ingest writes); copies into a GPU cross its ``h2d``
link; reads of another node's memory cross that node's ``nic_out``, any explicit link
between the two nodes, and the reader node's ``nic_in``.

The pieces: :mod:`.workload` (what is carried), :mod:`.topology` (learners, locations,
routes), :mod:`.loads` (allocations and the bytes they put on each link); this module
predicts path times from them and re-exports their public names.
"""

from __future__ import annotations

import numpy as np

from conduit_hpc.placement.loads import Allocation, Evaluation, evaluate, ingest_matrix
from conduit_hpc.placement.placement import Bottleneck, LearnerPrediction, PlanPrediction
from conduit_hpc.placement.topology import BUF, GPU, HOST, KIND_TIER, Topology, take_ids
from conduit_hpc.placement.workload import (
    INDEX_BYTES_PER_ROW,
    SHARD_OVERHEAD_BYTES,
    STAMP_BYTES_PER_ROW,
    Workload,
    sampling_of,
)

__all__ = [
    "BUF",
    "GPU",
    "HOST",
    "INDEX_BYTES_PER_ROW",
    "KIND_TIER",
    "SHARD_OVERHEAD_BYTES",
    "STAMP_BYTES_PER_ROW",
    "Allocation",
    "Evaluation",
    "Topology",
    "Workload",
    "evaluate",
    "ingest_matrix",
    "predict",
    "sampling_of",
]


# ---------------------------------------------------------------------------------
# predictions


def _times(topo: Topology, ev: Evaluation) -> np.ndarray:
    return ev.total_bytes / topo.links.bytes_per_s


def _learner_paths_partitioned(topo: Topology, workload: Workload, alloc: Allocation,
                               t: np.ndarray) -> tuple[np.ndarray, list[dict[str, float]],
                                                       list[str]]:
    lt = topo.links
    nl = topo.n_learners
    bb = workload.batch_rows * workload.row_bytes
    path = np.zeros(nl)
    slow = np.full(nl, -1, np.int64)
    per: list[dict[str, float]] = [{} for _ in range(nl)]
    live = alloc.mass > 0
    if live.any():
        part, loc, mass = alloc.part[live], alloc.loc[live], alloc.mass[live]
        routes = topo.read_routes(loc, part)
        ok = routes >= 0
        tt = np.where(ok, t[np.maximum(routes, 0)], -1.0)
        lat = np.where(ok, lt.latency_s[np.maximum(routes, 0)], 0.0).sum(axis=1)
        busiest = tt.max(axis=1)
        te = np.maximum(busiest, 0.0) + 2.0 * lat
        which = np.where(busiest >= 0, routes[np.arange(len(routes)), tt.argmax(axis=1)], -1)
        order = np.lexsort((-te, part))  # per partition, slowest entry first
        first = np.ones(len(order), bool)
        first[1:] = part[order][1:] != part[order][:-1]
        top = order[first]
        path[part[top]] = te[top]
        slow[part[top]] = which[top]
        names = lt.names
        for e in range(len(part)):
            d = per[int(part[e])]
            for k in routes[e]:
                if k >= 0:
                    d[names[k]] = d.get(names[k], 0.0) + bb * float(mass[e])
    return path, per, [lt.names[k] if k >= 0 else "" for k in slow]


def _learner_paths_global(topo: Topology, workload: Workload, alloc: Allocation,
                          t: np.ndarray) -> tuple[np.ndarray, list[dict[str, float]],
                                                  list[str]]:
    lt = topo.links
    nl, nnodes = topo.n_learners, topo.nodes
    bb = workload.batch_rows * workload.row_bytes
    s = np.bincount(alloc.loc, weights=alloc.mass, minlength=topo.n_locations)
    kind, node = topo.o_kind, topo.o_node
    lat = lt.latency_s
    ln, lg = topo.l_node, topo.l_gpu
    has_gpu = lg >= 0

    def tl(ids: np.ndarray) -> np.ndarray:
        return np.where(ids >= 0, t[np.maximum(ids, 0)], 0.0)

    def ll(ids: np.ndarray) -> np.ndarray:
        return np.where(ids >= 0, lat[np.maximum(ids, 0)], 0.0)

    h2d = take_ids(lt.h2d, lg)
    nvl_in = take_ids(lt.nvl_in, lg)
    path = np.zeros(nl)
    slow = np.full(nl, -1, np.int64)

    def offer(cand: np.ndarray, link: np.ndarray) -> None:
        better = cand > path
        path[better] = cand[better]
        slow[better] = link[better]

    # local host / buffer sources
    src = ~(kind == GPU) & (s > 0)
    has_local = np.bincount(node[src], minlength=nnodes)[ln] > 0
    shm = lt.shm[ln]
    cand = np.maximum(tl(shm), tl(h2d)) + 2 * (ll(shm) + ll(h2d))
    offer(np.where(has_local, cand, 0.0), np.where(tl(shm) >= tl(h2d), shm, h2d))
    # peer GPUs on the node: the best live source other than the learner's own GPU
    glive = np.flatnonzero((kind == GPU) & (s > 0))
    if len(glive):
        gnode, gg = node[glive], topo.o_gpu[glive]
        out_link = np.where(lt.has_nvlink[gnode], take_ids(lt.nvl_out, gg), take_ids(lt.d2h, gg))
        t_out = tl(out_link)
        order = np.lexsort((gg, -t_out, gnode))
        first = np.ones(len(order), bool)
        first[1:] = gnode[order][1:] != gnode[order][:-1]
        b1 = np.full(nnodes, -1, np.int64)
        b1[gnode[order[first]]] = order[first]
        second = np.zeros(len(order), bool)
        second[1:] = first[:-1] & ~first[1:]
        b2 = np.full(nnodes, -1, np.int64)
        b2[gnode[order[second]]] = order[second]
        cand1, cand2 = b1[ln], b2[ln]
        own_first = (cand1 >= 0) & (gg[np.maximum(cand1, 0)] == lg)
        pick = np.where(own_first, cand2, cand1)
        ok = (pick >= 0) & has_gpu
        if ok.any():
            li = np.flatnonzero(ok)
            pk = pick[li]
            nv = lt.has_nvlink[ln[li]]
            sink = np.where(nv, nvl_in[li], h2d[li])
            mid = np.where(nv, -1, lt.shm[ln[li]])
            src = out_link[pk]
            times = np.stack([t_out[pk], tl(sink), tl(mid)], axis=1)
            links = np.stack([src, sink, mid], axis=1)
            cand = times.max(axis=1) + 2 * (ll(src) + ll(sink) + ll(mid))
            better = cand > path[li]
            upd = li[better]
            path[upd] = cand[better]
            slow[upd] = links[better][np.arange(len(upd)), times[better].argmax(axis=1)]
    # remote nodes
    if nnodes > 1:
        src_link = np.where(kind == GPU, take_ids(lt.d2h, topo.o_gpu), lt.shm[node])
        live = s > 0
        a_term = np.full(nnodes, -np.inf)
        b_term = np.zeros(nnodes)
        np.maximum.at(a_term, node[live], tl(src_link[live]) + 2 * ll(src_link[live]))
        np.maximum.at(b_term, node[live], 2 * ll(src_link[live]))
        served = np.isfinite(a_term)
        # per node, the source link with the most time (for naming the slowest link)
        src_t = np.full(nnodes, -1.0)
        src_l = np.full(nnodes, -1, np.int64)
        for o in np.flatnonzero(live):
            tt = float(tl(src_link[o:o + 1])[0])
            if tt > src_t[node[o]]:
                src_t[node[o]], src_l[node[o]] = tt, src_link[o]
        for a in np.flatnonzero(served):
            far = ln != a
            if not far.any():
                continue
            idx = np.flatnonzero(far)
            net = topo.network_links(np.full(len(idx), a), ln[idx])
            x = np.maximum(tl(net).max(axis=1), tl(h2d[idx]))
            y = 2 * (ll(net).sum(axis=1) + ll(h2d[idx]))
            cand = np.maximum(a_term[a], x + b_term[a]) + y
            better = cand > path[idx]
            upd = idx[better]
            path[upd] = cand[better]
            cands = np.hstack([np.full((len(upd), 1), src_l[a]), net[better],
                               h2d[upd][:, None]])
            ct = np.where(cands >= 0, tl(cands), -1.0)
            slow[upd] = cands[np.arange(len(upd)), ct.argmax(axis=1)]
    # bytes per link, per learner
    s_node = np.bincount(node, weights=s, minlength=nnodes)
    sgpu_node = np.bincount(node[kind == GPU], weights=s[kind == GPU], minlength=nnodes)
    shost_node = s_node - sgpu_node
    s_own = np.where(topo.l_gpu_loc >= 0, s[np.maximum(topo.l_gpu_loc, 0)], 0.0)
    total = float(s.sum())
    per: list[dict[str, float]] = []
    names = lt.names
    for lx in range(nl):
        ni = int(ln[lx])
        d: dict[str, float] = {}
        if shost_node[ni] > 0:
            d[names[lt.shm[ni]]] = bb * float(shost_node[ni])
        peer = float(sgpu_node[ni] - s_own[lx])
        nvl_here = bool(lt.has_nvlink[ni])
        if has_gpu[lx]:
            via_h2d = total - float(s_own[lx]) - (peer if nvl_here else 0.0)
            if via_h2d > 1e-15:
                d[names[h2d[lx]]] = bb * via_h2d
            if nvl_here and peer > 1e-15:
                d[names[nvl_in[lx]]] = bb * peer
        if peer > 1e-15:
            d["peers.nvlink.out" if nvl_here else "peers.d2h"] = bb * peer
        rem = total - float(s_node[ni])
        if rem > 1e-15 and lt.nic_in[ni] >= 0:
            d[names[lt.nic_in[ni]]] = bb * rem
            d["remote.nic.out"] = bb * rem
        per.append(d)
    return path, per, [names[k] if k >= 0 else "" for k in slow]


def predict(topo: Topology, workload: Workload, alloc: Allocation, *, method: str = "",
            planning_s: float = 0.0, ev: Evaluation | None = None) -> PlanPrediction:
    """The full prediction of an allocation: per learner, bottleneck, tier usage."""
    ev = ev or evaluate(topo, workload, alloc)
    t = _times(topo, ev)
    lt = topo.links
    if alloc.scope == "partitioned":
        path, per, slow = _learner_paths_partitioned(topo, workload, alloc, t)
    else:
        path, per, slow = _learner_paths_global(topo, workload, alloc, t)
    compute = workload.effective_compute_s
    bb = workload.batch_rows * workload.row_bytes
    names = [topo.cluster.nodes[int(n)].name for n in topo.l_node]
    learners = tuple(
        LearnerPrediction(rank=int(topo.l_rank[i]), node=names[i], path_s=float(path[i]),
                          exposed_s=float(max(0.0, path[i] - compute)), read_bytes=float(bb),
                          bytes_per_link=per[i], slowest_link=slow[i])
        for i in range(topo.n_learners))
    k = int(np.argmax(t)) if len(t) else 0
    step = workload.superstep_s
    bottleneck = Bottleneck(link=lt.names[k], kind=lt.kind_name(k), time_s=float(t[k]),
                            utilisation=float(t[k] / step), read_bytes=float(ev.read_bytes[k]),
                            ingest_bytes=float(ev.ingest_bytes[k]))
    tier_bytes: dict[str, tuple[int, int]] = {}
    for tier_kind, tier in KIND_TIER.items():
        sel = topo.o_kind == tier_kind
        tier_bytes[tier] = (int(ev.usage_bytes[sel].sum()), int(topo.o_cap[sel].sum()))
    busy = np.flatnonzero(t > 0)
    return PlanPrediction(superstep_s=step, compute_s=compute, objective_s=float(t.max(initial=0)),
                          learners=learners, bottleneck=bottleneck, tier_bytes=tier_bytes,
                          link_time_s={lt.names[i]: float(t[i]) for i in busy}, method=method,
                          planning_s=planning_s)
