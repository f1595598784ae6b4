"""End-to-end: the CLI starts real ranks with mpirun (every subprocess has a timeout)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conduit_hpc.testing import REPO


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _assert_ended(run_dir, rc: int, why: str) -> None:
    """The launcher recorded how the job ended (``exit.json``) and ``report`` says it:
    a failed run's directory held nothing that said it failed."""
    from conduit_hpc.tools.report.run import write_report

    doc = json.loads((run_dir / "exit.json").read_text())
    assert doc["exit_status"] == rc and doc["ok"] == (rc == 0) and why in doc["why"], doc
    md = write_report([run_dir], run_dir / "report").read_text()
    assert ("| ok |" if rc == 0 else f"| failed (exit {rc}) |") in md, md
    assert (f"the job failed (exit {rc}): " in md) == (rc != 0), md


def test_synthetic_job_runs_and_reports_ingest(tmp_path) -> None:
    import importlib.util

    tensorboard = importlib.util.find_spec("tensorboard") is not None  # the extra
    out = cli("run", "jobs/synthetic.toml", "--runs", str(tmp_path),
              "--set", "run.duration_s=1.0",
              *(["--set", "run.tensorboard=true"] if tensorboard else []))
    assert out.returncode == 0, out.stderr
    assert "ingested" in out.stdout and "rows/s" in out.stdout
    # four actors each reported a non-zero row count
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("│") and "│" in ln[1:]]
    counts = [int(r.split("│")[2].strip().replace(",", "")) for r in rows]
    assert len(counts) == 4 and all(c > 0 for c in counts)
    run_dir = next(tmp_path.iterdir())
    assert (run_dir / "config.toml").exists() and (run_dir / "logs").is_dir()
    _assert_ended(run_dir, 0, "")
    # progress under mpirun: plain lines of the lead learner, whole, with the budget
    progress = [ln for ln in out.stdout.splitlines() if "[progress " in ln]
    assert progress and all(ln.startswith("[progress ") for ln in progress), out.stdout
    assert any("learner" in ln and "supersteps" in ln and "ETA" in ln for ln in progress)
    if tensorboard:  # every learner and actor wrote scalars that TensorBoard reads
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        logs = sorted(p.name for p in (run_dir / "tensorboard").iterdir())
        assert logs == ["actor-2", "actor-3", "actor-4", "actor-5", "learner-0"], logs
        acc = EventAccumulator(str(run_dir / "tensorboard" / "learner-0"))
        acc.Reload()
        assert len(acc.Scalars("latency/exposed_s")) > 0


def test_the_synthetic_jobs_ingest_rates_are_over_the_actors_span(tmp_path) -> None:
    """The job printed each actor's rows/s and the overall rate over the job's wall time
    (start-up, the learner's tail and teardown: 16 s for 2 s of ingest at 2,000 rows/s,
    so '250' and '500 rows/s overall' where summary.json said 4,029). Now each over the
    time its rows took: a rate times the actor's time in its CSV is at least its rows."""
    import csv
    import json
    import re

    out = cli("run", "jobs/synthetic.toml", "--runs", str(tmp_path), "--set",
              "run.duration_s=1.0", "--set", "layout.actors=2", "--set",
              "synthetic.actor_rate_rows_s=2000", "--set", "checkpoint.every_seconds=0")
    assert out.returncode == 0, out.stderr
    run_dir = next(tmp_path.iterdir())
    summary = json.loads((run_dir / "metrics" / "summary.json").read_text())
    rows = [ln.split("│")[1:-1] for ln in out.stdout.splitlines()
            if ln.startswith("│") and "│" in ln[1:]]
    assert len(rows) == 2, out.stdout
    for cells in rows:
        rank, n, rate = (int(c.strip().replace(",", "")) for c in (cells[0], cells[1],
                                                                     cells[4]))
        with open(run_dir / "metrics" / f"actor-{rank}.csv", newline="") as f:
            span = float(list(csv.DictReader(f))[-1]["time_s"])
        assert n > 0 and rate * span * 1.01 >= n, (rank, n, rate, span, out.stdout)
    m = re.search(r"ingested ([\d,]+) rows .* at ([\d,]+) rows/s overall", out.stdout)
    assert m, out.stdout
    n, rate = (int(g.replace(",", "")) for g in m.groups())
    assert n == summary["rows_ingested"]
    assert rate * summary["ingest_span_s"] * 1.01 >= n, (rate, summary, out.stdout)
    # summary.json has what the job printed: the shards' rows, the checkpoints' tally
    m = re.search(r"committed ([\d,]+), held ([\d,]+)", out.stdout)
    assert m, out.stdout
    assert (summary["rows_committed"], summary["rows_held"]) == tuple(
        int(g.replace(",", "")) for g in m.groups()) == (n, n)
    assert summary["capacity_rows"] == 200_000 and summary["dropped_updates"] == 0
    assert (summary["checkpoints_written"], summary["checkpoints_failed"]) == (0, 0)


