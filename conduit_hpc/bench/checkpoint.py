"""Checkpoint bandwidth and pause, against a plain sequential file write of the same bytes.

    conduit-hpc bench checkpoint [--smoke] [--gb 1.0] [--row-bytes 1024] [--buffers 1]
                                 [--actors 2] [--checkpoints 3] [--dir DIR]

Buffer ranks hold ``--gb`` GB of replay (rows of ``--row-bytes``); actors fill it and then
keep ingesting (at a moderate pace) while the buffer side writes ``--checkpoints``
checkpoints back to back through the periodic path (cut inside the progress loop, HDF5
write on a background thread). Measured in the same run, on the same disk:

* **pause**: the cut (commit pass + memcpy into staging) per checkpoint - the only time
  the progress loop, hence ingest and delivery, stops for a checkpoint;
* **loop gap**: the longest time between two progress-loop passes while a checkpoint is
  being written (GIL contention with the writer thread) and while none is;
* **write GB/s**: checkpoint bytes / wall time from the cut to ``DONE`` (manifest, fsyncs
  and rename included), and for the shard files alone, against a plain sequential write
  (``file.write`` + ``fsync``) of the same bytes from the same memory;
* **read GB/s**: reading a shard back with every checksum verified, and restoring it into
  the ring, against a plain sequential read (``readinto``) of the plain file.

Reads right after writes come mostly from the page cache, for both sides alike. One JSON
line per result (with the git sha), then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import existing_dir, out_file, real, whole
from conduit_hpc.bench.common import git_sha, worker_command
from conduit_hpc.plane.extensions import BufferExtension


class _PassHook(BufferExtension):
    """A function run on every pass of the buffer loop."""

    def __init__(self, fn: Callable[[], int]) -> None:
        self.fn = fn

    def on_pass(self) -> int:
        return self.fn()


# ---------------------------------------------------------------------------------
# worker (under mpirun: buffers first, then actors)


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from conduit_hpc import ExperienceDataPlane, Role
    from conduit_hpc import checkpoint as ck
    from conduit_hpc.features.checkpointing.agent import CheckpointAgent
    from conduit_hpc.features.checkpointing.stopping import StopCoordinator
    from conduit_hpc.storage.snapshot import restore_snapshot
    from conduit_hpc.testing import make_config
    from conduit_hpc.transport.objects import bcast_json, gather_json

    comm = MPI.COMM_WORLD
    cap = max(1000, int(args.gb * 1e9 / args.row_bytes))
    cfg = make_config(spec={"obs": {"dtype": "uint8", "shape": [args.row_bytes]}},
                      layout={"learners": 0, "buffers": args.buffers},
                      storage={"capacity_rows": cap}, run={"timeout_s": 600.0})
    root = Path(args.root)
    out: dict = {}
    with ExperienceDataPlane(cfg, comm) as edp:
        stop = StopCoordinator(edp, signals=())
        agent = CheckpointAgent(edp, root, keep=1)
        world = edp.roles.world
        if edp.role is Role.ACTOR:
            actors = edp.roles.actor
            assert actors is not None
            batch = 256
            data = {"obs": np.random.default_rng(world.rank).integers(
                0, 255, (batch, args.row_bytes), dtype=np.uint8)}
            mine = cap // actors.Get_size()  # no lap: the buffer is not serving yet
            t0 = time.perf_counter()
            for _ in range(mine // batch):  # fill the buffer
                edp.ingest(data)
            out["fill_s"] = time.perf_counter() - t0
            world.Barrier()
            world.Barrier()  # the buffer side starts checkpointing now
            rows = 0
            t0 = time.perf_counter()
            while not stop.requested():  # ingest goes on while checkpoints are written
                edp.ingest(data)
                rows += batch
                time.sleep(0.002)
            out["during_rows_per_s"] = rows / (time.perf_counter() - t0)
            edp.done()
        else:
            world.Barrier()  # the actors are filling: plain writes wait for them
            server = edp.server
            assert server is not None
            gaps = {"busy": 0.0, "idle": 0.0}
            last = [time.perf_counter()]
            first_pass = [0]

            def gap_hook() -> int:
                now = time.perf_counter()
                # the first pass after the fill makes every filled row sampleable: skip it
                if server.passes > first_pass[0] + 1:
                    key = "busy" if agent.busy else "idle"
                    gaps[key] = max(gaps[key], now - last[0])
                last[0] = now
                return 0

            def driver() -> int:  # leader: the next checkpoint as soon as one is done
                if agent.is_leader and not agent.busy and not agent._requests:
                    if agent.completed.total + agent.failed.total >= args.checkpoints:
                        stop.trigger()
                    else:
                        agent.request(reason="bench")
                return 0

            server.add_extension(_PassHook(gap_hook), first=True)
            out["plain_write_s"] = [plain_write(root, edp.world_rank, agent)]
            world.Barrier()
            first_pass[0] = server.passes
            last[0] = time.perf_counter()
            server.add_extension(_PassHook(driver))
            edp.serve()
            out["gaps"] = gaps
        agent.finish()
        out["cuts_s"] = list(agent.cuts_s)
        out["completed"] = list(agent.completed)
        out["failed"] = list(agent.failed)
        # read back the last checkpoint (verified) and restore it into the rings
        world.Barrier()
        last_path = bcast_json(world, agent.completed[-1]["path"] if agent.is_leader
                               else None, root=edp.roles.buffer_ranks[0])
        ckpt = ck.open_checkpoint(last_path, spec=edp.spec)
        shards = edp.owned_shards()
        mine_bytes = 0
        world.Barrier()
        t0 = time.perf_counter()
        snaps = {s.shard_id: ckpt.read_shard(s.shard_id, agent.staging[s.shard_id])
                 for s in shards}
        out["read_s"] = time.perf_counter() - t0
        for s in shards:
            restore_snapshot(s.ring, s.index, snaps[s.shard_id])
        out["restore_s"] = time.perf_counter() - t0
        world.Barrier()
        if shards:
            part = ckpt.counters[edp.world_rank]
            out["file_bytes"] = int(part["checkpoint_bytes"])
            mine_bytes = sum(v.nbytes for v in snaps.values())
            out["snapshot_bytes"] = mine_bytes
        del snaps
        # the plain sequential baseline: the same bytes, from and into the same memory
        world.Barrier()
        if shards:
            out["plain_write_s"].append(plain_write(root, edp.world_rank, agent))
            out["plain_bytes"] = plain_path(root, edp.world_rank).stat().st_size
        world.Barrier()
        if shards:
            t0 = time.perf_counter()
            with open(plain_path(root, edp.world_rank), "rb") as fh:
                for a in staged_arrays(agent):
                    fh.readinto(a.reshape(-1).view(np.uint8).data)
            out["plain_read_s"] = time.perf_counter() - t0
            plain_path(root, edp.world_rank).unlink()
        out["writes_s"] = list(agent.writes_s)
        out["role"] = edp.role.value
        everyone = gather_json(world, out, root=0)
    if comm.rank == 0:
        assert everyone is not None
        print("RESULT " + jsontext.dumps(summarize(everyone, args, cap)), flush=True)


def plain_path(root: Path, rank: int) -> Path:
    return root / f"plain-{rank}.bin"


def staged_arrays(agent) -> list[np.ndarray]:
    return [a for st in agent.staging.values() for a in (
        st.seqs, st.priority, st.init_priority, *st.columns.values())]


def plain_write(root: Path, rank: int, agent) -> float:
    """Seconds to write the staging memory to one file, sequentially, and fsync it."""
    t0 = time.perf_counter()
    with open(plain_path(root, rank), "wb") as fh:
        for a in staged_arrays(agent):
            fh.write(a.reshape(-1).view(np.uint8).data)
        fh.flush()
        os.fsync(fh.fileno())
    return time.perf_counter() - t0


def summarize(parts: list[dict], args: argparse.Namespace, cap: int) -> dict:
    bufs = [p for p in parts if p["role"] == "buffer"]
    acts = [p for p in parts if p["role"] == "actor"]
    completed = [c for p in bufs for c in p["completed"]]
    cuts = [c for p in bufs for c in p["cuts_s"]]
    ck_bytes = sum(p["file_bytes"] for p in bufs)
    plain_bytes = sum(p["plain_bytes"] for p in bufs)
    walls = [c["seconds"] for c in completed]
    # best of each, side by side (the machine is shared: medians are in the JSON too)
    wall = min(walls, default=float("nan"))
    shard_w = max(min(p["writes_s"]) for p in bufs)
    plain_w = max(min(p["plain_write_s"]) for p in bufs)
    snap_bytes = sum(p["snapshot_bytes"] for p in bufs)
    read_s = max(p["read_s"] for p in bufs)
    plain_r = max(p["plain_read_s"] for p in bufs)
    r = {
        "bench": "checkpoint", "buffer_gb": args.gb, "row_bytes": args.row_bytes,
        "capacity_rows": cap, "buffers": args.buffers, "actors": args.actors,
        "checkpoints": len(completed), "failed": sum(len(p["failed"]) for p in bufs),
        "checkpoint_bytes": ck_bytes, "plain_bytes": plain_bytes,
        "pause_s_median": float(np.median(cuts)) if cuts else float("nan"),
        "pause_s_max": max(cuts, default=float("nan")),
        "loop_gap_s_max_writing": max(p["gaps"]["busy"] for p in bufs),
        "loop_gap_s_max_idle": max(p["gaps"]["idle"] for p in bufs),
        "checkpoint_wall_s_best": wall,
        "checkpoint_wall_s_median": float(np.median(walls)) if walls else float("nan"),
        "shard_write_s_all": [w for p in bufs for w in p["writes_s"]],
        "plain_write_s_all": [w for p in bufs for w in p["plain_write_s"]],
        "write_gbps": ck_bytes / wall / 1e9,
        "shard_write_gbps": ck_bytes / shard_w / 1e9,
        "plain_write_gbps": plain_bytes / plain_w / 1e9,
        "read_gbps": snap_bytes / read_s / 1e9,
        "restore_gbps": snap_bytes / max(p["restore_s"] for p in bufs) / 1e9,
        "plain_read_gbps": plain_bytes / plain_r / 1e9,
        "ingest_rows_per_s_during": sum(p["during_rows_per_s"] for p in acts),
    }
    r["write_ratio_to_plain"] = r["write_gbps"] / r["plain_write_gbps"]
    r["shard_write_ratio_to_plain"] = r["shard_write_gbps"] / r["plain_write_gbps"]
    r["read_ratio_to_plain"] = r["read_gbps"] / r["plain_read_gbps"]
    return r


# ---------------------------------------------------------------------------------
# driver


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench checkpoint")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    p.add_argument("--gb", type=real(0, 4096, open_lo=True), default=1.0,
                   help="replay bytes over all buffers")
    p.add_argument("--row-bytes", type=whole(1, 1 << 30), default=1024)
    p.add_argument("--buffers", type=whole(1, 64), default=1)
    p.add_argument("--actors", type=whole(1, 64), default=2)
    p.add_argument("--checkpoints", type=whole(1, 10**4), default=3)
    p.add_argument("--dir", type=existing_dir, default="",
                   help="where to write (default: a temp dir)")
    p.add_argument("--out", type=out_file, default="",
                   help="also append the JSON line to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    if args.smoke:
        args.gb, args.actors, args.checkpoints = 0.01, 1, 2
    from conduit_hpc.testing import mpirun

    root = Path(tempfile.mkdtemp(prefix="conduit-bench-ckpt-", dir=args.dir or None))
    try:
        n = args.buffers + args.actors
        out = mpirun(n, worker_command("conduit_hpc.bench.checkpoint", "--worker", "--root",
                                       str(root), "--gb", str(args.gb), "--row-bytes",
                                       str(args.row_bytes), "--buffers", str(args.buffers),
                                       "--actors", str(args.actors), "--checkpoints",
                                       str(args.checkpoints)),
                     timeout_s=120 + 300 * args.gb)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if out.returncode != 0:
        raise RuntimeError(f"bench worker failed ({out.returncode}):\n{out.stderr[-4000:]}")
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[7:])
    result.update(git_sha=git_sha(), disk=str(Path(args.dir or tempfile.gettempdir())))
    print(jsontext.dumps(result))
    if args.out:
        with open(args.out, "a") as f:
            f.write(jsontext.dumps(result) + "\n")
    print_table(result)
    return result


def print_table(r: dict) -> None:
    gb = r["checkpoint_bytes"] / 1e9
    print(f"\ncheckpoint of {gb:.2f} GB ({r['buffers']} buffer rank(s), {r['actors']} actors "
          f"ingesting meanwhile), {r['checkpoints']} checkpoints, disk {r['disk']}")
    print(f"  pause (cut) per checkpoint : median {r['pause_s_median'] * 1e3:.1f} ms, "
          f"max {r['pause_s_max'] * 1e3:.1f} ms")
    print(f"  progress-loop gap          : max {r['loop_gap_s_max_writing'] * 1e3:.1f} ms while "
          f"writing, {r['loop_gap_s_max_idle'] * 1e3:.1f} ms otherwise")
    print(f"  write  (cut..DONE)         : {r['write_gbps']:.2f} GB/s  "
          f"= {r['write_ratio_to_plain']:.2f} x plain write ({r['plain_write_gbps']:.2f} GB/s)")
    print(f"  write  (shard files only)  : {r['shard_write_gbps']:.2f} GB/s  "
          f"= {r['shard_write_ratio_to_plain']:.2f} x plain write")
    print(f"  read   (checksums verified): {r['read_gbps']:.2f} GB/s  "
          f"= {r['read_ratio_to_plain']:.2f} x plain read ({r['plain_read_gbps']:.2f} GB/s); "
          f"read + restore into the ring {r['restore_gbps']:.2f} GB/s")


if __name__ == "__main__":
    main(sys.argv[1:])
