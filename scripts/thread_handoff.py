"""Indicative, not a benchmark of record: what a data-plane thread can and cannot buy a
learner under CPython's GIL, with no MPI and no data plane involved.

    python scripts/thread_handoff.py [ITEMS]

Three figures, each in microseconds per item (CPU of the whole process, and wall):

1. **wake round trip**: two threads hand a token back and forth through semaphores, and
   two processes through pipes. Each round trip is two blocking wakes of a sleeping
   thread; their cost is the machine's (a virtual machine's wake of an idle vCPU is
   dear), not Python's.
2. **producer / consumer, consumer computes under the GIL**: a producer makes items (pure
   Python work, standing in for a batch's draw, gather and update) and a consumer takes
   each one (a little Python, standing in for a learner that computes nothing). In one
   thread, or the producer on a second thread with a ``threading.Condition`` hand-off
   per item, as the ``edp`` data-plane thread does. The two threads' Python cannot
   overlap (one GIL), so the second thread adds its wakes and nothing else.
3. **the same, the consumer's compute releases the GIL** (``time.sleep`` of the
   producer's time, standing in for torch kernels, a GPU wait or a gloo all-reduce): here
   the thread overlaps the producer's work with the compute, and wall time per item
   drops toward the larger of the two.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

_items = sys.argv[1] if len(sys.argv) > 1 else "4000"
if not _items.isdecimal() or int(_items) < 1:
    sys.exit(f"ITEMS must be a whole number >= 1, got {_items!r}")
ITEMS = int(_items)


def work(n: int = 2500) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def per_item(fn: Callable[[], None], n: int) -> tuple[float, float]:
    c0, w0 = cpu_s(), time.perf_counter()
    fn()
    return (cpu_s() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6


def ping_threads(n: int) -> None:
    a, b = threading.Semaphore(0), threading.Semaphore(0)

    def peer() -> None:
        for _ in range(n):
            a.acquire()
            b.release()

    t = threading.Thread(target=peer)
    t.start()
    for _ in range(n):
        a.release()
        b.acquire()
    t.join()


def ping_processes(n: int) -> None:
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        for _ in range(n):
            os.read(r1, 1)
            os.write(w2, b"x")
        os._exit(0)
    for _ in range(n):
        os.write(w1, b"x")
        os.read(r2, 1)
    os.waitpid(pid, 0)


def consume(gil_free_s: float) -> None:
    if gil_free_s:
        time.sleep(gil_free_s)
    else:
        work(200)


def one_thread(n: int, gil_free_s: float) -> None:
    for _ in range(n):
        work()
        consume(gil_free_s)


def two_threads(n: int, gil_free_s: float) -> None:
    cv = threading.Condition()
    ready: list[int] = []
    asked = threading.Semaphore(2)  # at most 2 items ahead (prefetch_depth 2)

    def producer() -> None:
        for t in range(n):
            asked.acquire()
            work()
            with cv:
                ready.append(t)
                cv.notify()

    th = threading.Thread(target=producer)
    th.start()
    for _ in range(n):
        with cv:
            while not ready:
                cv.wait(0.05)
            ready.pop(0)
        asked.release()
        consume(gil_free_s)
    th.join()


def main() -> None:
    n = ITEMS
    print(f"# {time.strftime('%T')} load {os.getloadavg()[0]:.2f}, {n} items, "
          f"Python {sys.version.split()[0]}")
    for label, ping in (("threads", ping_threads), ("processes", ping_processes)):
        c, w = per_item(lambda p=ping: p(n * 4), n * 4)  # type: ignore[misc]
        print(f"wake round trip, {label:10s} cpu {c:6.1f}  wall {w:6.1f} us")
    t0 = time.perf_counter()
    work()
    w = max(time.perf_counter() - t0, 1e-5)  # the producer's time, for case 3
    for label, free in (("consumer under the GIL", 0.0), ("consumer releases it", w)):
        a = per_item(lambda f=free: one_thread(n, f), n)  # type: ignore[misc]
        b = per_item(lambda f=free: two_threads(n, f), n)  # type: ignore[misc]
        print(f"{label:23s} one thread: cpu {a[0]:6.1f} wall {a[1]:6.1f} us | "
              f"two threads: cpu {b[0]:6.1f} wall {b[1]:6.1f} us")


if __name__ == "__main__":
    main()
