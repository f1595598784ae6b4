"""Job sections declared by jobs: find the config class of a job from its script.

A job is a TOML file and a script beside it (``jobs/NAME.py`` for ``jobs/NAME.toml``, the
script that ``conduit-hpc run`` starts on every rank). A job with sections of its own
(``[synthetic]``, ``[dqn]``, ...) subclasses :class:`~conduit_hpc.config.Config` and
**declares** that class at module level::

    @dataclass(frozen=True, slots=True, kw_only=True)
    class SyntheticConfig(Config):
        synthetic: SyntheticSection = field(default_factory=SyntheticSection)

    JOB_CONFIG = SyntheticConfig

    if __name__ == "__main__":
        job_main(SyntheticConfig, run)

When a TOML file has top-level tables that the requested class does not know,
:func:`~conduit_hpc.config.loader.load` (and so ``Config.from_toml``, ``conduit-hpc run``,
``info`` and ``sbatch``) imports the script under a private module name - its
``job_main`` call is under ``if __name__ == "__main__"``, so importing runs no job - and
validates the whole file with ``JOB_CONFIG``. A table that neither the library nor the
job declares is refused as an unknown key. Local; no MPI (unless the script imports it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from conduit_hpc.errors import ConfigError

__all__ = ["JOB_CONFIG_NAME", "declared_config", "job_script_for"]

#: the module-level name under which a job script declares its config class
JOB_CONFIG_NAME = "JOB_CONFIG"


def job_script_for(config_path: str | Path) -> Path:
    """The job script of a TOML file: ``<config>.py`` beside it."""
    return Path(config_path).with_suffix(".py")


def declared_config(config_path: str | Path,
                    script: str | Path | None = None) -> tuple[type | None, str]:
    """The config class that the job script declares: ``script``, by default the one
    beside ``config_path``.

    The script is imported once per process and version of the file (under
    ``_conduit_job_<hash of path and mtime>``, so a script named like a library module
    shadows nothing, and an edited script is imported afresh).

    Returns:
        tuple[type | None, str]: the class, or ``None`` and why there is none.

    Raises:
        ConfigError: the script exists but fails to import, or its ``JOB_CONFIG`` is not
            a dataclass type.
    """
    script = Path(script) if script is not None else job_script_for(config_path)
    if not script.is_file():
        return None, f"no job script {str(script)!r} declares them"
    resolved = script.resolve()
    stamp = f"{resolved}:{resolved.stat().st_mtime_ns}"
    name = "_conduit_job_" + hashlib.sha256(stamp.encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, resolved)
        if spec is None or spec.loader is None:
            return None, f"the job script {str(script)!r} cannot be imported"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve annotations through it
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:  # the job's own code: anything can go wrong
            del sys.modules[name]
            raise ConfigError(f"importing the job script {str(script)!r} to find its "
                              f"{JOB_CONFIG_NAME} failed: {type(err).__name__}: {err}",
                              key="") from err
    cls = getattr(module, JOB_CONFIG_NAME, None)
    if cls is None:
        return None, (f"the job script {str(script)!r} declares no {JOB_CONFIG_NAME} "
                      f"(its config class)")
    if not isinstance(cls, type) or not hasattr(cls, "__dataclass_fields__"):
        raise ConfigError(f"{JOB_CONFIG_NAME} in {str(script)!r} must be a config dataclass "
                          f"(a subclass of conduit_hpc.config.Config), got {cls!r}",
                          key="")
    return cls, ""
