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
from conduit_hpc.config.checks import DTYPES
from conduit_hpc.spec import as_array, check_in_range

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
        if np.shape(mask) != out.shape[:1]:
            raise ValueError(f"info['_final_obs'] must have one flag per env "
                             f"({out.shape[:1]}), got shape {np.shape(mask)}")
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
        for name, v in (("num_envs", num_envs), ("n", n)):
            # n = 2.5 never filled a window (len == 2.5): every row waited for the
            # episode's end
            if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        real = isinstance(gamma, int | float | np.integer | np.floating)
        if not (real and not isinstance(gamma, bool) and 0.0 <= gamma <= 1.0):
            raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
        try:
            dt = np.dtype(obs_dtype)
        except TypeError as err:
            raise ValueError(f"obs_dtype must be one of {', '.join(DTYPES)}, got "
                             f"{obs_dtype!r}") from err
        if dt.name not in DTYPES:
            raise ValueError(f"obs_dtype must be one of {', '.join(DTYPES)}, got "
                             f"{obs_dtype!r}")
        self.num_envs, self.n, self.gamma = int(num_envs), int(n), float(gamma)
        self.obs_dtype = dt
        self._windows: list[deque[tuple[np.ndarray, int, float]]] = [
            deque() for _ in range(self.num_envs)]

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

        Raises:
            ValueError: (nothing held changes) naming the argument: not ``E`` rows,
                ``next_obs`` of another shape than ``obs``, observations that do not
                cast to ``obs_dtype`` within their kind (or would wrap or overflow),
                an action that is not an integer, a reward NaN, infinite or beyond
                float32, or a flag other than true/false (0/1).
        """
        obs, action, reward, next_obs, term, trunc = self._check_step(
            obs, action, reward, next_obs, terminated, truncated)
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

    def _check_step(self, obs: object, action: object, reward: object, next_obs: object,
                    terminated: object, truncated: object) -> tuple[np.ndarray, ...]:
        """One step's arguments checked and converted, before any window changes (a
        short ``reward`` or a scalar flag failed mid-loop, with some envs' steps taken
        and others not, or an env's flushed rows lost); the observations as arrays of
        their own (a window kept views of the caller's array: an env that reuses its
        buffer rewrote the observations of pending rows)."""
        e = self.num_envs
        out = []
        for name, value in (("obs", obs), ("next_obs", next_obs)):
            arr = as_array(value, name)
            if arr.ndim < 1 or arr.shape[0] != e:
                raise ValueError(f"{name} must have {e} rows (one per env), got shape "
                                 f"{arr.shape}")
            if arr.dtype != self.obs_dtype and arr.size:
                if not np.can_cast(arr.dtype, self.obs_dtype, casting="same_kind"):
                    raise ValueError(f"{name}: dtype {arr.dtype.name} does not cast within "
                                     f"its kind to obs_dtype {self.obs_dtype.name}; convert "
                                     f"it explicitly")
                check_in_range(name, arr, self.obs_dtype)
            out.append(np.array(arr, dtype=self.obs_dtype, copy=True))
        if out[1].shape != out[0].shape:
            raise ValueError(f"next_obs must have the shape of obs {out[0].shape}, got "
                             f"{out[1].shape}")
        act = _per_env(action, "action", e)
        if act.dtype.kind == "f":  # integral floats are taken (a float tensor's argmax)
            bad = ~(np.abs(act) <= 2**53) | (act != np.round(act))  # NaN fails too
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"action[{i}] must be an integer (a discrete action), got "
                                 f"{float(act[i])!r}")
        elif act.dtype.kind not in "iub":
            raise ValueError(f"action must be integers (discrete actions), got dtype "
                             f"{act.dtype.name}")
        elif act.dtype.kind == "u" and act.size and act.max() > np.iinfo(np.int64).max:
            raise ValueError(f"action must fit int64, got {act.max()!r}")
        rew = _per_env(reward, "reward", e)
        if rew.dtype.kind not in "iubf":
            raise ValueError(f"reward must be real numbers, got dtype {rew.dtype.name}")
        rew = rew.astype(np.float64)
        bad = ~(np.abs(rew) <= np.finfo(np.float32).max)  # NaN too
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"reward[{i}] must be finite and within float32's range (the "
                             f"reward column), got {float(rew[i])!r}")
        flags = []
        for name, value in (("terminated", terminated), ("truncated", truncated)):
            f = _per_env(value, name, e)
            if f.dtype.kind != "b" and not (f.dtype.kind in "iuf" and np.isin(f, (0, 1)).all()):
                raise ValueError(f"{name} must be true/false (or 0/1) per env, got "
                                 f"{f.tolist()!r}")
            flags.append(f.astype(bool))
        return out[0], act.astype(np.int64), rew, out[1], flags[0], flags[1]

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


def _per_env(value: object, name: str, num_envs: int) -> np.ndarray:
    """One number per env (shape ``(E,)``, or ``(E, 1)``)."""
    arr = as_array(value, name)
    if arr.size != num_envs or sum(d != 1 for d in arr.shape) > 1:
        raise ValueError(f"{name} must have one entry per env ({num_envs}), got shape "
                         f"{arr.shape}")
    return arr.reshape(-1)


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
