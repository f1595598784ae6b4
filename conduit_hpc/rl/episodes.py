"""Episode bookkeeping on an actor: returns per env, ``episodes.csv`` rows, and the
"mean return of the last W episodes" convergence test. Pure Python/numpy.

With an epsilon ladder, the explorers with a large epsilon end their episodes early and
often, so "the last W episodes" of *all* envs mostly measures exploration noise, not the
learned policy. A log can therefore *score* only some envs (the near-greedy ones, see
``DQNSection.score_max_epsilon``): every episode is written, with its env's ``epsilon``
and whether it is ``scored``, but only scored episodes enter the running mean.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import time
from collections import deque
from pathlib import Path
from typing import TextIO

import numpy as np

from conduit_hpc.plane.csv_resume import cut_torn_row, last_row, latest_time, number, set_aside
from conduit_hpc.protocol.tags import JOB_TAGS

__all__ = ["EPISODES_TAG", "EPISODE_COLUMNS", "EXTRA_COLUMNS", "EpisodeLog", "has_episodes",
           "merge_episode_files"]

#: channel tag of the RL jobs' episode reports (a job tag, from ``protocol.JOB_TAGS``):
#: actor -> lead learner, float64: env steps so far, then (return, scored) pairs
EPISODES_TAG = JOB_TAGS.start
log = logging.getLogger("conduit_hpc.episodes")

#: columns of ``RUN_DIR/metrics/episodes.csv`` (then ``epsilon``, ``scored`` when known)
EPISODE_COLUMNS = ("time_s", "env_steps", "actor", "episode_return")
EXTRA_COLUMNS = ("epsilon", "scored")


class EpisodeLog:
    """Running returns of ``num_envs`` envs; finished episodes to a CSV file.

    Not collective; writing a row does not block beyond a buffered file write.

    Args:
        num_envs (int): environments stepped together.
        actor (int): the actor id written in the ``actor`` column.
        path (str | Path | None): ``episodes.csv`` to append to (header written when the
            file is new); ``None`` keeps episodes in memory only. The columns go on over
            the attempts of a resumed run that append to one file: ``time_s`` after the
            latest row of this file and of the files beside it named like it (the other
            actors' ``episodes-*.csv``, so that the merge's time order holds across
            actors, and for an actor new to the run), ``env_steps`` after this file's
            last row's (:attr:`env_steps_offset`; the steps an attempt took after its
            last finished episode are not counted).
        window (int): scored episodes in the running mean.
        t0 (float | None): ``time.perf_counter()`` origin of ``time_s`` (default: now).
        epsilons (np.ndarray | None): ``(E,)`` exploration epsilon of each env (written
            in the ``epsilon`` column).
        scored (np.ndarray | None): ``(E,)`` bool, envs whose episodes enter the running
            mean (default: all). None scored is allowed (an actor of the distributed
            job that holds only explorers): its running mean stays ``nan``.
        keep (int): finished episodes whose return, env steps and env the log keeps in
            :attr:`returns`, :attr:`steps_at` and :attr:`envs` (the latest; every
            episode is counted in :attr:`count` and written to the CSV file).
    """

    def __init__(self, num_envs: int, *, actor: int = 0, path: str | Path | None = None,
                 window: int = 20, t0: float | None = None,
                 epsilons: np.ndarray | None = None, scored: np.ndarray | None = None,
                 keep: int = 10_000) -> None:
        for name, v in (("num_envs", num_envs), ("window", window), ("keep", keep)):
            if not isinstance(v, int | np.integer) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.num_envs, self.actor, self.window = int(num_envs), actor, int(window)
        self.epsilons = None if epsilons is None else np.asarray(epsilons, dtype=np.float64)
        self.scored = (np.ones(num_envs, dtype=bool) if scored is None
                       else np.asarray(scored, dtype=bool))
        # one per env: a shorter one failed (IndexError) at the first episode of an env
        # past its end, with the step's rewards already added
        for name, arr in (("epsilons", self.epsilons), ("scored", self.scored)):
            if arr is not None and arr.shape != (num_envs,):
                raise ValueError(f"{name} must have shape ({num_envs},) (one per env), got "
                                 f"{arr.shape}")
        self.t0 = time.perf_counter() if t0 is None else t0
        self._running = np.zeros(num_envs, dtype=np.float64)
        self.recent: deque[float] = deque(maxlen=window)
        # the latest episodes (every one was kept: ~80 bytes an episode, for as long as
        # the actor ran - hundreds of MB an hour for short episodes on many envs)
        self.returns: deque[float] = deque(maxlen=keep)
        self.steps_at: deque[int] = deque(maxlen=keep)
        self.envs: deque[int] = deque(maxlen=keep)
        self.count = 0  # episodes finished
        self._fh: TextIO | None = None
        self._writer: csv.DictWriter[str] | None = None
        #: added to ``env_steps`` in the file (the attempts before this one, see below)
        self.env_steps_offset = 0
        if path is not None:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.exists() and not p.is_file():  # a FIFO's open for writing waits for ever
                set_aside(p, keep_suffix=True)
            new = cut_torn_row(p) <= 0
            # a resumed attempt (a requeued job, --resume into its run directory): its
            # times go on after the latest row of this file and of its siblings (the
            # other actors' files; they began at 0 again, and the merge, which sorts by
            # time, put the resumed rows before the killed attempt's), and this actor's
            # env steps after its own last row's (they began at 0 again too, and the
            # merge's job total went back at the cut)
            self.t0 -= latest_time(p)
            self.env_steps_offset = 0 if new else _last_row(p)[1]
            columns = EPISODE_COLUMNS + (EXTRA_COLUMNS if self.epsilons is not None else ())
            if not new and [c.strip() for c in _header(p)] != list(columns):
                # an earlier attempt's file of other columns (another version): its rows
                # under one header and this attempt's under another were left out of
                # the merge; it moves to episodes-<rank>.K.csv, which the merge reads
                set_aside(p, keep_suffix=True)
                new = True
            self._fh = open(p, "a", newline="")  # noqa: SIM115 - closed in close()
            self._writer = csv.DictWriter(self._fh, fieldnames=columns)
            if new:
                self._writer.writeheader()

    def step(self, reward: np.ndarray, done: np.ndarray, env_steps: int) -> list[float]:
        """Add one step's rewards; return the returns of episodes that ended now.

        Args:
            reward (np.ndarray): ``(E,)`` rewards.
            done (np.ndarray): ``(E,)`` terminated or truncated.
            env_steps (int): environment steps so far (all envs of this log), written
                with each finished episode.

        Raises:
            ValueError: (nothing changes) ``reward`` or ``done`` not one per env (a
                scalar reward was added to every env, a scalar ``done`` ended env 0's
                episode only, a longer ``done`` failed after the rewards were added), or
                a reward that is not finite (the running mean never reached a target
                again).
        """
        r = np.asarray(reward, dtype=np.float64)
        d = np.asarray(done)
        for name, arr in (("reward", r), ("done", d)):
            if arr.shape != (self.num_envs,):
                raise ValueError(f"{name} must have shape ({self.num_envs},) (one per env), "
                                 f"got {arr.shape}")
        if not np.isfinite(r).all():
            i = int(np.flatnonzero(~np.isfinite(r))[0])
            raise ValueError(f"reward[{i}] must be finite, got {float(r[i])!r}")
        self._running += r
        finished: list[float] = []
        for e in np.flatnonzero(d):
            ret = float(self._running[e])
            self._running[e] = 0.0
            finished.append(ret)
            self.count += 1
            if self.scored[e]:
                self.recent.append(ret)
            self.returns.append(ret)
            self.steps_at.append(env_steps)
            self.envs.append(int(e))
            if self._writer is not None:
                row = {"time_s": f"{time.perf_counter() - self.t0:.4f}",
                       "env_steps": env_steps + self.env_steps_offset, "actor": self.actor,
                       "episode_return": f"{ret:g}"}
                if self.epsilons is not None:
                    row.update(epsilon=f"{self.epsilons[e]:.6g}", scored=int(self.scored[e]))
                self._writer.writerow(row)
        if finished and self._fh is not None:
            self._fh.flush()
        return finished

    @property
    def mean_recent(self) -> float:
        """Mean return of the last ``window`` scored episodes (``nan`` before the first)."""
        return float(np.mean(self.recent)) if self.recent else float("nan")

    def reached(self, target: float) -> bool:
        """Whether ``window`` scored episodes have finished and their mean is >= ``target``."""
        return len(self.recent) == self.window and self.mean_recent >= target

    def close(self) -> None:
        """Close the CSV file (idempotent)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self._writer = None


