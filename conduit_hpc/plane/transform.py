"""A learner's ``transform``: what it returned, checked, and made the batch's own.

:func:`checked_transform` turns what the transform returned into a dict of numpy arrays
(or names the fault). :func:`private_columns` then makes sure that no one but the batch
holds their memory before they go to torch without a copy: a transform that writes into
a buffer of its own and returns it (or a view of it, or keeps what it returned) would
otherwise hand every batch the same memory, and in ``edp`` mode the data-plane thread
transforms batch ``s+1`` into it while the learner computes on batch ``s``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from conduit_hpc.errors import SpecError
from conduit_hpc.spec import as_array

__all__ = ["checked_transform", "private_columns"]


def checked_transform(data: Any, rows: int | None = None) -> dict[str, np.ndarray]:
    """What a learner's ``transform`` returned, as a dict of numpy arrays, or a
    :class:`SpecError` naming the transform (before the batch is staged: torch's or
    numpy's own error otherwise, raised from deep in the copy to the device).
    ``rows``: the batch's rows, which every column must keep (one per index and weight:
    a column of other length would pair rows with another row's index and weight)."""
    if not isinstance(data, Mapping):
        raise SpecError(f"transform must return a mapping of field name to array, got "
                        f"{type(data).__name__} {data!r:.80}")
    out = {k: as_array(v, f"transform output {k!r}") for k, v in data.items()}
    for k, v in out.items():
        if rows is not None and (v.ndim == 0 or v.shape[0] != rows):
            raise SpecError(f"transform output {k!r} has shape {list(v.shape)}; expected "
                            f"{rows} rows first (scheduler.batch_rows: one per entry of "
                            f"Batch.indices and Batch.weights)")
    return out


def _owner(a: np.ndarray) -> object:
    """The object that holds ``a``'s memory (numpy points a view's ``base`` at it)."""
    o: object = a
    while isinstance(o, np.ndarray) and o.base is not None:
        o = o.base
    return o


def _extra_refs(data: Mapping[str, np.ndarray]) -> list[tuple[str, int, int, int]]:
    """Per array of ``data``: (name, id of its memory's owner, references to the owner
    beyond one per array of ``data`` on it, references to the array itself if it is a
    view, else -1). Measured the same way for every call (and for :data:`_FRESH`)."""
    uses: dict[int, int] = {}
    owners: dict[int, object] = {}
    for v in data.values():
        o = _owner(v)
        owners[id(o)] = o
        uses[id(o)] = uses.get(id(o), 0) + 1
    out = []
    for k, v in data.items():
        o = owners[id(_owner(v))]
        view = -1 if v is o else sys.getrefcount(v)
        out.append((k, id(o), sys.getrefcount(o) - uses[id(o)], view))
    return out


def _fresh() -> tuple[int, int, int]:
    """What :func:`_extra_refs` reads for arrays that nothing but their dict holds: an
    array's own memory, a view's memory (its base), the view."""
    own, view = _extra_refs({"a": np.empty(1), "b": np.empty(2)[:1]})
    return own[2], view[2], view[3]


#: (own memory, a view's memory, the view) references of arrays held by their dict only
_FRESH = _fresh()


def private_columns(data: dict[str, np.ndarray], columns: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
    """``data`` (a transform's checked output) with each array whose memory something
    else holds as well replaced by a copy. Arrays of the batch's own ``columns`` (or
    views of them: the recycler never reuses a column that is referred to), and arrays
    that nothing else refers to (new ones the transform made), go as they are; an array
    a transform keeps (a buffer it reuses, or one it remembers), a view of one, or the
    memory of another object (a tensor's, whose storage others may share) is copied.
    Local; costs a few reference counts per field unless it copies."""
    ours = {id(c) for c in columns.values()}
    own, base, alone = _FRESH
    shared = {k for k, owner, refs, view in _extra_refs(data) if owner not in ours and (
        not isinstance(data[k].base, np.ndarray | None)  # a tensor's, a buffer's memory
        or (refs > own if view < 0 else refs > base or view > alone))}
    if not shared:
        return data
    return {k: np.array(v) if k in shared else v for k, v in data.items()}
