"""The HDF5 checkpoint format: round trip, virtual datasets, refusals, retention, inspect."""

from __future__ import annotations

import json
import re
import resource
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from conduit_hpc import CheckpointError
from conduit_hpc import checkpoint as ck
from conduit_hpc.config import FieldConfig
from conduit_hpc.spec import Spec
from conduit_hpc.storage.snapshot import ShardSnapshot
from conduit_hpc.testing import CHECKED_SPEC, checked_batch

SPEC = Spec.from_config({k: FieldConfig(**v) for k, v in CHECKED_SPEC.items()})
CONFIG_TOML = '[run]\nname = "unit"\n\n[storage]\ncapacity_rows = 60\n'


def snapshot(shard_id: int, cap: int, commit: int, rows: int, seed: int) -> ShardSnapshot:
    rng = np.random.default_rng(seed)
    first = commit - rows
    cols = checked_batch(shard_id, first, rows)
    return ShardSnapshot(shard_id=shard_id, capacity=cap, commit=commit,
                         seqs=np.arange(first, commit, dtype=np.int64), columns=cols,
                         priority=rng.uniform(0, 3, rows), init_priority=np.full(rows, np.nan),
                         max_priority=3.5 + shard_id, applied_updates=7 * shard_id,
                         dropped_updates=shard_id, reserve=commit + 2)


def snapshots() -> list[ShardSnapshot]:
    # three shards of 20 slots over two "buffer ranks"; one wrapped, one empty
    return [snapshot(0, 20, 57, 20, 0), snapshot(1, 20, 9, 9, 1), snapshot(2, 20, 0, 0, 2)]


def write(root: Path, seq: int, snaps: list[ShardSnapshot] | None = None, *,
          extra: dict | None = None, spec: Spec = SPEC, sampler: dict | None = None,
          compression: dict[str, str] | None = None) -> Path:
    """A checkpoint as the collective save writes it, without MPI."""
    snaps = snapshots() if snaps is None else snaps
    tmp = root / f".tmp-{ck.checkpoint_name(seq)}-1"
    tmp.mkdir(parents=True)
    by_file = {"buffer-0000.h5": snaps[:2], "buffer-0001.h5": snaps[2:]}
    parts = []
    for r, (name, ss) in enumerate(by_file.items()):
        rec = ck.write_shard_file(tmp / name, ss, attrs={"world_rank": r + 1},
                                  compression=compression)
        parts.append({"world_rank": r + 1, "role": "buffer", "rng": None,
                      "counters": {"passes": 10 + r}, "files": [rec["file"]],
                      "shards": rec["shards"]})
    gen = np.random.default_rng(42)
    gen.random(3)
    learner = {"world_rank": 0, "role": "learner", "rng": ck.rng_to_json(gen),
               "counters": {"superstep": 1234, "samples": 5.5e6}, "files": [], "shards": [],
               "sampler": sampler}
    if extra is not None:
        learner["files"] = [ck.write_arrays_file(tmp / ck.LEARNER_FILE, extra)]
    parts.append(learner)
    placement = {"shards": [{"shard_id": s.shard_id, "owner_rank": 1 + (s.shard_id >= 2),
                             "tier": "buffer_host", "capacity_rows": s.capacity}
                            for s in snaps],
                 "actor_shards": {"3": 0}, "learner_shards": {"0": [0, 1, 2]}}
    layout = {"world_size": 4, "learner_ranks": [0], "buffer_ranks": [1, 2],
              "actor_ranks": [3], "node_of": [0, 0, 0, 0]}
    rec = ck.write_manifest(tmp, seq=seq, spec=spec, config_toml=CONFIG_TOML, layout=layout,
                            placement=placement, parts=parts)
    final = root / ck.checkpoint_name(seq)
    ck.finalize(tmp, final, rec)
    return final


EXTRA = {"model/fc1.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
         "model/fc1.bias": np.zeros(4, np.float32),
         "optimizer/step": np.int64(17), "optimizer/exp_avg/0": np.ones((3, 4)),
         "torch_rng": np.arange(16, dtype=np.uint8), "flags": np.array([True, False])}


