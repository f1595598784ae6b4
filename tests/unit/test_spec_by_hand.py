"""A ``Spec`` built by hand (``Field``, ``FrameStack``, ``Spec.from_dict``) is held to the
rules of a loaded ``[spec.*]``: whatever the arguments, it is built with a plain ``np.dtype``
and a tuple of positive ``int`` - or refused with a ``SpecError`` naming the field and the
value - never a raw ``TypeError``/``AttributeError`` now, nor a spec that breaks later in
``empty``/``validate``/a shard."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_hpc import SpecError
from conduit_hpc.config.checks import DTYPES
from conduit_hpc.spec import Field, FrameStack, Spec

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

odd = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(), st.text(max_size=4),
                st.sampled_from([np.float32, "float32", "floot", object, "U3", "c8", ">f4",
                                 "M8[s]", [("a", "f4")], ("f4", (2,)), np.dtype("V4")]))
shapes = st.one_of(odd, st.lists(st.one_of(st.integers(-2, 4), st.booleans(), st.floats(0, 3),
                                           st.just(np.int64(2)), st.just(2**40)), max_size=3)
                   .flatmap(lambda xs: st.sampled_from([tuple(xs), list(xs)])))


@FAST
@given(name=st.one_of(st.text(max_size=5), odd), dtype=odd, shape=shapes,
       allow_nan=st.one_of(st.booleans(), odd), cast=st.sampled_from(["safe", "same_kind",
                                                                      "unsafe", None]))
def test_a_field_is_normalised_or_refused_by_name(name: Any, dtype: Any, shape: Any,
                                                   allow_nan: Any, cast: Any) -> None:
    try:
        f = Field(name, dtype, shape, allow_nan, cast)
    except SpecError as err:
        assert "field" in str(err), str(err)
        return
    assert isinstance(f.dtype, np.dtype) and f.dtype.name in DTYPES and f.dtype.isnative
    assert type(f.shape) is tuple and all(type(d) is int and d > 0 for d in f.shape)
    assert isinstance(f.allow_nan, bool)
    spec = Spec([f])
    assert spec.validate(spec.empty(2))[f.name].shape == (2, *f.shape)


@pytest.mark.parametrize(("make", "match"), [
    (lambda: Field(3, np.dtype("f4")), "field name .* got 3"),
    (lambda: Field("obs", np.dtype("f4"), (-1,)), r"'obs': shape .* got \(-1,\)"),
    (lambda: Field("obs", np.dtype("f4"), (0,)), r"'obs': shape .* got \(0,\)"),
    (lambda: Field("obs", np.dtype("f4"), 3), "'obs': shape .* got 3"),
    (lambda: Field("obs", np.dtype("f4"), (2**20, 2**20)), r"'obs': shape .* bytes per row"),
    (lambda: Field("obs", np.dtype(object)), "'obs': dtype must be one of bool"),
    (lambda: Field("obs", ">f4"), r"'obs': dtype .*native byte order.*>f4"),
    (lambda: Field("obs", "floot"), "'obs': dtype .* got 'floot'"),
    (lambda: Field("obs", "f4", cast="unsafe"), "'obs': cast .* got 'unsafe'"),
    (lambda: Spec("obs"), "list or tuple of Field, got str"),
    (lambda: Spec([("obs", "f4", ())]), r"fields\[0\] must be a Field, got tuple"),
    (lambda: Spec.from_dict({"obs": ("f4",)}), r"'obs': expected a \(dtype, shape\) pair"),
    (lambda: Spec([Field("a", "f4")], stacks={"a": 3}), "stack 'a' must be a FrameStack"),
    (lambda: Spec([Field("a", "u1", (2**16, 2**15)), Field("b", "u1", (2**16, 2**15)),
                   Field("c", "u1", (2,))]), "spec rows take 4294967298 bytes"),
])
def test_each_bad_argument_is_named(make: Any, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        make()


def test_hand_written_dtypes_and_shapes_are_normalised() -> None:
    a = Spec([Field("obs", np.float32, [np.int64(3)]), Field("r", "float32")])
    b = Spec.from_dict({"obs": ("float32", (3,)), "r": (np.dtype("f4"), ())})
    assert a == b and a["obs"].shape == (3,) and type(a["obs"].shape[0]) is int


def stacked(*extra: Field) -> list[Field]:
    return [Field("obs", "u1", (4, 2)), Field("n", "u1", (4, 2)), Field("s", "i8"), *extra]


@pytest.mark.parametrize(("fields", "stacks", "match"), [
    (stacked(), {"obs": FrameStack("obs", "s", 0, 4, (2,), "obs")},
     "next field 'obs' must be another spec field"),
    (stacked(), {"obs": FrameStack("obs", "s", 0, 4, (2,), "n"),
                 "n": FrameStack("n", "s", 0, 4, (2,))}, "'n' is declared a stack itself"),
    (stacked(Field("o2", "u1", (4, 2))), {"obs": FrameStack("obs", "s", 0, 4, (2,), "n"),
                                           "o2": FrameStack("o2", "s", 0, 4, (2,), "n")},
     "next field 'n' already follows 'obs'"),
    (stacked(), {"obs": FrameStack("obs", "s", True, 2, (4,))}, "axis and depth must be"),
])
def test_stacks_that_do_not_fit_are_refused(fields: list[Field], stacks: Any,
                                            match: str) -> None:
    with pytest.raises(SpecError, match=match):
        Spec(fields, stacks)
