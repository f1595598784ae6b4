"""HDF5 experience checkpoints: the on-disk format (write, open, verify, inspect).

The only module that imports ``h5py``. Nothing here uses MPI: the collective protocol that
decides *when* and *who* writes lives in :mod:`conduit_hpc.checkpointing`.

A checkpoint is a directory ``ckpt-NNNNNN`` under a checkpoint root::

    ckpt-000007/
        buffer-0000.h5   one per buffer rank: /shards/<id>/{seq,priority,init_priority,
                         columns/<field>} with the cut's cursors and counters as attributes
        learner.h5       optional: /arrays/<name> (model and optimizer state, any rank's)
        manifest.h5      spec, config (TOML text), layout, placement, every rank's RNG state
                         and counters, a CRC-32 per dataset of every other file, and HDF5
                         virtual datasets: /experience/<field> (every shard's rows as one
                         global array), /index/{priority,shard,seq}; /learner links into
                         learner.h5
        DONE             JSON, written last: file sizes and the manifest's SHA-256

Files are written into ``.tmp-ckpt-NNNNNN-*`` and fsync'ed, the directory is renamed into
place, and ``DONE`` is written (and fsync'ed) last. A directory without ``DONE``, a file
shorter than recorded (truncated), a dataset whose checksum differs, a schema version from
the future or a checkpoint of a different spec is refused with a
:class:`~conduit_hpc.errors.CheckpointError` naming the file and the reason. Only numeric
arrays, strings and JSON are read back: no pickle is ever loaded, nothing is executed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .errors import CheckpointError
from .spec import Field, Spec
from .storage.snapshot import ShardSnapshot, SnapshotStaging

__all__ = [
    "DONE",
    "MANIFEST",
    "SCHEMA_VERSION",
    "Checkpoint",
    "ShardRecord",
    "checksum",
    "finalize",
    "format_report",
    "inspect_checkpoint",
    "list_checkpoints",
    "open_checkpoint",
    "prune",
    "rng_from_json",
    "rng_to_json",
    "spec_to_json",
    "write_arrays_file",
    "write_manifest",
    "write_shard_file",
]

SCHEMA_VERSION = 1
FORMAT = "conduit_hpc experience checkpoint"
MANIFEST = "manifest.h5"
DONE = "DONE"
LEARNER_FILE = "learner.h5"
TMP_PREFIX = ".tmp-"
_NAME = re.compile(r"^ckpt-(\d{6,})$")
_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.h5$")
CHUNK_BYTES = 8 << 20  # write/read/checksum in slabs of this size

# ---------------------------------------------------------------------------------
# small helpers


def checkpoint_name(seq: int) -> str:
    """Directory name of checkpoint number ``seq``."""
    return f"ckpt-{seq:06d}"


def seq_of(path: Path) -> int | None:
    """The checkpoint number in a directory name, or None."""
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def _rows_per_slab(arr: np.ndarray, chunk_bytes: int) -> int:
    row = max(1, int(arr.nbytes // max(len(arr), 1)))
    return max(1, chunk_bytes // row)


def _crc(piece: np.ndarray, crc: int) -> int:
    raw = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
    return zlib.crc32(raw.data, crc)


def checksum(arr: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> str:
    """CRC-32 of an array's bytes in C order, as ``"crc32:xxxxxxxx"``."""
    crc = 0
    a = np.ascontiguousarray(arr)
    if a.ndim == 0:
        return f"crc32:{zlib.crc32(a.tobytes()):08x}"
    step = _rows_per_slab(a, chunk_bytes)
    for i in range(0, len(a), step):
        crc = _crc(a[i:i + step], crc)
    return f"crc32:{crc:08x}"


def _write_dataset(group: h5py.Group, name: str, arr: np.ndarray, chunk_bytes: int) -> str:
    """Create a contiguous dataset, write it in slabs, return its checksum."""
    a = np.ascontiguousarray(arr)
    ds = group.create_dataset(name, shape=a.shape, dtype=a.dtype)
    crc = 0
    if a.ndim == 0:
        ds[()] = a
        crc = zlib.crc32(a.tobytes())
    elif len(a):
        step = _rows_per_slab(a, chunk_bytes)
        for i in range(0, len(a), step):
            piece = a[i:i + step]
            ds[i:i + len(piece)] = piece
            crc = _crc(piece, crc)
    value = f"crc32:{crc:08x}"
    ds.attrs["checksum"] = value
    return value


