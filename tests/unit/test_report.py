"""`report` on run directories whose metric files are written here in exactly the format
the scheduler and jobs write (learner-*.csv, actor-*.csv, episodes.csv, summary.json)."""

from __future__ import annotations

import csv
import json
import math
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
                            "timeline-dqn-service.png", "logged-dqn-edp.png",
                            "logged-dqn-sync.png", "logged-dqn-service.png"])
    for p in out.glob("*.png"):
        png_is_plot(p)
    text = md.read_text()
    for title in ("exposed latency, mean (ms)", "iteration latency, mean (ms)",
                  "ingest rate (rows/s, all actors", "env steps to mean return 475"):
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
    # four actors, 20 x 400 rows each, over the longest actor's span
    with open(tmp_path / "dqn-edp-0" / "metrics" / "actor-2.csv", newline="") as fh:
        span = float(list(csv.DictReader(fh))[-1]["time_s"])
    assert edp["rows_ingested"] == 4 * 20 * 400
    assert edp["ingest_rows_per_s"] == pytest.approx(4 * 20 * 400 / span)
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


def test_a_metrics_file_that_is_a_device_or_a_fifo_is_skipped_not_read_forever(tmp_path):
    """A run directory's metrics file linked to /dev/zero (or a FIFO nobody writes) held
    ``conduit-hpc report`` forever (reading endlessly, growing). It is named unreadable
    and the rest of the report is written."""
    import os

    run = make_run(tmp_path, "edp")
    actors = sorted((run / "metrics").glob("actor-*.csv"))
    actors[0].unlink()
    actors[0].symlink_to("/dev/zero")
    (run / "metrics" / "episodes.csv").unlink()
    os.mkfifo(run / "metrics" / "episodes.csv")
    text = write_report([run]).read_text()  # no wait for the FIFO's writer: a run has none
    assert f"{actors[0].name}: unreadable (metrics file" in text, text
    assert "episodes.csv: unreadable" in text
    assert text.count("is not a regular file (a FIFO, device or socket)") == 2, text


