"""The run report's plots (:func:`~conduit_hpc.tools.report.run.write_report`): return
curve, per-superstep timeline, latency, ingest rate and rate-limiter waits. Each
``plot_*`` returns the PNG written, or ``None``, and a note saying what was skipped and
why. matplotlib with the Agg backend (imported when a plot is drawn); no MPI.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc.plane.headline import headline_figures, waited_fraction
from conduit_hpc.plane.metrics import LEARNER_COLUMNS
from conduit_hpc.plane.sampled_rows import weighted_mean, weighted_percentile
from conduit_hpc.tools.report.run_data import (
    PATH_PARTS,
    RunData,
    episode_x,
    has_columns,
    ingest_grid,
    learner_table,
    missing_columns,
    pooled,
    pooled_weighted,
    rolling_mean,
    scored_episodes,
    table_weights,
    warm_up_rows,
    weighted_rolling_mean,
)

__all__ = ["plot_ingest", "plot_latency", "plot_logged", "plot_returns", "plot_timeline"]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _whole(x: float) -> str:
    """A superstep number as text: ``?`` for a missing (NaN) or infinite cell."""
    return str(int(x)) if np.isfinite(x) else "?"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


def plot_returns(runs: Sequence[RunData], out: Path) -> tuple[Path | None, str]:
    have = [r for r in runs if has_columns(r.episodes, "episode_return")]
    if not have:
        why = "; ".join(f"{r.label}: " + ("no episodes.csv" if r.episodes is None else
                        "episodes.csv lacks " + ", ".join(missing_columns(r.episodes,
                                                                   "episode_return")))
                        for r in runs)
        return None, f"return curve skipped ({why})"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    xlabel = "environment steps"
    for r in have:
        ep = r.episodes
        assert ep is not None
        x_all, xlabel = episode_x(ep)
        order = np.argsort(x_all, kind="stable")
        x, y = scored_episodes(ep)
        scored = "scored " if has_columns(ep, "scored") else ""
        line = ax.plot(x, rolling_mean(y, r.window), lw=2,
                       label=f"{r.label} (mean of {r.window} {scored}episodes)")[0]
        ax.scatter(x_all[order], ep["episode_return"][order], s=4, alpha=0.2,
                   color=line.get_color())
    for target in sorted({r.target_return for r in have}):
        ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:g}")
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
    skipped = [r.label for r in runs if not any(r is h for h in have)]  # not ==: arrays
    return path, (f"runs without episodes: {', '.join(skipped)}" if skipped else "")


def plot_timeline(run: RunData, out: Path, window: int = 24) -> tuple[Path | None, str]:
    lt = learner_table(run)
    need = ("iteration_s", "compute_s", "exposed_s")
    if lt is None:
        return None, f"timeline of {run.label} skipped (no learner-*.csv)"
    if missing_columns(lt, *need):
        return None, (f"timeline of {run.label} skipped (learner CSV lacks "
                      f"{', '.join(missing_columns(lt, *need))})")
    parts = [c for c in PATH_PARTS if has_columns(lt, c)]
    w = table_weights(lt)  # past run.metrics_full_rows a row stands for several supersteps
    it = np.nan_to_num(lt["iteration_s"])
    comp, expo = np.nan_to_num(lt["compute_s"]), np.nan_to_num(lt["exposed_s"])
    step = lt["superstep"] if has_columns(lt, "superstep") else np.arange(len(it), dtype=float)
    start = np.concatenate([[0.0], np.cumsum(it)[:-1]])
    plt = _plt()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), height_ratios=[1, 1.2],
                                     layout="constrained")
    # top: a Gantt chart of `window` successive supersteps from the middle of the run,
    # or of the rows with one superstep each (they come first)
    each = int(np.argmax(w > 1)) if (w > 1).any() else len(it)
    lo = max(0, each // 2 - window // 2)
    hi = min(each, lo + window)
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
    top.set_xlabel(f"ms since superstep {_whole(step[lo])} (thin lines: superstep starts)")
    fig.suptitle(f"{run.label}: timeline", fontsize=11)
    where = "run" if each == len(it) else "supersteps the file has every row of"
    top.set_title(f"supersteps {_whole(step[lo])}-{_whole(step[hi - 1])} from the middle of the "
                  f"{where}\n(experience-path work drawn from the start of the superstep it "
                  f"ran in)", fontsize=9)
    top.set_ylim(0, 2.6)
    top.legend(handles=handles, fontsize=7, ncol=len(handles), loc="upper left")
    # bottom: every superstep; the y axis is clipped so that warm-up (the first
    # supersteps wait for the minimum fill, torch's first steps) does not flatten the rest
    k = max(1, len(it) // 200)
    warm = warm_up_rows(lt)
    ceiling = _ceiling([it[warm:], comp[warm:], expo[warm:]], w[warm:])
    bottom.plot(step, weighted_rolling_mean(it, w, k) * 1e3, label="iteration",
                color="black", lw=1)
    bottom.plot(step, weighted_rolling_mean(comp, w, k) * 1e3, label="compute",
                color="#1f77b4", lw=1)
    if parts:
        work = sum(np.nan_to_num(lt[c]) for c in parts)
        bottom.plot(step, weighted_rolling_mean(np.asarray(work), w, k) * 1e3,
                    color="#ff7f0e", lw=1.5,
                    label="experience-path work (" + "+".join(c[:-2] for c in parts) + ")")
    bottom.plot(step, weighted_rolling_mean(expo, w, k) * 1e3, label="exposed",
                color="#d62728", lw=1, ls="--")
    bottom.set_xlabel("superstep" + (f" (rolling mean of {k})" if k > 1 else ""))
    peak = float(np.max(it)) * 1e3 if len(it) else 0.0
    if ceiling is not None and peak > ceiling:
        bottom.set_ylim(0, ceiling)
        first = int(np.argmax(it))
        bottom.set_ylabel(f"ms (clipped at {ceiling:.4g}: 1.5 x p99 after the first "
                          f"{warm} supersteps;\nsuperstep {_whole(step[first])} took "
                          f"{peak:.4g} ms)", fontsize=8)
    else:
        bottom.set_ylabel("ms")
    bottom.legend(fontsize=7, ncol=2, loc="best")
    bottom.grid(alpha=0.3)
    path = out / f"timeline-{_slug(run.name)}-{_slug(run.mode)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    note = "" if parts else (f"{run.label}: no experience-path columns "
                             f"({', '.join(PATH_PARTS)}); lane left empty")
    return path, note


def _ceiling(series: Sequence[np.ndarray], w: np.ndarray) -> float | None:
    """1.5 x the largest p99 of ``series`` (ms; rows weighted by ``w``), or None when
    empty."""
    vals = [weighted_percentile(v, w, 99) for v in series if len(v)]
    return 1.5 * max(vals) * 1e3 if vals and max(vals) > 0 else None


def plot_logged(run: RunData, out: Path, window: int = 50) -> tuple[Path | None, str]:
    """What the job logged with ``ExperienceDataPlane.log(name=value)`` (the learner
    CSV's columns beyond :data:`~conduit_hpc.plane.metrics.LEARNER_COLUMNS`), one panel
    each, against the superstep: the values and their rolling mean."""
    lt = learner_table(run)
    if lt is None:
        return None, ""
    cols = [c for c in lt if c not in LEARNER_COLUMNS and has_columns(lt, c)
            and np.isfinite(lt[c]).any()]
    if not cols:
        return None, ""
    plt = _plt()
    fig, axes = plt.subplots(len(cols), 1, figsize=(9, 2.4 * len(cols) + 0.6),
                             layout="constrained", sharex=True, squeeze=False)
    step = lt["superstep"] if has_columns(lt, "superstep") else np.arange(len(lt[cols[0]]),
                                                                          dtype=float)
    w = table_weights(lt)
    for ax, c in zip(axes[:, 0], cols, strict=True):
        v = lt[c]
        ok = np.isfinite(v)
        ax.plot(step[ok], v[ok], lw=0.5, alpha=0.35, color="#1f77b4")
        k = min(window, max(1, int(ok.sum()) // 20))
        ax.plot(step[ok], weighted_rolling_mean(v[ok], w[ok], k), lw=1.5, color="#1f77b4",
                label=f"rolling mean of {k}")
        ax.set_ylabel(c)
        if (v[ok] > 0).all() and v[ok].max() > 100 * v[ok].min():
            ax.set_yscale("log")
            ax.set_ylabel(f"{c} (log)")
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("superstep")
    fig.suptitle(f"{run.label}: learner columns beyond the standard ones (edp.log values "
                 "such as loss, extra timings)", fontsize=11)
    path = out / f"logged-{_slug(run.name)}-{_slug(run.mode)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path, ""


def plot_latency(runs: Sequence[RunData], out: Path) -> tuple[Path | None, str]:
    have = [r for r in runs if len(pooled(r, "exposed_s")) and len(pooled(r, "iteration_s"))]
    if not have:
        return None, ("latency bars skipped (no learner CSV with exposed_s and "
                      "iteration_s in any run)")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(have) + 3), 4.5),
                           layout="constrained")
    x = np.arange(len(have))
    w = 0.38
    for j, (col, color) in enumerate((("exposed_s", "#d62728"), ("iteration_s", "#555555"))):
        # after the warm-up, as the summary's table and summary.json
        vw = [pooled_weighted(r, col, after_warm_up=True) for r in have]  # rows, weights
        means = [1e3 * weighted_mean(*x) for x in vw]
        p95 = [1e3 * weighted_percentile(*x, 95) for x in vw]
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
    skipped = [r.label for r in runs if not any(r is h for h in have)]  # not ==: arrays
    return path, (f"runs without latency columns: {', '.join(skipped)}" if skipped else "")


def plot_ingest(runs: Sequence[RunData], out: Path) -> tuple[Path | None, str]:
    rate = {r.label: g for r in runs if (g := ingest_grid(r)) is not None}
    waits = []
    for r in runs:
        for who, tables, tcol in (("actors", list(r.actors.values()), "time_s"),
                                  ("learner", list(r.learners.values()), "time_s")):
            ts = [t for t in tables if has_columns(t, tcol, "limiter_wait_s")]
            if ts:
                t_all = np.concatenate([t[tcol] for t in ts])
                w_all = np.nan_to_num(np.concatenate([  # a learner row: its supersteps'
                    t["limiter_wait_s"] * (table_weights(t) if who == "learner" else 1.0)
                    for t in ts]))
                order = np.argsort(t_all, kind="stable")
                waits.append((f"{r.label} {who}", t_all[order], np.cumsum(w_all[order])))
    if not rate and not waits:
        return None, ("ingest plot skipped (no actor-*.csv with time_s and rows_per_s, and "
                      "no limiter_wait_s column in any actor or learner CSV)")
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    heads = {r.label: headline_figures(r.metrics) for r in runs if r.metrics is not None}
    for label, (grid, total) in rate.items():
        line = a.plot(grid, total, lw=1.5, label=label)[0]
        mean = heads.get(label, {}).get("ingest_rows_per_s")
        if mean:  # the summary's figure: rows over the actors' span
            a.axhline(mean, color=line.get_color(), ls=":", lw=1,
                      label=f"{label}: {mean:,.0f} rows/s over the run")
    a.set_xlabel("time (s)")
    a.set_ylabel("rows/s (all actors)")
    a.set_title("Ingest rate" if rate else "Ingest rate (no actor rows_per_s)")
    if rate:
        a.legend(fontsize=7)
    a.grid(alpha=0.3)
    for label, t, c in waits:
        b.plot(t, c, lw=1.5, label=label)
    b.set_xlabel("time (s)")
    b.set_ylabel("cumulative wait (s, summed over ranks)")
    said = [f"{label}: {w}" for label, fig in heads.items() if (w := waited_fraction(fig))]
    b.set_title(("Rate-limiter waits\n" + "\n".join(said)) if said else
                "Rate-limiter waits" if waits else "Rate-limiter waits (no limiter_wait_s)",
                fontsize=9 if said else None)
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
