"""What rosters and link tables read of a cluster model: a structural type, so that
:mod:`~conduit_hpc.placement.roster` and :mod:`~conduit_hpc.placement.links` need not
import :mod:`~conduit_hpc.placement.cluster` (which builds on them).

Plain Python; no MPI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["ClusterShape"]


class ClusterShape(Protocol):
    """A cluster model's name, nodes and paths (``ClusterModel`` is one): each node has
    ``name``, ``gpus``, the per-role counts and link specs; each path ``a``, ``b`` and a
    link spec."""

    @property
    def name(self) -> str: ...

    @property
    def nodes(self) -> Sequence[Any]: ...

    @property
    def paths(self) -> Sequence[Any]: ...