def _read_verified(ds: h5py.Dataset, expected: str | None, where: str,
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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _str(ds: h5py.Dataset) -> str:
    v = ds[()]
    return v.decode() if isinstance(v, bytes) else str(v)


def spec_to_json(spec: Spec) -> list[dict[str, Any]]:
    """The spec as plain JSON: name, dtype (numpy ``str``), shape, allow_nan per field."""
    return [{"name": f.name, "dtype": f.dtype.str, "shape": list(f.shape),
             "allow_nan": f.allow_nan} for f in spec]


def spec_from_json(fields: Sequence[Mapping[str, Any]]) -> Spec:
    """Inverse of :func:`spec_to_json` (only numeric dtypes are accepted)."""
    out = []
    for f in fields:
        dt = np.dtype(str(f["dtype"]))
        if dt.kind not in "biuf":
            raise ValueError(f"field {f['name']!r} has non-numeric dtype {dt}")
        out.append(Field(str(f["name"]), dt, tuple(int(d) for d in f["shape"]),
                         bool(f["allow_nan"])))
    return Spec(out)


# ---------------------------------------------------------------------------------
# RNG states as JSON (no pickle)

_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")


def rng_to_json(gen: np.random.Generator) -> str:
    """The state of a numpy ``Generator`` as JSON text."""
    state = gen.bit_generator.state

    def plain(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return {"__array__": v.dtype.str, "data": v.tolist()}
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, np.integer):
            return int(v)
        return v

    return _json(plain(state))


def rng_from_json(text: str) -> np.random.Generator:
    """A numpy ``Generator`` in the state :func:`rng_to_json` wrote.

    Raises:
        CheckpointError: not JSON, or a bit generator that is not one of numpy's.
    """
    try:
        state = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"RNG state is not valid JSON: {err}") from err

    def arrays(v: Any) -> Any:
        if isinstance(v, dict) and "__array__" in v:
            return np.asarray(v["data"], dtype=np.dtype(v["__array__"]))
        if isinstance(v, dict):
            return {k: arrays(x) for k, x in v.items()}
        return v

    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in _BIT_GENERATORS:
        raise CheckpointError(f"RNG state names bit generator {name!r}; expected one of "
                              f"{', '.join(_BIT_GENERATORS)}")
    bg = getattr(np.random, name)()
    bg.state = arrays(state)
    return np.random.Generator(bg)


# ---------------------------------------------------------------------------------
# writing


def write_shard_file(path: Path, snapshots: Sequence[ShardSnapshot], *,
                     attrs: Mapping[str, Any] | None = None,
                     chunk_bytes: int = CHUNK_BYTES) -> dict[str, Any]:
    """Write the snapshots of one buffer rank's shards into ``path`` and fsync it.

    Local; blocks for the disk write (run it off the progress loop). The snapshots'
    arrays are only read.

    Returns:
        dict: the file record (``name``, ``bytes``, ``datasets``: path -> checksum) and
        ``shards``: one record per shard (cursors, counters, rows) for the manifest.

    Raises:
        CheckpointError: the file cannot be written (names it and the OS reason).
    """
    datasets: dict[str, str] = {}
    shards = []
    try:
        with h5py.File(path, "w", libver="latest") as f:
            f.attrs["format"] = FORMAT
            f.attrs["schema_version"] = SCHEMA_VERSION
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
                    datasets[f"{g.name}/{name}"] = _write_dataset(g, name, arr, chunk_bytes)
                cols = g.create_group("columns")
                for name, arr in s.columns.items():
                    datasets[f"{cols.name}/{name}"] = _write_dataset(cols, name, arr,
                                                                     chunk_bytes)
                shards.append({**meta, "file": path.name})
        _fsync(path)
    except OSError as err:
        raise CheckpointError(f"cannot write checkpoint file {path}: {err}") from err
    return {"file": {"name": path.name, "bytes": path.stat().st_size,
                     "datasets": datasets}, "shards": shards}


