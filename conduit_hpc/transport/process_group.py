"""Forming a ``torch.distributed`` backend object of its own (gloo or NCCL): which
backend a group gets, where its rendezvous store listens, which device a rank binds, and
shutting it down. Used by :mod:`conduit_hpc.transport.collectives`.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from conduit_hpc.errors import ConfigError

__all__ = ["BACKENDS", "choose_backend", "closed_by", "cuda_device", "end_group", "keep_store",
           "make_group", "mark_closed", "release", "serve_store", "shutdown", "store_address"]

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


def route_address(peer: str) -> str:
    """This host's address on the route to ``peer`` (a UDP ``connect`` sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return str(s.getsockname()[0])


def store_address(one_node: bool) -> str:
    """The address the first rank's store listens on, as the others reach it."""
    if one_node:
        return "127.0.0.1"
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        addr = ""
    if addr and not ipaddress.ip_address(addr).is_loopback:
        return addr
    return route_address("10.255.255.255")  # the interface of the default route


def serve_store(address: str, size: int, timeout: datetime.timedelta) -> Any:
    """The first rank's rendezvous store (a ``TCPStore`` server), listening on ``address``
    alone, over IPv4 (``127.0.0.1`` for a group on one node: off the network).

    Left to itself, torch's store listens on every interface through an IPv6 socket, so
    each peer it accepts is ``::ffff:a.b.c.d``, and its server thread reverse-resolves
    that name (``getnameinfo``, for its logs) before it serves anyone else: no hosts file
    lists the v4-mapped form, so every peer cost a DNS query, and a query the resolver
    lost held every rank of the group for the resolver's timeout (glibc: 5 s: the ~5.07 s
    stalls of tests/mpi/test_collectives.py). A plain IPv4 peer (as
    ``127.0.0.1``) is named from the hosts file. The clients' own look-up of the address
    they connect to (torch connects through a v4-mapped IPv6 socket) is torch's and
    remains (docs/sharp-bits.md)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 0))
        sock.listen(max(size, 128))
        port = int(sock.getsockname()[1])
    except OSError:
        sock.close()
        raise
    # the store owns the descriptor from here (it closes it when it ends; one it refused
    # is left open rather than closed twice)
    return dist.TCPStore(address, port, size, True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=sock.detach())


def cuda_device(device: torch.device | str | None, local: int) -> torch.device | None:
    """This rank's own CUDA device, if it has one (``device`` if given and CUDA)."""
    if device is not None:
        d = torch.device(device)
        return d if d.type == "cuda" and torch.cuda.is_available() else None
    if torch.cuda.is_available() and local < torch.cuda.device_count():
        return torch.device("cuda", local)
    return None


def make_group(backend: str, store: Any, rank: int, size: int,
                timeout: datetime.timedelta, store_address: str, one_node: bool) -> Any:
    if backend == "gloo":
        gloo: Any = dist.ProcessGroupGloo
        opts = gloo._Options()
        opts._timeout = timeout
        here = "127.0.0.1" if one_node else route_address(store_address)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=here)]
        return gloo(store, rank, size, opts)
    nccl: Any = getattr(dist, "ProcessGroupNCCL")  # noqa: B009 (absent from CPU builds)
    opts = nccl.Options()
    opts.is_high_priority_stream = False
    opts._timeout = timeout
    return nccl(store, rank, size, opts)


def shutdown(group: Any) -> None:
    if group is not None and hasattr(group, "shutdown"):
        with contextlib.suppress(RuntimeError):  # a peer already gone: nothing to release
            group.shutdown()


#: groups given up with a collective still in flight (kept, as the work writes into its
#: tensors until gloo's deadline ends it; shutting such a group down waits for that)
PARKED: list[tuple[Any, Any]] = []


