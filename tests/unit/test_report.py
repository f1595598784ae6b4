"""`report` on run directories whose metric files are written here in exactly the format
the scheduler and jobs write (learner-*.csv, actor-*.csv, episodes.csv, summary.json)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from conduit_hpc.errors import ConduitError
from conduit_hpc.tools.report.run import load_run, run_stats, write_report

LEARNER = ["superstep", "time_s", "mode", "iteration_s", "exposed_s", "compute_s", "sample_s",
           "gather_s", "transform_s", "copy_s", "rows", "staleness", "limiter_wait_s"]
ACTOR = ["time_s", "rows", "rows_per_s", "limiter_wait_s", "policy_version"]
EPISODES = ["time_s", "env_steps", "actor", "episode_return"]


def write_rows(path: Path, header: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        w.writerows(rows)


def make_run(root: Path, mode: str, *, supersteps: int = 300, seed: int = 0,
             drop: tuple[str, ...] = (), extra_learner: tuple[str, ...] = ("loss",)) -> Path:
    """A run directory as `conduit-hpc run` leaves it (config.toml, metrics/)."""
    rng = np.random.default_rng(seed)
    run = root / f"dqn-{mode}-{seed}"
    metrics = run / "metrics"
    metrics.mkdir(parents=True)
    (run / "config.toml").write_text(f'[run]\nname = "dqn"\n\n[scheduler]\nmode = "{mode}"\n')
    compute = 0.004 + 0.001 * rng.random(supersteps)
    path_parts = {c: 0.0005 + 0.0005 * rng.random(supersteps)
                  for c in ("sample_s", "gather_s", "transform_s", "copy_s")}
    work = sum(path_parts.values())
    exposed = {"sync": work, "service": work + 0.002, "edp": np.maximum(0, work - compute)
               + 0.0001}[mode]
    iteration = compute + exposed + 0.0002
    t = np.cumsum(iteration)
    rows = [{"superstep": s, "time_s": f"{t[s]:.6f}", "mode": mode,
             "iteration_s": iteration[s], "exposed_s": exposed[s], "compute_s": compute[s],
             **{c: v[s] for c, v in path_parts.items()}, "rows": 64, "staleness": 1,
             "limiter_wait_s": 0.0005 if s % 10 == 0 else 0.0, "loss": 1.0 / (s + 1)}
            for s in range(supersteps)]
    header = [c for c in LEARNER if c not in drop] + list(extra_learner)
    write_rows(metrics / "learner-0.csv", header,
               [{k: v for k, v in r.items() if k in header} for r in rows])
    for a in range(2, 6):
        times = np.linspace(0.1, t[-1], 20)
        write_rows(metrics / f"actor-{a}.csv", ACTOR,
                   # running totals, as ExperienceDataPlane writes them
                   [{"time_s": f"{x:.4f}", "rows": 400 * (i + 1), "rows_per_s": 4000 + 100 * a,
                     "limiter_wait_s": 0.002 * (i + 1), "policy_version": i}
                    for i, x in enumerate(times)])
    returns = np.clip(np.r_[np.linspace(10, 500, 80), np.full(40, 500.0)]
                      + rng.normal(0, 20, 120), 8, 500)
    write_rows(metrics / "episodes.csv", EPISODES,
               [{"time_s": f"{i * t[-1] / 120:.3f}", "env_steps": 200 * (i + 1),
                 "actor": 2 + i % 4, "episode_return": f"{r:.0f}"}
                for i, r in enumerate(returns)])
    (metrics / "summary.json").write_text(json.dumps(
        {"mode": mode, "supersteps": supersteps, "exposed_mean_s": float(exposed.mean()),
         "reached": True}))
    return run


def png_is_plot(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.exists() and path.stat().st_size > 10_000, path
    img = mpimg.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 300
    # a real plot: many distinct colours, not a blank canvas
    flat = (img[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    assert len(np.unique(flat, axis=0)) > 50, path
    assert (flat.mean(axis=1) < 200).mean() > 0.01, path  # some ink on the page


def test_report_of_three_modes_draws_every_plot_and_summarises(tmp_path) -> None:
    runs = [make_run(tmp_path, m, seed=i) for i, m in enumerate(("edp", "sync", "service"))]
    md = write_report(runs, tmp_path / "out")
    out = md.parent
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == sorted(["returns.png", "latency.png", "ingest.png",
                            "timeline-dqn-edp.png", "timeline-dqn-sync.png",
                            "timeline-dqn-service.png"])
    for p in out.glob("*.png"):
        png_is_plot(p)
    text = md.read_text()
    for title in ("exposed latency, mean (ms)", "iteration latency, mean (ms)",
                  "ingest rate (rows/s, all actors)", "env steps to mean return 475"):
        assert title in text
    assert "dqn [edp]" in text and "dqn [sync]" in text and "dqn [service]" in text
    for png in names:
        assert f"]({png})" in text
    assert "Skipped" not in text


def test_stats_follow_the_numbers_in_the_files(tmp_path) -> None:
    edp = run_stats(load_run(make_run(tmp_path, "edp")))
    sync = run_stats(load_run(make_run(tmp_path, "sync", seed=1)))
    assert edp["supersteps"] == sync["supersteps"] == 300
    assert edp["exposed_mean_ms"] < 0.5 * sync["exposed_mean_ms"]
    assert edp["path_work_hidden"] > 0.8 and sync["path_work_hidden"] == pytest.approx(0, abs=1e-9)
    # four actors at 4200..4500 rows/s
    assert edp["ingest_rows_per_s"] == pytest.approx(4200 + 4300 + 4400 + 4500, rel=0.01)
    assert edp["learner_limiter_wait_s"] == pytest.approx(30 * 0.0005)
    # the actors' running totals: 20 rows of 0.002 s each, four actors
    assert edp["actor_limiter_wait_s"] == pytest.approx(4 * 20 * 0.002)
    assert edp["episodes"] == 120


def test_missing_files_and_columns_skip_plots_with_reasons(tmp_path) -> None:
    run = make_run(tmp_path, "edp", drop=("exposed_s", "sample_s", "gather_s",
                                          "transform_s", "copy_s"))
    (run / "metrics" / "episodes.csv").unlink()
    for f in (run / "metrics").glob("actor-*.csv"):
        f.unlink()
    (run / "metrics" / "summary.json").write_text("{not json")
    md = write_report([run])
    assert md.parent == run / "report"
    text = md.read_text()
    assert "return curve skipped" in text and "no episodes.csv" in text
    assert "timeline of dqn [edp] skipped (learner CSV lacks exposed_s)" in text
    assert "latency bars skipped" in text
    assert "summary.json: unreadable" in text
    # the learner's limiter waits still make the ingest plot
    assert (md.parent / "ingest.png").exists()
    assert not (md.parent / "returns.png").exists()


def test_report_of_an_empty_run_dir_says_why_everything_is_missing(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    md = write_report([tmp_path / "empty"])
    text = md.read_text()
    assert "return curve skipped" in text and "latency bars skipped" in text
    assert "ingest plot skipped" in text and not list(md.parent.glob("*.png"))


def test_report_refuses_a_missing_directory(tmp_path) -> None:
    with pytest.raises(ConduitError, match="does not exist"):
        write_report([tmp_path / "nope"])


def test_return_curve_and_stats_use_only_scored_episodes(tmp_path) -> None:
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    rows = []
    for i in range(60):  # near-greedy slots reach 500; the explorer stays at 100
        rows.append({"time_s": i, "env_steps": 100 * i, "actor": 2,
                     "episode_return": 500 if i % 2 else 100, "epsilon": 0.001 if i % 2
                     else 0.4, "scored": i % 2})
    write_rows(run / "metrics" / "episodes.csv", [*EPISODES, "epsilon", "scored"], rows)
    stats = run_stats(load_run(run))
    assert stats["episodes"] == 60 and stats["scored_episodes"] == 30
    assert stats["final_mean_return_20"] == 500 and stats["env_steps_to_475"] == 100 * 39
    md = write_report([run])
    png_is_plot(md.parent / "returns.png")
    assert "scored episodes (near-greedy explorers)" in md.read_text()


def test_stats_cover_every_learner_of_a_data_parallel_run(tmp_path) -> None:
    run = make_run(tmp_path, "edp")
    with open(run / "metrics" / "learner-0.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    one = run_stats(load_run(run))
    # a second learner whose every superstep waited 10 ms more
    for r in rows:
        r["exposed_s"] = str(float(r["exposed_s"]) + 0.010)
    write_rows(run / "metrics" / "learner-1.csv", list(rows[0]), rows)
    two = run_stats(load_run(run))
    assert (one["learners"], two["learners"]) == (1, 2)
    assert two["supersteps"] == one["supersteps"] == 300
    assert two["exposed_mean_ms"] == pytest.approx(one["exposed_mean_ms"] + 5.0, rel=1e-6)
    assert "learner ranks" in write_report([run]).read_text()