def test_round_trip_of_every_piece_of_state(tmp_path: Path) -> None:
    path = write(tmp_path, 3, extra=EXTRA)
    c = ck.open_checkpoint(path, spec=SPEC)
    assert c.seq == 3 and c.schema_version == ck.SCHEMA_VERSION
    assert c.spec == SPEC and c.config_toml == CONFIG_TOML
    assert c.layout["buffer_ranks"] == [1, 2] and c.placement["actor_shards"] == {"3": 0}
    assert c.rows == 29 and c.capacities == [20, 20, 20]
    for s in snapshots():
        got = c.read_shard(s.shard_id)
        for k in ("shard_id", "capacity", "commit", "max_priority", "applied_updates",
                  "dropped_updates", "reserve"):
            assert getattr(got, k) == getattr(s, k), k
        np.testing.assert_array_equal(got.seqs, s.seqs)
        np.testing.assert_array_equal(got.priority, s.priority)
        np.testing.assert_array_equal(got.init_priority, s.init_priority)
        for name in SPEC.names:
            np.testing.assert_array_equal(got.columns[name], s.columns[name])
            assert got.columns[name].dtype == s.columns[name].dtype
    extra = c.extra_state()
    assert set(extra) == set(EXTRA)
    for k, v in EXTRA.items():
        np.testing.assert_array_equal(extra[k], v)
        assert extra[k].dtype == np.asarray(v).dtype
    assert c.counters[0] == {"role": "learner", "superstep": 1234, "samples": 5.5e6}
    assert c.counters[2]["passes"] == 11
    # the RNG continues where it was
    gen = np.random.default_rng(42)
    gen.random(3)
    np.testing.assert_array_equal(ck.rng_from_json(c.rng[0]).random(5), gen.random(5))
    assert set(c.rng) == {0}
    c.verify()


def test_virtual_datasets_read_every_shard_as_one_array(tmp_path: Path) -> None:
    path = write(tmp_path, 1, extra=EXTRA)
    moved = tmp_path / "elsewhere"
    shutil.move(path, moved)  # source paths are relative: the directory can move
    snaps = snapshots()
    with h5py.File(moved / ck.MANIFEST, "r") as f:
        for name in SPEC.names:
            assert f[f"experience/{name}"].is_virtual
            np.testing.assert_array_equal(f[f"experience/{name}"][:], np.concatenate(
                [s.columns[name] for s in snaps]))
        np.testing.assert_array_equal(f["index/priority"][:],
                                      np.concatenate([s.priority for s in snaps]))
        np.testing.assert_array_equal(f["index/seq"][:], np.concatenate([s.seqs for s in snaps]))
        np.testing.assert_array_equal(f["index/shard"][:], [0] * 20 + [1] * 9)
        np.testing.assert_array_equal(f["learner/model/fc1.weight"][:],
                                      EXTRA["model/fc1.weight"])
        np.testing.assert_array_equal(f["shards/rows"][:], [20, 9, 0])


def test_empty_buffer_gives_empty_global_arrays(tmp_path: Path) -> None:
    path = write(tmp_path, 1, [snapshot(i, 8, 0, 0, i) for i in range(3)])
    with h5py.File(path / ck.MANIFEST, "r") as f:
        assert f["experience/payload"].shape == (0, 6)
    assert ck.open_checkpoint(path).rows == 0


def flip_byte_in(path: Path, dataset: str, index: int = 0) -> None:
    with h5py.File(path, "r") as f:
        off = f[dataset].id.get_offset()
    with open(path, "r+b") as fh:
        fh.seek(off + index)
        b = fh.read(1)
        fh.seek(off + index)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_refuses_a_directory_without_done(tmp_path: Path) -> None:
    path = write(tmp_path, 1)
    (path / ck.DONE).unlink()
    with pytest.raises(CheckpointError, match=r"ckpt-000001: no DONE marker"):
        ck.open_checkpoint(path)


def test_refuses_a_truncated_file(tmp_path: Path) -> None:
    path = write(tmp_path, 1)
    f = path / "buffer-0000.h5"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size // 2)
    with pytest.raises(CheckpointError, match=rf"buffer-0000.h5 is truncated.*{size // 2} "
                                              rf"bytes, {size} were written"):
        ck.open_checkpoint(path)


