from __future__ import annotations

import socket

import pytest
from mpi4py import MPI

from conduit_hpc import ConfigError, ConfigMismatch, LayoutConfig, WorldTooSmall
from conduit_hpc.plane.roles import Role, check_same_config, split_roles
from conduit_hpc.testing import make_config

COMM = MPI.COMM_WORLD


def everyone(flag: bool) -> bool:
    return all(COMM.allgather(flag))


@pytest.mark.mpi(min_size=3)
def test_counts_layout_rest_are_actors() -> None:
    roles = split_roles(COMM, LayoutConfig(learners=1, buffers=1, actors=0))
    size = COMM.Get_size()
    assert roles.learner_ranks == (0,)
    assert roles.buffer_ranks == (1,)
    assert roles.actor_ranks == tuple(range(2, size))
    expected = Role.LEARNER if COMM.rank == 0 else Role.BUFFER if COMM.rank == 1 else Role.ACTOR
    assert roles.role is expected
    assert roles.role_comm.Get_size() == len(roles.ranks_of(expected))
    assert roles.role_rank == roles.ranks_of(expected).index(COMM.rank)
    # the private world is a duplicate, never COMM_WORLD itself
    assert roles.world != COMM and MPI.Comm.Compare(roles.world, COMM) == MPI.CONGRUENT
    # role comms are disjoint and cover the world
    sizes = COMM.allgather((roles.role.value, roles.role_comm.Get_size()))
    assert {r: s for r, s in sizes} == {"learner": 1, "buffer": 1, "actor": size - 2}
    roles.close()


@pytest.mark.mpi(min_size=4)
def test_two_buffers_no_learner() -> None:
    roles = split_roles(COMM, LayoutConfig(learners=0, buffers=2))
    assert roles.learner_ranks == () and roles.buffer_ranks == (0, 1)
    assert roles.learner is None
    roles.close()


