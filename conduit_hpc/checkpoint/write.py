"""Writing checkpoint files with ``h5py``: a buffer rank's shard file, the named-array
file (model, optimizer), the manifest with its virtual datasets, and :func:`finalize`
(rename into place, then ``DONE``). Reading them back is :mod:`.read`; the format is
described in :mod:`conduit_hpc.checkpoint`.

Every function here is local (no MPI, no collective) and blocks for its own disk I/O
(run it off a progress loop); every file is fsync'ed before it is recorded.
"""

from __future__ import annotations

import errno
import os
import re
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.checkpoint import files as _files
from conduit_hpc.checkpoint.files import (
    CHUNK_BYTES,
    COMPRESSED_CHUNK_BYTES,
    DONE,
    FILE_RE,
    FORMAT,
    LEARNER_FILE,
    MANIFEST,
    _crc,
    _fsync,
    _json,
    _rows_per_slab,
    _sha256,
    dataset_attrs,
    h5_filter,
    spec_to_json,
)
from conduit_hpc.errors import CheckpointError
from conduit_hpc.spec import Spec
from conduit_hpc.storage.snapshot import ShardSnapshot

__all__ = ["finalize", "write_arrays_file", "write_manifest", "write_shard_file"]


class _DirtyLimit:
    """Write dirty pages back every ``every_bytes`` while a file is being written.

    Letting a GB of dirty page cache pile up and flushing it at the end stalls the whole
    process (and its progress loop) for seconds when the kernel throttles writeback;
    ``fdatasync`` every 64 MB keeps the backlog, and the stalls, short.
    """

    def __init__(self, f: h5py.File, every_bytes: int = 64 << 20) -> None:
        self.f, self.every, self.pending = f, every_bytes, 0

    def wrote(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= self.every:
            self.pending = 0
            self.f.flush()
            os.fdatasync(self.f.id.get_vfd_handle())


#: room a checkpoint file needs beyond its arrays' bytes: HDF5's superblock and groups,
#: and per dataset its header, attributes and chunk index (~2 kB; twice that counted)
_HEADROOM_BYTES, _DATASET_BYTES = 16 << 10, 4 << 10


def _check_room(path: Path, raw_bytes: int, datasets: int) -> None:
    """Refuse a write that the file system has no room for before HDF5 starts it: HDF5
    meets a full disk where it flushes or closes a dataset, and a close that fails leaves
    a half-closed dataset that crashes the process (SIGSEGV) when the file or the library
    closes - a periodic checkpoint dropped on a full disk took its buffer rank down at
    exit. Compressed bytes are not counted (unknown before they are written); a quota
    is not seen. Local.

    Raises:
        OSError: ENOSPC.
    """
    st = os.statvfs(path.parent)
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    need = raw_bytes + raw_bytes // 50 + _HEADROOM_BYTES + datasets * _DATASET_BYTES
    if need > free:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


@contextmanager
def _h5_create(path: Path, raw_bytes: int = 0, datasets: int = 0) -> Iterator[h5py.File]:
    """A new HDF5 file for the ``with`` block (room for ``raw_bytes`` of uncompressed
    arrays in ``datasets`` checked first), closed after it; when the block or the close
    fails, the file is given up clean (:func:`_abandon`)."""
    if datasets:
        _check_room(path, raw_bytes, datasets)
    f = h5py.File(path, "w", libver="latest")
    try:
        yield f
        f.close()  # its last flush may fail too (a full disk)
    except BaseException:
        _abandon(f, path)
        raise


def _abandon(f: h5py.File, path: Path) -> None:
    """Close a file whose write failed (it is removed with its checkpoint): HDF5 flushes
    dirty metadata when the file and its datasets close, and on a full disk that fails
    again, leaving IDs open that crashed the process when HDF5 shut down at its exit
    (SIGSEGV in H5D_close, after a periodic checkpoint dropped on a full disk). The
    file's bytes are given back first (truncated to 0), so the close has room."""
    with suppress(OSError):
        os.truncate(path, 0)
    with suppress(Exception):
        f.close()


def _set_attrs(obj: h5py.HLObject, attrs: Mapping[str, Any] | None) -> None:
    for k, v in (attrs or {}).items():
        obj.attrs[str(k)] = v


def _write_dataset(group: h5py.Group, name: str, arr: np.ndarray, chunk_bytes: int,
                   limit: _DirtyLimit | None = None,
                   attrs: Mapping[str, Any] | None = None, codec: str = "none") -> str:
    """Create a dataset (with ``attrs``), write it in slabs, return its checksum (CRC-32
    of the uncompressed bytes). ``codec`` other than ``"none"``: a chunked dataset
    through that HDF5 filter (chunks of about :data:`COMPRESSED_CHUNK_BYTES`, slabs of
    whole chunks, so no chunk is compressed twice), its name in the ``compression``
    attribute; else contiguous."""
    a = np.ascontiguousarray(arr)
    chunk_rows = 0
    if codec != "none" and a.ndim and len(a):
        chunk_rows = min(len(a), _rows_per_slab(a, COMPRESSED_CHUNK_BYTES))
        ds = group.create_dataset(name, shape=a.shape, dtype=a.dtype,
                                  chunks=(chunk_rows, *a.shape[1:]), **h5_filter(codec))
        ds.attrs["compression"] = codec
    else:
        ds = group.create_dataset(name, shape=a.shape, dtype=a.dtype)
    _set_attrs(ds, attrs)
    crc = 0
    if a.ndim == 0:
        ds[()] = a
        crc = zlib.crc32(a.tobytes())
    elif len(a):
        step = _rows_per_slab(a, chunk_bytes)
        if chunk_rows:
            step = max(chunk_rows, step // chunk_rows * chunk_rows)
        for i in range(0, len(a), step):
            piece = a[i:i + step]
            ds[i:i + len(piece)] = piece
            crc = _crc(piece, crc)
            if limit is not None:
                limit.wrote(piece.nbytes)
    value = f"crc32:{crc:08x}"
    ds.attrs["checksum"] = value
    # before ds is let go: HDF5 writes what it buffered when a dataset closes, and a
    # failure there (a full disk) is only printed ('Exception ignored in __dealloc__')
    # and leaves a half-closed dataset that crashes the file's close (SIGSEGV); a flush
    # raises it here instead, with ds still open
    group.file.flush()
    return value


def write_shard_file(path: Path, snapshots: Sequence[ShardSnapshot], *,
                     attrs: Mapping[str, Any] | None = None,
                     chunk_bytes: int = CHUNK_BYTES,
                     described: Mapping[str, Mapping[str, Any]] | None = None,
                     compression: Mapping[str, str] | None = None
                     ) -> dict[str, Any]:
    """Write the snapshots of one buffer rank's shards into ``path`` and fsync it.

    Local; blocks for the disk write (run it off the progress loop). The snapshots'
    arrays are only read. ``described`` gives each dataset's attributes by its path in
    a shard group (:func:`~conduit_hpc.checkpoint.files.dataset_attrs`);
    ``compression`` the codec of each stored column by name (``"none"`` for the
    others; see :func:`~conduit_hpc.checkpoint.files.h5_filter`). The checksums are of
    the uncompressed bytes, so a damaged compressed block is refused on read either by
    the filter or by the checksum.

    Returns:
        dict: the file record (``name``, ``bytes``, ``datasets``: path -> checksum) and
        ``shards``: one record per shard (cursors, counters, rows) for the manifest.

    Raises:
        CheckpointError: the file cannot be written (names it and the OS reason).
    """
    datasets: dict[str, str] = {}
    shards = []
    try:
        plain = sum(a.nbytes for sn in snapshots for a in (
            sn.seqs, sn.priority, sn.init_priority, *(c for name, c in sn.columns.items()
                                                   if (compression or {}).get(name, "none")
                                                   == "none")))
        with _h5_create(path, plain, sum(3 + len(sn.columns) for sn in snapshots)) as f:
            limit = _DirtyLimit(f)
            f.attrs["format"] = FORMAT
            f.attrs["schema_version"] = _files.SCHEMA_VERSION
            for k, v in (attrs or {}).items():
                f.attrs[k] = v
            for s in snapshots:
                g = f.create_group(f"shards/{s.shard_id}")
                meta = {"shard_id": s.shard_id, "capacity": s.capacity, "commit": s.commit,
                        "reserve": s.reserve, "rows": s.rows,
                        "max_priority": s.max_priority,
                        "applied_updates": s.applied_updates,
                        "dropped_updates": s.dropped_updates}
                for k, v in meta.items():
                    g.attrs[k] = v
                for name, arr in (("seq", s.seqs), ("priority", s.priority),
                                  ("init_priority", s.init_priority)):
                    datasets[f"{g.name}/{name}"] = _write_dataset(
                        g, name, arr, chunk_bytes, limit, (described or {}).get(name))
                cols = g.create_group("columns")
                for name, arr in s.columns.items():
                    datasets[f"{cols.name}/{name}"] = _write_dataset(
                        cols, name, arr, chunk_bytes, limit,
                        (described or {}).get(f"columns/{name}"),
                        (compression or {}).get(name, "none"))
                shards.append({**meta, "file": path.name})
        _fsync(path)
    except WRITE_ERRORS as err:
        raise CheckpointError(f"cannot write checkpoint file {path}: {os_reason(err)}") from err
    return {"file": {"name": path.name, "bytes": path.stat().st_size,
                     "datasets": datasets}, "shards": shards}


#: what a write raises when the disk fails it: an OSError, or - where HDF5 meets the
#: failure while it flushes or closes the file (ENOSPC half-way through a part) - a
#: RuntimeError whose text carries the OS's ``errno = N``
WRITE_ERRORS = (OSError, RuntimeError)


def os_reason(err: BaseException) -> str:
    """An OS error in one line: ``[Errno 28] No space left on device``. HDF5's own
    message runs over several lines with a time stamp, a buffer address and offsets
    (an h5py RuntimeError: its ``errno = N`` is read from the text)."""
    code = getattr(err, "errno", None)
    if not code and (m := re.search(r"errno = (\d+)", str(err))):
        code = int(m.group(1))
    if code:
        return f"[Errno {code}] {os.strerror(code)}"
    return " ".join(str(err).split())


def _check_array_name(name: str) -> str:
    parts = name.split("/")
    if not name or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"array name {name!r} must be '/'-separated non-empty parts "
                              f"other than '.' and '..'")
    return name


def write_arrays_file(path: Path, arrays: Mapping[str, Any],
                      attrs: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Write named numeric arrays (model, optimizer, any extra state) to ``path``.

    Names may contain ``/`` (``model/fc1.weight``); values are numpy arrays or
    scalars of a numeric or bool dtype (convert tensors with ``.cpu().numpy()``).
    ``attrs`` gives arrays their HDF5 attributes by name (``{"model/fc1.weight":
    {"description": ...}}``; strings, numbers and bools); a name not in ``arrays`` is
    refused.

    Returns:
        dict: the file record (``name``, ``bytes``, ``datasets``).

    Raises:
        CheckpointError: a bad name, a non-numeric value, or the OS refused the write.
    """
    datasets: dict[str, str] = {}
    clean = {}
    for name, value in arrays.items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise CheckpointError(f"extra state {name!r} has dtype {arr.dtype}; only "
                                  f"numeric and bool arrays are stored (no pickles)")
        clean[_check_array_name(str(name))] = arr
    stray = sorted(set(attrs or {}) - set(clean))
    if stray:
        raise CheckpointError(f"attributes given for arrays that are not stored: {stray}")
    try:
        with _h5_create(path, sum(a.nbytes for a in clean.values()), len(clean)) as f:
            limit = _DirtyLimit(f)
            f.attrs["format"] = FORMAT
            f.attrs["schema_version"] = _files.SCHEMA_VERSION
            g = f.create_group("arrays")
            for name, arr in clean.items():
                datasets[f"/arrays/{name}"] = _write_dataset(g, name, arr, CHUNK_BYTES,
                                                             limit, (attrs or {}).get(name))
        _fsync(path)
    except WRITE_ERRORS as err:
        raise CheckpointError(f"cannot write checkpoint file {path}: {os_reason(err)}") from err
    return {"name": path.name, "bytes": path.stat().st_size, "datasets": datasets}


def write_manifest(directory: Path, *, seq: int, spec: Spec, config_toml: str,
                   layout: Mapping[str, Any], placement: Mapping[str, Any],
                   parts: Sequence[Mapping[str, Any]],
                   created_unix: float | None = None,
                   alpha: float | None = None) -> dict[str, Any]:
    """Write ``manifest.h5`` into ``directory`` from every rank's part.

    Args:
        directory (Path): the (temporary) checkpoint directory holding the other files.
        seq (int): checkpoint number.
        spec (Spec): the experience spec.
        config_toml (str): the job's config as TOML text.
        layout (Mapping): world size and the ranks of each role.
        placement (Mapping): shards (owner, tier, capacity), actor and learner shards.
        parts (Sequence[Mapping]): one per contributing rank: ``world_rank``, ``role``,
            ``rng`` (JSON text or None), ``counters`` (name -> number), ``files`` (file
            records) and ``shards`` (shard records).
        created_unix (float | None): timestamp (default: now).
        alpha (float | None): the priority exponent, an attribute of ``/index/priority``.

    Every dataset carries ``description`` and ``units`` attributes
    (:func:`~conduit_hpc.checkpoint.files.dataset_attrs`); ``/learner`` and ``/weights``
    are external links to ``learner.h5``'s ``/arrays`` when it exists, so that
    ``h5py.File(manifest)["weights/online/..."]`` reads a network parameter.

    Returns:
        dict: ``files`` (name -> bytes, the manifest included) for ``DONE``.

    Raises:
        CheckpointError: inconsistent parts (a shard missing or twice) or an OS error.
    """
    created = time.time() if created_unix is None else created_unix
    files: dict[str, Mapping[str, Any]] = {}
    shard_recs: dict[int, Mapping[str, Any]] = {}
    for p in parts:
        for fr in p.get("files", ()):
            if not FILE_RE.match(fr["name"]) or fr["name"] in files or fr["name"] == MANIFEST:
                raise CheckpointError(f"{directory}: bad or duplicate file name "
                                      f"{fr['name']!r} from rank {p['world_rank']}")
            files[fr["name"]] = fr
        for s in p.get("shards", ()):
            if int(s["shard_id"]) in shard_recs:
                raise CheckpointError(f"{directory}: shard {s['shard_id']} written twice")
            shard_recs[int(s["shard_id"])] = s
    nshards = len(placement["shards"])
    if sorted(shard_recs) != list(range(nshards)):
        raise CheckpointError(f"{directory}: parts hold shards {sorted(shard_recs)}, the "
                              f"placement has {nshards}")
    shards = [shard_recs[i] for i in range(nshards)]
    path = directory / MANIFEST
    try:
        with _h5_create(path) as f:
            a = f.attrs
            a["format"] = FORMAT
            a["schema_version"] = _files.SCHEMA_VERSION
            a["seq"] = seq
            a["created_unix"] = created
            a["world_size"] = int(layout["world_size"])
            a["shards"] = nshards
            a["rows"] = int(sum(int(s["rows"]) for s in shards))
            m = f.create_group("meta")
            m["spec"] = _json(spec_to_json(spec))
            m["config_toml"] = config_toml
            m["layout"] = _json(layout)
            m["placement"] = _json(placement)
            m["files"] = _json(files)
            m["shards"] = _json(shards)
            t = f.create_group("shards")
            for key, dt in (("shard_id", np.int64), ("capacity", np.int64),
                            ("commit", np.int64), ("rows", np.int64),
                            ("max_priority", np.float64)):
                t[key] = np.asarray([s[key] for s in shards], dtype=dt)
            t["owner_rank"] = np.asarray([placement["shards"][i]["owner_rank"]
                                          for i in range(nshards)], dtype=np.int64)
            for key, (text, units) in _SHARD_TABLE.items():
                _set_attrs(t[key], {"description": text, "units": units})
            rng = f.create_group("rng")
            sampler = f.create_group("sampler")  # schema 2 (absent in schema 1)
            counters = f.create_group("counters")
            for p in sorted(parts, key=lambda p: int(p["world_rank"])):
                r = str(int(p["world_rank"]))
                if p.get("rng"):
                    rng[r] = str(p["rng"])
                if p.get("sampler"):
                    sampler[r] = _json(p["sampler"])
                c = counters.create_group(r)
                c.attrs["role"] = str(p.get("role", ""))
                for k, v in (p.get("counters") or {}).items():
                    c.attrs[str(k)] = v
            _virtual_datasets(f, spec, shards, dataset_attrs(spec, alpha))
            if LEARNER_FILE in files:
                f["learner"] = h5py.ExternalLink(LEARNER_FILE, "/arrays")
                f["weights"] = h5py.ExternalLink(LEARNER_FILE, "/arrays")
        _fsync(path)
    except WRITE_ERRORS as err:
        raise CheckpointError(f"cannot write checkpoint manifest {path}: "
                              f"{os_reason(err)}") from err
    sizes = {name: int(fr["bytes"]) for name, fr in files.items()}
    sizes[MANIFEST] = path.stat().st_size
    return {"files": sizes, "created_unix": created, "seq": seq}


_SHARD_TABLE = {
    "shard_id": ("global shard number (one entry per shard)", ""),
    "capacity": ("ring slots of the shard", "rows"),
    "commit": ("commit cursor at the cut: every row held has seq < commit", "rows"),
    "rows": ("rows the shard held at the cut", "rows"),
    "max_priority": ("the shard's running maximum priority (raw, alpha not applied): "
                     "what a row inserted without a priority gets", ""),
    "owner_rank": ("world rank that held the shard's memory", ""),
}


def _virtual_datasets(f: h5py.File, spec: Spec, shards: Sequence[Mapping[str, Any]],
                      described: Mapping[str, Mapping[str, Any]]) -> None:
    total = int(sum(int(s["rows"]) for s in shards))
    exp = f.create_group("experience")
    idx = f.create_group("index")
    targets: list[tuple[h5py.Group, str, np.dtype, tuple[int, ...], str]] = [
        (exp, fl.name, fl.dtype, fl.shape, f"columns/{fl.name}") for fl in spec]
    targets += [(idx, "priority", np.dtype(np.float64), (), "priority"),
                (idx, "seq", np.dtype(np.int64), (), "seq")]
    for group, name, dtype, shape, src in targets:
        if total == 0:
            ds = group.create_dataset(name, shape=(0, *shape), dtype=dtype)
            _set_attrs(ds, described.get(src))
            continue
        lay = h5py.VirtualLayout(shape=(total, *shape), dtype=dtype)
        off = 0
        for s in shards:
            n = int(s["rows"])
            if n:
                lay[off:off + n] = h5py.VirtualSource(
                    s["file"], f"/shards/{s['shard_id']}/{src}", shape=(n, *shape))
            off += n
        ds = group.create_virtual_dataset(name, lay)
        _set_attrs(ds, described.get(src))
    # which shard each global row came from (a real dataset: small)
    idx["shard"] = np.repeat(np.asarray([int(s["shard_id"]) for s in shards], np.int64),
                             [int(s["rows"]) for s in shards])
    _set_attrs(idx["shard"], described.get("shard"))


def finalize(tmp_dir: Path, final_dir: Path, manifest_record: Mapping[str, Any]) -> None:
    """Rename a fully written temporary directory into place, then write ``DONE``.

    A crash before the rename leaves a ``.tmp-*`` directory; after it, a directory
    without ``DONE``; both are refused by :func:`open_checkpoint`. Blocks for fsyncs.

    Raises:
        CheckpointError: the destination exists or the OS refused.
    """
    if final_dir.exists():
        raise CheckpointError(f"cannot finalize checkpoint {final_dir}: it already exists")
    try:
        digest = _sha256(tmp_dir / MANIFEST)
        tmp_dir.rename(final_dir)
        _fsync(final_dir.parent)
        done = {"format": FORMAT, "schema_version": _files.SCHEMA_VERSION,
                "seq": int(manifest_record["seq"]),
                "created_unix": float(manifest_record["created_unix"]),
                "manifest_sha256": digest, "files": dict(manifest_record["files"])}
        tmp_done = final_dir / (DONE + ".partial")
        tmp_done.write_text(jsontext.dumps(done, indent=1, sort_keys=True) + "\n")
        _fsync(tmp_done)
        tmp_done.rename(final_dir / DONE)
        _fsync(final_dir)
    except OSError as err:
        raise CheckpointError(f"cannot finalize checkpoint {final_dir}: {err}") from err
