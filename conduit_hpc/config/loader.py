"""One loading path for every TOML file of conduit_hpc: read, override, validate.

:func:`load` reads a file (:func:`read_toml`), applies ``--set key=value`` overrides
(:func:`apply_overrides`), finds the job's config class when the file has tables the
requested class does not know (:mod:`conduit_hpc.config.jobs`), and validates the mapping
into a frozen dataclass tree (:func:`validate`). Job configs, cluster files
(:meth:`~conduit_hpc.placement.cluster.ClusterModel.from_toml`) and workload files
(:meth:`~conduit_hpc.placement.model.Workload.from_toml`) all go through it.

Validation is pydantic's (v2) on plain stdlib dataclasses, in its strict JSON mode: TOML's
data model is JSON's (plus dates, which no config takes), so strict mode then means what a
TOML user expects - arrays for tuples, tables for sections, an integer where a number is
expected, but never a boolean for an integer nor a string for a number - and unknown
keys are refused. Each section's ``__post_init__`` checks ranges. Every failure is a
:class:`~conduit_hpc.errors.ConfigError` whose message names the dotted key, the value
and what was expected, with ``.key`` set to the dotted key. Local; no MPI.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import select
import stat
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import tomli_w
from pydantic import ConfigDict, TypeAdapter, ValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

from conduit_hpc.config import toml_guard
from conduit_hpc.config.checks import INT64_MAX
from conduit_hpc.config.jobs import declared_config
from conduit_hpc.errors import ConfigError

__all__ = [
    "apply_overrides",
    "config_from_dict",
    "load",
    "parse_override",
    "read_bounded",
    "read_toml",
    "to_plain",
    "to_toml",
    "tomllib",
    "validate",
]

T = TypeVar("T")
_MAX_DEPTH = 32


# ---------------------------------------------------------------------------------
# reading and overriding


def read_toml(path: str | Path, *, what: str = "config file") -> dict[str, Any]:
    """The mapping of a TOML file.

    Raises:
        ConfigError: the file is missing, a directory, unreadable, not UTF-8, or not valid
            TOML (the message names the file and, for a syntax error, the line).
    """
    p = Path(path)
    try:
        data = read_bounded(p, what)
    except FileNotFoundError as err:
        raise ConfigError(f"{what} {str(p)!r} does not exist", key="") from err
    except IsADirectoryError as err:
        raise ConfigError(f"{what} {str(p)!r} is a directory, not a TOML file",
                          key="") from err
    except OSError as err:
        raise ConfigError(f"{what} {str(p)!r} cannot be read: {err.strerror or err}",
                          key="") from err
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(f"{what} {str(p)!r} is not UTF-8 text (byte {err.start}, line "
                          f"{line}); TOML files are UTF-8", key="") from err
    # a byte order mark (what some Windows editors put first) is not TOML's: dropped
    text = text.removeprefix("\ufeff")
    try:  # a key or nesting that would stall or break tomllib is refused (toml_guard)
        return toml_guard.loads(text, f"{what} {str(p)!r}", "")
    except ConfigError:  # a ValueError too: not the cases below
        raise
    except tomllib.TOMLDecodeError as err:
        # the message of tomllib ends with "(at line L, column C)"
        raise ConfigError(f"{what} {str(p)!r} is not valid TOML: {err}", key="") from err
    except ValueError as err:  # int(): a literal past Python's 4300-digit limit
        raise ConfigError(f"{what} {str(p)!r} holds a number too long to read ({err}); "
                          f"no value conduit_hpc takes comes near it", key="") from err


#: no config, cluster or workload file comes near this; a larger one is refused
MAX_TOML_BYTES = 64 << 20
#: how long a FIFO's writer may stay quiet before reading it is given up
FIFO_QUIET_S = 60.0


def read_bounded(p: Path, what: str, limit: int | None = None) -> bytes:
    """The bytes of ``p``, at most ``limit`` (default :data:`MAX_TOML_BYTES`), read so
    that no path can
    hold the caller forever: a device (``/dev/zero``: endless) or socket is refused (a
    :class:`ConfigError` naming ``what``), a file that grows past the limit while read
    (``/proc``) too, and a FIFO or pipe
    (``<(...)``) is read as its writer writes, ending when it closes (a FIFO no writer
    opens, or whose writer goes quiet for :data:`FIFO_QUIET_S`, is refused)."""
    st = os.stat(p)  # FileNotFoundError, PermissionError: the caller names them
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(str(p))
    fifo = stat.S_ISFIFO(st.st_mode)
    if not (fifo or stat.S_ISREG(st.st_mode)):
        raise ConfigError(f"{what} {str(p)!r} is not a regular file (a device or a "
                          f"socket), not a file to read", key="")
    limit = MAX_TOML_BYTES if limit is None else limit
    too_big = ConfigError(f"{what} {str(p)!r} is larger than {limit} bytes; no such file "
                          f"conduit_hpc reads is this large", key="")
    if st.st_size > limit:
        raise too_big
    fd = os.open(p, os.O_RDONLY | (os.O_NONBLOCK if fifo else 0))
    try:
        chunks: list[bytes] = []
        n = 0
        while True:
            if fifo and not select.select([fd], [], [], FIFO_QUIET_S)[0]:
                raise ConfigError(f"{what} {str(p)!r} is a FIFO whose writer sent nothing "
                                  f"for {FIFO_QUIET_S:g} s", key="")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            n += len(chunk)
            if n > limit:
                raise too_big
            chunks.append(chunk)
    finally:
        os.close(fd)


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=value`` and read value as a TOML literal (a bare word stays a string,
    and so does a TOML date or time such as ``1979-05-27``: no config field takes one).

    Raises:
        ConfigError: no ``=``, or an empty or malformed dotted key.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value", key=text)
    key, _, value = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key", key=text)
    if any(not part.strip() for part in key.split(".")):
        raise ConfigError(f"override {text!r}: key {key!r} must be dotted names such as "
                          f"storage.capacity_rows", key=key)
    try:  # an inline table's keys are checked; a bare word with dots stays text
        parsed = toml_guard.loads(f"v = {value.strip()}", f"override {key!r}: its value",
                                  key, keys="{" in value)["v"]
    except ConfigError:  # a ValueError too: not the cases below
        raise
    except (tomllib.TOMLDecodeError, KeyError):
        parsed = value.strip()
    except ValueError as err:  # int(): a literal past Python's 4300-digit limit
        raise ConfigError(f"override {key!r}: its value, {len(value.strip())} characters, "
                          f"is a number too long to read ({err}); no value conduit_hpc "
                          f"takes comes near it", key=key) from err
    if isinstance(parsed, _dt.date | _dt.time):  # no field takes one: 1979-05-27 is text
        parsed = value.strip()
    return key, parsed


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``raw`` with each ``key=value`` override set (see :func:`parse_override`).

    A key the config does not have is refused by :func:`validate`, naming the key.

    Raises:
        ConfigError: a malformed override, or one that goes through a value that is not a
            table.
    """
    out = _copy_tables(raw)
    if overrides is None:
        overrides = ()
    if isinstance(overrides, str | bytes) or not isinstance(overrides, Sequence):
        raise ConfigError(f"overrides must be a list of 'section.key=value' strings, got "
                          f"{type(overrides).__name__} {overrides!r:.80}", key="overrides")
    for ov in overrides:
        if not isinstance(ov, str):
            raise ConfigError(f"override {ov!r} must be a string 'section.key=value', got "
                              f"{type(ov).__name__}", key="overrides")
        key, value = parse_override(ov)
        parts = [p.strip() for p in key.split(".")]
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(f"override {key!r}: {where} is {child!r}, not a table",
                                  key=key)
            node = child
        node[parts[-1]] = value
    return out


