"""The collectives' backend choice, decided alike on every rank from what each reported
(the MPI tests run the group itself)."""

from __future__ import annotations

import os

import pytest

from conduit_hpc.errors import ConfigError
from conduit_hpc.transport.collectives import choose_backend


def test_collectives_backend_choice_needs_a_gpu_of_its_own_per_rank() -> None:
    own = [{"cuda": True, "nccl": True, "gpu": f"n0:{i}"} for i in range(2)]
    shared = [{"cuda": True, "nccl": True, "gpu": "n0:0"}] * 2 + [
        {"cuda": True, "nccl": True, "gpu": "n1:0"}]
    cpu = [{"cuda": False, "nccl": True, "gpu": ""}, own[0]]
    no_nccl = [{**m, "nccl": False} for m in own]
    assert choose_backend("auto", own) == "nccl"
    assert choose_backend("auto", shared) == "gloo"  # two ranks on one GPU: no NCCL
    assert choose_backend("auto", cpu) == "gloo"
    assert choose_backend("auto", no_nccl) == "gloo"
    assert choose_backend("gloo", own) == "gloo"
    assert choose_backend("nccl", own) == "nccl"
    with pytest.raises(ConfigError, match=r"ranks \[0, 1\] of the group have none of their own"):
        choose_backend("nccl", shared)
    with pytest.raises(ConfigError, match=r"transport\.collectives must be one of \['auto', "
                                          r"'gloo', 'nccl'\], got 'mpi'"):
        choose_backend("mpi", own)


@pytest.mark.parametrize("timeout_s", [True, 0, -1.0, float("nan"), "60", None])
def test_a_bad_timeout_is_refused_before_any_collective(timeout_s) -> None:
    """Refused on every rank alike, before the group's first MPI call; ``True`` was taken
    for a 1-second bound on every collective of the group (a bool is an int)."""
    from mpi4py import MPI

    from conduit_hpc.plane.learner_group import LearnerGroup
    from conduit_hpc.transport.collectives import Collectives

    with pytest.raises(ConfigError, match=r"timeout_s must be a number of seconds in "
                                          r"\(0, 86400\], got "):
        Collectives.open(MPI.COMM_SELF, "gloo", timeout_s=timeout_s)
    with pytest.raises(ConfigError, match=r"timeout_s must be a number of seconds"):
        LearnerGroup.open(None, "gloo", timeout_s=timeout_s)  # type: ignore[arg-type]


def _listeners(port: int) -> set[str]:
    """The local addresses (as /proc/net writes them) that listen on TCP ``port``."""
    found = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, _, hexport = local.rpartition(":")
                if state == "0A" and int(hexport, 16) == port:
                    found.add(f"{table}:{addr}")
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="Linux /proc")
def test_the_rendezvous_store_of_a_one_node_group_listens_on_loopback_ipv4_alone() -> None:
    """Before, torch's store listened on every interface through an IPv6 socket
    (``tcp6:...0000``): each peer came as ``::ffff:127.0.0.1``, which its server thread
    reverse-resolved over DNS before serving anyone (no hosts file names it) - a lost
    query held every rank ~5 s (the ~5.07 s stalls of tests/mpi/test_collectives.py).
    Now a one-node group's store takes
    its peers on 127.0.0.1 over IPv4 alone (named from the hosts file, off the network)."""
    from mpi4py import MPI

    from conduit_hpc.transport.collectives import Collectives

    with Collectives.open(MPI.COMM_SELF, "gloo", timeout_s=30) as c:
        assert _listeners(int(c._store.port)) == {"tcp:0100007F"}