def _header(path: Path) -> list[str]:
    """The column names on the first line of a CSV file ([] when it has none)."""
    got = last_row(path)
    return got[0] if got is not None else []


def _last_row(path: Path) -> tuple[float, int]:
    """``time_s`` and ``env_steps`` of the last whole row of an episode file (0.0 and 0
    when there is none, or for a cell that does not parse as a finite number >= 0)."""
    got = last_row(path)
    if got is None or not got[1]:
        return 0.0, 0
    row = dict(zip(*got, strict=False))
    try:
        steps = int(row.get("env_steps") or 0)
    except ValueError:
        steps = 0
    return max(number(row, "time_s"), 0.0), max(steps, 0)


def _read_part(path: Path, header: list[str]) -> tuple[list[dict[str, str]], list[str]]:
    """The well-formed rows of one actor's episode file (extends ``header`` with its
    columns), and why each other row was left out (file and line named)."""
    rows: list[dict[str, str]] = []
    skipped: list[str] = []
    if not path.is_file():  # a FIFO would hold the job's end for ever (actors write
        return [], [f"{path}: not a regular file"]  # regular files only)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        names = list(reader.fieldnames or ())
        if not names:  # empty: an actor that died before its header was written
            return [], []
        missing = [c for c in EPISODE_COLUMNS if c not in names]
        if missing:
            return [], [f"{path}: no column {', '.join(missing)} in its header {names}"]
        for name in names:
            if name not in header:
                header.append(name)
        for row in reader:
            line = reader.line_num
            why = ""
            if None in row or any(v is None for v in row.values()):
                why = f"{len(names)} fields expected"
            else:
                try:
                    t, steps = float(row["time_s"]), int(row["env_steps"])
                    float(row["episode_return"])
                    if not np.isfinite(t) or steps < 0:
                        why = "time_s not finite or env_steps < 0"
                except ValueError as err:
                    why = str(err)
            if why:
                skipped.append(f"{path}:{line}: {why} (a row cut short by a crash?)")
            else:
                rows.append(row)
    return rows, skipped


