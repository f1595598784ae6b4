"""Indicative, not a benchmark of record: Atari transitions delivered over one shaped
long-haul link (``forward``), without and with ``[longhaul] compression = "zlib"``;
frames stored once in both replays. Needs the [atari] extra.

    mpirun -n 4 python -m mpi4py scripts/longhaul_atari.py none|zlib [SECONDS]

World rank 0 is the learner, 1 the data-centre buffer, 2 the edge buffer, 3 the actor,
which replays real frames of three ALE games (random actions, recorded at start) as
three interleaved streams, n-step 3, 4 rows a stream per ingest; the link carries
``RATE`` bytes/s (environment, default 2e6) with 10 ms latency. Prints one JSON line:
rows received in the data centre per second, bytes on the link, nominal bytes.
"""
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import make_config

comp = sys.argv[1] if len(sys.argv) > 1 else ""
if comp not in ("none", "zlib"):
    sys.exit(f"usage: longhaul_atari.py none|zlib [SECONDS]; got {comp!r}")
try:
    dur = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
except ValueError:
    dur = float("nan")
if not 0 < dur < 1e6:
    sys.exit(f"SECONDS must be a number of seconds above 0 and below 1e6, got "
             f"{sys.argv[2]!r}")
RATE = float(os.environ.get("RATE", "2e6"))


def record(game: str, steps: int = 700) -> np.ndarray:
    from conduit_hpc.bench.frames import AleFrames

    return AleFrames(game, 0).take(steps + 1)


SPEC = {"obs": {"dtype": "uint8", "shape": [4, 84, 84], "stack": {"axis": 0, "stream": "env"}},
        "next_obs": {"dtype": "uint8", "shape": [4, 84, 84], "next_of": "obs"},
        "action": {"dtype": "int64"}, "reward": {"dtype": "float32"},
        "env": {"dtype": "int64"}, "discount": {"dtype": "float32"}}
cfg = make_config(spec=SPEC, layout={"learners": 1, "buffers": 2},
                  storage={"capacity_rows": 20000, "priority_exponent": 0.6},
                  scheduler={"mode": "edp", "fetch": "owner", "batch_rows": 32,
                             "prefetch_depth": 2, "min_fill_rows": 64},
                  longhaul={"mode": "forward", "bandwidth_gbps": RATE / 1e9, "latency_s": 0.01,
                            "queue_rows": 4096, "forward_rows": 32, "compression": comp},
                  run={"timeout_s": 120.0})
world = MPI.COMM_WORLD
streams = ([record(f"ALE/{g}-v5") for g in ("Pong", "Breakout", "SpaceInvaders")]
           if world.rank == world.size - 1 else [])  # the actor, before the clock starts
with ExperienceDataPlane(cfg) as edp:
    if edp.role is Role.ACTOR:
        t = 3
        t0 = time.monotonic()
        while not edp.should_stop and time.monotonic() - t0 < dur:
            for e, f in enumerate(streams):
                i = np.arange(t, t + 4)
                idx = i[:, None] + np.arange(-3, 1)[None, :]
                edp.ingest({"obs": f[idx], "next_obs": f[np.minimum(idx + 3, len(f) - 1)],
                            "action": i % 6, "reward": np.zeros(4, np.float32),
                            "env": np.full(4, e), "discount": np.full(4, 0.97, np.float32)},
                           priorities=np.ones(4))
            t = t + 4 if t + 8 < len(streams[0]) - 4 else 3
            time.sleep(0.002)
    elif edp.role is Role.LEARNER:
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < dur:
            b = edp.next_batch()
            edp.update_priorities(b.indices, np.ones(len(b)))
            n += 1
    else:
        edp.serve()
    edp.done()
    s = edp.summary()
if world.rank == 0:
    lh = s["longhaul"]
    keys = ("rows_received", "rows_forwarded", "rows_dropped", "rows_unsent",
            "edge_rows_committed", "e2c_bytes", "forwarded_nominal_bytes")
    print(json.dumps({"compression": comp, "rate_bytes_s": RATE, "seconds": dur,
                      **{k: lh[k] for k in keys}, "rows_per_s": lh["rows_received"] / dur,
                      "load": os.getloadavg()}))
