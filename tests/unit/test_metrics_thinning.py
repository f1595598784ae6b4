"""A learner's metrics file past ``run.metrics_full_rows`` supersteps: the writer keeps
every row, then one row per block of 2, 4, 8, ... supersteps with its ``weight``
(:class:`conduit_hpc.plane.sampled_rows.RowThinning`), and every reader weighs the rows: the
report, the benchmarks and the plan check give, on such a file, the counts of the full
file exactly and its means, shares and percentiles within sampling error. A row a
superstep grew the file by ~2 GB an hour; readers that counted rows would be wrong."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from conduit_hpc import Config, ConfigError
from conduit_hpc.bench._scale_measured import load_learner_runs, load_measured
from conduit_hpc.bench.exposed_latency import latency_stats
from conduit_hpc.features.longhaul.metrics import settled_mean
from conduit_hpc.plane.metrics import LEARNER_COLUMNS, CsvSink
from conduit_hpc.plane.sampled_rows import (
    RowThinning,
    row_weight,
    rows_after,
    weighted_median,
    weighted_percentile,
)
from conduit_hpc.tools.report.plan_check import plan_vs_measured
from conduit_hpc.tools.report.run_data import load_run, run_stats

S = 6000  # supersteps of the synthetic run
N = 150  # rows kept at each spacing in the thinned file (~800 rows in all)
#: relative tolerances: ~3x the sampling error's rms over 20 seeds of data and draws (a
#: reader that counted each row once was 21-25 % off on means and p95s, 87 % on the
#: limiter's total: a quarter of the supersteps, each sampled row standing for up to 32)
MEAN, P95, RARE = 0.08, 0.12, 0.3


def _rows(supersteps: int = S, seed: int = 0) -> list[dict]:
    """Learner rows of a run that slows down as it goes (the mean of a column over
    supersteps is not the mean over a thinned file's rows) and waits for the rate
    limiter every 4th superstep (a fixed place in each block would see every such
    superstep or none)."""
    rng = np.random.default_rng(seed)
    s = np.arange(supersteps)
    slow = 1.0 + 2.0 * s / supersteps
    compute = 0.004 * slow * rng.lognormal(0, 0.3, supersteps)
    parts = {c: 0.0005 * slow * rng.lognormal(0, 0.3, supersteps)
             for c in ("sample_s", "gather_s", "transform_s", "copy_s")}
    exposed = 0.3 * sum(parts.values()) + 0.0001
    limiter = np.where(s % 4 == 1, 0.002 * rng.lognormal(0, 0.3, supersteps), 0.0)
    iteration = compute + exposed + limiter
    t = np.cumsum(iteration)
    return [{"superstep": int(i), "time_s": float(t[i]), "mode": "edp",
             "iteration_s": float(iteration[i]), "exposed_s": float(exposed[i] + limiter[i]),
             "compute_s": float(compute[i]), **{c: float(v[i]) for c, v in parts.items()},
             "rows": 64, "staleness": 1, "limiter_wait_s": float(limiter[i]),
             "loss": float(1.0 / slow[i])}
            for i in s]


def _write(path: Path, rows: list[dict], full_rows: int | None) -> Path:
    """The rows through the learner's writer (``None``: a file written before the
    ``weight`` column, one row per superstep)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if full_rows is None:
        cols = [c for c in LEARNER_COLUMNS if c != "weight"] + ["loss"]
        with open(path, "w", newline="") as fh:
            w = csv.DictWriter(fh, cols, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        return path
    sink = CsvSink(path, LEARNER_COLUMNS, keep=False, thinning=RowThinning(full_rows))
    for i, r in enumerate(rows):
        sink.add(r)
        if i % 50 == 49:
            sink.flush()
    sink.close()
    return path


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _run(root: Path, name: str, rows: list[dict], full_rows: int | None) -> Path:
    run = root / name
    _write(run / "metrics" / "learner-0.csv", rows, full_rows)
    (run / "config.toml").write_text('[run]\nname = "t"\n\n[scheduler]\nmode = "edp"\n')
    (run / "metrics" / "summary.json").write_text(json.dumps({"learners": 1}))
    return run


# -- the writer ------------------------------------------------------------------------


def test_the_file_keeps_n_rows_then_n_rows_per_spacing_that_doubles(tmp_path: Path) -> None:
    rows = [{"superstep": i, "exposed_s": 0.001} for i in range(1000)]
    got = _read(_write(tmp_path / "learner-0.csv", rows, 10))
    steps = [int(r["superstep"]) for r in got]
    weights = [int(r["weight"]) for r in got]
    # 10 rows of 1 superstep, 10 of 2, 10 of 4, ..., then the incomplete block's row
    assert weights == ([1] * 10 + [2] * 10 + [4] * 10 + [8] * 10 + [16] * 10 + [32] * 10
                       + [64] * 5 + [1000 - 630 - 5 * 64])
    assert steps[:10] == list(range(10))
    # each row is a superstep of its block, in order
    start = np.concatenate([[0], np.cumsum(weights)[:-1]])
    assert all(b <= s < b + w for s, b, w in zip(steps, start, weights, strict=True))
    # N rows more each time the run doubles: N (1 + log2(1 + S / N)) rows at most
    for n, total in ((10, 1000), (7, 100_000), (1, 5000)):
        thin = RowThinning(n)
        kept = [r for r in (thin.offer({"superstep": i}) for i in range(total)) if r]
        kept += [r for r in [thin.rest()] if r]
        assert sum(r["weight"] for r in kept) == total
        assert len(kept) <= n * (1 + math.log2(1 + total / n)) + 1, (n, total, len(kept))


def test_every_row_with_metrics_full_rows_0_and_before_n(tmp_path: Path) -> None:
    rows = [{"superstep": i, "exposed_s": i * 1e-3} for i in range(300)]
    for n in (0, 300, 10**5):
        got = _read(_write(tmp_path / f"learner-{n}.csv", rows, n))
        assert [int(r["superstep"]) for r in got] == list(range(300))
        assert {r["weight"] for r in got} == {"1"}


def test_listeners_see_every_row_and_the_sample_is_uniform_in_each_block() -> None:
    seen: list[int] = []
    sink = CsvSink(None, LEARNER_COLUMNS, keep=False, thinning=RowThinning(1))
    sink.listeners.append(lambda r: seen.append(r["superstep"]))
    for i in range(2**14 - 1):
        sink.add({"superstep": i})
    assert seen == list(range(2**14 - 1))  # TensorBoard's rows are not thinned
    # where in its block each row falls, over many blocks of 16: uniform (with a fixed
    # place, work every 16 supersteps would be in every row or in none)
    thin = RowThinning(4096)
    for i in range(4096 * 15):
        thin.offer({"superstep": i})
    places = [thin.offer({"superstep": 4096 * 15 + i}) for i in range(4096 * 16)]
    counts = np.bincount([r["superstep"] % 16 for r in places if r], minlength=16)
    assert counts.sum() == 4096 and counts.min() > 180 and counts.max() < 340, counts


def test_run_metrics_full_rows_bad_values_are_refused_naming_the_field(tmp_path) -> None:
    good = ('[run]\nname = "t"\n\n[layout]\nlearners = 1\nbuffers = 1\nactors = 0\n\n'
            '[spec.obs]\ndtype = "float32"\nshape = [4]\n\n[storage]\ncapacity_rows = 100\n')
    (tmp_path / "job.toml").write_text(good)
    assert Config.from_toml(tmp_path / "job.toml").run.metrics_full_rows == 100_000
    assert Config.from_toml(tmp_path / "job.toml",
                            ["run.metrics_full_rows=0"]).run.metrics_full_rows == 0
    for bad, expected in (("-1", ">= 0"), ("2147483648", "<= 2147483647"),
                          ("1.5", "integer"), ('"many"', "integer"), ("true", "integer")):
        with pytest.raises(ConfigError) as info:
            Config.from_toml(tmp_path / "job.toml", [f"run.metrics_full_rows={bad}"])
        assert info.value.key == "run.metrics_full_rows", info.value
        assert expected in str(info.value) and bad.strip('"') in str(info.value).lower()
    with pytest.raises(ValueError, match=r"full_rows must be an integer >= 0.*-3"):
        RowThinning(-3)


# -- the readers -----------------------------------------------------------------------


def test_weighted_percentile_is_numpys_of_the_repeated_values() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 300):
        v, w = rng.normal(size=n), rng.integers(1, 9, n)
        for q in (0, 1, 25, 50, 95, 99, 100):
            assert weighted_percentile(v, w, q) == np.percentile(np.repeat(v, w), q)
        assert weighted_median(v, w) == np.median(np.repeat(v, w))
        assert weighted_median(v, np.ones(n)) == statistics.median(v)
    assert math.isnan(weighted_percentile([math.nan], [1], 50))


