"""``conduit-hpc`` given rank counts and run directories it cannot use: one
``conduit-hpc: error`` line naming the flag and the value, exit status 2, nothing
launched and no traceback (before: ``OverflowError`` for a huge ``-n``,
``FileNotFoundError``/``NotADirectoryError`` for ``--runs``, ``mpirun -n -2`` started,
``info -n 10**17`` hung until its timeout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conduit_hpc import Config
from conduit_hpc.config import LayoutConfig
from conduit_hpc.errors import ConfigError
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli
from conduit_hpc.tools.launcher import ranks_problem

JOB = str(REPO / "jobs/synthetic.toml")


@pytest.mark.parametrize("argv", [
    ["run", JOB, "-n", "99999999999999999999"],
    ["run", JOB, "-n", "-1"],
    ["run", JOB, "-n", "0"],
    ["info", "-n", "-2"],
    ["info", "-n", "99999999999999999"],
    ["probe", "-n", "0"],
])
def test_a_rank_count_out_of_range_is_refused_naming_it(argv: list[str], tmp_path: Path,
                                                        capsys) -> None:
    assert cli.main([*argv, *(["--runs", str(tmp_path)] if argv[0] == "run" else [])]) == 2
    err = capsys.readouterr().err
    assert "ConfigError: -n must be a number of ranks between" in err, err
    assert f"got {argv[-1]}" in err
    assert list(tmp_path.iterdir()) == []


def test_the_rule_is_asked_without_a_world_of_a_billion_ranks() -> None:
    cfg = Config(layout=LayoutConfig(learners=1, buffers=1, actors=0))
    assert ranks_problem(cfg, 2**31 - 1) is None  # every rank an actor: fine, and fast
    exact = Config(layout=LayoutConfig(learners=1, buffers=1, actors=4))
    err = ranks_problem(exact, 2**31 - 1)
    assert isinstance(err, ConfigError) and "-n 2147483647 is more than the 6" in str(err)


@pytest.mark.parametrize("where", ["file", "missing-parent"])
def test_a_run_directory_that_cannot_be_made_is_named(where: str, tmp_path: Path,
                                                      capsys) -> None:
    runs = tmp_path / "a-file"
    runs.write_text("not a directory")
    if where == "missing-parent":
        runs = Path("/proc/no-such-dir")
    assert cli.main(["run", JOB, "--runs", str(runs), "--launcher", "mpirun"]) == 2
    err = capsys.readouterr().err
    assert f"under --runs {str(runs)!r}) cannot be made or written" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("flag", "value"), [
    ("--partition", "gpu\necho injected"), ("--account", "acct\recho injected"),
    ("--module", "cuda\necho injected"), ("--output", "x.out\necho injected"),
    ("--runs", "runs\necho injected"), ("--partition", "a b"),
])
def test_a_value_that_would_start_a_script_line_of_its_own_is_refused(
        flag: str, value: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "job.sbatch"
    argv = ["slurm", JOB, "--nodes", "1", "--ntasks-per-node", "6", flag, value, "-o", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"ConfigError: {flag} must be" in err and repr(value) in err, err
    assert not out.exists()


def test_a_line_break_in_another_argument_stays_inside_the_comment(tmp_path: Path,
                                                                    capsys, monkeypatch) -> None:
    import sys

    argv = ["slurm", JOB, "--nodes", "1", "--ntasks-per-node", "6", "--time", "30"]
    monkeypatch.setattr(sys, "argv", ["conduit-hpc", *argv, "--sbatch-note\necho injected"])
    assert cli.main(argv) == 0
    script = capsys.readouterr().out
    assert "\necho injected" not in script and "--sbatch-note\\necho injected" in script


@pytest.mark.parametrize("where", ["dir", "unmakeable"])
def test_an_output_that_cannot_be_written_is_named(where: str, tmp_path: Path,
                                                   capsys) -> None:
    out = str(tmp_path) if where == "dir" else "/proc/no-such-dir/job.sbatch"
    argv = ["slurm", JOB, "--nodes", "1", "--ntasks-per-node", "6", "-o", out]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"ConfigError: -o must be a file path that can be written, got {out!r}" in err
    assert "Traceback" not in err


def test_slurm_refuses_a_job_file_without_its_script(tmp_path: Path, capsys) -> None:
    job = tmp_path / "empty.toml"
    job.write_text("")  # a valid config (every default), but no empty.py beside it
    out = tmp_path / "job.sbatch"
    argv = ["slurm", str(job), "--nodes", "1", "--ntasks-per-node", "6", "-o", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"no job script {str(tmp_path / 'empty.py')!r}" in err and not out.exists()


@pytest.mark.parametrize("timeout", ["nan", "inf", "-5", "0"])
def test_a_run_timeout_that_would_never_or_at_once_end_the_wait_is_refused(
        timeout: str, tmp_path: Path, capsys) -> None:
    assert cli.main(["run", JOB, "--timeout", timeout, "--runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "ConfigError: --timeout must be a number of seconds > 0" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("top", ["-5", "0"])
def test_plan_top_below_one_is_refused(top: str, capsys) -> None:
    argv = ["plan", str(REPO / "jobs/cluster-local.toml"), "--top", top]
    assert cli.main(argv) == 2
    assert f"ConfigError: --top must be a number of rows >= 1, got {top}" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("args", "match"), [
    (["--learners", "-1"], "learners must be >= 0"),
    (["--emulate-nodes", "-3"], "emulate_nodes must be >= 0"),
    (["--out", "/proc/no-such-dir/cluster.toml"], "--out must be a file path in an existing"),
    # before: the probe took 1 learner instead, without a word
    (["-n", "3", "--learners", "5"], "--learners 5 does not fit -n 3"),
    (["-n", "4", "--learners", "3"], "use --learners 2 or fewer, or -n 5"),
    (["-n", "3", "--emulate-nodes", "10"], "--emulate-nodes 10 is more nodes than the -n 3"),
])
def test_probe_refuses_bad_values_before_launching(args: list[str], match: str,
                                                    capsys) -> None:
    assert cli.main(["probe", *args]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("where", ["run-dir", "shared-absolute", "being-written"])
def test_a_fresh_run_into_a_root_holding_checkpoints_is_refused(where: str, tmp_path: Path,
                                                                capsys) -> None:
    """Before: the fresh run's retention (keep = 2) deleted the earlier run's
    checkpoints once it had written two of its own."""
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    sets: list[str] = []
    if where == "shared-absolute":
        root = tmp_path / "shared"
        sets = ["--set", f'checkpoint.directory="{root}"']
    names = [".tmp-ckpt-000004-77"] if where == "being-written" else [
        "ckpt-000002", "ckpt-000003"]
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "DONE").write_text("{}")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    argv = ["run", JOB, "--run-dir", str(run_dir), "--launcher", "mpirun", *sets]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    given = root if where == "shared-absolute" else "checkpoints"
    assert (f"ConfigError: checkpoint.directory = '{given}': checkpoint root {root} "
            f"already holds {len(names)} checkpoint(s) of another run "
            f"({', '.join(names)})") in err, err
    assert "pass --resume" in err and "another --run-dir or checkpoint.directory" in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("under", [False, True])
def test_a_checkpoint_directory_that_is_a_file_is_refused(under: bool, tmp_path: Path,
                                                          capsys) -> None:
    """Before: accepted, and every rank failed later with FileExistsError."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    directory = precious / "sub" if under else precious
    argv = ["run", JOB, "--runs", str(tmp_path / "runs"), "--launcher", "mpirun",
            "--set", f'checkpoint.directory="{directory}"']
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    what = f"lies under the file {precious}" if under else "is a file"
    assert (f"ConfigError: checkpoint.directory = '{directory}': checkpoint root "
            f"{directory} {what}, not a directory") in err, err
    assert precious.read_text() == "keep me\n"
    assert not (tmp_path / "runs").exists()  # nothing made, nothing launched


