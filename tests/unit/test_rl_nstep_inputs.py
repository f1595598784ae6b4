"""n-step helpers against a hostile caller and a pure-Python reference: the actor-side
:class:`NStepAccumulator` (terminated vs truncated at every position, episodes shorter
than n, interleaved envs, bad arguments refused with nothing held changed, inputs not
kept) and the RLlib :class:`NStepAssembler`."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conduit_hpc.integrations.nstep import NStepAssembler
from conduit_hpc.rl import NStepAccumulator


def reference(episodes: list[list[tuple[float, float, int, float]]], n: int, g: float,
              last: list[tuple[str, float]]) -> list[tuple[float, int, float, float, float]]:
    """Every n-step row of one env's stream, by the definition: ``episodes`` of steps
    ``(obs, reward, action, next_obs)``, ``last`` how each ended ("term", "trunc" or
    "open": still running). Row ``(obs, action, return, next_obs, discount)``."""
    rows = []
    for steps, (end, _) in zip(episodes, last, strict=True):
        for t in range(len(steps)):
            k = min(n, len(steps) - t)
            if k < n and end == "open":
                continue  # not complete yet
            ret = sum(g ** i * steps[t + i][1] for i in range(k))
            ended_inside = t + k == len(steps) and end != "open"
            disc = 0.0 if ended_inside and end == "term" else g ** k
            rows.append((steps[t][0], steps[t][2], ret, steps[t + k - 1][3], disc))
    return rows


@pytest.mark.parametrize("n, g", [(1, 0.9), (3, 0.9), (4, 1.0), (2, 0.0), (7, 0.5)])
def test_n_step_rows_match_a_reference_over_random_episode_ends(n: int, g: float) -> None:
    """Three interleaved envs, episodes of 1 to 9 steps ending terminated or truncated
    at random (so at every position of the window, shorter and longer than n)."""
    rng = np.random.default_rng(n)
    envs = 3
    acc = NStepAccumulator(envs, n, g)
    got: list[list[tuple]] = [[] for _ in range(envs)]
    episodes: list[list[list]] = [[[]] for _ in range(envs)]
    ends: list[list[tuple[str, float]]] = [[] for _ in range(envs)]
    obs = rng.normal(size=(envs, 1)).astype(np.float32)
    for _ in range(120):
        action = rng.integers(0, 5, envs)
        reward = np.round(rng.normal(size=envs), 3)
        nxt = rng.normal(size=(envs, 1)).astype(np.float32)
        end = rng.random(envs)
        term, trunc = end < 0.12, (end >= 0.12) & (end < 0.2)
        rows = acc.push(obs.copy(), action, reward, nxt.copy(), term, trunc)
        for i in range(len(rows["env"])):
            got[rows["env"][i]].append((float(rows["obs"][i, 0]), int(rows["action"][i]),
                                        float(rows["reward"][i]),
                                        float(rows["next_obs"][i, 0]),
                                        float(rows["discount"][i])))
        for e in range(envs):
            episodes[e][-1].append((float(obs[e, 0]), float(reward[e]), int(action[e]),
                                    float(nxt[e, 0])))
            if term[e] or trunc[e]:
                ends[e].append(("term" if term[e] else "trunc", 0.0))
                episodes[e].append([])
        obs = rng.normal(size=(envs, 1)).astype(np.float32)  # the reset's first obs
    for e in range(envs):
        want = reference(episodes[e], n, g, [*ends[e], ("open", 0.0)])
        key = lambda r: (r[0], r[1])  # noqa: E731 - rows in emission order differ
        assert len(got[e]) == len(want)
        for a, b in zip(sorted(got[e], key=key), sorted(want, key=key), strict=True):
            assert a[:2] == pytest.approx(b[:2]) and a[3] == pytest.approx(b[3])
            assert a[2] == pytest.approx(b[2], rel=1e-5, abs=1e-5)
            assert a[4] == pytest.approx(b[4], rel=1e-6)
    assert acc.pending() == sum(len(ep[-1]) for ep in episodes) - sum(
        max(0, len(ep[-1]) - n + 1) for ep in episodes)


OBS = np.zeros((2, 3), np.float32)


@pytest.mark.parametrize("args, match", [
    # a scalar flag took env 0's step, then failed (IndexError) before env 1's
    ({"terminated": False}, r"terminated must have one entry per env \(2\)"),
    ({"reward": [1.0]}, r"reward must have one entry per env \(2\), got shape \(1,\)"),
    ({"reward": [1.0, 2.0, 3.0]}, r"reward must have one entry per env"),  # extra dropped
    # env 0's flushed rows were lost when int(nan) failed on env 1
    ({"action": [0.0, np.nan], "terminated": [1, 1]}, r"action\[1\] must be an integer"),
    ({"action": [0.0, 1.7]}, r"action\[1\] must be an integer.*1.7"),  # taken as 1
    ({"reward": [np.nan, 1.0]}, r"reward\[0\] must be finite.*nan"),
    ({"reward": [1.0, np.inf]}, r"reward\[1\] must be finite.*inf"),
    ({"reward": [1e300, 1.0]}, r"reward\[0\] must be finite and within float32"),
    ({"next_obs": np.zeros((2, 5))}, r"next_obs must have the shape of obs \(2, 3\)"),
    ({"next_obs": np.zeros((1, 3))}, r"next_obs must have 2 rows"),
    ({"obs": 1.0}, r"obs must have 2 rows"),
    ({"obs": [["a", "b", "c"]] * 2}, "obs.*str"),
    ({"truncated": [0.5, 0]}, "truncated must be true/false"),
])
def test_a_bad_step_is_refused_and_no_window_changes(args: dict, match: str) -> None:
    acc = NStepAccumulator(2, 3, 0.9)
    acc.push(OBS, [0, 1], [1.0, 1.0], OBS + 1, [False, False], [False, False])
    step = {"obs": OBS + 1, "action": [0, 1], "reward": [1.0, 1.0], "next_obs": OBS + 2,
            "terminated": [False, False], "truncated": [False, False], **args}
    with pytest.raises(ValueError, match=match):
        acc.push(**step)
    assert acc.pending() == 2
    rows = acc.push(OBS + 1, [0, 1], [2.0, 2.0], OBS + 2, [True, True], [False, False])
    np.testing.assert_allclose(rows["reward"], [1 + 0.9 * 2, 2, 1 + 0.9 * 2, 2])


def test_a_uint8_accumulator_refuses_float_pixels_rather_than_wrap_them() -> None:
    """300.7 became 44 in a uint8 observation."""
    acc = NStepAccumulator(2, 2, 0.9, "uint8")
    with pytest.raises(ValueError, match="obs: dtype float64 does not cast"):
        acc.push(np.full((2, 3), 300.7), [0, 1], [1, 1], np.zeros((2, 3), np.uint8),
                 [1, 1], [0, 0])
    rows = acc.push(np.full((2, 3), 7, np.uint16), torch.tensor([0, 1]), [1, 1],
                    np.zeros((2, 3), np.uint8), [1, 1], [0, 0])
    assert rows["obs"].dtype == np.uint8 and (rows["obs"] == 7).all()


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 2.5}, "n must be an integer >= 1, got 2.5"),  # never filled a window
    ({"n": True}, "n must be an integer >= 1, got True"),
    ({"n": 0}, "n must be an integer >= 1, got 0"),
    ({"num_envs": 2.0}, "num_envs must be an integer >= 1, got 2.0"),
    ({"gamma": "0.9"}, r"gamma must be a number in \[0, 1\], got '0.9'"),
    ({"gamma": float("nan")}, r"gamma must be a number in \[0, 1\], got nan"),
    ({"obs_dtype": "complex64"}, "obs_dtype must be one of"),
    ({"obs_dtype": "object"}, "obs_dtype must be one of"),
])
def test_an_accumulator_of_bad_arguments_is_refused(kwargs: dict, match: str) -> None:
    args = {"num_envs": 2, "n": 3, "gamma": 0.9, "obs_dtype": "float32", **kwargs}
    with pytest.raises(ValueError, match=match):
        NStepAccumulator(**args)


def test_the_accumulator_keeps_no_reference_to_the_callers_observations() -> None:
    """An env that writes its observations into one buffer (reused each step) rewrote
    the pending rows' ``obs``: the window held views of the caller's array."""
    acc = NStepAccumulator(2, 2, 0.9)
    buf = np.zeros((2, 3), np.float32)
    acc.push(buf, [0, 1], [1.0, 1.0], buf + 1, [False, False], [False, False])
    buf[:] = 7
    rows = acc.push(buf, [0, 1], [1.0, 1.0], buf + 1, [False, False], [False, False])
    assert rows["obs"][:, 0].tolist() == [0, 0]


def chunk(id_: str, obs: list, acts: list, rews: list, done: bool = False,
          terminated: bool = False) -> SimpleNamespace:
    """A stand-in for RLlib's SingleAgentEpisode chunk (the four getters and flags)."""
    return SimpleNamespace(id_=id_, get_observations=lambda: obs, get_actions=lambda: acts,
                           get_rewards=lambda: rews, is_done=done, is_terminated=terminated)


