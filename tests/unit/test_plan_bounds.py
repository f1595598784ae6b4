"""``conduit-hpc plan`` given extreme values: one ``ConfigError`` line naming the field,
the value and the range, at load (before: an ``OverflowError`` or a linprog ``ValueError``
traceback, a message naming no field, "the placement LP is infeasible" for a capacity of
1e30 GB, and nonsense plans for a latency of 1e300 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli

CLUSTER = REPO / "jobs" / "cluster-local.toml"
JOB = REPO / "jobs" / "synthetic.toml"


def _plan(capsys, cluster: Path, workload: Path) -> str:
    assert cli.main(["plan", str(cluster), "--workload", str(workload)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("conduit-hpc: error: ConfigError: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(("lines", "fragment"), [
    ("row_bytes = 9223372036854775807",
     "workload.row_bytes must be between 1 and 4294967296 (4 GiB), got 9223372036854775807"),
    ("row_bytes = 100\nupdate_rate_hz = 1e-308",
     "workload.update_rate_hz must be between 1e-06 and 1e+06 updates per second, got 1e-308"),
    ("row_bytes = 100\nactor_rows_per_s = 1e308",
     "workload.actor_rows_per_s must be between 0 and 1e+09 rows per second, got 1e+308"),
    ("row_bytes = 100\ncompute_s = 1e300", "workload.compute_s must be between 0 and 1e+07"),
    ("row_bytes = 4294967296\ncapacity_rows = 1099511627776",
     "workload.capacity_rows must be at most 4611686018427387904 bytes of replay"),
    ("row_bytes = 100\nfoo = 1", "unknown key 'workload.foo' in [workload]"),
])
def test_extreme_workload_values_are_named(lines: str, fragment: str, tmp_path: Path,
                                           capsys) -> None:
    w = tmp_path / "w.toml"
    w.write_text("[workload]\n" + ("" if "capacity_rows" in lines else "capacity_rows = 1000\n")
                 + lines + "\n")
    err = _plan(capsys, CLUSTER, w)
    assert f"w.toml: {fragment}" in err, err


def test_a_workload_that_is_not_a_table_is_named(tmp_path: Path, capsys) -> None:
    w = tmp_path / "w.toml"
    w.write_text("workload = 1\n")
    assert "w.toml: workload must be a table, got 1" in _plan(capsys, CLUSTER, w)


@pytest.mark.parametrize(("old", "new", "fragment"), [
    ('"2 GB"', "1e300", "nodes[0].learner_host_bytes must be at most 1000000000000000 "
                        "bytes (1 PB), got 1e+300"),
    ('"2 GB"', '"1e30 GB"', "nodes[0].learner_host_bytes must be at most 1000000000000000 "
                            "bytes (1 PB), got '1e30 GB'"),
    ("latency_s = 1.5e-6", "latency_s = 1e300",
     "nodes[0].shm.latency_s must be a finite number >= 0 (seconds), at most 60, got 1e+300"),
    ("bandwidth_gbps = 8.0", "bandwidth_gbps = 1e-300",
     "nodes[0].shm.bandwidth_gbps must be a finite number > 0 (GB/s), between 1e-06 and "
     "1e+06, got 1e-300"),
    ("bandwidth_gbps = 8.0", "bandwidth_gbps = 1e300",
     "nodes[0].shm.bandwidth_gbps must be a finite number > 0 (GB/s), between 1e-06 and "
     "1e+06, got 1e+300"),
])
def test_extreme_cluster_values_are_named(old: str, new: str, fragment: str,
                                          tmp_path: Path, capsys) -> None:
    text = CLUSTER.read_text()
    assert old in text
    c = tmp_path / "c.toml"
    c.write_text(text.replace(old, new, 1))
    err = _plan(capsys, c, JOB)
    assert f"c.toml: {fragment}" in err, err


def test_values_at_the_bounds_still_plan(tmp_path: Path, capsys) -> None:
    w = tmp_path / "w.toml"
    w.write_text("[workload]\ncapacity_rows = 1000\nrow_bytes = 100\nupdate_rate_hz = 1e-6\n"
                 "actor_rows_per_s = 1e9\n")
    c = tmp_path / "c.toml"
    c.write_text(CLUSTER.read_text().replace('"2 GB"', "1e15").replace(
        "latency_s = 1.5e-6", "latency_s = 60"))
    assert cli.main(["plan", str(c), "--workload", str(w)]) == 0
    assert "bottleneck:" in capsys.readouterr().out


def test_a_cluster_without_ranks_is_infeasible_not_a_traceback(tmp_path: Path, capsys) -> None:
    # learners = buffers = actors = 0: no location at all; the infeasibility report
    # indexed an empty float array with itself (IndexError traceback)
    c = tmp_path / "c.toml"
    c.write_text('[[nodes]]\nname = "n"\nlearners = 0\nbuffers = 0\nactors = 0\n'
                 'shm = { bandwidth_gbps = 8.0 }\n')
    assert cli.main(["plan", str(c)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("conduit-hpc: error: PlacementInfeasible: ") and err.count("\n") == 1
    assert "learner_host: 0 x 0 B" in err, err
