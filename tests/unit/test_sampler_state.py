"""The sampler's own state in checkpoints (issue 23, item 5): a resumed sampler
continues exactly - the beta schedule from its superstep offset, the same random draws."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conduit_hpc import jsontext
from conduit_hpc.errors import CheckpointError
from conduit_hpc.sampling.prioritized import PrioritizedSampler
from conduit_hpc.sampling.stratified import ShardStats

STATS = [ShardStats(total=10.0, count=10, min=0.5), ShardStats(total=6.0, count=4, min=1.0)]


def _sampler() -> PrioritizedSampler:
    return PrioritizedSampler(batch_rows=8, seed=7, alpha=0.6, beta=0.4, beta_final=1.0,
                              beta_anneal_supersteps=100)


def _step(s: PrioritizedSampler, superstep: int) -> tuple[np.ndarray, ...]:
    shard, local = s.targets(STATS, 8)
    mass = np.linspace(0.5, 2.0, 8)
    return shard, local, s.redraw(3.0, 2), s.weights(mass, STATS, superstep)


def test_a_resumed_sampler_continues_exactly() -> None:
    run = _sampler()
    for s in range(30):
        _step(run, s)
    state = json.loads(jsontext.dumps(run.state_dict(30)))  # through a checkpoint's JSON
    assert state["sampler"] == "prioritized" and state["superstep_offset"] == 30
    resumed = _sampler()
    resumed.load_state_dict(state)
    for s in range(30, 60):  # the resumed learner counts its supersteps from 0 again
        want, got = _step(run, s), _step(resumed, s - 30)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a, b)
    assert resumed.superstep_offset == 30


@pytest.mark.parametrize(("state", "match"), [
    ({"rng": "{not json"}, "sampler state 'rng'"),
    ({"rng": json.dumps({"bit_generator": "NoSuch"})}, "sampler state 'rng'"),
    ({"superstep_offset": -1}, "'superstep_offset' must be an integer >= 0, got -1"),
    ({"superstep_offset": "3"}, "got '3'"),
])
def test_a_bad_state_is_refused_naming_the_key(state: dict[str, object], match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        _sampler().load_state_dict(state)
