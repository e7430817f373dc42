//! Records for Python: a typed table as a dict of numpy columns, and a serde record (a file's
//! struct) as dicts, lists and numbers. The library decides every value; these functions only
//! convert.

use hyperlens_analysis::table::{Column, Table};
use ndarray::Array1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::Serialize;
use serde_json::Value;

use crate::arrays::out;
use crate::errors::{raise, to_py, Kind};

/// `table` as a dict of its columns in order: int64, float64 (each value as the CSV file prints
/// it; integers that may be missing as float64 with NaN), bool numpy arrays, and lists of `str`
/// for text.
///
/// # Errors
/// None in practice (a float column is read as one).
pub fn table<'py>(py: Python<'py>, table: &Table) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, column) in table.columns() {
        match column {
            Column::Int(v) => d.set_item(name, out(py, Array1::from(v.clone())))?,
            Column::Float { .. } | Column::MaybeFloat(_) | Column::MaybeInt(_) | Column::Exp(_) => {
                let v = Table::column_f64(column).map_err(to_py)?;
                d.set_item(name, out(py, Array1::from(v)))?
            }
            Column::Bool(v) => d.set_item(name, out(py, Array1::from(v.clone())))?,
            Column::Text(v) => d.set_item(name, PyList::new(py, v)?)?,
        }
    }
    Ok(d)
}

/// `record` (any serde struct) as Python objects: objects as dicts (keys in the file's order),
/// arrays as lists, numbers, strings, booleans and `None`.
///
/// # Errors
/// `HyperlensError` if the record does not serialise (it does for hyperlens's types).
pub fn record<'py>(py: Python<'py>, record: &impl Serialize) -> PyResult<Bound<'py, PyAny>> {
    let v = serde_json::to_value(record).map_err(|e| raise(Kind::Other, e.to_string()))?;
    value(py, &v)
}

/// One JSON value as a Python object.
fn value<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(value(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, value(py, x)?)?;
            }
            d.into_any()
        }
    })
}
