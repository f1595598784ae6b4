"""A batch stays what it was when it was delivered, whatever the learner's ``transform``
does with the arrays it returns. A transform that writes into a buffer of its own and
returns it (or a view of it) handed every batch the same memory, which went to torch
without a copy: in ``edp`` mode the data-plane thread transformed batch ``s+1`` into it
while the learner computed on batch ``s`` (21-24 of 30 batches changed under a learner
that computed 20 ms each), and a batch kept past the next ``next_batch`` changed in
every mode."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc.testing import checked_batch, make_config, row_consistent

COMM = MPI.COMM_WORLD
STEPS, BATCH, KEEP = 12, 16, 3


class ReusedBuffer:
    """Copies each field into memory of its own, reused for every batch."""

    def __init__(self, view: bool) -> None:
        self.view = view
        self.buf: dict[str, np.ndarray] = {}

    def __call__(self, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for k, v in data.items():
            if k not in self.buf:  # twice the rows: a view of its head is returned
                self.buf[k] = np.empty((2 * len(v), *v.shape[1:]), v.dtype)
            np.copyto(self.buf[k][:len(v)], v)
            out[k] = self.buf[k][:len(v)] if self.view else self.buf[k][:len(v)].copy()
            if not self.view:
                self.buf[k] = out[k]  # the very array returned, kept and written again
        return out


def fresh(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**data, "payload": data["payload"] + 0}


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["edp", "sync"])
@pytest.mark.parametrize("kind", ["buffer", "view of a buffer", "fresh"])
def test_batches_kept_by_the_learner_do_not_change(mode: str, kind: str) -> None:
    cap = 256
    cfg = make_config(layout={"learners": 1, "buffers": 1, "actors": COMM.Get_size() - 2},
                      storage={"capacity_rows": cap},
                      scheduler={"mode": mode, "batch_rows": BATCH, "min_fill_rows": cap,
                                 "prefetch_depth": 2})
    transform = fresh if kind == "fresh" else ReusedBuffer(view=kind != "buffer")
    problems: list[str] = []
    with ExperienceDataPlane(cfg, transform=transform) as edp:
        if edp.role is Role.ACTOR:
            w = 0
            while w < cap:  # the ring once, then idle: every batch is of these rows
                edp.ingest(checked_batch(edp.world_rank, w, 16))
                w += 16
            while not edp.should_stop:
                time.sleep(0.005)
        elif edp.role is Role.LEARNER:
            kept: list[tuple[int, object, dict[str, torch.Tensor]]] = []
            for s in range(STEPS):
                b = edp.next_batch()
                cols = {k: v.numpy() for k, v in b.data.items()}
                if not row_consistent(cols).all():
                    problems.append(f"batch {s} has torn rows")
                kept = [*kept[-(KEEP - 1):], (s, b, {k: v.clone() for k, v in b.data.items()})]
                for t, old, snap in kept:  # earlier batches the learner still holds
                    for k, v in snap.items():
                        if not torch.equal(old.data[k], v):  # type: ignore[attr-defined]
                            problems.append(f"batch {t}'s {k!r} changed by batch {s}")
        else:
            edp.serve()
        edp.done()
    assert COMM.allreduce([f"rank {COMM.Get_rank()}: {p}" for p in problems]) == []
