"""One-sided MPI RMA windows: how bytes move to and from replay memory.

An :class:`RmaWindow` is collective over a communicator; every rank contributes a local
segment (possibly empty) and may ``put``/``get``/``fetch_add`` into any rank's segment
with passive-target synchronisation (one ``Lock_all`` epoch for the window's lifetime,
``Flush`` to complete operations).

Where the target shares a node with the caller and shared memory is allowed, the
segment is also mapped into the caller's address space (``Win.Allocate_shared`` on the
node communicator) and :meth:`RmaWindow.local_view` returns a numpy view of it: readers
and writers then copy with plain numpy, with zero MPI calls on the data path. Ranks on
other nodes reach the same memory through a ``Win.Create`` window over the whole
communicator. Atomics always go through one window so that they stay atomic with
respect to each other.

Nothing here knows about experience, shards or roles.
"""

from __future__ import annotations

import os
import threading

import numpy as np
from mpi4py import MPI

from conduit_hpc.errors import TransportError
from conduit_hpc.transport.objects import bounded_allgather, bounded_barrier

__all__ = ["PAGE", "RmaWindow", "free_bytes", "shared_memory_dir"]

_ALIGN = 64
#: the most bytes one Put or Get moves: Open MPI refuses a count past 2**31 - 1
#: (MPI_ERR_ARG, e.g. an actor on another node pulling a model of 2**29 float32 weights)
MAX_OP_BYTES = 1 << 30
#: bytes the MPI library may add to a shared segment (rounding to pages, its header)
PAGE = 4096


def shared_memory_dir() -> str | None:
    """The directory whose file system backs shared-memory windows on this host (Open
    MPI's ``osc_sm_backing_directory``, ``/dev/shm`` by default, as for MPICH), or
    ``None`` where there is none to check."""
    d: str = os.environ.get("OMPI_MCA_osc_sm_backing_directory", "")  # noqa: SIM112 (its name)
    d = d or "/dev/shm"
    return d if os.path.isdir(d) else None


