"""Config values that passed the loader and failed only on the ranks are refused before
any rank starts (before: ``--set 'spec={}'`` failed on the ranks with SpecError; a
sequence longer than the replay ended in a misleading DataPlaneClosed; ``--set
run.name=1979-05-27`` became a TOML date)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_hpc import Config
from conduit_hpc.config.loader import parse_override
from conduit_hpc.errors import ConfigError
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli

JOB = str(REPO / "jobs/synthetic.toml")
EMPTY_SPEC = ("ConfigError: spec must be at least one field (a [spec.NAME] table with a "
              "dtype) for a job to run, got {}")


@pytest.mark.parametrize("command", ["run", "slurm"])
def test_an_empty_spec_is_refused_before_launch(command: str, tmp_path: Path,
                                                capsys) -> None:
    runs = tmp_path / "runs"
    extra = ["--runs", str(runs)] if command == "run" else []
    assert cli.main([command, JOB, "--set", "spec={}", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"conduit-hpc: error: {EMPTY_SPEC}\n"
    assert captured.out == "" and not runs.exists()


def test_a_config_without_spec_still_loads_for_the_tools() -> None:
    cfg = Config.from_toml(JOB, ["spec={}"])  # plan/info/layout tools take it
    assert cfg.spec == {}
    with pytest.raises(ConfigError, match=r"spec must be at least one field"):
        cfg.check_runnable()
    Config.from_toml(JOB).check_runnable()


@pytest.mark.parametrize(("sets", "ok"), [
    (["scheduler.sequence_length=6000", "storage.capacity_rows=5000"], False),
    (["scheduler.sequence_length=4000", "scheduler.burn_in=1001",
      "storage.capacity_rows=5000"], False),
    (["scheduler.sequence_length=4000", "scheduler.burn_in=1000",
      "storage.capacity_rows=5000"], True),
])
def test_a_sequence_longer_than_the_replay_is_refused_at_load(sets: list[str], ok: bool) -> None:
    sets = ["scheduler.sampler=sequence", "scheduler.min_fill_rows=5000", *sets]
    if ok:
        assert Config.from_toml(JOB, sets).scheduler.window == 5000
        return
    with pytest.raises(ConfigError, match=r"scheduler.sequence_length must be a window \("
                       r"burn_in \d+ \+ sequence_length\) of at most storage.capacity_rows "
                       r"\(5000\) rows"):
        Config.from_toml(JOB, sets)


@pytest.mark.parametrize("text", ["1979-05-27", "1979-05-27T07:32:00", "07:32:00",
                                  "1979-05-27 07:32:00Z"])
def test_a_toml_date_in_an_override_stays_its_text(text: str) -> None:
    assert parse_override(f"run.name={text}") == ("run.name", text)


def test_a_date_like_run_name_is_the_name_given() -> None:
    assert Config.from_toml(JOB, ["run.name=1979-05-27"]).run.name == "1979-05-27"


@pytest.mark.parametrize("value", ["1e400", "nan", "-1.0", "3601.0"])
def test_the_example_jobs_compute_time_is_refused_unless_finite(value: str, tmp_path: Path,
                                                                 capsys) -> None:
    # compute_s = 1e400 (inf) was taken and rank 0 failed with OverflowError (a hostile
    # test, stop 35): refused before launch, naming the field
    runs = tmp_path / "runs"
    assert cli.main(["run", JOB, "--set", f"synthetic.compute_s={value}", "--runs",
                     str(runs)]) == 2
    err = capsys.readouterr().err
    assert "compute_s" in err and ">= 0 and <= 3600" in err and not runs.exists()
