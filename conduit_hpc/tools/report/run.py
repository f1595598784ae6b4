"""``conduit-hpc report RUN_DIR [RUN_DIR ...]``: PNG plots and a markdown summary.

Reads the metrics files of each run (in ``RUN_DIR/metrics/``, or ``RUN_DIR`` itself):

* ``learner-<world_rank>.csv``: ``superstep,time_s,mode,iteration_s,exposed_s,compute_s,
  sample_s,gather_s,transform_s,copy_s,rows,staleness,limiter_wait_s`` (+ job columns);
  one row per superstep; durations are seconds spent in that superstep.
* ``actor-<world_rank>.csv``: ``time_s,rows,rows_per_s,limiter_wait_s,policy_version``;
  ``rows`` and ``limiter_wait_s`` are the actor's running totals at ``time_s`` (as
  ``ExperienceDataPlane`` writes them; :func:`load_run` turns them into amounts since
  the previous row), ``rows_per_s`` its ingest rate since the previous row.
* ``episodes.csv``: ``time_s,env_steps,actor,episode_return``.
* ``summary.json``: a flat dict of the run's headline numbers.

and writes ``returns.png`` (return curve), ``timeline-<run>.png`` (per-superstep learner
compute vs experience-path work, showing their overlap), ``latency.png`` (exposed and
iteration latency per run/mode side by side), ``ingest.png`` (ingest rate and
rate-limiter waits) and ``report.md``. A plot whose inputs are missing is skipped, and
the markdown says why. matplotlib with the Agg backend; no MPI.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc.errors import ConduitError

__all__ = ["RunData", "load_run", "write_report"]

Table = dict[str, np.ndarray]
PATH_PARTS = ("sample_s", "gather_s", "transform_s", "copy_s")
TARGET_RETURN = 475.0


# ---------------------------------------------------------------------------------
# reading


def read_csv(path: Path) -> Table:
    """Columns of a CSV file with a header; numeric columns as float64, others as str.

    Ragged or non-numeric cells in a numeric column become NaN.
    """
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
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
            out[name] = np.array([float(c) if _is_number(c) else math.nan for c in cells],
                                 dtype=np.float64)
        else:
            out[name] = np.array(cells, dtype=object)
    return out


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
        problems (list[str]): files that could not be read, and why.
    """

    path: Path
    name: str
    mode: str
    learners: dict[int, Table] = field(default_factory=dict)
    actors: dict[int, Table] = field(default_factory=dict)
    episodes: Table | None = None
    summary: dict[str, Any] = field(default_factory=dict)
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
    run = RunData(path=p, name=name, mode="?")
    if problem:
        run.problems.append(problem)
    for kind, target in (("learner", run.learners), ("actor", run.actors)):
        for f in sorted(metrics.glob(f"{kind}-*.csv")):
            m = re.fullmatch(rf"{kind}-(\d+)\.csv", f.name)
            if not m:
                continue
            try:
                table = read_csv(f)
            except (OSError, UnicodeDecodeError, csv.Error) as err:
                run.problems.append(f"{f.name}: unreadable ({err})")
                continue
            if kind == "actor":
                for col in ("rows", "limiter_wait_s"):  # running totals -> per row
                    v = table.get(col)
                    if v is not None and v.dtype == np.float64:
                        table[col] = np.diff(np.nan_to_num(v), prepend=0.0)
            target[int(m.group(1))] = table
    if (metrics / "episodes.csv").exists():
        try:
            run.episodes = read_csv(metrics / "episodes.csv")
        except (OSError, UnicodeDecodeError, csv.Error) as err:
            run.problems.append(f"episodes.csv: unreadable ({err})")
    if (metrics / "summary.json").exists():
        try:
            loaded = json.loads((metrics / "summary.json").read_text())
            if isinstance(loaded, dict):
                run.summary = loaded
            else:
                run.problems.append("summary.json: not a JSON object")
        except (OSError, ValueError) as err:
            run.problems.append(f"summary.json: unreadable ({err})")
    run.mode = _mode_of(run, config)
    return run


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


def _learner(run: RunData) -> Table | None:
    """The lowest-rank learner's table (every learner runs the same supersteps)."""
    return run.learners[min(run.learners)] if run.learners else None


def _pooled(run: RunData, column: str) -> np.ndarray:
    vals = [t[column] for t in run.learners.values()
            if column in t and t[column].dtype != object]
    v = np.concatenate(vals) if vals else np.zeros(0)
    return v[np.isfinite(v)]


