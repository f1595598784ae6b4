"""The frame-stack declaration of ``[spec]`` (``stack = {axis, stream}``, ``next_of``):
accepted as designed, every refusal a ConfigError naming the key, the plain layout the
default, and a hypothesis fuzz of random declarations against an independent statement
of the rules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit_hpc import Config, ConfigError
from conduit_hpc.config import FieldConfig, StackConfig, tomllib
from conduit_hpc.spec import FrameStack, frame_stacks

ATARI: dict[str, Any] = {
    "obs": {"dtype": "uint8", "shape": [4, 84, 84], "stack": {"axis": 0, "stream": "env"}},
    "next_obs": {"dtype": "uint8", "shape": [4, 84, 84], "next_of": "obs"},
    "action": {"dtype": "int64"},
    "env": {"dtype": "int64"},
}


def load(spec: dict[str, Any]) -> Config:
    return Config.from_dict({"spec": spec})


def test_the_atari_declaration_loads_and_resolves() -> None:
    cfg = load(ATARI)
    assert cfg.spec["obs"].stack == StackConfig(stream="env", axis=0)
    assert frame_stacks(cfg.spec) == {
        "obs": FrameStack("obs", "env", 0, 4, (84, 84), "next_obs")}
    # it survives the round trip through the resolved config (RUN_DIR/config.toml)
    assert Config.from_dict(cfg.to_dict()) == cfg


def test_stacks_are_off_by_default_the_plain_layout() -> None:
    fc = FieldConfig(dtype="uint8", shape=(4, 84, 84))
    assert not fc.stack.enabled and fc.next_of == ""
    assert frame_stacks(load({"obs": {"dtype": "uint8", "shape": [4, 84, 84]}}).spec) == {}


def test_a_declaration_in_a_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[spec.obs]\ndtype = "uint8"\nshape = [2, 3, 84, 84]\n'
                    'stack = { axis = 1, stream = "sid" }\n'
                    '[spec.next_obs]\ndtype = "uint8"\nshape = [2, 3, 84, 84]\n'
                    'next_of = "obs"\n[spec.sid]\ndtype = "uint32"\n')
    stacks = frame_stacks(Config.from_toml(path).spec)
    assert stacks["obs"].depth == 3 and stacks["obs"].frame_shape == (2, 84, 84)
    bad = path.read_text().replace("axis = 1", "axis = 4")
    path.write_text(bad)
    with pytest.raises(ConfigError, match=r"spec\.obs\.stack\.axis") as err:
        Config.from_toml(path)
    assert err.value.key == "spec.obs.stack.axis"


def mutated(change) -> dict[str, Any]:
    spec = copy.deepcopy(ATARI)
    change(spec)
    return spec


REFUSALS = [
    # depth 0 or axis out of range
    ("depth 0", lambda s: s["obs"].update(shape=[0, 84, 84]), "spec.obs.stack"),
    ("axis past the shape", lambda s: s["obs"]["stack"].update(axis=3), "spec.obs.stack.axis"),
    ("negative axis", lambda s: s["obs"]["stack"].update(axis=-1), "spec.obs.stack.axis"),
    ("stack of a scalar", lambda s: s["action"].update(stack={"stream": "env"}),
     "spec.action.stack.axis"),
    # next_of names a missing field, a non-stack, or a field of another shape or dtype
    ("next_of missing", lambda s: s["next_obs"].update(next_of="nope"),
     "spec.next_obs.next_of"),
    ("next_of itself", lambda s: s["next_obs"].update(next_of="next_obs"),
     "spec.next_obs.next_of"),
    ("next_of a plain field", lambda s: s["next_obs"].update(next_of="action"),
     "spec.next_obs.next_of"),
    ("next_of another shape", lambda s: s["next_obs"].update(shape=[4, 84, 85]),
     "spec.next_obs.next_of"),
    ("next_of another dtype", lambda s: s["next_obs"].update(dtype="float32"),
     "spec.next_obs.next_of"),
    ("two next stacks of one", lambda s: s.update(other=dict(s["next_obs"])),
     "spec.other.next_of"),
    ("a next stack with a stack", lambda s: s["next_obs"].update(stack={"stream": "env"}),
     "spec.next_obs.stack"),
    ("next_of not a name", lambda s: s["next_obs"].update(next_of="a b"),
     "spec.next_obs.next_of"),
    # the stream: missing, itself, not an integer scalar, or a stack itself
    ("stream missing", lambda s: s.pop("env"), "spec.obs.stack.stream"),
    ("stream is the field", lambda s: s["obs"]["stack"].update(stream="obs"),
     "spec.obs.stack.stream"),
    ("stream float", lambda s: s["env"].update(dtype="float32"), "spec.obs.stack.stream"),
    ("stream bool", lambda s: s["env"].update(dtype="bool"), "spec.obs.stack.stream"),
    ("stream not scalar", lambda s: s["env"].update(shape=[2]), "spec.obs.stack.stream"),
    ("stream is a stack", lambda s: s["obs"]["stack"].update(stream="next_obs"),
     "spec.obs.stack.stream"),
    ("stream not a name", lambda s: s["obs"]["stack"].update(stream="1x"),
     "spec.obs.stack.stream"),
    ("unknown key", lambda s: s["obs"]["stack"].update(depth=4), "spec.obs.stack.depth"),
]


@pytest.mark.parametrize(("what", "change", "key"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_bad_declaration_is_refused_naming_its_key(what, change, key) -> None:
    with pytest.raises(ConfigError) as err:
        load(mutated(change))
    assert err.value.key == key, (what, err.value.key, str(err.value))
    assert key in str(err.value), str(err.value)


@pytest.mark.parametrize(("make", "key", "value"), [
    (lambda: StackConfig(stream="env", axis=1.0), "axis", "1.0"),
    (lambda: StackConfig(stream="env", axis=True), "axis", "True"),
    (lambda: StackConfig(stream="env", axis="0"), "axis", "'0'"),
    (lambda: StackConfig(stream=3), "stream", "3"),
    (lambda: FieldConfig(dtype="uint8", next_of=None), "next_of", "None"),
    (lambda: FieldConfig(dtype="uint8", shape=(True, 8)), "shape", "(True, 8)"),
    (lambda: FieldConfig(dtype="uint8", shape=(4.0, 8)), "shape", "(4.0, 8)"),
    (lambda: FieldConfig(dtype="uint8", shape=(4,), stack={"stream": "env"}), "stack", "{"),
])
def test_a_declaration_built_in_python_is_held_to_the_toml_types(make, key, value) -> None:
    """Built by hand, ``StackConfig(axis=1.0)`` raised a raw TypeError in ``Config``,
    ``stream=3`` an AttributeError, and a bool axis or depth was accepted."""
    with pytest.raises(ConfigError, match=rf"^{key} must be ") as err:
        make()
    assert err.value.key == key and f"got {value}" in str(err.value)
    fc = FieldConfig(dtype="uint8", shape=[4, 8], stack=StackConfig(stream="e", axis=0))
    assert fc.shape == (4, 8) and type(fc.shape) is tuple  # a list is taken as a tuple


# ---------------------------------------------------------------------------------
# fuzz: random declarations, judged by the rules written out independently

DTYPES = ["uint8", "int64", "uint32", "float32", "bool"]
SHAPES = st.lists(st.integers(1, 3), max_size=3)


@st.composite
def declarations(draw) -> dict[str, Any]:
    """A valid declaration (streams, stacks on them, next stacks, a plain field), then
    up to two random changes of one key each, which may break any rule."""
    streams = [f"s{i}" for i in range(draw(st.integers(0, 2)))]
    spec: dict[str, Any] = {s: {"dtype": draw(st.sampled_from(["int64", "uint32", "int8"]))}
                            for s in streams}
    for i in range(draw(st.integers(0, 3)) if streams else 0):
        shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
        dtype = draw(st.sampled_from(DTYPES))
        spec[f"x{i}"] = {"dtype": dtype, "shape": shape,
                         "stack": {"axis": draw(st.integers(0, len(shape) - 1)),
                                   "stream": draw(st.sampled_from(streams))}}
        if draw(st.booleans()):
            spec[f"n{i}"] = {"dtype": dtype, "shape": list(shape), "next_of": f"x{i}"}
    spec["p"] = {"dtype": draw(st.sampled_from(DTYPES)), "shape": draw(SHAPES)}
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(sorted(spec)))
        fc = spec[name]
        names = sorted(spec)
        change = draw(st.sampled_from(["dtype", "shape", "axis", "stream", "next_of", "drop"]))
        if change == "dtype":
            fc["dtype"] = draw(st.sampled_from(DTYPES))
        elif change == "shape":
            fc["shape"] = draw(st.lists(st.integers(0, 3), max_size=3))
        elif change == "axis":
            fc["stack"] = {"axis": draw(st.integers(-1, 4)),
                           "stream": fc.get("stack", {}).get("stream")
                           or draw(st.sampled_from([*names, "zz"]))}
        elif change == "stream":
            fc["stack"] = {"axis": fc.get("stack", {}).get("axis", 0),
                           "stream": draw(st.sampled_from([*names, "zz", ""]))}
        elif change == "next_of":
            fc["next_of"] = draw(st.sampled_from([*names, "zz", ""]))
        elif len(spec) > 1:
            del spec[name]
    return spec


def valid(spec: dict[str, Any]) -> bool:
    """The rules, stated once more without the library's code."""
    def stacked(fc: dict[str, Any]) -> bool:
        return bool(fc.get("stack", {}).get("stream"))

    followed: set[str] = set()
    for fc in spec.values():
        if 0 in fc.get("shape", []):
            return False
        st_ = fc.get("stack", {})
        if not 0 <= st_.get("axis", 0) <= 31:
            return False
        if stacked(fc) and (fc.get("next_of")
                            or st_.get("axis", 0) >= len(fc.get("shape", []))):
            return False
    for name, fc in spec.items():
        if stacked(fc):
            stream = fc["stack"]["stream"]
            sf = spec.get(stream)
            if (stream == name or sf is None or sf.get("shape", [])
                    or sf["dtype"] in ("float32", "bool") or stacked(sf) or sf.get("next_of")):
                return False
        of = fc.get("next_of")
        if of:
            src = spec.get(of)
            if (of == name or src is None or not stacked(src) or src["dtype"] != fc["dtype"]
                    or src.get("shape", []) != fc.get("shape", []) or of in followed):
                return False
            followed.add(of)
    return True


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(declarations())
def test_random_declarations_load_exactly_when_the_rules_hold(spec) -> None:
    try:
        cfg = load(spec)
    except ConfigError as err:
        assert not valid(spec), f"refused a valid declaration: {err}"
        assert err.key.startswith("spec."), err.key
        return
    assert valid(spec), f"accepted an invalid declaration: {spec}"
    stacks = frame_stacks(cfg.spec)
    assert set(stacks) == {n for n, fc in spec.items() if fc.get("stack", {}).get("stream")}
    for name, fs in stacks.items():
        shape = spec[name]["shape"]
        assert fs.depth == shape[fs.axis] >= 1
        assert fs.frame_shape == tuple(shape[:fs.axis] + shape[fs.axis + 1:])
        assert fs.next_field in ("", *(n for n, fc in spec.items()
                                       if fc.get("next_of") == name))
    # the resolved config round-trips through TOML text
    text = tomli_w.dumps(cfg.to_dict())
    assert Config.from_dict(tomllib.loads(text)) == cfg


