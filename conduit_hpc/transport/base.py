"""The transport seam: what storage may ask of a byte mover.

Storage code is written against :class:`Transport`; it never sees an ``MPI.Win``. A
transport never sees a shard, a row or a priority.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Transport"]


@runtime_checkable
class Transport(Protocol):
    """One-sided access to segments of memory owned by ranks.

    ``put``/``get`` are non-blocking until :meth:`flush`; atomics block for their result.
    """

    def put(self, target_rank: int, displacement: int, buffer: np.ndarray) -> None: ...

    def get(self, target_rank: int, displacement: int, buffer: np.ndarray) -> None: ...

    def get_blocks(self, target_rank: int, displacement: int, block_bytes: int,
                   offsets: np.ndarray, buffer: np.ndarray) -> None: ...

    def fetch_add(self, target_rank: int, displacement: int, value: int) -> int: ...

    def atomic_read(self, target_rank: int, displacement: int) -> int: ...

    def atomic_write(self, target_rank: int, displacement: int, value: int) -> None: ...

    def compare_and_swap(self, target_rank: int, displacement: int, compare: int,
                         value: int) -> int: ...

    def flush(self, target_rank: int | None = None) -> None: ...

    def progress(self) -> None: ...

    def sync(self) -> None: ...

    def local_view(self, rank: int) -> np.ndarray | None: ...

    def close(self) -> None: ...
