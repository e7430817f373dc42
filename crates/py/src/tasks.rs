//! `hyperlens.tasks`: SRAVEN problem sets (sample, save, load, validate) as numpy arrays.

use std::path::PathBuf;

use hyperlens_tasks::npz::{load_problems, save_problems};
use hyperlens_tasks::sraven::{sample, ProblemSet, Set, Split, SravenParams};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use hyperlens_report::code_explorer::ProblemOrigin;

use crate::arrays::{out, In1, In2, In3};
use crate::errors::{detached, raise, to_py, Kind};

/// `id` or `ood`.
pub fn parse_set(set: &str) -> PyResult<Set> {
    match set {
        "id" => Ok(Set::Id),
        "ood" => Ok(Set::Ood),
        other => Err(raise(
            Kind::Input,
            format!("`set` must be \"id\" or \"ood\", got {other:?}"),
        )),
    }
}

/// A problem set's arrays as a dict: `x` float32 [N, T, M], `y`, `rules` int64 [N, F], `perms`
/// int64 [N, 3, F] (or None).
pub fn problems_dict<'py>(py: Python<'py>, p: ProblemSet) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("x", out(py, p.x))?;
    d.set_item("y", out(py, p.y))?;
    d.set_item("rules", out(py, p.rules))?;
    match p.perms {
        Some(perms) => d.set_item("perms", out(py, perms))?,
        None => d.set_item("perms", py.None())?,
    }
    Ok(d)
}

/// The SRAVEN splits: `(name, n_id_tasks, n_ood_tasks)` of the paper's four.
#[pyfunction]
fn splits() -> PyResult<Vec<(String, usize, usize)>> {
    Split::paper_names()
        .iter()
        .map(|name| {
            let s = Split::named(name).map_err(to_py)?;
            Ok((s.name.to_string(), s.id_tasks.len(), s.ood_tasks.len()))
        })
        .collect()
}

/// Samples `n` SRAVEN problems of `split`'s `set` with `seed` (as `hyperlens tasks sample`).
#[pyfunction]
#[pyo3(signature = (split, set, n, seed, unpermuted))]
fn sample_sraven<'py>(
    py: Python<'py>,
    split: &str,
    set: &str,
    n: usize,
    seed: u64,
    unpermuted: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let set = parse_set(set)?;
    if n == 0 {
        return Err(raise(Kind::Input, "`n` must be at least 1"));
    }
    let split = Split::named(split).map_err(to_py)?;
    let problems = detached(py, || {
        sample(&split, set, n, seed, unpermuted).map_err(to_py)
    })?;
    problems_dict(py, problems)
}

/// A [`ProblemSet`] of the arrays, validated (one-hot context, zero queries, values and rules in
/// range, permutations).
pub fn problem_set(
    x: &In3<'_, f32>,
    y: &In2<'_, i64>,
    rules: &In2<'_, i64>,
    perms: Option<&In3<'_, i64>>,
) -> PyResult<ProblemSet> {
    let params = SravenParams {
        features: y.as_array().ncols(),
        values: x.as_array().dim().2,
        ..Default::default()
    };
    let set = ProblemSet {
        x: x.owned("x")?,
        y: y.owned("y")?,
        rules: rules.owned("rules")?,
        perms: perms.map(|p| p.owned("perms")).transpose()?,
        params,
    };
    set.validate().map_err(to_py)?;
    Ok(set)
}

/// Checks a problem set's arrays (`ProblemSet.validate`).
#[pyfunction]
#[pyo3(signature = (x, y, rules, perms=None))]
fn validate_problems(
    x: In3<'_, f32>,
    y: In2<'_, i64>,
    rules: In2<'_, i64>,
    perms: Option<In3<'_, i64>>,
) -> PyResult<()> {
    problem_set(&x, &y, &rules, perms.as_ref()).map(|_| ())
}

/// Writes a problem set as the CLI's problem file (`x` uint8, the rest int64), atomically.
#[pyfunction]
#[pyo3(signature = (path, x, y, rules, perms=None))]
fn save_sraven(
    py: Python<'_>,
    path: PathBuf,
    x: In3<'_, f32>,
    y: In2<'_, i64>,
    rules: In2<'_, i64>,
    perms: Option<In3<'_, i64>>,
) -> PyResult<()> {
    let set = problem_set(&x, &y, &rules, perms.as_ref())?;
    detached(py, || save_problems(&path, &set).map_err(to_py))
}

/// Reads a problem file of the CLI (or numpy's `savez` with its arrays), validated.
#[pyfunction]
#[pyo3(signature = (path, features=4, values=8))]
fn load_sraven<'py>(
    py: Python<'py>,
    path: PathBuf,
    features: usize,
    values: usize,
) -> PyResult<Bound<'py, PyDict>> {
    if !path.exists() {
        return Err(raise(
            Kind::NotFound,
            format!("{}: no such file", path.display()),
        ));
    }
    let params = SravenParams {
        features,
        values,
        ..Default::default()
    };
    let set = detached(py, || load_problems(&path, &params).map_err(to_py))?;
    problems_dict(py, set)
}

/// The `meta` of the rows `rows` of a set whose `meta` is `meta` (a copy; `meta` is left as it
/// is): the same for a prefix `0..k`, else marked `subset`, as
/// [`ProblemOrigin::keeps_origin`](hyperlens_report::code_explorer::ProblemOrigin::keeps_origin)
/// decides.
///
/// # Shapes
/// `rows`: int64 `[k]`, the indices taken, in order.
#[pyfunction]
fn rows_meta<'py>(meta: &Bound<'py, PyDict>, rows: In1<'py, i64>) -> PyResult<Bound<'py, PyDict>> {
    let d = meta.copy()?;
    let rows = rows.as_array();
    let keeps = match rows.as_slice() {
        Some(r) => ProblemOrigin::keeps_origin(r),
        None => ProblemOrigin::keeps_origin(&rows.to_vec()),
    };
    if !keeps {
        d.set_item("subset", true)?;
    }
    Ok(d)
}

/// Registers the submodule's functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(splits, m)?)?;
    m.add_function(wrap_pyfunction!(sample_sraven, m)?)?;
    m.add_function(wrap_pyfunction!(validate_problems, m)?)?;
    m.add_function(wrap_pyfunction!(save_sraven, m)?)?;
    m.add_function(wrap_pyfunction!(load_sraven, m)?)?;
    m.add_function(wrap_pyfunction!(rows_meta, m)?)?;
    crate::logic::register(m)
}
