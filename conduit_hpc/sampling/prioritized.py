"""Prioritized replay (Schaul et al.): rows drawn with probability ``p**alpha / sum``,
weighted by ``(N P(i))**-beta`` with beta annealed over the supersteps."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from conduit_hpc.sampling.base import Draw, Sampler, ShardDrawer
from conduit_hpc.sampling.stratified import ShardStats, beta_at, importance_weights
from conduit_hpc.storage.priority import PriorityIndex

__all__ = ["PrioritizedSampler", "TreeDrawer"]


class TreeDrawer(ShardDrawer):
    """Prefix search in the owner's sum-tree."""

    def stats(self, index: PriorityIndex) -> tuple[int, float, float, float]:
        count = index.count  # a scan of every slot's generation: once
        return count, index.total, index.min.min if count else np.inf, index.max_priority

    def draw(self, index: PriorityIndex, targets: np.ndarray) -> Draw:
        n = len(targets)
        if index.total <= 0:
            return np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n)
        slots = index.sum.prefix_search(targets)
        return slots, index.gens[slots].copy(), index.sum[slots].copy()

    def span(self, index: PriorityIndex) -> float:
        return index.total


class PrioritizedSampler(Sampler):
    """``scheduler.sampler = "prioritized"``.

    Args:
        alpha (float): ``storage.priority_exponent``.
        beta, beta_final (float), beta_anneal_supersteps (int): the weight exponent's
            linear schedule (``scheduler.beta*``).
    """

    name = "prioritized"

    def __init__(self, *, batch_rows: int, seed: int, alpha: float, beta: float,
                 beta_final: float, beta_anneal_supersteps: int) -> None:
        super().__init__(batch_rows=batch_rows, seed=seed)
        self._alpha = float(alpha)
        self.beta, self.beta_final = float(beta), float(beta_final)
        self.beta_anneal_supersteps = int(beta_anneal_supersteps)

    @property
    def alpha(self) -> float:
        return self._alpha

    def drawer(self, columns: Mapping[str, np.ndarray], capacity: int,
               committed: Callable[[], int]) -> ShardDrawer:
        return TreeDrawer()

    def weights(self, mass: np.ndarray, stats: list[ShardStats], superstep: int) -> np.ndarray:
        beta = beta_at(superstep + self.superstep_offset, self.beta, self.beta_final,
                       self.beta_anneal_supersteps)
        return importance_weights(mass, stats, beta)
