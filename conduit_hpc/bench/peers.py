"""Our cross-process figures beside cpprb and TorchRL in-process, on the same workload.

    conduit-hpc bench peers [--smoke] [--kinds cartpole,atari] [--batches N]
                            [--actors 2] [--modes sync] [--peers cpprb,torchrl]
    conduit-hpc bench peers --profile [--batches 300] [--kinds atari] [--modes sync]
                                                  # cProfile of the learner

**Ours** (MPI ranks: 1 buffer, 1 learner, ``--actors`` actors, one node, shared memory):
the actors first ingest as fast as they can (batches of 1,024 CartPole rows or 32 Atari
rows) for ``--duration`` seconds - the insert rate across processes; then the learner
runs ``--batches`` prioritized batches (sample + priority update of every row, alpha 0.6,
beta 0.4) with the actors idle, then as many again while every actor inserts as fast as
it can; then the same with the uniform sampler (sample only). In ``sync`` mode each
``next_batch`` is an unprefetched batch: its latency (median / p99) is reported.

**Peers**, each in its own process on the same workload (capacity, row layout, batch,
alpha, beta): cpprb's ``PrioritizedReplayBuffer`` / ``ReplayBuffer`` and TorchRL's
``TensorDictPrioritizedReplayBuffer`` / ``TensorDictReplayBuffer`` on a
``LazyTensorStorage``. A peer that is not installed (``pip install conduit_hpc[peers]``)
or does not work with the installed torch (TorchRL's C++ segment trees are built for one
torch version) is skipped, with a note saying so and what to do. A peer runs with glibc's
malloc set to keep freed memory (:data:`PEER_MALLOC`), so that the fresh arrays its
samples return are not page-faulted in anew each time: its best state.

One JSON line per result; then the ratios ours / peer. Rows: ``cartpole`` 45 B (obs and
next_obs float32[4], action int64, reward float32, done uint8), ``atari`` 56,461 B (obs
and next_obs uint8[4,84,84], action, reward, done: random bytes, the full layout) and
``atari-frames`` 56,469 B delivered (``atari``'s fields and an int64 ``env`` stream id,
with the frame stacks declared: the plane stores each frame once; the actors write
stream-consistent rows, 4 games each, n-step 3, interleaved, made as they go, so its
insert rate includes making them). cpprb runs ``atari-frames`` with ``next_of`` +
``stack_compress`` (one stream in order, n-step 1) and without (whole stacks); its
figure is the faster variant's (``peer_variant``). TorchRL skips ``atari-frames``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.bench._args import names, real, whole
from conduit_hpc.bench._peers_inprocess import (
    ALPHA,
    BETA,
    ROWS,
    latency_stats,
    parse_kinds,
    row_source,
    run_cpprb,
    run_torchrl,
    sizes_of,
)
from conduit_hpc.bench.common import git_sha, worker_command
from conduit_hpc.errors import ConfigError

PEERS = ("cpprb", "torchrl")


# ---------------------------------------------------------------------------------
# ours: runs under mpirun (1 buffer, 1 learner, the rest actors)


def _learner_loop(edp: Any, n: int, prioritized: bool, warm: int) -> dict[str, float]:
    batch = edp.config.scheduler.batch_rows
    prios = np.random.default_rng(1).random((n + warm, batch)) + 0.01
    # the loop keeps what it measured and adds nothing else a batch (the peers' timed
    # loops take two clock reads a batch): the parts are split after it
    seen: list[tuple[float, float, float, dict[str, float]]] = []
    clock = time.perf_counter
    t_all = 0.0
    for i in range(n + warm):
        if i == warm:
            # every side starts its window with the cyclic collector done (the peers'
            # _timed_loop too): one full pass over torch's objects takes 80-180 ms
            gc.collect()
            t_all = clock()
        t0 = clock()
        b = edp.next_batch()
        t1 = clock()
        if prioritized:
            edp.update_priorities(b.indices, prios[i])
        if i >= warm:
            seen.append((t0, t1, clock(), b.timings))
    t_end = clock()
    lat = [t2 - t0 for t0, _, t2, _ in seen]
    parts: dict[str, list[float]] = {}
    for t0, t1, t2, timings in seen:
        path = {k: v for k, v in timings.items() if k.endswith("_s")}
        path["other_next_batch_s"] = t1 - t0 - sum(path.values())
        path["update_priorities_s"] = t2 - t1
        for k, v in path.items():
            parts.setdefault(k, []).append(v)
    out: dict[str, Any] = latency_stats(lat, t_end - t_all)
    # where a batch's time goes: the median of each part (they need not add up)
    out["median_parts_s"] = {k: float(np.median(v)) for k, v in parts.items()}
    out["mean_parts_s"] = {k: float(np.mean(v)) for k, v in parts.items()}
    return out


def mode_spec(spec: str) -> tuple[str, str, str]:
    """``MODE[-process][:FETCH]`` (``sync``, ``edp``, ``edp-process:owner``...) ->
    (scheduler.mode, scheduler.delivery, scheduler.fetch)."""
    mode, _, fetch = spec.partition(":")
    mode, _, delivery = mode.partition("-")
    return mode, delivery or "thread", fetch or "direct"


def parse_modes(text: str) -> list[str]:
    """The delivery modes of a comma-separated ``--modes`` value (``MODE[-process]
    [:FETCH]``: MODE ``sync``, ``edp`` or ``service``; ``-process`` with ``edp`` only;
    FETCH ``direct`` or ``owner``); raises ConfigError naming the flag, the value and
    what is allowed. Local."""
    modes = [m.strip() for m in text.split(",")] if text.strip() else []
    if "" in modes:
        raise ConfigError(f"--modes must be a comma-separated list with no empty item, got "
                          f"{text!r}")
    seen: dict[tuple[str, str, str], str] = {}
    for m in modes:
        if mode_spec(m) in seen:  # sync and sync:direct are one mode
            raise ConfigError(f"--modes must name each mode once; got {text!r} ({m!r} is "
                              f"{seen[mode_spec(m)]!r} again)")
        seen[mode_spec(m)] = m
        mode, delivery, fetch = mode_spec(m)
        if (mode not in ("sync", "edp", "service") or delivery not in ("thread", "process")
                or fetch not in ("direct", "owner") or (delivery == "process" and mode != "edp")
                or m.count(":") > 1 or m.partition(":")[0].count("-") > 1):
            raise ConfigError(f"--modes: {m!r} is not MODE[-process][:FETCH] with MODE sync, "
                              f"edp or service ('-process' with edp only) and FETCH direct "
                              f"or owner; got --modes {text!r}")
    if not modes:
        raise ConfigError(f"--modes must name at least one mode, got {text!r}")
    return modes


def check_counts(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--batches`` and ``--actors`` >= 1, ``--duration`` in [0, 1e6) s, or the parser's
    error (exit 2) naming them and the values given."""
    if args.batches < 1 or args.actors < 1 or not 0 <= args.duration < 1e6:
        p.error(f"--batches and --actors must be >= 1 and --duration in [0, 1e6) s, got "
                f"{args.batches}, {args.actors}, {args.duration}")
    rate = getattr(args, "insert_rate", 0.0)
    if not 0 <= rate < 1e12:  # NaN fails too
        p.error(f"--insert-rate must be rows per second in [0, 1e12) (0: every actor "
                f"inserts as fast as it can), got {rate}")


