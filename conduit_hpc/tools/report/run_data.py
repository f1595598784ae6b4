"""Loading a run's metrics files (``RUN_DIR/metrics/``: learner and actor CSVs,
``episodes.csv``, ``summary.json``) into :class:`RunData`, and the headline statistics
of a run (:func:`run_stats`) with the helpers the plots share. Plain numpy; no MPI, no
matplotlib. File formats: :mod:`conduit_hpc.tools.report.run`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc.errors import ConduitError
from conduit_hpc.plane.headline import headline_figures, read_metrics_text
from conduit_hpc.plane.metrics import PATH_WORK, SKIP, exposed_split, exposed_story
from conduit_hpc.plane.sampled_rows import WEIGHT, weighted_mean, weighted_percentile, weights

__all__ = ["PATH_PARTS", "TARGET_RETURN", "RunData", "Table", "episode_x", "has_columns",
           "ingest_grid", "learner_table", "load_run", "missing_columns", "pooled",
           "pooled_weighted", "read_csv", "rolling_mean", "run_stats", "scored_episodes",
           "supersteps", "table_weights", "warm_up_rows", "weighted_rolling_mean"]

Table = dict[str, np.ndarray]
PATH_PARTS = ("sample_s", "gather_s", "transform_s", "copy_s")
TARGET_RETURN = 475.0


# ---------------------------------------------------------------------------------
# reading


def read_csv(path: Path) -> Table:
    """Columns of a CSV file with a header; numeric columns as float64, others as str.

    Ragged, non-numeric or non-finite cells in a numeric column become NaN.
    """
    reader = csv.reader(io.StringIO(read_metrics_text(path), newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        return {}
    rows = [r for r in reader if r]
    out: Table = {}
    for i, name in enumerate(header):
        cells = [r[i].strip() if i < len(r) else "" for r in rows]
        filled = [c for c in cells if c]
        numeric = sum(_is_number(c) for c in filled)
        if numeric * 2 >= len(filled) and (numeric or not filled):
            out[name] = np.array([_finite(c) for c in cells], dtype=np.float64)
        else:
            out[name] = np.array(cells, dtype=object)
    return out


def _finite(text: str) -> float:
    """A cell's number; NaN for text, an empty cell, or a non-finite value (no writer
    logs ``inf``: a damaged or hand-edited file; it is left out like a missing cell)."""
    try:
        x = float(text)
    except ValueError:
        return math.nan
    return x if math.isfinite(x) else math.nan


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass
class RunData:
    """What one run directory holds.

    Attributes:
        path (Path): the run directory.
        name (str): job name (from ``config.toml``, else the directory name).
        mode (str): delivery mode (learner CSV, summary or config), ``"?"`` if unknown.
        learners (dict[int, Table]): learner metrics by world rank.
        actors (dict[int, Table]): actor metrics by world rank.
        episodes (Table | None): finished episodes.
        summary (dict[str, Any]): ``summary.json``.
        ended (str): how the job ended, from the launcher's ``exit.json`` (``"ok"``,
            ``"failed (exit N)"``; ``""`` when the directory has no launcher record).
        problems (list[str]): files that could not be read, and why.
        metrics (Path | None): the directory the metrics files are in.
        target_return (float): the return the job aims at (``dqn.target_return`` of
            ``config.toml``, else ``summary.json``'s, else 475).
        window (int): episodes in its running mean (``dqn.window``, else 20).
    """

    path: Path
    name: str
    mode: str
    metrics: Path | None = None
    target_return: float = TARGET_RETURN
    window: int = 20
    learners: dict[int, Table] = field(default_factory=dict)
    actors: dict[int, Table] = field(default_factory=dict)
    episodes: Table | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    ended: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.name} [{self.mode}]" if self.mode != "?" else self.name


def load_run(path: str | Path) -> RunData:
    """Read every metrics file of a run directory that exists and parses.

    Not collective; reads files only.

    Raises:
        ConduitError: ``path`` is not a directory.
    """
    p = Path(path)
    if not p.is_dir():
        raise ConduitError(f"run directory {str(p)!r} does not exist or is not a directory")
    metrics = p / "metrics" if (p / "metrics").is_dir() else p
    config: dict[str, Any] = {}
    if (p / "config.toml").exists():
        from conduit_hpc.config import read_toml
        from conduit_hpc.errors import ConfigError

        try:
            config = read_toml(p / "config.toml", what="run config")
        except ConfigError as err:
            config = {}
            problem = f"config.toml: {err}"
        else:
            problem = ""
    else:
        problem = ""
    name = str(config.get("run", {}).get("name") or p.name)
    run = RunData(path=p, name=name, mode="?", metrics=metrics)
    if problem:
        run.problems.append(problem)
    for kind, target in (("learner", run.learners), ("actor", run.actors)):
        for f in sorted(metrics.glob(f"{kind}-*.csv")):
            m = re.fullmatch(rf"{kind}-(\d+)\.csv", f.name)
            if not m:
                continue
            try:
                table = read_csv(f)
            except (OSError, UnicodeDecodeError, csv.Error, ConduitError) as err:
                run.problems.append(f"{f.name}: unreadable ({err})")
                continue
            if kind == "actor":
                for col in ("rows", "limiter_wait_s"):  # running totals -> per row
                    v = table.get(col)
                    if v is not None and v.dtype == np.float64:
                        table[col] = np.diff(np.nan_to_num(v), prepend=0.0)
            target[int(m.group(1))] = table
    _merge_if_stale(metrics, run.problems)
    if (metrics / "episodes.csv").exists():
        try:
            run.episodes = read_csv(metrics / "episodes.csv")
        except (OSError, UnicodeDecodeError, csv.Error, ConduitError) as err:
            run.problems.append(f"episodes.csv: unreadable ({err})")
    if (metrics / "summary.json").exists():
        try:
            loaded = json.loads(read_metrics_text(metrics / "summary.json"))
            if isinstance(loaded, dict):
                run.summary = loaded
            else:
                run.problems.append("summary.json: not a JSON object")
        except (OSError, ValueError, ConduitError) as err:
            run.problems.append(f"summary.json: unreadable ({err})")
    _read_exit(run)
    run.mode = _mode_of(run, config)
    dqn = config.get("dqn", {}) if isinstance(config.get("dqn"), dict) else {}
    goal = dqn.get("target_return", run.summary.get("target_return"))
    if isinstance(goal, int | float) and not isinstance(goal, bool):
        run.target_return = float(goal)
    window = dqn.get("window", run.summary.get("target_window"))
    if isinstance(window, int) and not isinstance(window, bool) and window >= 1:
        run.window = window
    return run


def _merge_if_stale(metrics: Path, problems: list[str]) -> None:
    """Merge the actors' episode files into ``episodes.csv`` (as the job does at its
    end) when the job did not: no merged file, or an actor's file newer than it (an
    attempt killed before its end; the report showed no episodes for a run killed in
    its first attempt, and the episodes up to the latest completed attempt's end for a
    later one). Writes only that file; a failure is one of ``problems``."""
    parts = [p for p in metrics.glob("episodes-*.csv") if p.is_file()]
    merged = metrics / "episodes.csv"
    try:
        if not parts or (merged.is_file() and merged.stat().st_mtime
                         >= max(p.stat().st_mtime for p in parts)):
            return
        from conduit_hpc.rl.episodes import merge_episode_files

        merge_episode_files(metrics)
    except (OSError, UnicodeDecodeError, csv.Error, ValueError) as err:
        problems.append(f"episodes-*.csv: not merged ({type(err).__name__}: {err})")


def _read_exit(run: RunData) -> None:
    """How the job ended, from the launcher's record (``conduit-hpc run`` writes
    ``exit.json`` when the job ends; a directory it made has ``command.txt``). A failed
    run's reason goes to :attr:`RunData.problems`."""
    from conduit_hpc.tools.rundir import EXIT_FILE

    f = run.path / EXIT_FILE
    if not f.exists():
        if (run.path / "command.txt").exists():
            run.ended = "not recorded"
            run.problems.append(f"{EXIT_FILE}: none, so how the job ended is not known: it "
                                f"is still running, or its launcher was killed")
        return
    try:
        doc = json.loads(read_metrics_text(f))
        rc, why = doc["exit_status"], doc.get("why", "")
        if not isinstance(rc, int) or isinstance(rc, bool) or not isinstance(why, str):
            raise ValueError(f"exit_status {rc!r} (expected an integer), why {why!r}")
    except (OSError, ValueError, KeyError, TypeError, ConduitError) as err:
        run.problems.append(f"{EXIT_FILE}: unreadable ({type(err).__name__}: "
                            f"{' '.join(str(err).split())[:200]})")
        return
    run.ended = "ok" if rc == 0 else f"failed (exit {rc})"
    if rc != 0:
        run.problems.append(f"the job failed (exit {rc}): "
                            f"{' '.join(why.split())[:500] or 'no reason recorded'}")