@pytest.mark.parametrize("link", ["loop", "dangling", "under-loop"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_checkpoint_directory_behind_a_broken_link_is_refused(
        link: str, resume: bool, tmp_path: Path, capsys) -> None:
    """A checkpoint root that is (or lies under) a symbolic link leading nowhere - a loop
    or a dangling link - is refused before launch, naming the link. Before: accepted,
    and the first buffer rank alone failed at start with 'FileExistsError: File exists'
    when it made the root."""
    bad = tmp_path / "ckpt-link"
    bad.symlink_to(bad if link != "dangling" else tmp_path / "gone" / "away")
    directory = bad / "sub" if link == "under-loop" else bad
    argv = ["run", JOB, "--runs", str(tmp_path / "runs"), "--launcher", "mpirun",
            "--set", f'checkpoint.directory="{directory}"', *(["--resume"] if resume else [])]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    what = "lies under" if link == "under-loop" else "is"
    assert (f"ConfigError: checkpoint.directory = '{directory}': checkpoint root "
            f"{directory} {what} the symbolic link {bad}, which leads nowhere") in err, err
    assert not (tmp_path / "runs").exists()  # nothing made, nothing launched


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_resume_is_refused_not_a_fresh_start(value: str, tmp_path: Path,
                                                      capsys) -> None:
    """Before: ``--resume ""`` started a fresh run silently (the checkpoints it was
    meant to resume from then fell to its retention)."""
    argv = ["run", JOB, "--runs", str(tmp_path), "--launcher", "mpirun", "--resume", value]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert ("ConfigError: --resume must be given alone (the latest checkpoint) or with a "
            f"checkpoint path, got the empty value {value!r}") in err, err
    assert list(tmp_path.iterdir()) == []  # nothing made, nothing launched


@pytest.mark.parametrize("what", ["missing", "a-file"])
def test_a_resume_path_that_is_no_directory_is_refused_before_launch(
        what: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """Before: ``--resume /nonexistent`` made a run directory and started every rank,
    which then refused it together ('checkpoint /nonexistent does not exist or is not a
    directory', exit status 3)."""
    monkeypatch.setenv("CONDUIT_MPIRUN", "/bin/false")  # a missed check: exit 1 at once
    path = tmp_path / what
    if what == "a-file":
        path.write_text("not a checkpoint")
    runs = tmp_path / "runs"
    argv = ["run", JOB, "--runs", str(runs), "--launcher", "mpirun", "--resume", str(path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    why = "does not exist" if what == "missing" else "is not a directory"
    assert (f"ConfigError: --resume {str(path)!r} must be a checkpoint directory "
            f"(ckpt-NNNNNN) or a directory holding them; it {why}") in err, err
    assert not runs.exists()


def test_a_job_script_refuses_an_empty_resume(tmp_path: Path) -> None:
    """The same on the ranks, for a job script started without ``conduit-hpc run``:
    one error line, exit status 3, ``run`` never called."""
    script = ("import sys\nfrom conduit_hpc import Config\nfrom conduit_hpc.job import "
              "job_main\n\ndef run(cfg, run_dir, resume):\n    print('RAN', repr(resume))\n\n"
              "if __name__ == '__main__':\n    job_main(Config, run)\n")
    (tmp_path / "job.py").write_text(script)
    out = subprocess.run([sys.executable, str(tmp_path / "job.py"), "--config", JOB,
                          "--resume", ""], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 3 and "RAN" not in out.stdout, (out.stdout, out.stderr)
    assert ("conduit-hpc: error on world rank 0: ConfigError: --resume must be given alone"
            in out.stderr), out.stderr
    # (in tmp_path: without --run-dir its checkpoint root, whose .lock rank 0 takes, is
    # ./checkpoints)
    ok = subprocess.run([sys.executable, str(tmp_path / "job.py"), "--config", JOB,
                         "--resume"], capture_output=True, text=True, timeout=120,
                        check=False, cwd=tmp_path)
    assert ok.returncode == 0 and "RAN 'latest'" in ok.stdout, ok.stderr


@pytest.mark.parametrize("how", ["fresh", "resume", "no-checkpoints"])
def test_a_job_script_refuses_a_fresh_run_into_a_root_holding_checkpoints(
        how: str, tmp_path: Path) -> None:
    """``conduit-hpc run`` refuses this before launch; a job script started by hand
    (``mpirun python -m mpi4py job.py --run-dir D``) ran, and its retention deleted the
    earlier run's checkpoints. Now every rank refuses it (exit 3), unless it resumes or
    writes no checkpoints."""
    script = ("from conduit_hpc import Config\nfrom conduit_hpc.job import job_main\n\n"
              "def run(cfg, run_dir, resume):\n    print('RAN', repr(resume))\n\n"
              "if __name__ == '__main__':\n    job_main(Config, run)\n")
    (tmp_path / "job.py").write_text(script)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "ckpt-000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "ckpt-000002" / "DONE").write_text("{}")
    extra = {"fresh": [], "resume": ["--resume"],
             "no-checkpoints": ["--set", "checkpoint.on_stop=false", "--set",
                                "checkpoint.every_seconds=0"]}[how]
    out = subprocess.run([sys.executable, str(tmp_path / "job.py"), "--config", JOB,
                          "--run-dir", str(run_dir), *extra], capture_output=True,
                         text=True, timeout=120, check=False)
    logs = "".join(p.read_text() for p in sorted(run_dir.glob("logs/rank.0/*")))
    if how == "fresh":
        assert out.returncode == 3 and "RAN" not in logs, logs
        assert ("ConfigError: checkpoint.directory = 'checkpoints': checkpoint root "
                f"{run_dir / 'checkpoints'} already holds 1 checkpoint(s)") in logs, logs
    else:
        assert out.returncode == 0 and "RAN" in logs, logs
    assert (run_dir / "checkpoints" / "ckpt-000002" / "DONE").exists()


LONGHAUL = str(REPO / "jobs/longhaul_dqn.toml")


@pytest.mark.parametrize(("n", "sets", "match"), [
    (None, ["longhaul.edge_ranks=[9,2,3]"], "below the world size 5"),
    (None, ["longhaul.edge_ranks=[0,1,2]"], "must not hold the learner"),
    (7, ["layout.actors=0", "longhaul.edge_ranks=[2,3,4,5]"], r"\[6\] are missing"),
])
def test_a_long_link_that_does_not_fit_the_roles_is_refused_before_any_rank_starts(
        n: int | None, sets: list[str], match: str, tmp_path: Path, capsys) -> None:
    """What every rank's LinkSides.build would raise after mpirun started, said first."""
    import re

    argv = ["run", LONGHAUL, "--runs", str(tmp_path / "runs"), "--launcher", "mpirun",
            *(["-n", str(n)] if n else []), *(x for s in sets for x in ("--set", s))]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "ConfigError: longhaul.edge_ranks" in err and re.search(match, err), err
    assert not (tmp_path / "runs").exists()  # nothing made, nothing launched


def test_the_long_link_check_mirrors_the_ranks_own() -> None:
    from conduit_hpc.config import load
    from conduit_hpc.config.layout_rule import assign_roles
    from conduit_hpc.features.longhaul.topology import LinkSides

    for n in (5, 6, 8):
        for edge in ((), (2,), (2, 3, 4), (1, 2, 3, 4), (2, 3, 4, 5), (0, 3), (2, 3, 4, 7)):
            cfg = load(Config, LONGHAUL, [f"longhaul.edge_ranks={list(edge)}",
                                          "layout.actors=0"])
            got, _ = assign_roles(cfg.layout, (0,) * n)
            assert got is not None
            try:  # what the ranks raise
                LinkSides.build(cfg, world_size=n, actor_ranks=got.ranks("actor"),
                                buffer_ranks=got.ranks("buffer"),
                                learner_ranks=got.ranks("learner"))
                want = None
            except ConfigError as err:
                want = str(err)
            problem = ranks_problem(cfg, n)
            assert (None if problem is None else str(problem)) == want, (n, edge)


def test_a_cluster_file_the_ranks_could_not_load_is_refused_before_any_rank_starts(
        tmp_path: Path, capsys) -> None:
    bad = tmp_path / "cluster.toml"
    bad.write_text("[[nodes]]\nname = 3\n")
    # round_robin does not read it: a bad one was taken in silence (a typo in its path)
    for path, planner in ((tmp_path / "absent.toml", "static"), (bad, "static"),
                          (tmp_path / "absent.toml", "round_robin")):
        argv = ["run", JOB, "--runs", str(tmp_path / "runs"), "--launcher", "mpirun",
                "--set", f"placement.planner={planner!r}", "--set",
                f"placement.cluster={path}"]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert f"ConfigError: placement.cluster = {str(path)!r}: " in err, err
        assert not (tmp_path / "runs").exists()


def test_a_second_run_into_a_run_directory_in_use_is_refused(tmp_path: Path, capsys) -> None:
    """Two ``conduit-hpc run --run-dir D`` at once wrote the same logs and checkpoints
    (each one's retention deleting the other's). The launcher holds ``D/.lock`` while its
    job runs; a second is refused before anything is written, naming the holder."""
    import os

    from conduit_hpc.tools.rundir import lock_run_dir

    run_dir = tmp_path / "run"
    held = lock_run_dir(run_dir, tmp_path)  # what the first launcher holds
    try:
        for extra in ([], ["--resume"]):
            argv = ["run", JOB, "--run-dir", str(run_dir), "--launcher", "mpirun", *extra]
            assert cli.main(argv) == 2
            err = capsys.readouterr().err
            assert (f"run directory {str(run_dir)!r} is in use by another conduit-hpc run "
                    f"(pid {os.getpid()} on ") in err, err
            assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    finally:
        held.close()
    again = lock_run_dir(run_dir, tmp_path)  # free once its holder closed it (or died)
    again.close()


def test_a_second_run_into_a_checkpoint_root_in_use_is_refused(tmp_path: Path, capsys,
                                                               monkeypatch) -> None:
    """Two runs in different run directories naming one absolute checkpoint.directory
    took each other's checkpoint numbers, deleted each other's checkpoints being written
    (a leader prunes every temporary directory not its own) and pruned each other's
    complete ones. The launcher now holds ``ROOT/.lock`` too; a second run is refused
    before launch, naming the root and the holder, and the first run's checkpoints stay."""
    import os

    from conduit_hpc.config import Config
    from conduit_hpc.tools.rundir import lock_run_dir

    monkeypatch.setenv("CONDUIT_MPIRUN", "/bin/false")  # a missed check: exit 1 at once
    root = tmp_path / "shared-ckpts"
    sets = ["--set", f'checkpoint.directory="{root}"']
    cfg = Config.from_toml(JOB, sets[1::2])
    held = lock_run_dir(tmp_path / "first", tmp_path, cfg)  # the first run's launcher
    try:
        # fresh, while the first run has written nothing yet; then a resume, once it has
        for extra in ([], ["--resume"]):
            if extra:
                (root / "ckpt-000001").mkdir()
            argv = ["run", JOB, "--run-dir", str(tmp_path / "second"), "--launcher", "mpirun",
                    *sets, *extra]
            assert cli.main(argv) == 2
            err = capsys.readouterr().err
            assert (f"checkpoint root {str(root)!r} (checkpoint.directory) is in use by "
                    f"another conduit-hpc run (pid {os.getpid()} on ") in err, err
            assert sorted(p.name for p in root.iterdir()) == [".lock", *(
                ["ckpt-000001"] if extra else [])]
            assert not (tmp_path / "second" / "logs").exists()  # nothing launched
    finally:
        held.close()
    again = lock_run_dir(tmp_path / "second", tmp_path, cfg)  # free once the first ended
    again.close()


ALLOCATION_VARS = ("SLURM_JOB_ID", "PBS_NODEFILE", "LSB_HOSTS", "LSB_MCPU_HOSTS", "PE_HOSTFILE",
                   "OAR_NODEFILE", "COBALT_NODEFILE", "CONDUIT_MPI")


@pytest.mark.parametrize("argv", [
    ["probe", "-n", "99999"],
    ["info", "-n", "99999"],
    ["run", JOB, "-n", "100000", "--set", "layout.actors=0"],
    ["run", JOB, "--set", "layout.actors=1000000000"],
])
def test_more_ranks_than_this_machine_can_hold_are_refused_before_mpirun(
        argv: list[str], tmp_path: Path, capsys, monkeypatch) -> None:
    """With the wheel's MPI and no allocation or hostfile, mpirun starts every rank on
    this machine, oversubscribed: ``probe -n 99999`` started processes until the
    machine stood still (load 82, 1,000 of them before it was killed by hand)."""
    for var in ALLOCATION_VARS:
        monkeypatch.delenv(var, raising=False)
    assert cli.main([*argv, *(["--runs", str(tmp_path)] if argv[0] == "run" else [])]) == 2
    err = capsys.readouterr().err
    assert "mpirun would start all" in err and "ranks on this machine" in err, err
    assert "MiB a rank), more than its" in err and "run across nodes" in err
    assert list(tmp_path.iterdir()) == []


def test_where_ranks_may_go_elsewhere_their_count_is_left_to_the_launcher() -> None:
    """A batch allocation, a hostfile or the site's MPI: mpirun may place ranks on
    other machines, so only the allocation or the hostfile bounds them."""
    from conduit_hpc.tools.cli_support import RANK_FLOOR_BYTES, local_ranks_problem

    huge = 1 << 40
    assert local_ranks_problem(2, "-n", env={}) is None
    assert isinstance(local_ranks_problem(huge, "-n", env={}), ConfigError)
    memory = __import__("os").sysconf("SC_PAGE_SIZE") * __import__("os").sysconf(
        "SC_PHYS_PAGES")
    fits = memory // RANK_FLOOR_BYTES
    assert local_ranks_problem(fits, "-n", env={}) is None
    assert local_ranks_problem(fits + 1, "-n", env={}) is not None
    for env in ({"SLURM_JOB_ID": "7"}, {"PBS_NODEFILE": "/x"}, {"CONDUIT_MPI": "site"},
                {"PRTE_MCA_prte_default_hostfile": "/h"}, {"OMPI_MCA_orte_default_hostfile": "/h"}):
        assert local_ranks_problem(huge, "-n", env=env) is None, env
