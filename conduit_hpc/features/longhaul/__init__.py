"""The long-haul edge/cloud deployment (``[longhaul] mode``; see ``docs/longhaul.md``).

* :mod:`.topology` - :class:`LinkSides`: which ranks are on which side of the link;
* :mod:`.plan` - :func:`plan_longhaul`: the deployment's placement;
* :mod:`.board` - the link counters and their publication to the learner;
* :mod:`.stations` - the buffer-loop extensions (forwarder, receiver, edge replay);
* :mod:`.feature` - :class:`LongHaul`, the feature that composes them;
* :mod:`.metrics` - metric definitions (plain numpy).

The forward message's wire format is :mod:`conduit_hpc.protocol.forward`.
"""

from conduit_hpc.features.longhaul.board import BoardPublisher, LinkCounters, crossing_priorities
from conduit_hpc.features.longhaul.feature import LongHaul
from conduit_hpc.features.longhaul.plan import CLOUD_SHARD, EDGE_SHARD, plan_longhaul
from conduit_hpc.features.longhaul.stations import CloudReceiver, EdgeForwarder, EdgeReplayStation
from conduit_hpc.features.longhaul.topology import LinkSides

__all__ = [
    "CLOUD_SHARD",
    "EDGE_SHARD",
    "BoardPublisher",
    "CloudReceiver",
    "EdgeForwarder",
    "EdgeReplayStation",
    "LinkCounters",
    "LinkSides",
    "LongHaul",
    "crossing_priorities",
    "plan_longhaul",
]
