"""The naming rule between TensorDict keys and the data plane's flat spec fields.

A TensorDict key is a string (``"observation"``) or a tuple of strings for a nested
entry (``("next", "observation")``); a :class:`~conduit_hpc.spec.Spec` field is one
Python identifier. The rule:

* a key's parts are joined with a double underscore: ``("next", "observation")`` is the
  field ``next__observation``, ``"observation"`` the field ``observation``;
* a field name is split at every double underscore, left to right:
  ``next__observation`` is ``("next", "observation")``; a name with no double underscore
  is a plain string key.

For the rule to go both ways every part must be an identifier that contains no double
underscore and does not end with an underscore (``"_weight"`` is fine, ``"obs_"`` and
``"a__b"`` are not: ``("a", "_b")`` and ``("a_", "b")`` would both be ``a___b``).
:func:`field_name` refuses other keys, naming the part at fault, so that no two keys share
a field and every field names exactly one key. Pure Python; imports neither torch nor
TensorDict.
"""

from __future__ import annotations

from collections.abc import Iterable

from conduit_hpc.errors import SpecError

__all__ = ["SEPARATOR", "NestedKey", "field_name", "key_of", "keys_of", "normalise_key"]

#: what joins the parts of a nested key in a field name
SEPARATOR = "__"

NestedKey = str | tuple[str, ...]


def normalise_key(key: object) -> NestedKey:
    """A TensorDict key in its canonical form: a 1-tuple becomes its string.

    Raises:
        SpecError: the key is not a string or a non-empty tuple of strings.
    """
    if isinstance(key, str):
        return key
    if (isinstance(key, tuple) and key and all(isinstance(p, str) for p in key)):
        return key[0] if len(key) == 1 else key
    raise SpecError(f"TensorDict key {key!r} must be a string or a non-empty tuple of "
                    f"strings")


def _check_part(part: str, key: NestedKey) -> None:
    why = ""
    if not part.isidentifier():
        why = "is not a Python identifier"
    elif SEPARATOR in part:
        why = f"contains {SEPARATOR!r}, the separator of nested keys"
    elif part.endswith("_"):
        why = "ends with '_' (it would run into the separator of nested keys)"
    if why:
        raise SpecError(f"TensorDict key {key!r}: part {part!r} {why}; the data plane "
                        f"names nested keys by joining their parts with {SEPARATOR!r}, "
                        f"which takes parts that are identifiers without {SEPARATOR!r} "
                        f"and without a trailing '_' (rename the entry, or leave it out "
                        f"of the buffer with exclude_keys)")


def field_name(key: object) -> str:
    """The spec field that holds TensorDict entry ``key``.

    Raises:
        SpecError: a part of the key breaks the rule (see the module docstring), naming
            the key and the part.
    """
    k = normalise_key(key)
    parts = (k,) if isinstance(k, str) else k
    for p in parts:
        _check_part(p, k)
    return SEPARATOR.join(parts)


def key_of(name: str) -> NestedKey:
    """The TensorDict key held by spec field ``name`` (inverse of :func:`field_name`).

    Raises:
        SpecError: ``name`` is no field name that :func:`field_name` makes (or not a
            string: an AttributeError before).
    """
    if not isinstance(name, str):
        raise SpecError(f"spec field name must be a string, got {name!r}")
    parts = tuple(name.split(SEPARATOR))
    key: NestedKey = parts[0] if len(parts) == 1 else parts
    try:
        ok = field_name(key) == name
    except SpecError as err:  # e.g. "a___" (parts "a", "_") or "x____y" (an empty part)
        raise SpecError(f"spec field {name!r} names no TensorDict key under the rule "
                        f"(parts joined by {SEPARATOR!r}): {err}") from err
    if not ok:
        raise SpecError(f"spec field {name!r} names no TensorDict key under the rule "
                        f"(parts joined by {SEPARATOR!r})")
    return key


def keys_of(names: Iterable[str]) -> dict[str, NestedKey]:
    """``{field: key}`` for every field name in ``names``.

    Raises:
        SpecError: ``names`` is a string (its characters were taken for field names),
            or a name :func:`key_of` refuses.
    """
    if isinstance(names, str | bytes):
        raise SpecError(f"names must be a collection of spec field names (e.g. "
                        f"[{names!r}]), got the string {names!r}")
    return {n: key_of(n) for n in names}
