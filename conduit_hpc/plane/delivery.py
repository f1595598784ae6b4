"""The deliver control point on learner ranks: sample, gather, transform, copy.

:class:`Deliverer` runs the experience path for one batch - read the shards' published
statistics, draw stratified targets, have each shard's owner find the rows (one message
per shard), copy the rows (numpy from shared memory, one indexed RMA get per field
otherwise), check they are intact, transform them and hand them to torch on the
learner's device - or, in ``service`` mode, has the owners do all of it and send the
rows. :class:`ControlBlock` holds the job-wide counters (rate limiter, done flags,
learner version) and :class:`WeightsBoard` the lead learner's published parameters.

This is the composition layer: it uses the transport (windows, channel) and the
semantics (sampling, scheduler) together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc.config import SchedulerConfig
from conduit_hpc.errors import DataPlaneClosed, DataPlaneTimeout
from conduit_hpc.protocol import PriorityUpdate, SampleReply, SampleRequest, Tag, unpack_rows
from conduit_hpc.sampling import ShardStats, allocate_targets, importance_weights
from conduit_hpc.scheduler import LimiterState, RateLimiter
from conduit_hpc.spec import Spec
from conduit_hpc.storage.priority import check_priorities
from conduit_hpc.storage.ring import ShardRing
from conduit_hpc.transport.channel import Channel
from conduit_hpc.transport.rma import RmaWindow

if TYPE_CHECKING:  # torch loads only on ranks that use it (learners, weight sharing)
    import torch

__all__ = ["Batch", "ControlBlock", "Deliverer", "PendingBatch", "WeightsBoard",
           "select_device"]

# control block slots (int64): rows written by actors, rows sampled by learners, ranks
# done, the lead learner's superstep, and rows actors have reserved (admitted or waiting)
(C_INSERTS, C_SAMPLES, C_ACTORS_DONE, C_LEARNERS_DONE, C_LEARNER_VERSION,
 C_RESERVED) = range(6)
CONTROL_BYTES = 64

Transform = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class ControlBlock:
    """Job-wide counters in 64 bytes of one rank's memory, updated with atomics.

    Args:
        window (RmaWindow): the window holding the block.
        owner (int): rank whose segment holds it, at displacement 0.
    """

    def __init__(self, window: RmaWindow, owner: int) -> None:
        self.window, self.owner = window, owner

    def add(self, slot: int, n: int) -> int:
        """Atomically add ``n``; returns the old value. Blocks for the round trip."""
        return self.window.fetch_add(self.owner, 8 * slot, n)

    def read(self, slot: int) -> int:
        return self.window.atomic_read(self.owner, 8 * slot)

    def write(self, slot: int, value: int) -> None:
        self.window.atomic_write(self.owner, 8 * slot, value)


class WeightsBoard:
    """The lead learner's parameters, published for actors (seqlock on a version).

    Layout in the owner's segment: int64 ``[version, superstep, nparams, 0 ...]`` (64
    bytes) then float32 parameters. ``version`` is odd while the owner writes.

    Args:
        window (RmaWindow): window holding the board.
        owner (int): lead learner's rank.
        nparams (int): float32 parameters.
    """

    def __init__(self, window: RmaWindow, owner: int, nparams: int) -> None:
        self.window, self.owner, self.nparams = window, owner, nparams
        self.seen_version = 0
        self.seen_superstep = -1
        self._buf = np.empty(nparams, dtype=np.float32)

    def publish(self, flat: np.ndarray, superstep: int) -> None:
        """Owner only: store new parameters. Local (direct stores + memory barrier)."""
        seg = self.window.own_segment()
        head = seg[:64].view(np.int64)
        v = int(head[0])
        head[0] = v + 1
        self.window.sync()
        seg[64:64 + 4 * self.nparams].view(np.float32)[:] = flat
        head[1] = superstep
        head[2] = self.nparams
        self.window.sync()
        head[0] = v + 2
        self.window.sync()

    def published(self) -> tuple[int, int]:
        """(version, learner superstep) of the newest publication. Blocks for a read."""
        v = self.window.atomic_read(self.owner, 0)
        s = self.window.atomic_read(self.owner, 8)
        return v, s

    def pull(self) -> np.ndarray | None:
        """Newer parameters than last pulled, or ``None``. One-sided; blocks for the
        copy."""
        w = self.window
        for _ in range(100):
            v1 = w.atomic_read(self.owner, 0)
            if v1 <= self.seen_version or v1 % 2:
                if v1 % 2:
                    time.sleep(0.0001)
                    continue
                return None
            superstep = w.atomic_read(self.owner, 8)
            view = w.local_view(self.owner)
            if view is not None:
                w.sync()
                self._buf[:] = view[64:64 + 4 * self.nparams].view(np.float32)
                w.sync()
            else:
                w.get(self.owner, 64, self._buf)
                w.flush(self.owner)
            if w.atomic_read(self.owner, 0) == v1:
                self.seen_version, self.seen_superstep = v1, superstep
                return self._buf.copy()
        return None


def flat_parameters(model: torch.nn.Module) -> np.ndarray:
    """Every parameter, flattened into one float32 array (host copy)."""
    import torch

    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).float().cpu()
                          for p in model.parameters()]).numpy()


def load_flat(model: torch.nn.Module, flat: np.ndarray) -> None:
    """Inverse of :func:`flat_parameters`."""
    import torch

    with torch.no_grad():
        o = 0
        for p in model.parameters():
            n = p.numel()
            p.copy_(torch.from_numpy(flat[o:o + n]).view_as(p))
            o += n


def select_device(kind: str, local_learner_index: int) -> torch.device:
    """The learner's device: its node-local GPU (bound by node-local learner index,
    never by world rank) when asked for or available, else the CPU."""
    import torch

    if kind in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", local_learner_index % torch.cuda.device_count())
    if kind == "cuda":
        raise DataPlaneClosed("scheduler.device = 'cuda' but torch sees no GPU")
    return torch.device("cpu")


@dataclass
class PendingBatch:
    """A batch whose rows the owners are sampling and sending (see
    :meth:`Deliverer.begin`): request id -> the batch positions it fills."""

    superstep: int
    staleness: int
    stats: list[ShardStats]
    ids: dict[int, tuple[int, int]]
    t0: float
    waited: float


@dataclass
class Batch:
    """One learner batch.

    Attributes:
        data (dict[str, torch.Tensor]): one tensor per field (``[B, ...]``, or
            ``[B, L, ...]`` for sequences), on the learner's device.
        indices (np.ndarray): int64 ``[B, 3]``: shard, slot, generation of each row
            (the first row of a sequence); pass back to ``update_priorities``.
        weights (torch.Tensor): float32 ``[B]`` importance weights (1 when uniform).
        superstep (int): the superstep this batch is for.
        staleness (int): supersteps of priority updates this batch was sampled without.
        timings (dict[str, float]): seconds spent on sample, gather, transform, copy.
    """

    data: dict[str, torch.Tensor]
    indices: np.ndarray
    weights: torch.Tensor
    superstep: int
    staleness: int
    timings: dict[str, float] = field(default_factory=dict)
    ready: Any = None  # a CUDA event when the copy is asynchronous

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.data[name]

    def __len__(self) -> int:
        return len(self.indices)

    def wait(self) -> None:
        """Block until the device copy is done (no-op on the CPU)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None


