"""Hostile values typed into ``conduit-hpc``'s path arguments and ``run.name``: one
``conduit-hpc: error`` line and exit status 2, nothing launched, never a traceback nor a
job that starts and then fails on what the checks let through.

Before: a path argument past NAME_MAX (``OSError: File name too long`` from
``Path.exists()`` and the like) ended run, slurm, inspect and report in a traceback; a
run directory behind a symbolic-link loop ended report in pathlib's ``RuntimeError``;
``run .`` and ``slurm /`` in ``ValueError: ... has an empty name``; ``run.name`` of 300
characters passed the loader and failed making the run directory (``OSError``); and
``--resume`` of a directory holding no checkpoint started every rank, which then
refused it together (``CheckpointError``, exit 3, ~20 s later)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conduit_hpc import Config, ConfigError
from conduit_hpc.config.checks import MAX_NAME_BYTES
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli
from conduit_hpc.tools.rundir import resume_problem

JOB = str(REPO / "jobs/synthetic.toml")
CLUSTER = str(REPO / "jobs/cluster-local.toml")
LONG = "a" * 300  # one path component past NAME_MAX (255 bytes)


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``conduit-hpc ARGV`` in this process: exit status 2 and one error line."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def path_cases(where: Path) -> list[tuple[list[str], str]]:
    loop = where / "loop"
    return [
        (["slurm", LONG], LONG),
        (["slurm", JOB, "-o", LONG], LONG),
        (["inspect", LONG], LONG),
        (["report", LONG], LONG),
        (["report", str(loop)], str(loop)),
        (["run", JOB, "--resume", LONG], LONG),
        (["run", JOB, "--entry", LONG], LONG),
        (["run", JOB, "--run-dir", f"{LONG}/x"], LONG),
        (["run", "."], "'.'"),
        (["run", "/"], "'/'"),
        (["run", ""], "'.' is a directory"),
        (["slurm", "/"], "'/'"),
        (["slurm", "."], "'.'"),
        (["info", "--config", LONG], LONG),
        (["plan", LONG], LONG),
        (["plan", CLUSTER, "--workload", str(loop)], str(loop)),
    ]


@pytest.mark.parametrize("case", range(16))
def test_a_path_the_system_refuses_is_one_error_line(case: int, tmp_path: Path, capsys,
                                                     monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_MPIRUN", "/bin/false")  # a missed check: exit 1 at once
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    argv, named = path_cases(tmp_path)[case]
    if argv[0] == "run":
        argv = [*argv, "--runs", str(tmp_path / "runs"), "--launcher", "mpirun"]
    line = one_error_line(argv, capsys)
    assert named in line, line
    assert not (tmp_path / "runs").exists()


def test_every_path_case_is_run() -> None:
    assert len(path_cases(Path("/x"))) == 16


@pytest.mark.parametrize("name", ["a" * 300, "é" * 101, "a" * (MAX_NAME_BYTES + 1)])
def test_a_run_name_too_long_for_its_run_directory_is_refused_at_load(name: str) -> None:
    with pytest.raises(ConfigError, match=r"run\.name must be a name of at most 200 bytes"
                       ) as err:
        Config.from_dict({"run": {"name": name}})
    assert err.value.key == "run.name"


def test_the_longest_run_name_taken_makes_its_run_directory(tmp_path: Path) -> None:
    name = "é" * (MAX_NAME_BYTES // 2)
    assert Config.from_dict({"run": {"name": name}}).run.name == name
    (tmp_path / f"{name}-20261205-155039-315984").mkdir()  # the launcher's stamp


def test_a_run_name_too_long_is_refused_before_launch(tmp_path: Path, capsys,
                                                      monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_MPIRUN", "/bin/false")
    runs = tmp_path / "runs"
    line = one_error_line(["run", JOB, "--set", f"run.name={LONG}", "--runs", str(runs),
                           "--launcher", "mpirun"], capsys)
    assert "ConfigError" in line and "run.name must be a name of at most 200 bytes" in line
    assert not runs.exists()


@pytest.mark.parametrize("what", ["empty", "files-only", "tmp-only"])
def test_a_resume_directory_holding_no_checkpoint_is_refused_before_launch(
        what: str, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_MPIRUN", "/bin/false")
    path = tmp_path / "resume-from"
    path.mkdir()
    if what == "files-only":
        (path / "notes.txt").write_text("not a checkpoint")
        (path / "logs").mkdir()
    if what == "tmp-only":
        (path / ".tmp-ckpt-000001").mkdir()  # a write that never finished
    runs = tmp_path / "runs"
    line = one_error_line(["run", JOB, "--runs", str(runs), "--launcher", "mpirun",
                           "--resume", str(path)], capsys)
    assert (f"ConfigError: --resume {str(path)!r} must be a checkpoint directory "
            f"(ckpt-NNNNNN) or a directory holding them; it is a directory that holds "
            f"neither") in line, line
    assert not runs.exists()


@pytest.mark.parametrize("what", ["checkpoint", "manifest", "done-only", "root"])
def test_what_the_ranks_would_try_passes_the_resume_check(what: str, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt-000003"
    ckpt.mkdir()
    (ckpt / ("DONE" if what == "done-only" else "manifest.h5")).write_bytes(b"")
    given = {"checkpoint": ckpt, "manifest": ckpt / "manifest.h5", "done-only": ckpt,
             "root": tmp_path}[what]
    assert resume_problem(str(given)) == ""
    assert resume_problem(os.fspath(tmp_path / "nope")) == "does not exist"
    assert resume_problem(str(ckpt / "manifest.h5" / "x")) == "does not exist"
