"""Each frame stored once: the real shard storage (storage/frames.py through ShardRing and
OwnedShard, COMM_SELF windows) against the single-process reference model
(storage/frames_reference.py): random interleavings of streams, episode ends, laps,
several writers; a checkpoint round trip through HDF5; the refusals."""

from __future__ import annotations

import time
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from conduit_hpc import CheckpointError, ConfigError, SpecError
from conduit_hpc import checkpoint as ck
from conduit_hpc.config import FieldConfig, StackConfig
from conduit_hpc.plane.buffer import OwnedShard
from conduit_hpc.spec import Field, FrameStack, Spec
from conduit_hpc.storage import PriorityIndex, ShardLayout, ShardRing
from conduit_hpc.storage.frames import (
    LAG_COLUMN,
    LAG_NONE,
    FrameCodec,
    FrameWriter,
    fingerprints,
    stored_spec,
)
from conduit_hpc.storage.frames_reference import FrameReplay, FrameRing
from conduit_hpc.storage.frames_reshard import reshard_frames
from conduit_hpc.storage.migrate import move_rows
from conduit_hpc.storage.snapshot import restore_snapshot, take_snapshot
from conduit_hpc.testing import FRAME_SPEC, frame_rows, frame_stacks_of, make_config
from conduit_hpc.transport.rma import RmaWindow

FRAME = (2, 3)
DEPTH = 4
FSPEC = Spec.from_config(make_config(spec=FRAME_SPEC).spec)


def spec_for(axis: int) -> Spec:
    shape = list(FRAME)
    shape.insert(axis, DEPTH)
    return Spec.from_config({
        "obs": FieldConfig(dtype="uint8", shape=tuple(shape),
                           stack=StackConfig(axis=axis, stream="env")),
        "next_obs": FieldConfig(dtype="uint8", shape=tuple(shape), next_of="obs"),
        "env": FieldConfig(dtype="int64"),
        "rid": FieldConfig(dtype="int64"),
    })


class Shard:
    """Writers and the owner of one shard of ``spec`` in a COMM_SELF window."""

    def __init__(self, spec: Spec, cap: int, writers: int = 1, *, direct: bool = True,
                 **owned: object) -> None:
        self.layout = lay = ShardLayout(spec, cap)
        self.win = RmaWindow(MPI.COMM_SELF, lay.nbytes, node_comm=MPI.COMM_SELF,
                             shared=direct)
        owner = ShardRing(self.win, 0, 0, lay, timeout_s=2.0)
        owner.views = lay.views(self.win.own_segment(), 0)
        self.owned = OwnedShard(0, owner, PriorityIndex(cap, alpha=0.6), **owned)
        self.writers = [ShardRing(self.win, 0, 0, lay, timeout_s=2.0) for _ in range(writers)]
        self.reader = ShardRing(self.win, 0, 0, lay, timeout_s=2.0)
        for w in self.writers:
            w.on_wait = self.owned.poll

    def write(self, w: int, batch: dict[str, np.ndarray]) -> range:
        """Write through writer ``w``; the owner's pass; the seqs of the rows."""
        ring = self.writers[w]
        first = ring.write(self.layout.spec.validate(batch))
        self.owned.poll()
        return range(first, first + len(batch["env"]))

    def delivered(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Every committed seq a reader would deliver now, with its rows: those the
        index holds (drawable, or hidden by the owner) that are intact."""
        ring, ix = self.owned.ring, self.owned.index
        commit = ring.commit_cursor()
        seqs = np.arange(max(0, commit - ring.capacity), commit, dtype=np.int64)
        cols, cursor = self.reader.gather(seqs % ring.capacity)
        slots = seqs % ring.capacity
        indexed = (ix.gens[slots] == seqs + 1) | (ix.hidden_gens[slots] == seqs + 1)
        ok = self.reader.intact(seqs + 1, cursor) & indexed
        return seqs[ok], {k: v[ok] for k, v in cols.items()}

    def close(self) -> None:
        self.win.close()


class Actors:
    """Streams of frames as actors make them, the reference model as the oracle: what
    each row's stacks were (``stacks(rid)``). The reference pads an episode's first
    stacks by repeating its first frame; with ``zero_fill`` the actors pad with zeros
    instead (the other common rule): the padding frames are zero frames."""

    def __init__(self, n_step: int, zero_fill: bool = False) -> None:
        self.frames = FrameRing(1 << 20, FRAME, depth=DEPTH)  # never laps: the truth
        self.replay = FrameReplay(self.frames, 1 << 20)
        self.n, self.zero_fill = n_step, zero_fill
        self.episode: dict[int, list[int]] = {}
        self.pending: list[tuple[int, int]] = []  # (stream, rid)
        self.at: dict[int, tuple[int, int]] = {}  # rid -> episode positions of its frames

    def step(self, stream: int, reset: bool, sym: int) -> None:
        ep = self.episode.get(stream)
        if reset or ep is None:
            if ep:
                self._rows(stream, [(o, ep[-1]) for o in ep[max(0, len(ep) - self.n):-1]])
            ep = self.episode[stream] = []
        frame = ((np.arange(6).reshape(FRAME) * (sym + 1) + sym * 7) % 5).astype(np.uint8)
        ep.append(self.frames.append(stream, frame, episode_start=not ep))
        if len(ep) > self.n:
            self._rows(stream, [(ep[-1 - self.n], ep[-1])])

    def _rows(self, stream: int, pairs: list[tuple[int, int]]) -> None:
        ep = self.episode[stream]
        for o, nx in pairs:
            rid = self.replay.add(o, nx)
            self.pending.append((stream, rid))
            self.at[rid] = (ep.index(o), ep.index(nx))

    def stacks(self, rid: int) -> tuple[np.ndarray, np.ndarray]:
        """The row's obs and next_obs stacks as its actor made them (oldest first)."""
        obs, nxt = self.replay.get(rid)
        if self.zero_fill:
            for st_, t in zip((obs, nxt), self.at[rid], strict=True):
                st_[:max(0, DEPTH - 1 - t)] = 0  # the frames before the episode
        return obs, nxt

    def batch(self, k: int, axis: int) -> dict[str, np.ndarray] | None:
        take, self.pending = self.pending[:k], self.pending[k:]
        if not take:
            return None
        obs, nxt = zip(*(self.stacks(rid) for _, rid in take), strict=True)
        return {"obs": np.moveaxis(np.stack(obs), 1, 1 + axis),
                "next_obs": np.moveaxis(np.stack(nxt), 1, 1 + axis),
                "env": np.array([s for s, _ in take], np.int64),
                "rid": np.array([r for _, r in take], np.int64)}

    def check(self, seqs: np.ndarray, cols: dict[str, np.ndarray], rows_at: dict[int, int],
              axis: int) -> None:
        """Every delivered row is a row (never a frames-only slot) and exactly its
        actor's stacks."""
        for i, q in enumerate(seqs):
            rid = int(cols["rid"][i])
            assert rows_at.get(int(q)) == rid, f"seq {q}: delivered a slot that is no row"
            obs, nxt = self.stacks(rid)
            np.testing.assert_array_equal(cols["obs"][i], np.moveaxis(obs, 0, axis))
            np.testing.assert_array_equal(cols["next_obs"][i], np.moveaxis(nxt, 0, axis))
            assert cols["env"][i] == self.replay.stream(rid)


def _drawable(shard: Shard) -> list[int]:
    """The seqs a learner could draw now: held in the index with mass > 0."""
    idx, ring = shard.owned.index, shard.owned.ring
    commit, cap = ring.commit_cursor(), ring.capacity
    return [q for q in range(max(0, commit - cap), commit)
            if idx.gens[q % cap] == q + 1 and idx.sum.leaves[q % cap] > 0]


EVENTS = st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.integers(0, 5),
                            st.integers(0, 6), st.integers(0, 2)), min_size=1, max_size=120)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=EVENTS, axis=st.sampled_from([0, 2]), cap=st.sampled_from([40, 64, 97]),
       n_step=st.integers(1, 3), zero_fill=st.booleans())
