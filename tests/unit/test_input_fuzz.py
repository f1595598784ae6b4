"""What ``ingest`` and ``update_priorities`` accept, fuzzed: a ``SpecError`` naming the
input, or correct handling - never another exception, a silent lossy conversion."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conduit_hpc.config import FieldConfig
from conduit_hpc.errors import SpecError
from conduit_hpc.sampling import check_update
from conduit_hpc.spec import Field, Spec, as_array
from conduit_hpc.storage.priority import check_priorities

SPEC = Spec([Field("obs", np.dtype(np.float32), (3,)), Field("action", np.dtype(np.int64)),
             Field("done", np.dtype(np.bool_))])
SETTINGS = settings(deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

DTYPES = [np.bool_, np.int8, np.int32, np.int64, np.uint8, np.uint64, np.float16, np.float32,
          np.float64, np.complex64]
TORCH_DTYPES = [torch.bool, torch.int8, torch.int32, torch.int64, torch.uint8, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex64]


def odd_values() -> st.SearchStrategy[Any]:
    """Things users hand in by mistake."""
    return st.one_of(
        st.none(), st.integers(), st.floats(allow_nan=True), st.text(max_size=5),
        st.binary(max_size=5), st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
        st.lists(st.lists(st.integers(), max_size=4), max_size=4),  # often ragged
        st.lists(st.one_of(st.integers(), st.text(max_size=2)), max_size=4),
        st.sets(st.integers(), max_size=3),
        st.builds(lambda n, c: np.full(n, c), st.integers(0, 4), st.just(1 + 2j)),
        st.builds(lambda n: np.array(["a"] * n), st.integers(0, 4)),
        st.builds(lambda n: np.empty(n, dtype=object), st.integers(0, 4)),
    )


def arrays(rows: int, shape: tuple[int, ...]) -> st.SearchStrategy[Any]:
    np_arrays = st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(
        dt, st.one_of(st.just((rows, *shape)), hnp.array_shapes(max_dims=3, max_side=4))))
    torch_tensors = st.tuples(st.sampled_from(TORCH_DTYPES), st.booleans()).map(
        lambda a: _tensor((rows, *shape), *a))
    return st.one_of(np_arrays, torch_tensors, np_arrays.map(lambda a: a.tolist()),
                     odd_values())


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, grad: bool) -> torch.Tensor:
    t = torch.zeros(shape, dtype=torch.float32).to(dtype)
    if grad and (dtype.is_floating_point or dtype.is_complex):
        t.requires_grad_(True)
    return t


@SETTINGS
@given(st.integers(0, 4).flatmap(lambda n: st.fixed_dictionaries(
    {"obs": arrays(n, (3,)), "action": arrays(n, ()), "done": arrays(n, ())})))
def test_validate_takes_or_refuses_by_name(batch: dict[str, Any]) -> None:
    try:
        out = SPEC.validate(batch)
    except SpecError as err:
        assert "field" in str(err) or "batch" in str(err), str(err)
        return
    rows = len(out["obs"])
    for f in SPEC:
        arr = out[f.name]
        assert arr.dtype == f.dtype and arr.shape == (rows, *f.shape)
        assert arr.flags.c_contiguous
        src = as_array(batch[f.name], f.name)
        if src.size == 0 and not hasattr(batch[f.name], "dtype"):
            assert rows == 0  # [] (a list with no dtype of its own): zero rows
            continue
        # only casts that lose nothing
        assert np.can_cast(src.dtype, f.dtype, "safe")
        assert np.array_equal(arr, src.astype(f.dtype), equal_nan=True)


@SETTINGS
@given(st.one_of(arrays(5, ()), st.lists(st.floats(allow_nan=True), max_size=6)))
def test_priorities_are_real_finite_and_non_negative_or_refused(value: Any) -> None:
    try:
        p = check_priorities(value)
    except SpecError as err:
        assert "priorities" in str(err)
        return
    assert p.dtype == np.float64 and p.ndim == 1
    assert np.isfinite(p).all() and (p >= 0).all()
    src = as_array(value, "x")
    assert src.dtype.kind != "c"  # complex is refused, never cut to its real part


@SETTINGS
@given(st.one_of(arrays(3, (3,)), st.builds(
    lambda s, sl, g: np.array([[s, sl, g]] * 3), st.integers(-2, 3), st.integers(-5, 20),
    st.integers(-1, 5))), st.one_of(arrays(3, ()), st.just([1.0, 2.0, 3.0])))
def test_update_checks_take_or_refuse_by_name(indices: Any, priorities: Any) -> None:
    try:
        idx, p = check_update(indices, priorities, {0: 16, 1: 8})
    except SpecError as err:
        assert "indices" in str(err) or "priorities" in str(err), str(err)
        return
    assert idx.dtype == np.int64 and idx.shape == (len(p), 3)
    for sid, slot, _ in idx:
        assert 0 <= slot < {0: 16, 1: 8}[int(sid)]


def test_torch_inputs_follow_the_rule() -> None:
    obs = torch.ones(2, 3, requires_grad=True)
    out = SPEC.validate({"obs": obs, "action": torch.tensor([1, 2]),
                         "done": torch.tensor([True, False])})
    assert out["obs"].dtype == np.float32 and out["obs"].sum() == 6
    bf = SPEC.validate({"obs": torch.ones(2, 3, dtype=torch.bfloat16),
                        "action": [1, 2], "done": [False, True]})
    assert bf["obs"].dtype == np.float32
    with pytest.raises(SpecError, match=r"field .action.*float32"):
        SPEC.validate({"obs": obs, "action": torch.ones(2), "done": [True, False]})
    with pytest.raises(SpecError, match="complex"):
        check_priorities(torch.ones(3, dtype=torch.complex64))
    with pytest.raises(SpecError, match="priorities must be an array of numbers, got a dict"):
        check_priorities({"a": 1.0})
    with pytest.raises(SpecError, match="field 'obs' must be a rectangular array"):
        SPEC.validate({"obs": [[1, 2, 3], [1]], "action": [1, 2], "done": [False, True]})


def test_same_kind_cast_takes_gymnasium_rewards() -> None:
    fc = FieldConfig(dtype="float32", cast="same_kind")
    spec = Spec.from_config({"reward": fc})
    out = spec.validate({"reward": np.array([1.0, 0.5], dtype=np.float64)})
    assert out["reward"].dtype == np.float32
    strict = Spec.from_config({"reward": FieldConfig(dtype="float32")})
    with pytest.raises(SpecError, match=r'cast = "same_kind" in \[spec.reward\]'):
        strict.validate({"reward": np.array([1.0], dtype=np.float64)})
    with pytest.raises(SpecError, match="within its kind"):
        spec.validate({"reward": np.array([1 + 1j])})
