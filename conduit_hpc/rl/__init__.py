"""DQN building blocks (pure torch/numpy; no MPI, no data plane).

The single-process baseline and the distributed Ape-X-style job share every piece:
:class:`QNetwork` (:class:`NatureQNetwork` for Atari frames), the epsilon ladder, the
n-step accumulator, the double-DQN loss, actor-side initial priorities and the
hyperparameters (:class:`DQNSection`; :class:`AtariSection` for an ALE game's
preprocessing).
Importing this package imports torch.
"""

from conduit_hpc.rl.apex import ActorStep, ApexActor
from conduit_hpc.rl.atari import AtariSection, make_atari_vector_env
from conduit_hpc.rl.dqn import DQNSection, make_vector_env, train_single_process, updates_due
from conduit_hpc.rl.episodes import (
    EPISODE_COLUMNS,
    EPISODES_TAG,
    EpisodeLog,
    has_episodes,
    merge_episode_files,
)
from conduit_hpc.rl.exploration import epsilon_greedy, epsilon_ladder
from conduit_hpc.rl.losses import (
    double_dqn_loss,
    double_dqn_targets,
    initial_priorities,
    to_tensors,
)
from conduit_hpc.rl.nstep import NStepAccumulator, describe_transitions, true_next_obs
from conduit_hpc.rl.qnet import NatureQNetwork, QNetwork, copy_weights, sync_target
from conduit_hpc.rl.replay import PrioritizedReplay, ReplaySample
from conduit_hpc.rl.section import check_actor_batch, check_dqn_launch
from conduit_hpc.rl.updater import DQNUpdater

__all__ = [
    "EPISODES_TAG",
    "EPISODE_COLUMNS",
    "ActorStep",
    "ApexActor",
    "AtariSection",
    "DQNSection",
    "DQNUpdater",
    "EpisodeLog",
    "NStepAccumulator",
    "NatureQNetwork",
    "PrioritizedReplay",
    "QNetwork",
    "ReplaySample",
    "check_actor_batch",
    "check_dqn_launch",
    "copy_weights",
    "describe_transitions",
    "double_dqn_loss",
    "double_dqn_targets",
    "epsilon_greedy",
    "epsilon_ladder",
    "has_episodes",
    "initial_priorities",
    "make_atari_vector_env",
    "make_vector_env",
    "merge_episode_files",
    "sync_target",
    "to_tensors",
    "train_single_process",
    "true_next_obs",
    "updates_due",
]
