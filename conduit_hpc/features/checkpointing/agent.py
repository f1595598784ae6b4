"""Checkpoints of a running data plane: when, who, and agreement. Composition layer.

:mod:`conduit_hpc.checkpoint` knows the HDF5 format; this module drives it from MPI ranks:

* :class:`CheckpointAgent` - periodic checkpoints on the buffer side while ingest and
  delivery go on. The buffer leader (first buffer rank) starts one every
  ``checkpoint.every_seconds`` or on a :attr:`~conduit_hpc.plane.buffer.Tag.CKPT_REQUEST`
  message from any rank (a learner at a superstep boundary), by sending
  :attr:`~conduit_hpc.plane.buffer.Tag.CKPT_CUT` to every buffer rank. Each buffer rank cuts
  its shards inside its progress loop (a commit pass, then one ``memcpy`` per field into
  preallocated staging memory - the only pause ingest and delivery see), writes its file
  on a background thread, and sends its part (file record, cursors, counters) to the
  leader, which writes the manifest, renames the directory into place, writes ``DONE``
  and prunes old checkpoints, also off the loop.
  **Superstep boundaries** (a marker protocol, as in Chandy-Lamport snapshots): at a
  boundary every learner calls :meth:`CheckpointAgent.mark` *after* sending its
  messages of that superstep (priority updates); the marker travels behind them on each
  learner -> buffer channel (MPI keeps one sender's messages in order). The leader starts
  the checkpoint when it holds the markers of every learner, and each buffer rank cuts
  only once it holds them too, so every cut sees exactly the updates of supersteps up to
  the boundary. Learners then hand in their parts with :meth:`CheckpointAgent.contribute`.
* :func:`~conduit_hpc.features.checkpointing.save.save_checkpoint` (``save.py``) - the
  same, as one blocking collective over the job's ranks (the final checkpoint on stop).

A buffer rank's cut and shard file, and the leader's manifest, are in ``parts.py``
(shared by both).

Restoring (collective, at start-up) is :mod:`conduit_hpc.features.checkpointing.resume`.

:class:`~.stopping.StopCoordinator` turns SIGTERM / SIGUSR1 into a stop every
rank sees, after which jobs call ``save_checkpoint`` together.

Control messages carry JSON bytes and small collectives move JSON bytes in ``uint8``
buffers (``Bcast``/``Gatherv``): no pickle anywhere on this path.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conduit_hpc import checkpoint as ck
from conduit_hpc.errors import CheckpointError
from conduit_hpc.features.checkpointing.boundary import BoundaryHook, plain_counters
from conduit_hpc.features.checkpointing.parts import (
    STALL_ENV,
    buffer_file,
    compression_for,
    cut_shards,
    described_for,
    finish_from_parts,
    io_timeout,
    limiter_counters,
    write_buffer_part,
)
from conduit_hpc.features.checkpointing.records import RECORDS_KEEP, Kept
from conduit_hpc.plane.extensions import BufferExtension
from conduit_hpc.protocol import Tag
from conduit_hpc.storage.snapshot import SnapshotStaging
from conduit_hpc.transport.channel import Message
from conduit_hpc.transport.objects import (
    bcast_json,
    bounded_barrier,
    bounded_bcast_json,
    gather_json,
)
from conduit_hpc.wait import Deadline

if TYPE_CHECKING:
    from conduit_hpc.plane.host import FeatureHost

Handler = Callable[["Message"], None]

# bcast_json and gather_json stay importable from here (jobs/synthetic.py takes them)
__all__ = ["STALL_ENV", "CheckpointAgent", "bcast_json", "gather_json"]

log = logging.getLogger("conduit_hpc.checkpoint")


# ---------------------------------------------------------------------------------
# JSON over MPI without pickle


def _to_bytes(obj: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(obj, separators=(",", ":")).encode(), dtype=np.uint8)


def _from_bytes(buf: np.ndarray) -> Any:
    return json.loads(bytes(buf).decode())


# ---------------------------------------------------------------------------------
# periodic checkpoints on the buffer side


@dataclass
class _Flight:
    seq: int
    tmp: Path
    started: float
    parts: dict[int, dict[str, Any]] = field(default_factory=dict)
    expected: set[int] = field(default_factory=set)


class CheckpointAgent(BufferExtension):
    """Buffer-side checkpoints while the job runs.

    Construct on every rank of the job (local, no collective); it does work only on
    buffer ranks, where it is an extension of the progress loop (its messages, a per-pass
    step, and holding a learner's messages between its marker and this rank's cut).
    Learners take part in superstep-boundary checkpoints through
    :meth:`every_supersteps`. Staging memory equal to this rank's shards is allocated
    and touched here, so that a cut is a plain ``memcpy``.

    Args:
        edp (FeatureHost): this rank's data plane.
        root (Path): checkpoint root (shared by all buffer ranks).
        every_seconds (float): the leader starts a checkpoint this often (0: only on
            request).
        keep (int): complete checkpoints kept under ``root`` (0: all).
        first_seq (int): smallest checkpoint number to use (after a resume: the restored
            number + 1).
        counters (Callable[[], dict] | None): extra counters of this rank, read at each
            cut (e.g. the scheduler's position).
        markers (Sequence[int] | None): world ranks whose :meth:`mark` gates a
            superstep-boundary checkpoint (default: the learner ranks).
    """

    def __init__(self, edp: FeatureHost, root: Path, *, every_seconds: float = 0.0,
                 keep: int = 3, first_seq: int = 1,
                 counters: Callable[[], dict[str, Any]] | None = None,
                 markers: Sequence[int] | None = None) -> None:
        self.edp = edp
        self.root = Path(root)
        self.every_seconds = float(every_seconds)
        self.keep = int(keep)
        self.first_seq = int(first_seq)
        self.counters = counters
        roles = edp.roles
        self.is_buffer = edp.server is not None
        self.leader = roles.buffer_ranks[0]
        self.is_leader = roles.world_rank == self.leader
        # the latest RECORDS_KEEP of each (``.total`` counts every one)
        self.completed: Kept[dict[str, Any]] = Kept(maxlen=RECORDS_KEEP)  # leader: a checkpoint's
        self.failed: Kept[str] = Kept(maxlen=RECORDS_KEEP)
        self.cuts_s: Kept[float] = Kept(maxlen=RECORDS_KEEP)  # this rank's cut pauses
        self.writes_s: Kept[float] = Kept(maxlen=RECORDS_KEEP)  # its shard-file writes (background)
        self.longest_cut_s = 0.0
        self._flight: _Flight | None = None  # leader
        self._flight_info: dict[str, Any] = {}
        self._requests: list[dict[str, Any]] = []  # leader
        self._manifest: threading.Thread | None = None  # leader
        self._manifest_result: dict[str, Any] = {}
        self._writer: threading.Thread | None = None
        self._writer_result: dict[str, Any] = {}
        self._writing_seq = -1
        self._last_cut_seq = -1
        self._closing = False
        self._last_start = time.monotonic()
        self.markers = frozenset(roles.learner_ranks if markers is None else markers)
        self._marks: dict[int, set[int]] = {}  # superstep -> ranks whose marker arrived
        self._mark_parts: dict[int, set[int]] = {}  # superstep -> ranks with a part
        self._deferred: tuple[int, Path, int] | None = None  # a cut waiting for markers
        self.staging: dict[int, SnapshotStaging] = {}
        #: sources whose messages wait (in order) until :meth:`release` - between a
        #: learner's checkpoint marker and this rank's cut, so that the cut holds exactly
        #: what that learner sent before the marker
        self.holding: dict[int, float] = {}
        self.held: list[Message] = []
        self._handlers: dict[int, Handler] = {
            Tag.CKPT_CUT: self._on_cut, Tag.CKPT_PART: self._on_part,
            Tag.CKPT_REQUEST: self._on_request, Tag.CKPT_MARK: self._on_mark}
        if self.is_buffer:
            assert edp.server is not None
            for s in edp.server.shards:
                self.staging[s.shard_id] = SnapshotStaging(s.ring.layout.stored,
                                                               s.ring.capacity)
            edp.server.add_extension(self)
            if self.is_leader:
                self.root.mkdir(parents=True, exist_ok=True)
                ck.prune(self.root, self.keep)  # leftovers of a crashed run in this root

    # -- the buffer loop's events (see BufferExtension) --------------------------------
    tags = frozenset({Tag.CKPT_CUT, Tag.CKPT_PART, Tag.CKPT_REQUEST, Tag.CKPT_MARK})
    #: tags never held (the checkpoint and stop protocols themselves)
    PASS_THROUGH = frozenset({*tags, Tag.STOP})

    def on_message(self, msg: Message) -> None:
        self._handlers[msg.tag](msg)

    def intercept(self, msg: Message) -> bool:
        if msg.source in self.holding and msg.tag not in self.PASS_THROUGH:
            self.held.append(msg)
            return True
        return False

    def on_pass(self) -> int:
        return self.poll()

    def hold(self, source: int) -> None:
        """Keep messages from ``source`` (in order) until :meth:`release`. Local."""
        self.holding.setdefault(source, time.monotonic())

    def release(self) -> int:
        """Hand every held message back to the loop, in arrival order. Local."""
        held, self.held = self.held, []
        self.holding.clear()
        assert self.edp.server is not None
        for msg in held:
            self.edp.server.dispatch(msg)
        return len(held)

    # -- learners ------------------------------------------------------------------
    def every_supersteps(self, every: int,
                         provide: Callable[[], dict[str, Any]] | None = None) -> None:
        """Learners: take part in checkpoints cut at every ``every``-th superstep
        boundary; ``provide()`` returns this learner's state (``extra_state``: named
        arrays such as the model and optimizer, lead learner only, ``extra_attrs``
        their attributes; ``counters``). Other
        ranks, or ``every <= 0``: no-op. Local."""
        if self.edp.learner is not None and every > 0:
            self.edp.learner.add_hook(BoundaryHook(self, self.edp.learner, every,
                                                   provide or (lambda: {})))

    # -- any rank ------------------------------------------------------------------
    def request(self, *, parts_from: Sequence[int] = (), **info: Any) -> None:
        """Ask the leader for a checkpoint as soon as none is in flight. Local, does not
        block.

        Args:
            parts_from (Sequence[int]): non-buffer world ranks that contribute a part
                (RNG state, counters, named arrays) through :meth:`contribute`; the
                checkpoint completes only when each has.
            **info: JSON-able scalars (e.g. ``superstep=120``), stored in the manifest
                as the leader's counters ``request.<name>``.
        """
        info = {**info, "parts_from": [int(r) for r in parts_from]}
        if self.is_leader:
            self._requests.append(info)
        else:
            self.edp.channel.isend(self.leader, Tag.CKPT_REQUEST, _to_bytes(info))

    def mark(self, superstep: int, *, part: bool = True) -> None:
        """Superstep boundary (non-buffer ranks, every rank in ``markers``): everything
        this rank sent for supersteps ``<= superstep`` belongs in the checkpoint. Send it
        after those messages. Local, does not block.

        Args:
            superstep (int): the boundary.
            part (bool): this rank will hand in a part with :meth:`contribute`.
        """
        payload = _to_bytes({"mark": int(superstep), "part": bool(part)})
        for b in self.edp.roles.buffer_ranks:
            self.edp.channel.isend(b, Tag.CKPT_MARK, payload)

    def _marked(self, superstep: int) -> bool:
        return self._marks.get(superstep, set()) >= self.markers

    def _on_mark(self, msg: Message) -> None:
        info = _from_bytes(msg.payload)
        s = int(info["mark"])
        self._marks.setdefault(s, set()).add(msg.source)
        if not self._closing:
            # what this learner sends after its marker belongs after the cut
            self.hold(msg.source)
        if info.get("part"):
            self._mark_parts.setdefault(s, set()).add(msg.source)
        if self.is_leader and self._marked(s) and not self._closing:
            self._requests.append({"superstep": s, "mark": s,
                                   "parts_from": sorted(self._mark_parts.pop(s, set()))})

    def contribute(self, provide: Callable[[], Mapping[str, Any]]) -> bool:
        """Non-buffer ranks named in a request's ``parts_from``: if the leader has asked
        for this rank's part, write it and send it. Call it in the rank's loop (a learner:
        at superstep boundaries). Local; does not wait for a request, but writes the
        named arrays (if any) before returning.

        Args:
            provide (Callable[[], Mapping]): called once per checkpoint; returns any of
                ``rng`` (JSON text, :func:`~conduit_hpc.checkpoint.rng_to_json`),
                ``counters`` (name -> number) and ``extra_state`` (name -> numeric array;
                one rank per checkpoint) with ``extra_attrs`` (name -> HDF5 attributes).

        Returns:
            bool: whether a part was written and sent.
        """
        msg = self.edp.channel.poll(tag=Tag.CKPT_CUT)
        if msg is None:
            return False
        info = _from_bytes(msg.payload)
        state = provide()
        part: dict[str, Any] = {"seq": int(info["seq"]), "world_rank": self.edp.world_rank,
                                "role": self.edp.role.value, "rng": state.get("rng"),
                                "sampler": state.get("sampler"),
                                "counters": dict(state.get("counters") or {}),
                                "files": [], "shards": []}
        extra = state.get("extra_state")
        try:
            if state.get("error"):  # the state could not be taken (BoundaryHook)
                raise CheckpointError(str(state["error"]))
            if extra is not None:
                part["files"].append(ck.write_arrays_file(Path(info["tmp"]) / ck.LEARNER_FILE,
                                                          extra, state.get("extra_attrs")))
        except CheckpointError as err:
            part["error"] = str(err)
        self.edp.channel.isend(self.leader, Tag.CKPT_PART, _to_bytes(part))
        return True

    # -- handlers (buffer ranks, inside the progress loop) ---------------------------
    def _on_request(self, msg: Message) -> None:
        if not self._closing:
            self._requests.append(_from_bytes(msg.payload))

    def _on_cut(self, msg: Message) -> None:
        info = _from_bytes(msg.payload)
        mark = info.get("mark")
        if mark is not None and not self._marked(int(mark)):
            self._deferred = (int(info["seq"]), Path(info["tmp"]), int(mark))
            return  # a learner's marker (and the messages before it) is still on its way
        self._start_cut(int(info["seq"]), Path(info["tmp"]), mark)

    def _on_part(self, msg: Message) -> None:
        part = _from_bytes(msg.payload)
        self._add_part(part)

    def _start_cut(self, seq: int, tmp: Path, mark: int | None = None) -> None:
        if self._writer is not None:  # only after the leader dropped a late checkpoint
            self._last_cut_seq = seq
            part = {"seq": seq, "world_rank": self.edp.world_rank, "role": "buffer",
                    "rng": None, "counters": {}, "error": f"world rank "
                    f"{self.edp.world_rank} is still writing checkpoint {self._writing_seq}"}
            if self.is_leader:
                self._add_part(part)
            else:
                self.edp.channel.isend(self.leader, Tag.CKPT_PART, _to_bytes(part))
            return
        assert self.edp.server is not None
        if mark is not None:  # markers up to this boundary are used up
            for m in [m for m in self._marks if m <= mark]:
                del self._marks[m]
        snaps, cut_s = cut_shards(self.edp.server.shards, self.staging,
                                  writers_done=self.edp.server.finished)
        self.release()  # messages sent after the markers apply after the cut
        self.cuts_s.append(cut_s)
        self.longest_cut_s = max(self.longest_cut_s, cut_s)
        self._last_cut_seq = seq
        self._writing_seq = seq
        # plain numbers of its own, now (the part is sent from the writer's result)
        extra = plain_counters(self.counters() if self.counters else {})
        if isinstance(extra, dict):  # (another form is refused with the part)
            extra.update(limiter_counters(self.edp))
        path = tmp / buffer_file(self.edp)
        me = self.edp.world_rank
        result: dict[str, Any] = {}
        self._writer_result = result
        described = described_for(self.edp)
        codecs = compression_for(self.edp)

        def write() -> None:
            try:
                result.update(write_buffer_part(path, snaps, cut_s, me, extra, described,
                                                codecs))
            except Exception as err:  # whatever failed, the leader drops this checkpoint
                result.update({"error": f"{type(err).__name__}: {err}", "counters": {}})

        self._writer = threading.Thread(target=write, name=f"ckpt-write-{seq}", daemon=True)
        self._writer.start()

    def _add_part(self, part: dict[str, Any]) -> None:
        fl = self._flight
        if fl is None or int(part["seq"]) != fl.seq:
            return  # a part of a dropped checkpoint
        fl.parts[int(part["world_rank"])] = part
        if set(fl.parts) >= fl.expected and self._manifest is None:
            self._start_manifest(fl)

    # -- the per-pass hook ---------------------------------------------------------
    def poll(self) -> int:
        """One step of the protocol; called by the buffer loop each pass. Local, never
        blocks; returns work done."""
        work = 0
        since = min(self.holding.values(), default=None)
        if since is not None and (self._closing or time.monotonic() - since >
                                  self.edp.config.run.timeout_s / 2):
            # a boundary whose cut never came (closing, or the checkpoint was dropped):
            # let the learners' messages through rather than stall them
            log.warning("releasing messages held for a checkpoint cut that did not come")
            work += self.release()
        if self._deferred is not None and self._marked(self._deferred[2]):
            seq, tmp, mark = self._deferred
            self._deferred = None
            self._start_cut(seq, tmp, mark)
            work += 1
        if self._writer is not None and not self._writer.is_alive():
            self._writer.join()
            self._writer = None
            part = {"seq": self._writing_seq, "world_rank": self.edp.world_rank,
                    "role": "buffer", "rng": None, **self._writer_result}
            if "checkpoint_write_s" in part.get("counters", {}):
                self.writes_s.append(float(part["counters"]["checkpoint_write_s"]))
            if self.is_leader:
                self._add_part(part)
            else:
                self.edp.channel.isend(self.leader, Tag.CKPT_PART, _to_bytes(part))
            work += 1
        if self.is_leader:
            work += self._leader_poll()
        return work

    def _leader_poll(self) -> int:
        if self._manifest is not None and not self._manifest.is_alive():
            self._manifest.join()
            self._manifest = None
            fl = self._flight
            assert fl is not None
            res = self._manifest_result
            if "error" in res:
                self.failed.append(res["error"])
                log.warning("checkpoint %d failed and was dropped: %s", fl.seq, res["error"])
                shutil.rmtree(fl.tmp, ignore_errors=True)
            else:
                self.completed.append(res)
            self._flight = None
            return 1
        fl = self._flight
        io_s, io_note = io_timeout(self.edp)  # the parts are written first: disk time
        if fl is not None and self._manifest is None and \
                time.perf_counter() - fl.started > io_s:
            missing = sorted(fl.expected - set(fl.parts))
            self.failed.append(f"checkpoint {fl.seq}: no part from world ranks {missing}"
                               f"{self.edp.roles.hosts.of_ranks(missing)} within {io_s:g} s"
                               f"{io_note}")
            log.warning("checkpoint %d dropped: %s", fl.seq, self.failed[-1])
            shutil.rmtree(fl.tmp, ignore_errors=True)
            self._flight = None
            return 1
        if self._flight is not None or self._closing or self._writer is not None:
            return 0
        due = self.every_seconds > 0 and \
            time.monotonic() - self._last_start >= self.every_seconds
        if not (due or self._requests):
            return 0
        info = self._requests.pop(0) if self._requests else {"reason": "timer"}
        self._start(info)
        return 1

    def _start(self, info: Mapping[str, Any]) -> None:
        self._last_start = time.monotonic()
        seq = ck.next_seq(self.root, self.first_seq)
        self.first_seq = seq + 1
        tmp = self.root / f"{ck.TMP_PREFIX}{ck.checkpoint_name(seq)}-{os.getpid()}"
        try:
            tmp.mkdir(parents=True)
        except OSError as err:
            self.failed.append(f"cannot create {tmp}: {err}")
            log.warning("checkpoint %d not started: cannot create %s: %s", seq, tmp, err)
            return
        roles = self.edp.roles
        others = [int(r) for r in info.get("parts_from", ()) if r not in roles.buffer_ranks]
        self._flight = _Flight(seq=seq, tmp=tmp, started=time.perf_counter(),
                               expected=set(roles.buffer_ranks) | set(others))
        self._flight_info = {k: v for k, v in info.items()
                             if isinstance(v, int | float | str | bool)}
        payload = _to_bytes({"seq": seq, "tmp": str(tmp), "mark": info.get("mark")})
        for r in [*roles.buffer_ranks, *others]:
            if r != self.leader:
                self.edp.channel.isend(r, Tag.CKPT_CUT, payload)
        self._start_cut(seq, tmp, info.get("mark"))

    def _start_manifest(self, fl: _Flight) -> None:
        parts = list(fl.parts.values())
        for p in parts:  # what the request said (e.g. the superstep) goes on record
            if int(p["world_rank"]) == self.leader:
                p["counters"].update({f"request.{k}": v for k, v in self._flight_info.items()})
        result: dict[str, Any] = {}
        self._manifest_result = result
        edp, root, keep = self.edp, self.root, self.keep

        def write() -> None:
            result.update(finish_from_parts(fl.tmp, root, fl.seq, edp, parts, keep,
                                            started=fl.started))

        self._manifest = threading.Thread(target=write, name=f"ckpt-manifest-{fl.seq}",
                                          daemon=True)
        self._manifest.start()

    # -- end -----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Whether this rank has checkpoint work in flight."""
        return self._writer is not None or self._manifest is not None or \
            self._flight is not None

    def _no_part_yet(self) -> str:
        """For a timeout's message: the ranks whose part of the checkpoint in flight
        the leader has not received (``""``: none, or not the leader)."""
        fl = self._flight
        missing = sorted(fl.expected - set(fl.parts)) if fl is not None else []
        return (f"no part yet from world ranks {missing}"
                f"{self.edp.roles.hosts.of_ranks(missing)}") if missing else ""

    def finish(self, timeout_s: float | None = None) -> None:
        """Complete the checkpoint in flight and stop starting new ones.

        **Collective** over the buffer ranks (no-op elsewhere); call after ``serve``
        returned. Blocks at most ``timeout_s`` (default: ``max(run.timeout_s,
        checkpoint.timeout_s)``, as the checkpoint in flight may still be writing).

        Raises:
            DataPlaneTimeout: the checkpoint in flight did not complete in time.
        """
        if not self.is_buffer:
            return
        self._closing = True
        bcomm = self.edp.roles.buffer
        assert bcomm is not None
        timeout, note = io_timeout(self.edp) if timeout_s is None else (timeout_s, "")
        flying = bounded_bcast_json(bcomm, self._flight.seq if self._flight else -1, 0,
                                    timeout, "the end of checkpointing (the checkpoint in "
                                    "flight)", lambda: self.edp.control.raise_if_failed(
                                        self.edp.world_rank))
        deadline = Deadline(timeout, f"checkpoint {flying} to complete on world rank "
                                     f"{self.edp.world_rank}{note}")
        ch = self.edp.channel
        while True:
            for tag, handler in ((Tag.CKPT_CUT, self._on_cut), (Tag.CKPT_PART, self._on_part)):
                while (msg := ch.poll(tag=tag)) is not None:
                    handler(msg)
            self.poll()
            if self.is_leader:
                done = not self.busy
            else:
                done = self._writer is None and self._last_cut_seq >= flying
            if done:
                break
            deadline.check(self._no_part_yet)
            time.sleep(0.001)
        # this rank's part may be held for an emulated long link (long-haul): hand it to
        # MPI first, or the leader waits for it while this rank waits in the barrier
        ch.release_held(deadline.remaining_s)
        bounded_barrier(bcomm, timeout, "the end of checkpointing",
                        lambda: self.edp.control.raise_if_failed(self.edp.world_rank))
