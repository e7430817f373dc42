//! `hyperlens.report`: the main job (`hyperlens report`) through `hyperlens_report::run`: accuracy,
//! latent codes and their analyses for every checkpoint, figures, and a Markdown + HTML page; and
//! the latent-code study of a language model (`hyperlens study`) through
//! `hyperlens_report::lm_study::run`.

use std::path::PathBuf;
use std::str::FromStr;

use hyperlens_report::{run as run_report, Progress, ReportError, ReportParams};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{detached, to_py, Callback, Classify, Kind};

impl Classify for ReportError {
    fn kind(&self) -> Kind {
        match self {
            ReportError::InvalidInput(_) => Kind::Input,
            ReportError::NoCheckpoint { .. } => Kind::NotFound,
            ReportError::Unsupported { .. } => Kind::Checkpoint,
            ReportError::Model(e) => e.kind(),
            ReportError::Tasks(e) => e.kind(),
            ReportError::Checkpoint { source, .. } => source.kind(),
            ReportError::Probe(e) => e.kind(),
            ReportError::Analysis(e) => e.kind(),
            ReportError::Viz(e) => e.kind(),
            _ => Kind::Other,
        }
    }
}

/// A report stage as a Python dict: `stage` (`skipped`, `checkpoint`, `codes`, `logic_codes`,
/// `analysis`, `causal`, `figures`) and its fields.
fn progress_dict<'py>(py: Python<'py>, p: &Progress<'_>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match p {
        Progress::Skipped { dir, task } => {
            d.set_item("stage", "skipped")?;
            d.set_item("dir", dir.display().to_string())?;
            d.set_item("task", task.to_string())?;
        }
        Progress::Checkpoint { dir, index, total } => {
            d.set_item("stage", "checkpoint")?;
            d.set_item("dir", dir.display().to_string())?;
            d.set_item("done", index)?;
            d.set_item("total", total)?;
        }
        Progress::Codes {
            name,
            set,
            done,
            total,
        } => {
            d.set_item("stage", "codes")?;
            d.set_item("name", *name)?;
            d.set_item("set", set.to_string())?;
            d.set_item("done", done)?;
            d.set_item("total", total)?;
        }
        Progress::LogicCodes {
            name,
            set,
            done,
            total,
        } => {
            d.set_item("stage", "logic_codes")?;
            d.set_item("name", *name)?;
            d.set_item("set", set.to_string())?;
            d.set_item("done", done)?;
            d.set_item("total", total)?;
        }
        Progress::Analysis { name, done, total } => {
            d.set_item("stage", "analysis")?;
            d.set_item("name", *name)?;
            d.set_item("done", done)?;
            d.set_item("total", total)?;
        }
        Progress::Causal { name, done, total } => {
            d.set_item("stage", "causal")?;
            d.set_item("name", *name)?;
            d.set_item("done", done)?;
            d.set_item("total", total)?;
        }
        Progress::Figures { done, total } => {
            d.set_item("stage", "figures")?;
            d.set_item("done", done)?;
            d.set_item("total", total)?;
        }
    }
    Ok(d)
}

/// `hyperlens report --checkpoint ... --out OUT --n N --split S --seed SEED --batch B --causal-n C`:
/// writes the report into `out` and returns `(index.html path, checkpoints analysed, seconds)`.
/// `on_progress(dict)` is called at each stage, batch of codes and analysis or transplant step; an
/// exception it raises, or Ctrl-C (checked at the same points), stops the report there and is
/// raised: the staging directory is removed and a previous report at `out` stays whole.
#[pyfunction]
#[pyo3(signature = (checkpoints, out, n = 2048, split = None, seed = 0, device = "cpu", batch = 256, causal_n = 128, aggregate = false, on_progress = None))]
#[allow(clippy::too_many_arguments)]
fn report(
    py: Python<'_>,
    checkpoints: Vec<PathBuf>,
    out: PathBuf,
    n: usize,
    split: Option<String>,
    seed: u64,
    device: &str,
    batch: usize,
    causal_n: usize,
    aggregate: bool,
    on_progress: Option<Py<PyAny>>,
) -> PyResult<(PathBuf, usize, f64)> {
    // `n` and `batch` are checked by `hyperlens_report::run`, before any work.
    let device = hyperlens_model::Device::from_str(device).map_err(to_py)?;
    let split = split
        .as_deref()
        .map(hyperlens_tasks::sraven::SplitName::from_str)
        .transpose()
        .map_err(to_py)?;
    let params = ReportParams {
        checkpoints,
        out,
        n,
        split,
        seed,
        device,
        batch,
        causal_n,
        aggregate,
        ..ReportParams::default()
    };
    let s = detached(py, || {
        let mut on = Callback::new(on_progress.as_ref());
        let summary = run_report(&params, &mut |p| {
            on.step(|py, f| f.call1(py, (progress_dict(py, &p)?,)).map(drop))
        });
        on.finish(summary)
    })?;
    Ok((s.index_html, s.checkpoints, s.elapsed_s))
}

/// `hyperlens study MODEL --out OUT ...`: the latent-code study of a language model, written into
/// `out`; returns `(index.html path, verdict sentence, seconds, peak resident bytes or None)`.
/// `on_progress(dict)` receives `stage`, `done`, `total` and `unit` at every batch and analysis
/// step; an exception it raises, or Ctrl-C, stops the study there and is raised: a previous
/// report at `out` stays whole.
#[pyfunction]
#[pyo3(signature = (model, out, n_relations = 500, n_icl = 600, shots = 5, seed = 0, split_seeds = vec![0, 1, 2], batch = 16, n_bootstrap = 1000, transplant_n = 200, device = "cpu", on_progress = None))]
#[allow(clippy::too_many_arguments)]
fn lm_study(
    py: Python<'_>,
    model: PathBuf,
    out: PathBuf,
    n_relations: usize,
    n_icl: usize,
    shots: usize,
    seed: u64,
    split_seeds: Vec<u64>,
    batch: usize,
    n_bootstrap: usize,
    transplant_n: usize,
    device: &str,
    on_progress: Option<Py<PyAny>>,
) -> PyResult<(PathBuf, String, f64, Option<u64>)> {
    use hyperlens_report::lm_study::{run as run_study, LmStudyParams};
    let params = LmStudyParams {
        n_relations,
        n_icl,
        shots,
        seed,
        split_seeds,
        batch,
        n_bootstrap,
        transplant_n,
        device: hyperlens_model::Device::from_str(device).map_err(to_py)?,
        ..LmStudyParams::new(model, out)
    };
    let s = detached(py, || {
        let mut on = Callback::new(on_progress.as_ref());
        let outcome = run_study(&params, &mut |p| {
            on.step(|py, f| {
                let d = PyDict::new(py);
                d.set_item("stage", p.stage)?;
                d.set_item("done", p.done)?;
                d.set_item("total", p.total)?;
                d.set_item("unit", p.unit)?;
                f.call1(py, (d,)).map(drop)
            })
        });
        on.finish(outcome)
    })?;
    Ok((s.index_html, s.verdict, s.elapsed_s, s.peak_rss_bytes))
}

/// Registers the functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(report, m)?)?;
    m.add_function(wrap_pyfunction!(lm_study, m)?)?;
    Ok(())
}
