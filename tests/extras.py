"""Whether an optional extra (``[torchrl]``, ``[rllib]``, ``[tensorboard]``) is
installed, for the tests that need it.

Where it is missing a test skips - except under CI (``CI`` set and not ``false``/``0``),
where ``make`` (which ``.ci/run`` runs) installs every extra and a missing one is a
failure, never a silent skip.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def need_extra(extra: str, *modules: str, module_level: bool = False) -> None:
    """Skip (outside CI) or fail (in CI) unless every one of ``modules`` imports.
    ``module_level``: called at a test module's top level (skips the whole module)."""
    try:
        for name in modules:
            importlib.import_module(name)
    except ImportError as err:
        msg = (f"the [{extra}] extra is not installed ({err}); pip install "
               f"'conduit-hpc[{extra}]'")
        if in_ci():
            pytest.fail(f"{msg} - `make` installs it, so under CI this is a failure",
                        pytrace=False)
        pytest.skip(msg, allow_module_level=module_level)


def need_torchrl() -> None:
    """:func:`need_extra` for the ``[torchrl]`` extra (torchrl and tensordict)."""
    need_extra("torchrl", "tensordict", "torchrl")


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (``"64k"``, ``"16m"``) mounted at ``where`` (made) for the
    ``with`` block, unmounted after: a small or full file system (a quota, a scratch, a
    container's ``/dev/shm``). Skips without root or where ``mount`` is refused."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True, text=True, check=False, timeout=30)
    if got.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed (no CAP_SYS_ADMIN here?): {got.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, check=False, timeout=30)


def fill_up(path: Path) -> None:
    """Append to ``path`` until its file system is full (ENOSPC)."""
    with open(path, "ab", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"x" * 4096)
