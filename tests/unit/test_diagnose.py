"""The one message of a failed run: a rank's own error before another rank's consequence
of it (a collective whose peer died), decided by the error class."""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_hpc.config import Config
from conduit_hpc.tools.diagnose import first_error, rank_death


def write_logs(run: Path, logs: dict[int, str]) -> None:
    for rank, text in logs.items():
        d = run / "logs" / f"rank.{rank}"
        d.mkdir(parents=True)
        (d / "stderr").write_text(text)


def test_the_failing_ranks_error_is_reported_not_its_peers_collective_failure(
        tmp_path: Path) -> None:
    write_logs(tmp_path, {
        0: "conduit-hpc: error on world rank 0: CollectiveFailed: allreduce of 17,410 "
           "values on the gloo group of 2 ranks (this rank 0) failed: a peer failed\n",
        1: "conduit-hpc: error on world rank 1: ConduitError: injected failure\n"})
    msg = first_error(tmp_path)
    assert msg is not None and msg.startswith(
        "conduit-hpc: error on world rank 1: ConduitError: injected failure")


def test_a_peers_traceback_beats_a_collective_failure_and_alone_it_is_reported(
        tmp_path: Path) -> None:
    consequence = ("conduit-hpc: error on world rank 0: CollectiveFailed: broadcast of 10 "
                   "values from rank 0 failed\n")
    write_logs(tmp_path / "a", {0: consequence, 2: "Traceback (most recent call last):\n"
                                "  File \"x.py\", line 1\nRuntimeError: boom\n"})
    assert "on world rank 2: RuntimeError: boom" in str(first_error(tmp_path / "a"))
    write_logs(tmp_path / "b", {0: consequence, 1: "some warning\n"})
    assert str(first_error(tmp_path / "b")).startswith(consequence.strip())
    # a ConduitError that is not a RemoteFailure stays the first reported, by rank
    write_logs(tmp_path / "c", {0: "conduit-hpc: error on world rank 0: ConfigError: x\n",
                                1: "conduit-hpc: error on world rank 1: ConduitError: y\n"})
    assert "world rank 0: ConfigError: x" in str(first_error(tmp_path / "c"))


def test_a_rank_whose_wait_ran_out_is_reported_before_one_stopped_by_its_mark(
        tmp_path: Path) -> None:
    """A hung rank: the first to give up on the collective marks itself (so that a
    buffer in serve() ends too), and a lower rank then stops on that mark. The report
    was the lower rank's RemoteFailure ("world rank 1 left..."); it is the CollectiveFailed
    naming the step the job hung in."""
    gave_up = ("conduit-hpc: error on world rank 1: CollectiveFailed: waited 5.0 s for "
               "every rank of 4 to reach save_checkpoint(): every rank's part\n")
    write_logs(tmp_path, {0: "conduit-hpc: error on world rank 0: RemoteFailure: world "
                          "rank 1 left the data plane on an exception\n", 1: gave_up})
    assert str(first_error(tmp_path)).startswith(gave_up.strip())


def test_a_traceback_of_any_exception_class_is_reported(tmp_path: Path) -> None:
    """An exception whose class does not end in Error (gymnasium's NameNotFound, a
    KeyboardInterrupt) is still the message, not "job exited with status 1"."""
    write_logs(tmp_path, {1: "", 3: "A.L.E: banner\nTraceback (most recent call last):\n"
                          "  File \"x.py\", line 1, in <module>\n    make()\n"
                          "gymnasium.error.NameNotFound: Environment `NoSuchEnv` doesn't "
                          "exist.\n"})
    msg = str(first_error(tmp_path))
    assert "world rank 3: gymnasium.error.NameNotFound: Environment `NoSuchEnv`" in msg
    write_logs(tmp_path / "k", {0: "Traceback (most recent call last):\n  File \"y\"\n"
                                "KeyboardInterrupt\n"})
    assert "world rank 0: KeyboardInterrupt" in str(first_error(tmp_path / "k"))