def _check_array_name(name: str) -> str:
    parts = name.split("/")
    if not name or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"array name {name!r} must be '/'-separated non-empty parts "
                              f"other than '.' and '..'")
    return name


def write_arrays_file(path: Path, arrays: Mapping[str, Any]) -> dict[str, Any]:
    """Write named numeric arrays (model, optimizer, any extra state) to ``path``.

    Names may contain ``/`` (``model/fc1.weight``); values are numpy arrays or
    scalars of a numeric or bool dtype (convert tensors with ``.cpu().numpy()``).

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
    try:
        with h5py.File(path, "w", libver="latest") as f:
            f.attrs["format"] = FORMAT
            f.attrs["schema_version"] = SCHEMA_VERSION
            g = f.create_group("arrays")
            for name, arr in clean.items():
                datasets[f"/arrays/{name}"] = _write_dataset(g, name, arr, CHUNK_BYTES)
        _fsync(path)
    except OSError as err:
        raise CheckpointError(f"cannot write checkpoint file {path}: {err}") from err
    return {"name": path.name, "bytes": path.stat().st_size, "datasets": datasets}


def write_manifest(directory: Path, *, seq: int, spec: Spec, config_toml: str,
                   layout: Mapping[str, Any], placement: Mapping[str, Any],
                   parts: Sequence[Mapping[str, Any]],
                   created_unix: float | None = None) -> dict[str, Any]:
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
            if not _FILE.match(fr["name"]) or fr["name"] in files or fr["name"] == MANIFEST:
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
        with h5py.File(path, "w", libver="latest") as f:
            a = f.attrs
            a["format"] = FORMAT
            a["schema_version"] = SCHEMA_VERSION
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
            rng = f.create_group("rng")
            counters = f.create_group("counters")
            for p in sorted(parts, key=lambda p: int(p["world_rank"])):
                r = str(int(p["world_rank"]))
                if p.get("rng"):
                    rng[r] = str(p["rng"])
                c = counters.create_group(r)
                c.attrs["role"] = str(p.get("role", ""))
                for k, v in (p.get("counters") or {}).items():
                    c.attrs[str(k)] = v
            _virtual_datasets(f, spec, shards)
            if LEARNER_FILE in files:
                f["learner"] = h5py.ExternalLink(LEARNER_FILE, "/arrays")
        _fsync(path)
    except OSError as err:
        raise CheckpointError(f"cannot write checkpoint manifest {path}: {err}") from err
    sizes = {name: int(fr["bytes"]) for name, fr in files.items()}
    sizes[MANIFEST] = path.stat().st_size
    return {"files": sizes, "created_unix": created, "seq": seq}


def _virtual_datasets(f: h5py.File, spec: Spec, shards: Sequence[Mapping[str, Any]]) -> None:
    total = int(sum(int(s["rows"]) for s in shards))
    exp = f.create_group("experience")
    idx = f.create_group("index")
    targets: list[tuple[h5py.Group, str, np.dtype, tuple[int, ...], str]] = [
        (exp, fl.name, fl.dtype, fl.shape, f"columns/{fl.name}") for fl in spec]
    targets += [(idx, "priority", np.dtype(np.float64), (), "priority"),
                (idx, "seq", np.dtype(np.int64), (), "seq")]
    for group, name, dtype, shape, src in targets:
        if total == 0:
            group.create_dataset(name, shape=(0, *shape), dtype=dtype)
            continue
        lay = h5py.VirtualLayout(shape=(total, *shape), dtype=dtype)
        off = 0
        for s in shards:
            n = int(s["rows"])
            if n:
                lay[off:off + n] = h5py.VirtualSource(
                    s["file"], f"/shards/{s['shard_id']}/{src}", shape=(n, *shape))
            off += n
        group.create_virtual_dataset(name, lay)
    # which shard each global row came from (a real dataset: small)
    idx["shard"] = np.repeat(np.asarray([int(s["shard_id"]) for s in shards], np.int64),
                             [int(s["rows"]) for s in shards])


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
        done = {"format": FORMAT, "schema_version": SCHEMA_VERSION,
                "seq": int(manifest_record["seq"]),
                "created_unix": float(manifest_record["created_unix"]),
                "manifest_sha256": digest, "files": dict(manifest_record["files"])}
        tmp_done = final_dir / (DONE + ".partial")
        tmp_done.write_text(json.dumps(done, indent=1, sort_keys=True) + "\n")
        _fsync(tmp_done)
        tmp_done.rename(final_dir / DONE)
        _fsync(final_dir)
    except OSError as err:
        raise CheckpointError(f"cannot finalize checkpoint {final_dir}: {err}") from err


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------
# finding, pruning


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories (complete or not, ``.tmp-*`` excluded) under ``root``,
    oldest first by number."""
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if p.is_dir() and (s := seq_of(p)) is not None]
    return [p for _, p in sorted(found)]


