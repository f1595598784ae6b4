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
        """The transitions these chunks complete (``None``: none yet).

        Raises:
            ValueError: a chunk whose observations are not one more than its actions,
                whose rewards are not one per
                action, or a reward that is not finite - naming the episode. Nothing
                changes then: the open episodes' steps are as before the call (a
                refused chunk lost its episode's pending steps, and a chunk of 3
                observations for 3 actions emitted columns of different lengths).
        """
        n = self.n_step
        cols: dict[str, list[np.ndarray]] = {f: [] for f in SPEC_FIELDS}
        open_ = dict(self.open)  # its lists are never changed in place
        for ep in episodes:
            obs, acts, rews = open_.pop(ep.id_, ([], [], []))
            # copies: a kept observation must not change with the caller's buffer
            new_obs = [o.copy() if isinstance(o, np.ndarray) else o
                       for o in ep.get_observations()]
            new_acts = list(ep.get_actions())
            new_rews = [float(r) for r in ep.get_rewards()]
            if len(new_obs) != len(new_acts) + 1 or len(new_rews) != len(new_acts):
                raise ValueError(f"episode {ep.id_!r}: a chunk must hold "
                                 f"{len(new_acts) + 1} observations and {len(new_acts)} "
                                 f"rewards for its {len(new_acts)} actions, got "
                                 f"{len(new_obs)} and {len(new_rews)}")
            bad = [i for i, r in enumerate(new_rews) if not np.isfinite(r)]
            if bad:
                raise ValueError(f"episode {ep.id_!r}: reward {new_rews[bad[0]]!r} of the "
                                 f"chunk's step {bad[0]} must be finite")
            obs = obs[:-1] + new_obs if obs else new_obs
            acts = acts + new_acts
            rews = rews + new_rews
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
                open_[ep.id_] = (obs[keep:], acts[keep:], rews[keep:])
        self.open = open_
        if not cols["obs"]:
            return None
        return {f: np.concatenate(v) for f, v in cols.items()}
