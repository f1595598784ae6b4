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
        "tiers": ["learner_host", "buffer_host"],
        "min_gain": 0.2, "patience": 2}})
    p = cfg.placement
    assert (p.planner, p.scope, p.tiers, p.patience) == (
        "static", "partitioned", ("learner_host", "buffer_host"), 2)


def test_adaptive_in_a_running_job_loads_with_what_it_supports() -> None:
    cfg = Config.from_dict({"placement": {"adaptive": True, "interval_supersteps": 50},
                            "checkpoint": {"on_stop": False}})
    assert cfg.placement.adaptive and cfg.placement.interval_supersteps == 50


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"placement": {"scope": "partitioned"}}, "placement.scope must be 'global'"),
        ({"scheduler": {"sampler": "sequence", "sequence_length": 4}},
         "scheduler.sampler must be 'uniform' or 'prioritized' with placement.adaptive"),
        ({"storage": {"shards_per_buffer": 2}}, "storage.shards_per_buffer must be 1"),
        ({"layout": {"learners": 0}}, "layout.learners must be >= 1"),
        ({"checkpoint": {"on_stop": True}}, "checkpoint must be off"),
        ({"checkpoint": {"on_stop": False, "every_seconds": 5.0}},
         "'every_seconds': 5.0"),
        # long-haul places the shards itself (an edge one and a cloud one) and paces what
        # crosses its link: a re-placement was accepted and then failed at run time
        # (edge_replay: "needs exactly one shard per buffer rank"; forward: the job did
        # its work, then every rank waited run.timeout_s at the end for the coordinator)
        ({"layout": {"buffers": 2}, "longhaul": {"mode": "forward"}},
         "longhaul.mode must be 'off' with placement.adaptive = true"),
        ({"layout": {"buffers": 2}, "longhaul": {"mode": "edge_replay"},
          "scheduler": {"fetch": "owner"}},
         "longhaul.mode must be 'off' with placement.adaptive = true"),
    ],
)
def test_adaptive_refuses_what_a_running_job_cannot_re_place(raw: dict,
                                                             fragment: str) -> None:
    raw = {"checkpoint": {"on_stop": False}, **raw}
    raw["placement"] = {"adaptive": True, **raw.get("placement", {})}
    with pytest.raises(ConfigError) as info:
        Config.from_dict(raw)
    assert fragment in str(info.value)


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


def test_device_rows_with_edge_replay_is_refused() -> None:
    # edge_replay keeps the replay at the edge and sends only sampled batches across the
    # link; promoting that shard to the learner's device read it in place, bypassing the
    # link (a run crossed 320 rows of 3,840 sampled, and its exposed time fell 1000x)
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"layout": {"buffers": 2}, "scheduler": {"fetch": "owner"},
                          "longhaul": {"mode": "edge_replay"},
                          "placement": {"device_rows": 1000}})
    assert "longhaul.mode must be 'off' or 'forward' with placement.device_rows = 1000" in (
        str(info.value))