def test_a_failed_job_on_a_full_file_system_is_told_so(tmp_path) -> None:
    """A run directory on a full file system (a quota, a small scratch): the job failed
    with status 1 and empty logs (its ranks could not write their errors), and the report
    said only "job exited with status 1; logs in ...". The note says the disk is full. A
    real full file system: a 64 kB tmpfs, filled (root, as the hosts tier)."""
    from extras import fill_up, small_tmpfs

    from conduit_hpc.tools.diagnose import disk_full_note

    assert disk_full_note(tmp_path) == ""  # space left: nothing to add
    assert disk_full_note(tmp_path / "gone") == ""  # cannot be asked: nothing either
    with small_tmpfs(tmp_path / "small", "64k") as mnt:
        run_dir = mnt / "runs" / "job-1"
        run_dir.mkdir(parents=True)
        fill_up(mnt / "fill")
        note = disk_full_note(run_dir)
        assert note.startswith("\nconduit-hpc: error: note: the file system of ")
        assert f"{run_dir} has 0 bytes free: the job may have failed on the full disk" in note


# what prterun (Open MPI 5) wrote to launcher.log when a rank called os._exit(0) /
# os._exit(1) mid-run (captured from tests/launch/jobs/fail_one_rank.py, fail.how)
_PRTE_EXIT0 = """--------------------------------------------------------------------------
prterun has exited due to process rank 1 with PID 16669 on node vm exiting
improperly. There are three reasons this could occur:

1. this process did not call "init" before exiting, but others in the
job did.
--------------------------------------------------------------------------
"""
_PRTE_EXIT1 = """--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-17854@1,2]
   Exit code:    1
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize(("text", "says"), [
    (_PRTE_EXIT0, "world rank 1 (buffer) on host vm exited with status 0 while the job ran"),
    (_PRTE_EXIT1, "world rank 2 (actor) exited with status 1 while the job ran"),
    ("srun: error: vm: task 0: Exited with exit code 7\n",
     "world rank 0 (learner) on host vm exited with status 7 while the job ran"),
])
def test_a_rank_that_exited_without_a_report_is_named_with_its_role(
        tmp_path: Path, text: str, says: str) -> None:
    """Before: a rank that left by os._exit (no traceback, no error line) made `conduit-hpc
    run` say only "job exited with status 1; logs in ...": which rank, of which role, and
    that it exited rather than failed, was in the launcher's log alone."""
    write_logs(tmp_path, {0: "", 1: "", 2: "", 3: ""})
    (tmp_path / "logs" / "launcher.log").write_text(text)
    cfg = Config.from_dict({"layout": {"learners": 1, "buffers": 1, "actors": 2},
                            "spec": {"x": {"dtype": "float32"}}})
    assert first_error(tmp_path) is None
    msg = str(rank_death(tmp_path, cfg))
    assert msg.startswith(f"conduit-hpc: error: {says}"), msg
    assert "without reporting an error (os._exit" in msg
    rank = says.split()[2]
    assert str(tmp_path / "logs" / f"rank.{rank}") in msg


def test_a_rank_that_lost_its_peer_says_so_and_names_the_other_hosts(tmp_path: Path) -> None:
    """Every rank of one host killed (kill -9; tests/hosts/test_link_faults.py does it): a
    rank on the other host whose TCP connection broke aborts first, and `conduit-hpc run`
    said only "job exited with status 14" - it now says that a rank lost its connection,
    that the one named is the one that noticed, and which ranks the other hosts held."""
    write_logs(tmp_path, {0: "", 1: "", 2: "", 3: ""})
    (tmp_path / "logs" / "launcher.log").write_text(
        "[host0:00000] *** An error occurred in Socket closed\n"
        "[host0:00000] *** reported by process [2113994753,2]\n"
        "[host0:00000] *** on a NULL communicator\n"
        "-" * 74 + "\nprterun has exited due to process rank 2 with PID 29932 on node host0 "
        "calling\n\"abort\". This may have caused other processes in the application to be\n"
        "terminated by signals sent by prterun (as reported here).\n")
    (tmp_path / "plan.json").write_text(
        '{"nodes": [{"host": "host0", "node": 0, "ranks": [0, 2]},'
        ' {"host": "host1", "node": 1, "ranks": [1, 3]}]}')
    cfg = Config.from_dict({"layout": {"learners": 1, "buffers": 1, "actors": 2},
                            "spec": {"x": {"dtype": "float32"}}})
    assert first_error(tmp_path) is None
    msg = str(rank_death(tmp_path, cfg))
    assert msg.startswith("conduit-hpc: error: world rank 2 (actor) on host host0 lost its "
                          "connection to another rank"), msg
    assert "(the other hosts' ranks: host1: world ranks 1, 3)" in msg, msg
