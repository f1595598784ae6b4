"""Stored bytes per Atari transition, each frame stored once against whole stacks; and
what a checkpoint of each takes, with and without compression.

    conduit-hpc bench frames [--capacity 20000] [--streams 8] [--rows 40000]
                             [--batches 32,256] [--repeats 20] [--smoke]
                             [--frames random|ale] [--game ALE/Pong-v5]
                             [--checkpoint] [--codec gzip] [--dir DIR]

One process, no MPI job: two shards of ``--capacity`` slots in shared-memory RMA windows
on ``COMM_SELF``, one of the Atari spec with its frame stacks declared (the frame-once
layout, :mod:`conduit_hpc.storage.frames`) and one of the same spec without (the full
layout: ``obs`` and ``next_obs`` each hold 4 frames). ``--streams`` games of 84 x 84
frames and random episode lengths (50-500 steps), n-step 3, write ``--rows``
transitions into both, interleaved in batches of 1-4 rows a stream as Ape-X actors do;
then batches of each size in ``--batches`` are gathered from both. The frames are
random bytes (``--frames random``, the default: incompressible), or real ones
(``--frames ale``: each stream plays ``--game`` with random actions through the Atari
job's preprocessing; needs the ``[atari]`` extra).

Reports, per layout (one JSON line each): bytes a shard takes per slot (columns, stamps,
index), slots per transition written (frames-once writes extra slots at episode starts),
so **stored bytes per transition** and its ratio to the full layout (goal <= 1/6); the
fraction of held rows that are deliverable (a frame-once row dies with its oldest frame);
ingest rows/s and gather ms per batch.

``--checkpoint``: each shard is then cut and written as a one-shard HDF5 checkpoint under
``--dir`` (a temporary directory on the default one) without compression and with the
frame columns (``obs``, ``next_obs``; a stacked field's codec covers its frames) through
``--codec``: **bytes on disk** per transition, **save** seconds (cut, shard file,
manifest, fsyncs, ``DONE``) and **restore** seconds (open, read with every checksum
verified and every block decompressed, write back into a fresh ring); the restored
shard's rows are compared with the original's (a sample of 512). Reads right after
writes come mostly from the page cache. Times are noisy on a shared machine: compare the
layouts of one run, not runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import existing_dir, whole, wholes
from conduit_hpc.bench.common import AtariGame, git_sha
from conduit_hpc.config import CHECKPOINT_CODECS

ATARI: dict[str, dict[str, Any]] = {
    "obs": {"dtype": "uint8", "shape": [4, 84, 84], "stack": {"axis": 0, "stream": "env"}},
    "next_obs": {"dtype": "uint8", "shape": [4, 84, 84], "next_of": "obs"},
    "action": {"dtype": "int64"},
    "reward": {"dtype": "float32"},
    "env": {"dtype": "int64"},
    "discount": {"dtype": "float32"},
}


class AleFrames:
    """Real frames of one stream: a game played with random actions through the Atari
    job's preprocessing (84 x 84 grayscale, frame skip 4), the newest frame of each
    step, the game reset when it ends (also what ``scripts/measure_codecs.py`` and
    ``scripts/longhaul_atari.py`` record)."""

    def __init__(self, game: str, seed: int) -> None:
        from conduit_hpc.rl.atari import AtariSection, make_atari_vector_env

        self.env, obs = make_atari_vector_env(game, 1, seed, AtariSection())
        self.last = obs[0, -1].copy()

    def take(self, n: int) -> np.ndarray:
        out = np.empty((n, 84, 84), np.uint8)
        for i in range(n):
            out[i] = self.last
            obs, *_ = self.env.step(self.env.action_space.sample())
            self.last = obs[0, -1].copy()
        return out


def _games(args: argparse.Namespace) -> list[AtariGame]:
    return [AtariGame(e, np.random.default_rng(100 + e),
                  AleFrames(args.game, 100 + e) if args.frames == "ale" else None)
            for e in range(args.streams)]


def _measure(spec: Any, args: argparse.Namespace, name: str) -> dict[str, Any]:
    from mpi4py import MPI

    from conduit_hpc.storage import ShardLayout, ShardRing
    from conduit_hpc.transport.rma import RmaWindow

    lay = ShardLayout(spec, args.capacity)
    win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
    try:
        ring = ShardRing(win, 0, 0, lay, timeout_s=10.0)
        rng = np.random.default_rng(0)
        games = _games(args)
        rows, write_s, firsts = 0, 0.0, []
        while rows < args.rows:
            for g in rng.permutation(len(games)):
                rows_g = games[g].rows(int(rng.integers(1, 5)))
                batch = spec.validate({k: rows_g[k] for k in ATARI})
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
        out = {"bench": "frames", "git_sha": git_sha(), "layout": name,
               "frames": args.frames, "capacity": args.capacity, "streams": args.streams,
               "rows": rows, "slots": slots, "frame_only_slots": frame_only,
               "slot_bytes": slot_bytes,
               "stored_bytes_per_transition": slot_bytes * slots / rows,
               "deliverable_fraction": deliverable / max(1, rows_held),
               "ingest_rows_per_s": rows / write_s if write_s > 0 else 0.0,
               "gather_ms": gather_ms, "load_avg": list(os.getloadavg())}
        if args.checkpoint:
            out["checkpoint"] = [_checkpoint(win, lay, codec, args, rows_held)
                                 for codec in ("none", args.codec)]
        return out
    finally:
        win.close()


def _checkpoint(win: Any, lay: Any, codec: str, args: argparse.Namespace,
                rows_held: int) -> dict[str, Any]:
    """Cut the shard in ``win``, write it as a checkpoint (frame fields through
    ``codec``), restore it into a fresh ring and compare rows. Blocks for the disk."""
    from mpi4py import MPI

    from conduit_hpc import checkpoint as ck
    from conduit_hpc.storage import ShardRing
    from conduit_hpc.storage.frames import stored_owner, stored_spec
    from conduit_hpc.storage.priority import PriorityIndex
    from conduit_hpc.storage.snapshot import restore_snapshot, take_snapshot
    from conduit_hpc.transport.rma import RmaWindow

    cap, spec = args.capacity, lay.spec
    owner = ShardRing(win, 0, 0, lay, timeout_s=10.0)
    owner.views = lay.views(win.own_segment(), 0)
    index = PriorityIndex(cap, alpha=0.6)
    commit = owner.commit_cursor()
    seqs = np.arange(max(0, commit - cap), commit, dtype=np.int64)
    index.insert(seqs % cap, seqs + 1, owner.views.priority[seqs % cap])
    codecs = {col: codec for col, of in stored_owner(spec).items()
              if of in ("obs", "next_obs")}
    base = Path(tempfile.mkdtemp(prefix="bench-frames-", dir=args.dir))
    try:
        t0 = time.perf_counter()
        snap = take_snapshot(0, owner, index)
        tmp = base / ".tmp-ckpt"
        tmp.mkdir()
        rec = ck.write_shard_file(tmp / "buffer-0000.h5", [snap], compression=codecs,
                                  described=ck.dataset_attrs(stored_spec(spec)))
        parts = [{"world_rank": 0, "role": "buffer", "rng": None, "counters": {},
                  "files": [rec["file"]], "shards": rec["shards"]}]
        man = ck.write_manifest(
            tmp, seq=1, spec=stored_spec(spec), config_toml="", parts=parts,
            layout={"world_size": 1, "learner_ranks": [], "buffer_ranks": [0],
                    "actor_ranks": [], "node_of": [0]},
            placement={"shards": [{"shard_id": 0, "owner_rank": 0, "tier": "buffer_host",
                                   "capacity_rows": cap}],
                       "actor_shards": {}, "learner_shards": {}})
        final = base / ck.checkpoint_name(1)
        ck.finalize(tmp, final, man)
        save_s = time.perf_counter() - t0
        disk = sum(f.stat().st_size for f in final.iterdir())
        del snap
        win2 = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF, shared=True)
        try:
            ring2 = ShardRing(win2, 0, 0, lay, timeout_s=10.0)
            ring2.views = lay.views(win2.own_segment(), 0)
            t0 = time.perf_counter()
            back = ck.open_checkpoint(final, spec=stored_spec(spec)).read_shard(0)
            restore_snapshot(ring2, PriorityIndex(cap, alpha=0.6), back)
            restore_s = time.perf_counter() - t0
            del back
            pick = np.random.default_rng(1).choice(seqs, min(512, len(seqs)), replace=False)
            a, ca = owner.gather(pick % cap)
            b, cb = ring2.gather(pick % cap)
            ok = ring2.intact(pick + 1, cb) & owner.intact(pick + 1, ca)
            exact = all(np.array_equal(a[k][ok], b[k][ok]) for k in a)
        finally:
            win2.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"codec": codec, "disk_bytes": disk,
            "disk_bytes_per_transition": disk / max(1, rows_held),
            "save_s": save_s, "restore_s": restore_s, "rows_compared": int(ok.sum()),
            "exact": bool(exact)}


#: bytes one stream's game holds at most: an episode of up to 500 frames and its stacks
STREAM_BYTES = 5 * 500 * 84 * 84


def _check_memory(p: argparse.ArgumentParser, args: argparse.Namespace, full: Any) -> None:
    """Refuse, before anything is allocated, options whose run cannot fit in the memory
    free here (before: ``--batches 1048576`` or ``--streams 65536`` ended in a numpy
    MemoryError traceback, or in the kernel's OOM killer): the full layout's shard
    window, each stream's episode and stacks, and the largest gathered batch (whole
    stacks, and the copies a gather makes). Names the option that takes the most."""
    from conduit_hpc.plane.memory import free_memory_bytes
    from conduit_hpc.storage import ShardLayout

    free = free_memory_bytes()
    if free is None:
        return
    takes = {"--capacity": (args.capacity, ShardLayout(full, args.capacity).nbytes),
             "--streams": (args.streams, args.streams * STREAM_BYTES),
             "--batches": (",".join(map(str, args.batches)),
                           2 * max(args.batches) * full.row_bytes)}
    need = sum(b for _, b in takes.values())
    if need > free:
        flag = max(takes, key=lambda k: takes[k][1])
        parts = ", ".join(f"{k} {v} {b:,} bytes" for k, (v, b) in takes.items())
        p.error(f"argument {flag}: must leave the run within the {free:,} bytes of memory "
                f"free here; it needs {need:,} ({parts}), got {str(takes[flag][0])!r}")


def main(argv: list[str] | None = None) -> dict:
    from conduit_hpc.config import Config
    from conduit_hpc.spec import Spec

    p = argparse.ArgumentParser(prog="conduit-hpc bench frames")
    # 32: the slots a batch of 4 Atari rows may need (8 new frames each)
    p.add_argument("--capacity", type=whole(32, 1 << 30), default=20_000)
    p.add_argument("--streams", type=whole(1, 1 << 16), default=8)
    p.add_argument("--rows", type=whole(1, 1 << 31), default=40_000)
    p.add_argument("--batches", type=wholes(1, 1 << 20), default="32,256")
    p.add_argument("--repeats", type=whole(1, 10**6), default=20)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--frames", choices=("random", "ale"), default="random")
    p.add_argument("--game", default="ALE/Pong-v5")
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--codec", default="gzip", choices=CHECKPOINT_CODECS)
    p.add_argument("--dir", type=existing_dir, default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.capacity, args.rows, args.streams, args.repeats = 1500, 2500, 4, 3
    args.batches = [int(b) for b in str(args.batches).split(",") if b]
    plain = {k: {a: b for a, b in v.items() if a not in ("stack", "next_of")}
             for k, v in ATARI.items()}
    specs = {"full": Spec.from_config(Config.from_dict({"spec": plain}).spec),
             "frames_once": Spec.from_config(Config.from_dict({"spec": ATARI}).spec)}
    _check_memory(p, args, specs["full"])
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
    if args.checkpoint:
        full_disk = results[0]["checkpoint"][0]["disk_bytes_per_transition"]
        print(f"\n{'checkpoint':<22} {'disk bytes/transition':>21} {'ratio':>6} "
              f"{'save s':>7} {'restore s':>9} {'exact':>5}")
        for r in results:
            for c in r["checkpoint"]:
                c["ratio_to_full"] = c["disk_bytes_per_transition"] / full_disk
                print(f"{r['layout'] + ' + ' + c['codec']:<22} "
                      f"{c['disk_bytes_per_transition']:>21,.0f} {c['ratio_to_full']:>6.3f} "
                      f"{c['save_s']:>7.2f} {c['restore_s']:>9.2f} {c['exact']!s:>5}")
    print(f"load average {os.getloadavg()}")
    return {"results": results}


if __name__ == "__main__":
    main(sys.argv[1:])
