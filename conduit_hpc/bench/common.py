"""What several benchmarks share: provenance (:func:`git_sha`) and where the repository's
files are (:func:`repo_path`), so that a benchmark runs from a checkout and from an
installed wheel alike. Not collective; no MPI.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["git_sha", "in_checkout", "repo_path", "worker_command"]

_CHECKOUT = Path(__file__).resolve().parents[2]


def in_checkout() -> bool:
    """Whether this package runs from a source checkout (``jobs/`` beside it)."""
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "jobs").is_dir()


def repo_path(relative: str) -> Path:
    """``relative`` (e.g. ``"jobs/cluster-128x8.toml"``, ``"bench/out"``) in the checkout
    this package runs from; outside a checkout (an installed wheel), the same path under
    the current directory - so a benchmark's default job and cluster files come from the
    checkout, or from a ``jobs/`` folder where it is started."""
    return _CHECKOUT / relative if in_checkout() else Path.cwd() / relative


def git_sha() -> str:
    """The short commit of the checkout this package runs from (``"unknown"`` outside
    a git checkout), for the provenance of benchmark results. Not collective."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                             cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def worker_command(module: str, *args: str) -> list[str]:
    """Arguments after ``python -m mpi4py`` that run benchmark ``module``'s ranks
    (``python -m mpi4py -m conduit_hpc.bench.NAME ARGS``)."""
    return ["-m", module, *args]
