"""A resumed attempt's per-superstep metrics files in its run directory: kept and
continued, not overwritten; a fresh run in the same directory sets the earlier run's
aside."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from conduit_hpc.plane.headline import headline_figures
from conduit_hpc.plane.metrics import ACTOR_CARRY, ACTOR_COLUMNS, CsvSink
from conduit_hpc.tools.report.run_data import load_run, run_stats
from conduit_hpc.tools.rundir import lock_run_dir


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _actor_attempt(path: Path, rows: list[tuple[float, int, float]]) -> None:
    """An actor's sink as one attempt writes it: (time_s, rows, limiter_wait_s), its
    running totals from 0."""
    sink = CsvSink(path, ACTOR_COLUMNS, keep=False, carry=ACTOR_CARRY)
    for t, n, w in rows:
        sink.add({"time_s": t, "rows": n, "rows_per_s": 1.0, "limiter_wait_s": w,
                  "ring_wait_s": 0.0, "policy_version": 0})
        sink.flush()
    sink.close()


def _attempt(metrics: Path, rows: dict[int, list[tuple[float, int, float]]]) -> None:
    """One attempt of several actors, each writing ``rows[rank]`` as
    :func:`_actor_attempt` does; their sinks are made before any writes (as the ranks
    of one attempt make theirs at its start)."""
    sinks = {r: CsvSink(metrics / f"actor-{r}.csv", ACTOR_COLUMNS, keep=False,
                        carry=ACTOR_CARRY) for r in rows}
    for r, sink in sinks.items():
        for t, n, w in rows[r]:
            sink.add({"time_s": t, "rows": n, "rows_per_s": 1.0, "limiter_wait_s": w,
                      "ring_wait_s": 0.0, "policy_version": 0})
            sink.flush()
        sink.close()


def test_a_resumed_actor_appends_and_its_totals_go_on(tmp_path) -> None:
    """A resumed attempt opened its actor CSV with "w": the killed attempt's rows were
    lost, and the run's rows_ingested and ingest rate (the last row's running total
    over its time) said the last attempt's alone."""
    p = tmp_path / "actor-2.csv"
    _actor_attempt(p, [(1.0, 100, 0.5), (2.0, 300, 1.0)])
    _actor_attempt(p, [(1.0, 50, 0.25)])  # resumed: its totals and clock from 0 again
    rows = _rows(p)
    assert [float(r["time_s"]) for r in rows] == [1.0, 2.0, 3.0]
    assert [int(float(r["rows"])) for r in rows] == [100, 300, 350]
    assert float(rows[-1]["limiter_wait_s"]) == 1.25
    fig = headline_figures(tmp_path)
    assert fig["rows_ingested"] == 350 and fig["ingest_span_s"] == 3.0


def test_a_torn_last_row_is_cut_and_another_header_is_set_aside(tmp_path) -> None:
    p = tmp_path / "learner-0.csv"
    sink = CsvSink(p, ["superstep", "time_s", "loss"], carry=("time_s",))
    for s in range(3):
        sink.add({"superstep": s, "time_s": 0.5 * (s + 1), "loss": 1.0})
    sink.close()
    p.write_bytes(p.read_bytes()[:-4])  # the kill, mid-row
    sink = CsvSink(p, ["superstep", "time_s", "loss"], carry=("time_s",))
    sink.add({"superstep": 2, "time_s": 0.25, "loss": 2.0})  # redone after the checkpoint
    sink.close()
    rows = _rows(p)
    assert [(r["superstep"], float(r["time_s"])) for r in rows] == [
        ("0", 0.5), ("1", 1.0), ("2", 1.25)]
    # an earlier attempt's file of other columns is kept beside the new one
    sink = CsvSink(p, ["superstep", "time_s", "loss", "extra"], carry=("time_s",))
    sink.add({"superstep": 3, "time_s": 0.1, "loss": 1.0, "extra": 1})
    sink.close()
    assert len(_rows(p.with_name("learner-0.csv.1"))) == 3
    assert [r["superstep"] for r in _rows(p)] == ["3"]
    # no regular file (a FIFO: the open for writing waited for a reader for ever)
    fifo = tmp_path / "actor-5.csv"
    os.mkfifo(fifo)
    _actor_attempt(fifo, [(1.0, 1, 0.0)])
    assert fifo.with_name("actor-5.csv.1").is_fifo() and len(_rows(fifo)) == 1
    os.mkfifo(tmp_path / "actor-6.csv")  # beside a resumed actor's file: not read
    _actor_attempt(fifo, [(1.0, 1, 0.0)])
    assert len(_rows(fifo)) == 2


def test_a_new_actor_file_of_a_resumed_run_goes_on_after_the_others(tmp_path) -> None:
    """The clock of an actor file that an earlier attempt wrote goes on after the latest
    time of every actor's file (one actor's last row came early), so that the ingest
    grid puts the attempts in order."""
    _attempt(tmp_path, {2: [(1.0, 10, 0.0)], 3: [(9.0, 90, 0.0)]})  # the killed one
    _actor_attempt(tmp_path / "actor-2.csv", [(1.0, 5, 0.0)])
    assert float(_rows(tmp_path / "actor-2.csv")[-1]["time_s"]) == 10.0


