"""Prioritized replay (Schaul et al.): rows drawn with probability ``p**alpha / sum``,
weighted by ``(N P(i))**-beta`` with beta annealed over the supersteps."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from conduit_hpc.config.checks import MAX_PRIORITY
from conduit_hpc.errors import SpecError
from conduit_hpc.sampling.base import Draw, Sampler, ShardDrawer, check_update
from conduit_hpc.sampling.stratified import ShardStats, beta_at, importance_weights
from conduit_hpc.storage.priority import PriorityIndex, check_masses

__all__ = ["PrioritizedSampler", "TreeDrawer"]


@functools.lru_cache(maxsize=64)
def _safe_alpha(rows: int) -> float:
    """The exponent from which ``MAX_PRIORITY ** alpha`` over ``rows`` rows may
    overflow float64 (below it a priority update's masses cannot; the check is skipped)."""
    return (math.log(np.finfo(np.float64).max) - math.log(rows)) / math.log(MAX_PRIORITY) - 1e-9


class TreeDrawer(ShardDrawer):
    """Prefix search in the owner's sum-tree."""

    def stats(self, index: PriorityIndex) -> tuple[int, float, float, float]:
        count = index.count  # a scan of every slot's generation: once
        return count, index.total, index.min.min if count else np.inf, index.max_priority

    def draw(self, index: PriorityIndex, targets: np.ndarray) -> Draw:
        """Rows for ``targets`` (mass offsets over the total the learner read); a target
        at or past the current total (the tree lost mass since: rows hidden, priorities
        lowered) is slot -1, drawn again over the current total, never clipped onto the
        last row with mass (which then took every such draw)."""
        n = len(targets)
        total = index.total
        if total <= 0:
            return np.full(n, -1, np.int64), np.zeros(n, np.int64), np.zeros(n)
        slots = index.sum.prefix_search(targets)
        gens, mass = index.gens[slots], index.sum[slots]  # fancy indexing: copies
        past = np.asarray(targets) >= total
        if past.any():
            slots[past], gens[past], mass[past] = -1, 0, 0.0
        return slots, gens, mass

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
        #: priority_exponent 0 is uniform (every mass 1): priorities are not applied
        self.applies_priorities = self._alpha > 0
        self.beta, self.beta_final = float(beta), float(beta_final)
        self.beta_anneal_supersteps = int(beta_anneal_supersteps)

    @property
    def alpha(self) -> float:
        return self._alpha

    def check_update(self, indices: Any, priorities: Any,
                     capacities: Mapping[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """:func:`~conduit_hpc.sampling.check_update`, and a priority whose
        ``priority ** alpha`` over the shards read could overflow the sum-tree's float64
        totals is refused here, on the learner, before anything is sent (the owner
        would refuse it otherwise, on its own rank); so is a positive priority whose
        ``priority ** alpha`` underflows to 0 (:meth:`check_masses`).

        Raises:
            SpecError: see :func:`~conduit_hpc.sampling.check_update`.
        """
        idx, p = check_update(indices, priorities, capacities)
        self.check_masses(p)
        rows = max(1, sum(capacities.values()))
        # priorities are <= MAX_PRIORITY (check_priorities): below this exponent no mass
        # over these rows can overflow, and no priority needs a look
        if len(p) and self._alpha > 0 and self._alpha >= _safe_alpha(rows):
            top = float(p.max())
            with np.errstate(over="ignore"):
                mass = np.power(top, self._alpha) * rows
            if not np.isfinite(mass):
                limit = (np.finfo(np.float64).max / rows) ** (1 / self._alpha)
                raise SpecError(f"priorities: {top!r} ** priority_exponent {self._alpha} "
                                f"over {rows} rows overflows float64; expected priorities "
                                f"<= {limit:.3g}")
        return idx, p

    def check_masses(self, priorities: np.ndarray) -> None:
        """A positive priority whose ``priority ** alpha`` underflows to 0 is refused
        (:func:`~conduit_hpc.storage.priority.check_masses`): its row could never be
        drawn."""
        check_masses(priorities, self._alpha)

    def drawer(self, columns: Mapping[str, np.ndarray], capacity: int,
               committed: Callable[[], int]) -> ShardDrawer:
        return TreeDrawer()

    def weights(self, mass: np.ndarray, stats: list[ShardStats], superstep: int) -> np.ndarray:
        beta = beta_at(superstep + self.superstep_offset, self.beta, self.beta_final,
                       self.beta_anneal_supersteps)
        return importance_weights(mass, stats, beta)
