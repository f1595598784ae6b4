"""The long-haul link counters: what a crossing counts (:func:`crossing_priorities`),
a rank's counters (:class:`LinkCounters`) and their publication to the learner's board
and ``metrics/link-<rank>.csv`` (:class:`BoardPublisher`).

The board is ``int64[world_size, BOARD_FIELDS]`` in the learner's memory, one row per
rank, written with one-sided atomics (metric definitions in
:mod:`conduit_hpc.features.longhaul.metrics`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from conduit_hpc.plane.metrics import CsvSink
from conduit_hpc.protocol import SampleReply, Tag
from conduit_hpc.protocol.forward import forward_head
from conduit_hpc.spec import Spec
from conduit_hpc.transport.link import LinkedChannel
from conduit_hpc.transport.rma import RmaWindow

__all__ = ["BOARD_FIELDS", "FLUSH_ROWS", "LINK_CSV_COLUMNS", "BoardPublisher", "LinkCounters",
           "crossing_priorities"]

# the board: int64[world_size, BOARD_FIELDS] in the learner's memory, one row per rank
(B_BYTES_OUT, B_MESSAGES_OUT, B_BYTES_IN, B_ROWS, B_PRIORITY_SUM, B_DROPPED, B_BACKLOG,
 B_RECEIVED) = range(8)
BOARD_FIELDS = 8
LINK_CSV_COLUMNS = ("time_s", "clock_s", "bytes_out", "messages_out", "bytes_in",
                    "held_messages", "held_bytes", "rows_crossed", "priority_sum",
                    "rows_dropped", "backlog_rows", "rows_received")


def crossing_priorities(tag: int, payload: np.ndarray, spec: Spec,
                        priorities: Mapping[int, np.ndarray]) -> np.ndarray | None:
    """The priorities of the rows a message from the edge buffer hands to the link -
    the one definition used in both placements (see :mod:`conduit_hpc.features.longhaul.metrics`):
    the raw priority the edge replay holds for each row at that moment. A forward
    message carries them (read from the edge index when forwarded); a service reply
    names (shard, slot, generation) and they are read from ``priorities`` (shard id ->
    the index's raw priority per slot) now. ``None`` for messages that carry no rows.
    Local; pure but for reading ``priorities``."""
    if tag == Tag.FORWARD:
        _, _, prio = forward_head(payload)  # the rows are not decompressed
        return np.array(prio, copy=True)
    if tag == Tag.SERVICE_REPLY:
        rep, _ = SampleReply.unpack(payload)
        held = priorities.get(rep.shard_id)
        if held is None:
            return None
        return held[rep.slots].copy()
    return None


# ---------------------------------------------------------------------------------
# counters and their publication


class LinkCounters:
    """What one rank counts about the link besides its channel's byte counts."""

    __slots__ = ("forwarded_nominal_bytes", "priority_sum", "rows_backlog", "rows_crossed",
                 "rows_dropped", "rows_forwarded", "rows_received", "rows_unsent")

    def __init__(self) -> None:
        self.forwarded_nominal_bytes = 0  # forward messages as they would be uncompressed
        self.rows_crossed = 0
        self.priority_sum = 0.0
        self.rows_forwarded = 0
        self.rows_dropped = 0
        self.rows_backlog = 0
        self.rows_unsent = 0
        self.rows_received = 0


#: link-CSV rows a publisher holds before it writes them (~1 s at the default
#: ``publish_every_s``): they were written only at the end, a row every ``publish_every_s``
#: held in memory for the whole run (~2.6 GB a day per buffer rank) and lost with a crash
FLUSH_ROWS = 50


class BoardPublisher:
    """A buffer rank's link counters: to the learner's board (one-sided atomics, only
    fields that changed) and to ``link-<rank>.csv``, at most every ``every_s``.

    Args:
        board (RmaWindow): the board window; ``owner`` holds it.
        owner (int): the learner's world rank.
        rank (int): this rank (its row of the board).
        channel (LinkedChannel): this rank's channel.
        counters (LinkCounters): this rank's counters.
        csv_path (Path | None): the link CSV.
        every_s (float): publication period.
        t0 (float): ``time.monotonic()`` origin of ``time_s``.
    """

    def __init__(self, board: RmaWindow, owner: int, rank: int, channel: LinkedChannel,
                 counters: LinkCounters, csv_path: Path | None, every_s: float,
                 t0: float) -> None:
        self.board, self.owner, self.rank = board, owner, rank
        self.link, self.c = channel, counters
        self.every_s, self.t0 = every_s, t0
        # a resumed attempt appends: its clock and running totals go on (clock_s is the
        # host's monotonic clock, levels such as backlog_rows are the attempt's own)
        self.sink = CsvSink(csv_path, LINK_CSV_COLUMNS, keep=False, carry=(
            "time_s", "bytes_out", "messages_out", "bytes_in", "rows_crossed",
            "priority_sum", "rows_dropped", "rows_received"))
        self._last = -math.inf
        self._sent = np.zeros(BOARD_FIELDS, dtype=np.int64)

    def values(self) -> np.ndarray:
        ch, c = self.link, self.c
        v = np.zeros(BOARD_FIELDS, dtype=np.int64)
        v[B_BYTES_OUT], v[B_MESSAGES_OUT], v[B_BYTES_IN] = (ch.bytes_out, ch.messages_out,
                                                           ch.bytes_in)
        v[B_ROWS] = c.rows_crossed
        v[B_PRIORITY_SUM] = np.float64(c.priority_sum).view(np.int64)
        v[B_DROPPED], v[B_BACKLOG], v[B_RECEIVED] = (c.rows_dropped, c.rows_backlog,
                                                     c.rows_received)
        return v

    def maybe(self, *, force: bool = False) -> None:
        """Publish if ``every_s`` passed (or ``force``). Blocks for a few atomics."""
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        v = self.values()
        base = 8 * BOARD_FIELDS * self.rank
        for i in np.flatnonzero(v != self._sent):
            self.board.atomic_write(self.owner, base + 8 * int(i), int(v[i]))
        self._sent = v
        ch, c = self.link, self.c
        self.sink.add({"time_s": now - self.t0, "clock_s": now, "bytes_out": ch.bytes_out,
                       "messages_out": ch.messages_out, "bytes_in": ch.bytes_in,
                       "held_messages": ch.held, "held_bytes": ch.held_bytes,
                       "rows_crossed": c.rows_crossed, "priority_sum": c.priority_sum,
                       "rows_dropped": c.rows_dropped, "backlog_rows": c.rows_backlog,
                       "rows_received": c.rows_received})
        if force or self.sink.pending >= FLUSH_ROWS:
            self.sink.flush()

    def close(self) -> None:
        self.sink.close()


