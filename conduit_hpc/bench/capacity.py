"""Delivery capacity: the most prioritized batches per second a learner that computes
nothing gets, per delivery mode and fetch, beside cpprb and TorchRL in process.

    conduit-hpc bench capacity [--smoke] [--kinds cartpole,atari,atari-frames]
                               [--modes sync,edp,edp-process,sync:owner] [--batches N]
                               [--actors 2] [--peers cpprb,torchrl] [--batch-size B]
                               [--insert-rate ROWS_PER_S] [--repeat N]

Each mode runs the workload of ``conduit-hpc bench peers`` (rows, capacity, batch,
alpha 0.6, beta 0.4; :mod:`conduit_hpc.bench.peers`) on its own ``mpirun`` (1 buffer, 1
learner, ``--actors`` actors, plus the learner's delivery rank for ``edp-process``): the
actors fill the ring, then the learner takes ``--batches`` prioritized batches, each
followed by a priority update of every row, with the actors idle (0 inserting), then as
many again while every actor inserts as fast as it can (``--insert-rate R``: all
actors together at R rows/s, paced; the table's ``rows/s ins.`` is what they reached).
A mode is ``MODE[-process][:FETCH]``: ``sync`` (inline), ``edp`` (a data-plane thread
prefetches), ``edp-process`` (a delivery rank prefetches), fetch ``direct`` (default) or
``owner``. The peers run in their own process on the same rows; one that is missing or
broken is skipped with a note. One JSON line per result, then the ratios ours / peer and
inserting / idle. ``--repeat N`` runs all of it N times, one run after another (each
run's ratios are to the peers of the same run, so a slow or fast spell of the machine
moves both), and adds the median and range of every figure over the runs: on a busy
2-core machine one run's spread is wider than a 10% goal.

Row kinds (``--kinds``): ``cartpole``, ``atari`` (random bytes, the full layout: each row
holds ``obs`` and ``next_obs`` as 2 x uint8[4, 84, 84]) and ``atari-frames``: the same
Atari transition (plus an ``env`` stream id) with its frame stacks declared, so the plane
stores each frame once (:mod:`conduit_hpc.storage.frames`); the actors write
stream-consistent rows (4 games each, n-step 3, interleaved), batch 32 as ``atari``. Set
``atari`` and ``atari-frames`` side by side for the frame-once layout against the full one
on the same delivered rows. cpprb runs ``atari-frames`` with its ``next_of`` +
``stack_compress`` (one stream in order, n-step 1: what that scheme supports) and
without (whole stacks); ``x cpprb`` is against the faster of the two (the harder bar;
``cpprb_variant`` names it). TorchRL skips ``atari-frames`` with a note.

Batch (``--batch-size``): each kind's own by default (``cartpole`` 256, ``atari`` and
``atari-frames`` 32; ``--smoke`` 64 and 8); ``--batch-size B`` gives every kind and peer
a batch of ``B`` rows, e.g. ``--kinds atari,atari-frames --batch-size 256`` for the
issue's second Atari batch through every delivery mode. A value outside 1 .. half a
kind's ring (2,000 rows for the Atari kinds, 128 at ``--smoke``) is refused before
anything runs, naming ``--batch-size``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.bench._args import real, whole
from conduit_hpc.bench._peers_inprocess import parse_kinds, sizes_of
from conduit_hpc.bench.common import git_sha, worker_command
from conduit_hpc.bench.peers import (
    PEERS,
    check_counts,
    mode_spec,
    parse_modes,
    parse_peers,
    run_peer,
)
from conduit_hpc.errors import ConfigError

__all__ = ["main"]


def _ours(mode: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from conduit_hpc.testing import mpirun

    _, delivery, _ = mode_spec(mode)
    ranks = 2 + args.actors + (1 if delivery == "process" else 0)
    wargs = ["--worker", "--kinds", args.kinds, "--modes", mode, "--samplers", "prioritized",
             "--batches", str(args.batches), "--duration", str(args.duration)]
    wargs += ["--smoke"] * args.smoke + ["--insert-rate", repr(args.insert_rate)]
    if args.batch_size is not None:
        wargs += ["--batch-size", str(args.batch_size)]
    out = mpirun(ranks, worker_command("conduit_hpc.bench.peers", *wargs), timeout_s=900)
    if out.returncode != 0:
        return [{"system": "conduit_hpc", "mode": mode,
                 "failed": f"exit {out.returncode}: {out.stderr.strip()[-1500:]}"}]
    res = [json.loads(line[7:]) for line in out.stdout.splitlines()
           if line.startswith("RESULT ")]
    for r in res:
        r.update(system="conduit_hpc", mode=mode)
    return res


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row kind and mode: batches/s idle and inserting, inserting / idle, and ours /
    each peer's prioritized sample + update rate (cpprb on ``atari-frames``: its faster
    variant, named in ``cpprb_variant``)."""
    out = []
    for r in results:
        if r["system"] != "conduit_hpc" or "idle" not in r:
            continue
        row: dict[str, Any] = {
            "kind": r["kind"], "mode": r["mode"], "batch": r.get("batch"),
            "idle_batches_per_s": r["idle"]["batches_per_s"],
            "idle_median_ms": r["idle"]["latency_median_s"] * 1e3,
            "inserting_batches_per_s": r["inserting"]["batches_per_s"],
            "inserting_rows_per_s": r["inserting_rows_per_s"],
            "inserting_over_idle": r["inserting"]["batches_per_s"] / r["idle"]["batches_per_s"]}
        for peer in results:
            if (peer["system"] in PEERS and peer.get("kind") == r["kind"]
                    and "prioritized" in peer):
                row[f"over_{peer['system']}"] = (r["idle"]["batches_per_s"]
                                                 / peer["prioritized"]["batches_per_s"])
                if "prioritized_variant" in peer:
                    row[f"{peer['system']}_variant"] = peer["prioritized_variant"]
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="conduit-hpc bench capacity")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    p.add_argument("--kinds", default="cartpole,atari",
                   help="row kinds: cartpole, atari, atari-frames")
    p.add_argument("--modes", default="sync,edp,edp-process,sync:owner")
    p.add_argument("--batches", type=whole(1, 10**9), default=400, help="timed batches per phase")
    p.add_argument("--actors", type=whole(1, 64), default=2)
    p.add_argument("--duration", type=real(0, 1e6), default=1.0, help="seconds of the first fill")
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--batch-size", type=whole(1, 10**9), default=None,
                   help="rows per learner batch, every kind and peer (default: each kind's "
                        "own: cartpole 256, atari and atari-frames 32; --smoke 64 and 8)")
    p.add_argument("--insert-rate", type=real(0, 1e12), default=0.0,
                   help="rows/s all actors insert together in the inserting phase (paced; "
                        "default 0: every actor as fast as it can)")
    p.add_argument("--repeat", type=whole(1, 100), default=1,
                   help="runs of every mode and peer, interleaved (each run's ratios are "
                        "to the peers of the same run); the summary gives their median "
                        "and range")
    args = p.parse_args(argv)
    try:
        kinds = parse_kinds(args.kinds)
        modes = parse_modes(args.modes)
        peers = parse_peers(args.peers)
        for kind in kinds:  # before anything runs
            sizes_of(kind, smoke=args.smoke, batch_rows=args.batch_size)
    except ConfigError as err:
        p.error(str(err))
    check_counts(p, args)
    if not 1 <= args.repeat <= 100:
        p.error(f"--repeat must be a number of runs from 1 to 100, got {args.repeat}")
    if args.smoke:
        args.batches, args.duration = 30, 0.1
    sha = git_sha()
    load = os.getloadavg()[0]
    results: list[dict[str, Any]] = []
    table: list[dict[str, Any]] = []
    for rep in range(args.repeat):  # ours, then the peers, run after run
        run: list[dict[str, Any]] = []
        for mode in modes:
            for r in _ours(mode, args):
                r.update(git_sha=sha, bench="capacity", load_1min=os.getloadavg()[0],
                         run=rep)
                run.append(r)
                print(jsontext.dumps(r), flush=True)
        for peer in peers:
            for kind in kinds:
                r = run_peer(peer, kind, args)
                r.update(system=peer, kind=kind, git_sha=sha, bench="capacity", run=rep)
                run.append(r)
                print(jsontext.dumps(r), flush=True)
        results += run
        table += [{**t, "run": rep} for t in ratios(run)]
    peers = sorted({k[5:] for t in table for k in t if k.startswith("over_")})
    print(f"\n{'kind':>12} {'mode':>18} {'run':>3} {'batch':>5} {'idle b/s':>9} {'med ms':>7} "
          f"{'ins. b/s':>9} {'ins/idle':>8} {'rows/s ins.':>12} "
          + " ".join(f"{'x ' + q:>10}" for q in peers))
    for t in table:
        print(f"{t['kind']:>12} {t['mode']:>18} {t['run']:>3} {t['batch'] or 0:>5} "
              f"{t['idle_batches_per_s']:>9,.0f} "
              f"{t['idle_median_ms']:>7.3f} {t['inserting_batches_per_s']:>9,.0f} "
              f"{t['inserting_over_idle']:>8.2f} {t['inserting_rows_per_s']:>12,.0f} "
              + " ".join(f"{t.get('over_' + q, float('nan')):>10.2f}" for q in peers))
    for t in table:
        for q in peers:
            if f"{q}_variant" in t:
                which = f" (run {t['run']})" if args.repeat > 1 else ""
                print(f"{t['kind']} {t['mode']}{which}: x {q} is against {q}'s faster "
                      f"variant, {t[q + '_variant']}")
    for r in results:
        if "failed" in r or "skipped" in r:
            print(f"{r['system']} {r.get('mode', r.get('kind'))}: "
                  f"{r.get('failed') or r.get('skipped')}")
    summary = summarise(table)
    if args.repeat > 1:
        print(f"\nover {args.repeat} runs: the median, and the range, of each figure")
        for t in summary:
            print(f"{t['kind']:>12} {t['mode']:>18} idle b/s {t['idle_batches_per_s']:>7,.0f} "
                  f"({t['idle_batches_per_s_min']:,.0f}-{t['idle_batches_per_s_max']:,.0f}) "
                  f"ins/idle {t['inserting_over_idle']:.2f} "
                  + " ".join(f"x {q} {t['over_' + q]:.2f} ({t['over_' + q + '_min']:.2f}-"
                             f"{t['over_' + q + '_max']:.2f}, {t['over_' + q + '_below_1']} "
                             f"of {t['runs']} below 1.0)"
                             for q in peers if 'over_' + q in t))
    print(jsontext.dumps({"bench": "capacity", "git_sha": sha, "load_1min": load,
                          "insert_rate": args.insert_rate, "repeat": args.repeat,
                          "ratios": table, "summary": summary}), flush=True)
    return {"results": results, "ratios": table, "summary": summary}


def summarise(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row kind and mode, over the runs of ``table`` (:func:`ratios` of each run):
    the median, smallest and largest idle rate, inserting / idle and ratio to each peer,
    and how many runs fell below 1.0x each peer."""
    out = []
    for kind, mode in dict.fromkeys((t["kind"], t["mode"]) for t in table):
        rows = [t for t in table if (t["kind"], t["mode"]) == (kind, mode)]
        row: dict[str, Any] = {"kind": kind, "mode": mode, "runs": len(rows)}
        keys = ["idle_batches_per_s", "inserting_over_idle"]
        keys += sorted({k for t in rows for k in t if k.startswith("over_")})
        for k in keys:
            vals = [float(t[k]) for t in rows if k in t]
            if not vals:
                continue
            row[k] = float(statistics.median(vals))
            row[k + "_min"], row[k + "_max"] = min(vals), max(vals)
            if k.startswith("over_"):
                row[k + "_below_1"] = sum(v < 1.0 for v in vals)
        out.append(row)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
