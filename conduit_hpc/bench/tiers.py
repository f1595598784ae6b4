"""Delivery per superstep with the replay's rows in each memory tier (device, window, both).

    conduit-hpc bench tiers [--device cpu|cuda:0] [--rows 50000] [--row-bytes 1024]
                            [--batch 256] [--supersteps 300] [--smoke]

One process, no MPI job: the tier stores of :mod:`conduit_hpc.storage` hold ``--rows``
rows of ``--row-bytes`` (a float32 vector and an int64 key) with random priorities
(``alpha = 0.6``), and each superstep draws a batch of ``--batch`` rows by priority,
gathers it onto ``--device`` as torch tensors and sends new priorities back - the
experience path of one learner, without the network. Configurations:

* ``learner_gpu (device path)``: :class:`~conduit_hpc.storage.device.DeviceStore` alone,
  through its device-only calls (``draw_batch``, ``update``: no host round trip);
* ``learner_gpu``: the same store through :class:`~conduit_hpc.storage.tiers.
  TieredReplay` (the cross-tier path: totals and the draw on the host);
* ``learner_host``: a :class:`~conduit_hpc.storage.windowstore.WindowStore` (a shard ring
  in a shared-memory RMA window on ``COMM_SELF`` and its sum-tree), rows copied to the
  device;
* ``split``: half the rows in each (the hottest half on the device, after one
  ``rebalance``).

Reports the median and 95th percentile of a superstep (ms) and batches/s per
configuration, one JSON line each. With ``--device cpu`` the "device" is host memory: the
numbers compare the code paths (searchsorted over device tensors vs the sum-tree, copies),
not PCIe.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import torch_device, whole
from conduit_hpc.bench.common import git_sha


def _stores(args: argparse.Namespace, gpu_rows: int, host_rows: int) -> tuple[Any, ...]:
    from mpi4py import MPI

    from conduit_hpc.config import FieldConfig
    from conduit_hpc.spec import Spec
    from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing
    from conduit_hpc.storage.device import DeviceStore
    from conduit_hpc.storage.windowstore import WindowStore
    from conduit_hpc.transport.rma import RmaWindow

    width = max(1, (args.row_bytes - 8) // 4)
    spec = Spec.from_config({"key": FieldConfig(dtype="int64"),
                             "x": FieldConfig(dtype="float32", shape=(width,))})
    out: list[Any] = [spec]
    win = None
    if gpu_rows:
        out.append(DeviceStore(spec, gpu_rows, alpha=0.6, device=args.device))
    if host_rows:
        lay = ShardLayout(spec, host_rows)
        win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
        ring = ShardRing(win, 0, 0, lay, timeout_s=60.0)
        ring.views = lay.views(win.own_segment(), 0)
        out.append(WindowStore(ring, PriorityIndex(host_rows, alpha=0.6), "learner_host"))
    return win, *out


def _rows(spec: Any, ids: np.ndarray) -> dict[str, np.ndarray]:
    width = next(f.shape[0] for f in spec if f.name == "x")
    return {"key": ids.astype(np.int64),
            "x": np.broadcast_to(ids[:, None].astype(np.float32), (len(ids), width)).copy()}


def _fill(replay: Any, spec: Any, stores: list[Any], rows: int, rng: np.random.Generator
          ) -> None:
    ids = np.arange(rows, dtype=np.int64)
    prio = rng.uniform(0.01, 10.0, rows)
    lo = 0
    for j, s in enumerate(stores):
        n = s.capacity if j < len(stores) - 1 else rows - lo
        for a in range(lo, lo + n, 4096):
            b = min(a + 4096, lo + n)
            replay.insert(j, _rows(spec, ids[a:b]), ids[a:b], prio[a:b])
        lo += n


def _time(step: Any, supersteps: int) -> list[float]:
    for _ in range(min(10, supersteps)):  # warm-up
        step()
    out = []
    for _ in range(supersteps):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def _device_step(g: Any, k: int) -> Any:
    import torch

    def step() -> None:
        slots, ids, _cols, prob = g.draw_batch(k)
        g.update(slots, ids, (prob * 1e3).clamp_(min=1e-3))
        if g.device.type == "cuda":
            torch.cuda.synchronize(g.device)
    return step


def _replay_step(replay: Any, k: int, cuda: bool) -> Any:
    import torch

    def step() -> None:
        b = replay.sample(k)
        replay.update(b, np.maximum(b.probabilities * 1e3, 1e-3))
        if cuda:
            torch.cuda.synchronize()
    return step


def main(argv: list[str] | None = None) -> dict:
    from conduit_hpc.storage.tiers import TieredReplay

    p = argparse.ArgumentParser(prog="conduit-hpc bench tiers")
    p.add_argument("--device", type=torch_device, default="cpu")
    p.add_argument("--rows", type=whole(1, 1 << 30), default=50_000)
    p.add_argument("--row-bytes", type=whole(1, 1 << 30), default=1024)
    p.add_argument("--batch", type=whole(1, 1 << 24), default=256)
    p.add_argument("--supersteps", type=whole(1, 10**7), default=300)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.supersteps = 4096, 20
    sha = git_sha()
    rng = np.random.default_rng(0)
    results = []
    half = args.rows // 2
    for name, gpu_rows, host_rows in (("learner_gpu (device path)", args.rows, 0),
                                      ("learner_gpu", args.rows, 0),
                                      ("learner_host", 0, args.rows),
                                      ("split", half, args.rows - half)):
        win, spec, *stores = _stores(args, gpu_rows, host_rows)
        try:
            replay = TieredReplay(stores, device=args.device, seed=1)
            _fill(replay, spec, stores, args.rows, rng)
            if name == "split":
                replay.rebalance(half)
            k = args.batch
            step = _device_step(stores[0], k) if name.endswith("(device path)") else \
                _replay_step(replay, k, args.device.startswith("cuda"))
            times = _time(step, args.supersteps)
        finally:
            if win is not None:
                win.close()
        r = {"bench": "tiers", "git_sha": sha, "config": name, "device": args.device,
             "rows": args.rows, "row_bytes": args.row_bytes, "batch": k,
             "supersteps": args.supersteps,
             "median_ms": 1e3 * statistics.median(times),
             "p95_ms": 1e3 * float(np.percentile(times, 95)),
             "batches_per_s": 1.0 / statistics.median(times)}
        print(jsontext.dumps(r))
        results.append(r)
    print(f"\n{'configuration':<26} {'median ms':>10} {'p95 ms':>8} {'batches/s':>10}")
    for r in results:
        print(f"{r['config']:<26} {r['median_ms']:>10.3f} {r['p95_ms']:>8.3f} "
              f"{r['batches_per_s']:>10.0f}")
    return {"results": results}


if __name__ == "__main__":
    main(sys.argv[1:])
