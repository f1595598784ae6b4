"""Double-DQN targets and loss with importance weights, and actor-side initial
priorities. Plain torch; no ``torch.distributed``.

A batch holds n-step transitions as :class:`~conduit_hpc.rl.nstep.NStepAccumulator`
emits them: ``obs``, ``action``, ``reward`` (the n-step discounted return), ``next_obs``
and ``discount`` (``gamma^k * (1 - terminated)``). The double-DQN target is

    y = reward + discount * Q_target(next_obs, argmax_a Q_online(next_obs, a))

and the TD error ``y - Q_online(obs, action)``; its absolute value is the priority.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["check_batch", "double_dqn_loss", "double_dqn_targets", "initial_priorities",
           "to_tensors"]

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
        if name == "action" and t.is_floating_point():
            # 1.7 was taken as action 1, NaN as an arbitrary one
            bad = ~torch.isfinite(t) | (t != t.round())
            if bool(bad.any()):
                i = int(torch.nonzero(bad.reshape(-1))[0])
                raise ValueError(f"action[{i}] must be an integer (a discrete action), got "
                                 f"{float(t.reshape(-1)[i])!r}")
        out[name] = t.long() if name == "action" else t.float()
    return out


def check_batch(batch: Mapping[str, torch.Tensor], n_actions: int,
                weights: torch.Tensor | None = None) -> None:
    """Refuse DQN columns that would broadcast or index wrongly, naming the column: an
    ``action``, ``reward``, ``discount`` or ``weights`` of another shape than
    ``(rows,)`` (a ``(rows, 1)`` reward made every TD error a ``rows x rows`` matrix and
    the loss its mean, silently), ``next_obs`` of another shape than ``obs``, an action
    outside ``[0, n_actions)`` (a CUDA gather then fails as a device-side assert), a
    reward or weight that is not finite, a discount outside [0, 1]. One reduction
    decides the values (one device sync); the search for the first bad value runs
    only when there is one. Not collective.

    Raises:
        ValueError: naming the column, the shape or first value, and what was expected.
    """
    rows = int(batch["obs"].shape[0]) if batch["obs"].dim() else -1
    if rows < 0 or tuple(batch["next_obs"].shape) != tuple(batch["obs"].shape):
        raise ValueError(f"obs and next_obs must have one shape (rows, ...), got "
                         f"{tuple(batch['obs'].shape)} and {tuple(batch['next_obs'].shape)}")
    cols = {k: batch[k] for k in ("action", "reward", "discount")}
    if weights is not None:
        cols["weights"] = weights
    for name, t in cols.items():
        if tuple(t.shape) != (rows,):
            raise ValueError(f"{name} must have shape ({rows},) (one per row of obs), got "
                             f"{tuple(t.shape)}")
    if rows == 0:
        return
    if _values_ok(cols, n_actions):
        return
    checks = {"action": lambda a: (a >= 0) & (a < n_actions),
              "reward": torch.isfinite,
              "discount": lambda d: (d >= 0) & (d <= 1),  # NaN fails
              "weights": lambda w: torch.isfinite(w) & (w >= 0)}
    want = {"action": f"in [0, {n_actions}) (the network's actions)",
            "reward": "finite", "discount": "in [0, 1] (gamma^k * (1 - terminated))",
            "weights": "finite and >= 0"}
    for name, t in cols.items():
        m = checks[name](t)
        if not bool(m.all()):
            i = int(torch.nonzero(~m)[0])
            raise ValueError(f"{name}[{i}] must be {want[name]}, got {t[i].item()!r}")


def _values_ok(cols: Mapping[str, torch.Tensor], n_actions: int) -> bool:
    """Whether every action is in ``[0, n_actions)``, every discount in [0, 1], every
    reward finite and every weight finite and >= 0 - the common case, decided in a few
    reductions (numpy's on the host, a few microseconds each; on a device, one stack
    and one transfer): the extremes of action and discount (a NaN makes them NaN),
    the sums of reward and weights (a NaN or inf makes them so), the least weight."""
    v = None
    if all(t.device.type == "cpu" for t in cols.values()):
        try:
            v = {k: t.detach().numpy() for k, t in cols.items()}
        except TypeError:  # bfloat16 has no numpy type: the torch path
            v = None
    if v is not None:
        figures = [v["action"].min(), v["action"].max(), v["discount"].min(),
                   v["discount"].max(), np.sum(v["reward"], dtype=np.float64)]
        if "weights" in v:
            figures += [np.sum(v["weights"], dtype=np.float64), v["weights"].min()]
        lo, hi, dl, dh, *rest = (float(x) for x in figures)
    else:
        parts = [*torch.aminmax(cols["action"]), *torch.aminmax(cols["discount"]),
                 cols["reward"].double().sum()]
        if "weights" in cols:
            parts += [cols["weights"].double().sum(), cols["weights"].min()]
        lo, hi, dl, dh, *rest = torch.stack([p.double() for p in parts]).tolist()
    sums_ok = all(math.isfinite(x) for x in rest[:2])
    return (lo >= 0 and hi < n_actions and dl >= 0 and dh <= 1 and sums_ok
            and (len(rest) < 3 or rest[2] >= 0))


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

    Raises:
        ValueError: ``huber_delta`` not > 0, or a column :func:`check_batch` refuses.
    """
    if not huber_delta > 0:  # NaN fails too
        raise ValueError(f"huber_delta must be > 0 (inf: the squared error / 2), got "
                         f"{huber_delta!r}")
    q_all = online(batch["obs"])
    check_batch(batch, int(q_all.shape[1]), weights)
    q = q_all.gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
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

    Raises:
        ValueError: ``floor`` not finite and >= 0 (NaN made every priority NaN, which
            a replay takes for "the running maximum"), a column :func:`check_batch`
            refuses, or a TD error that is not finite (the network's Q-values, or a
            huge reward), naming the row.
    """
    if not (isinstance(floor, int | float | np.integer | np.floating) and 0 <= floor < np.inf):
        raise ValueError(f"floor must be a finite number >= 0, got {floor!r}")
    t = to_tensors(batch)
    q_all = net(t["obs"])
    check_batch(t, int(q_all.shape[1]))
    q = q_all.gather(1, t["action"].unsqueeze(1)).squeeze(1)
    if target is None:  # one network: the double-DQN target is its own max
        y = t["reward"] + t["discount"] * net(t["next_obs"]).max(dim=1).values
    else:
        y = double_dqn_targets(net, target, t["reward"], t["next_obs"], t["discount"])
    td = (y - q).abs().double().numpy()
    if not np.isfinite(td).all():
        i = int(np.flatnonzero(~np.isfinite(td))[0])
        raise ValueError(f"initial priority of row {i} is not finite: |TD| = {td[i]!r} "
                         f"(Q(obs) = {float(q[i])!r}, target = {float(y[i])!r}); the "
                         f"network's Q-values diverged?")
    return td + floor
