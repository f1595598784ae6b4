"""The MPI-free layout rule (config/layout_rule.py): the roles it hands out, the delivery
ranks of ``scheduler.delivery = "process"``, and the launcher's and the diagnosis' use
of it."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conduit_hpc import Config
from conduit_hpc.config import CheckpointConfig, LayoutConfig, SchedulerConfig
from conduit_hpc.config.layout_rule import (
    assign_roles,
    delivery_per_learner,
    emulated_nodes_problem,
    ranks_needed,
    role_of_rank,
)
from conduit_hpc.errors import ConfigError, WorldTooSmall
from conduit_hpc.tools.diagnose import role_of
from conduit_hpc.tools.launcher import ranks_problem

layouts = st.builds(LayoutConfig, learners=st.integers(0, 3), buffers=st.integers(1, 3),
                    actors=st.integers(0, 3), per_node=st.booleans())
deliveries = st.sampled_from(["thread", "process"])


@settings(max_examples=300, deadline=None)
@given(layout=layouts, delivery=deliveries, nodes=st.integers(1, 3), extra=st.integers(0, 4),
       interleave=st.booleans())
def test_roles_have_the_counts_order_and_nodes_the_layout_says(layout, delivery, nodes,
                                                               extra, interleave) -> None:
    per = ranks_needed(layout, delivery) + (extra if layout.actors == 0 else 0)
    n = per * nodes if layout.per_node else per
    node_of = tuple((r % nodes if interleave else r * nodes // n) for r in range(n))
    got, err = assign_roles(layout, node_of, delivery)
    assert err is None and got is not None
    d = delivery_per_learner(delivery)
    groups = nodes if layout.per_node else 1
    assert len(got.ranks("learner")) == layout.learners * groups
    assert len(got.ranks("delivery")) == layout.learners * d * groups
    assert len(got.ranks("buffer")) == layout.buffers * groups
    assert len(got.ranks("actor")) == n - (layout.learners * (1 + d) + layout.buffers) * groups
    # every learner has exactly one delivery rank (process) on its node, none shared
    assert sorted(got.delivery_of) == (sorted(got.ranks("learner")) if d else [])
    assert sorted(got.delivery_of.values()) == sorted(got.ranks("delivery"))
    for lo, dr in got.delivery_of.items():
        if layout.per_node:
            assert node_of[lo] == node_of[dr]
    # within a group, roles come in the order learner, delivery, buffer, actor
    order = {"learner": 0, "delivery": 1, "buffer": 2, "actor": 3}
    for g in range(groups):
        mine = [got.roles[r] for r in range(n) if not layout.per_node or node_of[r] == g]
        assert [order[x] for x in mine] == sorted(order[x] for x in mine)


@settings(max_examples=300, deadline=None)
@given(layout=layouts, delivery=deliveries, n=st.integers(1, 16))
def test_the_launcher_and_the_diagnosis_agree_with_the_rule(layout, delivery, n) -> None:
    assume(delivery == "thread" or layout.learners >= 1)  # else refused when loaded
    cfg = Config(layout=layout, scheduler=SchedulerConfig(delivery=delivery),
                 checkpoint=CheckpointConfig(on_stop=False))
    got, err = assign_roles(layout, (0,) * n, delivery)
    problem = ranks_problem(cfg, n)
    if layout.per_node:
        assert problem is None  # not checked before launch
        assert role_of(cfg, n, 0) == ""
        return
    assert (None if problem is None else type(problem)) is (None if err is None else type(err))
    for r in range(n):
        assert role_of(cfg, n, r) == ("" if got is None else got.roles[r])
        assert role_of_rank(layout, delivery, n, r) == role_of(cfg, n, r)


def test_errors_name_the_delivery_ranks_and_the_option() -> None:
    lay = LayoutConfig(learners=2, buffers=1, actors=1)
    _, err = assign_roles(lay, (0,) * 4, "process")
    assert isinstance(err, WorldTooSmall) and "2 delivery" in str(err) and "6 ranks" in str(err)
    cfg = Config(layout=lay, scheduler=SchedulerConfig(delivery="process"),
                 checkpoint=CheckpointConfig(on_stop=False))
    assert isinstance(ranks_problem(cfg, 4), WorldTooSmall)
    assert "delivery" in str(ranks_problem(cfg, 4))
    assert ranks_problem(cfg, 6) is None
    assert isinstance(ranks_problem(cfg, 7), ConfigError)
    with pytest.raises(ConfigError, match=r"scheduler\.delivery"):
        delivery_per_learner("fork")


@pytest.mark.parametrize(("override", "key"), [
    ({"scheduler": {"delivery": "process", "mode": "sync"}}, "scheduler.delivery"),
    ({"scheduler": {"delivery": "process", "mode": "service"}}, "scheduler.delivery"),
    ({"scheduler": {"delivery": "socket"}}, "scheduler.delivery"),
    ({"scheduler": {"delivery": "process"}, "checkpoint": {"every_supersteps": 5,
                                                           "on_stop": False}}, "checkpoint"),
    ({"scheduler": {"delivery": "process"}}, "checkpoint"),  # on_stop is on by default
    ({"scheduler": {"delivery": "process"}, "checkpoint": {"on_stop": False},
      "placement": {"adaptive": True}}, "placement.adaptive"),
    ({"scheduler": {"delivery": "process"}, "checkpoint": {"on_stop": False},
      "layout": {"learners": 0}}, "layout.learners"),
])
def test_unsupported_combinations_are_refused_when_loaded(override, key) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_dict(override)
    assert info.value.key == key or str(info.value).startswith(key)
    assert "delivery" in str(info.value)


def test_process_delivery_loads_with_checkpoints_off() -> None:
    cfg = Config.from_dict({"scheduler": {"delivery": "process"},
                            "checkpoint": {"on_stop": False}})
    assert cfg.scheduler.delivery == "process"


def test_the_sbatch_plan_counts_the_delivery_ranks() -> None:
    from conduit_hpc.tools.slurm import SlurmRequest, plan_tasks

    lay = LayoutConfig(learners=1, buffers=1, actors=2)
    t, _, comment = plan_tasks(lay, SlurmRequest(nodes=1), "process")
    assert t == 5 and "rank 1 delivery" in comment[0] and "ranks 3-4 actors" in comment[0]
    assert plan_tasks(lay, SlurmRequest(nodes=1))[0] == 4
    with pytest.raises(ConfigError, match="1 delivery rank"):
        plan_tasks(lay, SlurmRequest(nodes=1, ntasks_per_node=4), "process")


@settings(max_examples=200, deadline=None)
@given(nodes=st.integers(0, 40), n=st.integers(1, 32), per_node=st.booleans())
def test_more_emulated_nodes_than_ranks_refused_before_launch(nodes, n, per_node) -> None:
    # the check split_roles makes on every rank, and the launcher before mpirun
    lay = LayoutConfig(learners=0, buffers=1, actors=0, emulate_nodes=nodes,
                       per_node=per_node)
    bad = emulated_nodes_problem(lay, n)
    assert (bad is not None) == (nodes > n)
    got = ranks_problem(Config(layout=lay), n)
    if nodes > n:
        assert isinstance(bad, ConfigError) and bad.key == "layout.emulate_nodes"
        assert f"emulate_nodes = {nodes}" in str(bad) and f"1 to {n}" in str(bad)
        assert isinstance(got, ConfigError) and got.key == "layout.emulate_nodes"
    else:
        assert getattr(got, "key", None) != "layout.emulate_nodes"