def test_refuses_a_dataset_whose_checksum_differs(tmp_path: Path) -> None:
    path = write(tmp_path, 1)
    flip_byte_in(path / "buffer-0000.h5", "/shards/1/columns/payload", 11)
    c = ck.open_checkpoint(path)  # the cheap checks pass: sizes are right
    c.read_shard(0)  # another dataset of the same file is fine
    with pytest.raises(CheckpointError, match=r"buffer-0000.h5: dataset "
                                              r"/shards/1/columns/payload fails its checksum"):
        c.read_shard(1)
    with pytest.raises(CheckpointError, match="fails its checksum"):
        c.verify()


def flip_header_of(path: Path, dataset: str) -> None:
    """Damage a dataset's HDF5 object header (metadata, not data): h5py then raises a
    KeyError ("incorrect metadata checksum") when the dataset is looked up."""
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f[dataset].id).addr
    with open(path, "r+b") as fh:
        fh.seek(addr + 8)  # past the "OHDR" signature and version
        b = fh.read(16)
        fh.seek(addr + 8)
        fh.write(bytes(x ^ 0xFF for x in b))


def test_refuses_a_dataset_whose_metadata_is_damaged(tmp_path: Path) -> None:
    path = write(tmp_path, 1, extra=EXTRA)
    flip_header_of(path / "buffer-0000.h5", "/shards/0/priority")
    flip_header_of(path / ck.LEARNER_FILE, "/arrays/model/fc1.bias")
    c = ck.open_checkpoint(path)  # the cheap checks pass: sizes are right
    c.read_shard(1)  # another shard of the same file is fine
    what = r"buffer-0000.h5: dataset /shards/0/priority cannot be read; the file is damaged"
    for read in (lambda: c.read_shard(0), lambda: c.priorities(0), c.verify):
        with pytest.raises(CheckpointError, match=what + r" \(KeyError: .*checksum"):
            read()
    with pytest.raises(CheckpointError, match=r"learner.h5: dataset /arrays/model/fc1.bias "
                                              r"cannot be read; the file is damaged"):
        c.extra_state()
    report = ck.inspect_checkpoint(path)  # refused, not a traceback
    assert not report["ok"] and re.search(what, report["error"]), report["error"]
    write(tmp_path, 2)  # a root: the newest is good, the damaged one is still listed
    listing = ck.inspect_checkpoint(tmp_path, verify=True)
    assert listing["ok"] and [c["path"] for c in listing["checkpoints"]] == [
        str(path), str(tmp_path / "ckpt-000002")]


def test_refuses_a_damaged_manifest(tmp_path: Path) -> None:
    path = write(tmp_path, 1)
    m = path / ck.MANIFEST
    with h5py.File(m, "r") as f:
        off = f["shards/rows"].id.get_offset()
    with open(m, "r+b") as fh:
        fh.seek(off)
        fh.write(b"\x07")
    with pytest.raises(CheckpointError, match=r"manifest.h5 fails its checksum"):
        ck.open_checkpoint(path)


def test_refuses_a_schema_from_the_future(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ck.files, "SCHEMA_VERSION", ck.SCHEMA_VERSION + 1)
    path = write(tmp_path, 1)
    monkeypatch.undo()
    now = ck.SCHEMA_VERSION
    with pytest.raises(CheckpointError, match=rf"schema version {now + 1} is newer than "
                                              rf"this conduit_hpc reads \({now}\)"):
        ck.open_checkpoint(path)


def test_refuses_a_checkpoint_of_a_different_spec(tmp_path: Path) -> None:
    path = write(tmp_path, 1)
    other = Spec.from_dict({"writer": ("int32", ()), "wseq": ("int64", ()),
                            "payload": ("int64", (5,)), "check": ("uint64", ())})
    with pytest.raises(CheckpointError, match=r"different spec: field 'payload' is "
                                              r"int64\[6\].*int64\[5\]"):
        ck.open_checkpoint(path, spec=other)
    fewer = Spec.from_dict({"writer": ("int32", ())})
    with pytest.raises(CheckpointError, match="'wseq' is in the checkpoint but not"):
        ck.open_checkpoint(path, spec=fewer)


