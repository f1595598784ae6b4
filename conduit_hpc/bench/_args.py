"""Checked types for the benchmarks' command-line options.

Every number a benchmark takes on its command line goes through one of these
``argparse`` types, so that a value out of range (``0`` rows, ``-1`` seconds, ``nan``,
``inf``, ``1e30``) is refused while the arguments are parsed: one ``error: argument
--NAME: must be ..., got 'VALUE'`` line, exit status 2, before anything is launched or
written (``tests/unit/test_bench_args.py`` holds every benchmark to it). A comma list
comes back normalised as a string (``" 1, 2"`` -> ``"1,2"``), as the benchmarks read it.
Paths are checked the same way: a folder to write into (``out_dir``, made if missing),
an existing one (``existing_dir``), a file to write (``out_file``) and a run's folder
(``run_dir``; ``finished_run``). Permission checks use ``os.access`` and so cannot
refuse a folder root may not write for other reasons (``/proc``); those fail when the
benchmark writes.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Checked", "Names", "existing_dir", "finished_run", "link", "names", "out_dir",
           "out_file", "real", "reals", "run_dir", "torch_device", "whole", "wholes"]


def _range(lo: float, hi: float, open_lo: bool) -> str:
    return f"{'above' if open_lo else 'from'} {lo:,g} to {hi:,g}"


def _whole(text: str, lo: int, hi: int) -> int:
    try:
        v = int(text.strip())
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        raise argparse.ArgumentTypeError(
            f"must be an integer from {lo:,} to {hi:,}, got {text!r}")
    return v


def _real(text: str, lo: float, hi: float, open_lo: bool) -> float:
    try:
        v = float(text.strip())
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and (lo < v if open_lo else lo <= v) and v <= hi):
        raise argparse.ArgumentTypeError(
            f"must be a number {_range(lo, hi, open_lo)}, got {text!r}")
    return v


def _items(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not items or any(not x for x in items):
        raise argparse.ArgumentTypeError(
            f"must be a comma-separated list with no empty item, got {text!r}")
    return items


@dataclass(frozen=True)
class Checked:
    """An ``argparse`` type: ``lo`` .. ``hi`` (above ``lo`` when ``open_lo``); ``many``:
    a comma list of such values, each once; ``integer``: whole numbers."""

    lo: float
    hi: float
    open_lo: bool = False
    many: bool = False
    integer: bool = True

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return "integer" if self.integer else "number"

    def one(self, text: str) -> int | float:
        if self.integer:
            return _whole(text, int(self.lo), int(self.hi))
        return _real(text, self.lo, self.hi, self.open_lo)

    def __call__(self, text: str) -> Any:
        if not self.many:
            return self.one(text)
        what = (f"integers from {int(self.lo):,} to {int(self.hi):,}" if self.integer
                else f"numbers {_range(self.lo, self.hi, self.open_lo)}")
        try:
            values = [self.one(x) for x in _items(text)]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"must be a comma-separated list of {what}, got {text!r}") from None
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:  # the same run or size twice: twice the time, and a skewed summary
            raise argparse.ArgumentTypeError(
                f"must be a comma-separated list of distinct {what}, got {text!r} "
                f"({', '.join(map(repr, twice))} twice)")
        return ",".join(map(repr, values))


def whole(lo: int, hi: int) -> Checked:
    """An integer in ``[lo, hi]``."""
    return Checked(lo, hi)


def real(lo: float, hi: float, *, open_lo: bool = False) -> Checked:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``open_lo``)."""
    return Checked(lo, hi, open_lo, integer=False)


def wholes(lo: int, hi: int) -> Checked:
    """A comma list of distinct integers in ``[lo, hi]``, normalised (``"1,2"``)."""
    return Checked(lo, hi, many=True)


def reals(lo: float, hi: float, *, open_lo: bool = False) -> Checked:
    """A comma list of distinct finite numbers in ``[lo, hi]`` (``(lo, hi]`` with
    ``open_lo``), normalised (``"0.5,4.0"``)."""
    return Checked(lo, hi, open_lo, many=True, integer=False)


