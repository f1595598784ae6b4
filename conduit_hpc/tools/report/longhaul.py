"""The two long-haul placements side by side: plots and a markdown table.

    python -m conduit_hpc.tools.report.longhaul RUN_DIR [RUN_DIR ...] [--out DIR]

Reads each run's ``metrics/learner-0.csv`` (the data plane's columns plus the link's -
see :data:`~conduit_hpc.features.longhaul.metrics.LINK_COLUMNS` - and the job's ``loss``),
``metrics/summary.json``, ``metrics/episodes.csv`` (when the workload has episodes) and
``config.toml``, groups runs by ``longhaul.mode`` (and link budget), and writes

* ``longhaul.png`` (``longhaul-<kB/s>kBps.png`` per link budget when there are several) -
  TD loss, average priority of transferred experiences, bytes per second crossing the
  link each way (against the bandwidth), and return, per superstep (time for return),
  one colour per mode, one line per run;
* ``longhaul.md`` - a row per run and the ``edge_replay / forward`` ratios of the
  average transferred priority and of the settled TD loss, per link budget.

Plain numpy, csv and matplotlib (Agg); no MPI. The generic ``conduit-hpc report`` can
call :func:`write_longhaul_report` for runs whose ``config.toml`` has a ``[longhaul]``
section with ``mode != "off"`` (see :func:`is_longhaul_run`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc.config import read_toml
from conduit_hpc.errors import ConduitError
from conduit_hpc.features.longhaul.metrics import settled_mean, windowed_mean_priority
from conduit_hpc.plane.headline import read_metrics_text
from conduit_hpc.plane.sampled_rows import WEIGHT, weights
from conduit_hpc.tools.report.run_data import read_csv

__all__ = ["LongHaulRun", "is_longhaul_run", "load_longhaul_run", "ratios",
           "write_longhaul_report"]

COLORS = {"forward": "tab:red", "edge_replay": "tab:green"}
#: ``summary.json`` figures the report reads as numbers
SUMMARY_NUMBERS = ("final_mean_return", "wall_s", "exposed_median_s", "link_e2c_util")


@dataclass
class LongHaulRun:
    """One run's numbers.

    Attributes:
        path (Path): the run directory.
        mode (str): ``forward`` or ``edge_replay``.
        bandwidth_bytes_s (float): the link's bandwidth per direction.
        seed (int): ``run.seed``.
        learner (dict[str, np.ndarray]): ``learner-0.csv`` columns (numeric ones).
        episodes (dict[str, np.ndarray]): ``episodes.csv`` columns (may be empty).
        summary (dict[str, Any]): ``summary.json``.
    """

    path: Path
    mode: str
    bandwidth_bytes_s: float
    seed: int
    learner: dict[str, np.ndarray]
    episodes: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.mode} {self.bandwidth_bytes_s / 1e3:g} kB/s seed {self.seed}"

    def column(self, name: str) -> np.ndarray:
        return self.learner.get(name, np.full(len(self.learner.get("superstep", [])), np.nan))

    @property
    def weight(self) -> np.ndarray:
        """Supersteps each learner row stands for (``weight``; 1 in older files)."""
        return weights(self.learner.get(WEIGHT), len(self.learner.get("superstep", [])))

    @property
    def loss_settled(self) -> float:
        return settled_mean(self.column("loss"), weight=self.weight)

    @property
    def priority_mean(self) -> float:
        """Average priority of every row that crossed during the run."""
        rows, psum = self.column("xfer_rows"), self.column("xfer_priority_sum")
        n = float(np.nansum(rows * self.weight))
        return float(np.nansum(psum * self.weight)) / n if n > 0 else math.nan

    @property
    def final_return(self) -> float:
        r = self.summary.get("final_mean_return")
        return float(r) if r is not None else math.nan


def _read_csv(path: Path) -> dict[str, np.ndarray]:
    """The numeric columns of a metrics CSV (empty where absent), read as every report
    reads them (:func:`~conduit_hpc.tools.report.run_data.read_csv`); a text column
    (mode) is left out.

    Raises:
        ConduitError: the file cannot be read as text (naming it).
    """
    if not path.exists():
        return {}
    try:
        table = read_csv(path)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ConduitError(f"{path} is unreadable ({err}); expected the CSV a run "
                           f"writes") from err
    return {k: v for k, v in table.items() if v.dtype == np.float64}


def _config(run_dir: Path) -> dict[str, Any]:
    p = run_dir / "config.toml"
    return read_toml(p, what="run config") if p.exists() else {}


def is_longhaul_run(run_dir: str | Path) -> bool:
    """Whether a run directory holds a long-haul run (``[longhaul] mode`` not off).

    Raises:
        ConfigError: its ``config.toml`` is not TOML (naming it).
    """
    section = _config(Path(run_dir)).get("longhaul", {})
    return isinstance(section, dict) and section.get("mode", "off") in ("forward",
                                                                        "edge_replay")


def load_longhaul_run(run_dir: str | Path) -> LongHaulRun:
    """Read one run.

    Raises:
        FileNotFoundError: no ``metrics/learner-0.csv`` in the run.
        ConduitError: a file of the run that cannot be read as a run writes it (naming
            the file and what was wrong with it).
    """
    path = Path(run_dir)
    metrics = path / "metrics"
    learner = metrics / "learner-0.csv"
    if not learner.is_file():
        raise FileNotFoundError(f"{learner} does not exist: not a finished run directory")
    cfg = _config(path)
    lh, run = _table(cfg, "longhaul", path), _table(cfg, "run", path)
    summary_path = metrics / "summary.json"
    summary: Any = {}
    if summary_path.exists():
        try:
            summary = json.loads(read_metrics_text(summary_path))
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise ConduitError(f"{summary_path} is unreadable ({err}); expected the JSON "
                               f"object a run writes") from err
        if not isinstance(summary, dict):
            raise ConduitError(f"{summary_path} holds a {type(summary).__name__}; expected "
                               f"the JSON object a run writes")
        for key in SUMMARY_NUMBERS:  # the figures the table reads as numbers
            value = summary.get(key)
            if value is not None and (isinstance(value, bool) or
                                      not isinstance(value, int | float)):
                raise ConduitError(f"{summary_path}: {key} = {value!r:.40}; expected a "
                                   f"number (or null) as a run writes it")
    try:
        bandwidth = float(lh.get("bandwidth_gbps", 0.0)) * 1e9
        seed = int(run.get("seed", 0))
    except (TypeError, ValueError, OverflowError) as err:
        raise ConduitError(f"{path / 'config.toml'}: longhaul.bandwidth_gbps = "
                           f"{lh.get('bandwidth_gbps')!r}, run.seed = {run.get('seed')!r}; "
                           f"expected numbers (a run's own config)") from err
    return LongHaulRun(path=path, mode=str(summary.get("mode", lh.get("mode", "off"))),
                       bandwidth_bytes_s=bandwidth, seed=seed, learner=_read_csv(learner),
                       episodes=_read_csv(metrics / "episodes.csv"), summary=summary)


def _table(cfg: dict[str, Any], name: str, run_dir: Path) -> dict[str, Any]:
    """Section ``name`` of a run's config (empty where absent)."""
    section = cfg.get(name, {})
    if not isinstance(section, dict):
        raise ConduitError(f"{run_dir / 'config.toml'}: {name} = {section!r:.40} is not a "
                           f"table; expected a [{name}] section (a run's own config)")
    return section


