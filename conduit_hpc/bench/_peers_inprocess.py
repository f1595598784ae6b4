"""The workload of ``conduit-hpc bench peers`` and its in-process peers (cpprb, TorchRL).

Row layouts, sizes and the timing helpers shared by our ranks and the peers; the peers'
runners import their library when called (an absent one raises ImportError). No MPI.

Row kinds (:data:`ROWS`): ``cartpole``, ``atari`` (random bytes, whole stacks: each row
holds its 8 frames) and ``atari-frames``: the same Atari transition (``atari``'s fields
and an ``env`` stream id, 8 B more per row) with its frame stacks declared (``obs``
stacked along axis 0 per ``env`` stream, ``next_obs`` its next field), so our plane
stores each frame once (:mod:`conduit_hpc.storage.frames`). Its rows are
stream-consistent (:func:`row_source`: 4 streams per writer, n-step 3, episodes of random
length, interleaved in runs of 1-4 rows). cpprb runs it twice (:func:`run_cpprb`): with
its ``next_of="obs"`` and ``stack_compress="obs"`` (one stream added in order, n-step 1
and the stack on the last axis, ``uint8[84, 84, 4]``: what that scheme supports) and
without (whole stacks, the same interleaved rows as ours); its ``prioritized`` figure is
the faster of the two (the harder bar), named in ``prioritized_variant``. TorchRL skips
``atari-frames`` (no frame-once storage of its own to compare with).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from conduit_hpc.bench.common import AtariGame, interleaved_rows
from conduit_hpc.errors import ConfigError

__all__ = ["ALPHA", "BETA", "ROWS", "SIZES", "SMOKE_SIZES", "STREAMS", "fake_rows",
           "latency_stats", "parse_kinds", "row_source", "run_cpprb", "run_torchrl",
           "sizes_of"]

ROWS: dict[str, dict[str, dict[str, Any]]] = {
    "cartpole": {"obs": {"dtype": "float32", "shape": [4]},
                 "next_obs": {"dtype": "float32", "shape": [4]},
                 "action": {"dtype": "int64", "shape": []},
                 "reward": {"dtype": "float32", "shape": []},
                 "done": {"dtype": "uint8", "shape": []}},
    "atari": {"obs": {"dtype": "uint8", "shape": [4, 84, 84]},
              "next_obs": {"dtype": "uint8", "shape": [4, 84, 84]},
              "action": {"dtype": "int64", "shape": []},
              "reward": {"dtype": "float32", "shape": []},
              "done": {"dtype": "uint8", "shape": []}},
    "atari-frames": {
        "obs": {"dtype": "uint8", "shape": [4, 84, 84],
                "stack": {"axis": 0, "stream": "env"}},
        "next_obs": {"dtype": "uint8", "shape": [4, 84, 84], "next_of": "obs"},
        "action": {"dtype": "int64", "shape": []},
        "reward": {"dtype": "float32", "shape": []},
        "done": {"dtype": "uint8", "shape": []},
        "env": {"dtype": "int64", "shape": []}},
}
#: ``atari-frames``: streams (games) per writer, interleaved
STREAMS = 4
#: per row kind: ring capacity, learner batch, actor ingest batch
SIZES = {"cartpole": {"capacity": 100_000, "batch": 256, "ingest": 1024},
         "atari": {"capacity": 4_000, "batch": 32, "ingest": 32},
         "atari-frames": {"capacity": 4_000, "batch": 32, "ingest": 32}}
SMOKE_SIZES = {"cartpole": {"capacity": 4_096, "batch": 64, "ingest": 256},
               "atari": {"capacity": 256, "batch": 8, "ingest": 8},
               "atari-frames": {"capacity": 256, "batch": 8, "ingest": 8}}
ALPHA, BETA = 0.6, 0.4


def parse_kinds(text: str) -> list[str]:
    """The row kinds of a comma-separated ``--kinds`` value; raises ConfigError naming
    the field and the allowed values for an unknown or empty one. Local."""
    kinds = [k.strip() for k in text.split(",")]
    bad = [k for k in kinds if k not in ROWS]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if bad or twice:
        why = ("an empty item" if "" in kinds else f"unknown: {', '.join(bad)}" if bad
               else f"{', '.join(twice)} twice")
        raise ConfigError(f"--kinds must be a comma-separated list of {', '.join(ROWS)}, "
                          f"each once; got {text!r} ({why})")
    return kinds


def sizes_of(kind: str, *, smoke: bool, batch_rows: int | None = None) -> dict[str, int]:
    """Ring capacity, learner batch and actor ingest batch of ``kind`` (:data:`SIZES`, or
    :data:`SMOKE_SIZES` with ``smoke``), the batch replaced by ``batch_rows`` when given
    (``--batch-size``). Local.

    Raises:
        ConfigError: ``batch_rows`` is not an integer from 1 to half the kind's ring (a
            batch must find that many intact rows while the actors overwrite the ring),
            naming ``--batch-size``, the value and the bound.
    """
    sz = dict((SMOKE_SIZES if smoke else SIZES)[kind])
    if batch_rows is None:
        return sz
    most = sz["capacity"] // 2
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) \
            or not 1 <= batch_rows <= most:
        raise ConfigError(f"--batch-size must be an integer from 1 to {most:,} (half the "
                          f"{kind} ring of {sz['capacity']:,} rows"
                          f"{' at --smoke' if smoke else ''}), got {batch_rows!r}",
                          key="--batch-size")
    sz["batch"] = batch_rows
    return sz


def row_source(kind: str, n: int, seed: int) -> Callable[[], dict[str, np.ndarray]]:
    """A callable giving ``n`` rows of ``kind`` per call, for an actor that ingests
    over and over: the same random rows each time for ``cartpole`` and ``atari``; for
    ``atari-frames`` new stream-consistent rows each call (:data:`STREAMS` games with
    ``env`` ids ``seed * STREAMS + i``, interleaved; repeating rows would only store
    references). Local."""
    if "stack" not in ROWS[kind]["obs"]:
        data = fake_rows(kind, n, seed)
        return lambda: data
    rng = np.random.default_rng(seed)
    games = [AtariGame(seed * STREAMS + i, np.random.default_rng([seed, i]))
             for i in range(STREAMS)]
    fields = tuple(ROWS[kind])
    return lambda: interleaved_rows(games, rng, n, fields)


def fake_rows(kind: str, n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` rows of ``kind`` with random contents (``atari-frames``: stream-consistent
    rows, :func:`row_source`)."""
    if "stack" in ROWS[kind]["obs"]:
        return row_source(kind, n, seed)()
    rng = np.random.default_rng(seed)
    out = {}
    for name, f in ROWS[kind].items():
        shape = (n, *f["shape"])
        if f["dtype"].startswith("float"):
            out[name] = rng.random(shape).astype(f["dtype"])
        else:
            out[name] = rng.integers(0, 2 if name == "done" else 255, shape).astype(f["dtype"])
    return out


