"""``conduit-hpc slurm -o`` and ``probe --out`` never write over the job's own files
nor over a file they did not write (before: ``slurm JOB.toml -o JOB.toml`` made the job
TOML a bash script, ``-o JOB.py`` destroyed the job script and ``probe --out JOB.toml``
replaced a job config with a cluster model, each with exit status 0)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conduit_hpc.config.outfile import SBATCH_HEADER, written_by
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli


@pytest.fixture
def job(tmp_path: Path) -> Path:
    for ext in ("toml", "py"):
        shutil.copy(REPO / f"jobs/synthetic.{ext}", tmp_path / f"synthetic.{ext}")
    return tmp_path / "synthetic.toml"


@pytest.mark.parametrize("target", ["synthetic.toml", "synthetic.py", "./sub/../synthetic.py"])
@pytest.mark.parametrize("force", [False, True])
def test_slurm_never_writes_over_the_jobs_own_files(job: Path, target: str, force: bool,
                                                     capsys) -> None:
    (job.parent / "sub").mkdir()
    before = {p.name: p.read_bytes() for p in job.parent.glob("synthetic.*")}
    out = str(job.parent / target)
    assert cli.main(["slurm", str(job), "-o", out, *(["--force"] if force else [])]) == 2
    err = capsys.readouterr().err
    assert "ConfigError: -o must not be the job's own file" in err and repr(out) in err, err
    assert "Traceback" not in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in job.parent.glob("synthetic.*")} == before


def test_slurm_refuses_another_existing_file_unless_forced(job: Path, capsys) -> None:
    other = job.parent / "notes.txt"
    other.write_text("precious\n")
    assert cli.main(["slurm", str(job), "-o", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"-o {str(other)!r} is an existing file that is not an sbatch script" in err, err
    assert "--force" in err and other.read_text() == "precious\n"
    assert cli.main(["slurm", str(job), "-o", str(other), "--force"]) == 0
    assert written_by(other, SBATCH_HEADER)


def test_slurm_writes_a_new_file_and_rewrites_its_own_script(job: Path) -> None:
    out = job.parent / "job.sbatch"
    assert cli.main(["slurm", str(job), "-o", str(out)]) == 0
    assert written_by(out, SBATCH_HEADER) and out.read_text().endswith("\n")
    assert cli.main(["slurm", str(job), "-o", str(out), "--time", "30"]) == 0
    assert "#SBATCH --time=30\n" in out.read_text()


def test_probe_refuses_an_existing_file_it_did_not_write(job: Path, capsys) -> None:
    before = job.read_bytes()
    assert cli.main(["probe", "-n", "3", "--out", str(job)]) == 2  # before any launch
    err = capsys.readouterr().err
    assert f"--out {str(job)!r} is an existing file that is not a cluster model" in err, err
    assert job.read_bytes() == before


def test_the_probe_writes_the_header_the_check_knows() -> None:
    text = (REPO / "conduit_hpc/plane/probe.py").read_text()
    assert 'f.write(PROBE_HEADER + "\\n"' in text


def test_the_probe_module_run_by_hand_refuses_a_file_it_did_not_write(job: Path) -> None:
    """``python -m conduit_hpc.plane.probe --out`` (the way its docstring shows) checks
    --out as ``conduit-hpc probe`` does, before the collective probe (every rank)."""
    import os
    import subprocess
    import sys

    before = job.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = subprocess.run([sys.executable, "-m", "conduit_hpc.plane.probe", "--out",
                          str(job)], capture_output=True, text=True, timeout=120, env=env)
    assert got.returncode == 2, got.stderr
    assert "is an existing file that is not a cluster model" in got.stderr, got.stderr
    assert job.read_bytes() == before
