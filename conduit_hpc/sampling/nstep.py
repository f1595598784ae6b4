"""n-step returns over sampled windows (a batch transform). Plain numpy."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["nstep_returns", "nstep_transform"]


def nstep_returns(rewards: np.ndarray, terminated: np.ndarray, gamma: float,
                  truncated: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """n-step discounted returns of windows of ``n`` consecutive steps, cut at the first
    episode end.

    Args:
        rewards (np.ndarray): ``[B, n]`` rewards of steps ``t .. t+n-1``.
        terminated (np.ndarray): ``[B, n]`` step ends the episode in a terminal state.
        gamma (float): discount.
        truncated (np.ndarray | None): ``[B, n]`` step ends the episode by a time limit
            (the return stops there but the state is not terminal: bootstrap).

    Returns:
        tuple: ``returns [B]`` (sum of ``gamma**k r_{t+k}`` up to and including the first
        end), ``discount [B]`` (``gamma**k`` for bootstrapping from the state after the
        last step counted, 0 if that step was terminal), and ``last [B]`` (index of the
        last step counted, whose next observation to bootstrap from).
    """
    r = np.asarray(rewards, dtype=np.float64)
    term = np.asarray(terminated, dtype=bool)
    trunc = np.zeros_like(term) if truncated is None else np.asarray(truncated, dtype=bool)
    b, n = r.shape
    ends = term | trunc
    any_end = ends.any(axis=1)
    last = np.where(any_end, ends.argmax(axis=1), n - 1)
    k = np.arange(n)
    counted = k[None, :] <= last[:, None]
    disc = gamma ** k
    returns = (r * disc[None, :] * counted).sum(axis=1)
    boot = gamma ** (last + 1)
    boot = np.where(term[np.arange(b), last], 0.0, boot)
    return returns.astype(np.float32), boot.astype(np.float32), last.astype(np.int64)


def nstep_transform(batch: Mapping[str, np.ndarray], *, gamma: float, reward: str = "reward",
                    terminated: str = "terminated", truncated: str | None = "truncated",
                    obs: str = "obs", next_obs: str = "next_obs", action: str = "action"
                    ) -> dict[str, np.ndarray]:
    """Turn sampled windows ``[B, n, ...]`` of 1-step transitions into n-step
    transitions: ``obs`` and ``action`` of the first step, the n-step ``return``, the
    ``next_obs`` after the last counted step and its bootstrap ``discount``.
    """
    ret, disc, last = nstep_returns(batch[reward], batch[terminated], gamma,
                                    batch[truncated] if truncated and truncated in batch
                                    else None)
    rows = np.arange(len(last))
    return {"obs": batch[obs][:, 0], "action": batch[action][:, 0], "return": ret,
            "next_obs": batch[next_obs][rows, last], "discount": disc}
