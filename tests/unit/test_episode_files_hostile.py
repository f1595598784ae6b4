"""Episode files as a killed attempt leaves them: a requeued attempt of a job (SLURM
requeue: the same run directory) appends to each actor's ``episodes-<rank>.csv``; a row
torn by the kill is cut off first, and the merge at the job's end leaves out a damaged
row or a FIFO (naming them in a warning) instead of ending the job in a traceback."""

from __future__ import annotations

import csv
import logging
import os
import random
from pathlib import Path

import numpy as np
import pytest

from conduit_hpc.rl.episodes import EpisodeLog, merge_episode_files


def _attempt(path: Path, steps: int, actor: int = 0) -> None:
    log = EpisodeLog(2, actor=actor, path=path)
    for t in range(steps):
        log.step(np.ones(2), np.array([t % 3 == 2, t % 4 == 3]), env_steps=2 * (t + 1))
    log.close()


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.mark.parametrize("seed", range(6))
def test_a_row_torn_by_a_kill_is_cut_and_the_next_attempt_merges(tmp_path: Path,
                                                                 seed: int) -> None:
    """Before: the requeued attempt's first row was glued onto the torn one
    ('0.0009,60.0005,10,0,5') and merge_episode_files raised ValueError (int('60.0005'))
    on rank 0 after the final checkpoint: no episodes.csv, no summary, exit 1."""
    metrics = tmp_path / "metrics"
    part = metrics / "episodes-3.csv"
    _attempt(part, 40)
    whole = part.read_bytes()
    rows_before = len(_rows(part)) - 1
    cut = random.Random(seed).randrange(len(b"\r\n".join(whole.split(b"\r\n")[:2])) + 1,
                                        len(whole) - 1)
    if whole[cut - 1:cut] == b"\n":
        cut -= 1  # a torn row, not a whole one
    part.write_bytes(whole[:cut])  # killed mid-row
    kept = whole[:cut].rfind(b"\n") + 1
    _attempt(part, 12)
    text = part.read_bytes()
    assert text.startswith(whole[:kept])  # every whole row stays
    rows = _rows(part)
    assert all(len(r) == 4 for r in rows), rows
    assert rows[0] == ["time_s", "env_steps", "actor", "episode_return"]
    written = merge_episode_files(metrics)
    assert written == len(rows) - 1 >= whole[:kept].count(b"\n") - 1
    assert written < rows_before + 12


def test_a_file_torn_inside_its_header_starts_again_with_one(tmp_path: Path) -> None:
    part = tmp_path / "episodes-1.csv"
    part.write_bytes(b"time_s,env_st")
    _attempt(part, 6)
    rows = _rows(part)
    assert rows[0] == ["time_s", "env_steps", "actor", "episode_return"] and len(rows) > 1
    assert merge_episode_files(tmp_path) == len(rows) - 1


def test_the_merge_leaves_out_damaged_rows_and_a_fifo_and_names_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _attempt(tmp_path / "episodes-1.csv", 9, actor=1)
    with open(tmp_path / "episodes-2.csv", "a", newline="") as f:
        f.write("time_s,env_steps,actor,episode_return\r\n0.5,4,2,1.0\r\nx,y,2,3\r\n"
                "0.7,4.5,2,1\r\n0.8,6,2,1,extra\r\n0.9,8,2,2.0\r\n")
    os.mkfifo(tmp_path / "episodes-3.csv")  # would hold the job's end for ever
    with caplog.at_level(logging.WARNING, "conduit_hpc.episodes"):
        n = merge_episode_files(tmp_path)
    good = len(_rows(tmp_path / "episodes-1.csv")) - 1 + 2
    assert n == good
    assert all(f"episodes-2.csv:{line}" in caplog.text for line in (3, 4, 5)), caplog.text
    assert "episodes-3.csv: not a regular file" in caplog.text
    merged = _rows(tmp_path / "episodes.csv")
    assert len(merged) == good + 1 and merged[-1][-1] == "8"  # actor 2's own steps