def test_a_fresh_run_sets_the_metrics_of_a_run_before_it_aside(tmp_path) -> None:
    """A fresh run (no --resume) in a used run directory appended its episodes to the
    earlier run's (and now would its per-superstep CSVs); a resumed one keeps them."""
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "episodes-2.csv").write_text("time_s,env_steps,actor,episode_return\n")
    (run / "logs").mkdir()
    (run / "metrics" / "summary.json").write_text("{}\n")
    (run / "config.toml").write_text("[layout]\nactors = 2\n")  # what that attempt ran
    lock_run_dir(run, tmp_path, fresh=False).close()  # a resume
    assert (run / "logs.1" / "config.toml").read_text() == "[layout]\nactors = 2\n"
    assert (run / "metrics" / "episodes-2.csv").exists() and (run / "logs.1").is_dir()
    # the earlier attempt's summary: not this attempt's, should it be killed before its own
    assert not (run / "metrics" / "summary.json").exists()
    assert (run / "logs.1" / "summary.json").read_text() == "{}\n"
    (run / "logs").mkdir()
    lock_run_dir(run, tmp_path, fresh=True).close()
    assert not (run / "metrics").exists() and (run / "logs.2").is_dir()
    assert (run / "metrics.1" / "episodes-2.csv").exists()


def test_the_report_counts_a_superstep_run_twice_once(tmp_path) -> None:
    """The supersteps after the checkpoint a killed attempt resumed from ran again: the
    learner CSV holds both rows, and the report counted rows as supersteps."""
    (tmp_path / "metrics").mkdir()
    rows = [(0, 1.0), (1, 2.0), (2, 3.0), (1, 4.0), (2, 5.0), (3, 6.0)]  # resumed at 1
    (tmp_path / "metrics" / "learner-0.csv").write_text(
        "superstep,time_s,iteration_s\n" + "".join(f"{s},{t},0.1\n" for s, t in rows))
    assert run_stats(load_run(tmp_path))["supersteps"] == 4


def test_the_report_merges_the_episodes_of_a_killed_attempt(tmp_path) -> None:
    """The job merges its actors' episode files at its end: a run killed in its first
    attempt had no episodes.csv and its report no episodes; one killed in a later
    attempt showed the episodes up to the previous attempt's end."""
    import os

    import numpy as np

    from conduit_hpc.rl.episodes import EpisodeLog, merge_episode_files

    metrics = tmp_path / "metrics"
    log = EpisodeLog(1, actor=2, path=metrics / "episodes-2.csv", epsilons=np.array([0.0]))
    for steps in (10, 20):
        log.step(np.array([5.0]), np.array([True]), env_steps=steps)
    log.close()
    assert len(load_run(tmp_path).episodes["episode_return"]) == 2  # killed: never merged
    merge_episode_files(metrics)  # an attempt's end; then a killed one appends
    old = metrics.joinpath("episodes.csv").stat().st_mtime - 10
    os.utime(metrics / "episodes.csv", (old, old))
    log = EpisodeLog(1, actor=2, path=metrics / "episodes-2.csv", epsilons=np.array([0.0]))
    log.step(np.array([5.0]), np.array([True]), env_steps=5)
    log.close()
    run = load_run(tmp_path)
    assert list(run.episodes["env_steps"]) == [10, 20, 25] and not run.problems


def test_the_report_counts_a_thinned_file_resumed_in_it_by_weight_once(tmp_path) -> None:
    """Past run.metrics_full_rows a row stands for ``weight`` supersteps; a resumed
    attempt appends rows from the superstep it resumed at: each superstep counts once."""
    (tmp_path / "metrics").mkdir()
    rows = [(0, 1), (1, 1), (2, 2), (4, 2), (4, 1), (5, 1), (6, 1)]  # resumed at 4
    (tmp_path / "metrics" / "learner-0.csv").write_text(
        "superstep,time_s,iteration_s,weight\n"
        + "".join(f"{s},{k},0.1,{w}\n" for k, (s, w) in enumerate(rows)))
    assert run_stats(load_run(tmp_path))["supersteps"] == 7


def test_an_actor_new_to_a_resumed_run_goes_on_after_every_actor_s_file(tmp_path) -> None:
    """An actor rank new to a resumed run (more ranks than before) began its clock at 0,
    while the episode files go on after the latest row of every actor's file: the
    ingest grid put its rows among the killed attempt's. Its running totals are its
    own (no earlier file of its to go on from)."""
    _actor_attempt(tmp_path / "actor-2.csv", [(1.0, 10, 0.0), (9.0, 90, 0.5)])
    _actor_attempt(tmp_path / "actor-3.csv", [(1.0, 5, 0.25)])  # new to the run
    rows = _rows(tmp_path / "actor-3.csv")
    assert [float(r["time_s"]) for r in rows] == [10.0]
    assert [int(float(r["rows"])) for r in rows] == [5]
    assert float(rows[0]["limiter_wait_s"]) == 0.25


def test_the_clock_goes_on_after_the_earlier_attempts_not_this_one_s(tmp_path) -> None:
    """The files beside a sink are read when it is made (as the episode files are),
    before this attempt's ranks write theirs: read at a sink's first write, another
    rank's first row of this attempt moved its clock on (here actor 3's by actor 2's
    first second), and in a fresh run a rank's clock would begin late."""
    fresh = tmp_path / "fresh"
    _attempt(fresh, {2: [(1.0, 5, 0.0)], 3: [(1.0, 5, 0.0)]})
    assert [float(_rows(fresh / f"actor-{r}.csv")[0]["time_s"]) for r in (2, 3)] == [1.0, 1.0]
    _attempt(tmp_path, {2: [(9.0, 90, 0.0)], 3: [(4.0, 40, 0.0)]})  # the killed attempt
    _attempt(tmp_path, {r: [(1.0, 5, 0.0)] for r in (2, 3, 4)})  # resumed, one actor more
    assert [float(_rows(tmp_path / f"actor-{r}.csv")[-1]["time_s"]) for r in (2, 3, 4)] == [
        10.0, 10.0, 10.0]
