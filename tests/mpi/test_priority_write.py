"""Priority updates written where they live: learners (one or two, on one shard) write
into the shard's index in the node's shared memory while its owner commits and hides
rows in it, under the index lock; through RMA (no shared memory) they go to the owner.

Checked on every rank (verdicts all-reduced): every update row is applied or dropped
exactly once; a node-local learner's update is in the index when ``update_priorities``
returns in ``sync`` mode (staleness 0 with no round trip); with one learner every row
still held carries the priority last given to it; and the index the writers share is
whole - sum- and min-tree agree with their leaves, leaves with the raw priorities, and
the published statistics with the trees.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD
TRANSPORTS = {"shm": {"shared_memory": "auto"}, "rma": {"shared_memory": "never"}}
ALPHA = 0.7
STEPS, BATCH = 60, 32


def _index_problems(shard) -> list[str]:
    """Whether the shard's index is whole (see the module docstring)."""
    ix, out = shard.index, []
    p = ix.sum._p
    leaves = ix.sum._tree[p:p + ix.capacity]
    live = ix.gens > 0
    want = np.where(live & (ix.priority > 0), np.power(ix.priority, ALPHA), 0.0)
    if not np.allclose(leaves, want, rtol=1e-12, atol=0):
        k = int(np.flatnonzero(~np.isclose(leaves, want, rtol=1e-12, atol=0))[0])
        out.append(f"slot {k}: leaf {leaves[k]} but priority {ix.priority[k]} (gen "
                   f"{ix.gens[k]})")
    tree = ix.sum._tree
    inner = tree[1:p]
    kids = tree[2:2 * p:2] + tree[3:2 * p:2]
    if not np.allclose(inner, kids, rtol=1e-9, atol=1e-12):
        out.append("the sum-tree's inner nodes disagree with their children")
    mins = ix.min._tree
    mleaves = mins[p:p + ix.capacity]
    mwant = np.where(live & (want > 0), want, np.inf)
    if not np.array_equal(mleaves, mwant):
        out.append("the min-tree's leaves disagree with the masses")
    if not np.isclose(ix.min.min, mwant.min() if mwant.size else np.inf):
        out.append(f"min-tree root {ix.min.min} != smallest mass {mwant.min()}")
    held, total, _, _ = shard.ring.read_stats()
    if held != int(np.count_nonzero(live)) or not np.isclose(total, leaves.sum()):
        out.append(f"published stats (held {held}, total {total}) != the index "
                   f"({int(np.count_nonzero(live))}, {leaves.sum()})")
    if np.count_nonzero(ix.hidden_gens & ix.gens):
        out.append("a slot both drawable and hidden")
    return out


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_learners_and_owner_write_one_index(transport: str) -> None:
    learners = 2 if COMM.Get_size() >= 5 else 1
    cap = 512  # small: actors lap it while learners update, the guard band moves
    cfg = make_config(run={"timeout_s": 60.0},
                      layout={"learners": learners, "buffers": 1,
                              "actors": COMM.Get_size() - 1 - learners},
                      storage={"capacity_rows": cap, "priority_exponent": ALPHA},
                      transport=TRANSPORTS[transport],
                      scheduler={"mode": "sync", "fetch": "direct", "batch_rows": BATCH,
                                 "min_fill_rows": cap, "sampler": "prioritized"})
    problems: list[str] = []
    given: dict[tuple[int, int], float] = {}  # (slot, gen) -> priority last given
    rows_sent = 0
    with ExperienceDataPlane(cfg) as edp:
        me = edp.world_rank
        if edp.role is Role.ACTOR:
            w = 0
            while not edp.should_stop:
                edp.ingest(checked_batch(me, w, 24))
                w += 24
        elif edp.role is Role.LEARNER:
            ring = edp.rings[0]
            lead = me == edp.roles.learner_ranks[0]
            for step in range(STEPS):
                b = edp.next_batch()
                # distinct per learner and step: the last one given is recognisable
                prio = (1.0 + step + 1000.0 * lead) * (1.0 + np.arange(BATCH) / BATCH)
                edp.update_priorities(b.indices, prio)
                rows_sent += BATCH
                for (_, slot, gen), pr in zip(b.indices, prio, strict=True):
                    given[(int(slot), int(gen))] = float(pr)
                if ring.views is not None:
                    # staleness 0 without a round trip: the leaves show it already
                    gens, mass = ring.leaves(b.indices[:, 1])
                    last = {int(s): k for k, s in enumerate(b.indices[:, 1])}
                    for s, k in last.items():
                        if gens[k] == b.indices[k, 2] and learners == 1 and not np.isclose(
                                mass[k], prio[k] ** ALPHA):
                            problems.append(f"step {step}: slot {s} has mass {mass[k]} "
                                            f"right after the update to {prio[k]}")
        else:
            edp.serve()
        edp.done()
        everyone = COMM.allreduce(rows_sent)
        summary = edp.summary()
        given_all: dict = {}
        for part in COMM.allgather(given if learners == 1 else {}):
            given_all.update(part)
        if edp.serves:  # while the window is still there
            (shard,) = edp.owned_shards()
            shard.poll()
            problems += _index_problems(shard)
            ix = shard.index
            for slot in range(cap):
                gen = int(ix.gens[slot] or ix.hidden_gens[slot])
                want = given_all.get((slot, gen))
                if want is not None and ix.priority[slot] != want:
                    problems.append(f"slot {slot} gen {gen}: priority {ix.priority[slot]}, "
                                    f"last given {want}")
    (s,) = summary["shards"].values()
    if s["applied_updates"] + s["dropped_updates"] != everyone:
        problems.append(f"{s['applied_updates']} applied + {s['dropped_updates']} dropped "
                        f"!= {everyone} update rows sent")
    for rank, lrn in summary["learners"].items():
        direct = lrn["priority_rows_direct"]
        expect = STEPS * BATCH if transport == "shm" else 0
        if direct != expect:
            problems.append(f"learner {rank} wrote {direct} rows directly, expected {expect}")
    assert COMM.allreduce([f"rank {COMM.Get_rank()}: {p}" for p in problems[:5]]) == []
