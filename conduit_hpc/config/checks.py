"""Range checks shared by the config sections: :func:`require` and the sane bounds.

Plain Python; imports nothing of ours but :mod:`conduit_hpc.errors`. The bounds keep a
value that passed validation from breaking a rank later: integers that size memory or
index arrays fit ``int64`` with room for sums, and waits stay within what
``threading`` and ``time.sleep`` accept.
"""

from __future__ import annotations

import math

import numpy as np

from conduit_hpc.errors import ConfigError

__all__ = [
    "DTYPES",
    "INT64_MAX",
    "MAX_BYTES",
    "MAX_COUNT",
    "MAX_ROWS",
    "MAX_ROW_BYTES",
    "MAX_SECONDS",
    "finite",
    "itemsize",
    "require",
]

#: the largest value of a signed 64-bit integer (what numpy indexes arrays with)
INT64_MAX = 2**63 - 1
#: rows of a replay, a batch window or a queue (2**40 ~ 10**12 rows)
MAX_ROWS = 2**40
#: counts of ranks, batch rows, ingest batches, dimensions of one field (fit int32)
MAX_COUNT = 2**31 - 1
#: bytes of one row of the experience spec (4 GiB)
MAX_ROW_BYTES = 2**32
#: bytes of one shard, one batch or one queue (int64 with room for sums)
MAX_BYTES = 2**62
#: seconds of any timeout, budget or period (~115 days; threading's limit is far above)
MAX_SECONDS = 1e7
#: largest priority (initial or given): keeps priority ** alpha summed over a replay
#: finite in float64 for every priority_exponent <= 9.8 and capacity <= 2**40 (StorageConfig
#: refuses an exponent past the bound of its capacity)
MAX_PRIORITY = 1e30

DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)


def require(ok: bool, key: str, value: object, expected: str) -> None:
    """Raise :class:`ConfigError` naming ``key``, ``value`` and ``expected`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} must be {expected}, got {value!r}", key=key)


def finite(v: float) -> bool:
    """Whether ``v`` is a finite number."""
    return math.isfinite(v)


def itemsize(dtype: str) -> int:
    """Bytes of one element of a spec dtype name (one of :data:`DTYPES`)."""
    return int(np.dtype(dtype).itemsize)
