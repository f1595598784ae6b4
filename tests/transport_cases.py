"""Transport test cases, written once and run with more than one communicator.

As in mpi4py's ``test/test_rma.py``: each ``*Cases`` class holds the tests and reads
``COMM`` from the subclass. ``tests/unit/test_transport.py`` runs them on
``MPI.COMM_SELF`` (plain pytest, one process), ``tests/mpi/test_transport.py`` on
``MPI.COMM_WORLD`` under ``mpirun`` at any size. Every test is written for a
communicator of any size (1 included): it computes what this rank saw, all-gathers it,
and asserts on every rank; collective calls (window construction and ``close``) are
made by every rank in the same order, also when an assertion fails.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc.errors import DataPlaneTimeout, TransportError
from conduit_hpc.transport.channel import Channel
from conduit_hpc.transport.link import LinkedChannel, LinkParams
from conduit_hpc.transport.rma import RmaWindow

WINDOW_MODES = ["shared", "rma", "hybrid"]


def roundup(n: int) -> int:
    return (max(n, 1) + 63) // 64 * 64


def refusal(call: Callable[[], object], pattern: str,
            exc: type[Exception] = TransportError) -> str:
    """What went wrong with a call that must raise ``exc`` matching ``pattern``: "" when
    it did. Local; it never raises, so a rank that sees something else still makes the
    collective calls that follow, and the verdicts are all-gathered."""
    try:
        call()
    except exc as err:
        return "" if re.search(pattern, str(err)) else f"{exc.__name__} {str(err)!r} !~ {pattern!r}"
    except Exception as err:  # reported, not raised: see above
        return f"{type(err).__name__}: {err}"
    return f"no error (expected {exc.__name__} ~ {pattern!r})"


def self_node(mode: str, rank: int, size: int) -> set[int]:
    """Ranks that share ``rank``'s node in ``mode`` (see :class:`RmaWindowCases`)."""
    if mode == "rma":
        return set()
    if mode == "shared":
        return set(range(size))  # the tests run on one machine
    return {r for r in range(size) if r * 2 // size == rank * 2 // size}


class RmaWindowCases:
    """:class:`RmaWindow` on ``COMM``: ``shared`` (one node, direct load/store), ``rma``
    (no shared memory: every access through MPI) and ``hybrid`` (two emulated nodes:
    shared memory within, a ``Win.Create`` window across; one node on a size-1 comm)."""

    COMM: MPI.Intracomm = MPI.COMM_NULL

    @pytest.fixture(params=WINDOW_MODES)
    def mode(self, request) -> Iterator[str]:
        yield request.param

    @contextmanager
    def window(self, mode: str, nbytes: int) -> Iterator[RmaWindow]:
        comm = self.COMM
        node: MPI.Intracomm | None = None
        if mode == "shared":
            node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        elif mode == "hybrid":
            node = comm.Split(comm.Get_rank() * 2 // comm.Get_size(), comm.Get_rank())
        try:
            win = RmaWindow(comm, nbytes, node_comm=node, shared=node is not None)
            try:
                yield win
            finally:
                win.close()
        finally:
            if node is not None:
                node.Free()

    def test_segments_are_rounded_up_zeroed_and_known_to_every_rank(self, mode) -> None:
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        with self.window(mode, 100 + 30 * rank) as win:
            sizes = [win.segment_bytes(r) for r in range(size)]
            zeroed = not win.own_segment().any()
            seen = comm.allgather((sizes, zeroed, len(win.own_segment())))
        expected = [roundup(100 + 30 * r) for r in range(size)]
        assert all(s == expected for s, _, _ in seen)
        assert all(z for _, z, _ in seen)
        assert [n for _, _, n in seen] == expected

    def test_an_empty_segment_is_allowed_and_refuses_every_access(self, mode) -> None:
        comm = self.COMM
        # rank 0 contributes nothing: its segment is the 64-byte minimum
        with self.window(mode, 0 if comm.Get_rank() == 0 else 64) as win:
            sizes = win.segment_bytes(0)
            wrong = refusal(lambda: win.get(0, 64, np.zeros(1, np.uint8)),
                            "1 bytes at displacement 64 is outside rank 0's segment of 64 bytes")
            seen = comm.allgather((sizes, wrong))
        assert seen == [(64, "")] * comm.Get_size()

    def test_put_then_get_reaches_every_rank(self, mode) -> None:
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        # each target's segment holds one 16-byte slot per origin: [origin, target]
        with self.window(mode, 16 * size) as win:
            for target in range(size):
                win.put(target, 16 * rank, np.array([rank, target], np.int64))
            win.flush()
            comm.Barrier()
            got = np.zeros((size, size, 2), np.int64)
            for target in range(size):
                win.get(target, 0, got[target])
            win.flush()
            comm.Barrier()  # nobody frees the window while others still read it
            # the owner sees the same bytes in its own segment
            win.sync()
            own = win.own_segment()[:16 * size].view(np.int64).reshape(size, 2).copy()
            seen = comm.allgather((got, own))
        for r, (g, own) in enumerate(seen):
            for target in range(size):
                np.testing.assert_array_equal(g[target, :, 0], np.arange(size))
                np.testing.assert_array_equal(g[target, :, 1], np.full(size, target))
            np.testing.assert_array_equal(own[:, 0], np.arange(size))
            np.testing.assert_array_equal(own[:, 1], np.full(size, r))

    def test_a_transfer_past_one_operation_goes_in_parts(self, mode, monkeypatch) -> None:
        """One Put or Get of more than 2**31 - 1 bytes raised MPI_ERR_ARG (a model of
        2**29 float32 weights pulled by an actor on another node); transfers past
        ``MAX_OP_BYTES`` go in parts (made small here: the parts' seams are what is
        tested, not gigabytes)."""
        from conduit_hpc.transport import rma

        monkeypatch.setattr(rma, "MAX_OP_BYTES", 48)
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        with self.window(mode, 1000) as win:
            mine = (np.arange(125, dtype=np.int64) + 1000 * rank)  # 1,000 bytes
            win.put(rank, 0, mine)
            win.flush()
            comm.Barrier()
            got = np.zeros((size, 123), np.int64)
            for target in range(size):
                win.get(target, 8, got[target])  # 984 bytes from byte 8: 21 parts
            win.flush()
            comm.Barrier()
            seen = comm.allgather(got)
        for g in seen:
            for target in range(size):
                np.testing.assert_array_equal(g[target], np.arange(1, 124) + 1000 * target)

    @pytest.mark.parametrize("row_bytes", [16, 24, 104])
    def test_get_blocks_past_one_operation_goes_in_parts(self, mode, monkeypatch,
                                                         row_bytes: int) -> None:
        """A gather of more than 2**31 - 1 bytes in all raised MPI_ERR_ARG (rows of some
        MB, a batch of some hundred); it goes in operations of at most ``MAX_OP_BYTES``
        (made 48 here: 3, 2 and less than 1 row per operation)."""
        from conduit_hpc.transport import rma

        monkeypatch.setattr(rma, "MAX_OP_BYTES", 48)
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        rows = 9
        with self.window(mode, rows * row_bytes) as win:
            mine = win.own_segment()[:rows * row_bytes].reshape(rows, row_bytes)
            mine[:] = ((rank * 16 + np.arange(rows))[:, None] + np.arange(row_bytes)) % 251
            win.sync()
            comm.Barrier()
            win.sync()
            picks = np.array([8, 0, 5, 5, 2, 7, 1])
            got = np.zeros((size, len(picks), row_bytes), np.uint8)
            for target in range(size):
                win.get_blocks(target, 0, row_bytes, picks * row_bytes, got[target])
            win.flush()
            comm.Barrier()
            seen = comm.allgather(got)
        for g in seen:
            for target in range(size):
                want = ((target * 16 + picks)[:, None] + np.arange(row_bytes)) % 251
                np.testing.assert_array_equal(g[target], want)

    def test_get_blocks_gathers_scattered_rows_in_one_call(self, mode) -> None:
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        rows, row_bytes = 12, 24
        with self.window(mode, 64 + rows * row_bytes) as win:
            # the owner fills its rows directly: row i of rank r holds r * 1000 + i
            mine = win.own_segment()[64:64 + rows * row_bytes].view(np.int64).reshape(rows, 3)
            mine[:] = (rank * 1000 + np.arange(rows))[:, None]
            win.sync()
            comm.Barrier()
            win.sync()
            picks = np.array([7, 0, 11, 7, 3])
            got = np.zeros((size, len(picks), 3), np.int64)
            for target in range(size):
                win.get_blocks(target, 64, row_bytes, picks * row_bytes, got[target])
            win.get_blocks(0, 64, row_bytes, np.zeros(0, np.int64), np.zeros(0, np.uint8))
            win.flush()
            comm.Barrier()
            seen = comm.allgather(got)
        for g in seen:
            for target in range(size):
                np.testing.assert_array_equal(g[target], np.repeat(
                    (target * 1000 + picks)[:, None], 3, axis=1))

    def test_fetch_add_hands_out_every_ticket_once(self, mode) -> None:
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        rounds = 25
        with self.window(mode, 8 * (size + 1)) as win:
            tickets = [[win.fetch_add(t, 0, 1) for _ in range(rounds)] for t in range(size)]
            # and a counter per origin, after the shared one, added to with -3
            for t in range(size):
                win.fetch_add(t, 8 * (rank + 1), -3)
            comm.Barrier()
            finals = [win.atomic_read(t, 0) for t in range(size)]
            mine = [win.atomic_read(t, 8 * (rank + 1)) for t in range(size)]
            comm.Barrier()
            seen = comm.allgather((tickets, finals, mine))
        for t in range(size):
            handed = sorted(x for tk, _, _ in seen for x in tk[t])
            assert handed == list(range(size * rounds)), f"rank {t}'s counter"
        assert all(f == [size * rounds] * size for _, f, _ in seen)
        assert all(m == [-3] * size for _, _, m in seen)

    def test_atomic_write_then_read_across_ranks(self, mode) -> None:
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        right = (rank + 1) % size
        with self.window(mode, 8 * size) as win:
            win.atomic_write(right, 8 * rank, 2**40 + rank)
            win.atomic_write(right, 8 * rank, -(2**40) - rank)  # the last write wins
            comm.Barrier()
            got = [win.atomic_read(rank, 8 * origin) for origin in range(size)]
            comm.Barrier()
            seen = comm.allgather(got)
        for r, g in enumerate(seen):
            left = (r - 1) % size
            assert g[left] == -(2**40) - left
            # nothing else wrote into this rank's segment (for size 1, left is the rank)
            assert all(v == 0 for o, v in enumerate(g) if o != left)

    def test_atomics_from_another_thread_and_compare_and_swap_misses(self, mode) -> None:
        # an atomic's operands are reused, one set per thread: interleaved, neither
        # thread sees the other's values
        import threading

        comm = self.COMM
        rank = comm.Get_rank()
        with self.window(mode, 32) as win:
            seen: list[int] = []

            def other() -> None:
                seen.append(win.fetch_add(rank, 8, 5))
                seen.append(win.compare_and_swap(rank, 8, 4, 99))  # a miss: unchanged
                seen.append(win.compare_and_swap(rank, 8, 5, -7))  # a hit
                win.atomic_write(rank, 16, 2**50)
                seen.append(win.atomic_read(rank, 8))

            win.atomic_write(rank, 0, 11)
            for _ in range(3):
                assert win.compare_and_swap(rank, 0, 12, 1) == 11  # misses keep it
                t = threading.Thread(target=other)
                t.start()
                t.join()
                assert win.fetch_add(rank, 0, 0) == 11
                assert seen[-4:] == [0, 5, 5, -7]
                win.atomic_write(rank, 8, 0)
            assert seen == [0, 5, 5, -7] * 3
            assert win.atomic_read(rank, 16) == 2**50
            assert win.atomic_read(rank, 0) == 11
            comm.Barrier()

    def test_local_view_aliases_node_local_segments_only(self, mode) -> None:
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        with self.window(mode, 64) as win:
            direct = {r for r in range(size) if win.local_view(r) is not None}
            views_ok = all(v.dtype == np.uint8 and len(v) == 64 and v.flags.writeable
                           for v in map(win.local_view, direct))
            # a store through a view is what an RMA get of that segment then returns
            for r in sorted(direct):
                win.local_view(r)[rank] = rank + 1
            win.sync()
            comm.Barrier()
            win.sync()
            got = np.zeros(64, np.uint8)
            win.get(rank, 0, got)
            win.flush()
            comm.Barrier()
            seen = comm.allgather((direct, views_ok, got[:size].tolist()))
        for r, (d, ok, g) in enumerate(seen):
            assert d == self_node(mode, r, size) and ok
            # rank q stored into r's segment exactly when r is on q's node
            assert g == [q + 1 if r in self_node(mode, q, size) else 0 for q in range(size)]

    def test_out_of_segment_access_is_refused_naming_rank_displacement_and_size(
            self, mode) -> None:
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        target = (rank + 1) % size
        one = np.zeros(1, np.int64)
        with self.window(mode, 64 * (rank + 1)) as win:
            seg = win.segment_bytes(target)
            outside = rf"outside rank {target}'s segment of {seg} bytes"
            wrong = [
                refusal(lambda: win.put(target, seg - 4, one),
                        rf"8 bytes at displacement {seg - 4} is {outside}"),
                refusal(lambda: win.get(target, -8, one), rf"displacement -8 is {outside}"),
                refusal(lambda: win.fetch_add(target, seg, 1),
                        rf"displacement {seg} is {outside}"),
                refusal(lambda: win.atomic_read(target, seg - 7),
                        rf"displacement {seg - 7} is {outside}"),
                refusal(lambda: win.atomic_write(target, seg, 1),
                        rf"displacement {seg} is {outside}"),
                # the last block ends past the segment
                refusal(lambda: win.get_blocks(target, seg - 8, 8, np.array([0, 16]),
                                               np.zeros(2, np.int64)),
                        rf"displacement {seg + 8} is {outside}"),
                refusal(lambda: win.get_blocks(target, 0, 8, np.array([0, 8]),
                                               np.zeros(3, np.int64)),
                        "buffer of 24 bytes does not hold 2 blocks of 8 bytes"),
                refusal(lambda: win.put(size, 0, one),
                        rf"target rank {size} outside the window's communicator of size "
                        rf"{size}"),
                refusal(lambda: win.put(target, 0, np.zeros((4, 4))[:, 0]), "C-contiguous"),
                # not an integer: a TransportError naming them, not Python's TypeError
                refusal(lambda: win.atomic_read(float(target), 0),
                        rf"rank, displacement and size must be integers, got {float(target)!r}"),
                refusal(lambda: win.fetch_add(target, None, 1),
                        r"must be integers, got \d+, None, 8"),
            ]
            # nothing of the refused accesses landed anywhere
            win.flush()
            comm.Barrier()
            win.sync()
            clean = not win.own_segment().any()
            comm.Barrier()
            seen = comm.allgather((seg == 64 * (target + 1), [w for w in wrong if w], clean))
        assert seen == [(True, [], True)] * size

    def test_a_negative_size_is_refused_before_any_collective(self, mode) -> None:
        # every rank raises on its own (no collective was entered), and stays usable
        with pytest.raises(TransportError, match="nbytes must be >= 0, got -1"):
            RmaWindow(self.COMM, -1, node_comm=None)
        with self.window(mode, 8) as win:
            assert win.fetch_add(0, 0, 1) in range(self.COMM.Get_size())

    def test_every_call_after_close_is_refused(self, mode) -> None:
        with self.window(mode, 64) as win:
            pass
        assert win.closed
        win.close()  # idempotent (and, being local then, needs no other rank)
        buf = np.zeros(1, np.int64)
        calls = {"put": lambda: win.put(0, 0, buf),
                 "get": lambda: win.get(0, 0, buf),
                 "get_blocks": lambda: win.get_blocks(0, 0, 8, np.zeros(1), buf),
                 "fetch_add": lambda: win.fetch_add(0, 0, 1),
                 "atomic_read": lambda: win.atomic_read(0, 0),
                 "atomic_write": lambda: win.atomic_write(0, 0, 1),
                 "flush": lambda: win.flush(),
                 "flush(0)": lambda: win.flush(0),
                 "sync": lambda: win.sync()}
        wrong = {k: w for k, call in calls.items()
                 if (w := refusal(call, r"window used after close\(\)"))}
        assert wrong == {}
        assert win.local_view(0) is None


class ChannelCases:
    """:class:`Channel` (and :class:`LinkedChannel`'s MPI side) on ``COMM``: every rank
    sends to its right neighbour and receives from its left one (itself on a size-1
    comm)."""

    COMM: MPI.Intracomm = MPI.COMM_NULL

    @contextmanager
    def channel(self, **kwargs) -> Iterator[Channel]:
        ch = Channel(self.COMM, **kwargs)
        try:
            yield ch
        finally:
            ch.drain(10.0)
            ch.close()

    def neighbours(self) -> tuple[int, int]:
        rank, size = self.COMM.Get_rank(), self.COMM.Get_size()
        return (rank - 1) % size, (rank + 1) % size

    def test_send_and_recv_carry_bytes_of_any_layout(self) -> None:
        left, right = self.neighbours()
        rank = self.COMM.Get_rank()
        with self.channel() as ch:
            assert (ch.rank, ch.size) == (rank, self.COMM.Get_size())
            ch.send(right, 3, np.arange(6, dtype=np.float64).reshape(2, 3)[:, 1] + rank)
            ch.send(right, 4, np.zeros(0, np.int32))  # zero bytes
            a = ch.recv(left, 3, timeout_s=30)
            b = ch.recv(left, 4, timeout_s=30)
            seen = self.COMM.allgather((a.source, a.tag, a.view(np.float64).tolist(),
                                        b.source, b.tag, b.payload.size, a.payload.dtype))
        for r, (src, tag, vals, src_b, tag_b, nb, dt) in enumerate(seen):
            lft = (r - 1) % len(seen)
            assert (src, tag, vals) == (lft, 3, [1.0 + lft, 4.0 + lft])
            assert (src_b, tag_b, nb, dt) == (lft, 4, 0, np.uint8)

    def test_isend_keeps_order_and_tags_select(self) -> None:
        left, right = self.neighbours()
        rank = self.COMM.Get_rank()
        with self.channel() as ch:
            for i in range(20):
                ch.isend(right, 10 + i % 2, np.array([rank, i], np.int64))
            ch.drain(30.0)
            # by tag: the odd ones first, then the even ones; each tag in sending order
            odd = [ch.recv(left, 11, timeout_s=30).view(np.int64).tolist() for _ in range(10)]
            even = [ch.recv(tag=10, timeout_s=30).view(np.int64).tolist() for _ in range(10)]
            after = ch.poll()
            seen = self.COMM.allgather((odd, even, after))
        for r, (odd, even, after) in enumerate(seen):
            lft = (r - 1) % len(seen)
            assert odd == [[lft, i] for i in range(1, 20, 2)]
            assert even == [[lft, i] for i in range(0, 20, 2)]
            assert after is None

    def test_any_source_hears_everyone(self) -> None:
        comm = self.COMM
        rank, size = comm.Get_rank(), comm.Get_size()
        with self.channel() as ch:
            for dest in range(size):
                ch.isend(dest, 5, np.array([rank], np.int64))
            got = sorted(int(ch.recv(tag=5, timeout_s=30).view(np.int64)[0])
                         for _ in range(size))
            sources_ok = got == list(range(size))
            assert all(comm.allgather(sources_ok))

    def test_messages_stay_on_the_channels_own_communicator(self) -> None:
        comm = self.COMM
        left, right = self.neighbours()
        with self.channel() as ch:
            assert ch.comm != comm and MPI.Comm.Compare(ch.comm, comm) == MPI.CONGRUENT
            ch.isend(right, 7, np.ones(4, np.uint8))
            ch.drain(30.0)
            m = ch.recv(left, 7, timeout_s=30)
            leaked = comm.Iprobe(MPI.ANY_SOURCE, 7)  # nothing arrives on the parent comm
            seen = comm.allgather((m.payload.tolist(), leaked))
        assert all(p == [1, 1, 1, 1] and not leaked for p, leaked in seen)

    def test_recv_times_out_naming_what_it_waited_for(self) -> None:
        rank = self.COMM.Get_rank()
        with self.channel() as ch:
            nothing = ch.poll(tag=99)
            t0 = time.monotonic()
            wrong = refusal(lambda: ch.recv(0, 99, timeout_s=0.1, what="the reply"),
                            rf"waited 0\.1 s for the reply \(source 0, tag 99\) on rank {rank}",
                            DataPlaneTimeout)
            waited = time.monotonic() - t0
            seen = self.COMM.allgather((nothing, wrong, 0.1 <= waited < 5.0))
        assert seen == [(None, "", True)] * self.COMM.Get_size()

    def test_every_call_after_close_is_refused(self) -> None:
        ch = Channel(self.COMM)
        ch.close()
        ch.close()  # idempotent
        buf = np.zeros(1, np.uint8)
        calls = {"send": lambda: ch.send(0, 1, buf), "isend": lambda: ch.isend(0, 1, buf),
                 "poll": lambda: ch.poll(), "recv": lambda: ch.recv(timeout_s=1.0)}
        wrong = {k: w for k, call in calls.items()
                 if (w := refusal(call, r"channel used after close\(\)"))}
        assert wrong == {}
        ch.drain(0.1)  # nothing pending: returns at once

    def test_linked_channel_holds_far_messages_for_the_latency(self) -> None:
        comm = self.COMM
        left, right = self.neighbours()
        latency = 0.2
        ch = LinkedChannel(comm, far=range(comm.Get_size()),
                           params=LinkParams(1e9, latency_s=latency))
        try:
            t0 = time.monotonic()
            ch.isend(right, 8, np.arange(4, dtype=np.int64))
            held = ch.held
            ch.drain(30.0)  # releases it when due, then completes the send
            released_after = time.monotonic() - t0
            m = ch.recv(left, 8, timeout_s=30)
            comm.Barrier()
            s = ch.stats()
            seen = comm.allgather((held, released_after, m.view(np.int64).tolist(), s))
        finally:
            ch.close()
        for held, after, vals, s in seen:
            assert held == 1 and after >= latency
            assert vals == [0, 1, 2, 3]
            assert (s["messages_out"], s["bytes_out"], s["held_messages"]) == (1, 32, 0)
            assert (s["messages_in"], s["bytes_in"]) == (1, 32)