def test_info_prints_mpi_roles_and_nodes() -> None:
    out = cli("info", "-n", "3")
    assert out.returncode == 0, out.stderr
    assert "Open MPI" in out.stdout
    assert "thread level  : multiple" in out.stdout
    assert "world size    : 3" in out.stdout
    assert out.stdout.count("learner") == 1 and out.stdout.count("buffer") == 1
    assert "shares memory among world ranks [0, 1, 2]" in out.stdout


@pytest.mark.parametrize("args", [(), ("-n", "0")])
def test_info_without_a_rank_count_launches_the_two_its_layout_needs(args) -> None:
    """Before: ``info`` and ``info -n 0`` ran in this one process and failed with
    WorldTooSmall (its layout needs a buffer and an actor)."""
    out = cli("info", *args)
    assert out.returncode == 0, out.stderr
    assert "world size    : 2" in out.stdout and "WorldTooSmall" not in out.stderr
    assert out.stdout.count("buffer") == 1 and out.stdout.count("actor") == 1


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--set", "synthetic.batch_rows=0"], ["ConfigError", "synthetic.batch_rows", "> 0"]),
        (["-n", "4"], ["WorldTooSmall", "-n 4 is too few", "needs 6 ranks"]),
    ],
)
def test_failing_job_is_one_message_and_nonzero(tmp_path, args, fragments) -> None:
    out = cli("run", "jobs/synthetic.toml", "--runs", str(tmp_path), *args)
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    for f in fragments:
        assert f in errors[0]


