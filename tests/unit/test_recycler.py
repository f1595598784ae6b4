"""Batch columns are recycled only when nothing refers to them any more: a batch a user
keeps (as torch tensors, their views, ``.numpy()`` of them, or a transform's view) is
never gathered over; freed ones are reused."""

from __future__ import annotations

import gc

import numpy as np
import torch

from conduit_hpc.plane.staging import Recycler, Stager
from conduit_hpc.spec import Spec

SPEC = Spec.from_dict({"obs": ("uint8", (4, 3)), "reward": ("float32", ())})


def _batch(stager: Stager, t: int, fill: int):
    cols = stager.alloc(t, SPEC, (8,))
    for v in cols.values():
        v[...] = fill
    return stager.to_device(cols, np.zeros((8, 3), np.int64), np.ones(8, np.float32), t, 0)


def _holders(batch):
    """Every way a user may hold on to a batch's rows."""
    return [
        lambda: batch,                        # the batch itself
        lambda: batch["obs"][2:5],            # a view of a tensor
        lambda: batch["obs"].numpy(),         # numpy of a tensor
        lambda: batch["reward"].view(2, 4),   # a reshape
        lambda: dict(batch.data),             # the dict of tensors
    ]


def test_kept_batches_are_never_written_over() -> None:
    stager = Stager(torch.device("cpu"))
    for k in range(5):
        first = _batch(stager, 0, 7)
        keep = _holders(first)[k]()
        del first
        gc.collect()
        for t in range(1, 12):  # many batches after it, each dropped at once
            _batch(stager, t, 100 + t)
        held = keep if isinstance(keep, (torch.Tensor, np.ndarray)) else keep["obs"]
        assert (np.asarray(held) == 7).all(), f"holder {k}: a kept batch was written over"


def test_freed_columns_are_reused_and_the_pool_is_bounded() -> None:
    stager = Stager(torch.device("cpu"))
    for t in range(20):
        b = _batch(stager, t, t)
        assert (b["obs"].numpy() == t).all()
        del b
    assert stager.recycler.reused >= 18
    assert len(stager.recycler.sets) <= 2  # one in use at a time: no growth
    held = [_batch(stager, t, t) for t in range(6)]  # a user keeping six batches
    assert [int(b["obs"][0, 0, 0]) for b in held] == list(range(6))


def test_budget_bounds_what_is_kept() -> None:
    r = Recycler(budget_bytes=1)  # below one set: two sets kept, more made fresh
    held = [r.take(SPEC, (8,)) for _ in range(5)]
    assert len(r.sets) == 2 and len({id(h["obs"]) for h in held}) == 5
    del held
    r.take(SPEC, (4,))  # another batch shape: the old sets are dropped
    assert len(r.sets) == 1 and r.sets[0]["obs"].shape == (4, 4, 3)
