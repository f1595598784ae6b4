"""The checkpoint root's lock for jobs started by hand (``mpirun ... job.py``, not through
``conduit-hpc run``): world rank 0 holds ``ROOT/.lock`` while ``run`` runs, and a root
that another run holds fails every rank at once, touching nothing of it. Three ranks,
a job script whose ``run`` builds no data plane (a few seconds a launch)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from conduit_hpc.config import Config
from conduit_hpc.testing import REPO, mpirun
from conduit_hpc.tools.rundir import lock_run_dir

# run() tries the root's lock itself (a fresh open, as another run would) on every rank;
# rank 0's own try says whether a lock taken before run is held still
SCRIPT = '''
import fcntl, os, time
from conduit_hpc import Config
from conduit_hpc.checkpoint.files import checkpoint_root
from conduit_hpc.job import job_main

def run(cfg, run_dir, resume):
    root = checkpoint_root(cfg, run_dir)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("ROOT FREE", flush=True)
        except BlockingIOError:
            f.seek(0)
            print("ROOT HELD by", f.read().strip(), "this rank is", os.getpid(), flush=True)
    from mpi4py import MPI
    from conduit_hpc.transport.objects import bounded_barrier
    # rank 0 returns (and lets the lock go) once every rank has looked
    bounded_barrier(MPI.COMM_WORLD, 60.0, "every rank's look at the lock")

if __name__ == "__main__":
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "2":
        time.sleep(1.0)  # a rank that reaches job_main late
    job_main(Config, run)
'''
TOML = '''
[run]
name = "root-lock"
timeout_s = 20.0

[layout]
learners = 1
buffers = 1
actors = 1

[spec.obs]
dtype = "float32"

[storage]
capacity_rows = 64

[checkpoint]
on_stop = true
'''


def job(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "job.py").write_text(SCRIPT)
    (tmp_path / "job.toml").write_text(TOML)
    return tmp_path / "job.py", tmp_path / "job.toml"


def outputs(run_dir: Path, name: str) -> list[str]:
    return [(run_dir / "logs" / f"rank.{r}" / name).read_text() for r in range(3)]


def test_a_job_started_by_hand_into_a_root_another_run_holds_fails_on_every_rank(
        tmp_path: Path) -> None:
    """Two runs writing one root (started together, or both ``--resume``) both passed the
    start-up check of the root's contents, then took each other's checkpoint numbers and
    their retention deleted each other's checkpoints. Now, while another run holds the
    root (here this process, as a ``conduit-hpc run`` launcher does), every rank of a job
    started by hand ends at once with one error naming the root and the holder, exit
    status 3 - the rank that reaches job_main late too - and nothing in the root changes."""
    script, toml = job(tmp_path)
    root = tmp_path / "shared-ckpts"
    (root / "ckpt-000001").mkdir(parents=True)
    (root / "ckpt-000001" / "DONE").write_text("{}")
    sets = ["--set", f'checkpoint.directory="{root}"']
    held = lock_run_dir(tmp_path / "first", tmp_path, Config.from_toml(toml, sets[1::2]))
    try:
        before = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
        run_dir = tmp_path / "second"
        out = mpirun(3, [str(script), "--config", str(toml), "--run-dir", str(run_dir),
                         *sets, "--resume"], timeout_s=120)
        after = {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    finally:
        held.close()
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-3000:]
    want = (f"ConduitError: checkpoint root {str(root)!r} (checkpoint.directory) is in use "
            f"by another conduit-hpc run (pid {os.getpid()} on {socket.gethostname()})")
    for r, err in enumerate(outputs(run_dir, "stderr")):
        assert f"conduit-hpc: error on world rank {r}: {want}" in err, (r, err)
    assert not any("ROOT" in o for o in outputs(run_dir, "stdout"))  # run never called
    assert after == before and sorted(before) == [Path(".lock"), Path("ckpt-000001/DONE")]


def test_a_job_started_by_hand_holds_its_root_while_it_runs(tmp_path: Path) -> None:
    """Rank 0 holds ``ROOT/.lock`` (its pid in it) for as long as ``run`` runs - here
    ``RUN_DIR/checkpoints``, the root that a ``conduit-hpc run`` into the same run
    directory locks too - and lets it go when the job ends."""
    script, toml = job(tmp_path)
    run_dir = tmp_path / "run"
    out = mpirun(3, [str(script), "--config", str(toml), "--run-dir", str(run_dir)],
                 timeout_s=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    said = outputs(run_dir, "stdout")
    assert all("ROOT HELD by pid " in s for s in said), said
    rank0 = said[0].split("this rank is ")[1].split()[0]
    assert all(f"ROOT HELD by pid {rank0} on " in s for s in said), said
    lock_run_dir(tmp_path / "next", tmp_path, Config.from_toml(toml, [
        f'checkpoint.directory="{run_dir / "checkpoints"}"'])).close()  # free again


def test_conduit_hpc_run_jobs_with_checkpoints_run_under_their_launchers_lock(
        tmp_path: Path) -> None:
    """Through ``conduit-hpc run``: a root outside the run directory is held by the
    launcher (its ranks must not take it again: a fresh open by a child would conflict
    with its own launcher, and the job would refuse to start), one inside by rank 0, and
    the run directory itself (``checkpoint.directory = "."``: ``ROOT/.lock`` is the
    launcher's ``RUN_DIR/.lock``) by the launcher again (the job refused to start)."""
    _, toml = job(tmp_path)
    for where in ("outside", "inside", "same"):
        run_dir = tmp_path / f"run-{where}"
        sets = {"outside": ["--set", f'checkpoint.directory="{tmp_path / "ckpts"}"'],
                "inside": [],  # (the root is the run directory itself: its .lock is
                "same": ["--set", 'checkpoint.directory="."']}[where]  # the launcher's)
        out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "run", str(toml),
                              "-n", "3", "--launcher", "mpirun", "--run-dir", str(run_dir),
                              *sets], cwd=REPO, capture_output=True, text=True, timeout=180,
                             check=False)
        assert out.returncode == 0, (where, out.stdout[-2000:], out.stderr[-3000:])
        said = outputs(run_dir, "stdout")
        assert all("ROOT HELD by pid " in s for s in said), (where, said)
