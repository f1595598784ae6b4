"""Each frame stored once: the frame-stack layout of a shard. Plain numpy; no MPI.

A spec that declares frame stacks (``[spec.obs] stack = {axis, stream}``, ``[spec.next_obs]
next_of = "obs"``; see ``docs/frame-stacks.md``) is stored in a shard's ring as *stored
columns* instead of its own fields (:class:`FrameCodec`):

* every plain field as it is;
* per stack group (a stacked field and its next field) a **frame column** ``NAME__frame``
  (one frame per slot) and a **references column** ``NAME__refs``: int64
  ``[fields * depth]``, the sequence numbers of the slots that hold the frames of the
  row's stacks (``obs`` oldest first, then ``next_obs``);
* one **lag column** ``frames__lag``: int64, how far before its own seq the row's oldest
  frame lies (``max(0, seq - min(refs))``); :data:`LAG_NONE` marks a slot that holds
  frames but no row.

A writer (:class:`FrameWriter`, one per ring client) stores a frame only when no frame of
the same stream with the same bytes is known to be in the ring and recent: frames are
looked up by a 64-bit fingerprint and matched by their exact bytes (every reference is
checked against the remembered copy), so a reference always resolves to the very bytes
the actor gave, whatever the order of rows, streams, episodes or writers;
episode starts that repeat (or zero-fill) a frame store it once. A batch of ``r`` rows
takes ``max(r, new frames)`` slots: the rows first, then slots with frames only (never
drawn: written with priority 0 and :data:`LAG_NONE`).

A gather copies the stored columns of the drawn slots, then the frames by reference, and
rebuilds the stacks. The ring's one intact rule (``seq + capacity >= cursor``) covers the
references because the gather returns each row's cursor raised by its lag: a row is
intact iff its own slot *and its oldest frame's* were not handed to a writer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from conduit_hpc.errors import SpecError
from conduit_hpc.spec import Field, FrameStack, Spec
from conduit_hpc.storage import tree_kernels
from conduit_hpc.storage.frames_reference import refs_frame_by_frame
from conduit_hpc.storage.frames_store import FrameStore, fingerprints, frame_words

__all__ = [
    "LAG_COLUMN",
    "LAG_NONE",
    "FrameCodec",
    "FrameWriter",
    "seal_cut",
    "stored_owner",
    "stored_spec",
]

#: lag of a slot that holds frames but no row: never intact
LAG_NONE = 1 << 60
LAG_COLUMN = "frames__lag"


@dataclass(frozen=True, slots=True)
class FrameGroup:
    """A stacked field and its next field, sharing one frame column.

    Attributes:
        stack (FrameStack): the declaration.
        fields (tuple[str, ...]): the stacked field, then its next field if any.
        frame (str), refs (str): the stored columns.
    """

    stack: FrameStack
    fields: tuple[str, ...]
    frame: str
    refs: str

    @property
    def width(self) -> int:
        """References per row."""
        return self.stack.depth * len(self.fields)


class FrameCodec:
    """The stored columns of a spec with frame stacks, and how rows map onto them.

    Args:
        spec (Spec): a spec whose ``stacks`` are not empty.

    Raises:
        SpecError: no stack, or a stored column's name taken by a spec field.
    """

    def __init__(self, spec: Spec) -> None:
        stacks = spec.stacks
        if not stacks:
            raise SpecError("FrameCodec needs a spec with frame stacks (spec.NAME.stack)")
        self.spec = spec
        self.groups = tuple(
            FrameGroup(st, (name, st.next_field) if st.next_field else (name,),
                       f"{name}__frame", f"{name}__refs") for name, st in stacks.items())
        stacked = {n for g in self.groups for n in g.fields}
        self.plain = tuple(f.name for f in spec if f.name not in stacked)
        fields: list[Field] = [spec[n] for n in self.plain]
        for g in self.groups:
            src = spec[g.stack.field]
            fields.append(Field(g.frame, src.dtype, g.stack.frame_shape,
                                description=f"frames of {', '.join(g.fields)}, each once "
                                            f"(one per slot)"))
            fields.append(Field(g.refs, np.dtype(np.int64), (g.width,),
                                description=f"seqs of the frames of {', '.join(g.fields)}"
                                            f", oldest first"))
        fields.append(Field(LAG_COLUMN, np.dtype(np.int64), (),
                            description="seq minus the oldest referenced frame's seq"))
        taken = [f.name for f in fields[len(self.plain):] if f.name in spec.names]
        if taken:
            raise SpecError(f"spec field {taken[0]!r} has the name of a stored frame "
                            f"column; rename it")
        self.stored = Spec(fields)

    def gather(self, read: Callable[[str, np.ndarray, np.ndarray], None], slots: np.ndarray,
               out: dict[str, np.ndarray], capacity: int) -> np.ndarray:
        """Rebuild the rows of ``slots`` into ``out`` (the spec's fields, ``n`` rows or
        more): ``read(column, slots, dst)`` copies a stored column's rows. Returns each
        row's lag (clipped to ``[0, LAG_NONE]``) to add to the writers' cursor."""
        n = len(slots)
        for name in self.plain:
            read(name, slots, out[name][:n])
        lag = np.empty(n, np.int64)
        read(LAG_COLUMN, slots, lag)
        np.minimum(np.maximum(lag, 0, out=lag), LAG_NONE, out=lag)  # (np.clip: ~3x the time)
        for g in self.groups:
            refs = np.empty((n, g.width), np.int64)
            read(g.refs, slots, refs)
            frame_slots = refs % capacity  # garbage refs (torn rows): caught by the lag
            d, ax = g.stack.depth, g.stack.axis
            for k, name in enumerate(g.fields):
                dst = out[name][:n]
                picks = np.ascontiguousarray(frame_slots[:, k * d:(k + 1) * d])
                if ax == 0 and dst.flags.c_contiguous:
                    read(g.frame, picks.reshape(-1), dst.reshape(n * d, *g.stack.frame_shape))
                else:
                    tmp = np.empty((n * d, *g.stack.frame_shape), dst.dtype)
                    read(g.frame, picks.reshape(-1), tmp)
                    dst[...] = np.moveaxis(tmp.reshape(n, d, *g.stack.frame_shape), 1, 1 + ax)
        return lag

    def frame(self, g: FrameGroup, arr: np.ndarray, k: int) -> np.ndarray:
        """Frame ``k`` (oldest first) of one row's stack ``arr``."""
        return arr[k] if g.stack.axis == 0 else np.take(arr, k, axis=g.stack.axis)


