"""Promotion and demotion to the learner's device tier (``plane/device_policy.py``;
the CPU device here, the same code as ``cuda:i``): ``[placement] device_rows`` = one
shard's capacity, a look every superstep, patience 1.

* the learner heats shard X (priority 50 for its rows, 0.1 for the others): X is
  promoted, once; then it heats shard Y instead: X is demoted and Y promoted;
* at the end (actors finished, a fence): the device mirrors Y's ring exactly once - ids
  distinct and equal to the ring's stamps, every row of the owner's index on the device
  with the same mass (late updates followed the rows through both moves);
* with writes stopped, draws across the two tiers match the mass shares (per tier and
  per row, chi-square);
* ``device_rows`` with a delivery rank is refused on every rank.

Layouts: 3 ranks (learner, buffer, actor: 4 shards), 4 ranks (two buffers: 8 shards),
one node, so every shard's ring is in the learner's shared memory.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ConfigError, ExperienceDataPlane, Role
from conduit_hpc.placement.placement import Placement, ShardWeights, plan_round_robin
from conduit_hpc.plane.control import C_ACTORS_DONE
from conduit_hpc.testing import checked_batch, make_config, row_consistent
from conduit_hpc.wait import wait_until
from tests.mpi.tier_checks import draw_problems, masses, mirror_problems

COMM = MPI.COMM_WORLD
LAYOUTS = {3: {"learners": 1, "buffers": 1}, 4: {"learners": 1, "buffers": 2}}
SHARD_ROWS = 128
PER_BUFFER = 4
#: rows per batch: a priority update for one shard then carries over 256 rows, past the
#: eager limit - it may reach the owner only while the learner is inside MPI, so a
#: promotion that did not wait for the owner to apply it would copy stale masses
BATCH = 512


def _config(**extra):
    if COMM.size not in LAYOUTS:
        pytest.skip(f"no layout for {COMM.size} ranks (runs at {sorted(LAYOUTS)})")
    layout = LAYOUTS[COMM.size]
    sched = {"mode": "sync", "batch_rows": BATCH, "min_fill_rows": 32, **extra.pop("sched", {})}
    return make_config(
        layout=layout,
        storage={"capacity_rows": SHARD_ROWS * PER_BUFFER * layout["buffers"],
                 "shards_per_buffer": PER_BUFFER, "priority_exponent": 0.7},
        placement={"planner": "round_robin", "device_rows": SHARD_ROWS,
                   "interval_supersteps": 1, "patience": 1},
        scheduler=sched, checkpoint={"on_stop": False}, **extra)


def _placement(cfg) -> Placement:
    """Round robin (world rank 0 learns, then the buffer ranks, then the actors), each
    actor spreading its rows evenly over every shard (so that every shard fills)."""
    nb = cfg.layout.buffers
    actors = tuple(range(1 + nb, COMM.size))
    rr = plan_round_robin(actor_ranks=actors, buffer_ranks=tuple(range(1, 1 + nb)),
                          learner_ranks=(0,), capacity_rows=cfg.storage.capacity_rows,
                          shards_per_buffer=PER_BUFFER)
    spread = ShardWeights.of({s.shard_id: 1.0 for s in rr.shards})
    return Placement(shards=rr.shards, actor_shards=rr.actor_shards,
                     learner_shards=rr.learner_shards,
                     actor_weights=dict.fromkeys(actors, spread))


def _verdict(ok: bool) -> bool:
    return bool(COMM.allreduce(int(ok), op=MPI.MIN))


def _heat(edp, hot: int, steps: int, until: set[int], problems: list[str]) -> int:
    """Batches with priority 50 for shard ``hot``'s rows, 0.1 for the others, until
    the device mirrors the shards ``until`` (at most ``steps``); returns the batches."""
    d = edp.learner.mode.d
    for n in range(steps):
        if _on_thread(edp, lambda: set(d.device_shards)) == until:
            return n
        b = edp.next_batch()
        cols = {k: v.cpu().numpy() for k, v in b.data.items()}
        if not row_consistent(cols).all():
            problems.append("torn or wrong rows")
        sid = np.asarray(b.indices)[:, 0]
        edp.update_priorities(b.indices, np.where(sid == hot, 50.0, 0.1))
    return steps


def _on_thread(edp, fn):
    """``fn()`` on the thread that uses the Deliverer (the data-plane thread in edp)."""
    return edp.learner.run_on_thread(fn, "a test's look at the device tier")


def _draws_match_masses(edp, d, batches: int) -> tuple[list[str], int]:
    """Draw ``batches`` batches without updates; each tier's and each row's share of
    the draws against its share of the mass (:func:`draw_problems`). Returns the
    problems and the draws of device rows."""
    counts: dict[tuple[int, int, int], int] = {}
    for _ in range(batches):
        b = edp.next_batch()
        for key in map(tuple, np.asarray(b.indices).tolist()):
            counts[key] = counts.get(key, 0) + 1
    mass = _on_thread(edp, lambda: masses(d))
    on_dev = _on_thread(edp, lambda: set(d.device_shards))
    return (draw_problems(counts, mass, on_dev),
            sum(c for k, c in counts.items() if k[0] in on_dev))


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["sync", "edp"])
def test_the_hottest_shard_moves_to_the_device_and_back_without_loss(mode):
    """``edp``: owner fetch, two batches prefetched - batches drawn from one tier complete
    after a move (device replies are matched to the store that drew them)."""
    extra = {"mode": mode, "fetch": "owner", "prefetch_depth": 2} if mode == "edp" else {}
    cfg = _config(sched=extra)
    problems: list[str] = []
    device_draws = None  # the learner's draws of device rows with writes stopped
    with ExperienceDataPlane(cfg, placement=_placement(cfg)) as edp:
        if edp.role is Role.ACTOR:
            w = 0
            while w < 3 * cfg.storage.capacity_rows and not edp.should_stop:
                edp.ingest(checked_batch(edp.world_rank, w, 8))
                w += 8
        elif edp.role is Role.LEARNER:
            d = edp.learner.mode.d
            pol = d.device_policy
            assert pol is not None and not d.device_shards

            def tier() -> set[int]:
                return _on_thread(edp, lambda: set(d.device_shards))

            def check(writing: bool) -> None:  # the owners committed and applied all sent
                problems.extend(_on_thread(edp, lambda: (d.fence(),
                                                         mirror_problems(d, writing=writing))[1]))

            shards = sorted(d.rings)
            assert list(pol.candidates) == shards  # one learner, one node: all of them
            x, y = shards[0], shards[-1]
            _heat(edp, x, 600, {x}, problems)
            assert tier() == {x}, pol.moves
            assert sum(m[1:] == ("promote", x) for m in list(pol.moves)) == 1, pol.moves
            check(True)  # the copy X's promotion made, and every update since, as the owner's
            before = len(pol.moves)
            _heat(edp, y, 1500, {y}, problems)
            assert tier() == {y}, pol.moves
            later = [m[1:] for m in list(pol.moves)[before:]]
            assert ("demote", x) in later and ("promote", y) in later, pol.moves
            check(True)
            # writes stop; varied priorities that keep Y the hottest, then the checks
            n = len(roles := edp.roles.writer_ranks)
            wait_until(lambda: edp.control.read(C_ACTORS_DONE) >= n, timeout_s=60,
                       what=f"the actors {roles} to finish")
            rng = np.random.default_rng(3)
            for _ in range(30):
                b = edp.next_batch()
                sid = np.asarray(b.indices)[:, 0]
                edp.update_priorities(b.indices, np.where(
                    sid == y, rng.uniform(20, 60, len(b)), rng.uniform(0.1, 4.0, len(b))))
            check(False)
            moves = len(pol.moves)
            bad, device_draws = _draws_match_masses(edp, d, 12800 // BATCH)
            problems += bad
            if len(pol.moves) != moves or tier() != {y}:
                problems.append(f"moved while the heat held still: {pol.moves}")
        else:
            edp.serve()
        edp.done()
        summary = edp.summary()
    # the learner's summary counts the moves and every mirror's rows, demoted ones' too
    c = summary["learners"].get(0) or summary["learners"].get("0")
    counted = (c["device_promotions"] >= 2 and c["device_demotions"] >= 1
               and c["device_rows_in"] >= c["device_rows_promoted"] > 0
               and device_draws is not None and c["device_rows_drawn"] >= device_draws > 0)
    if edp.role is Role.LEARNER and not counted:
        problems.append(f"learner summary {c}")
    assert _verdict(not problems), problems


@pytest.mark.mpi(min_size=3)
def test_device_rows_with_a_delivery_rank_is_refused_on_every_rank():
    with pytest.raises(ConfigError) as err:
        _config(sched={"delivery": "process"})
    assert _verdict(err.value.key == "scheduler.delivery"), str(err.value)
