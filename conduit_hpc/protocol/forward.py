"""The long-haul forward message (``Tag.FORWARD``): rows the edge buffer hands across
the link to the cloud buffer, with the priorities they crossed with. Plain numpy; no MPI.

Layout: int64 ``[first_seq, rows, flags]``, float64 ``priorities[rows]``, then the rows
packed in spec order (:func:`~conduit_hpc.protocol.messages.pack_rows`). No pickle.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conduit_hpc.protocol.messages import pack_rows, unpack_rows
from conduit_hpc.spec import Spec

__all__ = ["FORWARD_HEAD", "F_END", "forward_message_bytes", "pack_forward", "unpack_forward"]

# forward messages: int64 [first_seq, rows, flags], float64 priorities[rows], packed rows
FORWARD_HEAD = 24
F_END = 1  # flag: the edge buffer will forward nothing more


def forward_message_bytes(spec: Spec, rows: int) -> int:
    """Bytes of a forward message of ``rows`` rows."""
    return FORWARD_HEAD + 8 * rows + spec.row_bytes * rows


def pack_forward(spec: Spec, first_seq: int, priorities: np.ndarray,
                 columns: Mapping[str, np.ndarray], flags: int = 0) -> np.ndarray:
    """A forward message: header, the rows' priorities, the rows (no pickle)."""
    head = np.array([first_seq, len(priorities), flags], dtype=np.int64)
    parts = [head.view(np.uint8), np.ascontiguousarray(priorities, np.float64).view(np.uint8)]
    if len(priorities):
        parts.append(pack_rows(spec, columns))
    return np.concatenate(parts)


def unpack_forward(spec: Spec, payload: np.ndarray
                   ) -> tuple[int, int, np.ndarray, dict[str, np.ndarray]]:
    """``(first_seq, flags, priorities, columns)`` of a forward message (views)."""
    head = payload[:FORWARD_HEAD].view(np.int64)
    n = int(head[1])
    prio = payload[FORWARD_HEAD:FORWARD_HEAD + 8 * n].view(np.float64)
    cols = unpack_rows(spec, payload[FORWARD_HEAD + 8 * n:], n) if n else {}
    return int(head[0]), int(head[2]), prio, cols