@pytest.mark.parametrize("stack_axis", [0, 2])
@pytest.mark.parametrize("with_next", [True, False])
def test_stored_row_bytes_is_what_a_shard_slot_holds(stack_axis: int, with_next: bool) -> None:
    """``Spec.stored_row_bytes`` (what placement charges a tier and an actor's ingest
    with) is the row bytes of the stored columns the storage lays out."""
    from conduit_hpc.spec import Spec
    from conduit_hpc.storage.frames import stored_spec

    spec_raw = copy.deepcopy(ATARI)
    spec_raw["obs"]["stack"]["axis"] = stack_axis
    if not with_next:
        spec_raw["next_obs"] = {"dtype": "uint8", "shape": [4, 84, 84]}  # plain, whole
    spec = Spec.from_config(load(spec_raw).spec)
    assert spec.stored_row_bytes == stored_spec(spec).row_bytes < spec.row_bytes
    plain = Spec.from_config(load({k: {a: b for a, b in v.items()
                                       if a not in ("stack", "next_of")}
                                   for k, v in ATARI.items()}).spec)
    assert plain.stored_row_bytes == plain.row_bytes
    if stack_axis == 0 and with_next:
        # one frame, 8 references, the lag, action and env
        assert spec.stored_row_bytes == 84 * 84 + 8 * 8 + 8 + 16