@pytest.mark.parametrize("mode", ["edp", "sync", "service"])
def test_synthetic_job_in_each_mode_writes_metrics(tmp_path, mode: str) -> None:
    import csv

    out = cli("run", "jobs/synthetic.toml", "--runs", str(tmp_path), "--mode", mode,
              "--set", "synthetic.supersteps=60", "--set", "layout.actors=2")
    assert out.returncode == 0, out.stderr
    assert f"learner 0 ({mode}): 60 supersteps" in out.stdout
    run_dir = next(tmp_path.iterdir())
    with open(run_dir / "metrics" / "learner-0.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 60 and {r["mode"] for r in rows} == {mode}
    assert all(float(r["exposed_s"]) >= 0 and int(r["rows"]) == 256 for r in rows)
    assert (run_dir / "metrics" / "summary.json").exists()
    assert list((run_dir / "metrics").glob("actor-*.csv"))


def test_a_rank_raising_midway_ends_the_job_with_one_message(tmp_path) -> None:
    # the other ranks are mid-collective or waiting; they must not hang (cli() has a
    # timeout) and the one message is the injected error, not a DataPlaneTimeout
    out = cli("run", "tests/launch/jobs/raise_midway.toml", "--runs", str(tmp_path))
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    assert "world rank 0" in errors[0] and "injected failure at superstep 20" in errors[0]


def test_ranks_that_never_started_are_a_failure_even_when_the_launcher_says_0(
        tmp_path, capsys) -> None:
    # what srun does after a PMIx set-up failure ("task launch failed", exit 0): the
    # entry below keeps the contract on paper but exits 0 before it becomes a rank of
    # the job (no logs/rank.N); the pre-launch check of the entry is off to get there
    from conduit_hpc.tools.launcher import launch

    noop = tmp_path / "noop.py"
    noop.write_text("print('noop: leaving early')\nraise SystemExit(0)\n"
                    "if __name__ == '__main__':\n    job_main(Config, run)\n")
    rc, run_dir = launch(REPO / "jobs/synthetic.toml", nranks=3,
                         overrides=["layout.actors=1"], entry=noop,
                         runs_root=tmp_path / "runs", quiet=True, timeout_s=120,
                         check_entry=False)
    assert rc == 1
    err = capsys.readouterr().err
    assert "exited 0 but rank(s) 0, 1, 2 of 3 never started: no rank reached job_main" in err
    assert str(run_dir / "logs" / "launcher.log") in err
    assert "last lines of launcher.log:" in err and "| noop: leaving early" in err, err
    assert len([ln for ln in err.splitlines() if ln.startswith("conduit-hpc: error")]) == 1
    doc = json.loads((run_dir / "exit.json").read_text())
    assert doc["exit_status"] == 1 and "never started" in doc["why"], doc


def test_a_script_without_job_main_is_named_as_the_cause_not_the_filesystem(
        tmp_path, capsys) -> None:
    # a job written from the README's API alone: it ran (here: printed) on every rank
    # but never called job_main, so no rank wrote logs/rank.N
    from conduit_hpc.tools.launcher import launch

    script = tmp_path / "no_main.py"
    script.write_text("def run(cfg, run_dir, resume):\n    pass\n\nprint('no_main ran')\n")
    rc, _ = launch(REPO / "jobs/synthetic.toml", nranks=3,
                   overrides=["layout.actors=1"], entry=script,
                   runs_root=tmp_path / "runs", quiet=True, timeout_s=120, check_entry=False)
    assert rc == 1
    err = capsys.readouterr().err
    assert "ended without calling job_main, so no rank wrote logs/rank.N" in err, err
    assert "docs/writing-a-job.md" in err and "shared" not in err
    assert "| no_main ran" in err


_PLAIN_JOB = """[run]\nname = "plain"\n\n[layout]\nlearners = 1\nbuffers = 1\nactors = 1\n
[spec.obs]\ndtype = "float32"\n"""


@pytest.mark.parametrize(
    ("case", "args", "fragments"),
    [
        ("too few ranks", ["jobs/synthetic.toml", "-n", "4"],
         ["WorldTooSmall: -n 4 is too few: [layout] needs 6 ranks", "use -n 6"]),
        ("too many ranks", ["jobs/synthetic.toml", "-n", "8"],
         ["ConfigError: -n 8 is more than the 6 ranks [layout] uses", "use -n 6",
          "--set layout.actors=0"]),
        ("bad value", ["jobs/synthetic.toml", "--set", "storage.capacity_rows=-1"],
         ["storage.capacity_rows must be > 0, got -1"]),
        ("unknown --set key", ["jobs/synthetic.toml", "--set", "synthetic.batch_rowz=3"],
         ["synthetic.batch_rowz"]),
        ("missing config file", ["jobs/synthetc.toml"], ["jobs/synthetc.toml"]),
        ("missing job script", ["{job}/plain.toml"], ["no job script", "plain.py",
                                                      "the .py beside it"]),
        ("script without job_main", ["{job}/plain.toml", "--entry", "{job}/no_main.py"],
         ["never calls job_main", "job_main(MyConfig, run)", "docs/writing-a-job.md"]),
        ("script without run", ["{job}/plain.toml", "--entry", "{job}/no_run.py"],
         ["defines no run(cfg, run_dir, resume)"]),
        # before: "never calls job_main" (it does; the file does not parse)
        ("script that does not parse", ["{job}/plain.toml", "--entry", "{job}/syn.py"],
         ["the job script", "syn.py' is not valid Python: '(' was never closed (line 3)"]),
        # before: checked against the script beside the TOML (which declares the
        # [synthetic] section), launched, and every rank failed on the unknown key
        ("entry declaring another config", ["jobs/synthetic.toml", "--entry",
                                            "{job}/plain_entry.py"],
         ["unknown key 'synthetic'", "plain_entry.py' declares JOB_CONFIG = Config, which "
                                     "has no such section"]),
    ],
)
def test_mistakes_are_refused_before_launch_without_a_run_directory(
        tmp_path, case, args, fragments) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "plain.toml").write_text(_PLAIN_JOB)
    (job / "no_main.py").write_text("def run(cfg, run_dir, resume):\n    pass\n")
    (job / "no_run.py").write_text("from conduit_hpc import Config\n"
                                   "from conduit_hpc.job import job_main\n\n"
                                   "if __name__ == '__main__':\n"
                                   "    job_main(Config, print)\n")
    (job / "syn.py").write_text("from conduit_hpc.job import job_main\n"
                                "def run(c, r, s): pass\nx = (\n"
                                "if __name__ == '__main__':\n    job_main(None, run)\n")
    (job / "plain_entry.py").write_text("from conduit_hpc import Config\n"
                                        "from conduit_hpc.job import job_main\n"
                                        "JOB_CONFIG = Config\ndef run(c, r, s): pass\n"
                                        "if __name__ == '__main__':\n"
                                        "    job_main(Config, run)\n")
    runs = tmp_path / "runs"
    out = cli("run", *[a.format(job=job) for a in args], "--runs", str(runs), timeout=60)
    assert out.returncode == 2, (case, out.stderr)
    assert out.stderr.startswith("conduit-hpc: error"), (case, out.stderr)
    assert len(out.stderr.strip().splitlines()) == 1, (case, out.stderr)
    for f in fragments:
        assert f in out.stderr, (case, f, out.stderr)
    assert not runs.exists() or not list(runs.iterdir()), case