def test_delivered_stacks_equal_the_reference(events, axis, cap, n_step, zero_fill) -> None:
    """Streams interleave, episodes end (their first stacks padded by repeating the first
    frame, or with zeros), several writers share the shard, the ring laps: every row
    delivered is exactly what its actor made; frames-only slots are never drawable nor
    delivered; the rows just written are all deliverable, and so is every drawable row
    (the owner hides rows whose frames are gone)."""
    spec = spec_for(axis)
    shard, actors = Shard(spec, cap, writers=3), Actors(n_step, zero_fill)
    rows_at: dict[int, int] = {}
    try:
        for stream, reset, sym, flush, writer in events:
            actors.step(stream, reset and sym < 2, sym)
            batch = actors.batch(flush, axis) if flush else None
            if batch is None:
                continue
            seqs = shard.write(writer, batch)
            rows_at.update(zip(seqs, batch["rid"].tolist(), strict=True))
            got, cols = shard.delivered()
            actors.check(got, cols, rows_at, axis)
            assert set(seqs) <= set(got.tolist()), "a row just written is not deliverable"
            # frames-only slots: held with mass 0 (never drawn), never delivered
            idx, ring = shard.owned.index, shard.owned.ring
            commit = ring.commit_cursor()
            for q in range(max(0, commit - cap), commit):
                if q not in rows_at and idx.gens[q % cap] == q + 1:
                    assert idx.sum.leaves[q % cap] == 0
            # the owner hides a row once its oldest frame's slot is handed to a writer:
            # every drawable row is deliverable (a learner never draws one to redraw)
            gone = set(_drawable(shard)) - set(got.tolist())
            assert not gone, f"drawable rows whose frames are gone: {sorted(gone)}"
    finally:
        shard.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "rma"])
@pytest.mark.parametrize("clash", [False, True], ids=["", "clashing-fingerprints"])
def test_interleaved_episodes_lap_and_store_one_frame_a_step(direct: bool, clash: bool,
                                                             monkeypatch) -> None:
    """Atari-like rows (n = 3) of 5 streams in batches of 4: about one slot per row, the
    stacks exact through many laps, over shared memory and over RMA gets; with every
    fingerprint equal, the byte check still keeps every stack exact."""
    if clash:
        monkeypatch.setattr("conduit_hpc.storage.frames.fingerprints",
                            lambda f: np.zeros(len(f), np.uint64))
    spec = FSPEC
    shard = Shard(spec, 64, writers=2, direct=direct)
    rng = np.random.default_rng(0)
    eps = [frame_rows(e, 0, int(rng.integers(20, 60))) for e in range(5)]
    pos, slots0, rows = [0] * 5, shard.owned.ring.reserve_cursor(), 0
    try:
        while any(p < len(ep["env"]) for p, ep in zip(pos, eps, strict=True)):
            parts = []
            for e in range(5):
                k = min(4, len(eps[e]["env"]) - pos[e])
                parts.append({n: c[pos[e]:pos[e] + k] for n, c in eps[e].items()})
                pos[e] += k
            for e, part in enumerate(parts):
                if len(part["env"]):
                    shard.write(e % 2, part)
                    rows += len(part["env"])
            seqs, cols = shard.delivered()
            assert frame_stacks_of(cols).all()
            # rows die when their oldest frame (about 25 slots back here) is overwritten
            assert clash or rows < 64 or len(seqs) >= 24, len(seqs)
            # ... and the owner hides them then: every drawable row is deliverable
            gone = set(_drawable(shard)) - set(seqs.tolist())
            assert not gone, f"drawable rows whose frames are gone: {sorted(gone)}"
        slots = shard.owned.ring.reserve_cursor() - slots0
        writers = shard.writers
        if clash:
            assert sum(w.frames.fingerprint_clashes for w in writers if w.frames) > 0
        else:  # one frame a step; episode starts take n more
            assert slots <= rows + 5 * 3 + 5
    finally:
        shard.close()


