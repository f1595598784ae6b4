"""Typed, frozen job configuration loaded from TOML.

A job is described by one :class:`Config` (sections ``[run]``, ``[layout]``, ``[spec.*]``,
``[storage]``, ``[transport]``, ...). Jobs that need sections of their own subclass
:class:`Config` and add fields; :meth:`Config.from_toml` works on the subclass.

Loading is strict: an unknown key, a value of the wrong type or one out of range raises
:class:`~conduit_hpc.errors.ConfigError` naming the dotted key, the value and what was
expected. Nothing here imports MPI; :func:`check_same_config` (in ``roles``) compares
:meth:`Config.digest` across ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

from .errors import ConfigError

__all__ = [
    "CheckpointConfig",
    "Config",
    "FieldConfig",
    "LayoutConfig",
    "RunConfig",
    "StorageConfig",
    "TransportConfig",
    "config_from_dict",
    "parse_override",
    "require",
]

T = TypeVar("T")

_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)


def require(ok: bool, key: str, value: object, expected: str) -> None:
    """Raise :class:`ConfigError` naming ``key``, ``value`` and ``expected`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} must be {expected}, got {value!r}", key=key)


def _finite(v: float) -> bool:
    return math.isfinite(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """``[run]``: identity of the job and its global limits.

    Attributes:
        name (str): job name, used for run directories.
        seed (int): base seed; rank ``r`` seeds with ``seed + world_rank``.
        timeout_s (float): bound on every blocking wait of the data plane.
        duration_s (float): wall-time budget of a job's main loop (0 = job decides).
    """

    name: str = "conduit"
    seed: int = 0
    timeout_s: float = 120.0
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        require(bool(self.name) and self.name.replace("-", "").replace("_", "").isalnum(),
                "name", self.name, "a non-empty name of letters, digits, '-' and '_'")
        require(self.seed >= 0, "seed", self.seed, ">= 0")
        require(_finite(self.timeout_s) and self.timeout_s > 0, "timeout_s", self.timeout_s,
                "a finite number > 0")
        require(_finite(self.duration_s) and self.duration_s >= 0, "duration_s",
                self.duration_s, "a finite number >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutConfig:
    """``[layout]``: how ``COMM_WORLD`` splits into roles.

    With ``per_node = false`` the counts are for the whole world: world ranks
    ``0 .. learners-1`` are learners, the next ``buffers`` are buffers, the rest actors.
    With ``per_node = true`` the counts are per node (node-local ranks in that order).
    ``actors = 0`` means "every remaining rank".

    Attributes:
        learners (int): learner ranks (per node when ``per_node``).
        buffers (int): buffer ranks (per node when ``per_node``).
        actors (int): actor ranks, 0 for all the remaining ranks.
        per_node (bool): counts are per node rather than for the world.
        emulate_nodes (int): when > 0, treat the world as this many nodes of consecutive
            ranks (for tests of multi-node paths on one machine); 0 uses the real nodes.
    """

    learners: int = 1
    buffers: int = 1
    actors: int = 0
    per_node: bool = False
    emulate_nodes: int = 0

    def __post_init__(self) -> None:
        require(self.learners >= 0, "learners", self.learners, ">= 0")
        require(self.buffers >= 1, "buffers", self.buffers, ">= 1")
        require(self.actors >= 0, "actors", self.actors, ">= 0 (0 = all remaining ranks)")
        require(self.emulate_nodes >= 0, "emulate_nodes", self.emulate_nodes, ">= 0")

    @property
    def fixed_ranks(self) -> int:
        """Ranks the layout needs (per node when ``per_node``), counting one actor for 0."""
        return self.learners + self.buffers + max(self.actors, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldConfig:
    """``[spec.NAME]``: one field of the experience spec.

    Attributes:
        dtype (str): numpy dtype name (``float32``, ``uint8``, ...).
        shape (tuple[int, ...]): per-row shape, ``[]`` for a scalar.
        allow_nan (bool): when false, a NaN in this field is refused at ingest.
    """

    dtype: str
    shape: tuple[int, ...] = ()
    allow_nan: bool = True

    def __post_init__(self) -> None:
        require(self.dtype in _DTYPES, "dtype", self.dtype, f"one of {', '.join(_DTYPES)}")
        for d in self.shape:
            require(d > 0, "shape", self.shape, "a list of positive integers")


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageConfig:
    """``[storage]``: replay capacity and sharding.

    Attributes:
        capacity_rows (int): total replay capacity over all shards (rows).
        shards_per_buffer (int): shards held by each buffer rank.
        initial_priority (float): priority of a row inserted without one, until a
            larger priority has been seen (new rows enter at the running maximum).
        priority_exponent (float): alpha in p**alpha (0 = uniform).
    """

    capacity_rows: int = 100_000
    shards_per_buffer: int = 1
    initial_priority: float = 1.0
    priority_exponent: float = 0.6

    def __post_init__(self) -> None:
        require(self.capacity_rows > 0, "capacity_rows", self.capacity_rows, "> 0")
        require(self.shards_per_buffer >= 1, "shards_per_buffer", self.shards_per_buffer,
                ">= 1")
        require(_finite(self.initial_priority) and self.initial_priority > 0,
                "initial_priority", self.initial_priority, "a finite number > 0")
        require(_finite(self.priority_exponent) and self.priority_exponent >= 0,
                "priority_exponent", self.priority_exponent, "a finite number >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """``[transport]``: how bytes move.

    Attributes:
        shared_memory (str): ``auto`` reads and writes windows of ranks on the same node
            with plain numpy; ``never`` forces MPI RMA for every access (what ranks on
            different nodes do).
        poll_interval_s (float): sleep between polls of a waiting loop.
    """

    shared_memory: Literal["auto", "never"] = "auto"
    poll_interval_s: float = 0.0002

    def __post_init__(self) -> None:
        require(_finite(self.poll_interval_s) and 0 <= self.poll_interval_s <= 0.1,
                "poll_interval_s", self.poll_interval_s, "between 0 and 0.1")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig:
    """``[checkpoint]``: HDF5 experience checkpoints (see ``conduit_hpc.checkpointing``).

    Attributes:
        directory (str): checkpoint root; relative paths are under the run directory
            (``--resume`` also looks in earlier runs of the same job beside it).
        every_supersteps (int): learners request a checkpoint at every N-th superstep
            boundary (0: never).
        every_seconds (float): the buffer side starts one this often (0: never).
        keep (int): complete checkpoints kept (0: all).
        on_stop (bool): write a final checkpoint when the job is asked to stop
            (SIGTERM / SIGUSR1).
    """

    directory: str = "checkpoints"
    every_supersteps: int = 0
    every_seconds: float = 0.0
    keep: int = 3
    on_stop: bool = True

    def __post_init__(self) -> None:
        require(bool(self.directory.strip()), "directory", self.directory,
                "a non-empty path")
        require(self.every_supersteps >= 0, "every_supersteps", self.every_supersteps,
                ">= 0 (0 = never)")
        require(_finite(self.every_seconds) and self.every_seconds >= 0, "every_seconds",
                self.every_seconds, "a finite number >= 0 (0 = never)")
        require(self.keep >= 0, "keep", self.keep, ">= 0 (0 = keep all)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The whole job configuration; every rank must hold an equal one."""

    run: RunConfig = field(default_factory=RunConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    spec: dict[str, FieldConfig] = field(default_factory=dict)
    storage: StorageConfig = field(default_factory=StorageConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        for name in self.spec:
            require(name.isidentifier(), "spec", name, "field names that are identifiers")

    # -- loading -------------------------------------------------------------------
    @classmethod
    def from_toml(cls: type[T], path: str | Path, overrides: Sequence[str] = ()) -> T:
        """Load a config file, applying ``key=value`` overrides (TOML literals).

        Raises:
            ConfigError: unreadable file, bad TOML, unknown key, wrong type, bad range.
        """
        p = Path(path)
        try:
            raw = tomllib.loads(p.read_text())
        except FileNotFoundError as err:
            raise ConfigError(f"config file {str(p)!r} does not exist", key="") from err
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {err}",
                              key="") from err
        for ov in overrides:
            key, value = parse_override(ov)
            _set_dotted(raw, key, value)
        return config_from_dict(cls, raw)

    @classmethod
    def from_dict(cls: type[T], raw: Mapping[str, Any]) -> T:
        """Build from a plain mapping (as TOML would give), with the same checks."""
        return config_from_dict(cls, raw)

    # -- identity ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON- and TOML-compatible mapping of every value."""
        return _to_plain(self)

    def digest(self) -> str:
        """SHA-256 of the canonical JSON form; equal configs have equal digests."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    def replace(self: T, **sections: Any) -> T:
        """A copy with whole sections replaced (``cfg.replace(run=...)``)."""
        return dataclasses.replace(self, **sections)  # type: ignore[type-var]


# ---------------------------------------------------------------------------------
# generic strict conversion


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=value`` and read value as a TOML literal (a bare word stays a string).

    Raises:
        ConfigError: no ``=`` or an empty key.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value", key=text)
    key, _, value = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key", key=text)
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key, parsed


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {'.'.join(parts[: i + 1])} is not a table",
                              key=key)
        node = child
    node[parts[-1]] = value


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [_to_plain(v) for v in obj]
    return obj


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (tuple, list):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin in (dict, Mapping):
        return "a table"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a table"
    if tp is type(None):
        return "nothing"
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a table, got {value!r}", key=key)
        return _build(tp, value, key)
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}", key=key)
        return value
    if origin in (typing.Union, types.UnionType):
        last: ConfigError | None = None
        for arg in get_args(tp):
            if arg is type(None):
                if value is None:
                    return None
                continue
            try:
                return _convert(arg, value, key)
            except ConfigError as err:
                last = err
        raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}",
                          key=key) from last
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be {_type_name(tp)}, got {value!r}", key=key)
        (elem,) = get_args(tp)[:1]
        return tuple(_convert(elem, v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a table, got {value!r}", key=key)
        _, vt = get_args(tp)
        return {str(k): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}", key=key)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}", key=key)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {value!r}", key=key)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}", key=key)
        return value
    raise TypeError(f"config field {key} has unsupported type {tp!r}")  # programming error


def _build(cls: type[T], raw: Mapping[str, Any], prefix: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        where = f"[{prefix}]" if prefix else "the top level"
        known = ", ".join(sorted(fields))
        raise ConfigError(
            f"unknown key {_join(prefix, unknown[0])!r} in {where} (known keys: {known})",
            key=_join(prefix, unknown[0]))
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in raw:
            kwargs[name] = _convert(hints[name], raw[name], _join(prefix, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{_join(prefix, name)} is required (expected "
                              f"{_type_name(hints[name])})", key=_join(prefix, name))
    try:
        return cls(**kwargs)
    except ConfigError as err:
        full = _join(prefix, err.key) if err.key else prefix
        msg = str(err)
        if err.key and prefix and msg.startswith(err.key):
            msg = full + msg[len(err.key):]
        raise ConfigError(msg, key=full) from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def config_from_dict(cls: type[T], raw: Mapping[str, Any]) -> T:
    """Build any config dataclass tree from a mapping with strict checks.

    Raises:
        ConfigError: naming the dotted key, the value and what was expected.
    """
    return _build(cls, raw, "")
