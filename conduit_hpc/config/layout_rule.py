"""The layout rule: which world rank gets which role. MPI-free.

One rule, used by :func:`conduit_hpc.plane.roles.split_roles` (with the real node of
every rank), by the launcher's rank-count check before ``mpirun``
(:func:`conduit_hpc.tools.launcher.ranks_problem`) and by the diagnosis of a failed run
(:func:`conduit_hpc.tools.diagnose.role_of`).

With ``per_node = false`` the counts are for the whole world, in world-rank order:
``learners`` learner ranks, then (``scheduler.delivery = "process"``) one delivery rank
per learner (learner ``k``'s is the ``k``-th), then ``buffers`` buffer ranks, then the
actors. With ``per_node = true`` the same order holds among the ranks of each node, and
each learner's delivery rank is on its node. A delivery rank owns its learner's
experience path (see :mod:`conduit_hpc.plane.delivery_rank`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conduit_hpc.config.sections import LayoutConfig
from conduit_hpc.errors import ConduitError, ConfigError, WorldTooSmall

__all__ = ["ROLE_NAMES", "Assignment", "assign_roles", "delivery_per_learner",
           "emulated_nodes_problem", "ranks_needed", "role_counts", "role_of_rank",
           "world_problem"]

#: the role names, in the order they are handed out
ROLE_NAMES = ("learner", "delivery", "buffer", "actor")


def delivery_per_learner(delivery: str) -> int:
    """Delivery ranks per learner for ``scheduler.delivery`` (0 or 1).

    Raises:
        ConfigError: an unknown value (names ``scheduler.delivery``).
    """
    if delivery not in ("thread", "process"):
        raise ConfigError(f"scheduler.delivery must be 'thread' or 'process', got "
                          f"{delivery!r}", key="scheduler.delivery")
    return 1 if delivery == "process" else 0


def ranks_needed(layout: LayoutConfig, delivery: str = "thread") -> int:
    """Ranks the layout needs (per node when ``per_node``), counting one actor for
    ``actors = 0`` and the delivery ranks of ``delivery = "process"``."""
    return layout.fixed_ranks + layout.learners * delivery_per_learner(delivery)


def emulated_nodes_problem(layout: LayoutConfig, size: int) -> ConfigError | None:
    """Why ``layout.emulate_nodes`` cannot split a world of ``size`` ranks (more
    emulated nodes than ranks: a node would hold none), or ``None``."""
    if layout.emulate_nodes <= size:
        return None
    return ConfigError(f"layout.emulate_nodes = {layout.emulate_nodes}, but the world has "
                       f"{size} ranks: expected 0 (the real nodes) or 1 to {size} (each "
                       f"emulated node holds one or more consecutive ranks)",
                       key="layout.emulate_nodes")


def _describe(layout: LayoutConfig, delivery: str) -> str:
    d = layout.learners * delivery_per_learner(delivery)
    return (f"{layout.learners} learners, " + (f"{d} delivery, " if d else "")
            + f"{layout.buffers} buffers, {layout.min_actors}"
            f"{'+' if layout.actors == 0 else ''} actors")


@dataclass(frozen=True)
class Assignment:
    """The role of every world rank.

    Attributes:
        roles (tuple[str, ...]): role name per world rank (one of :data:`ROLE_NAMES`).
        delivery_of (dict[int, int]): learner world rank -> its delivery rank (empty
            with ``delivery = "thread"``).
    """

    roles: tuple[str, ...]
    delivery_of: dict[int, int] = field(default_factory=dict)

    def ranks(self, name: str) -> tuple[int, ...]:
        """World ranks of role ``name``, ascending."""
        return tuple(r for r, x in enumerate(self.roles) if x == name)


def _group(layout: LayoutConfig, ranks: list[int], per_learner: int,
           roles: list[str], delivery_of: dict[int, int]) -> None:
    """Hand out the roles among ``ranks`` (one node, or the world) in order."""
    lo, d = layout.learners, layout.learners * per_learner
    for i, r in enumerate(ranks):
        roles[r] = ("learner" if i < lo else "delivery" if i < lo + d
                    else "buffer" if i < lo + d + layout.buffers else "actor")
    if per_learner:
        for k in range(lo):
            delivery_of[ranks[k]] = ranks[lo + k]


def assign_roles(layout: LayoutConfig, node_of: tuple[int, ...] | list[int],
                 delivery: str = "thread") -> tuple[Assignment | None, ConduitError | None]:
    """The roles of a world whose rank ``r`` is on node ``node_of[r]``, or the error to
    raise (the same wherever it is computed from the same values). Pure.

    Returns:
        (Assignment, None), or (None, WorldTooSmall | ConfigError).
    """
    per_learner = delivery_per_learner(delivery)
    size = len(node_of)
    need = ranks_needed(layout, delivery)
    what = _describe(layout, delivery)
    roles = [""] * size
    delivery_of: dict[int, int] = {}
    if not layout.per_node:
        err = world_problem(layout, size, delivery)
        if err is not None:
            return None, err
        _group(layout, list(range(size)), per_learner, roles, delivery_of)
        return Assignment(tuple(roles), delivery_of), None
    per_node: dict[int, list[int]] = {}
    for r, n in enumerate(node_of):
        per_node.setdefault(n, []).append(r)
    for n, ranks in sorted(per_node.items()):
        if len(ranks) < need:
            return None, WorldTooSmall(
                f"layout needs {need} ranks per node ({what}) but node {n} has {len(ranks)}")
        if layout.actors and len(ranks) > need:
            return None, ConfigError(
                f"layout uses exactly {need} ranks per node but node {n} has "
                f"{len(ranks)}; set layout.actors = 0 to use the rest as actors",
                key="layout.actors")
        _group(layout, ranks, per_learner, roles, delivery_of)
    return Assignment(tuple(roles), delivery_of), None


def world_problem(layout: LayoutConfig, size: int,
                  delivery: str = "thread") -> ConduitError | None:
    """Why a world of ``size`` ranks does not fit a ``per_node = false`` layout, or
    ``None``: the rule of :func:`assign_roles`, by counting (no list of ``size`` roles,
    so a layout or a world of a billion ranks is answered at once). Pure."""
    need = ranks_needed(layout, delivery)
    if size < need:
        return WorldTooSmall(f"layout needs {need} ranks ({_describe(layout, delivery)}) "
                             f"but the world has {size}")
    if layout.actors and size > need:
        return ConfigError(f"layout uses exactly {need} ranks but the world has {size}; set "
                           f"layout.actors = 0 to make every remaining rank an actor",
                           key="layout.actors")
    return None


def role_counts(layout: LayoutConfig, size: int, delivery: str = "thread") -> dict[str, int]:
    """Ranks of each role (:data:`ROLE_NAMES`) in a world of ``size`` ranks that a
    ``per_node = false`` layout fits (see :func:`world_problem`), by counting. Pure."""
    d = layout.learners * delivery_per_learner(delivery)
    return {"learner": layout.learners, "delivery": d, "buffer": layout.buffers,
            "actor": size - layout.learners - d - layout.buffers}


def role_of_rank(layout: LayoutConfig, delivery: str, world_size: int, rank: int) -> str:
    """The role name of ``rank`` in a world of ``world_size`` ranks on one node per
    ``per_node = false`` layout; ``""`` when unknown (``per_node`` layouts depend on how
    the launcher fills nodes; a world the layout does not fit; a rank outside it)."""
    if layout.per_node or not 0 <= rank < world_size:
        return ""
    got, err = assign_roles(layout, (0,) * world_size, delivery)
    return "" if got is None or err is not None else got.roles[rank]
