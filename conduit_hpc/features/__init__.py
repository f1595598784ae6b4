"""Features of a job that plug into the plane through its extension interfaces
(:mod:`conduit_hpc.plane.extensions`), each in its own package:

* :mod:`~conduit_hpc.features.checkpointing` - checkpoints, restore, stopping together
  (built by the job: :class:`~conduit_hpc.features.checkpointing.CheckpointAgent`, ...);
* :mod:`~conduit_hpc.features.replace` - adaptive re-placement of a running job
  (``[placement] adaptive = true``);
* :mod:`~conduit_hpc.features.longhaul` - the edge/cloud deployment across one long link
  (``[longhaul] mode``);
* :mod:`~conduit_hpc.features.tensorboard` - TensorBoard scalars of the metrics
  (``[run] tensorboard = true``).

Importing this package registers the config-driven ones with the plane
(``conduit_hpc.ExperienceDataPlane`` does).
"""

from __future__ import annotations

from conduit_hpc.features.longhaul import LongHaul
from conduit_hpc.features.replace import Replacement
from conduit_hpc.features.tensorboard import TensorBoardScalars
from conduit_hpc.plane.extensions import register_feature

__all__ = ["LongHaul", "Replacement", "TensorBoardScalars"]

register_feature(Replacement)
register_feature(LongHaul)
register_feature(TensorBoardScalars)
