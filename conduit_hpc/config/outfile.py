"""Where ``conduit-hpc slurm -o`` and ``conduit-hpc probe --out`` may write.

The rule: a new file is written; an existing one is written over only when its first
lines carry the header this command writes (an sbatch script it rendered, a cluster
model it measured) or with ``--force``; the job's own files (its TOML, its job script)
are never written over, ``--force`` or not. Pure Python; reads at most a few lines.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from conduit_hpc.errors import ConfigError

__all__ = ["PROBE_HEADER", "SBATCH_HEADER", "check_out_file", "written_by"]

#: the header line of an sbatch script that ``conduit-hpc slurm`` rendered (templates/)
SBATCH_HEADER = "# Rendered by `conduit-hpc slurm`"
#: the first line of a cluster model that ``conduit-hpc probe --out`` wrote
PROBE_HEADER = "# measured by `conduit-hpc probe`"
_WHAT = {SBATCH_HEADER: "an sbatch script rendered by conduit-hpc slurm",
         PROBE_HEADER: "a cluster model written by conduit-hpc probe"}

#: lines of a file read to find the header
_HEAD_LINES = 5


def written_by(path: Path, marker: str) -> bool:
    """Whether one of the first lines of the file ``path`` starts with ``marker``.
    Not collective."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            head = [f.readline() for _ in range(_HEAD_LINES)]
    except OSError:
        return False
    return any(line.startswith(marker) for line in head)


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return a.resolve() == b.resolve()


def check_out_file(out: str, flag: str, *, marker: str, force: bool = False,
                   keep: Iterable[str | Path] = ()) -> None:
    """Refuse to write ``out`` over a file it must not replace. Not collective.

    Args:
        out (str): the output path given (``""``: stdout; nothing to check).
        flag (str): the option's name, for the message (``-o``, ``--out``).
        marker (str): the start of the header line this command writes
            (:data:`SBATCH_HEADER` or :data:`PROBE_HEADER`).
        force (bool): ``--force``: write over any other existing file.
        keep (Iterable[str | Path]): files never written over (the job's TOML and
            script).

    Raises:
        ConfigError: ``out`` is one of ``keep``, or an existing file without the
            header and no ``force``, naming ``flag`` and the path.
    """
    if not out:
        return
    what = _WHAT.get(marker, f"a file starting {marker!r}")
    p = Path(out)
    for k in keep:
        if _same(p, Path(k)):
            raise ConfigError(f"{flag} must not be the job's own file {str(k)!r}, got "
                              f"{out!r}: it would be written over with {what}; choose "
                              f"another path", key=flag)
    if p.is_file() and not force and not written_by(p, marker):
        raise ConfigError(f"{flag} {out!r} is an existing file that is not {what} (no "
                          f"{marker!r} header line); choose another path, remove it, or "
                          f"give --force to write over it", key=flag)
