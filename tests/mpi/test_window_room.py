"""A window larger than the free space of the file system that backs shared memory
(``/dev/shm``, or Open MPI's ``osc_sm_backing_directory``) is refused on every rank of
its communicator before anything is allocated (``transport/rma.py``): not an
``MPI_ERR_INTERN`` on the rank that creates the backing file, or a SIGBUS on first touch.
The size asked for is the file system's whole size plus 1 MiB: never free, whatever other
processes free meanwhile (it was the free space plus 1 MiB, which a segment another job
unlinked between the test's look and the window's check made fit: the window was
allocated, "DID NOT RAISE", 1 run in 8 beside a job that makes and frees 16 MB)."""

from __future__ import annotations

import os

import pytest
from mpi4py import MPI

from conduit_hpc.errors import TransportError
from conduit_hpc.transport.rma import RmaWindow, free_bytes, shared_memory_dir

COMM = MPI.COMM_WORLD


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("shared", [True, False])
def test_a_window_past_the_shared_memory_is_refused_on_every_rank(shared: bool) -> None:
    d = shared_memory_dir()
    room = free_bytes(d) if d is not None else -1
    if COMM.allreduce(room < 0, op=MPI.LOR):
        pytest.skip("no shared-memory directory to check against here")
    node = COMM.Split_type(MPI.COMM_TYPE_SHARED, key=COMM.rank)
    if COMM.allreduce(node.Get_size() != COMM.Get_size(), op=MPI.LOR) and not shared:
        node.Free()
        pytest.skip("private windows on several hosts are not backed by shared memory")
    try:
        # the last rank asks for more than its file system holds; every rank refuses,
        # naming the bytes
        st = os.statvfs(d) if d is not None else None
        size = int(st.f_blocks) * int(st.f_frsize) if st is not None else 0
        want = size + (1 << 20) if COMM.rank == COMM.size - 1 else 0
        with pytest.raises(TransportError, match="does not fit") as err:
            RmaWindow(COMM, want, node_comm=node, shared=shared)
        assert f"free in {d}" in str(err.value)
        # a window that fits still works after the refusal
        w = RmaWindow(COMM, 4096, node_comm=node, shared=shared)
        w.close()
    finally:
        node.Free()
