//! `hyperlens._core.prompts`: the JSONL prompt sets of `hyperlens_tasks::prompts` (build from
//! JSON, load, save, the `icl` and `relations` generators, sites checked against the roles), for
//! `hyperlens.tasks.prompts` / `load_prompts` / `icl` / `relations`.

use std::path::PathBuf;

use hyperlens_tasks::prompts::{
    icl, relations, IclParams, PromptSet, PromptSplit, RelationsParams, SiteSpec,
};
use pyo3::prelude::*;

use crate::arrays::out;
use crate::errors::{raise, to_py, Kind};

/// A validated prompt set (`hyperlens.tasks.PromptSet` wraps it).
#[pyclass(name = "PromptSet", module = "hyperlens._core", frozen)]
pub struct PyPromptSet {
    set: PromptSet,
}

impl PyPromptSet {
    /// The set.
    pub(crate) fn set(&self) -> &PromptSet {
        &self.set
    }
}

#[pymethods]
impl PyPromptSet {
    /// The number of prompts.
    fn __len__(&self) -> usize {
        self.set.len()
    }

    /// Prompt `i` as its JSON line (the Python side parses it into a dict).
    fn prompt_json(&self, i: usize) -> PyResult<String> {
        let p = self.set.prompts.get(i).ok_or_else(|| {
            raise(
                Kind::Input,
                format!(
                    "prompt index {i} out of range for {} prompts",
                    self.set.len()
                ),
            )
        })?;
        serde_json::to_string(p).map_err(|e| raise(Kind::Other, e.to_string()))
    }

    /// Writes the set as JSONL, atomically.
    fn save(&self, path: PathBuf) -> PyResult<()> {
        self.set.save(&path).map_err(to_py)
    }

    /// The whole set as JSONL text.
    fn to_jsonl(&self) -> String {
        self.set.to_jsonl()
    }

    /// `[(name, [values sorted])]`, names sorted.
    #[getter]
    fn factors(&self) -> Vec<(String, Vec<String>)> {
        self.set
            .factors()
            .into_iter()
            .map(|f| (f.name, f.values))
            .collect()
    }

    /// int64 `[N, F]` value indices (-1 for a missing label).
    fn factor_matrix<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        out(py, self.set.factor_matrix())
    }

    /// Every prompt's split: `"train"`, `"test"` or None.
    #[getter]
    fn splits(&self) -> Vec<Option<&'static str>> {
        self.set
            .splits()
            .into_iter()
            .map(|s| s.map(PromptSplit::as_str))
            .collect()
    }

    /// Every prompt's text (its segments joined).
    fn texts(&self) -> Vec<String> {
        self.set.texts()
    }

    /// The recommended site spec, or None.
    #[getter]
    fn sites(&self) -> Option<String> {
        self.set.sites.as_ref().map(ToString::to_string)
    }

    /// Where the prompts came from (a path or a generator call).
    #[getter]
    fn origin(&self) -> String {
        self.set.origin.clone()
    }

    /// The label values and value pairs that only test prompts have.
    fn unseen_in_training(&self) -> Vec<String> {
        self.set.unseen_in_training()
    }

    /// Checks `spec` against the prompts' roles; returns `(Q, K)`.
    fn check_sites(&self, spec: &str) -> PyResult<(usize, usize)> {
        let spec = SiteSpec::parse(spec).map_err(to_py)?;
        spec.check_segments(&self.set).map_err(to_py)
    }
}

/// A prompt set from one JSON object text per prompt, validated (errors name `prompt {i}`).
#[pyfunction]
#[pyo3(signature = (items, origin = "python"))]
fn from_json_items(items: Vec<String>, origin: &str) -> PyResult<PyPromptSet> {
    let set = PromptSet::from_json_items(&items, origin).map_err(to_py)?;
    Ok(PyPromptSet { set })
}

/// Reads a JSONL prompt file (errors name the file and line).
#[pyfunction]
fn load(path: PathBuf) -> PyResult<PyPromptSet> {
    let set = PromptSet::load(&path).map_err(to_py)?;
    Ok(PyPromptSet { set })
}

/// The `icl` generator; a parameter left None takes [`IclParams::default`]'s value.
#[pyfunction]
#[pyo3(signature = (n=None, seed=0, shots=None, hold_out=None))]
fn icl_set(
    n: Option<usize>,
    seed: u64,
    shots: Option<usize>,
    hold_out: Option<f64>,
) -> PyResult<PyPromptSet> {
    let d = IclParams::default();
    let set = icl(&IclParams {
        n: n.unwrap_or(d.n),
        seed,
        shots: shots.unwrap_or(d.shots),
        hold_out: hold_out.unwrap_or(d.hold_out),
    })
    .map_err(to_py)?;
    Ok(PyPromptSet { set })
}

/// The `relations` generator; a parameter left None takes [`RelationsParams::default`]'s value
/// (`words` None = the project's word list).
#[pyfunction]
#[pyo3(signature = (n=None, seed=0, words=None, min_len=None, max_len=None, test_fraction=None))]
fn relations_set(
    n: Option<usize>,
    seed: u64,
    words: Option<Vec<String>>,
    min_len: Option<usize>,
    max_len: Option<usize>,
    test_fraction: Option<f64>,
) -> PyResult<PyPromptSet> {
    let d = RelationsParams::default();
    let set = relations(&RelationsParams {
        n: n.unwrap_or(d.n),
        seed,
        min_len: min_len.unwrap_or(d.min_len),
        max_len: max_len.unwrap_or(d.max_len),
        test_fraction: test_fraction.unwrap_or(d.test_fraction),
        words,
    })
    .map_err(to_py)?;
    Ok(PyPromptSet { set })
}

/// Fills `hyperlens._core.prompts`.
///
/// # Errors
/// A registration failure (pyo3).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPromptSet>()?;
    m.add_function(wrap_pyfunction!(from_json_items, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(icl_set, m)?)?;
    m.add_function(wrap_pyfunction!(relations_set, m)?)?;
    Ok(())
}
