"""Typed, frozen job configuration loaded from TOML (see ``docs`` and README "Design notes").

* :mod:`~conduit_hpc.config.sections` and :mod:`~conduit_hpc.config.feature_sections`:
  the sections, frozen dataclasses whose ``__post_init__`` checks ranges;
* :mod:`~conduit_hpc.config.root`: :class:`Config`, the whole job;
* :mod:`~conduit_hpc.config.loader`: the one loading path (read the file, apply
  ``--set`` overrides, validate with pydantic) and TOML writing (``tomli-w``);
* :mod:`~conduit_hpc.config.jobs`: job sections declared by the job script
  (``JOB_CONFIG``);
* :mod:`~conduit_hpc.config.launch_world`: what a job's sections are checked against
  before launch (:class:`LaunchWorld`, :meth:`Config.check_launch`).

Every error is a :class:`~conduit_hpc.errors.ConfigError` naming the dotted key, the
value and what was expected. Nothing here imports MPI.
"""

from __future__ import annotations

from conduit_hpc.config.checks import FrozenDict, require, require_types
from conduit_hpc.config.feature_sections import (
    CHECKPOINT_CODECS,
    CheckpointConfig,
    LongHaulConfig,
    PlacementConfig,
)
from conduit_hpc.config.jobs import JOB_CONFIG_NAME, declared_config, job_script_for
from conduit_hpc.config.launch_world import LaunchWorld, require_bytes
from conduit_hpc.config.loader import (
    apply_overrides,
    config_from_dict,
    load,
    parse_override,
    read_toml,
    to_plain,
    to_toml,
    tomllib,
    validate,
)
from conduit_hpc.config.root import Config
from conduit_hpc.config.sections import (
    FieldConfig,
    LayoutConfig,
    RunConfig,
    SchedulerConfig,
    StackConfig,
    StorageConfig,
    TransportConfig,
)
from conduit_hpc.errors import ConfigError

__all__ = [
    "CHECKPOINT_CODECS",
    "JOB_CONFIG_NAME",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "FieldConfig",
    "FrozenDict",
    "LaunchWorld",
    "LayoutConfig",
    "LongHaulConfig",
    "PlacementConfig",
    "RunConfig",
    "SchedulerConfig",
    "StackConfig",
    "StorageConfig",
    "TransportConfig",
    "apply_overrides",
    "config_from_dict",
    "declared_config",
    "job_script_for",
    "load",
    "parse_override",
    "read_toml",
    "require",
    "require_bytes",
    "require_types",
    "to_plain",
    "to_toml",
    "tomllib",
    "validate",
]
