"""Errors that name a rank waited on name its host when the job spans several hosts
(``conduit_hpc.wait.Hosts``), and read as before on one host."""

from __future__ import annotations

import threading

import pytest

from conduit_hpc.errors import DataPlaneTimeout
from conduit_hpc.plane.sources import unanswered
from conduit_hpc.scheduler.worker import DataPlaneThread
from conduit_hpc.wait import NO_HOSTS, Deadline, Hosts


def test_one_host_names_the_rank_only() -> None:
    hosts = Hosts(["node-a"] * 4)
    assert not hosts.several
    assert hosts.rank(3) == "world rank 3"
    assert hosts.of(3) == ""
    assert NO_HOSTS.rank(0) == "world rank 0"


def test_several_hosts_name_the_ranks_host() -> None:
    hosts = Hosts(["node-a", "node-b", "node-a", "node-b"])
    assert hosts.several
    assert hosts.rank(3) == "world rank 3 (host node-b)"
    assert hosts.rank(0) == "world rank 0 (host node-a)"
    assert hosts.rank(9) == "world rank 9"  # not a rank of the job: no host invented


def test_unanswered_names_the_owners_not_heard_from_by_rank_and_host() -> None:
    owners = {0: 1, 1: 3, 2: 1}  # shard -> owner's world rank
    asked = {10: 0, 11: 1, 12: 2, 13: 0}  # request id -> shard
    assert unanswered(Hosts(["a", "b", "a", "b"]), owners, asked, {}) == (
        "no reply yet from world rank 1 (host b), the owner of shards 0, 2; "
        "world rank 3 (host b), the owner of shard 1")
    assert unanswered(Hosts(["a"] * 4), owners, asked, {10: "reply", 12: "r", 13: "r"}) == (
        "no reply yet from world rank 3, the owner of shard 1")
    assert unanswered(Hosts(["a", "b"]), owners, asked, set(asked)) == ""


def test_the_timeout_message_carries_the_host() -> None:
    hosts = Hosts(["node-a", "node-b"])
    deadline = Deadline(0.0, "batch 13")
    with pytest.raises(DataPlaneTimeout,
                       match=r"^waited 0\.0 s for batch 13: no reply yet from world rank 1 "
                             r"\(host node-b\), the owner of shard 0$"):
        while True:
            deadline.check(lambda: unanswered(hosts, {0: 1}, {7: 0}, ()))


@pytest.mark.parametrize("said", ["no reply yet from world rank 1 (host node-b), the owner "
                                  "of shard 0", ""])
def test_a_call_the_stuck_data_plane_thread_never_took_says_what_it_waits_for(said: str
                                                                              ) -> None:
    entered, release = threading.Event(), threading.Event()

    def stuck() -> bool:  # the background step, stuck (as in a wait on a lost host)
        entered.set()
        return release.wait(10.0)

    thread = DataPlaneThread(stuck, busy_with=lambda: said)
    thread.start()
    try:
        assert entered.wait(10.0)
        with pytest.raises(DataPlaneTimeout) as got:
            thread.call(lambda: None, timeout_s=0.05, what="a stop check")
        assert str(got.value) == "waited 0.05 s for a stop check" + (
            f": the data-plane thread is busy ({said})" if said else "")
    finally:
        release.set()
        thread.stop(5.0)


def test_a_list_of_ranks_is_grouped_by_host_across_hosts_only() -> None:
    assert Hosts(["a", "b", "a", "b"]).of_ranks([3, 1, 2]) == " (on host b: 1, 3; host a: 2)"
    assert Hosts(["a"] * 4).of_ranks([3, 1]) == ""
    assert Hosts(["a", "b"]).of_ranks([]) == ""
