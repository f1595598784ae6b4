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
        ValueError: ``n`` not an integer >= 1 (2.5 gave 3 epsilons), ``eps`` not a number
            in (0, 1], or ``alpha`` not a finite number >= 0 (inf made the first
            epsilon ``eps ** (1 + 0 * inf)``, NaN).
    """
    if not isinstance(n, int | np.integer) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not (_real(eps) and 0 < eps <= 1):
        raise ValueError(f"eps must be a number in (0, 1], got {eps!r}")
    if not (_real(alpha) and 0 <= alpha < np.inf):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    if n == 1:
        return np.array([eps], dtype=np.float64)
    i = np.arange(n, dtype=np.float64)
    return np.power(eps, 1.0 + i / (n - 1) * alpha)


def _real(v: object) -> bool:
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool)


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

    Raises:
        ValueError: ``q_values`` not ``(rows, actions)`` with an action, or
            ``epsilons`` not one per row (or one for all) in [0, 1] (NaN never
            explored, 2 always did, both silently).
    """
    q = np.asarray(q_values)
    if q.ndim != 2 or q.shape[1] < 1:
        raise ValueError(f"q_values must have shape (rows, actions) with actions >= 1, got "
                         f"{q.shape}")
    rows, n_actions = q.shape
    eps = np.asarray(epsilons, dtype=np.float64)
    if eps.shape not in ((rows,), (), (1,)):
        raise ValueError(f"epsilons must have shape ({rows},) (one per row), got "
                         f"{eps.shape}")
    bad = ~((eps >= 0) & (eps <= 1)).reshape(-1)  # NaN too
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"epsilons[{i}] must be in [0, 1], got {float(eps.reshape(-1)[i])!r}")
    greedy = q.argmax(axis=1).astype(np.int64)
    explore = rng.random(rows) < eps
    random = rng.integers(0, n_actions, rows)
    return np.where(explore, random, greedy)
