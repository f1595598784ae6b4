"""Ingest throughput into one buffer rank, as a ratio to single-core memcpy.

    conduit-hpc bench ingest [--smoke] [--duration S] [--transports shm,rma]

For 1, 2 and 4 actor ranks, rows of 4 float32 and Atari-sized rows (2 x 4x84x84 uint8),
batch sizes 1, 64 and 1024: every actor ingests as fast as it can for ``--duration``
seconds into a single buffer rank; aggregate rows/s and GB/s are compared with numpy
memcpy bandwidth on one core, measured in the same run. One JSON line per result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import names, out_file, real, wholes
from conduit_hpc.bench.common import git_sha, worker_command

ROWS = {
    "float4": {"obs": {"dtype": "float32", "shape": [4]}},
    "atari": {"obs": {"dtype": "uint8", "shape": [4, 84, 84]},
              "next_obs": {"dtype": "uint8", "shape": [4, 84, 84]}},
}


def memcpy_gbps(nbytes: int = 64 << 20, repeats: int = 7) -> float:
    """Best-of single-core numpy copy bandwidth (bytes copied per second / 1e9)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


# ---------------------------------------------------------------------------------
# worker (runs under mpirun: rank 0 is the buffer, the rest are actors)


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from conduit_hpc import ExperienceDataPlane, Role
    from conduit_hpc.testing import make_config
    from conduit_hpc.transport.objects import gather_json

    comm = MPI.COMM_WORLD
    results = []
    for kind in args.kinds.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            spec = ROWS[kind]
            cfg = make_config(spec=spec, layout={"learners": 0, "buffers": 1},
                              storage={"capacity_rows": max(4 * batch, 4096)
                                       if kind == "float4" else max(2 * batch, 256)},
                              transport={"shared_memory": args.transport})
            with ExperienceDataPlane(cfg, comm) as edp:
                rows = 0
                elapsed = 0.0
                if edp.role is Role.ACTOR:
                    rng = np.random.default_rng(comm.rank)
                    data = {f.name: rng.integers(0, 255, (batch, *f.shape)).astype(f.dtype)
                            for f in edp.spec}
                    for _ in range(3):
                        edp.ingest(data)
                    actors = edp.roles.actor
                    assert actors is not None
                    actors.Barrier()
                    t0 = time.perf_counter()
                    end = t0 + args.duration
                    while time.perf_counter() < end:
                        edp.ingest(data)
                        rows += batch
                    elapsed = time.perf_counter() - t0
                    edp.done()
                else:
                    edp.serve()
                stats = gather_json(edp.roles.world, [rows, elapsed], root=0)
                row_bytes = edp.spec.row_bytes
            if comm.rank == 0:
                assert stats is not None
                total = sum(r for r, _ in stats)
                wall = max(e for _, e in stats)
                results.append({"kind": kind, "batch": batch, "actors": comm.size - 1,
                                "transport": args.transport, "row_bytes": row_bytes,
                                "rows": total, "seconds": wall,
                                "rows_per_s": total / wall,
                                "gbps": total * row_bytes / wall / 1e9})
    if comm.rank == 0:
        for r in results:
            print("RESULT " + jsontext.dumps(r), flush=True)


# ---------------------------------------------------------------------------------
# driver


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench ingest")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    p.add_argument("--duration", type=real(0, 1e6, open_lo=True), default=1.0,
                   help="timed seconds per case")
    p.add_argument("--actors", type=wholes(1, 256), default="1,2,4")
    p.add_argument("--kinds", type=names(ROWS), default="float4,atari")
    p.add_argument("--batches", type=wholes(1, 1 << 24), default="1,64,1024")
    p.add_argument("--transports", type=names(("shm", "rma")), default="shm,rma",
                   help="shm: direct shared-memory stores; rma: MPI_Put through the window")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--transport", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--out", type=out_file, default="",
                   help="also append the JSON lines to this file")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    if args.smoke:
        args.duration, args.actors, args.batches = 0.05, "2", "1,64"
        args.transports = "shm"
    from conduit_hpc.testing import mpirun

    sha = git_sha()
    bw = memcpy_gbps()
    results: list[dict] = []
    for transport in args.transports.split(","):
        shared = {"shm": "auto", "rma": "never"}[transport]
        for n in [int(a) for a in args.actors.split(",")]:
            out = mpirun(n + 1, worker_command("conduit_hpc.bench.ingest", "--worker", "--duration",
                                            str(args.duration), "--kinds", args.kinds,
                                            "--batches", args.batches, "--transport",
                                            shared),
                         timeout_s=120 + 20 * args.duration * 6)
            if out.returncode != 0:
                raise RuntimeError(f"bench worker failed ({out.returncode}):\n{out.stderr}")
            for line in out.stdout.splitlines():
                if line.startswith("RESULT "):
                    r = json.loads(line[7:])
                    r.update(transport=transport, memcpy_gbps=bw,
                             ratio_to_memcpy=r["gbps"] / bw, git_sha=sha, bench="ingest")
                    results.append(r)
    lines = [jsontext.dumps(r) for r in results]
    for ln in lines:
        print(ln)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    print_table(results, bw)
    best_atari = max((r["ratio_to_memcpy"] for r in results
                      if r["kind"] == "atari" and r["batch"] >= 64), default=float("nan"))
    return {"memcpy_gbps": bw, "results": results, "best_atari_batched_ratio": best_atari}


def print_table(results: list[dict], bw: float) -> None:
    print(f"\nsingle-core numpy memcpy: {bw:.2f} GB/s")
    print(f"{'transport':>9} {'rows':>7} {'batch':>6} {'actors':>6} {'rows/s':>12} "
          f"{'GB/s':>8} {'x memcpy':>9}")
    for r in results:
        print(f"{r['transport']:>9} {r['kind']:>7} {r['batch']:>6} {r['actors']:>6} "
              f"{r['rows_per_s']:>12,.0f} {r['gbps']:>8.3f} {r['ratio_to_memcpy']:>9.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
