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

import ast
import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from conduit_hpc.errors import ConfigError

__all__ = ["JOB_CONFIG_NAME", "contract_problem", "declared_config", "job_script_for",
           "main_calls_job_main"]

#: the module-level name under which a job script declares its config class
JOB_CONFIG_NAME = "JOB_CONFIG"


def job_script_for(config_path: str | Path) -> Path:
    """The job script of a TOML file: ``<config>.py`` beside it.

    Raises:
        ConfigError: a path without a file name (``""``, ``.``, ``/``), which names a
            directory, not a TOML file (before: pathlib's bare ``ValueError``, a
            traceback from ``conduit-hpc run .``).
    """
    p = Path(config_path)
    if not p.name:
        raise ConfigError(f"config file {str(config_path)!r} is a directory, not a TOML "
                          f"file", key="")
    return p.with_suffix(".py")


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
    module = _import_script(script, f"to find its {JOB_CONFIG_NAME}")
    if module is None:
        return None, f"the job script {str(script)!r} cannot be imported"
    cls = getattr(module, JOB_CONFIG_NAME, None)
    if cls is None:
        return None, (f"the job script {str(script)!r} declares no {JOB_CONFIG_NAME} "
                      f"(its config class)")
    if not isinstance(cls, type) or not hasattr(cls, "__dataclass_fields__"):
        raise ConfigError(f"{JOB_CONFIG_NAME} in {str(script)!r} must be a config dataclass "
                          f"(a subclass of conduit_hpc.config.Config), got {cls!r}",
                          key="")
    return cls, ""


def _import_script(script: Path, why: str) -> ModuleType | None:
    """Import a job script once per process and version of the file (``None``: no
    loader for it). Raises ConfigError when its own code fails."""
    resolved = script.resolve()
    stamp = f"{resolved}:{resolved.stat().st_mtime_ns}"
    name = "_conduit_job_" + hashlib.sha256(stamp.encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, resolved)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve annotations through it
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:  # the job's own code: anything can go wrong
            del sys.modules[name]
            raise ConfigError(f"importing the job script {str(script)!r} {why} failed: "
                              f"{type(err).__name__}: {err}", key="") from err
    return module


def main_calls_job_main(source: str) -> bool:
    """Whether a script's source calls ``job_main(...)`` (or ``x.job_main(...)``) inside
    an ``if __name__ == "__main__":`` block at module level. Static; runs nothing."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in tree.body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)):
            continue
        names = [node.test.left, *node.test.comparators]
        if not any(isinstance(n, ast.Name) and n.id == "__name__" for n in names):
            continue
        for sub in ast.walk(ast.Module(body=node.body, type_ignores=[])):
            if isinstance(sub, ast.Call):
                f = sub.func
                if ((isinstance(f, ast.Name) and f.id == "job_main")
                        or (isinstance(f, ast.Attribute) and f.attr == "job_main")):
                    return True
    return False


def contract_problem(script: str | Path) -> str:
    """What keeps ``script`` from being a job script that ``conduit-hpc run`` can start
    (see ``docs/writing-a-job.md``), or ``""``: the file exists, calls ``job_main`` under
    ``if __name__ == "__main__":`` and defines a callable ``run`` (found by importing
    it as :func:`declared_config` does - importing runs no job). Local; no MPI unless
    the script imports it.

    Raises:
        ConfigError: importing the script fails.
    """
    script = Path(script)
    if not script.is_file():
        return f"no job script {str(script)!r}"
    end = ('end it with `if __name__ == "__main__": job_main(MyConfig, run)` (see '
           'docs/writing-a-job.md)')
    source = script.read_text(errors="replace")
    try:
        compile(source, str(script), "exec", dont_inherit=True)
    except SyntaxError as err:  # before "never calls job_main", which it may well do
        return (f"the job script {str(script)!r} is not valid Python: {err.msg} (line "
                f"{err.lineno})")
    except ValueError as err:  # a NUL byte
        return f"the job script {str(script)!r} is not valid Python: {err}"
    if not main_calls_job_main(source):
        return f"the job script {str(script)!r} never calls job_main; {end}"
    module = _import_script(script, "to check it")
    if module is None:
        return f"the job script {str(script)!r} cannot be imported"
    if not callable(getattr(module, "run", None)):
        return (f"the job script {str(script)!r} defines no run(cfg, run_dir, resume) "
                f"for job_main to call; define it and {end}")
    return ""
