"""Small JSON-able objects over MPI collectives, without pickle.

mpi4py's lowercase collectives pickle; these send JSON text as ``uint8`` buffers
(``Bcast``/``Gatherv``/``Allgatherv``), so that nothing a peer sends is ever unpickled.
Every function is **collective** on ``comm`` and blocks until its part is done.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from conduit_hpc.errors import CollectiveFailed
from conduit_hpc.wait import wait_until

__all__ = ["allgather_json", "bcast_json", "bounded_allgather", "bounded_barrier",
           "bounded_bcast_json", "bounded_gather_json", "gather_json", "register_board"]

_DID_NOT_ARRIVE = "a rank failed, left without an error, or did not arrive"
#: requests given up on, with their buffers (see :func:`bounded_allgather`)
_ABANDONED: list[tuple[MPI.Request | np.ndarray, ...]] = []
#: communicator handle -> (arrive, behind) of its arrival board (the data plane's world:
#: :class:`~conduit_hpc.plane.control.ControlBlock`): a bounded collective counts itself
#: there, and one that gives up names the ranks that had not come
_BOARDS: dict[int, tuple[Callable[[], None], Callable[[], list[int]]]] = {}


#: a communicator's attribute (MPI caches it on the communicator and drops it when the
#: communicator is freed): why this rank left it out of step with its other ranks. Made
#: at first use (MPI may not be initialised when this module is imported: the CLI's tools)
_OUT_OF_STEP: list[int] = []


def _keyval() -> int:
    if not _OUT_OF_STEP:
        _OUT_OF_STEP.append(MPI.Comm.Create_keyval())
    return _OUT_OF_STEP[0]


def _in_step(comm: MPI.Intracomm, what: str) -> None:
    """Refuse a collective on ``comm`` after this rank left one of its multi-step
    collectives between or inside its steps (:class:`_Steps`): the others may still be in
    it, and this one's messages would be matched to theirs - MPI_ERR_TRUNCATE, or another
    collective's bytes decoded as this one's data (both seen: a learner that caught
    Ctrl-C in ``save_checkpoint`` and called it again)."""
    why = comm.Get_attr(_keyval())
    if why:
        raise CollectiveFailed(f"{what}: this rank left {why} unfinished on this "
                               f"communicator, so its ranks are out of step (the others may "
                               f"still be in it) and no collective on it can run: the job "
                               f"must stop")


class _Steps:
    """Around a multi-step collective: an exception out of it leaves ``comm`` out of
    step on this rank (:func:`_in_step` then refuses the next collective on it) - any
    but a :class:`CollectiveFailed` of its bounded arrival (every rank settled that
    one: they raise together, in step). Set :attr:`arrived` once the arrival passed."""

    def __init__(self, comm: MPI.Intracomm, what: str, *, arrived: bool = False) -> None:
        self.comm, self.what, self.arrived = comm, what, arrived

    def __enter__(self) -> _Steps:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and (self.arrived or not issubclass(exc_type,
                                                                    CollectiveFailed)):
            self.comm.Set_attr(_keyval(), f"{self.what or 'a collective'} "
                                             f"({exc_type.__name__})")


def register_board(comm: MPI.Intracomm, arrive: Callable[[], None],
                   behind: Callable[[], list[int]]) -> Callable[[], None]:
    """Count this rank's bounded collectives of ``comm`` with ``arrive`` and, when one
    gives up, name the ranks ``behind`` returns. Returns the call that undoes it (before
    the board's memory is freed). Local; every rank of ``comm`` registers at the same
    point (between the same two collectives), or the counts do not compare."""
    key = comm.py2f()
    _BOARDS[key] = (arrive, behind)

    def unregister() -> None:
        if _BOARDS.get(key) == (arrive, behind):
            del _BOARDS[key]

    return unregister


def _arrive(comm: MPI.Intracomm) -> Callable[[], str]:
    """Count this rank's arrival at a bounded collective of ``comm`` (where it has a
    board); returns the detail of its timeout, naming the ranks that never came."""
    board = _BOARDS.get(comm.py2f())
    if board is None:
        return lambda: _DID_NOT_ARRIVE
    board[0]()

    def detail() -> str:
        late = board[1]()
        if not late:
            return _DID_NOT_ARRIVE
        shown = ", ".join(map(str, late[:16])) + (f" and {len(late) - 16} more"
                                                  if len(late) > 16 else "")
        return f"{_DID_NOT_ARRIVE}: world ranks {shown} had not arrived"

    return detail


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"{type(v).__name__} is not JSON-able")


def _to_bytes(obj: Any) -> np.ndarray:
    text = json.dumps(obj, separators=(",", ":"), default=_plain)
    return np.frombuffer(text.encode(), dtype=np.uint8)


def _from_bytes(buf: np.ndarray) -> Any:
    return json.loads(bytes(buf).decode())


_Bound = tuple[float, str, "Callable[[], object] | None"]


def _wait(req: MPI.Request, buffers: tuple[np.ndarray, ...], bound: _Bound | None) -> None:
    """Wait for a collective's data step; bounded (``(timeout_s, what, between)``) after
    a bounded arrival: a rank interrupted between the two (Ctrl-C, caught) left the others
    in a plain collective forever, checking nothing. Given up on, the request and its
    buffers are kept alive (:data:`_ABANDONED`: MPI may still write them)."""
    if bound is None:
        req.Wait()
        return
    timeout_s, what, between = bound
    try:
        wait_until(req.Test, timeout_s=timeout_s, what=f"every rank to pass {what}",
                   error=CollectiveFailed, between=between, detail=_DID_NOT_ARRIVE)
    except BaseException:
        _ABANDONED.append((req, *buffers))
        raise


def bcast_json(comm: MPI.Intracomm, obj: Any, root: int, bound: _Bound | None = None) -> Any:
    """Broadcast a JSON-able object from ``root``. **Collective** on ``comm``; blocks
    (bounded by ``bound``: ``(timeout_s, what, between)``, as :func:`_wait`)."""
    _in_step(comm, bound[1] if bound else "a broadcast")
    n = np.zeros(1, dtype=np.int64)
    data = _to_bytes(obj) if comm.Get_rank() == root else np.zeros(0, np.uint8)
    n[0] = len(data)
    with _Steps(comm, bound[1] if bound else "", arrived=True):
        _wait(comm.Ibcast(n, root=root), (n,), bound)
        buf = data.copy() if comm.Get_rank() == root else np.empty(int(n[0]), np.uint8)
        _wait(comm.Ibcast(buf, root=root), (buf,), bound)
    return _from_bytes(buf)


def gather_json(comm: MPI.Intracomm, obj: Any, root: int, bound: _Bound | None = None
                ) -> list[Any] | None:
    """Gather one JSON-able object per rank at ``root`` (None elsewhere). **Collective**
    (bounded by ``bound``, as :func:`bcast_json`)."""
    _in_step(comm, bound[1] if bound else "a gather")
    data = _to_bytes(obj)
    sizes = np.zeros(comm.Get_size(), dtype=np.int64) if comm.Get_rank() == root else None
    size = np.array([len(data)], dtype=np.int64)
    with _Steps(comm, bound[1] if bound else "", arrived=True):
        _wait(comm.Igather(size, sizes, root=root),
              (size,) if sizes is None else (size, sizes), bound)
        if comm.Get_rank() != root:
            _wait(comm.Igatherv(data, None, root=root), (data,), bound)
            return None
        assert sizes is not None
        buf = np.empty(int(sizes.sum()), np.uint8)
        _wait(comm.Igatherv(data, [buf, sizes, MPI.BYTE], root=root), (data, buf, sizes),
              bound)
    offs = np.concatenate([[0], np.cumsum(sizes)])
    return [_from_bytes(buf[offs[i]:offs[i + 1]]) for i in range(len(sizes))]


def allgather_json(comm: MPI.Intracomm, obj: Any, timeout_s: float | None = None,
                   what: str = "", between: Callable[[], object] | None = None
                   ) -> list[Any]:
    """One JSON-able object per rank, on every rank (rank order). **Collective**; with
    ``timeout_s``, bounded as :func:`bounded_allgather`, the data step too."""
    _in_step(comm, what or "an allgather")
    data = _to_bytes(obj)
    sizes = np.zeros(comm.Get_size(), dtype=np.int64)
    size = np.array([len(data)], dtype=np.int64)
    bound: _Bound | None = None
    with _Steps(comm, what) as steps:
        if timeout_s is None:
            comm.Allgather(size, sizes)
        else:
            bounded_allgather(comm, size, sizes, timeout_s, what, between)
            bound = (timeout_s, what, between)
        steps.arrived = True
        buf = np.empty(int(sizes.sum()), np.uint8)
        _wait(comm.Iallgatherv(data, [buf, sizes, MPI.BYTE]), (data, buf, sizes), bound)
    offs = np.concatenate([[0], np.cumsum(sizes)])
    return [_from_bytes(buf[offs[i]:offs[i + 1]]) for i in range(len(sizes))]


def bounded_barrier(comm: MPI.Intracomm, timeout_s: float, what: str,
                    between: Callable[[], object] | None = None) -> None:
    """A barrier that gives up: :class:`~conduit_hpc.errors.CollectiveFailed` when not
    every rank of ``comm`` reached ``what`` within ``timeout_s`` (a rank failed, left
    without an error, or hangs), where a plain ``Barrier`` would wait forever.
    ``between`` runs once before the barrier is entered and after every poll (it may
    raise: a rank that raises before entering never lets the others complete, so none
    of them goes on into a collective it will not reach). **Collective**.

    A rank that gives up leaves its part of the barrier posted: a rank that came later
    completed it, and went on alone into the next collective (a plain one in the
    constructor, ``Win.Free`` in ``close()``), where it waited forever when those that
    gave up did not go on. So every rank then says whether it gave up (:func:`_settle`,
    one more non-blocking collective on every rank, whatever happened: the ranks'
    collectives stay matched), and a rank that came late raises too."""
    _in_step(comm, what)
    if between is not None:
        between()
    detail = _arrive(comm)
    _complete(comm, comm.Ibarrier(), (), timeout_s, what, between, detail)


def _complete(comm: MPI.Intracomm, req: MPI.Request, buffers: tuple[np.ndarray, ...],
              timeout_s: float, what: str, between: Callable[[], object] | None,
              detail: Callable[[], str]) -> None:
    """Wait (bounded) for a bounded collective's request ``req``, then :func:`_settle`
    it on every rank. A rank that gives up keeps the request and its ``buffers`` alive
    (:data:`_ABANDONED`: MPI may still write them) and posts that it gave up."""
    try:
        wait_until(req.Test, timeout_s=timeout_s, what=f"every rank of {comm.Get_size()} "
                   f"to reach {what}", error=CollectiveFailed, between=between,
                   detail=detail)
    except BaseException:
        _ABANDONED.append((req, *buffers))
        _settle(comm, True, timeout_s, what, between)
        raise
    _settle(comm, False, timeout_s, what, between)


def _settle(comm: MPI.Intracomm, gave_up: bool, timeout_s: float, what: str,
            between: Callable[[], object] | None) -> None:
    """After a bounded collective: whether any rank gave up on it (or left it on an
    error), all-reduced. A rank that gave up posts its part and goes (the request is
    abandoned); the others wait (bounded) and raise if one did. **Collective**.

    Raises:
        CollectiveFailed: this rank came, but after another had given up waiting for it.
    """
    flag = np.array([int(gave_up)], np.int64)
    out = np.zeros(1, np.int64)
    req = comm.Iallreduce(flag, out, op=MPI.MAX)
    if gave_up:
        _ABANDONED.append((req, flag, out))
        return
    try:
        wait_until(req.Test, timeout_s=timeout_s, what=f"every rank of {comm.Get_size()} "
                   f"to pass {what}", error=CollectiveFailed, between=between,
                   detail=_DID_NOT_ARRIVE)
    except BaseException:
        _ABANDONED.append((req, flag, out))
        raise
    if out[0]:
        raise CollectiveFailed(f"every rank of {comm.Get_size()} reached {what}, but a rank "
                               f"had given up waiting for the last to come before it did "
                               f"(ranks this far apart need a longer timeout), or left on "
                               f"an error")


def bounded_bcast_json(comm: MPI.Intracomm, obj: Any, root: int, timeout_s: float, what: str,
                       between: Callable[[], object] | None = None) -> Any:
    """:func:`bcast_json` that gives up as :func:`bounded_barrier` does when not every
    rank reaches it within ``timeout_s`` (a rank hangs or died in the work before it: a
    plain ``Bcast`` would wait for it forever). **Collective**."""
    with _Steps(comm, what) as steps:
        bounded_barrier(comm, timeout_s, what, between)
        steps.arrived = True
        return bcast_json(comm, obj, root, (timeout_s, what, between))


def bounded_gather_json(comm: MPI.Intracomm, obj: Any, root: int, timeout_s: float,
                        what: str, between: Callable[[], object] | None = None
                        ) -> list[Any] | None:
    """:func:`gather_json`, bounded as :func:`bounded_bcast_json`. **Collective**."""
    with _Steps(comm, what) as steps:
        bounded_barrier(comm, timeout_s, what, between)
        steps.arrived = True
        return gather_json(comm, obj, root, (timeout_s, what, between))


def bounded_allgather(comm: MPI.Intracomm, send: np.ndarray, recv: np.ndarray,
                      timeout_s: float, what: str,
                      between: Callable[[], object] | None = None) -> None:
    """``Allgather`` that gives up as :func:`bounded_barrier` does
    (:class:`~conduit_hpc.errors.CollectiveFailed` naming ``what``). **Collective**.

    A request given up on stays pending: the ranks that did arrive still send their
    parts, and MPI writes them into ``recv`` whenever it next makes progress. So its
    buffers are kept alive for the life of the process (freed, they were written over
    later: a segfault in unrelated code, seen at 6 ranks)."""
    _in_step(comm, what)
    if between is not None:  # before entering, as in bounded_barrier
        between()
    detail = _arrive(comm)
    _complete(comm, comm.Iallgather(send, recv), (send, recv), timeout_s, what, between,
              detail)


