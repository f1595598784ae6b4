"""A placement keeps what it checked, whatever happens to the tables it was built from.
``Placement`` (documented immutable) held the caller's ``actor_shards`` /
``learner_shards`` / ``actor_weights`` dicts themselves, and an actor routes every
ingest through them: a ``placement=`` given to the data plane and changed afterwards
sent an actor's rows to a shard the other ranks' plan did not give it, or - a shard id
out of range, refused had it been there at the check - raised a raw ``KeyError`` from
``ingest``."""

from __future__ import annotations

from typing import Any

import pytest

from conduit_hpc.placement.placement import Placement, ShardPlacement, ShardWeights


def _shards() -> tuple[ShardPlacement, ...]:
    return (ShardPlacement(0, 0, "buffer_host", 128), ShardPlacement(1, 0, "buffer_host", 128))


def test_the_callers_tables_changed_afterwards_do_not_reach_the_plan() -> None:
    actors = {2: 0, 3: 1}
    reads = [0, 1]
    learners = {1: reads}
    weights = {3: ShardWeights.of({1: 1.0})}
    pl = Placement(_shards(), actors, learners, weights)
    before = pl.to_dict()
    actors[2] = 7  # out of range: refused had it been there at the check
    actors[4] = 1
    reads.append(5)
    learners[9] = (0,)
    weights[3] = ShardWeights.of({0: 1.0})
    assert pl.to_dict() == before
    assert [pl.shard_for(2, b) for b in range(4)] == [0] * 4  # where ingest writes
    assert [pl.shard_for(3, b) for b in range(4)] == [1] * 4
    assert pl.learner_shards == {1: (0, 1)} and 4 not in pl.actor_shards


@pytest.mark.parametrize("table", ["actor_shards", "learner_shards", "actor_weights"])
@pytest.mark.parametrize("change", [
    lambda m: m.__setitem__(2, 1), lambda m: m.pop(next(iter(m))), lambda m: m.clear(),
    lambda m: m.update({5: 0})], ids=["setitem", "pop", "clear", "update"])
def test_a_plans_tables_cannot_be_changed_through_it(table: str, change: Any) -> None:
    pl = Placement(_shards(), {2: 0, 3: 1}, {1: (0, 1)}, {3: ShardWeights.of({1: 1.0})})
    before = pl.to_dict()
    with pytest.raises(TypeError, match="cannot be changed"):
        change(getattr(pl, table))
    assert pl.to_dict() == before


def test_a_plan_compares_and_checks_as_before() -> None:
    a = Placement(_shards(), {2: 0}, {1: [0, 1]})  # a list of shards becomes a tuple
    b = Placement(list(_shards()), {2: 0}, {1: (0, 1)})
    assert a == b and a.learner_shards[1] == (0, 1) and isinstance(a.shards, tuple)
    with pytest.raises(ValueError, match="actor 2 writes shard 7"):
        Placement(_shards(), {2: 7}, {})