@pytest.mark.parametrize(
    ("args", "fragment", "traceback"),
    [([], "RuntimeError: deliberate failure on world rank 2", True),
     (["--set", "fail.conduit_error=true"], "DataPlaneTimeout: deliberate timeout", False)],
)
def test_an_exception_on_one_rank_is_one_message_not_a_hang(tmp_path, args, fragment,
                                                            traceback) -> None:
    out = cli("run", "tests/launch/jobs/fail_one_rank.toml", "-n", "4", "--runs", str(tmp_path),
              *args, timeout=120)
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    assert f"on world rank 2: {fragment}" in errors[0]
    assert "Traceback" not in out.stderr
    # what the rank wrote is kept in its own log (mpirun makes a file per rank that wrote)
    run_dir = next(tmp_path.iterdir())
    logs = {p.parent.name: p.read_text() for p in run_dir.glob("logs/**/rank.*/stderr")}
    assert fragment.split(":")[0] in logs["rank.2"]
    assert ("Traceback" in logs["rank.2"]) == traceback


def test_a_killed_rank_is_named_with_its_role_host_signal_and_log(tmp_path) -> None:
    out = cli("run", "tests/launch/jobs/fail_one_rank.toml", "-n", "4", "--runs", str(tmp_path),
              "--set", "fail.rank=1", "--set", "fail.kill=true", timeout=120)
    assert out.returncode != 0
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    assert "world rank 1 (buffer) on host " in errors[0], errors[0]
    assert "killed by signal 9 (SIGKILL)" in errors[0], errors[0]
    assert "rank.1" in errors[0] and "launcher.log" in errors[0]
    assert "Traceback" not in out.stderr
    _assert_ended(next(tmp_path.iterdir()), out.returncode, "killed by signal 9 (SIGKILL)")


@pytest.mark.slow  # ~15 s each: `make launch-slow` (.ci/run), not `make test`
@pytest.mark.parametrize(("how", "rank", "says"), [
    ("exit0", "1", ("world rank 1 (buffer) ", "exited with status 0 while the job ran")),
    ("exit1", "0", ("world rank 0 (learner) ", "exited with status 1 while the job ran")),
])
def test_a_rank_that_calls_os_exit_is_named_with_its_role(tmp_path, how, rank,
                                                          says) -> None:
    # a rank of a running data plane leaves by os._exit (no traceback, no error line):
    # the job ends (mpirun sees it leave without finalizing), and the one message once
    # said only "job exited with status 1; logs in ..."
    out = cli("run", "tests/launch/jobs/fail_one_rank.toml", "-n", "4", "--runs", str(tmp_path),
              "--timeout", "100", "--set", "fail.phase=start", "--set", f"fail.how={how}",
              "--set", f"fail.rank={rank}", timeout=150)
    assert out.returncode not in (0, 124), out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    assert all(part in errors[0] for part in says), errors[0]
    assert "without reporting an error (os._exit" in errors[0] and f"rank.{rank}" in errors[0]


