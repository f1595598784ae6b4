"""What ``conduit-hpc run`` says when a job fails: reading a run's logs afterwards.

:func:`first_error` (a rank's own report), :func:`rank_death` (a rank the launcher saw
die of a signal) and :func:`never_started` (a launcher that exited 0 while ranks never
reached ``job_main``) each turn ``RUN_DIR/logs`` into one ``conduit-hpc: error``
message. Local; no MPI.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path

from conduit_hpc import errors
from conduit_hpc.config import Config
from conduit_hpc.config.jobs import main_calls_job_main
from conduit_hpc.config.layout_rule import role_of_rank
from conduit_hpc.job import ERROR_PREFIX

__all__ = ["disk_full_note", "failed_start", "first_error", "never_started", "rank_death",
           "role_of"]


#: below this many free bytes, a failed job's file system counts as full
DISK_FULL_BYTES = 1 << 20


def disk_full_note(run_dir: Path) -> str:
    """A line for a failed job's report when its run directory's file system is full
    (free space below :data:`DISK_FULL_BYTES`: a quota, a small scratch): the failure may
    be the full disk itself, and the ranks' logs that would say so may be cut short or
    empty. "" otherwise, or when the file system cannot be asked."""
    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        return ""
    if free >= DISK_FULL_BYTES:
        return ""
    return (f"\n{ERROR_PREFIX}: note: the file system of {run_dir} has {free:,} bytes "
            f"free: the job may have failed on the full disk (or a quota), and its ranks' "
            f"logs, metrics and checkpoints may be cut short")


def never_started(which: str, missing: Sequence[int], n: int, entry: Path, logs: Path,
                  tail_lines: int = 10) -> str:
    """The report for a launcher that exited 0 while rank(s) ``missing`` wrote no
    ``logs/rank.N`` (every rank of a job writes it first thing, in ``job_main``): why -
    a job script that ends without ``job_main``, ranks whose logs this node cannot see,
    or ranks the launcher never started - then the last lines of ``launcher.log``."""
    shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
    head = f"{ERROR_PREFIX}: {which} exited 0 but rank(s) {shown} of {n} never started"
    log = logs / "launcher.log"
    try:
        contract = main_calls_job_main(entry.read_text(errors="replace"))
    except OSError:
        contract = True  # unreadable here: say nothing about its contents
    if not contract:
        why = (f": the job script {str(entry)!r} ran and ended without calling job_main, "
               f"so no rank wrote logs/rank.N; end it with `if __name__ == \"__main__\": "
               f"job_main(MyConfig, run)` (see docs/writing-a-job.md)")
    elif len(missing) < n:
        why = (f": ranks that started wrote {logs / 'rank.N'} but these did not, or wrote "
               f"them where this node cannot see them - the run directory must be on a "
               f"filesystem shared by every node")
    else:
        why = (": no rank reached job_main - the launcher did not start them (e.g. srun "
               "after a PMIx set-up failure), the script exited before job_main, or the "
               "run directory is not on a filesystem shared with the ranks' nodes")
    lines = [f"{head}{why}; see {log}"]
    text = log.read_text(errors="replace") if log.exists() else ""
    tail = [ln for ln in text.splitlines() if ln.strip()][-tail_lines:]
    if tail:
        lines.append(f"  last lines of {log.name}:")
        lines += [f"  | {ln}" for ln in tail]
    else:
        lines.append(f"  ({log.name} is empty)")
    return "\n".join(lines)


def failed_start(which: str, rc: int, logs: Path, tail_lines: int = 10) -> str:
    """The report for a launcher that failed before any rank wrote ``logs/rank.N``
    (srun outside a working SLURM allocation, mpirun unable to start): its exit status
    and the last lines of ``launcher.log``, which say why."""
    log = logs / "launcher.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    tail = [ln for ln in text.splitlines() if ln.strip()][-tail_lines:]
    lines = [f"{ERROR_PREFIX}: {which} exited with status {rc} before any rank started; "
             f"see {log}" + (" (empty)" if not tail else "")]
    if tail:
        lines.append(f"  last lines of {log.name}:")
        lines += [f"  | {ln}" for ln in tail]
    return "\n".join(lines)


# mpirun/prterun: "prterun noticed that process rank 3 with PID 417 on node vm exited on
# signal 9 (Killed)."; srun: "srun: error: vm: task 3: Killed"
_DEATH_MPIRUN = re.compile(r"noticed that process rank (\d+) with PID (\d+) on node (\S+)\s+"
                           r"exited on\s+signal (\d+)(?: \(([^)]*)\))?")
_DEATH_SRUN = re.compile(r"srun: error: (\S+): tasks? (\d+)[-\d,]*: (Killed|Terminated|"
                         r"Segmentation fault|Aborted|Bus error)")
# a rank that exited without an error report (``os._exit``, a native library's exit):
# prterun: "prterun has exited due to process rank 0 with PID 16669 on node vm exiting
# improperly" (status 0, MPI not finalized); "prterun detected that one or more processes
# exited with non-zero status ... Process name: [prterun-vm-17854@1,2]  Exit code: 1";
# srun: "srun: error: vm: task 2: Exited with exit code 1"
_EXIT_IMPROPER = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exiting\s+"
                            r"improperly")
_EXIT_NONZERO = re.compile(r"exited with non-zero status.*?Process name:\s*\[[^\]]*,(\d+)\]"
                           r"\s*Exit code:\s*(\d+)", re.S)
_EXIT_SRUN = re.compile(r"srun: error: (\S+): tasks? (\d+)[-\d,]*: Exited with exit code (\d+)")
# a rank whose TCP connection to another rank broke (that rank died, or its host or the
# link to it failed): Open MPI's "An error occurred in Socket closed", then prterun "has
# exited due to process rank 2 with PID 29932 on node host0 calling "abort"" - the rank
# that noticed, not the one that failed
_SOCKET_CLOSED = "An error occurred in Socket closed"
_ABORT_MPIRUN = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) calling\s+"
                           r"\"abort\"")


def role_of(cfg: Config, world_size: int, rank: int) -> str:
    """The role ``rank`` has under ``cfg``'s layout (``per_node`` layouts: by the ranks
    of one node, assuming the launcher fills nodes in order; "" if unknown): the rule of
    :func:`conduit_hpc.config.layout_rule.assign_roles`, delivery ranks included."""
    return role_of_rank(cfg.layout, cfg.scheduler.delivery, world_size, rank)


def rank_death(run_dir: Path, cfg: Config) -> str | None:
    """One message naming the rank that the launcher saw die of a signal, or exit without
    an error report (``os._exit``) - its role, world rank, host, the signal or status,
    and where its log is - or ``None``. (Used when no rank reported an error itself.)"""
    log = run_dir / "logs" / "launcher.log"
    if not log.exists():
        return None
    text = log.read_text(errors="replace")
    n = len(list((run_dir / "logs").glob("rank.*")))
    m = _DEATH_MPIRUN.search(text)
    if m is None and _SOCKET_CLOSED in text and (a := _ABORT_MPIRUN.search(text)):
        return _lost_peer(run_dir, cfg, n, int(a.group(1)), a.group(2), log)
    if m is None and (left := _rank_exit(text)) is not None:
        rank, host, status = left
        role = role_of(cfg, n, rank)
        who = f"world rank {rank}" + (f" ({role})" if role else "")
        return (f"{ERROR_PREFIX}: {who}{f' on host {host}' if host else ''} exited with "
                f"status {status} while the job ran, without reporting an error (os._exit, "
                f"or an exit in native code; MPI not finalized); its log: "
                f"{run_dir / 'logs' / f'rank.{rank}'}, the launcher's: {log}")
    if m is not None:
        rank, host, sig = int(m.group(1)), m.group(3), int(m.group(4))
    else:
        s = _DEATH_SRUN.search(text)
        if s is None:
            return None
        rank, host = int(s.group(2)), s.group(1)
        sig = {"Killed": signal.SIGKILL, "Terminated": signal.SIGTERM,
               "Segmentation fault": signal.SIGSEGV, "Aborted": signal.SIGABRT,
               "Bus error": signal.SIGBUS}[s.group(3)]
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    role = role_of(cfg, n, rank)
    who = f"world rank {rank}" + (f" ({role})" if role else "")
    return (f"{ERROR_PREFIX}: {who} on host {host} was killed by signal {sig} ({name}); "
            f"its log: {run_dir / 'logs' / f'rank.{rank}'}, the launcher's: {log}")


def _lost_peer(run_dir: Path, cfg: Config, n: int, rank: int, host: str, log: Path) -> str:
    """The report for a job that Open MPI ended because ``rank`` on ``host`` lost its
    connection to another rank: which ranks sit on the other hosts (from the run's
    ``plan.json``, where it was written), since one of them, or its host or link, failed
    and the launcher names only the rank that noticed."""
    role = role_of(cfg, n, rank)
    who = f"world rank {rank}" + (f" ({role})" if role else "")
    others = ""
    try:
        nodes = json.loads((run_dir / "plan.json").read_text())["nodes"]
        others = "; ".join(f"{nd['host']}: world ranks {', '.join(map(str, nd['ranks']))}"
                           for nd in nodes if nd["host"] != host)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return (f"{ERROR_PREFIX}: {who} on host {host} lost its connection to another rank "
            f"(Open MPI: 'Socket closed') and ended the job: a rank on another host died "
            f"(killed, out of memory) or that host or the link to it failed - the launcher "
            f"names the rank that noticed, not the one that failed"
            + (f" (the other hosts' ranks: {others})" if others else "")
            + f"; the failed rank's log ends without an error: {run_dir / 'logs'}, the "
            f"launcher's: {log}")


def _rank_exit(text: str) -> tuple[int, str, int] | None:
    """(world rank, host or "", exit status) of a rank that the launcher saw exit
    without an error report (see ``_EXIT_IMPROPER``), or ``None``."""
    if (m := _EXIT_IMPROPER.search(text)) is not None:
        return int(m.group(1)), m.group(2), 0
    if (m := _EXIT_NONZERO.search(text)) is not None:
        return int(m.group(1)), "", int(m.group(2))
    if (m := _EXIT_SRUN.search(text)) is not None:
        return int(m.group(2)), m.group(1), int(m.group(3))
    return None


def _is_consequence(line: str, kind: type[Exception] = errors.RemoteFailure) -> bool:
    """Whether a ``conduit-hpc: error on world rank N: TYPE: ...`` line reports a
    :class:`~conduit_hpc.errors.RemoteFailure` (this rank stopped because another
    failed; with ``kind``, that subclass), decided by the error's class, not its text."""
    m = re.match(r".*? on world rank \d+: (\w+): ", line)
    cls = getattr(errors, m.group(1), None) if m else None
    return isinstance(cls, type) and issubclass(cls, kind)


