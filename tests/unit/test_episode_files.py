"""Actors' episode files as crashes and resumes leave them, and their merge."""

from __future__ import annotations

import csv
import logging

import numpy as np
import pytest

from conduit_hpc.rl.episodes import EpisodeLog, merge_episode_files


def _log(path, actor: int, steps: list[int]) -> None:
    log = EpisodeLog(1, actor=actor, path=path, epsilons=np.array([0.1]))
    for s in steps:
        log.step(np.array([1.0]), np.array([True]), env_steps=s)
    log.close()


def _merge(tmp_path, caplog) -> tuple[int, str]:
    """Episodes merged, and what the merge warned."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, "conduit_hpc.episodes"):
        n = merge_episode_files(tmp_path)
    return n, caplog.text


def _merged(tmp_path) -> list[dict[str, str]]:
    with open(tmp_path / "episodes.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("cut", [1, 3, 7, 12])
def test_a_row_cut_short_by_a_crash_is_left_out_and_said(tmp_path, cut, caplog) -> None:
    """A crash mid-row leaves the last line without its newline (and without its last
    fields): it was merged as a row (its env_steps a prefix of the true count, or a
    TypeError on the missing fields). Left out now, with a warning naming the line."""
    _log(tmp_path / "episodes-1.csv", 1, [10, 20])
    _log(tmp_path / "episodes-2.csv", 2, [5])
    p = tmp_path / "episodes-1.csv"
    whole = p.read_bytes()
    last = whole.rstrip(b"\r\n").rsplit(b"\n", 1)[1]
    p.write_bytes(whole[: len(whole) - len(last) - 2 + min(cut, len(last) - 1)])
    n, said = _merge(tmp_path, caplog)
    assert n == 2 and "episodes-1.csv:3" in said, said
    rows = _merged(tmp_path)
    assert sorted(int(r["actor_env_steps"]) for r in rows) == [5, 10]


def test_a_resumed_log_does_not_glue_its_first_row_to_a_torn_one(tmp_path, caplog) -> None:
    """A resumed actor appends to its file: after a torn last line its first row
    was written on the same line, and both were lost in one malformed row. The torn
    row is cut first now."""
    p = tmp_path / "episodes-1.csv"
    _log(p, 1, [10, 20])
    p.write_bytes(p.read_bytes()[:-5])  # the crash
    _log(p, 1, [20, 30])  # its own count from 0 again: on after the last whole row's
    n, said = _merge(tmp_path, caplog)
    assert n == 3 and not said, said
    assert [int(r["actor_env_steps"]) for r in _merged(tmp_path)] == [10, 30, 40]


@pytest.mark.parametrize("bad", ["x,1,1,2.0,0.1,1", "1.0,-3,1,2.0,0.1,1",
                                 "nan,3,1,2.0,0.1,1", "1.0,3,1,ret,0.1,1",
                                 "1.0,3,1,2.0,0.1,1,extra", "1.0,3"])
def test_malformed_rows_anywhere_are_left_out(tmp_path, bad, caplog) -> None:
    _log(tmp_path / "episodes-1.csv", 1, [10])
    with open(tmp_path / "episodes-1.csv", "a", newline="") as f:
        f.write(bad + "\r\n")
    _log(tmp_path / "episodes-1.csv", 1, [20])
    n, said = _merge(tmp_path, caplog)
    assert n == 2 and "episodes-1.csv:3" in said, said


def test_files_without_the_columns_or_empty_are_not_merged(tmp_path, caplog) -> None:
    _log(tmp_path / "episodes-1.csv", 1, [10])
    (tmp_path / "episodes-2.csv").write_text("a,b\n1,2\n")
    (tmp_path / "episodes-3.csv").write_text("")
    n, said = _merge(tmp_path, caplog)
    assert n == 1 and "no column time_s" in said, said


def test_well_formed_files_merge_without_a_warning(tmp_path, caplog) -> None:
    _log(tmp_path / "episodes-1.csv", 1, [10, 20])
    _log(tmp_path / "episodes-2.csv", 2, [5])
    assert _merge(tmp_path, caplog) == (3, "")


def test_a_resumed_log_goes_on_after_its_last_time(tmp_path, caplog) -> None:
    """A resumed actor's times began at 0 again: the merge (which sorts by time) put
    its rows before the killed attempt's, and each job total was wrong (CI saw
    ``[30, 40, 10]``). An actor new to the run (another rank count) starts after the
    latest row of every actor's file, not at 0 either."""
    p = tmp_path / "episodes-1.csv"
    _log(p, 1, [10, 20])
    lines = p.read_text().splitlines(keepends=True)
    p.write_text(lines[0] + "".join("500.0" + ln[ln.index(","):] for ln in lines[1:]))
    _log(p, 1, [10])  # the resumed actor counts its steps from 0 again
    _log(tmp_path / "episodes-2.csv", 2, [5])
    n, said = _merge(tmp_path, caplog)
    assert n == 4 and not said, said
    rows = _merged(tmp_path)
    assert [int(r["actor_env_steps"]) for r in rows] == [10, 20, 30, 5]
    assert all(float(r["time_s"]) >= 500.0 for r in rows)
    assert [int(r["env_steps"]) for r in rows] == [10, 20, 30, 35]


