"""Stored bytes per Atari transition, each frame stored once against whole stacks.

    conduit-hpc bench frames [--capacity 20000] [--streams 8] [--rows 40000]
                             [--batches 32,256] [--repeats 20] [--smoke]

One process, no MPI job: two shards of ``--capacity`` slots in shared-memory RMA windows
on ``COMM_SELF``, one of the Atari spec with its frame stacks declared (the frame-once
layout, :mod:`conduit_hpc.storage.frames`) and one of the same spec without (the full
layout: ``obs`` and ``next_obs`` each hold 4 frames). ``--streams`` games of random
84 x 84 frames and random episode lengths (50-500 steps), n-step 3, write ``--rows``
transitions into both, interleaved in batches of 1-4 rows a stream as Ape-X actors do;
then batches of each size in ``--batches`` are gathered from both.

Reports, per layout (one JSON line each): bytes a shard takes per slot (columns, stamps,
index), slots per transition written (frames-once writes extra slots at episode starts),
so **stored bytes per transition** and its ratio to the full layout (goal <= 1/6); the
fraction of held rows that are deliverable (a frame-once row dies with its oldest frame);
ingest rows/s and gather ms per batch. Times are noisy on a shared machine: compare the
two layouts of one run, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench.common import git_sha

ATARI: dict[str, dict[str, Any]] = {
    "obs": {"dtype": "uint8", "shape": [4, 84, 84], "stack": {"axis": 0, "stream": "env"}},
    "next_obs": {"dtype": "uint8", "shape": [4, 84, 84], "next_of": "obs"},
    "action": {"dtype": "int64"},
    "reward": {"dtype": "float32"},
    "env": {"dtype": "int64"},
    "discount": {"dtype": "float32"},
}


class _Game:
    """One stream's transitions: random frames, episodes of random length, n-step 3."""

    def __init__(self, env: int, rng: np.random.Generator) -> None:
        self.env, self.rng, self.t = env, rng, 0
        self._episode()

    def _episode(self) -> None:
        length = int(self.rng.integers(50, 500))
        frames = self.rng.integers(0, 256, (length + 1, 84, 84), dtype=np.uint8)
        idx = np.maximum(np.arange(length + 1)[:, None] + np.arange(-3, 1)[None, :], 0)
        self.stacks = frames[idx]  # [t] = the 4 frames ending at t, the first repeated
        self.length, self.t = length, 0

    def rows(self, k: int) -> dict[str, np.ndarray]:
        if self.t == self.length:
            self._episode()
        t = np.arange(self.t, min(self.t + k, self.length))
        self.t += len(t)
        return {"obs": self.stacks[t], "next_obs": self.stacks[np.minimum(t + 3, self.length)],
                "action": t % 6, "reward": np.zeros(len(t), np.float32),
                "env": np.full(len(t), self.env, np.int64),
                "discount": np.full(len(t), 0.97, np.float32)}


def _measure(spec: Any, args: argparse.Namespace, name: str) -> dict[str, Any]:
    from mpi4py import MPI

    from conduit_hpc.storage import ShardLayout, ShardRing
    from conduit_hpc.transport.rma import RmaWindow

    lay = ShardLayout(spec, args.capacity)
    win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
    try:
        ring = ShardRing(win, 0, 0, lay, timeout_s=10.0)
        rng = np.random.default_rng(0)
        games = [_Game(e, np.random.default_rng(100 + e)) for e in range(args.streams)]
        rows, write_s, firsts = 0, 0.0, []
        while rows < args.rows:
            for g in rng.permutation(len(games)):
                batch = spec.validate(games[g].rows(int(rng.integers(1, 5))))
                t0 = time.perf_counter()
                firsts.append((ring.write(batch), len(batch["env"])))
                ring.advance_commits()  # the owner's commit (no guard band here)
                write_s += time.perf_counter() - t0
                rows += len(batch["env"])
        slots = ring.reserve_cursor()
        commit = ring.commit_cursor()
        seqs = np.arange(max(0, commit - args.capacity), commit)
        _, cursor = ring.gather(seqs % args.capacity)
        is_row = np.zeros(slots, bool)
        for first, n in firsts:
            is_row[first:first + n] = True
        rows_held = int(np.count_nonzero(is_row[seqs]))  # rows among the slots held
        frame_only = slots - rows
        deliverable = int(np.count_nonzero(ring.intact(seqs + 1, cursor) & is_row[seqs]))
        gather_ms = {}
        for k in args.batches:
            times = []
            for _ in range(args.repeats):
                pick = rng.integers(0, args.capacity, k)
                t0 = time.perf_counter()
                ring.gather(pick)
                times.append(time.perf_counter() - t0)
            gather_ms[str(k)] = 1e3 * statistics.median(times)
        slot_bytes = lay.nbytes / args.capacity
        return {"bench": "frames", "git_sha": git_sha(), "layout": name,
                "capacity": args.capacity, "streams": args.streams, "rows": rows,
                "slots": slots, "frame_only_slots": frame_only, "slot_bytes": slot_bytes,
                "stored_bytes_per_transition": slot_bytes * slots / rows,
                "deliverable_fraction": deliverable / max(1, rows_held),
                "ingest_rows_per_s": rows / write_s if write_s > 0 else 0.0,
                "gather_ms": gather_ms}
    finally:
        win.close()


def main(argv: list[str] | None = None) -> dict:
    from conduit_hpc.config import Config
    from conduit_hpc.spec import Spec

    p = argparse.ArgumentParser(prog="conduit-hpc bench frames")
    p.add_argument("--capacity", type=int, default=20_000)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--rows", type=int, default=40_000)
    p.add_argument("--batches", default="32,256")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.capacity, args.rows, args.streams, args.repeats = 1500, 2500, 4, 3
    args.batches = [int(b) for b in str(args.batches).split(",") if b]
    plain = {k: {a: b for a, b in v.items() if a not in ("stack", "next_of")}
             for k, v in ATARI.items()}
    specs = {"full": Spec.from_config(Config.from_dict({"spec": plain}).spec),
             "frames_once": Spec.from_config(Config.from_dict({"spec": ATARI}).spec)}
    results = [_measure(spec, args, name) for name, spec in specs.items()]
    full = results[0]["stored_bytes_per_transition"]
    for r in results:
        r["ratio_to_full"] = r["stored_bytes_per_transition"] / full
        print(jsontext.dumps(r))
    print(f"\n{'layout':<12} {'bytes/transition':>17} {'ratio':>6} {'deliverable':>11} "
          f"{'rows/s':>8} " + " ".join(f"{'gather ' + str(k) + ' ms':>15}"
                                       for k in args.batches))
    for r in results:
        print(f"{r['layout']:<12} {r['stored_bytes_per_transition']:>17,.0f} "
              f"{r['ratio_to_full']:>6.3f} {r['deliverable_fraction']:>11.3f} "
              f"{r['ingest_rows_per_s']:>8.0f} "
              + " ".join(f"{r['gather_ms'][str(k)]:>15.3f}" for k in args.batches))
    return {"results": results}


if __name__ == "__main__":
    main(sys.argv[1:])