def parse_peers(text: str) -> list[str]:
    """The peers of a comma-separated ``--peers`` value (``cpprb``, ``torchrl``; empty
    or ``none``: no peer); raises ConfigError naming the flag, the value and what is
    allowed. Local."""
    peers = [x for x in text.split(",") if x]
    if peers == ["none"]:
        return []
    bad = [x for x in peers if x not in PEERS]
    if bad:
        raise ConfigError(f"--peers must be a comma-separated list of {', '.join(PEERS)} "
                          f"(or none); got {text!r} (unknown: {', '.join(bad)})")
    return list(dict.fromkeys(peers))  # a peer named twice runs once


def ours_worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    from conduit_hpc import ExperienceDataPlane, Role
    from conduit_hpc.testing import make_config

    comm = MPI.COMM_WORLD
    results: list[dict] = []
    samplers = ("prioritized",) if args.profile else tuple(args.samplers.split(","))
    for kind in parse_kinds(args.kinds):
        sz = sizes_of(kind, smoke=args.smoke, batch_rows=args.batch_size)
        for mode in args.modes.split(","):
            for sampler in samplers:
                m, delivery, fetch = mode_spec(mode)
                cfg = make_config(
                    spec=ROWS[kind], layout={"learners": 1, "buffers": 1},
                    storage={"capacity_rows": sz["capacity"], "priority_exponent": ALPHA},
                    checkpoint={"on_stop": False},
                    scheduler={"mode": m, "delivery": delivery, "fetch": fetch,
                               "batch_rows": sz["batch"],
                               "sampler": sampler, "beta": BETA, "beta_final": BETA,
                               "min_fill_rows": sz["batch"], "prefetch_depth": 2},
                    run={"timeout_s": 120.0})
                with ExperienceDataPlane(cfg, comm) as edp:
                    role = edp.role
                    side = comm.Split(0 if edp.serves else 1,
                                      0 if role is Role.LEARNER else 1 + comm.rank)
                    if edp.serves:
                        side.Free()
                        edp.serve()
                        continue
                    res = _ours_phases(edp, side, kind, sz, args, sampler == "prioritized",
                                       role is Role.LEARNER)
                    edp.done()
                    side.Free()
                    if res is not None:
                        res.update(kind=kind, mode=mode, sampler=sampler)
                        results.append(res)
    for r in results:
        print("RESULT " + jsontext.dumps(r), flush=True)


