"""Whether an optional extra (``[torchrl]``, ``[rllib]``, ``[tensorboard]``) is
installed, for the tests that need it.

Where it is missing a test skips - except under CI (``CI`` set and not ``false``/``0``),
where ``make`` (which ``.ci/run`` runs) installs every extra and a missing one is a
failure, never a silent skip.
"""

from __future__ import annotations

import importlib
import os

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
