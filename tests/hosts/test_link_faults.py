"""Links that fail under a running job across hosts: every rank must end within its
bounds with an error naming the wait, never hang (docs/hosts.md, "Faults").

Every subprocess has a timeout, and every link a test takes down is brought back up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hosts_cluster import CLUSTER, Cluster, synthetic_job_on_2_hosts, wait_until_started

from conduit_hpc.testing import REPO

#: a rank's script: wait (outside MPI) until the test says go, then a bounded barrier of
#: the library's on the world - the first message between the hosts (a ``Dup`` before it
#: would be the first)
FIRST_CONTACT = """\
import json, os, socket, sys, time
from mpi4py import MPI
from conduit_hpc.errors import CollectiveFailed
from conduit_hpc.transport.objects import bounded_barrier
here = sys.argv[1]
comm = MPI.COMM_WORLD
open(f"{here}/ready.{comm.rank}", "w").close()
while not os.path.exists(f"{here}/go"):
    time.sleep(0.05)
t0 = time.monotonic()
try:
    bounded_barrier(comm, 3.0, "the first contact")
    got = "passed"
except CollectiveFailed as err:
    got = f"CollectiveFailed: {err}"
with open(f"{here}/result.{comm.rank}", "w") as f:
    json.dump({"host": socket.gethostname(), "got": got,
               "took_s": time.monotonic() - t0}, f)
os._exit(0)  # not MPI_Finalize: it would wait for the unreachable host
"""


@contextmanager
def link_down(cluster: Cluster, host: str) -> Iterator[None]:
    """``host``'s link to the switch goes down (its port on the bridge): packets between
    it and the other hosts vanish, in both directions, without an error to either end."""
    port = f"p{host.removeprefix('host')}"
    got = cluster.sh("exec", "switch", "ip", "link", "set", port, "down")
    assert got.returncode == 0, got.stderr
    try:
        yield
    finally:
        cluster.sh("exec", "switch", "ip", "link", "set", port, "up")


def _wait_for(paths: list[Path], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(p.exists() for p in paths):
            return True
        time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen[str], marker: str) -> str:
    """End the mpirun (its process group) and wait until no process whose command line
    holds ``marker`` is left (the ranks on the far host go when their daemon hears of it,
    once the link is back); returns mpirun's output."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    end = time.monotonic() + 30
    while time.monotonic() < end and _processes_with(marker):
        time.sleep(0.2)
    for pid in _processes_with(marker):
        os.kill(int(pid), signal.SIGKILL)
    return out


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def test_link_down_before_the_first_contact_ends_in_the_bound(cluster: Cluster,
                                                              tmp_path: Path) -> None:
    """host1's link drops after MPI_Init but before any message between the hosts: the
    library's bounded barrier (the data plane constructor's first step) gives up within
    its 3 s on host0. It used to hang there for ever: left lazy, Open MPI's first message
    to a peer asks the PMIx server for the peer's address, which waits with no limit for
    the far host's daemon - inside the "non-blocking" Ibarrier, where no deadline of ours
    could run (the launcher's whole budget, hours for a long job, ended it). The job's
    environment (mpi_env.sh) now has every peer wired up inside MPI_Init."""
    script = tmp_path / "first_contact.py"
    script.write_text(FIRST_CONTACT)
    hostfile = cluster.hostfile(2, 1)  # rank 0 on host0, rank 1 on host1
    proc = subprocess.Popen([str(CLUSTER), "mpirun", "--hostfile", str(hostfile), "-n", "2",
                             "python", str(script), str(tmp_path)], env=cluster.env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    out = ""
    try:
        ready = _wait_for([tmp_path / "ready.0", tmp_path / "ready.1"], 60)
        assert ready, "the ranks never started"
        with link_down(cluster, "host1"):
            (tmp_path / "go").touch()
            # bounded by the barrier's 3 s; 60 s is the test's patience, not a timing
            ended = _wait_for([tmp_path / "result.0"], 60)
    finally:
        out = _stop(proc, str(script))
    assert ended, f"rank 0 (host0) never came back from its bounded barrier: {out[-2000:]}"
    got = json.loads((tmp_path / "result.0").read_text())
    assert got["host"] == "host0"
    assert got["got"].startswith("CollectiveFailed: waited 3.0 s for every rank of 2 to "
                                 "reach the first contact"), got


def test_every_rank_of_a_host_killed_ends_the_job_naming_that_host(cluster: Cluster,
                                                                   tmp_path: Path) -> None:
    """kill -9 of every rank on host1 (the buffer and an actor) under `conduit-hpc run`:
    the job ends at once, and its one message points at host1. Open MPI names the first
    rank to report: mostly a rank on host0 whose TCP connection broke ("Socket closed",
    3 runs of 3), for which the launcher said only "job exited with status 14"; it now
    says a rank lost its connection and lists the other hosts' ranks (from plan.json)."""
    env, cmd = synthetic_job_on_2_hosts(cluster, tmp_path, timeout=240, duration_s=120,
                                        timeout_s=5)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until_started(proc, tmp_path)
        run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
        host1 = os.readlink(f"/proc/{(cluster.state / 'host1.pid').read_text().strip()}"
                            f"/ns/net")
        victims = [pid for pid in _processes_with(str(run_dir)) if _in_netns(pid, host1)
                   and os.path.basename(_argv0(pid)).startswith("python")]
        assert len(victims) == 2, victims  # world ranks 1 and 3
        for pid in victims:
            os.kill(int(pid), signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode not in (0, 124), err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, err[-3000:]
    named = (re.search(r"world rank [13] \(\w+\) on host host1 was killed by signal 9",
                       errors[0])
             or ("lost its connection to another rank" in errors[0]
                 and "(the other hosts' ranks: host1: world ranks 1, 3)" in errors[0]))
    assert named, errors[0]
    left = _processes_with(str(run_dir))
    assert not left, f"processes of the job left behind: {left}"


def _in_netns(pid: str, netns: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == netns
    except OSError:
        return False


def _argv0(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def test_two_hosts_with_one_hostname_are_refused_on_every_rank(cluster: Cluster,
                                                               tmp_path: Path) -> None:
    """host1 renamed host0 (two nodes with one hostname: a cloned image): Open MPI takes
    them for one node and its blocking collectives then chose different algorithms on
    different ranks (coll han on one, tuned on the others) and waited for each other for
    ever - the constructor's config all-gather hung until the launcher's budget (2 runs
    of 2). Each rank now sends its hostname and machine (boot id, /dev/shm's file system)
    with the config digest, bounded, and every rank refuses a hostname of 2 machines."""
    env, cmd = synthetic_job_on_2_hosts(cluster, tmp_path, timeout=90, duration_s=5,
                                        timeout_s=10)
    renamed = cluster.sh("exec", "host1", "hostname", "host0")
    assert renamed.returncode == 0, renamed.stderr
    try:
        out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                             timeout=150, check=False)
    finally:
        cluster.sh("exec", "host1", "hostname", "host1")
    assert cluster.sh("exec", "host1", "hostname").stdout.strip() == "host1"
    assert out.returncode not in (0, 124), out.stderr[-3000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("conduit-hpc: error")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert ("ConfigError: hostname 'host0' is shared by 2 machines (world ranks by machine: "
            "[[0, 2], [1, 3]])") in errors[0], errors[0]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    said = [(run_dir / "logs" / f"rank.{r}" / "stderr").read_text() for r in range(4)]
    assert all("is shared by 2 machines" in s for s in said), said  # every rank, together