def test_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        ck.open_checkpoint(tmp_path / "nope")
    d = tmp_path / "ckpt-000001"
    d.mkdir()
    (d / ck.DONE).write_text("{not json")
    with pytest.raises(CheckpointError, match="DONE marker is damaged"):
        ck.open_checkpoint(d)


def test_a_directory_that_is_no_checkpoint_is_not_called_an_unfinished_one(
        tmp_path: Path) -> None:
    """A directory with neither a manifest nor a DONE marker (a run's other folders, a
    typo) is said to be no checkpoint, not one "not completely written (the job stopped
    while writing it)"; a checkpoint whose DONE is gone still is."""
    other = tmp_path / "logs"
    other.mkdir()
    (other / "x.txt").write_text("x")
    for read in (ck.open_checkpoint, ck.inspect_checkpoint):
        try:
            got = read(other)
            message = got["error"]
        except CheckpointError as err:
            message = str(err)
        assert "is not a checkpoint" in message and "ckpt-NNNNNN" in message, message
        assert "not completely written" not in message
    path = write(tmp_path / "root", 1)
    (path / ck.DONE).unlink()
    with pytest.raises(CheckpointError, match="no DONE marker"):
        ck.open_checkpoint(path)


def test_an_oversized_done_marker_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """Before: the marker was read whole, then its size checked (10 GB ran out the time,
    1 GB took 1.1 GB of memory). The file is sparse: no disk is used."""
    path = write(tmp_path, 1)
    size = 512 << 20
    with open(path / ck.DONE, "r+b") as fh:
        fh.truncate(size)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    for read in (lambda: ck.open_checkpoint(path), lambda: ck.done_record(path)):
        with pytest.raises(CheckpointError, match=rf"DONE marker {path / ck.DONE} is "
                                                  rf"damaged: {size} bytes, more than the "
                                                  rf"{1 << 20} a marker may have"):
            read()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 << 10
    assert ck.newest_first([tmp_path]) == [path]  # listed by its time, not read
    report = ck.inspect_checkpoint(path)
    assert not report["ok"] and f"{size} bytes" in report["error"]


def test_extra_state_refuses_objects_and_bad_names(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="only numeric and bool arrays"):
        ck.write_arrays_file(tmp_path / "x.h5", {"a": np.array(["s"], dtype=object)})
    with pytest.raises(CheckpointError, match="array name 'a//b'"):
        ck.write_arrays_file(tmp_path / "y.h5", {"a//b": np.zeros(2)})
    with pytest.raises(CheckpointError, match="bit generator 'Evil'"):
        ck.rng_from_json(json.dumps({"bit_generator": "Evil", "state": {}}))


def test_prune_keeps_the_newest_and_clears_leftovers(tmp_path: Path) -> None:
    for seq in range(1, 6):
        write(tmp_path, seq, [snapshot(i, 4, 2, 2, i) for i in range(3)])
    (tmp_path / "ckpt-000002" / ck.DONE).unlink()  # an incomplete one, older than newest
    (tmp_path / ".tmp-ckpt-000006-99").mkdir()
    (tmp_path / ".tmp-ckpt-000007-99").mkdir()
    removed = ck.prune(tmp_path, 2, in_flight=[tmp_path / ".tmp-ckpt-000007-99"])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".tmp-ckpt-000007-99", "ckpt-000004", "ckpt-000005"], removed
    assert ck.next_seq(tmp_path) == 8


