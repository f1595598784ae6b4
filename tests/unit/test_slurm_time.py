"""``conduit-hpc slurm`` refuses a preemption warning that cannot fit the time limit, a
malformed time and an empty module name (before: ``-t 1`` rendered ``--time=1`` with
``--signal=B:TERM@120``, an endless requeue loop; ``--signal-secs 70000``, ``--time
99:99:99`` and ``--module ''`` were rendered as given)."""

from __future__ import annotations

import re

import pytest

from conduit_hpc.errors import ConfigError
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli
from conduit_hpc.tools.slurm import SlurmRequest, render_sbatch
from conduit_hpc.tools.slurm_time import time_limit_s

JOB = REPO / "jobs" / "synthetic.toml"


@pytest.mark.parametrize(("time", "seconds"), [
    ("30", 1800), ("0", 0), ("1:30", 90), ("02:00:00", 7200), ("100:00:00", 360000),
    ("1-12", 129600), ("1-12:30", 131400), ("2-00:00:01", 172801),
])
def test_slurm_times_in_seconds(time: str, seconds: int) -> None:
    assert time_limit_s(time) == seconds


@pytest.mark.parametrize("time", ["99:99:99", "1:60", "01:60:00", "1-2:60", "1-2:3:60",
                                  "soon", "", "1:2:3:4", "-5", "1.5"])
def test_a_malformed_time_is_refused_naming_it(time: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("--time must be a SLURM time")
                       + ".*" + re.escape(f"got {time!r}")):
        SlurmRequest(time=time)


@pytest.mark.parametrize(("time", "signal_s", "fragment"), [
    ("1", 120, "--signal-secs must be below the --time limit 1 (60 s)"),
    ("2", 120, "--signal-secs must be below the --time limit 2 (120 s)"),
    ("0:30", 30, "--signal-secs must be below the --time limit 0:30 (30 s)"),
    ("3-00", 70000, "--signal-secs must be between 0 and 65535"),
    ("3-00", -1, "--signal-secs must be between 0 and 65535"),
])
def test_a_warning_that_cannot_fit_is_refused(time: str, signal_s: int, fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)) as err:
        SlurmRequest(time=time, signal_s=signal_s)
    assert f"got {signal_s}" in str(err.value)


@pytest.mark.parametrize(("time", "signal_s"), [("3", 120), ("0", 120), ("1", 0),
                                                ("3-00", 65535)])
def test_a_warning_within_the_limit_is_rendered(time: str, signal_s: int) -> None:
    text = render_sbatch(JOB, SlurmRequest(time=time, signal_s=signal_s))
    assert f"#SBATCH --time={time}\n" in text and text.endswith("\n")
    assert (f"#SBATCH --signal=B:TERM@{signal_s}\n" in text) == bool(signal_s)


@pytest.mark.parametrize("module", ["", "  "])
def test_an_empty_module_name_is_refused(module: str, capsys) -> None:
    assert cli.main(["slurm", str(JOB), "--module", module]) == 2
    err = capsys.readouterr().err
    assert f"ConfigError: --module must be a module name (not empty), got {module!r}" in err
    assert "module load" not in capsys.readouterr().out


def test_the_cli_refuses_the_requeue_loop_in_one_line(capsys) -> None:
    assert cli.main(["slurm", str(JOB), "-t", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "--signal-secs must be below the --time limit 1 (60 s)" in captured.err
