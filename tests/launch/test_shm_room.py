"""Hostile sizes: shard windows or staging rings larger than the file system that backs
MPI's shared memory (``/dev/shm``, or Open MPI's ``osc_sm_backing_directory``) are refused
on every rank before any window exists, naming the keys and the bytes - not an
``MPI_ERR_INTERN`` traceback on one rank (or a SIGBUS on first touch).

The small file system is a real 16 MiB tmpfs, mounted by the test (root only; skipped
otherwise), that Open MPI is pointed at through its MCA environment variable."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from extras import small_tmpfs

from conduit_hpc.testing import REPO


@pytest.fixture
def small_shm(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "shm", "16m") as d:
        yield d


def run(tmp_path: Path, shm: Path, *sets: str) -> tuple[subprocess.CompletedProcess[str], str]:
    env = dict(os.environ, OMPI_MCA_osc_sm_backing_directory=str(shm))
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "run",
                          "jobs/synthetic.toml", "--runs", str(tmp_path / "runs"),
                          "--set", "checkpoint.every_seconds=0",
                          "--set", "checkpoint.on_stop=false", "--set", "layout.actors=1",
                          "--set", "run.duration_s=1.0", *args, "--timeout", "120"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
                         check=False)
    logs = "".join(p.read_text(errors="replace")
                   for p in sorted((tmp_path / "runs").glob("*/logs/rank.*/stderr")))
    return out, logs


def test_shards_larger_than_the_shared_memory_are_refused_on_every_rank(
        tmp_path: Path, small_shm: Path) -> None:
    # ~120 bytes a row: 400,000 rows are ~48 MB, three times the 16 MiB there
    out, logs = run(tmp_path, small_shm, "storage.capacity_rows=400000")
    assert out.returncode != 0
    text = out.stderr + out.stdout + logs
    assert "MPI_ERR_INTERN" not in text, text[-3000:]
    assert "storage.capacity_rows = 400000" in text, text[-3000:]
    assert f"free space of {small_shm}" in text and "16777216 bytes" in text, text[-3000:]
    # every rank refused it, with the same message
    assert logs.count("ConfigError: storage.capacity_rows = 400000") == 3, logs[-3000:]


def test_a_staging_ring_larger_than_the_shared_memory_is_refused(
        tmp_path: Path, small_shm: Path) -> None:
    # the shards fit (1,000 rows); 3 slots of 40,000-row batches (~5 MB each) do not
    out, logs = run(tmp_path, small_shm, 'scheduler.delivery="process"',
                    "storage.capacity_rows=60000", "scheduler.batch_rows=40000",
                    "scheduler.min_fill_rows=40000", "scheduler.prefetch_depth=2")
    assert out.returncode != 0
    text = out.stderr + out.stdout + logs
    assert "MPI_ERR_INTERN" not in text, text[-3000:]
    assert "scheduler.batch_rows = 40000" in text, text[-3000:]
    assert "scheduler.prefetch_depth = 2" in text and "staging rings" in text, text[-3000:]
    assert logs.count("ConfigError:") == 4, logs[-3000:]