def test_a_checkpoint_marked_damaged_is_kept_shown_and_never_counted(tmp_path: Path) -> None:
    """Before: after a resume fell back past a damaged ckpt-000003 to ckpt-000002 and
    wrote ckpt-000004, keep = 2 deleted the good 000002 and kept the damaged 000003,
    which inspect listed as complete."""
    for seq in (2, 3, 4):
        write(tmp_path, seq, [snapshot(i, 4, 2, 2, i) for i in range(3)])
    bad = tmp_path / "ckpt-000003"
    flip_byte_in(bad / "buffer-0000.h5", "/shards/0/columns/payload")
    assert ck.damage_of(bad) is None
    assert ck.mark_damaged(bad, "buffer-0000.h5: dataset x fails its checksum")
    assert not ck.mark_damaged(bad, "another reason")  # the first reason stays
    assert ck.damage_of(bad) == "buffer-0000.h5: dataset x fails its checksum"
    assert ck.prune(tmp_path, 2) == []  # 2 and 4 are the two kept; 3 is not counted
    write(tmp_path, 5, [snapshot(i, 4, 2, 2, i) for i in range(3)])
    assert ck.prune(tmp_path, 2) == [tmp_path / "ckpt-000002"]
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == [
        "ckpt-000003", "ckpt-000004", "ckpt-000005"]  # the damaged one kept as evidence
    with pytest.raises(CheckpointError, match=r"ckpt-000003 is marked damaged \(.*DAMAGED"
                                              r"\): buffer-0000.h5: dataset x fails"):
        ck.open_checkpoint(bad)
    listing = ck.inspect_checkpoint(tmp_path)
    assert [c["damaged"] for c in listing["checkpoints"]] == [
        "buffer-0000.h5: dataset x fails its checksum", None, None]
    text = ck.format_report(listing)
    assert f"DAMAGED     {bad}  (buffer-0000.h5: dataset x fails" in text, text
    assert f"complete    {tmp_path / 'ckpt-000005'}" in text
    (tmp_path / "ckpt-000004" / ck.DAMAGED).write_bytes(b"x" * (1 << 20))  # oversized
    assert "no readable reason" in str(ck.damage_of(tmp_path / "ckpt-000004"))
    # the newest not marked damaged is the one described
    assert ck.inspect_checkpoint(tmp_path)["path"] == str(tmp_path / "ckpt-000005")


def test_newest_first_orders_by_completion_time(tmp_path: Path) -> None:
    a = write(tmp_path / "run-a", 9, [snapshot(i, 4, 1, 1, i) for i in range(3)])
    b = write(tmp_path / "run-b", 1, [snapshot(i, 4, 1, 1, i) for i in range(3)])
    assert ck.newest_first([tmp_path / "run-a", tmp_path / "run-b"]) == [b, a]


def test_a_checkpoint_pruned_while_listed_is_passed_over(tmp_path: Path, monkeypatch) -> None:
    """A writer in the root pruned a checkpoint between the listing and its ``stat()``
    (an incomplete one's time is its directory's): the resume leader raised
    FileNotFoundError. The one gone is passed over."""
    a = write(tmp_path / "run-a", 2, [snapshot(i, 4, 1, 1, i) for i in range(3)])
    gone = write(tmp_path / "run-b", 3, [snapshot(i, 4, 1, 1, i) for i in range(3)])
    (gone / ck.DONE).unlink()
    listed = ck.files.list_checkpoints

    def listing_then_prune(root: Path) -> list[Path]:
        found = listed(root)
        if gone in found:
            shutil.rmtree(gone)
        return found

    monkeypatch.setattr(ck.files, "list_checkpoints", listing_then_prune)
    assert ck.newest_first([tmp_path / "run-a", tmp_path / "run-b"]) == [a]


def test_inspect_reports_good_and_damaged(tmp_path: Path) -> None:
    path = write(tmp_path, 4, extra=EXTRA)
    good = ck.inspect_checkpoint(path, verify=True)
    assert good["ok"] and good["verified"] and good["error"] is None
    assert [s["rows"] for s in good["shards"]] == [20, 9, 0]
    s0 = snapshots()[0]
    assert good["shards"][0]["priority_max"] == pytest.approx(s0.priority.max())
    assert good["shards"][2]["priority_min"] is None
    assert good["counters"][0]["superstep"] == 1234
    assert "model/fc1.weight" in good["extra_arrays"]
    # a root: the newest complete checkpoint, and the list of all
    listing = ck.inspect_checkpoint(tmp_path)
    assert listing["ok"] and listing["path"] == str(path) and len(listing["checkpoints"]) == 1
    flip_byte_in(path / "buffer-0000.h5", "/shards/0/columns/wseq")
    cheap = ck.inspect_checkpoint(path)
    assert cheap["ok"]  # priorities are fine; only --verify reads the columns
    bad = ck.inspect_checkpoint(path, verify=True)
    assert not bad["ok"] and "fails its checksum" in bad["error"]
    (path / ck.DONE).unlink()
    gone = ck.inspect_checkpoint(path)
    assert not gone["ok"] and "no DONE marker" in gone["error"]