def _has(t: Table | None, *columns: str) -> bool:
    return t is not None and all(c in t and t[c].dtype != object and len(t[c]) for c in columns)


def _missing(t: Table | None, *columns: str) -> list[str]:
    if t is None:
        return list(columns)
    return [c for c in columns if c not in t or t[c].dtype == object or not len(t[c])]


def _rolling_mean(x: np.ndarray, window: int) -> np.ndarray:
    c = np.cumsum(np.insert(x.astype(np.float64), 0, 0.0))
    out = np.empty(len(x))
    for i in range(len(x)):
        lo = max(0, i + 1 - window)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def _episode_x(ep: Table) -> tuple[np.ndarray, str]:
    """Each episode's position: env steps, else time, else episode number."""
    if _has(ep, "env_steps"):
        return ep["env_steps"], "environment steps"
    if _has(ep, "time_s"):
        return ep["time_s"], "time (s)"
    return np.arange(len(ep["episode_return"]), dtype=float), "episode"


def _scored_episodes(ep: Table) -> tuple[np.ndarray, np.ndarray]:
    """(x, return) of the episodes that count toward the convergence test, sorted by x.
    Episodes whose ``scored`` column is 0 (explorers with a large epsilon) are left out."""
    x, _ = _episode_x(ep)
    ret = ep["episode_return"]
    keep = ep["scored"] > 0 if _has(ep, "scored") else np.ones(len(ret), dtype=bool)
    order = np.argsort(x[keep], kind="stable")
    return x[keep][order], ret[keep][order]


def _episode_stats(ep: Table | None) -> dict[str, Any]:
    if not _has(ep, "episode_return"):
        return {}
    assert ep is not None
    x, ret = _scored_episodes(ep)
    out: dict[str, Any] = {"episodes": len(ep["episode_return"])}
    if _has(ep, "scored"):
        out["scored_episodes"] = len(ret)
    if not len(ret):
        return out
    roll = _rolling_mean(ret, 20)
    out["final_mean_return_20"] = float(roll[-1])
    out["best_mean_return_20"] = float(roll[19:].max()) if len(roll) >= 20 else float("nan")
    hit = np.flatnonzero((roll >= TARGET_RETURN) & (np.arange(len(roll)) >= 19))
    if len(hit) and _has(ep, "env_steps"):
        out["env_steps_to_475"] = int(x[hit[0]])
    return out


def _ingest_grid(run: RunData, bins: int = 60) -> tuple[np.ndarray, np.ndarray] | None:
    """Total ingest rate over all actors on a common time grid (rows/s)."""
    tables = [t for t in run.actors.values() if _has(t, "time_s", "rows_per_s")]
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


def run_stats(run: RunData) -> dict[str, Any]:
    """Headline numbers of one run (missing inputs leave their keys out)."""
    s: dict[str, Any] = {"mode": run.mode}
    lt = _learner(run)
    if lt is not None:
        s["supersteps"] = max(len(next(iter(t.values()), [])) for t in run.learners.values())
    for col in ("iteration_s", "exposed_s", "compute_s"):
        v = _pooled(run, col)
        if len(v):
            s[f"{col[:-2]}_mean_ms"] = 1e3 * float(v.mean())
            s[f"{col[:-2]}_p95_ms"] = 1e3 * float(np.percentile(v, 95))
    it, ex = _pooled(run, "iteration_s"), _pooled(run, "exposed_s")
    if len(it) and len(ex) and it.sum() > 0:
        s["exposed_share"] = float(ex.sum() / it.sum())
    parts = [c for c in PATH_PARTS if _has(lt, c)]
    if lt is not None and parts and _has(lt, "exposed_s"):
        work = float(sum(np.nansum(lt[c]) for c in parts))
        if work > 0:
            s["path_work_hidden"] = max(0.0, 1.0 - float(np.nansum(lt["exposed_s"])) / work)
    grid = _ingest_grid(run)
    if grid is not None:
        s["ingest_rows_per_s"] = float(grid[1].mean())
    waits = [float(np.nansum(t["limiter_wait_s"])) for t in run.actors.values()
             if _has(t, "limiter_wait_s")]
    if waits:
        s["actor_limiter_wait_s"] = float(sum(waits))
    lw = _pooled(run, "limiter_wait_s")
    if len(lw):
        s["learner_limiter_wait_s"] = float(lw.sum())
    s.update(_episode_stats(run.episodes))
    return s


