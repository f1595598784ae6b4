"""Targets drawn over a shard's published span that has since shrunk (rows hidden
ahead of writers, priorities lowered, windows cut) are "nothing drawn here" (slot -1,
drawn again over the current span), never clipped onto the shard's last row.

A learner draws a batch's targets over the statistics it read; the owner (or the
learner's own search of the shared tree) finds the rows a moment later, after the
owner's pass may have changed the tree. Before, every target past the current total
was clipped to it and landed on the last row with mass (the last valid window): with
a quarter of the mass gone that row got a quarter of the draws. Now the rows drawn
follow the current masses exactly, as a single-buffer reference says.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI
from scipy import stats as sps

from conduit_hpc.config import FieldConfig
from conduit_hpc.plane.buffer import OwnedShard
from conduit_hpc.sampling import TreeDrawer, WindowDrawer
from conduit_hpc.spec import Spec
from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing, tree_kernels
from conduit_hpc.testing import CHECKED_SPEC, checked_batch
from conduit_hpc.transport.rma import RmaWindow

SPEC = Spec.from_config({k: FieldConfig(**v) for k, v in CHECKED_SPEC.items()})


def _follows_the_masses(slots: np.ndarray, mass: np.ndarray) -> None:
    """The drawn slots (-1: drawn again elsewhere) are distributed as ``mass``."""
    got = np.bincount(slots[slots >= 0], minlength=len(mass))
    live = mass > 0
    assert got[~live].sum() == 0, "a row without mass was drawn"
    if live.sum() == 1:
        return
    expected = mass[live] / mass[live].sum() * got.sum()
    assert sps.chisquare(got[live], expected).pvalue > 1e-6, (got, expected)


@settings(max_examples=40, deadline=None, derandomize=True)  # chi-square: fixed draws
@given(cap=st.integers(4, 64), gone=st.floats(0.05, 0.9), seed=st.integers(0, 2**32 - 1))
def test_the_owners_tree_draw_follows_the_current_masses(cap: int, gone: float,
                                                         seed: int) -> None:
    rng = np.random.default_rng(seed)
    index = PriorityIndex(cap, alpha=1.0)
    index.insert(np.arange(cap), np.arange(1, cap + 1), rng.random(cap) + 0.5)
    stale = index.total  # what the learner read
    hide = rng.permutation(cap)[:max(1, int(gone * cap))]
    if len(hide) == cap:
        hide = hide[1:]
    index.hide(hide)  # the owner's pass: rows hidden ahead of the writers
    assert index.total < stale
    slots, gens, mass = TreeDrawer().draw(index, rng.random(20_000) * stale)
    drawn = slots >= 0
    assert (gens[~drawn] == 0).all() and (mass[~drawn] == 0).all()
    np.testing.assert_array_equal(gens[drawn], index.gens[slots[drawn]])
    _follows_the_masses(slots, index.sum.leaves.copy())


def test_window_draws_past_the_current_starts_are_drawn_again() -> None:
    cap = 32
    cols = {"end": np.zeros(cap, np.int8)}
    commit = [cap]
    index = PriorityIndex(cap, alpha=1.0)
    index.insert(np.arange(cap), np.arange(1, cap + 1), np.ones(cap))
    drawer = WindowDrawer(cols, cap, lambda: commit[0], length=4, episode_field="end",
                          stream_field="", cross_episode=False, refresh_s=0.0)
    stale = drawer.span(index)  # 29 starts
    cols["end"][10] = 1  # an episode ends there: windows over it are cut
    drawer.changed()
    now = drawer.starts(index, force=True)
    assert len(now) < stale
    rng = np.random.default_rng(0)
    slots, gens, mass = drawer.draw(index, np.floor(rng.random(20_000) * stale))
    starts_mass = np.zeros(cap)
    starts_mass[now % cap] = 1.0
    _follows_the_masses(slots, starts_mass)
    drawn = slots >= 0
    assert (gens[drawn] == slots[drawn] + 1).all() and (mass[~drawn] == 0).all()


@pytest.mark.parametrize("compiled", [True, False])
def test_a_learners_own_search_follows_the_current_masses(compiled: bool, monkeypatch) -> None:
    cap = 16
    lay = ShardLayout(SPEC, cap)
    win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
    try:
        ring = ShardRing(win, 0, 0, lay, timeout_s=2.0)
        owner_ring = ShardRing(win, 0, 0, lay, timeout_s=2.0)
        owner_ring.views = v = lay.views(win.own_segment(), 0)
        index = PriorityIndex(cap, alpha=1.0, sum_buffer=v.tree, gens_buffer=v.gens)
        owned = OwnedShard(0, owner_ring, index)
        ring.write(SPEC.validate(checked_batch(1, 0, cap)))
        owned.poll()
        _, stale, _, _ = ring.read_stats()  # the learner's statistics
        with owned.writing():  # then another learner lowers half the rows' priorities
            index.update(np.arange(8), index.gens[:8].copy(), np.full(8, 0.01))
        assert ring.read_stats()[1] < stale
        targets = np.random.default_rng(1).random(20_000) * stale
        if not compiled:  # the numpy path (where numba is not there)
            monkeypatch.setattr(tree_kernels, "available", lambda: False)
        slots, gens, mass, *_ = ring.search(targets)
        drawn = slots >= 0
        assert (mass[~drawn] == 0).all() and (gens[~drawn] == 0).all()
        _follows_the_masses(slots, index.sum.leaves.copy())
    finally:
        win.close()
