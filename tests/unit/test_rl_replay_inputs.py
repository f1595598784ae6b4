"""The single-process prioritized replay (the convergence baseline's) against a hostile
caller: rows of another shape, lossy casts, bad exponents, batch sizes and slots are
refused naming the argument, with nothing stored; sampling frequencies follow a pure
Python reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conduit_hpc.rl import PrioritizedReplay

COLUMNS = {"obs": ((4,), "float32"), "action": ((), "int64")}


def filled(capacity: int = 8, alpha: float = 1.0) -> PrioritizedReplay:
    rb = PrioritizedReplay(COLUMNS, capacity, alpha)
    rb.add({"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "action": [0, 1, 2]},
           [1.0, 2.0, 3.0])
    return rb


def stored(rb: PrioritizedReplay) -> tuple[list, list, int, list]:
    return (rb._data["obs"].tolist(), rb._data["action"].tolist(), rb.inserted,
            rb._index.priority.tolist())


@pytest.mark.parametrize("batch, match", [
    # a row of shape (1,) was broadcast into every element of a (4,) row
    ({"obs": np.ones((3, 1)), "action": [0, 1, 2]}, r"'obs': shape \(3, 1\)"),
    # four scalars were broadcast into four rows, each a copy of all four
    ({"obs": np.arange(4.0), "action": [0, 1, 2, 3]}, r"'obs': shape \(4,\)"),
    # float actions were truncated (1.7 -> 1) and NaN became -2**63
    ({"obs": np.ones((2, 4)), "action": np.array([1.7, np.nan])}, "'action': dtype float64"),
    # strings were parsed as numbers
    ({"obs": np.ones((1, 4)), "action": ["3"]}, "'action'.*str"),
    # 1e300 became inf in a float32 column
    ({"obs": np.full((1, 4), 1e300), "action": [1]}, "'obs': value 1e\\+300"),
    # 2**63 + 5 wrapped to a negative action
    ({"obs": np.ones((1, 4)), "action": np.array([2**63 + 5], np.uint64)}, "'action'.*wrap"),
    ({"obs": 1.0, "action": 1}, r"'obs': shape \(\)"),  # TypeError: no len()
    ({}, "'obs' is missing"),  # StopIteration
    ({"obs": np.ones((2, 4)), "action": [0]}, "'action' has 1 rows"),
])
def test_a_batch_that_does_not_fit_the_columns_is_refused_and_nothing_stored(
        batch: dict, match: str) -> None:
    rb = filled()
    before = stored(rb)
    with pytest.raises(ValueError, match=match):
        rb.add(batch)
    assert stored(rb) == before


def test_a_batch_of_any_array_kind_is_stored_by_value_and_not_kept() -> None:
    """Non-contiguous, read-only, torch tensors (with grad) and lists are stored; the
    caller's arrays are copied (mutating them after the call changes nothing), and a
    sample's arrays stay as returned when the replay changes."""
    rb = PrioritizedReplay({"x": ((2,), "float32")}, 4, alpha=1.0)
    a = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    a.setflags(write=False)
    p = np.array([1.0, 2.0, 3.0])
    rb.add({"x": a}, p)
    rb.add({"x": torch.ones(1, 2, requires_grad=True)}, torch.tensor([4.0]))
    b = np.zeros((0, 2), np.float32)
    rb.add({"x": b})
    rb.add({"x": []})  # zero rows, no dtype: nothing
    p[:] = np.nan
    assert rb._data["x"].tolist() == [[0, 2], [4, 6], [8, 10], [1, 1]]
    assert rb._index.priority.tolist() == [1, 2, 3, 4]
    s = rb.sample(4, 0.4, np.random.default_rng(0))
    held = (s.batch["x"].copy(), s.slots.copy(), s.gens.copy(), s.weights.copy())
    rb.add({"x": np.full((4, 2), 9.0)}, np.ones(4))
    rb.update_priorities(s.slots, s.gens, np.full(4, 7.0))
    rb.sample(4, 0.4, np.random.default_rng(1))
    for now, then in zip((s.batch["x"], s.slots, s.gens, s.weights), held, strict=True):
        np.testing.assert_array_equal(now, then)


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": float("nan")}, "alpha must be a number in \\[0, 10\\].*got nan"),
    ({"alpha": -1.0}, "alpha must be a number in \\[0, 10\\].*got -1.0"),
    ({"alpha": float("inf")}, "alpha must be a number in \\[0, 10\\].*got inf"),
    ({"alpha": 9.9, "capacity": 2**40}, "alpha must be <= 9.8"),
    ({"capacity": 2.5}, "capacity must be an integer >= 1, got 2.5"),
    ({"capacity": True}, "capacity must be an integer >= 1, got True"),
    ({"capacity": "3"}, "capacity must be an integer >= 1, got '3'"),
    ({"capacity": 0}, "capacity must be an integer >= 1, got 0"),
    ({"columns": {}}, "at least one field"),
    ({"columns": {"x": (4, "float32")}}, "'x': shape must be a tuple"),
    ({"columns": {"x": ((), object)}}, "'x': dtype must be one of"),
    ({"columns": {"x": "float32"}}, "'x': expected a \\(shape, dtype\\) pair"),
])
def test_a_replay_of_bad_arguments_is_refused(kwargs: dict, match: str) -> None:
    """A NaN alpha made every mass NaN (the sum-tree then drew slot 0 only), a negative
    one favoured the rows of least priority; other bad arguments failed with numpy's
    TypeErrors (or made an object column)."""
    args = {"columns": COLUMNS, "capacity": 8, "alpha": 0.6, **kwargs}
    with pytest.raises(ValueError, match=match):
        PrioritizedReplay(args["columns"], args["capacity"], args["alpha"])