def test_inspect_of_a_root_whose_newest_is_refused_names_the_one_resume_takes(
        tmp_path: Path) -> None:
    """A root whose newest checkpoint is damaged (not yet marked so by a resume):
    ``inspect`` describes the newest and why it is refused, and says which checkpoint
    ``--resume`` falls back to (before, only that the newest was refused), or that none
    is left."""
    write(tmp_path, 1)
    write(tmp_path, 2)
    newest = write(tmp_path, 3)
    flip_byte_in(newest / "buffer-0000.h5", "/shards/0/columns/wseq")
    report = ck.inspect_checkpoint(tmp_path, verify=True)
    assert not report["ok"] and "fails its checksum" in report["error"]
    assert report["path"] == str(newest)
    assert report["fallback"] == str(tmp_path / "ckpt-000002")
    text = ck.format_report(report)
    assert f"--resume falls back to {tmp_path / 'ckpt-000002'}" in text, text
    for seq in (1, 2):
        flip_byte_in(tmp_path / ck.checkpoint_name(seq) / "buffer-0000.h5",
                     "/shards/0/columns/wseq")
    report = ck.inspect_checkpoint(tmp_path, verify=True)
    assert not report["ok"] and report["fallback"] is None
    assert "no older checkpoint is usable: --resume refuses them all" in ck.format_report(
        report)
    cheap = ck.inspect_checkpoint(tmp_path)  # without --verify the damage is not seen
    assert cheap["ok"] and "fallback" not in cheap


def test_checkpoint_config_section(tmp_path: Path) -> None:
    from conduit_hpc import Config, ConfigError

    cfg = Config.from_dict({"checkpoint": {"every_seconds": 30, "keep": 5}})
    assert cfg.checkpoint.every_seconds == 30.0 and cfg.checkpoint.keep == 5
    assert cfg.checkpoint.directory == "checkpoints" and cfg.checkpoint.on_stop
    for raw, fragment in [({"keep": -1}, "checkpoint.keep must be >= 0"),
                          ({"every_seconds": -2.0}, "checkpoint.every_seconds must be"),
                          ({"every_supersteps": -1}, "checkpoint.every_supersteps must be"),
                          ({"directory": " "}, "checkpoint.directory must be a non-empty"),
                          ({"every_minutes": 1}, "unknown key 'checkpoint.every_minutes'")]:
        with pytest.raises(ConfigError, match=fragment):
            Config.from_dict({"checkpoint": raw})


def test_checkpoint_roots_follow_the_run_directory(tmp_path: Path) -> None:
    from conduit_hpc import Config
    from conduit_hpc.features.checkpointing.resume import checkpoint_root, resume_roots

    cfg = Config.from_dict({"run": {"name": "job"}})
    for name in ("job-1", "job-2", "other-1"):
        (tmp_path / name).mkdir()
    assert checkpoint_root(cfg, tmp_path / "job-2") == tmp_path / "job-2" / "checkpoints"
    assert resume_roots(cfg, tmp_path / "job-2") == [tmp_path / "job-2" / "checkpoints",
                                                     tmp_path / "job-1" / "checkpoints"]
    absolute = Config.from_dict({"checkpoint": {"directory": str(tmp_path / "shared")}})
    assert resume_roots(absolute, tmp_path / "job-2") == [tmp_path / "shared"]


def test_the_samplers_state_round_trips_and_schema_1_still_opens(tmp_path: Path,
                                                                monkeypatch) -> None:
    """Schema 2 holds each learner's Sampler.state_dict (issue 23 item 5); a schema-1
    checkpoint (no ``sampler`` group) opens with none, and resume falls back to the
    superstep counter and the RNG."""
    state = {"sampler": "prioritized", "rng": "{}", "superstep_offset": 1234}
    new = write(tmp_path / "new", 1, sampler=state)
    c = ck.open_checkpoint(new)
    assert c.schema_version == 2 and c.sampler == {0: state}
    text = ck.format_report(ck.inspect_checkpoint(new))
    assert "samplers     rank 0: prioritized from superstep 1234" in text
    old = write(tmp_path / "old", 1)
    with h5py.File(old / ck.MANIFEST, "r") as f:
        assert len(f["sampler"]) == 0
    monkeypatch.setattr(ck.files, "SCHEMA_VERSION", 1)
    c1 = ck.open_checkpoint(write(tmp_path / "v1", 1))
    assert c1.schema_version == 1 and c1.sampler == {} and c1.rng[0]


