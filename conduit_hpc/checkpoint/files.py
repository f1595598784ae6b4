"""Checkpoint directories without h5py: names, markers, listing, retention, checksums and
the JSON encodings of the spec and of RNG states. See :mod:`conduit_hpc.checkpoint`.

Every function here is local (no MPI, no collective), blocks only for its own disk I/O,
and returns the same on every rank for the same files.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from conduit_hpc import jsontext
from conduit_hpc.checkpoint.problems import _is_int
from conduit_hpc.checkpoint.rawio import _sha256 as _sha256  # (imported from here)
from conduit_hpc.checkpoint.rawio import open_regular
from conduit_hpc.config import CHECKPOINT_CODECS, Config
from conduit_hpc.errors import CheckpointError
from conduit_hpc.spec import Field, Spec

#: 2: a ``sampler`` group (world rank -> the learner's Sampler.state_dict as JSON);
#: version 1 checkpoints, without it, are still read
SCHEMA_VERSION = 2
FORMAT = "conduit_hpc experience checkpoint"
MANIFEST = "manifest.h5"
DONE = "DONE"
#: a complete checkpoint found damaged (by a resume that fell back past it): JSON with
#: ``reason`` and ``marked_unix``; it is kept as evidence, never restored, never counted
#: by retention
DAMAGED = "DAMAGED"
#: the most bytes a DONE or DAMAGED marker may have (they are a few hundred; DONE grows
#: by ~40 bytes per file): a larger one is damaged and is refused before it is read
MARKER_MAX_BYTES = 1 << 20
LEARNER_FILE = "learner.h5"
TMP_PREFIX = ".tmp-"
NAME_RE = re.compile(r"^ckpt-(\d{6,})$")
FILE_RE = re.compile(r"^[A-Za-z0-9_.-]+\.h5$")
CHUNK_BYTES = 8 << 20  # write/read/checksum in slabs of this size
#: bytes of one HDF5 chunk of a compressed dataset (the unit a codec compresses, and the
#: unit a damaged block takes down); slabs are whole numbers of chunks
COMPRESSED_CHUNK_BYTES = 1 << 20


def h5_filter(codec: str) -> dict[str, Any]:
    """``h5py.Group.create_dataset`` keywords of a checkpoint codec (one of
    :data:`conduit_hpc.config.CHECKPOINT_CODECS`; ``{}`` for ``"none"``). Local; pure.

    Raises:
        CheckpointError: an unknown codec (names it and the known ones).
    """
    if codec not in CHECKPOINT_CODECS:
        raise CheckpointError(f"checkpoint codec {codec!r} is unknown; expected one of "
                              f"{', '.join(CHECKPOINT_CODECS)}")
    if codec == "none":
        return {}
    if codec == "lzf":
        return {"compression": "lzf"}
    return {"compression": "gzip", "compression_opts": int(codec[5:] or 1)}


def checkpoint_name(seq: int) -> str:
    """Directory name of checkpoint number ``seq``."""
    return f"ckpt-{seq:06d}"


def seq_of(path: Path) -> int | None:
    """The checkpoint number in a directory name, or None."""
    m = NAME_RE.match(path.name)
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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json(obj: Any) -> str:
    return jsontext.dumps(obj, sort_keys=True, separators=(",", ":"))


def spec_to_json(spec: Spec) -> list[dict[str, Any]]:
    """The spec as plain JSON: name, dtype (numpy ``str``), shape, allow_nan, description
    and units per field."""
    return [{"name": f.name, "dtype": f.dtype.str, "shape": list(f.shape),
             "allow_nan": f.allow_nan, "description": f.description, "units": f.units}
            for f in spec]


def spec_from_json(fields: Sequence[Mapping[str, Any]]) -> Spec:
    """Inverse of :func:`spec_to_json` (only numeric dtypes are accepted; description
    and units may be absent, as in checkpoints written before they existed)."""
    out = []
    for f in fields:
        dt = np.dtype(str(f["dtype"]))
        if dt.kind not in "biuf":
            raise ValueError(f"field {f['name']!r} has non-numeric dtype {dt}")
        out.append(Field(str(f["name"]), dt, tuple(int(d) for d in f["shape"]),
                         bool(f["allow_nan"]), description=str(f.get("description", "")),
                         units=str(f.get("units", ""))))
    return Spec(out)


def dataset_attrs(spec: Spec, alpha: float | None = None) -> dict[str, dict[str, Any]]:
    """The attributes every experience dataset carries, by its path inside a shard group
    (``seq``, ``priority``, ``init_priority``, ``columns/<field>``); the manifest's
    ``/experience/<field>`` and ``/index/*`` carry the same. ``description`` says what
    it holds, ``units`` its units ("" when none); ``priority`` says that alpha is *not*
    applied (``alpha_applied = False``) and, when given, ``alpha`` (sampling draws rows
    in proportion to ``priority ** alpha``). Local."""
    prio: dict[str, Any] = {
        "description": "the row's current priority as the learners last set it (|TD| "
                       "error + epsilon, raw: NOT raised to alpha); sampling draws rows in "
                       "proportion to priority ** alpha",
        "units": "", "alpha_applied": False}
    if alpha is not None:
        prio["alpha"] = float(alpha)
    out: dict[str, dict[str, Any]] = {
        "seq": {"description": "the row's insert sequence number in its shard (the "
                               "ring's generation stamp; ascending, contiguous)",
                "units": "rows"},
        "priority": prio,
        "init_priority": {"description": "the priority the actor gave at ingest (raw, "
                                         "alpha not applied; NaN: none given, the shard's "
                                         "running maximum was used)",
                          "units": "", "alpha_applied": False},
        "shard": {"description": "the shard each global row was read from", "units": ""},
    }
    for f in spec:
        out[f"columns/{f.name}"] = {
            "description": f.description or f"experience field {f.name!r} (the spec "
                                              f"gives no description)",
            "units": f.units, "field": f.name, "allow_nan": f.allow_nan}
    return out


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


def checkpoint_root(config: Config, run_dir: Path | None) -> Path:
    """``checkpoint.directory``, relative to the run directory (or the working directory
    when there is none); absolute paths as given. Local; pure."""
    d = Path(config.checkpoint.directory)
    if d.is_absolute():
        return d
    return (Path.cwd() if run_dir is None else Path(run_dir)) / d


def root_problem(root: Path, *, fresh: bool) -> str:
    """Why a run cannot use ``root`` as its checkpoint root ("" if it can): a path that
    is (or lies under) something other than a directory or a symbolic link that leads
    nowhere, or - for a ``fresh`` run (no
    resume) - a root that already holds checkpoints or checkpoints being written, which
    this run's retention would delete (an earlier run's, or a concurrent one's). Local;
    reads the directory only.
    """
    here = Path(root)
    while not here.exists() and here != here.parent:
        if here.is_symlink():  # exists() follows links: one that leads nowhere
            return (f"checkpoint root {root} "
                    f"{'is' if here == Path(root) else 'lies under'} the symbolic link "
                    f"{here}, which leads nowhere (dangling, or a loop: "
                    f"{here} -> {os.readlink(here)}); expected a directory")
        here = here.parent
    if here.exists() and not here.is_dir():
        what = "is a file" if here == Path(root) else f"lies under the file {here}"
        return f"checkpoint root {root} {what}, not a directory"
    if not fresh or not Path(root).is_dir():
        return ""
    held = list_checkpoints(root) + sorted(Path(root).glob(TMP_PREFIX + "ckpt-*"))
    if not held:
        return ""
    names = ", ".join(p.name for p in held[:3]) + (", ..." if len(held) > 3 else "")
    return (f"checkpoint root {root} already holds {len(held)} checkpoint(s) of another "
            f"run ({names}), which this fresh run's retention would delete; pass --resume "
            f"to continue from them, or choose another --run-dir or checkpoint.directory")


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


def damage_of(path: Path) -> str | None:
    """Why ``path`` is marked damaged (its ``DAMAGED`` marker's reason), or None when it
    is not marked. Local; reads at most :data:`MARKER_MAX_BYTES` of the marker (an
    unreadable or oversized marker still marks it damaged)."""
    f = path / DAMAGED
    if not f.exists() and not f.is_symlink():
        return None
    try:
        with open_regular(f) as fh:  # a FIFO there held every reader for ever
            raw = fh.read(MARKER_MAX_BYTES + 1)
        rec = json.loads(raw.decode("utf-8")) if len(raw) <= MARKER_MAX_BYTES else None
        reason = rec.get("reason") if isinstance(rec, dict) else None
    except OSError as err:
        return f"its {DAMAGED} marker cannot be read ({err.strerror})"
    except ValueError:
        reason = None
    return str(reason) if reason else f"its {DAMAGED} marker gives no readable reason"


def mark_damaged(path: Path, reason: str) -> bool:
    """Mark a complete checkpoint damaged (``DAMAGED``, written atomically), unless it is
    marked already, so that listings show it, a resume skips it, and retention neither
    counts nor deletes it (it is kept as evidence). Local; blocks for a small write.

    Returns:
        bool: whether a marker was written (False: already marked, or not writable).
    """
    if damage_of(path) is not None:
        return False
    tmp = path / f"{TMP_PREFIX}{DAMAGED}-{os.getpid()}"
    try:
        tmp.write_text(_json({"reason": reason, "marked_unix": time.time()}))
        os.replace(tmp, path / DAMAGED)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True


def done_record(path: Path) -> dict[str, Any]:
    """The parsed and checked ``DONE`` marker: ``format`` (str), ``schema_version`` (int
    >= 1), ``seq`` (int >= 0), ``created_unix`` (finite number), ``manifest_sha256`` (64
    hex digits), ``files`` (file name -> size in bytes, a plain name each). Every field is
    checked before anything uses it.

    Raises:
        CheckpointError: missing, unreadable, larger than :data:`MARKER_MAX_BYTES`
            (checked before it is read: naming the file, its size and the limit), not
            JSON, or a field missing or of the wrong type or range (naming the field and
            the value).
    """
    f = path / DONE
    if not f.is_file():
        raise CheckpointError(f"checkpoint {path}: no {DONE} marker; it was not completely "
                              f"written (the job stopped while writing it)")
    try:
        size = f.stat().st_size  # before reading: a marker grown to gigabytes is not read
        if size <= MARKER_MAX_BYTES:
            with open_regular(f) as fh:
                raw = fh.read(MARKER_MAX_BYTES + 1)
            size = len(raw)
        if size > MARKER_MAX_BYTES:
            raise CheckpointError(f"checkpoint {path}: {DONE} marker {f} is damaged: "
                                  f"{size} bytes, more than the {MARKER_MAX_BYTES} a marker "
                                  f"may have (a {DONE} marker is a few hundred)")
        rec = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError included
        raise CheckpointError(f"checkpoint {path}: {DONE} marker is damaged: {err}") from err
    problem = _done_problem(rec)
    if problem:
        raise CheckpointError(f"checkpoint {path}: {DONE} marker is damaged: {problem}")
    return rec


def _done_problem(rec: Any) -> str:
    """What is wrong with a parsed ``DONE`` record ("" if nothing)."""
    if not isinstance(rec, dict):
        return f"expected a JSON object, got {type(rec).__name__}"
    checks: list[tuple[str, Any, str]] = [
        ("format", lambda v: isinstance(v, str) and v, "a non-empty string"),
        ("schema_version", lambda v: _is_int(v) and 1 <= v < 1 << 31, "an integer >= 1"),
        ("seq", lambda v: _is_int(v) and 0 <= v < 1 << 62, "an integer >= 0"),
        ("created_unix", lambda v: isinstance(v, int | float) and not isinstance(v, bool)
         and math.isfinite(v), "a finite number"),
        ("manifest_sha256", lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v),
         "64 hexadecimal digits"),
        ("files", lambda v: isinstance(v, dict) and bool(v), "a non-empty table of sizes"),
    ]
    for key, ok, expected in checks:
        if key not in rec:
            return f"field {key!r} is missing (expected {expected})"
        if not ok(rec[key]):
            return f"field {key!r} must be {expected}, got {rec[key]!r}"
    for name, size in rec["files"].items():
        if not re.fullmatch(r"[\w.-]+", name) or name in (".", ".."):
            return f"field 'files' names {name!r}, which is not a plain file name"
        if not (_is_int(size) and 0 <= size < 1 << 62):
            return f"field 'files' gives {name!r} the size {size!r}, expected bytes >= 0"
    return ""


def newest_first(roots: Iterable[Path]) -> list[Path]:
    """Every checkpoint directory under ``roots``, newest first: within a root by number
    (the numbers grow), roots by their newest checkpoint's time (``DONE``, or the
    directory's modification time when none is complete)."""
    groups: list[tuple[float, list[Path]]] = []
    for root in roots:
        found = list_checkpoints(root)
        if not found:
            continue
        times, kept = [], []
        for p in found:
            try:
                times.append(float(done_record(p)["created_unix"]))
            except CheckpointError:
                try:
                    times.append(p.stat().st_mtime)
                except OSError:  # pruned since the listing (a writer in this root):
                    continue  # gone, not a failure of the resume
            kept.append(p)
        if kept:
            groups.append((max(times), kept[::-1]))
    groups.sort(key=lambda g: g[0], reverse=True)
    return [p for _, ps in groups for p in ps]


def next_seq(root: Path, at_least: int = 1) -> int:
    """A checkpoint number not used under ``root`` (temporary directories included, and
    a checkpoint's name taken by something else: a file there failed every save)."""
    used = [s for p in (root.iterdir() if root.is_dir() else ())
            if (s := seq_of(p)) is not None]
    if root.is_dir():
        for p in root.glob(TMP_PREFIX + "ckpt-*"):
            m = re.match(r"^\.tmp-ckpt-(\d+)", p.name)
            if m:
                used.append(int(m.group(1)))
    return max([at_least - 1, *used]) + 1


def prune(root: Path, keep: int, *, in_flight: Iterable[Path] = ()) -> list[Path]:
    """Keep the ``keep`` newest complete checkpoints under ``root``; remove older ones,
    incomplete ones older than the newest complete one, and temporary directories not in
    flight. A checkpoint marked damaged (:func:`mark_damaged`) is neither counted nor
    removed: a good checkpoint is never pruned in favour of a damaged one, and the
    damaged one stays as evidence. Local; blocks for the deletes.

    Returns:
        list[Path]: what was removed.
    """
    busy = {Path(p).resolve() for p in in_flight}
    all_ = [p for p in list_checkpoints(root) if damage_of(p) is None]
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
