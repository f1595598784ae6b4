"""The experience schema: named, typed, fixed-shape fields.

A :class:`Spec` fixes the layout of a row. :meth:`Spec.validate` checks an incoming batch
(a mapping of arrays with a leading batch dimension) before anything is written and
returns it normalised (contiguous arrays of the spec's dtypes). Pure numpy; no MPI.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from conduit_hpc.config import FieldConfig
from conduit_hpc.config.checks import DTYPES, MAX_COUNT, MAX_ROW_BYTES
from conduit_hpc.errors import SpecError
from conduit_hpc.spec.arrays import as_array

__all__ = ["Field", "FrameStack", "Spec", "as_array", "check_in_range", "frame_stacks"]


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a row.

    Attributes:
        name (str): field name (a Python identifier).
        dtype (np.dtype): element type.
        shape (tuple[int, ...]): per-row shape (``()`` for a scalar).
        allow_nan (bool): when false, NaN values are refused at ingest.
        cast (str): ``safe`` or ``same_kind``: which input dtypes ingest converts.
        description (str): what the field means (an attribute of its checkpoint
            datasets; not part of :meth:`Spec.signature`).
        units (str): its units ("" when none).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] = ()
    allow_nan: bool = True
    cast: Literal["safe", "same_kind"] = "safe"
    description: str = ""
    units: str = ""

    def __post_init__(self) -> None:
        """Check a field built by hand by the rules of ``[spec.NAME]``
        (:class:`~conduit_hpc.config.FieldConfig`), naming the field, the value and what
        was expected. ``dtype`` may be given as anything :class:`numpy.dtype` takes
        (``"float32"``, ``np.float32``) and ``shape`` as a list or numpy integers: they
        are stored as ``np.dtype`` and a tuple of ``int``."""
        name = self.name
        if not isinstance(name, str) or not name.isidentifier():
            raise SpecError(f"field name must be a string that is a Python identifier, "
                            f"got {name!r}")
        try:
            dt = np.dtype(self.dtype)
        except (TypeError, ValueError) as err:
            raise SpecError(f"field {name!r}: dtype must be one of {', '.join(DTYPES)}, "
                            f"got {self.dtype!r}") from err
        if dt.name not in DTYPES or not dt.isnative or dt.shape:
            raise SpecError(f"field {name!r}: dtype must be one of {', '.join(DTYPES)} "
                            f"(native byte order), got {dt.str if dt.fields is None else dt}"
                            f" ({dt.name})")
        object.__setattr__(self, "dtype", dt)
        shape = self.shape
        if not isinstance(shape, tuple | list) or len(shape) > 32 or not all(
                isinstance(d, int | np.integer) and not isinstance(d, bool | np.bool_)
                and 0 < d <= MAX_COUNT for d in shape):
            raise SpecError(f"field {name!r}: shape must be a tuple of at most 32 positive "
                            f"integers <= {MAX_COUNT} (() for a scalar), got {shape!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if self.row_bytes > MAX_ROW_BYTES:
            raise SpecError(f"field {name!r}: shape {list(self.shape)} of {dt.name} takes "
                            f"{self.row_bytes} bytes per row; expected at most "
                            f"{MAX_ROW_BYTES}")
        if not isinstance(self.allow_nan, bool | np.bool_):
            raise SpecError(f"field {name!r}: allow_nan must be True or False, got "
                            f"{self.allow_nan!r}")
        object.__setattr__(self, "allow_nan", bool(self.allow_nan))
        if self.cast not in ("safe", "same_kind"):
            raise SpecError(f"field {name!r}: cast must be 'safe' or 'same_kind', got "
                            f"{self.cast!r}")
        for key in ("description", "units"):
            if not isinstance(getattr(self, key), str):
                raise SpecError(f"field {name!r}: {key} must be a string, got "
                                f"{getattr(self, key)!r}")

    @property
    def row_bytes(self) -> int:
        """Bytes this field takes in one row."""
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


class Spec:
    """An ordered set of fields; equal specs have equal :meth:`signature`.

    Args:
        fields (tuple[Field, ...] | list[Field]): the fields, in row order.
        stacks (Mapping[str, FrameStack] | None): the frame stacks the fields declare
            (:func:`frame_stacks`; none: the plain layout). With stacks, a shard stores
            each frame once (:mod:`conduit_hpc.storage.frames`); rows look the same.

    Raises:
        SpecError: no field, duplicate names, a name that is not an identifier, or a
            stack that does not fit its fields.
    """

    def __init__(self, fields: tuple[Field, ...] | list[Field],
                 stacks: Mapping[str, FrameStack] | None = None) -> None:
        if isinstance(fields, str | bytes | Mapping) or not isinstance(fields, Iterable):
            raise SpecError(f"spec fields must be a list or tuple of Field, got "
                            f"{type(fields).__name__}")
        fields = tuple(fields)
        if not fields:
            raise SpecError("spec must have at least one field, got none")
        seen: set[str] = set()
        for i, f in enumerate(fields):
            if not isinstance(f, Field):
                raise SpecError(f"spec fields[{i}] must be a Field, got "
                                f"{type(f).__name__} {f!r:.80}")
            if f.name in seen:
                raise SpecError(f"field {f.name!r} appears twice in the spec")
            seen.add(f.name)
        self._fields = fields
        self._by_name = {f.name: f for f in fields}
        self._names = tuple(f.name for f in fields)
        self._row_bytes = sum(f.row_bytes for f in fields)
        if self._row_bytes > MAX_ROW_BYTES:
            raise SpecError(f"spec rows take {self._row_bytes} bytes over fields "
                            f"{', '.join(self._names)}; expected at most {MAX_ROW_BYTES}")
        if stacks is not None and not isinstance(stacks, Mapping):
            raise SpecError(f"spec stacks must be a mapping of field name to FrameStack, "
                            f"got {type(stacks).__name__}")
        self._stacks = dict(stacks or {})
        for name, st in self._stacks.items():
            if not isinstance(st, FrameStack):
                raise SpecError(f"stack {name!r} must be a FrameStack, got "
                                f"{type(st).__name__} {st!r:.80}")
            _check_stack(self._by_name, name, st)
        _check_stack_groups(self._stacks)

    @classmethod
    def from_config(cls, fields: Mapping[str, FieldConfig]) -> Spec:
        """Build from the ``[spec.*]`` tables of a :class:`~conduit_hpc.config.Config`."""
        return cls([Field(name, np.dtype(fc.dtype), tuple(fc.shape), fc.allow_nan, fc.cast,
                          fc.description, fc.units)
                    for name, fc in fields.items()], frame_stacks(fields))

    @classmethod
    def from_dict(cls, fields: Mapping[str, tuple[str | np.dtype, tuple[int, ...]]]) -> Spec:
        """Shorthand: ``Spec.from_dict({"obs": ("float32", (4,)), "reward": ("float32", ())})``."""
        if not isinstance(fields, Mapping):
            raise SpecError(f"Spec.from_dict takes a mapping of name to (dtype, shape), got "
                            f"{type(fields).__name__}")
        out = []
        for n, entry in fields.items():
            if not isinstance(entry, tuple | list) or len(entry) != 2:
                raise SpecError(f"field {n!r}: expected a (dtype, shape) pair, got "
                                f"{entry!r}")
            dtype: Any = entry[0]  # Field checks and normalises dtype and shape
            out.append(Field(n, dtype, entry[1]))
        return cls(out)

    # -- introspection -------------------------------------------------------------
    @property
    def fields(self) -> tuple[Field, ...]:
        return self._fields

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    @property
    def stacks(self) -> dict[str, FrameStack]:
        """The frame stacks declared, by stacked field (empty: the plain layout)."""
        return dict(self._stacks)

    def __getitem__(self, name: str) -> Field:
        return self._by_name[name]

    def __iter__(self) -> Iterator[Field]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Spec) and self.signature() == other.signature()
                and self._stacks == other._stacks)

    def __hash__(self) -> int:
        return hash(self.signature())

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name}: {f.dtype.name}{list(f.shape)}" for f in self._fields)
        return f"Spec({inner})"

    @property
    def row_bytes(self) -> int:
        """Bytes of one row over all fields (nominal: whole stacks)."""
        return self._row_bytes

    @property
    def stored_row_bytes(self) -> int:
        """Bytes one shard slot takes in memory: :attr:`row_bytes` for the plain layout;
        with frame stacks, the stored columns' (every plain field, one frame and the
        int64 references per stack group, the int64 lag; ``docs/frame-stacks.md``),
        7,152 for the Atari spec against 56,472 nominal. What placement charges a
        tier's capacity and an actor's ingest with. :class:`conduit_hpc.storage.frames.
        FrameCodec` lays these columns out; a unit test holds the two equal."""
        if not self._stacks:
            return self._row_bytes
        stacked: set[str] = set()
        total = 8  # the lag column
        for st in self._stacks.values():
            names = (st.field, st.next_field) if st.next_field else (st.field,)
            stacked.update(names)
            frame = int(np.prod(st.frame_shape, dtype=np.int64)) * self[st.field].dtype.itemsize
            total += frame + 8 * st.depth * len(names)
        return total + sum(f.row_bytes for f in self._fields if f.name not in stacked)

    def signature(self) -> tuple[tuple[str, str, tuple[int, ...], bool], ...]:
        """A plain, comparable description (name, dtype, shape, allow_nan) per field."""
        return tuple((f.name, f.dtype.str, f.shape, f.allow_nan) for f in self._fields)

    def empty(self, rows: int) -> dict[str, np.ndarray]:
        """Zero-filled arrays for ``rows`` rows."""
        return {f.name: np.zeros((rows, *f.shape), dtype=f.dtype) for f in self._fields}

    # -- validation ----------------------------------------------------------------
    def validate(self, batch: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Check a batch against the spec and return it normalised.

        Args:
            batch (Mapping[str, array-like]): one array per field, leading batch dim.

        Returns:
            dict[str, np.ndarray]: C-contiguous arrays of the spec's dtypes, in spec order.
            Arrays already of the right dtype and layout are returned without a copy.

        Raises:
            SpecError: (a ``ValueError``) naming the field for a missing or extra field,
            a dtype that does not cast safely, a wrong per-row shape, batch lengths that
            differ, or a NaN in a field that forbids it. Nothing is modified.
        """
        if not isinstance(batch, Mapping):
            raise SpecError(f"batch must be a mapping of field name to array, "
                            f"got {type(batch).__name__}")
        missing = [n for n in self.names if n not in batch]
        if missing:
            raise SpecError(f"field {missing[0]!r} is missing from the batch "
                            f"(spec fields: {', '.join(self.names)})")
        extra = sorted(str(k) for k in batch if k not in self._by_name)
        if extra:
            raise SpecError(f"field {extra[0]!r} is not in the spec "
                            f"(spec fields: {', '.join(self.names)})")
        out: dict[str, np.ndarray] = {}
        rows: int | None = None
        first = ""
        for f in self._fields:
            raw = batch[f.name]
            arr = as_array(raw, f"field {f.name!r}")
            if arr.shape == (0,) and not hasattr(raw, "dtype"):  # [] or (): zero rows,
                arr = np.empty((0, *f.shape), f.dtype)  # not numpy's default float64
            if arr.dtype != f.dtype and not np.can_cast(arr.dtype, f.dtype, casting=f.cast):
                hint = ("; convert it explicitly, or set cast = \"same_kind\" in "
                        f"[spec.{f.name}]" if f.cast == "safe"
                        and np.can_cast(arr.dtype, f.dtype, casting="same_kind")
                        else "; convert it explicitly")
                raise SpecError(f"field {f.name!r}: dtype {arr.dtype.name} does not cast "
                                f"{'safely' if f.cast == 'safe' else 'within its kind'} to "
                                f"{f.dtype.name}{hint}")
            if arr.ndim != 1 + len(f.shape) or tuple(arr.shape[1:]) != f.shape:
                want = ("(batch, " + ", ".join(map(str, f.shape)) + ")" if f.shape
                        else "(batch,) for a scalar field")
                raise SpecError(f"field {f.name!r}: shape {tuple(arr.shape)} does not match "
                                f"{want}")
            if rows is None:
                rows, first = int(arr.shape[0]), f.name
            elif arr.shape[0] != rows:
                raise SpecError(f"field {f.name!r} has {arr.shape[0]} rows but field "
                                f"{first!r} has {rows}")
            if not f.allow_nan and f.dtype.kind == "f" and arr.size and np.isnan(arr).any():
                bad = int(np.flatnonzero(np.isnan(arr).reshape(arr.shape[0], -1).any(1))[0])
                raise SpecError(f"field {f.name!r} holds NaN (first at row {bad}) but the "
                                f"spec forbids NaN in it")
            if arr.dtype != f.dtype and arr.size:
                check_in_range(f.name, arr, f.dtype)
            out[f.name] = np.ascontiguousarray(arr, dtype=f.dtype)
        return out

    def rows_of(self, batch: Mapping[str, np.ndarray]) -> int:
        """Rows in an already validated batch."""
        return int(next(iter(batch.values())).shape[0])