def is_complete(path: Path) -> bool:
    """Whether ``path`` has its ``DONE`` marker (nothing else is checked)."""
    return (path / DONE).is_file()


def done_record(path: Path) -> dict[str, Any]:
    """The parsed ``DONE`` marker.

    Raises:
        CheckpointError: missing or not valid JSON.
    """
    f = path / DONE
    if not f.is_file():
        raise CheckpointError(f"checkpoint {path}: no {DONE} marker; it was not completely "
                              f"written (the job stopped while writing it)")
    try:
        rec = json.loads(f.read_text())
        _ = (int(rec["seq"]), float(rec["created_unix"]), dict(rec["files"]))
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path}: {DONE} marker is damaged: {err}") from err
    return rec


def newest_first(roots: Iterable[Path]) -> list[Path]:
    """Every checkpoint directory under ``roots``, newest first (by the time in ``DONE``,
    then by number; incomplete ones by their number, after complete ones of the same
    root with a higher number)."""
    found: list[tuple[float, int, str, Path]] = []
    for root in roots:
        for p in list_checkpoints(root):
            try:
                t = float(done_record(p)["created_unix"])
            except CheckpointError:
                t = p.stat().st_mtime
            found.append((t, seq_of(p) or 0, str(p), p))
    return [p for *_, p in sorted(found, reverse=True)]


def next_seq(root: Path, at_least: int = 1) -> int:
    """A checkpoint number not used under ``root`` (temporary directories included)."""
    used = [s for p in list_checkpoints(root) if (s := seq_of(p)) is not None]
    if root.is_dir():
        for p in root.glob(TMP_PREFIX + "ckpt-*"):
            m = re.match(r"^\.tmp-ckpt-(\d+)", p.name)
            if m:
                used.append(int(m.group(1)))
    return max([at_least - 1, *used]) + 1


def prune(root: Path, keep: int, *, in_flight: Iterable[Path] = ()) -> list[Path]:
    """Keep the ``keep`` newest complete checkpoints under ``root``; remove older ones,
    incomplete ones older than the newest complete one, and temporary directories not in
    flight. Local; blocks for the deletes.

    Returns:
        list[Path]: what was removed.
    """
    busy = {Path(p).resolve() for p in in_flight}
    all_ = list_checkpoints(root)
    complete = [p for p in all_ if is_complete(p)]
    removed = []
    doomed = complete[:-keep] if keep > 0 else []
    if complete:
        newest = seq_of(complete[-1]) or 0
        doomed += [p for p in all_ if not is_complete(p) and (seq_of(p) or 0) < newest]
    if root.is_dir():
        doomed += [p for p in root.glob(TMP_PREFIX + "ckpt-*") if p.resolve() not in busy]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


# ---------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class ShardRecord:
    """What the manifest says about one shard."""

    shard_id: int
    capacity: int
    commit: int
    rows: int
    max_priority: float
    applied_updates: int
    dropped_updates: int
    reserve: int
    file: str


