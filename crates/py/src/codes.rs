//! `hyperlens.CodeSet`'s files: the CLI's `codes.npz` format, read and written by the crates'
//! own reader and writer.

use std::fs::File;
use std::path::PathBuf;

use hyperlens_analysis::CodeSet;
use hyperlens_io::keys::codes as keys;
use hyperlens_probe::ProbeMeta;
use ndarray::{Array1, Array2, ArrayD, Ix1};
use ndarray_npy::NpzReader;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::analysis::{validated_code_set, CodeArrays};
use crate::arrays::{out, In1, In2, In3, InDyn};
use crate::errors::{detached, raise, to_py, Kind};

/// Writes a code set as the probe's `.npz` (codes float32, integer arrays int64, `correct` bool),
/// atomically. Arrays that are None are left out; `codes` and `label` are required.
#[pyfunction]
#[pyo3(signature = (path, codes, label, rules=None, inputs=None, target=None, prediction=None, correct=None, slot=None, problem=None))]
#[allow(clippy::too_many_arguments)]
fn save_codes(
    py: Python<'_>,
    path: PathBuf,
    codes: InDyn<'_, f32>,
    label: In1<'_, i64>,
    rules: Option<In2<'_, i64>>,
    inputs: Option<In2<'_, i64>>,
    target: Option<In1<'_, i64>>,
    prediction: Option<In1<'_, i64>>,
    correct: Option<In1<'_, bool>>,
    slot: Option<In1<'_, i64>>,
    problem: Option<In1<'_, i64>>,
) -> PyResult<()> {
    // The reader's validation (the analysis crate's CodeSet), so that what is written can be read.
    let set = validated_code_set(
        "codes",
        &codes,
        &label,
        CodeArrays {
            rules: rules.as_ref(),
            inputs: inputs.as_ref(),
            target: target.as_ref(),
            prediction: prediction.as_ref(),
            correct: correct.as_ref(),
        },
    )?;
    let n = set.n_samples();
    for (name, a) in [("slot", &slot), ("problem", &problem)] {
        if let Some(a) = a {
            let rows = a.as_array().len();
            if rows != n {
                return Err(raise(
                    Kind::Shape,
                    format!("`{name}` has {rows} rows but `codes` has N = {n}"),
                ));
            }
        }
    }
    let c = codes.as_array();
    let label = label.as_array();
    let (rules, inputs) = (
        rules.as_ref().map(|a| a.as_array()),
        inputs.as_ref().map(|a| a.as_array()),
    );
    let (target, prediction, slot, problem) = (
        target.as_ref().map(|a| a.as_array()),
        prediction.as_ref().map(|a| a.as_array()),
        slot.as_ref().map(|a| a.as_array()),
        problem.as_ref().map(|a| a.as_array()),
    );
    let correct = correct.as_ref().map(|a| a.as_array());
    detached(py, || {
        hyperlens_io::write_npz(&path, |npz| -> Result<(), hyperlens_io::IoError> {
            npz.add(keys::CODES, &c)?;
            npz.add(keys::LABEL, &label)?;
            if let Some(a) = &rules {
                npz.add(keys::RULES, a)?;
            }
            if let Some(a) = &inputs {
                npz.add(keys::INPUTS, a)?;
            }
            if let Some(a) = &target {
                npz.add(keys::TARGET, a)?;
            }
            if let Some(a) = &prediction {
                npz.add(keys::PREDICTION, a)?;
            }
            if let Some(a) = &correct {
                npz.add(keys::CORRECT, a)?;
            }
            if let Some(a) = &slot {
                npz.add(keys::SLOT, a)?;
            }
            if let Some(a) = &problem {
                npz.add(keys::PROBLEM, a)?;
            }
            Ok(())
        })
        .map_err(to_py)
    })
}

/// Reads an int64 vector of an archive whose header was checked already.
fn read_i64(path: &std::path::Path, name: &str) -> PyResult<Array1<i64>> {
    let file = File::open(path)
        .map_err(|e| raise(Kind::FileFormat, format!("{}: {e}", path.display())))?;
    let mut npz = NpzReader::new(file)
        .map_err(|e| raise(Kind::FileFormat, format!("{}: {e}", path.display())))?;
    npz.by_name::<ndarray::OwnedRepr<i64>, Ix1>(name)
        .map_err(|e| {
            raise(
                Kind::FileFormat,
                format!("{}: array `{name}`: {e}", path.display()),
            )
        })
}

