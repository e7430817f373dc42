"""Conversion of user arrays to the dtypes the Rust core reads, safely or not at all."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import InputError, ShapeError

_F32_EXACT_INT = 2**24


def as_f32(a: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """``a`` as a float32 array: float32 as is (no copy), bool / integer / float16 / float64
    converted when every value is exactly representable, anything else refused."""
    arr = np.asarray(a)
    if ndim is not None and arr.ndim != ndim:
        raise ShapeError(f"`{name}` must have {ndim} axes, got shape {arr.shape}")
    dt = arr.dtype
    if dt == np.float32:
        return arr
    if dt == np.bool_ or dt == np.float16:
        return arr.astype(np.float32)
    if np.issubdtype(dt, np.integer):
        if arr.size and np.abs(arr).max() >= _F32_EXACT_INT:
            raise InputError(f"`{name}` holds integers too large for float32")
        return arr.astype(np.float32)
    if dt == np.float64:
        out = arr.astype(np.float32)
        finite = np.isfinite(arr)
        if not np.array_equal(out[finite].astype(np.float64), arr[finite]):
            raise InputError(
                f"`{name}` is float64 with values that float32 cannot hold exactly; "
                "convert it with .astype(np.float32) if the rounding is intended"
            )
        return out
    raise InputError(f"`{name}` has dtype {dt}; expected float32 (or bool, an integer type, float64)")


def as_f64(a: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """``a`` as a float64 array (any real numeric dtype), refusing others."""
    arr = np.asarray(a)
    if ndim is not None and arr.ndim != ndim:
        raise ShapeError(f"`{name}` must have {ndim} axes, got shape {arr.shape}")
    if arr.dtype == np.float64:
        return arr
    if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        return arr.astype(np.float64)
    raise InputError(f"`{name}` has dtype {arr.dtype}; expected a real numeric array")


def as_i64(a: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """``a`` as an int64 array: any integer dtype, or floats that are whole numbers."""
    arr = np.asarray(a)
    if ndim is not None and arr.ndim != ndim:
        raise ShapeError(f"`{name}` must have {ndim} axes, got shape {arr.shape}")
    if arr.dtype == np.int64:
        return arr
    if np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise InputError(f"`{name}` holds values too large for int64")
        return arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            raise InputError(f"`{name}` holds NaN or infinite values; expected integers")
        if not np.array_equal(np.round(arr), arr):
            raise InputError(f"`{name}` holds non-integer values; expected integers")
        return arr.astype(np.int64)
    raise InputError(f"`{name}` has dtype {arr.dtype}; expected integers")


def as_u8(a: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """``a`` as a uint8 array: any integer or bool dtype whose values lie in 0..255, or whole
    floats in that range."""
    arr = np.asarray(a)
    if ndim is not None and arr.ndim != ndim:
        raise ShapeError(f"`{name}` must have {ndim} axes, got shape {arr.shape}")
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8)
    if np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0 or arr.max() > 255):
            raise InputError(f"`{name}` holds values outside 0..255; expected bits")
        if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(np.round(arr), arr):
            raise InputError(f"`{name}` holds non-integer values; expected bits")
        return arr.astype(np.uint8)
    raise InputError(f"`{name}` has dtype {arr.dtype}; expected uint8 bits")
