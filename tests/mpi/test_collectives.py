"""torch.distributed collectives with the group formed from MPI (gloo on this CPU
machine): the mean equals numpy's over what every rank had, broadcast, variable-size
all-to-all, a group closed and formed again in the same process, a bad backend refused
on every rank, and a rank that fails before or inside a collective ending every rank's
wait with an error (bounded) instead of a hang."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
import torch
from mpi4py import MPI

from conduit_hpc import ConfigError, LayoutConfig
from conduit_hpc.errors import TransportError
from conduit_hpc.plane.roles import Role, split_roles
from conduit_hpc.transport.collectives import Collectives

COMM = MPI.COMM_WORLD


def everyone(flag: bool) -> bool:
    return all(COMM.allgather(flag))


def local_tensors(rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(3, 4, generator=g), torch.randn(7, generator=g, dtype=torch.float64),
            torch.randn(2, 2, 2, generator=g)]


@pytest.mark.mpi(min_size=2)
def test_allreduce_mean_equals_the_numpy_mean_of_every_rank() -> None:
    with Collectives.open(COMM, "auto", timeout_s=30) as c:
        assert (c.backend, c.rank, c.size) == ("gloo", COMM.rank, COMM.size)
        mine = local_tensors(COMM.rank)
        c.allreduce_mean_(mine)
        for i, t in enumerate(mine):
            want = np.mean([local_tensors(r)[i].numpy() for r in range(COMM.size)], axis=0)
            assert t.dtype == local_tensors(0)[i].dtype
            np.testing.assert_allclose(t.numpy(), want, rtol=1e-6, atol=1e-6)
        # the same bits on every rank, not merely close
        flat = np.concatenate([t.double().numpy().ravel() for t in mine])
        assert len({flat.tobytes() for flat in COMM.allgather(flat)}) == 1
        assert c.allreduce_max([COMM.rank, -COMM.rank]) == [COMM.size - 1, 0]
        assert c.allreduce_max([COMM.rank == 1]) == [1]  # a flag is 0 or 1
    assert c.closed


@pytest.mark.mpi(min_size=2)
def test_broadcast_and_variable_size_all_to_all() -> None:
    size, rank = COMM.size, COMM.rank
    with Collectives.open(COMM, "gloo", timeout_s=30) as c:
        ts = local_tensors(rank)
        c.broadcast_(ts, src=size - 1)
        for a, b in zip(ts, local_tensors(size - 1), strict=True):
            assert torch.equal(a, b)
        with pytest.raises(ValueError, match="src must be a rank"):
            c.broadcast_(ts, src=size)
        # rank i sends (i + j) % 3 rows of 2 columns, all equal to 100 i + j, to rank j
        blocks = [torch.full(((rank + j) % 3, 2), 100.0 * rank + j) for j in range(size)]
        got = c.all_to_all(blocks)
        assert len(got) == size
        for i, b in enumerate(got):
            assert b.shape == ((i + rank) % 3, 2)
            assert torch.all(b == 100.0 * i + rank)


@pytest.mark.mpi(min_size=3)
def test_group_of_the_learner_communicator_closes_and_forms_again() -> None:
    size = COMM.size
    roles = split_roles(COMM, LayoutConfig(learners=size - 2, buffers=1, actors=1))
    try:
        if roles.role is Role.LEARNER:
            assert roles.learner is not None
            for round_ in range(2):  # the same process, twice, cleanly
                c = Collectives.open(roles.learner, timeout_s=30)
                assert c.size == size - 2 and c.rank == roles.role_rank
                x = [torch.full((5,), float(c.rank + round_))]
                c.allreduce_mean_(x)
                assert torch.allclose(x[0], torch.full((5,), (size - 3) / 2 + round_))
                c.close()
                c.close()  # idempotent
                with pytest.raises(TransportError, match="closed process group"):
                    c.allreduce_mean_(x)
    finally:
        roles.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("backend", "match"), [
    ("mpi", r"transport\.collectives must be one of \['auto', 'gloo', 'nccl'\], got 'mpi'"),
    ("nccl", r"transport\.collectives = 'nccl' needs a CUDA device per rank"),
])
def test_a_bad_backend_is_refused_on_every_rank(backend: str, match: str) -> None:
    if backend == "nccl" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=match):
        Collectives.open(COMM, backend, timeout_s=30)
    assert everyone(True)  # every rank raised and came back: nobody is left waiting


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", ["absent", "gone"])
def test_a_rank_failing_around_a_collective_ends_every_wait(how: str) -> None:
    """Rank 1 fails instead of entering the all-reduce: it never arrives (``absent``),
    or its group is shut down (``gone``, as when its process dies). Every other rank's
    all-reduce ends with a TransportError naming the operation - within the timeout,
    not a hang - and every rank ends with an error."""
    timeout = 3.0
    c = Collectives.open(COMM, "gloo", timeout_s=timeout)
    failed = ""
    try:
        if COMM.rank == 1:
            if how == "gone":
                c.close()
            raise RuntimeError("injected failure on rank 1")
        c.allreduce_mean_([torch.ones(1000)])
    except TransportError as err:
        failed = str(err)
        assert "allreduce of 1,000 values on the gloo group" in failed
    except RuntimeError as err:
        failed = str(err)
    req = COMM.Ibarrier()  # rank 1 waits here until the others gave up
    deadline = time.monotonic() + 60
    while not req.Test():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    c.close()
    assert failed, "the all-reduce returned although rank 1 never took part"
    outcomes = COMM.allgather(bool(failed))
    assert all(outcomes), outcomes


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("closer", ["first", "last"])
def test_a_rank_that_closes_the_group_while_the_others_wait_is_named(closer: str) -> None:
    """One rank closes its group while the others are in an all-reduce. Before, their
    CollectiveFailed said "a peer failed, left or did not arrive" and named nobody; now
    each names the rank that closed (also rank 0, whose process holds the store)."""
    c = Collectives.open(COMM, "gloo", timeout_s=3)  # the others wait it out
    who = 0 if closer == "first" else COMM.size - 1
    failed = ""
    if COMM.rank == who:
        c.close()
    else:
        try:
            for _ in range(10_000):
                c.allreduce_mean_([torch.ones(10)])
        except TransportError as err:
            failed = str(err)
    c.close()
    got = COMM.allgather(failed)
    for r, what in enumerate(got):
        if r != who:
            assert f"rank {who} of the gloo group closed its process group" in what, got


@pytest.mark.mpi(min_size=2)
def test_a_rendezvous_that_fails_is_one_error_on_every_rank(monkeypatch) -> None:
    """The first rank's store is to listen at an address that is not this host's
    (TEST-NET-3; before, it listened everywhere and every rank's connection to that
    address timed out): every rank raises the same TransportError within the timeout -
    no rank goes on into a group the others are not in."""
    import conduit_hpc.transport.collectives as collectives

    monkeypatch.setattr(collectives, "_store_address", lambda one_node: "203.0.113.1")
    with pytest.raises(TransportError, match=r"forming the gloo process group of \d+ ranks "
                                             r"failed: rank \d+ could not"):
        Collectives.open(COMM, "gloo", timeout_s=2.0)
    assert everyone(True)


def _mismatch(case: str, rank: int) -> tuple[str, object]:
    """(operation, argument) rank ``rank`` passes in a hostile ``case``."""
    f32, f64 = torch.float32, torch.float64
    ones = {  # ranks differ in what they pass
        "count": ("mean", [torch.ones(1000 + 10 * rank)]),
        "dtype": ("mean", [torch.ones(10, dtype=f32 if rank == 0 else f64)]),
        "extra": ("mean", [torch.ones(10)] + ([torch.ones(3, dtype=f64)] if rank == 0
                                              else [])),
        "order": ("mean", [torch.ones(2, 3), torch.ones(6)][::1 if rank == 0 else -1]),
        "ops": ("mean", [torch.ones(1)]) if rank == 0 else ("max", [5]),
        "bool": ("mean", [torch.ones(2, dtype=torch.bool)]),
        "sparse": ("mean", [torch.ones(4)] if rank == 0
                   else [torch.ones(4).to_sparse()]),
        "src": ("bcast", rank % 2),
        "huge": ("max", [2 ** 70 if rank == 1 else 1]),
        "float": ("max", [0.5 if rank == 1 else 1]),
        "maxlen": ("max", [1, 2] if rank == 0 else [1]),
    }
    return ones[case]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("case", "match"), [
    ("count", r"passed other tensors \(rank 0: 1 tensors of 1,000 values, rank 1: 1 "
              r"tensors of 1,010 values"),
    ("dtype", r"ranks \[1\] of the gloo group passed tensors of rank 0's count and size "
              r"but other shapes, dtypes or order"),
    ("extra", r"rank 0: 2 tensors of 13 values, rank 1: 1 tensors of 10 values"),
    ("order", r"other shapes, dtypes or order"),
    ("ops", r"called different collectives at this point \(rank 0: allreduce_mean_, "
            r"rank 1: allreduce_max"),
    ("bool", r"passed what it cannot move \(rank 0: a bool tensor at position 0"),
    ("sparse", r"ranks \[1\] of the gloo group passed what it cannot move \(rank 1: a "
               r"sparse tensor at position 0\)"),
    ("src", r"broadcast_: the ranks named other sources \(rank 0: 0, rank 1: 1"),
    ("huge", r"rank 1: a value that is not an int64"),
    ("float", r"ranks \[1\] of the gloo group passed what it cannot move \(rank 1: a value "
              r"that is not an int64"),
    ("maxlen", r"rank 0: 1 tensors of 2 values, rank 1: 1 tensors of 1 values"),
])
def test_ranks_passing_what_does_not_fit_together_fail_together(case: str, match: str
                                                                ) -> None:
    """Hostile: the ranks call a collective with tensors of other sizes, dtypes, counts or
    order, call different collectives, or pass a tensor gloo cannot move on one rank.
    Before, gloo's background thread aborted the process (SIGABRT: "Received data size
    doesn't match expected size"), same-sized tensors of other shapes were averaged
    position by position, an extra bucket paired with the other rank's next call, and a
    sparse or bool tensor raised torch's raw RuntimeError on one rank while the other
    waited out the timeout. Now every rank raises CollectiveMismatch naming the ranks
    and what each passed, nothing is exchanged, and the group stays usable."""
    from conduit_hpc.errors import CollectiveMismatch

    with Collectives.open(COMM, "gloo", timeout_s=20) as c:
        op, arg = _mismatch(case, min(COMM.rank, 1) if COMM.rank < 2 else 0)
        with pytest.raises(CollectiveMismatch, match=match):
            if op == "mean":
                c.allreduce_mean_(arg)  # type: ignore[arg-type]
            elif op == "max":
                c.allreduce_max(arg)  # type: ignore[arg-type]
            else:
                c.broadcast_([torch.ones(3)], src=arg)  # type: ignore[arg-type]
        x = [torch.full((4,), float(COMM.rank))]  # still in step: the next call works
        c.allreduce_mean_(x)
        assert torch.allclose(x[0], torch.full((4,), (COMM.size - 1) / 2))
    assert everyone(True)


@pytest.mark.mpi(min_size=2)
def test_absent_values_count_as_zeros_and_parameters_take_a_broadcast() -> None:
    """``present``: a rank without a value for a tensor (a parameter unused this step)
    contributes zeros and learns whether any rank had it; a broadcast writes into leaf
    tensors that require grad (it raised torch's in-place error on them)."""
    with Collectives.open(COMM, "gloo", timeout_s=20) as c:
        ts = [torch.full((3,), 2.0 * COMM.size), torch.zeros(2)]
        have = [COMM.rank == 0, False]
        if not have[0]:
            ts[0].zero_()
        assert c.allreduce_mean_(ts, have) == [True, False]
        assert torch.equal(ts[0], torch.full((3,), 2.0)) and torch.equal(ts[1], torch.zeros(2))
        p = torch.nn.Parameter(torch.full((5,), float(COMM.rank)))
        c.broadcast_([p], src=COMM.size - 1)
        assert torch.equal(p.detach(), torch.full((5,), float(COMM.size - 1)))
        assert p.requires_grad
    assert everyone(True)


@pytest.mark.mpi(min_size=2)
def test_a_rank_that_never_opens_the_group_fails_the_others_in_bounded_time() -> None:
    """The last rank never calls ``Collectives.open``: the others waited forever in its
    first MPI call (``Split_type``); now CollectiveFailed naming the call after
    ``timeout_s``."""
    from conduit_hpc.errors import CollectiveFailed

    sub = COMM.Dup()  # every rank makes it; the last never uses it
    seen = "nothing"
    if COMM.rank != COMM.size - 1:
        try:
            Collectives.open(sub, "gloo", timeout_s=3.0)
        except CollectiveFailed as err:
            seen = str(err)
    COMM.Barrier()  # all here again (the plain world)
    ok = COMM.rank == COMM.size - 1 or "Collectives.open()" in seen
    assert all(COMM.allgather(ok)), (COMM.rank, seen)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("case", "match"), [
    ("src", r"broadcast_: ranks \[1\] of the gloo group passed what it cannot move \(rank 1: "
            r"src must be a rank of the group; got \d+\)"),
    ("blocks", r"all_to_all: ranks \[1\] .*\(rank 1: not one block per rank; got 1\)"),
    ("rows", r"all_to_all: ranks \[1\] .*\(rank 1: a block of other dtype or row shape "
             r"than block 0 at position 1\)"),
])
def test_a_bad_argument_on_one_rank_fails_every_rank_at_once(case: str, match: str) -> None:
    """One rank passes a src outside the group, or blocks that do not make an all_to_all.
    Before, that rank raised ValueError alone and the others waited out the timeout in
    the collective, then raised a CollectiveFailed naming nobody. Now every rank raises
    CollectiveMismatch naming the rank and its argument, at once, and the group stays
    usable."""
    from conduit_hpc.errors import CollectiveMismatch

    odd = COMM.rank == 1
    with Collectives.open(COMM, "gloo", timeout_s=60) as c:
        t0 = time.monotonic()
        with pytest.raises(CollectiveMismatch, match=match):
            if case == "src":
                c.broadcast_([torch.ones(3)], src=COMM.size + 5 if odd else 0)
            elif case == "blocks":
                c.all_to_all([torch.ones(1, 2)] * (1 if odd else COMM.size))
            else:
                blocks = [torch.ones(1, 2) for _ in range(COMM.size)]
                if odd:
                    blocks[1] = torch.ones(1, 3)
                c.all_to_all(blocks)
        took = time.monotonic() - t0
        got = c.all_to_all([torch.full((1, 2), float(COMM.rank)) for _ in range(COMM.size)])
        assert [float(b[0, 0]) for b in got] == [float(r) for r in range(COMM.size)]
    assert all(COMM.allgather(took < 60)), "a rank waited out the timeout"


