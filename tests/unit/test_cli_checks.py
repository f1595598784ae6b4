"""The CLI's checks a newcomer meets first: ``inspect RUN_DIR`` looks in the run's
checkpoints, ``report`` of a folder that is no run is an error that writes nothing, and
``run`` refuses a missing site ``mpirun`` or a bad ``CONDUIT_MPI`` before it makes a run
directory (no MPI: in-process, or ``conduit-hpc run`` stopped before ``mpirun``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli


def test_inspect_of_a_run_directory_reads_its_checkpoints(tmp_path: Path, capsys) -> None:
    from test_checkpoint import write  # the unit tests' checkpoint, written without MPI

    run_dir = tmp_path / "synthetic-20260101"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.toml").write_text('[checkpoint]\ndirectory = "ckpts"\n')
    assert cli.main(["inspect", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "is a run directory without checkpoints" in err and "ckpts" in err
    write(run_dir / "ckpts", 3)
    assert cli.main(["inspect", str(run_dir), "--verify"]) == 0
    out, err = capsys.readouterr()
    assert f"its checkpoints are under {run_dir / 'ckpts'}" in err
    assert "ckpt-000003" in out and "verified" in out and "DONE" not in out


def test_inspect_of_a_checkpoint_itself_is_unchanged(tmp_path: Path, capsys) -> None:
    from test_checkpoint import write

    ckpt = write(tmp_path / "checkpoints", 1)
    assert cli.main(["inspect", str(ckpt)]) == 0
    assert "run directory" not in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["inspect", str(tmp_path / "empty")]) == 1  # not a run: as before


def test_report_of_a_folder_without_metrics_is_an_error_and_writes_nothing(
        tmp_path: Path, capsys) -> None:
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"'{tmp_path}' is not a run directory: it has no metrics/" in err
    assert list(tmp_path.iterdir()) == []


def run_cli(env: dict[str, str], runs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "run",
                           "jobs/synthetic.toml", "--launcher", "mpirun", "--runs", str(runs)],
                          cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_missing_site_mpirun_or_bad_mpi_is_refused_before_the_run_directory(
        tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    out = run_cli({"CONDUIT_MPI": "site", "CONDUIT_MPIRUN": "/no/such/mpirun"}, runs)
    assert out.returncode == 2, out.stderr
    assert "mpirun '/no/such/mpirun' ($CONDUIT_MPIRUN" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    bad = run_cli({"CONDUIT_MPI": "system"}, runs)
    assert bad.returncode == 2 and "CONDUIT_MPI must be wheel or site, got 'system'" in \
        bad.stderr, bad.stderr
    assert not runs.exists()


def test_bench_flags_are_refused_before_any_rank_starts() -> None:
    """``bench capacity`` and ``bench peers`` name a bad ``--modes``, ``--peers`` or
    count (argparse exit 2), rather than a KeyError after minutes of measuring."""
    from conduit_hpc.bench import capacity, peers
    from conduit_hpc.errors import ConfigError

    assert peers.parse_peers("none") == [] and peers.parse_peers("") == []
    assert peers.parse_peers("cpprb,cpprb,torchrl") == ["cpprb", "torchrl"]
    assert peers.parse_modes("sync,edp-process:owner,service") == [
        "sync", "edp-process:owner", "service"]
    for bad in ("foo", "sync-process", "edp-thread-process", "edp:foo", "sync:owner:x", ","):
        with pytest.raises(ConfigError, match="--modes"):
            peers.parse_modes(bad)
    with pytest.raises(ConfigError, match="unknown: reverb"):
        peers.parse_peers("cpprb,reverb")
    for main in (capacity.main, peers.main):
        for argv in (["--peers", "none,x"], ["--modes", "bogus"], ["--batches", "0"],
                     ["--actors", "-1"], ["--duration", "nan"], ["--duration", "inf"]):
            with pytest.raises(SystemExit) as exc:
                main(argv)
            assert exc.value.code == 2, argv


@pytest.mark.parametrize("name", ["plan.json", "metrics/learner-1.csv"])
def test_report_refuses_a_fifo_in_a_run_directory_at_once(name: str, tmp_path: Path) -> None:
    """A FIFO named plan.json held conduit-hpc report forever (read_text waited for a
    writer that never came; /dev/zero linked there would be read until memory ran
    out); a FIFO among the metrics CSVs held it 60 s (the config reader's wait for a
    FIFO's writer). Now each is reported unreadable and the report is written."""
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "learner-0.csv").write_text("superstep,t_s,exposed_s\n1,0.1,0.01\n")
    os.mkfifo(run / name)
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "report", str(run),
                          "--out", str(tmp_path / "rep")], cwd=REPO, capture_output=True,
                         text=True, timeout=40, stdin=subprocess.DEVNULL, check=False)
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"{Path(name).name}: unreadable (metrics file" in md and \
        "is not a regular file (a FIFO, device or socket)" in md, md


def test_a_launcher_that_fails_before_any_rank_is_reported_with_its_own_words(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """``SLURM_JOB_ID`` set outside a working allocation with ``--launcher srun``: srun
    exits 1 ('Could not establish a configuration source') before any rank starts, and
    conduit-hpc run said only 'job exited with status 1; logs in ...'. Now the launcher's
    status and the last lines of launcher.log (a stand-in mpirun here, as srun there)."""
    fake = tmp_path / "fake-mpirun"
    fake.write_text("#!/bin/sh\necho 'fake: fatal: Could not establish a configuration "
                    "source' >&2\nexit 7\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CONDUIT_MPIRUN", str(fake))
    runs = tmp_path / "runs"
    assert cli.main(["run", str(REPO / "jobs/synthetic.toml"), "--runs", str(runs),
                     "--launcher", "mpirun"]) == 7
    err = capsys.readouterr().err
    assert "conduit-hpc: error: mpirun exited with status 7 before any rank started" in err
    assert "| fake: fatal: Could not establish a configuration source" in err, err
