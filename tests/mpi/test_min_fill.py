"""The minimum fill counts the rows of the shards a learner reads: with partitioned
sampling that is its partition, smaller than ``storage.capacity_rows`` (the bound the
config checks on its own). A fill above what a learner can ever hold is refused on
every rank when the plan is made (before, the learners waited it out until their
timeout, told only the limiter's counters); a fill that fits runs."""

from __future__ import annotations

import pytest
from mpi4py import MPI

from conduit_hpc import ConfigError, ExperienceDataPlane, Role
from conduit_hpc.testing import checked_batch, make_config

COMM = MPI.COMM_WORLD


def config(min_fill_rows: int):
    return make_config(layout={"learners": 2, "buffers": 1},
                       storage={"capacity_rows": 256},
                       placement={"planner": "static", "scope": "partitioned",
                                  "tiers": ["buffer_host"]},
                       scheduler={"mode": "sync", "batch_rows": 8,
                                  "min_fill_rows": min_fill_rows})


@pytest.mark.mpi(min_size=4)
def test_a_fill_above_a_learners_partition_is_refused_on_every_rank() -> None:
    with pytest.raises(ConfigError, match=r"scheduler.min_fill_rows must be <= the rows "
                       r"every learner reads, got 256: learner rank 0 reads shards \[0\] of "
                       r"128 rows in all \(placement.scope = 'partitioned'\).*use "
                       r"min_fill_rows <= 128") as err:
        ExperienceDataPlane(config(256), COMM)
    assert err.value.key == "scheduler.min_fill_rows"


@pytest.mark.mpi(min_size=4)
def test_a_fill_of_the_whole_partition_is_reached() -> None:
    got = 0
    with ExperienceDataPlane(config(128), COMM) as edp:
        if edp.role is Role.ACTOR:
            wseq = 0
            while not edp.should_stop:
                edp.ingest(checked_batch(edp.world_rank, wseq, 4))
                wseq += 4
        elif edp.role is Role.LEARNER:
            for _ in range(3):
                got += len(edp.next_batch().indices)
        else:
            edp.serve()
        edp.done()
    learners = [g for g in COMM.allgather(got) if g]
    assert learners == [24, 24]


def ratio_config(error_buffer: float):
    return make_config(layout={"learners": 2, "buffers": 1},
                       storage={"capacity_rows": 512},
                       placement={"planner": "static", "scope": "partitioned",
                                  "tiers": ["buffer_host"]},
                       scheduler={"mode": "sync", "batch_rows": 8, "min_fill_rows": 200,
                                  "samples_per_insert": 1.0, "error_buffer": error_buffer,
                                  "max_insert_batch": 8})


@pytest.mark.mpi(min_size=4)
def test_a_ratio_tolerance_that_holds_actors_before_any_partition_fills_is_refused() -> None:
    # the ratio counts every partition's inserts, a learner's fill only its own: with
    # error_buffer 8 the actors were held at 208 inserts while each partition of two
    # held ~104 of the 200 rows its learner waits for - every rank waited out its timeout
    with pytest.raises(ConfigError, match=r"scheduler.error_buffer must be >= "
                       r"samples_per_insert \* \(\(partitions - 1\) \* min_fill_rows \+ "
                       r"partitions \* max_insert_batch\) = 216 with 2 learner partitions "
                       r".*got 8") as err:
        ExperienceDataPlane(ratio_config(8.0), COMM)
    assert err.value.key == "scheduler.error_buffer"


@pytest.mark.mpi(min_size=4)
def test_a_ratio_tolerance_wide_enough_for_the_partitions_runs() -> None:
    got = 0
    with ExperienceDataPlane(ratio_config(216.0), COMM) as edp:
        if edp.role is Role.ACTOR:
            wseq = 0
            while not edp.should_stop:
                edp.ingest(checked_batch(edp.world_rank, wseq, 4))
                wseq += 4
        elif edp.role is Role.LEARNER:
            for _ in range(3):
                got += len(edp.next_batch().indices)
        else:
            edp.serve()
        edp.done()
    assert [g for g in COMM.allgather(got) if g] == [24, 24]