def _hidden_exactly_where_broken(shard: Shard) -> int:
    """Every row the index holds is hidden iff the slot of its oldest frame lies below
    the owner's hidden cursor (its own slot's, for a row without older frames): the
    guard band hides rows whose slots writers may take next, the frame tracking rows
    whose frames they may take. Returns the rows hidden for their frames only."""
    own, ring = shard.owned, shard.owned.ring
    ix, cap, upto = own.index, ring.capacity, own.hidden_upto
    commit = ring.commit_cursor()
    seqs = np.arange(max(0, commit - cap), commit, dtype=np.int64)
    slots = seqs % cap
    lag = ring.views.columns[LAG_COLUMN][slots]
    row = lag < LAG_NONE
    seqs, slots, lag = seqs[row], slots[row], lag[row]
    shown, hidden = ix.gens[slots] == seqs + 1, ix.hidden_gens[slots] == seqs + 1
    assert not (shown & hidden).any()
    held = shown | hidden
    brk = seqs - lag + cap
    wrong = held & (hidden != (brk < upto))
    assert not wrong.any(), (f"rows hidden (or shown) against their breaks, hidden cursor "
                             f"{upto}: seqs {seqs[wrong].tolist()}, breaks "
                             f"{brk[wrong].tolist()}, hidden {hidden[wrong].tolist()}")
    return int((hidden & (seqs + cap >= upto)).sum())


def test_a_band_given_back_keeps_rows_hidden_exactly_while_their_frames_are_due() -> None:
    """A guarded shard of frame stacks whose writers pause (the owner takes its guard
    band back for sampling) and resume, many times, over many laps: after every pass a
    row is hidden iff its oldest frame's slot is due - a give-back leaves hidden the
    rows whose frames writers hold and makes the others drawable again (none stays
    hidden for a band that is gone) - and ``frame_hidden_rows`` counts at least every
    row hidden for its frames alone."""
    shard = Shard(FSPEC, 64, writers=2, guarded=True, guard_s=1.0, idle_s=0.01)
    own = shard.owned
    rng = np.random.default_rng(7)
    eps = [frame_rows(e, 0, 200) for e in range(3)]
    pos = [0] * 3
    try:
        for _ in range(20):
            for _ in range(int(rng.integers(2, 6))):
                e = int(rng.integers(0, 3))
                k = int(rng.integers(1, 5))
                part = {n: c[pos[e]:pos[e] + k] for n, c in eps[e].items()}
                pos[e] += k
                shard.write(e % 2, part)
                time.sleep(0.003)  # a measured insert rate: the owner keeps a band
                own.poll()
                _hidden_exactly_where_broken(shard)
            time.sleep(0.03)  # writers idle: the band is given back
            own.poll()
            own.poll()
            frames_only = _hidden_exactly_where_broken(shard)
            assert own.frame_hidden_rows >= frames_only
            seqs, _ = shard.delivered()
            drawable = set(_drawable(shard))
            assert drawable <= set(seqs.tolist()), "a drawable row whose frames are gone"
        assert own.revocations > 0 and own.unhidden_rows > 0 and own.frame_hidden_rows > 0
    finally:
        shard.close()


def test_stored_bytes_of_an_atari_row_are_under_a_sixth() -> None:
    atari = {"obs": {"dtype": "uint8", "shape": [4, 84, 84],
                     "stack": {"axis": 0, "stream": "env"}},
             "next_obs": {"dtype": "uint8", "shape": [4, 84, 84], "next_of": "obs"},
             "action": {"dtype": "int64"}, "reward": {"dtype": "float32"},
             "env": {"dtype": "int64"}, "discount": {"dtype": "float32"}}
    framed = Spec.from_config(make_config(spec=atari).spec)
    plain = Spec.from_config(make_config(spec={
        k: {a: b for a, b in v.items() if a not in ("stack", "next_of")}
        for k, v in atari.items()}).spec)
    cap = 10_000
    ratio = ShardLayout(framed, cap).nbytes / ShardLayout(plain, cap).nbytes
    assert ratio <= 1 / 6, ratio
    assert stored_spec(plain) is plain and "obs__frame" in stored_spec(framed).names


