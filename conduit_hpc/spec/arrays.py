"""Array-likes as numpy arrays by one rule (:func:`as_array`): what ingest, priority
updates and the integrations take, and what they refuse because converting would lose
something. Pure numpy (torch and pandas only when given). No MPI."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conduit_hpc.errors import SpecError

__all__ = ["as_array"]


def as_array(value: object, what: str) -> np.ndarray:
    """The one rule by which ingest and priority updates take array-likes.

    What is taken is the values, by position. Anything that carries more than its
    values is taken only when the conversion loses none of it, and refused otherwise:

    - numpy arrays pass as they are (``np.matrix`` and ``np.memmap`` as plain arrays); a
      masked array is taken only when nothing is masked (the mask would be dropped,
      and with it whatever lies under it); any other ``ndarray`` subclass (units,
      labels...) is refused: pass ``np.asarray(value)`` if only the values matter.
    - a nested sequence: its elements follow this same rule (a masked array or a
      tensor inside a list is not flattened silently), then it must be rectangular.
    - a torch tensor is detached and copied to the host (``requires_grad`` and CUDA
      tensors are fine: the graph and the device are not data); sparse layouts are
      made dense, conjugate and negative bits resolved; ``bfloat16``/``float8`` widened
      to float32 and ``complex32`` to complex64 (exact). Refused: quantized tensors
      (their values are ``scale * (q - zero_point)``: call ``dequantize()`` or
      ``int_repr()``), nested (ragged) tensors, and tensors without data (``meta``).
    - a pandas object is taken by position, so its index must be the default
      ``0..n-1`` (pandas would align other labels); a DataFrame's columns must share
      one dtype (no silent upcast); missing values (``NA``) are refused unless the
      dtype is a numpy float, where NaN is a value.
    - anything else with ``__array__`` or the buffer protocol (``memoryview``) through
      :func:`numpy.asarray`.

    Refused too, naming ``what``: ragged nesting, objects that are not numbers (object,
    string, bytes, structured, datetime/timedelta dtypes), mappings, and anything numpy
    cannot convert. Whether the dtype may then be cast is the caller's decision (no cast
    here loses anything).

    Raises:
        SpecError: naming ``what``, the type or dtype found and what was expected.
    """
    given = type(value).__name__
    if isinstance(value, np.ndarray):
        arr = _from_ndarray(value, what)
    else:
        if isinstance(value, Mapping | str | bytes | set | frozenset):
            raise SpecError(f"{what} must be an array of numbers, got a "
                            f"{type(value).__name__}")
        module = type(value).__module__
        if module.startswith("torch"):
            value = _from_torch(value, what)
        elif module.startswith("pandas"):
            value = _from_pandas(value, what)
        elif isinstance(value, list | tuple) and not all(isinstance(e, _SCALARS)
                                                         for e in value):
            value = [e if isinstance(e, _SCALARS) else as_array(e, f"{what} element {i}")
                     for i, e in enumerate(value)]
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError, RuntimeError, OverflowError, MemoryError) as err:
            raise SpecError(f"{what} must be a rectangular array of numbers, got "
                            f"{given} that numpy cannot convert: {err}") from err
    if arr.dtype.kind not in "biufc":
        raise SpecError(f"{what} must hold numbers, got dtype {arr.dtype} ({given})")
    return arr


# elements of a sequence that numpy takes as they are (no mask, no device, no graph)
_SCALARS = (bool, int, float, complex, np.bool_, np.number)


def _from_ndarray(value: np.ndarray, what: str) -> np.ndarray:
    """A numpy array or subclass as a plain array, or refused if that loses anything."""
    if type(value) is np.ndarray:
        return value
    if isinstance(value, np.ma.MaskedArray):
        masked = np.ma.getmaskarray(value)
        if masked.any():
            first = tuple(int(i) for i in np.argwhere(masked)[0])
            raise SpecError(f"{what}: a masked array with {int(masked.sum())} masked "
                            f"element(s) (first at index {first}); its mask would be "
                            f"dropped: fill them (value.filled(...)) or leave those rows "
                            f"out")
        return np.asarray(np.ma.getdata(value))
    if isinstance(value, np.matrix | np.memmap):
        return np.asarray(value)
    raise SpecError(f"{what}: an ndarray subclass {type(value).__name__} may carry more "
                    f"than its values (units, labels); expected a numpy array: pass "
                    f"np.asarray(value) if only the values matter")


def _from_torch(value: object, what: str) -> object:
    """A torch tensor as a host array, or refused if that would lose anything."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    t = value.detach()
    if t.is_quantized:
        raise SpecError(f"{what}: a quantized tensor ({t.dtype}) holds scale * (q - "
                        f"zero_point); expected plain numbers: call .dequantize() or "
                        f".int_repr()")
    if t.is_nested:
        raise SpecError(f"{what} must be a rectangular array of numbers, got a nested "
                        f"(ragged) tensor")
    if t.device.type == "meta":
        raise SpecError(f"{what}: a tensor on the meta device has no values")
    if t.layout != torch.strided:
        t = t.to_dense()  # sparse: the same values
    t = t.resolve_conj().resolve_neg()
    if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32,
                                                 torch.float64):
        t = t.float()  # bfloat16, float8: exact in float32
    elif t.is_complex() and t.dtype not in (torch.complex64, torch.complex128):
        t = t.to(torch.complex64)
    try:
        return t.cpu().numpy()
    except (TypeError, RuntimeError) as err:
        raise SpecError(f"{what}: a torch tensor of dtype {t.dtype} cannot become a numpy "
                        f"array: {err}") from err


def _from_pandas(value: object, what: str) -> object:
    """A pandas object's values by position, or refused if that would lose anything."""
    index = getattr(value, "index", None)
    if index is not None and not (type(index).__name__ == "RangeIndex"
                                  and index.start == 0 and index.step == 1):
        raise SpecError(f"{what}: a pandas {type(value).__name__} with index "
                        f"{type(index).__name__} {list(index[:3])}...; rows are taken by "
                        f"position, so expected the default index 0..n-1: call "
                        f".reset_index(drop=True) or .to_numpy()")
    dtypes = list(getattr(value, "dtypes", [])) if hasattr(value, "columns") else []
    if len({str(d) for d in dtypes}) > 1:
        raise SpecError(f"{what}: a pandas DataFrame with columns of dtypes "
                        f"{sorted({str(d) for d in dtypes})}; expected one dtype (they "
                        f"would be cast to one): convert it explicitly")
    isna = getattr(value, "isna", None)
    if callable(isna) and np.asarray(isna()).any():
        kinds = {getattr(d, "kind", "") if isinstance(d, np.dtype) else ""
                 for d in (dtypes or [getattr(value, "dtype", None)])}
        if kinds != {"f"}:
            raise SpecError(f"{what}: a pandas {type(value).__name__} with missing "
                            f"values (NA) of dtype {getattr(value, 'dtype', dtypes)}; "
                            f"they would become NaN or be lost: fill them or leave those "
                            f"rows out")
    to_numpy = getattr(value, "to_numpy", None)
    return to_numpy() if callable(to_numpy) else value
