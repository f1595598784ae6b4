"""The workload of ``conduit-hpc bench peers`` and its in-process peers (cpprb, TorchRL).

Row layouts, sizes and the timing helpers shared by our ranks and the peers; the peers'
runners import their library when called (an absent one raises ImportError). No MPI.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["ALPHA", "BETA", "ROWS", "SIZES", "SMOKE_SIZES", "fake_rows", "latency_stats",
           "run_cpprb", "run_torchrl"]

ROWS: dict[str, dict[str, dict[str, Any]]] = {
    "cartpole": {"obs": {"dtype": "float32", "shape": [4]},
                 "next_obs": {"dtype": "float32", "shape": [4]},
                 "action": {"dtype": "int64", "shape": []},
                 "reward": {"dtype": "float32", "shape": []},
                 "done": {"dtype": "uint8", "shape": []}},
    "atari": {"obs": {"dtype": "uint8", "shape": [4, 84, 84]},
              "next_obs": {"dtype": "uint8", "shape": [4, 84, 84]},
              "action": {"dtype": "int64", "shape": []},
              "reward": {"dtype": "float32", "shape": []},
              "done": {"dtype": "uint8", "shape": []}},
}
#: per row kind: ring capacity, learner batch, actor ingest batch
SIZES = {"cartpole": {"capacity": 100_000, "batch": 256, "ingest": 1024},
         "atari": {"capacity": 4_000, "batch": 32, "ingest": 32}}
SMOKE_SIZES = {"cartpole": {"capacity": 4_096, "batch": 64, "ingest": 256},
               "atari": {"capacity": 256, "batch": 8, "ingest": 8}}
ALPHA, BETA = 0.6, 0.4

def fake_rows(kind: str, n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` rows of ``kind`` with random contents."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, f in ROWS[kind].items():
        shape = (n, *f["shape"])
        if f["dtype"].startswith("float"):
            out[name] = rng.random(shape).astype(f["dtype"])
        else:
            out[name] = rng.integers(0, 2 if name == "done" else 255, shape).astype(f["dtype"])
    return out


def latency_stats(lat: list[float], wall_s: float) -> dict[str, float]:
    a = np.asarray(lat)
    return {"batches": len(a), "batches_per_s": len(a) / wall_s,
            "latency_median_s": float(np.median(a)), "latency_p99_s": float(np.percentile(a, 99))}


def run_cpprb(kind: str, sz: dict[str, int], n: int, insert_rows: int) -> dict[str, Any]:
    import cpprb

    env = {name: {"shape": tuple(f["shape"]) or 1, "dtype": np.dtype(f["dtype"])}
           for name, f in ROWS[kind].items()}
    cap, B = sz["capacity"], sz["batch"]
    data = fake_rows(kind, sz["ingest"], 0)
    out: dict[str, Any] = {"version": getattr(cpprb, "__version__", "")}
    prb = cpprb.PrioritizedReplayBuffer(cap, env, alpha=ALPHA)
    out["insert_rows_per_s"] = _timed_insert(lambda: prb.add(**data), sz["ingest"], insert_rows)
    prios = np.random.default_rng(1).random((n, B)) + 0.01
    warm = max(5, n // 10)

    def prio_step(i: int) -> None:
        s = prb.sample(B, beta=BETA)
        prb.update_priorities(s["indexes"], prios[i % n])

    out["prioritized"] = _timed_loop(prio_step, n, warm)
    urb = cpprb.ReplayBuffer(cap, env)
    for _ in range(-(-cap // sz["ingest"])):
        urb.add(**data)
    out["uniform"] = _timed_loop(lambda i: urb.sample(B), n, warm)
    return out


def run_torchrl(kind: str, sz: dict[str, int], n: int, insert_rows: int) -> dict[str, Any]:
    import tensordict
    import torch
    import torchrl
    from torchrl.data import (
        LazyTensorStorage,
        TensorDictPrioritizedReplayBuffer,
        TensorDictReplayBuffer,
    )

    cap, B = sz["capacity"], sz["batch"]
    td = tensordict.TensorDict({k: torch.from_numpy(v) for k, v in
                                fake_rows(kind, sz["ingest"], 0).items()},
                               batch_size=[sz["ingest"]])
    out: dict[str, Any] = {"version": torchrl.__version__, "torch": torch.__version__,
                           "tensordict": tensordict.__version__}
    warm = max(5, n // 10)
    urb = TensorDictReplayBuffer(storage=LazyTensorStorage(cap), batch_size=B)
    out["insert_rows_per_s"] = _timed_insert(lambda: urb.extend(td), sz["ingest"], insert_rows)
    out["uniform"] = _timed_loop(lambda i: urb.sample(), n, warm)
    try:
        prb = TensorDictPrioritizedReplayBuffer(alpha=ALPHA, beta=BETA,
                                                storage=LazyTensorStorage(cap), batch_size=B)
    except RuntimeError as err:  # the C++ segment trees did not load with this torch
        from conduit_hpc.integrations.torchrl_fallback import extension_problem

        out["prioritized_skipped"] = extension_problem() or str(err)
        return out
    for _ in range(-(-cap // sz["ingest"])):
        prb.extend(td)
    prios = torch.rand(n, B) + 0.01

    def prio_step(i: int) -> None:
        s = prb.sample()
        prb.update_priority(s["index"], prios[i % n])

    out["prioritized"] = _timed_loop(prio_step, n, warm)
    return out


def _timed_insert(add: Any, per_call: int, rows: int) -> float:
    t0, done = time.perf_counter(), 0
    while done < rows:
        add()
        done += per_call
    return done / (time.perf_counter() - t0)


def _timed_loop(step: Any, n: int, warm: int) -> dict[str, float]:
    for i in range(warm):
        step(i)
    lat = []
    t_all = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        step(i)
        lat.append(time.perf_counter() - t0)
    return latency_stats(lat, time.perf_counter() - t_all)
