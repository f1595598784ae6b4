"""Indicative, for the device check: what one learner update of the main job
(``jobs/dqn_cartpole``: the double-DQN update of ``conduit_hpc.rl.DQNUpdater`` on its
Q-network, batch 64) costs on each device, and where it goes, in one process with no data
plane. The job's learner does, per superstep: the update, ``td.abs().double().cpu()`` for
the priorities, and every ``weights_every`` supersteps a copy of the weights to the host
(``share_weights``). One JSON line per device:

    python scripts/device_learner_step.py [STEPS]      # cpu, then cuda where there is one

Each phase is timed alone (``torch.cuda.synchronize()`` around it on a GPU), over STEPS
updates (default 500) after 50 to warm up; ``update_ms`` is the whole update with the
priorities' copy to the host, as the job runs it (no synchronisation inside).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch

from conduit_hpc.rl.losses import double_dqn_loss, to_tensors
from conduit_hpc.rl.qnet import QNetwork
from conduit_hpc.rl.section import DQNSection
from conduit_hpc.rl.updater import DQNUpdater

arg = sys.argv[1] if len(sys.argv) > 1 else "500"
if not arg.isdecimal() or int(arg) < 1:
    sys.exit(f"STEPS must be a whole number >= 1, got {arg!r}")
STEPS = int(arg)
BATCH = 64


def batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A CartPole-shaped batch (the five DQN columns)."""
    return {"obs": rng.standard_normal((BATCH, 4)).astype(np.float32),
            "action": rng.integers(0, 2, BATCH),
            "reward": np.ones(BATCH, np.float32),
            "next_obs": rng.standard_normal((BATCH, 4)).astype(np.float32),
            "discount": np.full(BATCH, 0.99, np.float32)}


def measure(device: torch.device) -> dict[str, object]:
    torch.manual_seed(0)
    hp = DQNSection()
    net = QNetwork(4, 2, hp.hidden, hp.dueling).to(device)
    up = DQNUpdater(hp, net)
    rng = np.random.default_rng(0)
    data = [batch(rng) for _ in range(16)]
    w = np.ones(BATCH, np.float32)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn, n: int = STEPS) -> float:
        for i in range(50):
            fn(i)
        sync()
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        sync()
        return (time.perf_counter() - t0) / n * 1e3

    def whole(i: int) -> None:
        _, td = up.update(data[i % 16], w)
        td.abs().double().cpu().numpy()

    out: dict[str, object] = {"device": str(device), "torch": torch.__version__,
                              "batch": BATCH, "hidden": list(hp.hidden), "steps": STEPS}
    out["update_ms"] = timed(whole)
    tens = [to_tensors(d, device) for d in data]
    wt = torch.as_tensor(w, device=device)
    out["to_device_ms"] = timed(lambda i: to_tensors(data[i % 16], device))

    def loss_only(i: int) -> None:
        double_dqn_loss(up.online, up.target, tens[i % 16], wt, hp.huber_delta)

    out["loss_forward_ms"] = timed(loss_only)

    def backward(i: int) -> None:
        loss, _ = double_dqn_loss(up.online, up.target, tens[i % 16], wt, hp.huber_delta)
        up.opt.zero_grad(set_to_none=True)
        loss.backward()

    out["forward_backward_ms"] = timed(backward)
    out["clip_ms"] = timed(lambda i: torch.nn.utils.clip_grad_norm_(up.online.parameters(),
                                                                     hp.max_grad_norm))
    out["adam_step_ms"] = timed(lambda i: up.opt.step())
    out["loss_item_ms"] = timed(lambda i: float(torch.zeros((), device=device)))
    out["weights_to_host_ms"] = timed(
        lambda i: [p.detach().cpu().numpy() for p in up.online.state_dict().values()], 100)
    return out


devices = [torch.device("cpu")]
if torch.cuda.is_available():
    devices.append(torch.device("cuda", 0))
torch.set_num_threads(1)  # as the job's learner
for dev in devices:
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                      for k, v in measure(dev).items()}), flush=True)