def test_rows_after_skips_supersteps_not_rows() -> None:
    rows = [{"weight": w} for w in ("1", "1", "2", "4", "4")]
    assert rows_after(rows, 2) == rows[2:] and rows_after(rows, 3) == rows[3:]
    assert rows_after(rows, 4) == rows[3:]  # the row of supersteps 4-7 starts at 4
    assert rows_after(rows, 5) == rows[4:] and rows_after(rows, 13) == []
    assert rows_after([{"superstep": "1"}] * 5, 2) == [{"superstep": "1"}] * 3  # no column
    assert [row_weight(r) for r in ({"weight": ""}, {"weight": "x"}, {"weight": "0"},
                                    {"weight": "8"})] == [1.0, 1.0, 1.0, 8.0]


def test_report_of_a_thinned_file_gives_the_full_files_figures(tmp_path: Path) -> None:
    rows = _rows()
    full = run_stats(load_run(_run(tmp_path, "full", rows, 0)))
    thin_run = _run(tmp_path, "thin", rows, N)
    assert len(_read(thin_run / "metrics" / "learner-0.csv")) < S / 5
    thin = run_stats(load_run(thin_run))
    assert thin["supersteps"] == full["supersteps"] == S  # exact: weights summed
    for keys, rel in ((("iteration_mean_ms", "exposed_mean_ms", "compute_mean_ms",
                        "exposed_share", "exposed_total_s", "path_work_s"), MEAN),
                      (("iteration_p95_ms", "exposed_p95_ms", "compute_p95_ms"), P95),
                      (("exposed_limiter_s", "learner_limiter_wait_s"), RARE)):
        for key in keys:
            assert thin[key] == pytest.approx(full[key], rel=rel), key
    # an old file (no weight column: a row a superstep) reads as before, weight 1
    old = run_stats(load_run(_run(tmp_path, "old", rows, None)))
    assert {k: v for k, v in old.items()} == {k: v for k, v in full.items()}


