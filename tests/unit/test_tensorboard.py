"""TensorBoard scalars ([run] tensorboard = true): metrics rows written as scalars and
read back with TensorBoard's own event reader; a clear error without the package."""

from __future__ import annotations

import builtins
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from extras import need_extra

from conduit_hpc import Config, ConfigError
from conduit_hpc.plane.metrics import ACTOR_COLUMNS, LEARNER_COLUMNS, CsvSink

need_extra("tensorboard", "tensorboard", module_level=True)

from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from conduit_hpc.features.tensorboard import TensorBoardScalars, scalar_tag  # noqa: E402


def config(on: bool, every_s: float = 0.0) -> Config:
    return Config.from_dict({"run": {"tensorboard": on, "tensorboard_every_s": every_s},
                             "spec": {"x": {"dtype": "float32"}}})


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def test_learner_and_actor_rows_become_scalars(tmp_path: Path) -> None:
    cfg = config(True)
    assert TensorBoardScalars.wanted(cfg) and not TensorBoardScalars.wanted(config(False))
    learner = SimpleNamespace(metrics=CsvSink(tmp_path / "learner-0.csv", LEARNER_COLUMNS))
    actor = SimpleNamespace(metrics=CsvSink(tmp_path / "actor-3.csv", ACTOR_COLUMNS))
    features = []
    for rank, (lrn, act) in enumerate(((learner, None), (None, actor))):
        f = TensorBoardScalars(cfg, None)
        f.attach(SimpleNamespace(run_dir=tmp_path, learner=lrn, actor=act,
                                 world_rank=rank * 3))
        features.append(f)
    for s in range(5):
        learner.metrics.add({"superstep": 10 + s, "time_s": 0.1 * s, "mode": "edp",
                             "exposed_s": 0.001 * s, "iteration_s": 0.01,
                             "limiter_wait_s": 0.0, "loss": 1.0 / (s + 1),
                             "mean_return": math.nan if s < 2 else 100.0 * s})
    for s in range(3):
        actor.metrics.add({"time_s": 1.0 * s, "rows": 64 * s, "rows_per_s": 64.0,
                           "limiter_wait_s": 0.5 * s, "policy_version": s})
    for f in features:
        f.close()
    got = scalars(tmp_path / "tensorboard" / "learner-0")
    assert got["job/loss"] == [(10 + s, pytest.approx(1.0 / (s + 1))) for s in range(5)]
    assert got["latency/exposed_s"][-1] == (14, pytest.approx(0.004))
    assert got["job/mean_return"] == [(12, 200.0), (13, 300.0), (14, 400.0)]  # NaN skipped
    assert "latency/mode" not in got and "latency/superstep" not in got
    acts = scalars(tmp_path / "tensorboard" / "actor-3")
    assert acts["ingest/rows"] == [(0, 0.0), (1, 64.0), (2, 128.0)]
    assert acts["limiter/actor_wait_s"][-1] == (2, 1.0)
    assert scalar_tag("learner", "limiter_wait_s") == "limiter/learner_wait_s"


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch) -> None:
    real = builtins.__import__

    def no_tensorboard(name: str, *args, **kw):
        if name.startswith("torch.utils.tensorboard"):
            raise ModuleNotFoundError("No module named 'tensorboard'")
        return real(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(ConfigError, match=r"conduit-hpc\[tensorboard\]") as err:
        TensorBoardScalars(config(True), None)
    assert err.value.key == "run.tensorboard"


def test_the_switch_is_validated() -> None:
    with pytest.raises(ConfigError, match="tensorboard"):
        Config.from_dict({"run": {"tensorboard": "yes"}, "spec": {"x": {"dtype": "float32"}}})


def test_a_learner_writes_each_columns_mean_once_a_window(tmp_path: Path) -> None:
    """The default: one scalar per tag a window (``run.tensorboard_every_s``), the mean of
    the window's finite values at its last superstep - not one per superstep, which cost
    a fast learner ~0.45 ms a superstep (3x its iteration) and ~600 bytes of event file."""
    assert Config.from_dict({"spec": {"x": {"dtype": "float32"}}}).run.tensorboard_every_s == 1
    learner = SimpleNamespace(metrics=CsvSink(tmp_path / "learner-0.csv", LEARNER_COLUMNS))
    f = TensorBoardScalars(config(True, every_s=1.0), None)
    now = [100.0]
    f.clock = lambda: now[0]
    f.attach(SimpleNamespace(run_dir=tmp_path, learner=learner, actor=None, world_rank=0))
    for s in range(5000):  # one window: 5,000 supersteps within 0.5 s
        now[0] = 100.0 + s * 1e-4
        learner.metrics.add({"superstep": s, "exposed_s": 0.001 * (s % 2), "rows": 256,
                             "loss": 2.0 if s % 2 else math.nan})
    now[0] = 101.5  # the window has lasted 1.5 s: this superstep closes it
    learner.metrics.add({"superstep": 5000, "exposed_s": 0.0, "rows": 256, "loss": 4.0})
    for s in range(5001, 5004):  # the next window, written at close()
        now[0] = 101.6
        learner.metrics.add({"superstep": s, "exposed_s": 0.003, "rows": 128})
    f.close()
    got = scalars(tmp_path / "tensorboard" / "learner-0")
    assert got["latency/exposed_s"] == [(5000, pytest.approx(0.0005 * 5000 / 5001)),
                                        (5003, pytest.approx(0.003))]
    assert got["learner/rows"] == [(5000, 256.0), (5003, 128.0)]
    # NaN skipped; a column absent from a window's rows writes nothing for it
    assert got["job/loss"] == [(5000, pytest.approx((2.0 * 2500 + 4.0) / 2501))]


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 3601.0, "1", True])
def test_the_window_is_validated(bad: object) -> None:
    with pytest.raises(ConfigError, match="tensorboard_every_s"):
        Config.from_dict({"run": {"tensorboard_every_s": bad},
                          "spec": {"x": {"dtype": "float32"}}})


