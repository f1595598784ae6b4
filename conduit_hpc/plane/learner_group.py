"""The learner ranks as one data-parallel group: gradients averaged each superstep,
parameters broadcast from the lead learner, stop decisions agreed.

:meth:`LearnerGroup.open` forms a :class:`~conduit_hpc.transport.collectives.Collectives`
group over the learners' communicator (``RoleComms.learner``) and agrees the outcome on
the whole world, so that a learner that cannot join (NCCL asked for without a GPU, a
rendezvous that failed) makes *every* rank of the job raise the same error, actors and
buffers included. With one learner no process group is formed and every operation is
the identity.

The collectives run on the learner's own thread, never through MPI, so they can run
while the ``edp`` data-plane thread owns this rank's MPI calls.

Opened with the data plane (``LearnerGroup.open(edp, ...)``), a learner that leaves the
plane on an exception shuts its group down on the way out (``ControlBlock.on_leave``), so
the learners waiting for it in a collective stop at once, and their
:class:`~conduit_hpc.errors.CollectiveFailed` names it (the plane's record of who left),
instead of waiting out ``timeout_s`` and naming nobody.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.errors import CollectiveMismatch, ConduitError, ConfigError, TransportError
from conduit_hpc.plane.roles import RoleComms
from conduit_hpc.transport.objects import allgather_json

if TYPE_CHECKING:  # torch loads only on ranks that use it
    import torch

    from conduit_hpc.plane.front import ExperienceDataPlane
    from conduit_hpc.transport.collectives import Collectives

__all__ = ["LearnerGroup"]


class LearnerGroup:
    """This learner's place in the group of learners (``None`` parts on other roles).

    Attributes:
        size (int): learner ranks in the job.
        rank (int): this learner's index among them (0 = the lead; -1 elsewhere).
        backend (str): ``gloo``, ``nccl``, or ``none`` (one learner, or not a learner).
        allreduce_s, agree_s (float): seconds this learner spent in
            :meth:`average_gradients` and :meth:`agree` (0 with one learner); a call's
            time includes waiting for the slowest learner to arrive.
        allreduce_calls, agree_calls (int): how many of those calls went to the group.
    """

    def __init__(self, coll: Collectives | None, size: int, rank: int, *,
                 world_rank: int = -1, role: str = "learner") -> None:
        self._coll, self.size, self.rank = coll, size, rank
        self._where = f"world rank {world_rank} has the role {role!r}"
        self.backend = coll.backend if coll is not None else "none"
        self.allreduce_s = self.agree_s = 0.0
        self.allreduce_calls = self.agree_calls = 0

    @classmethod
    def open(cls, roles: RoleComms | ExperienceDataPlane, backend: str = "auto", *,
             timeout_s: float = 60.0, device: torch.device | None = None) -> LearnerGroup:
        """Form the learners' group. **Collective** on ``roles.world`` (every rank calls
        it, before any learner's first ``next_batch``: the rendezvous uses MPI).

        Args:
            roles (RoleComms | ExperienceDataPlane): the job's communicators, or the data
                plane (then a learner leaving it on an exception ends the others'
                collectives at once, and their error names it).
            backend (str): ``transport.collectives``: ``auto``, ``gloo`` or ``nccl``.
            timeout_s (float): bound on forming the group and on each collective.
            device (torch.device | None): this learner's device (NCCL's GPU).

        Raises:
            ConfigError: a bad backend or ``timeout_s``, or NCCL where a learner has no
                GPU (every rank).
            TransportError: a learner could not join the group (every rank).
            CollectiveFailed: a rank did not call it within ``timeout_s`` (e.g. a job
                that opens it on learners only: before, the learners waited forever in
                the world's Allgather); RemoteFailure: a rank left the data plane.
        """
        if isinstance(timeout_s, bool) or not (isinstance(timeout_s, int | float)
                                               and 0 < timeout_s <= 86400):
            raise ConfigError(f"timeout_s must be a number of seconds in (0, 86400], got "
                              f"{timeout_s!r}", key="timeout_s")
        plane = None if isinstance(roles, RoleComms) else roles
        roles = roles if isinstance(roles, RoleComms) else roles.roles
        check = _who_left(plane) if plane is not None else None
        what = "LearnerGroup.open()"
        # every rank is here before the learners' own collectives (bounded: a rank that
        # never calls it fails the others here, not inside the learners' Split_type)
        allgather_json(roles.world, 0, timeout_s, what, check)
        n = len(roles.learner_ranks)
        coll, problem, kind = None, "", ""
        if roles.learner is not None:
            try:
                if n > 1:
                    from conduit_hpc.transport.collectives import Collectives

                    coll = Collectives.open(roles.learner, backend, timeout_s=timeout_s,
                                            device=device)
                else:
                    _check_alone(backend, device)
            except ConduitError as err:
                problem, kind = f"on world rank {roles.world_rank}: {err}", type(err).__name__
        # the learners' forming is bounded by timeout_s (rendezvous) on each of them
        reports = [r for r in allgather_json(roles.world, [problem, kind], 2 * timeout_s + 10,
                                             what, check) if r[0]]
        if reports:
            if coll is not None:
                coll.close()
            text, kind = reports[0]
            raise (ConfigError(text, key="transport.collectives") if kind == "ConfigError"
                   else TransportError(f"the learners' process group: {text}"))
        rank = roles.role_rank if roles.learner is not None else -1
        group = cls(coll, n, rank, world_rank=roles.world_rank, role=roles.role.value)
        if coll is not None:  # named so to the others if it closes the group first
            coll.member = f"learner {rank} (world rank {roles.world_rank})"
        if plane is not None and coll is not None:
            coll.peers, coll.idle = _who_left(plane), _progress(plane)
            plane.control.on_leave.append(group.close)
        return group

    def _require(self, what: str) -> None:
        if self.rank < 0:
            raise ConduitError(f"LearnerGroup.{what} is for learner ranks (collective on "
                               f"them); {self._where}")

    # -- per superstep -----------------------------------------------------------------
    def average_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Replace every parameter's gradient by its mean over the learners (one flat
        all-reduce per dtype). Parameters with ``requires_grad=False`` take no part. A
        parameter whose gradient is ``None`` on some learners (unused this step) counts
        as zeros there, as in DDP, and gets the mean if any learner had a gradient; it
        stays ``None`` if none had. **Collective** on the learners; blocks (bounded).

        Raises:
            CollectiveMismatch: the learners' parameters differ in number, shapes, dtypes
                or order, or a gradient is sparse (on every learner).
            CollectiveFailed: a learner failed or left (named when the group was opened
                with the data plane), or one left a collective of the group unfinished
                (an interrupt it caught: the group is out of step, and ended).
        """
        self._require("average_gradients()")
        if self._coll is not None:
            import torch

            t0 = time.perf_counter()
            bad: Exception | None = None
            grads: list[Any]
            try:
                live = [p for p in params if p.requires_grad]
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in live]
            except (AttributeError, TypeError, RuntimeError) as err:
                # not parameters (None, a number...): refused on every learner through
                # the collective's header (a non-tensor), not here alone while the
                # others wait for this one
                live, grads, bad = [], [err], err
            try:
                anywhere = self._coll.allreduce_mean_(grads,
                                                      [p.grad is not None for p in live])
            except CollectiveMismatch as err:
                if bad is None:
                    raise
                raise CollectiveMismatch(f"average_gradients() on learner {self.rank}: "
                                         f"params must be torch parameters ({bad}); {err}"
                                         ) from bad
            for p, g, had in zip(live, grads, anywhere, strict=True):
                if p.grad is None and had:
                    p.grad = g
            self.allreduce_s += time.perf_counter() - t0
            self.allreduce_calls += 1

    def agree(self, code: int) -> int:
        """The largest ``code`` any learner passed (0: every learner goes on).
        **Collective** on the learners; blocks (bounded)."""
        self._require("agree()")
        ok = isinstance(code, int | np.integer | np.bool_) and -(2 ** 63) <= int(code) < 2 ** 63
        if self._coll is None:  # one learner: the same rule as the collective's
            if not ok:
                raise CollectiveMismatch(f"agree(): code must be an int64, got {code!r}")
            return int(code)
        t0 = time.perf_counter()
        try:
            out = self._coll.allreduce_max([code])[0]
        except CollectiveMismatch as err:  # raised on every learner; this one says its value
            if ok:
                raise
            raise CollectiveMismatch(f"{err} (this learner passed agree({code!r}))") from err
        self.agree_s += time.perf_counter() - t0
        self.agree_calls += 1
        return out

    def timings(self) -> dict[str, float]:
        """This learner's mean seconds per gradient all-reduce and per agreement
        (``allreduce_mean_s``, ``agree_mean_s``; ``nan`` where no call went to a group:
        one learner) and the call counts, for the run's summary. Local."""
        return {"allreduce_mean_s": (self.allreduce_s / self.allreduce_calls
                                     if self.allreduce_calls else math.nan),
                "agree_mean_s": (self.agree_s / self.agree_calls
                                 if self.agree_calls else math.nan),
                "allreduce_calls": self.allreduce_calls, "agree_calls": self.agree_calls}

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Give every learner the lead learner's parameters and buffers.
        **Collective** on the learners; blocks (bounded)."""
        self._require("broadcast_module()")
        if self._coll is not None:
            import torch

            with torch.no_grad():
                self._coll.broadcast_([*module.parameters(), *module.buffers()], src=0)

    def broadcast_(self, tensors: list[torch.Tensor]) -> None:
        """Overwrite ``tensors`` with the lead learner's. **Collective** on the learners."""
        self._require("broadcast_()")
        if self._coll is not None:
            self._coll.broadcast_(tensors, src=0)

    @staticmethod
    def checksum(module: torch.nn.Module) -> str:
        """SHA-256 (16 hex digits) of the module's parameters' bytes: equal on every
        learner iff the parameters are identical. Local."""
        h = hashlib.sha256()
        for p in module.parameters():
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def close(self) -> None:
        """Shut the process group down. Local; idempotent."""
        if self._coll is not None:
            self._coll.close()


