"""The Q networks (an MLP for flat observations, the Nature CNN for stacked frames) and
target-network synchronisation. Plain torch; no ``torch.distributed``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["NatureQNetwork", "QNetwork", "copy_weights", "sync_target"]


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


class NatureQNetwork(nn.Module):
    """The DQN network of Mnih et al. (Nature, 2015) for stacked frames: conv 32 8x8
    stride 4, conv 64 4x4 stride 2, conv 64 3x3 stride 1 (ReLU after each), then an MLP
    head (:class:`QNetwork`: ``hidden`` widths, 512 in the paper) to one value per action.

    Observations are ``(batch, frames, height, width)`` pixels of any dtype (uint8 from
    the replay); the network scales them by ``scale`` (1/255) itself, so rows stay
    uint8 in replay and on the wire.

    Args:
        obs_shape (Sequence[int]): ``(frames, height, width)``, e.g. ``(4, 84, 84)``.
        n_actions (int): number of discrete actions.
        hidden (Sequence[int]): widths of the head's hidden layers.
        dueling (bool): dueling head (see :class:`QNetwork`).
        scale (float): multiplies the pixels before the first convolution.

    Raises:
        ValueError: ``obs_shape`` is not three positive sizes, or too small for the
            convolutions (at least 36 x 36 pixels).
    """

    def __init__(self, obs_shape: Sequence[int], n_actions: int,
                 hidden: Sequence[int] = (512,), dueling: bool = False,
                 scale: float = 1.0 / 255.0) -> None:
        super().__init__()
        shape = tuple(int(d) for d in obs_shape)
        if len(shape) != 3 or min(shape) < 1 or min(shape[1:]) < 36:
            raise ValueError(f"obs_shape must be (frames, height, width) with height and "
                             f"width >= 36, got {tuple(obs_shape)!r}")
        self.obs_shape, self.scale = shape, float(scale)
        self.torso = nn.Sequential(
            nn.Conv2d(shape[0], 32, kernel_size=8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, kernel_size=3, stride=1), nn.ReLU(),
            nn.Flatten())
        with torch.no_grad():
            self.features = int(self.torso(torch.zeros(1, *shape)).shape[1])
        self.head = QNetwork(self.features, n_actions, hidden, dueling)
        self.n_actions = n_actions

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``(batch, frames, height, width)`` -> ``(batch, n_actions)`` action values."""
        return self.head(self.torso(obs.float() * self.scale))


@torch.no_grad()
def sync_target(online: nn.Module, target: nn.Module, tau: float = 1.0) -> None:
    """Move the target network towards the online one: a hard copy when ``tau == 1``,
    else Polyak averaging ``target = tau * online + (1 - tau) * target``.

    Not collective; does not block.

    Raises:
        ValueError: ``tau`` not a number in (0, 1], or networks of another architecture
            (naming the first entry that differs; nothing changed - the entries before
            it were averaged or copied before).
    """
    real = isinstance(tau, int | float | np.integer | np.floating) and not isinstance(tau, bool)
    if not (real and 0.0 < tau <= 1.0):
        raise ValueError(f"tau must be a number in (0, 1], got {tau!r}")
    _check_same(online, target)
    if tau == 1.0:
        target.load_state_dict(online.state_dict())
        return
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.lerp_(o, tau)


@torch.no_grad()
def copy_weights(src: nn.Module, dst: nn.Module) -> None:
    """Copy every parameter and buffer of ``src`` into ``dst`` (same architecture).

    Raises:
        ValueError: another architecture, naming the first entry that differs (nothing
            copied: torch's load copied the entries that fit, then raised).
    """
    _check_same(src, dst)
    dst.load_state_dict(src.state_dict())


def _check_same(src: nn.Module, dst: nn.Module) -> None:
    """Refuse two networks whose parameters and buffers differ in name or shape."""
    a, b = src.state_dict(), dst.state_dict()
    for name in sorted(a.keys() | b.keys()):
        sa = tuple(a[name].shape) if name in a else None
        sb = tuple(b[name].shape) if name in b else None
        if sa != sb:
            raise ValueError(f"networks differ at {name!r}: shape {sa} in the source, {sb} "
                             f"in the destination (None: absent); expected the same "
                             f"architecture")