def test_bench_frames_reports_a_sixth_or_less(capsys, tmp_path: Path) -> None:
    from conduit_hpc.bench import frames

    out = frames.main(["--capacity", "300", "--rows", "600", "--streams", "3",
                       "--repeats", "1", "--batches", "32", "--checkpoint", "--codec", "lzf",
                       "--dir", str(tmp_path)])
    full, once = out["results"]
    assert full["layout"] == "full" and once["layout"] == "frames_once"
    assert once["ratio_to_full"] <= 1 / 6 and once["deliverable_fraction"] > 0.8
    assert "bytes/transition" in capsys.readouterr().out
    # checkpoints of both layouts, plain and through lzf: restored rows are the same
    for r in (full, once):
        assert [c["codec"] for c in r["checkpoint"]] == ["none", "lzf"]
        assert all(c["exact"] and c["rows_compared"] > 100 for c in r["checkpoint"])
    assert once["checkpoint"][0]["ratio_to_full"] <= 1 / 6


def _write_checkpoint(root: Path, snap, spec: Spec, config_toml: str = "") -> Path:
    tmp = root / ".tmp-ckpt"
    tmp.mkdir(parents=True)
    rec = ck.write_shard_file(tmp / "buffer-0000.h5", [snap], attrs={"world_rank": 1})
    parts = [{"world_rank": 1, "role": "buffer", "rng": None, "counters": {},
              "files": [rec["file"]], "shards": rec["shards"]}]
    placement = {"shards": [{"shard_id": 0, "owner_rank": 1, "tier": "buffer_host",
                             "capacity_rows": snap.capacity}],
                 "actor_shards": {}, "learner_shards": {}}
    layout = {"world_size": 2, "learner_ranks": [], "buffer_ranks": [1], "actor_ranks": [0],
              "node_of": [0, 0]}
    man = ck.write_manifest(tmp, seq=1, spec=spec, config_toml=config_toml, layout=layout,
                            placement=placement, parts=parts)
    final = root / ck.checkpoint_name(1)
    ck.finalize(tmp, final, man)
    return final


def test_checkpoint_round_trip_of_a_deduplicated_shard(tmp_path: Path) -> None:
    """Cut a lapped shard, write it to HDF5 (frames once), restore into a fresh shard:
    the same rows are delivered, exactly (less only those whose frames lay before the
    cut); writing goes on after the restore, stacks still exact."""
    spec = FSPEC
    cap = 80
    a = Shard(spec, cap, writers=1)
    eps = [frame_rows(e, 1, 70) for e in range(3)]
    for lo in range(0, 70, 5):
        for ep in eps:
            a.write(0, {n: c[lo:lo + 5] for n, c in ep.items()})
    live_seqs, live = a.delivered()
    ring = a.owned.ring
    snap = take_snapshot(0, ring, a.owned.index)
    assert LAG_COLUMN in snap.columns and "obs" not in snap.columns
    lag = ring.views.columns[LAG_COLUMN][live_seqs % cap]
    keep = live_seqs - lag >= snap.seqs[0]
    path = _write_checkpoint(tmp_path, snap, stored_spec(spec))
    a.close()
    with pytest.raises(CheckpointError, match="different spec"):
        ck.open_checkpoint(path, spec=spec)  # the plain columns are not what it holds
    back = ck.open_checkpoint(path, spec=stored_spec(spec)).read_shard(0)
    b = Shard(spec, cap, writers=1)
    try:
        with b.owned.writing():
            restore_snapshot(b.owned.ring, b.owned.index, back)
        b.owned.hidden_upto = back.commit
        b.owned.track_held_frames()  # as the restore of a running job does
        b.owned.poll()
        seqs, cols = b.delivered()
        np.testing.assert_array_equal(seqs, live_seqs[keep])
        # rows whose frames the cut lacks are hidden: every drawable row is delivered
        assert set(_drawable(b)) == set(seqs.tolist())
        for k in cols:
            np.testing.assert_array_equal(cols[k], live[k][keep])
        assert frame_stacks_of(cols).all() and len(seqs) > cap // 2
        for ep in [frame_rows(e, 2, 30) for e in range(3)]:
            b.write(0, ep)  # a fresh writer after the restore
        seqs, cols = b.delivered()
        assert frame_stacks_of(cols).all() and (cols["episode"] == 2).any()
    finally:
        b.close()


def _keys(cols: dict[str, np.ndarray]) -> list[tuple[int, int, int]]:
    return list(zip(cols["env"].tolist(), cols["episode"].tolist(), cols["step"].tolist(),
                    strict=True))


@pytest.mark.parametrize(("old_caps", "new_caps"), [((80,), (50, 70)), ((60, 90), (200,)),
                                                  ((80,), (30,))])
