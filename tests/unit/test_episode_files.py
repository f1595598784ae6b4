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
    _log(p, 1, [30, 40])
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
    ``[30, 40, 10]``)."""
    p = tmp_path / "episodes-1.csv"
    _log(p, 1, [10, 20])
    lines = p.read_text().splitlines(keepends=True)
    p.write_text(lines[0] + "".join("500.0" + ln[ln.index(","):] for ln in lines[1:]))
    _log(p, 1, [30])
    _log(tmp_path / "episodes-2.csv", 2, [5])
    n, said = _merge(tmp_path, caplog)
    assert n == 4 and not said, said
    rows = _merged(tmp_path)
    assert [int(r["actor_env_steps"]) for r in rows] == [5, 10, 20, 30]
    assert float(rows[-1]["time_s"]) >= 500.0
    assert [int(r["env_steps"]) for r in rows] == [5, 15, 25, 35]