def test_report_of_a_directory_without_a_run_is_refused(tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a run")
    with pytest.raises(ConduitError, match=r"no run in .*empty.*learner-"):
        write_report([tmp_path / "empty"])
    assert not (tmp_path / "empty" / "report").exists()  # nothing written


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
    assert stats["final_mean_return"] == 500 and stats["env_steps_to_target"] == 100 * 39
    md = write_report([run])
    png_is_plot(md.parent / "returns.png")
    assert "scored episodes (near-greedy explorers)" in md.read_text()


def test_report_shows_the_executed_plan_predicted_against_measured(tmp_path) -> None:
    """A plan.json as the data plane writes it (static plan on the local cluster file):
    the report's Plan section has the learner's predicted and measured path time."""
    from conduit_hpc.placement.cluster import ClusterModel, Roster
    from conduit_hpc.placement.static import plan_static
    from conduit_hpc.placement.workload import Workload
    from conduit_hpc.plane.planning import PlanRecord, plan_document
    from conduit_hpc.tools.report.plan_check import plan_vs_measured

    cluster = ClusterModel.from_toml(Path(__file__).parents[2] / "jobs/cluster-local.toml")
    plan = plan_static(cluster, Workload(capacity_rows=10_000, row_bytes=100,
                                         tiers=("learner_host", "buffer_host")),
                       roster=Roster.block(cluster))
    run = make_run(tmp_path, "edp")
    (run / "plan.json").write_text(json.dumps(plan_document(plan, PlanRecord("static", "x"))))
    loaded = load_run(run)
    (row,) = plan_vs_measured(json.loads((run / "plan.json").read_text()), loaded.learners)
    assert row["rank"] == 0 and row["shards"] == len(plan.shards)
    assert row["predicted_path_ms"] == pytest.approx(1e3 * plan.prediction.learners[0].path_s)
    t = loaded.learners[0]
    assert row["measured_path_ms"] == pytest.approx(1e3 * float(np.mean(t["sample_s"]
                                                                         + t["gather_s"])))
    md = write_report([run]).read_text()
    assert "## Plan: predicted against measured, per learner" in md
    assert f"{row['predicted_path_ms']:.4g}" in md and f"{row['measured_path_ms']:.4g}" in md


def test_summary_and_report_give_the_same_headline_figures(tmp_path) -> None:
    from conduit_hpc.plane.headline import headline_figures
    from conduit_hpc.plane.metrics import write_summary

    run = make_run(tmp_path, "edp")
    (run / "config.toml").write_text('[run]\nname = "dqn"\n\n[dqn]\ntarget_return = 450.0'
                                     '\nwindow = 10\n')
    # what jobs/dqn_cartpole.py does at the end of a run ...
    flat = headline_figures(run / "metrics", target_return=450.0, window=10)
    write_summary(run / "metrics" / "summary.json", flat)
    # ... and what report prints from the same directory
    stats = run_stats(load_run(run))
    summary = json.loads((run / "metrics" / "summary.json").read_text())
    for key in ("ingest_rows_per_s", "actor_limiter_wait_s", "rows_ingested",
                "env_steps_to_target"):
        assert summary[key] is not None and stats[key] == pytest.approx(summary[key]), key
    text = write_report([run]).read_text()
    assert "env steps to mean return 450" in text and "last 10 (scored)" in text


def test_steps_to_target_counts_only_scored_episodes_in_order() -> None:
    from conduit_hpc.plane.headline import steps_to_target

    steps = [10, 20, 30, 40, 50]
    rets = [500, 0, 500, 500, 100]
    assert steps_to_target(steps, rets, None, window=2, target_return=475) == 40
    assert steps_to_target(steps, rets, [True, False, True, True, True], window=2,
                           target_return=475) == 30  # the 0 of an explorer is not scored
    assert steps_to_target(steps, rets, None, window=5, target_return=475) is None
    with pytest.raises(ValueError, match="window must be >= 1"):
        steps_to_target(steps, rets, None, window=0, target_return=1)


def test_ingest_panel_says_what_share_of_actor_time_went_to_waiting(tmp_path) -> None:
    from conduit_hpc.plane.headline import headline_figures, waited_fraction

    run = make_run(tmp_path, "edp")
    fig = headline_figures(run / "metrics")
    assert fig["actor_limiter_wait_s"] == pytest.approx(4 * 20 * 0.002)
    text = waited_fraction(fig)
    share = 100 * fig["actor_limiter_wait_s"] / fig["actor_seconds"]
    assert text.startswith("actors waited 0 of ") and text.endswith(f"({share:.0f}%)")


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
    # the exposed split is over every learner too, as the exposed share it breaks down
    # (it was the lowest rank's alone: 'exposed share of wall time' and the story's
    # 'exposed ... of wall time' of one report differed 3x in a 2-learner synthetic run)
    after = 300 - 5  # the warm-up
    assert one["exposed_total_s"] == pytest.approx(one["exposed_mean_ms"] / 1e3 * after)
    assert two["exposed_total_s"] == pytest.approx(2 * one["exposed_total_s"] + 0.010 * after)
    assert (two["exposed_path_s"] + two["exposed_limiter_s"] + two["exposed_other_s"]
            == pytest.approx(two["exposed_total_s"]))
    assert two["path_work_s"] == pytest.approx(2 * one["path_work_s"])
    assert two["exposed_story"].startswith(f"exposed {two['exposed_share']:.3g} of wall time")


@pytest.mark.parametrize("twice", ["same", "trailing-slash"])
def test_report_of_one_run_given_twice_names_it(tmp_path, twice: str, capsys) -> None:
    """Before: a ValueError traceback (the run compared with itself, arrays and all)."""
    from conduit_hpc.tools import cli

    run = make_run(tmp_path, "edp")
    again = str(run) if twice == "same" else f"{run}/"
    out = tmp_path / "rep"
    assert cli.main(["report", str(run), again, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"conduit-hpc: error: ConduitError: RUN_DIR {again!r} is given "
                          f"twice") and err.count("\n") == 1, err
    assert not out.exists()


def test_report_of_two_runs_with_the_same_data_draws_both(tmp_path) -> None:
    a = make_run(tmp_path, "edp")
    b = tmp_path / "copy"
    import shutil

    shutil.copytree(a, b)
    md = write_report([a, b], tmp_path / "rep")
    assert md.is_file() and (tmp_path / "rep" / "latency.png").is_file()


def test_report_out_that_is_a_file_is_refused_in_one_line(tmp_path, capsys) -> None:
    """Before: a FileExistsError traceback."""
    from conduit_hpc.tools import cli

    run = make_run(tmp_path, "edp")
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    assert cli.main(["report", str(run), "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err == (f"conduit-hpc: error: ConduitError: --out must be a folder (created if "
                   f"missing), got {str(afile)!r}: an existing file that is not a folder\n")
    assert afile.read_text() == "keep me\n" and not (run / "report").exists()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "1e308", "-1e308", "", "x"])
@pytest.mark.parametrize("rows", ["first", "all"])
def test_a_report_of_files_with_out_of_range_cells_is_written(tmp_path, value, rows) -> None:
    """Cells no run writes (a damaged or hand-edited file), in every numeric column of
    every metrics file: ``inf`` ended `report` in an OverflowError traceback (a superstep
    number, a sum of returns), ``1e308`` in matplotlib's ValueError laying out an axis,
    an empty column in ``int(NaN)``. Non-finite cells now count as missing; a plot that
    cannot be laid out is skipped with a note; the rest of the report is written."""
    from conduit_hpc.plane.headline import headline_figures

    run = make_run(tmp_path, "edp", supersteps=60)
    for path in sorted((run / "metrics").glob("*.csv")):
        table = list(csv.reader(path.open()))
        for i in ([1] if rows == "first" else range(1, len(table))):
            table[i] = [c if name == "mode" else value for name, c in zip(table[0], table[i],
                                                                          strict=True)]
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerows(table)
    md = write_report([run], None)
    text = md.read_text()
    assert "## Summary" in text and "## Plots" in text
    figures = headline_figures(run / "metrics", target_return=400.0)
    numbers = [v for v in figures.values() if isinstance(v, int | float)]
    assert all(math.isfinite(v) for v in numbers), figures


@pytest.mark.parametrize("where, value", [
    (("prediction",), True), (("prediction", "learners"), "x"),
    (("prediction", "learners", "0"), [1, 2]), (("tiers",), [1, 2]),
    (("tiers", "learner_host"), None), (("placement", "learner_shards", 0, "shards"), -1),
    (("placement", "learner_shards", 0, "learners", 0), {"a": 1})])
def test_a_plan_json_not_in_the_form_a_run_writes_skips_its_section(tmp_path, where,
                                                                     value) -> None:
    """A plan.json whose values have other types than the data plane writes (hand-edited,
    another version) ended `report` in an AttributeError/TypeError/ValueError traceback;
    the Plan section is now skipped with a note naming the error, the rest written."""
    from conduit_hpc.placement.cluster import ClusterModel, Roster
    from conduit_hpc.placement.static import plan_static
    from conduit_hpc.placement.workload import Workload
    from conduit_hpc.plane.planning import PlanRecord, plan_document

    cluster = ClusterModel.from_toml(Path(__file__).parents[2] / "jobs/cluster-local.toml")
    plan = plan_static(cluster, Workload(capacity_rows=10_000, row_bytes=100,
                                         tiers=("learner_host", "buffer_host")),
                       roster=Roster.block(cluster))
    doc = json.loads(json.dumps(plan_document(plan, PlanRecord("static", "x"))))
    at = doc
    for key in where[:-1]:
        at = at[key]
    at[where[-1]] = value
    run = make_run(tmp_path, "edp", supersteps=30)
    (run / "plan.json").write_text(json.dumps(doc))
    md = write_report([run]).read_text()
    assert "## Summary" in md and "## Plots" in md
    assert "plan.json: not in the form a run writes, its section is skipped (" in md


def test_report_latencies_are_summary_jsons_after_the_warm_up(tmp_path) -> None:
    """The report's exposed latency pooled every superstep, the first one's wait for
    scheduler.min_fill_rows included, while summary.json (LatencyRecord) skips the
    warm-up: a synthetic run read 'exposed latency, mean 0.338 ms, share 0.172' beside
    summary.json's 0.040 ms (exposed 0.0044 of wall time). Both now leave it out."""
    from conduit_hpc.plane.metrics import LatencyRecord

    run = make_run(tmp_path, "edp")
    path = run / "metrics" / "learner-0.csv"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    rows[0]["exposed_s"] = rows[0]["iteration_s"] = "0.3"  # the fill
    rows[0]["limiter_wait_s"] = "0.29"
    write_rows(path, list(rows[0]), rows)
    record = LatencyRecord()
    for r in rows:
        record.add({k: float(v) for k, v in r.items() if k != "mode"})
    want = record.summary()
    stats = run_stats(load_run(run))
    assert stats["supersteps"] == 300
    assert stats["exposed_mean_ms"] == pytest.approx(1e3 * want["exposed_mean_s"])
    assert stats["iteration_mean_ms"] == pytest.approx(1e3 * want["iteration_mean_s"])
    for key in ("exposed_total_s", "exposed_path_s", "exposed_limiter_s", "exposed_other_s",
                "path_work_s", "path_work_hidden"):
        assert stats[key] == pytest.approx(want[key]), key
    assert stats["exposed_share"] == pytest.approx(
        want["exposed_total_s"] / (want["iteration_mean_s"] * want["measured"]))
    # every wait is still counted
    assert stats["learner_limiter_wait_s"] == pytest.approx(0.29 + 29 * 0.0005)


@pytest.mark.parametrize(("content", "ended", "problem"), [
    ('{"exit_status": 0, "ok": true, "why": ""}', "ok", None),
    ('{"exit_status": 124, "ok": false, "why": "job ran past its 60 s budget"}',
     "failed (exit 124)", "the job failed (exit 124): job ran past its 60 s budget"),
    ('{"exit_status": 1, "ok": false}', "failed (exit 1)", "no reason recorded"),
    ('{"exit_status": "1"}', "", "exit.json: unreadable"),
    ('{"exit_status": true}', "", "exit.json: unreadable"),
    ('{"exit_status": 1, "why": ["a"]}', "", "exit.json: unreadable"),
    ("[1]", "", "exit.json: unreadable"),
    ("{", "", "exit.json: unreadable"),
    (None, "not recorded", "still running, or its launcher was killed"),
])
def test_report_says_how_the_job_ended(tmp_path, content, ended, problem) -> None:
    """The launcher records the job's exit status in ``exit.json``; a failed run's
    directory held nothing that said it failed, and its report read as a short
    success. A record in another form is a problem of the report, not its end."""
    run = make_run(tmp_path, "sync")
    (run / "command.txt").write_text("mpirun -n 3 ...\n")
    if content is not None:
        (run / "exit.json").write_text(content)
    data = load_run(run)
    assert data.ended == ended
    assert run_stats(data).get("ended", "") == ended
    if problem is None:
        assert not data.problems
    else:
        assert any(problem in p for p in data.problems), data.problems
    if content is None or '"ok": true' in content or "budget" in content:  # (plots: ~1 s)
        md = write_report([run]).read_text()
        assert (f"| {ended} |" in md) and (problem is None or problem in md), md


def test_a_run_directory_not_made_by_the_launcher_has_no_end_to_report(tmp_path) -> None:
    data = load_run(make_run(tmp_path, "sync"))  # no command.txt: a job started by hand
    assert data.ended == "" and "ended" not in run_stats(data) and not data.problems