def test_reshard_writes_each_frame_once_again(old_caps, new_caps) -> None:
    """Cuts of lapped shards dealt over other shards: every row delivered from the new
    shards is a row the old ones delivered, exactly, with its priority; about all of
    them move when the new shards have the room, the newest when they do not."""
    rng = np.random.default_rng(3)
    snaps, live, prio = [], {}, {}
    for sid, cap in enumerate(old_caps):
        a = Shard(FSPEC, cap)
        eps = [frame_rows(10 * sid + e, 1, 60) for e in range(3)]
        for lo in range(0, 60, 4):
            for ep in eps:
                a.write(0, {n: c[lo:lo + 4] for n, c in ep.items()})
        idx = a.owned.index
        held = np.flatnonzero(idx.gens > 0)
        idx.update(held, idx.gens[held], rng.uniform(0.5, 3.0, len(held)))
        seqs, cols = a.delivered()
        for q, key in zip(seqs, _keys(cols), strict=True):
            live[key] = cols
            prio[key] = idx.priority[q % cap]
        snaps.append(take_snapshot(sid, a.owned.ring, idx))
        a.close()
    codec = ShardLayout(FSPEC, 8).frames
    assert codec is not None
    new, dropped = reshard_frames(codec, len(snaps), snaps.__getitem__, new_caps,
                                  list(range(len(new_caps))), 3.0, chunk_rows=7)
    room = sum(new_caps) >= sum(old_caps)
    assert dropped == max(0, len(live) - sum(new_caps))
    moved = []
    for k, cap in enumerate(new_caps):
        b = Shard(FSPEC, cap)
        try:
            with b.owned.writing():
                restore_snapshot(b.owned.ring, b.owned.index, new[k])
            b.owned.hidden_upto = new[k].commit
            seqs, cols = b.delivered()
            assert frame_stacks_of(cols).all()
            for q, key in zip(seqs, _keys(cols), strict=True):
                assert key in live and b.owned.index.priority[q % cap] == prio[key]
            moved += _keys(cols)
        finally:
            b.close()
    assert len(set(moved)) == len(moved)  # no row twice
    if room:
        assert len(moved) >= 0.9 * len(live)
    else:  # the newest rows that fit (a few at the cut's edge lose their frames)
        assert 0.6 * new_caps[0] <= len(moved) <= new_caps[0]


def test_rows_moved_to_another_shard_keep_their_stacks() -> None:
    """Live re-placement's row move (storage/migrate.py) out of a lapped frame-once shard:
    the rows deliverable there arrive whole (frames stored once again), nothing else."""
    a, b = Shard(FSPEC, 64), Shard(FSPEC, 160)
    try:
        eps = [frame_rows(e, 3, 50) for e in range(3)]
        for lo in range(0, 50, 3):
            for ep in eps:
                a.write(0, {n: c[lo:lo + 3] for n, c in ep.items()})
        _, live = a.delivered()
        # every slot: the rows the owner hid (their frames are gone) are skipped
        rec = move_rows(a.owned.ring, a.owned.index, b.writers[0], np.arange(64))
        b.owned.poll()
        _, got = b.delivered()
        assert frame_stacks_of(got).all()
        assert sorted(_keys(got)) == sorted(_keys(live)) and rec.skipped > 0
    finally:
        a.close()
        b.close()


def test_refusals_name_the_field() -> None:
    fields = [Field("obs", np.dtype(np.uint8), (4, 2)), Field("env", np.dtype(np.int64))]
    with pytest.raises(SpecError, match=r"'obs'.*depth 3"):
        Spec(fields, {"obs": FrameStack("obs", "env", 0, 3, (2,))})
    with pytest.raises(SpecError, match="stream 'nope'"):
        Spec(fields, {"obs": FrameStack("obs", "nope", 0, 4, (2,))})
    with pytest.raises(SpecError, match="next field 'env'"):
        Spec(fields, {"obs": FrameStack("obs", "env", 0, 4, (2,), "env")})
    with pytest.raises(ConfigError, match=r"stack\.axis .* got 3"):
        FieldConfig(dtype="uint8", shape=(4, 2, 2), stack=StackConfig(axis=3, stream="env"))
    bad = dict(FRAME_SPEC, obs__frame={"dtype": "uint8"})
    with pytest.raises(SpecError, match="obs__frame"):
        ShardLayout(Spec.from_config(make_config(spec=bad).spec), 8)
    with pytest.raises(ConfigError, match=r"scheduler\.sampler"):
        make_config(spec=FRAME_SPEC, scheduler={"sampler": "sequence",
                                                "sequence_length": 2})


def test_a_batch_that_needs_more_slots_than_the_shard_is_refused() -> None:
    spec = FSPEC
    shard = Shard(spec, 8)
    try:
        rows = {n: c[:2] for n, c in frame_rows(0, 0, 2).items()}
        # 8 frames no row shares, and the one frame both obs stacks repeat
        rows["next_obs"] = (np.arange(8)[:, None] + 100 + np.arange(30)).astype(
            np.uint8).reshape(2, 4, 6, 5)
        with pytest.raises(SpecError, match="taking 9 slots"):
            shard.write(0, rows)
    finally:
        shard.close()


def test_lag_none_never_intact_and_an_empty_gather() -> None:
    spec = FSPEC
    ring = Shard(spec, 8)
    try:
        assert not ring.reader.intact(np.array([1]), np.array([LAG_NONE])).any()
        ring.write(0, {n: c[:2] for n, c in frame_rows(0, 0, 2).items()})
        cols, cursor = ring.reader.gather(np.zeros(0, np.int64))
        assert len(cols["obs"]) == 0 and len(cursor) == 0
    finally:
        ring.close()


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 40), shape=st.sampled_from([(84, 84), (3, 5), (7,), (2, 3, 4), (1,)]),
       dtype=st.sampled_from([np.uint8, np.float32, np.int16]), seed=st.integers(0, 2**32 - 1))
def test_compiled_fingerprints_equal_numpy(m, shape, dtype, seed) -> None:
    """The compiled fingerprint is numpy's uint64 matmul bit for bit, for frames whose
    bytes are a multiple of 8, 4, 2 or 1 (the word size follows)."""
    from conduit_hpc.storage.frames import fingerprints

    raw = np.random.default_rng(seed).integers(0, 256, (m, *shape, np.dtype(dtype).itemsize),
                                               dtype=np.uint8)
    frames = raw.view(dtype).reshape(m, *shape)
    assert np.array_equal(fingerprints(frames), fingerprints(frames, compiled=False))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 30), words=st.sampled_from([1, 3, 882]), seed=st.integers(0, 2**32 - 1),
       dtype=st.sampled_from([np.uint8, np.uint64]))
