"""The placement a job executes, decided at start-up from ``[placement]``.

Composition layer: the planners (:mod:`conduit_hpc.placement`) are plain Python; this
module runs them for a job's role split and makes every rank agree.

* ``planner = "round_robin"``: :func:`~conduit_hpc.placement.plan_round_robin` (shards
  on buffer ranks' host memory, capacity split evenly).
* ``planner = "static"``: :func:`~conduit_hpc.placement.plan_static` on a cluster model -
  the file ``[placement] cluster`` or, when it is empty, one the start-up probe measures
  (:func:`~conduit_hpc.plane.probe.probe_cluster`, collective) - for the job's workload
  (rows, batch and sampling from the config, tiers from ``[placement] tiers``, scope from
  ``[placement] scope``), then :func:`executable` maps it onto the ranks that serve it.

Every rank plans (the planner is deterministic), then the ranks compare a digest of the
plan (one ``Allgatherv``): a rank that failed, or planned differently, makes every rank
raise the same :class:`~conduit_hpc.errors.ConfigError`.

**Which tiers a running job serves.** ``buffer_host`` shards live in their buffer rank's
window. A ``learner_host`` shard lives in host memory of the learner's node: its owner
is a *buffer rank on that node* (the plan names the learner; :func:`executable` moves the
ownership to the node's buffer ranks, in turn), so the owner's progress loop, the RMA
window and the learner's shared-memory reads are exactly those of a buffer shard - only
its location differs. A ``learner_gpu`` shard is such a ring too, and its one learner
mirrors it slot for slot on its device (:mod:`~conduit_hpc.plane.device_tier`): its rows
are drawn, gathered and re-prioritised there. A plan whose ``learner_host`` or
``learner_gpu`` shard has no buffer rank on its node is refused, as is a ``learner_gpu``
shard read by several learners or with a delivery rank or the sequence sampler.
"""

from __future__ import annotations

import hashlib
import math
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.config import Config, SchedulerConfig
from conduit_hpc.errors import CollectiveFailed, ConfigError
from conduit_hpc.placement.placement import Placement, plan_round_robin
from conduit_hpc.plane.roles import RoleComms
from conduit_hpc.spec import Spec
from conduit_hpc.transport.objects import allgather_json, bounded_barrier

__all__ = ["EXECUTED_TIERS", "PlanRecord", "decide_placement", "executable", "plan_document",
           "write_plan"]

#: tiers whose shards a running job serves (see the module docstring)
EXECUTED_TIERS = ("buffer_host", "learner_host", "learner_gpu")


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """How the executed plan was made, for ``plan.json``.

    Attributes:
        planner (str): ``round_robin``, ``static`` or ``given``.
        cluster (str): the cluster model's name and where it came from ("" unless
            static).
        notes (list[str]): what was assumed (workload rates) or changed (owners).
        workload (dict): the workload planned for (static).
        nodes (list[dict]): the job's nodes as the ranks found them - ``node`` (index),
            ``host`` (the host name of its ranks) and ``ranks`` (world ranks) - whatever
            the planner (filled by :func:`decide_placement`).
        probe (dict): what the start-up probe measured (``LinkMeasurements.as_dict``:
            memcpy, RMA within a node and between two nodes, GB/s and s); empty when
            the model came from a file or there was none.
    """

    planner: str
    cluster: str = ""
    notes: list[str] = field(default_factory=list)
    workload: dict[str, Any] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)