def test_the_timeline_of_a_thinned_file_draws_successive_supersteps(tmp_path) -> None:
    from conduit_hpc.tools.report.run_plots import plot_timeline

    run = load_run(_run(tmp_path, "thin", _rows(2000), 100))
    png, note = plot_timeline(run, tmp_path, window=8)
    assert png is not None and png.stat().st_size > 10_000 and note == ""


def test_bench_readers_on_a_thinned_file_give_the_full_files_figures(tmp_path) -> None:
    rows = _rows()
    full_dir, thin_dir = (_run(tmp_path, name, rows, n) for name, n in (("f", 0), ("t", N)))
    full = latency_stats(full_dir / "metrics" / "learner-0.csv")
    thin = latency_stats(thin_dir / "metrics" / "learner-0.csv")
    assert full["supersteps"] == S - S // 10 - 1  # warm-up and the last one left out
    assert abs(thin["supersteps"] - full["supersteps"]) <= 2 * 2 ** math.ceil(
        math.log2(S / N))  # the rows of the blocks at the two cuts
    for key in ("exposed_median_s", "iteration_median_s", "path_median_s",
                "compute_median_s"):
        assert thin[key] == pytest.approx(full[key], rel=P95), key
    for key in ("exposed_p99_s", "iteration_p99_s"):  # ~1 % of ~800 rows: a few
        assert thin[key] == pytest.approx(full[key], rel=RARE), key
    mf, mt = load_measured([str(full_dir)]), load_measured([str(thin_dir)])
    for key in ("iteration_s", "exposed_s", "compute_s"):
        assert mt["edp"][key] == pytest.approx(mf["edp"][key], rel=MEAN), key
    lf, lt = load_learner_runs([str(full_dir)]), load_learner_runs([str(thin_dir)])
    assert lt[1]["iteration_s"] == pytest.approx(lf[1]["iteration_s"], rel=MEAN)


def test_plan_check_and_long_haul_means_weigh_the_rows(tmp_path: Path) -> None:
    rows = _rows()
    full = load_run(_run(tmp_path, "full", rows, 0)).learners
    thin = load_run(_run(tmp_path, "thin", rows, N)).learners
    (f,), (t,) = plan_vs_measured({}, full), plan_vs_measured({}, thin)
    assert t["measured_exposed_ms"] == pytest.approx(f["measured_exposed_ms"], rel=MEAN)
    assert t["measured_path_ms"] == pytest.approx(f["measured_path_ms"], rel=MEAN)
    loss_full = settled_mean(full[0]["loss"])
    assert settled_mean(thin[0]["loss"], weight=thin[0]["weight"]) == pytest.approx(
        loss_full, rel=MEAN)
