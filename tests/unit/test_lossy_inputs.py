"""Array-likes that carry more than their values (issue 23, item 2): taken when the
conversion loses nothing, refused with a SpecError naming the field otherwise."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conduit_hpc.errors import SpecError
from conduit_hpc.spec import Field, Spec, as_array
from conduit_hpc.storage.priority import check_priorities

try:  # pandas comes with the rllib extra only
    import pandas as pd
except ImportError:  # pragma: no cover - depends on the extras installed
    pd = None

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
REWARD = Spec([Field("reward", np.dtype(np.float64))])


def test_the_reported_case_a_masked_reward_with_nan_under_the_mask() -> None:
    r = np.array([1.0, np.nan, 0.5])
    with pytest.raises(SpecError, match=r"field 'reward': a masked array with 1 masked "
                                        r"element\(s\) \(first at index \(1,\)\)"):
        REWARD.validate({"reward": np.ma.masked_invalid(r)})
    with pytest.raises(SpecError, match="priorities: a masked array"):
        check_priorities(np.ma.masked_invalid(r))


@SETTINGS
@given(hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=5)),
       st.data())
def test_a_masked_array_is_taken_iff_nothing_is_masked(data: np.ndarray, draw: Any) -> None:
    mask = draw.draw(hnp.arrays(np.bool_, data.shape))
    value = np.ma.masked_array(data, mask=mask)
    for v in (value, [value], list(value) if value.ndim else [value]):
        try:
            out = as_array(v, "field 'x'")
        except SpecError as err:
            assert mask.any() and "field 'x'" in str(err) and "masked" in str(err)
            continue
        assert not mask.any()
        assert type(out) is np.ndarray
        assert np.array_equal(out.reshape(-1), data.reshape(-1), equal_nan=True)


@SETTINGS
@given(hnp.arrays(np.complex64, hnp.array_shapes(max_dims=2, max_side=4),
                  elements=st.complex_numbers(max_magnitude=1e3, width=64)),
       st.booleans(), st.booleans(), st.booleans())
def test_tensor_views_and_layouts_give_their_values(data: np.ndarray, conj: bool, neg: bool,
                                                   sparse: bool) -> None:
    """Conjugate and negative bits resolved, sparse made dense: exactly the values."""
    t = torch.from_numpy(data.copy())
    want = data.copy()
    if conj:
        t, want = t.conj(), np.conj(want)
    if neg:
        t, want = torch._neg_view(t), -want
    if sparse and t.ndim:
        t = t.resolve_conj().resolve_neg().to_sparse()
    assert np.array_equal(as_array(t, "field 'x'"), want)


@pytest.mark.parametrize(("make", "want"), [
    (lambda: np.matrix([[1.0, 2.0]]), [[1.0, 2.0]]),
    (lambda: np.ma.masked_array([1.0, 2.0]), [1.0, 2.0]),
    (lambda: memoryview(np.arange(3.0)), [0.0, 1.0, 2.0]),
    (lambda: pd.Series([1.0, np.nan]), [1.0, np.nan]),  # NaN in a numpy float: a value
    (lambda: pd.Series([1, 2], dtype="Int64"), [1, 2]),
    (lambda: pd.Series(pd.Categorical([1, 2, 1])), [1, 2, 1]),
    (lambda: pd.arrays.SparseArray([0.0, 1.0]), [0.0, 1.0]),
    (lambda: pd.DataFrame({"a": [1.0], "b": [2.0]}), [[1.0, 2.0]]),
    (lambda: torch.ones(2, dtype=torch.float8_e4m3fn), [1.0, 1.0]),
    (lambda: torch.eye(2).to_sparse_csr(), [[1.0, 0.0], [0.0, 1.0]]),
    (lambda: [torch.tensor(1.0, requires_grad=True), torch.tensor(2.0)], [1.0, 2.0]),
])
def test_lossless_conversions_are_taken(make: Any, want: list[Any]) -> None:
    value = _pandas_or_skip(make)
    out = as_array(value, "field 'x'")
    assert type(out) is np.ndarray
    assert np.array_equal(out, np.asarray(want, dtype=out.dtype), equal_nan=True)


def _pandas_or_skip(make: Any) -> Any:
    try:
        return make()
    except AttributeError:  # pd is None
        if pd is None:
            pytest.skip("pandas is not installed")
        raise


def _nested() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])


@pytest.mark.parametrize(("make", "match"), [
    (lambda: [1.0, np.ma.masked], "field 'x' element 1: a masked array"),
    (lambda: np.arange(3.0).view(np.recarray), "ndarray subclass recarray"),
    (lambda: pd.Series([1.0, 2.0], index=[5, 3]), "expected the default index 0..n-1"),
    (lambda: pd.Series([1, None], dtype="Int64"), r"missing values \(NA\) of dtype Int64"),
    (lambda: pd.Series(pd.Categorical([1, None])), "missing values"),
    (lambda: pd.DataFrame({"a": [1.0], "b": [2**60]}), "columns of dtypes"),
    (lambda: pd.Series(pd.to_datetime(["2020-01-01"])), "must hold numbers.*Series"),
    (lambda: torch.quantize_per_tensor(torch.tensor([1.0]), 0.1, 0, torch.quint8),
     "quantized tensor"),
    (_nested, "nested"),
    (lambda: torch.empty(2, device="meta"), "meta device"),
    (lambda: np.zeros(2, dtype=[("a", "f4")]), "must hold numbers"),
    (lambda: np.array([1], dtype="m8[s]"), "must hold numbers"),
])
def test_lossy_conversions_are_refused_naming_the_field(make: Any, match: str) -> None:
    value = _pandas_or_skip(make)
    with pytest.raises(SpecError, match=match) as info:
        as_array(value, "field 'x'")
    assert "field 'x'" in str(info.value)