def _copy_tables(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy_tables(v) if isinstance(v, Mapping) else v for k, v in raw.items()}


# ---------------------------------------------------------------------------------
# validating


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}
_HINTS: dict[Any, dict[str, Any]] = {}


def _adapter(cls: Any) -> TypeAdapter[Any]:
    # TypeAdapter takes no config for a dataclass; a wrapper carries it, and pydantic
    # hands it down to every nested stdlib dataclass (job sections included)
    if cls not in _ADAPTERS:
        root = dataclasses.make_dataclass("_Root", [("value", cls)], frozen=True)
        root.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]
        _ADAPTERS[cls] = TypeAdapter(root)
    return _ADAPTERS[cls]


def validate(cls: type[T], raw: Any) -> T:
    """Build the config dataclass ``cls`` (a tree of them) from a plain mapping.

    Raises:
        ConfigError: naming the dotted key, the value and what was expected.
    """
    blob = json.dumps({"value": _plain(raw, "", 0)}, allow_nan=True)
    try:
        return typing.cast(T, _adapter(cls).validate_json(blob, strict=True).value)
    except ValidationError as err:
        raise _translate(cls, raw, err) from err


def config_from_dict(cls: type[T], raw: Mapping[str, Any]) -> T:
    """Alias of :func:`validate` for a mapping (the name the library has used)."""
    return validate(cls, raw)


