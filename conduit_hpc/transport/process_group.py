"""Forming a ``torch.distributed`` backend object of its own (gloo or NCCL): which
backend a group gets, where its rendezvous store listens, which device a rank binds, and
shutting it down. Used by :mod:`conduit_hpc.transport.collectives`.
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

from conduit_hpc.errors import ConfigError

__all__ = ["BACKENDS", "choose_backend", "cuda_device", "make_group", "shutdown",
           "store_address"]

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
