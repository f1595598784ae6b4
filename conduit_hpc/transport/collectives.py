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

Nothing here knows what the tensors are.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI

from conduit_hpc.errors import CollectiveFailed, ConfigError, TransportError
from conduit_hpc.transport.objects import allgather_json, bcast_json

__all__ = ["BACKENDS", "Collectives", "choose_backend"]

#: what ``backend`` may say
BACKENDS = ("auto", "gloo", "nccl")


def choose_backend(asked: str, members: Sequence[dict[str, Any]],
                   key: str = "transport.collectives") -> str:
    """The backend for a group whose ranks reported ``members`` (``cuda``: this rank
    has a CUDA device; ``nccl``: torch has NCCL built in; ``gpu``: which one, as
    ``host:index`` - two ranks on one GPU have no device of their own, and NCCL refuses
    them). Local and deterministic: every rank decides the same from the same reports.

    Raises:
        ConfigError: ``asked`` is not one of :data:`BACKENDS`, or is ``"nccl"`` while
            some rank has no CUDA device of its own or no NCCL (names the ranks).
    """
    if asked not in BACKENDS:
        raise ConfigError(f"{key} must be one of {list(BACKENDS)}, got {asked!r}", key=key)
    gpus = [m.get("gpu", "") for m in members]
    lacking = [r for r, m in enumerate(members) if not (m["cuda"] and m["nccl"])
               or (gpus[r] and gpus.count(gpus[r]) > 1)]
    if asked == "nccl" and lacking:
        raise ConfigError(f"{key} = 'nccl' needs a CUDA device per rank and torch built "
                          f"with NCCL, but ranks {lacking} of the group have none of their "
                          f"own "
                          f"(torch {torch.__version__}); use 'gloo' or 'auto'", key=key)
    if asked == "auto":
        return "gloo" if lacking else "nccl"
    return asked


def _route_address(peer: str) -> str:
    """This host's address on the route to ``peer`` (a UDP ``connect`` sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return str(s.getsockname()[0])


def _store_address(one_node: bool) -> str:
    """The address the first rank's store listens on, as the others reach it."""
    if one_node:
        return "127.0.0.1"
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        addr = ""
    if addr and not ipaddress.ip_address(addr).is_loopback:
        return addr
    return _route_address("10.255.255.255")  # the interface of the default route


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
        """
        if not (isinstance(timeout_s, int | float) and 0 < timeout_s <= 86400):
            raise ConfigError(f"timeout_s must be a number of seconds in (0, 86400], got "
                              f"{timeout_s!r}", key="timeout_s")
        if backend not in BACKENDS:  # deterministic: every rank raises before any call
            raise ConfigError(f"{key} must be one of {list(BACKENDS)}, got {backend!r}",
                              key=key)
        rank, size = comm.Get_rank(), comm.Get_size()
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
                store = dist.TCPStore(where["address"], 0, size, True, timeout=timeout,
                                      wait_for_workers=False)
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
        problems = [p for p in allgather_json(comm, problem) if p]
        if problems:
            _shutdown(group)
            raise TransportError(f"forming the {chosen} process group of {size} ranks "
                                 f"failed: {problems[0]}"
                                 + (f" (and {len(problems) - 1} more)" if len(problems) > 1
                                    else ""))
        return cls(group, store, backend=chosen, rank=rank, size=size, device=dev,
                   timeout_s=float(timeout_s))

    # -- collectives -----------------------------------------------------------------
    def _run(self, what: str, start: Any) -> None:
        if self._group is None:
            raise TransportError(f"{what} on a closed process group")
        try:
            start().wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as err:
            raise CollectiveFailed(
                f"{what} on the {self.backend} group of {self.size} ranks (this rank "
                f"{self.rank}) failed: a peer failed or did not arrive within "
                f"{self.timeout_s:g} s ({str(err).strip().splitlines()[0]})") from err

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
        for t in ts:
            n = t.numel()
            t.copy_(flat[at:at + n].view_as(t))
            at += n

    def allreduce_mean_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor by its mean over the group, in place. One flat bucket
        per dtype. **Collective**; blocks (bounded)."""
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

    def allreduce_max(self, values: Sequence[int]) -> list[int]:
        """The element-wise maximum of ``values`` over the group (e.g. flags every rank
        must agree on). **Collective**; blocks (bounded)."""
        t = torch.tensor([int(v) for v in values], dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
        self._run(f"allreduce-max of {len(values)} values",
                  lambda: self._group.allreduce([t], opts))
        return [int(v) for v in t.cpu().tolist()]

    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int) -> None:
        """Overwrite each tensor with rank ``src``'s, in place. **Collective**; blocks.

        Raises:
            ValueError: ``src`` is not a rank of the group.
        """
        if not 0 <= src < self.size:
            raise ValueError(f"src must be a rank of the group (0..{self.size - 1}), "
                             f"got {src!r}")
        for ts, flat in self._buckets(tensors):
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = src, 0
            self._run(f"broadcast of {flat.numel():,} values from rank {src}",
                      lambda f=flat, o=opts: self._group.broadcast([f], o))
            self._scatter_back(ts, flat)

    def all_to_all(self, blocks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Send ``blocks[j]`` (any number of rows) to rank ``j``; return the blocks
        received, ``out[i]`` from rank ``i``. Every block has the same dtype and row
        shape on every rank. **Collective** (two exchanges: row counts, then rows);
        blocks (bounded).

        Raises:
            ValueError: not one block per rank, or blocks of different dtype or row
                shape.
        """
        if len(blocks) != self.size:
            raise ValueError(f"all_to_all needs one block per rank ({self.size}), got "
                             f"{len(blocks)}")
        row, dtype = tuple(blocks[0].shape[1:]), blocks[0].dtype
        for j, b in enumerate(blocks):
            if tuple(b.shape[1:]) != row or b.dtype != dtype:
                raise ValueError(f"block {j} has rows {tuple(b.shape[1:])} of {b.dtype}, "
                                 f"block 0 rows {row} of {dtype}")
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

    # -- lifetime ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._group is None

    def close(self) -> None:
        """Shut the group down and let the store go. Local; idempotent. A group can be
        formed again afterwards (a new :meth:`open`)."""
        group, self._group, self._store = self._group, None, None
        _shutdown(group)

    def __enter__(self) -> Collectives:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cuda_device(device: torch.device | str | None, local: int) -> torch.device | None:
    """This rank's own CUDA device, if it has one (``device`` if given and CUDA)."""
    if device is not None:
        d = torch.device(device)
        return d if d.type == "cuda" and torch.cuda.is_available() else None
    if torch.cuda.is_available() and local < torch.cuda.device_count():
        return torch.device("cuda", local)
    return None


def _make_group(backend: str, store: Any, rank: int, size: int,
                timeout: datetime.timedelta, store_address: str, one_node: bool) -> Any:
    if backend == "gloo":
        gloo: Any = dist.ProcessGroupGloo
        opts = gloo._Options()
        opts._timeout = timeout
        here = "127.0.0.1" if one_node else _route_address(store_address)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=here)]
        return gloo(store, rank, size, opts)
    nccl: Any = getattr(dist, "ProcessGroupNCCL")  # noqa: B009 (absent from CPU builds)
    opts = nccl.Options()
    opts.is_high_priority_stream = False
    opts._timeout = timeout
    return nccl(store, rank, size, opts)


def _shutdown(group: Any) -> None:
    if group is not None and hasattr(group, "shutdown"):
        with contextlib.suppress(RuntimeError):  # a peer already gone: nothing to release
            group.shutdown()