def load(cls: type[T], path: str | Path, overrides: Sequence[str] = (), *,
         what: str = "config file", discover: bool = True,
         script: str | Path | None = None) -> T:
    """Read ``path``, apply ``overrides`` and validate into ``cls``.

    With ``discover``, a file whose top level has tables that ``cls`` does not declare is
    loaded with the config class that the job script beside it declares (see
    :func:`conduit_hpc.config.jobs.declared_config`) when that class is a subclass of
    ``cls``; otherwise those tables are refused as unknown keys. ``script`` names the job
    script when it is not beside the file.

    Raises:
        ConfigError: the file, an override or a value is bad; the message starts with the
            file's path.
    """
    if not isinstance(path, str | PathLike):
        raise ConfigError(f"{what} must be a path (str or pathlib.Path), got "
                          f"{type(path).__name__} {path!r:.80}", key="path")
    p = Path(path)
    raw = apply_overrides(read_toml(p, what=what), overrides)
    target: type[Any] = cls
    note = ""
    extra: list[str] = []
    if discover and dataclasses.is_dataclass(cls):
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(k for k, v in raw.items() if k not in known and isinstance(v, dict))
        if extra:
            job_cls, note = declared_config(p, script)
            if job_cls is not None and issubclass(job_cls, cls):
                target = job_cls
                note = "" if job_cls is not cls else (
                    f"the job script {str(script or p.with_suffix('.py'))!r} declares "
                    f"JOB_CONFIG = {job_cls.__name__}, which has no such section")
            elif job_cls is not None:
                note = (f"the job script declares JOB_CONFIG = {job_cls.__name__}, which "
                        f"is not a subclass of {cls.__name__}")
    try:
        return typing.cast(T, validate(target, raw))
    except ConfigError as err:
        more = f" ({note})" if note and err.key.split(".")[0] in extra else ""
        raise ConfigError(f"{p}: {err}{more}", key=err.key) from err


