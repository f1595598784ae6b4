"""The planner's bytes a row (``Workload.bytes_per_row``: what `conduit-hpc plan` charges a
tier with, rows per tier and bytes used) against what a shard's ring really lays out
(``storage.layout.ShardLayout``, the bytes a job's window allocates)."""

from __future__ import annotations

import pytest

from conduit_hpc.placement.model import SHARD_OVERHEAD_BYTES, Workload
from conduit_hpc.spec import Spec
from conduit_hpc.storage.layout import ShardLayout

SPEC = Spec.from_dict({"obs": ("float32", [4]), "action": ("int64", []),
                       "reward": ("float32", [])})
#: rows a power of two, one above, one below, and the synthetic job's
CAPACITIES = (256, 1000, 1023, 1024, 1025, 65_536, 65_537, 200_000, 1 << 20, (1 << 20) + 1)


@pytest.mark.parametrize("sampling", ["uniform", "prioritized"])
@pytest.mark.parametrize("rows", CAPACITIES)
def test_a_shard_never_takes_more_than_the_plan_charges(sampling: str, rows: int) -> None:
    """Before: 96 B a row beside the payload for prioritized sampling (the trees are
    2 x 2P float64 nodes, P the power of two >= the rows: up to 112 B a row in a shard
    just above a power of two: 1,048,577 rows of 28 B took 146.8 MB, the plan said
    130.0 MB) and 16 B for uniform sampling, though every shard lays the index out
    whatever the sampler (200,000 rows: 23.6 MB allocated, the plan said 8.8 MB)."""
    w = Workload(capacity_rows=rows, row_bytes=SPEC.row_bytes, batch_rows=1,
                 min_shard_rows=1, sampling=sampling)  # type: ignore[arg-type]
    real = ShardLayout(SPEC, rows).nbytes
    charged = rows * w.bytes_per_row + SHARD_OVERHEAD_BYTES
    assert real <= charged, (rows, sampling, real, charged)
    # an upper bound, not a guess far off: at most the trees' 32 B a row over
    assert charged - real <= rows * 32 + SHARD_OVERHEAD_BYTES, (rows, real, charged)
