"""Long-haul deployment: config, topology, placement, wire format and metric definitions
on hand-made cases (no MPI ranks)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conduit_hpc import ConfigError, Spec
from conduit_hpc.errors import TransportError
from conduit_hpc.features.longhaul import (
    CLOUD_SHARD,
    EDGE_SHARD,
    LinkSides,
    crossing_priorities,
    plan_longhaul,
)
from conduit_hpc.features.longhaul.metrics import (
    LinkSnapshot,
    merge_link_stats,
    settled_mean,
    superstep_columns,
    windowed_mean_priority,
)
from conduit_hpc.protocol import SampleReply, Tag
from conduit_hpc.protocol.forward import (
    F_END,
    F_ZLIB,
    forward_head,
    forward_message_bytes,
    pack_forward,
    unpack_forward,
)
from conduit_hpc.testing import make_config

SPEC = {"obs": {"dtype": "float32", "shape": [4]}, "action": {"dtype": "int64"}}


def cfg(**longhaul):
    return make_config(spec=SPEC, layout={"learners": 1, "buffers": 2},
                       storage={"capacity_rows": 1000},
                       scheduler={"fetch": "owner"},
                       longhaul={"mode": "forward", "queue_rows": 256, **longhaul})


def topo(c, world=6):
    return LinkSides.build(c, world_size=world, actor_ranks=tuple(range(3, world)),
                          buffer_ranks=(1, 2), learner_ranks=(0,))


# -- config -------------------------------------------------------------------------

@pytest.mark.parametrize(("section", "fragment"), [
    ({"bandwidth_gbps": 0.0}, "longhaul.bandwidth_gbps must be a finite number > 0"),
    ({"latency_s": -0.1}, "longhaul.latency_s must be a finite number >= 0"),
    ({"burst_bytes": -1}, "longhaul.burst_bytes must be >= 0"),
    ({"queue_rows": 0}, "longhaul.queue_rows must be >= 1"),
    ({"queue_rows": 10, "forward_rows": 11}, "longhaul.forward_rows must be between 1"),
    ({"edge_ranks": [3, 3]}, "longhaul.edge_ranks must be distinct world ranks"),
    ({"mode": "sideways"}, "longhaul.mode must be one of 'off', 'forward', 'edge_replay'"),
    ({"mode": "forward", "compression": "lz4"},
     "longhaul.compression must be one of 'none', 'zlib', got 'lz4'"),
    ({"mode": "edge_replay", "compression": "zlib"},
     r"longhaul.compression must be 'none' with mode = 'edge_replay' \(only the rows "
     r"that 'forward' sends are compressed\), got 'zlib'"),
])
def test_bad_longhaul_values_are_refused_naming_the_key(section, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        cfg(**section)


def test_edge_replay_needs_the_owner_to_send_the_rows() -> None:
    with pytest.raises(ConfigError, match=r"scheduler\.fetch must be 'owner' with longhaul"):
        make_config(spec=SPEC, scheduler={"fetch": "direct"},
                    longhaul={"mode": "edge_replay"})
    # service mode always has the owner send the rows
    make_config(spec=SPEC, scheduler={"mode": "service"}, longhaul={"mode": "edge_replay"})


def test_bandwidth_is_in_gigabytes_per_second_like_the_cluster_model() -> None:
    assert cfg(bandwidth_gbps=0.000125).longhaul.bytes_per_s == pytest.approx(125_000.0)


# -- topology and placement -----------------------------------------------------------

def test_default_topology_puts_actors_and_the_last_buffer_at_the_edge() -> None:
    t = topo(cfg())
    assert t.edge == {2, 3, 4, 5} and t.cloud == {0, 1}
    assert (t.edge_buffer, t.cloud_buffer, t.learner) == (2, 1, 0)
    assert t.far_of(0) == t.edge and t.far_of(4) == t.cloud
    assert t.side(2) == "edge" and t.side(1) == "cloud"
    other = topo(cfg(edge_ranks=[1, 3, 4, 5]))
    assert (other.edge_buffer, other.cloud_buffer) == (1, 2)


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"edge_ranks": [2, 3, 4, 9]}, "below the world size 6"),
    ({"edge_ranks": [0, 2, 3, 4, 5]}, "must not hold the learner"),
    ({"edge_ranks": [2, 3, 4]}, r"must hold every actor rank; \[5\] are missing"),
    ({"edge_ranks": [1, 2, 3, 4, 5]}, "exactly one of the buffer ranks"),
])
def test_topologies_that_do_not_fit_are_refused(kwargs, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        topo(cfg(**kwargs))


def test_layout_must_have_one_learner_and_two_buffers() -> None:
    c = cfg()
    with pytest.raises(ConfigError, match=r"layout\.learners must be 1"):
        LinkSides.build(c, world_size=6, actor_ranks=(4, 5), buffer_ranks=(2, 3),
                       learner_ranks=(0, 1))
    with pytest.raises(ConfigError, match=r"layout\.buffers must be 2"):
        LinkSides.build(c, world_size=6, actor_ranks=(2, 3, 4, 5), buffer_ranks=(1,),
                       learner_ranks=(0,))


def test_placements_of_the_two_modes() -> None:
    fwd = cfg()
    p = plan_longhaul(fwd, topo(fwd), (3, 4, 5))
    assert [(s.shard_id, s.owner_rank, s.capacity_rows) for s in p.shards] == [
        (EDGE_SHARD, 2, 1000), (CLOUD_SHARD, 1, 1000)]
    assert p.actor_shards == {3: EDGE_SHARD, 4: EDGE_SHARD, 5: EDGE_SHARD}
    assert p.learner_shards == {0: (CLOUD_SHARD,)}
    er = cfg(mode="edge_replay")
    p = plan_longhaul(er, topo(er), (3, 4, 5))
    assert [(s.shard_id, s.owner_rank) for s in p.shards] == [(EDGE_SHARD, 2)]
    assert p.learner_shards == {0: (EDGE_SHARD,)}
    big = cfg(queue_rows=1001, forward_rows=8)
    with pytest.raises(ConfigError, match=r"longhaul.queue_rows must be <= "
                                          r"storage.capacity_rows \(1000\), got 1001"):
        plan_longhaul(big, topo(big), (3, 4, 5))


# -- wire format and the crossing priority -------------------------------------------

def test_forward_message_round_trip_and_size() -> None:
    spec = Spec.from_config(cfg().spec)
    cols = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4),
            "action": np.array([7, 8, 9], np.int64)}
    msg = pack_forward(spec, 41, np.array([0.5, 2.0, 3.5]), cols)
    assert msg.dtype == np.uint8 and msg.size == forward_message_bytes(spec, 3)
    assert forward_message_bytes(spec, 3) == 24 + 3 * 8 + 3 * (16 + 8)
    first, flags, prio, back = unpack_forward(spec, msg)
    assert (first, flags) == (41, 0)
    np.testing.assert_array_equal(prio, [0.5, 2.0, 3.5])
    np.testing.assert_array_equal(back["obs"], cols["obs"])
    np.testing.assert_array_equal(back["action"], cols["action"])
    end = pack_forward(spec, 44, np.zeros(0), {}, flags=F_END)
    assert end.size == forward_message_bytes(spec, 0) == 24
    assert unpack_forward(spec, end)[:2] == (44, F_END)


def test_compressed_forward_message_round_trip() -> None:
    """``compress``: the rows are zlib-compressed (flag F_ZLIB), header and priorities
    stay plain (read without decompressing), the rows come back exactly; damaged
    compressed rows are refused naming the rows."""
    spec = Spec.from_config(cfg().spec)
    cols = {"obs": np.tile(np.arange(4, dtype=np.float32), (64, 1)),  # repetitive
            "action": np.arange(64, dtype=np.int64) % 3}
    prio = np.linspace(0.5, 7.0, 64)
    msg = pack_forward(spec, 100, prio, cols, compress=True)
    assert msg.size < forward_message_bytes(spec, 64) / 2
    first, flags, p = forward_head(msg)
    assert (first, flags) == (100, F_ZLIB)
    np.testing.assert_array_equal(p, prio)
    np.testing.assert_array_equal(crossing_priorities(Tag.FORWARD, msg, spec, {}), prio)
    _, _, p2, back = unpack_forward(spec, msg)
    np.testing.assert_array_equal(p2, prio)
    for k in cols:
        np.testing.assert_array_equal(back[k], cols[k])
    end = pack_forward(spec, 164, np.zeros(0), {}, flags=F_END, compress=True)
    assert unpack_forward(spec, end)[:2] == (164, F_END)  # nothing to compress
    bad = msg.copy()
    bad[24 + 8 * 64 + 5:] ^= 0x5A
    with pytest.raises(TransportError, match=r"forward message of rows 100 .. 163: the "
                                             r"compressed rows are damaged"):
        unpack_forward(spec, bad)


def test_crossing_priority_has_one_definition_for_both_placements() -> None:
    spec = Spec.from_config(cfg().spec)
    # forward: the priorities travel with the rows
    cols = {"obs": np.zeros((2, 4), np.float32), "action": np.zeros(2, np.int64)}
    fwd = pack_forward(spec, 0, np.array([1.5, 4.0]), cols)
    np.testing.assert_array_equal(crossing_priorities(Tag.FORWARD, fwd, spec, {}),
                                  [1.5, 4.0])
    # edge_replay: the rows a service reply names, priced by the edge index now
    held = {EDGE_SHARD: np.array([0.0, 3.0, 0.25, 9.0])}
    rep = SampleReply(1, EDGE_SHARD, np.array([3, 1, 3]), np.array([4, 2, 4]),
                      np.array([9.0, 3.0, 9.0]), 4, 12.25, 0.25)
    got = crossing_priorities(Tag.SERVICE_REPLY, rep.pack(np.zeros(48, np.uint8)), spec, held)
    np.testing.assert_array_equal(got, [9.0, 3.0, 9.0])  # drawn twice: counted twice
    # messages that carry no rows have none
    assert crossing_priorities(Tag.PRIORITY, np.zeros(16, np.uint8), spec, held) is None
    assert crossing_priorities(Tag.DONE, np.zeros(0, np.uint8), spec, held) is None


# -- metric definitions ----------------------------------------------------------------

def test_superstep_columns_on_a_hand_made_interval() -> None:
    prev = LinkSnapshot(time_s=10.0, e2c_bytes=1000, c2e_bytes=50, rows=10,
                        priority_sum=20.0, dropped=3, backlog=7)
    cur = LinkSnapshot(time_s=10.5, e2c_bytes=1500, c2e_bytes=150, rows=14,
                       priority_sum=30.0, dropped=5, backlog=2)
    c = superstep_columns(prev, cur, bytes_per_s=2000.0)
    assert c["link_e2c_bytes"] == 500 and c["link_c2e_bytes"] == 100
    assert c["link_e2c_util"] == 0.5 and c["link_c2e_util"] == 0.1
    assert c["xfer_rows"] == 4 and c["xfer_priority_sum"] == 10.0
    assert c["xfer_priority_mean"] == 2.5
    assert (c["dropped_rows"], c["backlog_rows"]) == (5, 2)  # cumulative / current
    idle = superstep_columns(cur, LinkSnapshot(time_s=11.0, e2c_bytes=1500, c2e_bytes=150,
                                               rows=14, priority_sum=30.0), 2000.0)
    assert math.isnan(idle["xfer_priority_mean"]) and idle["link_e2c_util"] == 0.0
    assert math.isnan(superstep_columns(cur, cur, 2000.0)["link_e2c_util"])


def test_windowed_mean_priority_weights_by_rows() -> None:
    # 3 rows of mean 2 then 1 row of priority 10 then nothing: window 2
    got = windowed_mean_priority([3, 1, 0, 0], [6.0, 10.0, 0.0, 0.0], window=2)
    # trailing windows: [0..0], [0..1], [1..2], [2..3]
    np.testing.assert_allclose(got[:3], [2.0, 4.0, 10.0])
    assert math.isnan(got[3])
    with pytest.raises(ValueError, match="window must be >= 1"):
        windowed_mean_priority([1], [1.0], window=0)


def test_settled_mean_uses_the_tail_and_skips_nan() -> None:
    assert settled_mean([100.0, 50.0, 2.0, float("nan"), 4.0], skip_fraction=0.4) == 3.0
    assert math.isnan(settled_mean([1.0, float("nan")], skip_fraction=0.5))
    with pytest.raises(ValueError, match="skip_fraction"):
        settled_mean([1.0], skip_fraction=1.0)


def test_merge_link_stats_adds_per_direction_and_averages_priorities() -> None:
    learner = {"side": "cloud", "bytes_out": 300, "messages_out": 30, "bytes_in": 4000}
    edge = {"side": "edge", "bytes_out": 4000, "messages_out": 10, "bytes_in": 300,
            "rows_crossed": 40, "priority_sum_crossed": 100.0, "rows_dropped": 5,
            "rows_forwarded": 40, "rows_unsent": 2, "edge_rows_committed": 47,
            "late_s_max": 0.002}
    actor = {"side": "edge", "bytes_out": 0, "messages_out": 1, "bytes_in": 0}
    m = merge_link_stats([learner, edge, actor, None], mode="forward", bytes_per_s=1e4,
                         latency_s=0.01)
    assert (m["e2c_bytes"], m["c2e_bytes"]) == (4000, 300)
    assert (m["e2c_messages"], m["c2e_messages"]) == (11, 30)
    assert (m["e2c_received_bytes"], m["c2e_received_bytes"]) == (4000, 300)
    assert m["priority_mean_crossed"] == 2.5 and m["rows_crossed"] == 40
    assert m["edge_rows_committed"] == m["rows_forwarded"] + m["rows_dropped"] + \
        m["rows_unsent"]
    assert m["late_s_max"] == 0.002 and m["mode"] == "forward"
    empty = merge_link_stats([], mode="edge_replay", bytes_per_s=1.0, latency_s=0.0)
    assert math.isnan(empty["priority_mean_crossed"])


def test_report_ratios_on_hand_made_runs(tmp_path) -> None:
    from pathlib import Path

    from conduit_hpc.tools.report.longhaul import LongHaulRun, markdown, plot, ratios

    def run(mode: str, seed: int, prio: float, loss: float, bw: float = 5e4) -> LongHaulRun:
        n = 10
        learner = {"superstep": np.arange(n, dtype=float), "loss": np.r_[np.full(5, 9.0),
                                                                         np.full(5, loss)],
                   "xfer_rows": np.full(n, 4.0), "xfer_priority_sum": np.full(n, 4 * prio),
                   "iteration_s": np.full(n, 0.1), "link_e2c_bytes": np.full(n, 100.0),
                   "link_c2e_bytes": np.zeros(n)}
        return LongHaulRun(path=Path(f"/runs/{mode}-{seed}"), mode=mode,
                           bandwidth_bytes_s=bw, seed=seed, learner=learner,
                           summary={"final_mean_return": 100.0 + seed})

    runs = [run("forward", 0, 1.0, 0.4), run("forward", 1, 1.0, 0.6),
            run("edge_replay", 0, 3.0, 0.1), run("edge_replay", 1, 5.0, 0.1),
            run("forward", 0, 1.0, 1.0, bw=1e6)]  # no edge_replay at this budget: no ratio
    (t,) = ratios(runs)
    assert t["bandwidth_bytes_s"] == 5e4 and t["seeds"] == 2
    assert t["priority_mean_ratio"] == 4.0  # (3 + 5) / 2 over 1
    assert t["loss_settled_ratio"] == pytest.approx(0.2)  # settled: second half only
    assert t["forward_final_return"] == 100.5
    text = markdown(runs)
    assert "| 50 | 2 | 4 | 0.2 |" in text
    assert plot(runs, tmp_path).stat().st_size > 10_000


@pytest.mark.parametrize(("files", "fragment"), [
    ({}, "learner-0.csv does not exist"),
    ({"metrics/summary.json": '{"x":'}, "summary.json is unreadable"),
    ({"metrics/summary.json": "[1]"}, "summary.json holds a list"),
    ({"metrics/summary.json": b"\xff\xfe"}, "summary.json is unreadable"),
    ({"metrics/learner-0.csv": b"superstep\n\xff\xfe\n"}, "learner-0.csv is unreadable"),
    ({"metrics/episodes.csv": b"\xff"}, "episodes.csv is unreadable"),
    ({"config.toml": "garbage = = "}, "is not valid TOML"),
    ({"config.toml": "longhaul = 3"}, "longhaul = 3 is not a table"),
    ({"config.toml": "run = [1]"}, "run = [1] is not a table"),
    ({"config.toml": '[longhaul]\nbandwidth_gbps = "x"'}, "longhaul.bandwidth_gbps = 'x'"),
    ({"config.toml": "[run]\nseed = 1.5e400"}, "run.seed = inf"),
    ({"metrics/summary.json": '{"wall_s": "x"}'}, "wall_s = 'x'; expected a number"),
    ({"metrics/summary.json": '{"final_mean_return": [1]}'}, "final_mean_return = [1]"),
    ({"metrics/summary.json": '{"exposed_median_s": true}'}, "exposed_median_s = True"),
])
def test_longhaul_report_refuses_a_hostile_run_directory_by_name(tmp_path, capsys, files,
                                                                 fragment) -> None:
    # python -m conduit_hpc.tools.report.longhaul (docs/longhaul.md): each of these was
    # a traceback (JSONDecodeError, UnicodeDecodeError, AttributeError, ValueError...)
    from conduit_hpc.tools.report.longhaul import main

    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    if files:  # a finished run's learner file, unless the case replaces it
        files = {"metrics/learner-0.csv": "superstep,loss\n0,1.0\n", **files}
    for name, text in files.items():
        (run / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main([str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("longhaul report: error: ") and fragment in err, err


def test_longhaul_report_takes_null_figures_as_a_run_writes_them(tmp_path, capsys) -> None:
    # a non-finite figure is written as null (conduit_hpc.jsontext): float(None) was a
    # TypeError in the table
    from conduit_hpc.tools.report.longhaul import main

    run = tmp_path / "r1"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics/learner-0.csv").write_text("superstep,loss\n0,1.0\n1,0.5\n")
    (run / "metrics/summary.json").write_text(
        '{"mode": "forward", "wall_s": 2.5, "exposed_median_s": null, '
        '"link_e2c_util": null, "final_mean_return": null}')
    assert main([str(run), "--out", str(tmp_path / "out")]) == 0
    row = next(line for line in (tmp_path / "out/longhaul.md").read_text().splitlines()
               if line.startswith("| r1 | forward |"))
    assert "| 2.5 |" in row and "| - |" in row, row


def test_longhaul_report_skips_fields_past_the_header_and_text(tmp_path) -> None:
    from conduit_hpc.tools.report.longhaul import load_longhaul_run

    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics/learner-0.csv").write_text("superstep,loss,mode\n0,1.5,edp,9,9\n1,,edp\n")
    got = load_longhaul_run(run)
    assert set(got.learner) == {"superstep", "loss"}
    np.testing.assert_array_equal(got.learner["loss"], [1.5, np.nan])