@pytest.mark.parametrize("kwargs, match", [
    ({"n_step": 0}, "n_step must be an integer >= 1, got 0"),  # next_obs = obs, reward 0
    ({"n_step": -2}, "n_step must be an integer >= 1, got -2"),
    ({"n_step": 1.5}, "n_step must be an integer >= 1, got 1.5"),  # TypeError mid-add
    ({"gamma": float("nan")}, r"gamma must be a number in \[0, 1\], got nan"),
    ({"gamma": 1.5}, r"gamma must be a number in \[0, 1\], got 1.5"),
    ({"gamma": -0.1}, r"gamma must be a number in \[0, 1\], got -0.1"),
])
def test_an_rllib_assembler_of_bad_arguments_is_refused(kwargs: dict, match: str) -> None:
    args = {"n_step": 3, "gamma": 0.9, **kwargs}
    with pytest.raises(ValueError, match=match):
        NStepAssembler(**args)


def test_the_rllib_assembler_matches_a_reference_across_chunks() -> None:
    """An episode cut into chunks of 2 and 3 steps, ending terminated; another shorter
    than n: every row by the definition (steps closer than n to the end are dropped)."""
    n, g = 3, 0.5
    asm = NStepAssembler(n, g)
    obs = [float(i) for i in range(8)]  # 7 steps
    rews = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    outs = [asm.add([chunk("a", obs[0:3], [0, 1], rews[0:2])]),
            asm.add([chunk("a", obs[2:6], [2, 3, 4], rews[2:5]),
                     chunk("b", [10.0, 11.0, 12.0], [7, 7], [1.0, 1.0], True, True)]),
            asm.add([chunk("a", obs[5:8], [5, 6], rews[5:7], True, True)])]
    assert outs[0] is None
    got = {k: np.concatenate([o[k] for o in outs if o is not None]) for k in outs[1]}
    want_ret = [sum(g ** i * rews[t + i] for i in range(n)) for t in range(7 - n + 1)]
    np.testing.assert_allclose(got["obs"], obs[:5])
    np.testing.assert_allclose(got["next_obs"], obs[3:8])
    np.testing.assert_allclose(got["reward"], want_ret)
    assert got["action"].tolist() == [0, 1, 2, 3, 4]
    assert got["terminated"].tolist() == [False] * 4 + [True]
    assert asm.open == {}


