"""The shared functions with which a resumed attempt reads the CSV files a killed one
left (``plane.csv_resume``: the per-superstep metrics and the episode files both use
them), on hostile files: none raises or hangs, each gives its documented result."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conduit_hpc.plane.csv_resume import (
    cut_torn_row,
    last_row,
    latest_time,
    number,
    set_aside,
    siblings,
)

HEAD = b"superstep,time_s,loss\r\n"

pytestmark = pytest.mark.timeout(60)  # a FIFO opened for reading would wait for ever


def test_a_torn_last_row_is_cut_and_the_whole_one_before_it_read(tmp_path: Path) -> None:
    p = tmp_path / "learner-0.csv"
    whole = HEAD + b"0,0.5,1.0\r\n1,1.5,2.0\r\n"
    p.write_bytes(whole + b"2,2.")  # killed mid-row
    assert last_row(p) == (["superstep", "time_s", "loss"], ["1", "1.5", "2.0"])
    assert latest_time(p) == 1.5
    assert cut_torn_row(p) == len(whole) and p.read_bytes() == whole
    assert cut_torn_row(p) == len(whole)  # whole rows: nothing more goes


def test_a_torn_row_longer_than_the_tail_read_is_cut_whole(tmp_path: Path) -> None:
    p = tmp_path / "learner-0.csv"
    whole = HEAD + b"0,0.5,1.0\r\n"
    p.write_bytes(whole + b"1,2," + b"9" * (200 << 10))
    assert cut_torn_row(p) == len(whole) and p.read_bytes() == whole


def test_an_empty_file_and_a_torn_header(tmp_path: Path) -> None:
    p = tmp_path / "actor-1.csv"
    p.write_bytes(b"")
    assert cut_torn_row(p) == 0 and last_row(p) == ([], []) and latest_time(p) == 0.0
    p.write_bytes(b"time_s,ro")
    assert last_row(p) == ([], [])
    assert cut_torn_row(p) == 0 and p.read_bytes() == b""


def test_a_header_only_file_has_no_row(tmp_path: Path) -> None:
    p = tmp_path / "actor-1.csv"
    p.write_bytes(HEAD)
    assert cut_torn_row(p) == len(HEAD)
    assert last_row(p) == (["superstep", "time_s", "loss"], [])
    assert latest_time(p) == 0.0


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_no_regular_file_is_opened_nor_read_as_a_sibling(tmp_path: Path, kind: str) -> None:
    own = tmp_path / "actor-1.csv"
    own.write_bytes(b"time_s,rows\r\n4.0,40\r\n")
    odd = tmp_path / "actor-2.csv"
    os.mkfifo(odd) if kind == "fifo" else odd.mkdir()
    assert siblings(own) == [own]
    assert latest_time(own) == 4.0
    assert latest_time(odd) == 4.0  # (the clock of an attempt beside it)
    assert cut_torn_row(odd) == -1 and last_row(odd) is None
    assert cut_torn_row(tmp_path / "actor-9.csv") == -1  # missing: nothing made
    assert not (tmp_path / "actor-9.csv").exists() and last_row(tmp_path / "x.csv") is None
    moved = set_aside(odd)
    assert moved.name == "actor-2.csv.1" and not odd.exists()
    assert (moved.is_fifo() if kind == "fifo" else moved.is_dir())


def test_bytes_that_are_not_utf8_are_read_not_refused(tmp_path: Path) -> None:
    p = tmp_path / "episodes-3.csv"
    p.write_bytes(b"time_s,env_steps\xff\r\n\xfe\x00,12\r\n7.5,\x80\r\n")
    header, row = last_row(p) or ([], [])
    assert header == ["time_s", "env_steps\ufffd"] and row == ["7.5", "\ufffd"]
    assert latest_time(p) == 7.5
    p.write_bytes(b"time_s,env_steps\r\n\xfe\x00,12\r\n")
    assert last_row(p) == (["time_s", "env_steps"], ["\ufffd\ufffd", "12"])
    assert latest_time(p) == 0.0
    assert cut_torn_row(p) == len(p.read_bytes())


def test_a_time_that_is_not_a_number_counts_as_none(tmp_path: Path) -> None:
    for rank, cell in enumerate(["soon", "nan", "inf", "-3.0", "", "2.5"]):
        (tmp_path / f"actor-{rank}.csv").write_text(f"time_s,rows\r\n{cell},1\r\n")
    assert latest_time(tmp_path / "actor-0.csv") == 2.5
    assert latest_time(tmp_path / "actor-9.csv") == 2.5  # a rank new to the run
    (tmp_path / "actor-5.csv").unlink()
    assert latest_time(tmp_path / "actor-0.csv") == 0.0
    for cell in ("soon", "nan", "inf", "-inf", "", None):
        assert number({"time_s": cell} if cell is not None else {}, "time_s") == 0.0
    assert number({"rows": "-3"}, "rows") == -3.0


def test_siblings_are_the_files_named_like_it(tmp_path: Path) -> None:
    for name in ("actor-1.csv", "actor-2.csv", "actor-2.csv.1", "learner-0.csv",
                 "episodes-3.1.csv", "summary.csv"):
        (tmp_path / name).write_text("time_s\r\n1\r\n")
    names = [q.name for q in siblings(tmp_path / "actor-7.csv")]
    assert names == ["actor-1.csv", "actor-2.csv"]
    assert [q.name for q in siblings(tmp_path / "summary.csv")] == ["summary.csv"]
    assert [q.name for q in siblings(tmp_path / "episodes-3.csv")] == ["episodes-3.1.csv"]
    assert set_aside(tmp_path / "episodes-3.1.csv", keep_suffix=True).name == \
        "episodes-3.1.1.csv"


def test_an_episode_log_sets_a_fifo_aside_and_reads_a_header_of_bad_bytes(
        tmp_path: Path) -> None:
    """Before: an EpisodeLog on a FIFO at its path raised UnsupportedOperation ('not
    seekable'), and on an earlier attempt's file whose header held a byte that is not
    UTF-8, UnicodeDecodeError: the actor ended in a traceback."""
    import numpy as np

    from conduit_hpc.rl.episodes import EpisodeLog

    os.mkfifo(tmp_path / "episodes-1.csv")
    (tmp_path / "episodes-2.csv").write_bytes(
        b"time_s,env_steps\xff,actor,episode_return\r\n1.0,5,2,1\r\n")
    for actor in (1, 2):
        log = EpisodeLog(1, actor=actor, path=tmp_path / f"episodes-{actor}.csv")
        log.step(np.array([1.0]), np.array([True]), env_steps=3)
        log.close()
    assert (tmp_path / "episodes-1.1.csv").is_fifo()
    assert (tmp_path / "episodes-2.1.csv").read_bytes().startswith(b"time_s,env_steps\xff")
    for actor in (1, 2):
        lines = (tmp_path / f"episodes-{actor}.csv").read_text().splitlines()
        assert lines[0] == "time_s,env_steps,actor,episode_return" and len(lines) == 2
    assert float(lines[1].split(",")[0]) >= 1.0  # after the earlier attempt's clock
