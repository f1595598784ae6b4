"""The direct draw: one batch drawn and copied by this rank from shards in its node's
shared memory, without the per-shard stages of the general path.

Where every shard a learner reads is a buffer's ring that this process maps and whose
index it may search (``scheduler.fetch = "direct"``, a sampler that searches directly,
window 1, no device mirror; frame stacks too), a batch needs no messages and no replies:
:func:`direct_batch` draws the targets, and for each shard searches its index
(:meth:`~conduit_hpc.storage.ring.ShardRing.search`, the seqlocked read), marks the
rows drawn, copies them straight into the batch's columns
(:meth:`~conduit_hpc.storage.ring.ShardRing.gather`) and checks them intact by the
ring's one rule (:meth:`~conduit_hpc.storage.ring.ShardRing.all_intact`); a shard with a
row overwritten meanwhile (or a target past its total) goes through the same redraw
loop as the general path (:func:`redraw`), under a read pin. The rest of the batch
(transform, weights, the copy to the device) is the Deliverer's
(:meth:`~conduit_hpc.plane.delivery.Deliverer.finish`).

The same work as the general path's stages, in the same order (await the owner's
acknowledgements, search, mark, copy, read the writers' cursor, check), with the
parts, replies and fill callbacks that owner-sampled and device shards need left out:
~300 Python calls a batch cost the learner more than its compiled kernels
(``bench/README.md``, "Stop 44").
"""

from __future__ import annotations

import time

import numpy as np

from conduit_hpc.plane.delivery import Deliverer, ShardEmptied
from conduit_hpc.plane.sources import HostSource
from conduit_hpc.plane.staging import Batch
from conduit_hpc.protocol import Tag
from conduit_hpc.sampling import ShardStats
from conduit_hpc.storage import tree_kernels
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.wait import Backoff, Deadline

__all__ = ["direct_batch", "direct_rings", "gather_checked", "redraw"]


def direct_rings(d: Deliverer) -> list[tuple[int, ShardRing]] | None:
    """``(shard id, ring)`` of every shard ``d`` reads, in its order, where each can be
    drawn by :func:`direct_batch` (see the module docstring); else ``None``."""
    if d.window != 1 or d.device_shards:
        return None
    out = []
    for sid in d._sids:
        src, ring = d.sources[sid], d.rings[sid]
        if type(src) is not HostSource or src.searched_owner is None or ring.views is None:
            return None
        out.append((sid, ring))
    return out


def direct_batch(d: Deliverer, rings: list[tuple[int, ShardRing]], superstep: int,
                 staleness: int, stats: list[ShardStats], timings: dict[str, float],
                 t0: float) -> Batch:
    """One batch of ``d``'s shards (``rings``: :func:`direct_rings`), drawn over
    ``stats`` (admitted), copied, checked and finished. ``t0``: when sampling began
    (``timings["sample_s"]`` runs from it). Blocks (bounded, in the redraws)."""
    B = d.cfg.batch_rows
    out = d.stager.alloc(superstep, d.spec, (B,))
    indices = np.empty((B, 3), dtype=np.int64)
    mass = np.empty(B, dtype=np.float64)
    shard_pos, local = d.sampler.targets(stats, B)
    n = len(rings)
    bounds = (0, B) if n == 1 else np.searchsorted(shard_pos, np.arange(n + 1))
    drawn: list[tuple[int, int, int, ShardRing]] = []
    for k in range(n):  # sample: search each shard's index, mark what it gave
        a, b = int(bounds[k]), int(bounds[k + 1])
        if b == a:
            continue
        sid, ring = rings[k]
        d.prio.await_applied(ring.owner)  # its updates this batch must see (mark())
        found = ring.search(local[a:b])
        assert found is not None  # direct_rings: this process maps the shard
        slots, gens, m = found[0], found[1], found[2]
        ring.mark_sampled(slots, gens)
        indices[a:b, 0], indices[a:b, 1], indices[a:b, 2] = sid, slots, gens
        mass[a:b] = m
        drawn.append((sid, a, b, ring))
    t1 = time.perf_counter()
    timings["sample_s"] = t1 - t0
    for sid, a, b, _ in drawn:  # gather: copy, check by the writers' cursor, redraw
        gather_checked(d, sid, a, b, indices, mass, out)
    timings["gather_s"] = time.perf_counter() - t1
    return d.finish(superstep, staleness, stats, out, indices, mass, timings)