def free_bytes(directory: str) -> int:
    """Bytes that an unprivileged writer may still put in ``directory``'s file system
    (``-1``: unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return -1
    return int(st.f_bavail) * int(st.f_frsize)


class RmaWindow:
    """A window with one segment per rank of ``comm``; segments start zeroed.

    **Collective** on ``comm`` (construction and :meth:`close`); all other methods are
    local and one-sided. Not thread-safe: one thread per process uses a window.

    Args:
        comm (MPI.Intracomm): the ranks that take part.
        nbytes (int): size of this rank's segment in bytes (0 allowed).
        node_comm (MPI.Intracomm | None): ranks of ``comm`` that share this rank's node
            (``Split_type(COMM_TYPE_SHARED)`` or an emulated node); ``None`` disables
            shared memory.
        shared (bool): allow direct load/store to segments of node-local ranks.
        timeout_s (float | None): bound on the wait for every rank of ``comm`` to reach
            the allocation (a bounded ``Ibarrier`` first; the room check's ``Allgather``,
            after its file-system call, bounded too); ``None``: plain collectives.
        what (str): the step named by the error when that bound passes.

    Raises:
        TransportError: a negative size.
        CollectiveFailed: with ``timeout_s``, a rank did not reach the allocation in time
            (one stopped or stuck before it): the allocation itself cannot be waited for
            with a bound, so the ranks that came give up before entering it.
    """

    def __init__(self, comm: MPI.Intracomm, nbytes: int, *, node_comm: MPI.Intracomm | None,
                 shared: bool = True, timeout_s: float | None = None,
                 what: str = "a window's allocation") -> None:
        if nbytes < 0:
            raise TransportError(f"nbytes must be >= 0, got {nbytes!r}")
        if timeout_s is not None:
            bounded_barrier(comm, timeout_s, what)
        self._comm = comm
        self._closed = False
        self._shm: MPI.Win | None = None
        self._progress_comm: MPI.Intracomm | None = None
        self._views: dict[int, np.ndarray] = {}
        self._node_rank: dict[int, int] = {}  # rank of comm -> its rank on this node
        size = comm.Get_size()
        alloc = max(int(nbytes), 1)
        alloc = (alloc + _ALIGN - 1) // _ALIGN * _ALIGN
        use_shared = shared and node_comm is not None
        # every rank must take the same branch: agree on it
        use_shared = bool(comm.allreduce(use_shared, op=MPI.LAND))
        _check_room(comm, alloc, use_shared, timeout_s, what)
        if use_shared:
            assert node_comm is not None
            self._shm = MPI.Win.Allocate_shared(alloc, 1, comm=node_comm)
            node_group = node_comm.Get_group()
            comm_group = comm.Get_group()
            node_ranks = MPI.Group.Translate_ranks(node_group, list(range(node_comm.Get_size())),
                                                   comm_group)
            node_group.Free()
            comm_group.Free()
            self._node_rank = {int(r): k for k, r in enumerate(node_ranks)}
            for node_rank, rank in enumerate(node_ranks):
                buf, _ = self._shm.Shared_query(node_rank)
                self._views[int(rank)] = np.frombuffer(buf, dtype=np.uint8)  # type: ignore[call-overload]
            all_local = bool(comm.allreduce(node_comm.Get_size() == size, op=MPI.LAND))
            if all_local:
                self._win = self._shm
                self._owns_second = False
            else:
                mem = self._shm.tomemory()
                self._win = MPI.Win.Create(mem, 1, comm=comm)
                self._owns_second = True
                # nothing is ever sent on it: a probe there never matches, so it always
                # enters the progress engine (see progress())
                self._progress_comm = comm.Dup()
        else:
            self._win = MPI.Win.Allocate(alloc, 1, comm=comm)
            self._owns_second = False
            mine = np.frombuffer(self._win.tomemory(),  # type: ignore[call-overload]
                                 dtype=np.uint8)[:alloc]
            self._own = mine
        self._nbytes = alloc
        # an atomic's one-element operands, one set per thread that uses the window
        # (which thread can change: the learner's, then its data-plane thread's), so
        # that no two threads ever share one
        self._tls = threading.local()
        self.own_segment()[:] = 0  # segments start zeroed ...
        self._sizes = np.zeros(size, dtype=np.int64)  # ... before use
        comm.Allgather(np.array([alloc], dtype=np.int64), self._sizes)
        self._size_of = [int(n) for n in self._sizes]  # what _check reads (plain ints)
        self._win.Lock_all(MPI.MODE_NOCHECK)
        if self._owns_second:
            assert self._shm is not None
            self._shm.Lock_all(MPI.MODE_NOCHECK)

    # -- introspection -------------------------------------------------------------
    @property
    def one_node(self) -> bool:
        """Whether every rank of the window shares this node's memory (one shared
        window carries every operation; across nodes a second, RMA window spans them)."""
        return self._shm is not None and not self._owns_second

    @property
    def comm(self) -> MPI.Intracomm:
        """The communicator the window spans."""
        return self._comm

    def segment_bytes(self, rank: int) -> int:
        """Size of ``rank``'s segment (rounded up to 64 bytes)."""
        return int(self._sizes[rank])

    def local_view(self, rank: int) -> np.ndarray | None:
        """A writable ``uint8`` view of ``rank``'s segment if this process can load/store
        it directly (same node, shared memory allowed), else ``None``. Local."""
        return self._views.get(rank)

    def own_segment(self) -> np.ndarray:
        """This rank's own segment as a ``uint8`` array (always directly accessible)."""
        me = self._comm.Get_rank()
        v = self._views.get(me)
        return v if v is not None else self._own

    # -- one-sided operations ------------------------------------------------------
    def _check(self, rank: int, displacement: int, nbytes: int) -> None:
        if self._closed:
            raise TransportError("window used after close()")
        sizes = self._size_of
        try:  # (a try costs nothing here unless it raises: this runs on every access)
            if not 0 <= rank < len(sizes):
                raise TransportError(f"target rank {rank} outside the window's "
                                     f"communicator of size {len(sizes)}")
            if displacement < 0 or displacement + nbytes > sizes[rank]:
                raise TransportError(f"access of {nbytes} bytes at displacement "
                                     f"{displacement} is outside rank {rank}'s segment of "
                                     f"{int(self._sizes[rank])} bytes")
        except TypeError:  # a rank, displacement or size that is not an integer
            raise TransportError(f"target rank, displacement and size must be integers, "
                                 f"got {rank!r}, {displacement!r}, {nbytes!r}") from None

    @staticmethod
    def _operands() -> tuple[list, list, list, np.ndarray, np.ndarray, np.ndarray]:
        """Buffer specs ``[val, INT64]``, ``[cmp, INT64]``, ``[res, INT64]`` and their
        arrays."""
        val, cmp, res = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64)
        return [val, MPI.INT64_T], [cmp, MPI.INT64_T], [res, MPI.INT64_T], val, cmp, res

    def _atomic_operands(self) -> tuple[list, list, list, np.ndarray, np.ndarray, np.ndarray]:
        ops: tuple[list, list, list, np.ndarray, np.ndarray, np.ndarray] | None = getattr(
            self._tls, "ops", None)
        if ops is None:  # this thread's first atomic on the window
            ops = self._tls.ops = self._operands()
        return ops

    @staticmethod
    def _bytes(buffer: np.ndarray) -> np.ndarray:
        if not buffer.flags.c_contiguous:
            raise TransportError("buffer must be C-contiguous")
        return buffer.reshape(-1).view(np.uint8)

    def put(self, target_rank: int, displacement: int, buffer: np.ndarray) -> None:
        """Start copying ``buffer`` into ``target_rank``'s segment at byte
        ``displacement``; complete with :meth:`flush`. Non-blocking, local. A buffer
        past :data:`MAX_OP_BYTES` goes in several operations."""
        raw = self._bytes(buffer)
        self._check(target_rank, displacement, raw.size)
        for at in range(0, raw.size, MAX_OP_BYTES):
            part = raw[at:at + MAX_OP_BYTES]
            self._win.Put([part, MPI.BYTE], target_rank,
                          (displacement + at, part.size, MPI.BYTE))

    def get(self, target_rank: int, displacement: int, buffer: np.ndarray) -> None:
        """Start copying from ``target_rank``'s segment into ``buffer``; the data is
        valid after :meth:`flush`. Non-blocking, local. A buffer past
        :data:`MAX_OP_BYTES` comes in several operations."""
        raw = self._bytes(buffer)
        self._check(target_rank, displacement, raw.size)
        for at in range(0, raw.size, MAX_OP_BYTES):
            part = raw[at:at + MAX_OP_BYTES]
            self._win.Get([part, MPI.BYTE], target_rank,
                          (displacement + at, part.size, MPI.BYTE))

    def get_blocks(self, target_rank: int, displacement: int, block_bytes: int,
                   offsets: np.ndarray, buffer: np.ndarray) -> None:
        """Start copying ``len(offsets)`` blocks of ``block_bytes`` each, found at
        ``displacement + offsets[i]`` in ``target_rank``'s segment, one after another
        into ``buffer`` - one MPI call with an indexed datatype (one per
        :data:`MAX_OP_BYTES` of blocks: past 2**31 - 1 bytes in all, a single call
        raised MPI_ERR_ARG; a block larger than that comes with :meth:`get`, in parts).
        Complete with :meth:`flush`. Non-blocking, local."""
        raw = self._bytes(buffer)
        offs = np.asarray(offsets, dtype=np.int64)
        if raw.size != block_bytes * len(offs):
            raise TransportError(f"buffer of {raw.size} bytes does not hold {len(offs)} "
                                 f"blocks of {block_bytes} bytes")
        if len(offs) == 0:
            return
        self._check(target_rank, displacement + int(offs.min()), 0)
        self._check(target_rank, displacement + int(offs.max()), block_bytes)
        if block_bytes > MAX_OP_BYTES:  # each block alone is past one operation
            for i, off in enumerate(offs.tolist()):
                self.get(target_rank, displacement + off,
                         raw[i * block_bytes:(i + 1) * block_bytes])
            return
        per = MAX_OP_BYTES // max(block_bytes, 1)  # blocks per operation
        for at in range(0, len(offs), per):
            part = offs[at:at + per]
            dtype = MPI.BYTE.Create_hindexed_block(block_bytes, part.tolist()).Commit()
            try:
                self._win.Get([raw[at * block_bytes:(at + len(part)) * block_bytes],
                               MPI.BYTE], target_rank, (displacement, 1, dtype))
            finally:
                dtype.Free()  # MPI keeps it alive until the operation completes

    def fetch_add(self, target_rank: int, displacement: int, value: int) -> int:
        """Atomically add ``value`` to the int64 at ``displacement`` and return the old
        value. Blocks until the result is back (flushes the target)."""
        self._check(target_rank, displacement, 8)
        v, _, r, val, _, res = self._atomic_operands()
        val[0] = value
        self._win.Fetch_and_op(v, r, target_rank, displacement, MPI.SUM)
        self._win.Flush(target_rank)
        return int(res[0])

    def atomic_read(self, target_rank: int, displacement: int) -> int:
        """Atomically read the int64 at ``displacement`` (``MPI_NO_OP``). Blocks."""
        self._check(target_rank, displacement, 8)
        v, _, r, _, _, res = self._atomic_operands()
        self._win.Fetch_and_op(v, r, target_rank, displacement, MPI.NO_OP)
        self._win.Flush(target_rank)
        return int(res[0])

    def atomic_write(self, target_rank: int, displacement: int, value: int) -> None:
        """Atomically replace the int64 at ``displacement`` (``MPI_REPLACE``). Blocks."""
        self._check(target_rank, displacement, 8)
        v, _, r, val, _, _ = self._atomic_operands()
        val[0] = value
        self._win.Fetch_and_op(v, r, target_rank, displacement, MPI.REPLACE)
        self._win.Flush(target_rank)

    def compare_and_swap(self, target_rank: int, displacement: int, compare: int,
                         value: int) -> int:
        """Atomically replace the int64 at ``displacement`` by ``value`` if it equals
        ``compare``; returns the old value. Blocks. Through the node's shared window when
        the target shares this node (no remote progress needed): a word used with it
        must only be used so by ranks of the target's node."""
        self._check(target_rank, displacement, 8)
        v, c, r, val, cmp, res = self._atomic_operands()
        val[0], cmp[0] = value, compare
        node = self._node_rank.get(target_rank)
        if node is not None and self._shm is not None:
            self._shm.Compare_and_swap(v, c, r, node, displacement)
            self._shm.Flush(node)
        else:
            self._win.Compare_and_swap(v, c, r, target_rank, displacement)
            self._win.Flush(target_rank)
        return int(res[0])

    def progress(self) -> None:
        """Enter MPI's progress engine once, where the window spans nodes (a no-op on
        one node). Local; never blocks.

        Across nodes the window is Open MPI's ``osc rdma`` over active-message BTLs
        (``tcp``, ``sm``): every rank's window state - the accumulate lock that each
        atomic, this rank's own included, takes first - lives in a segment of its
        node's *leader* (its lowest rank) and is changed by messages that the leader
        runs only while it is inside an MPI call. A rank that waits without entering MPI
        (e.g. spinning on a word of the node's shared window, whose ``osc sm`` atomics
        never call progress) therefore stalls every atomic on its node's segments if it
        is the leader - and deadlocks if the rank it waits for is inside such an atomic.
        Waits that may be such a rank's call this between tries (the index lock, a
        learner's wait for acknowledgements, its data-plane thread when idle); see
        docs/sharp-bits.md, "Passive-target progress".
        """
        if self._closed:
            raise TransportError("window used after close()")
        if self._progress_comm is not None:
            self._progress_comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)

    def flush(self, target_rank: int | None = None) -> None:
        """Complete every outstanding operation to ``target_rank`` (all targets when
        ``None``), at origin and target. Blocks until done."""
        if self._closed:
            raise TransportError("window used after close()")
        if target_rank is None:
            self._win.Flush_all()
        else:
            self._win.Flush(target_rank)

    def sync(self) -> None:
        """Memory barrier between direct (numpy) loads/stores and other processes'."""
        if self._closed:
            raise TransportError("window used after close()")
        if self._shm is not None:
            self._shm.Sync()
        else:
            self._win.Sync()

    # -- lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """Free the window. **Collective** on ``comm``; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._views.clear()
        self._win.Unlock_all()
        if self._owns_second:
            assert self._shm is not None
            self._shm.Unlock_all()
        self._win.Free()
        if self._owns_second and self._shm is not None:
            self._shm.Free()
        if self._progress_comm is not None:
            self._progress_comm.Free()
            self._progress_comm = None

    @property
    def closed(self) -> bool:
        return self._closed


