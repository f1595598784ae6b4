"""Actor-side n-step returns from vectorised environments.

:class:`NStepAccumulator` turns the 1-step transitions of ``E`` lock-stepped environments
into n-step transitions ``(obs, action, reward, next_obs, discount)`` where

* ``reward`` is the discounted sum ``r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}``,
* ``next_obs`` is the observation ``k`` steps later (the *final* observation when the
  episode ended inside the window),
* ``discount`` is ``g^k * (1 - terminated)``: zero after a true termination, so the
  learner does not bootstrap, but ``g^k`` after a truncation (a time limit), so that
  it bootstraps from the final observation as the Markov property asks,

with ``k = n`` in the steady state and ``k < n`` for the last transitions of an episode,
which are flushed when the episode ends. The learner's target is then
``reward + discount * Q_target(next_obs, argmax_a Q(next_obs, a))``.

:func:`true_next_obs` recovers the final observation from a Gymnasium vector env in
``SAME_STEP`` autoreset mode, where the returned observation of a finished env is
already the first of its next episode. Pure numpy; no torch, no MPI.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from conduit_hpc.config import FieldConfig

__all__ = ["NStepAccumulator", "describe_transitions", "true_next_obs"]


def true_next_obs(obs: np.ndarray, info: Mapping[str, Any]) -> np.ndarray:
    """The observation each env reached by its last step (not the reset one).

    Args:
        obs (np.ndarray): ``(E, ...)`` observations returned by ``step``.
        info (Mapping): the step's info; with ``SAME_STEP`` autoreset, ``final_obs``
            holds the final observation of every env that just finished.

    Returns:
        np.ndarray: a copy of ``obs`` with finished envs' final observations.
    """
    out = np.array(obs, copy=True)
    mask = info.get("_final_obs")
    if mask is not None:
        for e in np.flatnonzero(mask):
            out[e] = info["final_obs"][e]
    return out


class NStepAccumulator:
    """n-step transitions from ``num_envs`` lock-stepped environments.

    Not thread-safe; not collective; :meth:`push` never blocks.

    Args:
        num_envs (int): environments stepped together.
        n (int): steps per transition, >= 1.
        gamma (float): discount per step in [0, 1].
        obs_dtype (str): dtype of the ``obs`` and ``next_obs`` columns (``float32``;
            ``uint8`` keeps Atari frames as pixels).
    """

    def __init__(self, num_envs: int, n: int, gamma: float,
                 obs_dtype: str = "float32") -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs!r}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n!r}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
        self.num_envs, self.n, self.gamma = num_envs, n, float(gamma)
        self.obs_dtype = np.dtype(obs_dtype)
        self._windows: list[deque[tuple[np.ndarray, int, float]]] = [
            deque() for _ in range(num_envs)]

    def pending(self) -> int:
        """1-step transitions held back (not yet part of an emitted n-step one)."""
        return sum(len(w) for w in self._windows)

    def reset(self) -> None:
        """Drop every pending step (e.g. after the envs were reset by hand)."""
        for w in self._windows:
            w.clear()

    def push(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
             next_obs: np.ndarray, terminated: np.ndarray,
             truncated: np.ndarray) -> dict[str, np.ndarray]:
        """Add one step of every env; return the n-step transitions now complete.

        Args:
            obs (np.ndarray): ``(E, ...)`` observations the actions were taken in.
            action (np.ndarray): ``(E,)`` actions.
            reward (np.ndarray): ``(E,)`` rewards.
            next_obs (np.ndarray): ``(E, ...)`` observations reached - the true final
                observation for envs that finished (see :func:`true_next_obs`).
            terminated (np.ndarray): ``(E,)`` episode ended in a terminal state.
            truncated (np.ndarray): ``(E,)`` episode was cut (time limit).

        Returns:
            dict[str, np.ndarray]: columns ``obs`` (``obs_dtype``), ``action`` (int64),
            ``reward`` (float32), ``next_obs`` (``obs_dtype``), ``discount`` (float32) and
            ``env`` (int64, the env each row came from); zero rows is possible.
        """
        obs = np.asarray(obs, dtype=self.obs_dtype)
        next_obs = np.asarray(next_obs, dtype=self.obs_dtype)
        if obs.shape[0] != self.num_envs:
            raise ValueError(f"obs must have {self.num_envs} rows (one per env), "
                             f"got shape {obs.shape}")
        action = np.asarray(action).reshape(-1)
        reward = np.asarray(reward, dtype=np.float64).reshape(-1)
        term = np.asarray(terminated, dtype=bool).reshape(-1)
        trunc = np.asarray(truncated, dtype=bool).reshape(-1)
        rows: list[tuple[np.ndarray, int, float, np.ndarray, float, int]] = []
        g = self.gamma
        for e in range(self.num_envs):
            w = self._windows[e]
            w.append((obs[e], int(action[e]), float(reward[e])))
            if term[e] or trunc[e]:
                # flush: every start in the window bootstraps (or not) from the final obs
                items = list(w)
                k = len(items)
                not_term = 0.0 if term[e] else 1.0
                ret = 0.0
                rets = [0.0] * k
                for i in range(k - 1, -1, -1):
                    ret = items[i][2] + g * ret
                    rets[i] = ret
                for i in range(k):
                    rows.append((items[i][0], items[i][1], rets[i], next_obs[e],
                                 g ** (k - i) * not_term, e))
                w.clear()
            elif len(w) == self.n:
                o, a, _ = w[0]
                ret = 0.0
                for i in range(self.n - 1, -1, -1):
                    ret = w[i][2] + g * ret
                rows.append((o, a, ret, next_obs[e], g ** self.n, e))
                w.popleft()
        return self._columns(rows, obs.shape[1:], self.obs_dtype)

    @staticmethod
    def _columns(rows: list[tuple[np.ndarray, int, float, np.ndarray, float, int]],
                 obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> dict[str, np.ndarray]:
        if not rows:
            return {"obs": np.zeros((0, *obs_shape), obs_dtype),
                    "action": np.zeros(0, np.int64), "reward": np.zeros(0, np.float32),
                    "next_obs": np.zeros((0, *obs_shape), obs_dtype),
                    "discount": np.zeros(0, np.float32), "env": np.zeros(0, np.int64)}
        o, a, r, no, d, e = zip(*rows, strict=True)
        return {"obs": np.stack(o).astype(obs_dtype, copy=False),
                "action": np.asarray(a, dtype=np.int64),
                "reward": np.asarray(r, dtype=np.float32),
                "next_obs": np.stack(no).astype(obs_dtype, copy=False),
                "discount": np.asarray(d, dtype=np.float32),
                "env": np.asarray(e, dtype=np.int64)}


def describe_transitions(fields: Mapping[str, FieldConfig], *, n_step: int, gamma: float
                         ) -> dict[str, FieldConfig]:
    """The ``[spec.*]`` of an n-step transition (``obs``, ``action``, ``reward``,
    ``next_obs``, ``discount``) with what each field means (n and gamma included) and its
    units, where the config gives no description of its own; other fields unchanged.
    These become the attributes of the checkpoint's datasets. Local; pure.
    """
    g_n = gamma ** n_step
    text = {
        "obs": ("the observation the action was taken in", ""),
        "action": ("the action taken (index of the discrete action)", ""),
        "reward": (f"n-step discounted return r_t + g r_(t+1) + ... + g^(k-1) r_(t+k-1) "
                   f"with n = {n_step}, gamma = {gamma:g}; k = n except at the end of an "
                   f"episode (k < n)", "reward units of the environment"),
        "next_obs": (f"the observation k = {n_step} steps later (the final one when the "
                     f"episode ended inside the window)", ""),
        "discount": (f"bootstrap factor gamma^k * (1 - terminated): gamma^n = "
                     f"{gamma:g}^{n_step} = {g_n:.6g} in the steady state, 0 after a "
                     f"termination, gamma^k (k < n) at an episode's end or truncation",
                     ""),
    }
    out = dict(fields)
    for name, (what, units) in text.items():
        fc = out.get(name)
        if fc is not None and not fc.description:
            out[name] = replace(fc, description=what, units=fc.units or units)
    return out