@pytest.mark.parametrize("bad, match", [
    # 3 actions, 2 observations: columns of different lengths were emitted
    (chunk("a", [0.0, 1.0], [0, 1, 2], [1.0, 1.0, 1.0]), "must hold 4 observations"),
    # a broadcast error after the episode's pending steps were popped (lost)
    (chunk("a", [0.0, 1.0, 2.0, 3.0], [0, 1, 2], [1.0]), "and 3 rewards.*got 4 and 1"),
    (chunk("a", [2.0, 3.0], [0], [float("nan")]), "reward nan of the chunk's step 0"),
])
def test_a_refused_rllib_chunk_changes_no_open_episode(bad: SimpleNamespace, match: str
                                                       ) -> None:
    asm = NStepAssembler(2, 0.5)
    assert asm.add([chunk("a", [0.0, 1.0, 2.0], [0, 1], [1.0, 1.0])])["obs"].tolist() == [0]
    assert asm.add([chunk("b", [5.0, 6.0], [3], [1.0])]) is None
    before = {k: tuple(list(x) for x in v) for k, v in asm.open.items()}
    with pytest.raises(ValueError, match=match):
        asm.add([chunk("b", [6.0, 7.0], [4], [2.0]), bad])  # b's chunk is fine
    assert {k: tuple(list(x) for x in v) for k, v in asm.open.items()} == before
    out = asm.add([chunk("a", [2.0, 3.0], [2], [4.0])])
    assert out["obs"].tolist() == [1.0] and out["reward"].tolist() == [1.0 + 0.5 * 4.0]


def test_the_rllib_assembler_keeps_no_reference_to_the_callers_observations() -> None:
    asm = NStepAssembler(2, 0.5)
    buf = np.zeros((2, 2))
    asm.add([chunk("a", buf, [0], [1.0])])
    buf[:] = 9  # an episode buffer reused by the caller
    out = asm.add([chunk("a", np.array([[0.0, 0.0], [1.0, 1.0]]), [1], [1.0])])
    assert out["obs"].tolist() == [[0.0, 0.0]]
