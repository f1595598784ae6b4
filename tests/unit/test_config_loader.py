"""The one loading path: files, overrides, strict types, job sections, sane sizes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conduit_hpc import Config, ConfigError
from conduit_hpc.config import declared_config, load, read_toml, to_toml
from conduit_hpc.placement.cluster import ClusterModel

REPO = Path(__file__).resolve().parents[2]
SPEC = '[spec.obs]\ndtype = "float32"\nshape = [4]\n'


def write(tmp_path: Path, text: str | bytes, name: str = "job.toml") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


# ---------------------------------------------------------------------------------
# reading files


def test_unreadable_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as info:
        Config.from_toml(tmp_path / "nope.toml")
    assert "nope.toml" in str(info.value)
    with pytest.raises(ConfigError, match="is a directory") as info:
        Config.from_toml(tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 14, line 2\)"):
        Config.from_toml(write(tmp_path, b"[run]\nname = \"\xff\"\n"))


def test_a_byte_order_mark_first_is_read_past(tmp_path: Path) -> None:
    # what some Windows editors save; it was "is not valid TOML: Invalid statement (at
    # line 1, column 1)" for a file that looks right in every editor
    cfg = Config.from_toml(write(tmp_path, "\ufeff[run]\nseed = 7\n".encode()))
    assert cfg.run.seed == 7
    with pytest.raises(ConfigError, match="is not valid TOML"):  # only first, as in UTF-8
        Config.from_toml(write(tmp_path, "[run]\n\ufeffseed = 7\n".encode()))


def test_toml_syntax_errors_name_file_and_line(tmp_path: Path) -> None:
    p = write(tmp_path, "[run]\nseed = 1\nseed = 2\n")  # a duplicated key
    with pytest.raises(ConfigError, match=r"is not valid TOML.*line 3") as info:
        Config.from_toml(p)
    assert "job.toml" in str(info.value) and info.value.key == ""
    with pytest.raises(ConfigError, match="line 2"):
        ClusterModel.from_toml(write(tmp_path, "name = 'c'\n[[nodes]\n", "cluster.toml"))


def test_overrides_unknown_keys_and_malformed_ones(tmp_path: Path) -> None:
    p = write(tmp_path, SPEC)
    with pytest.raises(ConfigError, match=r"unknown key 'storage\.capacity_rowz'") as info:
        Config.from_toml(p, ["storage.capacity_rowz=3"])
    assert info.value.key == "storage.capacity_rowz"
    with pytest.raises(ConfigError, match="unknown key 'nosuch'"):
        Config.from_toml(p, ["nosuch.key=3"])
    with pytest.raises(ConfigError, match=r"run\.name is 'x', not a table"):
        Config.from_toml(p, ["run.name=x", "run.name.deeper=1"])
    with pytest.raises(ConfigError, match="dotted names"):
        Config.from_toml(p, ["storage..capacity_rows=1"])
    assert Config.from_toml(p, ["scheduler.batch_rows = 7"]).scheduler.batch_rows == 7


# ---------------------------------------------------------------------------------
# strict types


@pytest.mark.parametrize(("raw", "key", "fragment"), [
    ({"storage": {"capacity_rows": True}}, "storage.capacity_rows", "must be an integer"),
    ({"storage": {"capacity_rows": 1.0}}, "storage.capacity_rows", "must be an integer"),
    ({"storage": {"initial_priority": "1"}}, "storage.initial_priority", "must be a number"),
    ({"layout": {"per_node": 1}}, "layout.per_node", "must be true or false"),
    ({"run": {"name": 3}}, "run.name", "must be a string"),
    ({"storage": 3}, "storage", "must be a table"),
    ({"spec": {"obs": {"shape": [4]}}}, "spec.obs.dtype", "is required"),
    ({"spec": {"obs": {"dtype": "float32", "shape": [1, "2"]}}}, "spec.obs.shape[1]",
     "must be an integer"),
    ({"storage": {"capacity_rows": 2**64}}, "storage.capacity_rows", "64-bit"),
])
def test_strict_types_name_the_key(raw: dict, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        Config.from_dict(raw)
    assert info.value.key == key and key in str(info.value)


def test_lists_for_tuples_and_integers_for_numbers() -> None:
    cfg = Config.from_dict({"storage": {"initial_priority": 2},
                            "placement": {"tiers": ["buffer_host"]}})
    assert cfg.storage.initial_priority == 2.0
    assert isinstance(cfg.storage.initial_priority, float)
    assert cfg.placement.tiers == ("buffer_host",)


# ---------------------------------------------------------------------------------
# sizes that would break a rank later


@pytest.mark.parametrize(("raw", "key"), [
    ({"storage": {"capacity_rows": 2**40 + 1}}, "storage.capacity_rows"),
    ({"spec": {"obs": {"dtype": "float64", "shape": [2**31]}}}, "spec.obs.shape"),
    ({"spec": {"obs": {"dtype": "float64", "shape": [2**16, 2**16]}}}, "spec.obs.shape"),
    ({"spec": {"obs": {"dtype": "float64", "shape": [2**20, 2**8]}},
      "storage": {"capacity_rows": 2**40}}, "storage.capacity_rows"),
    ({"scheduler": {"batch_rows": 2**31}}, "scheduler.batch_rows"),
    ({"scheduler": {"min_fill_rows": 10}, "storage": {"capacity_rows": 9}},
     "scheduler.min_fill_rows"),
    ({"longhaul": {"queue_rows": 2**41}}, "longhaul.queue_rows"),
    # an owner sends a batch's rows in one message: 512 rows of 4.2 MB is past 2 GiB
    ({"spec": {"x": {"dtype": "uint8", "shape": [4_200_000]}},
      "scheduler": {"mode": "service", "batch_rows": 512}}, "scheduler.batch_rows"),
    ({"spec": {"x": {"dtype": "uint8", "shape": [4_200_000]}},
      "scheduler": {"mode": "sync", "fetch": "owner", "batch_rows": 512}},
     "scheduler.batch_rows"),
    ({"spec": {"x": {"dtype": "uint8", "shape": [1_000_000]}},
      "scheduler": {"mode": "service", "batch_rows": 64, "sampler": "sequence",
                    "sequence_length": 40}, "storage": {"capacity_rows": 100}},
     "scheduler.batch_rows"),
    ({"run": {"timeout_s": 1e300}}, "run.timeout_s"),
    ({"run": {"seed": 2**40}}, "run.seed"),
])
def test_sizes_are_bounded(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_dict(raw)
    assert info.value.key == key and key in str(info.value)


def test_a_batch_past_one_message_is_fine_where_no_owner_sends_it() -> None:
    # the rows are gathered one-sided (in parts past 2 GiB: RmaWindow.get_blocks)
    cfg = Config.from_dict({"spec": {"x": {"dtype": "uint8", "shape": [4_200_000]}},
                            "scheduler": {"mode": "edp", "batch_rows": 512}})
    assert cfg.scheduler.batch_rows == 512


# ---------------------------------------------------------------------------------
# job sections declared by jobs


def test_job_files_load_with_the_class_their_script_declares() -> None:
    cfg = Config.from_toml(REPO / "jobs" / "synthetic.toml", ["synthetic.supersteps=20"])
    assert type(cfg).__name__ == "SyntheticConfig" and isinstance(cfg, Config)
    assert cfg.synthetic.supersteps == 20 and cfg.synthetic.batch_rows == 64  # type: ignore[attr-defined]
    cls, _ = declared_config(REPO / "jobs" / "synthetic.toml")
    assert cls is type(cfg)  # imported once
    assert cls.from_toml(REPO / "jobs" / "synthetic.toml") == Config.from_toml(
        REPO / "jobs" / "synthetic.toml")
    with pytest.raises(ConfigError, match=r"unknown key 'synthetic\.bogus'"):
        Config.from_toml(REPO / "jobs" / "synthetic.toml", ["synthetic.bogus=1"])


JOB_SCRIPT = '''
from dataclasses import dataclass, field
from conduit_hpc import Config

@dataclass(frozen=True, slots=True, kw_only=True)
class Knobs:
    steps: int = 1

@dataclass(frozen=True, slots=True, kw_only=True)
class MyConfig(Config):
    mine: Knobs = field(default_factory=Knobs)

JOB_CONFIG = MyConfig

if __name__ == "__main__":
    raise SystemExit("importing must not run the job")
'''


def test_undeclared_tables_are_refused_with_the_reason(tmp_path: Path) -> None:
    p = write(tmp_path, SPEC + "[mine]\nsteps = 3\n", "a.toml")
    with pytest.raises(ConfigError, match=r"unknown key 'mine'.*no job script") as info:
        Config.from_toml(p)
    assert info.value.key == "mine"
    write(tmp_path, "x = 1\n", "a.py")
    with pytest.raises(ConfigError, match="declares no JOB_CONFIG"):
        Config.from_toml(p)
    write(tmp_path, "raise RuntimeError('boom')\n", "a.py")
    with pytest.raises(ConfigError, match="RuntimeError: boom"):
        load(Config, write(tmp_path, SPEC + "[mine]\nsteps = 3\n", "a.toml"))
    q = write(tmp_path, SPEC + "[mine]\nsteps = 3\n", "b.toml")
    write(tmp_path, JOB_SCRIPT, "b.py")
    cfg = Config.from_toml(q)
    assert type(cfg).__name__ == "MyConfig" and cfg.mine.steps == 3  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"mine\.steps must be an integer"):
        Config.from_toml(q, ["mine.steps=true"])


def test_resolved_config_round_trips_through_tomli_w(tmp_path: Path) -> None:
    cfg = Config.from_toml(REPO / "jobs" / "dqn_cartpole.toml")
    text = to_toml(cfg.to_dict())
    p = write(tmp_path, text, "resolved.toml")
    assert read_toml(p) == cfg.to_dict()
    assert type(cfg).from_toml(p) == cfg


def test_cluster_file_errors_keep_their_information(tmp_path: Path) -> None:
    text = textwrap.dedent("""
        name = "c"
        [[nodes]]
        name = "n"
        shm = { bandwidth_gbps = 1.0 }
        gpus = "two"
    """)
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.gpus must be an integer, got 'two'"):
        ClusterModel.from_toml(write(tmp_path, text, "cluster.toml"))


def test_no_path_holds_the_loader_forever(tmp_path, monkeypatch) -> None:
    """``conduit-hpc run /dev/zero`` (and ``plan``, any TOML a path names) read forever,
    growing; a FIFO nobody writes to blocked forever. Devices are refused, a file past
    the limit too, a FIFO is read as its writer writes (``<(...)``), and a quiet one is
    given up."""
    import os
    import threading

    from conduit_hpc.config import loader

    with pytest.raises(ConfigError, match=r"'/dev/zero' is not a regular file \(a device"):
        read_toml("/dev/zero")
    monkeypatch.setattr(loader, "MAX_TOML_BYTES", 1000)
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 200)
    with pytest.raises(ConfigError, match="is larger than 1000 bytes"):
        read_toml(big)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    monkeypatch.setattr(loader, "FIFO_QUIET_S", 0.3)
    with pytest.raises(ConfigError, match=r"is a FIFO whose writer sent nothing for 0.3 s"):
        read_toml(fifo)  # no writer ever opens it
    monkeypatch.setattr(loader, "FIFO_QUIET_S", 60.0)  # a loaded machine's thread start
    writer = threading.Thread(target=lambda: fifo.write_text('name = "x"\n'))
    writer.start()
    try:
        assert read_toml(fifo) == {"name": "x"}
    finally:
        writer.join(10)


def test_a_number_past_pythons_digit_limit_is_a_config_error(tmp_path: Path) -> None:
    """tomllib reads an integer with int(), which refuses more than 4300 digits with a
    plain ValueError: a TOML file or a --set value of 5000 digits ended conduit-hpc run
    (and plan) with a traceback. Now a ConfigError naming the file or the key."""
    big = "9" * 5000
    path = write(tmp_path, f"[storage]\ncapacity_rows = {big}\n")
    with pytest.raises(ConfigError, match=r"holds a number too long to read .*4300 digits"):
        read_toml(path)
    with pytest.raises(ConfigError, match=r"holds a number too long to read"):
        ClusterModel.from_toml(write(tmp_path, f"name = 'x'\nfoo = {big}\n", "cluster.toml"))
    ok = write(tmp_path, "[storage]\ncapacity_rows = 1000\n", "ok.toml")
    with pytest.raises(ConfigError, match=r"override 'storage\.capacity_rows': its value, "
                                          r"5000 characters, is a number too long") as got:
        load(Config, ok, [f"storage.capacity_rows={big}"])
    assert got.value.key == "storage.capacity_rows"
