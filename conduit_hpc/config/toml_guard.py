"""What TOML text may hold before :mod:`tomllib` reads it: no dotted key long enough to
stall the reader, and no nesting that breaks it. Plain Python.

tomllib reads a dotted key (``a.b.c = 1``, ``[a.b.c]``, ``{a.b = 1}``) in time quadratic in
its parts: 8,000 parts took 2.7 s, 50,000 (a 100 kB file) over a minute - on every rank,
which load the config too - and the 64 MiB file limit let one take hours. No config key
has more than a few parts (nesting past 32 levels is refused anyway), so a chain of more
than :data:`MAX_KEY_PARTS` is refused before it is parsed.
"""

from __future__ import annotations

import re
import sys
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

from conduit_hpc.errors import ConfigError

__all__ = ["MAX_KEY_PARTS", "loads", "long_key_line"]

#: parts of a dotted key (bare or quoted, as one chain) past which a text is refused
MAX_KEY_PARTS = 64
_PART = r"""(?:[A-Za-z0-9_-]+|"[^"\\\n]*"|'[^'\n]*')"""
# the look-behind starts a chain at its first part only, and a part given back fails at
# once (what follows it is no '.'): the scan is linear in the text
_LONG_KEY = re.compile(rf"""(?<![A-Za-z0-9_\-."'])(?:{_PART}[ \t]*\.[ \t]*)"""
                       rf"{{{MAX_KEY_PARTS}}}{_PART}")


def long_key_line(text: str) -> int | None:
    """The line (from 1) where ``text`` has a dotted key of more than
    :data:`MAX_KEY_PARTS` parts, or ``None``. A string value of that many dotted words
    counts too (no config value looks like one)."""
    m = _LONG_KEY.search(text)
    return None if m is None else text.count("\n", 0, m.start()) + 1


def loads(text: str, who: str, key: str, *, keys: bool = True) -> dict[str, Any]:
    """``tomllib.loads(text)``, refusing first a dotted key too long to read (with
    ``keys``) and then nesting too deep for it (a ``RecursionError`` in tomllib: arrays
    or inline tables a few hundred levels deep). ``who`` starts the message (``config
    file 'x.toml'``, ``override 'run.name': its value``).

    Raises:
        ConfigError: naming ``who`` (``.key`` = ``key``); tomllib's own errors pass.
    """
    line = long_key_line(text) if keys else None
    if line is not None:
        raise ConfigError(f"{who} has a dotted key of more than {MAX_KEY_PARTS} parts (line "
                          f"{line}); no config key has more than a few", key=key)
    try:
        return tomllib.loads(text)
    except RecursionError as err:  # tomllib recurses once per level of [ or {
        raise ConfigError(f"{who} nests arrays or inline tables too deeply to read "
                          f"(hundreds of levels); no config nests deeper than 32",
                          key=key) from err
