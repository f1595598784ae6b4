"""The data plane's wire protocol: message tags (one range per feature, :mod:`.tags`),
the learner <-> buffer message layouts (:mod:`.messages`) and the long-haul forward
message (:mod:`.forward`). Plain numpy; no MPI, no pickle.
"""

from __future__ import annotations

from conduit_hpc.protocol.messages import (
    PriorityUpdate,
    SampleReply,
    SampleRequest,
    pack_rows,
    unpack_rows,
)
from conduit_hpc.protocol.tags import JOB_TAGS, TAG_RANGES, Tag, tag_owner

__all__ = [
    "JOB_TAGS",
    "TAG_RANGES",
    "PriorityUpdate",
    "SampleReply",
    "SampleRequest",
    "Tag",
    "pack_rows",
    "tag_owner",
    "unpack_rows",
]