def test_compiled_byte_check_equals_numpy(n, words, seed, dtype) -> None:
    """FrameWriter's byte check, compiled against numpy: frames of a batch (in one part,
    or two: its fields') against remembered frames and against the batch's own frames,
    equal and differing (in one word anywhere, the first and the last included)."""
    from conduit_hpc.storage.frames import FrameWriter
    from conduit_hpc.storage.frames_store import FrameStore as _FrameStore

    rng = np.random.default_rng(seed)
    batch = rng.integers(0, 4, (n, words)).astype(dtype)
    store = _FrameStore()
    rows = store.put(batch[rng.permutation(n)][: max(1, n // 2)])
    at = rng.integers(0, n, 2 * n)
    src = np.where(rng.random(2 * n) < 0.5, rng.choice(rows, 2 * n), -1 - rng.integers(0, n, 2 * n))
    same = rng.random(2 * n) < 0.5  # make about half of the pairs equal
    assert store.data is not None
    for j in np.flatnonzero(same):
        if src[j] >= 0:
            batch[at[j]] = store.data[src[j]]
        else:
            at[j] = -1 - src[j]
    cut = int(rng.integers(0, n + 1))  # the batch's frames as two fields' (or one)
    parts = (batch[:cut], batch[cut:]) if cut < n else (batch,)
    a = FrameWriter._differ(parts, store, at, src)
    b = FrameWriter._differ(parts, store, at, src, compiled=False)
    want = [not np.array_equal(batch[x], store.data[s] if s >= 0 else batch[-1 - s])
            for x, s in zip(at, src, strict=True)]
    assert a.tolist() == b.tolist() == want


def test_the_frame_store_reuses_rows_only_once_freed() -> None:
    """A remembered frame's store row is never handed out again while a fingerprint still
    points at it (its bytes are what every later reference is checked against)."""
    from conduit_hpc.storage.frames import FrameCodec, FrameWriter

    spec = Spec.from_config(make_config(spec=FRAME_SPEC).spec)
    w = FrameWriter(FrameCodec(spec), keep_per_stream=3)
    first = 0
    for e in range(6):
        rows = frame_rows(e % 3, 0, 9)
        plan = w.plan(spec.validate(rows), first, 1000)
        w.columns(plan, rows, first, None)
        first += plan.slots
        for gi, store in enumerate(w.stores):
            held = [row for seen in w.known[gi].values() for _, row in seen.values()]
            assert len(held) == len(set(held)), "two remembered frames share a store row"
            assert not set(held) & set(store.free), "a remembered frame's row is free"
            assert store.data is not None
            assert len(held) + len(store.free) == len(store.data), "a store row leaked"


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 40)), min_size=1,
                      max_size=12),
       streams=st.integers(1, 4), alphabet=st.integers(1, 6), clash=st.booleans(),
       seed=st.integers(0, 2**32 - 1), cap=st.sampled_from([16, 64, 4096]))
def test_vectorized_plan_equals_the_frame_by_frame_plan(steps, streams, alphabet, clash, seed,
                                                         cap) -> None:
    """FrameWriter.plan looks each distinct (stream, fingerprint) up once; the reference
    looks up every frame in turn. Two writers fed the same batches (frames from a small
    alphabet: repeats within a batch, across batches and across streams; with every
    fingerprint equal, the byte check alone tells frames apart; the reserve cursor
    moving on by ``skip`` puts remembered frames past the horizon) make the same plans
    and remember the same frames."""
    with patch("conduit_hpc.storage.frames.fingerprints",
               (lambda f: np.zeros(len(f), np.uint64)) if clash else fingerprints):
        _plans_agree(steps, streams, alphabet, seed, cap)


def _plans_agree(steps, streams, alphabet, seed, cap) -> None:
    spec = spec_for(0)
    fast, ref = FrameWriter(FrameCodec(spec)), FrameWriter(FrameCodec(spec))
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 3, (alphabet, *FRAME)).astype(np.uint8)
    first = 0
    for rows, skip in steps:
        pick = rng.integers(0, alphabet, (2, rows, DEPTH))
        batch = spec.validate({"obs": pool[pick[0]], "next_obs": pool[pick[1]],
                               "env": rng.integers(0, streams, rows),
                               "rid": np.arange(rows)})
        first += skip
        a = fast.plan(batch, first, cap, vectorized=True)  # (by default, small batches
        b = ref.plan(batch, first, cap, vectorized=False)  # take the reference's path)
        assert (a.rows, a.slots, a.new) == (b.rows, b.slots, b.new)
        for x, y in zip(a.refs, b.refs, strict=True):
            assert np.array_equal(x, y)
        fast.columns(a, batch, first, None)
        ref.columns(b, batch, first, None)
        assert fast.known == ref.known
        assert fast.fingerprint_clashes == ref.fingerprint_clashes
        first += a.slots


