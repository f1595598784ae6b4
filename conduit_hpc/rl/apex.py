"""The two halves of an Ape-X-style DQN, without the data plane between them.

:class:`ApexActor` is one actor's share of the environments: it steps ``k`` vectorised
envs with its slice of the epsilon ladder (slots ``a*k .. a*k+k-1`` of
``DQNSection.num_envs``), turns the steps into n-step transitions, gives them initial
priorities ``|TD|`` from its copy of the network (and of the target network, which it
refreshes when the learner's does), and logs finished episodes. :class:`DQNUpdater` is
the learner's side: the online and target networks, Adam, the importance-weighted
double-DQN loss, gradient clipping and target syncs.

The distributed jobs (``jobs/dqn_cartpole.py``, ``jobs/longhaul_dqn.py``) put the data
plane between the two; the single-process baseline uses :class:`DQNUpdater` with an
in-process replay. Plain torch/numpy: no MPI, no ``torch.distributed``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from conduit_hpc.rl.dqn import DQNSection, make_vector_env
from conduit_hpc.rl.episodes import EpisodeLog
from conduit_hpc.rl.exploration import epsilon_greedy
from conduit_hpc.rl.losses import FIELDS, initial_priorities
from conduit_hpc.rl.nstep import NStepAccumulator, true_next_obs
from conduit_hpc.rl.qnet import copy_weights
from conduit_hpc.rl.updater import DQNUpdater

__all__ = ["ActorStep", "ApexActor", "DQNUpdater"]


class ActorStep(NamedTuple):
    """What one :meth:`ApexActor.step` produced.

    Attributes:
        rows (dict[str, np.ndarray]): n-step transitions (the five DQN columns, and the
            stream column when asked for; may be empty).
        priorities (np.ndarray): float64 initial priority per row.
        returns (list[float]): returns of the episodes that ended at this step.
        scored (list[bool]): per ended episode, whether its env slot is scored
            (``DQNSection.scored_slots``).
    """

    rows: dict[str, np.ndarray]
    priorities: np.ndarray
    returns: list[float]
    scored: list[bool]


class ApexActor:
    """One actor's environments, exploration, n-step returns and initial priorities.

    Not collective; not thread-safe; :meth:`step` blocks only for the env step.

    Args:
        hp (DQNSection): the hyperparameters; ``hp.num_envs`` is the ladder's length
            over all actors.
        net (nn.Module): the actor's Q network (the data plane loads the learner's
            weights into it).
        actor_index (int): this actor's index among the actors (0-based).
        envs_per_actor (int): environments this actor steps (``k``).
        seed (int): seeds the envs (``seed .. seed+k-1``) and the exploration.
        episodes_path (str | Path | None): this actor's ``episodes*.csv`` (None: none).
        actor_id (int): written in the ``actor`` column (e.g. the world rank).
        t0 (float | None): ``time.perf_counter()`` origin of the ``time_s`` column.
        make_env (callable | None): ``make_env(num_envs, seed) -> (env, first_obs)``, a
            Gymnasium vector env in ``SAME_STEP`` autoreset mode (default:
            :func:`make_vector_env` of ``hp.env_id``; Atari:
            :func:`~conduit_hpc.rl.atari.make_atari_vector_env`).
        obs_dtype (str): dtype of the observation columns (``uint8`` for pixels).
        reward_clip (float): rewards enter the n-step returns clipped to
            ``[-reward_clip, reward_clip]`` (0: unclipped); episode returns stay raw.
        stream_field (str): when set, rows also carry this column: the env slot each row
            came from over all actors (``actor_index * k + env``), the stream of a
            frame-stack declaration (``[spec.obs] stack``).
        stream_dtype (str): the integer type of that column (the spec field's; it must
            hold ``hp.num_envs - 1``).

    Raises:
        ValueError: the actor's slots do not fit in ``hp.num_envs``, ``reward_clip`` is
            not a finite number >= 0, or ``stream_dtype`` cannot hold every env slot.
    """

    def __init__(self, hp: DQNSection, net: nn.Module, *, actor_index: int,
                 envs_per_actor: int, seed: int, episodes_path: str | Path | None = None,
                 actor_id: int = 0, t0: float | None = None,
                 make_env: Callable[[int, int], tuple[Any, np.ndarray]] | None = None,
                 obs_dtype: str = "float32", reward_clip: float = 0.0,
                 stream_field: str = "", stream_dtype: str = "int64") -> None:
        k, a = envs_per_actor, actor_index
        if k < 1 or a < 0 or (a + 1) * k > hp.num_envs:
            raise ValueError(f"actor {a} with {k} envs needs slots {a * k}..{(a + 1) * k - 1}"
                             f", but dqn.num_envs = {hp.num_envs}")
        if not (isinstance(reward_clip, int | float) and 0 <= reward_clip < np.inf):
            # -1 or NaN left the rewards unclipped, silently
            raise ValueError(f"reward_clip must be a finite number >= 0 (0: unclipped), got "
                             f"{reward_clip!r}")
        sdt = np.dtype(stream_dtype)
        if stream_field and (sdt.kind not in "iu" or np.iinfo(sdt).max < hp.num_envs - 1):
            # the env slots were cast with astype: 300 wrapped to 44 in uint8
            raise ValueError(f"stream_dtype must be an integer type that holds env slot "
                             f"{hp.num_envs - 1} (dqn.num_envs - 1), got {sdt.name}")
        self.hp, self.net, self.k = hp, net, k
        made: tuple[Any, np.ndarray] = (make_env(k, seed) if make_env is not None
                                        else make_vector_env(hp.env_id, k, seed))
        self.env, self.obs = made
        self.reward_clip = float(reward_clip)
        self.stream_field, self.first_slot = stream_field, a * k
        self.stream_dtype = np.dtype(stream_dtype)
        self.rng = np.random.default_rng(seed)
        self.epsilons = hp.epsilons()[a * k:(a + 1) * k]
        self.scored = hp.scored_slots()[a * k:(a + 1) * k]
        self.nstep = NStepAccumulator(k, hp.n_step, hp.gamma, obs_dtype)
        self.episodes = EpisodeLog(k, actor=actor_id, path=episodes_path, window=hp.window,
                                   t0=t0, epsilons=self.epsilons, scored=self.scored)
        # the target network follows the learner's: the weights published at its last
        # multiple of hp.target_period, so that initial priorities are the same
        # double-DQN |TD| the learner sends back (on the same scale)
        self.target = copy.deepcopy(net)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self._target_epoch = 0
        self.env_steps = 0

    def weights_loaded(self, policy_version: int) -> None:
        """Tell the actor that ``net`` now holds the learner's weights of superstep
        ``policy_version``; refreshes the target copy when the learner's target synced
        since the last refresh."""
        epoch = max(policy_version, 0) // self.hp.target_period
        if epoch != self._target_epoch:
            self._target_epoch = epoch
            copy_weights(self.net, self.target)

    def step(self) -> ActorStep:
        """Act in every env (epsilon-greedy on ``net``), step them, and return the
        completed n-step transitions with initial priorities and the ended episodes."""
        with torch.no_grad():
            q = self.net(torch.as_tensor(self.obs, dtype=torch.float32)).numpy()
        action = epsilon_greedy(q, self.epsilons, self.rng)
        next_obs, reward, term, trunc, info = self.env.step(action)
        self.env_steps += self.k
        clipped = (np.clip(reward, -self.reward_clip, self.reward_clip)
                   if self.reward_clip > 0 else reward)
        rows = self.nstep.push(self.obs, action, clipped, true_next_obs(next_obs, info),
                               term, trunc)
        self.obs = next_obs
        returns = self.episodes.step(reward, term | trunc, self.env_steps)
        scored = [bool(self.scored[e]) for e in np.flatnonzero(term | trunc)]  # in order
        batch = {f: rows[f] for f in FIELDS}
        prio = (initial_priorities(self.net, batch, target=self.target)
                if len(batch["action"]) else np.zeros(0))
        if self.stream_field:
            batch[self.stream_field] = (rows["env"] + self.first_slot).astype(
                self.stream_dtype)
        return ActorStep(batch, prio, returns, scored)

    def close(self) -> None:
        """Close the envs and the episode file (idempotent)."""
        self.episodes.close()
        self.env.close()
