"""TensorBoard scalars of a run (``[run] tensorboard = true``): every row a learner or an
actor adds to its metrics CSV is also written, as scalars, to
``RUN_DIR/tensorboard/<role>-<world rank>/`` with torch's ``SummaryWriter`` (which needs
the ``tensorboard`` package: ``pip install 'conduit-hpc[tensorboard]'``). The only module
that imports it.

Learners write the mean of each column over ``run.tensorboard_every_s`` seconds of
supersteps (default 1 s; 0: every superstep), at the step of the last one: a scalar a
superstep cost the learner ~0.45 ms a superstep (``add_scalar`` is ~15-40 us) and ~600
bytes of event file. Actors write each log row (about one a second).

Tags:

* ``latency/exposed_s``, ``latency/iteration_s``, ``latency/compute_s`` and the path's
  parts (``latency/sample_s``, ``latency/gather_s``, ...);
* ``limiter/learner_wait_s`` (per superstep), ``limiter/actor_wait_s`` (running total);
* ``ingest/rows_per_s``, ``ingest/rows`` (an actor's running total);
* ``job/<name>`` for every value the job logs with ``edp.log(name=value)`` (the DQN job:
  ``job/loss``, ``job/td_abs_mean``, ``job/mean_return``).

A resumed run in the same run directory writes into the same folders: a learner's
scalars from the superstep it resumed at replace the earlier attempt's from there on
(``purge_step``: the supersteps after the checkpoint ran again), and an actor's steps
(one a row of its CSV) go on after the earlier attempts' rows.

Launch ``tensorboard --logdir RUN_DIR/tensorboard``. Plain Python; no MPI.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.plane.extensions import Feature
from conduit_hpc.plane.host import FeatureHost
from conduit_hpc.plane.metrics import LEARNER_COLUMNS

__all__ = ["TensorBoardScalars", "scalar_tag"]

_LEARNER_TAGS = {"limiter_wait_s": "limiter/learner_wait_s", "rows": "learner/rows",
                 "ack_wait_s": "latency/ack_wait_s",
                 "staleness": "learner/staleness"}
_ACTOR_TAGS = {"rows_per_s": "ingest/rows_per_s", "rows": "ingest/rows",
               "limiter_wait_s": "limiter/actor_wait_s", "ring_wait_s": "ingest/ring_wait_s",
               "policy_version": "actor/policy_version"}
_SKIP = {"superstep", "time_s", "mode"}


def scalar_tag(role: str, column: str) -> str:
    """The TensorBoard tag of a metrics column (see the module docstring)."""
    table = _LEARNER_TAGS if role == "learner" else _ACTOR_TAGS
    if column in table:
        return table[column]
    if role == "learner" and column in LEARNER_COLUMNS:
        return f"latency/{column}"
    if role == "learner":
        return f"job/{column}"
    return f"actor/{column}"


class TensorBoardScalars(Feature):
    """Writes the learners' and actors' metrics rows as TensorBoard scalars.

    Raises:
        ConfigError: ``run.tensorboard`` is on but the ``tensorboard`` package is not
            installed (on every rank, before any window).
    """

    name = "tensorboard"

    @classmethod
    def wanted(cls, config: Config) -> bool:
        return bool(config.run.tensorboard)

    def __init__(self, config: Config, roles: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ConfigError(
                "run.tensorboard = true needs the tensorboard package, which is not "
                f"installed ({err}); install it with pip install 'conduit-hpc[tensorboard]' "
                "(or pip install tensorboard), or set run.tensorboard = false",
                key="run.tensorboard") from err
        self._writer_cls = SummaryWriter
        self.writer: Any = None
        self._logdir: Path | None = None  # (attached: a learner's or an actor's)
        self._step = 0
        self.every_s = float(config.run.tensorboard_every_s)
        #: the learner's window: column -> [sum, count] of its finite values since the last
        #: write, opened at :attr:`_opened` (clock seconds; None: no row yet)
        self._window: dict[str, list[float]] = {}
        self._opened: float | None = None
        self._last_step = 0
        self.clock = time.monotonic  # (a test may set another)

    def attach(self, plane: FeatureHost) -> None:
        run_dir: Path | None = plane.run_dir
        endpoint, role = ((plane.learner, "learner") if plane.learner is not None
                          else (plane.actor, "actor") if plane.actor is not None
                          else (None, ""))
        if run_dir is None or endpoint is None:
            return
        self._logdir = Path(run_dir) / "tensorboard" / f"{role}-{plane.world_rank}"
        if role == "actor":  # its steps go on after an earlier attempt's (one a CSV row)
            self._step = endpoint.metrics.rows_on_disk()
        endpoint.metrics.listeners.append(
            lambda row: self.write(role, row))

    def _open(self, role: str, step: int) -> None:
        """The writer, made at the first row: a learner's in a directory an earlier
        attempt of the run wrote (a resumed run) purges that attempt's events from this
        row's superstep on (``purge_step``: the supersteps after the checkpoint it
        resumed from ran again, and TensorBoard drew both, the line going back)."""
        assert self._logdir is not None
        earlier = self._logdir.is_dir() and any(self._logdir.glob("events.out.tfevents.*"))
        purge = step if role == "learner" and earlier else None
        self.writer = self._writer_cls(log_dir=str(self._logdir), flush_secs=5,
                                       purge_step=purge)

    def write(self, role: str, row: Mapping[str, Any]) -> None:
        """One metrics row as scalars (non-numeric and non-finite values skipped): at once
        on actors (and with ``tensorboard_every_s = 0``), into the window on learners."""
        if self._logdir is None:
            return
        if role == "learner" and "superstep" in row:
            step = int(row["superstep"])
        else:
            step = self._step
            self._step += 1
        if self.writer is None:
            self._open(role, step)
        values = [(column, float(value)) for column, value in row.items()
                  if not (column in _SKIP or column.startswith("_") or isinstance(value, bool))
                  and isinstance(value, numbers.Real) and math.isfinite(value)]
        if role != "learner" or self.every_s == 0:
            for column, v in values:
                self.writer.add_scalar(scalar_tag(role, column), v, step)
            return
        now = self.clock()
        if self._opened is None:
            self._opened = now
        window = self._window  # by column: the tags are made once a window
        for column, v in values:
            acc = window.get(column)
            if acc is None:
                window[column] = [v, 1.0]
            else:
                acc[0] += v
                acc[1] += 1.0
        self._last_step = step
        if now - self._opened >= self.every_s:
            self.flush()

    def flush(self) -> None:
        """Write the learner's window (each column's mean at the last superstep's step)."""
        if self.writer is not None:
            for column, (total, n) in self._window.items():
                self.writer.add_scalar(scalar_tag("learner", column), total / n,
                                       self._last_step)
        self._window.clear()
        self._opened = None

    def close(self) -> None:
        if self.writer is not None:
            self.flush()
            self.writer.close()
            self.writer = None
        self._logdir = None