def _ours_phases(edp: Any, side: Any, kind: str, sz: dict[str, int],
                 args: argparse.Namespace, prioritized: bool, learner: bool
                 ) -> dict | None:
    """Insert phase, then learner batches with idle and with inserting actors. Ranks of
    ``side``: the learner (0) and the actors."""
    from conduit_hpc.transport.objects import gather_json

    n, warm = args.batches, max(5, args.batches // 10)
    if learner:
        side.Barrier()
        ins = gather_json(side, [0, 0.0], root=0)
        assert ins is not None
        rows = sum(r for r, _ in ins)
        out: dict[str, Any] = {"insert_rows_per_s": rows / max(e for _, e in ins),
                               "actors": side.size - 1, "row_bytes": edp.spec.row_bytes,
                               "batch": sz["batch"], "capacity": sz["capacity"]}
        prof = None
        if args.profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        out["idle"] = _learner_loop(edp, n, prioritized, warm)
        if prof is not None:
            prof.disable()
            import io
            import pstats

            s = io.StringIO()
            st = pstats.Stats(prof, stream=s)
            st.sort_stats("tottime").print_stats(35)
            st.sort_stats("cumulative").print_stats(45)
            print(s.getvalue(), flush=True)
        side.Ibarrier().Wait()  # actors start inserting
        if not args.profile:
            out["inserting"] = _learner_loop(edp, n, prioritized, warm)
        side.Ibarrier().Wait()  # actors stop
        during = gather_json(side, [0, 0.0], root=0)
        assert during is not None
        rows = sum(r for r, _ in during)
        out["inserting_rows"] = rows  # all actors', while the learner sampled
        out["inserting_rows_per_s"] = rows / max(max(e for _, e in during), 1e-9)
        return out
    next_rows = row_source(kind, sz["ingest"], seed=side.rank)
    side.Barrier()
    rows, t0 = 0, time.perf_counter()
    # the timed insert phase; at least one lap of the ring, so it is full afterwards
    while (time.perf_counter() - t0 < args.duration
           or rows * (side.size - 1) < sz["capacity"]):
        edp.ingest(next_rows())
        rows += sz["ingest"]
    gather_json(side, [rows, time.perf_counter() - t0], root=0)
    start = side.Ibarrier()
    while not start.Test():  # idle while the learner samples alone
        time.sleep(0.001)
    stop = side.Ibarrier()
    rows, t0 = 0, time.perf_counter()
    # --insert-rate: this actor's share of the rows per second, paced (0: flat out)
    share = getattr(args, "insert_rate", 0.0) / max(side.size - 1, 1)
    while not stop.Test():
        if args.profile:
            time.sleep(0.001)
            continue
        if share > 0:
            ahead = rows / share - (time.perf_counter() - t0)
            if ahead > 0:  # ahead of the pace: wait, still hearing the stop
                time.sleep(min(ahead, 0.005))
                continue
        edp.ingest(next_rows())
        rows += sz["ingest"]
    gather_json(side, [rows, time.perf_counter() - t0], root=0)
    return None


def peer_worker(args: argparse.Namespace) -> None:
    sz = sizes_of(args.kind, smoke=args.smoke, batch_rows=args.batch_size)
    fn = {"cpprb": run_cpprb, "torchrl": run_torchrl}[args.peer]
    try:
        res = fn(args.kind, sz, args.batches, max(sz["capacity"], 10 * sz["ingest"]))
    except ImportError as err:
        res = {"skipped": f"{args.peer} is not installed ({err}); pip install "
                          f"'conduit_hpc[peers]' (or cpprb torchrl tensordict)"}
    res["batch"] = sz["batch"]  # the same rows per batch as ours
    res["malloc"] = {k: os.environ.get(k) for k in PEER_MALLOC}  # as it ran (run_peer)
    print("RESULT " + jsontext.dumps(res), flush=True)


# ---------------------------------------------------------------------------------
# driver


#: glibc's malloc for a peer: keep freed memory instead of handing it back to the system.
#: A peer's sample returns fresh arrays (7 MB a field for 256 Atari rows); by default
#: glibc returned them (munmap or heap trim) and the next sample page-faulted them in
#: again: ~470-730 faults, 1.5-2 ms of a cpprb batch of 256, in some runs and not others
#: (bench/README.md, "Stop 32"). Ours reuses its batch buffers and needs no such setting.
PEER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def run_peer(peer: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "conduit_hpc.bench.peers", "--peer", peer, "--kind", kind,
           "--batches", str(args.batches)] + (["--smoke"] if args.smoke else [])
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                             env={**os.environ, **PEER_MALLOC})
    except subprocess.TimeoutExpired:
        return {"skipped": f"{peer} did not finish within 600 s"}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            r: dict[str, Any] = json.loads(line[7:])
            return r
    tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
    return {"skipped": f"{peer} failed (exit {out.returncode}): {' | '.join(tail)}"}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="conduit-hpc bench peers")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    p.add_argument("--profile", action="store_true",
                   help="cProfile the learner: prioritized, idle actor, the first of --kinds "
                        "and --modes")
    p.add_argument("--kinds", default="cartpole,atari",
                   help="row kinds: cartpole, atari, atari-frames")
    p.add_argument("--modes", default="sync", help="our delivery modes (sync, edp, service)")
    p.add_argument("--batches", type=whole(1, 10**9), default=300, help="timed batches per figure")
    p.add_argument("--actors", type=whole(1, 64), default=2)
    p.add_argument("--duration", type=real(0, 1e6), default=1.0, help="seconds of the insert phase")
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--samplers", type=names(("prioritized", "uniform")),
                   default="prioritized,uniform", help="our samplers")
    p.add_argument("--batch-size", type=whole(1, 10**9), default=None,
                   help="rows per learner batch, every kind and peer (default: each kind's "
                        "own: cartpole 256, atari 32; --smoke 64 and 8)")
    p.add_argument("--insert-rate", type=real(0, 1e12), default=0.0,
                   help="rows/s all actors insert together while the learner samples "
                        "(paced; default 0: as fast as each can)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--peer", default="", help=argparse.SUPPRESS)
    p.add_argument("--kind", default="cartpole", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        for kind in parse_kinds(args.kind if args.peer else args.kinds):
            sizes_of(kind, smoke=args.smoke, batch_rows=args.batch_size)
        peers = parse_peers(args.peers)
        parse_modes(args.modes)
    except ConfigError as err:
        p.error(str(err))
    check_counts(p, args)
    if args.peer:
        peer_worker(args)
        return {}
    if args.worker:
        ours_worker(args)
        return {}
    if args.smoke:
        args.batches, args.duration = 30, 0.1
    if args.profile:  # one mode of one row kind (--kinds, --modes: the first of each)
        args.kinds, args.modes = args.kinds.split(",")[0], args.modes.split(",")[0]
        args.actors, peers = 1, []
    from conduit_hpc.testing import mpirun

    sha = git_sha()
    wargs = ["--worker", "--kinds", args.kinds, "--modes", args.modes, "--samplers",
             args.samplers, "--batches",
             str(args.batches), "--duration", str(args.duration)]
    wargs += ["--smoke"] * args.smoke + ["--profile"] * args.profile
    wargs += ["--insert-rate", repr(args.insert_rate)]
    if args.batch_size is not None:
        wargs += ["--batch-size", str(args.batch_size)]
    out = mpirun(2 + args.actors, worker_command("conduit_hpc.bench.peers", *wargs),
                 timeout_s=900)
    if out.returncode != 0:
        raise RuntimeError(f"bench worker failed ({out.returncode}):\n{out.stderr[-4000:]}")
    if args.profile:
        print(out.stdout)
    results: list[dict] = []
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r.update(system="conduit_hpc", git_sha=sha, bench="peers")
            results.append(r)
            print(jsontext.dumps(r), flush=True)
    for peer in peers:
        for kind in parse_kinds(args.kinds):
            r = run_peer(peer, kind, args)
            r.update(system=peer, kind=kind, git_sha=sha, bench="peers")
            results.append(r)
            print(jsontext.dumps(r), flush=True)
    table = ratios(results)
    for t in table:
        print(jsontext.dumps({**t, "bench": "peers", "git_sha": sha}), flush=True)
    print_table(results, table)
    return {"results": results, "ratios": table}


def ratios(results: list[dict]) -> list[dict]:
    """ours / peer for each row kind, mode and peer that ran."""
    out = []
    for ours in (r for r in results if r["system"] == "conduit_hpc" and "inserting" in r):
        for peer in (r for r in results if r["system"] != "conduit_hpc"
                     and r["kind"] == ours["kind"] and "skipped" not in r):
            key = "prioritized" if ours["sampler"] == "prioritized" else "uniform"
            if key not in peer:
                continue
            pr = peer[key]
            out.append({
                "kind": ours["kind"], "mode": ours["mode"], "sampler": ours["sampler"],
                "peer": peer["system"], "peer_variant": peer.get(f"{key}_variant", ""),
                "rate_ratio_idle": ours["idle"]["batches_per_s"] / pr["batches_per_s"],
                "rate_ratio_inserting":
                    ours["inserting"]["batches_per_s"] / pr["batches_per_s"],
                "median_latency_ratio":
                    ours["idle"]["latency_median_s"] / pr["latency_median_s"],
                "inserting_over_idle":
                    ours["inserting"]["batches_per_s"] / ours["idle"]["batches_per_s"]})
    return out


def print_table(results: list[dict], table: list[dict]) -> None:
    print(f"\n{'system':>12} {'kind':>12} {'mode':>5} {'sampler':>11} {'insert rows/s':>14} "
          f"{'batches/s':>10} {'med ms':>7} {'p99 ms':>7} | {'ins. b/s':>9} {'med ms':>7} "
          f"{'p99 ms':>7} {'rows/s':>10}")
    for r in results:
        if r["system"] == "conduit_hpc":
            a, b = r["idle"], r.get("inserting", r["idle"])
            print(f"{'ours':>12} {r['kind']:>12} {r['mode']:>5} {r['sampler']:>11} "
                  f"{r['insert_rows_per_s']:>14,.0f} {a['batches_per_s']:>10,.0f} "
                  f"{a['latency_median_s'] * 1e3:>7.3f} {a['latency_p99_s'] * 1e3:>7.3f} | "
                  f"{b['batches_per_s']:>9,.0f} {b['latency_median_s'] * 1e3:>7.3f} "
                  f"{b['latency_p99_s'] * 1e3:>7.3f} {r['inserting_rows_per_s']:>10,.0f}")
        elif "skipped" in r:
            print(f"{r['system']:>12} {r['kind']:>12}   skipped: {r['skipped']}")
        else:
            for key in ("prioritized", "uniform"):
                if key in r:
                    a = r[key]
                    print(f"{r['system']:>12} {r['kind']:>12} {'in-p':>5} {key:>11} "
                          f"{r['insert_rows_per_s']:>14,.0f} {a['batches_per_s']:>10,.0f} "
                          f"{a['latency_median_s'] * 1e3:>7.3f} "
                          f"{a['latency_p99_s'] * 1e3:>7.3f} |")
            if "prioritized_skipped" in r:
                print(f"{r['system']:>12} {r['kind']:>12}   prioritized skipped: "
                      f"{r['prioritized_skipped']}")
    print(f"\n{'kind':>12} {'mode':>5} {'sampler':>11} {'peer':>8} {'peer variant':>22} "
          f"{'rate x':>7} {'rate x (ins.)':>13} {'median x':>9} {'ins./idle':>9}")
    for t in table:
        print(f"{t['kind']:>12} {t['mode']:>5} {t['sampler']:>11} {t['peer']:>8} "
              f"{t['peer_variant'] or '-':>22} {t['rate_ratio_idle']:>7.2f} "
              f"{t['rate_ratio_inserting']:>13.2f} {t['median_latency_ratio']:>9.2f} "
              f"{t['inserting_over_idle']:>9.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