class Deliverer:
    """The experience path of one learner rank (not thread-safe: one thread uses it).

    Args:
        spec (Spec): the row schema.
        rings (Mapping[int, ShardRing]): ring clients of the shards this learner reads.
        owners (Mapping[int, int]): shard id -> owner rank.
        acks (Mapping[int, np.ndarray]): for owners whose memory this process maps, the
            int64 per-rank count of priority-update messages they have applied.
        sync (Callable[[], None]): memory barrier for ``acks``.
        rank (int): this learner's rank (its entry in ``acks``).
        channel (Channel): the data plane's channel.
        control (ControlBlock): job-wide counters.
        limiter (RateLimiter): the samples-per-insert limiter.
        config (SchedulerConfig): batch size, sampler, beta schedule...
        n_actors (int): actors in the job (to know when all are done).
        device (torch.device): where batches go.
        transform (Transform | None): applied to each numpy batch before the copy.
        seed (int): sampling seed.
        timeout_s (float): bound on every wait.
    """

    def __init__(self, *, spec: Spec, rings: Mapping[int, ShardRing], owners: Mapping[int, int],
                 acks: Mapping[int, np.ndarray], sync: Callable[[], None], rank: int,
                 channel: Channel, control: ControlBlock, limiter: RateLimiter,
                 config: SchedulerConfig, n_actors: int, device: torch.device,
                 transform: Transform | None, seed: int, timeout_s: float,
                 poll_interval_s: float) -> None:
        self.spec, self.rings, self.owners = spec, dict(rings), dict(owners)
        self.shard_ids = np.array(sorted(self.rings), dtype=np.int64)
        self.channel, self.control, self.limiter = channel, control, limiter
        self.cfg, self.n_actors, self.device = config, n_actors, device
        self.transform = transform
        self.rng = np.random.default_rng(seed)
        self.timeout_s, self.poll_s = timeout_s, poll_interval_s
        self.window = config.window
        self._request_id = 0
        self.superstep_offset = 0  # supersteps done before a restore (beta schedule)
        self.acks, self._sync, self.rank = dict(acks), sync, rank
        self.sent: dict[int, int] = {}  # priority-update messages sent, per owner
        self.required: dict[int, int] = {}  # ... that a direct search must wait for
        self.resampled = 0
        self.limiter_wait_s = 0.0
        import torch

        self._torch = torch
        self._stream = (torch.cuda.Stream(device) if device.type == "cuda" else None)
        # replies that arrived while another batch's were awaited (pipelined owner fetch)
        self._stash: dict[int, tuple[SampleReply, np.ndarray]] = {}

    # -- statistics and the rate limiter -------------------------------------------
    def shard_stats(self) -> list[ShardStats]:
        out = []
        for sid in self.shard_ids:
            held, total, mn, _ = self.rings[int(sid)].read_stats()
            out.append(ShardStats(total=total, count=held, min=mn))
        return out

    def _admit(self, rows: int) -> tuple[list[ShardStats], float]:
        """Wait until the limiter lets us sample ``rows``, then count them. Returns the
        shard statistics to sample with and the seconds waited."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        lim = self.limiter
        fenced = False
        while True:
            stats = self.shard_stats()
            held = sum(s.count for s in stats)
            mass = sum(s.total for s in stats)
            state = LimiterState(self.control.read(C_INSERTS), self.control.read(C_SAMPLES),
                                 held)
            if mass > 0 and lim.can_sample(state, rows):
                break
            if self.control.read(C_ACTORS_DONE) >= self.n_actors:
                # no insert will ever come: the ratio no longer binds, the fill must
                if held >= lim.min_size_to_sample and mass > 0:
                    break
                if not fenced:
                    # the stats may lag: rows the actors wrote before they finished that
                    # an owner has not committed yet, or this learner's own priority
                    # updates in flight (every row zeroed, one raised again) - look once
                    # more after every owner has committed and applied them
                    self._fence()
                    fenced = True
                    continue
                raise DataPlaneClosed(
                    f"every actor finished with {held} rows held (total priority mass "
                    f"{mass:g}); sampling needs scheduler.min_fill_rows = "
                    f"{lim.min_size_to_sample} rows with mass > 0")
            if time.monotonic() > deadline:
                raise DataPlaneTimeout(f"learner waited {self.timeout_s:.1f} s to sample "
                                       f"{rows} rows: {lim.explain(state)}")
            self.channel.progress()  # e.g. messages held for a long link still go out
            time.sleep(self.poll_s)
        self.control.add(C_SAMPLES, rows)
        waited = time.perf_counter() - t0
        self.limiter_wait_s += waited
        return stats, waited

    def _fence(self) -> None:
        """Wait (bounded) until the owners of this learner's shards have committed the
        rows written so far and applied this learner's priority updates: one 1-target
        sample request per shard - an owner handles a learner's messages in order and
        commits a shard before it answers a sample request of it, and the rows were in
        its memory before the request was sent."""
        ids = {self._request(Tag.SAMPLE, k, np.zeros(1)) for k in range(len(self.shard_ids))}
        if ids:
            self._collect(Tag.SAMPLE_REPLY, ids, "the owners' replies to a fence")

    # -- sampling --------------------------------------------------------------------
    def _request(self, tag: Tag, shard_pos: int, targets: np.ndarray) -> int:
        self._request_id += 1
        sid = int(self.shard_ids[shard_pos])
        req = SampleRequest(self._request_id, sid, targets)
        self.channel.isend(self.owners[sid], tag, req.pack())
        return self._request_id

    def _collect(self, tag: Tag, ids: set[int], what: str) -> dict[int, tuple[SampleReply,
                                                                               np.ndarray]]:
        got = {i: self._stash.pop(i) for i in ids if i in self._stash}
        while len(got) < len(ids):
            msg = self.channel.recv(tag=tag, timeout_s=self.timeout_s, what=what)
            rep, rest = SampleReply.unpack(msg.payload)
            if rep.request_id in ids:
                got[rep.request_id] = (rep, rest)
            else:  # for another batch in flight (see begin())
                self._stash[rep.request_id] = (rep, rest)
        return got

    def _draw(self, tag: Tag, stats: list[ShardStats], rows: int
              ) -> list[tuple[int, int, SampleReply, np.ndarray]]:
        """Targets over all shards -> per shard (first position, end, reply, extra).
        Shards in this node's shared memory are searched directly; the others' owners
        are asked (one message per shard), as are all owners in service mode."""
        totals = np.array([s.total for s in stats])
        shard_pos, local = allocate_targets(totals, rows, self.rng)
        bounds = np.searchsorted(shard_pos, np.arange(len(stats) + 1))
        ids: dict[int, tuple[int, int]] = {}
        parts = []
        for k in range(len(stats)):
            a, b = int(bounds[k]), int(bounds[k + 1])
            if b == a:
                continue
            found = None if tag is Tag.SERVICE else self._search(k, local[a:b])
            if found is not None:
                parts.append((a, b, found, np.zeros(0, np.uint8)))
            else:
                ids[self._request(tag, k, local[a:b])] = (a, b)
        if ids:
            reply = Tag.SERVICE_REPLY if tag is Tag.SERVICE else Tag.SAMPLE_REPLY
            replies = self._collect(reply, set(ids), "sample replies")
            parts += [(a, b, replies[i][0], replies[i][1]) for i, (a, b) in ids.items()]
        parts.sort(key=lambda x: x[0])
        return parts

    def mark(self) -> None:
        """A superstep ended: batches prepared from now on must see every priority
        update sent so far. Messages to an owner arrive in order, so asking the owner
        keeps this by itself; a direct search of its tree first waits for the owner's
        acknowledgement count to catch up (:meth:`_search`)."""
        self.required = dict(self.sent)

    def _search(self, k: int, targets: np.ndarray) -> SampleReply | None:
        """Search shard ``k``'s tree in shared memory, if this process maps it."""
        if self.window > 1:  # sequence windows are cut by the owner
            return None
        sid = int(self.shard_ids[k])
        owner = self.owners[sid]
        acks = self.acks.get(owner)
        if acks is None:
            return None
        need = self.required.get(owner, 0)
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._sync()
            if int(acks[self.rank]) >= need:
                break
            if time.monotonic() > deadline:
                raise DataPlaneTimeout(f"the owner (rank {owner}) of shard {sid} did not apply "
                                       f"this learner's priority updates within "
                                       f"{self.timeout_s:.1f} s")
            time.sleep(self.poll_s)
        found = self.rings[sid].search(targets)
        if found is None:
            return None
        slots, gens, mass, held, total, mn = found
        return SampleReply(0, sid, slots, gens, mass, held, total, mn)

    # -- one batch ---------------------------------------------------------------------
    def prepare(self, superstep: int, staleness: int, *, service: bool = False) -> Batch:
        """Sample, gather, check, transform and copy one batch. Blocks (bounded)."""
        B = self.cfg.batch_rows
        timings = {"sample_s": 0.0, "gather_s": 0.0, "transform_s": 0.0, "copy_s": 0.0}
        stats, waited = self._admit(B)
        timings["limiter_wait_s"] = waited
        t0 = time.perf_counter()
        parts = self._draw(Tag.SERVICE if service else Tag.SAMPLE, stats, B)
        timings["sample_s"] = time.perf_counter() - t0
        return self._assemble(superstep, staleness, stats, parts, timings, service=service)

    def _assemble(self, superstep: int, staleness: int, stats: list[ShardStats],
                  parts: list[tuple[int, int, SampleReply, np.ndarray]],
                  timings: dict[str, float], *, service: bool) -> Batch:
        """Gather (or unpack the owners' rows), transform, weigh and copy one batch."""
        B, w = self.cfg.batch_rows, self.window
        lead = (B, w) if w > 1 else (B,)
        out = {f.name: np.empty((*lead, *f.shape), dtype=f.dtype) for f in self.spec}
        flat = {k: v.reshape(B * w, *v.shape[len(lead):]) for k, v in out.items()}
        indices = np.empty((B, 3), dtype=np.int64)
        mass = np.empty(B, dtype=np.float64)
        t1 = time.perf_counter()
        for a, b, rep, rows in parts:
            sid = rep.shard_id
            indices[a:b, 0], indices[a:b, 1], indices[a:b, 2] = sid, rep.slots, rep.gens
            mass[a:b] = rep.mass
            if service:
                cols = unpack_rows(self.spec, rows, (b - a) * w)
                for name, arr in cols.items():
                    flat[name][a * w:b * w] = arr
            else:
                self._gather_checked(sid, a, b, indices, mass, flat)
        t2 = time.perf_counter()
        timings["gather_s"] = t2 - t1
        data = out
        if self.transform is not None:
            data = self.transform(out)
        t3 = time.perf_counter()
        timings["transform_s"] = t3 - t2
        superstep += self.superstep_offset
        beta = self._beta(superstep)
        weights = (np.ones(B, np.float32) if self.cfg.sampler == "sequence"
                   else importance_weights(mass, stats, beta))
        batch = self._to_device(data, indices, weights, superstep, staleness)
        timings["copy_s"] = time.perf_counter() - t3
        batch.timings = timings
        return batch

    # -- pipelined owner fetch: several batches in flight (edp with fetch = owner) -------
    def begin(self, superstep: int, staleness: int) -> PendingBatch:
        """Start a batch that the shards' owners sample and send: admit it, draw its
        targets and send one request per shard; returns at once. Requests of several
        batches may be in flight (across a long link their latency then overlaps).
        Blocks only while the rate limiter or the minimum fill holds sampling back."""
        B = self.cfg.batch_rows
        stats, waited = self._admit(B)
        t0 = time.perf_counter()
        totals = np.array([s.total for s in stats])
        shard_pos, local = allocate_targets(totals, B, self.rng)
        bounds = np.searchsorted(shard_pos, np.arange(len(stats) + 1))
        ids: dict[int, tuple[int, int]] = {}
        for k in range(len(stats)):
            a, b = int(bounds[k]), int(bounds[k + 1])
            if b > a:
                ids[self._request(Tag.SERVICE, k, local[a:b])] = (a, b)
        return PendingBatch(superstep, staleness, stats, ids, t0, waited)

    def arrived(self, pending: PendingBatch) -> bool:
        """Whether every reply of ``pending`` is here (receives what has arrived). Local;
        never blocks."""
        while (msg := self.channel.poll(tag=Tag.SERVICE_REPLY)) is not None:
            rep, rest = SampleReply.unpack(msg.payload)
            self._stash[rep.request_id] = (rep, rest)
        return all(i in self._stash for i in pending.ids)

    def complete(self, pending: PendingBatch) -> Batch:
        """Wait for ``pending``'s replies (bounded by ``timeout_s``) and assemble it."""
        replies = self._collect(Tag.SERVICE_REPLY, set(pending.ids), "service replies")
        parts = sorted(((a, b, replies[i][0], replies[i][1])
                        for i, (a, b) in pending.ids.items()), key=lambda x: x[0])
        timings = {"sample_s": time.perf_counter() - pending.t0, "gather_s": 0.0,
                   "transform_s": 0.0, "copy_s": 0.0, "limiter_wait_s": pending.waited}
        return self._assemble(pending.superstep, pending.staleness, pending.stats, parts,
                              timings, service=True)

    def _beta(self, superstep: int) -> float:
        from conduit_hpc.sampling import beta_at

        c = self.cfg
        if c.sampler == "uniform":
            return 0.0
        return beta_at(superstep, c.beta, c.beta_final, c.beta_anneal_supersteps)

    def _gather_checked(self, sid: int, a: int, b: int, indices: np.ndarray, mass: np.ndarray,
                        flat: dict[str, np.ndarray]) -> None:
        """Copy rows a..b of the batch from shard ``sid``; redraw (in the same shard)
        any whose slot was handed to a writer meanwhile, until all are intact."""
        ring, w = self.rings[sid], self.window
        cap = ring.capacity
        todo = np.arange(a, b)
        pos = int(np.flatnonzero(self.shard_ids == sid)[0])
        deadline = time.monotonic() + self.timeout_s
        while True:
            drawn = indices[todo, 1] >= 0  # -1: the owner had nothing to draw then
            slots = np.where(drawn, indices[todo, 1], 0)
            rows = (slots[:, None] + np.arange(w)[None, :]).reshape(-1) % cap
            if len(todo) == b - a:  # first pass: straight into the batch
                dst = {k: v[a * w:b * w] for k, v in flat.items()}
                _, reserved = ring.gather(rows, dst)
            else:
                got, reserved = ring.gather(rows)
                sel = (todo[:, None] * w + np.arange(w)[None, :]).reshape(-1)
                for k, v in got.items():
                    flat[k][sel] = v
            bad = ~drawn | ((indices[todo, 2] - 1) + cap < reserved)
            if not bad.any():
                return
            todo = todo[bad]
            self.resampled += len(todo)
            if time.monotonic() > deadline:
                raise DataPlaneTimeout(f"rows of shard {sid} kept being overwritten while "
                                       f"gathering for {self.timeout_s:.1f} s")
            _, total, _, _ = ring.read_stats()
            if total <= 0:
                time.sleep(self.poll_s)
            targets = self.rng.random(len(todo)) * max(total, 0.0)
            rep = self._search(pos, targets)
            if rep is None:
                rid = self._request(Tag.SAMPLE, pos, targets)
                (rep, _), = self._collect(Tag.SAMPLE_REPLY, {rid}, "resample reply").values()
            indices[todo, 1], indices[todo, 2], mass[todo] = rep.slots, rep.gens, rep.mass

    def _to_device(self, data: Mapping[str, np.ndarray], indices: np.ndarray,
                   weights: np.ndarray, superstep: int, staleness: int) -> Batch:
        torch = self._torch
        if self.device.type == "cpu":
            tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in data.items()}
            return Batch(tensors, indices, torch.from_numpy(weights), superstep, staleness)
        assert self._stream is not None
        with torch.cuda.stream(self._stream):
            tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).pin_memory().to(
                self.device, non_blocking=True) for k, v in data.items()}
            wt = torch.from_numpy(weights).pin_memory().to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return Batch(tensors, indices, wt, superstep, staleness, ready=event)

    # -- priorities ----------------------------------------------------------------------
    def send_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> int:
        """Carry checked priority updates to the owners (one message per shard).
        Non-blocking sends. Returns rows sent."""
        order = np.argsort(indices[:, 0], kind="stable")
        idx, pr = indices[order], priorities[order]
        cuts = np.flatnonzero(np.diff(idx[:, 0])) + 1
        for part, p in zip(np.split(idx, cuts), np.split(pr, cuts), strict=True):
            sid = int(part[0, 0])
            up = PriorityUpdate(sid, part[:, 1], part[:, 2], p)
            owner = self.owners[sid]
            self.channel.isend(owner, Tag.PRIORITY, up.pack())
            self.sent[owner] = self.sent.get(owner, 0) + 1
        return len(indices)


