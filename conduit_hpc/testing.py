"""Helpers for tests of code that runs on several ranks.

Importing this module does not import MPI; the functions that need it import it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc.config import Config

__all__ = [
    "REPO",
    "ZeroedRows",
    "checked_batch",
    "frame_rows",
    "frame_stacks_of",
    "make_config",
    "mpirun",
    "row_consistent",
    "world_size",
]

REPO = Path(__file__).resolve().parent.parent

#: A spec whose rows say who wrote them and can be checked for tearing.
CHECKED_SPEC: dict[str, dict[str, Any]] = {
    "writer": {"dtype": "int32"},
    "wseq": {"dtype": "int64"},
    "payload": {"dtype": "int64", "shape": [6]},
    "check": {"dtype": "uint64"},
}


def make_config(*, spec: Mapping[str, Mapping[str, Any]] | None = None,
                cls: type[Config] = Config, **sections: Mapping[str, Any]) -> Config:
    """A config from plain mappings: ``make_config(storage={"capacity_rows": 64})``."""
    raw: dict[str, Any] = {"spec": dict(CHECKED_SPEC if spec is None else spec)}
    raw["run"] = {"timeout_s": 60.0, **sections.pop("run", {})}
    raw.update(sections)
    return cls.from_dict(raw)


def _payload(writer: np.ndarray, wseq: np.ndarray) -> np.ndarray:
    base = (writer.astype(np.int64) << 40) + wseq.astype(np.int64) * 16
    return base[:, None] + np.arange(6, dtype=np.int64)[None, :]


def _check(writer: np.ndarray, wseq: np.ndarray) -> np.ndarray:
    x = (writer.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ wseq.astype(np.uint64)
    return x * np.uint64(0xBF58476D1CE4E5B9)


def checked_batch(writer: int, first_wseq: int, rows: int) -> dict[str, np.ndarray]:
    """Rows ``first_wseq .. first_wseq+rows-1`` of ``writer`` in :data:`CHECKED_SPEC`."""
    w = np.full(rows, writer, dtype=np.int32)
    s = np.arange(first_wseq, first_wseq + rows, dtype=np.int64)
    with np.errstate(over="ignore"):
        return {"writer": w, "wseq": s, "payload": _payload(w, s), "check": _check(w, s)}


def row_consistent(cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per row: whether payload and check agree with (writer, wseq) - False if torn."""
    w, s = cols["writer"], cols["wseq"]
    with np.errstate(over="ignore"):
        ok = (cols["payload"] == _payload(w, s)).all(axis=1)
        return ok & (cols["check"] == _check(w, s))


#: A spec whose stacks (depth 4 of 6x5 frames, stream ``env``) can be recomputed from
#: the row's plain fields (:func:`frame_stacks_of`).
FRAME_SPEC: dict[str, dict[str, Any]] = {
    "obs": {"dtype": "uint8", "shape": [4, 6, 5], "stack": {"axis": 0, "stream": "env"}},
    "next_obs": {"dtype": "uint8", "shape": [4, 6, 5], "next_of": "obs"},
    "env": {"dtype": "int64"},
    "episode": {"dtype": "int64"},
    "step": {"dtype": "int64"},
    "next_step": {"dtype": "int64"},
}


def _frame(env: int, episode: int, t: int) -> np.ndarray:
    # pairs of steps share a frame (t // 2) and streams collide now and then: repeats
    v = (env * 1_000_003 + episode * 10_007 + t // 2) % 251
    return ((np.arange(30) * (1 + v % 3) + v) % 256).astype(np.uint8).reshape(6, 5)


def _stack(env: int, episode: int, t: int) -> np.ndarray:
    """The 4 frames ending at step ``t``, an episode's first frame repeated at its start."""
    return np.stack([_frame(env, episode, max(0, k)) for k in range(t - 3, t + 1)])


def frame_rows(env: int, episode: int, length: int, n_step: int = 3) -> dict[str, np.ndarray]:
    """The rows of one episode of ``length`` steps (frames 0..length) of stream ``env`` in
    :data:`FRAME_SPEC`, as an n-step actor makes them (``next_obs`` n steps on, or the
    episode's last frame)."""
    t = np.arange(length, dtype=np.int64)
    nxt = np.minimum(t + n_step, length)
    return {"obs": np.stack([_stack(env, episode, int(k)) for k in t]).reshape(-1, 4, 6, 5),
            "next_obs": np.stack([_stack(env, episode, int(k)) for k in nxt]).reshape(
                -1, 4, 6, 5),
            "env": np.full(length, env, np.int64), "episode": np.full(length, episode,
                                                                       np.int64),
            "step": t, "next_step": nxt}


def frame_stacks_of(cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per row of :data:`FRAME_SPEC`: whether ``obs`` and ``next_obs`` are exactly the
    stacks its actor made (recomputed from env, episode, step, next_step)."""
    ok = np.empty(len(cols["env"]), bool)
    for i, (e, ep, t, nt) in enumerate(zip(cols["env"], cols["episode"], cols["step"],
                                           cols["next_step"], strict=True)):
        ok[i] = (np.array_equal(cols["obs"][i], _stack(int(e), int(ep), int(t)))
                 and np.array_equal(cols["next_obs"][i], _stack(int(e), int(ep), int(nt))))
    return ok


def world_size() -> int:
    """Size of ``COMM_WORLD`` (imports MPI)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


def mpirun(n: int, args: Sequence[str], *, timeout_s: float = 120.0,
           env: Mapping[str, str] | None = None,
           cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m mpi4py ARGS`` on ``n`` ranks with a timeout (each try); capture
    output. A launch that Open MPI failed to start (no rank ran) is tried again: see
    :func:`conduit_hpc.tools.mpi_start.run_captured`."""
    from conduit_hpc.tools.launcher import mpi_env
    from conduit_hpc.tools.mpi_start import run_captured

    cmd = ["mpirun", "-n", str(n), sys.executable, "-m", "mpi4py", *args]
    full_env = mpi_env(os.environ if env is None else {**os.environ, **env})
    return run_captured(cmd, env=full_env, cwd=cwd or REPO, timeout_s=timeout_s)


class ZeroedRows:
    """A priority-staleness probe for a learner: every row it draws is zeroed at once,
    except ``keep`` (kept at priority 5), so that a row zeroed in superstep ``z`` may still
    come in batches ``z+1 .. z+depth`` (prepared before the update arrived), never later.

    Args:
        edp: the learner's data plane (``update_priorities`` is called on it).
        keep (tuple): the ``indices`` row that keeps its mass.
        depth (int): how many batches may have been prepared before an update.
    """

    def __init__(self, edp: Any, keep: tuple[int, ...], depth: int) -> None:
        self.edp, self.keep, self.depth = edp, keep, depth
        self.zeroed_at: dict[tuple[int, ...], int] = {}

    def step(self, s: int, batch: Any) -> None:
        """Check batch ``s`` (``AssertionError`` naming the late rows), then zero its rows."""
        assert batch.staleness <= self.depth
        rows = [tuple(r) for r in batch.indices.tolist()]
        late = [r for r in rows if r != self.keep and self.zeroed_at.get(r, s) < s - self.depth]
        assert not late, f"superstep {s}: rows zeroed too long ago delivered: {late}"
        for r in rows:
            self.zeroed_at.setdefault(r, s)
        self.edp.update_priorities(batch.indices, np.zeros(len(batch)))
        self.edp.update_priorities(np.array([self.keep]), [5.0])