def exception_lines(text: str) -> list[str]:
    """The exception line (``module.Class: message``) ending each Python traceback in
    ``text``, whatever the class is called (``gymnasium.error.NameNotFound``,
    ``KeyboardInterrupt``...): the first unindented line after a traceback's frames."""
    out: list[str] = []
    inside = False
    for ln in text.splitlines():
        if ln.startswith("Traceback (most recent call last)"):
            inside = True
        elif inside and ln and not ln[0].isspace():
            if re.match(r"^[A-Za-z_][\w.]*(: |$)", ln):
                out.append(ln)
            inside = False
    return out


def first_error(run_dir: Path) -> str | None:
    """The first ``conduit-hpc: error`` line any rank wrote (one that is not a
    :class:`~conduit_hpc.errors.RemoteFailure` if there is one), or the last line of the
    first Python traceback (a rank's, else the launcher's), as one message; ``None`` if
    there is neither."""
    logs = sorted((run_dir / "logs").glob("rank.*/stderr"),
                  key=lambda p: int(p.parent.name.split(".")[1]))
    launcher = run_dir / "logs" / "launcher.log"
    reported = [line for f in logs for line in f.read_text(errors="replace").splitlines()
                if line.startswith(ERROR_PREFIX)]
    # a rank's own error before another's consequence of it (a collective whose peer died)
    own = [line for line in reported if not _is_consequence(line)]
    if own:
        return own[0] + f" (logs in {run_dir / 'logs'})"
    for f in [*logs, launcher] if launcher.exists() else logs:
        text = f.read_text(errors="replace")
        if "Traceback (most recent call last)" in text:
            tail = exception_lines(text)
            where = (f"world rank {f.parent.name.split('.')[1]}" if f.name == "stderr"
                     else "a rank")
            if tail:
                return (f"{ERROR_PREFIX} on {where}: {tail[-1]} "
                        f"(logs in {run_dir / 'logs'})")
    if reported:  # only consequences, and no traceback behind them: a rank whose own
        # wait ran out (CollectiveFailed, naming the step) before one that stopped on the
        # mark it then left (RemoteFailure pointing at it)
        gave_up = [ln for ln in reported if _is_consequence(ln, errors.CollectiveFailed)]
        return (gave_up or reported)[0] + f" (logs in {run_dir / 'logs'})"
    return None
