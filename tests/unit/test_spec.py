from __future__ import annotations

import re

import numpy as np
import pytest

from conduit_hpc import Spec, SpecError
from conduit_hpc.spec import Field

SPEC = Spec([Field("obs", np.dtype("float32"), (4,), allow_nan=False),
             Field("action", np.dtype("int64"), ()),
             Field("reward", np.dtype("float32"), ())])


def good(n: int = 3) -> dict[str, np.ndarray]:
    return {"obs": np.zeros((n, 4), np.float32), "action": np.arange(n),
            "reward": np.ones(n, np.float32)}


def test_valid_batch_is_normalised_without_copies() -> None:
    b = good()
    out = SPEC.validate(b)
    assert list(out) == ["obs", "action", "reward"]
    assert out["obs"] is b["obs"] or np.shares_memory(out["obs"], b["obs"])
    assert SPEC.rows_of(out) == 3
    assert SPEC.row_bytes == 16 + 8 + 4


def test_safe_casts_are_accepted() -> None:
    b = good()
    b["action"] = np.arange(3, dtype=np.int16)
    assert SPEC.validate(b)["action"].dtype == np.int64


@pytest.mark.parametrize("empty", [[], ()])
def test_an_empty_sequence_is_zero_rows_of_the_fields_dtype(empty) -> None:
    """``[]`` has no dtype of its own (numpy's default, float64, is not the user's): it
    is zero rows, like a zero-row array of the field's dtype, not a dtype problem."""
    out = SPEC.validate({"obs": empty, "action": empty, "reward": np.ones(0, np.float32)})
    assert SPEC.rows_of(out) == 0
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {
        "obs": (np.float32, (0, 4)), "action": (np.int64, (0,)), "reward": (np.float32, (0,))}
    with pytest.raises(SpecError, match="field 'action' has 3 rows but field 'obs' has 0"):
        SPEC.validate({**good(), "obs": empty})
    with pytest.raises(SpecError, match="field 'obs': dtype float64 does not cast"):
        SPEC.validate({**good(0), "obs": np.zeros(0)})  # an array's dtype is its own


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [
        (lambda b: b.pop("reward"), "reward", "missing"),
        (lambda b: b.update(extra=np.zeros(3)), "extra", "not in the spec"),
        (lambda b: b.update(obs=np.zeros((3, 4), np.float64)), "obs", "cast safely"),
        (lambda b: b.update(action=np.zeros(3, np.float32)), "action", "cast safely"),
        (lambda b: b.update(obs=np.zeros((3, 5), np.float32)), "obs", "shape (3, 5)"),
        (lambda b: b.update(reward=np.zeros((3, 1), np.float32)), "reward", "scalar"),
        (lambda b: b.update(action=np.arange(4)), "action", "4 rows"),
        (lambda b: b["obs"].__setitem__((1, 2), np.nan), "obs", "NaN"),
    ],
)
def test_each_bad_input_names_the_field(mutate, field: str, fragment: str) -> None:
    b = good()
    mutate(b)
    with pytest.raises(SpecError) as info:
        SPEC.validate(b)
    assert isinstance(info.value, ValueError)
    assert repr(field) in str(info.value) and fragment in str(info.value)


def test_nan_allowed_where_spec_allows_it() -> None:
    b = good()
    b["reward"][0] = np.nan
    SPEC.validate(b)


def test_not_a_mapping_and_bad_specs() -> None:
    with pytest.raises(SpecError, match="mapping"):
        SPEC.validate([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="at least one"):
        Spec([])
    with pytest.raises(SpecError, match="twice"):
        Spec([Field("a", np.dtype("int8")), Field("a", np.dtype("int8"))])


def test_equality_by_signature() -> None:
    a = Spec.from_dict({"x": ("float32", (2,))})
    assert a == Spec.from_dict({"x": (np.float32, (2,))})
    assert a != Spec.from_dict({"x": ("float64", (2,))})


SAME_KIND = Spec([Field("action", np.dtype("int8"), (), cast="same_kind"),
                  Field("u", np.dtype("uint8"), (), cast="same_kind"),
                  Field("reward", np.dtype("float16"), (), cast="same_kind")])


def _kind_batch(**over) -> dict[str, np.ndarray]:
    b = {"action": np.array([1, -128, 127]), "u": np.array([0, 255, 3], np.uint64),
         "reward": np.array([1.5, np.inf, np.nan])}
    return {**b, **{k: np.resize(np.asarray(v), 3) for k, v in over.items()}}


@pytest.mark.parametrize("field, value, says", [
    ("action", 300, "value 300 is outside int8's range [-128, 127]"),
    ("action", -200, "value -200 is outside int8's range"),
    ("u", np.uint64(256), "value 256 is outside uint8's range [0, 255]"),
    ("reward", 1e6, "value 1000000.0 is beyond float16's largest finite value"),
    ("reward", -7e4, "value -70000.0 is beyond float16's"),
])
def test_a_same_kind_cast_rounds_but_never_wraps_or_overflows(field, value, says) -> None:
    # same_kind lets float64 round to float16, int64 narrow to int8 - but a value the
    # field's type cannot hold was wrapped (300 -> 44) or made inf (1e6 -> inf) and
    # stored (a hostile test, stop 35)
    with pytest.raises(SpecError, match=f"field '{field}': {re.escape(says)}"):
        SAME_KIND.validate(_kind_batch(**{field: value}))
    got = SAME_KIND.validate(_kind_batch())  # in range: taken, rounded where it must be
    assert got["action"].tolist() == [1, -128, 127] and got["u"].dtype == np.uint8
    assert np.isinf(got["reward"][1]) and np.isnan(got["reward"][2])  # inf, NaN stay
