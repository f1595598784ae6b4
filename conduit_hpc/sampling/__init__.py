"""Sampling: the :class:`Sampler` strategies (one file each) and their numpy pieces.

``scheduler.sampler`` names the strategy; :func:`make_sampler` builds it from the
config (the only place that looks at the name). Plain numpy; no MPI.
"""

from __future__ import annotations

from conduit_hpc.config import Config
from conduit_hpc.sampling.base import Draw, Sampler, ShardDrawer, check_update
from conduit_hpc.sampling.nstep import nstep_returns, nstep_transform
from conduit_hpc.sampling.prioritized import PrioritizedSampler, TreeDrawer
from conduit_hpc.sampling.sequence import SequenceSampler, WindowDrawer
from conduit_hpc.sampling.stratified import (
    ShardStats,
    allocate_targets,
    beta_at,
    importance_weights,
)
from conduit_hpc.sampling.uniform import UniformSampler
from conduit_hpc.sampling.windows import valid_sequence_starts

__all__ = [
    "SAMPLERS",
    "Draw",
    "PrioritizedSampler",
    "Sampler",
    "SequenceSampler",
    "ShardDrawer",
    "ShardStats",
    "TreeDrawer",
    "UniformSampler",
    "WindowDrawer",
    "allocate_targets",
    "applies_priorities",
    "beta_at",
    "check_update",
    "importance_weights",
    "make_sampler",
    "nstep_returns",
    "nstep_transform",
    "valid_sequence_starts",
]


def _uniform(config: Config, seed: int) -> Sampler:
    return UniformSampler(batch_rows=config.scheduler.batch_rows, seed=seed)


def _prioritized(config: Config, seed: int) -> Sampler:
    s = config.scheduler
    return PrioritizedSampler(batch_rows=s.batch_rows, seed=seed,
                              alpha=config.storage.priority_exponent, beta=s.beta,
                              beta_final=s.beta_final,
                              beta_anneal_supersteps=s.beta_anneal_supersteps)


def _sequence(config: Config, seed: int) -> Sampler:
    s = config.scheduler
    return SequenceSampler(batch_rows=s.batch_rows, seed=seed, window=s.window,
                           episode_field=s.episode_field, stream_field=s.stream_field,
                           cross_episode=s.cross_episode,
                           alpha=config.storage.priority_exponent)


#: ``scheduler.sampler`` -> builder
SAMPLERS = {"uniform": _uniform, "prioritized": _prioritized, "sequence": _sequence}


def make_sampler(config: Config, seed: int) -> Sampler:
    """The sampler ``scheduler.sampler`` names, seeded with ``seed``."""
    return SAMPLERS[config.scheduler.sampler](config, seed)


def applies_priorities(config: Config) -> bool:
    """Whether the sampler ``scheduler.sampler`` names applies the priorities actors and
    learners give (:attr:`Sampler.applies_priorities`). Local; pure."""
    return make_sampler(config, 0).applies_priorities
