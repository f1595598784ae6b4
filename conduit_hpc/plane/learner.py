"""The learner endpoint: supersteps, metrics, hooks; batches reach it through its
delivery mode (:mod:`~conduit_hpc.plane.modes`).

Per superstep the endpoint records iteration latency (between successive
``next_batch`` returns), exposed latency (time blocked inside ``next_batch``, including
the device copy it waits on) and the split of the experience path. Features add
:class:`~conduit_hpc.plane.extensions.LearnerHook` objects (:meth:`LearnerEndpoint.add_hook`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.config import SchedulerConfig
from conduit_hpc.errors import DataPlaneTimeout, SpecError
from conduit_hpc.plane.control import C_LEARNER_VERSION, ControlBlock
from conduit_hpc.plane.extensions import LearnerHook
from conduit_hpc.plane.metrics import (
    LEARNER_COLUMNS,
    CsvSink,
    LatencyRecord,
    exposed_story,
    rows_split,
)
from conduit_hpc.plane.modes import DeliveryMode
from conduit_hpc.plane.progress import ProgressBoard
from conduit_hpc.plane.sampled_rows import FULL_ROWS, RowThinning
from conduit_hpc.plane.staging import Batch
from conduit_hpc.plane.weights import WeightsBoard, flat_parameters
from conduit_hpc.scheduler import PrefetchClock

if TYPE_CHECKING:
    import torch

    from conduit_hpc.sampling import Sampler

__all__ = ["LearnerEndpoint"]


class LearnerEndpoint:
    """Delivery on one learner rank.

    Args:
        mode (Callable): makes the delivery mode from the endpoint
            (:func:`inline_mode`, or the process delivery's, see
            :mod:`conduit_hpc.plane.delivery_rank`).
        sampler (Sampler): this learner's sampler (checks priority updates; its state
            and superstep count are what checkpoints keep).
        capacities (Mapping[int, int]): shard id -> capacity, of the shards it reads.
        config (SchedulerConfig): mode, depth, weights cadence.
        control (ControlBlock): job-wide counters.
        lead (bool): this is the lead learner (publishes version and weights).
        metrics_path (Path | None): CSV file for per-superstep metrics.
        timeout_s (float): bound on every wait.
        status (bool): show this rank's progress (:attr:`progress`): a live line on a
            terminal, plain lines every 10 s in a log.
        budget_s (float): the run's time budget (``run.duration_s``; 0: none), which
            the progress line counts down.
        metrics_full_rows (int): ``run.metrics_full_rows``: the metrics file holds a row
            for each of this many first supersteps, then a sample (see
            :class:`~conduit_hpc.plane.sampled_rows.RowThinning`); 0: every row.
    """

    def __init__(self, mode: Callable[[LearnerEndpoint], DeliveryMode], sampler: Sampler,
                 capacities: Mapping[int, int], config: SchedulerConfig,
                 control: ControlBlock, *, lead: bool, metrics_path: Path | None,
                 timeout_s: float, status: bool = False, budget_s: float = 0.0,
                 metrics_full_rows: int = FULL_ROWS) -> None:
        self.sampler = sampler
        self.capacities = dict(capacities)
        self.cfg = config
        self.control = control
        self.lead = lead
        self.timeout_s = timeout_s
        self.mode = mode(self)
        self.clock = PrefetchClock(self.mode.depth)
        # rows go to the CSV file as they come (every 50), past metrics_full_rows a
        # sample with weights (the file grew by GBs an hour); the summary's are kept in
        # bounded memory (a run of millions of supersteps kept every one)
        self.metrics = CsvSink(metrics_path, LEARNER_COLUMNS, keep=False, carry=("time_s",),
                               thinning=RowThinning(metrics_full_rows))
        self.record = LatencyRecord()
        self.metrics.rows = self.record.rows  # what it keeps (every row, then a sample)
        self.weights: WeightsBoard | None = None
        self.model: torch.nn.Module | None = None
        self._superstep = -1
        self._t_start = time.perf_counter()
        self._last_return: float | None = None
        self._row: dict[str, Any] | None = None
        self._extra: dict[str, Any] = {}
        self.priority_rows = 0
        self._turn = threading.Lock()  # one next_batch at a time (see next_batch)
        self.hooks: list[LearnerHook] = []
        self.started = False  # the mode starts at the first next_batch(), so that
        # collectives before it (share_weights) run while one thread makes MPI calls
        self.progress = ProgressBoard() if status else None
        if self.progress is not None:  # the job may add a count budget and more lines
            self.progress.update("learner", 0, unit="supersteps", time_s=budget_s,
                                 note=self._status_text)

    # -- what features use -------------------------------------------------------------
    @property
    def superstep(self) -> int:
        """Supersteps of this learner so far, counting those before a restore."""
        return self._superstep + self.sampler.superstep_offset

    @property
    def superstep_offset(self) -> int:
        """Supersteps done before a restore (where the counting resumes)."""
        return self.sampler.superstep_offset

    @property
    def sampler_rng(self) -> np.random.Generator:
        """The sampler's random generator (for checkpoints)."""
        return self.sampler.rng

    @property
    def limiter_wait_s(self) -> float:
        """Seconds this learner waited for the rate limiter."""
        return float(self.mode.counters().get("limiter_wait_s", 0.0))

    def sampler_state(self, supersteps: int | None = None) -> dict[str, Any]:
        """The sampler's state to resume after ``supersteps`` of this learner (counted
        from its start; None: those delivered so far), JSON-able
        (:meth:`~conduit_hpc.sampling.Sampler.state_dict`). Local; call it where the
        data-plane thread is not drawing (``post``) or after the last ``next_batch``."""
        done = self._superstep + 1 if supersteps is None else int(supersteps)
        return self.sampler.state_dict(done)

    def load_sampler_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's sampler state. Before the first ``next_batch``.

        Raises:
            CheckpointError: a state the sampler cannot take.
        """
        self.sampler.load_state_dict(state)

    def resume_at(self, superstep: int, rng: np.random.Generator | None = None) -> None:
        """Continue counting from ``superstep`` (and with ``rng``) after a restore.
        Before the first ``next_batch``."""
        self.sampler.superstep_offset = int(superstep)
        if rng is not None:
            self.sampler.rng = rng

    def updates_through_owners(self) -> None:
        """Send the next priority updates to the owners as messages until each applied
        one (behind a checkpoint's marker). Where MPI calls are made (:meth:`post`)."""
        self.mode.updates_through_owners()

    def add_hook(self, hook: LearnerHook) -> None:
        """Call ``hook`` at superstep boundaries (see LearnerHook). Local."""
        self.hooks.append(hook)

    def post(self, fn: Callable[[], Any]) -> None:
        """Queue ``fn`` where this rank's MPI calls are made (the data-plane thread in
        ``edp`` mode, after every call queued before it; inline otherwise). Does not wait
        for it; its errors surface at the next call."""
        self.mode.post(fn)

    def run_on_thread(self, fn: Callable[[], Any], what: str) -> Any:
        """Run ``fn`` where this rank's MPI calls are made (after every call queued
        before it) and return its result. Blocks (bounded by ``timeout_s``)."""
        return self.mode.call(fn, what)

    # -- the learner's calls -----------------------------------------------------------
    def next_batch(self) -> Batch:
        """Batch for the next superstep; ends the current one. Blocks (bounded).

        Calls from several threads take turns (each gets the next superstep's batch):
        run concurrently, two calls took the same superstep, so in ``edp`` and
        ``service`` one waited out the timeout for a batch the other had taken, and a
        delivery rank's batch went to both."""
        if not self._turn.acquire(timeout=self.timeout_s):
            raise DataPlaneTimeout(f"next_batch() waited {self.timeout_s:g} s (run.timeout_s) "
                                   f"for another thread's next_batch() on this learner")
        try:
            return self._next_batch()
        finally:
            self._turn.release()

    def _next_batch(self) -> Batch:
        t0 = time.perf_counter()
        if not self.started:
            self.started = True
            self.mode.start()
        s = self._superstep + 1
        for hook in self.hooks:
            hook.on_boundary(s)
        batch = self.mode.next_batch(s)
        batch.wait()
        t1 = time.perf_counter()
        self._close_superstep(t0)
        self._superstep = s
        self._row = {"superstep": s + self.superstep_offset, "mode": self.mode.name,
                     "exposed_s": t1 - t0,
                     "rows": len(batch), "staleness": batch.staleness, **batch.timings,
                     "_call": t0}
        self._last_return = t1
        self._publish(s)
        for hook in self.hooks:
            hook.on_superstep(s, batch, t1 - t0)
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
        self.record.add(row)
        if self.record.n % 50 == 0:
            self.metrics.flush()
        if self.progress is not None:  # the note is computed only when drawn
            self.progress.update("learner", self.superstep + 1)

    def _status_text(self) -> str:
        if self._superstep < 0:
            return f"[{self.mode.name}] no batch delivered yet"
        rows = list(self.record.recent)
        exp = np.median([r["exposed_s"] for r in rows]) * 1e3 if rows else float("nan")
        it = np.nanmedian([r["iteration_s"] for r in rows]) * 1e3 if rows else float("nan")
        wall = float(np.nansum([r["iteration_s"] for r in rows]))
        story = exposed_story(rows_split(rows), wall) if rows else ""
        return (f"[{self.mode.name}] exposed {exp:.2f} ms  iteration {it:.2f} ms (median "
                f"of the last {len(rows)})  resampled "
                f"{int(self.mode.counters().get('resampled_rows', 0))}"
                + (f"  last {len(rows)}: {story}" if story else ""))  # not the run's

    def _publish(self, s: int) -> None:
        if not self.lead:
            return
        control = self.control
        self.post(lambda: control.write(C_LEARNER_VERSION, s))
        if self.weights is not None and self.model is not None and s % self.cfg.weights_every == 0:
            flat = flat_parameters(self.model)
            board = self.weights
            board.check(flat)  # here, not on the data-plane thread
            self.post(lambda: board.publish(flat, s))

    def log(self, **values: float) -> None:
        """Add job columns (``loss=...``) to the current superstep's metrics row.

        Raises:
            SpecError: a name the data plane writes itself (``time_s``...: it would be
                overwritten), or a value that is not one real number (a float, an int,
                a one-element array or tensor; NaN is a value). Nothing is logged.
        """
        row: dict[str, float] = {}
        for k, v in values.items():
            if k in LEARNER_COLUMNS:
                raise SpecError(f"log: {k!r} is a column the data plane writes itself; "
                                f"expected a name of the job's own (loss=..., ...)")
            try:
                if isinstance(v, str | bytes) or v is None:
                    raise TypeError(type(v).__name__)
                row[k] = float(v.item() if isinstance(v, np.ndarray) and v.size == 1 else v)
            except (TypeError, ValueError, RuntimeError) as err:
                raise SpecError(f"log: {k} = {v!r:.60} must be one real number (a float, "
                                f"or a one-element array or tensor)") from err
        self._extra.update(row)

    def update_priorities(self, indices: Any, priorities: Any) -> None:
        """Check, then send new priorities to the owners; they apply before serving
        any later sample of this learner. Never blocks on the network. A sampler that
        does not apply priorities (uniform) checks them and sends nothing.

        Raises:
            ValueError: see :func:`~conduit_hpc.sampling.check_update` (nothing sent).
        """
        idx, p = self.sampler.check_update(indices, priorities, self.capacities)
        self.priority_rows += len(idx)
        if len(idx) == 0 or not self.sampler.applies_priorities:
            return  # nothing to send (send_priorities needs a row), or nothing to apply
        self.mode.send_priorities(idx, p)

    def publish_now(self) -> None:
        """Publish the attached model's weights immediately (lead learner)."""
        if self.lead and self.weights is not None and self.model is not None:
            flat, board, s = flat_parameters(self.model), self.weights, max(self._superstep, 0)
            board.check(flat)
            self.run_on_thread(lambda: board.publish(flat, s), "weight publication")

    def stop(self) -> dict[str, float]:
        """Stop the thread (pending calls are done first), flush metrics, and return
        the latency summary. Blocks (bounded)."""
        for hook in self.hooks:
            hook.on_stop()
        self.mode.stop()
        if self._row is not None and self._last_return is not None:
            self._close_superstep(time.perf_counter())
            self._row = None
        self.metrics.close()
        if self.progress is not None:
            self.progress.close()
        summary = self.record.summary()
        summary.update(self.mode.counters())
        return summary