def check_in_range(name: str, arr: np.ndarray, dtype: np.dtype) -> None:
    """Refuse values that a cast within their kind (``cast = "same_kind"``) would not
    round but wrap (an integer outside the field's integer type) or overflow (a finite
    float beyond the field's float type, which would become inf), naming the field, the
    first such value and the range (SpecError). A safe cast cannot do either."""
    if dtype.kind in "iu" and arr.dtype.kind in "iub":
        info = np.iinfo(dtype)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            worst = lo if lo < info.min else hi
            raise SpecError(f"field {name!r}: value {worst} is outside {dtype.name}'s range "
                            f"[{info.min}, {info.max}]; the cast would wrap it")
    elif dtype.kind == "f" and arr.dtype.kind == "f":
        top = np.finfo(dtype).max
        with np.errstate(invalid="ignore"):
            big = np.isfinite(arr) & (np.abs(arr) > top)
        if big.any():
            raise SpecError(f"field {name!r}: value {float(arr[big].flat[0])!r} is beyond "
                            f"{dtype.name}'s largest finite value {top:g}; the cast would "
                            f"make it inf")


@dataclass(frozen=True, slots=True)
class FrameStack:
    """A field declared a stack of the previous ``depth`` frames of one stream
    (``[spec.NAME] stack = {axis, stream}``), resolved against the other fields.

    Attributes:
        field (str): the stacked field (``obs``).
        stream (str): the integer scalar field naming each row's stream.
        axis (int): the axis of the field's shape that the frames are stacked along.
        depth (int): frames per stack (``shape[axis]``); the newest is the last.
        frame_shape (tuple[int, ...]): the shape of one frame (the field's shape
            without ``axis``).
        next_field (str): the field declared its next stack (``next_of``), or ``""``.
    """

    field: str
    stream: str
    axis: int
    depth: int
    frame_shape: tuple[int, ...]
    next_field: str = ""