/// Reads a code file written by `hyperlens probe` or [`save_codes`], validated by the analysis
/// crate's reader (shapes, finite codes, rule indices, the memory budget).
#[pyfunction]
fn load_codes<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    if !path.exists() {
        return Err(raise(
            Kind::NotFound,
            format!("{}: no such file", path.display()),
        ));
    }
    let (set, extra) = detached(py, || {
        let set = CodeSet::read_npz(&path).map_err(to_py)?;
        let members =
            hyperlens_io::inspect_npz_arrays(&path, &[keys::SLOT, keys::PROBLEM]).map_err(to_py)?;
        let mut extra = Vec::new();
        for m in &members {
            if m.name == keys::SLOT || m.name == keys::PROBLEM {
                let a = read_i64(&path, &m.name)?;
                if a.len() != set.n_samples() {
                    return Err(raise(
                        Kind::FileFormat,
                        format!(
                            "{}: array `{}` has {} rows, `codes` has {}",
                            path.display(),
                            m.name,
                            a.len(),
                            set.n_samples()
                        ),
                    ));
                }
                extra.push((m.name.clone(), a));
            }
        }
        Ok((set, extra))
    })?;
    let d = PyDict::new(py);
    d.set_item("codes", out(py, set.codes().clone()))?;
    d.set_item("label", out(py, set.label().clone()))?;
    let opt2 = |a: Option<&Array2<i64>>| a.cloned();
    if let Some(a) = opt2(set.rules()) {
        d.set_item("rules", out(py, a))?;
    }
    if let Some(a) = opt2(set.inputs()) {
        d.set_item("inputs", out(py, a))?;
    }
    if let Some(a) = set.target() {
        d.set_item("target", out(py, a.clone()))?;
    }
    if let Some(a) = set.prediction() {
        d.set_item("prediction", out(py, a.clone()))?;
    }
    if let Some(a) = set.correct() {
        d.set_item("correct", out(py, a.clone()))?;
    }
    for (name, a) in extra {
        d.set_item(name, out(py, a))?;
    }
    Ok(d)
}

/// Writes a logic code set as `hyperlens probe` writes one on a fuzzy-logic checkpoint (arrays in
/// its order: `codes` float32 `[N, L, H, Q, K]`, `terms` int64 `[N, Kt, Lv]`, `term_ids` int64
/// `[N, Kt]`, `target` and `prediction` float32 `[N]`, `problem` int64 `[N]`), atomically.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn save_logic_codes(
    py: Python<'_>,
    path: PathBuf,
    codes: InDyn<'_, f32>,
    terms: In3<'_, i64>,
    term_ids: In2<'_, i64>,
    target: In1<'_, f32>,
    prediction: In1<'_, f32>,
    problem: In1<'_, i64>,
) -> PyResult<()> {
    let c = codes.as_array();
    if c.ndim() != 5 {
        return Err(crate::arrays::shape_error(
            "codes",
            "[N, L, H, Q, K]",
            c.shape(),
        ));
    }
    let n = c.shape()[0];
    // The reader's validation (TermCodes::new: bits, term indices, finite codes), so that what is
    // written can be read.
    let c5 = codes
        .owned("codes")?
        .into_dimensionality::<ndarray::Ix5>()
        .map_err(|_| crate::arrays::shape_error("codes", "[N, L, H, Q, K]", c.shape()))?;
    hyperlens_analysis::terms::TermCodes::new(
        c5,
        terms.owned("terms")?,
        term_ids.owned("term_ids")?,
    )
    .map_err(to_py)?;
    let (terms, term_ids) = (terms.as_array(), term_ids.as_array());
    let (target, prediction, problem) =
        (target.as_array(), prediction.as_array(), problem.as_array());
    for (name, rows) in [
        ("terms", terms.dim().0),
        ("term_ids", term_ids.nrows()),
        ("target", target.len()),
        ("prediction", prediction.len()),
        ("problem", problem.len()),
    ] {
        if rows != n {
            return Err(raise(
                Kind::Shape,
                format!("`{name}` has {rows} rows but `codes` has N = {n}"),
            ));
        }
    }
    detached(py, || {
        hyperlens_io::write_npz(&path, |npz| -> Result<(), hyperlens_io::IoError> {
            npz.add(keys::CODES, &c)?;
            npz.add(keys::TERMS, &terms)?;
            npz.add(keys::TERM_IDS, &term_ids)?;
            npz.add(keys::TARGET, &target)?;
            npz.add(keys::PREDICTION, &prediction)?;
            npz.add(keys::PROBLEM, &problem)?;
            Ok(())
        })
        .map_err(to_py)
    })
}