def _interrupt_in(where: str, monkeypatch) -> Callable[[], None]:
    """This rank's next collective is interrupted (``KeyboardInterrupt``) once every rank
    passed its header: ``between`` it and the data step (the others are in the data
    step), or by a real signal inside the data step's wait (the others come 1 s late:
    :func:`_late_to_the_data_step`). Returns what puts the signal's handler back."""
    import os
    import signal
    import threading

    agree = Collectives._agree
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR2))

    def interrupted(self, *args, **kwargs):
        rows = agree(self, *args, **kwargs)
        monkeypatch.setattr(Collectives, "_agree", agree)
        if where == "between":
            time.sleep(0.5)
            raise KeyboardInterrupt
        timer.start()
        return rows

    def ctrl_c(*_: object) -> None:
        raise KeyboardInterrupt

    def restore() -> None:
        timer.cancel()
        if timer.is_alive():
            timer.join()
        signal.signal(signal.SIGUSR2, old)
    monkeypatch.setattr(Collectives, "_agree", interrupted)
    old = signal.signal(signal.SIGUSR2, ctrl_c)
    return restore


def _late_to_the_data_step(monkeypatch) -> None:
    """This rank's next collective comes to its data step 1 s after its header."""
    buckets = Collectives._buckets

    def late(self, tensors):
        monkeypatch.setattr(Collectives, "_buckets", buckets)
        time.sleep(1.0)
        return buckets(self, tensors)
    monkeypatch.setattr(Collectives, "_buckets", late)


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(COMM.size != 3, reason="one rank count (make test's time)")
@pytest.mark.parametrize("where", ["between", "data"])
def test_a_rank_that_catches_an_interrupt_inside_a_collective_and_calls_again_is_refused(
        where: str, monkeypatch) -> None:
    """The last rank is interrupted (Ctrl-C) between a collective's header and its data
    step, or inside the data step's wait, catches it and calls the same collective
    again. Before, its new call was matched to the step the others were still in: they
    averaged its header's bytes as data (``between``: [2.9e261, 7.0] for [11.0, 11.0],
    returned as a success; its header is as long as these 2 float64 values) or, after
    the data step that gloo finished in the background, its stale values with their next
    step's (``data``: 17.67 for 21.0 on every rank, silently, at any size); with other
    byte counts gloo aborted the process ("Received data size doesn't match"). Now the
    interrupted rank's group is out of step: its next call raises CollectiveFailed saying
    why, and every value the others got is the true mean until they stop with
    CollectiveFailed naming it (at once, or by the timeout where its step was still in flight)."""
    from conduit_hpc.errors import CollectiveFailed

    victim, size = COMM.size - 1, COMM.size
    c = Collectives.open(COMM, "gloo", timeout_s=3.0)
    got: list[object] = []
    restore: Callable[[], None] = lambda: None  # noqa: E731
    try:
        if COMM.rank == victim:
            restore = _interrupt_in(where, monkeypatch)
        elif where == "data":
            _late_to_the_data_step(monkeypatch)
        for step in (1, 2):
            x = [torch.full((2,), 10.0 * step + COMM.rank, dtype=torch.float64)]
            try:
                c.allreduce_mean_(x)
            except KeyboardInterrupt:
                got.append("KeyboardInterrupt")
                c.allreduce_mean_(x)  # a hostile job: catches Ctrl-C and calls again
            got.append(x[0].tolist())
    except CollectiveFailed as err:
        got.append(f"CollectiveFailed: {err}")
    finally:
        restore()
        c.close()
    every = COMM.allgather(got)
    for r, seen in enumerate(every):
        values = [v for v in seen if isinstance(v, list)]
        assert values == [[10.0 * s + (size - 1) / 2] * 2 for s in range(1, len(values) + 1)
                          ], (r, every)  # only true means, never a wrong one
        assert isinstance(seen[-1], str) and seen[-1].startswith("CollectiveFailed"), every
        if r == victim:
            assert seen[0] == "KeyboardInterrupt" and len(seen) == 2, every
            assert "out of step" in seen[-1] and "KeyboardInterrupt" in seen[-1], every
        else:
            assert f"rank {victim} of the gloo group left allreduce_mean_" in seen[-1], every
