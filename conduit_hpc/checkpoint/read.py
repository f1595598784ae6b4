"""Opening and reading checkpoints back with every check: :func:`open_checkpoint` (the
cheap checks: ``DONE``, manifest SHA-256, schema, file sizes, spec) and
:class:`Checkpoint` (reads that verify each dataset's CRC-32, and :meth:`Checkpoint.verify`).
Writing is :mod:`.write`; the format is described in :mod:`conduit_hpc.checkpoint`.

Every function and method here is local (no MPI, no collective), blocks for its own disk
I/O, and returns the same on every rank for the same files. Only numeric arrays, strings
and JSON are read: no pickle is loaded, nothing is executed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from conduit_hpc.checkpoint import files as _files
from conduit_hpc.checkpoint.datasets import SHARD_DTYPES, check_shape, read_verified
from conduit_hpc.checkpoint.files import (
    DAMAGED,
    DONE,
    FILE_RE,
    FORMAT,
    LEARNER_FILE,
    MANIFEST,
    _sha256,
    damage_of,
    done_record,
    spec_from_json,
)
from conduit_hpc.checkpoint.problems import manifest_problem
from conduit_hpc.checkpoint.ranks import read_rank_groups
from conduit_hpc.errors import CheckpointError, CheckpointMismatch
from conduit_hpc.spec import Spec
from conduit_hpc.storage.frames import LAG_COLUMN
from conduit_hpc.storage.snapshot import ShardSnapshot, SnapshotStaging

__all__ = ["Checkpoint", "ShardRecord", "open_checkpoint"]


def _str(ds: h5py.Dataset) -> str:
    v = ds[()]
    return v.decode() if isinstance(v, bytes) else str(v)


#: what h5py raises for damaged HDF5 metadata or storage (a bad object header checksum
#: surfaces as a KeyError from ``name in group``, a bad B-tree as OSError, ...)
H5_ERRORS = (KeyError, OSError, RuntimeError, ValueError)


@contextmanager
def _damaged(where: str, what: str) -> Iterator[None]:
    """Turn an h5py/HDF5 error raised under it into the :class:`CheckpointError` of a
    damaged checkpoint, naming the file (``where``) and what was read (``what``), so a
    resume falls back past it and ``inspect`` refuses it, as for a checksum failure.

    Raises:
        CheckpointError: for any of :data:`H5_ERRORS` (a CheckpointError passes as is).
    """
    try:
        yield
    except CheckpointError:
        raise
    except H5_ERRORS as err:
        raise CheckpointError(f"{where}: {what} cannot be read; the file is damaged "
                              f"({type(err).__name__}: {err})") from err



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
        sampler (dict[int, dict]): world rank -> the learner's sampler state
            (:meth:`~conduit_hpc.sampling.Sampler.state_dict`; empty before schema 2).
        manifest_sha256 (str): the SHA-256 of the manifest read (hex), as ``DONE``
            recorded it: two ranks that opened the same checkpoint read the same one.
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
    sampler: dict[int, dict[str, Any]] = field(default_factory=dict)
    manifest_sha256: str = ""

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
        except H5_ERRORS as err:
            raise CheckpointError(f"checkpoint file {p} cannot be opened: {err}") from err

    def _expected(self, path: str) -> tuple[tuple[int, ...], np.dtype] | None:
        """The shape and dtype the manifest and the spec give a shard dataset
        (``/shards/<id>/seq``, ``priority``, ``init_priority``, ``columns/<field>``);
        None for another dataset (a learner's array)."""
        parts = path.strip("/").split("/")
        if len(parts) < 3 or parts[0] != "shards" or not parts[1].isdigit() \
                or int(parts[1]) >= len(self.shards):
            return None
        n = self.shards[int(parts[1])].rows
        rest = "/".join(parts[2:])
        if rest in SHARD_DTYPES:
            return (n,), np.dtype(SHARD_DTYPES[rest])
        fields = {f"columns/{fl.name}": fl for fl in self.spec}
        fl = fields.get(rest)
        return None if fl is None else ((n, *fl.shape), fl.dtype)

    def _dataset(self, f: h5py.File, name: str, path: str,
                 out: np.ndarray | None = None) -> np.ndarray:
        where = str(self.path / name)
        with _damaged(where, f"dataset {path}"):  # damaged metadata: KeyError, OSError..
            if path not in f:
                raise CheckpointError(f"{where}: dataset {path} is missing")
            obj = f[path]
            if not isinstance(obj, h5py.Dataset):
                raise CheckpointError(f"{where}: {path} is not a dataset")
            expected = self.files[name]["datasets"].get(path)
            if expected is None:
                raise CheckpointError(f"{where}: dataset {path} has no checksum in the "
                                      f"manifest")
            # before anything is allocated or read: a damaged or replaced header may say
            # any shape (a 10**14-row one raised a raw MemoryError, which a resume takes
            # for no fault of the checkpoint's; 10**8 rows were read for seconds)
            check_shape(obj, self._expected(path), where,
                         int(self.files[name].get("bytes", 0) or 0))
            try:
                return read_verified(obj, expected, where, out=out)
            except OSError as err:  # truncated or damaged storage under a readable header
                codec = obj.compression
                what = (f" (a compressed block is damaged: the {codec} filter refused it)"
                        if codec else "")
                raise CheckpointError(f"{where}: dataset {path} cannot be read{what}: "
                                      f"{err}") from err

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

    def priorities(self, shard_id: int) -> np.ndarray:
        """One shard's current priorities (raw, before alpha), checksum verified."""
        return self.shard_dataset(shard_id, "priority")

    def shard_dataset(self, shard_id: int, name: str) -> np.ndarray:
        """One dataset of a shard (``priority``, ``columns/<column>``, ...), verified."""
        rec = self.shards[shard_id]
        with self._file(rec.file) as f:
            return self._dataset(f, rec.file, f"/shards/{shard_id}/{name}")

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

    def dataset_attrs(self) -> dict[str, dict[str, Any]]:
        """The attributes of the manifest's datasets (``/experience/<field>``,
        ``/index/*``, ``/shards/*``) and of ``learner.h5``'s arrays (``/weights/<name>``),
        checksums left out: what a plain ``h5py`` user sees. Strings, numbers and bools
        only; a checkpoint written before attributes existed gives ``{}`` entries.
        Local; reads headers only."""
        out: dict[str, dict[str, Any]] = {}

        def plain(attrs: h5py.AttributeManager) -> dict[str, Any]:
            got: dict[str, Any] = {}
            for k, v in attrs.items():
                if k == "checksum":
                    continue
                if isinstance(v, bytes):
                    v = v.decode("utf-8", "replace")
                elif isinstance(v, np.generic):
                    v = v.item()
                if isinstance(v, str | int | float | bool):
                    got[k] = v
            return got

        with self._file(MANIFEST) as f, _damaged(str(self.path / MANIFEST), "attributes"):
            for group in ("experience", "index", "shards"):
                g = f.get(group)
                if isinstance(g, h5py.Group):
                    for name in g:
                        obj = g.get(name)
                        if isinstance(obj, h5py.Dataset):
                            out[f"/{group}/{name}"] = plain(obj.attrs)
        if LEARNER_FILE in self.files:
            with self._file(LEARNER_FILE) as f, \
                    _damaged(str(self.path / LEARNER_FILE), "attributes"):
                for path in self.files[LEARNER_FILE]["datasets"]:
                    obj = f.get(path)
                    if isinstance(obj, h5py.Dataset):
                        out["/weights/" + path[len("/arrays/"):]] = plain(obj.attrs)
        return out

    def column_storage(self) -> dict[str, dict[str, Any]]:
        """Per stored column, over every shard: its ``codec`` (``"none"`` when not
        compressed), ``stored_bytes`` (on disk) and ``raw_bytes`` (uncompressed). Local;
        reads headers only."""
        out: dict[str, dict[str, Any]] = {}
        by_file: dict[str, list[int]] = {}
        for s in self.shards:
            by_file.setdefault(s.file, []).append(s.shard_id)
        for name, ids in by_file.items():
            with self._file(name) as f, _damaged(str(self.path / name), "column headers"):
                for sid in ids:
                    g = f.get(f"/shards/{sid}/columns")
                    if not isinstance(g, h5py.Group):
                        continue
                    for col in g:
                        ds = g.get(col)
                        if not isinstance(ds, h5py.Dataset):
                            continue
                        raw = ds.attrs.get("compression", "none")
                        codec = raw.decode() if isinstance(raw, bytes) else str(raw)
                        rec = out.setdefault(col, {"codec": codec, "stored_bytes": 0,
                                                   "raw_bytes": 0})
                        if rec["codec"] == "none":
                            rec["codec"] = codec  # an empty shard's column is plain
                        rec["stored_bytes"] += int(ds.id.get_storage_size())
                        rec["raw_bytes"] += int(ds.nbytes)
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

    Checks: no ``DAMAGED`` marker (left by a resume that fell back past it), ``DONE``
    present and valid, manifest SHA-256 as recorded, format and schema
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
    why = damage_of(p)
    if why is not None:
        raise CheckpointError(f"checkpoint {p} is marked damaged ({p / DAMAGED}): {why}")
    if not (p / DONE).exists() and not (p / MANIFEST).exists():
        raise CheckpointError(f"{p} is not a checkpoint: it holds neither {MANIFEST} nor "
                              f"{DONE} (expected a checkpoint directory ckpt-NNNNNN, or a "
                              f"directory holding them)")
    done = done_record(p)
    if int(done.get("schema_version", 0)) > _files.SCHEMA_VERSION:
        raise CheckpointMismatch(f"checkpoint {p}: schema version {done['schema_version']} "
                                 f"is newer than this conduit_hpc reads "
                                 f"({_files.SCHEMA_VERSION}); upgrade conduit_hpc")
    for name, size in done["files"].items():
        f = p / name
        if not FILE_RE.match(name):
            raise CheckpointError(f"checkpoint {p}: {DONE} names a bad file {name!r}")
        if not f.is_file():  # (follows links) a FIFO or a device would never end
            raise CheckpointError(
                f"checkpoint file {f} is missing" if not (f.exists() or f.is_symlink())
                else f"checkpoint file {f} is not a regular file (a directory, a FIFO, a "
                     f"device, or a link to one or to nothing)")
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
    except (OSError, RuntimeError) as err:  # (RuntimeError: HDF5 on damaged metadata)
        raise CheckpointError(f"checkpoint file {mpath} cannot be read: {err}") from err
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint file {mpath} is not a valid manifest: "
                              f"{type(err).__name__}: {err}") from err
    for name in ckpt.files:  # each checked above (present, a regular file, its size)
        if name not in done["files"]:
            raise CheckpointError(f"{mpath}: the manifest lists file {name!r}, which "
                                  f"{DONE} does not")
    for s in ckpt.shards:
        if s.file not in ckpt.files:
            raise CheckpointError(f"{mpath}: shard {s.shard_id} is in {s.file!r}, which "
                                  f"the manifest does not list")
    ckpt.manifest_sha256 = digest
    if spec is not None and spec.signature() != ckpt.spec.signature():
        raise CheckpointMismatch(f"checkpoint {p} holds experience of a different spec: "
                                 f"{_spec_diff(ckpt.spec, spec)}")
    return ckpt


