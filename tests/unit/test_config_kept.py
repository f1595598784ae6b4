"""A config built by hand keeps what it checked, whatever happens to the dicts it was
built from. ``Config.spec`` and ``checkpoint.compression`` (and any ``dict`` field of a
job's section) held the caller's dict itself: changed after the checks - after
``ExperienceDataPlane(cfg)`` - the change reached what the data plane reads later,
unchecked (a codec ``'bogus'`` failed the checkpoint at its cut; ``'lzf'`` compressed it
with another codec than every rank agreed on, and the manifest recorded the new one)."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from conduit_hpc.config import (
    CheckpointConfig,
    Config,
    ConfigError,
    FieldConfig,
    FrozenDict,
    PlacementConfig,
    require_types,
)
from conduit_hpc.testing import make_config


def _hand_built() -> tuple[Config, dict[str, FieldConfig], dict[str, str]]:
    fields = {"obs": FieldConfig(dtype="float32", shape=(4,)),
              "reward": FieldConfig(dtype="float32")}
    codecs = {"obs": "gzip"}
    return Config(spec=fields, checkpoint=CheckpointConfig(compression=codecs)), fields, codecs


def test_the_callers_dicts_changed_afterwards_do_not_reach_the_config() -> None:
    cfg, fields, codecs = _hand_built()
    before = cfg.to_dict()
    codecs["obs"] = "bogus"  # not a codec: refused had it been there at the check
    codecs["nope"] = "lzf"  # not a spec field: refused likewise
    fields["obs"] = FieldConfig(dtype="float64", shape=(8,))
    del fields["reward"]
    assert cfg.to_dict() == before
    assert dict(cfg.checkpoint.compression) == {"obs": "gzip"}
    assert list(cfg.spec) == ["obs", "reward"] and cfg.spec["obs"].shape == (4,)


@pytest.mark.parametrize("change", [
    lambda m: m.__setitem__("x", "gzip"),
    lambda m: m.__delitem__(next(iter(m))),
    lambda m: m.update(x="gzip"),
    lambda m: m.setdefault("x", "gzip"),
    lambda m: m.pop(next(iter(m))),
    lambda m: m.popitem(),
    lambda m: m.clear(),
    lambda m: m.__ior__({"x": "gzip"}),
], ids=["setitem", "delitem", "update", "setdefault", "pop", "popitem", "clear", "ior"])
@pytest.mark.parametrize("which", ["spec", "compression"])
def test_a_configs_mappings_cannot_be_changed_through_it(which: str, change: Any) -> None:
    cfg, _, _ = _hand_built()
    before = cfg.to_dict()
    target = cfg.spec if which == "spec" else cfg.checkpoint.compression
    with pytest.raises(TypeError, match="cannot be changed"):
        change(target)
    assert cfg.to_dict() == before


@dataclass(frozen=True, slots=True, kw_only=True)
class _JobSection:
    """A job's own section with a table (as ``[rllib] buffer_keys``)."""

    keys: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        require_types(self)
        for k, v in self.keys.items():
            if v < 0:
                raise ConfigError(f"keys.{k} must be >= 0, got {v!r}", key=f"keys.{k}")


def test_a_job_sections_table_is_its_own_too() -> None:
    keys = {"alpha": 0.5}
    sec = _JobSection(keys=keys)
    keys["alpha"] = -1.0  # what the check refuses, after it
    assert sec.keys == {"alpha": 0.5} and isinstance(sec.keys, FrozenDict)
    with pytest.raises(TypeError):
        sec.keys["alpha"] = -1.0  # type: ignore[index]


def test_frozen_configs_compare_copy_pickle_and_rebuild_as_before() -> None:
    cfg, _, _ = _hand_built()
    assert copy.deepcopy(cfg) == cfg and pickle.loads(pickle.dumps(cfg)) == cfg
    again = Config.from_dict(cfg.to_dict())
    assert again == cfg and again.digest() == cfg.digest()
    assert cfg.spec == {"obs": FieldConfig(dtype="float32", shape=(4,)),
                        "reward": FieldConfig(dtype="float32")}
    assert cfg.replace(run=cfg.run) == cfg  # replace() checks and freezes again
    loaded = make_config(checkpoint={"compression": {"payload": "lzf"}})
    assert isinstance(loaded.spec, FrozenDict)
    assert isinstance(loaded.checkpoint.compression, FrozenDict)
    mine = dict(loaded.spec)  # a copy to change is a dict as before
    mine.pop("payload")
    assert "payload" in loaded.spec


def test_a_list_of_names_is_the_configs_own_tuple() -> None:
    """``PlacementConfig(tiers=[...])`` kept the caller's list: a tier appended after the
    check ('bogus') was in the config the planner reads."""
    tiers = ["learner_host", "buffer_host"]
    pc = PlacementConfig(tiers=tiers)
    tiers.append("bogus")
    assert pc.tiers == ("learner_host", "buffer_host")
    with pytest.raises(ConfigError, match="tiers must be a list of strings"):
        PlacementConfig(tiers=["buffer_host", 3])  # type: ignore[list-item]