def test_a_writer_forgets_frames_past_the_horizon_whatever_the_streams() -> None:
    """Bounded memory: a writer remembers only frames a row may still reference (at or
    past half a lap before the reserve cursor), however many streams it has seen. A
    stream id per episode (a new stream every few rows) once kept every stream's
    frames forever: the remembered frames, and the store's rows, grew with the streams."""
    spec = Spec.from_config(make_config(spec=FRAME_SPEC).spec)
    cap = 64
    w = FrameWriter(FrameCodec(spec))
    first = 0
    for ep in range(400):
        rows = frame_rows(ep, ep, 6)  # a new stream each episode
        plan = w.plan(spec.validate(rows), first, cap)
        w.columns(plan, rows, first, None)
        first += plan.slots
        held = [seq for seen in w.known[0].values() for seq, _ in seen.values()]
        assert len(held) <= cap, f"{len(held)} frames remembered in a {cap}-slot shard"
        assert len(w.known[0]) <= cap  # no stream kept without a frame
        assert min(held) >= first - plan.slots - cap  # nothing a row can no longer use
    store = w.stores[0]
    assert store.data is not None and len(store.data) <= 4 * cap
    # what it still remembers is what it uses: the plan after a sweep is the plan of a
    # writer that never swept (the same stream again shares its recent frames)
    again = frame_rows(399, 399, 6)
    plan = w.plan(spec.validate(again), first, cap)
    assert plan.slots == 6 and all(len(n) == 0 for n in plan.new)


def test_a_checkpoint_of_other_stack_depths_is_refused_though_its_columns_match(
        tmp_path: Path) -> None:
    """The stored columns say the frame shape and the references per row, not how they
    split into stacks: a checkpoint of ``obs`` and ``next_obs`` stacks of 4 frames has the
    columns of an ``obs`` stack of 8 with no next stack, whose rows would be rebuilt as
    ``obs`` and ``next_obs`` end to end. The checkpoint's config says its stacks: another
    depth is a CheckpointMismatch naming the field and both depths."""
    from conduit_hpc.config import to_toml
    from conduit_hpc.features.checkpointing.resume import stacks_problem

    a = Shard(FSPEC, 40)
    a.write(0, frame_rows(0, 1, 20))
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    a.close()
    cfg = make_config(spec=FRAME_SPEC)
    path = _write_checkpoint(tmp_path, snap, stored_spec(FSPEC),
                             config_toml=to_toml(cfg.to_dict()))
    deeper = dict(FRAME_SPEC, obs=dict(FRAME_SPEC["obs"], shape=[8, 6, 5]))
    del deeper["next_obs"]
    spec8 = Spec.from_config(make_config(spec=deeper).spec)
    ckpt = ck.open_checkpoint(path, spec=stored_spec(spec8))  # the columns match
    why = stacks_problem(ckpt, spec8)
    assert "spec.obs" in why and "4 frames" in why and "8" in why, why
    assert stacks_problem(ckpt, FSPEC) == ""
    # a stack on another axis (the same frames) and a renamed next stack are the same
    moved = dict(FRAME_SPEC, obs=dict(FRAME_SPEC["obs"], shape=[6, 4, 5],
                                      stack={"axis": 1, "stream": "env"}),
                 next_obs={"dtype": "uint8", "shape": [6, 4, 5], "next_of": "obs"})
    assert stacks_problem(ckpt, Spec.from_config(make_config(spec=moved).spec)) == ""
    # a checkpoint whose config does not say (written by hand) is not refused for it
    bare = _write_checkpoint(tmp_path / "bare", snap, stored_spec(FSPEC))
    assert stacks_problem(ck.open_checkpoint(bare), spec8) == ""


def test_streams_of_uint64_ids_past_int64_reshard() -> None:
    """A stream field may be any integer type: uint64 ids at and past 2**63 (hashes, say)
    are written and resharded alike, every row exact (the reshard once turned the ids
    into int64: OverflowError, and the checkpoint could not be restored into another
    layout)."""
    spec = Spec.from_config(make_config(spec=dict(FRAME_SPEC, env={"dtype": "uint64"})).spec)
    a = Shard(spec, 80)
    sent = {}
    for e in range(3):
        rows = frame_rows(e, 1, 20)
        rows["env"] = rows["env"].astype(np.uint64) + np.uint64(2**63 + 5) * np.uint64(e % 2)
        a.write(0, rows)
        for i in range(20):
            sent[(int(rows["env"][i]), int(rows["step"][i]))] = rows["obs"][i], rows["next_obs"][i]
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    a.close()
    codec = ShardLayout(spec, 8).frames
    assert codec is not None
    new, dropped = reshard_frames(codec, 1, [snap].__getitem__, [50, 50], [0, 1], 1.0)
    assert dropped == 0
    got = 0
    for k, cap in enumerate((50, 50)):
        b = Shard(spec, cap)
        try:
            with b.owned.writing():
                restore_snapshot(b.owned.ring, b.owned.index, new[k])
            b.owned.hidden_upto = new[k].commit
            _, cols = b.delivered()
            for i in range(len(cols["env"])):
                obs, nxt = sent[(int(cols["env"][i]), int(cols["step"][i]))]
                assert np.array_equal(cols["obs"][i], obs)
                assert np.array_equal(cols["next_obs"][i], nxt)
            got += len(cols["env"])
        finally:
            b.close()
    assert got >= 0.9 * len(sent)


@pytest.mark.parametrize("forgery", ["past the cut", "before the cut", "before its lag",
                                     "negative lag"])