@pytest.mark.parametrize("kwargs, error, match", [
    ({"beta": float("nan")}, ValueError, "beta must be a number in \\[0, 1000\\].*nan"),
    ({"beta": -1.0}, ValueError, "beta must be a number in \\[0, 1000\\].*-1.0"),
    ({"beta": float("inf")}, ValueError, "beta must be a number in \\[0, 1000\\].*inf"),
    ({"beta": True}, ValueError, "beta must be a number in \\[0, 1000\\].*True"),
    ({"batch_size": 2.5}, ValueError, "batch_size must be an integer >= 1, got 2.5"),
    ({"batch_size": True}, ValueError, "batch_size must be an integer >= 1, got True"),
    ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1, got 0"),
    ({"rng": None}, TypeError, "rng must be a numpy.random.Generator.*NoneType"),
    ({"rng": 3}, TypeError, "rng must be a numpy.random.Generator.*int"),
])
def test_a_sample_of_bad_arguments_is_refused(kwargs: dict, error: type, match: str
                                              ) -> None:
    """A NaN beta gave NaN weights, an infinite one NaN and 0, a negative one weights
    above 1; a bad batch size or rng failed inside numpy."""
    args = {"batch_size": 4, "beta": 0.4, "rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(error, match=match):
        filled().sample(args["batch_size"], args["beta"], args["rng"])


def test_sampling_with_every_priority_zero_says_so_not_empty() -> None:
    rb = PrioritizedReplay(COLUMNS, 4)
    rb.add({"obs": np.ones((3, 4)), "action": [0, 1, 2]}, np.zeros(3))
    with pytest.raises(ValueError, match="every one of the 3 rows held has priority 0"):
        rb.sample(2, 0.4, np.random.default_rng(0))


@pytest.mark.parametrize("slots, gens, prios, match", [
    # a bool mask was taken as slots 0 and 1
    (np.array([True, False, True]), [1, 1, 1], [5.0] * 3, "slots must be integers.*bool"),
    # 1.7 was truncated to slot 1
    (np.array([1.7]), [2], [9.0], "slots must be integers.*float64"),
    ([0], [1.9], [9.0], "gens must be integers.*float64"),
    ([0, -1], [1, 3], [1.0, 1.0], r"slots\[1\] must be in \[0, 8\).*got -1"),
    ([99], [3], [1.0], r"slots\[0\] must be in \[0, 8\).*got 99"),
    ([0, 1], [1], [1.0, 1.0], "got 2, 1 and 2 entries"),
    ([[0, 1], [1, 2]], [1, 2, 3, 4], [1.0] * 4, r"slots must be one entry per row"),
    ([0], [1], [float("nan")], r"priorities\[0\] must be finite"),
])
def test_bad_priority_updates_are_refused_and_nothing_applied(slots: object, gens: object,
                                                              prios: object, match: str
                                                              ) -> None:
    rb = filled()
    before = stored(rb)
    with pytest.raises(ValueError, match=match):
        rb.update_priorities(slots, gens, prios)
    assert stored(rb) == before


def test_updates_follow_a_reference_model_through_overwrites_and_duplicates() -> None:
    """A pure-Python model of the replay (a dict slot -> (generation, priority)), fed the
    same adds and updates - duplicates, stale generations, rows overwritten since they
    were sampled - holds the same priorities; sampling frequencies over many draws match
    its probabilities within 5 standard deviations."""
    cap, alpha = 5, 0.7
    rb = PrioritizedReplay({"x": ((), "int64")}, cap, alpha)
    model: dict[int, tuple[int, float]] = {}
    seq = 0
    rng = np.random.default_rng(7)
    for step in range(40):
        k = int(rng.integers(1, 4))
        prios = rng.uniform(0.1, 5.0, k)
        rb.add({"x": np.arange(seq, seq + k)}, prios)
        for i in range(k):
            model[(seq + i) % cap] = (seq + i + 1, float(prios[i]))
        seq += k
        s = rb.sample(4, 0.5, rng)
        rb.add({"x": [seq]}, [1.0])  # may overwrite a sampled row
        model[seq % cap] = (seq + 1, 1.0)
        seq += 1
        new = rng.uniform(0.1, 5.0, 4)
        dropped = rb.update_priorities(s.slots, s.gens, new)
        want = 0
        for slot, gen, p in zip(s.slots.tolist(), s.gens.tolist(), new.tolist(), strict=True):
            if model[slot][0] == gen:
                model[slot] = (gen, p)  # later duplicates win
            else:
                want += 1
        assert dropped == want, step
        got = {slot: (int(rb._index.gens[slot]), float(rb._index.priority[slot]))
               for slot in range(cap) if rb._index.gens[slot]}
        assert got == model, step
    mass = np.array([model[i][1] ** alpha for i in range(cap)])
    prob = mass / mass.sum()
    draws, counts = 200_000, np.zeros(cap)
    for _ in range(draws // 1000):
        counts += np.bincount(rb.sample(1000, 1.0, rng).slots, minlength=cap)
    sd = np.sqrt(draws * prob * (1 - prob))
    assert (np.abs(counts - draws * prob) <= 5 * sd).all(), (counts / draws, prob)


def test_importance_weights_stay_in_zero_one_for_extreme_priority_ratios() -> None:
    """Priorities 1e30 and 1e-20 are both accepted; the heavy row's weight (1e-50 at
    beta 1) underflowed float32 to 0.0, outside (0, 1] (the data plane's sampler gives
    float32's smallest normal, since a loss may divide by a weight or take its log)."""
    rb = PrioritizedReplay({"x": ((), "float32")}, 4, alpha=1.0)
    rb.add({"x": np.zeros(2, np.float32)}, [1e30, 1e-20])
    rb.update_priorities([1], [2], [1e-20])
    for beta in (0.0, 1.0, 1000.0):
        s = rb.sample(8, beta, np.random.default_rng(0))
        assert s.weights.dtype == np.float32
        assert ((s.weights > 0) & (s.weights <= 1)).all(), (beta, s.weights)
