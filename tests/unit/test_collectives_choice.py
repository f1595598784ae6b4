"""The collectives' backend choice, decided alike on every rank from what each reported
(the MPI tests run the group itself)."""

from __future__ import annotations

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