@dataclass(eq=False)
class Checkpoint:
    """A complete checkpoint, opened and checked (see :func:`open_checkpoint`).

    Reading methods are local and block for the disk; each checks the CRC-32 of every
    dataset it reads.

    Attributes:
        path (Path): the checkpoint directory.
        seq (int): checkpoint number.
        created_unix (float): when it was written.
        schema_version (int): on-disk schema.
        spec (Spec): the experience spec it holds.
        config_toml (str): the job's config as TOML.
        layout (dict), placement (dict): as written.
        shards (list[ShardRecord]): by shard id.
        files (dict[str, dict]): file records (bytes, dataset checksums).
        counters (dict[int, dict]): world rank -> counters (``role`` included).
        rng (dict[int, str]): world rank -> RNG state (JSON).
    """

    path: Path
    seq: int
    created_unix: float
    schema_version: int
    spec: Spec
    config_toml: str
    layout: dict[str, Any]
    placement: dict[str, Any]
    shards: list[ShardRecord]
    files: dict[str, dict[str, Any]]
    counters: dict[int, dict[str, Any]] = field(default_factory=dict)
    rng: dict[int, str] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def capacities(self) -> list[int]:
        return [s.capacity for s in self.shards]

    def _file(self, name: str) -> h5py.File:
        p = self.path / name
        try:
            return h5py.File(p, "r")
        except OSError as err:
            raise CheckpointError(f"checkpoint file {p} cannot be opened: {err}") from err

    def _dataset(self, f: h5py.File, name: str, path: str,
                 out: np.ndarray | None = None) -> np.ndarray:
        where = str(self.path / name)
        if path not in f:
            raise CheckpointError(f"{where}: dataset {path} is missing")
        obj = f[path]
        if not isinstance(obj, h5py.Dataset):
            raise CheckpointError(f"{where}: {path} is not a dataset")
        expected = self.files[name]["datasets"].get(path)
        if expected is None:
            raise CheckpointError(f"{where}: dataset {path} has no checksum in the manifest")
        try:
            return _read_verified(obj, expected, where, out=out)
        except OSError as err:  # truncated or damaged storage under a readable header
            raise CheckpointError(f"{where}: dataset {path} cannot be read: {err}") from err

    def read_shard(self, shard_id: int, into: SnapshotStaging | None = None) -> ShardSnapshot:
        """Every row and counter of one shard, checksums verified.

        Args:
            shard_id (int): the shard.
            into (SnapshotStaging | None): read into these (touched) arrays instead of
                fresh ones; the snapshot's arrays are then views of it.

        Raises:
            CheckpointError: unreadable file, missing dataset, checksum mismatch, or
                contents that contradict the manifest.
        """
        rec = self.shards[shard_id]
        n = rec.rows
        if into is not None and into.capacity < n:
            into = None

        def dest(name: str) -> np.ndarray | None:
            return None if into is None else getattr(into, name)[:n]

        with self._file(rec.file) as f:
            g = f"/shards/{shard_id}"
            seqs = self._dataset(f, rec.file, f"{g}/seq", dest("seqs"))
            prio = self._dataset(f, rec.file, f"{g}/priority", dest("priority"))
            init = self._dataset(f, rec.file, f"{g}/init_priority", dest("init_priority"))
            cols = {fl.name: self._dataset(f, rec.file, f"{g}/columns/{fl.name}",
                                           None if into is None else
                                           into.columns[fl.name][:n])
                    for fl in self.spec}
        snap = ShardSnapshot(shard_id=shard_id, capacity=rec.capacity, commit=rec.commit,
                             seqs=seqs, columns=cols, priority=prio, init_priority=init,
                             max_priority=rec.max_priority,
                             applied_updates=rec.applied_updates,
                             dropped_updates=rec.dropped_updates, reserve=rec.reserve)
        try:
            snap.check(self.spec)
        except ValueError as err:
            raise CheckpointError(f"{self.path / rec.file}: {err}") from err
        if snap.rows != rec.rows:
            raise CheckpointError(f"{self.path / rec.file}: shard {shard_id} holds "
                                  f"{snap.rows} rows, the manifest says {rec.rows}")
        return snap

    def extra_state(self) -> dict[str, np.ndarray]:
        """The named arrays of ``learner.h5`` (model, optimizer, ...), verified; ``{}``
        if the checkpoint has none."""
        if LEARNER_FILE not in self.files:
            return {}
        out: dict[str, np.ndarray] = {}
        with self._file(LEARNER_FILE) as f:
            for path in self.files[LEARNER_FILE]["datasets"]:
                out[path[len("/arrays/"):]] = self._dataset(f, LEARNER_FILE, path)
        return out

    def verify(self) -> None:
        """Read every dataset of every file and check its checksum. Blocks.

        Raises:
            CheckpointError: the first problem found (file and reason).
        """
        for name, rec in self.files.items():
            with self._file(name) as f:
                for path in rec["datasets"]:
                    self._dataset(f, name, path)
        for s in self.shards:
            self.read_shard(s.shard_id)


