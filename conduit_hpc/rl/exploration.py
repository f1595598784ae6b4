"""Exploration: the Ape-X epsilon ladder and epsilon-greedy action choice.

Pure numpy; no torch, no MPI.
"""

from __future__ import annotations

import numpy as np

__all__ = ["epsilon_greedy", "epsilon_ladder"]


def epsilon_ladder(n: int, eps: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """The Ape-X ladder of per-explorer epsilons (Horgan et al., 2018).

    ``eps_i = eps ** (1 + i / (n - 1) * alpha)`` for ``i = 0 .. n-1``; one explorer gets
    ``eps`` itself. A distributed job applies the ladder over *all* environment slots of
    all actors (actor ``a`` with ``k`` environments takes slots ``a*k .. a*k+k-1``), so
    that a single process with the same number of environments explores identically.

    Not collective; pure; the result does not depend on the rank.

    Args:
        n (int): number of explorers (environment slots), >= 1.
        eps (float): base epsilon in (0, 1].
        alpha (float): spread exponent, >= 0.

    Returns:
        np.ndarray: float64 array of ``n`` epsilons, non-increasing.

    Raises:
        ValueError: ``n < 1``, ``eps`` outside (0, 1] or ``alpha < 0``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if not 0 < eps <= 1:
        raise ValueError(f"eps must be in (0, 1], got {eps!r}")
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}")
    if n == 1:
        return np.array([eps], dtype=np.float64)
    i = np.arange(n, dtype=np.float64)
    return np.power(eps, 1.0 + i / (n - 1) * alpha)


def epsilon_greedy(q_values: np.ndarray, epsilons: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """Per row, the greedy action of ``q_values`` or, with probability ``epsilons[row]``,
    a uniformly random action.

    Not collective; does not block.

    Args:
        q_values (np.ndarray): ``(rows, actions)`` action values.
        epsilons (np.ndarray): ``(rows,)`` exploration probabilities.
        rng (np.random.Generator): the random source.

    Returns:
        np.ndarray: ``(rows,)`` int64 actions.
    """
    q = np.asarray(q_values)
    rows, n_actions = q.shape
    greedy = q.argmax(axis=1).astype(np.int64)
    explore = rng.random(rows) < np.asarray(epsilons)
    random = rng.integers(0, n_actions, rows)
    return np.where(explore, random, greedy)