def _spec_diff(stored: Spec, current: Spec) -> str:
    once = [[n[:-len("__refs")] for n in s.names if n.endswith("__refs")] if LAG_COLUMN in
            s.names else [] for s in (stored, current)]
    if bool(once[0]) != bool(once[1]):  # stored columns: say the layouts, not a column
        ours = (f"stores frame stacks, each frame once ({', '.join(once[0])}), and this job "
                f"declares none" if once[0] else "stores rows whole (no frame stacks), and "
                f"this job declares frame stacks ({', '.join(once[1])})")
        return f"the checkpoint {ours}: the layouts differ"
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
        raise CheckpointMismatch(f"{p / MANIFEST}: not a conduit_hpc checkpoint (format "
                                 f"{a.get('format')!r})")
    version = int(a["schema_version"])
    if version > _files.SCHEMA_VERSION:
        raise CheckpointMismatch(f"{p / MANIFEST}: schema version {version} is newer than "
                                 f"this conduit_hpc reads ({_files.SCHEMA_VERSION}); upgrade "
                                 f"conduit_hpc")
    meta = f["meta"]
    spec = spec_from_json(json.loads(_str(meta["spec"])))
    raw, files, placement, layout = (json.loads(_str(meta[k])) for k in (
        "shards", "files", "placement", "layout"))
    why = manifest_problem(raw, placement, files, layout)
    if why:
        raise CheckpointError(f"checkpoint file {p / MANIFEST} is not a valid manifest: {why}")
    shards = [ShardRecord(shard_id=int(s["shard_id"]), capacity=int(s["capacity"]),
                          commit=int(s["commit"]), rows=int(s["rows"]),
                          max_priority=float(s["max_priority"]),
                          applied_updates=int(s["applied_updates"]),
                          dropped_updates=int(s["dropped_updates"]),
                          reserve=int(s["reserve"]), file=str(s["file"]))
              for s in raw]
    counters, rng, sampler = read_rank_groups(f)  # types checked (ValueError)
    return Checkpoint(path=p, seq=int(a["seq"]), created_unix=float(a["created_unix"]),
                      schema_version=version, spec=spec,
                      config_toml=_str(meta["config_toml"]),
                      layout=layout, placement=placement, shards=shards,
                      files=files, counters=counters, rng=rng,
                      sampler=sampler)
