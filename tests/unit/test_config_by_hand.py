"""The Python entry points of a config and a data plane given the wrong kind of thing:
a ``ConfigError`` naming the argument and what was expected (before: ``Config(layout={...})``
and ``ExperienceDataPlane({...})`` raised AttributeError; ``from_toml(None)`` or an
override list of ints TypeError; an override string was read character by character)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest
from mpi4py import MPI

import conduit_hpc.config as c
from conduit_hpc import Config, ConfigError
from conduit_hpc.plane.roles import check_arguments
from conduit_hpc.testing import REPO

JOB = REPO / "jobs" / "synthetic.toml"


@pytest.mark.parametrize(("make", "match"), [
    (lambda: Config.from_toml(JOB, "layout.actors=1"),
     "overrides must be a list of 'section.key=value' strings, got str 'layout.actors=1'"),
    (lambda: Config.from_toml(JOB, [1]), "override 1 must be a string"),
    (lambda: Config.from_toml(None), "config file must be a path .* got NoneType None"),
    (lambda: Config.from_toml(b"jobs/synthetic.toml"), "must be a path .* got bytes"),
    (lambda: Config(layout={"actors": 1}), "layout must be a LayoutConfig, got dict"),
    (lambda: Config(spec={"obs": 3}), "spec must be a dict of field name to FieldConfig"),
    (lambda: Config(run=None), "run must be a RunConfig, got NoneType"),
])
def test_the_wrong_kind_of_argument_is_named(make: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make()


SECTIONS = [c.RunConfig, c.LayoutConfig, c.StackConfig, c.StorageConfig, c.TransportConfig,
            c.SchedulerConfig, c.PlacementConfig, c.CheckpointConfig, c.LongHaulConfig]


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda k: k.__name__)
def test_each_field_of_a_section_built_by_hand_refuses_the_wrong_type(cls: Any) -> None:
    """Built in Python, ``StorageConfig(capacity_rows="5")`` raised a raw TypeError,
    ``capacity_rows=5.0`` or ``True`` was accepted, ``StackConfig(stream=3)`` raised an
    AttributeError: every int, float, str, bool and Literal field is now held to the
    TOML loader's types (a ConfigError naming the field and the value)."""
    hints = typing.get_type_hints(cls)
    bad = {int: [1.5, True, "1"], float: ["1", True, None, 10**400], str: [3, None],
           bool: [1, "yes"]}  # 10**400: float() overflowed (a raw OverflowError)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        wrong = bad.get(tp, [3, None] if typing.get_origin(tp) is typing.Literal else [])
        for v in wrong:
            with pytest.raises(ConfigError) as err:
                cls(**{f.name: v})
            assert err.value.key == f.name and f"got {v!r}" in str(err.value), (f.name, v)


def test_no_overrides_may_be_none() -> None:
    assert Config.from_toml(JOB, None) == Config.from_toml(JOB)


@pytest.mark.parametrize(("config", "comm", "match"), [
    ({"layout": {}}, None, "config must be a conduit_hpc.Config .* got dict"),
    ("jobs/synthetic.toml", None, "config must be a conduit_hpc.Config .* got str"),
    (Config(), "world", "comm must be an mpi4py intracommunicator, got str"),
])
def test_a_data_plane_refuses_what_is_not_a_config_or_a_comm(config: Any, comm: Any,
                                                              match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_arguments(config, MPI.COMM_SELF if comm is None else comm)


def test_a_placement_and_a_run_dir_are_checked_before_anything_collective(tmp_path) -> None:
    """Before: ``placement="x"`` raised AttributeError deep in the planner, ``run_dir=5``
    TypeError, and a run directory that cannot be made FileNotFoundError on rank 0
    alone (the others went on into the next collective)."""
    with pytest.raises(ConfigError, match=r"placement must be a conduit_hpc Placement or "
                                          r"None, got str 'x'"):
        check_arguments(Config(), MPI.COMM_SELF, None, "x")
    for bad in (5, "", b"runs"):
        with pytest.raises(ConfigError, match=r"run_dir must be a path \(str or "
                                              r"os.PathLike\) or None, got"):
            check_arguments(Config(), MPI.COMM_SELF, None, None, bad)
    afile = tmp_path / "a-file"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=f"run_dir '{afile}/run' cannot be made"):
        check_arguments(Config(), MPI.COMM_SELF, None, None, afile / "run")
    check_arguments(Config(), MPI.COMM_SELF, None, None, tmp_path / "new" / "run")
    assert (tmp_path / "new" / "run").is_dir()


def test_a_transform_must_be_callable_and_return_arrays_by_name() -> None:
    import numpy as np

    from conduit_hpc.errors import SpecError
    from conduit_hpc.plane.delivery import checked_transform

    with pytest.raises(ConfigError, match=r"transform must be a callable .* got str"):
        check_arguments(Config(), MPI.COMM_SELF, "normalise")
    with pytest.raises(SpecError, match=r"transform must return a mapping .* got NoneType"):
        checked_transform(None)
    with pytest.raises(SpecError, match="transform output 'obs' must hold numbers"):
        checked_transform({"obs": np.array(["a"])})
    out = checked_transform({"obs": [[1.0, 2.0]]})
    assert isinstance(out["obs"], np.ndarray) and out["obs"].shape == (1, 2)
