"""The naming rule between TensorDict keys and spec fields (no MPI; torch only for the
TensorDict checks, which need the [torchrl] extra - see tests/extras.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_hpc.errors import SpecError
from conduit_hpc.integrations.keymap import SEPARATOR, field_name, key_of, normalise_key

# parts the rule takes: identifiers without "__" that do not end with "_" ("_x" is fine)
PART = st.from_regex(r"\A_?[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)*\Z")
KEY = st.one_of(PART, st.lists(PART, min_size=2, max_size=4).map(tuple))


@given(KEY)
def test_every_key_round_trips_through_its_field_name(key) -> None:
    name = field_name(key)
    assert name.isidentifier()
    assert key_of(name) == key


@given(st.lists(KEY, min_size=2, max_size=6, unique=True))
def test_distinct_keys_get_distinct_fields(keys) -> None:
    names = [field_name(k) for k in keys]
    assert len(set(names)) == len(names)


def test_examples() -> None:
    assert field_name(("next", "observation")) == "next__observation"
    assert field_name(("observation",)) == "observation"
    assert key_of("next__observation") == ("next", "observation")
    assert key_of("observation") == "observation"
    assert field_name(("next", "_private")) == "next___private"
    assert key_of("next___private") == ("next", "_private")
    assert normalise_key(("a",)) == "a"


@pytest.mark.parametrize("key, part", [
    (("a", "b_"), "b_"),          # would run into the separator
    (("a__b",), "a__b"),          # holds the separator
    (("next", "1obs"), "1obs"),   # not an identifier
    ("with space", "with space"),
    (("a", ""), ""),
])
def test_keys_that_break_the_rule_are_refused_naming_the_part(key, part) -> None:
    with pytest.raises(SpecError, match="part") as err:
        field_name(key)
    assert repr(part) in str(err.value)


@pytest.mark.parametrize("key", [(), 3, ("a", 3), b"x"])
def test_keys_that_are_no_keys_are_refused(key) -> None:
    with pytest.raises(SpecError, match="must be a string"):
        field_name(key)


@pytest.mark.parametrize("name", ["a___", "_", "x____y", f"a{SEPARATOR}", "a_"])
def test_fields_that_name_no_key_are_refused(name) -> None:
    with pytest.raises(SpecError, match="names no TensorDict key"):
        key_of(name)


# -------------------------------------------------------------------------------------
# TensorDicts against a spec (the buffer's check, without a data plane)

torch = pytest.importorskip("torch")


def _tensordict_or_skip():
    from extras import need_torchrl

    need_torchrl()
    from tensordict import TensorDict

    return TensorDict


DTYPES = ["float32", "float64", "int64", "int32", "uint8", "bool", "float16", "int8"]


@given(st.lists(st.tuples(KEY, st.sampled_from(DTYPES),
                          st.lists(st.integers(1, 3), max_size=2).map(tuple)),
                min_size=1, max_size=5, unique_by=lambda t: field_name(t[0]))
       .filter(lambda fs: _prefix_free([f[0] for f in fs])),
       st.integers(1, 4))
@settings(max_examples=40)
def test_tensordict_rows_come_back_as_the_same_entries(fields, rows) -> None:
    """TensorDict -> spec columns -> TensorDict is the identity (keys, dtypes, shapes,
    values), whatever the nesting."""
    TensorDict = _tensordict_or_skip()
    from conduit_hpc.integrations.torchrl import TensorDictColumns
    from conduit_hpc.spec import Field, Spec

    rng = np.random.default_rng(0)
    data = {}
    for key, dt, shape in fields:
        a = rng.integers(0, 2, (rows, *shape)) if dt == "bool" else rng.random((rows, *shape)) * 100
        data[key] = torch.from_numpy(np.asarray(a).astype(dt))
    td = TensorDict(data, batch_size=[rows])
    spec = Spec([Field(field_name(k), np.dtype(dt), shape) for k, dt, shape in fields])
    cols = TensorDictColumns(spec).columns(td)
    back = TensorDictColumns(spec).tensordict({n: torch.from_numpy(v) for n, v in cols.items()})
    for key, _dt, shape in fields:
        got = back.get(key)
        assert got.dtype == data[key].dtype and tuple(got.shape) == (rows, *shape)
        assert torch.equal(got, data[key])


def _prefix_free(keys) -> bool:
    """No key is a prefix of another (a TensorDict cannot hold both ``a`` and
    ``("a", "b")`` as leaves)."""
    tup = [(k,) if isinstance(k, str) else k for k in keys]
    return not any(a != b and b[:len(a)] == a for a in tup for b in tup)


def _spec():
    from conduit_hpc.spec import Field, Spec

    return Spec([Field("observation", np.dtype("float32"), (4,)),
                 Field("next__reward", np.dtype("float32"), (1,)),
                 Field("next__done", np.dtype("bool"), (1,))])


def _good(rows=3):
    TensorDict = _tensordict_or_skip()
    return TensorDict({"observation": torch.zeros(rows, 4),
                       ("next", "reward"): torch.ones(rows, 1),
                       ("next", "done"): torch.zeros(rows, 1, dtype=torch.bool)},
                      batch_size=[rows])


@pytest.mark.parametrize("change, match", [
    (lambda td: td.set(("next", "extra"), torch.zeros(3)),
     r"key \('next', 'extra'\) \(spec field 'next__extra'\) is not in the spec"),
    (lambda td: td.exclude(("next", "done")),
     r"no key \('next', 'done'\) \(spec field 'next__done'\)"),
    (lambda td: td.set("observation", torch.zeros(3, 4, dtype=torch.float64)),
     r"'observation' \(spec field 'observation'\): dtype float64, the spec has float32"),
    (lambda td: td.set("observation", torch.zeros(3, 5)),
     r"'observation' \(spec field 'observation'\): per-row shape \(5,\), the spec has \(4,\)"),
    (lambda td: td.set(("next", "reward"), torch.ones(3)),
     r"'next', 'reward'\) \(spec field 'next__reward'\): per-row shape \(\), the spec"),
    (lambda td: td.set(("next", "bad_"), torch.ones(3)), r"part 'bad_' ends with '_'"),
])
def test_mismatched_tensordicts_are_refused_naming_key_and_field(change, match) -> None:
    from conduit_hpc.integrations.torchrl import TensorDictColumns

    td = _good()
    out = change(td)
    td = td if out is None else out
    with pytest.raises(SpecError, match=match):
        TensorDictColumns(_spec()).columns(td)


def test_excluded_and_reserved_keys_are_not_stored_and_batch_dims_flatten() -> None:
    from conduit_hpc.integrations.torchrl import TensorDictColumns

    td = _good(6).reshape(2, 3)
    td.set(("collector", "traj_ids"), torch.zeros(2, 3, dtype=torch.int64))
    td.set("index", torch.zeros(2, 3, dtype=torch.int64))
    td.set("td_error", torch.zeros(2, 3))
    cols = TensorDictColumns(_spec(), exclude_keys=[("collector", "traj_ids")],
                             skip=["index", "td_error"]).columns(td)
    assert sorted(cols) == ["next__done", "next__reward", "observation"]
    assert cols["observation"].shape == (6, 4)
    with pytest.raises(SpecError, match="traj_ids"):
        TensorDictColumns(_spec(), skip=["index", "td_error"]).columns(td)


def test_excluding_a_node_excludes_its_entries_and_a_string_is_refused() -> None:
    """exclude_keys=["collector"] (as TensorDict.exclude("collector") drops the node) was
    refused at every extend with "... ('collector', 'traj_ids') is not in the spec; ...
    pass it in exclude_keys" - which the caller had done; exclude_keys="collector" was
    taken letter by letter and gave the same error. Now a node's key excludes every entry
    under it, and a bare string is refused up front naming exclude_keys."""
    from conduit_hpc.errors import ConfigError
    from conduit_hpc.integrations.torchrl import TensorDictColumns, spec_tables

    td = _good()
    td.set(("collector", "traj_ids"), torch.zeros(3, dtype=torch.int64))
    td.set(("collector", "mask"), torch.ones(3, dtype=torch.bool))
    for exclude in (["collector"], [("collector",)], ("collector", "x")):
        cols = TensorDictColumns(_spec(), exclude_keys=exclude).columns(td)
        assert sorted(cols) == ["next__done", "next__reward", "observation"]
    assert "collector" not in spec_tables(td, exclude_keys=["collector"])
    with pytest.raises(ConfigError, match=r"exclude_keys must be a collection of TensorDict "
                                          r"keys .*got the string 'collector'"):
        TensorDictColumns(_spec(), exclude_keys="collector")
    with pytest.raises(ConfigError, match=r"exclude_keys must be a collection"):
        spec_tables(td, exclude_keys="collector")


@pytest.mark.parametrize("key", ["info", ("next", "info")])
def test_a_non_tensor_entry_is_refused_naming_it_unless_excluded(key) -> None:
    """A NonTensorData entry (``td.set_non_tensor("info", "a string")``, what some envs'
    info dicts become) was dropped without a word: TensorDict's default leaves skip
    non-tensors, so the entry neither matched a field nor was refused. Now it is an
    entry like any other: a SpecError naming the key, or left out with exclude_keys."""
    from conduit_hpc.integrations.torchrl import TensorDictColumns

    td = _good()
    td.set_non_tensor(key, "a string")
    with pytest.raises(SpecError, match=rf"TensorDict key {re.escape(repr(key))} holds a "
                                        rf"NonTensorData, not a tensor"):
        TensorDictColumns(_spec()).columns(td)
    cols = TensorDictColumns(_spec(), exclude_keys=[key]).columns(td)
    assert sorted(cols) == ["next__done", "next__reward", "observation"]


def test_spec_tables_give_the_spec_a_collector_batch_needs() -> None:
    import tomllib

    from conduit_hpc.integrations.torchrl import TensorDictColumns, spec_tables
    from conduit_hpc.spec import Spec

    td = _good(5)
    td.set(("collector", "traj_ids"), torch.zeros(5, dtype=torch.int64))
    parsed = tomllib.loads(spec_tables(td, exclude_keys=[("collector", "traj_ids")]))["spec"]
    assert parsed == {"observation": {"dtype": "float32", "shape": [4]},
                      "next__reward": {"dtype": "float32", "shape": [1]},
                      "next__done": {"dtype": "bool", "shape": [1]}}
    spec = Spec.from_dict({n: (f["dtype"], tuple(f["shape"])) for n, f in parsed.items()})
    cols = TensorDictColumns(spec, exclude_keys=[("collector", "traj_ids")]).columns(td)
    assert cols["next__done"].dtype == np.bool_



@pytest.mark.parametrize(("exclude", "skip", "match"), [
    (["observation"], (), r"exclude_keys holds 'observation', which is the spec field "
                          r"'observation'"),
    ([("next", "done")], (), r"exclude_keys holds \('next', 'done'\)"),
    (["next"], (), r"exclude_keys holds 'next', which holds \('next', 'reward'\), which "
                   r"is the spec field 'next__reward'"),
    ((), ["index", "observation"], r"spec field 'observation' is the TensorDict key "
                                   r"'observation', which the buffer keeps for itself"),
])
def test_a_spec_field_that_could_never_be_filled_is_refused_up_front(exclude, skip,
                                                                     match) -> None:
    """A spec field whose key is excluded, or is one of the buffer's own keys (``index``,
    ``priority_weight``, the priority key), is never stored: every extend() failed with
    'TensorDict has no key ...' although it had one. Refused when the buffer is built,
    naming the field."""
    from conduit_hpc.errors import ConfigError
    from conduit_hpc.integrations.torchrl import TensorDictColumns

    with pytest.raises(ConfigError, match=match):
        TensorDictColumns(_spec(), exclude_keys=exclude, skip=skip)


def test_meta_sparse_and_complex_entries_get_the_spec_rule_not_a_torch_error() -> None:
    """An entry on the meta device was a NotImplementedError ('Cannot copy out of meta
    tensor') and a sparse one a TypeError from ``.numpy()``; ``spec_tables`` wrote
    ``dtype = "complex64"``, which no spec loads. Now: SpecError naming the key, the
    sparse entry's values, and complex refused like any dtype a field cannot have."""
    from conduit_hpc.integrations.torchrl import TensorDictColumns, spec_tables

    td = _good()
    td.set("observation", torch.zeros(3, 4, device="meta"))
    with pytest.raises(SpecError, match=r"key 'observation' \(spec field 'observation'\): "
                                        r"a tensor on the meta device"):
        TensorDictColumns(_spec()).columns(td)
    td = _good()
    dense = td.get("observation").clone()
    td.set("observation", dense.to_sparse())
    np.testing.assert_array_equal(TensorDictColumns(_spec()).columns(td)["observation"],
                                  dense.numpy())
    td = _good()
    td.set("z", torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(SpecError, match=r"key 'z': dtype torch.complex64 has no numpy"):
        spec_tables(td)


@pytest.mark.parametrize("names", [("next", "next__obs"), ("a__b__c", "a__b", "x"),
                                   ("a__b", "a__b__c__d")])
def test_a_field_whose_key_holds_another_fields_key_is_refused(names) -> None:
    """``next`` and ``next__obs``: a TensorDict entry is a tensor or holds nested entries,
    never both, so no TensorDict had both keys (every extend() said one was missing) and
    building a sampled TensorDict raised tensordict's KeyError. Refused up front."""
    _tensordict_or_skip()
    from conduit_hpc.errors import ConfigError
    from conduit_hpc.integrations.torchrl import TensorDictColumns
    from conduit_hpc.spec import Field, Spec

    spec = Spec([Field(n, np.dtype("float32"), ()) for n in names])
    with pytest.raises(ConfigError, match=r"an entry is a tensor or holds nested entries"):
        TensorDictColumns(spec)


def test_a_lazy_stack_of_rows_of_different_shapes_is_a_spec_error_naming_the_key() -> None:
    """Was tensordict's RuntimeError ('Failed to stack tensors within a tensordict')."""
    TensorDict = _tensordict_or_skip()
    from tensordict import LazyStackedTensorDict

    from conduit_hpc.integrations.torchrl import TensorDictColumns

    rows = [TensorDict({"observation": torch.zeros(n)}, []) for n in (4, 3)]
    with pytest.raises(SpecError, match=r"key 'observation': its rows cannot be stacked"):
        TensorDictColumns(_spec()).columns(LazyStackedTensorDict.lazy_stack(rows, 0))


@pytest.mark.parametrize("data, match", [
    ({"obs": (3, 2)}, "'next__obs' is missing"),  # KeyError
    ({}, "'obs' is missing"),  # StopIteration
    ({"obs": (3, 2), "next__obs": (2, 2), "action": (3,)},
     r"column 'next__obs' has shape \(2, 2\); every column must have the 3 rows"),
    ({"obs": (3, 2), "next__obs": (3, 2), "action": ()}, r"column 'action' has shape \(\)"),
])
def test_columns_that_make_no_tensordict_are_refused_naming_the_field(data, match) -> None:
    _tensordict_or_skip()
    from conduit_hpc.integrations.columns import TensorDictColumns
    from conduit_hpc.spec import Spec

    spec = Spec.from_dict({"obs": ("float32", (2,)), "next__obs": ("float32", (2,)),
                           "action": ("int64", ())})
    with pytest.raises(SpecError, match=match):
        TensorDictColumns(spec).tensordict({k: torch.zeros(v) for k, v in data.items()})


def test_no_collection_of_keys_and_no_tensordict_are_refused_naming_the_argument() -> None:
    _tensordict_or_skip()
    from conduit_hpc.errors import ConfigError
    from conduit_hpc.integrations.columns import TensorDictColumns, spec_tables
    from conduit_hpc.spec import Spec

    spec = Spec.from_dict({"obs": ("float32", (2,))})
    for arg in ("exclude_keys", "skip"):
        with pytest.raises(ConfigError, match=f"{arg} must be a collection of TensorDict "
                                              f"keys.*got None"):  # a bare TypeError
            TensorDictColumns(spec, **{arg: None})
    with pytest.raises(SpecError, match=r"spec_tables takes a TensorDict.*got dict"):
        spec_tables({"obs": torch.zeros(2, 2)})  # AttributeError


def test_names_that_are_no_collection_of_strings_are_refused() -> None:
    from conduit_hpc.integrations.keymap import keys_of

    with pytest.raises(SpecError, match="got the string 'obs'"):
        keys_of("obs")  # was {"o": "o", "b": "b", "s": "s"}
    with pytest.raises(SpecError, match="spec field name must be a string, got 3"):
        key_of(3)  # AttributeError
    assert keys_of(["obs", "next__obs"]) == {"obs": "obs", "next__obs": ("next", "obs")}