def ratios(runs: Sequence[LongHaulRun]) -> list[dict[str, Any]]:
    """Per link budget: means over seeds of each mode, and ``edge_replay / forward`` for
    the average transferred priority and the settled TD loss (and both returns)."""
    out = []
    for bw in sorted({r.bandwidth_bytes_s for r in runs}):
        by = {m: [r for r in runs if r.bandwidth_bytes_s == bw and r.mode == m]
              for m in ("forward", "edge_replay")}
        if not all(by.values()):
            continue

        def mean(rs: list[LongHaulRun], attr: str) -> float:
            vals = [getattr(r, attr) for r in rs]
            vals = [v for v in vals if math.isfinite(v)]
            return float(np.mean(vals)) if vals else math.nan

        f, e = by["forward"], by["edge_replay"]
        row: dict[str, Any] = {"bandwidth_bytes_s": bw, "seeds": len(e)}
        for attr in ("priority_mean", "loss_settled", "final_return"):
            row[f"forward_{attr}"] = mean(f, attr)
            row[f"edge_replay_{attr}"] = mean(e, attr)
        for attr in ("priority_mean", "loss_settled"):
            fv = row[f"forward_{attr}"]
            row[f"{attr}_ratio"] = row[f"edge_replay_{attr}"] / fv if fv else math.nan
        out.append(row)
    return out