# -- compression (issue 22 item 3) ----------------------------------------------------

@pytest.mark.parametrize("codec", ["lzf", "gzip", "gzip-9"])
def test_compressed_columns_round_trip(tmp_path: Path, codec: str) -> None:
    """Columns named in ``compression`` are chunked through the HDF5 filter, the others
    stay contiguous; every value comes back, the checksums hold, the virtual datasets
    read through the filter."""
    path = write(tmp_path, 1, compression={"payload": codec, "check": codec})
    with h5py.File(path / "buffer-0000.h5", "r") as f:
        ds = f["/shards/0/columns/payload"]
        assert ds.compression == ("lzf" if codec == "lzf" else "gzip")
        assert ds.attrs["compression"] == codec and ds.chunks is not None
        assert f["/shards/0/columns/wseq"].compression is None
        assert f["/shards/0/columns/wseq"].chunks is None
    c = ck.open_checkpoint(path, spec=SPEC)
    for s in snapshots():
        got = c.read_shard(s.shard_id)
        for name in SPEC.names:
            np.testing.assert_array_equal(got.columns[name], s.columns[name])
    c.verify()
    with h5py.File(path / ck.MANIFEST, "r") as f:
        np.testing.assert_array_equal(f["experience/payload"][:], np.concatenate(
            [s.columns["payload"] for s in snapshots()]))


def test_compressed_atari_frames_are_smaller_and_exact(tmp_path: Path) -> None:
    """A frame column with structure (a moving block on a still background, as Atari
    frames are): gzip stores it in a small fraction of its bytes, bit for bit."""
    n = 64
    frames = np.zeros((n, 84, 84), np.uint8)
    frames[:, 70:, :] = 87  # the ground
    for i in range(n):
        frames[i, 10 + i % 50:14 + i % 50, 20:24] = 236  # the ball
    snap = ShardSnapshot(shard_id=0, capacity=n, commit=n, seqs=np.arange(n),
                         columns={"frame": frames}, priority=np.ones(n),
                         init_priority=np.ones(n), max_priority=1.0)
    snap.check(Spec.from_dict({"frame": ("uint8", (84, 84))}))
    sizes = {}
    for codec in ("none", "gzip"):
        rec = ck.write_shard_file(tmp_path / f"{codec}.h5", [snap],
                                  compression={"frame": codec})
        sizes[codec] = rec["file"]["bytes"]
        with h5py.File(tmp_path / f"{codec}.h5", "r") as f:
            np.testing.assert_array_equal(f["/shards/0/columns/frame"][:], frames)
    assert sizes["gzip"] < sizes["none"] / 10, sizes


def flip_bytes_in_chunk(path: Path, dataset: str, count: int = 8) -> None:
    """Invert ``count`` bytes in the middle of the dataset's first compressed chunk."""
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        at = info.byte_offset + info.size // 2 - count // 2
        fh.seek(at)
        b = fh.read(count)
        fh.seek(at)
        fh.write(bytes(x ^ 0xFF for x in b))


@pytest.mark.parametrize("codec", ["lzf", "gzip"])
def test_refuses_a_damaged_compressed_block_naming_the_dataset(tmp_path: Path,
                                                               codec: str) -> None:
    path = write(tmp_path, 1, compression={"payload": codec})
    flip_bytes_in_chunk(path / "buffer-0000.h5", "/shards/0/columns/payload")
    c = ck.open_checkpoint(path, spec=SPEC)  # sizes are right: the cheap checks pass
    c.read_shard(1)  # the other shard's datasets are intact
    with pytest.raises(CheckpointError, match=r"buffer-0000.h5: dataset "
                                              r"/shards/0/columns/payload (cannot be read "
                                              r"\(a compressed block is damaged|fails its "
                                              r"checksum)"):
        c.read_shard(0)
    bad = ck.inspect_checkpoint(path, verify=True)
    assert not bad["ok"] and "/shards/0/columns/payload" in bad["error"]
    cols = bad["columns"]  # headers only: readable though a block is damaged
    assert cols["payload"]["codec"] == codec and cols["wseq"]["codec"] == "none"
    assert cols["payload"]["raw_bytes"] == 29 * 6 * 8
    assert cols["wseq"]["stored_bytes"] == cols["wseq"]["raw_bytes"] == 29 * 8
    assert f"payload: {codec} " in ck.format_report(bad)


