"""CSV files that the attempts of one run append to: what a requeued (resumed) attempt
reads of the files a killed one left, before it appends.

A killed attempt may leave a row torn at a file's end (:func:`cut_torn_row` cuts it);
the attempt that appends goes on from the file's last whole row (:func:`last_row`,
:func:`number`) and its clock from the latest ``time_s`` of the files beside it named
like it (:func:`siblings`, :func:`latest_time`: every actor's, so that the attempts
stay in time order across ranks, and for a rank new to the run). A file that cannot be
appended to is moved aside (:func:`set_aside`).

Used by the per-superstep metrics (:class:`~conduit_hpc.plane.metrics.CsvSink`) and
the episode files (:class:`~conduit_hpc.rl.episodes.EpisodeLog`). Plain Python; local
(no rank talks to another); none of these functions opens a file that is not a regular
one (a FIFO's open waits for its other end for ever), and none raises for a file's
contents (torn, empty, non-UTF-8 bytes, cells that are not numbers).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path

__all__ = ["cut_torn_row", "last_row", "latest_time", "number", "set_aside", "siblings"]

#: bytes read from a file's end for its last row (a metrics or episode row is < 1 kB),
#: and at most for its header
TAIL_BYTES = 64 << 10


def cut_torn_row(path: Path) -> int:
    """Cut the bytes after the last line end of ``path`` (a row a kill cut short: glued
    to the next attempt's first row it made a row of wrong numbers, such as ``60.0005``
    as env steps). Only those bytes go.

    Returns:
        int: the size left (0: nothing whole was left, a new file's header is due);
        -1 when ``path`` is no regular file (missing, a FIFO, a directory: not opened)
        or cannot be opened for writing (nothing cut).
    """
    if not path.is_file():
        return -1
    try:
        with open(path, "rb+") as fh:
            end = fh.seek(0, 2)
            keep = end
            while keep > 0:
                start = max(0, keep - TAIL_BYTES)
                fh.seek(start)
                block = fh.read(keep - start)
                if keep == end and block.endswith(b"\n"):
                    return end  # whole rows: nothing torn
                cut = block.rfind(b"\n")
                if cut >= 0:
                    keep = start + cut + 1
                    break
                keep = start
            fh.truncate(keep)
            return keep
    except OSError:
        return -1


def last_row(path: Path) -> tuple[list[str], list[str]] | None:
    """The header of the CSV file ``path`` and its last whole row (the part after the
    last line end is being written, or was torn: not read).

    Bytes that are not UTF-8 are read as U+FFFD. Reads the first line (at most
    :data:`TAIL_BYTES`) and the last :data:`TAIL_BYTES` of the file.

    Returns:
        tuple[list[str], list[str]] | None: ``(header, row)``; ``row`` is ``[]`` when
        the file holds no whole row after its header (empty, header only, one torn
        row), and both are ``[]`` when not even the header is whole. None when ``path``
        is no regular file (missing, a FIFO, a directory: not opened) or cannot be read.
    """
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.readline(TAIL_BYTES)
            end = fh.seek(0, 2)
            start = max(len(head), end - TAIL_BYTES)
            fh.seek(start)
            lines = fh.read().split(b"\n")[:-1]
    except OSError:
        return None
    if not head.endswith(b"\n"):
        return [], []
    if start > len(head) and lines:
        lines = lines[1:]  # the first may be part of a line
    header = _cells(head)
    return header, (_cells(lines[-1]) if lines else [])


def _cells(line: bytes) -> list[str]:
    """One CSV line's cells (U+FFFD for bytes that are not UTF-8 and for NUL)."""
    text = line.decode("utf-8", "replace").rstrip("\r\n").replace("\0", "\ufffd")
    try:
        return next(csv.reader([text]), [])
    except csv.Error:  # (not seen for a line this short; a damaged row reads as none)
        return []


def number(row: Mapping[str, str], column: str) -> float:
    """``row[column]`` as a finite float; 0.0 when it is missing, empty, not a number
    or not finite."""
    try:
        v = float(row.get(column) or 0.0)
    except ValueError:
        return 0.0
    return v if math.isfinite(v) else 0.0


def siblings(path: Path) -> list[Path]:
    """``path`` and the files beside it named like it (``actor-*.csv`` for
    ``actor-3.csv``: every actor's; for a name without a ``-``, ``path`` alone), sorted;
    regular files only (a FIFO's reader waits for a writer for ever)."""
    stem, dash, _ = path.stem.rpartition("-")
    found = set(path.parent.glob(f"{stem}-*{path.suffix}")) if dash else set()
    return [q for q in sorted(found | {path}) if q.is_file()]


def latest_time(path: Path, column: str = "time_s") -> float:
    """The latest ``column`` of the last whole rows of ``path`` and its
    :func:`siblings`: where the clock of an attempt that appends to ``path`` (or begins
    it, beside them) goes on. 0.0 when none holds a row with a finite ``column`` > 0."""
    out = 0.0
    for q in siblings(path):
        got = last_row(q)
        if got is not None:
            out = max(out, number(dict(zip(got[0], got[1], strict=False)), column))
    return out


def set_aside(path: Path, *, keep_suffix: bool = False) -> Path:
    """Move ``path`` to ``NAME.K`` (the first free ``K``; with ``keep_suffix``,
    ``STEM.K.SUFFIX``: ``episodes-3.1.csv``): kept, out of the way. Returns where."""
    k = 1
    while (to := path.with_name(f"{path.stem}.{k}{path.suffix}" if keep_suffix
                                else f"{path.name}.{k}")).exists():
        k += 1
    path.rename(to)
    return to
