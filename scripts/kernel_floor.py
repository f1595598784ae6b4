"""Indicative, not a benchmark of record: the floor under a prioritized batch (sample +
update of every row) with the data plane's compiled kernels and none of its framework,
beside cpprb, in one process, interleaved. It answers "how much of a batch is the
plane's Python around the kernels?" (``bench/README.md``, "Round 11").

    python scripts/kernel_floor.py [cartpole|atari] [BATCHES] [ROUNDS] [shared|heap]

Ours: one shard's index (:class:`~conduit_hpc.storage.priority.PriorityIndex`) and its
columns in a shared ``mmap`` (as a buffer's window is; ``heap``: numpy arrays on the
heap instead, with the huge pages numpy asks for, as cpprb's are), each batch: stratified targets
(``tree_kernels.allocate``), the search with generations and masses
(``tree_kernels.draw``), ``np.take`` of every column, importance weights
(``tree_kernels.is_weights``), ``torch.from_numpy`` of every column, then the update
(``PriorityIndex.update``, checked priorities). No statistics header, seqlock, index
lock, read marks, intact check, limiter, metrics or checks of the update: what the
plane adds to these steps is the gap between this floor and ``bench capacity``'s
``sync``. cpprb: ``PrioritizedReplayBuffer.sample`` + ``update_priorities``.
"""
import mmap
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from conduit_hpc.bench._peers_inprocess import ALPHA, BETA, ROWS, SIZES, fake_rows
from conduit_hpc.storage import tree_kernels
from conduit_hpc.storage.priority import PriorityIndex
from conduit_hpc.storage.sumtree import search_level

USAGE = "usage: kernel_floor.py [cartpole|atari] [BATCHES >= 1] [ROUNDS >= 1] [shared|heap]"
args = (sys.argv[1:] + ["cartpole", "2000", "5", "shared"][len(sys.argv) - 1:])[:4]
kind, where = args[0], args[3]
try:
    n, rounds = int(args[1]), int(args[2])
except ValueError:
    sys.exit(f"{USAGE}; got {' '.join(sys.argv[1:])!r}")
if len(sys.argv) > 5 or kind not in ("cartpole", "atari") or n < 1 or rounds < 1 \
        or where not in ("shared", "heap"):
    sys.exit(f"{USAGE}; got {' '.join(sys.argv[1:])!r}")
sz = SIZES[kind]
cap, B = sz["capacity"], sz["batch"]
fields = {k: (np.dtype(f["dtype"]), tuple(f["shape"])) for k, f in ROWS[kind].items()}
rows = fake_rows(kind, cap, 0)


def shared(dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A zeroed array in a shared mapping (4 kB pages where shmem has no huge pages)."""
    nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED), dtype,
                         int(np.prod(shape))).reshape(shape)


cols = {k: shared(dt, (cap, *shp)) if where == "shared" else np.zeros((cap, *shp), dt)
        for k, (dt, shp) in fields.items()}
for k in cols:
    cols[k][:] = rows[k]
index = PriorityIndex(cap, alpha=ALPHA)
index.insert(np.arange(cap), np.arange(1, cap + 1), np.random.default_rng(0).random(cap) + 0.01)
out = {k: np.empty((B, *shp), dt) for k, (dt, shp) in fields.items()}
rng = np.random.default_rng(1)
prios = rng.random((n, B)) + 0.01
level = search_level(len(index.sum.nodes))


def ours() -> float:
    """Seconds a batch, over ``n`` batches."""
    t0 = time.perf_counter()
    for p in prios:
        total = index.total
        _, local = tree_kernels.allocate(np.array([total]), total, rng.random(B))
        slots, gens, mass = tree_kernels.draw(index.sum.nodes, index.gens, cap, local, level)
        for k, c in cols.items():
            np.take(c, slots, axis=0, out=out[k], mode="clip")
        w = tree_kernels.is_weights(mass, float(index.min.min), BETA, np.finfo(np.float32).tiny)
        batch = {k: torch.from_numpy(v) for k, v in out.items()}
        batch["weights"] = torch.from_numpy(w)
        index.update(slots, gens, p, checked=True)
    return (time.perf_counter() - t0) / n


def cpprb_batches() -> Callable[[], float] | None:
    """cpprb's seconds a batch over ``n`` batches, as a call (None without cpprb)."""
    try:
        import cpprb
    except ImportError:
        return None
    env = {k: {"shape": shp or 1, "dtype": dt} for k, (dt, shp) in fields.items()}
    rb = cpprb.PrioritizedReplayBuffer(cap, env, alpha=ALPHA)
    rb.add(**rows)

    def run() -> float:
        t0 = time.perf_counter()
        for p in prios:
            s = rb.sample(B, beta=BETA)
            rb.update_priorities(s["indexes"], p)
        return (time.perf_counter() - t0) / n
    return run  # (it holds the buffer)


peer = cpprb_batches()
ours()  # warm
got: dict[str, list[float]] = {f"ours (kernels only, {where} columns)": [], "cpprb": []}
for _ in range(rounds):
    got[f"ours (kernels only, {where} columns)"].append(ours())
    if peer is not None:
        got["cpprb"].append(peer())
for name, ts in got.items():
    if ts:
        print(f"{kind} {name}: {np.median(ts) * 1e6:.0f} us a batch (median of {rounds} "
              f"rounds of {n}; {min(ts) * 1e6:.0f}-{max(ts) * 1e6:.0f})", flush=True)
