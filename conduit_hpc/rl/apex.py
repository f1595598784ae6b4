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
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from conduit_hpc.rl.dqn import DQNSection, make_vector_env
from conduit_hpc.rl.episodes import EpisodeLog
from conduit_hpc.rl.exploration import epsilon_greedy
from conduit_hpc.rl.losses import FIELDS, double_dqn_loss, initial_priorities, to_tensors
from conduit_hpc.rl.nstep import NStepAccumulator, true_next_obs
from conduit_hpc.rl.qnet import copy_weights, sync_target

__all__ = ["ActorStep", "ApexActor", "DQNUpdater"]


class ActorStep(NamedTuple):
    """What one :meth:`ApexActor.step` produced.

    Attributes:
        rows (dict[str, np.ndarray]): n-step transitions (the five DQN columns; may be
            empty).
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

    Raises:
        ValueError: the actor's slots do not fit in ``hp.num_envs``.
    """

    def __init__(self, hp: DQNSection, net: nn.Module, *, actor_index: int,
                 envs_per_actor: int, seed: int, episodes_path: str | Path | None = None,
                 actor_id: int = 0, t0: float | None = None) -> None:
        k, a = envs_per_actor, actor_index
        if k < 1 or a < 0 or (a + 1) * k > hp.num_envs:
            raise ValueError(f"actor {a} with {k} envs needs slots {a * k}..{(a + 1) * k - 1}"
                             f", but dqn.num_envs = {hp.num_envs}")
        self.hp, self.net, self.k = hp, net, k
        self.env, self.obs = make_vector_env(hp.env_id, k, seed)
        self.rng = np.random.default_rng(seed)
        self.epsilons = hp.epsilons()[a * k:(a + 1) * k]
        self.scored = hp.scored_slots()[a * k:(a + 1) * k]
        self.nstep = NStepAccumulator(k, hp.n_step, hp.gamma)
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
        rows = self.nstep.push(self.obs, action, reward, true_next_obs(next_obs, info),
                               term, trunc)
        self.obs = next_obs
        returns = self.episodes.step(reward, term | trunc, self.env_steps)
        scored = ([bool(self.scored[e]) for e in self.episodes.envs[-len(returns):]]
                  if returns else [])
        batch = {f: rows[f] for f in FIELDS}
        prio = (initial_priorities(self.net, batch, target=self.target)
                if len(batch["action"]) else np.zeros(0))
        return ActorStep(batch, prio, returns, scored)

    def close(self) -> None:
        """Close the envs and the episode file (idempotent)."""
        self.episodes.close()
        self.env.close()


class DQNUpdater:
    """The learner's double-DQN update with importance weights and target syncs.

    Not collective; :meth:`update` blocks for one forward/backward/step on ``online``'s
    device.

    Args:
        hp (DQNSection): lr, huber_delta, max_grad_norm, target_period.
        online (nn.Module): the network being trained (already on its device).
    """

    def __init__(self, hp: DQNSection, online: nn.Module) -> None:
        self.hp, self.online = hp, online
        self.target = copy.deepcopy(online)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.opt = torch.optim.Adam(online.parameters(), lr=hp.lr)
        self.updates = 0
        self.device = next(online.parameters()).device

    def update(self, batch: Mapping[str, np.ndarray | torch.Tensor],
               weights: torch.Tensor | np.ndarray | None) -> tuple[float, torch.Tensor]:
        """One gradient step on ``batch`` (the five DQN columns); the target network
        syncs every ``hp.target_period`` updates.

        Returns:
            tuple[float, torch.Tensor]: the loss and the detached per-row TD errors.
        """
        w = None if weights is None else torch.as_tensor(weights, device=self.device).float()
        loss, td = double_dqn_loss(self.online, self.target, to_tensors(batch, self.device),
                                   w, self.hp.huber_delta)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.hp.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.hp.max_grad_norm)
        self.opt.step()
        self.updates += 1
        if self.updates % self.hp.target_period == 0:
            sync_target(self.online, self.target)
        return float(loss.detach()), td

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The online and target networks and Adam's moments as named numeric arrays
        (a checkpoint's ``extra_state``; no pickle). Not collective."""
        out: dict[str, np.ndarray] = {}
        for prefix, net in (("online", self.online), ("target", self.target)):
            for name, t in net.state_dict().items():
                out[f"{prefix}/{name}"] = t.detach().cpu().numpy().copy()
        for i, st in self.opt.state_dict()["state"].items():
            for name, t in st.items():
                out[f"adam/{i}/{name}"] = torch.as_tensor(t).detach().cpu().numpy().copy()
        out["updates"] = np.array([self.updates], dtype=np.int64)
        return out

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`state_arrays` wrote (same architecture). Not collective.

        Raises:
            KeyError: an array of the networks is missing (the message names it).
        """
        for prefix, net in (("online", self.online), ("target", self.target)):
            state = {}
            for name, t in net.state_dict().items():
                key = f"{prefix}/{name}"
                if key not in arrays:
                    raise KeyError(f"checkpoint state lacks {key!r}")
                state[name] = torch.tensor(np.asarray(arrays[key]), dtype=t.dtype,
                                           device=t.device)
            net.load_state_dict(state)
        sd = self.opt.state_dict()
        moments: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in arrays.items():
            parts = key.split("/")
            if parts[0] == "adam" and len(parts) == 3:
                t = torch.tensor(np.asarray(value))  # a copy: never share memory
                if parts[2] != "step":
                    t = t.to(self.device)
                moments.setdefault(int(parts[1]), {})[parts[2]] = t
        if moments:
            sd["state"] = moments
            self.opt.load_state_dict(sd)
        if "updates" in arrays:
            self.updates = int(np.asarray(arrays["updates"]).reshape(-1)[0])

    def warm_up(self) -> None:
        """One Adam step on a throwaway parameter: torch imports for seconds at the
        first optimizer step, which should not land in the first timed superstep."""
        w = torch.zeros(1, requires_grad=True)
        opt = torch.optim.Adam([w])
        (w * 2).sum().backward()
        opt.step()
