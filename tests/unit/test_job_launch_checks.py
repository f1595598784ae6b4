"""A job's own sections are checked against the world it is launched into before any
rank starts (``Config.check_launch``, called by ``conduit-hpc run``): sizes one rank
cannot hold, counts that must divide among the actors, batches no shard holds. Before,
each of these was accepted and failed only once mpirun had started every rank: a numpy
``MemoryError`` for ``synthetic.batch_rows = 10**13``, torch's "can't allocate" for
``synthetic.matmul_size = 10**6``, ``dqn.hidden = [10**9]`` swapped the node until the
launcher's budget ran out (exit 124 after 182 s), and ``dqn.num_envs = 7`` over 4 actors
or a batch larger than its shard were refused by the ranks. No MPI: a refusal happens
before ``mpirun``, which is ``/bin/false`` here so that a check that lets a value
through fails at once (exit 1) instead of launching a job."""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_hpc import ConfigError
from conduit_hpc.config import Config, LaunchWorld, LayoutConfig, declared_config
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli
from conduit_hpc.tools.launcher import ranks_problem

GB = 10**9
HUGE = str(10**7)  # widths, sides and rows no machine holds, far below 2**62 bytes


def load(job: str, *sets: str) -> Config:
    path = REPO / "jobs" / f"{job}.toml"
    cls, _ = declared_config(path)
    assert cls is not None
    return cls.from_toml(path, list(sets))


