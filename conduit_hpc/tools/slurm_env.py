"""The environment block of a rendered sbatch script (``conduit-hpc slurm``).

In the order the script runs them: ``module load`` lines, the Python environment
(``--env venv:PATH`` or ``--env conda:NAME``, each guarded: a missing venv or conda ends
the job with one clear line and exit status 2 before anything runs), the user's own
``--setup`` lines, the MPI (``--mpi wheel``: the pip wheel's Open MPI with the settings
of the packaged ``mpi_env.sh``; ``--mpi site``: the site's MPI as its modules set it up,
with the ``mpirun`` of ``--mpirun`` or ``srun --mpi=<--srun-mpi>``, and none of the
wheel's settings) and the job's checkout on ``PYTHONPATH``. Pure; writes nothing.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from conduit_hpc.config import require
from conduit_hpc.errors import ConfigError

__all__ = ["ENV_KINDS", "MPI_KINDS", "activation_lines", "checkout_of", "mpi_lines",
           "parse_env", "setup_block"]

ENV_KINDS = ("venv", "conda")
MPI_KINDS = ("wheel", "site")


def parse_env(spec: str) -> tuple[str, str]:
    """``("venv", PATH)`` or ``("conda", NAME_OR_PREFIX)`` from ``--env KIND:VALUE``;
    ``("", "")`` for an empty spec.

    Raises:
        ConfigError: another form (names ``--env``, the value and the forms accepted).
    """
    if not spec:
        return "", ""
    kind, sep, value = spec.partition(":")
    if not sep or kind not in ENV_KINDS or not value.strip() or "\n" in value:
        raise ConfigError(f"--env must be venv:PATH or conda:NAME (a conda environment's "
                          f"name or prefix), got {spec!r}", key="env")
    return kind, value


def activation_lines(spec: str) -> list[str]:
    """Shell lines that activate ``--env``: a venv's ``bin/activate``, or conda's
    ``etc/profile.d/conda.sh`` (found with ``conda info --base``) and ``conda activate``.
    A conda environment also sets ``VIRTUAL_ENV`` to its prefix, where the launch script
    looks for ``conduit-hpc`` (and, with ``--mpi wheel``, the wheel's Open MPI)."""
    kind, value = parse_env(spec)
    q = shlex.quote(value)
    if kind == "venv":
        return [f"# the Python environment: the virtualenv {value}",
                f"if [ ! -f {q}/bin/activate ]; then",
                f"  echo \"conduit-hpc: --env venv:{value}: no bin/activate there (not a "
                f"virtualenv, or not on a filesystem this node sees)\" >&2; exit 2",
                "fi",
                f"source {q}/bin/activate"]
    if kind == "conda":
        return [f"# the Python environment: the conda environment {value}",
                "if ! command -v conda >/dev/null 2>&1; then",
                f"  echo \"conduit-hpc: --env conda:{value}: conda is not on PATH on this "
                f"node; load its module first (--module ...)\" >&2; exit 2",
                "fi",
                "_conda_base=$(conda info --base) && "
                "source \"$_conda_base/etc/profile.d/conda.sh\" || {",
                "  echo \"conduit-hpc: cannot source $(conda info --base 2>/dev/null)"
                "/etc/profile.d/conda.sh\" >&2; exit 2; }",
                f"conda activate {q} || {{",
                f"  echo \"conduit-hpc: conda activate {value} failed\" >&2; exit 2; }}",
                "export VIRTUAL_ENV=$CONDA_PREFIX   # launch.sh runs "
                "$VIRTUAL_ENV/bin/conduit-hpc"]
    return []


def mpi_lines(mpi: str, mpirun: str = "", srun_mpi: str = "") -> list[str]:
    """The lines that choose the MPI environment the launch script sets up.

    Raises:
        ConfigError: an unknown ``--mpi``, ``--mpirun`` without ``--mpi site``, or a
            relative ``--mpirun`` path with a ``/`` in it.
    """
    require(mpi in MPI_KINDS, "--mpi", mpi, "wheel or site")
    require(not mpirun or mpi == "site", "--mpirun", mpirun,
            "only with --mpi site (the wheel's mpirun is the one in its environment)")
    require(not mpirun or "/" not in mpirun or mpirun.startswith("/"), "--mpirun", mpirun,
            "an absolute path or a command name on PATH")
    require(not srun_mpi or re.fullmatch(r"\w+", srun_mpi) is not None,
            "--srun-mpi", srun_mpi, "an srun --mpi plugin name such as pmix or pmi2")
    if mpi == "wheel":
        lines = ["# MPI: the pip wheel's Open MPI; launch.sh sources the packaged mpi_env.sh",
                 "export CONDUIT_MPI=wheel"]
    else:
        lines = ["# MPI: the site's, as its modules set it up (none of the wheel's "
                 "settings; see slurm/README.md)",
                 "export CONDUIT_MPI=site"]
        if mpirun:
            lines.append(f"export CONDUIT_MPIRUN={shlex.quote(mpirun)}")
        lines.append(f"export CONDUIT_SRUN_MPI={srun_mpi or 'pmix'}   # srun --mpi=... "
                     f"(srun --mpi=list shows them)")
        return lines
    if srun_mpi:
        lines.append(f"export CONDUIT_SRUN_MPI={srun_mpi}")
    return lines


def checkout_of(config_path: Path) -> Path | None:
    """The conduit_hpc checkout that holds the job file (a folder above it with
    ``pyproject.toml`` and ``conduit_hpc/tools/scripts/launch.sh``), or ``None``."""
    for d in Path(config_path).resolve().parents:
        if (d / "pyproject.toml").is_file() and \
                (d / "conduit_hpc" / "tools" / "scripts" / "launch.sh").is_file():
            return d
    return None


def setup_block(*, modules: Sequence[str], env: str, setup: Sequence[str], mpi: str,
                mpirun: str, srun_mpi: str, checkout: Path | None) -> list[str]:
    """The whole environment block, in the order the script runs it."""
    lines = [f"module load {shlex.quote(m)}" for m in modules]
    lines += activation_lines(env)
    lines += list(setup)
    if not modules and not env and not setup:
        lines += ["# module load python/3.11          # e.g.; or --module / --env",
                  "# default environment: the checkout's .venv, else the venv "
                  "conduit_hpc is installed in"]
    lines += mpi_lines(mpi, mpirun, srun_mpi)
    if checkout is not None:
        q = shlex.quote(str(checkout))
        lines += ["# conduit_hpc from the job file's checkout",
                  f"export PYTHONPATH={q}${{PYTHONPATH:+:$PYTHONPATH}}"]
    return lines
