"""The data-plane thread: runs a learner rank's experience path ahead of the learner.

It is the only thread of its rank that makes MPI calls while it runs. The owner hands it
callables (:meth:`DataPlaneThread.call` waits for the result through a
:class:`concurrent.futures.Future`, :meth:`~DataPlaneThread.post` does not), run in
order; whenever nothing is queued, and after each call, it runs one unit of
``background`` work (the prefetch step), so that calls queued without pause cannot
starve it. An exception in the thread is re-raised in the owner at its next call.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from conduit_hpc.errors import DataPlaneTimeout
from conduit_hpc.wait import Deadline

__all__ = ["DataPlaneThread"]


class DataPlaneThread:
    """A worker thread for one learner rank's experience path.

    Args:
        background (Callable[[], bool]): one unit of ahead-of-time work; returns whether
            it did anything (if not, the thread waits briefly for new calls).
        idle_sleep_s (float): longest wait for new calls when idle.
        busy_with (Callable[[], str] | None): what the thread may be waiting for (e.g.
            the ranks whose replies are missing); called only for the message of a
            call or post that timed out (the thread did not take it: it is stuck).
    """

    def __init__(self, background: Callable[[], bool], *, idle_sleep_s: float = 0.0005,
                 name: str = "conduit-dataplane", max_posted: int = 64,
                 busy_with: Callable[[], str] | None = None) -> None:
        self._background = background
        self._busy_with = busy_with
        self._idle = idle_sleep_s
        # (fn, its future - None when posted: nobody waits for it -, whether post()
        # counted it against max_posted)
        self._calls: queue.Queue[tuple[Callable[[], Any], Future[Any] | None, bool]] = \
            queue.Queue()
        #: room for posted calls not yet taken: post() waits (bounded) while there is
        #: none, so a thread that posts without pause cannot grow the queue without
        #: limit (each call holds its arrays) nor put every later call behind it
        self._room = threading.Semaphore(max_posted)
        self._owed = False  # a call ran since the last background step (see _next)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._reported = False  # the error was raised in the owner's thread
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _take(self, item: tuple[Callable[[], Any], Future[Any] | None, bool]
              ) -> tuple[Callable[[], Any], Future[Any] | None]:
        fn, fut, counted = item
        if counted:
            self._room.release()
        self._owed = True
        return fn, fut

    def _next(self) -> tuple[Callable[[], Any], Future[Any] | None] | None:
        if not self._owed:
            try:
                return self._take(self._calls.get_nowait())
            except queue.Empty:
                pass
        # the background's turn: whenever nothing is queued, and after every call even
        # when more are (a thread that queues calls without pause - priority updates in
        # a tight loop - starved the prefetch step, and next_batch waited out its
        # timeout). A step between two queued calls is one that could have come anyway,
        # had the second call been queued a moment later.
        self._owed = False
        if self._background():
            return None
        try:
            return self._take(self._calls.get(timeout=self._idle))
        except queue.Empty:
            return None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                item = self._next()
                if item is None:
                    continue
                fn, fut = item
                if fut is None:  # posted: nobody waits for it (an error ends the thread)
                    fn()
                    continue
                if not fut.set_running_or_notify_cancel():
                    continue  # its caller gave up waiting (call's timeout): never run it
                try:
                    fut.set_result(fn())
                except BaseException as err:
                    fut.set_exception(err)
                    raise
        except BaseException as err:
            self._error = err
            while True:  # wake anyone waiting on a queued call
                try:
                    _, fut, _ = self._calls.get_nowait()
                except queue.Empty:
                    break
                if fut is not None:
                    with contextlib.suppress(InvalidStateError):  # one its caller cancelled
                        fut.set_exception(err)

    def raise_if_failed(self) -> None:
        """Re-raise an exception the thread died of (in the caller's thread). The thread
        does not come back: every later call raises it again, of the same type, saying
        it is the earlier error (a timeout's "waited N s" is not a new wait)."""
        err = self._error
        if err is None:
            return
        if not self._reported:
            self._reported = True
            raise err
        try:
            again = type(err)(f"{err} [raised again: the data-plane thread stopped on this "
                              f"error at an earlier call and does not come back]")
        except Exception:  # a type that takes other arguments: the error as it was
            raise err from None
        raise again from err

    @property
    def failed_and_reported(self) -> bool:
        """The thread died of an exception that was raised in the owner's thread
        already (the owner may handle it and end cleanly: the thread is gone, so its
        rank's MPI calls may be made by the owner again)."""
        if not self._reported:
            return False
        self._thread.join(1.0)  # it ends right after storing the error
        return not self._thread.is_alive()

    def _wait(self, fut: Future[Any], timeout_s: float, what: str) -> Any:
        deadline = Deadline(timeout_s, what)
        extended = False
        while True:
            try:
                return fut.result(timeout=min(0.05, max(deadline.remaining_s, 0.001)))
            except FutureTimeout:
                if fut.done():  # done after the wait ran out, before this look: its
                    return fut.result()  # outcome, not a timeout (as collective_steps)
                self.raise_if_failed()
                if deadline.expired and not extended and not fut.cancel():
                    # begun already (its own waits are bounded): one more period for it
                    # to finish, rather than leave it running on what the caller holds
                    deadline, extended = Deadline(timeout_s, what), True
                # not begun (cancelled: never run now - an ingest would write, after its
                # caller was told it timed out, arrays the caller may reuse), or past the
                # extension: raise
                deadline.check(self._busy)

    def _busy(self) -> str:
        said = self._busy_with() if self._busy_with is not None else ""
        return f"the data-plane thread is busy ({said})" if said else ""

    def call(self, fn: Callable[[], Any], *, timeout_s: float, what: str) -> Any:
        """Run ``fn`` on the thread, after every call queued before it; blocks for its
        result at most ``timeout_s``: a call still queued then is dropped (it never runs
        after this raised); one begun by then gets ``timeout_s`` more to finish.

        Raises:
            DataPlaneTimeout: ``fn`` did not begin in time (names ``what``).
        """
        self.raise_if_failed()
        fut: Future[Any] = Future()
        self._calls.put((fn, fut, False))
        return self._wait(fut, timeout_s, what)

    def post(self, fn: Callable[[], Any], *, timeout_s: float) -> None:
        """Queue ``fn`` without waiting for it to run (errors surface at the next call).
        Waits only while ``max_posted`` posted calls are queued (the thread takes one
        every step), at most ``timeout_s``; from the thread itself, never.

        Raises:
            DataPlaneTimeout: no room within ``timeout_s`` (the thread is stuck).
        """
        self.raise_if_failed()
        if threading.current_thread() is self._thread:  # it would wait for itself
            self._calls.put((fn, None, False))
            return
        if not self._room.acquire(blocking=False):
            deadline = Deadline(timeout_s, "room in the data-plane thread's queue (the "
                                           "calls posted before were not taken)")
            while not self._room.acquire(timeout=min(0.05, max(deadline.remaining_s,
                                                                0.001))):
                self.raise_if_failed()
                deadline.check(self._busy)
        self._calls.put((fn, None, True))

    def stop(self, timeout_s: float) -> None:
        """Finish the queued calls, stop, and join. Blocks at most ``timeout_s``."""
        if not self._thread.is_alive():
            self.raise_if_failed()
            return
        done: Future[Any] = Future()
        self._calls.put((lambda: None, done, False))
        self._wait(done, timeout_s, "the data-plane thread to drain")
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise DataPlaneTimeout(f"data-plane thread did not stop within {timeout_s:.1f} s")
        self.raise_if_failed()