def has_episodes(metrics: str | Path, pattern: str = "episodes-*.csv") -> bool:
    """Whether an actor's episode file under ``metrics`` holds a row (an earlier attempt
    of the run wrote it: a resumed job's files go on from it). Local; reads files."""
    for p in Path(metrics).glob(pattern):
        with contextlib.suppress(OSError):
            if p.is_file() and _last_row(p) != (0.0, 0):
                return True
    return False


def merge_episode_files(metrics: str | Path, pattern: str = "episodes-*.csv",
                        out_name: str = "episodes.csv", *, env_steps_offset: int = 0) -> int:
    """Merge the actors' per-rank episode files into one ``episodes.csv``, by time.

    Each actor's ``env_steps`` column counts its own steps (over the attempts of a
    resumed run, see :class:`EpisodeLog`); in the merged file it is
    the job's total at that moment (the sum over actors of each one's latest count,
    walking the rows in time order), and the actor's own count moves to
    ``actor_env_steps``. Not collective; call on one rank after the actors closed
    their files.

    Rows that are not well formed (a last row a crash cut short, a row of another
    file's columns, numbers that do not parse) and files that are not regular (a FIFO)
    are left out with a warning (the ``conduit_hpc.episodes`` logger) naming the file
    and line of each, rather than failing the job's end or entering the merged file
    with a wrong count.

    ``env_steps_offset`` is added to each job total: the env steps of a resumed run
    that its files do not hold (a ``--resume`` into a new run directory: the
    checkpoint's count; 0 when the files hold the earlier attempts, see
    :func:`has_episodes`), so that ``env_steps`` and what ``env_steps_to_target`` reads
    from it count from the run's start, as the job's summary does.

    Returns:
        int: episodes written (0 when there is no per-rank file; nothing is written).
    """
    metrics = Path(metrics)
    parts = sorted(metrics.glob(pattern))
    if not parts:
        return 0
    rows: list[dict[str, str]] = []
    header: list[str] = list(EPISODE_COLUMNS)
    skipped: list[str] = []
    for p in parts:
        good, bad = _read_part(p, header)
        rows.extend(good)
        skipped.extend(bad)
    if skipped:  # a crash mid-row (or an edited file): left out, said, not fatal
        log.warning("merge_episode_files: left out %d damaged episode file(s) or row(s): %s",
                    len(skipped), "; ".join(skipped[:5]))
    rows.sort(key=lambda r: float(r["time_s"]))
    latest: dict[str, int] = {}
    for row in rows:
        own = int(row["env_steps"])
        latest[row["actor"]] = own
        row["actor_env_steps"] = str(own)
        row["env_steps"] = str(env_steps_offset + sum(latest.values()))
    with open(metrics / out_name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*header, "actor_env_steps"])
        w.writeheader()
        w.writerows(rows)
    return len(rows)
