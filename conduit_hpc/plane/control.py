"""The job-wide control block: counters every rank updates with MPI atomics.

64 bytes in the first buffer rank's memory: rows inserted by actors, rows sampled by
learners, actors and learners done, the lead learner's superstep, rows actors reserved
(admitted or waiting). Plane-internal; features read it through the endpoints.
"""

from __future__ import annotations

from conduit_hpc.transport.rma import RmaWindow

__all__ = [
    "CONTROL_BYTES",
    "C_ACTORS_DONE",
    "C_INSERTS",
    "C_LEARNERS_DONE",
    "C_LEARNER_VERSION",
    "C_RESERVED",
    "C_SAMPLES",
    "ControlBlock",
]

# control block slots (int64): rows written by actors, rows sampled by learners, ranks
# done, the lead learner's superstep, and rows actors have reserved (admitted or waiting)
(C_INSERTS, C_SAMPLES, C_ACTORS_DONE, C_LEARNERS_DONE, C_LEARNER_VERSION,
 C_RESERVED) = range(6)
CONTROL_BYTES = 64

class ControlBlock:
    """Job-wide counters in 64 bytes of one rank's memory, updated with atomics.

    Args:
        window (RmaWindow): the window holding the block.
        owner (int): rank whose segment holds it, at displacement 0.
    """

    def __init__(self, window: RmaWindow, owner: int) -> None:
        self.window, self.owner = window, owner

    def add(self, slot: int, n: int) -> int:
        """Atomically add ``n``; returns the old value. Blocks for the round trip."""
        return self.window.fetch_add(self.owner, 8 * slot, n)

    def read(self, slot: int) -> int:
        return self.window.atomic_read(self.owner, 8 * slot)

    def write(self, slot: int, value: int) -> None:
        self.window.atomic_write(self.owner, 8 * slot, value)
