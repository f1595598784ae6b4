"""The node-shared staging ring between a learner and its delivery rank
(``scheduler.delivery = "process"``).

One shared-memory window (``MPI.Win.Allocate_shared``, through
:class:`~conduit_hpc.transport.rma.RmaWindow`) on the two-rank communicator {learner,
its delivery rank}, allocated by the delivery rank, mapped by both. Laid out by the
spec, the same on both sides:

* a control block of int64 words: the learner writes how many batches it asked for
  (:data:`W_REQUESTED`), that it stops or failed, and the head of the update queue; the
  delivery rank writes the queue's tail, that it stopped, failed or saw the stream end
  (then a UTF-8 message follows), and its counters when it stops;
* a sampler state, as JSON (:meth:`StagingRing.set_state`): the learner's, written once
  before its first request (:data:`W_STARTED`), so that the delivery rank, whose sampler
  draws the batches and weighs them, continues from where the learner's was put (a
  restored checkpoint's superstep, beta schedule and random state); then the delivery
  rank's as it stops (:data:`W_FINAL`), which the learner takes (what a final checkpoint
  saves of it);
* ``prefetch_depth + 1`` batch slots: a header (the tag: batch ``t + 1`` is in the slot;
  the superstep, rows, staleness, timings), then the batch's columns laid out by the
  spec, its ``[B, 3]`` indices and its importance weights. Batch ``t`` lives in slot
  ``t % (depth + 1)``; the delivery rank may write batch ``t`` only once the learner asked
  for batch ``t - depth`` (the prefetch clock), by when it is done with batch
  ``t - depth - 1``, the slot's previous tenant - asking is what frees a slot;
* a single-producer single-consumer queue of priority updates (indices and priorities),
  written by the learner, forwarded to the owners by the delivery rank.

Ordering, as in the shard ring (:mod:`conduit_hpc.storage.ring`): the writer stores the
data with numpy, then a memory barrier (``MPI_Win_sync``), then the word that publishes it
(a slot's tag, the queue head, the requested count), then a barrier; the reader reads the
word, a barrier, then the data. Each word has one writer. Nothing here blocks; the waits
are the callers' (bounded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from conduit_hpc.errors import ConfigError, SpecError
from conduit_hpc.plane.staging import Batch, BatchSink
from conduit_hpc.spec import Spec, check_in_range
from conduit_hpc.transport.rma import RmaWindow

__all__ = ["SLOT_TIMINGS", "SlotWriter", "StagingLayout", "StagingRing"]

_ALIGN = 64
#: control words (int64)
W_REQUESTED, W_STOP, W_LEARNER_FAILED, W_STOPPED, W_FAILED, W_CLOSED = 0, 1, 2, 3, 4, 5
W_Q_HEAD, W_Q_TAIL = 6, 7
W_STARTED = 8  # the learner's sampler state is written (bytes of it, + 1)
W_FINAL = 9  # the delivery rank's sampler state, as it stopped, is written (the same)
#: float64 counters the delivery rank leaves when it stops (words 16 ..)
COUNTERS = ("resampled", "limiter_wait_s", "overwritten_unsampled", "pinned_rounds",
            "priority_rows_direct", "priority_rows_messaged")
_CONTROL_WORDS = 32
_MESSAGE_BYTES = 2048
#: room for the learner's sampler state (JSON; numpy's largest bit generator state,
#: MT19937's, takes about 7 kB)
_START_BYTES = 16384
#: per-slot header words: tag, superstep, rows, staleness, then the timings
SLOT_TIMINGS = ("ack_wait_s", "sample_s", "gather_s", "transform_s", "copy_s",
                "limiter_wait_s")
_SLOT_HEADER_WORDS = 16


def _up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class StagingLayout:
    """Byte offsets of a staging ring (see the module docstring).

    Args:
        spec (Spec): the row schema.
        batch_rows (int): rows per batch (``B``).
        window (int): rows per sampled item (sequences), 1 otherwise.
        slots (int): batch slots (``prefetch_depth + 1``).
        queue_slots (int): entries of the update queue.
        queue_rows (int): rows per update-queue entry (longer updates take several).
    """

    spec: Spec
    batch_rows: int
    window: int
    slots: int
    queue_slots: int = 64
    queue_rows: int = 256

    @property
    def _lead(self) -> tuple[int, ...]:
        return (self.batch_rows, self.window) if self.window > 1 else (self.batch_rows,)

    @property
    def columns(self) -> dict[str, tuple[int, tuple[int, ...], np.dtype]]:
        """Field -> (offset within a slot, shape, dtype)."""
        off, out = _up(8 * _SLOT_HEADER_WORDS), {}
        for f in self.spec:
            shape = (*self._lead, *f.shape)
            out[f.name] = (off, shape, np.dtype(f.dtype))
            off = _up(off + int(np.prod(shape)) * np.dtype(f.dtype).itemsize)
        return out

    @property
    def indices_offset(self) -> int:
        last = max((o + int(np.prod(s)) * d.itemsize for o, s, d in self.columns.values()),
                   default=8 * _SLOT_HEADER_WORDS)
        return _up(last)

    @property
    def weights_offset(self) -> int:
        return _up(self.indices_offset + 24 * self.batch_rows)

    @property
    def slot_bytes(self) -> int:
        return _up(self.weights_offset + 4 * self.batch_rows)

    @property
    def slots_offset(self) -> int:
        return _up(8 * _CONTROL_WORDS + _MESSAGE_BYTES + _START_BYTES)

    @property
    def queue_entry_bytes(self) -> int:
        return _up(8 + 24 * self.queue_rows + 8 * self.queue_rows)

    @property
    def queue_offset(self) -> int:
        return self.slots_offset + self.slots * self.slot_bytes

    @property
    def nbytes(self) -> int:
        return self.queue_offset + self.queue_slots * self.queue_entry_bytes


@dataclass
class _Slot:
    header: np.ndarray  # int64 words
    timings: np.ndarray  # float64 view of the same header
    columns: dict[str, np.ndarray]
    indices: np.ndarray
    weights: np.ndarray


class StagingRing:
    """Both sides' view of one staging ring (see the module docstring). Not
    thread-safe; each side uses it from one thread.

    Args:
        window (RmaWindow): the pair's window; the delivery rank's segment holds the ring.
        owner (int): the delivery rank's rank in the pair communicator.
        layout (StagingLayout): the layout (equal on both sides).
    """

    def __init__(self, window: RmaWindow, owner: int, layout: StagingLayout) -> None:
        self.window, self.layout = window, layout
        seg = window.local_view(owner)
        if seg is None or len(seg) < layout.nbytes:
            raise RuntimeError("the staging ring's memory is not mapped on this rank")
        self._sync = window.sync
        self.control = seg[:8 * _CONTROL_WORDS].view(np.int64)
        self.counters = self.control[16:16 + len(COUNTERS)].view(np.float64)
        m0 = 8 * _CONTROL_WORDS
        self._message = seg[m0:m0 + _MESSAGE_BYTES]
        self._start = seg[m0 + _MESSAGE_BYTES:m0 + _MESSAGE_BYTES + _START_BYTES]
        self.slots = [self._slot(seg, layout.slots_offset + k * layout.slot_bytes)
                      for k in range(layout.slots)]
        q0, qb, r = layout.queue_offset, layout.queue_entry_bytes, layout.queue_rows
        self._queue = [(seg[q0 + k * qb:q0 + k * qb + 8].view(np.int64),
                        seg[q0 + k * qb + 8:q0 + k * qb + 8 + 24 * r].view(np.int64).reshape(r, 3),
                        seg[q0 + k * qb + 8 + 24 * r:q0 + k * qb + 8 + 32 * r].view(np.float64))
                       for k in range(layout.queue_slots)]

    def _slot(self, seg: np.ndarray, base: int) -> _Slot:
        lay, B = self.layout, self.layout.batch_rows
        header = seg[base:base + 8 * _SLOT_HEADER_WORDS].view(np.int64)
        cols = {}
        for name, (off, shape, dt) in lay.columns.items():
            n = int(np.prod(shape)) * dt.itemsize
            cols[name] = seg[base + off:base + off + n].view(dt).reshape(shape)
        io, wo = base + lay.indices_offset, base + lay.weights_offset
        return _Slot(header, header.view(np.float64), cols,
                     seg[io:io + 24 * B].view(np.int64).reshape(B, 3),
                     seg[wo:wo + 4 * B].view(np.float32))

    def close(self) -> None:
        """Free the window and the pair's communicator. **Collective** on the pair."""
        comm = self.window.comm
        self.window.close()
        comm.Free()

    # -- words -------------------------------------------------------------------------
    def word(self, w: int) -> int:
        """Read control word ``w`` (then a barrier: what it publishes is visible)."""
        v = int(self.control[w])
        self._sync()
        return v

    def set_word(self, w: int, value: int) -> None:
        """Publish control word ``w`` (a barrier first: what came before is visible)."""
        self._sync()
        self.control[w] = value
        self._sync()

    def _message_of(self, w: int) -> np.ndarray:
        half = _MESSAGE_BYTES // 2  # the learner's, then the delivery rank's
        return self._message[:half] if w == W_LEARNER_FAILED else self._message[half:]

    def set_message(self, w: int, text: str) -> None:
        """Write ``text`` then raise word ``w`` (failed / closed); each side has its own
        message area."""
        area = self._message_of(w)
        raw = text.encode("utf-8", "replace")[:len(area) - 1]
        area[:] = 0
        area[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.set_word(w, 1)

    def message(self, w: int) -> str:
        """The message that came with word ``w``."""
        raw = bytes(self._message_of(w))
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def set_state(self, w: int, text: str) -> None:
        """Write a sampler state (JSON text) into the state area, then word ``w`` (its
        length + 1): :data:`W_STARTED` by the learner before its first request, then
        :data:`W_FINAL` by the delivery rank as it stops (the area was read by then).

        Raises:
            ValueError: the text does not fit the ring's area (nothing is published).
        """
        raw = text.encode("utf-8")
        if len(raw) > len(self._start):
            raise ValueError(f"a sampler state takes {len(raw)} bytes as JSON; the "
                             f"staging ring has room for {len(self._start)}")
        self._start[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.set_word(w, len(raw) + 1)

    def state(self, w: int) -> str | None:
        """The sampler state published with word ``w`` (JSON text), or ``None`` before."""
        n = self.word(w)
        return bytes(self._start[:n - 1]).decode("utf-8") if n else None

    # -- batches (delivery rank writes, learner reads) ----------------------------------
    def slot_of(self, t: int) -> _Slot:
        return self.slots[t % self.layout.slots]

    def publish(self, t: int, superstep: int, staleness: int, timings: dict[str, float]) -> None:
        """Delivery rank: batch ``t`` is complete in its slot (data written before)."""
        slot = self.slot_of(t)
        slot.header[1], slot.header[2] = superstep, self.layout.batch_rows
        slot.header[3] = staleness
        for k, name in enumerate(SLOT_TIMINGS):
            slot.timings[4 + k] = float(timings.get(name, 0.0))
        self._sync()
        slot.header[0] = t + 1
        self._sync()

    def ready(self, t: int) -> bool:
        """Learner: whether batch ``t`` is in its slot (then its data is visible)."""
        if int(self.slot_of(t).header[0]) != t + 1:
            return False
        self._sync()
        return True

    def batch(self, t: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, int, int,
                                    dict[str, float]]:
        """Learner: batch ``t``'s columns (views of the slot, no copy), a copy of its
        indices and weights, its superstep, staleness and timings. Call after
        :meth:`ready`; the views stay valid until the learner asks for batch ``t + 1``."""
        slot = self.slot_of(t)
        timings = {name: float(slot.timings[4 + k]) for k, name in enumerate(SLOT_TIMINGS)}
        return (dict(slot.columns), slot.indices.copy(), slot.weights.copy(),
                int(slot.header[1]), int(slot.header[3]), timings)

    # -- priority updates (learner writes, delivery rank forwards) -----------------------
    def queue_free(self) -> int:
        """Learner: entries free in the update queue."""
        head, tail = int(self.control[W_Q_HEAD]), self.word(W_Q_TAIL)
        return self.layout.queue_slots - (head - tail)

    def push(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Learner: enqueue one update of at most ``queue_rows`` rows (check
        :meth:`queue_free` first)."""
        n = len(indices)
        assert 0 < n <= self.layout.queue_rows
        head = int(self.control[W_Q_HEAD])
        count, idx, pr = self._queue[head % self.layout.queue_slots]
        idx[:n] = indices
        pr[:n] = priorities
        count[0] = n
        self.set_word(W_Q_HEAD, head + 1)

    def pop_all(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Delivery rank: every queued update (copies), oldest first; frees them."""
        head, tail = self.word(W_Q_HEAD), int(self.control[W_Q_TAIL])
        out = []
        for k in range(tail, head):
            count, idx, pr = self._queue[k % self.layout.queue_slots]
            n = int(count[0])
            out.append((idx[:n].copy(), pr[:n].copy()))
        if head != tail:
            self.set_word(W_Q_TAIL, head)
        return out


class SlotWriter(BatchSink):
    """Where a delivery rank's batches go: the staging ring's slot, gathered there
    directly (:meth:`alloc`); a transform's new arrays are copied in. No
    device, no torch (the learner stages the slot to its device)."""

    def __init__(self, ring: StagingRing) -> None:
        self.ring = ring
        self.t = -1

    def alloc(self, t: int, spec: Spec, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
        """The columns of batch ``t``'s slot (free by the prefetch clock)."""
        self.t = t
        return self.ring.slot_of(t).columns

    def to_device(self, data: Any, indices: np.ndarray, weights: np.ndarray, superstep: int,
                  staleness: int, device_rows: Any = ()) -> Batch:
        # no learner_gpu shard with a delivery rank (refused by planning.executable)
        assert not device_rows, "a delivery rank has no device tier"
        slot = self.ring.slot_of(self.t)
        if set(data) != set(slot.columns):
            raise ConfigError(f"with scheduler.delivery = 'process' the transform must "
                              f"return the spec's fields {sorted(slot.columns)} (they are "
                              f"laid out in shared memory), got {sorted(data)}",
                              key="scheduler.delivery")
        for name, col in slot.columns.items():
            v = data[name]
            if v is not col:
                v = np.asarray(v)
                bad = v.shape != col.shape or not np.can_cast(v.dtype, col.dtype, "same_kind")
                why = f"{v.dtype}{list(v.shape)}"
                if not bad and v.dtype != col.dtype and v.size:
                    try:  # cast as ingest casts: no value may wrap or overflow
                        check_in_range(name, v, col.dtype)
                    except SpecError as err:
                        bad, why = True, f"{why}: {err}"
                if bad:
                    raise ConfigError(
                        f"with scheduler.delivery = 'process' the transform must keep field "
                        f"{name!r} as {col.dtype}{list(col.shape)}, got {why}",
                        key="scheduler.delivery")
                col[...] = v
        slot.indices[...] = indices
        slot.weights[...] = weights
        return Batch({}, indices, weights, superstep, staleness)  # type: ignore[arg-type]
