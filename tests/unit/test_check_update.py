"""``sampling.check_update``: its compiled one-pass verdict (``tree_kernels.check_rows``)
against the reference path on every kind of update a learner may send - the same rows
accepted, the same error for the rest (the reference path names the fault)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_hpc.errors import SpecError
from conduit_hpc.sampling import base
from conduit_hpc.storage import tree_kernels

SHARDS = {0: 50, 2: 7, 5: 1000}


def _reference(indices, priorities, shards):
    """check_update with the compiled pass off (its table is refused)."""
    saved = base._cap_table
    base._cap_table = lambda _s: None  # type: ignore[assignment]
    try:
        return base.check_update(indices, priorities, shards)
    finally:
        base._cap_table = saved  # type: ignore[assignment]


def _outcome(fn, *args):
    try:
        idx, p = fn(*args)
        return "ok", idx.tolist(), p.tolist()
    except SpecError as err:
        return "error", str(err)


values = st.one_of(st.floats(-1.0, 2e30),
                   st.sampled_from([0.0, 1e30, np.nextafter(1e30, 2e30), -0.0, 5e-324,
                                    float("nan"), float("inf"), -float("inf")]))


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from([0, 1, 2, 5, 6, -1, 70000]),
                               st.integers(-2, 1001), st.integers(0, 9), values),
                     min_size=0, max_size=20),
       as_int32=st.booleans())
def test_compiled_verdict_equals_the_reference(rows, as_int32) -> None:
    idx = np.array([[s, t, g] for s, t, g, _ in rows], dtype=np.int32 if as_int32 else np.int64)
    idx = idx.reshape(-1, 3)
    p = np.array([v for *_, v in rows], dtype=np.float64)
    assert _outcome(base.check_update, idx, p, SHARDS) == _outcome(_reference, idx, p, SHARDS)


def test_the_compiled_pass_runs_and_finds_each_fault() -> None:
    assert tree_kernels.available()
    caps = base._cap_table(SHARDS)
    assert caps is not None and caps.tolist() == [50, 0, 7, 0, 0, 1000]
    ok = np.array([[0, 49, 1], [2, 0, 1], [5, 999, 3]], np.int64)
    assert tree_kernels.check_rows(ok, np.array([0.0, 1.0, 1e30]), 1e30, caps) == -1
    for row, value, bad in (([1, 0, 1], 1.0, 1), ([2, 7, 1], 1.0, 1), ([0, -1, 1], 1.0, 1),
                            ([6, 0, 1], 1.0, 1), ([0, 0, 1], float("nan"), 1),
                            ([0, 0, 1], -1e-300, 1), ([0, 0, 1], 2e30, 1)):
        idx = np.array([[0, 0, 1], row], np.int64)
        assert tree_kernels.check_rows(idx, np.array([1.0, value]), 1e30, caps) == bad


@pytest.mark.parametrize("shards", [{np.int64(0): 10}, {-1: 10}, {1 << 20: 10}])
def test_shard_ids_the_table_cannot_hold_take_the_reference_path(shards) -> None:
    sid = next(iter(shards))
    idx = np.array([[int(sid), 3, 1]], np.int64)
    got_idx, got_p = base.check_update(idx, [2.0], shards)
    assert got_idx.tolist() == [[int(sid), 3, 1]] and got_p.tolist() == [2.0]
    with pytest.raises(SpecError, match="slot 10 outside"):
        base.check_update(np.array([[int(sid), 10, 1]]), [2.0], shards)


def test_an_update_naming_a_slot_outside_the_index_changes_nothing() -> None:
    from conduit_hpc.storage import PriorityIndex

    ix = PriorityIndex(8, alpha=0.6)
    ix.insert(np.arange(8), np.arange(1, 9), np.ones(8))
    before = (ix.sum.nodes.copy(), ix.priority.copy(), ix.max_priority)
    for slots in ([0, 8], [-1, 0]):
        with pytest.raises(ValueError, match=r"slot outside \[0, 8\)"):
            ix.update(np.array(slots), np.array([1, 1]), np.array([5.0, 5.0]), checked=True)
    assert np.array_equal(ix.sum.nodes, before[0]) and np.array_equal(ix.priority, before[1])
    assert ix.max_priority == before[2] and ix.applied_updates == 0


@pytest.mark.parametrize("col, what", [(0, "shard"), (1, "slot"), (2, "generation")])
def test_an_unsigned_index_beyond_int64_is_named_as_given(col, what) -> None:
    # 2**63 as uint64 wrapped to -2**63 before the check, which then named a slot the
    # caller never gave (a hostile test, stop 35)
    idx = np.array([[0, 3, 1], [0, 4, 1]], np.uint64)
    idx[1, col] = 2**63
    with pytest.raises(SpecError, match=f"indices row 1 has {what} 9223372036854775808, "):
        base.check_update(idx, [1.0, 1.0], SHARDS)
