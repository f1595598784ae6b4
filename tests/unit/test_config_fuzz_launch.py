"""Values the loader takes that a launched job could still not run on: refused by
``Config.check_launch`` before any rank starts, naming the field, the value and the limit.

Before: ``scheduler.batch_rows = 2000000000`` (56 GB a batch, three at once in mode edp)
passed every check; mpirun started every rank, and the learner ended after run.timeout_s
with 'DataPlaneTimeout: waited 15.0 s for batch 0' - nothing said that the batch could
never fit in the node's memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_hpc import Config, ConfigError
from conduit_hpc.config import LaunchWorld
from conduit_hpc.testing import REPO
from conduit_hpc.tools import cli

GB = 10**9
JOB = REPO / "jobs" / "synthetic.toml"
SPEC = {"obs": {"dtype": "float32", "shape": [250]}}  # 1,000-byte rows


def world(memory: int | None = GB, learners: int | None = 1) -> LaunchWorld:
    return LaunchWorld(3, learners=learners, buffers=1, actors=1, memory_bytes=memory)


def cfg(**scheduler: object) -> Config:
    return Config.from_dict({"spec": SPEC, "storage": {"capacity_rows": 1000},
                             "scheduler": scheduler})


def test_a_learner_batch_past_a_nodes_memory_is_refused_before_launch(
        tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("CONDUIT_MPIRUN", "/bin/false")  # a missed check: exit 1 at once
    argv = ["run", str(JOB), "-n", "3", "--runs", str(tmp_path), "--launcher", "mpirun",
            "--set", "layout.actors=1", "--set", "scheduler.batch_rows=2000000000"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("conduit-hpc: error: ConfigError: scheduler.batch_rows = "
                          "2000000000 needs 168 GB on each learner (3 batch(es) of "
                          "2,000,000,000 x 1 rows of 28 bytes"), err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # no run directory


@pytest.mark.parametrize(("scheduler", "batches"), [
    ({"mode": "edp", "prefetch_depth": 2}, 3),
    ({"mode": "edp", "prefetch_depth": 0}, 1),
    ({"mode": "sync", "prefetch_depth": 4}, 1),
    ({"mode": "service", "prefetch_depth": 4}, 1),
    ({"mode": "edp", "prefetch_depth": 4}, 5),
])
def test_the_learners_batches_are_counted_as_it_holds_them(scheduler: dict, batches: int
                                                           ) -> None:
    rows = GB // 1000 // batches  # exactly a node of 1 GB
    cfg(batch_rows=rows, **scheduler).check_launch(world())
    with pytest.raises(ConfigError, match=rf"needs .* on each learner \({batches} "
                                          rf"batch\(es\) of {rows + 1:,} x 1 rows of 1000 "
                                          r"bytes") as got:
        cfg(batch_rows=rows + 1, **scheduler).check_launch(world())
    assert got.value.key == "scheduler.batch_rows"


def test_a_sequence_window_multiplies_the_batch() -> None:
    ok = cfg(batch_rows=100_000, sampler="sequence", sequence_length=3, mode="sync")
    ok.check_launch(world(memory=3 * 100_000 * 1000))
    with pytest.raises(ConfigError, match=r"x 3 rows of 1000 bytes"):
        ok.check_launch(world(memory=3 * 100_000 * 1000 - 1))


def test_no_learner_or_no_known_memory_takes_what_fits_64_bits() -> None:
    big = cfg(batch_rows=2**31 - 1)
    big.check_launch(world(learners=0))  # no learner holds a batch
    big.check_launch(world(memory=None))  # slurm on a login node: the 64-bit bound only
    with pytest.raises(ConfigError, match=r"scheduler\.batch_rows"):
        big.check_launch(world(memory=GB, learners=None))  # per_node: the layout's count