def latency_stats(lat: list[float], wall_s: float) -> dict[str, float]:
    a = np.asarray(lat)
    return {"batches": len(a), "batches_per_s": len(a) / wall_s,
            "latency_median_s": float(np.median(a)), "latency_p99_s": float(np.percentile(a, 99))}


def run_cpprb(kind: str, sz: dict[str, int], n: int, insert_rows: int) -> dict[str, Any]:
    """cpprb's prioritized (sample + update of every row) and uniform buffers on
    ``kind``'s rows; for ``atari-frames`` with and without its compression (module
    docstring), ``prioritized`` / ``uniform`` the faster variant's. Blocks."""
    from importlib.metadata import version

    import cpprb

    out: dict[str, Any] = {"version": version("cpprb")}  # cpprb has no __version__
    env = {name: {"shape": tuple(f["shape"]) or 1, "dtype": np.dtype(f["dtype"])}
           for name, f in ROWS[kind].items()}
    if "stack" not in ROWS[kind]["obs"]:
        data = fake_rows(kind, sz["ingest"], 0)
        def add_data(rb: Any) -> int:
            rb.add(**data)
            return sz["ingest"]

        out.update(_cpprb_variant(cpprb, env, {}, add_data, sz, n, insert_rows))
        return out
    variants = {"plain": _cpprb_variant(cpprb, env, {}, _interleaved_adds(kind, sz["ingest"]),
                                        sz, n, insert_rows)}
    packed = {k: v for k, v in env.items() if k != "next_obs"}
    packed["obs"] = {"shape": (84, 84, 4), "dtype": np.dtype(np.uint8)}
    variants["next_of+stack_compress"] = _cpprb_variant(
        cpprb, packed, {"next_of": "obs", "stack_compress": "obs"},
        _one_stream_adds(sz["ingest"]), sz, n, insert_rows)
    out["variants"] = variants
    for key in ("prioritized", "uniform"):
        best = max(variants, key=lambda v: variants[v][key]["batches_per_s"])
        out[key], out[f"{key}_variant"] = variants[best][key], best
    out["insert_rows_per_s"] = variants[out["prioritized_variant"]]["insert_rows_per_s"]
    return out


def _interleaved_adds(kind: str, per_add: int) -> Callable[[Any], int]:
    """cpprb adds of ``per_add`` whole-stack rows from :data:`STREAMS` interleaved
    streams, as ours ingest (rows made ahead: only the add is timed)."""
    pool = [row_source(kind, per_add, 0)() for _ in range(16)]
    state = [0]

    def add(rb: Any) -> int:
        rb.add(**pool[state[0] % len(pool)])
        state[0] += 1
        return per_add
    return add


