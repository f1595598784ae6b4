"""What a job's checkpoints came to, told at its end on every rank.

A periodic checkpoint that fails (a full file system, a quota, a directory that cannot be
created) is dropped with one warning line and training goes on: one failure must not end
a long run. But a job that asked for checkpoints and got *none* is not resumable, and a
user who finds that out at the next preemption has lost the run. So a job ends with
:func:`checkpoint_outcome`: one line of what was written and what failed, and
:meth:`CheckpointOutcome.raise_if_none_written` turns "checkpoints were attempted and every
one failed" into a :class:`~conduit_hpc.errors.CheckpointError` on every rank together
(exit status 3 through :func:`~conduit_hpc.job.job_main`), after the job's report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conduit_hpc.errors import CheckpointError
from conduit_hpc.features.checkpointing.records import RECORDS_KEEP
from conduit_hpc.transport.objects import allgather_json

if TYPE_CHECKING:
    from conduit_hpc.features.checkpointing.agent import CheckpointAgent
    from conduit_hpc.features.checkpointing.save import SaveResult
    from conduit_hpc.plane.host import FeatureHost

__all__ = ["CheckpointOutcome", "checkpoint_outcome"]



@dataclass(frozen=True)
class CheckpointOutcome:
    """The job's checkpoints, the same on every rank."""

    written: list[str] = field(default_factory=list)  # paths, periodic then final
    failed: list[str] = field(default_factory=list)  # one message each
    longest_cut_s: float = 0.0
    #: checkpoints written and failed in all (``written`` and ``failed`` hold the latest
    #: :data:`RECORDS_KEEP` of each rank); ``None``: as many as listed
    written_count: int | None = None
    failed_count: int | None = None

    @property
    def n_written(self) -> int:
        return len(self.written) if self.written_count is None else self.written_count

    @property
    def n_failed(self) -> int:
        return len(self.failed) if self.failed_count is None else self.failed_count

    @property
    def none_written(self) -> bool:
        """Checkpoints were attempted and every one failed."""
        return self.n_failed > 0 and self.n_written == 0

    def lines(self) -> list[str]:
        """What to print at the end of the job (empty when no checkpoint was attempted)."""
        out: list[str] = []
        if self.n_written or self.n_failed:
            out.append(f"checkpoints: {self.n_written} written, {self.n_failed} failed"
                       f"; longest cut (pause) {self.longest_cut_s * 1e3:.2f} ms; last "
                       f"{self.written[-1] if self.written else '-'}")
        if self.n_failed > len(self.failed):
            out.append(f"the latest {len(self.failed)} of {self.n_failed} failures:")
        out.extend(f"checkpoint failed: {f}" for f in self.failed)
        return out

    def raise_if_none_written(self) -> None:
        """Raises:
            CheckpointError: every checkpoint this job attempted failed (the run cannot be
                resumed); names how many and the first failure.
        """
        if self.none_written:
            which = ("the first failure" if self.n_failed == len(self.failed)
                     else f"the earliest of the latest {len(self.failed)} failures")
            raise CheckpointError(
                f"every checkpoint this job attempted failed ({self.n_failed} of "
                f"{self.n_failed}), so this run cannot be resumed; {which}: "
                f"{self.failed[0] if self.failed else '?'}")


def checkpoint_outcome(edp: FeatureHost, agent: CheckpointAgent | None,
                       final: SaveResult | None = None) -> CheckpointOutcome:
    """Gather every rank's checkpoint records. **Collective** over the job's ranks (call it
    where every rank calls it, after :meth:`CheckpointAgent.finish` and the final save).

    Args:
        edp (FeatureHost): this rank's data plane.
        agent (CheckpointAgent | None): the job's agent (``None``: no periodic checkpoints).
        final (SaveResult | None): the final checkpoint, when one was written.
    """
    mine: dict[str, Any] = {"written": [], "failed": [], "n_written": 0, "n_failed": 0,
                            "longest_cut_s": 0.0}
    if agent is not None:
        mine = {"written": [str(c.get("path", "?")) for c in agent.completed],
                "failed": list(agent.failed), "n_written": agent.completed.total,
                "n_failed": agent.failed.total, "longest_cut_s": agent.longest_cut_s}
    me = edp.world_rank
    every = allgather_json(edp.roles.world, mine, edp.config.run.timeout_s,
                           "the job's checkpoint outcome",
                           lambda: edp.control.raise_if_failed(me))
    written = [p for r in every for p in r["written"]][-RECORDS_KEEP:]
    n_written = sum(int(r["n_written"]) for r in every)
    if final is not None:
        written.append(str(final.path))
        n_written += 1
    return CheckpointOutcome(written=written, failed=[f for r in every for f in r["failed"]],
                             longest_cut_s=max(float(r["longest_cut_s"]) for r in every),
                             written_count=n_written,
                             failed_count=sum(int(r["n_failed"]) for r in every))