def test_rows_whose_references_leave_the_cut_are_never_delivered(forgery: str) -> None:
    """A cut whose rows' references (or lags) were rewritten, with their checksums (the
    checksums cannot tell): restored into the same shard or resharded, a row that
    references a frame outside the cut, or before where its lag says its frames start,
    is never delivered (its references would resolve to other slots: other frames, or
    garbage); the other rows are delivered exactly. Before, every such row was delivered
    with frames of other slots."""
    a = Shard(FSPEC, 80)
    for lo in range(0, 60, 5):
        for e in range(3):
            a.write(0, {n: c[lo:lo + 5] for n, c in frame_rows(e, 1, 60).items()})
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    a.close()
    refs, lag = snap.columns["obs__refs"], snap.columns[LAG_COLUMN]
    rows = np.flatnonzero(lag < LAG_NONE)
    hit = rows[::3]
    first = int(snap.seqs[0])
    if forgery == "past the cut":
        refs[hit, 0] = 10**15
    elif forgery == "before the cut":
        refs[hit, 0] = first - 5
        lag[hit] = 0
    elif forgery == "before its lag":
        refs[hit, 0] = snap.seqs[hit] - lag[hit] - 1
    else:
        lag[hit] = -7
    b = Shard(FSPEC, 80)
    try:
        with b.owned.writing():
            restore_snapshot(b.owned.ring, b.owned.index, snap)
        b.owned.hidden_upto = snap.commit
        b.owned.track_held_frames()
        b.owned.poll()
        seqs, cols = b.delivered()
        assert frame_stacks_of(cols).all()
        assert not set(seqs.tolist()) & set(snap.seqs[hit].tolist())
        assert len(seqs) >= len(rows) - len(hit) - 5
    finally:
        b.close()
    codec = ShardLayout(FSPEC, 8).frames
    assert codec is not None
    new, _ = reshard_frames(codec, 1, [snap].__getitem__, [100], [0], 1.0)
    c = Shard(FSPEC, 100)
    try:
        with c.owned.writing():
            restore_snapshot(c.owned.ring, c.owned.index, new[0])
        c.owned.hidden_upto = new[0].commit
        _, cols = c.delivered()
        assert frame_stacks_of(cols).all() and len(cols["env"]) > 0
    finally:
        c.close()


def test_shards_too_small_for_one_rows_frames_are_refused_before_any_ingest() -> None:
    """One row of a fresh stream may bring a new frame for every reference it holds (8 for
    obs and next_obs stacks of 4): a shard of fewer slots could never take it, and the
    first such row failed at ingest ("split it": a batch of one row). Refused when the
    config loads (the whole replay) and when a shard's layout is made (each shard, before
    any window), naming storage.capacity_rows and the slots a row needs."""
    with pytest.raises(ConfigError, match=r"storage\.capacity_rows .* 8 .* got 6") as err:
        make_config(spec=FRAME_SPEC, storage={"capacity_rows": 6})
    assert err.value.key == "storage.capacity_rows"
    make_config(spec=FRAME_SPEC, storage={"capacity_rows": 8})
    with pytest.raises(ConfigError, match=r"shard of 7 slots") as err:
        ShardLayout(FSPEC, 7)
    assert err.value.key == "storage.capacity_rows"
    assert ShardLayout(FSPEC, 8).frames is not None


def test_a_layout_mismatch_says_which_side_stores_frames_once(tmp_path: Path) -> None:
    """A frame-once checkpoint into a job without stacks, and a plain one into a job with
    them: refused naming the layouts, not a stored column as a missing field (before:
    "field 'obs' is in the checkpoint but not in this job's spec" of a job whose spec
    has obs, declared a stack)."""
    plain_fields = {k: {kk: vv for kk, vv in v.items() if kk not in ("stack", "next_of")}
                    for k, v in FRAME_SPEC.items()}
    plain = Spec.from_config(make_config(spec=plain_fields).spec)
    paths = {}
    for name, spec in (("once", FSPEC), ("plain", plain)):
        a = Shard(spec, 40)
        a.write(0, frame_rows(0, 1, 20))
        snap = take_snapshot(0, a.owned.ring, a.owned.index)
        a.close()
        paths[name] = _write_checkpoint(tmp_path / name, snap, stored_spec(spec))
    with pytest.raises(CheckpointError, match=r"stores frame stacks, each frame once "
                                              r"\(obs\), and this job declares none"):
        ck.open_checkpoint(paths["once"], spec=stored_spec(plain))
    with pytest.raises(CheckpointError, match=r"stores rows whole \(no frame stacks\), "
                                              r"and this job declares frame stacks \(obs\)"):
        ck.open_checkpoint(paths["plain"], spec=stored_spec(FSPEC))


def test_inspect_of_a_frame_once_checkpoint_counts_the_transitions_it_can_deliver(
        tmp_path: Path) -> None:
    """A frame-once shard's slots hold rows, frames only (episode starts) and rows whose
    frames the cut lacks: ``inspect`` says how many of its slots are transitions that a
    restore can deliver (before: only the slots, read as rows)."""
    a = Shard(FSPEC, 80)
    for lo in range(0, 60, 5):
        for e in range(3):
            a.write(0, {n: c[lo:lo + 5] for n, c in frame_rows(e, 1, 60).items()})
    snap = take_snapshot(0, a.owned.ring, a.owned.index)
    a.close()
    want = int((snap.columns[LAG_COLUMN] < LAG_NONE).sum())
    assert 0 < want < snap.rows
    path = _write_checkpoint(tmp_path, snap, stored_spec(FSPEC))
    report = ck.inspect_checkpoint(path)
    assert report["ok"] and report["shards"][0]["deliverable"] == want
    assert report["rows"] == snap.rows and report["deliverable"] == want
    text = ck.format_report(report)
    assert f"{snap.rows:,} in 1 shards ({want:,} deliverable transitions" in text, text
