"""`conduit-hpc bench peers --smoke`: our figures beside the in-process peers, in one run
(every subprocess has a timeout)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from conduit_hpc.bench import capacity, peers
from conduit_hpc.bench._peers_inprocess import ROWS, SIZES, row_source, sizes_of
from conduit_hpc.testing import REPO


def bench_json(*args: str, timeout: float = 600) -> dict:
    """``conduit-hpc bench --json ARGS`` in a subprocess (bounded): its final JSON line,
    after checking that it exited 0."""
    out = subprocess.run([sys.executable, "-m", "conduit_hpc.tools.cli", "bench", "--json",
                          *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_peers_smoke_reports_ours_and_each_peer_or_why_not() -> None:
    result = bench_json("peers", "--smoke", "--kinds", "cartpole", timeout=400)
    ours = [r for r in result["results"] if r["system"] == "conduit_hpc"]
    assert {r["sampler"] for r in ours} == {"prioritized", "uniform"}
    for r in ours:
        assert r["insert_rows_per_s"] > 0 and r["inserting_rows_per_s"] > 0
        for phase in ("idle", "inserting"):
            assert r[phase]["batches"] == 30 and r[phase]["batches_per_s"] > 0
            assert r[phase]["latency_p99_s"] >= r[phase]["latency_median_s"] > 0
    others = {r["system"]: r for r in result["results"] if r["system"] != "conduit_hpc"}
    assert set(others) == {"cpprb", "torchrl"}
    for name, r in others.items():
        # a peer ran, or says why not (not installed, or built for another torch)
        assert "skipped" in r or "uniform" in r, (name, r)
        assert "prioritized" in r or "skipped" in r or "prioritized_skipped" in r
    for t in result["ratios"]:  # ours / peer, for every peer figure that exists
        assert t["rate_ratio_idle"] > 0 and t["median_latency_ratio"] > 0


def test_an_absent_peer_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "cpprb", None)  # import cpprb -> ImportError
    peers.main(["--peer", "cpprb", "--kind", "cartpole", "--smoke", "--batches", "5"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    r = json.loads(line.removeprefix("RESULT "))
    assert "not installed" in r["skipped"] and "[peers]" in r["skipped"]


def test_capacity_smoke_reports_every_delivery_mode_and_the_ratios() -> None:
    # sync, a data-plane thread, a delivery rank, and owner fetch: each a figure with 0
    # and 2 actors inserting, beside cpprb (or the reason it is missing); CartPole rows
    # and Atari rows stored frame-once, every kind at --batch-size 16 (not the smoke
    # size's 64 and 8: the option reaches our delivery path and the peer)
    modes = ["sync", "edp", "edp-process", "sync:owner"]
    kinds = {"cartpole", "atari-frames"}
    result = bench_json("capacity", "--smoke", "--kinds", ",".join(sorted(kinds)),
                        "--peers", "cpprb", "--modes", ",".join(modes), "--batch-size", "16")
    ours = {(r["kind"], r["mode"]): r for r in result["results"]
            if r["system"] == "conduit_hpc"}
    assert set(ours) == {(k, m) for k in kinds for m in modes}
    for key, r in ours.items():
        assert "failed" not in r, (key, r)
        assert r["batch"] == 16
        for phase in ("idle", "inserting"):
            assert r[phase]["batches"] == 30 and r[phase]["batches_per_s"] > 0
        assert r["inserting_rows_per_s"] > 0
    # the frame-once kind delivers atari's rows and an env stream id
    assert ours["atari-frames", "sync"]["row_bytes"] == 2 * 4 * 84 * 84 + 8 + 4 + 1 + 8
    assert {(t["kind"], t["mode"]) for t in result["ratios"]} == set(ours)
    for t in result["ratios"]:
        assert t["inserting_over_idle"] > 0 and t["batch"] == 16
    cpprb = {r["kind"]: r for r in result["results"] if r["system"] == "cpprb"}
    assert set(cpprb) == kinds and all(r["batch"] == 16 for r in cpprb.values())
    # each peer ran with malloc keeping freed memory (its samples' arrays not re-faulted)
    assert all(r["malloc"] == peers.PEER_MALLOC for r in cpprb.values())
    if "skipped" not in cpprb["atari-frames"]:  # both variants; the ratio is to the faster
        frames = cpprb["atari-frames"]
        variants = frames["variants"]
        assert set(variants) == {"plain", "next_of+stack_compress"}
        assert frames["prioritized"]["batches_per_s"] == max(
            v["prioritized"]["batches_per_s"] for v in variants.values())
        assert all(t["cpprb_variant"] == frames["prioritized_variant"]
                   for t in result["ratios"] if t["kind"] == "atari-frames")
    for kind, r in cpprb.items():
        if "skipped" not in r:  # then every mode has its ratio to it
            assert all(t["over_cpprb"] > 0 for t in result["ratios"] if t["kind"] == kind)


def test_an_unknown_row_kind_is_refused_with_the_allowed_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        capacity.main(["--kinds", "atari,atari-franes"])
    err = capsys.readouterr().err
    assert "--kinds" in err and "'atari,atari-franes'" in err
    assert "cartpole, atari, atari-frames" in err


@pytest.mark.parametrize("value", ["0", "-1", "129"])
def test_capacity_refuses_a_bad_batch_size_before_anything_runs(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    # the smoke Atari ring holds 256 rows: a batch of 1 .. 128
    with pytest.raises(SystemExit):
        capacity.main(["--smoke", "--kinds", "atari,atari-frames", "--batch-size", value])
    err = capsys.readouterr().err
    assert "--batch-size" in err
    if int(value) < 1:  # the option's type (bench/_args.py) refuses it while parsing
        assert "argument --batch-size: must be an integer from 1 to" in err
        assert f"got {value!r}" in err
    else:
        assert f"got {value}" in err and "from 1 to 128" in err
        assert "half the atari ring of 256 rows at --smoke" in err


def test_capacity_batch_size_sets_every_kinds_batch_default_each_kinds_own() -> None:
    assert sizes_of("atari", smoke=False)["batch"] == 32
    assert sizes_of("cartpole", smoke=False)["batch"] == 256
    for kind in ("atari", "atari-frames"):
        sz = sizes_of(kind, smoke=False, batch_rows=256)
        assert sz == {**SIZES[kind], "batch": 256}
    assert sizes_of("atari", smoke=False, batch_rows=2000)["batch"] == 2000


def test_atari_frames_rows_are_stream_consistent() -> None:
    # 4 streams interleaved; within a stream and an episode each obs slides one frame
    # on from the previous row's (consecutive rows share 3 frames)
    rows = row_source("atari-frames", 600, seed=1)()
    assert set(rows) == set(ROWS["atari-frames"])
    assert len(set(rows["env"].tolist())) == 4
    slid = 0
    for env in set(rows["env"].tolist()):
        obs = rows["obs"][rows["env"] == env]
        for a, b in itertools.pairwise(obs):
            if np.array_equal(b[:3], a[1:]):
                slid += 1
            else:  # a new episode: its first stack repeats one frame
                assert all(np.array_equal(b[0], b[i]) for i in range(4))
    assert slid >= 600 - 4 - 4 * 3  # a few episode starts at most


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e12", "x"])
@pytest.mark.parametrize("bench", ["capacity", "peers"])
def test_a_bad_insert_rate_is_refused_before_anything_runs(
        bench: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    main = capacity.main if bench == "capacity" else peers.main
    with pytest.raises(SystemExit):
        main(["--smoke", "--insert-rate", value])
    err = capsys.readouterr().err
    assert "--insert-rate" in err and "Traceback" not in err
    if value == "1e12":  # in the type's range, refused after parsing (1e12 itself is out)
        assert "[0, 1e12)" in err and f"got {float(value)}" in err
    else:  # the option's type (bench/_args.py) refuses it while parsing
        assert "argument --insert-rate: must be a number from 0 to" in err
        assert f"got {value!r}" in err


def test_capacity_paces_the_actors_at_insert_rate() -> None:
    # all actors together at --insert-rate rows/s while the learner samples: at 1 row/s
    # each actor's first ingest (256 rows at --smoke) puts it ~8 minutes ahead of its
    # pace, so it inserts nothing more while the learner's 30 batches run - whatever the
    # machine's speed
    result = bench_json("capacity", "--smoke", "--kinds", "cartpole", "--modes", "sync",
                        "--peers", "none", "--insert-rate", "1")
    (r,) = [r for r in result["results"] if r["system"] == "conduit_hpc"]
    assert "failed" not in r, r
    assert r["inserting"]["batches"] == 30
    assert r["inserting_rows"] == r["actors"] * sizes_of("cartpole", smoke=True)["ingest"]
    assert r["inserting_rows_per_s"] > 0


@pytest.mark.parametrize("value", ["0", "101", "x"])
def test_capacity_refuses_a_bad_repeat_before_anything_runs(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        capacity.main(["--smoke", "--repeat", value])
    err = capsys.readouterr().err
    assert "argument --repeat: must be an integer from 1 to 100" in err
    assert f"got {value!r}" in err


def test_capacity_repeat_pairs_each_run_with_its_own_peers_and_summarises() -> None:
    result = bench_json("capacity", "--smoke", "--kinds", "cartpole", "--modes", "sync",
                        "--peers", "cpprb", "--repeat", "2")
    ours = [r for r in result["results"] if r["system"] == "conduit_hpc"]
    assert sorted(r["run"] for r in ours) == [0, 1] and all("failed" not in r for r in ours)
    assert sorted(t["run"] for t in result["ratios"]) == [0, 1]
    (s,) = result["summary"]
    assert (s["kind"], s["mode"], s["runs"]) == ("cartpole", "sync", 2)
    idle = sorted(t["idle_batches_per_s"] for t in result["ratios"])
    assert s["idle_batches_per_s_min"] == idle[0] and s["idle_batches_per_s_max"] == idle[1]
    assert s["idle_batches_per_s"] == (idle[0] + idle[1]) / 2
    cpprb = {r["run"]: r for r in result["results"] if r["system"] == "cpprb"}
    assert set(cpprb) == {0, 1}
    if "skipped" not in cpprb[0]:  # each run's ratio is to its own run of the peer
        for t in result["ratios"]:
            peer = cpprb[t["run"]]["prioritized"]["batches_per_s"]
            assert t["over_cpprb"] == t["idle_batches_per_s"] / peer
        assert 0 <= s["over_cpprb_below_1"] <= 2
