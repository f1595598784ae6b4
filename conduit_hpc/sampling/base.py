"""The sampler strategy: how learners draw rows from shards and weigh them.

A :class:`Sampler` has two halves, both plain numpy:

* **learner side** - draw stratified targets over the shards' published statistics
  (:meth:`Sampler.targets`), redraw targets for rows found overwritten
  (:meth:`Sampler.redraw`), importance weights (:meth:`Sampler.weights`), the check of a
  priority update (:meth:`Sampler.check_update`), and its own state
  (:meth:`Sampler.state_dict`: the random generator and the superstep offset that the
  beta schedule counts from), which learner checkpoints hold and restore;
* **owner side** - a :class:`ShardDrawer` per shard, used by the shard's owner: what the
  shard publishes for samplers (:meth:`ShardDrawer.stats`) and which rows the targets
  fall on (:meth:`ShardDrawer.draw`).

Strategies are picked by name (``scheduler.sampler``) through :func:`make_sampler`; no
code path branches on the name. TorchRL's ``samplers/`` (one base owning priority
updates and its own ``state_dict``, one file per strategy) is the model.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.config.checks import MAX_PRIORITY
from conduit_hpc.errors import CheckpointError, SpecError
from conduit_hpc.sampling.stratified import ShardStats, allocate_targets
from conduit_hpc.spec import as_array
from conduit_hpc.storage import tree_kernels
from conduit_hpc.storage.priority import PriorityIndex, as_priorities, check_priorities

__all__ = ["Draw", "Sampler", "ShardDrawer", "check_update"]

#: (slots, generations, masses) of drawn rows; slot -1 where nothing could be drawn
Draw = tuple[np.ndarray, np.ndarray, np.ndarray]


class ShardDrawer(abc.ABC):
    """The owner's side of a sampler for one shard (single-threaded, owner only)."""

    @abc.abstractmethod
    def stats(self, index: PriorityIndex) -> tuple[int, float, float, float]:
        """``(items, total mass, min mass, max priority)`` that samplers see."""

    @abc.abstractmethod
    def draw(self, index: PriorityIndex, targets: np.ndarray) -> Draw:
        """Rows for ``targets`` (mass offsets, or item indices, over the span the
        learner read); slot -1 where the shard has nothing to draw right now, or the
        target lies at or past the current :meth:`span` (it shrank since: the learner
        draws those again over the new span, never clipped onto the last row)."""

    @abc.abstractmethod
    def span(self, index: PriorityIndex) -> float:
        """The range targets are drawn from (for redraws): total mass or item count."""

    def changed(self) -> None:  # noqa: B027 - optional hook, default does nothing
        """The shard's rows or index changed (commits, hides, moves)."""


