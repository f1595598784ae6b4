"""The staging ring of ``scheduler.delivery = "process"`` on one rank (a COMM_SELF
shared window: both sides in one process; tests/mpi/test_delivery_process.py runs it
between a learner and its delivery rank)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from conduit_hpc.config import FieldConfig
from conduit_hpc.errors import ConfigError
from conduit_hpc.plane.delivery_rank import SlotWriter
from conduit_hpc.plane.staging_ring import (
    W_CLOSED,
    W_FAILED,
    W_LEARNER_FAILED,
    StagingLayout,
    StagingRing,
)
from conduit_hpc.spec import Spec
from conduit_hpc.testing import CHECKED_SPEC, checked_batch, row_consistent
from conduit_hpc.transport.rma import RmaWindow

SPEC = Spec.from_config({k: FieldConfig(**v) for k, v in CHECKED_SPEC.items()})


def ring(batch_rows: int = 8, slots: int = 3, window: int = 1, queue_slots: int = 4,
         queue_rows: int = 16) -> StagingRing:
    lay = StagingLayout(SPEC, batch_rows, window, slots, queue_slots=queue_slots,
                        queue_rows=queue_rows)
    win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
    return StagingRing(win, 0, lay)


def test_layout_is_aligned_and_disjoint() -> None:
    lay = StagingLayout(SPEC, 7, 3, 4)
    spans = []
    for off, shape, dt in lay.columns.values():
        assert off % 64 == 0 and shape[:2] == (7, 3)
        spans.append((off, off + int(np.prod(shape)) * dt.itemsize))
    spans.append((lay.indices_offset, lay.indices_offset + 24 * 7))
    spans.append((lay.weights_offset, lay.weights_offset + 4 * 7))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert spans[-1][1] <= lay.slot_bytes
    assert lay.nbytes == lay.queue_offset + lay.queue_slots * lay.queue_entry_bytes


def test_batches_go_through_their_slots_in_order() -> None:
    r = ring()
    w = SlotWriter(r)
    for t in range(7):  # more batches than slots: each slot is reused
        assert not r.ready(t)
        cols = w.alloc(t, SPEC, (8,))  # gathered straight into the slot
        batch = checked_batch(5, 100 * t, 8)
        for k, v in batch.items():
            cols[k][...] = v
        idx = np.column_stack([np.zeros(8), np.arange(8) + t, np.arange(8) + 1]).astype(np.int64)
        wts = np.linspace(0.5, 1.0, 8).astype(np.float32)
        w.to_device(cols, idx, wts, t + 10, t % 3)
        r.publish(t, t + 10, t % 3, {"sample_s": 0.25, "gather_s": 0.5})
        assert r.ready(t) and not r.ready(t + 1)
        data, got_idx, got_w, superstep, staleness, timings = r.batch(t)
        assert row_consistent(data).all() and (data["wseq"] == np.arange(8) + 100 * t).all()
        assert np.shares_memory(data["payload"], r.slot_of(t).columns["payload"])  # no copy
        np.testing.assert_array_equal(got_idx, idx)
        np.testing.assert_array_equal(got_w, wts)
        assert (superstep, staleness) == (t + 10, t % 3)
        assert timings["sample_s"] == 0.25 and timings["copy_s"] == 0.0
    r.window.close()


def test_a_transform_that_changes_the_fields_is_refused_by_name() -> None:
    r = ring()
    w = SlotWriter(r)
    cols = w.alloc(0, SPEC, (8,))
    idx, wts = np.zeros((8, 3), np.int64), np.ones(8, np.float32)
    with pytest.raises(Exception, match="must return the spec's fields"):
        w.to_device({"writer": cols["writer"]}, idx, wts, 0, 0)
    bad = dict(cols, payload=np.zeros((8, 2), np.float64))
    with pytest.raises(Exception, match=r"keep field 'payload' as int64\[8, 6\]"):
        w.to_device(bad, idx, wts, 0, 0)
    new = {k: v.copy() for k, v in cols.items()}  # new arrays of the same layout: copied
    new["wseq"][:] = 42
    w.to_device(new, idx, wts, 0, 0)
    assert (r.slot_of(0).columns["wseq"] == 42).all()
    r.window.close()


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 16), min_size=1, max_size=12), drain=st.integers(1, 4))
def test_the_update_queue_keeps_order_across_wraps(sizes: list[int], drain: int) -> None:
    r = ring(queue_slots=4, queue_rows=16)
    sent, got = [], []
    for k, n in enumerate(sizes):
        if r.queue_free() == 0 or k % drain == 0:
            got += r.pop_all()
        assert r.queue_free() > 0
        idx = np.column_stack([np.full(n, k), np.arange(n), np.arange(n) + 1]).astype(np.int64)
        p = np.full(n, float(k))
        r.push(idx, p)
        sent.append((idx, p))
    got += r.pop_all()
    assert r.queue_free() == 4 and r.pop_all() == []
    assert len(got) == len(sent)
    for (a, p), (b, q) in zip(sent, got, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(p, q)
    r.window.close()


def test_each_side_has_its_own_message() -> None:
    r = ring()
    assert not r.word(W_FAILED) and not r.word(W_LEARNER_FAILED)
    r.set_message(W_LEARNER_FAILED, "RuntimeError: loss is NaN")
    r.set_message(W_FAILED, "DataPlaneTimeout: " + "x" * 5000)  # cut to its area
    assert r.word(W_FAILED) == 1 and r.word(W_LEARNER_FAILED) == 1
    assert r.message(W_LEARNER_FAILED) == "RuntimeError: loss is NaN"
    assert r.message(W_FAILED).startswith("DataPlaneTimeout: xxx")
    assert r.message(W_CLOSED) == r.message(W_FAILED)  # the delivery rank's area
    r.window.close()


@pytest.mark.parametrize(("name", "value", "shown"), [
    ("writer", np.int64(2**32 + 3), "4294967299"),  # int32: would wrap to 3
    ("wseq", np.uint64(2**63 + 5), "9223372036854775813"),  # int64: would wrap negative
])
def test_a_transforms_value_the_slot_cannot_hold_is_refused(name, value, shown) -> None:
    """A delivery rank's transform that returned an int64 column for an int32 field cast
    it into the staging slot with numpy's same_kind rule: 2**32 + 3 arrived as 3, where
    thread delivery hands the learner the transform's own int64. Now a value the spec's
    dtype cannot hold is refused as ingest refuses it, naming the field and the value;
    the slot is not published."""
    r = ring()
    w = SlotWriter(r)
    cols = w.alloc(0, SPEC, (8,))
    for k, v in checked_batch(5, 0, 8).items():
        cols[k][...] = v
    out = dict(cols)
    out[name] = np.full(8, value)
    with pytest.raises(ConfigError) as info:
        w.to_device(out, np.zeros((8, 3), np.int64), np.ones(8, np.float32), 0, 0)
    msg = str(info.value)
    assert repr(name) in msg and shown in msg and "range" in msg, msg
    assert not r.ready(0)
    # values that fit are cast as before (a transform's own dtype is its business)
    out[name] = np.arange(8, dtype=np.int64 if name == "writer" else np.uint64)
    w.to_device(out, np.zeros((8, 3), np.int64), np.ones(8, np.float32), 0, 0)
    assert cols[name].tolist() == list(range(8))


def test_a_float_that_would_overflow_the_slots_type_is_refused() -> None:
    spec = Spec.from_config({"x": FieldConfig(dtype="float32")})
    lay = StagingLayout(spec, 4, 1, 2, queue_slots=4, queue_rows=16)
    win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
    r = StagingRing(win, 0, lay)
    w = SlotWriter(r)
    w.alloc(0, spec, (4,))
    with pytest.raises(ConfigError, match=r"'x'.*1e\+39.*inf"):
        w.to_device({"x": np.array([0.0, 1.0, 1e39, 2.0])}, np.zeros((4, 3), np.int64),
                    np.ones(4, np.float32), 0, 0)
    w.to_device({"x": np.array([0.0, 1.0, np.inf, 2.5])}, np.zeros((4, 3), np.int64),
                np.ones(4, np.float32), 0, 0)  # inf itself is a value, kept
    assert r.slot_of(0).columns["x"].tolist() == [0.0, 1.0, np.inf, 2.5]