/// Reads a logic code file (`hyperlens probe` on a fuzzy-logic checkpoint, or
/// [`save_logic_codes`]), validated by the analysis crate's reader (`TermCodes::read_npz`:
/// shapes, finite codes, term bits and indices, the memory budget).
#[pyfunction]
fn load_logic_codes<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    if !path.exists() {
        return Err(raise(
            Kind::NotFound,
            format!("{}: no such file", path.display()),
        ));
    }
    let arrays = detached(py, || {
        hyperlens_analysis::terms::TermCodes::read_npz(&path).map_err(to_py)?;
        let shown = path.display().to_string();
        let file =
            File::open(&path).map_err(|e| raise(Kind::FileFormat, format!("{shown}: {e}")))?;
        let mut npz =
            NpzReader::new(file).map_err(|e| raise(Kind::FileFormat, format!("{shown}: {e}")))?;
        let names = npz
            .names()
            .map_err(|e| raise(Kind::FileFormat, format!("{shown}: {e}")))?;
        let bad = |name: &str, e: ndarray_npy::ReadNpzError| {
            raise(Kind::FileFormat, format!("{shown}: array `{name}`: {e}"))
        };
        let codes: ArrayD<f32> = npz.by_name(keys::CODES).map_err(|e| bad(keys::CODES, e))?;
        let terms: ArrayD<i64> = npz.by_name(keys::TERMS).map_err(|e| bad(keys::TERMS, e))?;
        let ids: ArrayD<i64> = npz
            .by_name(keys::TERM_IDS)
            .map_err(|e| bad(keys::TERM_IDS, e))?;
        let mut f32s = Vec::new();
        for name in [keys::TARGET, keys::PREDICTION] {
            if names.iter().any(|n| n == name) {
                let a: Array1<f32> = npz.by_name(name).map_err(|e| bad(name, e))?;
                f32s.push((name, a));
            }
        }
        let problem = if names.iter().any(|n| n == keys::PROBLEM) {
            Some(read_i64(&path, keys::PROBLEM)?)
        } else {
            None
        };
        Ok((codes, terms, ids, f32s, problem))
    })?;
    let (codes, terms, ids, f32s, problem) = arrays;
    let d = PyDict::new(py);
    d.set_item("codes", out(py, codes))?;
    d.set_item("terms", out(py, terms))?;
    d.set_item("term_ids", out(py, ids))?;
    for (name, a) in f32s {
        d.set_item(name, out(py, a))?;
    }
    if let Some(p) = problem {
        d.set_item("problem", out(py, p))?;
    }
    Ok(d)
}

/// The sidecar of a SRAVEN or fuzzy-logic code file (`codes.npz` -> `codes.json`, written by
/// `hyperlens probe`), read as the probe crate's [`ProbeMeta`]
/// ([`ProbeMeta::read_beside`]): a dict of its fields (`site` in the CLI's form, `layers`
/// along the codes' layer axis, `mixer`, `split`, `set`, `seed`, ...), or `None` when the file
/// has no sidecar.
///
/// # Errors
/// `FileFormatError` naming the sidecar when it cannot be read or is not a code file's.
#[pyfunction]
fn read_codes_sidecar(py: Python<'_>, path: PathBuf) -> PyResult<Option<Bound<'_, PyAny>>> {
    let meta = detached(py, || ProbeMeta::read_beside(&path).map_err(to_py))?;
    meta.map(|m| crate::records::record(py, &m)).transpose()
}

/// Registers the functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(save_codes, m)?)?;
    m.add_function(wrap_pyfunction!(load_codes, m)?)?;
    m.add_function(wrap_pyfunction!(save_logic_codes, m)?)?;
    m.add_function(wrap_pyfunction!(load_logic_codes, m)?)?;
    m.add_function(wrap_pyfunction!(read_codes_sidecar, m)?)?;
    Ok(())
}
