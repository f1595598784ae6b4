"""Batches prepared ahead: the one prefetch engine of the data-plane thread
(:class:`~conduit_hpc.plane.modes.EdpMode`) and the delivery rank
(:class:`~conduit_hpc.plane.delivery_rank.DeliveryServer`).

:class:`Prefetcher` runs the :class:`~conduit_hpc.plane.fetch.Fetch` strategy under the
:class:`~conduit_hpc.scheduler.PrefetchClock`: each :meth:`~Prefetcher.step` prepares the
next batch the clock allows (a pipelined fetch - the owners sample and send - starts every
allowed batch at once and completes them in order as their replies arrive) and hands it
to ``deliver(batch, superstep)``: the thread puts it where ``next_batch`` finds it, the
delivery rank publishes it in the staging ring. Where it runs is the caller's business;
what a prefetched batch is, and when it may be made, is decided here only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from conduit_hpc.errors import DataPlaneClosed
from conduit_hpc.plane.delivery import Deliverer
from conduit_hpc.plane.fetch import Fetch, OwnerFetch, PendingBatch
from conduit_hpc.plane.sources import unanswered
from conduit_hpc.plane.staging import Batch
from conduit_hpc.scheduler import PrefetchClock

__all__ = ["Prefetcher"]


class Prefetcher:
    """Prepares batches ahead of the learner (see the module docstring). Not
    thread-safe: one thread (the one making this rank's MPI calls) uses it.

    Args:
        d (Deliverer): the experience path.
        fetch (Fetch): how rows are found and fetched.
        clock (PrefetchClock): which batches may be prepared.
        deliver (Callable[[Batch, int], None]): takes each ready batch, in order.
        on_closed (Callable[[DataPlaneClosed], None]): told once when the stream ends
            (every actor finished below the minimum fill); batches in flight still
            complete.
    """

    def __init__(self, d: Deliverer, fetch: Fetch, clock: PrefetchClock,
                 deliver: Callable[[Batch, int], None],
                 on_closed: Callable[[DataPlaneClosed], None]) -> None:
        self.d, self.fetch, self.clock = d, fetch, clock
        self._deliver, self._on_closed = deliver, on_closed
        self._owner = fetch if isinstance(fetch, OwnerFetch) and fetch.pipelined else None
        self._pending: deque[PendingBatch] = deque()
        #: the end of the stream, once seen
        self.closed: DataPlaneClosed | None = None

    @property
    def in_flight(self) -> bool:
        """Whether batches were started whose replies have not completed."""
        return bool(self._pending)

    def waiting_on(self) -> str:
        """For the message of a batch that did not come (made only then, maybe on another
        thread than the one stepping this: best effort): the owners whose replies to the
        batches in flight are missing; else, across hosts, the owners on other hosts of
        the shards read (a direct fetch's remote reads wait on them). ``""``: none."""
        d, hosts = self.d, self.d.hosts
        asked = {i: src.shard_id for p in tuple(self._pending)
                 for i, (_, _, src) in p.ids.items()}
        if said := (unanswered(hosts, d.owners, asked, d.stash)
                    or unanswered(hosts, d.owners, *d.awaiting)):
            return said
        far = sorted({o for o in d.owners.values() if hosts.of(o) != hosts.of(d.rank)})
        more = f" and {len(far) - 8} more" if len(far) > 8 else ""
        return (f"this learner reads shards on other hosts, owned by "
                f"{', '.join(map(hosts.rank, far[:8]))}{more}") if far else ""

    def request(self) -> None:
        """The learner asked for the next batch: its superstep ended (every priority
        update sent before this call is seen by batches prepared after it)."""
        self.d.mark()
        self.clock.request()

    def step(self, *, start_new: bool = True) -> bool:
        """Prepare (or complete) what the clock allows now; ``start_new=False``: only
        complete batches in flight. Returns whether anything was done. Blocks only
        inside the fetch (bounded)."""
        try:
            if self.closed is not None or not start_new:
                return self._complete_arrived()  # (a batch that starts over may end it)
            if self._owner is not None:
                did = False
                while self.clock.may_prepare():
                    t, staleness = self.clock.start()
                    self._pending.append(self._owner.begin(self.d, t, staleness))
                    did = True
                return self._complete_arrived() or did
            if not self.clock.may_prepare():
                return False
            t, staleness = self.clock.start()
            self._deliver(self.fetch.prepare(self.d, t, staleness), t)
            return True
        except DataPlaneClosed as err:
            # the end of the stream, not a failure: the learner raises it once the
            # batches already made are handed out
            if self.closed is None:
                self.closed = err
                self._on_closed(err)
            return False

    def _complete_arrived(self) -> bool:
        o = self._owner
        if not (o and self._pending and o.arrived(self.d, self._pending[0])):
            return False
        pending = self._pending.popleft()
        done = o.complete(self.d, pending)
        if isinstance(done, PendingBatch):  # started over: still the oldest in flight
            self._pending.appendleft(done)
        else:
            self._deliver(done, pending.superstep)
        return True

    def finish(self) -> None:
        """Receive the replies of every batch in flight (no owner's send is left
        unmatched); they are not delivered. Blocks (bounded)."""
        if self._owner is not None:
            while self._pending:
                self._owner.drain(self.d, self._pending.popleft())
