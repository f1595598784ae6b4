"""Reading one dataset of a checkpoint file with its checks: its header against what the
manifest and the spec expect (shape, dtype, a size its file can hold) before anything is
allocated, then its bytes in slabs against their CRC-32. Used by :mod:`.read`.

Local (no MPI); blocks for the file's reads. Numeric arrays only: nothing is unpickled.
"""

from __future__ import annotations

import math
import zlib

import h5py
import numpy as np

from conduit_hpc.checkpoint.files import CHUNK_BYTES, _crc, _rows_per_slab
from conduit_hpc.errors import CheckpointError

__all__ = ["SHARD_DTYPES", "check_shape", "read_verified"]

#: the dtype of a shard's own datasets (its columns' are the spec's)
SHARD_DTYPES = {"seq": "<i8", "priority": "<f8", "init_priority": "<f8"}
#: DEFLATE's largest compression ratio is about 1032:1 (LZF's far less): a compressed
#: dataset that claims more bytes than this many times its file's is damaged
_MAX_RATIO = 1100


def check_shape(ds: h5py.Dataset, expect: tuple[tuple[int, ...], np.dtype] | None,
                where: str, file_bytes: int) -> None:
    """Refuse a dataset whose header disagrees with the manifest before it is read:
    another shape or dtype than ``expect`` (a shard's dataset), or - any dataset - more
    bytes than its file (uncompressed) or than any codec packs into it.

    Raises:
        CheckpointError: naming the dataset, what it says and what was expected.
    """
    if expect is not None:
        shape, dtype = expect
        if ds.shape != shape or ds.dtype != dtype:
            raise CheckpointError(f"{where}: dataset {ds.name} has shape {ds.shape} and "
                                  f"dtype {ds.dtype}; the manifest and the spec expect "
                                  f"shape {shape} and dtype {dtype}; the file is damaged "
                                  f"or not this checkpoint's")
    bound = file_bytes * (_MAX_RATIO if ds.compression else 1)
    claimed = 0 if ds.shape is None else ds.dtype.itemsize * math.prod(ds.shape)
    if file_bytes and claimed > bound:
        raise CheckpointError(f"{where}: dataset {ds.name} claims shape {ds.shape} of "
                              f"{ds.dtype} ({claimed:,} bytes) in a file of {file_bytes:,} bytes"
                              f"{' (compressed)' if ds.compression else ''}; expected at "
                              f"most {bound:,}: the header is damaged")


def read_verified(ds: h5py.Dataset, expected: str | None, where: str,
                  chunk_bytes: int = CHUNK_BYTES, out: np.ndarray | None = None) -> np.ndarray:
    """Read a whole dataset in slabs (into ``out`` if given, of the right shape and
    dtype), checking its CRC-32 against ``expected``."""
    if ds.dtype.kind not in "biuf":
        raise CheckpointError(f"{where}: dataset {ds.name} has dtype {ds.dtype}, expected a "
                              f"numeric array")
    if out is None or out.shape != ds.shape or out.dtype != ds.dtype:
        out = np.empty(ds.shape, dtype=ds.dtype)
    crc = 0
    if out.ndim == 0:
        out[()] = ds[()]
        crc = zlib.crc32(out.tobytes())
    elif len(out):
        step = _rows_per_slab(out, chunk_bytes)
        for i in range(0, len(out), step):
            piece = out[i:i + step]
            ds.read_direct(piece, np.s_[i:i + len(piece)])
            crc = _crc(piece, crc)
    got = f"crc32:{crc:08x}"
    if expected is not None and got != expected:
        raise CheckpointError(f"{where}: dataset {ds.name} fails its checksum (stored "
                              f"{expected}, read {got}); the file is corrupted")
    return out