def _mode_of(run: RunData, config: dict[str, Any]) -> str:
    for t in run.learners.values():
        col = t.get("mode")
        if col is not None and len(col) and col.dtype == object:
            return str(col[0])
    if isinstance(run.summary.get("mode"), str):
        return str(run.summary["mode"])
    mode = config.get("scheduler", {}).get("mode")
    return str(mode) if isinstance(mode, str) else "?"


# ---------------------------------------------------------------------------------
# statistics


def learner_table(run: RunData) -> Table | None:
    """The lowest-rank learner's table (every learner runs the same supersteps)."""
    return run.learners[min(run.learners)] if run.learners else None


def warm_up(rows: int) -> int:
    """Supersteps at a learner's start that latency statistics skip: ``min(SKIP,
    supersteps // 10)``, the warm-up the job's ``summary.json`` skips too
    (:class:`conduit_hpc.plane.metrics.LatencyRecord`)."""
    return min(SKIP, rows // 10)


def table_weights(t: Table) -> np.ndarray:
    """Supersteps each row of a learner table stands for (its ``weight`` column, see
    :mod:`conduit_hpc.plane.sampled_rows`; 1 each in a file without it)."""
    n = max((len(v) for v in t.values()), default=0)
    col = t.get(WEIGHT)
    return weights(col if col is not None and col.dtype != object else None, n)


def supersteps(t: Table) -> int:
    """Supersteps a learner table covers: its weights summed (its rows, in a file
    without the column), each superstep once: a resumed attempt ran the supersteps after
    the checkpoint it resumed from again, and its rows from there on stand for them (the
    killed attempt's rows of those supersteps are left out of the count)."""
    return int(table_weights(t)[latest_runs(t)].sum())


def latest_runs(t: Table) -> np.ndarray:
    """Which rows of a learner table are the latest run of their supersteps: a row whose
    ``superstep`` is not below that of a row after it (a later attempt's, resumed from
    an earlier superstep) was run again. All rows without a numeric column."""
    col = t.get("superstep")
    if col is None or col.dtype != np.float64 or not len(col):
        return np.ones(len(next(iter(t.values()), [])), dtype=bool)
    c = np.where(np.isfinite(col), col, np.inf)  # (then the least after each row:)
    return ~np.isfinite(col) | (col < np.append(np.minimum.accumulate(c[::-1])[-2::-1], np.inf))


def warm_up_rows(t: Table) -> int:
    """Rows at a learner table's start that stand for its :func:`warm_up` supersteps."""
    before = np.concatenate([[0.0], np.cumsum(table_weights(t))[:-1]])
    return int(np.searchsorted(before, warm_up(supersteps(t)), side="left"))


def pooled_weighted(run: RunData, column: str, *, after_warm_up: bool = False
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``column`` of every learner's table, concatenated (finite values), and the
    supersteps each value stands for; with ``after_warm_up`` each table's
    :func:`warm_up_rows` left out."""
    vals, ws = [], []
    for t in run.learners.values():
        if column in t and t[column].dtype != object:
            skip = warm_up_rows(t) if after_warm_up else 0
            vals.append(t[column][skip:])
            ws.append(table_weights(t)[skip:])
    v = np.concatenate(vals) if vals else np.zeros(0)
    w = np.concatenate(ws) if ws else np.zeros(0)
    ok = np.isfinite(v)
    return v[ok], w[ok]


def pooled(run: RunData, column: str, *, after_warm_up: bool = False) -> np.ndarray:
    """The values of :func:`pooled_weighted` (one per row, not per superstep: weigh
    them for statistics)."""
    return pooled_weighted(run, column, after_warm_up=after_warm_up)[0]


def has_columns(t: Table | None, *columns: str) -> bool:
    return t is not None and all(c in t and t[c].dtype != object and len(t[c]) for c in columns)


def missing_columns(t: Table | None, *columns: str) -> list[str]:
    if t is None:
        return list(columns)
    return [c for c in columns if c not in t or t[c].dtype == object or not len(t[c])]


def rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    c = np.cumsum(np.insert(x.astype(np.float64), 0, 0.0))
    out = np.empty(len(x))
    for i in range(len(x)):
        lo = max(0, i + 1 - window)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def weighted_rolling_mean(x: np.ndarray, w: np.ndarray, window: int) -> np.ndarray:
    """The mean of the last ``window`` rows at each row, each weighted by the supersteps
    it stands for (:func:`rolling_mean` for weights of 1)."""
    return rolling_mean(x * w, window) / rolling_mean(w, window)


def episode_x(ep: Table) -> tuple[np.ndarray, str]:
    """Each episode's position: env steps, else time, else episode number."""
    if has_columns(ep, "env_steps"):
        return ep["env_steps"], "environment steps"
    if has_columns(ep, "time_s"):
        return ep["time_s"], "time (s)"
    return np.arange(len(ep["episode_return"]), dtype=float), "episode"


def scored_episodes(ep: Table) -> tuple[np.ndarray, np.ndarray]:
    """(x, return) of the episodes that count toward the convergence test, sorted by x.
    Episodes whose ``scored`` column is 0 (explorers with a large epsilon) are left out."""
    x, _ = episode_x(ep)
    ret = ep["episode_return"]
    keep = ep["scored"] > 0 if has_columns(ep, "scored") else np.ones(len(ret), dtype=bool)
    order = np.argsort(x[keep], kind="stable")
    return x[keep][order], ret[keep][order]


def _episode_stats(ep: Table | None, window: int) -> dict[str, Any]:
    if not has_columns(ep, "episode_return"):
        return {}
    assert ep is not None
    _, ret = scored_episodes(ep)
    out: dict[str, Any] = {"episodes": len(ep["episode_return"])}
    if has_columns(ep, "scored"):
        out["scored_episodes"] = len(ret)
    if not len(ret):
        return out
    roll = rolling_mean(ret, window)
    out["final_mean_return"] = float(roll[-1])
    out["best_mean_return"] = (float(roll[window - 1:].max()) if len(roll) >= window
                               else float("nan"))
    return out


def ingest_grid(run: RunData, bins: int = 60) -> tuple[np.ndarray, np.ndarray] | None:
    """Total ingest rate over all actors on a common time grid (rows/s)."""
    tables = [t for t in run.actors.values() if has_columns(t, "time_s", "rows_per_s")]
    if not tables:
        return None
    t_max = max(float(np.nanmax(t["time_s"])) for t in tables)
    t_min = min(float(np.nanmin(t["time_s"])) for t in tables)
    grid = np.linspace(t_min, max(t_max, t_min + 1e-9), bins)
    total = np.zeros(bins)
    for t in tables:
        order = np.argsort(t["time_s"])
        ts, rate = t["time_s"][order], np.nan_to_num(t["rows_per_s"][order])
        idx = np.searchsorted(ts, grid, side="left")  # the record that covers each point
        covered = idx < len(ts)
        total[covered] += rate[idx[covered]]
    return grid, total


def learners_split(run: RunData) -> dict[str, float] | None:
    """What the learners waited for (path work, the rate limiter, or neither: a core,
    scheduling, other ranks), summed over every learner with ``exposed_s`` after its
    warm-up, as the exposed share is; ``path_work_hidden`` the share of the path work
    not inside a wait. None without such a learner."""
    total: dict[str, float] = {}
    for t in run.learners.values():
        if not has_columns(t, "exposed_s"):
            continue
        skip = warm_up_rows(t)
        w = table_weights(t)[skip:]
        t = {c: v[skip:] for c, v in t.items()}
        n = len(t["exposed_s"])
        path = sum((np.nan_to_num(t[c]) for c in PATH_WORK if has_columns(t, c)),
                   np.zeros(n))
        for k, v in exposed_split(t["exposed_s"], t.get("limiter_wait_s"), path,
                                  w).items():
            if k != "path_work_hidden":
                total[k] = total.get(k, 0.0) + v
    if not total:
        return None
    work = total["path_work_s"]
    total["path_work_hidden"] = 1.0 - total["exposed_path_s"] / work if work > 0 else math.nan
    return total


def run_stats(run: RunData) -> dict[str, Any]:
    """Headline numbers of one run (missing inputs leave their keys out)."""
    s: dict[str, Any] = {"mode": run.mode}
    if run.ended:
        s["ended"] = run.ended
    lt = learner_table(run)
    if lt is not None:
        s["learners"] = len(run.learners)  # every learner's CSV is pooled below
        # weights summed: a file keeps a sample of rows past run.metrics_full_rows
        s["supersteps"] = max(supersteps(t) for t in run.learners.values())
    # latency figures after each learner's warm-up, as summary.json's (the first
    # superstep's wait for scheduler.min_fill_rows is no superstep's latency); each row
    # weighs the supersteps it stands for
    for col in ("iteration_s", "exposed_s", "compute_s"):
        v, w = pooled_weighted(run, col, after_warm_up=True)
        if len(v):
            s[f"{col[:-2]}_mean_ms"] = 1e3 * weighted_mean(v, w)
            s[f"{col[:-2]}_p95_ms"] = 1e3 * weighted_percentile(v, w, 95)
    it, it_w = pooled_weighted(run, "iteration_s", after_warm_up=True)
    ex, ex_w = pooled_weighted(run, "exposed_s", after_warm_up=True)
    wall = float((it * it_w).sum())
    if len(it) and len(ex) and wall > 0:
        s["exposed_share"] = float((ex * ex_w).sum() / wall)
    split = learners_split(run)
    if split is not None:
        s.update({k: v for k, v in split.items() if k != "path_work_hidden"})
        if split["path_work_s"] > 0:
            s["path_work_hidden"] = split["path_work_hidden"]
        s["exposed_story"] = exposed_story(split, wall if len(it) else None)
    # the headline figures: the function summary.json's come from, on the same files
    if run.metrics is not None:
        fig = headline_figures(run.metrics, target_return=run.target_return,
                               window=run.window)
        for key in ("ingest_rows_per_s", "actor_limiter_wait_s", "actor_seconds",
                    "rows_ingested"):
            if key in fig:
                s[key] = fig[key]
        if fig.get("env_steps_to_target") is not None:
            s["env_steps_to_target"] = fig["env_steps_to_target"]
    lw, lw_w = pooled_weighted(run, "limiter_wait_s")
    if len(lw):
        s["learner_limiter_wait_s"] = float((lw * lw_w).sum())
    s.update(_episode_stats(run.episodes, run.window))
    return s
