"""TOML documents built to hurt the reader itself: nesting and dotted keys deep enough to
break or stall tomllib, in a job file, a cluster file, a workload file or a ``--set``
value. Each is a ConfigError naming the file (or the override), read in linear time.

Before: arrays or inline tables nested a few hundred levels deep ended every reader
(conduit-hpc run, plan, --set) in a RecursionError traceback from inside tomllib; a
dotted key of 50,000 parts (a 100 kB file) held conduit-hpc run for over a minute (the
reader is quadratic in a key's parts), and the 64 MiB file limit let one hold it for
hours - on every rank, which load the config too."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_hpc import Config, ConfigError
from conduit_hpc.config.loader import parse_override, read_toml
from conduit_hpc.placement import ClusterModel
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli


def nested(kind: str, depth: int) -> str:
    if kind == "array":
        return "[" * depth + "1" + "]" * depth
    if kind == "table":
        return "{a = " * depth + "1" + "}" * depth
    return "{" + ".".join(["k"] * depth) + " = 1}"  # an inline table's dotted key


def document(kind: str, depth: int) -> str:
    if kind == "dotted":
        return "[run]\n" + ".".join(["a"] * depth) + " = 1\n"
    if kind == "header":
        return "[" + ".".join(['"a"'] * depth) + "]\n"
    return f"[run]\nname = {nested(kind, depth)}\n"


READERS = {
    "job": lambda p: Config.from_toml(p),
    "cluster": lambda p: ClusterModel.from_toml(p),
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("kind", ["array", "table", "dotted", "header"])
def test_a_document_too_deep_to_read_is_a_config_error_naming_the_file(
        reader: str, kind: str, tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(document(kind, 3000))
    with pytest.raises(ConfigError) as got:
        READERS[reader](path)
    assert str(path) in str(got.value)
    why = ("nests arrays or inline tables too deeply to read" if kind in ("array", "table")
           else "has a dotted key of more than 64 parts (line ")
    assert why in str(got.value), str(got.value)


@pytest.mark.parametrize("kind", ["array", "table", "inline-dotted"])
def test_an_override_too_deep_to_read_is_a_config_error_naming_its_key(kind: str) -> None:
    with pytest.raises(ConfigError, match=r"override 'run\.name': its value ") as got:
        parse_override(f"run.name={nested(kind, 3000)}")
    assert got.value.key == "run.name"


@pytest.mark.parametrize("argv", [
    ["plan", str(REPO / "jobs/cluster-local.toml"), "--workload", "DEEP"],
    ["plan", "DEEP"],
    ["slurm", str(REPO / "jobs/synthetic.toml"), "--set", "run.name=" + nested("array", 3000)],
])
def test_the_cli_says_it_in_one_line(argv: list[str], tmp_path: Path, capsys) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text(document("array", 3000))
    assert cli.main([str(deep) if a == "DEEP" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("conduit-hpc: error: ConfigError: ") and "Traceback" not in err
    assert "too deeply to read" in err, err


def test_keys_and_values_a_config_has_still_read(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text("[run]\nname = 'x'\n" + ".".join(["a"] * 64) + " = 1\n"
                    + "v = '" + ".".join(["1"] * 200) + "'\n"  # dots in a string: no key
                    + "w = " + nested("array", 30) + "\n")
    raw = read_toml(path)  # read; what it says is for validation to judge
    assert raw["run"]["v"] == ".".join(["1"] * 200) and raw["run"]["name"] == "x"
    assert parse_override("run.name=" + ".".join(["x"] * 200)) == ("run.name", ".".join(
        ["x"] * 200))  # a bare word with dots stays a string


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["array", "table", "dotted", "header", "inline-dotted"]),
       depth=st.integers(min_value=1, max_value=2500))
def test_any_depth_loads_or_is_a_config_error(kind: str, depth: int) -> None:
    text = (document(kind, depth) if kind != "inline-dotted"
            else f"[run]\nname = {nested(kind, depth)}\n")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.toml"
        path.write_text(text)
        try:
            Config.from_toml(path)
        except ConfigError as err:
            assert isinstance(err.key, str)
