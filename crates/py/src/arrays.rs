//! numpy in and out: the one reader of numpy arguments ([`In`]), shape and value checks that name
//! the argument, and owned arrays handed to numpy without a copy.
//!
//! # Reading numpy arrays
//! rust-numpy's views assume that an array is aligned and that its strides are whole multiples of
//! its element size: for any other layout (a field of a packed structured array, a record buffer,
//! a view with an odd byte stride) `as_array` divides the byte strides by the element size and
//! reads the wrong elements, silently. [`In`] is the binding's one reader: it borrows the caller's
//! array when its layout is one the core can read (aligned, every stride a whole number of
//! elements; any order, negative strides, broadcast and read-only arrays included) and otherwise
//! reads a C-contiguous copy made by numpy (`numpy.ascontiguousarray`), after checking the copy
//! against the memory budget.

use std::ops::Deref;

use hyperlens_io::budget::{bytes_of, check_alloc};
use ndarray::{Array, ArrayView, Dimension};
use numpy::{Element, PyArray, PyArrayMethods, PyReadonlyArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::Borrowed;

use crate::errors::{raise, to_py, Kind};

/// A numpy argument of element type `T` and dimension `D`, readable by the core: the caller's
/// array itself (no copy) when its layout allows, else a C-contiguous copy (see the module
/// documentation). Dereferences to rust-numpy's [`PyReadonlyArray`], so `.as_array()` gives the view.
///
/// # Errors
/// Extraction fails as rust-numpy's does for a dtype or a number of axes that does not match (the
/// Python wrappers convert dtypes first), and with `BudgetError` when a copy would exceed the
/// memory budget.
pub struct In<'py, T: Element, D: Dimension>(PyReadonlyArray<'py, T, D>);

/// A one-axis [`In`].
pub type In1<'py, T> = In<'py, T, ndarray::Ix1>;
/// A two-axis [`In`].
pub type In2<'py, T> = In<'py, T, ndarray::Ix2>;
/// A three-axis [`In`].
pub type In3<'py, T> = In<'py, T, ndarray::Ix3>;
/// An [`In`] of any number of axes.
pub type InDyn<'py, T> = In<'py, T, ndarray::IxDyn>;

impl<'py, T: Element, D: Dimension> Deref for In<'py, T, D> {
    type Target = PyReadonlyArray<'py, T, D>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// Whether the core can read an array of `T` with these byte strides and this alignment through
/// a view: aligned, and every stride a whole number of elements (negative and zero strides
/// included).
pub fn readable_layout<T>(strides: &[isize], aligned: bool) -> bool {
    let size = std::mem::size_of::<T>() as isize;
    aligned && strides.iter().all(|s| s % size == 0)
}

impl<'a, 'py, T: Element + 'a, D: Dimension + 'a> FromPyObject<'a, 'py> for In<'py, T, D> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let arr: PyReadonlyArray<'py, T, D> = obj.extract()?;
        let aligned = arr.as_untyped().is_aligned();
        if readable_layout::<T>(arr.strides(), aligned) {
            return Ok(In(arr));
        }
        check_alloc(
            format!(
                "a C-contiguous copy of an array of shape {:?} (its layout cannot be read in place)",
                arr.shape()
            ),
            bytes_of(std::mem::size_of::<T>(), arr.shape()),
        )
        .map_err(to_py)?;
        drop(arr);
        let py = obj.py();
        let copy = py
            .import("numpy")?
            .call_method1("ascontiguousarray", (obj,))?;
        Ok(In(copy.extract()?))
    }
}

impl<T: Element + Clone, D: Dimension> In<'_, T, D> {
    /// An owned copy of the array, checked against the memory budget first (naming `arg`).
    ///
    /// # Errors
    /// `BudgetError` when the copy would exceed the budget.
    pub fn owned(&self, arg: &str) -> PyResult<Array<T, D>> {
        check_alloc(
            format!("a copy of `{arg}` {:?}", self.shape()),
            bytes_of(std::mem::size_of::<T>(), self.shape()),
        )
        .map_err(to_py)?;
        Ok(self.as_array().to_owned())
    }
}

/// Checks that an allocation the caller is about to make fits the memory budget
/// (`hyperlens._core.check_alloc`, used by the Python front before it converts or copies an
/// argument).
///
/// # Errors
/// `BudgetError` naming `what` and both sizes.
#[pyfunction]
#[pyo3(name = "check_alloc")]
pub fn check_alloc_py(what: &str, bytes: u128) -> PyResult<()> {
    check_alloc(what, bytes).map_err(to_py)
}

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
