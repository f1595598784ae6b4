"""The JSON the project writes: strict RFC 8259 text, with no NaN or Infinity.

Python's :mod:`json` writes ``NaN``, ``Infinity`` and ``-Infinity`` by default, which
no other JSON reader need accept. Every file, line and message the project writes as
JSON goes through :func:`dumps` (a structure test checks it): non-finite floats become
``null``, numpy scalars and arrays plain numbers and lists, and ``allow_nan=False``
makes anything left over an error instead of invalid text. No MPI, no numpy import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["dump", "dumps", "finite"]


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by ``None``, recursively.

    Mappings, lists and tuples are copied (tuples become lists); numpy scalars and
    arrays (anything with ``item``/``tolist`` and a ``dtype``) become plain values.
    Other objects are returned as they are (``default=`` of :func:`dumps` sees them).
    """
    if isinstance(obj, bool | int | str) or obj is None:
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    if hasattr(obj, "dtype") and hasattr(obj, "tolist"):
        return finite(obj.tolist())  # numpy array or scalar (tolist of a scalar: item)
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """:func:`json.dumps` of :func:`finite` ``(obj)`` with ``allow_nan=False``.

    Takes :func:`json.dumps`'s keyword arguments (``indent``, ``sort_keys``,
    ``separators``, ``default``) except ``allow_nan``.

    Raises:
        ValueError: a non-finite float that ``default`` produced.
        TypeError: an object JSON cannot represent (and ``default`` did not convert).
    """
    return json.dumps(finite(obj), allow_nan=False, **kwargs)


def dump(obj: Any, fp: IO[str], **kwargs: Any) -> None:
    """:func:`dumps` into an open text file."""
    fp.write(dumps(obj, **kwargs))
