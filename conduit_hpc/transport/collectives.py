"""Tensor collectives through ``torch.distributed``, its group formed from an MPI
communicator.

:meth:`Collectives.open` turns the ranks of an MPI communicator into a
``torch.distributed`` process group with nothing for the user to set (no environment
variable, no extra launcher): the first rank opens a ``TCPStore`` on a free port of its
host, its address and port go to every rank as JSON bytes over MPI
(:func:`~conduit_hpc.transport.objects.bcast_json`, no pickle), and every rank builds
the backend on that store with the communicator's rank and size. The backend is NCCL
when every rank has a CUDA device of its own (bound by node-local rank) and gloo
otherwise; ``"gloo"`` or ``"nccl"`` forces one.

The group is a backend object of its own (``ProcessGroupGloo`` / ``ProcessGroupNCCL``),
never torch's *default* process group: a job may use ``torch.distributed`` itself, and a
process may open, use and close several groups, one after another or side by side.

Every wait is bounded by ``timeout_s``: the store's connection, the backend's
rendezvous, and each collective (a peer that fails or never arrives ends the wait with
a :class:`~conduit_hpc.errors.CollectiveFailed` naming the operation). Forming the group is
agreed on the MPI communicator, so a rank that cannot join makes every rank raise the
same error.

A rank that leaves a collective between or inside its steps (an interrupt it catches)
leaves its group out of step: every later collective on it raises ``CollectiveFailed``
saying why, and the others' collectives fail naming it
(:mod:`~conduit_hpc.transport.collective_steps`).

Nothing here knows what the tensors are.
"""

from __future__ import annotations

import datetime
import hashlib
import socket
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from conduit_hpc.errors import CollectiveFailed, CollectiveMismatch, ConfigError, TransportError
from conduit_hpc.transport.collective_header import (
    OPS,
    PROBLEMS,
    int64_or,
    listing,
    peer_left,
    problem_of,
)
from conduit_hpc.transport.collective_steps import MARGIN_S, in_step, wait_work
from conduit_hpc.transport.objects import allgather_json, bcast_json
from conduit_hpc.transport.process_group import (
    BACKENDS,
    choose_backend,
    closed_by,
    end_group,
    keep_store,
    release,
    serve_store,
)
from conduit_hpc.transport.process_group import cuda_device as _cuda_device
from conduit_hpc.transport.process_group import make_group as _make_group
from conduit_hpc.transport.process_group import shutdown as _shutdown
from conduit_hpc.transport.process_group import store_address as _store_address

__all__ = ["BACKENDS", "Collectives", "choose_backend"]


