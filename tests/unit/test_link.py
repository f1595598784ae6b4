"""The link model delays and rate-limits exactly as configured (simulated clocks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from conduit_hpc.errors import DataPlaneTimeout, TransportError
from conduit_hpc.transport.link import LinkedChannel, LinkModel, LinkParams

# rates and sizes that are powers of two keep every expected time exact in binary


def test_serializer_without_burst_is_store_and_forward() -> None:
    link = LinkModel(LinkParams(1024.0, latency_s=0.25, burst_bytes=0), start_s=0.0)
    got = [link.schedule(n, 0.0) for n in (512, 256, 256)]
    assert [c.depart_s for c in got] == [0.5, 0.75, 1.0]
    assert [c.arrive_s for c in got] == [0.75, 1.0, 1.25]
    # an idle link: the message departs one transmission time after it is handed over
    late = link.schedule(128, 4.0)
    assert (late.depart_s, late.arrive_s) == (4.125, 4.375)
    assert link.bytes_total == 1152 and link.messages_total == 4
    assert link.wait_s_total == 0.5 + 0.75 + 1.0 + 0.125


def test_token_bucket_burst_then_rate() -> None:
    link = LinkModel(LinkParams(1024.0, latency_s=0.5, burst_bytes=2048), start_s=0.0)
    # the bucket starts full: two messages of 1024 bytes go at once, the third waits
    assert [link.schedule(1024, 0.0).depart_s for _ in range(3)] == [0.0, 0.0, 1.0]
    # after a long idle time the bucket holds 2048 tokens again (not more): a message of
    # 4096 bytes departs when the other 2048 have been paid, 2 s later
    big = link.schedule(4096, 10.0)
    assert (big.depart_s, big.arrive_s) == (12.0, 12.5)
    # the next small message queues behind that debt
    assert link.schedule(512, 10.0).depart_s == 12.5


def test_zero_byte_message_pays_latency_and_queues_behind_data() -> None:
    link = LinkModel(LinkParams(1024.0, latency_s=0.25), start_s=0.0)
    link.schedule(1024, 0.0)
    done = link.schedule(0, 0.5)
    assert (done.depart_s, done.arrive_s) == (1.0, 1.25)
    alone = LinkModel(LinkParams(1024.0, latency_s=0.25), start_s=0.0).schedule(0, 3.0)
    assert (alone.depart_s, alone.arrive_s) == (3.0, 3.25)


def test_ready_at_changes_nothing() -> None:
    link = LinkModel(LinkParams(1024.0, latency_s=0.25), start_s=0.0)
    link.schedule(1024, 0.0)
    before = link.paid_s
    assert link.ready_at(512, 0.25) == 1.5
    assert link.paid_s == before and link.messages_total == 1


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"bytes_per_s": 0.0}, "bytes_per_s must be a finite number > 0"),
    ({"bytes_per_s": float("inf")}, "bytes_per_s must be a finite number > 0"),
    ({"bytes_per_s": 1.0, "latency_s": -1.0}, "latency_s must be a finite number >= 0"),
    ({"bytes_per_s": 1.0, "burst_bytes": -1}, "burst_bytes must be >= 0"),
])
def test_bad_link_parameters_are_refused(kwargs, fragment) -> None:
    with pytest.raises(TransportError, match=fragment):
        LinkParams(**kwargs)


@settings(max_examples=100, deadline=None)
@given(rate=st.sampled_from([256.0, 1000.0, 4096.0]),
       burst=st.sampled_from([0, 100, 5000]),
       latency=st.sampled_from([0.0, 0.01, 0.5]),
       msgs=st.lists(st.tuples(st.floats(0, 3), st.integers(0, 3000)), min_size=1,
                     max_size=40))
def test_any_sequence_keeps_order_latency_and_the_rate_bound(rate, burst, latency,
                                                            msgs) -> None:
    link = LinkModel(LinkParams(rate, latency_s=latency, burst_bytes=burst), start_s=0.0)
    now, out = 0.0, []
    for gap, n in msgs:
        now += gap
        out.append((now, n, link.schedule(n, now)))
    departs = [c.depart_s for _, _, c in out]
    assert departs == sorted(departs)  # FIFO
    for t, n, c in out:
        assert c.depart_s >= t + max(0.0, (n - burst) / rate) - 1e-9
        assert c.arrive_s == c.depart_s + latency
    # bytes departing in any window [a, b] fit in the bucket plus the rate, counting a
    # message when its last byte leaves (so one message may straddle the start)
    big = max(n for _, n, _ in out)
    for i in range(len(out)):
        for j in range(i, len(out)):
            a, b = departs[i], departs[j]
            sent = sum(n for _, n, c in out[i:j + 1])
            assert sent <= burst + rate * (b - a) + big + 1e-6


def test_saturated_serializer_runs_at_exactly_the_rate() -> None:
    link = LinkModel(LinkParams(1000.0, latency_s=0.0), start_s=0.0)
    last = None
    for _ in range(1000):
        last = link.schedule(250, 0.0)
    assert last is not None and last.depart_s == pytest.approx(250.0, rel=1e-12)


class StepClock:
    """A simulated clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_linked_channel_releases_a_message_exactly_when_due() -> None:
    clock = StepClock()
    ch = LinkedChannel(MPI.COMM_SELF, far=[0], clock=clock,
                       params=LinkParams(1024.0, latency_s=0.25))
    try:
        ch.isend(0, 7, np.arange(64, dtype=np.int64))  # 512 bytes: due at +0.75 s
        ch.isend(0, 8, np.zeros(0, np.uint8))  # zero bytes: queues behind it
        assert ch.held == 2 and ch.held_bytes == 512
        assert ch.next_due() == 100.75
        clock.t = 100.7499
        assert ch.poll() is None and ch.held == 2
        clock.t = 100.75
        msg = ch.poll()
        assert msg is not None and msg.tag == 7
        np.testing.assert_array_equal(msg.view(np.int64), np.arange(64))
        assert ch.poll() is not None and ch.held == 0
        s = ch.stats()
        assert (s["bytes_out"], s["messages_out"]) == (512, 2)
        assert (s["bytes_in"], s["messages_in"]) == (512, 2)
        # the observer sees each message once, when it is handed to the link
        seen = []
        ch.on_send.append(lambda dest, tag, raw: seen.append((dest, tag, raw.size)))
        ch.isend(0, 9, np.ones(16, np.uint8))
        assert seen == [(0, 9, 16)]
        clock.t = 200.0
        ch.drain(1.0)
        assert ch.held == 0 and ch.poll() is not None
    finally:
        ch.close()


