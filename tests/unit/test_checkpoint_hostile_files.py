"""Checkpoint files as a hostile disk leaves them: a dataset header of another shape,
dtype or size than the manifest says is refused before anything is allocated or read,
and a FIFO, a device or a directory where a marker or a file should be is refused at
once (never waited on, never read without end); the newest-first search falls back past
each to the intact checkpoint before."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from conduit_hpc import CheckpointError
from conduit_hpc import checkpoint as ck
from tests.unit.test_checkpoint import EXTRA, SPEC, write


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    write(root, 1)
    write(root, 2, extra=EXTRA)
    return root


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _reseal_sizes(ckpt: Path) -> None:
    """``DONE``'s file sizes made the files' own (the manifest left as it is): a file
    changed in place, past the cheap size check."""
    rec = json.loads((ckpt / ck.DONE).read_text())
    rec["files"] = {n: (ckpt / n).stat().st_size for n in rec["files"]}
    (ckpt / ck.DONE).write_text(json.dumps(rec))


def _swap(path: str, **dataset: Any) -> Callable[[h5py.File], None]:
    def change(f: h5py.File) -> None:
        del f[path]
        f.create_dataset(path, **dataset)
    return change


@pytest.mark.parametrize(("name", "change", "fragment"), [
    # an unallocated chunked dataset: a 10**14-row header ended in a raw MemoryError
    # (a resume takes that for no fault of the checkpoint's: no fallback)
    ("buffer-0000.h5", _swap("/shards/0/seq", shape=(10**14,), dtype="<i8",
                             chunks=(1 << 16,)),
     "dataset /shards/0/seq has shape (100000000000000,) and dtype int64; the manifest "
     "and the spec expect shape (20,) and dtype int64"),
    # 10**7 rows of fill value were read whole (seconds, 80 MB) before the checksum
    ("buffer-0000.h5", _swap("/shards/1/priority", shape=(10**7,), dtype="<f8",
                             chunks=(1 << 16,)),
     "dataset /shards/1/priority has shape (10000000,) and dtype float64; the manifest "
     "and the spec expect shape (9,) and dtype float64"),
    ("buffer-0000.h5", _swap("/shards/0/priority", data=np.ones(20, np.float32)),
     "dataset /shards/0/priority has shape (20,) and dtype float32; the manifest and the "
     "spec expect shape (20,) and dtype float64"),
    ("buffer-0000.h5", _swap("/shards/0/columns/payload", data=np.zeros((20, 6, 1))),
     "dataset /shards/0/columns/payload has shape (20, 6, 1) and dtype float64; the "
     "manifest and the spec expect shape (20, 6) and dtype int64"),
    # a learner's array has no shape in the manifest: its file's size bounds it
    (ck.LEARNER_FILE, _swap("/arrays/model/fc1.bias", shape=(10**12,), dtype="<f4",
                            chunks=(1 << 16,)),
     "dataset /arrays/model/fc1.bias claims shape (1000000000000,) of float32 "
     "(4,000,000,000,000 bytes) in a file of"),
], ids=["seq-1e14", "priority-1e7", "priority-f32", "payload-rank3", "learner-1e12"])
def test_a_dataset_header_unlike_the_manifest_is_refused_before_it_is_read(
        pristine: Path, tmp_path: Path, name: str, change: Any, fragment: str) -> None:
    root = _copy(pristine, tmp_path / "r")
    newest = root / ck.checkpoint_name(2)
    with h5py.File(newest / name, "a") as f:
        change(f)
    _reseal_sizes(newest)
    with pytest.raises(CheckpointError) as err:
        ck.open_checkpoint(newest, spec=SPEC).verify()
    assert str(newest / name) in str(err.value) and fragment in str(err.value), err.value
    report = ck.inspect_checkpoint(newest, verify=True)
    assert not report["ok"] and fragment in report["error"]
    ck.open_checkpoint(root / ck.checkpoint_name(1), spec=SPEC).verify()


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _directory(p: Path) -> None:
    p.mkdir()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [_fifo, _zero, _directory], ids=["fifo", "dev-zero", "dir"])
@pytest.mark.parametrize("name", [ck.DAMAGED, ck.DONE, ck.MANIFEST, "buffer-0000.h5",
                                  ck.LEARNER_FILE])
def test_a_fifo_device_or_directory_in_a_checkpoint_is_refused_at_once(
        pristine: Path, tmp_path: Path, name: str, make: Callable[[Path], None]) -> None:
    """Before: a FIFO named DAMAGED held open_checkpoint, newest_first's callers,
    inspect and prune (a resume's leader, so every rank) for ever."""
    root = _copy(pristine, tmp_path / "r")
    newest = root / ck.checkpoint_name(2)
    (newest / name).unlink(missing_ok=True)
    make(newest / name)
    with pytest.raises(CheckpointError) as err:
        ck.open_checkpoint(newest, spec=SPEC).verify()
    assert str(newest) in str(err.value)
    if name != ck.DONE:
        assert "not a regular file" in str(err.value), err.value
    report = ck.inspect_checkpoint(root, verify=True)
    good = str(root / ck.checkpoint_name(1))
    assert report.get("fallback") == good or (report["ok"] and report["path"] == good), report
    usable = []
    for p in ck.newest_first([root]):
        try:
            ck.open_checkpoint(p, spec=SPEC).verify()
            usable.append(p.name)
        except CheckpointError:
            pass
    assert usable == [ck.checkpoint_name(1)]
    ck.prune(root, 2)  # never waits on what it looks at
    assert (root / ck.checkpoint_name(1) / ck.DONE).is_file()


def _reseal(ckpt: Path) -> None:
    """``DONE`` made the files' own again (sizes and the manifest's SHA-256)."""
    _reseal_sizes(ckpt)
    rec = json.loads((ckpt / ck.DONE).read_text())
    rec["manifest_sha256"] = ck.files._sha256(ckpt / ck.MANIFEST)
    (ckpt / ck.DONE).write_text(json.dumps(rec))


@pytest.mark.parametrize(("change", "fragment"), [
    # h5py gives None for a member it cannot open: '.attrs' of None (AttributeError)
    (lambda f: f["counters"].__setitem__("7", h5py.SoftLink("/gone")),
     "/counters/7 must be a Group (damaged or replaced), got NoneType"),
    (lambda f: f["rng"].__setitem__("7", h5py.SoftLink("/gone")),
     "/rng/7 must be a scalar string dataset (JSON), got NoneType"),
    (lambda f: (f.create_group("sampler") if "sampler" not in f else None,
                f["sampler"].__setitem__("7", h5py.SoftLink("/gone"))),
     "/sampler/7 must be a scalar string dataset (JSON), got NoneType"),
    # a dataset's attributes passed for a rank's counters
    (lambda f: (f.__delitem__("counters/0"), f.__setitem__("counters/0", [1.0])),
     "/counters/0 must be a Group (damaged or replaced), got Dataset"),
], ids=["counters-link", "rng-link", "sampler-link", "counters-dataset"])
def test_a_manifest_member_that_cannot_be_opened_is_refused_naming_it(
        pristine: Path, tmp_path: Path, change: Any, fragment: str) -> None:
    """A manifest re-sealed after a member of its per-rank groups was damaged (a seeded
    byte fuzz of the manifest found 4 in 600 ending in AttributeError from
    open_checkpoint and from inspect): refused as an invalid manifest naming the member."""
    root = _copy(pristine, tmp_path / "r")
    newest = root / ck.checkpoint_name(2)
    with h5py.File(newest / ck.MANIFEST, "a") as f:
        change(f)
    _reseal(newest)
    with pytest.raises(CheckpointError, match="is not a valid manifest") as err:
        ck.open_checkpoint(newest, spec=SPEC)
    assert fragment in str(err.value), err.value
    report = ck.inspect_checkpoint(root)
    assert report.get("fallback") == str(root / ck.checkpoint_name(1)), report


def _shard0(**values: Any) -> Callable[[Any], Any]:
    def change(doc: Any) -> Any:
        doc[0].update(values)
        return doc
    return change


@pytest.mark.parametrize(("name", "change", "fragment"), [
    # np.arange(commit - rows, commit) of a shard's stamps: OverflowError, not refused
    ("shards", _shard0(commit=2**70), "commit 1180591620717411303424"),
    # opened and verified, then written into a ring's int64 cursor after every rank
    # had agreed on the checkpoint
    ("shards", _shard0(reserve=2**70), "reserve 1180591620717411303424"),
    ("shards", _shard0(applied_updates=2**63), "applied_updates 9223372036854775808"),
    # a resume into other capacities plans the reshard from these counts before it
    # reads a byte: np.repeat of 10**12 rows
    ("shards", _shard0(rows=10**12, capacity=10**12, commit=10**12),
     "the shard records put 1000000000009 rows in 'buffer-0000.h5', which has"),
    ("files", lambda d: {k: {**v, "bytes": [1]} for k, v in d.items()},
     "gives bytes [1], expected bytes >= 0"),
], ids=["commit-2**70", "reserve-2**70", "applied-2**63", "rows-1e12", "bytes-list"])
def test_manifest_counts_no_int64_or_file_can_hold_are_refused_when_opened(
        pristine: Path, tmp_path: Path, name: str, change: Any, fragment: str) -> None:
    from tests.unit.test_checkpoint_fuzz import _rewrite_meta

    root = _copy(pristine, tmp_path / "r")
    newest = root / ck.checkpoint_name(2)
    _rewrite_meta(newest, name, change)
    with pytest.raises(CheckpointError, match="is not a valid manifest") as err:
        ck.open_checkpoint(newest, spec=SPEC)
    assert fragment in str(err.value), err.value


_FULL_DISK_WRITER = """
import sys
from pathlib import Path
from tests.unit.test_checkpoint import snapshot
from conduit_hpc import CheckpointError
from conduit_hpc import checkpoint as ck
where, left = Path(sys.argv[1]), int(sys.argv[2])
with open(where / "filler", "ab", buffering=0) as fh:  # another job fills the disk
    try:
        while True:
            fh.write(b"x" * 4096)
    except OSError:
        pass
    fh.truncate(max(0, fh.tell() - left))
try:
    ck.write_shard_file(where / "buffer-0000.h5", [snapshot(0, 2000, 2000, 2000, 0)])
    print("written")
except CheckpointError as err:
    print(err)
"""


@pytest.mark.parametrize("left", [16 << 10, 40 << 10], ids=["16k-left", "40k-left"])
def test_a_part_written_onto_a_full_disk_fails_cleanly_and_the_process_lives_on(
        tmp_path: Path, left: int) -> None:
    """Before: HDF5 met ENOSPC where it flushed a dataset as it closed; the failure was
    only printed ('Exception ignored in __dealloc__') and the half-closed dataset crashed
    the process with SIGSEGV (exit -11) when the file or the library closed - a
    periodic checkpoint dropped on a full disk took its buffer rank down at exit."""
    import subprocess
    import sys

    from extras import small_tmpfs

    with small_tmpfs(tmp_path / "small", "300k") as mnt:
        out = subprocess.run([sys.executable, "-c", _FULL_DISK_WRITER, str(mnt), str(left)],
                             capture_output=True, text=True, timeout=60, check=False,
                             cwd=Path(__file__).parents[2])
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert "cannot write checkpoint file" in out.stdout and \
        out.stdout.strip().endswith("[Errno 28] No space left on device"), out.stdout


@pytest.mark.parametrize("make", [lambda p: p.write_text("x"), _fifo, _zero],
                         ids=["file", "fifo", "dev-zero"])
def test_a_checkpoint_name_taken_by_a_file_is_not_numbered_again(
        pristine: Path, tmp_path: Path, make: Callable[[Path], None]) -> None:
    """Before: next_seq counted directories only, so a file named ckpt-000003 was the
    next number and every save finalizing it failed ('it already exists'): a
    save_checkpoint() without an agent failed the same way each time."""
    root = _copy(pristine, tmp_path / "r")
    make(root / ck.checkpoint_name(3))
    assert ck.next_seq(root) == 4
    assert write(root, ck.next_seq(root)).name == ck.checkpoint_name(4)
    assert [p.name for p in ck.list_checkpoints(root)] == [ck.checkpoint_name(k)
                                                           for k in (1, 2, 4)]
