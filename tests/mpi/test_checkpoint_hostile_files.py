"""Checkpoints written by a real MPI job, then damaged as a hostile disk leaves them: a
seeded property fuzz (bytes flipped, overwritten, truncated or zeroed at many offsets of
every file, with and without ``DONE`` re-sealed over the damage) where each damaged copy
is refused with a CheckpointError naming its file, or reads back exactly what was
written; a resume that falls back past a FIFO, a device and a lying dataset header on
every rank together; and saves onto a full and a read-only file system that fail on
every rank and keep the checkpoint before."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from conduit_hpc import CheckpointError, ExperienceDataPlane, Role
from conduit_hpc import checkpoint as ck
from conduit_hpc.features.checkpointing import restore_data_plane, save_checkpoint
from tests.mpi.test_checkpoint import cfg_for, held, ingest

COMM = MPI.COMM_WORLD
# rules of the files on disk, not of concurrency: one rank count (make test's time)
pytestmark = pytest.mark.skipif(COMM.size != 3, reason="run at 3 ranks")
SEED = 4343
CASES_PER_RANK = 90  # x ranks; a few ms each (the files are small)


def cycle(root: Path, batches: int, compression: dict | None = None,
          refused: str = "") -> list[tuple[int, int, int, float, int]]:
    """A short job (two buffer ranks: two part files): actors ingest ``batches`` batches
    of 3 rows, then every rank saves (a save ``refused`` raises a CheckpointError
    matching it, on every rank); what the buffers held (every rank)."""
    more = {"checkpoint": {"compression": compression}} if compression else {}
    with ExperienceDataPlane(cfg_for(2, 1, capacity=600, **more)) as edp:
        if edp.role is Role.ACTOR:
            ingest(edp, 0, batches)
            edp.done()
        else:
            edp.serve()
        rows = held(edp)
        if refused:
            with pytest.raises(CheckpointError, match=refused):
                save_checkpoint(edp, root)
        else:
            save_checkpoint(edp, root)
    return rows


def _contents(path: Path) -> list[dict[str, np.ndarray]]:
    c = ck.open_checkpoint(path)
    out = []
    for s in c.shards:
        snap = c.read_shard(s.shard_id)
        out.append({"seqs": snap.seqs, "priority": snap.priority,
                    "init": snap.init_priority, **snap.columns})
    return out


def _same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k], equal_nan=True) for k in x)
        for x, y in zip(a, b, strict=True))


def _damage(rng: random.Random, ckpt: Path) -> str:
    """Damage one file of ``ckpt`` in one seeded way; sometimes re-seal ``DONE`` over
    it (sizes, and the manifest's SHA-256), so that the damage gets past the cheap
    checks into HDF5's and the dataset checks. Returns what was done."""
    name = rng.choice(sorted(p.name for p in ckpt.iterdir()))
    f = ckpt / name
    data = bytearray(f.read_bytes())
    n = len(data)
    # most of an HDF5 file's metadata sits in its first few kB: aim there half the time
    at = rng.randrange(max(1, min(n, 4096) if rng.random() < 0.5 else n))
    how = rng.choice(["flip", "overwrite", "truncate", "zero-tail"])
    if how == "flip":
        for _ in range(rng.choice([1, 1, 2, 8, 32])):
            i = rng.randrange(max(1, min(n, at + 512)))
            if i < n:
                data[i] ^= 1 << rng.randrange(8)
    elif how == "overwrite":
        k = rng.randrange(1, 64)
        data[at:at + k] = rng.randbytes(k)
        del data[n:]
    elif how == "truncate":
        del data[at:]
    else:
        data[at:] = bytes(n - at)
    f.write_bytes(bytes(data))
    seal = rng.choice(["none", "sizes", "all"]) if name != ck.DONE else "none"
    if seal != "none":
        rec = json.loads((ckpt / ck.DONE).read_text())
        rec["files"] = {k: (ckpt / k).stat().st_size for k in rec["files"]}
        if seal == "all":
            rec["manifest_sha256"] = hashlib.sha256((ckpt / ck.MANIFEST).read_bytes()
                                                    ).hexdigest()
        (ckpt / ck.DONE).write_text(json.dumps(rec))
    return f"{how} {name} at {at} of {n} bytes, re-sealed: {seal}"


@pytest.mark.mpi(min_size=3)
def test_damaged_bytes_anywhere_are_refused_naming_the_file_or_read_back_exactly(
        shared_dir) -> None:
    """Every rank damages its own copies of two real checkpoints (one with gzip and lzf
    columns) CASES_PER_RANK times, seeded by SEED and its rank: opening and verifying
    each either raises a CheckpointError that names a file of the checkpoint, or gives
    back every row exactly as written; ``inspect`` never raises; nothing hangs."""
    cycle(shared_dir, 8)
    cycle(shared_dir, 12, {"payload": "gzip", "check": "lzf"})
    pristine = ck.list_checkpoints(shared_dir)
    truth = {p.name: _contents(p) for p in pristine}
    rng = random.Random(SEED + COMM.rank)
    work = shared_dir / f"fuzz-{COMM.rank}"
    problems, outcomes = [], {"refused": 0, "intact": 0}
    for case in range(CASES_PER_RANK):
        src = pristine[case % len(pristine)]
        shutil.rmtree(work, ignore_errors=True)
        copy = work / src.name
        shutil.copytree(src, copy)
        what = _damage(rng, copy)
        try:
            ckpt = ck.open_checkpoint(copy)
            ckpt.verify()
            if not _same(_contents(copy), truth[src.name]):
                problems.append(f"{what}: opened and verified, but reads back other rows")
            outcomes["intact"] += 1
        except CheckpointError as err:
            if str(copy) not in str(err):
                problems.append(f"{what}: refused without naming the checkpoint: {err}")
            outcomes["refused"] += 1
        except Exception as err:  # the finding: anything but a refusal
            problems.append(f"{what}: {type(err).__name__}: {err}")
        try:
            report = ck.inspect_checkpoint(copy, verify=True)
            if not (report["ok"] or isinstance(report["error"], str)):
                problems.append(f"{what}: inspect said neither ok nor why: {report}")
        except Exception as err:
            problems.append(f"{what}: inspect raised {type(err).__name__}: {err}")
    every = COMM.allgather((problems, outcomes))
    assert [p for ps, _ in every for p in ps] == []
    assert sum(o["refused"] for _, o in every) > COMM.size * CASES_PER_RANK // 2, every


def _flip_header_to(part: Path, dataset: str, rows: int) -> None:
    """Replace ``dataset`` with an unwritten one of ``rows`` rows and re-seal the sizes."""
    with h5py.File(part, "a") as f:
        dtype = f[dataset].dtype
        del f[dataset]
        f.create_dataset(dataset, shape=(rows,), dtype=dtype, chunks=(1 << 16,))
    ckpt = part.parent
    rec = json.loads((ckpt / ck.DONE).read_text())
    rec["files"] = {k: (ckpt / k).stat().st_size for k in rec["files"]}
    (ckpt / ck.DONE).write_text(json.dumps(rec))


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(120)
def test_resume_falls_back_past_a_fifo_a_device_and_a_lying_header_on_every_rank(
        shared_dir) -> None:
    """Before: a FIFO named DAMAGED held the leader of the resume (every rank with it)
    until the test's timeout; a dataset header of 10**14 rows raised MemoryError on the
    ranks that read it, which the resume takes for no fault of the checkpoint's (every
    rank failed, no fallback)."""
    first = cycle(shared_dir, 4)
    for k in (6, 8, 10):
        cycle(shared_dir, k)
    c1, c2, c3, c4 = ck.list_checkpoints(shared_dir)
    COMM.Barrier()
    if COMM.rank == 0:
        os.mkfifo(c4 / ck.DAMAGED)
        _flip_header_to(c3 / "buffer-0001.h5", "/shards/1/seq", 10**14)
        (c2 / "buffer-0000.h5").unlink()
        (c2 / "buffer-0000.h5").symlink_to("/dev/zero")
    COMM.Barrier()
    with ExperienceDataPlane(cfg_for(2, 1, capacity=600)) as edp:
        res = restore_data_plane(edp, "latest", roots=[shared_dir])
        assert res is not None and res.path == c1, res
        assert held(edp) == first  # every row, shard and priority as it was
        assert len(res.skipped) == 3, res.skipped
        assert f"{c4 / ck.DAMAGED}): its DAMAGED marker cannot be read (a FIFO, not a " \
               f"regular file)" in res.skipped[0], res.skipped[0]
        assert f"{c3 / 'buffer-0001.h5'}: dataset /shards/1/seq has shape " \
               f"(100000000000000,)" in res.skipped[1], res.skipped[1]
        assert f"checkpoint file {c2 / 'buffer-0000.h5'} is not a regular file" \
            in res.skipped[2], res.skipped[2]
        edp.done()
        if edp.serves:
            edp.serve()
    # the complete ones refused are marked (the FIFO one already was), and kept
    assert [ck.damage_of(p) is not None for p in (c1, c2, c3, c4)] == [False, True, True,
                                                                       True]


def _mount(where: Path, *options: str) -> str:
    """Rank 0 runs ``mount`` (one node: every rank sees it); its error ("" if none),
    the same on every rank."""
    err = ""
    if COMM.rank == 0:
        where.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(["mount", *options, str(where)], capture_output=True,
                             text=True, check=False, timeout=30)
        err = got.stderr.strip() or (f"exit {got.returncode}" if got.returncode else "")
    return COMM.bcast(err)


@pytest.mark.mpi(min_size=3)
def test_saves_onto_a_full_then_a_read_only_disk_fail_everywhere_and_keep_the_last(
        shared_dir) -> None:
    """A 200 kB tmpfs holds the first checkpoint; another file then fills it up to 16 kB
    and the next checkpoint does not fit (ENOSPC while HDF5 flushes a part): a
    CheckpointError on every rank naming it, nothing half-written left, the first one
    intact. Remounted read-only, a save fails the same way, and a resume reads the first
    one. Before: the part's writer raised HDF5's RuntimeError, not a CheckpointError
    (that rank left the data plane, the others ended in RemoteFailure)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = shared_dir / "small"
    why = _mount(mnt, "-t", "tmpfs", "-o", "size=200k", "tmpfs")
    if why:
        pytest.skip(f"mount -t tmpfs refused: {why}")
    try:
        root = mnt / "checkpoints"
        first = cycle(root, 4)
        (c1,) = ck.list_checkpoints(root)
        before = {p.name: p.read_bytes() for p in c1.iterdir()}
        if COMM.rank == 0:  # the disk fills up (another job's file), 16 kB left
            with open(mnt / "filler", "ab", buffering=0) as fh:
                try:
                    while True:
                        fh.write(b"x" * 4096)
                except OSError:
                    pass
                fh.truncate(max(0, fh.tell() - (16 << 10)))
        COMM.Barrier()
        cycle(root, 8, refused=r"\[Errno 28\] No space left on device")
        assert ck.list_checkpoints(root) == [c1] and not list(root.glob(".tmp-*"))
        assert {p.name: p.read_bytes() for p in c1.iterdir()} == before
        assert _mount(mnt, "-o", "remount,ro") == ""
        cycle(root, 2, refused="Read-only file system")
        with ExperienceDataPlane(cfg_for(2, 1, capacity=600)) as edp:
            res = restore_data_plane(edp, "latest", roots=[root])
            assert res is not None and res.path == c1 and held(edp) == first
            edp.done()
            if edp.serves:
                edp.serve()
    finally:
        COMM.Barrier()
        if COMM.rank == 0:
            subprocess.run(["umount", str(mnt)], capture_output=True, check=False,
                           timeout=30)
