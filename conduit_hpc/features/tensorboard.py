"""TensorBoard scalars of a run (``[run] tensorboard = true``): every row a learner or an
actor adds to its metrics CSV is also written, as scalars, to
``RUN_DIR/tensorboard/<role>-<world rank>/`` with torch's ``SummaryWriter`` (which needs
the ``tensorboard`` package: ``pip install 'conduit-hpc[tensorboard]'``). The only module
that imports it.

Tags (per superstep on learners, per actor log row - about one a second - on actors):

* ``latency/exposed_s``, ``latency/iteration_s``, ``latency/compute_s`` and the path's
  parts (``latency/sample_s``, ``latency/gather_s``, ...);
* ``limiter/learner_wait_s`` (per superstep), ``limiter/actor_wait_s`` (running total);
* ``ingest/rows_per_s``, ``ingest/rows`` (an actor's running total);
* ``job/<name>`` for every value the job logs with ``edp.log(name=value)`` (the DQN job:
  ``job/loss``, ``job/td_abs_mean``, ``job/mean_return``).

Launch ``tensorboard --logdir RUN_DIR/tensorboard``. Plain Python; no MPI.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.plane.extensions import Feature, FeatureHost
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
        self._step = 0

    def attach(self, plane: FeatureHost) -> None:
        run_dir: Path | None = plane.run_dir
        endpoint, role = ((plane.learner, "learner") if plane.learner is not None
                          else (plane.actor, "actor") if plane.actor is not None
                          else (None, ""))
        if run_dir is None or endpoint is None:
            return
        logdir = Path(run_dir) / "tensorboard" / f"{role}-{plane.world_rank}"
        self.writer = self._writer_cls(log_dir=str(logdir), flush_secs=5)
        endpoint.metrics.listeners.append(
            lambda row: self.write(role, row))

    def write(self, role: str, row: Mapping[str, Any]) -> None:
        """One metrics row as scalars (non-numeric and non-finite values skipped)."""
        if self.writer is None:
            return
        if role == "learner" and "superstep" in row:
            step = int(row["superstep"])
        else:
            step = self._step
            self._step += 1
        for column, value in row.items():
            if column in _SKIP or column.startswith("_") or isinstance(value, bool):
                continue
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                continue
            self.writer.add_scalar(scalar_tag(role, column), float(value), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