def test_srun_outside_an_allocation_is_refused(tmp_path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "run",
                          "jobs/synthetic.toml", "--launcher", "srun", "--runs", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 2
    assert "launcher 'srun' needs a SLURM allocation" in out.stderr


def test_slurm_renders_and_refuses_impossible_layouts(tmp_path) -> None:
    out = cli("slurm", "jobs/synthetic.toml", "--nodes", "2", "--set", "layout.per_node=true",
              "--set", "layout.actors=0", "--ntasks-per-node", "4", "-o", str(tmp_path / "j.sh"))
    assert out.returncode == 0, out.stderr
    assert subprocess.run(["bash", "-n", str(tmp_path / "j.sh")], timeout=30,
                          check=False).returncode == 0
    assert "#SBATCH --gpus-per-node=1" in (tmp_path / "j.sh").read_text()
    bad = cli("slurm", "jobs/synthetic.toml", "--nodes", "1", "--ntasks-per-node", "2",
              "--set", "layout.actors=0")
    assert bad.returncode == 2
    assert bad.stderr.startswith("conduit-hpc: error: ConfigError: --nodes 1 x "
                                 "--ntasks-per-node 2 = 2 tasks")
    assert "more roles than tasks" in bad.stderr


@pytest.mark.parametrize(("n", "emulate", "says"), [
    ("3", 9, "ConfigError: layout.emulate_nodes = 9, but the world has 3 ranks"),
    ("3", 2, "WorldTooSmall: -n 3 is too few: [layout] needs 6 ranks"),
])
def test_info_refuses_a_layout_that_does_not_fit_before_launching(tmp_path, n, emulate,
                                                                  says) -> None:
    # one line and status 2, as `run` says it (before: a traceback from every rank)
    toml = (REPO / "jobs" / "synthetic.toml").read_text().replace(
        "[layout]", f"[layout]\nemulate_nodes = {emulate}", 1)
    assert f"emulate_nodes = {emulate}" in toml
    (tmp_path / "job.toml").write_text(toml)
    (tmp_path / "job.py").write_text((REPO / "jobs" / "synthetic.py").read_text())
    out = cli("info", "-n", n, "--config", str(tmp_path / "job.toml"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith(f"conduit-hpc: error: {says}"), out.stderr
    assert "Traceback" not in out.stderr and "MPI_ABORT" not in out.stderr


def test_info_with_a_job_runs_the_ranks_of_its_layout() -> None:
    # no -n: the job's [layout] (1 learner, 1 buffer, 4 actors), job section included
    out = cli("info", "--config", "jobs/synthetic.toml")
    assert out.returncode == 0, out.stderr
    assert "world size    : 6" in out.stdout
    assert out.stdout.count("actor") == 4 and out.stdout.count("learner") == 1


@pytest.mark.slow  # ~25 s: `make launch-slow` (.ci/run), not `make test`
@pytest.mark.parametrize(("phase", "step"), [("save", "save_checkpoint(): every rank's part"),
                                           ("restore", "the restore: every rank's read"),
                                           ("construct", "constructor (the learners' device)")])
def test_a_hung_rank_ends_the_others_within_run_timeout(
        tmp_path, phase: str, step: str) -> None:
    # world rank 2 (an actor) stops (SIGSTOP) while it writes (reads) its part of a
    # checkpoint (or the learner, in the constructor before its device is agreed); the
    # leader once waited for that part in a plain Gather, the other actor
    # in a plain Bcast (the others, in a plain Allreduce or Split), until the launcher's
    # budget (rc 124). Now every wait of save_checkpoint, of the restore and of the
    # constructor's device agreement and staging split is bounded by run.timeout_s (5 s;
    # those that cover a checkpoint's writes and reads by checkpoint.timeout_s, 5 s too):
    # the survivors end with the step they waited in.
    out = cli("run", "tests/launch/jobs/hang_in_save.toml", "--runs", str(tmp_path),
              "--timeout", "100", "--set", f"hang.phase={phase}",
              # constructing, world rank 0 is the learner and stops picking its device
              *(["--set", "layout.learners=1", "--set", "hang.rank=0"]
                if phase == "construct" else []))
    assert out.returncode not in (0, 124), out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    assert "CollectiveFailed" in errors[0] and step in errors[0], errors[0]
    if phase != "construct":  # the arrival board exists (the control block): named
        assert "world ranks 2 had not arrived" in errors[0], errors[0]


@pytest.mark.slow  # ~12 s each: `make launch-slow` (.ci/run), not `make test`
@pytest.mark.parametrize(("where", "step"), [
    ("roles", "constructor (the role split)"),
    ("communicators", "constructor (the role communicators)"),
    ("placement", "constructor (the placement)"),
    ("memory", "constructor (the memory)"),
    ("memory_check", "constructor (the memory check)"),
    ("window", "constructor (the shard window)"),
    ("room", "constructor (the shard window) (the room check)"),
    ("channel", "constructor (the channel)"),
])
def test_a_rank_stopped_before_a_constructor_step_ends_the_others(
        tmp_path, where: str, step: str) -> None:
    # world rank 2 (an actor) stops (SIGSTOP) just before one of the constructor's
    # collective steps (or inside its file-system calls); the others once waited in a
    # plain Dup, Split, Allgather or window allocation until the launcher's budget (rc
    # 124). Now each step is entered through a bounded Ibarrier (or is a bounded
    # Iallgather): the survivors end within run.timeout_s (5 s), naming the step.
    out = cli("run", "tests/launch/jobs/hang_in_save.toml", "--runs", str(tmp_path),
              "--timeout", "100", "--set", "hang.phase=construct",
              "--set", f"hang.step={where}")
    assert out.returncode not in (0, 124), out.stderr
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr
    assert "CollectiveFailed" in errors[0] and step in errors[0], errors[0]
