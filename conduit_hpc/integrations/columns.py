"""TensorDict rows <-> the data plane's spec columns, by the naming rule of
:mod:`conduit_hpc.integrations.keymap`: what :class:`~conduit_hpc.integrations.torchrl.
DataPlaneReplayBuffer` stores and gives back. Imports ``tensordict`` (the ``[torchrl]``
extra), never ``torchrl``; no MPI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_leaf_nontensor

from conduit_hpc.config.checks import DTYPES
from conduit_hpc.errors import ConfigError, SpecError
from conduit_hpc.integrations.keymap import NestedKey, field_name, key_of, normalise_key
from conduit_hpc.spec import Spec, as_array

__all__ = ["TensorDictColumns", "spec_tables"]


def _numpy_dtype(t: torch.dtype, key: NestedKey) -> np.dtype:
    why = (f"TensorDict key {key!r}: dtype {t} has no numpy equivalent the data plane "
           f"stores (one of {', '.join(DTYPES)})")
    try:
        dt = np.dtype(torch.empty(0, dtype=t).numpy().dtype)
    except TypeError as err:
        raise SpecError(why) from err
    if dt.name not in DTYPES:  # complex64: numpy has it, a spec field cannot
        raise SpecError(why)
    return dt


def _key_set(keys: Iterable[Any], what: str) -> set[NestedKey]:
    """``keys`` as a set of canonical keys (a string is refused: its characters would
    be taken for keys)."""
    if isinstance(keys, str | bytes):
        raise ConfigError(f"{what} must be a collection of TensorDict keys (e.g. "
                          f"[{keys!r}] or [('collector', 'traj_ids')]), got the string "
                          f"{keys!r}", key=what)
    if not isinstance(keys, Iterable):  # None: a bare TypeError
        raise ConfigError(f"{what} must be a collection of TensorDict keys (e.g. [] or "
                          f"[('collector', 'traj_ids')]), got {keys!r}", key=what)
    return {normalise_key(k) for k in keys}


def _under(key: NestedKey, keys: set[NestedKey]) -> NestedKey | None:
    """The key of ``keys`` that is ``key`` or a node holding it (as TensorDict's
    ``exclude`` drops a node's entries with it), or ``None``."""
    parts = (key,) if isinstance(key, str) else key
    return next((k for i in range(1, len(parts) + 1)
                 if (k := normalise_key(parts[:i])) in keys), None)


def _leaves(td: TensorDictBase, skip: set[NestedKey]) -> dict[NestedKey, Any]:
    out: dict[NestedKey, Any] = {}
    # non-tensor entries (NonTensorData: strings, objects) are leaves too, and refused
    # below unless excluded (TensorDict's default leaves skip them: they were dropped)
    for k in td.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor):
        key = normalise_key(k)
        if _under(key, skip) is not None:  # the key, or a node holding it
            continue
        try:
            v = td.get(key)
        except RuntimeError as err:  # a lazy stack whose rows differ in shape
            raise SpecError(f"TensorDict key {key!r}: its rows cannot be stacked into one "
                            f"array (a lazy stack of TensorDicts whose entries differ in "
                            f"shape?); the data plane stores rows of one shape: {err}"
                            ) from err
        if not isinstance(v, torch.Tensor):
            raise SpecError(f"TensorDict key {key!r} holds a {type(v).__name__}, not a "
                            f"tensor; the data plane stores tensors only (leave it out "
                            f"with exclude_keys)")
        out[key] = v
    return out


def spec_tables(td: TensorDictBase, exclude_keys: Iterable[Any] = ()) -> str:
    """The ``[spec.*]`` TOML tables that store ``td``'s rows (its leading batch
    dimensions are rows), for a job's config file. Local.

    Raises:
        SpecError: ``td`` is not a TensorDict, a key breaks the naming rule, or an entry
            is not a tensor.
        ConfigError: ``exclude_keys`` is not a collection of keys.
    """
    if not isinstance(td, TensorDictBase):  # a dict: a bare AttributeError
        raise SpecError(f"spec_tables takes a TensorDict (a collector's batch), got "
                        f"{type(td).__name__}")
    rows = td.reshape(-1)
    skip = _key_set(exclude_keys, "exclude_keys")
    out = []
    for key, v in _leaves(rows, skip).items():
        dt = _numpy_dtype(v.dtype, key)
        shape = ", ".join(str(d) for d in v.shape[1:])
        out.append(f"[spec.{field_name(key)}]\ndtype = \"{dt.name}\"\nshape = [{shape}]\n")
    return "\n".join(out)


