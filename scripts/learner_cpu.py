"""Indicative, not a benchmark of record: the learner's CPU time per prioritized batch
(sample + update of every row, in MODE, a learner that computes nothing), with the
actors idle and with them inserting flat out, and the learner's share of a core while
they insert. CPU time, unlike batches/s, barely moves with what else the machine runs;
the share shows what two cores leave the learner when 2 actors and the buffer rank want
them too (the ceiling on ``bench capacity``'s inserting / idle ratio).

    mpirun -n 4 python -m mpi4py scripts/learner_cpu.py [cartpole|atari] [BATCHES] [MODE]

Ranks: 1 buffer, 1 learner, the rest actors (rows and sizes of ``bench peers``). MODE is
``sync`` (default), ``edp`` (a data-plane thread) or ``edp-process`` (a delivery rank:
one more rank, ``-n 5``). In both prefetching modes the learner's process prints, per thread,
its share of a core and its voluntary context switches a batch over the idle phase
(``/proc/self/task``; ``bench/README.md``, "Round 10").
"""
import os
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.bench._peers_inprocess import ALPHA, BETA, ROWS, SIZES, row_source
from conduit_hpc.testing import make_config

kind = sys.argv[1] if len(sys.argv) > 1 else "cartpole"
batches = sys.argv[2] if len(sys.argv) > 2 else "1000"
mode = sys.argv[3] if len(sys.argv) > 3 else "sync"
if kind not in ("cartpole", "atari"):
    sys.exit(f"KIND must be cartpole or atari, got {kind!r}")
if not batches.isdecimal() or int(batches) < 1:
    sys.exit(f"BATCHES must be a whole number >= 1, got {batches!r}")
n = int(batches)
if mode not in ("sync", "edp", "edp-process"):
    sys.exit(f"MODE must be sync, edp or edp-process, got {mode!r}")
comm = MPI.COMM_WORLD
sz = SIZES[kind]
cfg = make_config(spec=ROWS[kind], layout={"learners": 1, "buffers": 1},
                  storage={"capacity_rows": sz["capacity"], "priority_exponent": ALPHA},
                  checkpoint={"on_stop": False},
                  scheduler={"mode": mode.split("-")[0], "fetch": "direct",
                             "delivery": "process" if mode == "edp-process" else "thread",
                             "batch_rows": sz["batch"],
                             "sampler": "prioritized", "beta": BETA, "beta_final": BETA,
                             "min_fill_rows": sz["batch"]},
                  run={"timeout_s": 120.0})


def threads() -> dict[str, tuple[float, int]]:
    """CPU seconds and voluntary context switches of each thread of this process."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            task = Path("/proc/self/task", t)
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = (task / "status").read_text()
        except OSError:  # the thread ended
            continue
        cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        vol = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        out[t] = (cpu, vol)
    return out


def batches(edp: ExperienceDataPlane, prios: np.ndarray) -> tuple[float, float]:
    """CPU and wall seconds per batch over ``len(prios)`` batches."""
    c0, w0 = time.process_time(), time.perf_counter()
    for p in prios:
        b = edp.next_batch()
        edp.update_priorities(b.indices, p)
    return (time.process_time() - c0) / len(prios), (time.perf_counter() - w0) / len(prios)


with ExperienceDataPlane(cfg, comm) as edp:
    side = comm.Split(0 if edp.serves else 1, 0 if edp.role is Role.LEARNER else 1 + comm.rank)
    if edp.serves:
        side.Free()
        edp.serve()
    else:
        if edp.role is Role.LEARNER:
            side.Barrier()  # the actors filled the ring
            prios = np.random.default_rng(1).random((n, sz["batch"])) + 0.01
            batches(edp, prios[:200])  # warm
            t0, w0 = threads(), time.perf_counter()
            idle = sorted(batches(edp, prios) for _ in range(5))[2]  # median of 5
            t1, wall = threads(), time.perf_counter() - w0
            if mode != "sync":
                for t in sorted(set(t0) & set(t1)):
                    cpu, vol = t1[t][0] - t0[t][0], t1[t][1] - t0[t][1]
                    if cpu or vol:
                        print(f"{kind} {mode}: thread {t}: {cpu / wall:.2f} of a core, "
                              f"{vol / (5 * n):.1f} voluntary context switches a batch",
                              flush=True)
            side.Ibarrier().Wait()  # the actors start inserting (they wait in an Ibarrier)
            stop = side.Ibarrier()
            ins = batches(edp, prios)
            stop.Wait()
            print(f"{kind}: learner CPU us/batch idle {idle[0] * 1e6:.0f} (wall "
                  f"{idle[1] * 1e6:.0f}), inserting {ins[0] * 1e6:.0f} (wall "
                  f"{ins[1] * 1e6:.0f}); learner's share of a core while inserting "
                  f"{ins[0] / ins[1]:.2f}", flush=True)
        else:
            nxt = row_source(kind, sz["ingest"], seed=1 + comm.rank)
            rows = 0
            while rows < sz["capacity"]:
                edp.ingest(nxt())
                rows += sz["ingest"]
            side.Barrier()  # the ring is full
            start = side.Ibarrier()
            while not start.Test():  # idle while the learner samples alone (a blocking
                time.sleep(0.001)  # barrier polls: it took the learner's core)
            stop = side.Ibarrier()
            while not stop.Test():
                edp.ingest(nxt())
        edp.done()
        side.Free()