def _attempt(tmp_path, counts: dict[int, list[int]], t_end: float | None = None) -> None:
    """One attempt of a job: each actor appends episodes at its own step counts (from 0
    again, as a resumed actor counts); ``t_end`` moves each row's time there (an
    attempt that ran ``t_end`` seconds)."""
    for actor, steps in counts.items():
        p = tmp_path / f"episodes-{actor}.csv"
        before = p.read_text().splitlines(keepends=True) if p.exists() else []
        _log(p, actor, steps)
        if t_end is not None:
            lines = p.read_text().splitlines(keepends=True)
            new = lines[len(before) or 1:]
            head = before or lines[:1]
            p.write_text("".join(head) + "".join(
                f"{float(ln.split(',', 1)[0]) + t_end:.4f}" + ln[ln.index(","):]
                for ln in new))


def test_the_job_total_goes_on_over_resumed_attempts(tmp_path, caplog) -> None:
    """A resumed actor counted its env steps from 0 again in the file it appends to:
    the merge took that as its count, and the job's total went back at the cut (the
    killed attempt's steps dropped out of it: a job at 20,968 env steps ended its
    episodes.csv at 16,810, and env_steps_to_target read from it was short)."""
    _attempt(tmp_path, {1: [100, 200], 2: [150]}, t_end=50.0)  # killed at ~50 s
    _attempt(tmp_path, {1: [40, 80], 2: [60]})  # resumed: own counts from 0
    n, said = _merge(tmp_path, caplog)
    assert n == 6 and not said, said
    rows = _merged(tmp_path)
    totals = [int(r["env_steps"]) for r in rows]
    assert totals == sorted(totals), totals
    assert totals[-1] == 200 + 80 + 150 + 60
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times) and min(times[3:]) >= 50.0, times


def test_an_actor_behind_the_others_resumes_after_the_latest_of_them(tmp_path,
                                                                      caplog) -> None:
    """Each actor's resumed times went on after its own last row: an actor whose last
    episode of the killed attempt ended early (long episodes) wrote its resumed rows
    among the other actors' rows of the killed attempt, and the merge's totals there
    mixed the two attempts."""
    _attempt(tmp_path, {1: [100], 2: [300]})
    for actor, t in ((1, 10.0), (2, 90.0)):  # actor 1's last episode ended at 10 s
        p = tmp_path / f"episodes-{actor}.csv"
        head, row = p.read_text().splitlines(keepends=True)
        p.write_text(head + f"{t}" + row[row.index(","):])
    _attempt(tmp_path, {1: [5], 2: [5]})
    rows = _merged(tmp_path) if _merge(tmp_path, caplog)[0] == 4 else []
    assert [(r["actor"], int(r["env_steps"])) for r in rows][:2] == [("1", 100), ("2", 400)]
    assert min(float(r["time_s"]) for r in rows[2:]) >= 90.0


def test_a_resume_into_a_new_run_directory_counts_from_the_run_s_start(tmp_path,
                                                                         caplog) -> None:
    """``--resume`` without ``--run-dir`` starts a new run directory whose episode files
    hold this attempt alone: its env_steps (and the env_steps_to_target summary.json
    takes from them, over the live count the job had right) began at 0, not at the
    checkpoint's count that the summary's env_steps start from."""
    from conduit_hpc.rl.episodes import has_episodes

    assert not has_episodes(tmp_path)  # nothing of an earlier attempt here
    _attempt(tmp_path, {1: [40, 80], 2: [60]})
    assert has_episodes(tmp_path)
    with caplog.at_level(logging.WARNING, "conduit_hpc.episodes"):
        assert merge_episode_files(tmp_path, env_steps_offset=5000) == 3
    assert [int(r["env_steps"]) for r in _merged(tmp_path)] == [5040, 5080, 5140]
    assert [int(r["actor_env_steps"]) for r in _merged(tmp_path)] == [40, 80, 60]


def test_an_earlier_attempt_s_file_of_other_columns_is_kept_beside(tmp_path, caplog) -> None:
    """An attempt of another version (its file without epsilon and scored) resumed by
    this one: the new rows went under the old header, and the merge left every one of
    them out (6 fields under 4). The old file moves to episodes-1.1.csv, merged too,
    with the counts going on."""
    p = tmp_path / "episodes-1.csv"
    old = EpisodeLog(1, actor=1, path=p)  # no epsilons: the four columns
    old.step(np.array([1.0]), np.array([True]), env_steps=10)
    old.close()
    _log(p, 1, [5])
    n, said = _merge(tmp_path, caplog)
    assert n == 2 and not said, said
    assert (tmp_path / "episodes-1.1.csv").exists()
    assert [int(r["env_steps"]) for r in _merged(tmp_path)] == [10, 15]
