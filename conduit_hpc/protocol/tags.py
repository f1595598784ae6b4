"""Message tags on the data plane's channel, one range of numbers per owner.

Each owner - the plane's core, each feature, jobs and tests - takes its tags from its
own range in :data:`TAG_RANGES`, so that a new feature's tag can never collide with
another's. Members of :class:`Tag` are the library's; a job (or a test) declares its
own as plain ints in :data:`JOB_TAGS` (``EPISODES_TAG = JOB_TAGS.start``, see
:mod:`conduit_hpc.rl.episodes`). Plain Python; no MPI.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["JOB_TAGS", "TAG_RANGES", "Tag", "tag_owner"]

#: tag numbers by owner; the ranges do not overlap (``tests/unit/test_protocol.py``)
TAG_RANGES: Mapping[str, range] = MappingProxyType({
    "plane": range(1, 40),  # the plane's core: sampling, priorities, done
    "checkpointing": range(40, 60),  # conduit_hpc.features.checkpointing
    "replace": range(60, 70),  # conduit_hpc.features.replace
    "longhaul": range(70, 80),  # conduit_hpc.features.longhaul
    "jobs": range(100, 200),  # declared by jobs and tests, never by the library
})
#: the tags jobs and tests declare for their own messages
JOB_TAGS = TAG_RANGES["jobs"]


class Tag(enum.IntEnum):
    """Message tags on the data plane's channel (numbers from :data:`TAG_RANGES`)."""

    # the plane's core (TAG_RANGES["plane"])
    DONE = 1  # a non-buffer rank will send nothing more
    SAMPLE = 2  # learner -> owner: prefix-search these targets
    SAMPLE_REPLY = 3  # owner -> learner: slots, generations, masses
    PRIORITY = 4  # learner -> owner: new priorities for (slot, generation)
    SERVICE = 5  # learner -> owner: sample and send the rows themselves
    SERVICE_REPLY = 6  # owner -> learner: SAMPLE_REPLY plus the rows
    # checkpoints and stopping (TAG_RANGES["checkpointing"], conduit_hpc.features.checkpointing);
    # payloads are JSON bytes
    STOP = 40  # a rank was asked to stop (SIGTERM/SIGUSR1): every rank stops
    CKPT_REQUEST = 41  # any rank -> first buffer rank: please checkpoint
    CKPT_CUT = 42  # first buffer rank -> buffer ranks: cut your shards now
    CKPT_PART = 43  # buffer rank -> first buffer rank: my file is written
    CKPT_MARK = 44  # learner -> every buffer rank: my messages of superstep s are sent
    # adaptive re-placement in a running job (TAG_RANGES["replace"], conduit_hpc.features.replace)
    REPLACE_TELEMETRY = 60  # lead learner -> coordinator: samples per shard, timings
    REPLACE_STATS_REQ = 61  # coordinator -> buffer ranks: report the rows you hold
    REPLACE_STATS = 62  # buffer rank -> coordinator: held rows by sampling mass
    REPLACE_MOVE = 63  # coordinator -> owner: move these rows (JSON)
    REPLACE_MOVED = 64  # owner -> coordinator: moved (JSON counts)
    REPLACE_FWD = 65  # owner -> owner: priority updates for rows that moved
    REPLACE_FWD_ACK = 66  # owner -> owner: a forward is applied (or dropped), chain included
    REPLACE_QUIET = 67  # buffer -> buffer ranks: every peer is done, nothing of mine in flight
    # the long-haul deployment (TAG_RANGES["longhaul"], conduit_hpc.features.longhaul)
    FORWARD = 70  # edge buffer -> cloud buffer: rows with priorities (protocol.forward)


def tag_owner(tag: int) -> str:
    """The owner of ``tag``'s range in :data:`TAG_RANGES`.

    Raises:
        ValueError: ``tag`` lies in no range.
    """
    for owner, numbers in TAG_RANGES.items():
        if tag in numbers:
            return owner
    raise ValueError(f"tag must lie in one of TAG_RANGES {dict(TAG_RANGES)!r}, got {tag!r}")
