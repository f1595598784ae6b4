"""Uniform replay: every held row equally likely (mass 1 each), weights of 1."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from conduit_hpc.sampling.base import Sampler, ShardDrawer
from conduit_hpc.sampling.prioritized import TreeDrawer
from conduit_hpc.sampling.stratified import ShardStats

__all__ = ["UniformSampler"]


class UniformSampler(Sampler):
    """``scheduler.sampler = "uniform"``: the prioritized machinery with ``alpha = 0``
    (so laid-end-to-end shards stay one exact uniform draw) and no weights."""

    name = "uniform"

    @property
    def alpha(self) -> float:
        return 0.0

    def drawer(self, columns: Mapping[str, np.ndarray], capacity: int,
               committed: Callable[[], int]) -> ShardDrawer:
        return TreeDrawer()

    def weights(self, mass: np.ndarray, stats: list[ShardStats], superstep: int) -> np.ndarray:
        return np.ones(len(mass), dtype=np.float32)
