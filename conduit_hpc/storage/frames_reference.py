"""A single-process reference model of "each frame stored once" (frame-stacked replay).

Not used by the data plane: it is the oracle that the shared-memory version
(:mod:`conduit_hpc.storage.frames`) is tested against (``tests/unit/test_frames_storage.py``;
see ``docs/frame-stacks.md``), with :func:`refs_frame_by_frame`, the frame-by-frame lookup
that ``FrameWriter.plan(vectorized=False)`` runs. Pure numpy; no MPI; not thread-safe.

The model:

* :class:`FrameRing` holds the frames of every stream in one ring of
  ``capacity_frames`` slots, each frame once. :meth:`FrameRing.append` gives a frame
  its *sequence number* (0, 1, 2, ... over all streams); it lives in slot
  ``seq % capacity_frames`` until ``capacity_frames`` later frames overwrite it. Each
  frame remembers the previous frame of its stream's episode (itself at an episode
  start).
* The stack ending at a frame is its ``depth`` newest frames of the episode, oldest
  first, padded at an episode's start by repeating the episode's first frame (what
  Gymnasium's ``FrameStackObservation`` does with its default ``padding_type="reset"``).
* :class:`FrameReplay` keeps rows in a ring of ``capacity_rows``. A row references the
  ``depth`` frames of its ``obs`` stack and the ``depth`` frames of its ``next_obs``
  stack (sequence numbers, resolved when the row is added); it is *deliverable* while
  it is in the row ring and none of its frames was overwritten, and then
  :meth:`FrameReplay.get` rebuilds both stacks exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["FrameReplay", "FrameRing", "refs_frame_by_frame"]


class FrameRing:
    """Frames of many streams, each stored once, in one ring.

    Args:
        capacity_frames (int): frame slots (>= 1).
        frame_shape (Sequence[int]): the shape of one frame.
        dtype (str | np.dtype): the frames' dtype.
        depth (int): frames per stack (>= 1).

    Raises:
        ValueError: a capacity or depth below 1.
    """

    def __init__(self, capacity_frames: int, frame_shape: Sequence[int],
                 dtype: str | np.dtype = "uint8", depth: int = 4) -> None:
        if capacity_frames < 1 or depth < 1:
            raise ValueError(f"capacity_frames and depth must be >= 1, got "
                             f"{capacity_frames!r}, {depth!r}")
        self.capacity, self.depth = int(capacity_frames), int(depth)
        self.frame_shape = tuple(int(d) for d in frame_shape)
        self.frames = np.zeros((self.capacity, *self.frame_shape), dtype=dtype)
        self.slot_seq = np.full(self.capacity, -1, dtype=np.int64)  # who holds the slot
        self.slot_prev = np.full(self.capacity, -1, dtype=np.int64)
        self.slot_stream = np.full(self.capacity, -1, dtype=np.int64)
        self.appended = 0  # frames appended so far (the next sequence number)
        self._last: dict[int, int] = {}  # stream -> its newest frame's sequence number

    @property
    def oldest(self) -> int:
        """The oldest sequence number still held."""
        return max(0, self.appended - self.capacity)

    def alive(self, seqs: np.ndarray | Sequence[int]) -> bool:
        """Whether every frame in ``seqs`` is still held (none overwritten)."""
        s = np.asarray(seqs, dtype=np.int64)
        return bool(s.size == 0 or (s.min() >= self.oldest and s.max() < self.appended))

    def append(self, stream: int, frame: np.ndarray, *, episode_start: bool) -> int:
        """Store the next frame of ``stream`` (the first of an episode when
        ``episode_start``, and always for a stream's first frame); returns its
        sequence number. Overwrites the oldest frame when the ring is full.

        Raises:
            ValueError: the frame's shape is not ``frame_shape``.
        """
        frame = np.asarray(frame)
        if frame.shape != self.frame_shape:
            raise ValueError(f"frame must have shape {self.frame_shape}, got {frame.shape}")
        seq = self.appended
        prev = self._last.get(stream, -1)
        if episode_start or prev < 0:
            prev = seq
        slot = seq % self.capacity
        self.frames[slot] = frame
        self.slot_seq[slot], self.slot_prev[slot], self.slot_stream[slot] = seq, prev, stream
        self._last[stream] = seq
        self.appended += 1
        return seq

    def stream_of(self, seq: int) -> int:
        """The stream of a held frame.

        Raises:
            KeyError: the frame is not held (never appended, or overwritten).
        """
        self._slot(seq)
        return int(self.slot_stream[seq % self.capacity])

    def stack_refs(self, seq: int) -> np.ndarray:
        """The ``depth`` sequence numbers of the stack ending at frame ``seq``, oldest
        first (an episode's first frame repeated at its start).

        Raises:
            KeyError: a frame of the stack is no longer held, so the stack cannot be
                resolved.
        """
        refs = [seq]
        cur = seq
        for _ in range(self.depth - 1):
            prev = int(self.slot_prev[self._slot(cur)])
            if prev != cur:
                self._slot(prev)
            cur = prev
            refs.append(cur)
        return np.asarray(refs[::-1], dtype=np.int64)

    def gather(self, seqs: np.ndarray) -> np.ndarray:
        """The frames of ``seqs`` stacked on a new leading axis (copies).

        Raises:
            KeyError: a frame is no longer held.
        """
        return np.stack([self.frames[self._slot(int(s))] for s in seqs])

    def _slot(self, seq: int) -> int:
        slot = seq % self.capacity
        if not 0 <= seq < self.appended or self.slot_seq[slot] != seq:
            raise KeyError(f"frame {seq} is not held (frames {self.oldest}.."
                           f"{self.appended - 1} are)")
        return slot


class FrameReplay:
    """Rows of ``(obs stack, next_obs stack)`` that reference the frames of a
    :class:`FrameRing`, in a ring of ``capacity_rows``.

    Args:
        frames (FrameRing): where the frames live.
        capacity_rows (int): row slots (>= 1).

    Raises:
        ValueError: ``capacity_rows`` below 1.
    """

    def __init__(self, frames: FrameRing, capacity_rows: int) -> None:
        if capacity_rows < 1:
            raise ValueError(f"capacity_rows must be >= 1, got {capacity_rows!r}")
        self.frames, self.capacity = frames, int(capacity_rows)
        d = frames.depth
        self.refs = np.full((self.capacity, 2 * d), -1, dtype=np.int64)  # obs | next
        self.row_stream = np.full(self.capacity, -1, dtype=np.int64)
        self.added = 0  # rows added so far (the next row id)

    def add(self, obs_seq: int, next_seq: int) -> int:
        """Add the row whose ``obs`` is the stack ending at frame ``obs_seq`` and whose
        ``next_obs`` is the stack ending at frame ``next_seq`` (a later frame of the same
        stream and episode); returns its row id (0, 1, 2, ...). Overwrites the oldest
        row when the ring is full.

        Raises:
            KeyError: a frame of either stack is no longer held.
            ValueError: the two frames are of different streams, or ``next_seq`` is not
                later than ``obs_seq``.
        """
        ring = self.frames
        stream = ring.stream_of(obs_seq)
        if ring.stream_of(next_seq) != stream or next_seq <= obs_seq:
            raise ValueError(f"next frame {next_seq} must be a later frame of the stream "
                             f"of frame {obs_seq} ({stream})")
        refs = np.concatenate([ring.stack_refs(obs_seq), ring.stack_refs(next_seq)])
        row = self.added
        slot = row % self.capacity
        self.refs[slot], self.row_stream[slot] = refs, stream
        self.added += 1
        return row

    def deliverable(self, row: int) -> bool:
        """Whether row ``row`` is in the row ring and none of its frames was
        overwritten."""
        if not max(0, self.added - self.capacity) <= row < self.added:
            return False
        return self.frames.alive(self.refs[row % self.capacity])

    def deliverable_rows(self) -> list[int]:
        """Ids of every deliverable row, oldest first."""
        return [r for r in range(max(0, self.added - self.capacity), self.added)
                if self.deliverable(r)]

    def get(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """The row's ``obs`` and ``next_obs`` stacks, ``(depth, *frame_shape)`` each,
        oldest frame first (copies).

        Raises:
            KeyError: the row is not deliverable.
        """
        if not self.deliverable(row):
            raise KeyError(f"row {row} is not deliverable (overwritten, or one of its "
                           f"frames was)")
        refs = self.refs[row % self.capacity]
        d = self.frames.depth
        return self.frames.gather(refs[:d]), self.frames.gather(refs[d:])

    def stream(self, row: int) -> int:
        """The stream of a deliverable row.

        Raises:
            KeyError: the row is not deliverable.
        """
        if not self.deliverable(row):
            raise KeyError(f"row {row} is not deliverable")
        return int(self.row_stream[row % self.capacity])


def refs_frame_by_frame(known: dict[int, dict[int, tuple[int, int]]], streams: np.ndarray,
                        fps: np.ndarray, horizon: int
                        ) -> tuple[np.ndarray, list[tuple[int, int, int]], np.ndarray,
                                   np.ndarray]:
    """The reference of :meth:`conduit_hpc.storage.frames.FrameWriter._refs`, which
    finds the same: per frame of a batch (its stream and fingerprint), a seq (a
    remembered frame, ``known[stream][fingerprint] = (seq, store row)``, at or past
    ``horizon``) or ``-1 - j`` (the batch's ``j``-th new frame, in order of first
    appearance); the new frames (stream, fingerprint, frame); and the frames whose bytes
    must equal a remembered frame (its store row, >= 0) or an earlier frame ``x`` of the
    batch (``-1 - x``). Looks every frame up in turn."""
    fp_list, st_list = fps.tolist(), streams.tolist()
    pending: dict[tuple[int, int], int] = {}
    r = np.empty(len(fp_list), np.int64)
    fresh: list[tuple[int, int, int]] = []
    check_at: list[int] = []
    check_to: list[int] = []
    for x, (stream, fp) in enumerate(zip(st_list, fp_list, strict=True)):
        hit = known.get(stream, {}).get(fp)
        if hit is not None and hit[0] >= horizon:
            r[x] = hit[0]
            check_at.append(x)
            check_to.append(hit[1])
            continue
        at = pending.get((stream, fp))
        if at is None:
            at = pending[(stream, fp)] = len(fresh)
            fresh.append((stream, fp, x))
        else:
            check_at.append(x)
            check_to.append(-1 - fresh[at][2])
        r[x] = -1 - at
    return r, fresh, np.asarray(check_at, np.int64), np.asarray(check_to, np.int64)
