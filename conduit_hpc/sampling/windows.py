"""Sequence windows: which positions start a valid window of consecutive rows."""

from __future__ import annotations

import numpy as np

__all__ = ["valid_sequence_starts"]


def valid_sequence_starts(held: np.ndarray, length: int, *, episode_end: np.ndarray | None,
                          stream: np.ndarray | None, cross_episode: bool = False
                          ) -> np.ndarray:
    """Positions ``s`` such that rows ``s .. s+length-1`` (in sequence order) form a
    valid window.

    A window is valid when every row is held, every row comes from the same stream
    (e.g. the same actor), and - unless ``cross_episode`` - no row but the last ends an
    episode.

    Args:
        held (np.ndarray): bool per position, whether a committed row is held there.
        length (int): window length (>= 1).
        episode_end (np.ndarray | None): bool per position, the row ends an episode.
        stream (np.ndarray | None): stream id per position.
        cross_episode (bool): allow windows that span episode ends.

    Returns:
        np.ndarray: int64 start positions, ascending.
    """
    held = np.asarray(held, dtype=bool)
    n = len(held)
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length!r}")
    if n < length:
        return np.zeros(0, dtype=np.int64)
    starts = n - length + 1

    def window_all(ok: np.ndarray, span: int) -> np.ndarray:
        # ok[s .. s+span-1] all true, for s in [0, starts)
        if span <= 0:
            return np.ones(starts, dtype=bool)
        bad = np.concatenate(([0], np.cumsum(~ok)))
        return (bad[span:span + starts] - bad[:starts]) == 0

    valid = window_all(held, length)
    if stream is not None and length > 1:
        s = np.asarray(stream)
        same = s[1:] == s[:-1]  # position j: rows j and j+1 share a stream
        valid &= window_all(same, length - 1)
    if episode_end is not None and not cross_episode and length > 1:
        e = np.asarray(episode_end, dtype=bool)
        valid &= window_all(~e[:-1], length - 1)
    return np.flatnonzero(valid).astype(np.int64)