def open_checkpoint(path: str | Path, *, spec: Spec | None = None) -> Checkpoint:
    """Open a complete checkpoint and run the cheap checks. Local; blocks for a few small
    reads (``DONE``, the manifest, file sizes).

    Checks: ``DONE`` present and valid, manifest SHA-256 as recorded, format and schema
    version, every file present and of its recorded size (truncation), the spec (when
    ``spec`` is given). Dataset checksums are checked when the data is read
    (:meth:`Checkpoint.read_shard`) or by :meth:`Checkpoint.verify`.

    Args:
        path (str | Path): the checkpoint directory (or its ``manifest.h5``).
        spec (Spec | None): refuse a checkpoint of a different spec.

    Raises:
        CheckpointError: naming the file and the reason.
    """
    p = Path(path)
    if p.name == MANIFEST:
        p = p.parent
    if not p.is_dir():
        raise CheckpointError(f"checkpoint {p} does not exist or is not a directory")
    done = done_record(p)
    if int(done.get("schema_version", 0)) > SCHEMA_VERSION:
        raise CheckpointError(f"checkpoint {p}: schema version {done['schema_version']} is "
                              f"newer than this conduit_hpc reads ({SCHEMA_VERSION}); "
                              f"upgrade conduit_hpc")
    for name, size in done["files"].items():
        f = p / name
        if not _FILE.match(name):
            raise CheckpointError(f"checkpoint {p}: {DONE} names a bad file {name!r}")
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {f} is missing")
        actual = f.stat().st_size
        if actual != int(size):
            raise CheckpointError(f"checkpoint file {f} is truncated or damaged: {actual} "
                                  f"bytes, {int(size)} were written")
    mpath = p / MANIFEST
    if MANIFEST not in done["files"]:
        raise CheckpointError(f"checkpoint {p}: {DONE} does not list {MANIFEST}")
    digest = _sha256(mpath)
    if digest != done.get("manifest_sha256"):
        raise CheckpointError(f"checkpoint file {mpath} fails its checksum (SHA-256 "
                              f"{digest[:16]}..., {DONE} recorded "
                              f"{str(done.get('manifest_sha256'))[:16]}...)")
    try:
        with h5py.File(mpath, "r") as f:
            ckpt = _read_manifest(p, f)
    except OSError as err:
        raise CheckpointError(f"checkpoint file {mpath} cannot be read: {err}") from err
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint file {mpath} is not a valid manifest: "
                              f"{type(err).__name__}: {err}") from err
    for s in ckpt.shards:
        if s.file not in ckpt.files:
            raise CheckpointError(f"{mpath}: shard {s.shard_id} is in {s.file!r}, which "
                                  f"the manifest does not list")
    if spec is not None and spec.signature() != ckpt.spec.signature():
        raise CheckpointError(f"checkpoint {p} holds experience of a different spec: "
                              f"{_spec_diff(ckpt.spec, spec)}")
    return ckpt


