"""What ``share_weights`` is given, checked on every rank before anything is built (COMM_SELF:
one rank that is the lead learner and its only user): ``None`` from the lead learner and
things that are not torch modules are refused by name (before: ``None`` everywhere reached
``np.empty(-1)``, a raw ValueError on every rank; a string raised AttributeError on its own
rank only, before the Allgather the others then waited in), and a model without parameters
shares an empty board."""

from __future__ import annotations

import pytest
import torch
from mpi4py import MPI

from conduit_hpc.errors import ConfigError
from conduit_hpc.plane.weights import agreed_model_size, flat_parameters


@pytest.mark.parametrize(("model", "match"), [
    (None, r"lead learner \(world rank 0\) passed None"),
    ("model", r"ranks \[0\] passed something that is not a torch.nn.Module \(this rank's: a str"),
    (object(), "not a torch.nn.Module"),
])
def test_a_lead_without_a_model_is_refused_by_name(model: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        agreed_model_size(MPI.COMM_SELF, model, 0, (0,))


def test_models_are_sized_without_a_copy_and_an_empty_one_is_fine() -> None:
    assert agreed_model_size(MPI.COMM_SELF, torch.nn.Linear(4, 2), 0, (0,)) == 10
    assert agreed_model_size(MPI.COMM_SELF, torch.nn.Sequential(), 0, (0,)) == 0
    assert flat_parameters(torch.nn.Sequential()).shape == (0,)
    assert agreed_model_size(MPI.COMM_SELF, None, -1, ()) == -1  # no learner: nothing


@pytest.mark.parametrize("other", [torch.nn.Linear(4, 3), torch.nn.Linear(2, 2), "net", None])
def test_weights_are_loaded_only_into_a_model_of_their_size(other: object) -> None:
    from conduit_hpc.plane.weights import load_flat

    flat = flat_parameters(torch.nn.Linear(4, 2))
    before = [p.detach().clone() for p in other.parameters()] \
        if isinstance(other, torch.nn.Module) else []
    with pytest.raises(ConfigError, match="published weights have 10 parameters"):
        load_flat(other, flat)  # type: ignore[arg-type]
    if isinstance(other, torch.nn.Module):  # nothing written before the refusal
        assert all(torch.equal(a, b) for a, b in zip(before, other.parameters(),
                                                     strict=True))
    same = torch.nn.Linear(4, 2)
    load_flat(same, flat)
    assert (flat_parameters(same) == flat).all()


def test_update_indices_may_be_tensors_that_numpy_cannot_take_directly() -> None:
    from conduit_hpc.errors import SpecError
    from conduit_hpc.sampling import check_update

    idx = torch.tensor([[0, 1, 1]])
    got, _ = check_update(idx, torch.ones(1), {0: 4})
    assert got.tolist() == [[0, 1, 1]]
    with pytest.raises(SpecError, match="indices must be an integer array"):
        check_update(idx.float().requires_grad_(True), torch.ones(1), {0: 4})


def test_weights_are_not_loaded_into_another_architecture_of_the_same_size() -> None:
    """Linear(3, 3) and Linear(5, 2) both hold 12 parameters: counting them is not
    enough (the flat weights would load into the wrong layers)."""
    from conduit_hpc.plane.weights import load_flat, model_layout

    shared, other = torch.nn.Linear(3, 3), torch.nn.Linear(5, 2)
    flat = flat_parameters(shared)
    assert model_layout(shared) == model_layout(torch.nn.Linear(3, 3)) != model_layout(other)
    before = [p.detach().clone() for p in other.parameters()]
    with pytest.raises(ConfigError, match="other parameter shapes"):
        load_flat(other, flat, like=shared)
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters(), strict=True))
    twin = torch.nn.Linear(3, 3)
    load_flat(twin, flat, like=shared)
    assert (flat_parameters(twin) == flat).all()
