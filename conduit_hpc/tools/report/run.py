"""``conduit-hpc report RUN_DIR [RUN_DIR ...]``: PNG plots and a markdown summary.

Reads the metrics files of each run (in ``RUN_DIR/metrics/``, or ``RUN_DIR`` itself):

* ``learner-<world_rank>.csv``: ``superstep,time_s,mode,iteration_s,exposed_s,compute_s,
  sample_s,gather_s,transform_s,copy_s,rows,staleness,limiter_wait_s,weight`` (+ job
  columns); a row per superstep, past ``run.metrics_full_rows`` supersteps a sample
  whose ``weight`` says how many supersteps each row stands for (1 when the column is
  missing: older files; :mod:`conduit_hpc.plane.sampled_rows`): counts of supersteps
  sum the weights, sums, means and percentiles weigh each row by its weight; durations
  are seconds spent in that superstep.
* ``actor-<world_rank>.csv``: ``time_s,rows,rows_per_s,limiter_wait_s,policy_version``;
  ``rows`` and ``limiter_wait_s`` are the actor's running totals at ``time_s`` (as
  ``ExperienceDataPlane`` writes them; :func:`load_run` turns them into amounts since
  the previous row), ``rows_per_s`` its ingest rate since the previous row.
* ``episodes.csv``: ``time_s,env_steps,actor,episode_return``: the actors'
  ``episodes-<rank>.csv`` merged, by the job at its end, or by the report when the job
  did not (an attempt killed before its end: none, or older than an actor's file).
* ``summary.json``: a flat dict of the run's headline numbers;
* ``RUN_DIR/plan.json``: the placement the run executed, with its prediction (see
  :mod:`conduit_hpc.tools.report.plan_check`): the report's "Plan" section.

and writes ``returns.png`` (return curve), ``timeline-<run>.png`` (per-superstep learner
compute vs experience-path work, showing their overlap), ``latency.png`` (exposed and
iteration latency per run/mode side by side), ``ingest.png`` (ingest rate and
rate-limiter waits, with the share of the actors' time they waited),
``logged-<run>.png`` (every value the job logged with ``edp.log(name=value)``: the
learner CSV's extra columns, such as ``loss``) and ``report.md``. The headline figures
(ingest rate, waits, env steps to the target) come from
:func:`conduit_hpc.plane.headline.headline_figures`, as ``summary.json``'s do. A plot
whose inputs are missing is skipped, and the markdown says why. matplotlib with the Agg
backend; no MPI.

Loading and statistics are in :mod:`.run_data`, the plots in :mod:`.run_plots`; this
module writes the markdown.
"""


from __future__ import annotations

import datetime as _dt
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from conduit_hpc import jsontext
from conduit_hpc.errors import ConduitError
from conduit_hpc.tools.report.plan_check import load_plan, plan_markdown
from conduit_hpc.tools.report.run_data import RunData, load_run, run_stats
from conduit_hpc.tools.report.run_plots import (
    _plt,
    plot_ingest,
    plot_latency,
    plot_logged,
    plot_returns,
    plot_timeline,
)

__all__ = ["RunData", "load_run", "run_stats", "write_report"]


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
    ("ended", "how the job ended (the launcher's exit.json)"),
    ("learners", "learner ranks (metrics pooled over all)"),
    ("supersteps", "supersteps (the most of any learner)"),
    ("iteration_mean_ms", "iteration latency, mean (ms)"),
    ("iteration_p95_ms", "iteration latency, p95 (ms)"),
    ("exposed_mean_ms", "exposed latency, mean (ms)"),
    ("exposed_p95_ms", "exposed latency, p95 (ms)"),
    ("compute_mean_ms", "learner compute, mean (ms)"),
    ("exposed_share", "exposed share of wall time"),
    ("exposed_total_s", "exposed time, learners (s): the wait in next_batch"),
    ("exposed_path_s", "- of it, path work (s; edp: at most, it ran on a thread)"),
    ("exposed_limiter_s", "- of it, the rate limiter (s)"),
    ("exposed_other_s", "- of it, neither: a core, scheduling, other ranks (s)"),
    ("path_work_s", "experience-path work, learners (s)"),
    ("path_work_hidden", "experience-path work hidden behind compute (share)"),
    ("rows_ingested", "rows ingested (all actors)"),
    ("ingest_rows_per_s", "ingest rate (rows/s, all actors, over their span)"),
    ("actor_limiter_wait_s", "rate-limiter wait, actors (s)"),
    ("actor_seconds", "actor time, summed over actors (s)"),
    ("learner_limiter_wait_s", "rate-limiter wait, learners (s)"),
    ("episodes", "episodes"),
    ("scored_episodes", "scored episodes (near-greedy explorers)"),
    ("final_mean_return", "mean return, last WINDOW (scored) episodes"),
    ("best_mean_return", "best mean return over WINDOW (scored) episodes"),
    ("env_steps_to_target", "env steps to mean return TARGET"),
)


