"""``bench scale --measured-learners``: the link fitted from two all-reduce times, the
runs' metrics read back, the model's per-superstep time for 1 and 2 learners, and the
comparison's ratios - on small files and dicts, no launch."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from conduit_hpc.bench._scale_measured import (
    AGREE_BYTES,
    compare_learners,
    fit_link,
    load_learner_runs,
    predict_learners,
)
from conduit_hpc.bench.allreduce import ring_allreduce_s
from conduit_hpc.placement.clusterfile import LinkSpec

REPO = Path(__file__).resolve().parents[2]
COSTS = {"gather_s_per_row": 1e-7, "gather_s_per_byte": 1e-10, "sample_s_per_row": 2e-7,
         "update_s_per_row": 3e-7, "rma_message_s": 5e-6, "handoff_s": 2e-5,
         "request_s": 2e-5, "ingest_s_per_row": 1e-7, "ingest_s_per_byte": 1e-10}
# a run's config.toml, without the DQN job's own tables (loading those imports the job)
CONFIG = """
[layout]
learners = {learners}
buffers = 1
actors = 2
[spec.obs]
dtype = "float32"
shape = [4]
[spec.action]
dtype = "int64"
[storage]
capacity_rows = 100000
[scheduler]
mode = "edp"
sampler = "prioritized"
batch_rows = 32
"""


def test_fit_link_inverts_the_ring_model() -> None:
    true = LinkSpec(bandwidth_gbps=1.5, latency_s=60e-6)
    agree = ring_allreduce_s(AGREE_BYTES, 2, true.bandwidth_gbps, true.latency_s)
    large = ring_allreduce_s(4e6, 2, true.bandwidth_gbps, true.latency_s)
    link = fit_link(agree, large, 4e6)
    assert link.latency_s == pytest.approx(60e-6, rel=1e-3)
    assert link.bandwidth_gbps == pytest.approx(1.5, rel=1e-3)
    # and the fitted link predicts a third size it was not fitted to
    assert ring_allreduce_s(69_640, 2, link.bandwidth_gbps, link.latency_s) == \
        pytest.approx(ring_allreduce_s(69_640, 2, 1.5, 60e-6), rel=1e-3)


def test_fit_link_refuses_what_no_link_explains() -> None:
    with pytest.raises(ValueError, match="no slower than 2 latencies"):
        fit_link(100e-6, 90e-6, 4e6)
    with pytest.raises(ValueError, match="agree_s=0"):
        fit_link(0, 90e-6, 4e6)


def write_run(root: Path, name: str, learners: int, compute: list[float],
              exposed: list[float], allreduce: float, agree: float) -> Path:
    run = root / name
    (run / "metrics").mkdir(parents=True)
    (run / "config.toml").write_text(CONFIG.format(learners=learners))
    summary = {"learners": learners, "allreduce_mean_s": allreduce if learners > 1
               else math.nan, "agree_mean_s": agree if learners > 1 else math.nan,
               "updates_per_s": 250.0, "ingest_rows_per_s": 1000.0}
    (run / "metrics" / "summary.json").write_text(json.dumps(summary))
    # the lead learner is the lowest rank: 2 before 10 (not the lexical order)
    for rank, scale in ((2, 1.0), (10, 100.0)):
        with open(run / "metrics" / f"learner-{rank}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["superstep", "iteration_s", "exposed_s", "compute_s"])
            for i, (c, e) in enumerate(zip(compute, exposed, strict=True)):
                w.writerow([i, scale * (c + e), scale * e, scale * c])
    return run


def test_load_learner_runs_reads_the_lead_learner_without_warm_up(tmp_path: Path) -> None:
    # ten supersteps: the first (10 %) is warm-up and is dropped
    warm = [1.0]
    one = write_run(tmp_path, "a", 1, warm + [0.003] * 9, warm + [0.001] * 9, 0, 0)
    two = [write_run(tmp_path, f"b{i}", 2, warm + [c] * 9, warm + [0.002] * 9, ar, 0.0005)
           for i, (c, ar) in enumerate(((0.006, 0.001), (0.008, 0.003)))]
    m = load_learner_runs([str(one), *map(str, two)])
    assert sorted(m) == [1, 2]
    assert m[1]["runs"] == 1 and m[1]["allreduce_s"] == 0.0 and m[1]["agree_s"] == 0.0
    assert m[1]["compute_s"] == pytest.approx(0.003)
    assert m[1]["iteration_s"] == pytest.approx(0.004)
    assert m[2]["runs"] == 2
    assert m[2]["compute_s"] == pytest.approx(0.007)       # mean over the two runs
    assert m[2]["allreduce_s"] == pytest.approx(0.002)
    # compute between batches holds the all-reduce and the agreement: taken out
    assert m[2]["local_compute_s"] == pytest.approx(0.007 - 0.002 - 0.0005)


def test_load_learner_runs_names_a_run_without_learner_metrics(tmp_path: Path) -> None:
    (tmp_path / "r" / "metrics").mkdir(parents=True)
    (tmp_path / "r" / "metrics" / "summary.json").write_text('{"learners": 2}')
    with pytest.raises(FileNotFoundError, match=r"no learner-<rank>\.csv"):
        load_learner_runs([str(tmp_path / "r")])
    # a two-learner run from before the learners timed their collectives: named, refused
    old = write_run(tmp_path, "old", 2, [0.006] * 10, [0.002] * 10, 0.001, 0.0005)
    summary = json.loads((old / "metrics" / "summary.json").read_text())
    del summary["allreduce_mean_s"]
    (old / "metrics" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"old/metrics/summary.json: a run with 2 learners "
                                         r"without allreduce_mean_s"):
        load_learner_runs([str(old)])


def test_predict_learners_adds_the_ring_terms_on_the_given_link(tmp_path: Path) -> None:
    one = write_run(tmp_path, "a", 1, [0.003] * 10, [0.001] * 10, 0, 0)
    two = write_run(tmp_path, "b", 2, [0.006] * 10, [0.002] * 10, 0.001, 0.0005)
    measured = load_learner_runs([str(one), str(two)])
    link = LinkSpec(bandwidth_gbps=1.0, latency_s=100e-6)
    p = predict_learners(measured, COSTS, REPO / "jobs" / "cluster-local.toml", link,
                         69_640.0)
    assert p[1]["allreduce_s"] == 0.0 and p[1]["agree_s"] == 0.0
    assert p[2]["allreduce_s"] == pytest.approx(ring_allreduce_s(69_640, 2, 1.0, 100e-6))
    assert p[2]["agree_s"] == pytest.approx(ring_allreduce_s(AGREE_BYTES, 2, 1.0, 100e-6))
    for n in (1, 2):  # the runs' own local compute is the model's input
        assert p[n]["compute_s"] == pytest.approx(measured[n]["local_compute_s"])
        assert p[n]["exposed_s"] > 0
        assert p[n]["iteration_s"] == pytest.approx(
            p[n]["compute_s"] + p[n]["exposed_s"] + p[n]["allreduce_s"] + p[n]["agree_s"])


def test_compare_learners_gives_ratios_and_scaling(capsys: pytest.CaptureFixture) -> None:
    pred = {1: {"compute_s": 0.003, "exposed_s": 0.0001, "allreduce_s": 0.0,
                "agree_s": 0.0, "iteration_s": 0.0031},
            2: {"compute_s": 0.003, "exposed_s": 0.0001, "allreduce_s": 0.0002,
                "agree_s": 0.0001, "iteration_s": 0.0034}}
    meas = {1: {"exposed_s": 0.0002, "allreduce_s": 0.0, "agree_s": 0.0,
                "iteration_s": 0.0062, "runs": 3},
            2: {"exposed_s": 0.0002, "allreduce_s": 0.0008, "agree_s": 0.0001,
                "iteration_s": 0.0124, "runs": 3}}
    rows = compare_learners(pred, meas, "gloo probed here")
    out = capsys.readouterr().out
    assert "all-reduce link: gloo probed here" in out
    assert [r["learners"] for r in rows] == [1, 2]
    assert rows[0]["iteration_ratio"] == pytest.approx(0.5)
    assert math.isnan(rows[0]["allreduce_ratio"])  # one learner: nothing to all-reduce
    assert rows[1]["allreduce_ratio"] == pytest.approx(0.25)
    assert rows[1]["agree_ratio"] == pytest.approx(1.0)
    assert rows[1]["scaling_pred"] == pytest.approx(0.0034 / 0.0031)
    assert rows[1]["scaling_meas"] == pytest.approx(2.0)
    # a count predicted but not measured (or the reverse) is left out, not invented
    assert [r["learners"] for r in compare_learners(pred, {2: meas[2]})] == [2]