def test_a_resumed_learner_s_scalars_go_back_to_its_checkpoint(tmp_path: Path) -> None:
    """A killed attempt logged supersteps 0..7; the resumed one, from the checkpoint at
    superstep 5, logged 5.. again: TensorBoard drew both (two values at 5, 6 and 7, the
    line going back). The resumed writer purges the killed attempt's from 5 on."""
    for first, last, loss in ((0, 8, 1.0), (5, 10, 2.0)):
        learner = SimpleNamespace(metrics=CsvSink(None, LEARNER_COLUMNS))
        f = TensorBoardScalars(config(True), None)
        f.attach(SimpleNamespace(run_dir=tmp_path, learner=learner, actor=None,
                                 world_rank=0))
        for s in range(first, last):
            learner.metrics.add({"superstep": s, "loss": loss})
        f.close()
    got = scalars(tmp_path / "tensorboard" / "learner-0")
    assert got["job/loss"] == [(s, 1.0) for s in range(5)] + [(s, 2.0) for s in range(5, 10)]


def test_a_resumed_actor_s_scalars_go_on_after_the_killed_attempt_s(tmp_path: Path) -> None:
    """An actor's scalars are stepped by its rows: a resumed attempt began at step 0
    again, over the killed attempt's (two values a step)."""
    for n in (3, 2):
        actor = SimpleNamespace(metrics=CsvSink(tmp_path / "actor-3.csv", ACTOR_COLUMNS))
        f = TensorBoardScalars(config(True), None)
        f.attach(SimpleNamespace(run_dir=tmp_path, learner=None, actor=actor, world_rank=3))
        for s in range(n):
            actor.metrics.add({"time_s": 1.0 * s, "rows": 64 * (s + 1), "rows_per_s": 64.0,
                               "limiter_wait_s": 0.0, "policy_version": n})
        actor.metrics.close()
        f.close()
    got = scalars(tmp_path / "tensorboard" / "actor-3")
    assert got["actor/policy_version"] == [(0, 3.0), (1, 3.0), (2, 3.0), (3, 2.0), (4, 2.0)]
