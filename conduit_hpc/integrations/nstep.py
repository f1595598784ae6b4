"""RLlib episode chunks -> n-step transitions, for
:mod:`conduit_hpc.integrations.rllib` (plain numpy: imports neither Ray nor torch)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SPEC_FIELDS", "NStepAssembler"]

#: the ``[spec]`` fields the transitions fill
SPEC_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "n_step")


class NStepAssembler:
    """RLlib episode chunks -> n-step transitions (the :data:`SPEC_FIELDS` columns).

    A chunk continues its episode (same ``id_``; its first observation is the last one
    of the chunk before). Step ``t`` becomes a transition once step ``t + n_step - 1``
    is known: ``reward`` is ``sum(gamma**k * r[t + k] for k < n_step)``, ``next_obs`` the
    observation ``n_step`` later, ``terminated`` true only where ``t + n_step`` is the
    end of a terminated episode. Steps closer than ``n_step`` to an episode's end are
    dropped, as RLlib's buffer never samples them. Local; plain numpy.

    Args:
        n_step (int): steps summed per transition.
        gamma (float): the discount.

    Raises:
        ValueError: ``n_step`` not an integer >= 1 (0 made every row its own next
            observation with reward 0) or ``gamma`` not a number in [0, 1].
    """

    def __init__(self, n_step: int, gamma: float) -> None:
        if not isinstance(n_step, int | np.integer) or isinstance(n_step, bool) or n_step < 1:
            raise ValueError(f"n_step must be an integer >= 1, got {n_step!r}")
        real = isinstance(gamma, int | float | np.integer | np.floating)
        if not (real and not isinstance(gamma, bool) and 0.0 <= gamma <= 1.0):  # NaN fails
            raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
        self.n_step, self.gamma = int(n_step), float(gamma)
        #: per open episode: its observations, actions and rewards not yet emitted
        self.open: dict[str, tuple[list[Any], list[Any], list[float]]] = {}

    def add(self, episodes: Any) -> dict[str, np.ndarray] | None:
        """The transitions these chunks complete (``None``: none yet)."""
        n = self.n_step
        cols: dict[str, list[np.ndarray]] = {f: [] for f in SPEC_FIELDS}
        for ep in episodes:
            obs, acts, rews = self.open.pop(ep.id_, ([], [], []))
            new_obs = list(ep.get_observations())
            obs = obs[:-1] + new_obs if obs else new_obs
            acts = acts + list(ep.get_actions())
            rews = rews + [float(r) for r in ep.get_rewards()]
            t = len(acts) - n + 1  # transitions complete: steps 0 .. t-1
            if t > 0:
                r = np.asarray(rews, np.float64)
                cols["obs"].append(np.asarray(obs[:t]))
                cols["action"].append(np.asarray(acts[:t]))
                ret = np.zeros(t)
                for k in range(n):
                    ret += self.gamma ** k * r[k:k + t]
                cols["reward"].append(ret)
                cols["next_obs"].append(np.asarray(obs[n:n + t]))
                cols["terminated"].append((np.arange(t) + n == len(acts))
                                          & bool(ep.is_terminated))
                cols["n_step"].append(np.full(t, n, np.int64))
            if not ep.is_done:  # the next chunk continues these steps
                keep = max(t, 0)
                self.open[ep.id_] = (obs[keep:], acts[keep:], rews[keep:])
        if not cols["obs"]:
            return None
        return {f: np.concatenate(v) for f, v in cols.items()}
