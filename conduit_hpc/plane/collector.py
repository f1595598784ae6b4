"""The cyclic garbage collector while a data plane runs (``run.gc_freeze``).

CPython's cyclic collector runs a full pass over every tracked object once enough
objects have survived its younger passes. A learner's process holds ~280,000 of them
once torch is imported, nearly all made before the job's loop starts (modules,
functions, classes), and a full pass over them takes 80-180 ms. Start-up makes 3-5 such
passes, and the last one often fell in the first second of the job's loop: timed with
``gc.callbacks`` on the learner of ``scripts/learner_cpu.py cartpole``, one of 133 ms
4.5 s after the process started, after the plane was built, then none (the loop's own
garbage cost ~0.1% of its time: ~100 young passes, 3 ms, in ~15 s). Inside ``bench
capacity``'s 4,000-batch window (~0.7 s) such a pause was 15-20% of it
(``bench/README.md``, "Stop 44"); a job whose loop keeps objects alive meets one every
time a quarter more have survived.

:class:`GcFreeze` moves every object alive when the plane is built into the collector's
permanent generation (``gc.freeze``): a later full pass does not traverse them again
while it runs, and what the loop makes is collected as before. :meth:`GcFreeze.thaw`
gives them back (``gc.unfreeze``) when the plane closes or leaves on an error, so that
garbage cycles among them are collected after all (until then such garbage, made before
the plane, is kept). A process that froze objects itself is left as it is: its freeze is
its own. Local; no MPI.
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
