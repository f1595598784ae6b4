"""The Q network (an MLP) and target-network synchronisation. Plain torch; no
``torch.distributed``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["QNetwork", "copy_weights", "sync_target"]


class QNetwork(nn.Module):
    """An MLP from flat observations to one value per discrete action.

    Args:
        obs_dim (int): observation size.
        n_actions (int): number of discrete actions.
        hidden (Sequence[int]): hidden layer widths (ReLU between layers).
        dueling (bool): split the head into value and advantage streams
            (``Q = V + A - mean(A)``).
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: Sequence[int] = (128, 128),
                 dueling: bool = False) -> None:
        super().__init__()
        if obs_dim < 1 or n_actions < 1:
            raise ValueError(f"obs_dim and n_actions must be >= 1, got {obs_dim!r}, "
                             f"{n_actions!r}")
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden:
            if h < 1:
                raise ValueError(f"hidden widths must be >= 1, got {tuple(hidden)!r}")
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.body = nn.Sequential(*layers)
        self.dueling = dueling
        self.obs_dim, self.n_actions = obs_dim, n_actions
        self.head = nn.Linear(width, n_actions)
        self.value = nn.Linear(width, 1) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``(batch, obs_dim)`` -> ``(batch, n_actions)`` action values."""
        z = self.body(obs)
        adv = self.head(z)
        if self.value is None:
            return adv
        return self.value(z) + adv - adv.mean(dim=1, keepdim=True)


@torch.no_grad()
def sync_target(online: nn.Module, target: nn.Module, tau: float = 1.0) -> None:
    """Move the target network towards the online one: a hard copy when ``tau == 1``,
    else Polyak averaging ``target = tau * online + (1 - tau) * target``.

    Not collective; does not block.

    Raises:
        ValueError: ``tau`` outside (0, 1].
    """
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau!r}")
    if tau == 1.0:
        target.load_state_dict(online.state_dict())
        return
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.lerp_(o, tau)


@torch.no_grad()
def copy_weights(src: nn.Module, dst: nn.Module) -> None:
    """Copy every parameter and buffer of ``src`` into ``dst`` (same architecture)."""
    dst.load_state_dict(src.state_dict())
