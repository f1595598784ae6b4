"""A launch that Open MPI failed to start (``prterun``: "The PMIx server's listener
thread failed to start. We cannot continue.", before any rank started) is tried again;
one that failed otherwise, or whose ranks ran, is not. A stand-in ``mpirun`` first on
``PATH`` (or ``$CONDUIT_MPIRUN``) fails as told, counting its calls in a file, and then
runs the real ``mpirun``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli
from conduit_hpc.tools.cli_support import run_bounded
from conduit_hpc.tools.launcher import mpi_env

PMIX = ("echo '--------------------------------------------------------------------------'"
        " >&2\necho \"The PMIx server's listener thread failed to start. We cannot\" >&2\n"
        "echo 'continue.' >&2\n")
RANK = [sys.executable, "-c", "print('rank 0 ran')"]

pytestmark = pytest.mark.timeout(120)


def _fake(tmp_path: Path, fail_first: int, failure: str, then: str = "") -> Path:
    """A stand-in ``mpirun`` in ``tmp_path/bin``: its first ``fail_first`` calls print
    ``failure`` and exit 1; later ones run ``then`` (default: the real mpirun)."""
    real = shutil.which("mpirun", path=mpi_env()["PATH"])
    assert real is not None
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "mpirun"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho x >> {calls}\n"
                    f"if [ $(wc -l < {calls}) -le {fail_first} ]; then\n{failure}exit 1\nfi\n"
                    + (then or f"exec {real} \"$@\"\n"))
    fake.chmod(0o755)
    return fake


def _env(fake: Path) -> dict[str, str]:
    env = mpi_env()
    env["PATH"] = f"{fake.parent}:{env['PATH']}"
    return env


def _calls(tmp_path: Path) -> int:
    return len((tmp_path / "calls").read_text().splitlines())


def test_a_launch_open_mpi_failed_to_start_is_tried_again(tmp_path, capfd) -> None:
    """Before: conduit-hpc info (and probe) exited 1 with the message, as
    test_cli.py::test_info_prints_mpi_roles_and_nodes did once."""
    fake = _fake(tmp_path, 1, PMIX)
    assert run_bounded(["mpirun", "-n", "1", *RANK], _env(fake), 60.0) == 0
    out, err = capfd.readouterr()
    assert _calls(tmp_path) == 2 and "rank 0 ran" in out
    assert "conduit-hpc: mpirun failed to start the launch (Open MPI" in err
    assert "no rank started); trying again in 1 s (retry 1 of 2)" in err


def test_another_failure_or_a_launch_whose_ranks_ran_is_not_tried_again(tmp_path,
                                                                        capfd) -> None:
    fake = _fake(tmp_path, 1, "echo 'mpirun: some other failure' >&2\n")
    assert run_bounded(["mpirun", "-n", "1", *RANK], _env(fake), 60.0) == 1
    assert _calls(tmp_path) == 1 and "trying again" not in capfd.readouterr().err
    (tmp_path / "ran").mkdir()
    fake = _fake(tmp_path / "ran", 1, "echo 'rank 0 ran'\n" + PMIX)  # then the message
    assert run_bounded(["mpirun", "-n", "1", *RANK], _env(fake), 60.0) == 1
    out, err = capfd.readouterr()
    assert _calls(tmp_path / "ran") == 1 and "rank 0 ran" in out
    assert "listener thread" in err and "trying again" not in err


def test_a_launch_that_never_starts_is_tried_twice_more(tmp_path, capfd) -> None:
    from conduit_hpc.tools.mpi_start import run_captured

    fake = _fake(tmp_path, 99, PMIX)
    assert run_bounded(["mpirun", "-n", "1", *RANK], _env(fake), 60.0, pause_s=0.05) == 1
    err = capfd.readouterr().err
    assert _calls(tmp_path) == 3 and "(retry 2 of 2)" in err and "retry 3" not in err
    assert err.count("We cannot") == 3  # each try's own words
    (tmp_path / "c").mkdir()
    fake = _fake(tmp_path / "c", 1, PMIX)
    done = run_captured(["mpirun", "-n", "1", *RANK], env=_env(fake), cwd=tmp_path,
                        timeout_s=60.0, pause_s=0.05)
    assert done.returncode == 0 and done.stdout.strip() == "rank 0 ran"
    assert _calls(tmp_path / "c") == 2 and "(retry 1 of 2)" in capfd.readouterr().err


def _run_job(tmp_path: Path, fake: Path, monkeypatch, capsys) -> tuple[int, str, Path]:
    monkeypatch.setenv("CONDUIT_MPIRUN", str(fake))
    run = tmp_path / "run"
    rc = cli.main(["run", str(REPO / "jobs/synthetic.toml"), "--run-dir", str(run),
                   "--launcher", "mpirun"])
    return rc, capsys.readouterr().err, run / "logs" / "launcher.log"


def test_conduit_hpc_run_tries_a_failed_start_again(tmp_path, monkeypatch, capsys) -> None:
    """The job's own launch: the second try here fails otherwise (status 7, no rank),
    which is reported as such; the log keeps both tries and the note between them."""
    fake = _fake(tmp_path, 1, PMIX, then="echo 'fake: second try failed' >&2\nexit 7\n")
    rc, err, log = _run_job(tmp_path, fake, monkeypatch, capsys)
    assert rc == 7 and _calls(tmp_path) == 2
    assert "failed to start the launch" in err and "(retry 1 of 2)" in err
    assert "mpirun exited with status 7 before any rank started" in err
    text = log.read_text()
    assert text.index("listener thread") < text.index("(retry 1 of 2)") < text.index(
        "second try failed"), text


def test_conduit_hpc_run_never_starts_again_a_job_whose_ranks_ran(tmp_path, monkeypatch,
                                                                  capsys) -> None:
    """A rank wrote its log directory: the job ran, whatever the launcher said after."""
    rank_ran = ('while [ $# -gt 0 ]; do [ "$1" = --run-dir ] && mkdir -p "$2/logs/rank.0"; '
                'shift; done\n')
    fake = _fake(tmp_path, 9, rank_ran + PMIX)
    rc, err, _ = _run_job(tmp_path, fake, monkeypatch, capsys)
    assert rc == 1 and _calls(tmp_path) == 1 and "trying again" not in err
