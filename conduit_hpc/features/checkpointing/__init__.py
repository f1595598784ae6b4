"""Checkpoints of a running data plane, restore, and stopping together.

* :class:`CheckpointAgent` (``agent.py``) - periodic checkpoints on the buffer side
  while ingest and delivery go on (a buffer-loop extension), and learners' parts at
  superstep boundaries (:meth:`CheckpointAgent.every_supersteps`, a learner hook in
  ``boundary.py``);
* :func:`save_checkpoint` (``save.py``) - one blocking collective checkpoint (the final one
  on stop); a buffer rank's cut and shard file are in ``parts.py``, shared by both;
* :func:`restore_data_plane` (``resume.py``) - restore at start-up, onto the same or a
  different number of buffer ranks, falling back past damaged checkpoints;
* :func:`checkpoint_outcome` (``outcome.py``) - what the job's checkpoints came to, at its
  end; a job whose every checkpoint failed ends with an error;
* :class:`StopCoordinator` (``stopping.py``) - SIGTERM / SIGUSR1 on any rank becomes a
  stop every rank sees.

The HDF5 format itself is :mod:`conduit_hpc.checkpoint`.
"""

from __future__ import annotations

from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.features.checkpointing.outcome import CheckpointOutcome, checkpoint_outcome
from conduit_hpc.features.checkpointing.resume import (
    RestoreResult,
    checkpoint_root,
    restore_data_plane,
    restore_lines,
    resume_roots,
    resumed_counter,
)
from conduit_hpc.features.checkpointing.save import SaveResult, save_checkpoint
from conduit_hpc.features.checkpointing.stopping import StopCoordinator

__all__ = ["CheckpointAgent", "CheckpointOutcome", "RestoreResult", "SaveResult",
           "StopCoordinator", "checkpoint_outcome", "checkpoint_root", "restore_data_plane",
           "restore_lines", "resume_roots", "resumed_counter", "save_checkpoint"]
