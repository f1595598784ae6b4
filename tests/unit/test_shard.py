"""The owner's side of a shard on one rank: free cursor, guard band, block policy, read
pins and the overwritten-unsampled count (COMM_SELF windows; the writer's waits run the
owner's pass, as a concurrent owner would)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import DataPlaneTimeout
from conduit_hpc.config import FieldConfig
from conduit_hpc.plane.shard import OwnedShard
from conduit_hpc.spec import Spec
from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing
from conduit_hpc.storage.ring import H_RESERVE
from conduit_hpc.testing import CHECKED_SPEC, checked_batch
from conduit_hpc.transport.rma import RmaWindow

SPEC = Spec.from_config({k: FieldConfig(**v) for k, v in CHECKED_SPEC.items()})
CAP = 64


@pytest.fixture
def make():
    wins: list[RmaWindow] = []

    def build(**kw) -> tuple[ShardRing, OwnedShard]:
        lay = ShardLayout(SPEC, CAP)
        win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
        wins.append(win)
        writer = ShardRing(win, 0, 0, lay, timeout_s=5.0)
        owner = ShardRing(win, 0, 0, lay, timeout_s=5.0)
        owned = OwnedShard(0, owner, PriorityIndex(CAP, alpha=1.0), **kw)
        writer.on_wait = owned.poll  # stands in for the owner's concurrent loop
        return writer, owned

    yield build
    for w in wins:
        w.close()


def write(ring: ShardRing, first: int, n: int) -> None:
    ring.write(SPEC.validate(checked_batch(1, first, n)))


def test_guarded_owner_gates_writers_and_keeps_half_the_ring_drawable(make) -> None:
    ring, owned = make(guarded=True, guard_s=0.01)
    assert ring.free_cursor() == CAP  # published at once: no writer runs ahead of it
    seen = []
    for k in range(40):
        write(ring, 8 * k, 8)
        owned.poll()
        seen.append(ring.free_cursor())
        if k == 10:
            time.sleep(0.003)  # a measurable insert rate: a guard band opens
        commit, reserved = ring.commit_cursor(), ring.reserve_cursor()
        free = seen[-1]
        assert free >= reserved
        if commit >= CAP:  # past the first lap: at most half a ring ahead of the commits
            assert free <= commit + CAP // 2
        # every row a writer may take is hidden; at least half a ring stays drawable
        drawable = owned.index.gens[owned.index.gens > 0] - 1
        assert (drawable + CAP >= free).all()
        if commit >= CAP:
            assert owned.index.count >= CAP // 2
    assert seen == sorted(seen)  # the free cursor never moves back
    assert owned.guard_rows > 0


def test_overwritten_unsampled_counts_rows_no_learner_drew(make) -> None:
    ring, owned = make()
    write(ring, 0, CAP)
    owned.poll()
    slots = np.arange(10)
    assert ring.mark_sampled(slots, slots + 1)  # rows 0..9 drawn
    ring.mark_sampled(np.array([12]), np.array([1]))  # an older generation: not row 12
    write(ring, CAP, 20)  # overwrites rows 0..19
    owned.poll()
    assert owned.overwritten_unsampled == 10
    assert int(ring.read_header()[8]) == 10  # published for learners


def test_block_holds_writers_on_an_undrawn_row_then_lets_go(make) -> None:
    ring, owned = make(guarded=True, block=True, block_timeout_s=0.2)
    write(ring, 0, CAP)
    owned.poll()
    ring.mark_sampled(np.arange(8), np.arange(1, 9))  # rows 0..7 drawn
    write(ring, CAP, 8)  # takes their slots: no wait for a learner
    owned.poll()
    assert owned.block_releases == 0 and owned.overwritten_unsampled == 0
    t0 = time.monotonic()
    write(ring, CAP + 8, 4)  # rows 8..11 were never drawn: held, then let go
    assert time.monotonic() - t0 >= 0.2
    owned.poll()
    assert owned.block_releases == 1 and owned.overwritten_unsampled == 4
    assert ring.lap_waits >= 1 and ring.lap_wait_s >= 0.2


def test_block_ends_when_no_learner_is_left(make) -> None:
    ring, owned = make(guarded=True, block=True, block_timeout_s=30.0)
    write(ring, 0, CAP)
    owned.poll()
    owned.block = False  # what BufferServer does once every learner said it is done
    write(ring, CAP, 8)
    owned.poll()
    assert owned.block_releases == 0 and owned.overwritten_unsampled == 8


def test_a_read_pin_holds_the_free_cursor(make) -> None:
    pins = np.zeros((2, 2), np.int64)
    ring, owned = make(guarded=True, pins=pins)
    write(ring, 0, CAP)
    owned.poll()
    pinned = ring.free_cursor()
    pins[1] = (owned.shard_id + 1, pinned)  # rank 1 redraws rows of this shard
    ring.timeout_s = 0.2
    with pytest.raises(DataPlaneTimeout, match="free cursor"):
        write(ring, CAP + 100, 8)  # past the pin: waits
    assert ring.free_cursor() == pinned
    pins[1] = 0  # unpinned: the writer's seqs are freed on the next pass
    owned.poll()
    assert ring.free_cursor() > pinned


@pytest.mark.parametrize("guarded", [True, False])
def test_commit_interval_holds_few_rows_for_one_pass_at_most(make, guarded) -> None:
    """A bounded pass (the buffer loop's) lets a few committed rows wait at most
    ``commit_interval_s`` while learners sample; enough waiting rows, an unbounded pass
    (a request's), a writer waiting for the free cursor or a job without learners
    commit at once; no row is lost. (An interval of 30 s: no pass falls due by itself.)"""
    ring, owned = make(guarded=guarded, commit_interval_s=30.0, max_commit_rows=16)
    write(ring, 0, 4)
    assert owned.poll(bounded=True) == 4  # the first pass runs
    write(ring, 4, 4)
    got = owned.poll(bounded=True)
    if not guarded:  # nobody else takes the index lock: every pass commits
        assert got == 4
        return
    assert got == 0 and ring.commit_cursor() == 4 and owned.index.count == 4
    write(ring, 8, 12)  # 16 rows wait: the pass runs however recent the last one was
    assert owned.poll(bounded=True) == 16
    assert ring.commit_cursor() == 20 and owned.index.count == 20
    write(ring, 20, 2)
    assert owned.poll(bounded=True) == 0
    assert owned.poll() == 2  # unbounded: at once
    write(ring, 22, 2)
    owned.commit_interval_s = 0.05
    time.sleep(0.06)
    assert owned.poll(bounded=True) == 2  # the interval passed
    assert ring.commit_cursor() == 24
    assert sorted(owned.index.gens[owned.index.gens > 0]) == list(range(1, 25))
    owned.commit_interval_s, owned.max_commit_rows = 30.0, 1 << 12  # (the cursor decides)
    write(ring, 24, 2)
    assert owned._coalesce()  # two rows, a pass just ran: they may wait
    # a writer that reserved past the free cursor waits for a pass: it runs at once
    # (a small ring's writers reach the cursor between passes)
    ring.transport.fetch_add(0, ring.base + 8 * H_RESERVE,
                             ring.free_cursor() - ring.reserve_cursor() + 1)
    assert not owned._coalesce()
    assert owned.poll(bounded=True) == 2
