"""End-to-end checkpoints: SIGTERM -> final checkpoint and exit 0; SIGKILL while writing
-> --resume continues from the previous complete checkpoint; inspect on good and damaged
checkpoints; the benchmark's smoke size. Every subprocess has a timeout."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from extras import fill_up, small_tmpfs

from conduit_hpc import checkpoint as ck
from conduit_hpc.testing import REPO
from conduit_hpc.tools.launcher import mpi_env

SMALL = ["--set", "storage.capacity_rows=20000", "--set", "synthetic.actor_rate_rows_s=20000"]


class Proc:
    """A subprocess in its own session whose stdout lines are collected as they come."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.p = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True,
                                  env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line)

    def wait_line(self, fragment: str, timeout_s: float = 120) -> str:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                # ended, and every line it wrote is in the queue (the reader met EOF):
                # the process's exit alone does not say that the reader has read them
                if not self.reader.is_alive() and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if fragment in line:
                return line
        self.kill()
        raise AssertionError(f"no line with {fragment!r}; got {self.seen!r}")

    def finish(self, timeout_s: float = 180) -> tuple[int, str, str]:
        try:
            rc = self.p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        # the reader puts the last lines after the exit: wait until it met EOF (bounded:
        # an orphaned rank that holds the pipe would keep it reading)
        self.reader.join(timeout=30)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        assert self.p.stderr is not None
        return rc, "".join(self.seen), self.p.stderr.read()

    def kill(self) -> None:
        """SIGKILL every process of the session and of its descendants' sessions
        (mpirun puts ranks in groups of their own, and ``conduit-hpc run`` starts mpirun
        in a session of its own, so killing the process group is not enough)."""
        kill_tree(self.p.pid)
        self.p.wait(timeout=30)

    def children(self) -> list[int]:
        """The launcher's MPI launcher process(es) (mpirun / prterun / srun): not any
        short-lived helper an import may spawn while the job file is loaded."""
        out = []
        for pid, (ppid, _) in processes().items():
            if ppid != self.p.pid:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if Path(cmd.decode(errors="replace")).name in ("mpirun", "prterun", "srun"):
                out.append(pid)
        return out


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(stat.parent.name)] = (int(fields[1]), int(fields[3]))  # state ppid pgrp sid
    return out


def kill_tree(root: int, *sessions_too: int) -> None:
    """SIGKILL ``root``, its descendants, everything in their sessions and in
    ``sessions_too`` (e.g. an orphaned mpirun's, once ``root`` is gone)."""
    procs = processes()
    tree, sessions = {root}, {root, *sessions_too}
    grown = True
    while grown:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in tree} - tree
        tree |= more
        sessions |= {procs[pid][1] for pid in more}
        grown = bool(more)
    for pid, (_, sid) in procs.items():
        if pid in tree or sid in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