@dataclass(slots=True)
class WritePlan:
    """What one write stores: :meth:`FrameWriter.plan` makes it, the ring reserves
    ``slots`` seqs, :meth:`FrameWriter.columns` fills in the seqs.

    Attributes:
        rows (int): rows of the batch.
        slots (int): seqs to reserve (``max(rows, new frames of any group)``).
        refs (list[np.ndarray]): per group, int64 ``[rows, width]``: a seq (>= 0) or
            ``-1 - j`` for the batch's ``j``-th new frame.
        frames (list[tuple[np.ndarray, ...]]): per group, every frame of the batch,
            per field ``[rows * depth, *frame_shape]`` (row, oldest first); frame ``x``
            counts on through the fields (:meth:`FrameWriter._parts`).
        new (list[list[tuple[int, int, int]]]): per group, the new frames (stream,
            fingerprint, index into ``frames``) in slot order.
    """

    rows: int
    slots: int
    refs: list[np.ndarray]
    frames: list[tuple[np.ndarray, ...]]
    new: list[list[tuple[int, int, int]]]


#: what :meth:`FrameWriter._refs` finds: per frame a seq or ``-1 - j``, the new frames,
#: the frames to check byte for byte and what against
_Refs = tuple[np.ndarray, list[tuple[int, int, int]], np.ndarray, np.ndarray]


