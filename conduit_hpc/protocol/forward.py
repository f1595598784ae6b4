"""The long-haul forward message (``Tag.FORWARD``): rows the edge buffer hands across
the link to the cloud buffer, with the priorities they crossed with. Plain numpy; no MPI.

Layout: int64 ``[first_seq, rows, flags]``, float64 ``priorities[rows]``, then the rows
packed in spec order (:func:`~conduit_hpc.protocol.messages.pack_rows`), compressed with
``zlib`` (level 1) when the flag :data:`F_ZLIB` is set (``[longhaul] compression``): the
header and the priorities stay plain, so what crosses is counted without decompressing.
No pickle.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np

from conduit_hpc.errors import TransportError
from conduit_hpc.protocol.messages import pack_rows, unpack_rows
from conduit_hpc.spec import Spec

__all__ = ["FORWARD_HEAD", "F_END", "F_ZLIB", "forward_head", "forward_message_bytes",
           "pack_forward", "unpack_forward"]

# forward messages: int64 [first_seq, rows, flags], float64 priorities[rows], packed rows
FORWARD_HEAD = 24
F_END = 1  # flag: the edge buffer will forward nothing more
F_ZLIB = 2  # flag: the packed rows are zlib-compressed
#: zlib level of compressed rows: 1 measured ~270 MB/s at a ratio of ~36-69 on Atari
#: rows (whole stacks) on this machine, level 6 half as fast for twice the ratio
ZLIB_LEVEL = 1


def forward_message_bytes(spec: Spec, rows: int) -> int:
    """Bytes of an uncompressed forward message of ``rows`` rows."""
    return FORWARD_HEAD + 8 * rows + spec.row_bytes * rows


def pack_forward(spec: Spec, first_seq: int, priorities: np.ndarray,
                 columns: Mapping[str, np.ndarray], flags: int = 0, *,
                 compress: bool = False) -> np.ndarray:
    """A forward message: header, the rows' priorities, the rows (no pickle); the rows
    zlib-compressed (flag :data:`F_ZLIB`) when ``compress``. Local; pure."""
    rows = pack_rows(spec, columns) if len(priorities) else None
    if rows is not None and compress:
        rows = np.frombuffer(zlib.compress(rows.data, ZLIB_LEVEL), np.uint8)
        flags |= F_ZLIB
    head = np.array([first_seq, len(priorities), flags], dtype=np.int64)
    parts = [head.view(np.uint8), np.ascontiguousarray(priorities, np.float64).view(np.uint8)]
    if rows is not None:
        parts.append(rows)
    return np.concatenate(parts)


def forward_head(payload: np.ndarray) -> tuple[int, int, np.ndarray]:
    """``(first_seq, flags, priorities)`` of a forward message (views; the rows are not
    read, nor decompressed). Local; pure."""
    head = payload[:FORWARD_HEAD].view(np.int64)
    n = int(head[1])
    return int(head[0]), int(head[2]), payload[FORWARD_HEAD:FORWARD_HEAD + 8 * n].view(
        np.float64)


def unpack_forward(spec: Spec, payload: np.ndarray
                   ) -> tuple[int, int, np.ndarray, dict[str, np.ndarray]]:
    """``(first_seq, flags, priorities, columns)`` of a forward message (views; fresh
    arrays for compressed rows). Local; pure.

    Raises:
        TransportError: compressed rows that do not decompress to the message's rows.
    """
    first, flags, prio = forward_head(payload)
    n = len(prio)
    body = payload[FORWARD_HEAD + 8 * n:]
    if n and flags & F_ZLIB:
        try:
            raw = zlib.decompress(body.data)
        except zlib.error as err:
            raise TransportError(f"forward message of rows {first} .. {first + n - 1}: the "
                                 f"compressed rows are damaged: {err}") from err
        if len(raw) != n * spec.row_bytes:
            raise TransportError(f"forward message of rows {first} .. {first + n - 1}: the "
                                 f"rows decompress to {len(raw)} bytes, expected "
                                 f"{n * spec.row_bytes}")
        body = np.frombuffer(raw, np.uint8)
    cols = unpack_rows(spec, body, n) if n else {}
    return first, flags, prio, cols