@pytest.mark.parametrize(("job", "sets", "message"), [
    ("synthetic", ["synthetic.batch_rows=10000000000000"],
     "synthetic.batch_rows must be <= 200000, the rows of the shards the actors write"),
    ("synthetic", ["synthetic.batch_rows=150000", "layout.buffers=2", "layout.actors=3"],
     "synthetic.batch_rows must be <= 100000, the rows of the shards the actors write "
     "(storage.capacity_rows = 200000 over 2 shards)"),
    ("synthetic", ["synthetic.batch_rows=2000", "scheduler.samples_per_insert=1",
                   "scheduler.error_buffer=100000"],
     "synthetic.batch_rows must be <= scheduler.max_insert_batch = 1024"),
    # the ranks refused it at start, on every rank (exit 3), after mpirun had started
    ("synthetic", ["storage.capacity_rows=100000000000"],
     "storage.capacity_rows = 100000000000 needs 1.08e+04 GB on each buffer rank "
     "(100,000,000,000 rows of 108 bytes: its share over 1 buffer rank(s))"),
    ("synthetic", [f"synthetic.matmul_size={HUGE}"],
     f"synthetic.matmul_size = {HUGE} needs 1.2e+06 GB on the learner"),
    ("dqn_cartpole", ["dqn.num_envs=7"],
     "dqn.num_envs must be a positive multiple of the number of actor ranks (4), got 7"),
    ("dqn_cartpole", [f"dqn.hidden=[{HUGE},{HUGE}]"],
     f"dqn.hidden = [{HUGE}, {HUGE}] needs 2e+06 GB on a learner (a Q network of at "
     f"least"),
    ("dqn_cartpole", ["layout.per_node=true", f"dqn.num_envs={HUGE}000"],
     f"dqn.num_envs = {HUGE}000 needs"),
    ("longhaul_dqn", [f"dqn.hidden=[{HUGE},{HUGE}]"], "dqn.hidden = "),
    ("longhaul_dqn", ["dqn.num_envs=7"],
     "dqn.num_envs must be a positive multiple of the number of actor ranks (2), got 7"),
    ("apex_atari", [f"dqn.hidden=[{HUGE},{HUGE}]"], "from 3136 inputs"),
    ("torchrl_dqn_cartpole", [f"torchrl.hidden=[{HUGE},{HUGE}]"],
     f"torchrl.hidden = [{HUGE}, {HUGE}] needs 2e+06 GB on a learner"),
    ("rllib_dqn_cartpole", [f"rllib.hidden=[{HUGE},{HUGE}]"],
     f"rllib.hidden = [{HUGE}, {HUGE}] needs 2e+06 GB on a learner"),
    ("apex_atari", ["dqn.num_envs=4"],
     "dqn.num_envs must be a positive multiple of the number of actor ranks (3), got 4"),
])
def test_a_job_size_the_ranks_would_fail_on_is_refused_before_launch(
        job: str, sets: list[str], message: str, tmp_path: Path, capsys,
        monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_MPIRUN", "/bin/false")  # a missed check: exit 1 at once
    argv = ["run", str(REPO / "jobs" / f"{job}.toml"), "--runs", str(tmp_path),
            "--launcher", "mpirun"]
    for s in sets:
        argv += ["--set", s]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("conduit-hpc: error: ConfigError: ") and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no run directory


def test_matmul_reps_is_bounded_by_the_work_of_a_superstep() -> None:
    """``synthetic.matmul_reps`` had no upper bound: 10**15 matmuls a superstep ran
    until the launcher's budget. At most an hour's work at 1 TFLOP/s, as compute_s."""
    load("synthetic", "synthetic.matmul_reps=800000000")  # 2 x 128^3 x 8e8 = 3.4e15
    with pytest.raises(ConfigError, match=r"synthetic\.matmul_reps must be at most 858,306,884 "
                                          r"with matmul_size = 128 .*got 1000000000000000"):
        load("synthetic", "synthetic.matmul_reps=1000000000000000")
    with pytest.raises(ConfigError, match=r"at most 3,515 with matmul_size = 8000"):
        load("synthetic", "synthetic.matmul_size=8000", "synthetic.matmul_reps=3516")


def test_a_size_is_refused_against_the_memory_given_and_taken_below_it() -> None:
    world = LaunchWorld(6, learners=1, buffers=1, actors=4, memory_bytes=GB)
    load("synthetic", "synthetic.matmul_size=8000").check_launch(world)  # 0.77 GB
    with pytest.raises(ConfigError, match=r"synthetic\.matmul_size = 10000 needs 1\.2 GB on "
                                          r"the learner .* more than the memory of this "
                                          r"machine \(a node of the job\): 1 GB") as got:
        load("synthetic", "synthetic.matmul_size=10000").check_launch(world)
    assert got.value.key == "synthetic.matmul_size"
    # the actors' pool: 4 batches of 28-byte rows, 8 bytes per element while drawn
    load("synthetic", "synthetic.batch_rows=200000").check_launch(world)
    with pytest.raises(ConfigError, match=r"synthetic\.batch_rows = 150000 needs 0\.0216 GB"):
        load("synthetic", "synthetic.batch_rows=150000",
             "storage.capacity_rows=150000").check_launch(  # 18.6 MB of replay
            LaunchWorld(6, learners=1, buffers=1, actors=4, memory_bytes=GB // 50))
    # without a known memory only the 64-bit bound applies
    load("dqn_cartpole", "dqn.hidden=[100000,100000]").check_launch(LaunchWorld(6))
    with pytest.raises(ConfigError, match=r"more than 2\*\*62 bytes"):
        load("dqn_cartpole", f"dqn.hidden=[{10**9},{10**9}]").check_launch(LaunchWorld(6))


@pytest.mark.parametrize("job", ["synthetic", "dqn_cartpole", "apex_atari", "longhaul_dqn",
                                 "example_gym", "torchrl_dqn_cartpole", "rllib_dqn_cartpole"])
def test_the_jobs_as_written_pass_on_a_small_machine(job: str) -> None:
    """No false refusal: each job's own layout on a 4 GB node."""
    cfg = load(job)
    lay = cfg.layout
    cfg.check_launch(LaunchWorld(lay.fixed_ranks, learners=lay.learners, buffers=lay.buffers,
                                 actors=lay.min_actors, memory_bytes=4 * GB))


def test_a_layout_of_a_billion_ranks_is_answered_at_once() -> None:
    """The rank-count check counted by building a tuple of the layout's ranks: with
    layout.actors = 10**9 (a typo), conduit-hpc run held the launcher (8 GB and more)
    until it was killed, before mpirun had started. It counts now."""
    huge = Config(layout=LayoutConfig(learners=1, buffers=1, actors=2_000_000_000))
    err = ranks_problem(huge, 2_000_000_000)
    assert err is not None and "-n 2000000000 is too few: [layout] needs 2000000002" in \
        str(err)
    assert ranks_problem(huge, 2_000_000_002) is None
    more = ranks_problem(Config(layout=LayoutConfig(actors=4)), 2_000_000_000)
    assert more is not None and "is more than the 6 ranks" in str(more)


@pytest.mark.parametrize(("sets", "message"), [
    (["dqn.num_envs=7"],
     "dqn.num_envs must be a positive multiple of the number of actor ranks (4), got 7"),
    ([f"dqn.hidden=[{10**9},{10**9}]"], "more than 2**62 bytes"),
])
def test_slurm_renders_no_script_whose_job_its_world_refuses(
        sets: list[str], message: str, tmp_path: Path, capsys) -> None:
    """The rendered job would have failed only once it left the queue (on the node,
    at conduit-hpc run's check). Counts and the 64-bit bound are checked at render; a
    node's memory is not the login node's, so memory is checked on the node."""
    out = tmp_path / "job.sbatch"
    argv = ["slurm", str(REPO / "jobs" / "dqn_cartpole.toml"), "--nodes", "1", "-o", str(out)]
    for s in sets:
        argv += ["--set", s]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    ok = ["slurm", str(REPO / "jobs" / "dqn_cartpole.toml"), "--nodes", "1", "-o", str(out),
          "--set", f"dqn.hidden=[{10**5},{10**5}]"]  # 200 GB: left to the node's check
    assert cli.main(ok) == 0 and out.is_file()


def test_a_frame_stack_replay_is_counted_at_the_bytes_it_stores() -> None:
    """apex_atari stores one 84 x 84 frame a row (7,160 bytes with the rest), not its two
    stacks of four (56 kB): a million rows fit a 32 GB node, ten million do not."""
    world = LaunchWorld(5, learners=1, buffers=1, actors=3, memory_bytes=32 * GB)
    load("apex_atari", "storage.capacity_rows=1000000").check_launch(world)
    with pytest.raises(ConfigError, match=r"storage\.capacity_rows = 10000000 needs 71\.6 GB "
                                          r"on each buffer rank \(10,000,000 rows of 7160 "
                                          r"bytes"):
        load("apex_atari", "storage.capacity_rows=10000000").check_launch(world)
    # over more buffer ranks each holds its share
    load("apex_atari", "storage.capacity_rows=10000000", "layout.buffers=3").check_launch(
        LaunchWorld(7, learners=1, buffers=3, actors=3, memory_bytes=32 * GB))


def test_a_job_check_that_breaks_is_one_error_line_not_a_traceback(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """A bug in a job's own check_launch is the job's code failing: one error line naming
    the class, before any rank starts."""
    (tmp_path / "job.toml").write_text((REPO / "jobs" / "example_gym.toml").read_text())
    (tmp_path / "job.py").write_text(
        (REPO / "jobs" / "example_gym.py").read_text().replace(
            "JOB_CONFIG = ExampleConfig",
            "ExampleConfig.check_launch = lambda self, world: 1 / 0\n"
            "JOB_CONFIG = ExampleConfig"))
    monkeypatch.setenv("CONDUIT_MPIRUN", "/bin/false")
    runs = tmp_path / "runs"
    assert cli.main(["run", str(tmp_path / "job.toml"), "--runs", str(runs),
                     "--launcher", "mpirun"]) == 2
    err = capsys.readouterr().err
    assert ("ConfigError: ExampleConfig.check_launch (the job's checks before launch) "
            "failed: ZeroDivisionError: division by zero") in err, err
    assert "Traceback" not in err and not runs.exists()
