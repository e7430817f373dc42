"""Conversion of user arguments to what the Rust core reads, safely or not at all.

Arrays: the dtype is converted here (exactly, or refused); the layout is the core's reader's job
(``crates/py/src/arrays.rs``: an array is read in place when it is aligned with strides in whole
elements, else through a C-contiguous copy), so any strides, order, alignment or writability are
read right. Every copy made here or there is checked against the memory budget first.

Integers: range-checked before they reach the core, so that a negative or oversized value is an
``InputError`` (a ``ValueError``) naming the argument, never pyo3's ``OverflowError``.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import _core
from ._errors import InputError, ShapeError

_F32_EXACT_INT = 2**24
#: The largest value of the core's unsigned 64-bit integers (seeds, counts).
U64_MAX = 2**64 - 1
#: The largest count or index the core takes (``isize::MAX`` on a 64-bit machine).
COUNT_MAX = 2**63 - 1


def _array(a: Any, name: str, ndim: int | None) -> np.ndarray:
    """``a`` as a numpy array in native byte order, with ``ndim`` axes if given."""
    arr = np.asarray(a)
    if ndim is not None and arr.ndim != ndim:
        raise ShapeError(f"`{name}` must have {ndim} axes, got shape {arr.shape}")
    if not arr.dtype.isnative:
        arr = _copy(arr, arr.dtype.newbyteorder("="), name)
    return arr


def _copy(arr: np.ndarray, dtype: Any, name: str) -> np.ndarray:
    """``arr`` converted to ``dtype``, after checking the copy against the memory budget."""
    dt = np.dtype(dtype)
    _core.check_alloc(f"a {dt} copy of `{name}` {list(arr.shape)}", int(arr.size) * dt.itemsize)
    return arr.astype(dt)


def as_f32(a: Any, name: str, ndim: int | None = None, *, rounding: bool = False) -> np.ndarray:
    """``a`` as a float32 array: float32 as is (no copy), bool / integer / float16 / float64
    converted when every value is exactly representable (with ``rounding``, float64 is rounded to
    float32 as numpy does), anything else refused."""
    arr = _array(a, name, ndim)
    dt = arr.dtype
    if dt == np.float32:
        return arr
    if rounding and dt == np.float64:
        return _copy(arr, np.float32, name)
    if dt == np.bool_ or dt == np.float16:
        return _copy(arr, np.float32, name)
    if np.issubdtype(dt, np.integer):
        if arr.size and (arr.max() >= _F32_EXACT_INT or arr.min() <= -_F32_EXACT_INT):
            raise InputError(f"`{name}` holds integers too large for float32")
        return _copy(arr, np.float32, name)
    if dt == np.float64:
        out = _copy(arr, np.float32, name)
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
    arr = _array(a, name, ndim)
    if arr.dtype == np.float64:
        return arr
    if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        return _copy(arr, np.float64, name)
    raise InputError(f"`{name}` has dtype {arr.dtype}; expected a real numeric array")


def as_i64(a: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """``a`` as an int64 array: any integer dtype, or floats that are whole numbers."""
    arr = _array(a, name, ndim)
    if arr.dtype == np.int64:
        return arr
    if np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise InputError(f"`{name}` holds values too large for int64")
        return _copy(arr, np.int64, name)
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)):
            raise InputError(f"`{name}` holds NaN or infinite values; expected integers")
        if not np.array_equal(np.round(arr), arr):
            raise InputError(f"`{name}` holds non-integer values; expected integers")
        if arr.size and np.abs(arr).max() >= 2.0**63:
            raise InputError(f"`{name}` holds values too large for int64")
        return _copy(arr, np.int64, name)
    raise InputError(f"`{name}` has dtype {arr.dtype}; expected integers")


def as_u8(a: Any, name: str, ndim: int | None = None) -> np.ndarray:
    """``a`` as a uint8 array: any integer or bool dtype whose values lie in 0..255, or whole
    floats in that range."""
    arr = _array(a, name, ndim)
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return _copy(arr, np.uint8, name)
    if np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0 or arr.max() > 255):
            raise InputError(f"`{name}` holds values outside 0..255; expected bits")
        if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(np.round(arr), arr):
            raise InputError(f"`{name}` holds non-integer values; expected bits")
        return _copy(arr, np.uint8, name)
    raise InputError(f"`{name}` has dtype {arr.dtype}; expected uint8 bits")


def as_int(v: Any, name: str, lo: int = 0, hi: int = COUNT_MAX) -> int:
    """``v`` as a Python int in ``lo..=hi``: an int or numpy integer (not a bool, a float or a
    string), else an ``InputError`` naming the argument and the range."""
    if isinstance(v, (bool, np.bool_)):
        raise InputError(f"`{name}` must be an integer, got the bool {v!r}")
    try:
        i = operator.index(v)
    except TypeError:
        raise InputError(f"`{name}` must be an integer, got {v!r} ({type(v).__name__})") from None
    if i < lo or i > hi:
        top = "" if hi >= COUNT_MAX else f" and at most {hi}"
        raise InputError(f"`{name}` must be at least {lo}{top}, got {i}")
    return i


def as_seed(v: Any, name: str = "seed") -> int:
    """A seed: an integer in 0..2^64 - 1 (the core's ``u64``)."""
    return as_int(v, name, 0, U64_MAX)


def as_opt_int(v: Any, name: str, lo: int = 0, hi: int = COUNT_MAX) -> int | None:
    """``None``, or :func:`as_int`."""
    return None if v is None else as_int(v, name, lo, hi)


def as_layers(v: Any, name: str = "layers") -> list[int] | None:
    """``None`` (every layer), one layer index, or a sequence of layer indices, as a list of
    non-negative ints; a string, float or bool is refused (``'12'`` is not layers 1 and 2)."""
    if v is None:
        return None
    if isinstance(v, (str, bytes)):
        raise InputError(f"`{name}` must be a layer index or a list of them, got the string {v!r}")
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v.item()
    try:
        return [as_int(v, name)]
    except InputError:
        if isinstance(v, (int, np.integer, float, np.floating, bool, np.bool_)):
            raise
    try:
        items = list(v)
    except TypeError:
        raise InputError(f"`{name}` must be a layer index or a list of them, got {v!r}") from None
    return [as_int(x, f"{name}[{i}]") for i, x in enumerate(items)]


def rows(idx: Any, n: int, what: str = "problems") -> Any:
    """A numpy index of the rows of a set of ``n`` ``what`` from ``idx``, by numpy's rules: an int
    (negative from the end; the axis is kept, so the result is a set of one) must lie in
    ``-n..n`` (else ``IndexError``), a slice, a boolean mask of length ``n``, or a 1-D integer
    array whose entries lie in ``-n..n`` (else ``IndexError``). A bool or a tuple is refused
    (``TypeError`` / ``IndexError``)."""
    if isinstance(idx, (bool, np.bool_)):
        raise TypeError(f"index {idx!r}: index a set with an int, a slice, an int array or a boolean mask")
    if isinstance(idx, tuple):
        raise IndexError(f"a set of {what} has one index axis; index its arrays (e.g. set.x[...]) for more")
    if isinstance(idx, slice):
        return idx
    try:
        i = operator.index(idx)
    except TypeError:
        pass
    else:
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for a set of {n} {what}")
        i %= n
        return slice(i, i + 1)
    a = np.asarray(idx)
    if a.dtype == np.bool_:
        if a.shape != (n,):
            raise IndexError(f"a boolean mask of shape {a.shape} does not fit a set of {n} {what}")
        return a
    if a.size == 0 and a.ndim == 1:
        return a.astype(np.intp)
    if a.dtype.kind not in "iu" or a.ndim != 1:
        raise IndexError(f"an index array must be 1-D integers or a boolean mask, got {a.dtype} of shape {a.shape}")
    bad = (a < -n) | (a >= n)
    if bad.any():
        raise IndexError(f"index {int(a[bad][0])} is out of range for a set of {n} {what}")
    return a


def table(columns: Any) -> Any:
    """A table that the core hands over as its columns (a dict of numpy arrays and lists of
    ``str``, in order, each value as the CSV file prints it) as a pandas DataFrame, or without
    pandas as a dict of numpy columns (text as an object array)."""
    try:
        import pandas as pd
    except ImportError:
        pd = None
    cols = {name: (np.array(v, dtype=object) if isinstance(v, list) else v) for name, v in dict(columns).items()}
    return pd.DataFrame(cols) if pd is not None else cols