def _rolling(x: np.ndarray, window: int) -> np.ndarray:
    if len(x) == 0:
        return x
    v = np.nan_to_num(x.astype(float))
    ok = np.isfinite(x).astype(float)
    c, n = np.cumsum(np.r_[0, v]), np.cumsum(np.r_[0, ok])
    hi = np.arange(1, len(v) + 1)
    lo = np.maximum(hi - window, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (c[hi] - c[lo]) / (n[hi] - n[lo])


def plot(runs: Sequence[LongHaulRun], out: Path, window: int = 50,
         name: str = "longhaul.png") -> Path:
    """``name`` in ``out``: loss, transferred priority, link bytes/s, return."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    (a_loss, a_prio), (a_link, a_ret) = axes
    seen: set[str] = set()
    for r in runs:
        color = COLORS.get(r.mode, "tab:gray")
        label = r.mode if r.mode not in seen else None
        seen.add(r.mode)
        step = r.column("superstep")
        a_loss.plot(step, _rolling(r.column("loss"), window), color=color, lw=1, label=label)
        prio = windowed_mean_priority(r.column("xfer_rows") * r.weight,
                                      r.column("xfer_priority_sum") * r.weight, window)
        a_prio.plot(step, prio, color=color, lw=1, label=label)
        it = _rolling(r.column("iteration_s"), window)
        a_link.plot(step, _rolling(r.column("link_e2c_bytes"), window) / it / 1e3,
                    color=color, lw=1, label=f"{r.mode} edge->dc" if label else None)
        a_link.plot(step, _rolling(r.column("link_c2e_bytes"), window) / it / 1e3,
                    color=color, lw=1, ls="--",
                    label=f"{r.mode} dc->edge" if label else None)
        ep = r.episodes
        if ep.get("episode_return") is not None and len(ep["episode_return"]):
            order = np.argsort(ep["time_s"])
            a_ret.plot(ep["time_s"][order], _rolling(ep["episode_return"][order], 20),
                       color=color, lw=1, label=label)
    for bw in sorted({r.bandwidth_bytes_s for r in runs}):
        a_link.axhline(bw / 1e3, color="k", lw=0.8, ls=":")
    a_loss.set(title=f"TD loss (rolling mean of {window} supersteps)", xlabel="superstep",
               yscale="log")
    a_prio.set(title=f"average priority of transferred experiences ({window} supersteps)",
               xlabel="superstep")
    a_link.set(title="link throughput (dotted: bandwidth per direction)",
               xlabel="superstep", ylabel="kB/s")
    a_ret.set(title="episode return (rolling mean of 20 episodes)", xlabel="time (s)")
    if not any(len(r.episodes.get("episode_return", [])) for r in runs):
        a_ret.text(0.5, 0.5, "no episodes in these runs\n(regression workload)",
                   ha="center", va="center", transform=a_ret.transAxes)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if not math.isfinite(v) else f"{v:.4g}"
    return str(v)


def _number(summary: dict[str, Any], key: str) -> float:
    """A figure of ``summary.json``: NaN where absent or null (a run writes a non-finite
    figure as null: :mod:`conduit_hpc.jsontext`)."""
    value = summary.get(key)
    return math.nan if value is None else float(value)


def markdown(runs: Sequence[LongHaulRun]) -> str:
    """A table of the runs and one of the ratios (see :func:`ratios`)."""
    lines = ["| run | mode | kB/s | seed | updates | wall s | exposed median ms | "
             "e2c util | rows crossed | dropped | avg transferred priority | "
             "settled TD loss | final return |",
             "|" + "---|" * 13]
    for r in runs:
        s = r.summary
        lines.append("| " + " | ".join(_fmt(x) for x in (
            r.path.name, r.mode, r.bandwidth_bytes_s / 1e3, r.seed, s.get("updates", "-"),
            _number(s, "wall_s"), _number(s, "exposed_median_s") * 1e3,
            _number(s, "link_e2c_util"), s.get("link_rows_crossed", "-"),
            s.get("link_rows_dropped", "-"), r.priority_mean, r.loss_settled,
            r.final_return)) + " |")
    lines += ["", "| link kB/s | seeds | avg transferred priority: edge_replay / forward | "
              "settled TD loss: edge_replay / forward | return forward | "
              "return edge_replay |", "|---|---|---|---|---|---|"]
    for t in ratios(runs):
        lines.append("| " + " | ".join(_fmt(x) for x in (
            t["bandwidth_bytes_s"] / 1e3, t["seeds"], t["priority_mean_ratio"],
            t["loss_settled_ratio"], t["forward_final_return"],
            t["edge_replay_final_return"])) + " |")
    return "\n".join(lines) + "\n"


def write_longhaul_report(run_dirs: Sequence[str | Path], out_dir: str | Path) -> Path:
    """Plots and ``longhaul.md`` for the given runs in ``out_dir``; returns the markdown
    file. Local; reads files only."""
    runs = [load_longhaul_run(d) for d in run_dirs]
    out = Path(out_dir)
    budgets = sorted({r.bandwidth_bytes_s for r in runs})
    figures = []
    for bw in budgets:  # one figure per link budget (all of them if there is one)
        name = "longhaul.png" if len(budgets) == 1 else f"longhaul-{bw / 1e3:g}kBps.png"
        png = plot([r for r in runs if r.bandwidth_bytes_s == bw], out, name=name)
        figures.append(f"Link {bw / 1e3:g} kB/s per direction:\n\n![]({png.name})\n")
    md = out / "longhaul.md"
    md.write_text("# Long-haul placements side by side\n\n" + "\n".join(figures) + "\n"
                  + markdown(runs))
    return md


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conduit_hpc.tools.report.longhaul",
                                description="compare long-haul runs")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", default="", help="output folder (default: beside the first run)")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else Path(args.run_dirs[0]).parent / "longhaul-report"
    try:
        md = write_longhaul_report(args.run_dirs, out)
    except (ConduitError, OSError) as err:  # a run directory's files, or the output's
        print(f"longhaul report: error: {err}", file=sys.stderr)
        return 2
    print(md.read_text())
    print(f"report: {md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