def executable(plan: Placement, roles: RoleComms, scheduler: SchedulerConfig | None = None,
               *, shared_memory: str = "auto") -> tuple[Placement, list[str]]:
    """``plan`` on the ranks that serve it: each ``learner_host`` and ``learner_gpu``
    shard owned by a buffer rank on its learner's node (in turn when a node has several);
    a ``learner_gpu`` shard is mirrored on that learner's device
    (:mod:`~conduit_hpc.plane.device_tier`). Local; deterministic.

    Returns:
        tuple: the placement and notes on what changed.

    Raises:
        ConfigError: a ``learner_host``/``learner_gpu`` shard on a node with no buffer rank
            (``placement.tiers``); a ``learner_gpu`` shard read by several learners
            (``placement.scope``), with ``scheduler.delivery = "process"``, the sequence
            sampler (``scheduler.*``) or ``transport.shared_memory = "never"``.
    """
    shards, notes = [], []
    turn: dict[int, int] = {}
    for s in plan.shards:
        if s.tier == "learner_gpu":
            reader = _gpu_reader(plan, s.shard_id, s.capacity_rows, scheduler)
            if shared_memory == "never":
                raise ConfigError(
                    f"the static plan puts {s.capacity_rows} rows in learner_gpu shard "
                    f"{s.shard_id}; its learner mirrors the shard's ring from the node's "
                    f"shared memory, which transport.shared_memory = 'never' turns off: use "
                    f"'auto' or [placement] tiers without 'learner_gpu'",
                    key="transport.shared_memory")
        elif s.tier == "learner_host" and s.owner_rank not in roles.buffer_ranks:
            reader = s.owner_rank
        else:
            shards.append(s)
            continue
        node = roles.node_of[reader]
        bufs = [b for b in roles.buffer_ranks if roles.node_of[b] == node]
        if not bufs:
            raise ConfigError(
                f"the static plan puts shard {s.shard_id} ({s.capacity_rows} rows) in "
                f"{s.tier} memory of node {node} ({s.location or '?'}), which runs no "
                f"buffer rank to own it; give that node a buffer rank or set [placement] "
                f"tiers without {s.tier!r}", key="placement.tiers")
        k = turn.get(node, 0)
        turn[node] = k + 1
        owner = bufs[k % len(bufs)]
        if s.tier == "learner_gpu":
            notes.append(f"shard {s.shard_id} (learner_gpu, {s.location}): rows on learner "
                         f"{reader}'s device, its ring owned by buffer rank {owner} on the "
                         f"learner's node")
        else:
            notes.append(f"shard {s.shard_id} (learner_host, {s.location}): owned by buffer "
                         f"rank {owner} on the learner's node (planned: rank {s.owner_rank})")
        shards.append(replace(s, owner_rank=owner))
    out = Placement(shards=tuple(shards), actor_shards=dict(plan.actor_shards),
                    learner_shards=dict(plan.learner_shards),
                    actor_weights=plan.actor_weights, prediction=plan.prediction)
    return out, notes


def _gpu_reader(plan: Placement, sid: int, rows: int, scheduler: SchedulerConfig | None
                ) -> int:
    """The one learner that reads ``learner_gpu`` shard ``sid`` (checks the rest)."""
    readers = sorted(r for r, got in plan.learner_shards.items() if sid in got)
    what = f"the static plan puts {rows} rows in learner_gpu shard {sid}"
    if len(readers) != 1:
        raise ConfigError(
            f"{what}, which learners {readers} read; a learner_gpu shard is read by its "
            f"own learner only (rows on one device; exchanging them between learners' "
            f"devices is not built): set [placement] scope = 'partitioned' or tiers "
            f"without 'learner_gpu'", key="placement.scope")
    if scheduler is not None and scheduler.delivery != "thread":
        raise ConfigError(
            f"{what}; scheduler.delivery = {scheduler.delivery!r} gathers batches on a "
            f"delivery rank, which has no device: use delivery = 'thread' or [placement] "
            f"tiers without 'learner_gpu'", key="scheduler.delivery")
    if scheduler is not None and scheduler.sampler == "sequence":
        raise ConfigError(
            f"{what}; the sequence sampler cuts windows on the ring's owner, not on the "
            f"device: use sampler 'uniform'/'prioritized' or [placement] tiers without "
            f"'learner_gpu'", key="scheduler.sampler")
    return readers[0]