# ---------------------------------------------------------------------------------
# plots (each returns the file written, or None and the reason)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


def plot_returns(runs: Sequence[RunData], out: Path) -> tuple[Path | None, str]:
    have = [r for r in runs if _has(r.episodes, "episode_return")]
    if not have:
        why = "; ".join(f"{r.label}: " + ("no episodes.csv" if r.episodes is None else
                        "episodes.csv lacks " + ", ".join(_missing(r.episodes,
                                                                   "episode_return")))
                        for r in runs)
        return None, f"return curve skipped ({why})"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    xlabel = "environment steps"
    for r in have:
        ep = r.episodes
        assert ep is not None
        x_all, xlabel = _episode_x(ep)
        order = np.argsort(x_all, kind="stable")
        x, y = _scored_episodes(ep)
        scored = "scored " if _has(ep, "scored") else ""
        line = ax.plot(x, _rolling_mean(y, 20), lw=2,
                       label=f"{r.label} (mean of 20 {scored}episodes)")[0]
        ax.scatter(x_all[order], ep["episode_return"][order], s=4, alpha=0.2,
                   color=line.get_color())
    ax.axhline(TARGET_RETURN, color="grey", ls="--", lw=1, label=f"target {TARGET_RETURN:g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("episode return")
    ax.set_title("Return curve")
    if len(have) > 4:  # many runs: the legend goes below the axes, not over the curves
        fig.set_size_inches(8, 4.5 + 0.18 * (len(have) + 1))
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize=7)
    else:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path = out / "returns.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    skipped = [r.label for r in runs if r not in have]
    return path, (f"runs without episodes: {', '.join(skipped)}" if skipped else "")


