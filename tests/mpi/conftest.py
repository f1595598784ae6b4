from __future__ import annotations

import pytest

TRANSPORTS = {
    # shared-memory windows, direct numpy access
    "shm": {"transport": {"shared_memory": "auto"}},
    # every access through MPI RMA (what ranks on different nodes do)
    "rma": {"transport": {"shared_memory": "never"}},
    # two emulated nodes: shared memory within, RMA (Win.Create) across
    "hybrid": {"transport": {"shared_memory": "auto"}, "layout": {"emulate_nodes": 2}},
}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport_sections(request) -> dict:
    return TRANSPORTS[request.param]
