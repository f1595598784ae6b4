"""``run.gc_freeze`` (``plane/collector.py``): the objects alive when a plane is built
are frozen out of the cyclic collector while it runs, and given back when it ends."""

from __future__ import annotations

import gc

import pytest

from conduit_hpc.config import Config
from conduit_hpc.errors import ConfigError
from conduit_hpc.plane.collector import GcFreeze


@pytest.fixture(autouse=True)
def _thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_freeze_holds_what_lives_now_and_thaw_gives_it_back() -> None:
    cycle: list[object] = []
    cycle.append(cycle)  # garbage that only the cyclic collector frees
    f = GcFreeze(True)
    assert f.frozen and gc.get_freeze_count() > 0
    del cycle
    f.thaw()
    assert gc.get_freeze_count() == 0
    f.thaw()  # once only
    assert gc.get_freeze_count() == 0


def test_off_or_a_process_s_own_freeze_is_left_alone() -> None:
    assert not GcFreeze(False).frozen and gc.get_freeze_count() == 0
    gc.freeze()  # the process's own
    before = gc.get_freeze_count()
    f = GcFreeze(True)
    assert not f.frozen
    f.thaw()
    assert gc.get_freeze_count() == before  # not ours to undo


def test_the_collector_still_frees_what_the_loop_makes_while_frozen() -> None:
    f = GcFreeze(True)
    try:
        import weakref

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        ref = weakref.ref(a)
        del a, b
        gc.collect()
        assert ref() is None
    finally:
        f.thaw()


@pytest.mark.parametrize("bad", ["yes", 1, None, 0.0])
def test_gc_freeze_takes_a_bool_only(bad: object) -> None:
    with pytest.raises(ConfigError, match="gc_freeze"):
        Config.from_dict({"spec": {"x": {"dtype": "float32"}}, "run": {"gc_freeze": bad}})
