"""The learner state a boundary checkpoint holds is the state ``provide()`` returned at
that boundary, even when the learner changes its arrays the moment ``next_batch``
returns (an optimizer step writes into the very parameters ``provide()`` handed over).
The hook kept the caller's arrays and wrote them when the checkpoint asked for the part,
one or more supersteps later (on the data-plane thread in ``edp`` mode, while the
learner's own thread changed them): a checkpoint of superstep 5 held the weights of
superstep 6 or later, next to the replay and sampler state of superstep 5. A parameter
tensor (requires grad) given as it is raised a raw RuntimeError on the data-plane thread,
which surfaced supersteps later from an unrelated call."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from mpi4py import MPI

from conduit_hpc import ExperienceDataPlane, Role
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing.agent import CheckpointAgent
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD
EVERY = 4


def _boundary_run(shared_dir: Path, mode: str, provide: Callable[[], dict],
                  step: Callable[[int], None]) -> tuple[Any, int]:
    """A job with a boundary checkpoint every :data:`EVERY` supersteps of ``provide``:
    the learner takes ``3 * EVERY + 2`` batches, calling ``step(s)`` right after batch
    ``s`` (before its update). Returns the spec and the learner's world rank."""
    cfg = make_config(layout={"learners": 1, "buffers": 1},
                      storage={"capacity_rows": 4096, "priority_exponent": 1.0},
                      scheduler={"mode": mode, "batch_rows": 16, "min_fill_rows": 64})
    with ExperienceDataPlane(cfg) as edp:
        agent = CheckpointAgent(edp, shared_dir, keep=0)
        agent.every_supersteps(EVERY, provide)
        if edp.role is Role.ACTOR:
            for i in range(20):
                edp.ingest(checked_batch(edp.world_rank, 8 * i, 8))
            edp.done()
        elif edp.role is Role.LEARNER:
            for s in range(3 * EVERY + 2):
                b = edp.next_batch()
                step(s)
                edp.update_priorities(b.indices, np.ones(len(b)))
            edp.done()
        else:
            edp.serve()
        agent.finish()
        return edp.spec, edp.roles.learner_ranks[0]


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["edp", "sync"])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_boundary_checkpoint_holds_the_state_given_at_the_boundary(
        shared_dir, mode: str, kind: str) -> None:
    w = np.zeros((2, 3))  # the learner's "parameters", changed in place each step
    t = torch.zeros(4, requires_grad=True)  # a parameter as an optimizer holds it
    if kind == "numpy":
        def provide() -> dict:
            return {"extra_state": {"model/w": w[:]}}  # a view, as .numpy() gives
    else:
        def provide() -> dict:
            return {"extra_state": {"model/w": torch.from_numpy(w), "model/t": t}}

    def step(s: int) -> None:  # boundary s: provide() saw w == s
        w[:] = s + 1  # ... then the step changes the parameters at once
        with torch.no_grad():
            t[:] = s + 1

    spec, learner = _boundary_run(shared_dir, mode, provide, step)
    done = [p for p in ck.list_checkpoints(shared_dir) if ck.is_complete(p)]
    problems = [] if len(done) >= 2 else [f"{len(done)} complete checkpoints"]
    for path in done:
        c = ck.open_checkpoint(path, spec=spec)
        boundary = c.counters[learner]["superstep"]
        got = c.extra_state()
        if not (got["model/w"] == boundary).all():
            problems.append(f"checkpoint of superstep {boundary} holds the weights "
                            f"{got['model/w'].ravel()[0]:g}")
        if kind == "torch" and not (got["model/t"] == boundary).all():
            problems.append(f"checkpoint of superstep {boundary}: t = {got['model/t']}")
    assert problems == []


@pytest.mark.mpi(min_size=3)
@pytest.mark.parametrize("mode", ["edp", "sync"])
def test_boundary_checkpoint_counters_are_their_values_at_the_boundary(
        shared_dir, mode: str) -> None:
    """Counters given as numpy values: a 0-d array the learner counts in was written
    with its value supersteps later, and a numpy integer raised a raw TypeError (not
    JSON) where the part was sent - on the data-plane thread in ``edp`` mode."""
    steps = np.zeros((), np.int64)  # counted in place

    def provide() -> dict:
        return {"counters": {"steps": steps, "twice": np.int64(2 * int(steps)),
                             "loss": torch.tensor(0.5)}}

    def step(s: int) -> None:  # boundary s: steps == s
        steps[...] += 1

    spec, learner = _boundary_run(shared_dir, mode, provide, step)
    done = [p for p in ck.list_checkpoints(shared_dir) if ck.is_complete(p)]
    problems = [] if len(done) >= 2 else [f"{len(done)} complete checkpoints"]
    for path in done:
        got = ck.open_checkpoint(path, spec=spec).counters[learner]
        s = got["superstep"]
        if (got["steps"], got["twice"], got["loss"]) != (s, 2 * s, 0.5):
            problems.append(f"checkpoint of superstep {s}: counters {got}")
    assert problems == []


@pytest.mark.mpi(min_size=4)
def test_buffer_counters_given_as_numpy_values_reach_the_checkpoint(shared_dir) -> None:
    """``CheckpointAgent(counters=...)`` on buffer ranks: numpy values were kept as given
    and sent in the part's JSON message by a buffer rank other than the leader, where a
    numpy integer raised a raw TypeError inside its progress loop (the rank failed, and
    the job with it)."""
    cfg = make_config(layout={"learners": 0, "buffers": 2},
                      storage={"capacity_rows": 2048, "shards_per_buffer": 1})
    with ExperienceDataPlane(cfg) as edp:
        me = edp.world_rank
        agent = CheckpointAgent(edp, shared_dir, keep=0, counters=lambda: {
            "rank": np.int64(me), "half": np.float32(0.5)})
        if edp.role is Role.ACTOR:
            for i in range(4):
                edp.ingest(checked_batch(me, 8 * i, 8))
            if edp.roles.actor.Get_rank() == 0:
                agent.request(reason="test")
                done = Path(shared_dir) / "ckpt-000001" / ck.DONE
                for _ in range(6000):  # bounded: 60 s
                    if done.exists():
                        break
                    time.sleep(0.01)
            edp.done()
        else:
            edp.serve()
        agent.finish()
        buffers = edp.roles.buffer_ranks
    c = ck.open_checkpoint(Path(shared_dir) / "ckpt-000001", spec=edp.spec)
    for b in buffers:
        got = c.counters[b]
        assert (got["rank"], got["half"]) == (b, 0.5)