def _spec_diff(stored: Spec, current: Spec) -> str:
    a, b = dict((s[0], s) for s in stored.signature()), dict((s[0], s) for s in
                                                               current.signature())
    for name in list(a) + [n for n in b if n not in a]:
        if name not in b:
            return f"field {name!r} is in the checkpoint but not in this job's spec"
        if name not in a:
            return f"field {name!r} is in this job's spec but not in the checkpoint"
        if a[name] != b[name]:
            _, dt1, sh1, nan1 = a[name]
            _, dt2, sh2, nan2 = b[name]
            return (f"field {name!r} is {np.dtype(dt1).name}{list(sh1)} allow_nan={nan1} "
                    f"in the checkpoint, {np.dtype(dt2).name}{list(sh2)} allow_nan={nan2} "
                    f"in this job")
    return f"field order differs: {stored.names} vs {current.names}"


def _read_manifest(p: Path, f: h5py.File) -> Checkpoint:
    a = f.attrs
    if a.get("format") != FORMAT:
        raise CheckpointError(f"{p / MANIFEST}: not a conduit_hpc checkpoint (format "
                              f"{a.get('format')!r})")
    version = int(a["schema_version"])
    if version > SCHEMA_VERSION:
        raise CheckpointError(f"{p / MANIFEST}: schema version {version} is newer than this "
                              f"conduit_hpc reads ({SCHEMA_VERSION}); upgrade conduit_hpc")
    meta = f["meta"]
    spec = spec_from_json(json.loads(_str(meta["spec"])))
    shards = [ShardRecord(shard_id=int(s["shard_id"]), capacity=int(s["capacity"]),
                          commit=int(s["commit"]), rows=int(s["rows"]),
                          max_priority=float(s["max_priority"]),
                          applied_updates=int(s["applied_updates"]),
                          dropped_updates=int(s["dropped_updates"]),
                          reserve=int(s["reserve"]), file=str(s["file"]))
              for s in json.loads(_str(meta["shards"]))]
    counters: dict[int, dict[str, Any]] = {}
    for r, g in f["counters"].items():
        counters[int(r)] = {k: (v.item() if isinstance(v, np.generic) else
                                v.decode() if isinstance(v, bytes) else v)
                            for k, v in g.attrs.items()}
    rng = {int(r): _str(ds) for r, ds in f["rng"].items()}
    return Checkpoint(path=p, seq=int(a["seq"]), created_unix=float(a["created_unix"]),
                      schema_version=version, spec=spec,
                      config_toml=_str(meta["config_toml"]),
                      layout=json.loads(_str(meta["layout"])),
                      placement=json.loads(_str(meta["placement"])), shards=shards,
                      files=json.loads(_str(meta["files"])), counters=counters, rng=rng)


# ---------------------------------------------------------------------------------
# inspect


def inspect_checkpoint(path: str | Path, *, verify: bool = False) -> dict[str, Any]:
    """Describe a checkpoint (or the newest one under a root) as a plain dict.

    Local; blocks (``verify`` reads every byte). Never raises for a damaged checkpoint:
    the problem is in ``error`` and ``ok`` is False.

    Returns:
        dict: ``path``, ``ok``, ``error``, ``verified``, and when readable ``seq``,
        ``created_unix``, ``schema_version``, ``spec``, ``shards`` (per shard: rows,
        capacity, commit, owner, priority min/mean/max/sum), ``rows``, ``config_toml``,
        ``counters``, ``rng_ranks``, ``extra_arrays``; for a root, ``checkpoints`` lists
        every checkpoint and whether it is complete.
    """
    p = Path(path)
    out: dict[str, Any] = {"path": str(p), "ok": False, "error": None, "verified": False}
    if p.is_dir() and not (p / MANIFEST).exists() and not (p / DONE).exists() and \
            list_checkpoints(p):
        out["checkpoints"] = [{"path": str(c), "complete": is_complete(c)}
                              for c in list_checkpoints(p)]
        complete = [c for c in reversed(list_checkpoints(p)) if is_complete(c)]
        if not complete:
            out["error"] = f"no complete checkpoint under {p}"
            return out
        p = complete[0]
        out["path"] = str(p)
    try:
        ckpt = open_checkpoint(p)
        out.update(seq=ckpt.seq, created_unix=ckpt.created_unix,
                   schema_version=ckpt.schema_version,
                   spec=spec_to_json(ckpt.spec), rows=ckpt.rows,
                   config_toml=ckpt.config_toml, counters=ckpt.counters,
                   rng_ranks=sorted(ckpt.rng), layout=ckpt.layout,
                   extra_arrays=sorted(d[len("/arrays/"):] for d in
                                       ckpt.files.get(LEARNER_FILE, {}).get("datasets", {})))
        owners = [s["owner_rank"] for s in ckpt.placement["shards"]]
        shards = []
        for s in ckpt.shards:
            with ckpt._file(s.file) as f:
                prio = ckpt._dataset(f, s.file, f"/shards/{s.shard_id}/priority")
            shards.append({"shard_id": s.shard_id, "owner_rank": owners[s.shard_id],
                           "rows": s.rows, "capacity": s.capacity, "commit": s.commit,
                           "file": s.file,
                           "priority_min": float(prio.min()) if len(prio) else None,
                           "priority_mean": float(prio.mean()) if len(prio) else None,
                           "priority_max": float(prio.max()) if len(prio) else None,
                           "priority_sum": float(prio.sum())})
        out["shards"] = shards
        if verify:
            ckpt.verify()
            out["verified"] = True
        out["ok"] = True
    except CheckpointError as err:
        out["error"] = str(err)
    return out


