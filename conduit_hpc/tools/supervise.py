"""Watching a launched job from the launcher's process (:mod:`conduit_hpc.tools.launcher`):
signals forwarded to the ranks, the launcher's death taking ``mpirun`` with it, a rank's
reported error, stopping the process group, and the ranks' logs followed on the terminal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conduit_hpc.job import ERROR_PREFIX

__all__ = ["Follower", "Forwarder", "parent_death_signal", "rank_reported_error", "stop_group"]


#: signals of which a second one stops the ranks at once (SIGUSR1 only ever asks)
_HARD = (signal.SIGTERM, signal.SIGINT)


def _name(sig: int) -> str:
    return signal.Signals(sig).name


class Forwarder:
    """While the launcher waits: the first SIGTERM/SIGINT/SIGUSR1 (SLURM's preemption
    warning, ``kill``, Ctrl-C) becomes SIGUSR1 to the ranks - a stop request, after which
    they write a final checkpoint (``mpirun`` itself would kill them within a fraction
    of a second of a SIGTERM) - and the wait is extended by ``grace_s``; a second
    SIGTERM or SIGINT stops them. A request that comes while the ranks start is held
    until ``ready()`` (every rank has installed its handler), since SIGUSR1 would kill
    a rank before that."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: Callable[[], bool] = lambda: True
        self.held = False
        self.pending: list[int] = []
        self.forwarded = False
        self.grace_s = 60.0
        self.at: float | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Forwarder:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set in the main thread
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            self._old[sig] = signal.signal(sig, lambda s, f: self.pending.append(s))
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def act(self) -> None:
        if self.pending and self.proc is not None and not self.forwarded and not self.ready():
            if sum(map(self.pending.count, _HARD)) >= 2:
                print(f"{ERROR_PREFIX}: second {_name(self.pending[-1])}; stopping the ranks",
                      file=sys.stderr)
                stop_group(self.proc)
            elif not self.held:
                print("conduit-hpc: stop request while the ranks start; passing it on once "
                      "every rank is up", file=sys.stderr, flush=True)
                self.held = True
                self.at = self.at or time.monotonic()
            return
        while self.pending and self.proc is not None:
            sig = self.pending.pop(0)
            if sig in _HARD and self.forwarded:
                print(f"{ERROR_PREFIX}: second {_name(sig)}; stopping the ranks",
                      file=sys.stderr)
                stop_group(self.proc)
                return
            name = _name(sig)
            print(f"conduit-hpc: {name} received; asking the ranks to stop (SIGUSR1): "
                  f"asking every rank to stop and checkpoint", file=sys.stderr, flush=True)
            self.forwarded = True
            self.at = self.at or time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGUSR1)

    def extend(self, deadline: float) -> float:
        """The wait's deadline, extended by ``grace_s`` after a forwarded stop."""
        return deadline if self.at is None else max(deadline, self.at + self.grace_s)


def parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` for the launcher's child: SIGTERM it when ``conduit-hpc run``
    dies (even by SIGKILL), so that no orphaned mpirun keeps the ranks running - they
    are in a session of their own and no terminal or process-group signal reaches them.
    Linux only (``None`` elsewhere). ``prctl`` is looked up here, in the parent, so the
    child between fork and exec only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig, sig = 1, int(signal.SIGTERM)
    return lambda: prctl(pr_set_pdeathsig, sig)


def rank_reported_error(logs: Path) -> bool:
    """Whether a rank wrote its ``conduit-hpc: error`` line (``rank.N/stderr``)."""
    for f in logs.glob("rank.*/stderr"):
        try:
            with open(f, "rb") as fh:
                if ERROR_PREFIX.encode() in fh.read():
                    return True
        except OSError:
            continue
    return False


def stop_group(proc: subprocess.Popen[bytes], term_wait_s: float = 10.0) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=term_wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Follower:
    """Copies what rank 0 writes to stdout onto ours while the job runs."""

    def __init__(self, run_dir: Path, quiet: bool) -> None:
        self.run_dir, self.quiet, self.pos, self.last = run_dir, quiet, 0, "\n"

    def finish(self) -> None:
        if self.last != "\n":
            sys.stdout.write("\n")
            sys.stdout.flush()

    def pump(self) -> None:
        if self.quiet:
            return
        f = _rank_log(self.run_dir, 0, "stdout")
        if f is None:
            return
        with open(f, "rb") as fh:
            fh.seek(self.pos)
            chunk = fh.read()
        if chunk:
            self.pos += len(chunk)
            text = chunk.decode(errors="replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            self.last = text[-1]


def _rank_log(run_dir: Path, rank: int, name: str) -> Path | None:
    f = run_dir / "logs" / f"rank.{rank}" / name
    return f if f.exists() else None
