"""The learner's update: double DQN with a target network, Adam, gradient clipping.

One copy of the update, used by the distributed learner (``jobs/dqn_cartpole.py``) and by
the single-process baseline (:func:`~conduit_hpc.rl.dqn.train_single_process`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from conduit_hpc.rl.losses import double_dqn_loss, to_tensors
from conduit_hpc.rl.qnet import sync_target

if TYPE_CHECKING:
    from conduit_hpc.rl.section import DQNSection

__all__ = ["DQNUpdater"]


class DQNUpdater:
    """The learner's double-DQN update with importance weights and target syncs.

    Not collective by itself; :meth:`update` blocks for one forward/backward/step on
    ``online``'s device. With several data-parallel learners, ``average_gradients``
    (e.g. :meth:`~conduit_hpc.plane.learner_group.LearnerGroup.average_gradients`, a
    collective) replaces each gradient by its mean over the learners between the
    backward pass and the clipping: every learner then clips and steps alike, so
    parameters, Adam's moments and the target-network syncs stay identical.

    Args:
        hp (DQNSection): lr, huber_delta, max_grad_norm, target_period.
        online (nn.Module): the network being trained (already on its device).
        average_gradients (callable | None): called with ``online.parameters()`` after
            every backward pass (None: one learner).
    """

    def __init__(self, hp: DQNSection, online: nn.Module,
                 average_gradients: Callable[[Iterator[nn.Parameter]], None] | None = None
                 ) -> None:
        self.hp, self.online = hp, online
        self.average_gradients = average_gradients
        self.target = copy.deepcopy(online)
        for p in self.target.parameters():
            p.requires_grad_(False)
        self.opt = torch.optim.Adam(online.parameters(), lr=hp.lr)
        self.updates = 0
        self.device = next(online.parameters()).device

    def update(self, batch: Mapping[str, np.ndarray | torch.Tensor],
               weights: torch.Tensor | np.ndarray | None) -> tuple[float, torch.Tensor]:
        """One gradient step on ``batch`` (the five DQN columns); the target network
        syncs every ``hp.target_period`` updates.

        Returns:
            tuple[float, torch.Tensor]: the loss and the detached per-row TD errors.
        """
        w = None if weights is None else torch.as_tensor(weights, device=self.device).float()
        loss, td = double_dqn_loss(self.online, self.target, to_tensors(batch, self.device),
                                   w, self.hp.huber_delta)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.average_gradients is not None:
            self.average_gradients(self.online.parameters())
        if self.hp.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.hp.max_grad_norm)
        self.opt.step()
        self.updates += 1
        if self.updates % self.hp.target_period == 0:
            sync_target(self.online, self.target)
        return float(loss.detach()), td

    def _param_names(self) -> list[str]:
        """The online network's parameter names in the optimizer's order."""
        return [name for name, _ in self.online.named_parameters()]

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The online and target networks and Adam's state as named numeric arrays (a
        checkpoint's ``extra_state``; no pickle): ``online/<param>``, ``target/<param>``,
        ``adam/<param>/{exp_avg,exp_avg_sq,step}`` (by the online parameter's name),
        ``updates``. Not collective."""
        out: dict[str, np.ndarray] = {}
        for prefix, net in (("online", self.online), ("target", self.target)):
            for name, t in net.state_dict().items():
                out[f"{prefix}/{name}"] = t.detach().cpu().numpy().copy()
        names = self._param_names()
        for i, st in self.opt.state_dict()["state"].items():
            for name, t in st.items():
                out[f"adam/{names[i]}/{name}"] = (torch.as_tensor(t).detach().cpu().numpy()
                                                  .copy())
        out["updates"] = np.array([self.updates], dtype=np.int64)
        return out

    def state_attrs(self) -> dict[str, dict[str, str]]:
        """What each of :meth:`state_arrays` means (HDF5 attributes of a checkpoint's
        ``learner.h5``: ``description``, ``units``). Not collective."""
        out: dict[str, dict[str, str]] = {}
        what = {"online": "online Q-network (the one trained)",
                "target": f"target Q-network (synced from the online one every "
                          f"{self.hp.target_period} updates)"}
        for prefix, net in (("online", self.online), ("target", self.target)):
            for name in net.state_dict():
                out[f"{prefix}/{name}"] = {"description": f"{what[prefix]}: {name}",
                                           "units": ""}
        moments = {"exp_avg": ("Adam first moment (running mean of the gradient)", ""),
                   "exp_avg_sq": ("Adam second moment (running mean of the squared "
                                  "gradient)", ""),
                   "step": ("Adam step count", "optimizer steps")}
        names = self._param_names()
        for i, st in self.opt.state_dict()["state"].items():
            for name in st:
                text, units = moments.get(name, (f"Adam state {name!r}", ""))
                out[f"adam/{names[i]}/{name}"] = {
                    "description": f"{text} of online parameter {names[i]} (lr = "
                                   f"{self.hp.lr:g})", "units": units}
        out["updates"] = {"description": "learner updates (gradient steps) done",
                          "units": "updates"}
        return out

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`state_arrays` wrote (same architecture). Not collective.
        Every array is checked and converted before anything is loaded: a refused state
        changes nothing (a target network of another shape failed after the online
        one was loaded; an Adam moment of another shape was taken, and the next update
        failed; ``updates`` NaN failed after everything was loaded).

        Raises:
            KeyError: an array of the networks is missing, or an Adam entry names no
                parameter (the message names it).
            ValueError: an array of another shape than its parameter, or ``updates``
                not one integer >= 0 (naming the key, the value and what was expected).
        """
        nets: dict[str, dict[str, torch.Tensor]] = {}
        for prefix, net in (("online", self.online), ("target", self.target)):
            state = {}
            for name, t in net.state_dict().items():
                key = f"{prefix}/{name}"
                if key not in arrays:
                    raise KeyError(f"checkpoint state lacks {key!r}")
                state[name] = _converted(arrays[key], key, t)
            nets[prefix] = state
        params = list(self.online.parameters())
        names = self._param_names()
        index = {name: i for i, name in enumerate(names)}
        moments: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in arrays.items():
            parts = key.split("/")
            if parts[0] == "adam" and len(parts) == 3:
                # by parameter name; checkpoints written before that used its position
                i = (int(parts[1]) if parts[1].isascii() and parts[1].isdigit()
                     else index.get(parts[1]))
                if i is None or i >= len(params):
                    raise KeyError(f"checkpoint state {key!r} names no parameter of the "
                                   f"online network (it has {sorted(index)})")
                if parts[2] == "step":
                    t = torch.tensor(np.asarray(value))  # a copy: never share memory
                    if t.numel() != 1 or not bool(torch.isfinite(t).all()) or t.item() < 0:
                        raise ValueError(f"checkpoint state {key!r} must be one finite "
                                         f"step count >= 0, got {np.asarray(value)!r}")
                else:
                    t = _converted(value, key, params[i].detach())
                moments.setdefault(i, {})[parts[2]] = t
        updates = None
        if "updates" in arrays:
            u = np.asarray(arrays["updates"]).reshape(-1)
            if u.size != 1 or u.dtype.kind not in "iu" or u[0] < 0:
                raise ValueError(f"checkpoint state 'updates' must be one integer >= 0, got "
                                 f"{np.asarray(arrays['updates'])!r}")
            updates = int(u[0])
        for prefix, net in (("online", self.online), ("target", self.target)):
            net.load_state_dict(nets[prefix])
        if moments:
            sd = self.opt.state_dict()
            sd["state"] = moments
            self.opt.load_state_dict(sd)
        if updates is not None:
            self.updates = updates

    def warm_up(self) -> None:
        """One Adam step on a throwaway parameter: torch imports for seconds at the
        first optimizer step, which should not land in the first timed superstep."""
        w = torch.zeros(1, requires_grad=True)
        opt = torch.optim.Adam([w])
        (w * 2).sum().backward()
        opt.step()


def _converted(value: object, key: str, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a tensor of ``like``'s dtype, device and shape (a copy), or refused
    naming ``key``."""
    a = np.asarray(value)
    if tuple(a.shape) != tuple(like.shape):
        raise ValueError(f"checkpoint state {key!r} has shape {tuple(a.shape)}, the network's "
                         f"has {tuple(like.shape)} (another architecture?)")
    try:
        return torch.tensor(a, dtype=like.dtype, device=like.device)
    except (TypeError, RuntimeError) as err:
        raise ValueError(f"checkpoint state {key!r}: dtype {a.dtype} does not convert to "
                         f"{like.dtype}: {err}") from err
