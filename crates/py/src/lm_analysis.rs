//! `hyperlens.analysis.analyze_lm`: the analyses of a language model's code file
//! (`hyperlens_analysis::lm::analyze`, as `hyperlens analyze --lm-codes`), its tables handed over
//! as columns and its summary as a record.

use std::path::PathBuf;

use hyperlens_analysis::codes::report::CodeSplit;
use hyperlens_analysis::decode::LogisticParams;
use hyperlens_analysis::lm::{analyze, LmAnalysisParams};
use ndarray::Array1;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::out;
use crate::errors::{detached, to_py, Interrupt};
use crate::records;

/// The analyses of the code file `codes` (its `codes.json` beside it): behaviour per factor
/// combination, decoding of `factor` seen -> held-out per layer and on all layers with its
/// controls and bootstrap intervals, PCA and k-means per layer. Returns a dict: `decoding`,
/// `behaviour`, `structure` (tables as dicts of columns), `summary` (the record of
/// `summary.json`), `projections` (`layer{l}` / `all`: float64 `[N_u, n_components]`),
/// `structure_prompt` and `structure_label` (int64 `[N_u]`: the projected rows' prompt index and
/// value index of the factor).
#[pyfunction]
#[pyo3(signature = (codes, factor=None, shuffled_codes=None, min_accuracy=None, layers=None, seed=0, n_bootstrap=1000, ci_level=0.95, c=1.0, max_iter=100, n_components=3, kmeans_runs=3, unsupervised_on="test"))]
#[allow(clippy::too_many_arguments)]
fn analyze_lm<'py>(
    py: Python<'py>,
    codes: PathBuf,
    factor: Option<String>,
    shuffled_codes: Option<PathBuf>,
    min_accuracy: Option<f64>,
    layers: Option<Vec<usize>>,
    seed: u64,
    n_bootstrap: usize,
    ci_level: f64,
    c: f64,
    max_iter: u64,
    n_components: usize,
    kmeans_runs: usize,
    unsupervised_on: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let params = LmAnalysisParams {
        shuffled_codes,
        factor,
        min_accuracy,
        layers,
        seed,
        n_bootstrap,
        ci_level,
        logistic: LogisticParams {
            c,
            max_iterations: max_iter,
            ..LogisticParams::default()
        },
        n_components,
        kmeans_runs,
        unsupervised_on: unsupervised_on.parse::<CodeSplit>().map_err(to_py)?,
        ..LmAnalysisParams::new(codes)
    };
    let a = detached(py, || {
        let stop = Interrupt::default();
        let r = analyze(&params, &mut |_| stop.check());
        stop.finish(r)
    })?;
    let d = PyDict::new(py);
    for (file, table) in a.tables().map_err(to_py)? {
        d.set_item(file.trim_end_matches(".csv"), records::table(py, &table)?)?;
    }
    d.set_item("summary", records::record(py, &a.summary())?)?;
    let proj = PyDict::new(py);
    for p in &a.projections {
        let name = hyperlens_io::keys::pca::selection(p.layer);
        proj.set_item(name, out(py, p.projection.clone()))?;
    }
    d.set_item("projections", proj)?;
    d.set_item(
        "structure_prompt",
        out(py, Array1::from(a.structure_prompts.clone())),
    )?;
    d.set_item(
        "structure_label",
        out(py, Array1::from(a.structure_labels.clone())),
    )?;
    Ok(d)
}

/// Registers the function.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(analyze_lm, m)?)
}
