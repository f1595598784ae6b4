"""The [placement] config section."""

from __future__ import annotations

import pytest

from conduit_hpc.config import Config, PlacementConfig
from conduit_hpc.errors import ConfigError


def test_defaults_keep_the_round_robin_planner() -> None:
    cfg = Config.from_dict({})
    assert cfg.placement == PlacementConfig()
    assert cfg.placement.planner == "round_robin" and not cfg.placement.adaptive


def test_static_adaptive_section_loads() -> None:
    cfg = Config.from_dict({"placement": {
        "planner": "static", "cluster": "jobs/cluster-local.toml", "scope": "partitioned",
        "sampling": "prioritized", "tiers": ["learner_host", "buffer_host"],
        "adaptive": True, "min_gain": 0.2, "patience": 2}})
    p = cfg.placement
    assert (p.planner, p.scope, p.tiers, p.patience) == (
        "static", "partitioned", ("learner_host", "buffer_host"), 2)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"planner": "magic"}, "placement.planner must be one of 'round_robin', 'static'"),
        ({"tiers": ["disk"]}, "placement.tiers must be a non-empty list of distinct tiers"),
        ({"min_gain": 1.5}, "placement.min_gain must be a number in [0, 1)"),
        ({"patience": 0}, "placement.patience must be >= 1"),
        ({"hysteresis": 1}, "unknown key 'placement.hysteresis'"),
    ],
)
def test_bad_values_are_named(raw: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"placement": raw})
    assert fragment in str(info.value)