def _one_stream_adds(per_add: int) -> Callable[[Any], int]:
    """cpprb adds for ``next_of`` + ``stack_compress``: one stream in order, n-step 1
    (``next_obs`` is the next row's ``obs``), stacks on the last axis, up to ``per_add``
    rows an add, ``on_episode_end()`` at each episode's end (rows made ahead)."""
    game = AtariGame(0, np.random.default_rng(0), nstep=1)
    pool: list[tuple[dict[str, np.ndarray], bool]] = []
    for _ in range(64):
        r = game.rows(per_add)
        rows = {"obs": np.ascontiguousarray(r["obs"].transpose(0, 2, 3, 1)),
                "next_obs": np.ascontiguousarray(r["next_obs"].transpose(0, 2, 3, 1)),
                **{k: r[k] for k in ("action", "reward", "done", "env")}}
        pool.append((rows, game.episode_done))
    pool[-1] = (pool[-1][0], True)  # the pool repeats: close the episode before it does
    state = [0]

    def add(rb: Any) -> int:
        rows, ends = pool[state[0] % len(pool)]
        rb.add(**rows)
        if ends:
            rb.on_episode_end()
        state[0] += 1
        return len(rows["env"])  # fewer at an episode's end
    return add


def _cpprb_variant(cpprb: Any, env: dict[str, Any], options: dict[str, str],
                   add: Callable[[Any], int], sz: dict[str, int], n: int,
                   insert_rows: int) -> dict[str, Any]:
    """One cpprb buffer pair (``options``: its compression); ``add(rb)`` adds rows to
    ``rb`` and returns how many. Blocks."""
    cap, B = sz["capacity"], sz["batch"]
    out: dict[str, Any] = {}
    prb = cpprb.PrioritizedReplayBuffer(cap, env, alpha=ALPHA, **options)
    t0, done = time.perf_counter(), 0
    while done < insert_rows:
        done += add(prb)
    out["insert_rows_per_s"] = done / (time.perf_counter() - t0)
    prios = np.random.default_rng(1).random((n, B)) + 0.01
    warm = max(5, n // 10)

    def prio_step(i: int) -> None:
        s = prb.sample(B, beta=BETA)
        prb.update_priorities(s["indexes"], prios[i % n])

    out["prioritized"] = _timed_loop(prio_step, n, warm)
    urb = cpprb.ReplayBuffer(cap, env, **options)
    while urb.get_stored_size() < cap:
        add(urb)
    out["uniform"] = _timed_loop(lambda i: urb.sample(B), n, warm)
    return out


def run_torchrl(kind: str, sz: dict[str, int], n: int, insert_rows: int) -> dict[str, Any]:
    if "stack" in ROWS[kind]["obs"]:
        return {"skipped": f"TorchRL skips {kind}: it has no frame-once storage of its own "
                           "to set beside ours (its plain stacks are the atari kind)"}
    import tensordict
    import torch
    import torchrl
    from torchrl.data import (
        LazyTensorStorage,
        TensorDictPrioritizedReplayBuffer,
        TensorDictReplayBuffer,
    )

    cap, B = sz["capacity"], sz["batch"]
    td = tensordict.TensorDict({k: torch.from_numpy(v) for k, v in
                                fake_rows(kind, sz["ingest"], 0).items()},
                               batch_size=[sz["ingest"]])
    out: dict[str, Any] = {"version": torchrl.__version__, "torch": torch.__version__,
                           "tensordict": tensordict.__version__}
    warm = max(5, n // 10)
    urb = TensorDictReplayBuffer(storage=LazyTensorStorage(cap), batch_size=B)
    out["insert_rows_per_s"] = _timed_insert(lambda: urb.extend(td), sz["ingest"], insert_rows)
    out["uniform"] = _timed_loop(lambda i: urb.sample(), n, warm)
    try:
        prb = TensorDictPrioritizedReplayBuffer(alpha=ALPHA, beta=BETA,
                                                storage=LazyTensorStorage(cap), batch_size=B)
    except RuntimeError as err:  # the C++ segment trees did not load with this torch
        from conduit_hpc.integrations.torchrl_fallback import extension_problem

        out["prioritized_skipped"] = extension_problem() or str(err)
        return out
    for _ in range(-(-cap // sz["ingest"])):
        prb.extend(td)
    prios = torch.rand(n, B) + 0.01

    def prio_step(i: int) -> None:
        s = prb.sample()
        prb.update_priority(s["index"], prios[i % n])

    out["prioritized"] = _timed_loop(prio_step, n, warm)
    return out


def _timed_insert(add: Any, per_call: int, rows: int) -> float:
    t0, done = time.perf_counter(), 0
    while done < rows:
        add()
        done += per_call
    return done / (time.perf_counter() - t0)


def _timed_loop(step: Any, n: int, warm: int) -> dict[str, float]:
    for i in range(warm):
        step(i)
    lat = []
    gc.collect()  # as ours does (peers._learner_loop): no full pass left from the set-up
    t_all = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        step(i)
        lat.append(time.perf_counter() - t0)
    return latency_stats(lat, time.perf_counter() - t_all)