def check_update(indices: np.ndarray, priorities: Any, shards: Mapping[int, int]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Validate an ``update_priorities`` call before anything is sent.

    Raises:
        ValueError: indices not ``[n, 3]`` int, an unknown shard, a slot out of range,
            priorities of another length, or a negative, NaN or infinite priority.
    """
    idx = np.asarray(indices)
    if idx.ndim != 2 or idx.shape[1] != 3 or idx.dtype.kind not in "iu":
        raise ValueError(f"indices must be an integer array of shape [n, 3] (shard, slot, "
                         f"generation) as delivered in Batch.indices, got dtype "
                         f"{idx.dtype.name} shape {idx.shape}")
    p = check_priorities(priorities)
    if len(p) != len(idx):
        raise ValueError(f"priorities has {len(p)} entries but indices has {len(idx)}")
    idx = idx.astype(np.int64)
    for sid in np.unique(idx[:, 0]):
        if int(sid) not in shards:
            raise ValueError(f"indices names shard {int(sid)}, which this learner does "
                             f"not read (shards: {sorted(shards)})")
        slots = idx[idx[:, 0] == sid, 1]
        cap = shards[int(sid)]
        if slots.min() < 0 or slots.max() >= cap:
            raise ValueError(f"indices has slot {int(slots.max())} outside shard {int(sid)}'s "
                             f"[0, {cap})")
    return idx, p