def _progress(plane: ExperienceDataPlane) -> Callable[[], object]:
    """Enters MPI where this rank's MPI calls are made (posted to the data-plane thread
    in ``edp``), while the learner waits in a gloo step. Across hosts a learner may be its
    node's osc rdma leader, whose MPI progress every RMA atomic on the node's segments
    waits for: in ``sync`` mode nothing else entered MPI, and a learner that had left
    ``LearnerGroup.open``'s last all-gather first stalled, until gloo's timeout, the other
    learner's read of the control block in that all-gather - so it never reached the
    all-reduce this one waited in (``test_learner_group_across_hosts``, 2 runs of 4)."""
    window = plane.control.window

    def progress() -> object:
        if not plane._closed and plane.learner is not None:
            with contextlib.suppress(ConduitError):  # (a closing plane: the wait decides)
                plane.learner.post(window.progress)
        return None

    return progress


def _who_left(plane: ExperienceDataPlane) -> Callable[[], object]:
    """Raises RemoteFailure naming a rank that left the data plane on an exception (read
    where this rank's MPI calls are made: the data-plane thread in ``edp``)."""
    check = partial(plane.control.raise_if_failed, plane.world_rank)

    def who_left() -> object:
        if plane._closed:  # the control block is freed: nothing to read
            return None
        if plane.learner is not None:
            return plane.learner.run_on_thread(check, "a look at which rank left")
        return check()

    return who_left


def _check_alone(backend: str, device: Any) -> None:
    """One learner forms no group, but the backend it asks for is still checked."""
    import torch
    import torch.distributed as dist

    from conduit_hpc.transport.collectives import choose_backend

    cuda = (device is not None and torch.device(device).type == "cuda"
            and torch.cuda.is_available())
    choose_backend(backend, [{"cuda": cuda, "nccl": dist.is_nccl_available()}])