def plot_timeline(run: RunData, out: Path, window: int = 24) -> tuple[Path | None, str]:
    lt = _learner(run)
    need = ("iteration_s", "compute_s", "exposed_s")
    if lt is None:
        return None, f"timeline of {run.label} skipped (no learner-*.csv)"
    if _missing(lt, *need):
        return None, (f"timeline of {run.label} skipped (learner CSV lacks "
                      f"{', '.join(_missing(lt, *need))})")
    parts = [c for c in PATH_PARTS if _has(lt, c)]
    it = np.nan_to_num(lt["iteration_s"])
    comp, expo = np.nan_to_num(lt["compute_s"]), np.nan_to_num(lt["exposed_s"])
    step = lt["superstep"] if _has(lt, "superstep") else np.arange(len(it), dtype=float)
    start = np.concatenate([[0.0], np.cumsum(it)[:-1]])
    plt = _plt()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), height_ratios=[1, 1.2],
                                     layout="constrained")
    # top: a Gantt chart of `window` supersteps from the middle of the run
    lo = max(0, len(it) // 2 - window // 2)
    hi = min(len(it), lo + window)
    colors = {"sample_s": "#8c564b", "gather_s": "#ff7f0e", "transform_s": "#9467bd",
              "copy_s": "#17becf"}
    lanes: dict[str, list[tuple[float, float]]] = {"exposed": [], "compute": []}
    lanes.update({c: [] for c in parts})
    for i in range(lo, hi):
        t = start[i] - start[lo]
        lanes["exposed"].append((t * 1e3, expo[i] * 1e3))
        lanes["compute"].append(((t + expo[i]) * 1e3, comp[i] * 1e3))
        x = t
        for c in parts:
            d = float(np.nan_to_num(lt[c][i]))
            lanes[c].append((x * 1e3, d * 1e3))
            x += d
    top.broken_barh(lanes["exposed"], (1.1, 0.8), color="#d62728")
    top.broken_barh(lanes["compute"], (1.1, 0.8), color="#1f77b4")
    for c in parts:
        top.broken_barh(lanes[c], (0.1, 0.8), color=colors[c])
    top.vlines((start[lo:hi] - start[lo]) * 1e3, 0, 2, color="black", lw=0.4, alpha=0.4)
    handles = [plt.Rectangle((0, 0), 1, 1, color="#d62728", label="learner waits (exposed)"),
               plt.Rectangle((0, 0), 1, 1, color="#1f77b4", label="learner computes")]
    handles += [plt.Rectangle((0, 0), 1, 1, color=colors[c], label=c[:-2]) for c in parts]
    top.set_yticks([0.5, 1.5], ["experience path" if parts else "(no path columns)",
                                "learner"])
    top.set_xlabel(f"ms since superstep {int(step[lo])} (thin lines: superstep starts)")
    top.set_title(f"{run.label}: supersteps {int(step[lo])}-{int(step[hi - 1])} "
                  "(experience-path work drawn from the start of the superstep it ran in)")
    top.set_ylim(0, 2.6)
    top.legend(handles=handles, fontsize=7, ncol=len(handles), loc="upper left")
    # bottom: every superstep
    k = max(1, len(it) // 200)
    bottom.plot(step, _rolling_mean(it, k) * 1e3, label="iteration", color="black", lw=1)
    bottom.plot(step, _rolling_mean(comp, k) * 1e3, label="compute", color="#1f77b4", lw=1)
    if parts:
        work = sum(np.nan_to_num(lt[c]) for c in parts)
        bottom.plot(step, _rolling_mean(np.asarray(work), k) * 1e3, color="#ff7f0e", lw=1.5,
                    label="experience-path work (" + "+".join(c[:-2] for c in parts) + ")")
    bottom.plot(step, _rolling_mean(expo, k) * 1e3, label="exposed", color="#d62728", lw=1,
                ls="--")
    bottom.set_xlabel("superstep" + (f" (rolling mean of {k})" if k > 1 else ""))
    bottom.set_ylabel("ms")
    bottom.legend(fontsize=7, ncol=2, loc="best")
    bottom.grid(alpha=0.3)
    path = out / f"timeline-{_slug(run.name)}-{_slug(run.mode)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    note = "" if parts else (f"{run.label}: no experience-path columns "
                             f"({', '.join(PATH_PARTS)}); lane left empty")
    return path, note


def plot_latency(runs: Sequence[RunData], out: Path) -> tuple[Path | None, str]:
    have = [r for r in runs if len(_pooled(r, "exposed_s")) and len(_pooled(r, "iteration_s"))]
    if not have:
        return None, ("latency bars skipped (no learner CSV with exposed_s and "
                      "iteration_s in any run)")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(have) + 3), 4.5),
                           layout="constrained")
    x = np.arange(len(have))
    w = 0.38
    for j, (col, color) in enumerate((("exposed_s", "#d62728"), ("iteration_s", "#555555"))):
        means = [1e3 * _pooled(r, col).mean() for r in have]
        p95 = [1e3 * np.percentile(_pooled(r, col), 95) for r in have]
        err = np.array([[0.0] * len(have), [max(0.0, p - m) for p, m in zip(p95, means,
                                                                             strict=True)]])
        bars = ax.bar(x + (j - 0.5) * w, means, w, yerr=err, capsize=3, color=color,
                      label=f"{col[:-2]} (mean; whisker: p95)")
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    ax.set_xticks(x, [r.label for r in have], rotation=15 if len(have) > 3 else 0,
                  fontsize=8)
    ax.set_ylabel("ms per superstep")
    ax.set_title("Exposed vs iteration latency per run (mode)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    path = out / "latency.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    skipped = [r.label for r in runs if r not in have]
    return path, (f"runs without latency columns: {', '.join(skipped)}" if skipped else "")


def plot_ingest(runs: Sequence[RunData], out: Path) -> tuple[Path | None, str]:
    rate = {r.label: g for r in runs if (g := _ingest_grid(r)) is not None}
    waits = []
    for r in runs:
        for who, tables, tcol in (("actors", list(r.actors.values()), "time_s"),
                                  ("learner", list(r.learners.values()), "time_s")):
            ts = [t for t in tables if _has(t, tcol, "limiter_wait_s")]
            if ts:
                t_all = np.concatenate([t[tcol] for t in ts])
                w_all = np.nan_to_num(np.concatenate([t["limiter_wait_s"] for t in ts]))
                order = np.argsort(t_all, kind="stable")
                waits.append((f"{r.label} {who}", t_all[order], np.cumsum(w_all[order])))
    if not rate and not waits:
        return None, ("ingest plot skipped (no actor-*.csv with time_s and rows_per_s, and "
                      "no limiter_wait_s column in any actor or learner CSV)")
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for label, (grid, total) in rate.items():
        a.plot(grid, total, lw=1.5, label=label)
    a.set_xlabel("time (s)")
    a.set_ylabel("rows/s (all actors)")
    a.set_title("Ingest rate" if rate else "Ingest rate (no actor rows_per_s)")
    if rate:
        a.legend(fontsize=7)
    a.grid(alpha=0.3)
    for label, t, c in waits:
        b.plot(t, c, lw=1.5, label=label)
    b.set_xlabel("time (s)")
    b.set_ylabel("cumulative wait (s)")
    b.set_title("Rate-limiter waits" if waits else "Rate-limiter waits (no limiter_wait_s)")
    if waits:
        b.legend(fontsize=7)
    b.grid(alpha=0.3)
    path = out / "ingest.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    notes = []
    if not rate:
        notes.append("no actor-*.csv with time_s and rows_per_s: rate panel empty")
    if not waits:
        notes.append("no limiter_wait_s column: waits panel empty")
    return path, "; ".join(notes)


# ---------------------------------------------------------------------------------
# the report


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if abs(v) < 1e-9:
            return "0"
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


STAT_ROWS = (
    ("mode", "mode"),
    ("supersteps", "supersteps"),
    ("iteration_mean_ms", "iteration latency, mean (ms)"),
    ("iteration_p95_ms", "iteration latency, p95 (ms)"),
    ("exposed_mean_ms", "exposed latency, mean (ms)"),
    ("exposed_p95_ms", "exposed latency, p95 (ms)"),
    ("compute_mean_ms", "learner compute, mean (ms)"),
    ("exposed_share", "exposed share of wall time"),
    ("path_work_hidden", "experience-path work hidden behind compute"),
    ("ingest_rows_per_s", "ingest rate (rows/s, all actors)"),
    ("actor_limiter_wait_s", "rate-limiter wait, actors (s)"),
    ("learner_limiter_wait_s", "rate-limiter wait, learners (s)"),
    ("episodes", "episodes"),
    ("scored_episodes", "scored episodes (near-greedy explorers)"),
    ("final_mean_return_20", "mean return, last 20 (scored) episodes"),
    ("best_mean_return_20", "best mean return over 20 (scored) episodes"),
    ("env_steps_to_475", "env steps to mean return 475"),
)


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None
                 ) -> Path:
    """Write the plots and ``report.md`` for one or several runs.

    Not collective; blocks while plotting (seconds). Default output: ``RUN_DIR/report``
    for one run, ``report-<timestamp>`` beside the first run for several.

    Returns:
        Path: the markdown file.

    Raises:
        ConduitError: no run directory given, or one does not exist.
    """
    if not run_dirs:
        raise ConduitError("report needs at least one run directory, got none")
    runs = [load_run(d) for d in run_dirs]
    if out_dir is None:
        first = Path(run_dirs[0])
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = first / "report" if len(runs) == 1 else first.parent / f"report-{stamp}"
    else:
        out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # several runs of one name differ by mode; several of one mode differ by directory
    labels = [r.label for r in runs]
    for r in runs:
        if labels.count(r.label) > 1:
            r.name = f"{r.name} ({r.path.name})"
    plots: list[tuple[str, Path]] = []
    notes: list[str] = []
    for title, (path, note) in [("Return curve", plot_returns(runs, out)),
                                *[(f"Timeline: {r.label}", plot_timeline(r, out))
                                  for r in runs],
                                ("Exposed and iteration latency", plot_latency(runs, out)),
                                ("Ingest rate and rate-limiter waits", plot_ingest(runs, out))]:
        if path is not None:
            plots.append((title, path))
        if note:
            notes.append(note)
    stats = [run_stats(r) for r in runs]
    lines = ["# conduit_hpc run report", ""]
    lines += ["Runs: " + ", ".join(f"`{r.path}`" for r in runs), ""]
    lines += ["## Summary", "", "| | " + " | ".join(r.label for r in runs) + " |",
              "|---|" + "---|" * len(runs)]
    for key, title in STAT_ROWS:
        if any(key in s for s in stats):
            lines.append(f"| {title} | " + " | ".join(_fmt(s.get(key, "-")) for s in stats)
                         + " |")
    lines.append("")
    for r in runs:
        if r.summary:
            lines += [f"### summary.json of {r.label}", "", "| key | value |", "|---|---|"]
            lines += [f"| {k} | {_fmt(v) if not isinstance(v, dict | list) else json.dumps(v)}"
                      " |" for k, v in r.summary.items()]
            lines.append("")
    lines += ["## Plots", ""]
    for title, path in plots:
        lines += [f"### {title}", "", f"![{title}]({path.name})", ""]
    problems = [f"{r.label}: {p}" for r in runs for p in r.problems]
    if notes or problems:
        lines += ["## Skipped or incomplete", ""]
        lines += [f"- {n}" for n in [*notes, *problems]]
        lines.append("")
    md = out / "report.md"
    md.write_text("\n".join(lines))
    return md
