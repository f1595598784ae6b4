"""The cyclic garbage collector while a data plane runs (``run.gc_freeze``).

CPython's cyclic collector runs a full pass over every tracked object once enough
objects have survived its younger passes. A learner's process holds ~280,000 of them
once torch is imported, nearly all made before the job's loop starts (modules,
functions, classes); a full pass over them took ~90 ms, and the experience path's own
allocations brought one every few thousand batches: on the learner of
``scripts/learner_cpu.py cartpole`` (timed with ``gc.callbacks``) the collector took
~17% of its time, most of it in full passes (``bench/README.md``, "Stop 44").

:class:`GcFreeze` moves every object alive when the plane is built into the collector's
permanent generation (``gc.freeze``): they are not traversed again while it runs, and
what the loop makes is collected as before. :meth:`GcFreeze.thaw` gives them back
(``gc.unfreeze``) when the plane closes or leaves on an error, so that garbage cycles
among them are collected after all (until then such garbage, made before the plane, is
kept). A process that froze objects itself is left as it is: its freeze is its own.
Local; no MPI.
"""

from __future__ import annotations

import gc

__all__ = ["GcFreeze"]


class GcFreeze:
    """Freezes the objects alive now (``enabled``: ``run.gc_freeze``), unless the
    process has frozen objects already. Constant time: CPython moves its lists of
    objects, it does not walk them."""

    def __init__(self, enabled: bool) -> None:
        self.frozen = bool(enabled) and not gc.get_freeze_count()
        if self.frozen:
            gc.freeze()

    def thaw(self) -> None:
        """Undo the freeze, once (later calls, and calls where none was made, do
        nothing)."""
        if self.frozen:
            self.frozen = False
            gc.unfreeze()
