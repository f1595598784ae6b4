"""The learner side of the data plane: supersteps, the three delivery modes, metrics.

* ``edp``: a :class:`~conduit_hpc.scheduler.DataPlaneThread` prepares batches
  ``s+1 .. s+depth`` while the learner computes on batch ``s``; it is the only thread of
  the rank that makes MPI calls while it runs (MPI_THREAD_SERIALIZED or better needed).
* ``sync``: ``next_batch`` samples, gathers, transforms and copies inline.
* ``service``: ``next_batch`` asks the buffer ranks for the rows and waits.

Per superstep the endpoint records iteration latency (between successive
``next_batch`` returns), exposed latency (time blocked inside ``next_batch``, including
the device copy it waits on) and the split of the experience path.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.config import SchedulerConfig
from conduit_hpc.errors import DataPlaneClosed, DataPlaneTimeout
from conduit_hpc.plane.delivery import (
    C_LEARNER_VERSION,
    Batch,
    ControlBlock,
    Deliverer,
    PendingBatch,
    WeightsBoard,
    check_update,
    flat_parameters,
)
from conduit_hpc.plane.metrics import LEARNER_COLUMNS, CsvSink, LiveStatus, latency_summary
from conduit_hpc.scheduler import DataPlaneThread, PrefetchClock

if TYPE_CHECKING:
    import torch

__all__ = ["LearnerEndpoint"]


class LearnerEndpoint:
    """Delivery on one learner rank.

    Args:
        deliverer (Deliverer): the experience path.
        config (SchedulerConfig): mode, depth, weights cadence.
        control (ControlBlock): job-wide counters.
        lead (bool): this is the lead learner (publishes version and weights).
        metrics_path (Path | None): CSV file for per-superstep metrics.
        timeout_s (float): bound on every wait.
        status (bool): print a live status line.
    """

    def __init__(self, deliverer: Deliverer, config: SchedulerConfig, control: ControlBlock,
                 *, lead: bool, metrics_path: Path | None, timeout_s: float,
                 status: bool = False) -> None:
        self.d = deliverer
        self.cfg = config
        self.control = control
        self.lead = lead
        self.timeout_s = timeout_s
        self.mode = config.mode
        # the owner samples and sends the rows: always in service mode, by choice else
        self._by_owner = config.mode == "service" or config.fetch == "owner"
        # edp + owner fetch: the requests of every batch the clock allows are in flight
        # at once, so a long link's latency overlaps (batches still complete in order)
        self._pipelined = self.mode == "edp" and config.fetch == "owner"
        self._pending: deque[PendingBatch] = deque()
        self.clock = PrefetchClock(config.prefetch_depth if self.mode == "edp" else 0)
        self.metrics = CsvSink(metrics_path, LEARNER_COLUMNS)
        self.status = LiveStatus() if status else None
        self.weights: WeightsBoard | None = None
        self.model: torch.nn.Module | None = None
        self._ready: dict[int, Batch] = {}
        self._cv = threading.Condition()
        self._superstep = -1
        self._t_start = time.perf_counter()
        self._last_return: float | None = None
        self._row: dict[str, Any] | None = None
        self._extra: dict[str, Any] = {}
        self.priority_rows = 0
        self._ckpt: tuple[Any, int, Callable[[], dict[str, Any]]] | None = None
        self._part: dict[str, Any] | None = None  # a checkpoint part not yet handed in
        self._thread: DataPlaneThread | None = None
        self._closed: DataPlaneClosed | None = None  # the thread saw the stream end
        #: called at the end of every ``next_batch`` (in the caller's thread) with the
        #: superstep, the batch and its exposed seconds; must not block or call MPI (use
        #: :meth:`post`) - e.g. adaptive placement's telemetry
        self.on_superstep: list[Callable[[int, Batch, float], None]] = []
        self.started = False  # the thread starts at the first next_batch(), so that
        # collectives before it (share_weights) run while one thread makes MPI calls

    def _start(self) -> None:
        self.started = True
        if self.mode == "edp":
            self._thread = DataPlaneThread(self._prefetch_step)
            self._thread.start()

    # -- thread side -----------------------------------------------------------------
    def _prefetch_step(self) -> bool:
        self.d.channel.progress()  # e.g. release messages held for a long link
        if self._closed is not None:  # no new batches; those in flight still complete
            return self._complete_arrived()
        try:
            return self._pipelined_step() if self._pipelined else self._prepare_step()
        except DataPlaneClosed as err:
            # the end of the stream (every actor finished below the minimum fill), not
            # a failure of the thread: next_batch() raises it once the batches already
            # made are handed out, and calls (done, checkpoints, stop checks) still run
            with self._cv:
                self._closed = err
                self._cv.notify_all()
            return False

    def _prepare_step(self) -> bool:
        if not self.clock.may_prepare():
            return False
        t, staleness = self.clock.start()
        batch = self.d.prepare(t, staleness, service=self._by_owner)
        with self._cv:
            self._ready[t] = batch
            self._cv.notify_all()
        return True

    def _pipelined_step(self) -> bool:
        did = False
        while self.clock.may_prepare():
            t, staleness = self.clock.start()
            self._pending.append(self.d.begin(t, staleness))
            did = True
        return self._complete_arrived() or did

    def _complete_arrived(self) -> bool:
        if not (self._pending and self.d.arrived(self._pending[0])):
            return False
        batch = self.d.complete(self._pending.popleft())
        with self._cv:
            self._ready[batch.superstep] = batch
            self._cv.notify_all()
        return True

    def _finish_pending(self) -> None:
        """Receive the replies of batches still in flight (so that no owner's send is
        left unmatched when this learner stops)."""
        while self._pending:
            self.d.complete(self._pending.popleft())

    def _request(self) -> None:
        """On the thread, after every update queued before it: end the superstep."""
        self.d.mark()
        self.clock.request()

    def _run(self, fn: Callable[[], Any], what: str) -> Any:
        """Run on the data-plane thread when there is one (ordered after every earlier
        call), else inline."""
        if self._thread is None:
            return fn()
        return self._thread.call(fn, timeout_s=self.timeout_s, what=what)

    def run_on_thread(self, fn: Callable[[], Any], what: str) -> Any:
        """Run ``fn`` where this rank's MPI calls are made (the data-plane thread in
        ``edp`` mode, after every call queued before it; inline otherwise). Blocks for
        the result (bounded by ``timeout_s``)."""
        return self._run(fn, what)

    def post(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` where this rank's MPI calls are made (the data-plane thread in
        ``edp`` mode, after every call queued before it; inline otherwise). Does not wait
        for it; its errors surface at the next call."""
        self._post(fn)

    def _post(self, fn: Callable[[], Any]) -> None:
        if self._thread is None:
            fn()
        else:
            self._thread.post(fn)

    # -- the learner's calls -----------------------------------------------------------
    # -- checkpoints at superstep boundaries ------------------------------------------
    def attach_checkpoints(self, agent: Any, every_supersteps: int,
                           provide: Callable[[], dict[str, Any]] | None) -> None:
        """Take part in checkpoints cut at every ``every_supersteps``-th boundary: the
        marker goes to the buffers behind this learner's priority updates, then this
        learner's part - the sampler's RNG, its counters and, from ``provide()`` (the
        lead learner's model and optimizer as named arrays, read at the boundary), its
        state - is handed in when the checkpoint asks for it."""
        self._ckpt = (agent, every_supersteps, provide or (lambda: {}))

    def _checkpoint_boundary(self, s: int) -> None:
        assert self._ckpt is not None
        agent, every, provide = self._ckpt
        if every <= 0 or s == 0 or s % every or self._part is not None:
            return
        state = provide()
        part: dict[str, Any] = {
            "counters": {"superstep": s + self.d.superstep_offset,
                         "priority_rows": self.priority_rows,
                         "limiter_wait_s": self.d.limiter_wait_s,
                         **state.get("counters", {})}}
        if "extra_state" in state:
            part["extra_state"] = state["extra_state"]
        self._part = part
        d = self.d

        def mark() -> None:  # after this learner's updates of supersteps < s
            from conduit_hpc.checkpoint import rng_to_json

            part["rng"] = rng_to_json(d.rng)
            agent.mark(s)

        self._post(mark)

    def _hand_in(self) -> None:
        """Offer the pending checkpoint part (the agent sends it once asked)."""
        if self._ckpt is None or self._part is None:
            return
        agent, part = self._ckpt[0], self._part

        def offer() -> None:
            if agent.contribute(lambda: part) and self._part is part:
                self._part = None

        self._post(offer)

    def next_batch(self) -> Batch:
        """Batch for the next superstep; ends the current one. Blocks (bounded)."""
        t0 = time.perf_counter()
        if not self.started:
            self._start()
        s = self._superstep + 1
        if self._ckpt is not None:
            self._hand_in()
            self._checkpoint_boundary(s)
        if self._thread is None:
            self.d.mark()
            self.clock.request()
            t, staleness = self.clock.start()
            batch = self.d.prepare(t, staleness, service=self._by_owner)
        else:
            self._thread.post(self._request)
            deadline = time.monotonic() + self.timeout_s
            with self._cv:
                while s not in self._ready:
                    self._thread.raise_if_failed()
                    if self._closed is not None and not self._pending:
                        raise DataPlaneClosed(str(self._closed))
                    if time.monotonic() > deadline:
                        raise DataPlaneTimeout(f"learner waited {self.timeout_s:.1f} s for "
                                               f"batch {s}")
                    self._cv.wait(0.05)
                batch = self._ready.pop(s)
        batch.wait()
        t1 = time.perf_counter()
        self._close_superstep(t0)
        self._superstep = s
        self._row = {"superstep": s + self.d.superstep_offset, "mode": self.mode,
                     "exposed_s": t1 - t0,
                     "rows": len(batch), "staleness": batch.staleness, **batch.timings,
                     "_call": t0}
        self._last_return = t1
        self._publish(s)
        for hook in self.on_superstep:
            hook(s, batch, t1 - t0)
        return batch

    def _close_superstep(self, t_next_call: float) -> None:
        """Finish the metrics row of the superstep that ends now: superstep ``s`` runs
        from the call of ``next_batch`` for batch ``s`` to the call for ``s + 1``."""
        row = self._row
        if row is None:
            return
        start = row.pop("_call")
        returned = self._last_return
        assert returned is not None
        row["compute_s"] = t_next_call - returned
        row["iteration_s"] = t_next_call - start
        row["time_s"] = returned - self._t_start
        row.update(self._extra)
        self._extra = {}
        self.metrics.add(row)
        if self.metrics.keep and len(self.metrics.rows) % 50 == 0:
            self.metrics.flush()
        if self.status is not None:
            self.status.update(self._status_text())

    def _status_text(self) -> str:
        if self._superstep < 0:
            return f"[{self.mode}] no batch delivered yet"
        rows = self.metrics.rows[-50:]
        exp = np.median([r["exposed_s"] for r in rows]) * 1e3 if rows else float("nan")
        it = np.nanmedian([r["iteration_s"] for r in rows]) * 1e3 if rows else float("nan")
        return (f"[{self.mode}] superstep {self._superstep}  exposed {exp:.2f} ms  "
                f"iteration {it:.2f} ms  resampled {self.d.resampled}")

    def _publish(self, s: int) -> None:
        if not self.lead:
            return
        control = self.control
        self._post(lambda: control.write(C_LEARNER_VERSION, s))
        if self.weights is not None and self.model is not None and s % self.cfg.weights_every == 0:
            flat = flat_parameters(self.model)
            board = self.weights
            self._post(lambda: board.publish(flat, s))

    def log(self, **values: float) -> None:
        """Add job columns (``loss=...``) to the current superstep's metrics row."""
        self._extra.update(values)

    def update_priorities(self, indices: np.ndarray, priorities: Any) -> None:
        """Check, then send new priorities to the owners; they apply before serving
        any later sample of this learner. Never blocks on the network."""
        idx, p = check_update(indices, priorities,
                              {sid: r.capacity for sid, r in self.d.rings.items()})
        self.priority_rows += len(idx)
        if len(idx) == 0:  # nothing to send (send_priorities needs a row)
            return
        d = self.d
        self._post(lambda: d.send_priorities(idx, p))

    def publish_now(self) -> None:
        """Publish the attached model's weights immediately (lead learner)."""
        if self.lead and self.weights is not None and self.model is not None:
            flat, board, s = flat_parameters(self.model), self.weights, max(self._superstep, 0)
            self._run(lambda: board.publish(flat, s), "weight publication")

    def stop(self) -> dict[str, float]:
        """Stop the thread (pending calls are done first), flush metrics, and return
        the latency summary. Blocks (bounded)."""
        deadline = time.monotonic() + self.timeout_s / 4
        while self._part is not None and time.monotonic() < deadline:
            self._hand_in()  # a checkpoint still waits for this learner's part
            self._run(lambda: None, "a checkpoint hand-in")
            time.sleep(0.01)
        if self._thread is not None:
            if self._pipelined:
                self._thread.call(self._finish_pending, timeout_s=self.timeout_s,
                                  what="replies of prefetched batches")
            self._thread.stop(self.timeout_s)
            self._thread = None
        if self._row is not None and self._last_return is not None:
            self._close_superstep(time.perf_counter())
            self._row = None
        self.metrics.close()
        if self.status is not None:
            self.status.update(self._status_text(), force=True)
            self.status.close()
        summary = latency_summary(self.metrics.rows, skip=min(5, len(self.metrics.rows) // 10))
        summary["resampled_rows"] = float(self.d.resampled)
        summary["limiter_wait_s"] = float(self.d.limiter_wait_s)
        return summary
