"""Whether the ``[torchrl]`` extra is installed, for the tests that need it.

Where it is missing a test skips - except under CI (``CI`` set and not ``false``/``0``),
where ``.ci/run`` installs the extra and a missing one is a failure, never a silent skip.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def need_torchrl() -> None:
    """Skip (outside CI) or fail (in CI) unless torchrl and tensordict import."""
    try:
        import tensordict  # noqa: F401
        import torchrl  # noqa: F401
    except ImportError as err:
        msg = (f"the [torchrl] extra is not installed ({err}); pip install "
               f"'conduit-hpc[torchrl]'")
        if in_ci():
            pytest.fail(f"{msg} - .ci/run installs it, so under CI this is a failure")
        pytest.skip(msg)
