"""Range checks shared by the config sections: :func:`require` and the sane bounds.

Plain Python; imports nothing of ours but :mod:`conduit_hpc.errors`. The bounds keep a
value that passed validation from breaking a rank later: integers that size memory or
index arrays fit ``int64`` with room for sums, and waits stay within what
``threading`` and ``time.sleep`` accept.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import typing

import numpy as np

from conduit_hpc.errors import ConfigError

__all__ = [
    "DTYPES",
    "INT64_MAX",
    "MAX_BYTES",
    "MAX_COUNT",
    "MAX_NAME_BYTES",
    "MAX_ROWS",
    "MAX_ROW_BYTES",
    "MAX_SECONDS",
    "METRICS_FULL_ROWS",
    "FrozenDict",
    "finite",
    "itemsize",
    "require",
    "require_types",
]

#: the largest value of a signed 64-bit integer (what numpy indexes arrays with)
INT64_MAX = 2**63 - 1
#: rows of a replay, a batch window or a queue (2**40 ~ 10**12 rows)
MAX_ROWS = 2**40
#: counts of ranks, batch rows, ingest batches, dimensions of one field (fit int32)
MAX_COUNT = 2**31 - 1
#: bytes of one row of the experience spec (4 GiB)
MAX_ROW_BYTES = 2**32
#: bytes of one shard, one batch or one queue (int64 with room for sums)
MAX_BYTES = 2**62
#: bytes (UTF-8) of a name that becomes part of a file name (run.name: the run directory
#: is NAME-YYYYmmdd-HHMMSS-ffffff; a file name holds at most 255 bytes on Linux)
MAX_NAME_BYTES = 200
#: seconds of any timeout, budget or period (~115 days; threading's limit is far above)
MAX_SECONDS = 1e7
#: ``run.metrics_full_rows``'s default: supersteps whose rows a learner's metrics file all
#: holds before it keeps a sample (:class:`conduit_hpc.plane.sampled_rows.RowThinning`)
METRICS_FULL_ROWS = 100_000
#: largest priority (initial or given): keeps priority ** alpha summed over a replay
#: finite in float64 for every priority_exponent <= 9.8 and capacity <= 2**40 (StorageConfig
#: refuses an exponent past the bound of its capacity)
MAX_PRIORITY = 1e30

DTYPES = (
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


class FrozenDict(dict[typing.Any, typing.Any]):
    """A dict that cannot be changed: a config's mapping field (``Config.spec``,
    ``checkpoint.compression``, a job section's table). A frozen config holds one of its
    own, copied when it is built: before, it kept the caller's dict, so a change to that
    dict (or through ``cfg.spec[...]``) after the checks - after the data plane was
    built - reached what it reads later unchecked (a checkpoint's codec, the config
    written into its manifest). Equal to a dict of the same items; pickles and copies
    as one."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> typing.NoReturn:
        raise TypeError("a config's mapping cannot be changed (configs are frozen); "
                        "build a new config, e.g. with Config.replace() or "
                        "dataclasses.replace()")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> tuple[type, tuple[dict[object, object]]]:
        return (type(self), (dict(self),))  # (dict's way sets the items one by one)

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenDict:
        import copy

        return type(self)({copy.deepcopy(k, memo): copy.deepcopy(v, memo)
                           for k, v in self.items()})


def require(ok: bool, key: str, value: object, expected: str) -> None:
    """Raise :class:`ConfigError` naming ``key``, ``value`` and ``expected`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} must be {expected}, got {value!r}", key=key)


def finite(v: float) -> bool:
    """Whether ``v`` is a finite number."""
    return math.isfinite(v)


def itemsize(dtype: str) -> int:
    """Bytes of one element of a spec dtype name (one of :data:`DTYPES`)."""
    return int(np.dtype(dtype).itemsize)


def _integer(v: object) -> int | None:
    """``v`` as an ``int`` when it is a whole number that is not a bool (a numpy integer
    too), else ``None``."""
    if isinstance(v, bool | np.bool_):
        return None
    try:
        return operator.index(v)  # type: ignore[arg-type]
    except TypeError:
        return None


def require_types(section: object) -> None:
    """Hold a section built by hand in Python (``StackConfig(axis=1.0)``) to the types
    the TOML loader enforces, before its range checks run on a value they cannot compare
    (before: a raw ``TypeError``/``AttributeError``, or a float axis or a bool depth
    accepted). ``int`` fields take whole numbers but bools (numpy integers become
    ``int``), ``float`` ones numbers but bools, ``str``/``bool`` their own type, a
    ``Literal`` one of its values, ``tuple[int, ...]`` a list or tuple of whole numbers
    (made a tuple of ``int``), ``tuple[str, ...]`` one of strings (made a tuple), and a
    ``dict`` becomes a :class:`FrozenDict` of its own: what was checked cannot change
    afterwards. Fields of other types are left to the section.

    Raises:
        ConfigError: naming the field, the value and the type expected.
    """
    try:
        hints = typing.get_type_hints(type(section))
    except (NameError, KeyError, TypeError):  # a class whose module cannot resolve them
        return
    for f in dataclasses.fields(section):  # type: ignore[arg-type]
        tp, v = hints[f.name], getattr(section, f.name)
        if tp is int:
            n = _integer(v)
            require(n is not None, f.name, v, "an integer")
            object.__setattr__(section, f.name, n)
        elif tp is float:
            require(isinstance(v, int | float | np.integer | np.floating)
                    and not isinstance(v, bool | np.bool_), f.name, v, "a number")
            try:
                x = float(v)
            except OverflowError:  # an int past float64 (10**400)
                x = None
            require(x is not None, f.name, v, "a number within float64's range")
            object.__setattr__(section, f.name, x)
        elif tp in (str, bool):
            require(isinstance(v, tp), f.name, v, f"a {tp.__name__}")
        elif typing.get_origin(tp) is typing.Literal:
            allowed = typing.get_args(tp)
            require(any(type(v) is type(a) and v == a for a in allowed), f.name, v,
                    f"one of {', '.join(map(repr, allowed))}")
        elif tp == tuple[int, ...]:
            items = [_integer(d) for d in v] if isinstance(v, list | tuple) else [None]
            require(None not in items, f.name, v, "a list of integers")
            object.__setattr__(section, f.name, tuple(items))
        elif tp == tuple[str, ...]:
            ok = isinstance(v, list | tuple) and all(isinstance(x, str) for x in v)
            require(ok, f.name, v, "a list of strings")
            object.__setattr__(section, f.name, tuple(v))  # its own: not the caller's list
        elif typing.get_origin(tp) is dict and isinstance(v, dict):
            object.__setattr__(section, f.name, FrozenDict(v))  # its own, unchangeable