@pytest.mark.mpi(min_size=3)
def test_per_node_layout_on_emulated_nodes() -> None:
    size = COMM.Get_size()
    nodes = size // 3  # every emulated node gets >= 3 ranks
    roles = split_roles(COMM, LayoutConfig(learners=1, buffers=1, per_node=True,
                                           emulate_nodes=nodes))
    node_of = [r * nodes // size for r in range(size)]
    assert roles.node_of == tuple(node_of)
    assert roles.node.Get_size() == node_of.count(node_of[COMM.rank])
    firsts = [node_of.index(n) for n in range(nodes)]
    assert roles.learner_ranks == tuple(firsts)
    assert roles.buffer_ranks == tuple(f + 1 for f in firsts)
    assert len(roles.actor_ranks) == size - 2 * nodes
    roles.close()


@pytest.mark.mpi(min_size=3)
def test_real_node_split_puts_everyone_on_one_node() -> None:
    roles = split_roles(COMM, LayoutConfig())
    assert set(roles.node_of) == {0}
    assert roles.node.Get_size() == COMM.Get_size()
    roles.close()


@pytest.mark.mpi(min_size=2)
def test_world_too_small_raises_on_every_rank() -> None:
    size = COMM.Get_size()
    with pytest.raises(WorldTooSmall) as info:
        split_roles(COMM, LayoutConfig(learners=size - 1, buffers=1, actors=1))
    assert f"needs {size + 1} ranks" in str(info.value)
    assert f"world has {size}" in str(info.value)
    # per node: emulated nodes of ~2 ranks cannot hold 1+1+1
    with pytest.raises(WorldTooSmall, match="per node"):
        split_roles(COMM, LayoutConfig(per_node=True, emulate_nodes=size // 2 + 1))
    assert everyone(True)  # every rank got here: nobody hung


@pytest.mark.mpi(min_size=2)
def test_more_emulated_nodes_than_ranks_refused_on_every_rank() -> None:
    size = COMM.Get_size()
    with pytest.raises(ConfigError) as info:
        split_roles(COMM, LayoutConfig(learners=0, buffers=1, emulate_nodes=size + 1))
    assert info.value.key == "layout.emulate_nodes"
    assert f"emulate_nodes = {size + 1}" in str(info.value)
    assert f"1 to {size}" in str(info.value)
    roles = split_roles(COMM, LayoutConfig(learners=0, buffers=1, emulate_nodes=size))
    assert roles.node_of == tuple(range(size))  # one rank a node: the most there can be
    roles.close()
    assert everyone(True)  # every rank got here: nobody hung


@pytest.mark.mpi(min_size=3)
def test_fixed_counts_smaller_than_world_refused() -> None:
    size = COMM.Get_size()
    with pytest.raises(ConfigError, match="actors = 0"):
        split_roles(COMM, LayoutConfig(learners=1, buffers=1, actors=size - 3 if size > 3
                                       else 0) if size > 3 else LayoutConfig(
            learners=0, buffers=1, actors=1))


@pytest.mark.mpi(min_size=2)
def test_config_mismatch_raises_together() -> None:
    same = make_config()
    check_same_config(COMM, same)
    differs = make_config(run={"seed": 1 if COMM.rank == COMM.Get_size() - 1 else 0})
    with pytest.raises(ConfigMismatch) as info:
        check_same_config(COMM, differs)
    assert f"[{COMM.Get_size() - 1}]" in str(info.value)
    assert everyone(True)


@pytest.mark.mpi(min_size=3)
def test_shards_larger_than_the_node_s_memory_are_refused_on_every_rank() -> None:
    """A capacity that passes the config's ranges but cannot be allocated is refused on
    every rank, naming the key, before any window exists (was: OverflowError or an MPI
    allocation failure on some rank)."""
    from conduit_hpc import ExperienceDataPlane

    # (no checkpoints: their staging copy is named too, test_memory_check.py)
    cfg = make_config(storage={"capacity_rows": 2**40}, checkpoint={"on_stop": False})
    with pytest.raises(ConfigError, match=r"storage\.capacity_rows = 1099511627776 \(\d+ "
                       r"bytes of shards\) needs \d+ bytes .* more than is free there"):
        ExperienceDataPlane(cfg, COMM)
    assert everyone(True)  # every rank got here (none hangs in a collective)


@pytest.mark.mpi(min_size=3)
def test_a_learner_without_its_gpu_fails_every_rank_together() -> None:
    """``device = "cuda"`` where a learner's torch sees no GPU (a rank-local fact) is a
    ConfigError on every rank, agreed before any rank goes on - not one rank's error
    while the others wait in a collective."""
    import torch

    from conduit_hpc import ExperienceDataPlane

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cfg = make_config(scheduler={"device": "cuda"})
    with pytest.raises(ConfigError, match=r"scheduler\.device must be"):
        ExperienceDataPlane(cfg, COMM)
    assert everyone(True)


@pytest.mark.skipif(COMM.Get_size() != 3, reason="3 ranks")
def test_the_config_check_keeps_each_rank_s_host_on_the_roles() -> None:
    """The constructor's all-gather already carries each rank's hostname: it is kept (for
    errors that name a rank waited on), not thrown away."""
    hosts = check_same_config(COMM, make_config())
    assert hosts.names == (socket.gethostname(),) * 3
    assert not hosts.several and hosts.rank(2) == "world rank 2"  # one host: as before
    roles = split_roles(COMM, LayoutConfig(learners=1, buffers=1), hosts=hosts)
    assert roles.hosts is hosts
    roles.close()


@pytest.mark.mpi(min_size=3)
@pytest.mark.skipif(COMM.Get_size() != 3, reason="one rank count (make test's time)")
@pytest.mark.parametrize("on", [True, False])
def test_a_plane_freezes_the_collector_s_old_objects_while_it_runs(on: bool) -> None:
    """``run.gc_freeze`` (plane/collector.py): frozen from construction to close on every
    rank, and given back after; off, the collector is left as it was. Also after a rank
    leaves on an error."""
    import gc

    from conduit_hpc import ExperienceDataPlane, RemoteFailure

    gc.unfreeze()
    cfg = make_config(run={"gc_freeze": on, "timeout_s": 10.0})
    with ExperienceDataPlane(cfg, COMM) as edp:
        during = gc.get_freeze_count()
        if edp.serves:
            edp.serve()
        edp.done()
    assert everyone((during > 0) == on and gc.get_freeze_count() == 0)
    # one rank fails, the others hear
    with pytest.raises((RuntimeError, RemoteFailure)), ExperienceDataPlane(cfg, COMM) as edp:
        if COMM.rank == 0:
            raise RuntimeError("a failing job")
        if edp.serves:
            edp.serve()
        edp.done()
    assert everyone(gc.get_freeze_count() == 0)