class FrameWriter:
    """A writer's knowledge of which frames of each stream a ring holds, so that it
    stores each frame once. One per ring client; not thread-safe.

    Frames are looked up by a fingerprint and taken only when their bytes equal the
    remembered copy's (checked for every reference, in one comparison per batch): a
    reference always resolves to the very bytes the actor gave.

    Args:
        codec (FrameCodec): the shard's stored layout.
        keep_per_stream (int): frames remembered per stream and group (0: depth-based).
    """

    def __init__(self, codec: FrameCodec, keep_per_stream: int = 0) -> None:
        self.codec = codec
        self.keep = keep_per_stream or max(g.width for g in codec.groups) * 2 + 8
        # per group: stream -> {fingerprint: (seq, its row in the group's store)},
        # oldest first; the store holds a copy of each remembered frame
        self.known: list[dict[int, dict[int, tuple[int, int]]]] = [
            {} for _ in codec.groups]
        self.stores = [FrameStore() for _ in codec.groups]
        self.end = 0  # the end of this writer's last reservation
        self.swept = 0  # the reserve cursor of the last forgetting of old frames
        self.frames_stored = 0
        self.frames_referenced = 0
        self.fingerprint_clashes = 0  # equal fingerprints of unequal frames (stored anew)

    @staticmethod
    def _parts(g: FrameGroup, batch: Mapping[str, np.ndarray], rows: int
               ) -> tuple[np.ndarray, ...]:
        """Every frame of the group's fields: per field ``[rows * depth, *frame_shape]``
        (row, oldest first), a view of the batch's column where it is C-contiguous with
        the stack on axis 0 (no copy). Frame ``x`` of the batch counts on through the
        fields: ``x = field * rows * depth + row * depth + k``."""
        d, ax = g.stack.depth, g.stack.axis
        out = []
        for n in g.fields:
            col = batch[n] if ax == 0 else np.moveaxis(batch[n], 1 + ax, 1)
            out.append(np.ascontiguousarray(col).reshape(rows * d, *g.stack.frame_shape))
        return tuple(out)

    @staticmethod
    def _differ(parts: tuple[np.ndarray, ...], store: FrameStore, at: np.ndarray,
                src: np.ndarray, *, compiled: bool = True) -> np.ndarray:
        """Per checked frame: whether batch frame ``at[j]`` (``parts``: the batch's
        frames, per field, as :func:`frame_words`; :meth:`_parts` numbers them) differs from
        store row ``src[j]`` (>= 0) or from batch frame ``-1 - src[j]``. One compiled
        pass where numba is there, else numpy over the fields' frames concatenated (the
        reference)."""
        first = parts[0]
        data = store.data if store.data is not None else first[:0]
        k = tree_kernels.kernel("frames_differ") if compiled else None
        if (k is not None and len(parts) <= 2 and data.dtype == first.dtype
                and all(p.dtype == first.dtype and p.shape[1:] == first.shape[1:]
                        for p in (data, *parts))):
            out = np.empty(len(at), np.bool_)
            k(first, parts[1] if len(parts) == 2 else first[:0], data, at, src, out)
            return out
        words = np.concatenate(parts)
        mine = src >= 0
        want = np.empty((len(at), *words.shape[1:]), words.dtype)
        want[mine] = data[src[mine]]
        want[~mine] = words[-1 - src[~mine]]
        return np.asarray((words[at] != want).any(axis=1))

    def plan(self, batch: Mapping[str, np.ndarray], reserved: int, capacity: int, *,
             vectorized: bool | None = None) -> WritePlan:
        """Which frames of a validated batch are new. ``reserved``: the reserve cursor
        read now; a known frame older than half a lap before it is stored again (a row
        lives until its oldest frame is overwritten). ``vectorized``: look each distinct
        (stream, fingerprint) up once (:meth:`_refs`), else every frame in turn
        (:func:`~conduit_hpc.storage.frames_reference.refs_frame_by_frame`, the
        reference; faster below ~64 frames, so ``None`` picks by size): the same plan."""
        if reserved < self.end:  # the ring went back (a restore): forget everything
            self.known = [{} for _ in self.codec.groups]
            self.stores = [FrameStore() for _ in self.codec.groups]
            self.swept = 0
        horizon = max(0, reserved - capacity // 2)
        if reserved - self.swept >= max(1, capacity // 4):
            self._forget(horizon)  # memory bounded by the ring's slots, not the streams
            self.swept = reserved
        rows = self.codec.spec.rows_of(batch)
        refs, frames_of, new = [], [], []
        for gi, g in enumerate(self.codec.groups):
            parts = self._parts(g, batch, rows)
            fps = np.concatenate([fingerprints(p) for p in parts])
            streams = np.tile(np.repeat(batch[g.stack.stream], g.stack.depth), len(parts))
            fast = len(fps) > 64 if vectorized is None else vectorized
            resolve = self._refs if fast else refs_frame_by_frame
            r, fresh, check_at, check_to = resolve(self.known[gi], streams, fps, horizon)
            if len(check_at):  # the bytes decide: a fingerprint that lied stores its frame
                differ = self._differ(tuple(frame_words(p) for p in parts), self.stores[gi],
                                      check_at, check_to)
                for x in check_at[differ].tolist():
                    self.fingerprint_clashes += 1
                    r[x] = -1 - len(fresh)
                    fresh.append((int(streams[x]), int(fps[x]), x))
            # per row: its fields' frames in turn (x counts field by field)
            refs.append(r.reshape(len(parts), rows, g.stack.depth).transpose(1, 0, 2)
                        .reshape(rows, g.width))
            frames_of.append(parts)
            new.append(fresh)
        slots = max([rows] + [len(f) for f in new])
        return WritePlan(rows, slots, refs, frames_of, new)

    def _forget(self, horizon: int) -> None:
        """Drop the remembered frames older than ``horizon`` (no lookup takes them; each
        stream's are oldest first) and the streams left with none."""
        for known, store in zip(self.known, self.stores, strict=True):
            for stream in list(known):
                seen = known[stream]
                while seen:
                    fp, (seq, row) = next(iter(seen.items()))
                    if seq >= horizon:
                        break
                    del seen[fp]
                    store.drop(row)
                if not seen:
                    del known[stream]

    @staticmethod
    def _refs(known: dict[int, dict[int, tuple[int, int]]], streams: np.ndarray,
              fps: np.ndarray, horizon: int) -> _Refs:
        """Per frame (its stream and fingerprint): a seq (a remembered frame at or past
        ``horizon``) or ``-1 - j`` (the batch's ``j``-th new frame, in order of first
        appearance); the new frames (stream, fingerprint, frame); and the frames whose
        bytes must equal a remembered frame (its store row, >= 0) or an earlier frame
        ``x`` of the batch (``-1 - x``). Each distinct (stream, fingerprint) is looked
        up once."""
        n = len(fps)
        if n == 0:
            e = np.empty(0, np.int64)
            return e, [], e, e
        order = np.lexsort((fps, streams))  # stable: a key's first frame comes first
        ss, fs = streams[order], fps[order]
        head = np.empty(n, np.bool_)
        head[0] = True
        np.not_equal(ss[1:], ss[:-1], out=head[1:])
        head[1:] |= fs[1:] != fs[:-1]
        key = np.empty(n, np.int64)
        key[order] = np.cumsum(head) - 1  # per frame: its key, by (stream, fingerprint)
        firsts = order[head]  # per key: its first frame
        by_first = np.argsort(firsts)
        rank = np.empty(len(firsts), np.int64)
        rank[by_first] = np.arange(len(firsts))
        u = rank[key]  # per frame: its key, numbered in order of first appearance
        first = firsts[by_first]
        ref = np.empty(len(first), np.int64)
        row = np.full(len(first), -1, np.int64)
        fresh: list[tuple[int, int, int]] = []
        for j, (stream, fp, x) in enumerate(zip(streams[first].tolist(), fps[first].tolist(),
                                                first.tolist(), strict=True)):
            seen = known.get(stream)
            hit = None if seen is None else seen.get(fp)
            if hit is not None and hit[0] >= horizon:
                ref[j], row[j] = hit
            else:
                ref[j] = -1 - len(fresh)
                fresh.append((stream, fp, x))
        at_row = row[u]
        check = (at_row >= 0) | (first[u] != np.arange(n))
        at = np.flatnonzero(check)
        to = np.where(at_row[at] >= 0, at_row[at], -1 - first[u[at]])
        return ref[u], fresh, at, to

    @staticmethod
    def _take(parts: tuple[np.ndarray, ...], xs: list[int]) -> np.ndarray:
        """Frames ``xs`` of a batch (:meth:`_parts` numbers them), in that order."""
        idx, split = np.asarray(xs, np.int64), len(parts[0])
        if len(parts) == 1:
            return parts[0][idx]
        out, lo = np.empty((len(idx), *parts[0].shape[1:]), parts[0].dtype), idx < split
        out[lo] = parts[0][idx[lo]]
        out[~lo] = parts[1][idx[~lo] - split]
        return out

    def columns(self, plan: WritePlan, batch: Mapping[str, np.ndarray], first: int,
                priorities: np.ndarray | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The stored columns of a planned batch whose slots start at seq ``first`` (a
        column may be shorter than ``plan.slots``: its tail is not written) and the
        priorities of every slot (0 for slots without a row); remembers the new frames."""
        codec, rows = self.codec, plan.rows
        cols: dict[str, np.ndarray] = {n: batch[n] for n in codec.plain}
        low = np.arange(first, first + rows, dtype=np.int64)
        for gi, g in enumerate(codec.groups):
            r = plan.refs[gi]
            r = np.where(r >= 0, r, first - 1 - r)
            fresh = plan.new[gi]
            frames = self._take(plan.frames[gi], [x for _, _, x in fresh])
            known, store = self.known[gi], self.stores[gi]
            rows_of = store.put(frame_words(frames))
            for j, (stream, fp, _) in enumerate(fresh):
                seen = known.setdefault(stream, {})
                old = seen.pop(fp, None)
                if old is not None:
                    store.drop(old[1])
                seen[fp] = (first + j, rows_of[j])
                while len(seen) > self.keep:
                    store.drop(seen.pop(next(iter(seen)))[1])
            cols[g.frame], cols[g.refs] = frames, r
            if rows:
                np.minimum(low, r.min(axis=1), out=low)
            self.frames_stored += len(fresh)
            self.frames_referenced += r.size
        lag = np.full(plan.slots, LAG_NONE, np.int64)
        lag[:rows] = np.arange(first, first + rows) - low
        cols[LAG_COLUMN] = lag
        prio = np.zeros(plan.slots)
        prio[:rows] = np.nan if priorities is None else priorities
        self.end = first + plan.slots
        return cols, prio


def stored_spec(spec: Spec) -> Spec:
    """The columns a shard of ``spec`` holds (``spec`` itself for the plain layout)."""
    return FrameCodec(spec).stored if spec.stacks else spec


def stored_owner(spec: Spec) -> dict[str, str]:
    """Each stored column of ``spec`` -> the spec field whose bytes it holds: a plain
    field itself, a stack group's frame and reference columns its stacked field, the lag
    column ``""`` (no field's). The plain layout maps every field to itself. Local;
    pure."""
    if not spec.stacks:
        return {f.name: f.name for f in spec}
    codec = FrameCodec(spec)
    out = {name: name for name in codec.plain}
    for g in codec.groups:
        out[g.frame] = out[g.refs] = g.stack.field
    out[LAG_COLUMN] = ""
    return out


def seal_cut(codec: FrameCodec | None, columns: Mapping[str, np.ndarray],
             first_seq: int) -> None:
    """Make a cut (stored columns of the slots from seq ``first_seq`` on, oldest first)
    self-contained: a row that references a frame outside the cut (before it, or past
    its end: a batch whose last slots were not committed yet) can never be delivered
    from it, so its lag becomes :data:`LAG_NONE` (in place); so does a row whose lag
    does not say where its frames start (negative, or a reference before ``seq - lag``:
    a damaged or rewritten cut, whose references would resolve to other slots). No-op
    for the plain layout."""
    if codec is None or not len(columns[LAG_COLUMN]):
        return
    lag = columns[LAG_COLUMN]
    n = len(lag)
    seqs = np.arange(first_seq, first_seq + n, dtype=np.int64)
    low = seqs - np.minimum(lag, LAG_NONE)  # where the row's frames start, by its lag
    bad = (lag < 0) | (low < first_seq)
    for g in codec.groups:
        refs = columns[g.refs]
        bad |= (refs >= first_seq + n).any(axis=1) | (refs.min(axis=1) < low)
    lag[bad] = LAG_NONE
