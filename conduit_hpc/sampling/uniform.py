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
    (so laid-end-to-end shards stay one exact uniform draw) and no weights. Priorities
    given at ingest or by ``update_priorities`` are checked, then dropped
    (:attr:`~conduit_hpc.sampling.Sampler.applies_priorities`): every held row has mass
    1."""

    name = "uniform"
    #: priorities never change what is drawn (as TorchRL's and Reverb's uniform
    #: samplers ignore them): a row given priority 0 stays as likely as any other
    applies_priorities = False

    @property
    def alpha(self) -> float:
        return 0.0

    def drawer(self, columns: Mapping[str, np.ndarray], capacity: int,
               committed: Callable[[], int]) -> ShardDrawer:
        return TreeDrawer()

    def weights(self, mass: np.ndarray, stats: list[ShardStats], superstep: int) -> np.ndarray:
        return np.ones(len(mass), dtype=np.float32)