def format_report(report: Mapping[str, Any]) -> str:
    """:func:`inspect_checkpoint`'s dict as text for a terminal."""
    lines = []
    for c in report.get("checkpoints", ()):
        lines.append(f"  {'complete  ' if c['complete'] else 'INCOMPLETE'}  {c['path']}")
    if lines:
        lines.insert(0, "checkpoints under the root (oldest first):")
        lines.append("")
    status = ("verified: every dataset matches its checksum" if report.get("verified")
              else "not verified (--verify reads every checksum)")
    if not report.get("ok"):
        status = "REFUSED"
    lines.append(f"checkpoint   {report['path']}  [{status}]")
    if "seq" not in report:
        if report.get("error"):
            lines.append(f"error        {report['error']}")
        return "\n".join(lines)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report["created_unix"]))
    lines.append(f"number       {report['seq']}, written {when}, schema version "
                 f"{report['schema_version']}")
    spec = ", ".join(f"{f['name']}: {np.dtype(f['dtype']).name}{f['shape']}"
                     for f in report["spec"])
    lines.append(f"spec         {spec}")
    shards = report.get("shards", [])
    lines.append(f"rows         {report['rows']:,} in {len(shards)} shards")
    if shards:
        lines.append("")
        lines.append(f"{'shard':>6} {'owner':>6} {'rows':>10} {'capacity':>10} {'commit':>12} "
                     f"{'prio min':>10} {'mean':>10} {'max':>10} {'sum':>12}  file")

        def num(v: float | None) -> str:
            return "-" if v is None else f"{v:.4g}"

        for s in shards:
            lines.append(f"{s['shard_id']:>6} {s['owner_rank']:>6} {s['rows']:>10,} "
                         f"{s['capacity']:>10,} {s['commit']:>12,} "
                         f"{num(s['priority_min']):>10} {num(s['priority_mean']):>10} "
                         f"{num(s['priority_max']):>10} {num(s['priority_sum']):>12}  "
                         f"{s['file']}")
    lines.append("")
    position = [f"{k}={v}" for c in report["counters"].values() for k, v in c.items()
                if k in ("superstep", "step", "samples", "inserts")]
    lines.append("position     " + (", ".join(position) if position else
                                    "no scheduler position stored"))
    lines.append("counters")
    for r, c in sorted(report["counters"].items()):
        body = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in c.items() if k != "role")
        lines.append(f"  rank {r} ({c.get('role', '?')}): {body or '-'}")
    lines.append(f"rng states   world ranks {report['rng_ranks'] or 'none'}")
    extra = report.get("extra_arrays") or []
    lines.append(f"extra state  {', '.join(extra) if extra else 'none'}")
    lines.append("config")
    lines += ["  " + ln for ln in report["config_toml"].rstrip().splitlines()]
    if report.get("error"):
        lines.append(f"error        {report['error']}")
    return "\n".join(lines)