def frame_stacks(fields: Mapping[str, FieldConfig]) -> dict[str, FrameStack]:
    """The frame stacks a validated ``[spec.*]`` declares, by stacked field (empty for
    the plain layout). Local; pure. A shard of a spec with stacks stores each frame once
    (see ``docs/frame-stacks.md``)."""
    nexts = {fc.next_of: name for name, fc in fields.items() if fc.next_of}
    out: dict[str, FrameStack] = {}
    for name, fc in fields.items():
        if not fc.stack.enabled:
            continue
        shape, axis = tuple(fc.shape), fc.stack.axis
        out[name] = FrameStack(name, fc.stack.stream, axis, shape[axis],
                               shape[:axis] + shape[axis + 1:], nexts.get(name, ""))
    return out


def _check_stack(fields: Mapping[str, Field], name: str, st: FrameStack) -> None:
    """Refuse a stack that does not fit the fields (``Spec`` built by hand; a loaded
    config was checked already), naming the field, the value and what was expected."""
    f = fields.get(name)
    if f is None or st.field != name:
        raise SpecError(f"stack {name!r} must name a spec field, got {st.field!r}")
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (st.axis, st.depth)):
        raise SpecError(f"field {name!r}: stack axis and depth must be integers, got "
                        f"{st.axis!r} and {st.depth!r}")
    if not (0 <= st.axis < len(f.shape)) or st.depth != f.shape[st.axis] or st.depth < 1:
        raise SpecError(f"field {name!r}: stack axis {st.axis} / depth {st.depth} must "
                        f"be an axis of its shape {list(f.shape)} of length >= 1")
    if st.frame_shape != f.shape[:st.axis] + f.shape[st.axis + 1:]:
        raise SpecError(f"field {name!r}: frame shape {list(st.frame_shape)} must be "
                        f"its shape without axis {st.axis}")
    s = fields.get(st.stream)
    if s is None or s.shape != () or s.dtype.kind not in "iu":
        raise SpecError(f"field {name!r}: stack stream {st.stream!r} must be an integer "
                        f"scalar spec field")
    if st.next_field:
        if st.next_field == name:
            raise SpecError(f"field {name!r}: next field {st.next_field!r} must be another "
                            f"spec field, not the stacked field itself")
        nf = fields.get(st.next_field)
        if nf is None or nf.shape != f.shape or nf.dtype != f.dtype:
            raise SpecError(f"field {name!r}: next field {st.next_field!r} must be a spec "
                            f"field of dtype {f.dtype.name} and shape {list(f.shape)}")


def _check_stack_groups(stacks: Mapping[str, FrameStack]) -> None:
    """Refuse next fields that two stacks share or that are stacks themselves (each
    stored field belongs to one frame group), naming the field."""
    owner: dict[str, str] = {}
    for name, st in stacks.items():
        if not st.next_field:
            continue
        if st.next_field in stacks:
            raise SpecError(f"field {name!r}: next field {st.next_field!r} is declared a "
                            f"stack itself; expected a field that follows exactly one "
                            f"stack")
        if st.next_field in owner:
            raise SpecError(f"field {name!r}: next field {st.next_field!r} already follows "
                            f"{owner[st.next_field]!r}; expected one next field per stack")
        owner[st.next_field] = name
