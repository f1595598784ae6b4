"""Checks of a learner's device tier shared by ``test_device_tier.py`` and
``test_device_policy.py`` (not a test module). Each returns a list of problems, so that
the caller can agree on a verdict across ranks before asserting."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import chi2

Row = tuple[int, int, int]  # (shard, slot, id): a row as Batch.indices names it


def mirror_problems(d: Any, *, writing: bool = False) -> list[str]:
    """Every device shard of Deliverer ``d`` mirrors its ring exactly once: ids distinct,
    rows in = evicted + held, every row the owner's index holds on the device with the
    same mass; and, unless actors may still be ``writing`` (then rows can change under
    the check), every device row is the ring's row of that slot, intact, with the same
    bytes. Run on the Deliverer's thread."""
    out = []
    for sid, dev in d.device_shards.items():
        dev.sync()
        ring, cap = dev.ring, dev.capacity
        slots, ids, _ = dev.store.held_rows()
        if len(set(ids.tolist())) != len(ids):
            out.append(f"shard {sid}: an id held twice")
        if dev.rows_in - dev.evicted != len(ids):
            out.append(f"shard {sid}: {dev.rows_in} in, {dev.evicted} evicted, {len(ids)} "
                       f"held")
        gens, mass = ring.leaves(np.arange(cap))
        live = np.flatnonzero(gens > 0)
        on_dev = dict(zip(slots.tolist(), ids.tolist(), strict=True))
        if writing:  # only rows both hold at one generation
            live = np.array([s for s in live if on_dev.get(int(s)) == int(gens[s])], np.int64)
        else:
            if (ring.stamps_of(slots) != ids).any():
                out.append(f"shard {sid}: device rows the ring no longer holds")
            gate = min(ring.reserve_cursor(), ring.free_cursor() or 1 << 62)
            if (ids - 1 + cap < gate).any():
                out.append(f"shard {sid}: rows handed to a writer still held")
            host, _ = ring.gather(slots)
            for name, col in dev.store.gather(slots).items():
                if not np.array_equal(col.cpu().numpy().view(host[name].dtype), host[name]):
                    out.append(f"shard {sid}: column {name} differs")
            if any(on_dev.get(int(s)) != int(gens[s]) for s in live):
                out.append(f"shard {sid}: an indexed row is not on the device")
        dmass = dev.store.masses(live).cpu().numpy()
        if not np.allclose(dmass, mass[live], rtol=1e-9):
            bad = int(np.count_nonzero(~np.isclose(dmass, mass[live], rtol=1e-9)))
            out.append(f"shard {sid}: {bad} priorities differ from the owner's")
    return out


def masses(d: Any) -> dict[Row, float]:
    """Row -> mass of every row Deliverer ``d`` may draw, from the tier that holds it:
    the device for its shards, the owner's index (in this node's shared memory) for the
    others; shards on other nodes are left out. Run on the Deliverer's thread."""
    out: dict[Row, float] = {}
    for sid, ring in d.rings.items():
        dev = d.device_shards.get(sid)
        if dev is not None:
            dev.sync()
            slots, ids, _ = dev.store.held_rows()
            m = dev.store.masses(slots).cpu().numpy()
        elif ring.views is not None:
            gens, lm = ring.leaves(np.arange(ring.capacity))
            slots = np.flatnonzero(gens > 0)
            ids, m = gens[slots], lm[slots]
        else:
            continue
        for s, i, x in zip(slots.tolist(), ids.tolist(), m.tolist(), strict=True):
            out[(sid, s, i)] = x
    return out


def draw_problems(counts: dict[Row, int], mass: dict[Row, float],
                  device: set[int]) -> list[str]:
    """Draws against mass over the shards ``mass`` covers: every drawn row is held; each
    tier's (``device`` shards, the others) share of the draws within 5 sd of its share of
    the mass; each row's count by a chi-square over 20 bins of about equal expected
    counts (p > 1e-4)."""
    out = []
    local = {k[0] for k in mass}
    drawn = sum(c for k, c in counts.items() if k[0] in local)
    if not drawn:
        return ["nothing drawn from the shards checked"]
    stray = [k for k in counts if k[0] in local and k not in mass]
    if stray:
        out.append(f"drawn rows not held: {stray[:5]}")
    total = sum(mass.values())
    for name, keys in (("device", [k for k in mass if k[0] in device]),
                       ("host", [k for k in mass if k[0] not in device])):
        p = sum(mass[k] for k in keys) / total
        got = sum(counts.get(k, 0) for k in keys)
        sd = max(np.sqrt(drawn * p * (1 - p)), 1.0)
        if abs(got - p * drawn) > 5 * sd:
            out.append(f"{name} tier: {got} draws, expected {p * drawn:.0f} ± {sd:.0f}")
    keys = sorted(mass, key=lambda k: mass[k])
    exp_all = np.array([mass[k] / total * drawn for k in keys])
    got_all = np.array([counts.get(k, 0) for k in keys], float)
    edges = np.searchsorted(np.cumsum(exp_all), np.linspace(0, exp_all.sum(), 21)[1:-1])
    e = np.array([x.sum() for x in np.split(exp_all, edges)])
    o = np.array([x.sum() for x in np.split(got_all, edges)])
    stat = float(((o - e) ** 2 / e).sum())
    p_value = float(chi2.sf(stat, len(e) - 1))
    if p_value < 1e-4:
        out.append(f"chi-square p = {p_value:.2g} (stat {stat:.1f})")
    return out
