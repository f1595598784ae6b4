"""The bytes side of storing each frame once: a 64-bit fingerprint per frame
(:func:`fingerprints`), frames as words (:func:`frame_words`) and the store of the
frames a :class:`~conduit_hpc.storage.frames.FrameWriter` remembers
(:class:`FrameStore`), against whose bytes every reference is checked. Plain numpy
(numba kernels where there); no MPI; local."""

from __future__ import annotations

import math

import numpy as np

from conduit_hpc.storage import tree_kernels

__all__ = ["FrameStore", "fingerprints", "frame_words"]

_MULTIPLIERS: dict[int, np.ndarray] = {}


def fingerprints(frames: np.ndarray, *, compiled: bool = True) -> np.ndarray:
    """A 64-bit fingerprint per frame (``frames``: ``[m, ...]``, C-contiguous): a sum of
    the frame's words times fixed random odd multipliers, modulo 2**64. Only a hint: equal
    frames have equal fingerprints; equal fingerprints are checked byte for byte.
    ``compiled``: one compiled loop where numba is there (the same sum), else numpy's
    uint64 matmul (the reference)."""
    m = len(frames)
    words = frame_words(frames)
    n_words = int(words.shape[1])
    mult = _MULTIPLIERS.get(n_words)
    if mult is None:
        odd = np.random.default_rng(0x5EED).integers(0, 1 << 63, n_words,
                                                     dtype=np.uint64) * 2 + 1
        mult = _MULTIPLIERS[n_words] = np.asarray(odd, np.uint64)
    k = tree_kernels.kernel("fingerprint") if compiled else None
    if k is not None and m:
        out = np.empty(m, np.uint64)
        k(np.ascontiguousarray(words), mult, out)  # the same modular sum, compiled
        return out
    return np.asarray(words.astype(np.uint64, copy=False) @ mult, np.uint64)


def frame_words(frames: np.ndarray) -> np.ndarray:
    """``frames`` (``[m, ...]``, C-contiguous) as ``[m, words]`` of the widest unsigned
    integer whose size divides a frame's bytes (the byte check compares words)."""
    size = math.prod(frames.shape[1:]) * frames.dtype.itemsize  # (np.prod: ~5 us)
    raw = frames.view(np.uint8).reshape(len(frames), size)  # [0, size] too
    w = next(k for k in (8, 4, 2, 1) if size % k == 0)
    return raw.view(f"<u{w}")


class FrameStore:
    """The frames a :class:`FrameWriter` remembers for one group: rows of one array
    (grown by doubling), so that a batch's byte check reads them in one compiled pass
    (or one numpy take) instead of stacking a copy of each."""

    def __init__(self) -> None:
        self.data: np.ndarray | None = None  # [rows, words] of frame_words' dtype
        self.free: list[int] = []

    def put(self, words: np.ndarray) -> list[int]:
        """Remember ``words`` (``[n, frame words]``); returns their rows."""
        n = len(words)
        if self.data is None:  # a group's frames keep their shape: set once
            self.data = np.empty((0, *words.shape[1:]), words.dtype)
        if len(self.free) < n:
            old = len(self.data)
            size = max(64, 2 * old, old + n - len(self.free))
            grown = np.empty((size, *words.shape[1:]), words.dtype)
            grown[:old] = self.data
            self.data = grown
            self.free.extend(range(size - 1, old - 1, -1))
        rows = [self.free.pop() for _ in range(n)]
        if n:
            self.data[np.asarray(rows, np.int64)] = words
        return rows

    def drop(self, row: int) -> None:
        """Row ``row`` no longer holds a remembered frame: hand it out again."""
        self.free.append(row)
