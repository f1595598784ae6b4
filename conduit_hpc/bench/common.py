"""What several benchmarks share: provenance (:func:`git_sha`), where the repository's
files are (:func:`repo_path`), so that a benchmark runs from a checkout and from an
installed wheel alike, and stream-consistent Atari transitions (:class:`AtariGame`,
:func:`interleaved_rows`: consecutive rows of one stream share frames, as the frame-once
layout expects). Not collective; no MPI.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Protocol

import numpy as np

__all__ = ["AtariGame", "FrameSource", "git_sha", "in_checkout", "interleaved_rows",
           "repo_path", "worker_command"]

_CHECKOUT = Path(__file__).resolve().parents[2]


def in_checkout() -> bool:
    """Whether this package runs from a source checkout (``jobs/`` beside it)."""
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "jobs").is_dir()


def repo_path(relative: str) -> Path:
    """``relative`` (e.g. ``"jobs/cluster-128x8.toml"``, ``"bench/out"``) in the checkout
    this package runs from; outside a checkout (an installed wheel), the same path under
    the current directory - so a benchmark's default job and cluster files come from the
    checkout, or from a ``jobs/`` folder where it is started."""
    return _CHECKOUT / relative if in_checkout() else Path.cwd() / relative


def git_sha() -> str:
    """The short commit of the checkout this package runs from (``"unknown"`` outside
    a git checkout), for the provenance of benchmark results. Not collective."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                             cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def worker_command(module: str, *args: str) -> list[str]:
    """Arguments after ``python -m mpi4py`` that run benchmark ``module``'s ranks
    (``python -m mpi4py -m conduit_hpc.bench.NAME ARGS``)."""
    return ["-m", module, *args]


class FrameSource(Protocol):
    """Where a stream's 84 x 84 uint8 frames come from (e.g. a game played through the
    Atari job's preprocessing)."""

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` frames, ``uint8[n, 84, 84]``."""
        ...


class AtariGame:
    """One stream's Atari transitions: frames (random bytes, or ``source``'s), episodes
    of 50-499 steps, stacks of 4 (the first frame repeated at an episode start), n-step
    ``nstep`` (``next_obs`` is the stack ``nstep`` steps on, capped at the episode end).
    Consecutive rows of one stream share frames. Local; no MPI.

    Args:
        env (int): the stream id, written into the ``env`` field.
        rng (numpy.random.Generator): episode lengths and random frames.
        source (FrameSource | None): real frames instead of random ones.
        nstep (int): steps from ``obs`` to ``next_obs`` (1: cpprb's ``next_of`` scheme).
    """

    def __init__(self, env: int, rng: np.random.Generator,
                 source: FrameSource | None = None, nstep: int = 3) -> None:
        self.env, self.rng, self.t, self.source, self.nstep = env, rng, 0, source, nstep
        self._episode()

    def _episode(self) -> None:
        length = int(self.rng.integers(50, 500))
        frames = (self.source.take(length + 1) if self.source is not None else
                  self.rng.integers(0, 256, (length + 1, 84, 84), dtype=np.uint8))
        idx = np.maximum(np.arange(length + 1)[:, None] + np.arange(-3, 1)[None, :], 0)
        self.stacks = frames[idx]  # [t] = the 4 frames ending at t, the first repeated
        self.length, self.t = length, 0

    @property
    def episode_done(self) -> bool:
        """Whether every row of the current episode was taken (the next
        :meth:`rows` starts a new one)."""
        return self.t == self.length

    def rows(self, k: int) -> dict[str, np.ndarray]:
        """The next ``k`` rows of this stream, fewer at an episode's end: ``obs``,
        ``next_obs`` (uint8[4, 84, 84]), ``action`` (int64), ``reward`` (float32),
        ``done`` (uint8: ``next_obs`` is the episode's last stack), ``env`` (int64),
        ``discount`` (float32)."""
        if self.t == self.length:
            self._episode()
        t = np.arange(self.t, min(self.t + k, self.length))
        self.t += len(t)
        nxt = np.minimum(t + self.nstep, self.length)
        return {"obs": self.stacks[t], "next_obs": self.stacks[nxt],
                "action": t % 6, "reward": np.zeros(len(t), np.float32),
                "done": (nxt == self.length).astype(np.uint8),
                "env": np.full(len(t), self.env, np.int64),
                "discount": np.full(len(t), 0.97, np.float32)}


def interleaved_rows(games: list[AtariGame], rng: np.random.Generator, n: int,
                     fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``n`` rows (only ``fields``) from ``games``, interleaved as Ape-X actors write:
    runs of 1-4 consecutive rows of one stream at a time, streams picked at random.
    Local; no MPI."""
    parts: list[dict[str, np.ndarray]] = []
    left = n
    while left > 0:
        g = games[int(rng.integers(len(games)))]
        part = g.rows(min(left, int(rng.integers(1, 5))))
        parts.append(part)
        left -= len(part["env"])
    return {f: np.concatenate([p[f] for p in parts]) for f in fields}