def _static(config: Config, spec: Spec, roles: RoleComms) -> tuple[Placement, PlanRecord]:
    """Plan on every rank; collective only when it probes."""
    from conduit_hpc.placement.cluster import ClusterModel, Roster
    from conduit_hpc.placement.static import plan_static
    from conduit_hpc.placement.workload import Workload

    pc = config.placement
    measured: dict[str, Any] = {}
    if pc.cluster:
        try:
            cluster = ClusterModel.from_toml(pc.cluster)
        except ConfigError as err:
            raise ConfigError(f"placement.cluster = {pc.cluster!r}: {err}",
                              key="placement.cluster") from err
        where = f"{cluster.name} ({pc.cluster})"
    else:
        from conduit_hpc.plane.probe import probe_cluster

        bounded_barrier(roles.world, config.run.timeout_s,  # the probe: plain collectives
                        "the data plane's constructor (the start-up probe)")
        cluster, _, m = probe_cluster(roles)
        measured = m.as_dict()
        link = (f", node to node {m.net_put_gbps:.3g}/{m.net_get_gbps:.3g} GB/s put/get"
                if len(cluster.nodes) > 1 else "")
        where = (f"{cluster.name} (measured by the start-up probe: "
                 f"{len(cluster.nodes)} node(s){link})")
    roster = Roster.from_ranks(cluster, roles.node_of, roles.learner_ranks,
                               roles.buffer_ranks, roles.actor_ranks)
    workload, notes = Workload.from_job(config)
    workload = replace(workload, row_bytes=spec.row_bytes,
                       stored_row_bytes=spec.stored_row_bytes, tiers=tuple(pc.tiers))
    plan = plan_static(cluster, workload, roster=roster)
    plan, moved = executable(plan, roles, config.scheduler,
                             shared_memory=config.transport.shared_memory)
    wl = {k: getattr(workload, k) for k in workload.__slots__}
    return plan, PlanRecord("static", where, [*notes, *moved], wl, probe=measured)


