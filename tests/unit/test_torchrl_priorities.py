"""What ``DataPlaneReplayBuffer.update_priority`` / ``extend`` take as priorities, without
a data plane (the buffer's reduction alone): array-likes by ``spec.as_array``'s rule, each
bad one a ``SpecError`` naming the priority key (before: torch's or numpy's own TypeError,
RuntimeError or NotImplementedError for a string, None, an empty tensor, booleans, a
quantized or meta tensor), and ``reduction = "mean"`` over extra dimensions works (it
raised AttributeError: a mean tensor has a ``values`` method, taken for a result's field)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from extras import need_extra

from conduit_hpc.errors import ConfigError, SpecError

need_extra("torchrl", "tensordict", module_level=True)

from conduit_hpc.integrations.torchrl import DataPlaneReplayBuffer  # noqa: E402


def buffer(reduction: str) -> DataPlaneReplayBuffer:
    rb = DataPlaneReplayBuffer.__new__(DataPlaneReplayBuffer)  # its reduction, no plane
    rb.reduction, rb.eps, rb.priority_key = reduction, 1e-8, "td_error"
    return rb


@pytest.mark.parametrize("reduction", ["max", "min", "mean", "median"])
def test_each_reduction_matches_torchs(reduction: str) -> None:
    x = torch.randn(5, 2, 3)
    want = getattr(x.abs().double().reshape(5, -1), reduction)(dim=1)
    want = want if isinstance(want, torch.Tensor) else want.values
    got = buffer(reduction)._priority_vector(x, 5)
    np.testing.assert_allclose(got, want.numpy() + 1e-8)
    assert buffer(reduction)._priority_vector(torch.tensor(2.0), 3).tolist() == [2 + 1e-8] * 3


@pytest.mark.parametrize(("value", "match"), [
    ("abc", "must be an array of numbers, got a str"),
    (None, "must hold numbers"),
    ([[1.0, 2.0], [1.0]], "rectangular"),
    (torch.ones(3, dtype=torch.complex64), "must be real numbers"),
    (torch.ones(3, device="meta"), "meta device"),
    (torch.ones(3, 0), r"holds no value per row"),
])
def test_bad_priorities_are_named(value: Any, match: str) -> None:
    with pytest.raises(SpecError, match=r"priority \('td_error'\)"):
        buffer("max")._priority_vector(value, 3)
    with pytest.raises(SpecError, match=match):
        buffer("max")._priority_vector(value, 3)


def test_booleans_and_empty_priorities_are_values() -> None:
    assert buffer("max")._priority_vector(torch.ones(2, dtype=torch.bool), 2).tolist() == \
        [1 + 1e-8] * 2
    assert buffer("max")._priority_vector(torch.zeros(0), 0).shape == (0,)


@pytest.mark.parametrize("eps", [-1.0, float("nan"), float("inf"), "1e-8", True])
def test_a_bad_eps_is_refused_before_anything_is_built(eps: Any) -> None:
    # what the constructor reads before its first check
    plane = SimpleNamespace(config=SimpleNamespace(scheduler=SimpleNamespace(
        sampler="prioritized", batch_rows=32)))
    with pytest.raises(ConfigError, match=r"eps must be a finite number >= 0"):
        DataPlaneReplayBuffer(plane, eps=eps)  # type: ignore[arg-type]


@pytest.mark.parametrize("data", [{"observation": torch.zeros(2, 4)}, torch.zeros(2, 4), None])
def test_extend_of_what_is_no_tensordict_is_a_spec_error(data: Any) -> None:
    """Was AttributeError ("'dict' object has no attribute 'batch_dims'")."""
    from conduit_hpc.plane.roles import Role

    rb = buffer("max")
    rb.edp = SimpleNamespace(role=Role.ACTOR, world_rank=2)  # type: ignore[assignment]
    with pytest.raises(SpecError, match=r"extend\(\) takes a TensorDict .*, got "):
        rb.extend(data)


@pytest.mark.parametrize("data", [None, torch.zeros(3), 5, "index"])
def test_update_tensordict_priority_of_what_is_no_tensordict_is_a_spec_error(
        data: Any) -> None:
    """Was TypeError ('argument of type NoneType is not iterable') or torch's
    RuntimeError ('Tensor.__contains__ only supports Tensor or scalar')."""
    from conduit_hpc.plane.roles import Role

    rb = buffer("max")
    rb.prioritized = True
    rb.edp = SimpleNamespace(role=Role.LEARNER, world_rank=0)  # type: ignore[assignment]
    with pytest.raises(SpecError, match=r"takes the sampled TensorDict, got "):
        rb.update_tensordict_priority(data)


@pytest.mark.parametrize("call, name", [
    (lambda rb: rb.state_dict(), r"state_dict\(\)"),
    (lambda rb: rb.load_state_dict({}), r"load_state_dict\(\)"),
    (lambda rb: rb.dumps("/tmp/x"), r"dumps\(\)"),
    (lambda rb: rb.loads("/tmp/x"), r"loads\(\)"),
    (lambda rb: rb.empty(), r"empty\(\)"),
    (lambda rb: rb[0], r"__getitem__"),
])
def test_torchrl_buffer_methods_the_plane_does_not_offer_say_why(call: Any, name: str) -> None:
    """TorchRL's ReplayBuffer methods a moved script may still call were AttributeError
    ('... object has no attribute state_dict'), or TypeError for ``rb[0]``; each now says
    why and what the data plane does instead (checkpoints for the state)."""
    from conduit_hpc.integrations.torchrl_refused import NotOnTheDataPlane

    with pytest.raises(NotOnTheDataPlane, match=rf"DataPlaneReplayBuffer\.{name} is not "
                                               rf"offered: \S"):
        call(buffer("max"))
    with pytest.raises(NotImplementedError):  # what a caller of TorchRL's API may catch
        call(buffer("max"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e31])
def test_extend_refuses_a_bad_priority_in_any_chunk_before_writing_any(bad: float) -> None:
    """extend() splits a TensorDict into ingests of at most max_insert_batch rows, and
    each ingest checked its own priorities: a NaN in the third chunk's td_error raised
    after the first two chunks were stored (a part of the batch written, though the
    error said nothing was). Now every row's priority is checked first, naming the
    priority key and the row."""
    from tensordict import TensorDict

    from conduit_hpc.integrations.torchrl import TensorDictColumns
    from conduit_hpc.plane.roles import Role
    from conduit_hpc.spec import Field, Spec

    stored: list[int] = []
    rb = buffer("max")
    rb.prioritized, rb._chunk, rb._model = True, 4, None
    rb.columns = TensorDictColumns(Spec([Field("obs", np.dtype("float32"), (2,))]),
                                   skip=("index", "priority_weight", "td_error"))
    rb.edp = SimpleNamespace(role=Role.ACTOR, world_rank=2,  # type: ignore[assignment]
                             ingest=lambda cols, prio: stored.append(len(cols["obs"])))
    prio = torch.ones(10)
    prio[9] = bad
    td = TensorDict({"obs": torch.zeros(10, 2), "td_error": prio}, batch_size=[10])
    with pytest.raises(SpecError, match=r"priority \('td_error'\)\[9\] must be finite"):
        rb.extend(td)
    assert stored == []
    td.set("td_error", torch.ones(10))
    assert rb.extend(td) == 10 and stored == [4, 4, 2]
