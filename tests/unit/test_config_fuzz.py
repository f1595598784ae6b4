"""Fuzzing the loader: whatever the file, the value or the override, loading either
succeeds or raises ConfigError - never another exception (which would reach a rank as a
traceback, or worse, pass and break it later)."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import typing
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_hpc import Config, ConfigError
from conduit_hpc.spec import Spec

FUZZ = settings(deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def known_keys() -> dict[str, Any]:
    """Dotted keys of every field of Config (spec fields as ``spec.obs.*``): their types."""
    out: dict[str, Any] = {}
    for sec in dataclasses.fields(Config):
        tp = typing.get_type_hints(Config)[sec.name]
        if sec.name == "spec":
            tp, prefix = typing.get_args(tp)[1], "spec.obs"
        else:
            prefix = sec.name
        hints = typing.get_type_hints(tp)
        out.update({f"{prefix}.{f.name}": hints[f.name] for f in dataclasses.fields(tp)})
    return out


TYPES = known_keys()
KEYS = sorted(TYPES)
INT64 = 2**63 - 1
scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-INT64 - 1, max_value=INT64),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2, 2**31, 2**40, 2**62, INT64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["edp", "sync", "service", "prioritized", "uniform", "sequence",
                     "float32", "int64", "uint8", "auto", "owner", "global", "forward",
                     "edge_replay", "static", "learner_gpu", "buffer_host", "obs"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)


def typed(tp: Any) -> st.SearchStrategy[Any]:
    """Values of the field's own type, often in range: loads get past the type checks."""
    if typing.get_origin(tp) is typing.Literal:
        return st.sampled_from(typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return st.lists(typed(typing.get_args(tp)[0]), max_size=4)
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.one_of(st.integers(min_value=-2, max_value=5000),
                         st.sampled_from([2**31, 2**40, 2**40 + 1, 2**62, INT64]))
    if tp is float:
        return st.one_of(st.floats(min_value=-1.0, max_value=1e4),
                         st.sampled_from([0.0, 1e-9, 1e7, 1e300, math.inf, math.nan]))
    if tp is str:
        return st.sampled_from(["", "obs", "float32", "learner_gpu", "buffer_host", "x y",
                                "checkpoints"])
    return values


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def check_loaded(cfg: Config) -> None:
    """What a rank does first with a config that loaded: it must not fail."""
    cfg.digest()
    if cfg.spec:
        spec = Spec.from_config(cfg.spec)
        assert spec.row_bytes * cfg.storage.capacity_rows < 2**63
    for f in cfg.spec.values():
        assert math.prod(f.shape) < 2**63


def load_text(text: str | bytes, overrides: list[str] | None = None) -> Config | None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "fuzz.toml"
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
        try:
            cfg = Config.from_toml(p, overrides or [])
        except ConfigError as err:
            assert isinstance(err.key, str)
            return None
    check_loaded(cfg)
    return cfg


BASE = {"spec": {"obs": {"dtype": "float32", "shape": [4]}},
        "storage": {"capacity_rows": 1000}}


@FUZZ
@given(st.lists(st.sampled_from(KEYS).flatmap(
    lambda k: st.tuples(st.just(k), st.one_of(typed(TYPES[k]), typed(TYPES[k]), values))),
    min_size=1, max_size=4))
def test_random_values_for_known_keys(pairs: list[tuple[str, Any]]) -> None:
    raw: dict[str, Any] = {k: dict(v) for k, v in BASE.items()}
    raw["spec"] = {"obs": dict(BASE["spec"]["obs"])}
    for key, value in pairs:
        set_dotted(raw, key, value)
    try:
        cfg = Config.from_dict(raw)
    except ConfigError as err:
        # the key names a section the document has, or - when a default of a section it
        # does not have conflicts with what it set - the message names what it set
        top = err.key.split(".")[0].split("[")[0]
        assert (err.key == "" or top in raw
                or any(f"{k}." in str(err) for k in raw)), (err.key, str(err), raw)
        return
    check_loaded(cfg)


documents = st.dictionaries(
    st.sampled_from(["run", "layout", "spec", "storage", "scheduler", "transport",
                     "placement", "checkpoint", "longhaul", "extra", "x"]),
    st.dictionaries(st.sampled_from([k.split(".")[-1] for k in KEYS] + ["obs", "bogus"]),
                    values, max_size=4),
    max_size=5)


@FUZZ
@given(documents)
def test_random_toml_documents(doc: dict[str, Any]) -> None:
    try:
        text = tomli_w.dumps(doc)
    except (TypeError, ValueError):  # nothing TOML can say (tomli-w refuses it)
        return
    load_text(text)


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_files(blob: bytes) -> None:
    load_text(blob)


def literal(value: Any) -> str:
    """``value`` as a TOML literal (what a user types after ``--set key=``)."""
    try:
        return tomli_w.dumps({"v": value}).partition("=")[2].strip()
    except (TypeError, ValueError):
        return str(value)


overrides = st.one_of(
    st.tuples(st.one_of(st.sampled_from(KEYS), st.text(max_size=20)), st.text(max_size=20)),
    st.sampled_from(KEYS).flatmap(
        lambda k: st.tuples(st.just(k), typed(TYPES[k]).map(literal))))


@FUZZ
@given(st.lists(overrides, max_size=3))
def test_random_overrides(pairs: list[tuple[str, str]]) -> None:
    load_text(tomli_w.dumps(BASE), [f"{k}={v}" for k, v in pairs])
