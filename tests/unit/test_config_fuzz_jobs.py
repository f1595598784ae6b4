"""Fuzzing every job's own sections (``[synthetic]``, ``[dqn]``, ``[job]``, ``[atari]``,
``[torchrl]``, ``[rllib]``, ``[example]``) and the feature sections, as each job's TOML
file is loaded with its ``JOB_CONFIG``: a hostile value for any field either loads - and
then the pre-launch checks take it or refuse it by name - or is a ConfigError naming
that field; never another exception (a traceback on ``conduit-hpc run``) and never a
refusal that names another key. tests/unit/test_config_fuzz.py does the same for the
library's own sections on a bare Config."""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_hpc import ConfigError
from conduit_hpc.config import LaunchWorld, declared_config
from conduit_hpc.config.loader import read_toml, validate
from conduit_hpc.testing import REPO

JOBS = ["synthetic", "dqn_cartpole", "example_gym", "apex_atari", "longhaul_dqn",
        "torchrl_dqn_cartpole", "rllib_dqn_cartpole"]
LIBRARY = {"run", "layout", "spec", "storage", "scheduler", "transport"}  # fuzzed elsewhere
HOSTILE = st.one_of(
    st.sampled_from([True, False, 0, -1, 1, 2**31, 2**40 + 1, 2**62, 2**63 - 1, -(2**63),
                     0.0, -0.0, 5e-324, 1e-300, 1e300, 1.7976931348623157e308, math.inf,
                     -math.inf, math.nan, 0.5, "", " ", "x", "\x00", "\u202e",
                     "é" * 300, "../..", "/dev/zero", [], [0], [-1], [2**62, 2**62],
                     ["a"], [[1]], {}, {"a": 1}, {"bandwidth_gbps": 1.0}]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)


@cache
def job(name: str) -> tuple[type, dict[str, Any], list[str]]:
    """The job's config class, its TOML file as read, and the dotted keys of every field
    of its own and the feature sections."""
    path = REPO / "jobs" / f"{name}.toml"
    cls, _ = declared_config(path)
    assert cls is not None
    keys: list[str] = []

    def walk(tp: Any, prefix: str) -> None:
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{prefix}{f.name}.")
            else:
                keys.append(f"{prefix}{f.name}")

    hints = typing.get_type_hints(cls)
    for sec in dataclasses.fields(cls):
        if sec.name not in LIBRARY and dataclasses.is_dataclass(hints[sec.name]):
            walk(hints[sec.name], f"{sec.name}.")
    return cls, read_toml(path), keys


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(JOBS), st.data())
def test_a_hostile_value_in_a_jobs_own_section_loads_or_is_refused_by_name(
        name: str, data: st.DataObject) -> None:
    cls, base, keys = job(name)
    raw = copy.deepcopy(base)
    picked = data.draw(st.lists(st.tuples(st.sampled_from(keys), HOSTILE), min_size=1,
                                max_size=2))
    for key, value in picked:
        set_dotted(raw, key, value)
    try:
        cfg = validate(cls, raw)
    except ConfigError as err:
        top = err.key.split(".")[0].split("[")[0]
        # the field set, or one its new value conflicts with (a section the file does
        # not have, whose message then names the key set)
        assert err.key and (top in raw or any(k in str(err) for k, _ in picked)), (
            err.key, str(err), picked)
        return
    lay = cfg.layout
    try:
        cfg.check_launch(LaunchWorld(lay.fixed_ranks, learners=lay.learners,
                                     buffers=lay.buffers, actors=lay.min_actors,
                                     memory_bytes=4 * 10**9))
    except ConfigError as err:
        assert err.key, str(err)


def test_every_job_has_sections_to_fuzz() -> None:
    for name in JOBS:
        assert job(name)[2], name
    assert Path(REPO / "jobs" / "synthetic.toml").is_file()
