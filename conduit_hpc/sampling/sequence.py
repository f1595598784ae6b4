"""Sequence replay: windows of ``burn_in + sequence_length`` consecutive rows of one
stream, uniform over the valid window starts, weights of 1 (R2D2-style)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from conduit_hpc.sampling.base import Draw, Sampler, ShardDrawer
from conduit_hpc.sampling.stratified import ShardStats
from conduit_hpc.sampling.windows import valid_sequence_starts
from conduit_hpc.storage.priority import PriorityIndex

__all__ = ["SequenceSampler", "WindowDrawer"]


class WindowDrawer(ShardDrawer):
    """The valid window starts of one shard, recomputed at most every ``refresh_s``.

    Args:
        columns (Mapping[str, np.ndarray]): the shard's field arrays.
        capacity (int): slots in the ring.
        committed (Callable[[], int]): the shard's commit cursor.
        length (int): rows per window.
        episode_field, stream_field (str): fields marking episode ends and streams.
        cross_episode (bool): windows may span episode ends.
        refresh_s (float): cache lifetime of the starts.
    """

    def __init__(self, columns: Mapping[str, np.ndarray], capacity: int,
                 committed: Callable[[], int], *, length: int, episode_field: str,
                 stream_field: str, cross_episode: bool, refresh_s: float = 0.02) -> None:
        self.columns, self.capacity, self.committed = columns, capacity, committed
        self.length = length
        self.episode_field, self.stream_field = episode_field, stream_field
        self.cross_episode, self.refresh_s = cross_episode, refresh_s
        self._starts = np.zeros(0, np.int64)
        self._at = -1.0

    def starts(self, index: PriorityIndex, force: bool = False) -> np.ndarray:
        """Seqs that start a valid window (cached briefly)."""
        now = time.monotonic()
        if not force and now - self._at < self.refresh_s:
            return self._starts
        cap = self.capacity
        commit = self.committed()
        seqs = np.arange(max(0, commit - cap), commit, dtype=np.int64)
        slots = seqs % cap
        held = index.gens[slots] == seqs + 1
        ends = (self.columns[self.episode_field][slots].astype(bool)
                if self.episode_field else None)
        stream = self.columns[self.stream_field][slots] if self.stream_field else None
        ok = valid_sequence_starts(held, self.length, episode_end=ends, stream=stream,
                                   cross_episode=self.cross_episode)
        self._starts, self._at = seqs[ok] if len(seqs) else ok, now
        return self._starts

    def changed(self) -> None:
        self._at = -1.0

    def stats(self, index: PriorityIndex) -> tuple[int, float, float, float]:
        n = len(self.starts(index))
        return n, float(n), 1.0, index.max_priority

    def draw(self, index: PriorityIndex, targets: np.ndarray) -> Draw:
        starts = self.starts(index)
        n = len(targets)
        if len(starts) == 0:
            return np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n)
        # a target at or past the current starts (windows cut since the learner read
        # their count) is slot -1, drawn again: never clipped onto the last window
        at = np.asarray(targets).astype(np.int64)
        past = at >= len(starts)
        pick = starts[np.clip(at, 0, len(starts) - 1)]
        slots, gens, mass = pick % self.capacity, pick + 1, np.ones(len(pick))
        if past.any():
            slots[past], gens[past], mass[past] = -1, 0, 0.0
        return slots, gens, mass

    def span(self, index: PriorityIndex) -> float:
        return float(len(self.starts(index)))


class SequenceSampler(Sampler):
    """``scheduler.sampler = "sequence"``.

    Args:
        window (int): rows per item (``burn_in + sequence_length``).
        episode_field, stream_field (str), cross_episode (bool): see ``[scheduler]``.
        alpha (float): the owners' index exponent (priorities are kept, not sampled by).
    """

    name = "sequence"

    def __init__(self, *, batch_rows: int, seed: int, window: int, episode_field: str,
                 stream_field: str, cross_episode: bool, alpha: float) -> None:
        super().__init__(batch_rows=batch_rows, seed=seed)
        self.window = int(window)
        self.episode_field, self.stream_field = episode_field, stream_field
        self.cross_episode = cross_episode
        self._alpha = float(alpha)

    @property
    def alpha(self) -> float:
        return self._alpha

    def drawer(self, columns: Mapping[str, np.ndarray], capacity: int,
               committed: Callable[[], int]) -> ShardDrawer:
        return WindowDrawer(columns, capacity, committed, length=self.window,
                            episode_field=self.episode_field, stream_field=self.stream_field,
                            cross_episode=self.cross_episode)

    def weights(self, mass: np.ndarray, stats: list[ShardStats], superstep: int) -> np.ndarray:
        return np.ones(len(mass), dtype=np.float32)
