"""The manifest's per-rank groups (``/counters/<rank>`` attributes, ``/rng/<rank>`` and
``/sampler/<rank>`` JSON strings), read with their types checked: a restore hands them
to each rank's job after every rank agreed the checkpoint is good, so a value of the
wrong type must be refused here, when the manifest is opened, not on one rank later.
Local; reads only. See :mod:`conduit_hpc.checkpoint`."""

from __future__ import annotations

import json
from typing import Any

import h5py
import numpy as np

__all__ = ["read_rank_groups"]


def _text(ds: Any, where: str) -> str:
    if not (isinstance(ds, h5py.Dataset) and ds.shape == () and ds.dtype.kind in "SOU"):
        shape = getattr(ds, "shape", None)
        raise ValueError(f"{where} must be a scalar string dataset (JSON), got "
                         f"{type(ds).__name__} of dtype {getattr(ds, 'dtype', None)} "
                         f"shape {shape}")
    v = ds[()]
    return v.decode() if isinstance(v, bytes) else str(v)


def _rank(name: str, group: str) -> int:
    try:
        return int(name)
    except ValueError as err:
        raise ValueError(f"/{group}/{name} must be named by a world rank (an integer), got "
                         f"{name!r}") from err


def _members(f: h5py.File, group: str, kind: type) -> list[tuple[str, Any]]:
    """``(name, object)`` of a group's members, each of ``kind``: a damaged link (h5py
    gives None for an object it cannot open) or an object of another kind is refused."""
    g = f[group]
    if not isinstance(g, h5py.Group):
        raise ValueError(f"/{group} must be a group, got {type(g).__name__}")
    out = []
    for name in g:
        obj = g.get(name)
        if not isinstance(obj, kind):
            raise ValueError(f"/{group}/{name} must be a {kind.__name__} (damaged or "
                             f"replaced), got {type(obj).__name__}")
        out.append((name, obj))
    return out


def read_rank_groups(f: h5py.File) -> tuple[dict[int, dict[str, Any]], dict[int, str],
                                            dict[int, dict[str, Any]]]:
    """``(counters, rng, sampler)`` by world rank: counters are numbers or strings, an
    RNG state is JSON text, a sampler state a JSON object (schema 1 has no ``sampler``).

    Raises:
        ValueError: naming the group or attribute, the value and what was expected.
        KeyError: a group is missing.
    """
    counters: dict[int, dict[str, Any]] = {}
    for r, g in _members(f, "counters", h5py.Group):
        got: dict[str, Any] = {}
        for k, v in g.attrs.items():
            v = v.item() if isinstance(v, np.generic) else v
            v = v.decode() if isinstance(v, bytes) else v
            if not isinstance(v, str | int | float | bool):
                raise ValueError(f"attribute {k!r} of /counters/{r} must be a number or a "
                                 f"string, got {v!r:.80}")
            got[k] = v
        counters[_rank(r, 'counters')] = got
    rng = {_rank(r, "rng"): _text(ds, f"/rng/{r}") for r, ds in _members(f, "rng", object)}
    sampler: dict[int, dict[str, Any]] = {}
    for r, ds in (_members(f, "sampler", object) if "sampler" in f else ()):
        state = json.loads(_text(ds, f"/sampler/{r}"))
        if not isinstance(state, dict):
            raise ValueError(f"/sampler/{r} must hold a JSON object (a sampler's state), "
                             f"got {state!r:.80}")
        sampler[_rank(r, 'sampler')] = state
    return counters, rng, sampler