class TensorDictColumns:
    """TensorDict rows <-> the spec's columns, by the naming rule. Local; no MPI.

    Args:
        spec (Spec): the data plane's spec.
        exclude_keys (iterable of keys): entries never stored (the user's choice); a
            node's key excludes every entry under it, as ``TensorDict.exclude`` does.
        skip (iterable of keys): the buffer's own entries (``index``, ...), never stored.

    Raises:
        ConfigError: a spec field that names no TensorDict key, or whose key is in
            ``exclude_keys`` or ``skip`` (it could never be filled), or two fields
            where one's key holds the other's (``next`` and ``next__obs``).
    """

    def __init__(self, spec: Spec, exclude_keys: Iterable[Any] = (),
                 skip: Iterable[Any] = ()) -> None:
        self.spec = spec
        self.exclude_keys = _key_set(exclude_keys, "exclude_keys")
        own = _key_set(skip, "skip")
        self._skip = {*self.exclude_keys, *own}
        try:
            self.keys: dict[str, NestedKey] = {n: key_of(n) for n in spec.names}
        except SpecError as err:
            raise ConfigError(str(err), key="spec") from err
        paths = {n: (k,) if isinstance(k, str) else k for n, k in self.keys.items()}
        leaf = {path: n for n, path in paths.items()}
        for name, path in paths.items():
            inner = next((leaf[path[:i]] for i in range(1, len(path)) if path[:i] in leaf),
                         None)
            if inner is not None:
                raise ConfigError(f"spec fields {inner!r} and {name!r} are the TensorDict "
                                  f"entries {self.keys[inner]!r} and {self.keys[name]!r}: "
                                  f"an entry is a tensor or holds nested entries, never "
                                  f"both; rename one of them", key=f"spec.{name}")
        for name, key in self.keys.items():
            ex = _under(key, self.exclude_keys)
            if ex is not None:
                held = "is" if ex == key else f"holds {key!r}, which is"
                raise ConfigError(f"exclude_keys holds {ex!r}, which {held} the spec field "
                                  f"{name!r}: an excluded entry is never stored, so the "
                                  f"field could never be filled; drop it from exclude_keys "
                                  f"or [spec.{name}] from the config", key=f"spec.{name}")
            if key in own:
                raise ConfigError(f"spec field {name!r} is the TensorDict key {key!r}, which "
                                  f"the buffer keeps for itself (its own keys: "
                                  f"{', '.join(map(repr, sorted(map(str, own))))}), never "
                                  f"stored; rename the field and its entry, or pass another "
                                  f"priority_key", key=f"spec.{name}")

    def columns(self, td: TensorDictBase) -> dict[str, np.ndarray]:
        """``td``'s rows as spec columns (leading batch dimensions flattened).

        Raises:
            SpecError: a key that maps to no field or a field with no key, another
                dtype or per-row shape, or an entry that is not a tensor - naming the
                key and the field.
        """
        if not isinstance(td, TensorDictBase):
            raise SpecError(f"expected a TensorDict, got {type(td).__name__}")
        rows = td.reshape(-1) if td.batch_dims != 1 else td
        leaves = _leaves(rows, self._skip)
        cols: dict[str, np.ndarray] = {}
        for key, v in leaves.items():
            name = field_name(key)
            if name not in self.keys:
                raise SpecError(f"TensorDict key {key!r} (spec field {name!r}) is not in "
                                f"the spec (fields: {', '.join(self.keys)}); add "
                                f"[spec.{name}] to the job's config or pass it in "
                                f"exclude_keys")
            f = self.spec[name]
            dt = _numpy_dtype(v.dtype, key)
            if dt != f.dtype:
                raise SpecError(f"TensorDict key {key!r} (spec field {name!r}): dtype "
                                f"{dt.name}, the spec has {f.dtype.name}")
            if tuple(v.shape[1:]) != f.shape:
                raise SpecError(f"TensorDict key {key!r} (spec field {name!r}): per-row "
                                f"shape {tuple(v.shape[1:])}, the spec has {f.shape}")
            # by spec.as_array's rule: a sparse tensor's values, a meta one refused
            cols[name] = as_array(v, f"TensorDict key {key!r} (spec field {name!r})")
        missing = [n for n in self.keys if n not in cols]
        if missing:
            raise SpecError(f"TensorDict has no key {self.keys[missing[0]]!r} (spec field "
                            f"{missing[0]!r}); its keys: {sorted(map(str, leaves))}")
        return cols

    def tensordict(self, data: Mapping[str, torch.Tensor],
                   device: torch.device | str | None = None) -> TensorDictBase:
        """The TensorDict whose entries are the columns ``data`` (one tensor per spec
        field, leading dimension the rows).

        Raises:
            SpecError: ``data`` lacks a spec field, or its columns differ in rows (a
                KeyError, StopIteration or TensorDict's RuntimeError before), naming the
                field. Other columns are left out.
        """
        missing = [n for n in self.keys if n not in data]
        if missing:
            raise SpecError(f"columns must hold every spec field ({', '.join(self.keys)}): "
                            f"{missing[0]!r} is missing")
        rows = {name: int(data[name].shape[0]) if data[name].dim() else -1
                for name in self.keys}
        n = rows[next(iter(self.keys))]
        bad = next((name for name, r in rows.items() if r != n or r < 0), None)
        if bad is not None:
            raise SpecError(f"column {bad!r} has shape {tuple(data[bad].shape)}; every "
                            f"column must have the {n} rows of {next(iter(self.keys))!r}")
        td = TensorDict({}, batch_size=[n], device=device)
        for name, key in self.keys.items():
            td.set(key, data[name])
        return td