def gather_checked(d: Deliverer, sid: int, a: int, b: int, indices: np.ndarray,
                   mass: np.ndarray, flat: dict[str, np.ndarray]) -> None:
    """Copy rows a..b of the batch (drawn as ``indices``, ``mass``) from shard ``sid``
    into ``flat``; redraw (in the same shard) only those whose slot was handed to a
    writer meanwhile, until all are intact (:func:`redraw`). The general path's
    gather of one shard's part (the direct fetch's fill)."""
    ring, w = d.rings[sid], d.window
    cap = ring.capacity
    # first pass: straight into the batch; most batches end here
    slots = indices[a:b, 1]
    all_drawn = tree_kernels.span(slots)[0] >= 0  # -1: the owner had nothing to draw
    if not all_drawn:
        slots = np.where(slots >= 0, slots, 0)
    rows = slots if w == 1 else (slots[:, None] + np.arange(w)[None, :]).reshape(-1) % cap
    whole = a == 0 and b == len(indices)  # one part: the batch's own columns
    _, reserved = ring.gather(rows, flat if whole else {k: v[a * w:b * w]
                                                        for k, v in flat.items()})
    if all_drawn and ring.all_intact(indices[a:b, 2], reserved):
        return
    bad = (indices[a:b, 1] < 0) | ~ring.intact(indices[a:b, 2], reserved)
    if bad.any():
        redraw(d, sid, a + np.flatnonzero(bad), indices, mass, flat)


def redraw(d: Deliverer, sid: int, todo: np.ndarray, indices: np.ndarray, mass: np.ndarray,
           flat: dict[str, np.ndarray]) -> None:
    """Redraw (in shard ``sid``) the batch rows at positions ``todo`` - overwritten
    while copied, or with nothing drawn - until all are intact, and copy them into
    ``flat`` (rows of ``d.window`` consecutive slots each).

    The owner's guard band keeps such redraws rare (a drawn row stays intact for about
    ``storage.guard_s``). They run under a read pin (the owner's free cursor stays where
    this learner read it until the pin is dropped), so the rows drawn then cannot be
    overwritten: one redraw round is enough, unless the shard had nothing drawable (a
    round that replaced none pauses briefly). Bounded by the timeout; writers of the
    shard wait for at most that one round. A shard left with no mass at all raises
    :class:`~conduit_hpc.plane.delivery.ShardEmptied` (redrawn in it, the rows waited
    out the timeout "being overwritten" after every priority was set to 0)."""
    ring, w = d.rings[sid], d.window
    cap = ring.capacity
    src = d.sources[sid]
    deadline = Deadline(d.timeout_s, f"intact rows of shard {sid} (they kept being "
                                     f"overwritten while gathered)")
    backoff = Backoff(d.poll_s)
    pinned = False
    try:
        while True:
            d.resampled += len(todo)
            deadline.check()
            if not pinned and d.pins is not None:
                pin(d, ring, sid, True)
                pinned = True
            d.pinned_rounds += pinned
            _, total, _, _ = ring.read_stats()
            if not total > 0:  # no redraw here can succeed: start over (admit)
                raise ShardEmptied(sid)
            targets = d.sampler.redraw(total, len(todo))
            rep = src.draw(targets, False)
            if rep is None:
                rid = d.ask(Tag.SAMPLE, sid, targets)
                (rep, _), = d.collect(Tag.SAMPLE_REPLY, {rid: sid},
                                      "resample reply").values()
            indices[todo, 1], indices[todo, 2], mass[todo] = rep.slots, rep.gens, rep.mass
            drawn = indices[todo, 1] >= 0
            slots = np.where(drawn, indices[todo, 1], 0)
            rows = (slots[:, None] + np.arange(w)[None, :]).reshape(-1) % cap
            got, reserved = ring.gather(rows)
            sel = (todo[:, None] * w + np.arange(w)[None, :]).reshape(-1)
            for k, v in got.items():
                flat[k][sel] = v
            bad = ~drawn | ~ring.intact(indices[todo, 2], reserved)
            if not bad.any():
                return
            if bad.all() and pinned:  # nothing drawable: let the owner run
                d.check_failed()  # (e.g. a writer's gap: nothing commits)
                backoff.pause()
            todo = todo[bad]
    finally:
        if pinned:
            pin(d, ring, sid, False)


def pin(d: Deliverer, ring: ShardRing, sid: int, on: bool) -> None:
    """Hold (or drop) ``d``'s read pin on shard ``sid``: its owner does not move the
    free cursor past the value read here while the pin is held."""
    assert d.pins is not None
    t, disp = ring.transport, d.pins.pin_displacement(d.rank)
    if on:
        t.atomic_write(ring.owner, disp + 8, ring.free_cursor())
        t.atomic_write(ring.owner, disp, sid + 1)
    else:
        t.atomic_write(ring.owner, disp, 0)