def _drawn(title: str, plot: Callable[..., tuple[Path | None, str]], *args: Any
           ) -> tuple[Path | None, str]:
    """One plot, or a note of why it was skipped: values a run never writes (a damaged or
    hand-edited file: 1e308 seconds, a superstep of -1e300) can make matplotlib fail to
    lay out an axis, and one bad plot must not lose the report of the rest."""
    try:
        return plot(*args)
    except (ValueError, OverflowError, FloatingPointError, MemoryError) as err:
        _plt().close("all")
        return None, (f"{title}: not drawn, its values are out of range for a plot "
                      f"({type(err).__name__}: {' '.join(str(err).split())[:200]})")


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None
                 ) -> Path:
    """Write the plots and ``report.md`` for one or several runs.

    Not collective; blocks while plotting (seconds). Default output: ``RUN_DIR/report``
    for one run, ``report-<timestamp>`` beside the first run for several.

    Returns:
        Path: the markdown file.

    Raises:
        ConduitError: no run directory given, or one does not exist or holds no run's
            files (nothing is written then).
    """
    if not run_dirs:
        raise ConduitError("report needs at least one run directory, got none")
    given: dict[Path, str] = {}
    for d in map(str, run_dirs):  # one run given twice would be compared with itself
        where = Path(os.path.realpath(d))  # Path.resolve raises RuntimeError on a loop
        if where in given:
            also = f" (also as {given[where]!r})" if given[where] != d else ""
            raise ConduitError(f"RUN_DIR {d!r} is given twice{also}; give each run once")
        given[where] = d
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ConduitError(f"--out must be a folder (created if missing), got {str(out_dir)!r}"
                           f": an existing file that is not a folder")
    runs = [load_run(d) for d in run_dirs]
    for r in runs:
        if not (r.learners or r.actors or r.episodes is not None or r.summary
                or r.problems):
            raise ConduitError(
                f"no run in {str(r.path)!r}: neither it nor its metrics/ holds "
                f"learner-*.csv, actor-*.csv, episodes.csv or summary.json; give a run "
                f"directory (conduit-hpc run prints it, e.g. runs/<name>-<stamp>)")
    if out_dir is None:
        first = Path(run_dirs[0])
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = first / "report" if len(runs) == 1 else first.parent / f"report-{stamp}"
    else:
        out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConduitError(f"--out must be a folder that can be created, got {str(out)!r}: "
                           f"{err.strerror or err}") from err
    # several runs of one name differ by mode; several of one mode differ by directory
    labels = [r.label for r in runs]
    for r in runs:
        if labels.count(r.label) > 1:
            r.name = f"{r.name} ({r.path.name})"
    plots: list[tuple[str, Path]] = []
    notes: list[str] = []
    for title, (path, note) in [
            ("Return curve", _drawn("Return curve", plot_returns, runs, out)),
            *[(f"Timeline: {r.label}", _drawn(f"Timeline: {r.label}", plot_timeline, r, out))
              for r in runs],
            *[(f"Logged values: {r.label}",
               _drawn(f"Logged values: {r.label}", plot_logged, r, out)) for r in runs],
            ("Exposed and iteration latency",
             _drawn("Exposed and iteration latency", plot_latency, runs, out)),
            ("Ingest rate and rate-limiter waits",
             _drawn("Ingest rate and rate-limiter waits", plot_ingest, runs, out))]:
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
        title = (title.replace("WINDOW", "/".join(sorted({str(r.window) for r in runs})))
                 .replace("TARGET", "/".join(sorted({f"{r.target_return:g}" for r in runs}))))
        if any(key in s for s in stats):
            lines.append(f"| {title} | " + " | ".join(_fmt(s.get(key, "-")) for s in stats)
                         + " |")
    lines.append("")
    lines += [f"- {r.label}: {s['exposed_story']}" for r, s in zip(runs, stats, strict=True)
              if s.get("exposed_story")]
    if any(s.get("exposed_story") for s in stats):
        lines += ["", "Exposed time is the learner's wait in `next_batch`. Path work is "
                  "the batch's ack wait, sampling, gathering, transform and copy; 'other' "
                  "is waiting that neither path work nor the rate limiter explains: with "
                  "more ranks than cores, waiting for a core. Latencies, the exposed "
                  "share and its split leave out each learner's first min(5, supersteps "
                  "/ 10) supersteps (the warm-up: the wait for scheduler.min_fill_rows), "
                  "as summary.json's do; supersteps and rate-limiter waits count every "
                  "one. Past run.metrics_full_rows supersteps a learner file holds a "
                  "sample whose rows weigh the supersteps they stand for: figures past "
                  "them are estimates (summary.json's count every superstep).", ""]
    for r in runs:
        if r.summary:
            lines += [f"### summary.json of {r.label}", "", "| key | value |", "|---|---|"]
            lines += [f"| {k} | {_fmt(v) if not isinstance(v, dict | list) else jsontext.dumps(v)}"
                      " |" for k, v in r.summary.items()]
            lines.append("")
    plans = [(r, *load_plan(r.path)) for r in runs]
    if any(doc for _, doc, _ in plans):
        lines += ["## Plan: predicted against measured, per learner", ""]
        for r, doc, _ in plans:
            try:  # a hand-edited or foreign plan.json: its section is skipped, not the report
                lines += plan_markdown(r.label, doc, r.learners)
            except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as err:
                r.problems.append(f"plan.json: not in the form a run writes, its section is "
                                  f"skipped ({type(err).__name__}: "
                                  f"{' '.join(str(err).split())[:200]})")
    for r, _, problem in plans:
        if problem:
            r.problems.append(problem)
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