def test_unknown_codec_is_refused_when_writing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint codec 'zstd' is unknown"):
        ck.write_shard_file(tmp_path / "x.h5", snapshots()[:1],
                            compression={"payload": "zstd"})


FRAMED_SPEC = {"obs": {"dtype": "uint8", "shape": [4, 84, 84],
                       "stack": {"axis": 0, "stream": "env"}},
               "next_obs": {"dtype": "uint8", "shape": [4, 84, 84], "next_of": "obs"},
               "env": {"dtype": "int64"}, "reward": {"dtype": "float32"}}


def test_compression_config_is_checked_when_it_loads() -> None:
    from conduit_hpc import Config, ConfigError
    from conduit_hpc.storage.frames import stored_owner

    cfg = Config.from_dict({"spec": FRAMED_SPEC,
                            "checkpoint": {"compression": {"obs": "gzip", "reward": "lzf"}}})
    assert cfg.checkpoint.compression == {"obs": "gzip", "reward": "lzf"}
    assert Config.from_dict({}).checkpoint.compression == {}
    # a stacked field's codec covers its stored frames and references
    owner = stored_owner(Spec.from_config(cfg.spec))
    assert owner["obs__frame"] == owner["obs__refs"] == "obs" and owner["reward"] == "reward"
    assert owner["frames__lag"] == ""
    for comp, key, fragment in [
            ({"obs": "zstd"}, "checkpoint.compression.obs",
             r"must be one of none, lzf, gzip, gzip-1, .*gzip-9, got 'zstd'"),
            ({"obs": "gzip-0"}, "checkpoint.compression.obs", r"got 'gzip-0'"),
            ({"obs": 1}, "checkpoint.compression.obs", r"must be a string"),
            ({"pixels": "gzip"}, "checkpoint.compression.pixels",
             r"must be a spec field \(the fields: obs, next_obs, env, reward\), got "
             r"'pixels'"),
            ({"next_obs": "gzip"}, "checkpoint.compression.next_obs",
             r"next stack of spec.obs \(next_of\).*name 'obs', got 'next_obs'")]:
        with pytest.raises(ConfigError, match=fragment) as err:
            Config.from_dict({"spec": FRAMED_SPEC, "checkpoint": {"compression": comp}})
        assert err.value.key == key


def test_a_resume_into_a_smaller_replay_says_how_many_rows_it_left_out() -> None:
    # it said only "resharded" while 2,893 of 3,893 rows stayed behind (a hostile test,
    # stop 35)
    from conduit_hpc.features.checkpointing.resume import RestoreResult, restore_lines

    base = dict(path=Path("ckpt-000002"), seq=2, rows=1000, resharded=True, dropped=2893,
                counters={}, rng_state=None, extra_state={}, config_toml="", skipped=[])
    line = restore_lines(RestoreResult(**base), "latest")[-1]
    assert line.endswith("1,000 rows, resharded; 2,893 oldest rows left out: the "
                         "replay's capacity now holds fewer")
    assert "left out" not in restore_lines(RestoreResult(**{**base, "dropped": 0}),
                                           "latest")[-1]
    # frames stored once: rows and dropped count slots, and the line says so, with the
    # transitions among them (it called 1,000 slots 1,000 rows)
    line = restore_lines(RestoreResult(**base, transitions=700), "latest")[-1]
    assert line.endswith("1,000 slots, resharded; 2,893 oldest slots left out: the replay's "
                         "capacity now holds fewer (frames stored once: 700 of the "
                         "checkpoint's slots are transitions, the others hold frames only)")