# SIGTERM in `make test`; SIGINT (~12 s, the same stop path) in `make launch-slow` (.ci/run)
@pytest.mark.parametrize("sig", [signal.SIGTERM,
                                 pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGINT"])
def test_sigterm_writes_a_final_checkpoint_and_exits_0(tmp_path: Path, sig) -> None:
    # SIGINT is Ctrl-C (before: a KeyboardInterrupt traceback, rc 130, no checkpoint)
    job = Proc([sys.executable, "-m", "conduit_hpc.tools.cli", "run", "jobs/synthetic.toml",
                "--runs", str(tmp_path), "--set", "run.duration_s=300", "--set",
                "checkpoint.every_seconds=0.0", *SMALL])
    job.wait_line("running: checkpoints under")
    time.sleep(1.0)  # actors ingest meanwhile
    job.p.send_signal(sig)
    rc, out, err = job.finish()
    assert rc == 0, err
    assert f"{sig.name} received; asking the ranks to stop" in err
    assert "asking every rank to stop and checkpoint" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    final = next(ln for ln in out.splitlines() if ln.startswith("final checkpoint written:"))
    path = Path(final.split(": ", 1)[1].split(" (")[0])
    assert path.parent.parent.parent == tmp_path and (path / ck.DONE).exists()
    c = ck.open_checkpoint(path)
    c.verify()
    assert c.rows > 0
    assert set(c.rng) == set(range(6))  # every rank's RNG state


def test_sigterm_while_the_ranks_start_is_held_then_honoured(tmp_path: Path) -> None:
    # SIGUSR1's default action kills a rank that has not installed its handler yet
    # (exit 138): the launcher holds the request until every rank is up
    job = Proc([sys.executable, "-m", "conduit_hpc.tools.cli", "run", "jobs/synthetic.toml",
                "--runs", str(tmp_path), "--set", "run.duration_s=300", *SMALL])
    # once the launcher has started mpirun (its handlers are set by then), the ranks are
    # still importing for seconds: that is when the request comes
    end = time.monotonic() + 60
    while not job.children():
        assert time.monotonic() < end and job.p.poll() is None, "mpirun never started"
        time.sleep(0.01)
    job.p.send_signal(signal.SIGTERM)
    rc, out, err = job.finish()
    assert rc == 0, err
    assert "stop request while the ranks start" in err
    assert "stopped early: stop requested" in out
    assert any(ln.startswith("final checkpoint written:") for ln in out.splitlines()), out


def test_a_killed_launcher_takes_mpirun_and_the_ranks_with_it(tmp_path: Path) -> None:
    # mpirun runs in a session of its own: without the parent-death signal, a SIGKILLed
    # `conduit-hpc run` would leave the job running for its whole duration
    job = Proc([sys.executable, "-m", "conduit_hpc.tools.cli", "run", "jobs/synthetic.toml",
                "--runs", str(tmp_path), "--set", "run.duration_s=300", *SMALL])
    sid = 0
    try:
        job.wait_line("running: checkpoints under")
        (launcher,) = job.children()
        sid = processes()[launcher][1]
        assert sid != os.getsid(job.p.pid)  # its own session (why this matters)
        ranks = [pid for pid, (ppid, _) in processes().items() if ppid == launcher]
        assert len(ranks) == 6
        job.p.kill()
        job.p.wait(timeout=30)
        end = time.monotonic() + 60
        while left := [pid for pid, (_, s) in processes().items() if s == sid]:
            assert time.monotonic() < end, f"still running 60 s after the launcher died: {left}"
            time.sleep(0.1)
    finally:
        kill_tree(job.p.pid, *([sid] if sid else []))


@pytest.mark.slow  # ~14 s: `make launch-slow` (.ci/run), not `make test`
def test_killed_while_writing_resumes_from_the_previous_complete_checkpoint(
        tmp_path: Path) -> None:
    first = tmp_path / "synthetic-first"
    root = first / "checkpoints"
    env = mpi_env({**os.environ, "CONDUIT_CHECKPOINT_STALL_S": "3"})  # a wide window
    job = Proc(["mpirun", "-n", "6", sys.executable, "-m", "mpi4py", "jobs/synthetic.py",
                "--config", "jobs/synthetic.toml", "--run-dir", str(first), "--set",
                "run.duration_s=300", "--set", "checkpoint.every_seconds=0.5", *SMALL], env=env)
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end:  # one complete checkpoint, the next being written
            done = [p for p in ck.list_checkpoints(root) if ck.is_complete(p)]
            writing = list(root.glob(".tmp-ckpt-*")) if root.is_dir() else []
            if done and writing:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the job never had a checkpoint complete and one in flight")
    finally:
        job.kill()  # SIGKILL: nothing gets to clean up
    complete = [p for p in ck.list_checkpoints(root) if ck.is_complete(p)]
    assert list(root.glob(".tmp-ckpt-*")), "the kill did not hit a checkpoint being written"
    previous = complete[-1]
    rows = ck.open_checkpoint(previous).rows
    out = cli("run", "jobs/synthetic.toml", "--runs", str(tmp_path), "--resume", "--set",
              "run.duration_s=1", *SMALL, timeout=180)
    assert out.returncode == 0, out.stderr
    assert f"resumed from {previous} (checkpoint {ck.seq_of(previous)}): {rows:,} rows" \
        in out.stdout, out.stdout
    # the new run numbers its checkpoints on from the restored one
    second = next(p for p in tmp_path.iterdir() if p != first)
    later = ck.list_checkpoints(second / "checkpoints")
    assert later and all((ck.seq_of(p) or 0) > ck.seq_of(previous) for p in later)


def make_checkpoint(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    out = subprocess.run(["mpirun", "-n", "3", sys.executable, "-m", "mpi4py",
                          "jobs/synthetic.py", "--config", "jobs/synthetic.toml", "--run-dir",
                          str(run), "--set", "run.duration_s=1.5", "--set", "layout.actors=1",
                          "--set", "checkpoint.every_seconds=0.5", *SMALL], cwd=REPO,
                         env=mpi_env(), capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    done = [p for p in ck.list_checkpoints(run / "checkpoints") if ck.is_complete(p)]
    assert done, out.stdout
    return done[-1]


def test_inspect_good_and_damaged_checkpoints(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path)
    good = cli("inspect", str(path), "--verify")
    assert good.returncode == 0, good.stderr
    assert "[verified: every dataset matches its checksum]" in good.stdout
    for fragment in ("spec         obs: float32[4], action: int64[], reward: float32[]",
                     "prio min", "capacity_rows = 20000", "rank 1 (buffer)"):
        assert fragment in good.stdout
    report = json.loads(cli("inspect", str(path), "--json").stdout)
    assert report["ok"] and report["rows"] == sum(s["rows"] for s in report["shards"]) > 0
    # a flipped byte in the experience: only --verify reads it
    import h5py

    f = path / "buffer-0000.h5"
    with h5py.File(f, "r") as h:
        off = h["/shards/0/columns/obs"].id.get_offset()
    with open(f, "r+b") as fh:
        fh.seek(off + 3)
        b = fh.read(1)
        fh.seek(off + 3)
        fh.write(bytes([b[0] ^ 0x10]))
    assert cli("inspect", str(path)).returncode == 0
    bad = cli("inspect", str(path), "--verify")
    assert bad.returncode == 1
    assert "REFUSED" in bad.stdout
    assert "buffer-0000.h5: dataset /shards/0/columns/obs fails its checksum" in bad.stderr
    (path / ck.DONE).unlink()
    gone = cli("inspect", str(path))
    assert gone.returncode == 1 and "no DONE marker" in gone.stderr


def test_resume_past_a_damaged_checkpoint_keeps_the_good_one(tmp_path: Path) -> None:
    """The CLI end to end: a resume falls back past a damaged newest checkpoint, marks it
    damaged, and the new run's retention (keep = 2) keeps the good one it resumed from
    (before: it deleted the good one and kept the damaged one, listed as complete)."""
    newest = make_checkpoint(tmp_path)
    run = tmp_path / "run"
    with open(newest / "buffer-0000.h5", "r+b") as fh:  # damage in the data region
        import h5py

        with h5py.File(newest / "buffer-0000.h5", "r") as h:
            off = h["/shards/0/columns/obs"].id.get_offset()
        fh.seek(off)
        b = fh.read(64)
        fh.seek(off)
        fh.write(bytes(x ^ 0xFF for x in b))
    good = [p for p in ck.list_checkpoints(run / "checkpoints") if p != newest][-1]
    out = cli("run", "jobs/synthetic.toml", "--run-dir", str(run), "--resume", "--set",
              "run.duration_s=1", "--set", "layout.actors=1", "--set",
              "checkpoint.every_seconds=0.4", *SMALL, timeout=180)  # one or two new
    assert out.returncode == 0, out.stderr
    assert f"resumed from {good} " in out.stdout, out.stdout
    assert f"(marked damaged: {newest / ck.DAMAGED})" in out.stdout, out.stdout
    left = ck.list_checkpoints(run / "checkpoints")
    new = [p for p in left if (ck.seq_of(p) or 0) > (ck.seq_of(newest) or 0)]
    assert new and newest in left, left  # the damaged one is kept as evidence
    # keep = 2 counts the good ones only: the one resumed from stays until two newer
    assert [p for p in left if p != newest] == [good, *new][-2:], left
    assert ck.damage_of(newest) and "fails its checksum" in str(ck.damage_of(newest))
    listing = cli("inspect", str(run))
    assert f"DAMAGED     {newest}" in listing.stdout, listing.stdout


def test_a_job_whose_every_checkpoint_failed_ends_with_an_error(tmp_path: Path) -> None:
    """Periodic checkpoints onto a full file system (a quota, a small scratch; here a
    real filled 64 kB tmpfs): each failure was one warning and the job exited 0, so the
    user learned that the run could not be resumed only at the next preemption. The job
    now ends with one line of what was written and failed, each failure in one line (not
    HDF5's multi-line message), and exit status 3 naming the first failure."""
    with small_tmpfs(tmp_path / "small", "64k") as mnt:
        # the root's lock (the launcher holds ROOT/.lock) is made before the disk fills,
        # so that it can be rewritten in its own page: a root with no room even for it is
        # refused before launch (below)
        (mnt / "ck").mkdir()
        (mnt / "ck" / ".lock").write_text("x" * 100)
        fill_up(mnt / "fill")
        r = cli("run", "jobs/synthetic.toml", "--runs", str(tmp_path / "runs"),
                "--set", "run.duration_s=4", "--set", "checkpoint.every_seconds=1.0",
                "--set", f'checkpoint.directory="{mnt / "ck"}"', *SMALL, timeout=240)
        (mnt / "ck" / ".lock").unlink()  # no room for a lock either: refused at once
        fill_up(mnt / "fill")  # the lock's page too
        full = cli("run", "jobs/synthetic.toml", "--runs", str(tmp_path / "runs"),
                   "--set", f'checkpoint.directory="{mnt / "ck"}"', *SMALL)
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr
    assert "cannot be made or written: No space left on device" in full.stderr, full.stderr
    text = r.stdout + r.stderr
    assert r.returncode == 3, text
    tally = next(ln for ln in r.stdout.splitlines() if ln.startswith("checkpoints: "))
    assert tally.startswith("checkpoints: 0 written, ") and " failed;" in tally, tally
    failures = [ln for ln in r.stdout.splitlines() if ln.startswith("checkpoint failed: ")]
    assert failures and len(failures) == int(tally.split(", ")[1].split()[0]), r.stdout
    assert all(ln.endswith("[Errno 28] No space left on device") for ln in failures), failures
    assert "every checkpoint this job attempted failed" in text
    assert "this run cannot be resumed" in text


def test_the_checkpoint_tally_names_what_was_written_and_what_failed() -> None:
    from conduit_hpc.errors import CheckpointError
    from conduit_hpc.features.checkpointing import CheckpointOutcome

    assert CheckpointOutcome().lines() == []  # none attempted: nothing to say, no error
    CheckpointOutcome().raise_if_none_written()
    some = CheckpointOutcome(written=["/c/ckpt-000002"], failed=["disk full"],
                             longest_cut_s=0.002)
    assert some.lines() == ["checkpoints: 1 written, 1 failed; longest cut (pause) 2.00 ms; "
                            "last /c/ckpt-000002", "checkpoint failed: disk full"]
    some.raise_if_none_written()  # one good checkpoint: resumable
    with pytest.raises(CheckpointError, match=r"\(2 of 2\).*first failure: a$"):
        CheckpointOutcome(failed=["a", "b"]).raise_if_none_written()
    # a long run's: the latest failures kept, every one counted
    many = CheckpointOutcome(failed=["c", "d"], failed_count=7)
    assert many.lines()[:2] == ["checkpoints: 0 written, 7 failed; longest cut (pause) 0.00 "
                                "ms; last -", "the latest 2 of 7 failures:"]
    with pytest.raises(CheckpointError, match=r"\(7 of 7\).*the earliest of the latest 2 "
                                              r"failures: c$"):
        many.raise_if_none_written()
