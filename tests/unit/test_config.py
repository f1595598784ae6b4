from __future__ import annotations

from pathlib import Path

import pytest

from conduit_hpc import Config, ConfigError
from conduit_hpc.config import parse_override, to_toml

GOOD = """
[run]
name = "t1"
seed = 3

[layout]
learners = 1
buffers = 2
actors = 0

[spec.obs]
dtype = "float32"
shape = [4]

[spec.reward]
dtype = "float32"

[storage]
capacity_rows = 1000
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "job.toml"
    p.write_text(text)
    return p


def test_good_file_loads_with_types_and_defaults(tmp_path: Path) -> None:
    cfg = Config.from_toml(write(tmp_path, GOOD))
    assert cfg.run.name == "t1" and cfg.run.seed == 3
    assert cfg.layout.buffers == 2
    assert cfg.spec["obs"].shape == (4,) and cfg.spec["reward"].shape == ()
    assert cfg.storage.capacity_rows == 1000
    assert cfg.storage.shards_per_buffer == 1  # default
    assert list(cfg.spec) == ["obs", "reward"]  # file order kept


@pytest.mark.parametrize(
    ("edit", "key", "fragment"),
    [
        (("[storage]", "[storage]\ncapacity_rowz = 3"), "storage.capacity_rowz", "unknown key"),
        (("capacity_rows = 1000", "capacity_rows = -5"), "storage.capacity_rows", "> 0"),
        (("capacity_rows = 1000", 'capacity_rows = "big"'), "storage.capacity_rows",
         "integer"),
        (("seed = 3", "seed = 1.5"), "run.seed", "integer"),
        (("buffers = 2", "buffers = true"), "layout.buffers", "integer"),
        (('dtype = "float32"\nshape = [4]', 'dtype = "complex64"\nshape = [4]'),
         "spec.obs.dtype", "one of"),
        (("shape = [4]", "shape = [4, 0]"), "spec.obs.shape", "positive"),
        (("shape = [4]", 'shape = "4"'), "spec.obs.shape", "list"),
        (("[run]", "[rn]"), "rn", "unknown key"),
        (("capacity_rows = 1000", "commit_interval_s = -0.5\ncapacity_rows = 1000"),
         "storage.commit_interval_s", "between 0 and 1"),
        (("capacity_rows = 1000", "commit_interval_s = nan\ncapacity_rows = 1000"),
         "storage.commit_interval_s", "between 0 and 1"),
        (("capacity_rows = 1000", "commit_interval_s = 30.0\ncapacity_rows = 1000"),
         "storage.commit_interval_s", "between 0 and 1"),
        (('name = "t1"', 'name = "a b"'), "run.name", "letters"),
    ],
)
def test_bad_values_name_key_value_and_expectation(tmp_path: Path, edit: tuple[str, str],
                                                   key: str, fragment: str) -> None:
    text = GOOD.replace(*edit, 1)
    with pytest.raises(ConfigError) as info:
        Config.from_toml(write(tmp_path, text))
    msg = str(info.value)
    assert info.value.key == key
    assert key in msg and fragment in msg
    if "=" in edit[1]:  # the offending value is quoted back
        bad_value = edit[1].splitlines()[-1 if "shape" in key else 0].split("=")[-1]
        bad_value = bad_value.strip().strip('"').replace("[4, 0]", "(4, 0)")
        assert bad_value.lower() in msg.lower()


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Config.from_toml(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.from_toml(write(tmp_path, "[run\nname="))


def test_overrides_apply_as_toml_literals(tmp_path: Path) -> None:
    cfg = Config.from_toml(write(tmp_path, GOOD),
                           ["storage.capacity_rows=77", "run.name=other", "layout.buffers=1",
                            "transport.shared_memory=never"])
    assert cfg.storage.capacity_rows == 77
    assert cfg.run.name == "other"
    assert cfg.transport.shared_memory == "never"
    with pytest.raises(ConfigError, match=r"transport\.shared_memory"):
        Config.from_toml(write(tmp_path, GOOD), ["transport.shared_memory=sometimes"])
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override("nokey")


def test_digest_is_stable_and_sensitive(tmp_path: Path) -> None:
    a = Config.from_toml(write(tmp_path, GOOD))
    b = Config.from_toml(write(tmp_path, GOOD))
    c = Config.from_toml(write(tmp_path, GOOD), ["run.seed=4"])
    assert a.digest() == b.digest()
    assert a.digest() != c.digest()


def test_to_toml_round_trips(tmp_path: Path) -> None:
    a = Config.from_toml(write(tmp_path, GOOD))
    text = to_toml(a.to_dict())
    b = Config.from_toml(write(tmp_path, text))
    assert a == b and a.digest() == b.digest()


def test_configs_are_frozen() -> None:
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.run = None  # type: ignore[misc]


@pytest.mark.parametrize(("section", "value", "key"), [
    ("scheduler", {"samples_per_insert": 4.0, "error_buffer": 1e4},
     "scheduler.samples_per_insert"),
    ("scheduler", {"max_policy_lag": 2}, "scheduler.max_policy_lag"),
    ("layout", {"learners": 0}, "layout.learners"),
    ("placement", {"adaptive": True}, "placement.adaptive"),
])
def test_a_learner_that_ingests_refuses_what_would_make_it_wait_for_itself(
        section: str, value: dict, key: str) -> None:
    raw = {"spec": {"x": {"dtype": "float32"}}, "layout": {"learners_ingest": True},
           "checkpoint": {"on_stop": False}}
    raw.setdefault(section, {}).update(value)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        Config.from_dict(raw)
    assert "learners_ingest" in str(err.value)


def test_a_layout_whose_learners_ingest_needs_no_actor_rank() -> None:
    from conduit_hpc.tools.launcher import ranks_for, ranks_problem

    cfg = Config.from_dict({"spec": {"x": {"dtype": "float32"}},
                            "layout": {"learners": 1, "buffers": 1, "learners_ingest": True}})
    assert cfg.layout.fixed_ranks == 2 and ranks_for(cfg) == 2
    assert ranks_problem(cfg, 2) is None and ranks_problem(cfg, 1) is not None
    plain = Config.from_dict({"spec": {"x": {"dtype": "float32"}},
                              "layout": {"learners": 1, "buffers": 1}})
    assert plain.layout.fixed_ranks == 3 and ranks_problem(plain, 2) is not None


def test_the_configs_bytes_beside_a_row_are_the_placements_bounds() -> None:
    """The config checks a shard's bytes before the placement package is imported (the
    config may not import it): its per-row bytes beside the payload are the same
    bounds, the most (the ring's blocks and a tree over up to twice the rows) for the
    size check and the least (a tree over a power of two) for the memory check. 96
    was neither."""
    from conduit_hpc.config.root import (
        STAMP_AND_INDEX_BYTES_PER_ROW,
        STAMP_AND_INDEX_MIN_BYTES_PER_ROW,
    )
    from conduit_hpc.placement.workload import INDEX_BYTES_PER_ROW, STAMP_BYTES_PER_ROW
    from conduit_hpc.storage.priority import PriorityIndex

    assert STAMP_AND_INDEX_BYTES_PER_ROW == STAMP_BYTES_PER_ROW + INDEX_BYTES_PER_ROW
    assert STAMP_AND_INDEX_MIN_BYTES_PER_ROW == STAMP_BYTES_PER_ROW + INDEX_BYTES_PER_ROW // 2
    for rows in (1024, 1025):  # a power of two, and just above one
        ix = PriorityIndex(rows, alpha=0.6)
        tree = sum(t._tree.nbytes for t in (ix.sum, ix.min)) / rows
        assert INDEX_BYTES_PER_ROW // 2 <= tree <= INDEX_BYTES_PER_ROW, (rows, tree)