def _plain(value: Any, key: str, depth: int) -> Any:
    """``value`` as JSON-ready data; refuses what no config field takes."""
    if depth > _MAX_DEPTH:
        raise ConfigError(f"{key or 'the config'} nests deeper than {_MAX_DEPTH} levels",
                          key=key)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{key or 'the top level'} has a key {k!r} that is not a "
                                  f"string", key=key)
            out[k] = _plain(v, _join(key, k), depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_plain(v, f"{key}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise ConfigError(f"{key} must fit in a 64-bit signed integer, got {value!r}",
                              key=key)
        return value
    if isinstance(value, float):
        return value
    kind = ("a TOML date or time" if isinstance(value, _dt.date | _dt.time)
            else type(value).__name__)
    raise ConfigError(f"{key} must be a number, string, boolean, array or table, got "
                      f"{kind} {value!r}", key=key)


def _translate(cls: type, raw: Any, err: ValidationError) -> ConfigError:
    """The first error of ``err`` as a :class:`ConfigError` in the house style."""
    e = err.errors(include_url=False)[0]
    key, tp, parent, value, found = _locate(cls, raw, e["loc"][1:])
    kind = e["type"]
    ctx = e.get("ctx") or {}
    inner = ctx.get("error")
    if kind == "value_error" and isinstance(inner, ConfigError):
        full = _join(key, inner.key) if inner.key else key
        msg = str(inner)
        if inner.key and key and msg.startswith(inner.key):
            msg = full + msg[len(inner.key):]
        elif key and not msg.startswith(full):
            msg = f"{key}: {msg}"
        return ConfigError(msg, key=full)
    if kind == "value_error":
        return ConfigError(f"{key or 'the config'}: {inner if inner is not None else e['msg']}"
                           f" (got {value!r})", key=key)
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        prefix = key.rpartition(".")[0] if "." in key else ""
        where = f"[{prefix}]" if prefix else "the top level"
        known = ", ".join(sorted(_field_names(parent)))
        return ConfigError(f"unknown key {key!r} in {where} (known keys: {known})", key=key)
    if kind in ("missing_keyword_argument", "missing", "missing_argument"):
        return ConfigError(f"{key} is required (expected {_type_name(tp)})", key=key)
    if tp is not None and found:
        return ConfigError(f"{key or 'the config'} must be {_type_name(tp)}, got {value!r}",
                           key=key)
    return ConfigError(f"{key or 'the config'}: {e['msg']}, got {value!r}", key=key)


def _locate(cls: type, raw: Any, loc: tuple[int | str, ...]
            ) -> tuple[str, Any, Any, Any, bool]:
    """Walk ``loc`` through the types and the raw mapping: (dotted key, type there,
    enclosing dataclass, raw value there, whether the value was found)."""
    tp: Any = cls
    parent: Any = cls
    key = ""
    value: Any = raw
    found = True
    for item in loc:
        while tp is not None:
            origin = get_origin(tp)
            if origin in (typing.Union, types.UnionType):
                real = [a for a in get_args(tp) if a is not type(None)]
                if len(real) == 1:
                    tp = real[0]
                    continue
            break
        if tp is not None and get_origin(tp) in (typing.Union, types.UnionType):
            break  # a member's tag: the union's own key and type say it best
        if dataclasses.is_dataclass(tp):
            parent = tp
            tp = _hints(tp).get(str(item))
            key = _join(key, str(item))
        elif get_origin(tp) in (tuple, list):
            args = get_args(tp)
            if get_origin(tp) is list or (len(args) == 2 and args[1] is Ellipsis):
                tp = args[0]
            else:
                tp = args[item] if isinstance(item, int) and item < len(args) else None
            key = f"{key}[{item}]"
        elif get_origin(tp) in (dict, Mapping):
            tp = get_args(tp)[1]
            key = _join(key, str(item))
        else:
            tp = None
            key = f"{key}[{item}]" if isinstance(item, int) else _join(key, str(item))
        in_table = isinstance(value, Mapping) and item in value
        in_list = (isinstance(value, list | tuple) and isinstance(item, int)
                   and 0 <= item < len(value))
        if found and (in_table or in_list):
            value = value[item]
        else:
            found = False
            value = None
    return key, tp, parent, value, found


def _hints(cls: Any) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _field_names(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (tuple, list):
        elem = get_args(tp)[0]
        plural = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
        return f"a list of {plural.get(elem) or _type_name(elem).removeprefix('a ')}"
    if origin in (dict, Mapping) or dataclasses.is_dataclass(tp):
        return "a table"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             type(None): "nothing"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# ---------------------------------------------------------------------------------
# writing


def to_plain(obj: Any) -> Any:
    """A config dataclass tree as plain, JSON- and TOML-compatible data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    return obj


def to_toml(data: Mapping[str, Any]) -> str:
    """A nested mapping of scalars and lists as TOML text (written by ``tomli-w``).

    Raises:
        ConfigError: a value TOML cannot hold (``None``).
    """
    try:
        return tomli_w.dumps(to_plain(data))
    except TypeError as err:
        raise ConfigError(f"cannot write the config as TOML: {err}", key="") from err