def decide_placement(config: Config, spec: Spec, roles: RoleComms,
                     given: Placement | None = None) -> tuple[Placement, PlanRecord]:
    """The placement this job executes, the same on every rank: ``given`` (passed to the
    data plane, or made by a feature that places shards itself, e.g. long-haul) or the
    ``[placement] planner``'s. **Collective** on ``roles.world`` (one ``Allgatherv``, and
    the probe when it measures), except with ``given``.

    Raises:
        ConfigError: the plan cannot be made or executed (the cluster file is missing or
            bad, the tiers cannot hold the replay, a tier the job cannot serve), or the
            ranks planned differently - on every rank together, with the first failing
            rank's message and key (``placement.cluster``, ``placement.tiers``, ...).
    """
    pc = config.placement
    if given is not None:
        if pc.planner == "static":
            raise ConfigError("[placement] planner = 'static' cannot apply: the placement "
                              "was given (by the caller or by a feature that places shards "
                              "itself, e.g. longhaul); use planner = 'round_robin'",
                              key="placement.planner")
        return _windows_fit(config, given), PlanRecord("given")
    plan: Placement | None = None
    record = PlanRecord(pc.planner)
    error = key = ""
    try:
        if pc.planner == "static":
            plan, record = _static(config, spec, roles)
        else:
            plan = plan_round_robin(
                actor_ranks=roles.writer_ranks, buffer_ranks=roles.buffer_ranks,
                learner_ranks=roles.learner_ranks,
                capacity_rows=config.storage.capacity_rows,
                shards_per_buffer=config.storage.shards_per_buffer)
    except CollectiveFailed:
        raise  # a rank did not reach the probe: the others cannot reach the gather either
    except Exception as err:  # any failure, even a bug, must reach every rank below
        key = getattr(err, "key", "") or "placement.planner"
        error = f"{type(err).__name__}: {err}"
    digest = "" if plan is None else hashlib.sha256(
        jsontext.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()
    # bounded: a rank stopped or stuck while it plans ends the others within timeout_s
    seen = allgather_json(roles.world, {"error": error, "key": key if error else "",
                                        "digest": digest, "host": socket.gethostname()},
                          config.run.timeout_s, "the data plane's constructor (the placement)")
    bad = [(r, s) for r, s in enumerate(seen) if s["error"]]
    if bad:
        r, first = bad[0]
        raise ConfigError(f"[placement] planner = {pc.planner!r}: no executable plan "
                          f"(world rank {r}: {first['error']})", key=first["key"])
    digests = {s["digest"] for s in seen}
    if len(digests) != 1:
        groups = {d: [r for r, s in enumerate(seen) if s["digest"] == d] for d in digests}
        raise ConfigError(f"[placement] planner = {pc.planner!r}: ranks planned different "
                          f"placements (ranks by plan: {sorted(groups.values())}); the "
                          f"cluster file or the planner's inputs differ between ranks",
                          key="placement.planner")
    assert plan is not None
    nodes: dict[int, dict[str, Any]] = {}
    for r, s in enumerate(seen):
        n = nodes.setdefault(roles.node_of[r], {"node": roles.node_of[r], "hosts": [],
                                                "ranks": []})
        n["ranks"].append(r)
        if s.get("host") not in n["hosts"]:
            n["hosts"].append(s.get("host"))
    found = [{"node": n["node"], "host": ",".join(n["hosts"]), "ranks": n["ranks"]}
             for _, n in sorted(nodes.items())]
    return _windows_fit(config, plan), replace(record, nodes=found)


def _windows_fit(config: Config, plan: Placement) -> Placement:
    """A sequence sampler's window must fit in every shard: a window never spans two
    shards, so the rows of a smaller shard would never be sampled (and with every shard
    smaller, the learner waited out its timeout on a priority mass of 0). And every
    learner's shards must hold the minimum fill (:func:`_fill_reachable`).
    Deterministic: every rank raises alike."""
    _fill_reachable(config, plan)
    sch = config.scheduler
    small = [s for s in plan.shards if s.capacity_rows < sch.window]
    if sch.sampler == "sequence" and small:
        s = min(small, key=lambda x: x.capacity_rows)
        raise ConfigError(
            f"scheduler.sequence_length = {sch.sequence_length} (a window of {sch.window} "
            f"rows with burn_in {sch.burn_in}) does not fit in shard {s.shard_id} of "
            f"{s.capacity_rows} rows ({len(small)} of {len(plan.shards)} shards are "
            f"smaller): a window never spans two shards, so their rows would never be "
            f"sampled; use a window of at most {s.capacity_rows} rows, or more "
            f"storage.capacity_rows per shard (fewer layout.buffers or "
            f"storage.shards_per_buffer)", key="scheduler.sequence_length")
    _windows_whole(config, plan)
    return plan


def _windows_whole(config: Config, plan: Placement) -> None:
    """While writers write a shard, its owner hides from sampling the rows they may
    overwrite next: up to the free cursor ``F <= commit + (C - C // 2)`` (the guard band
    and the rows in flight; :class:`~conduit_hpc.plane.shard.OwnedShard`), so only the
    ``C // 2`` newest committed rows of a shard of ``C`` rows are sure to stay drawable,
    and at a fast enough insert rate no more are. A longer window of consecutive rows was
    never whole while writers wrote, and the learner waited out ``run.timeout_s``. Shards
    that no writer writes (rows from a restored checkpoint) keep the bound of their
    capacity. Deterministic: every rank raises alike."""
    sch = config.scheduler
    written = _written_shards(config, plan)
    if sch.sampler != "sequence" or (written is None and not plan.actor_shards):
        return
    banded = [s for s in plan.shards if written is None or s.shard_id in written]
    short = [s for s in banded if s.capacity_rows // 2 < sch.window]
    if short:
        s = min(short, key=lambda x: x.capacity_rows)
        most = s.capacity_rows // 2
        fits = (f"sequence_length <= {most - sch.burn_in} with burn_in {sch.burn_in}"
                if most > sch.burn_in else f"burn_in {sch.burn_in} alone is too long: "
                f"burn_in + sequence_length <= {most}")
        raise ConfigError(
            f"scheduler.sequence_length = {sch.sequence_length} (a window of {sch.window} "
            f"rows with burn_in {sch.burn_in}) is never sure to be whole in shard "
            f"{s.shard_id} of {s.capacity_rows} rows while writers write it ({len(short)} "
            f"of {len(plan.shards)} shards): its owner hides the rows writers may overwrite "
            f"next (up to {s.capacity_rows - most} ahead of its commits), so only the "
            f"newest {most} rows stay drawable and a learner would wait out run.timeout_s; "
            f"use a window of at most {most} rows ({fits}), or more "
            f"storage.capacity_rows per shard (fewer layout.buffers or "
            f"storage.shards_per_buffer)", key="scheduler.sequence_length")


def _fill_reachable(config: Config, plan: Placement) -> None:
    """``scheduler.min_fill_rows`` counts the rows of the shards a learner reads: with
    ``placement.scope = "partitioned"`` that is its partition, less than
    ``storage.capacity_rows`` (the bound the config checks alone). A fill above every
    row a learner can read held it until its wait timed out, with nothing that said it
    never could be reached. Deterministic: every rank raises alike."""
    _partitions_written(config, plan)
    fill = config.scheduler.min_fill_rows
    rows = {s.shard_id: s.capacity_rows for s in plan.shards}
    written = _written_shards(config, plan)
    for rank, ids in sorted(plan.learner_shards.items()):
        can = sum(rows.get(i, 0) for i in ids)
        if written is not None and fill <= can:
            held = sum(rows.get(i, 0) for i in ids if i in written)
            if held < fill:
                raise ConfigError(
                    f"scheduler.min_fill_rows must be <= the rows the writers can fill, got "
                    f"{fill}: learner rank {rank} reads shards {sorted(ids)} of {can} rows, "
                    f"but no actor writes {len(set(ids) - written)} of them ("
                    f"{len(plan.shards)} shards for {len(plan.actor_shards)} writers), so "
                    f"at most {held} rows are ever held and it would wait for the fill "
                    f"until its timeout; use min_fill_rows <= {held}, fewer shards "
                    f"(storage.shards_per_buffer, layout.buffers) or more actors",
                    key="scheduler.min_fill_rows")
        if can < fill:
            least = min(sum(rows.get(i, 0) for i in got)
                        for got in plan.learner_shards.values())
            raise ConfigError(
                f"scheduler.min_fill_rows must be <= the rows every learner reads, got "
                f"{fill}: learner rank {rank} reads shards {sorted(ids)} of {can} rows in "
                f"all (placement.scope = {config.placement.scope!r}), so it would wait for "
                f"the fill until its timeout; use min_fill_rows <= {least}, or "
                f"placement.scope = 'global'", key="scheduler.min_fill_rows")
    # the ratio counts every partition's inserts, a learner's fill only its own: before
    # any partition fills, actors are held at min_fill + error_buffer / spi inserts, so
    # the fullest partition (the others as fast: the worst case) must fill by then
    sch = config.scheduler
    parts = len({tuple(sorted(ids)) for ids in plan.learner_shards.values()})
    if sch.samples_per_insert > 0 and parts > 1:
        need = sch.samples_per_insert * ((parts - 1) * fill + parts * sch.max_insert_batch)
        if sch.error_buffer < need:
            raise ConfigError(
                f"scheduler.error_buffer must be >= samples_per_insert * ((partitions - 1) "
                f"* min_fill_rows + partitions * max_insert_batch) = {need:g} with "
                f"{parts} learner partitions (placement.scope = "
                f"{config.placement.scope!r}), got {sch.error_buffer:g}: the ratio holds "
                f"actors back after min_fill_rows + error_buffer / samples_per_insert "
                f"inserts into all partitions together, before any learner's own "
                f"partition holds min_fill_rows, and every rank would wait",
                key="scheduler.error_buffer")


def _written_shards(config: Config, plan: Placement) -> set[int] | None:
    """The shards some writer (an actor, or a learner that ingests) writes; ``None``
    where rows may reach others too (live re-placement routes actors anew, a long link's
    buffer forwards rows into a shard of its own; without any writer, rows come only
    from a restored checkpoint)."""
    if config.placement.adaptive or config.longhaul.mode != "off" or not plan.actor_shards:
        return None
    return set(plan.actor_shards.values()) | {
        s for w in (plan.actor_weights or {}).values() for s in w.shards}


def _partitions_written(config: Config, plan: Placement) -> None:
    """With ``placement.scope = "partitioned"`` a node's actors feed only its own
    learners' partitions (actors of nodes without learners feed every partition): a
    learner whose node has no actor, with every actor on a node with learners, reads
    shards no actor writes, and waited for its first batch until its timeout.
    Deterministic: every rank raises alike."""
    if config.placement.scope != "partitioned" or not plan.actor_shards:
        return
    written = set(plan.actor_shards.values()) | {
        s for w in (plan.actor_weights or {}).values() for s in w.shards}
    for rank, ids in sorted(plan.learner_shards.items()):
        if not set(ids) & written:
            raise ConfigError(
                f"placement.scope = 'partitioned' leaves learner rank {rank} with shards "
                f"{sorted(ids)} that no actor writes (a node's actors feed only the "
                f"partitions of the learners on their node, and learner rank {rank}'s node "
                f"has none), so it would wait for its first batch until its timeout; put "
                f"actors on every node with learners, or use placement.scope = 'global'",
                key="placement.scope")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def plan_document(plan: Placement, record: PlanRecord) -> dict[str, Any]:
    """``plan.json``: the plan executed - shards (owner, tier, capacity), bytes per tier,
    the prediction per learner (path and exposed time, read bytes) when planned against a
    cluster model. JSON-compatible."""
    tiers: dict[str, dict[str, Any]] = {}
    for s in plan.shards:
        t = tiers.setdefault(s.tier, {"shards": 0, "rows": 0})
        t["shards"] += 1
        t["rows"] += s.capacity_rows
    doc: dict[str, Any] = {"planner": record.planner, "cluster": record.cluster,
                           "nodes": record.nodes, "probe": record.probe,
                           "notes": record.notes, "workload": record.workload,
                           "tiers": tiers, "placement": plan.to_dict(), "prediction": None}
    pred = plan.prediction
    if pred is not None:
        for tier, (used, cap) in pred.tier_bytes.items():
            tiers.setdefault(tier, {"shards": 0, "rows": 0}).update(
                bytes_used=int(used), bytes_available=int(cap))
        doc["prediction"] = {
            "method": pred.method, "superstep_s": pred.superstep_s,
            "compute_s": pred.compute_s, "objective_s": pred.objective_s,
            "bottleneck": pred.bottleneck.describe(),
            "learners": {str(lp.rank): {
                "node": lp.node, "path_s": _finite(lp.path_s),
                "exposed_s": _finite(lp.exposed_s), "read_bytes": lp.read_bytes,
                "slowest_link": lp.slowest_link} for lp in pred.learners}}
    return doc


def write_plan(run_dir: Path, plan: Placement, record: PlanRecord) -> Path:
    """Write ``run_dir/plan.json`` (:func:`plan_document`). Local; one rank calls it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "plan.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(jsontext.dumps(plan_document(plan, record), indent=1, sort_keys=True))
    tmp.replace(path)
    return path