class Sampler(abc.ABC):
    """How learners sample (the learner side) and how owners draw (:meth:`drawer`).

    Args:
        batch_rows (int): items per batch.
        seed (int): seed of the learner's random generator.
    """

    name: ClassVar[str]
    #: rows per sampled item (> 1: sequence windows)
    window: int = 1
    #: priorities given at ingest and by ``update_priorities`` are applied to the
    #: owners' index; False where draws ignore them (uniform, or prioritized with
    #: priority_exponent 0): there a priority of 0 would still give its row mass 0
    #: (never drawn), so they are checked and dropped
    applies_priorities: bool = True

    def __init__(self, *, batch_rows: int, seed: int) -> None:
        self.batch_rows = int(batch_rows)
        self.rng = np.random.default_rng(seed)
        self.superstep_offset = 0  # supersteps done before a restore (schedules)

    # -- owner side ------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def alpha(self) -> float:
        """Exponent the owners' priority index applies (0: every row mass 1)."""

    @abc.abstractmethod
    def drawer(self, columns: Mapping[str, np.ndarray], capacity: int,
               committed: Any) -> ShardDrawer:
        """The owner's drawer of one shard (``columns``: its field arrays in memory;
        ``committed()``: its commit cursor)."""

    # -- learner side ----------------------------------------------------------------
    @property
    def direct_search(self) -> bool:
        """Whether a node-local learner may search the owner's tree itself."""
        return self.window == 1

    def targets(self, stats: list[ShardStats], rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Stratified targets over the shards laid end to end: (shard position, local
        target) per item, in draw order."""
        return allocate_targets(np.array([s.total for s in stats]), rows, self.rng)

    def redraw(self, span: float, n: int) -> np.ndarray:
        """``n`` fresh targets in one shard whose range is ``span``."""
        return self.rng.random(n) * max(span, 0.0)

    @abc.abstractmethod
    def weights(self, mass: np.ndarray, stats: list[ShardStats], superstep: int) -> np.ndarray:
        """float32 importance weights of a batch drawn at ``superstep`` (counted from
        this learner's start, :attr:`superstep_offset` is added)."""

    def check_update(self, indices: Any, priorities: Any,
                     capacities: Mapping[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Validate an ``update_priorities`` call (see :func:`check_update`)."""
        return check_update(indices, priorities, capacities)

    def check_masses(self, priorities: np.ndarray) -> None:  # noqa: B027 - optional
        """Refuse checked priorities that draws would treat as 0 although positive
        (default: none; draws that ignore priorities lose nothing)."""

    # -- state -----------------------------------------------------------------------
    def state_dict(self, supersteps: int = 0) -> dict[str, Any]:
        """JSON-able state, written into checkpoints (schema 2): the strategy's name, its
        random generator and the superstep offset its schedules count from.

        Args:
            supersteps (int): supersteps done since :attr:`superstep_offset` was set; the
                state resumes after them (a checkpoint at a boundary passes its own).
        """
        return {"sampler": self.name, "rng": jsontext.dumps(self.rng.bit_generator.state),
                "superstep_offset": self.superstep_offset + int(supersteps)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (missing keys keep their value). Strategies with
        more state extend both.

        Raises:
            CheckpointError: an RNG state that is not one of numpy's bit generators, or
                an offset that is not a non-negative integer.
        """
        if state.get("rng"):
            try:
                raw = json.loads(state["rng"])
                bg = getattr(np.random, str(raw["bit_generator"]))()
                bg.state = raw
            except (ValueError, TypeError, KeyError, AttributeError) as err:
                raise CheckpointError(f"sampler state 'rng' must be a numpy bit generator's "
                                      f"state as JSON, got {str(state['rng'])[:80]!r}: "
                                      f"{err}") from err
            self.rng = np.random.Generator(bg)
        if "superstep_offset" in state:
            off = state["superstep_offset"]
            if isinstance(off, bool) or not isinstance(off, int) or off < 0:
                raise CheckpointError(f"sampler state 'superstep_offset' must be an "
                                      f"integer >= 0, got {off!r}")
            self.superstep_offset = off


#: shard table of :func:`check_update`'s compiled pass, per shards mapping seen
_CAPS: dict[tuple[tuple[int, int], ...], np.ndarray] = {}


def _cap_table(shards: Mapping[int, int]) -> np.ndarray | None:
    """Capacity by shard id (0: not read) for :func:`check_update`'s compiled pass, or
    ``None`` where the ids are not small non-negative integers (the reference path
    checks then)."""
    key = tuple(shards.items())
    table = _CAPS.get(key)
    if table is None:
        ids = [sid for sid, _ in key]
        if not all(type(s) is int and 0 <= s < 1 << 16 for s in ids):
            return None
        table = np.zeros(max(ids, default=-1) + 1, np.int64)
        for sid, cap in key:
            table[sid] = max(int(cap), 0)
        if len(_CAPS) >= 64:
            _CAPS.clear()
        _CAPS[key] = table
    return table


def check_update(indices: Any, priorities: Any, shards: Mapping[int, int]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Validate an ``update_priorities`` call before anything is sent.

    Raises:
        SpecError: (a ``ValueError``) indices not ``[n, 3]`` int, an unknown shard, a slot
            out of range, priorities of another length, or a negative, NaN or infinite
            priority.
    """
    idx = as_array(indices, "indices")
    if idx.ndim != 2 or idx.shape[1] != 3 or idx.dtype.kind not in "iu":
        raise SpecError(f"indices must be an integer array of shape [n, 3] (shard, slot, "
                         f"generation) as delivered in Batch.indices, got dtype "
                         f"{idx.dtype.name} shape {idx.shape}")
    p = as_priorities(priorities)
    if len(p) != len(idx):
        check_priorities(p)  # a bad value is named first
        raise SpecError(f"priorities has {len(p)} entries but indices has {len(idx)}")
    if idx.dtype.kind == "u" and idx.size and idx.max() > np.iinfo(np.int64).max:
        row, col = np.unravel_index(int(np.argmax(idx)), idx.shape)  # would wrap negative
        raise SpecError(f"indices row {int(row)} has {('shard', 'slot', 'generation')[col]} "
                        f"{int(idx[row, col])}, beyond any in Batch.indices (int64)")
    idx = idx.astype(np.int64)
    if len(idx) == 0:
        return idx, p
    caps = _cap_table(shards)
    if caps is not None and tree_kernels.check_rows(idx, p, MAX_PRIORITY, caps) == -1:
        return idx, p  # every row checked in one compiled pass
    # the reference path, which names the first fault
    check_priorities(p)
    first = int(idx[0, 0])
    sids = np.unique(idx[:, 0]) if (idx[:, 0] != first).any() else (first,)
    for sid in sids:
        if int(sid) not in shards:
            raise SpecError(f"indices names shard {int(sid)}, which this learner does "
                             f"not read (shards: {sorted(shards)})")
        slots = idx[idx[:, 0] == sid, 1] if len(sids) > 1 else idx[:, 1]
        cap = shards[int(sid)]
        if slots.min() < 0 or slots.max() >= cap:
            worst = int(slots.min()) if slots.min() < 0 else int(slots.max())
            raise SpecError(f"indices has slot {worst} outside shard {int(sid)}'s "
                             f"[0, {cap})")
    return idx, p
