"""Progress of a run: one line per role with the share of its budget spent, the rate and
the time left, drawn live with rich on a terminal and printed as plain periodic lines
otherwise (under mpirun or SLURM, where stdout is a log file).

One process draws the board (the lead learner: :class:`~conduit_hpc.plane.learner.
LearnerEndpoint` makes it when asked for a status); other ranks print nothing periodic.
A line's budget is a count (``total`` in ``unit``: supersteps, env steps), a time
(``time_s``), or both; its share is the larger of the two fractions spent. The run ends
at the first budget of any line, so the board shows one ETA, on its first line: the
earliest end it can foresee over all lines, with its reason (``ETA 2 min (actors: env
steps budget)``). An end it cannot foresee (a return target) is not in it.

Updating is cheap: :meth:`ProgressBoard.update` stores numbers and returns unless it is
time to draw (every 0.25 s on a terminal, every ``every_s`` seconds in a log); a note
given as a callable is evaluated only when drawn. Plain Python and rich; no MPI.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["ProgressBoard", "ProgressLine", "format_eta"]


def format_eta(seconds: float) -> str:
    """``"1 h 02 min"``, ``"3 min 20 s"``, ``"45 s"``; ``"-"`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


@dataclass
class ProgressLine:
    """One role's progress.

    Attributes:
        role (str): the line's label (``learner``, ``actors``, ...).
        done (float): units done so far.
        total (float): the count budget (0: none).
        unit (str): what ``done`` counts.
        time_s (float): the time budget in seconds (0: none).
        note (str | Callable[[], str]): more text, computed when drawn if callable.
        started (float): ``time.monotonic()`` at the first update.
    """

    role: str
    done: float = 0.0
    total: float = 0.0
    unit: str = ""
    time_s: float = 0.0
    note: str | Callable[[], str] = ""
    started: float = field(default_factory=time.monotonic)
    _recent: list[tuple[float, float]] = field(default_factory=list)

    def fraction(self, now: float) -> float:
        """The share of the budget spent (the larger of count and time), NaN without a
        budget."""
        parts = []
        if self.total > 0:
            parts.append(self.done / self.total)
        if self.time_s > 0:
            parts.append((now - self.started) / self.time_s)
        return min(1.0, max(parts)) if parts else math.nan

    def rate(self, now: float) -> float:
        """Units per second over the last ~30 s (since the start before that)."""
        self._recent.append((now, self.done))
        while len(self._recent) > 2 and now - self._recent[1][0] >= 30.0:
            self._recent.pop(0)
        t0, d0 = self._recent[0]
        if now - t0 < 1e-6:
            return math.nan
        return (self.done - d0) / (now - t0)

    def ends(self, now: float, rate: float) -> list[tuple[float, str]]:
        """(seconds left, reason) of each budget of this line whose end can be told."""
        out = []
        if self.total > 0 and rate > 0:
            out.append((max(0.0, self.total - self.done) / rate,
                        f"{self.role}: {self.unit or 'count'} budget"))
        if self.time_s > 0:
            out.append((max(0.0, self.time_s - (now - self.started)),
                        f"{self.role}: time budget"))
        return out

    def eta_s(self, now: float, rate: float) -> float:
        """Seconds until this line's first budget runs out (inf when none can be told)."""
        return min((s for s, _ in self.ends(now, rate)), default=math.inf)

    def text(self, now: float, rate: float | None = None,
             eta: tuple[float, str] | None = None) -> str:
        """The line as plain text; with ``eta`` (seconds, reason) it shows that ETA.

        Args:
            now (float): ``time.monotonic()``.
            rate (float | None): this line's rate (None: measured now).
            eta (tuple[float, str] | None): the run's ETA and why (None: no ETA shown).
        """
        frac = self.fraction(now)
        rate = self.rate(now) if rate is None else rate
        done = f"{self.done:,.0f}" + (f"/{self.total:,.0f}" if self.total > 0 else "")
        pieces = [f"{self.role:<8}", f"{100 * frac:5.1f}%" if math.isfinite(frac) else "    -",
                  f"{done} {self.unit}".rstrip()]
        if math.isfinite(rate):
            pieces.append(f"{rate:,.0f} {self.unit}/s" if self.unit else f"{rate:,.1f}/s")
        if eta is not None:
            pieces.append(f"ETA {format_eta(eta[0])}" + (f" ({eta[1]})" if eta[1] else ""))
        pieces.append(f"elapsed {format_eta(now - self.started)}")
        note = self.note() if callable(self.note) else self.note
        if note:
            pieces.append(note)
        return "  ".join(pieces)


class ProgressBoard:
    """The lines of one process, drawn together.

    Args:
        stream (TextIO | None): where to draw (default ``sys.stdout``).
        every_s (float): seconds between plain lines when not on a terminal.
        live (bool | None): draw live with rich (None: when ``stream`` is a terminal and
            the process was not started by mpirun/srun, whose stdout ends in a log).
    """

    def __init__(self, stream: TextIO | None = None, every_s: float = 10.0,
                 live: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.every_s = float(every_s)
        if live is None:
            under_mpi = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                                      "SLURM_STEP_ID"))
            live = (not under_mpi and hasattr(self.stream, "isatty")
                    and self.stream.isatty())
        self.live = bool(live)
        self.lines: dict[str, ProgressLine] = {}
        self._last = -math.inf
        self._live: Any = None
        self._closed = False

    def update(self, role: str, done: float | None = None, *, total: float | None = None,
               unit: str | None = None, time_s: float | None = None,
               note: str | Callable[[], str] | None = None, force: bool = False) -> None:
        """Set what is given of ``role``'s line (made at its first update) and draw the
        board if it is time. Local; cheap when it does not draw."""
        line = self.lines.get(role)
        if line is None:
            line = self.lines[role] = ProgressLine(role)
        if done is not None:
            line.done = float(done)
        if total is not None:
            line.total = float(total)
        if unit is not None:
            line.unit = unit
        if time_s is not None:
            line.time_s = float(time_s)
        if note is not None:
            line.note = note
        self.draw(force=force)

    def draw(self, *, force: bool = False) -> None:
        """Draw every line now if it is time (or ``force``)."""
        if self._closed:
            return
        now = time.monotonic()
        if not force and now - self._last < (0.25 if self.live else self.every_s):
            return
        self._last = now
        texts = self.texts(now)
        if self.live:
            self._draw_live(texts)
        else:  # one write per block: lines of one board never interleave
            stamp = time.strftime("%H:%M:%S")
            self.stream.write("".join(f"[progress {stamp}] {t}\n" for t in texts))
            self.stream.flush()

    def texts(self, now: float) -> list[str]:
        """Every line as text; the first carries the run's one ETA: the earliest end
        foreseen over all lines, with its reason (``-`` when none can be told)."""
        lines = list(self.lines.values())
        rates = [line.rate(now) for line in lines]
        ends = [e for line, r in zip(lines, rates, strict=True) for e in line.ends(now, r)]
        eta = min(ends, default=(math.inf, ""))
        return [line.text(now, rate=r, eta=eta if i == 0 else None)
                for i, (line, r) in enumerate(zip(lines, rates, strict=True))]

    def _draw_live(self, texts: list[str]) -> None:
        from rich.console import Console, Group
        from rich.live import Live
        from rich.text import Text

        group = Group(*[Text(t, no_wrap=True, overflow="ellipsis") for t in texts])
        if self._live is None:
            console = Console(file=self.stream)
            self._live = Live(group, console=console, auto_refresh=False,
                              redirect_stdout=True, redirect_stderr=True, transient=False)
            self._live.start()
        self._live.update(group, refresh=True)

    def log(self, text: str) -> None:
        """Print a log line; on a terminal it scrolls above the live lines."""
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Draw the final state and stop drawing (idempotent)."""
        if self._closed:
            return
        self.draw(force=True)
        self._closed = True
        if self._live is not None:
            self._live.stop()
            self._live = None