@dataclass(frozen=True)
class Names:
    """An ``argparse`` type: a comma list of names from ``allowed``, each once,
    normalised (``"a,b"``)."""

    allowed: tuple[str, ...]

    @property
    def __name__(self) -> str:
        return "names"

    def __call__(self, text: str) -> str:
        items = [x.strip() for x in text.split(",")] if text.strip() else []
        bad = [x for x in items if x not in self.allowed]
        if bad or not items or len(set(items)) != len(items):
            what = ("an empty item" if "" in items else f"unknown: {', '.join(bad)}" if bad
                    else "a name twice" if items else "none")
            raise argparse.ArgumentTypeError(
                f"must be a comma-separated list of {', '.join(self.allowed)}; got "
                f"{text!r} ({what})")
        return ",".join(items)


def names(allowed: Iterable[str]) -> Names:
    """A comma list of names from ``allowed``."""
    return Names(tuple(allowed))


def torch_device(text: str) -> str:
    """A torch device this machine has (``cpu``, ``cuda``, ``cuda:1``...)."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"must be a torch device such as cpu or cuda:0, got {text!r}") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (
            dev.index is not None and dev.index >= torch.cuda.device_count())):
        raise argparse.ArgumentTypeError(
            f"must be a device this machine has; got {text!r}, and it has "
            f"{torch.cuda.device_count()} CUDA device(s)")
    if dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu or a CUDA device, got {text!r}")
    return text


def link(text: str) -> str:
    """``probe``, or a link as ``LATENCY_US,GBPS``: a latency from 0 to 1e7 us and a
    bandwidth above 0 to 1e6 GB/s (normalised)."""
    if text.strip() == "probe":
        return "probe"
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise argparse.ArgumentTypeError("two numbers")
        lat, gbps = _real(parts[0], 0, 1e7, False), _real(parts[1], 0, 1e6, True)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"must be probe or LATENCY_US,GBPS (latency 0 to 1e7 us, bandwidth above 0 to "
            f"1e6 GB/s), got {text!r}") from None
    return f"{lat!r},{gbps!r}"


def _writable_dir(p: Path) -> bool:
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK)


def existing_dir(text: str) -> str:
    """A directory that exists and can be written (``""``: the benchmark's default)."""
    if text and not _writable_dir(Path(text)):
        raise argparse.ArgumentTypeError(
            f"must be an existing directory this user can write, got {text!r}")
    return text


def out_dir(text: str) -> str:
    """A directory to write into, made if missing: not a file, and its nearest existing
    ancestor a directory this user can write (``""``: the benchmark's default)."""
    if not text:
        return text
    p = Path(text)
    if p.exists():
        if not _writable_dir(p):
            raise argparse.ArgumentTypeError(
                f"must be a directory this user can write (or a path to make one), "
                f"got {text!r}")
        return text
    up = p.absolute().parent
    while not up.exists():
        up = up.parent
    if not _writable_dir(up):
        raise argparse.ArgumentTypeError(
            f"must be a directory this user can make: {str(up)!r} above it is not a "
            f"writable directory, got {text!r}")
    return text


def out_file(text: str) -> str:
    """A file to write or append to: not a directory, in an existing directory this
    user can write (``""``: none)."""
    if text and (Path(text).is_dir() or not _writable_dir(Path(text).absolute().parent)):
        raise argparse.ArgumentTypeError(
            f"must be a file path in an existing directory this user can write, got "
            f"{text!r}")
    return text


def run_dir(text: str) -> str:
    """The directory of a ``conduit-hpc run`` with its learners' metrics
    (``metrics/learner-*.csv``)."""
    if not any((Path(text) / "metrics").glob("learner-*.csv")):
        raise argparse.ArgumentTypeError(
            f"must be a run directory of conduit-hpc run (with metrics/learner-*.csv), "
            f"got {text!r}")
    return text


def finished_run(text: str) -> str:
    """A :func:`run_dir` that finished: it also holds ``metrics/summary.json``."""
    run_dir(text)
    if not (Path(text) / "metrics" / "summary.json").is_file():
        raise argparse.ArgumentTypeError(
            f"must be a finished run directory of conduit-hpc run (with "
            f"metrics/summary.json), got {text!r}")
    return text
