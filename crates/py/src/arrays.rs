//! numpy in and out: shape and value checks that name the argument, and owned arrays handed to
//! numpy without a copy.

use ndarray::{Array, ArrayView, Dimension};
use numpy::{Element, PyArray};
use pyo3::prelude::*;

use crate::errors::{raise, Kind};

/// A `ShapeError` naming the argument, the shape expected and the shape given.
pub fn shape_error(arg: &str, expected: &str, got: &[usize]) -> PyErr {
    raise(
        Kind::Shape,
        format!("`{arg}` must have shape {expected}, got {got:?}"),
    )
}

/// An `InputError` unless every entry of `a` is finite, naming the argument and the first bad
/// entry.
pub fn check_finite<D: Dimension>(arg: &str, a: &ArrayView<'_, f32, D>) -> PyResult<()> {
    if let Some(pos) = a.iter().position(|v| !v.is_finite()) {
        return Err(raise(
            Kind::Input,
            format!("`{arg}` holds a NaN or infinite value (first at flat index {pos})"),
        ));
    }
    Ok(())
}

/// As [`check_finite`] for float64 arrays.
pub fn check_finite_f64<D: Dimension>(arg: &str, a: &ArrayView<'_, f64, D>) -> PyResult<()> {
    if let Some(pos) = a.iter().position(|v| !v.is_finite()) {
        return Err(raise(
            Kind::Input,
            format!("`{arg}` holds a NaN or infinite value (first at flat index {pos})"),
        ));
    }
    Ok(())
}

/// An owned array handed to numpy (no copy).
pub fn out<'py, T: Element, D: Dimension>(py: Python<'py>, a: Array<T, D>) -> Bound<'py, PyAny> {
    PyArray::from_owned_array(py, a).into_any()
}

/// A flat vector as an array of `shape`, or an `HyperlensError` if the sizes disagree (an internal
/// inconsistency, reported instead of a panic).
pub fn shaped<T, D: Dimension, Sh: Into<ndarray::StrideShape<D>>>(
    v: Vec<T>,
    shape: Sh,
    what: &str,
) -> PyResult<ndarray::Array<T, D>> {
    ndarray::Array::from_shape_vec(shape, v).map_err(|e| raise(Kind::Other, format!("{what}: {e}")))
}
