"""Values written on ``#SBATCH`` lines (``conduit-hpc slurm``). sbatch reads those lines
itself, without a shell (SLURM's ``_get_argument``, ``src/sbatch/opt.c``). Pure."""

from __future__ import annotations

import re

__all__ = ["SBATCH_OPTION", "sbatch_arg", "sbatch_option"]

#: what sbatch's reading of an ``#SBATCH`` line treats specially (see :func:`sbatch_arg`)
_SBATCH_SPECIAL = re.compile(r'[\s"\\#]')
#: an ``--sbatch`` option: ``--NAME`` or ``--NAME=VALUE``
SBATCH_OPTION = re.compile(r"--[A-Za-z][A-Za-z0-9-]*(=.*)?", re.DOTALL)


def sbatch_arg(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line, which sbatch reads without a shell:
    whitespace ends an argument outside double quotes, an unescaped ``#`` ends the line,
    quoted or not, and a backslash escapes (``--output=/a b/x.out`` wrote to ``/a``). Such
    a value is written in double quotes with ``"``, ``\\`` and ``#`` escaped."""
    if not _SBATCH_SPECIAL.search(value):
        return value
    return '"' + re.sub(r'(["\\#])', r"\\\1", value) + '"'


def sbatch_option(opt: str) -> str:
    """An ``--sbatch`` option (``--NAME`` or ``--NAME=VALUE``) for an ``#SBATCH`` line."""
    name, eq, value = opt.partition("=")
    return f"{name}={sbatch_arg(value)}" if eq else name
