"""The "each frame stored once" reference model (conduit_hpc/storage/frames_reference.py)
against a naive full layout that copies every stack into its row: random interleavings
of streams, episode ends, row adds, and laps of both rings (hypothesis)."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_hpc.storage.frames_reference import FrameReplay, FrameRing


def frame_of(index: int, stream: int) -> np.ndarray:
    """A frame that says which one it is (unique below 65,536 frames)."""
    return np.array([[index & 255, (index >> 8) & 255, stream]], dtype=np.uint8)


class FullLayout:
    """The naive model: every row holds copies of its two stacks."""

    def __init__(self, depth: int, capacity_frames: int, capacity_rows: int) -> None:
        self.depth, self.capacity_frames = depth, capacity_frames
        self.episodes: dict[int, list[tuple[int, np.ndarray]]] = {}
        self.frames = 0
        self.rows: deque[tuple[int, np.ndarray, np.ndarray, int, int]] = deque(
            maxlen=capacity_rows)
        self.added = 0

    def append(self, stream: int, start: bool) -> tuple[int, np.ndarray]:
        index, frame = self.frames, frame_of(self.frames, stream)
        if start or stream not in self.episodes:
            self.episodes[stream] = []
        self.episodes[stream].append((index, frame))
        self.frames += 1
        return index, frame

    def stack(self, ep: list[tuple[int, np.ndarray]], i: int) -> tuple[list[int], np.ndarray]:
        lo = max(0, i - self.depth + 1)
        items = [ep[0]] * (self.depth - (i - lo + 1)) + ep[lo:i + 1]
        return [k for k, _ in items], np.stack([f for _, f in items])

    def add(self, stream: int, i: int, j: int) -> bool:
        """Add the row (frame i -> frame j of the stream's episode); False where a
        frame it needs is gone (the reference model must then refuse it)."""
        ep = self.episodes[stream]
        ki, obs = self.stack(ep, i)
        kj, nxt = self.stack(ep, j)
        oldest = min(ki + kj)
        if oldest < self.frames - self.capacity_frames:
            return False
        self.rows.append((self.added, obs, nxt, oldest, stream))
        self.added += 1
        return True


OPS = st.lists(st.one_of(
    st.tuples(st.just("frame"), st.integers(0, 2), st.integers(0, 5)),  # 0: episode start
    st.tuples(st.just("row"), st.integers(0, 2), st.integers(0, 4), st.integers(1, 3)),
), min_size=20, max_size=150)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, depth=st.integers(1, 4), capacity_frames=st.integers(1, 24),
       capacity_rows=st.integers(1, 8))
def test_the_frame_model_delivers_what_the_full_layout_holds(ops, depth, capacity_frames,
                                                               capacity_rows) -> None:
    ring = FrameRing(capacity_frames, (1, 3), "uint8", depth)
    replay = FrameReplay(ring, capacity_rows)
    naive = FullLayout(depth, capacity_frames, capacity_rows)
    seq_of: dict[int, int] = {}  # naive frame index -> the ring's sequence number
    for op in ops:
        if op[0] == "frame":
            _, stream, start = op
            index, frame = naive.append(stream, start == 0)
            seq_of[index] = ring.append(stream, frame, episode_start=start == 0)
            assert seq_of[index] == index
        else:
            _, stream, back, n = op
            ep = naive.episodes.get(stream, [])
            if len(ep) < 2:
                continue
            j = max(1, len(ep) - 1 - back)
            i = max(0, j - n)
            kept = naive.add(stream, i, j)
            if kept:
                assert replay.add(seq_of[ep[i][0]], seq_of[ep[j][0]]) == naive.added - 1
            else:
                with pytest.raises(KeyError):
                    replay.add(seq_of[ep[i][0]], seq_of[ep[j][0]])
        check(replay, naive)


def check(replay: FrameReplay, naive: FullLayout) -> None:
    held = {row for row, *_ in naive.rows}
    expected = []
    for row, obs, nxt, oldest, stream in naive.rows:
        ok = oldest >= naive.frames - naive.capacity_frames
        assert replay.deliverable(row) == ok, (row, oldest, naive.frames)
        if ok:
            expected.append(row)
            got_obs, got_next = replay.get(row)
            np.testing.assert_array_equal(got_obs, obs)
            np.testing.assert_array_equal(got_next, nxt)
            assert replay.stream(row) == stream
        else:
            with pytest.raises(KeyError):
                replay.get(row)
    assert replay.deliverable_rows() == expected
    for row in range(naive.added):  # rows the row ring overwrote
        if row not in held:
            assert not replay.deliverable(row)
    assert not replay.deliverable(naive.added) and not replay.deliverable(-1)


def test_a_stack_pads_an_episode_start_with_its_first_frame() -> None:
    ring = FrameRing(16, (1,), "int64", depth=4)
    a0 = ring.append(0, np.array([10]), episode_start=True)
    b0 = ring.append(1, np.array([20]), episode_start=True)
    ring.append(0, np.array([11]), episode_start=False)
    a2 = ring.append(0, np.array([12]), episode_start=False)
    b1 = ring.append(1, np.array([21]), episode_start=False)
    a3 = ring.append(0, np.array([30]), episode_start=True)  # a new episode of stream 0
    replay = FrameReplay(ring, 4)
    r0 = replay.add(a0, a2)
    obs, nxt = replay.get(r0)
    assert obs.ravel().tolist() == [10, 10, 10, 10]
    assert nxt.ravel().tolist() == [10, 10, 11, 12]
    obs, nxt = replay.get(replay.add(b0, b1))
    assert obs.ravel().tolist() == [20] * 4 and nxt.ravel().tolist() == [20, 20, 20, 21]
    assert ring.stack_refs(a3).tolist() == [a3] * 4


def test_refusals() -> None:
    ring = FrameRing(3, (2,), "uint8", depth=2)
    with pytest.raises(ValueError, match="shape"):
        ring.append(0, np.zeros(3, np.uint8), episode_start=True)
    s = [ring.append(k % 2, np.full(2, k, np.uint8), episode_start=k < 2) for k in range(4)]
    replay = FrameReplay(ring, 2)
    with pytest.raises(ValueError, match="later frame"):
        replay.add(s[3], s[1])  # stream 1, backwards
    with pytest.raises(ValueError, match="later frame"):
        replay.add(s[2], s[3])  # two streams
    with pytest.raises(KeyError, match="not held"):
        replay.add(s[0], s[2])  # frame 0 was overwritten
    row = replay.add(s[1], s[3])
    ring.append(1, np.full(2, 9, np.uint8), episode_start=False)  # overwrites frame 1
    assert not replay.deliverable(row)
    with pytest.raises(KeyError, match="not deliverable"):
        replay.get(row)
    for bad in [(0, (2,), 1), (3, (2,), 0)]:
        with pytest.raises(ValueError):
            FrameRing(*bad[:2], depth=bad[2])
    with pytest.raises(ValueError):
        FrameReplay(ring, 0)
