"""Starting the ranks: which launcher (:func:`choose_launcher`: ``mpirun``, or ``srun``
in a SLURM allocation), ``mpirun`` under a timeout (:func:`run_bounded`), and trying
again when Open MPI failed to start the launch (before any rank started).

Open MPI 5's launcher (``prterun``) sometimes exits before it starts any rank with "The
PMIx server's listener thread failed to start. We cannot continue." (a listener that
could not get an interface address, seen on a loaded machine and in other projects'
CI logs); the same launch a moment later runs. Such a launch is tried again, at most
:data:`START_RETRIES` more times after a pause of :data:`START_PAUSE_S`, with a note on
stderr - only when its output carries that message (:data:`START_FAILURES`) *and* no
rank ran (no rank's output or files): a job whose ranks ran is never started again
(that would run its training again). Nothing here imports MPI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TextIO, TypeVar

from conduit_hpc.errors import ConduitError

__all__ = ["LAUNCHERS", "START_FAILURES", "START_PAUSE_S", "START_RETRIES", "StartRetry",
           "choose_launcher", "run_bounded", "run_captured", "start_failed"]

#: what Open MPI's launcher prints when it gave up before starting any rank, for a
#: cause that a second try may not meet (matched with runs of white space as one space:
#: the message is wrapped)
START_FAILURES = ("The PMIx server's listener thread failed to start",)
#: tries after the first
START_RETRIES = 2
#: seconds between tries
START_PAUSE_S = 1.0
#: characters of a launch's output kept to look for :data:`START_FAILURES` in (its end)
_KEEP_CHARS = 64 << 10


R = TypeVar("R", int, "subprocess.CompletedProcess[Any]")  # a try's result (_tried)

#: what ``--launcher`` takes
LAUNCHERS = ("auto", "mpirun", "srun")


def _mpi_flavour() -> str:
    """``openmpi`` or ``mpich`` from the MPI library in this environment (no MPI import)."""
    lib = Path(sys.prefix, "lib")
    if (lib / "libmpi.so.40").exists():
        return "openmpi"
    if (lib / "libmpi.so.12").exists():
        return "mpich"
    return "unknown"


def _srun_mpi_plugins() -> str:
    try:
        out = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout + out.stderr


def choose_launcher(requested: str = "auto") -> tuple[str, str]:
    """Pick how to start ranks: ``(launcher, srun_mpi_plugin)``.

    ``auto`` (or ``$CONDUIT_LAUNCHER``) takes ``srun`` inside a SLURM allocation
    (``SLURM_JOB_ID`` set, ``srun`` on ``PATH``) when SLURM has the plugin this MPI needs
    (``pmix`` for the Open MPI wheel, ``pmi2`` for MPICH), and ``mpirun`` otherwise
    (which also works inside an allocation). ``$CONDUIT_SRUN_MPI`` names the plugin
    instead (a site's MPI). Not collective; may run ``srun --mpi=list``.

    Raises:
        ConduitError: an unknown launcher, or ``srun`` requested outside an allocation.
    """
    req = requested if requested != "auto" else os.environ.get("CONDUIT_LAUNCHER", "auto")
    req = req or "auto"
    if req not in LAUNCHERS:
        raise ConduitError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {req!r}")
    plugin = os.environ.get("CONDUIT_SRUN_MPI", "") or {
        "openmpi": "pmix", "mpich": "pmi2"}.get(_mpi_flavour(), "pmix")
    in_alloc = bool(os.environ.get("SLURM_JOB_ID")) and shutil.which("srun") is not None
    if req == "srun":
        if not in_alloc:
            raise ConduitError("launcher 'srun' needs a SLURM allocation (SLURM_JOB_ID is "
                               "not set or srun is not on PATH); use sbatch/salloc or "
                               "--launcher mpirun")
        return "srun", plugin
    if req == "mpirun" or not in_alloc:
        return "mpirun", ""
    return ("srun", plugin) if plugin in _srun_mpi_plugins() else ("mpirun", "")


def start_failed(rc: int, output: str, *, ranks_ran: bool) -> bool:
    """Whether a finished launch failed to start, such that another try is safe: it
    exited with a non-zero status, no rank ran (``ranks_ran``: any rank's output or
    files, as the caller knows them), and its output carries one of
    :data:`START_FAILURES`. Pure."""
    if rc == 0 or ranks_ran:
        return False
    flat = " ".join(output.split())
    return any(m in flat for m in START_FAILURES)


def _note(cmd: Sequence[str], tries: int, retries: int, pause_s: float) -> str:
    return (f"conduit-hpc: {Path(cmd[0]).name} failed to start the launch (Open MPI: "
            f"\"{START_FAILURES[0]}\"; no rank started); trying again in {pause_s:g} s "
            f"(retry {tries + 1} of {retries})")


class StartRetry:
    """The tries of a launch whose output goes to the open file ``log`` (written by the
    launcher through the same file description: each try's output follows the last).
    Call :meth:`mark` just before each try starts, and :meth:`again` when it ended.

    Args:
        cmd (Sequence[str]): the launch command (named in the note).
        log (TextIO): the log's handle, open for writing.
        retries (int): tries after the first, at most.
        pause_s (float): seconds between tries.
    """

    def __init__(self, cmd: Sequence[str], log: TextIO, *, retries: int = START_RETRIES,
                 pause_s: float = START_PAUSE_S) -> None:
        self.cmd, self.log, self.retries, self.pause_s = list(cmd), log, retries, pause_s
        self.tries = 0
        self._since = 0

    def mark(self) -> None:
        """Where the next try's output begins in the log."""
        self.log.flush()
        self._since = os.lseek(self.log.fileno(), 0, os.SEEK_CUR)

    def again(self, rc: int, *, ranks_ran: bool) -> bool:
        """Whether to start the launch again: :func:`start_failed` on this try's output
        (its last 64 kB), with fewer than ``retries`` tries so far. When so, says why
        on stderr and in the log, then pauses ``pause_s`` (its only wait)."""
        if self.tries >= self.retries or rc == 0 or ranks_ran:
            return False
        try:
            with open(self.log.name, "rb") as fh:
                fh.seek(max(self._since, fh.seek(0, 2) - _KEEP_CHARS))
                text = fh.read().decode(errors="replace")
        except (OSError, TypeError):  # (TypeError: a handle without a file name)
            return False
        if not start_failed(rc, text, ranks_ran=ranks_ran):
            return False
        note = _note(self.cmd, self.tries, self.retries, self.pause_s)
        print(note, file=sys.stderr, flush=True)
        self.log.write(note + "\n")
        self.log.flush()
        self.tries += 1
        time.sleep(self.pause_s)
        return True


def run_bounded(cmd: list[str], env: dict[str, str], timeout_s: float, *,
                retries: int = START_RETRIES, pause_s: float = START_PAUSE_S) -> int:
    """Run an MPI launch in its own session, its output copied to ours line by line;
    past ``timeout_s`` (all tries together) the whole session (the launcher and its
    ranks) is killed and a ConduitError names the command. A launch that failed to
    start (:func:`start_failed`; a rank ran when anything came on its stdout) is tried
    again, at most ``retries`` more times, ``pause_s`` apart. Blocks; returns the last
    try's exit status."""
    deadline = time.monotonic() + timeout_s
    return _tried(cmd, lambda: _run_once(cmd, env, deadline, timeout_s), retries, pause_s)


def _tried(cmd: Sequence[str], once: Callable[[], tuple[R, str, bool]], retries: int,
           pause_s: float) -> R:
    """``once()`` - a try giving (its result, the end of its output, whether a rank
    ran), the result's exit status its ``returncode`` or itself - until it did not fail
    to start (:func:`start_failed`) or ``retries`` more tries were made, ``pause_s``
    apart, each with a note on stderr. Returns the last try's result."""
    tries = 0
    while True:
        result, output, ranks_ran = once()
        rc = result if isinstance(result, int) else result.returncode
        if tries >= retries or not start_failed(rc, output, ranks_ran=ranks_ran):
            return result
        print(_note(cmd, tries, retries, pause_s), file=sys.stderr, flush=True)
        tries += 1
        time.sleep(pause_s)


def _run_once(cmd: list[str], env: dict[str, str], deadline: float,
              timeout_s: float) -> tuple[int, str, bool]:
    """One try of :func:`run_bounded`: ``(status, the end of its output, whether
    anything came on its stdout)``."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    kept: deque[str] = deque()
    said = {"stdout": False}
    pumps = [threading.Thread(target=_pump, args=(pipe, name, kept, said), daemon=True)
             for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
    for t in pumps:
        t.start()
    try:
        rc = proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise ConduitError(f"{' '.join(cmd[:3])} did not finish within {timeout_s:.0f} s "
                           f"and was stopped (too many ranks for this machine?)") from None
    except BaseException:
        _kill(proc)
        raise
    for t in pumps:  # (a rank left behind may hold a pipe open: bounded)
        t.join(timeout=10.0)
    return rc, "".join(kept), said["stdout"]


def _pump(pipe: IO[bytes] | None, name: str, kept: deque[str], said: dict[str, bool]) -> None:
    """Copy a child's pipe to our stream of that name line by line, keeping its end."""
    if pipe is None:
        return
    size = 0
    with pipe:
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace")
            if name == "stdout":
                said["stdout"] = True
            with contextlib.suppress(ValueError, OSError, AttributeError):  # (closed, None)
                out = getattr(sys, name)
                out.write(line)
                out.flush()
            kept.append(line)  # (deque appends are thread-safe)
            size += len(line)
            while size > _KEEP_CHARS and len(kept) > 1:
                size -= len(kept.popleft())


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def run_captured(cmd: list[str], *, env: Mapping[str, str], cwd: str | Path,
                 timeout_s: float, retries: int = START_RETRIES,
                 pause_s: float = START_PAUSE_S) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` of an MPI launch with its output captured and a timeout (each
    try), tried again as :func:`run_bounded` does (a rank ran when its stdout holds
    anything). Blocks; returns the last try's result."""
    def once() -> tuple[subprocess.CompletedProcess[str], str, bool]:
        out = subprocess.run(cmd, env=dict(env), cwd=cwd, capture_output=True, text=True,
                             timeout=timeout_s, check=False)
        return out, out.stdout + out.stderr, bool(out.stdout)

    return _tried(cmd, once, retries, pause_s)