def test_near_ranks_bypass_the_link_and_held_messages_time_out() -> None:
    clock = StepClock()
    near = LinkedChannel(MPI.COMM_SELF, far=[], clock=clock,
                         params=LinkParams(1.0, latency_s=1000.0))
    try:
        near.isend(0, 3, np.ones(8, np.uint8))
        assert near.held == 0 and near.poll() is not None  # no delay
    finally:
        near.close()
    far = LinkedChannel(MPI.COMM_SELF, far=[0], clock=clock,
                        params=LinkParams(1.0, latency_s=1000.0))
    try:
        far.isend(0, 3, np.ones(8, np.uint8))
        with pytest.raises(DataPlaneTimeout, match="still held for the link"):
            far.release_held(0.05)  # the clock never reaches the due time
    finally:
        far.close()


def test_the_link_csv_is_written_as_the_run_goes(tmp_path) -> None:
    # a row every publish_every_s (0.02 s) was held in memory until the run's end (~2.6 GB
    # a day per buffer rank), and a crash lost every one: written every FLUSH_ROWS rows now
    from conduit_hpc.features.longhaul import board as board_module
    from conduit_hpc.features.longhaul.board import BOARD_FIELDS, BoardPublisher, LinkCounters
    from conduit_hpc.transport.rma import RmaWindow

    board = RmaWindow(MPI.COMM_SELF, 8 * BOARD_FIELDS, node_comm=MPI.COMM_SELF)
    ch = LinkedChannel(MPI.COMM_SELF, far=[], params=LinkParams(1e6))
    csv = tmp_path / "link-0.csv"
    pub = BoardPublisher(board, 0, 0, ch, LinkCounters(), csv, 0.0, 0.0)
    try:
        every = getattr(board_module, "FLUSH_ROWS", 50)
        for n in range(1, 10 * every + 1):
            pub.c.rows_crossed = n
            pub.maybe()
        # on disk while the run goes on, and no longer in memory
        assert csv.exists(), "nothing written before the end of the run"
        lines = csv.read_text().splitlines()
        assert len(lines) == 1 + 10 * every
        assert lines[-1].split(",")[lines[0].split(",").index("rows_crossed")] == str(n)
        assert pub.sink.pending == 0
    finally:
        pub.close()
        ch.close()
        board.close()
