"""The adaptive policy against synthetic telemetry; moves between plans."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conduit_hpc.placement.adaptive import (
    AdaptiveKnobs,
    AdaptivePolicy,
    Telemetry,
    heat_bins,
    hot_counts,
    migration_seconds,
    plan_moves,
    predict_placement,
)
from conduit_hpc.placement.cluster import ClusterModel
from conduit_hpc.placement.model import Workload
from conduit_hpc.placement.placement import plan_round_robin
from conduit_hpc.placement.static import plan_static
from conduit_hpc.testing import REPO

SKEW = ((0.05, 0.8), (0.95, 0.2))  # 5 % of the rows hold 80 % of the priority mass


def cluster(gpu_host_gbps: float = 2.0) -> ClusterModel:
    return ClusterModel.from_dict({"name": "one", "nodes": [{
        "name": "n", "gpus": 2, "buffers": 1, "actors": 2,
        "learner_gpu_bytes": "110 MB", "learner_host_bytes": "2 GB",
        "buffer_host_bytes": "2 GB",
        "gpu_host": {"bandwidth_gbps": gpu_host_gbps, "latency_s": 1e-5},
        "shm": {"bandwidth_gbps": 20.0, "latency_s": 1e-6}}]})


WORK = Workload(capacity_rows=2_000_000, row_bytes=1000 - 16 - 80, batch_rows=1024,
                update_rate_hz=100, compute_s=0.0002, sampling="prioritized",
                scope="partitioned", actor_rows_per_s=500)


def start(**knobs: float) -> AdaptivePolicy:
    c = cluster()
    plan = plan_static(c, WORK)  # planned without knowing the skew
    return AdaptivePolicy(c, WORK, plan, knobs=AdaptiveKnobs(**knobs))  # type: ignore[arg-type]


def shares(policy: AdaptivePolicy) -> dict[int, float]:
    return {s.shard_id: s.share for s in policy.placement.shards}


def test_moves_when_it_pays_and_keeps_hot_rows_in_the_gpu() -> None:
    pol = start(patience=2, cooldown_supersteps=0)
    before = pol.placement
    d1 = pol.observe(Telemetry(100, heat=SKEW, shard_sample_share=shares(pol)))
    assert d1.action == "hold" and "patience (1 of 2" in d1.reason
    d2 = pol.observe(Telemetry(200, heat=SKEW, shard_sample_share=shares(pol)))
    assert d2.action == "move", d2.reason
    assert d2.proposed_s < d2.current_s * 0.5 and d2.move_s > 0
    new = d2.placement
    assert new is not None and pol.placement is new
    # same capacity per tier, but the GPU shards now draw most samples: the hot rows
    assert new.tier_rows() == before.tier_rows()
    gpu_share = [s.share for s in new.shards if s.tier == "learner_gpu"]
    old_share = [s.share for s in before.shards if s.tier == "learner_gpu"]
    assert min(gpu_share) > 0.75 and max(old_share) < 0.15
    # the moves carry every row, hottest first into the fastest new shard
    assert sum(m.rows for m in d2.moves) == WORK.capacity_rows
    assert {m.order for m in d2.moves} == {"hottest"}
    # and the new plan, measured as predicted, is left alone
    d3 = pol.observe(Telemetry(300, heat=SKEW, shard_sample_share=shares(pol)))
    assert d3.action == "hold" and pol.moves_made == 1


@pytest.mark.parametrize(
    ("knobs", "telemetry", "reason"),
    [
        ({}, {"compute_s": 0.01}, "do not wait"),  # the path hides behind compute
        ({"min_gain": 0.9}, {"compute_s": 1e-5}, "below 90%"),  # 77 % is not enough
        ({"payback_supersteps": 1}, {}, "more than 1 supersteps of gain"),
    ],
)
def test_holds_when_it_does_not_pay(knobs: dict, telemetry: dict, reason: str) -> None:
    pol = start(patience=1, cooldown_supersteps=0, **knobs)
    for step in range(3):
        d = pol.observe(Telemetry(100 * step, heat=SKEW, shard_sample_share=shares(pol),
                                  **telemetry))
        assert d.action == "hold" and reason in d.reason, d.reason
    assert pol.moves_made == 0


def test_uniform_telemetry_holds() -> None:
    pol = start(patience=1, cooldown_supersteps=0)
    # priorities turned out uniform: the static plan is already the optimum
    d = pol.observe(Telemetry(100, heat=((1.0, 1.0),), shard_sample_share=shares(pol)))
    assert d.action == "hold" and abs(d.gain_s) <= 1e-9 + 0.01 * d.current_s


def test_flapping_telemetry_never_moves() -> None:
    pol = start(patience=2, cooldown_supersteps=0)
    uniform = shares(pol)
    for step in range(20):  # skewed, uniform, skewed, ...: never two looks in a row
        heat = SKEW if step % 2 == 0 else ((1.0, 1.0),)
        d = pol.observe(Telemetry(100 * step, heat=heat, shard_sample_share=uniform))
        assert d.action == "hold"
    assert pol.moves_made == 0


def test_noise_does_not_make_it_oscillate() -> None:
    pol = start(patience=2, cooldown_supersteps=0, min_gain=0.1)
    rng = np.random.default_rng(3)
    for step in range(30):
        bw = 2.0 * rng.uniform(0.9, 1.1)  # +-10 % noise on the measured PCIe bandwidth
        sh = {k: v * rng.uniform(0.95, 1.05) for k, v in shares(pol).items()}
        pol.observe(Telemetry(100 * step, heat=SKEW, link_bandwidth_gbps={"gpu_host": bw},
                              shard_sample_share=sh))
    assert pol.moves_made == 1  # the one move that pays, then nothing


def test_cooldown_and_a_real_change_moves_back() -> None:
    pol = start(patience=1, cooldown_supersteps=1000)
    assert pol.observe(Telemetry(0, heat=SKEW, shard_sample_share=shares(pol))).action == "move"
    # the hot set cools completely: the GPU shards now see only their row share
    cold = {s.shard_id: (0.11 if s.tier == "learner_gpu" else 0.89)
            for s in pol.placement.shards}
    d = pol.observe(Telemetry(500, heat=((1.0, 1.0),), shard_sample_share=cold,
                              link_bandwidth_gbps={"gpu_host": 0.5}))
    assert d.action == "hold" and "cooling down" in d.reason
    d = pol.observe(Telemetry(1500, heat=SKEW, shard_sample_share=cold,
                              link_bandwidth_gbps={"gpu_host": 0.5}))
    assert d.action == "move" and pol.moves_made == 2  # re-rank: hot rows back in the GPU


def test_predict_placement_reads_round_robin_plans() -> None:
    c = ClusterModel.from_toml(REPO / "jobs" / "cluster-local.toml")
    rr = plan_round_robin(actor_ranks=[2, 3, 4, 5], buffer_ranks=[1], learner_ranks=[0],
                          capacity_rows=1000)
    w = Workload(capacity_rows=1000, row_bytes=28, batch_rows=64)
    pred = predict_placement(c, w, rr)
    assert pred.learners[0].slowest_link == "local.shm" and pred.max_path_s > 0
    static = plan_static(c, w)
    assert static.prediction is not None
    assert static.prediction.objective_s <= pred.objective_s * (1 + 1e-9)


def test_plan_moves_conserves_rows_and_capacity() -> None:
    c = cluster()
    a = plan_static(c, WORK)
    b = plan_static(c, replace(WORK, heat=SKEW))
    held = {s.shard_id: s.capacity_rows - 7 * s.shard_id for s in a.shards}
    moves = plan_moves(a, b, held, hot_first=True)
    into: dict[int, int] = {}
    out: dict[int, int] = {}
    for m in moves:
        into[m.dst_shard] = into.get(m.dst_shard, 0) + m.rows
        out[m.src_shard] = out.get(m.src_shard, 0) + m.rows
        assert a.shards[m.src_shard].partition == b.shards[m.dst_shard].partition
    assert all(into[d] <= b.shards[d].capacity_rows for d in into)
    assert out == held  # everything held moves (the new plan has room)
    # exact hottest placement: the shards holding the hot rows fill the GPU shard first
    gpu0 = next(s.shard_id for s in b.shards if s.tier == "learner_gpu")
    part = b.shards[gpu0].partition
    srcs = [s.shard_id for s in a.shards if s.partition == part]
    hot = {srcs[0]: 0, srcs[1]: b.shards[gpu0].capacity_rows}
    mv = [m for m in plan_moves(a, b, held, hot_first=True, hot=hot) if m.dst_shard == gpu0]
    assert [(m.src_shard, m.rows) for m in mv] == [(srcs[1], b.shards[gpu0].capacity_rows)]
    # a shrinking plan keeps what fits
    small = plan_static(c, replace(WORK, capacity_rows=1_000_000))
    moved = sum(m.rows for m in plan_moves(a, small))
    assert moved == small.capacity_rows


def test_hot_counts_and_heat_bins() -> None:
    prio = {0: np.asarray([1.0, 9.0, 3.0]), 4: np.asarray([9.0, 8.0]), 7: np.asarray([0.5])}
    assert hot_counts(prio, 3) == {0: 1, 4: 2, 7: 0}  # 9 (shard 0 first on a tie), 9, 8
    m = np.concatenate([np.full(10, 100.0), np.full(990, 1.0)])
    bins = heat_bins(m, (0.01, 1.0))
    assert bins[0] == pytest.approx((0.01, 1000 / 1990))
    assert sum(b[0] for b in bins) == pytest.approx(1) and heat_bins(np.zeros(3)) == ()
    w = Workload(capacity_rows=10, row_bytes=8, sampling="prioritized", heat=bins)
    assert w.bins()[1][0] == pytest.approx(1000 / 1990)


def test_migration_seconds_is_bytes_over_the_slowest_link() -> None:
    c = cluster(gpu_host_gbps=1.0)
    a = plan_static(c, replace(WORK, tiers=("learner_host", "buffer_host")))
    b = plan_static(c, WORK)
    moves = plan_moves(a, b)
    to_gpu = sum(m.rows for m in moves if b.shards[m.dst_shard].tier == "learner_gpu")
    t = migration_seconds(c, a, b, moves, WORK.bytes_per_row)
    # the rows for both GPUs cross their own h2d links in parallel
    assert t == pytest.approx(to_gpu / 2 * WORK.bytes_per_row / 1e9 + 1e-5 + 1e-6, rel=0.02)


def test_history_keeps_the_latest_looks_and_counts_every_move(monkeypatch) -> None:
    # a look every interval_supersteps for the whole run: each decision (a move's with its
    # placement) was kept, so the policy grew for as long as the job ran
    from conduit_hpc.placement import adaptive

    monkeypatch.setattr(adaptive, "HISTORY_KEEP", 4, raising=False)
    pol = start(patience=1, cooldown_supersteps=1000)
    assert pol.observe(Telemetry(0, heat=SKEW, shard_sample_share=shares(pol))).action == "move"
    cold = {s.shard_id: (0.11 if s.tier == "learner_gpu" else 0.89)
            for s in pol.placement.shards}
    for step in range(1, 7):  # cooling down
        d = pol.observe(Telemetry(100 * step, heat=SKEW, shard_sample_share=cold))
        assert d.action == "hold"
    d = pol.observe(Telemetry(1500, heat=SKEW, shard_sample_share=cold,
                              link_bandwidth_gbps={"gpu_host": 0.5}))
    assert d.action == "move"
    assert len(pol.history) == 4 and pol.history[-1] is d  # the latest looks only
    assert pol.moves_made == 2  # both counted, the first one past the kept window