class Collectives:
    """A ``torch.distributed`` process group over the ranks of an MPI communicator.

    Build it with :meth:`open` (collective). The collectives are **collective** on the
    group (every rank calls them in the same order with tensors of the same shapes) and
    block until done, each bounded by ``timeout_s``; :meth:`close` is local.

    Attributes:
        backend (str): ``gloo`` or ``nccl``.
        rank (int): this rank in the group (= its rank in the MPI communicator).
        size (int): ranks in the group.
        device (torch.device): where the backend moves tensors (``cpu`` for gloo).
        timeout_s (float): bound on every collective.
    """

    def __init__(self, group: Any, store: Any, *, backend: str, rank: int, size: int,
                 device: torch.device, timeout_s: float) -> None:
        self._group, self._store = group, store
        self.backend, self.rank, self.size = backend, rank, size
        self.device, self.timeout_s = device, timeout_s
        #: raises RemoteFailure naming a rank that left (the data plane's record), so
        #: that a failed collective names it; ``None``: no such record
        self.peers: Callable[[], object] | None = None
        #: called while a gloo step waits, every 50 ms after the first (the data plane's
        #: MPI progress: ranks on this node may wait in RMA atomics for it); ``None``: none
        self.idle: Callable[[], object] | None = None
        self.member = f"rank {rank} of the {backend} group"  # named so if it closes first
        self._failure = ""
        #: why this rank left the group out of step ("": in step), whether this call's
        #: first step began, and the step in flight (True: being started) - in_step's
        self._left, self._began = "", False
        self._inflight: Any = None

    # -- forming the group -----------------------------------------------------------
    @classmethod
    def open(cls, comm: MPI.Intracomm, backend: str = "auto", *, timeout_s: float = 60.0,
             device: torch.device | str | None = None,
             key: str = "transport.collectives") -> Collectives:
        """Form a group of the ranks of ``comm``. **Collective** on ``comm``; blocks
        until every rank joined (bounded by ``timeout_s``).

        Args:
            comm (MPI.Intracomm): the ranks of the group, in its rank order.
            backend (str): ``auto`` (NCCL when every rank has a CUDA device of its own,
                else gloo), ``gloo`` or ``nccl``.
            timeout_s (float): bound on forming the group and on each collective.
            device (torch.device | str | None): this rank's CUDA device for NCCL (default:
                ``cuda:<node-local rank>`` when there are that many GPUs on the node).
            key (str): the config key named in errors about ``backend``.

        Raises:
            ConfigError: a bad ``backend`` or ``timeout_s``, or NCCL asked for where
                some rank has no CUDA device (on every rank).
            TransportError: some rank could not open or join the group (on every rank,
                with that rank's reason).
            CollectiveFailed: some rank of ``comm`` did not call it within ``timeout_s``.
        """
        if isinstance(timeout_s, bool) or not (isinstance(timeout_s, int | float)
                                               and 0 < timeout_s <= 86400):
            raise ConfigError(f"timeout_s must be a number of seconds in (0, 86400], got "
                              f"{timeout_s!r}", key="timeout_s")
        if backend not in BACKENDS:  # deterministic: every rank raises before any call
            raise ConfigError(f"{key} must be one of {list(BACKENDS)}, got {backend!r}",
                              key=key)
        rank, size = comm.Get_rank(), comm.Get_size()
        # every rank is here before the blocking MPI calls below (a rank that never
        # calls open fails the others here, within timeout_s, not in Split_type forever)
        allgather_json(comm, 0, timeout_s, "Collectives.open()")
        node: MPI.Intracomm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)  # type: ignore[assignment]
        local, one_node = node.Get_rank(), node.Get_size() == size
        node.Free()
        cuda = _cuda_device(device, local)
        gpu = (f"{socket.gethostname()}:{cuda.index if cuda.index is not None else 0}"
               if cuda is not None else "")
        members = allgather_json(comm, {"cuda": cuda is not None, "gpu": gpu,
                                        "nccl": dist.is_nccl_available()})
        chosen = choose_backend(backend, members, key)  # the same on every rank
        dev = cuda if chosen == "nccl" and cuda is not None else torch.device("cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)  # NCCL binds this rank to its node-local GPU
        timeout = datetime.timedelta(seconds=float(timeout_s))
        store, problem = None, ""
        where: dict[str, Any] = {"address": "", "port": 0, "error": ""}
        if rank == 0:
            try:
                where["address"] = _store_address(one_node)
                store = serve_store(where["address"], size, timeout)
                where["port"] = int(store.port)
            except (OSError, RuntimeError, ValueError) as err:
                where["error"] = f"rank 0 could not open the rendezvous store: {err}"
        where = bcast_json(comm, where, root=0)
        group = None
        if where["error"]:
            problem = where["error"]
        else:
            try:
                if store is None:
                    store = dist.TCPStore(where["address"], where["port"], size, False,
                                          timeout=timeout)
                group = _make_group(chosen, dist.PrefixStore("conduit/", store), rank, size,
                                    timeout, where["address"], one_node)
            except (OSError, RuntimeError, ValueError) as err:
                problem = (f"rank {rank} could not join the {chosen} group at "
                           f"{where['address']}:{where['port']} within {timeout_s:g} s: "
                           f"{str(err).strip().splitlines()[0] if str(err).strip() else err!r}")
        problems = [p for p in allgather_json(comm, problem, 2 * timeout_s + 10,
                                              "Collectives.open()") if p]
        if problems:
            _shutdown(group)
            raise TransportError(f"forming the {chosen} process group of {size} ranks "
                                 f"failed: {problems[0]}"
                                 + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                                    else ""))
        return cls(group, store, backend=chosen, rank=rank, size=size, device=dev,
                   timeout_s=float(timeout_s))

    # -- collectives -----------------------------------------------------------------
    def _agree(self, op: str, tensors: Sequence[Any], what: str, *, arg: int = 0,
               value: int = 0, local: tuple[str, int] = ("", 0)) -> list[list[int]]:
        """Every rank's header row before ``op`` moves any data (one allreduce of two values
        when the rows agree; an allgather of the rows when they differ): ranks that call
        other operations here, pass other tensor counts, shapes, dtypes or order, or a
        tensor the backend cannot move, raise
        :class:`~conduit_hpc.errors.CollectiveMismatch` on every rank, naming the ranks.
        Before, gloo got buffers of other sizes (its background thread then aborted the
        process: ``EnforceNotMet ... collective mismatch``), averaged unrelated values of
        same-sized tensors, or paired one rank's second bucket with another's next call.
        ``arg`` travels unchecked (per-op), ``value`` is the one-value maximum's value;
        ``local``: a problem the caller found in its arguments (one of :data:`PROBLEMS`,
        and a number), refused on every rank like the others. When every rank's row is
        the same, that one row is returned (not one per rank)."""
        problem, where = ((PROBLEMS.index(local[0]), local[1]) if local[0]
                          else problem_of(tensors))
        shapes = [] if problem else [(str(t.dtype), tuple(t.shape)) for t in tensors]
        nvalues = sum(int(t.numel()) for t in tensors) if not problem else 0
        fp = int.from_bytes(hashlib.blake2b(repr(shapes).encode(), digest_size=7).digest(),
                            "little")
        if not -(2 ** 63) <= value < 2 ** 63:
            problem, where, value = PROBLEMS.index("a value that is not an int64"), 0, 0
        row = torch.tensor([OPS.index(op), problem, where, len(tensors), nvalues, fp, arg,
                            value], dtype=torch.int64, device=self.device)
        # most calls agree: one allreduce of two values (gloo's allreduce costs ~12x more
        # from 8 values up at 4 ranks here: its algorithm changes) - the maximum of a hash
        # of the row and of its bitwise NOT (max(~h) = ~min(h)); equal extremes: every
        # rank's row is this one. A rank's count of absent tensors enters as "some".
        # Any difference (or a problem) gathers the rows one by one to name the ranks.
        key = [OPS.index(op), problem, where, len(tensors), nvalues, fp,
               min(arg, 1) if op == "allreduce_mean_" else arg, value]
        h = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(),
                           "little") >> 1
        pair = torch.tensor([h, ~h], dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        self._run(what, lambda: self._group.allreduce([pair], opts))
        hi, lo = (int(v) for v in pair.cpu().tolist())
        if hi == ~lo and not problem:  # the same on every rank (so is its problem)
            return [key]
        out = [torch.empty_like(row) for _ in range(self.size)]
        self._run(what, lambda: self._group.allgather([out], [row]))
        rows = [[int(v) for v in t.cpu().tolist()] for t in out]
        ops = {r: OPS[h[0]] if 0 <= h[0] < len(OPS) else "?" for r, h in enumerate(rows)}
        if len(set(ops.values())) > 1:
            raise CollectiveMismatch(f"{op} on rank {self.rank}: the ranks of the "
                                     f"{self.backend} group called different collectives "
                                     f"at this point ({listing(ops)}); every rank must "
                                     f"call the same ones in the same order")
        bad = {r: f"{PROBLEMS[h[1]]}{' at position' if h[1] < 4 else ''} {h[2]}"
               if 0 < h[1] < len(PROBLEMS) else "?" for r, h in enumerate(rows) if h[1]}
        if bad:
            raise CollectiveMismatch(f"{op}: ranks {sorted(bad)} of the {self.backend} group "
                                     f"passed what it cannot move ({listing(bad)}); expected "
                                     f"dense numeric torch tensors"
                                     + (f", src in 0..{self.size - 1}" if op == "broadcast_"
                                        else "") + f" (this rank {self.rank})")
        counts = {r: (h[3], h[4]) for r, h in enumerate(rows)}
        if len(set(counts.values())) > 1:
            raise CollectiveMismatch(
                f"{op}: the ranks of the {self.backend} group passed other tensors ("
                + listing({r: f"{n} tensors of {v:,} values" for r, (n, v) in
                            counts.items()})
                + f"); every rank must pass the same shapes and dtypes (this rank "
                  f"{self.rank})")
        other = [r for r, h in enumerate(rows) if h[5] != rows[0][5]]
        if other:
            mine = f"{shapes[:4]}{'...' if len(shapes) > 4 else ''}"
            raise CollectiveMismatch(f"{op}: ranks {other} of the {self.backend} group passed "
                                     f"tensors of rank 0's count and size but other shapes, "
                                     f"dtypes or order ({mine} on this rank {self.rank}); "
                                     f"the values would be "
                                     f"combined position by position across unrelated "
                                     f"tensors")
        return rows

    def _run(self, what: str, start: Any) -> None:
        if self._group is None:
            raise TransportError(f"{what} on a closed process group"
                                 + (f" (it failed earlier: {self._failure})"
                                    if self._failure else ""))
        self._began = work = self._inflight = True  # a step may be in flight from here
        try:
            work = self._inflight = start()
            wait_work(work, self.backend, self.timeout_s, self.idle)
        except RuntimeError as err:
            self._fail(what, err, None if work is True else work)
        self._inflight = None

    def _fail(self, what: str, err: RuntimeError, work: Any) -> NoReturn:
        """The group failed in ``what``: it cannot be used again (a later call raises
        TransportError naming this failure). Names the peer that left if ``peers`` (the
        data plane's record of ranks that left on an exception) knows one."""
        store = self._store
        cause = peer_left(self.peers) or closed_by(store, self.rank, self.size)
        first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
        text = (f"{what} on the {self.backend} group of {self.size} ranks (this rank "
                f"{self.rank}) failed: "
                + (f"{cause}" if cause else f"a peer failed, left or did not arrive within "
                                            f"{self.timeout_s:g} s")
                + f" ({first})")
        group, self._group, self._store = self._group, None, None
        keep_store(store, self.timeout_s + MARGIN_S)  # the peers look into it
        self._failure = text
        release(group, work)
        raise CollectiveFailed(text) from err

    def _leave(self, why: str) -> None:
        """This rank left a collective between or inside its steps (:func:`in_step`):
        the group is out of step here. It is ended (kept while a step of it is in
        flight), with word in its store naming this rank and ``why`` for the others."""
        group, store, work = self._group, self._store, self._inflight
        self._group, self._store, self._left = None, None, why
        self._failure = f"this rank left {why} unfinished"
        end_group(group, store, self.rank, self.member, self.timeout_s + MARGIN_S,
                  left=why, work=work)

    @in_step
    def allreduce_mean_(self, tensors: Sequence[torch.Tensor],
                        present: Sequence[bool] | None = None) -> list[bool]:
        """Replace each tensor by its mean over the group, in place. One flat bucket
        per dtype, after one small agreement (:meth:`_agree`) that every rank passes the same
        shapes and dtypes in the same order. ``present[i] = False``: this rank has no
        value for tensor ``i`` (its zeros count in the mean, as DDP counts an unused
        parameter's gradient). Returns, per tensor, whether any rank had it.
        **Collective**; blocks (bounded).

        Raises:
            CollectiveMismatch: ranks passed other tensors, or a sparse or bool one (on
                every rank).
            CollectiveFailed: a peer failed, left or did not arrive.
        """
        absent = [] if present is None else [i for i, p in enumerate(present) if not p]
        n = sum(int(t.numel()) for t in tensors if isinstance(t, torch.Tensor))
        rows = self._agree("allreduce_mean_", tensors, f"allreduce of {n:,} values",
                           arg=len(absent))
        anywhere = [True] * len(tensors)
        if any(h[6] for h in rows):  # some rank lacks some: which does any rank have
            mask = torch.tensor([0 if i in absent else 1 for i in range(len(tensors))],
                                dtype=torch.uint8, device=self.device)
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
            self._run(f"allreduce of which of {len(tensors)} tensors some rank has",
                      lambda: self._group.allreduce([mask], opts))
            anywhere = [bool(v) for v in mask.cpu().tolist()]
        for ts, flat in self._buckets(tensors):
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp(dist.ReduceOp.SUM)
            self._run(f"allreduce of {flat.numel():,} values",
                      lambda f=flat, o=opts: self._group.allreduce([f], o))
            if flat.is_floating_point() or flat.is_complex():
                flat /= self.size
            else:
                flat //= self.size
            self._scatter_back(ts, flat)
        return anywhere

    @in_step
    def allreduce_max(self, values: Sequence[int]) -> list[int]:
        """The element-wise maximum of ``values`` over the group (e.g. flags every rank
        must agree on; one value travels with the agreement, no second exchange).
        **Collective**; blocks (bounded).

        Raises:
            CollectiveMismatch: another number of values on some rank, or a value that is
                not an int64 (on every rank).
        """
        ints = [int(v) if isinstance(v, int | np.integer | np.bool_) else 2 ** 63
                for v in values]  # flags (True/False) are 1/0, as before
        refused = any(not -(2 ** 63) <= v < 2 ** 63 for v in ints)  # on every rank, below
        one = len(ints) == 1
        shape = torch.empty(len(ints), dtype=torch.int64, device="meta")
        rows = self._agree("allreduce_max", [shape], f"allreduce-max of {len(ints)} values",
                           value=2 ** 63 if refused else ints[0] if one else 0)
        if one:
            return [max(h[7] for h in rows)]
        t = torch.tensor(ints, dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        self._run(f"allreduce-max of {len(values)} values",
                  lambda: self._group.allreduce([t], opts))
        return [int(v) for v in t.cpu().tolist()]

    @in_step
    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int) -> None:
        """Overwrite each tensor with rank ``src``'s, in place (also parameters that
        require grad). **Collective**; blocks.

        Raises:
            CollectiveMismatch: ranks passed other tensors, another ``src``, or a ``src``
                that is not a rank of the group (on every rank: a ValueError).
        """
        ok = isinstance(src, int | np.integer) and 0 <= src < self.size
        n = sum(int(t.numel()) for t in tensors if isinstance(t, torch.Tensor))
        rows = self._agree("broadcast_", tensors, f"broadcast of {n:,} values from rank {src}",
                           arg=int(src) if ok else -1,
                           local=("", 0) if ok else (PROBLEMS[5], int64_or(src, -1)))
        srcs = {r: h[6] for r, h in enumerate(rows)}
        if len(set(srcs.values())) > 1:
            raise CollectiveMismatch(f"broadcast_: the ranks named other sources ("
                                     f"{listing(srcs)}); expected one src on every rank")
        for ts, flat in self._buckets(tensors):
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = src, 0
            self._run(f"broadcast of {flat.numel():,} values from rank {src}",
                      lambda f=flat, o=opts: self._group.broadcast([f], o))
            self._scatter_back(ts, flat)

    @in_step
    def all_to_all(self, blocks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Send ``blocks[j]`` (any number of rows) to rank ``j``; return the blocks
        received, ``out[i]`` from rank ``i``. Every block has the same dtype and row
        shape on every rank. **Collective** (the agreement, the row counts, then the
        rows); blocks (bounded).

        Raises:
            CollectiveMismatch: on some rank not one block per rank, blocks of other
                dtypes or row shapes, or other dtypes or row shapes than another rank's
                (on every rank: a ValueError).
        """
        local: tuple[str, int] = ("", 0)
        if len(blocks) != self.size or not blocks:
            local = (PROBLEMS[6], len(blocks))
        problem, where = problem_of(blocks)
        if problem:
            local = (PROBLEMS[problem], where)
        row = tuple(blocks[0].shape[1:]) if not local[0] else ()
        dtype = blocks[0].dtype if not local[0] else torch.float32
        bad = next((j for j, b in enumerate(blocks) if not local[0] and (
            tuple(b.shape[1:]) != row or b.dtype != dtype)), -1)
        if bad >= 0:
            local = (PROBLEMS[7], bad)
        self._agree("all_to_all", [torch.empty((0, *row), dtype=dtype, device="meta")],
                    "all_to_all of row counts", local=local)
        sent = torch.tensor([len(b) for b in blocks], dtype=torch.int64, device=self.device)
        got = torch.empty_like(sent)
        opts = dist.AllToAllOptions()
        self._run("all_to_all of row counts", lambda: self._group.alltoall_base(
            got, sent, [1] * self.size, [1] * self.size, opts))
        counts_in, counts_out = got.cpu().tolist(), sent.cpu().tolist()
        send = torch.cat([b.to(self.device) for b in blocks]).contiguous()
        recv = torch.empty((int(sum(counts_in)), *row), dtype=dtype, device=self.device)
        self._run(f"all_to_all of {len(send):,} rows", lambda: self._group.alltoall_base(
            recv, send, counts_in, counts_out, opts))
        return list(torch.split(recv, counts_in))

    def _buckets(self, tensors: Sequence[torch.Tensor]
                 ) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
        """The tensors grouped by dtype, each group flattened into one tensor on the
        backend's device (one collective per dtype, not per tensor)."""
        groups: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault(t.dtype, []).append(t)
        return [(ts, torch.cat([t.detach().reshape(-1).to(self.device) for t in ts]))
                for _, ts in sorted(groups.items(), key=lambda kv: str(kv[0]))]

    @staticmethod
    def _scatter_back(ts: list[torch.Tensor], flat: torch.Tensor) -> None:
        at = 0
        with torch.no_grad():  # parameters (leaves that require grad) included
            for t in ts:
                n = t.numel()
                t.copy_(flat[at:at + n].view_as(t))
                at += n

    # -- lifetime ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._group is None

    def close(self) -> None:
        """Shut the group down and let the store go. Local; idempotent. A group can be
        formed again afterwards (a new :meth:`open`). A peer still in a collective fails
        with a CollectiveFailed naming this rank (:attr:`member`)."""
        group, store, self._group, self._store = self._group, self._store, None, None
        end_group(group, store, self.rank, self.member, self.timeout_s + MARGIN_S)

    def __enter__(self) -> Collectives:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
