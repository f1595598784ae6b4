"""The measurement that chose the codecs of issue 22 item 3 (bench/README.md,
"Compression where bytes are dear"). Not part of the package or the test suite.

    .venv/bin/python scripts/measure_codecs.py [--steps 1500]

Real frames: three ALE games played with random actions through the Atari job's
preprocessing (needs the [atari] extra), the newest 84x84 frame of each step; CartPole
rows: obs and next_obs, float32[8]. Each array is written to an HDF5 file in /dev/shm
(chunks of ~1 MB, as checkpoints write them) through h5py's built-in filters and, when
``hdf5plugin`` is importable, its zstd / lz4 / blosc2 filters: compression ratio, write
and read MB/s (best of 3). Then one long-haul forward message (64 Pong rows, whole
stacks) through zlib and, when importable, lz4.frame. Prints the load average.
"""

from __future__ import annotations

import argparse
import os
import time
import zlib

import gymnasium as gym
import h5py
import numpy as np

from conduit_hpc.bench.frames import AleFrames


def frames(game: str, steps: int) -> np.ndarray:
    return AleFrames(game, 0).take(steps + 1)


def cartpole(rows: int) -> np.ndarray:
    env = gym.make("CartPole-v1")
    o, _ = env.reset(seed=0)
    out = []
    for _ in range(rows):
        o2, _, te, tr, _ = env.step(env.action_space.sample())
        out.append(np.concatenate([o, o2]).astype(np.float32))
        o = o2
        if te or tr:
            o, _ = env.reset()
    return np.stack(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1500)
    args = p.parse_args()
    games = {g: frames(f"ALE/{g}-v5", args.steps) for g in ("Pong", "Breakout", "SpaceInvaders")}
    mix = np.stack([games[g][i] for i in range(args.steps) for g in games])  # interleaved
    data = {"atari_frames_mix": mix, "pong": games["Pong"], "cartpole_f32x8": cartpole(20000)}
    codecs: dict[str, dict] = {"none": {}, "lzf": {"compression": "lzf"},
                               "gzip-1": {"compression": "gzip", "compression_opts": 1},
                               "gzip-4": {"compression": "gzip", "compression_opts": 4}}
    try:
        import hdf5plugin

        codecs.update({"zstd-1 (hdf5plugin)": dict(hdf5plugin.Zstd(clevel=1)),
                       "lz4 (hdf5plugin)": dict(hdf5plugin.LZ4())})
    except ImportError:
        print("hdf5plugin not installed: its filters are left out")
    print("load average", os.getloadavg())
    path = "/dev/shm/measure-codecs.h5"
    for name, arr in data.items():
        chunk = (max(1, min(len(arr), (1 << 20) // arr[0].nbytes)), *arr.shape[1:])
        for cname, kw in codecs.items():
            w = r = 1e9
            for _ in range(3):
                t0 = time.perf_counter()
                with h5py.File(path, "w") as f:
                    f.create_dataset("x", data=arr, chunks=chunk, **kw)
                w = min(w, time.perf_counter() - t0)
                t0 = time.perf_counter()
                with h5py.File(path, "r") as f:
                    back = f["x"][...]
                r = min(r, time.perf_counter() - t0)
            assert np.array_equal(back, arr)
            size = os.path.getsize(path)
            print(f"{name:18s} {cname:20s} ratio {arr.nbytes / size:6.1f}  write "
                  f"{arr.nbytes / w / 1e6:6.0f} MB/s  read {arr.nbytes / r / 1e6:6.0f} MB/s")
    os.unlink(path)
    f = games["Pong"]
    t = np.arange(10, 74)
    idx = t[:, None] + np.arange(-3, 1)[None, :]
    msg = np.concatenate([f[idx].reshape(64, -1), f[idx + 3].reshape(64, -1)], axis=1).tobytes()
    links = {"zlib-1": (lambda b: zlib.compress(b, 1), zlib.decompress)}
    try:
        import lz4.frame

        links["lz4.frame"] = (lz4.frame.compress, lz4.frame.decompress)
    except ImportError:
        print("lz4 not installed: left out")
    for cname, (enc, dec) in links.items():
        t0 = time.perf_counter()
        for _ in range(10):
            c = enc(msg)
        te = (time.perf_counter() - t0) / 10
        t0 = time.perf_counter()
        for _ in range(10):
            dec(c)
        td = (time.perf_counter() - t0) / 10
        print(f"forward message, 64 Pong rows ({len(msg)} B) {cname:10s} ratio "
              f"{len(msg) / len(c):5.1f}  compress {len(msg) / te / 1e6:5.0f} MB/s "
              f"({te * 1e3:.1f} ms)  decompress {len(msg) / td / 1e6:5.0f} MB/s")
    print("load average", os.getloadavg())


if __name__ == "__main__":
    main()
