"""Promotion and demotion of a learner's hottest shards to its device tier.

``[placement] device_rows = N`` lets a learner mirror up to ``N`` rows of shards on its
device beyond the plan's own ``learner_gpu`` shards (those stay pinned), the same way
(:class:`~conduit_hpc.plane.device_tier.DeviceShard`: slot for slot, synced from the ring
before each batch's statistics, drawn, gathered and re-prioritised on the device, every
priority update written back to the owner). Which shards is decided here, per shard:

* **candidates**: shards this learner reads that no other learner reads, whose ring is
  in this node's shared memory (and whose owner's acknowledgement counts this process
  maps), and that the plan did not already put in ``learner_gpu``;
* **heat** is mass density: a shard's total priority mass (the owner's published
  ``H_TOTAL``, or the device's total while mirrored - the same value, by the
  write-back) over its capacity. The wanted set (:func:`choose`) is greedy by density,
  descending, taking each shard whose capacity still fits the budget: never over
  ``device_rows``, and the most mass possible when the candidates' capacities are
  equal. Incumbents win ties, so equal heat does not flap;
* the policy looks every ``placement.interval_supersteps`` superstep boundaries
  (:meth:`Deliverer.mark <conduit_hpc.plane.delivery.Deliverer.mark>` calls
  :meth:`DevicePolicy.step`) and changes the mirrored set only after
  ``placement.patience`` consecutive looks wanted the same different set.

**A move loses and duplicates nothing.** The ring is never moved: its owner keeps
committing, evicting, checkpointing and indexing every row, in either tier. What moves
is where this learner *samples* the shard, and that switches in one place
(``Deliverer.device_shards``), on the one thread that uses the Deliverer, between
batches: a batch's statistics, targets and rows for a shard all come from one tier
(a device reply is matched to the store that drew it by its request id, so even a
pipelined batch begun before a switch completes from the tier that drew it). No row can
therefore be drawn from both tiers, or from neither.

* *Promote* shard H: first every priority update this learner sent H's owner is
  applied there (``required`` = ``sent`` for that owner, then the bounded
  acknowledgement wait), so the index masses the first :meth:`~conduit_hpc.plane.
  device_tier.DeviceShard.sync` copies are current; that sync puts every live row of the
  ring on the device, each once, with its index mass. Then H joins ``device_shards``.
* *Demote* H: it leaves ``device_shards`` and its store is dropped. The owner's index is
  already current - every update was sent to the owner as well - and the next direct
  search of its tree waits for the owner's acknowledgements as for any shard.
* *Late updates follow the row.* An update for a row drawn before a switch is sent to
  the owner always and applied on the device whenever H is mirrored at that moment,
  only where the slot still holds the row's generation (rows evicted since are
  skipped). Sent before a promotion, it reaches the device through the index the
  promotion copies; sent after, directly. Either way the row's priority is the same in
  both tiers.

What a promotion costs: the acknowledgement wait and one copy of the shard's live rows
(shared memory -> device). A demotion costs nothing but the device memory it frees.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from conduit_hpc.plane.device_tier import DeviceShard

#: the :class:`~conduit_hpc.plane.delivery.Deliverer` a policy serves (it owns the policy,
#: so this module does not import it: no import cycle)
Deliverer = Any

__all__ = ["Agreement", "DevicePolicy", "choose"]


def choose(heat: Mapping[int, tuple[float, int]], budget: int,
           incumbents: Iterable[int] = ()) -> frozenset[int]:
    """The shards to mirror: greedy by mass density (mass / capacity), descending;
    a shard is taken when its capacity still fits ``budget`` (later, smaller ones may
    still fit). Shards without mass are never taken. Ties: incumbents first, then the
    lower shard id. Pure.

    Args:
        heat (Mapping[int, tuple[float, int]]): candidate shard -> (mass, capacity rows).
        budget (int): rows the device may mirror.
        incumbents (Iterable[int]): shards mirrored now (they win ties).
    """
    held = set(incumbents)
    order = sorted((s for s, (m, c) in heat.items() if m > 0 and c > 0),
                   key=lambda s: (-heat[s][0] / heat[s][1], s not in held, s))
    out: set[int] = set()
    used = 0
    for s in order:
        cap = heat[s][1]
        if used + cap <= budget:
            out.add(s)
            used += cap
    return frozenset(out)


class Agreement:
    """Patience: a change happens once ``patience`` consecutive looks called for the same
    one. Pure.

    Args:
        patience (int): looks that must agree (1: act on the first).
    """

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.wanted: frozenset[int] | None = None  # what the last looks called for
        self.count = 0  # ... how many looks in a row

    def look(self, want: frozenset[int], held: frozenset[int]) -> bool:
        """One look wanting ``want`` while ``held`` is mirrored: whether to move now
        (then the count starts again)."""
        if want == held:
            self.wanted, self.count = None, 0
            return False
        self.count = self.count + 1 if want == self.wanted else 1
        self.wanted = want
        if self.count < self.patience:
            return False
        self.wanted, self.count = None, 0
        return True


class DevicePolicy:
    """Decides and makes this learner's promotions and demotions (see the module
    docstring). Not thread-safe: the Deliverer's thread calls :meth:`step`.

    Args:
        candidates (Iterable[int]): shards that may be promoted.
        budget (int): ``placement.device_rows``.
        interval (int): ``placement.interval_supersteps``.
        patience (int): ``placement.patience``.
        seed (int): base seed of the device stores' generators (``seed + shard``).
    """

    def __init__(self, candidates: Iterable[int], *, budget: int, interval: int,
                 patience: int, seed: int) -> None:
        self.candidates = tuple(sorted(set(candidates)))
        self.budget, self.interval, self.patience = budget, interval, patience
        self.seed = seed
        self.held: set[int] = set()  # shards this policy mirrors now
        self.marks = 0  # superstep boundaries seen
        self.looks = 0
        self.agreement = Agreement(patience)
        self.promotions = self.demotions = 0
        self.rows_copied = 0  # rows the promotions' first syncs put on the device
        #: what demoted shards' mirrors counted (``DeviceShard`` attribute -> rows)
        self.retired = dict.fromkeys(("drawn", "rows_in", "evicted", "missed"), 0)
        #: (look, "promote" | "demote", shard) of the latest 1,024 moves, in order
        #: (:attr:`promotions` and :attr:`demotions` count every one)
        self.moves: deque[tuple[int, str, int]] = deque(maxlen=1024)

    def heat(self, d: Deliverer) -> dict[int, tuple[float, int]]:
        """Candidate -> (mass, capacity): the device's total while mirrored, else what
        the owner last published. Local; one header read per host shard."""
        out = {}
        for sid in self.candidates:
            dev = d.device_shards.get(sid)
            ring = d.rings[sid]
            mass = dev.last_stats.total if dev is not None else ring.read_stats()[1]
            out[sid] = (mass, ring.capacity)
        return out

    def step(self, d: Deliverer) -> None:
        """A superstep boundary (after :meth:`Deliverer.mark
        <conduit_hpc.plane.delivery.Deliverer.mark>`): look every ``interval`` of them,
        move once ``patience`` looks agree. Blocks (bounded) only for a promotion's
        acknowledgement wait."""
        self.marks += 1
        if self.marks % self.interval:
            return
        self.looks += 1
        held = frozenset(self.held)
        want = choose(self.heat(d), self.budget, held)
        if not self.agreement.look(want, held):
            return
        for sid in sorted(held - want):  # first: their rows leave the device budget
            self.demote(d, sid)
        for sid in sorted(want - held):
            self.promote(d, sid)

    def promote(self, d: Deliverer, sid: int) -> None:
        """Mirror shard ``sid`` on the device (see the module docstring)."""
        owner = d.owners[sid]
        d.prio.catch_up(owner)  # the index the first sync copies has every update
        device = d.stager.device
        assert device is not None  # a learner's Stager (config refuses delivery ranks)
        dev = DeviceShard(sid, d.rings[sid], alpha=d.sampler.alpha, device=device,
                          seed=self.seed + sid)
        dev.sync()
        d.place(sid, dev)
        self.held.add(sid)
        self.promotions += 1
        self.rows_copied += dev.rows_in
        self.moves.append((self.looks, "promote", sid))

    def demote(self, d: Deliverer, sid: int) -> None:
        """Stop mirroring shard ``sid``: its rows are drawn from the owner's index again."""
        dev = d.device_shards[sid]
        d.place(sid, None)
        for k in self.retired:
            self.retired[k] += getattr(dev, k)
        self.held.discard(sid)
        self.demotions += 1
        self.moves.append((self.looks, "demote", sid))

    def counters(self) -> dict[str, Any]:
        """For the learner's summary."""
        return {"device_promotions": float(self.promotions),
                "device_demotions": float(self.demotions),
                "device_rows_promoted": float(self.rows_copied)}
