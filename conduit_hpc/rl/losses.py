"""Double-DQN targets and loss with importance weights, and actor-side initial
priorities. Plain torch; no ``torch.distributed``.

A batch holds n-step transitions as :class:`~conduit_hpc.rl.nstep.NStepAccumulator`
emits them: ``obs``, ``action``, ``reward`` (the n-step discounted return), ``next_obs``
and ``discount`` (``gamma^k * (1 - terminated)``). The double-DQN target is

    y = reward + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a))

and the TD error ``y - Q_online(obs, action)``; its absolute value is the priority.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["double_dqn_loss", "double_dqn_targets", "initial_priorities", "to_tensors"]

FIELDS = ("obs", "action", "reward", "next_obs", "discount")


def to_tensors(batch: Mapping[str, np.ndarray | torch.Tensor],
               device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The five DQN columns as tensors on ``device`` (float32, actions int64).

    Raises:
        KeyError: a column is missing (the message names it).
    """
    out: dict[str, torch.Tensor] = {}
    for name in FIELDS:
        if name not in batch:
            raise KeyError(f"DQN batch needs column {name!r}; it has {sorted(batch)}")
        t = torch.as_tensor(batch[name], device=device)
        out[name] = t.long() if name == "action" else t.float()
    return out


@torch.no_grad()
def double_dqn_targets(online: nn.Module, target: nn.Module, reward: torch.Tensor,
                       next_obs: torch.Tensor, discount: torch.Tensor) -> torch.Tensor:
    """``reward + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a))``.

    Not collective; does not block; no gradient flows through the result.
    """
    best = online(next_obs).argmax(dim=1, keepdim=True)
    q_next = target(next_obs).gather(1, best).squeeze(1)
    return reward + discount * q_next


def double_dqn_loss(online: nn.Module, target: nn.Module,
                    batch: Mapping[str, torch.Tensor], weights: torch.Tensor | None = None,
                    huber_delta: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance-weighted Huber loss of double-DQN TD errors.

    Not collective; does not block.

    Args:
        online (nn.Module): the network being trained.
        target (nn.Module): the target network.
        batch (Mapping[str, torch.Tensor]): the five columns (see :func:`to_tensors`).
        weights (torch.Tensor | None): ``(rows,)`` importance-sampling weights of
            prioritized replay; ``None`` for uniform (all ones).
        huber_delta (float): Huber threshold; ``inf`` gives the squared error / 2.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: the scalar loss (mean over rows of
        ``weight * huber(td)``) and the detached per-row TD errors ``y - Q(obs, a)``.
    """
    q = online(batch["obs"]).gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    y = double_dqn_targets(online, target, batch["reward"], batch["next_obs"],
                           batch["discount"])
    td = y - q
    if np.isinf(huber_delta):
        per_row = 0.5 * td.pow(2)
    else:
        per_row = F.huber_loss(q, y, reduction="none", delta=huber_delta)
    if weights is not None:
        per_row = per_row * weights
    return per_row.mean(), td.detach()


@torch.no_grad()
def initial_priorities(net: nn.Module, batch: Mapping[str, np.ndarray | torch.Tensor],
                       *, target: nn.Module | None = None, floor: float = 1e-6) -> np.ndarray:
    """Priorities ``|TD| + floor`` of new transitions, computed on the actor with the
    actor's copy of the network (as Ape-X does), so that new rows enter replay with an
    informed priority instead of the running maximum.

    Not collective; does not block; depends only on the arguments.

    Args:
        net (nn.Module): the actor's Q network (also the target when ``target`` is None).
        batch (Mapping): the five DQN columns.
        target (nn.Module | None): a target network, if the actor holds one.
        floor (float): added so that no row gets zero probability.

    Returns:
        np.ndarray: float64 ``(rows,)`` priorities.
    """
    t = to_tensors(batch)
    q = net(t["obs"]).gather(1, t["action"].unsqueeze(1)).squeeze(1)
    if target is None:  # one network: the double-DQN target is its own max
        y = t["reward"] + t["discount"] * net(t["next_obs"]).max(dim=1).values
    else:
        y = double_dqn_targets(net, target, t["reward"], t["next_obs"], t["discount"])
    return (y - q).abs().double().numpy() + floor
