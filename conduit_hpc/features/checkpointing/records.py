"""What a checkpoint agent keeps of the checkpoints of a run: the latest records, and
counts of them all (see :class:`Kept`). Plain Python."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import TypeVar

__all__ = ["RECORDS_KEEP", "Kept"]

#: checkpoints whose records (path, failure, cut and write time) an agent keeps: the
#: latest; every one is counted (they were all kept, and gathered and reported at the
#: job's end: a record a checkpoint, for as long as the job ran)
RECORDS_KEEP = 100

_T = TypeVar("_T")


class Kept(deque[_T]):
    """The latest ``maxlen`` items appended; :attr:`total` counts every one."""

    def __init__(self, items: Iterable[_T] = (), maxlen: int | None = None) -> None:
        super().__init__(items, maxlen)  # (deque's signature: copies and pickles alike)
        self.total = len(self)

    def append(self, item: _T) -> None:
        super().append(item)
        self.total += 1