def _check_room(comm: MPI.Intracomm, alloc: int, shared: bool, timeout_s: float | None = None,
                what: str = "") -> None:
    """Refuse, on every rank of ``comm`` together, a window whose segments on some host
    exceed the free space of the file system that backs shared memory there (MPI backs
    shared windows, and any window of ranks on one host, with a file in it: past its
    size a rank dies of SIGBUS on first touch, or MPI fails with an internal error).
    **Collective** on ``comm``.

    Raises:
        TransportError: naming the directory, the bytes needed and those free.
    """
    host = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        need = int(host.allreduce(alloc + PAGE, op=MPI.SUM))
        one_host = host.Get_size() == comm.Get_size()
    finally:
        host.Free()
    if not shared and not comm.allreduce(one_host, op=MPI.LAND):
        return  # private memory on several hosts: the callers check free memory
    directory = shared_memory_dir()
    room = free_bytes(directory) if directory is not None else -1
    short = np.array([need if 0 <= room < need else 0, room], np.int64)
    rows = np.zeros((comm.Get_size(), 2), np.int64)
    if timeout_s is None:
        comm.Allgather(short, rows)
    else:  # after a file-system call that can stall on one rank: bounded
        bounded_allgather(comm, short, rows, timeout_s, f"{what} (the room check)")
    bad = [(r, int(n), int(f)) for r, (n, f) in enumerate(rows) if n > 0]
    if bad:
        rank, n, f = bad[0]
        raise TransportError(
            f"a window of {n} bytes on the host of rank {rank} does not fit in the "
            f"{f} bytes free in {directory} (where MPI keeps shared memory); give the "
            f"job a larger {directory} or use less memory")