def release(group: Any, work: Any) -> None:
    """Let a group that ended here go: shut down, or kept (:data:`PARKED`) while ``work``
    is in flight (``True``: a collective may be, its work unknown: one was being started)."""
    if work is not None and (work is True or not work.is_completed()):
        PARKED.append((group, work))  # gloo ends it at its deadline; freed with it
    else:
        shutdown(group)  # nothing in flight: the peers' waits end now too


#: the store keys under which a rank that closed its group says who it was, and which
#: collective it left unfinished (out of step) if that is why
_CLOSED_KEY = "conduit-closed/"
_LEFT_KEY = "conduit-left/"
#: bound on each look into the store while a group closes or fails (the store's host
#: may be gone: a look must not wait out the group's whole timeout)
_LOOK_S = 2.0
#: stores of groups that ended here, kept until their peers' waits are surely over
#: (the first rank's store serves the peers' look at who closed: :func:`closed_by`)
_KEPT: list[tuple[float, Any]] = []


def keep_store(store: Any, seconds: float) -> None:
    """Keep ``store`` (and the server the first rank's store runs) for ``seconds``: a
    peer whose collective fails because this rank's group ended looks into it. Stores
    kept past their time are let go here."""
    now = time.monotonic()
    _KEPT[:] = [(t, s) for t, s in _KEPT if t > now]
    if store is not None:
        _KEPT.append((now + seconds, store))


def mark_closed(store: Any, rank: int, who: str, left: str = "") -> None:
    """Leave word in the group's store that ``rank`` (``who``) closed its group, and
    ``left``: the collective it left unfinished, if that is why, so that a peer whose
    collective fails because of it names it (:func:`closed_by`). Best effort and bounded
    (a few seconds): the store's host may be gone."""
    if store is None:
        return
    with contextlib.suppress(Exception):  # the store's host gone: nothing to tell
        store.set_timeout(datetime.timedelta(seconds=_LOOK_S))
        if left:
            store.set(f"{_LEFT_KEY}{rank}", left)
        store.set(f"{_CLOSED_KEY}{rank}", who)


def closed_by(store: Any, rank: int, size: int) -> str:
    """Who closed the group before this rank's collective failed, as the closer wrote it
    (:func:`mark_closed`), or "" when no peer did. The store lives on rank 0 of the
    group: when it cannot be reached any more from another rank, rank 0's group is gone
    (closed, or its process ended), and that is said. Bounded (a few seconds)."""
    if store is None or size < 2:
        return ""
    try:
        store.set_timeout(datetime.timedelta(seconds=_LOOK_S))
        for r in range(size):
            key = f"{_CLOSED_KEY}{r}"
            if r != rank and store.check([key]):
                who = store.get(key).decode(errors="replace")
                if store.check([f"{_LEFT_KEY}{r}"]):
                    left = store.get(f"{_LEFT_KEY}{r}").decode(errors="replace")
                    return (f"{who} left {left} unfinished, so the ranks of the group "
                            f"were out of step, and ended its process group while this "
                            f"rank waited for it in a collective: the job must stop")
                return (f"{who} closed its process group (close()) while this rank "
                        f"waited for it in a collective; every rank of the group must "
                        f"make the same collectives, then close it")
    except Exception:  # the store's host is gone (or the store broke)
        if rank != 0:
            return ("rank 0 of the group (the host of its rendezvous store) is gone: it "
                    "closed its process group or its process ended while this rank "
                    "waited for it in a collective")
    return ""


def end_group(group: Any, store: Any, rank: int, who: str, keep_s: float, *,
              left: str = "", work: Any = None) -> None:
    """Close a group here: word in its store that ``who`` closed it (when it was open;
    ``left``: the collective it left unfinished, if that is why), the store kept
    ``keep_s`` for the peers' look (:func:`keep_store`), then let go (:func:`release`:
    kept while ``work`` is in flight)."""
    if group is not None:
        mark_closed(store, rank, who, left)
    keep_store(store, keep_s)
    release(group, work)
