//! The fuzzy-logic task from Python: problem sets (sample, save, load, check) in `hyperlens.tasks`,
//! and the pieces of `hyperlens.Model`'s logic path (evaluation, latent codes) that
//! [`crate::model`]'s methods call. Every number comes from the crates the CLI calls:
//! `hyperlens_tasks::logic` (sampling, `tasks sample --task logic`), `hyperlens_train::logic`
//! (`eval`'s MSE and R²) and `hyperlens_probe::logic_code_rows` (`probe`'s codes).

use std::path::PathBuf;

use hyperlens_io::budget::{bytes_of, check_alloc};
use hyperlens_model::CodeSite;
use hyperlens_model::Evaluator;
use hyperlens_probe::{logic_code_rows, LogicRows, ProbeParams, Site};
use hyperlens_tasks::logic::{
    sample_problem_set, InputsVariant, LogicBatch, LogicParams, LogicSet, LogicSplit,
    ProblemSetParams,
};
use hyperlens_tasks::npz::{load_logic, save_logic};
use hyperlens_train::LogicSettings;
use ndarray::{s, Array1, IxDyn};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::{out, shape_error, shaped, In1, In2, In3};
use crate::errors::{check_signals, detached, raise, to_py, Kind};

/// The arrays of a logic problem set as numpy gives them (`x` float32 `[N, T, L + 1]`, `y`
/// float32 `[N]`, `targets` float32 `[N, T]`, `terms` uint8 `[N, K, L]`, `term_ids` int64
/// `[N, K]`).
pub struct LogicArrays<'py> {
    /// Inputs.
    pub x: In3<'py, f32>,
    /// The last token's target.
    pub y: In1<'py, f32>,
    /// Every token's target.
    pub targets: In2<'py, f32>,
    /// The terms' bits.
    pub terms: In3<'py, u8>,
    /// The terms' indices.
    pub term_ids: In2<'py, i64>,
}

/// Borrowed views of [`LogicArrays`] (what a call with the GIL released reads): the tasks
/// crate's [`hyperlens_tasks::logic::LogicArrays`], with the front's shape checks.
#[derive(Clone, Copy)]
pub struct LogicViews<'a>(hyperlens_tasks::logic::LogicArrays<'a>);

impl<'a> std::ops::Deref for LogicViews<'a> {
    type Target = hyperlens_tasks::logic::LogicArrays<'a>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl LogicArrays<'_> {
    /// The arrays as borrowed views (no copy).
    pub fn views(&self) -> LogicViews<'_> {
        LogicViews(hyperlens_tasks::logic::LogicArrays {
            x: self.x.as_array(),
            y: self.y.as_array(),
            targets: self.targets.as_array(),
            terms: self.terms.as_array(),
            term_ids: self.term_ids.as_array(),
        })
    }
}

/// A logic set name: `id`, `ood` or `unknown` (the CLI's `--set`).
fn parse_logic_set(set: &str) -> PyResult<LogicSet> {
    LogicSet::ALL
        .into_iter()
        .find(|s| s.name() == set)
        .ok_or_else(|| {
            raise(
                Kind::Input,
                format!("`set` must be \"id\", \"ood\" or \"unknown\", got {set:?}"),
            )
        })
}

/// The seed N of a logic split name `seed{N}`.
fn split_seed(name: &str) -> PyResult<u64> {
    name.parse::<hyperlens_tasks::sraven::SplitName>()
        .ok()
        .and_then(hyperlens_tasks::sraven::SplitName::seed)
        .ok_or_else(|| {
            raise(
                Kind::Input,
                format!("split {name:?}: the logic task takes a split seed{{N}}"),
            )
        })
}

/// The task's parameters: the training defaults (`train --task logic`, as `tasks sample --task
/// logic` uses them) with `samples` and `frac_test` when given.
fn params_of(samples: Option<usize>, frac_test: Option<f64>) -> LogicParams {
    LogicSettings::default()
        .params()
        .with_overrides(samples, frac_test)
}

/// A logic problem set's arrays as a dict (`x`, `y`, `targets` float32, `terms` uint8,
/// `term_ids` int64).
fn logic_dict<'py>(py: Python<'py>, p: LogicBatch) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("x", out(py, p.x))?;
    d.set_item("y", out(py, p.y))?;
    d.set_item("targets", out(py, p.targets))?;
    d.set_item("terms", out(py, p.terms))?;
    d.set_item("term_ids", out(py, p.term_ids.mapv(i64::from)))?;
    Ok(d)
}

/// Samples `n` fuzzy-logic sequences of `split`'s `set` with `seed`: what `hyperlens tasks sample
/// --task logic --split SPLIT --set SET --n N --seed SEED [--logic-samples S] [--logic-frac-test F]
/// [--fixed-query | --fixed-context]` writes.
#[pyfunction]
#[pyo3(signature = (split, set, n, seed, samples = None, frac_test = None, fixed_query = false, fixed_context = false))]
#[allow(clippy::too_many_arguments)]
fn sample_logic<'py>(
    py: Python<'py>,
    split: &str,
    set: &str,
    n: usize,
    seed: u64,
    samples: Option<usize>,
    frac_test: Option<f64>,
    fixed_query: bool,
    fixed_context: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let p = ProblemSetParams {
        params: params_of(samples, frac_test),
        split_seed: split_seed(split)?,
        set: parse_logic_set(set)?,
        n,
        seed,
        inputs: InputsVariant::from_flags(fixed_query, fixed_context).map_err(to_py)?,
    };
    let set = detached(py, || sample_problem_set(&p).map_err(to_py))?;
    logic_dict(py, set.problems)
}

/// The logic split's task counts: `(id, ood, unknown)` of split `seed{N}`.
#[pyfunction]
#[pyo3(signature = (split, samples = None, frac_test = None))]
fn logic_split(
    split: &str,
    samples: Option<usize>,
    frac_test: Option<f64>,
) -> PyResult<(usize, usize, usize)> {
    let s = LogicSplit::new(params_of(samples, frac_test), split_seed(split)?).map_err(to_py)?;
    Ok((s.id.len(), s.ood.len(), s.unknown.len()))
}

impl LogicViews<'_> {
    /// N, checking that the arrays agree: `x [N, T, L + 1]`, `y [N]`, `targets [N, T]`,
    /// `terms [N, K, L]`, `term_ids [N, K]`, inputs and targets finite.
    ///
    /// # Errors
    /// A `ShapeError` naming the first array that disagrees with `x`; an `InputError` for a NaN.
    pub fn check(&self) -> PyResult<usize> {
        let x = self.x;
        let (n, t, d) = x.dim();
        if n == 0 || d < 2 {
            return Err(shape_error(
                "x",
                "[N >= 1, T, L + 1 >= 2] (float32)",
                x.shape(),
            ));
        }
        let l = d - 1;
        let y = self.y;
        if y.len() != n {
            return Err(shape_error("y", &format!("[{n}] (float32)"), y.shape()));
        }
        let targets = self.targets;
        if targets.dim() != (n, t) {
            return Err(shape_error(
                "targets",
                &format!("[{n}, {t}] (float32)"),
                targets.shape(),
            ));
        }
        let terms = self.terms;
        let k = terms.dim().1;
        if terms.dim() != (n, k, l) || k == 0 {
            return Err(shape_error(
                "terms",
                &format!("[{n}, K >= 1, {l}] (uint8)"),
                terms.shape(),
            ));
        }
        let ids = self.term_ids;
        if ids.dim() != (n, k) {
            return Err(shape_error(
                "term_ids",
                &format!("[{n}, {k}] (int64)"),
                ids.shape(),
            ));
        }
        crate::arrays::check_finite("x", &x)?;
        crate::arrays::check_finite("y", &y)?;
        crate::arrays::check_finite("targets", &targets)?;
        if let Some(v) = ids.iter().find(|&&v| v < 0 || v >= 1i64 << l.min(62)) {
            return Err(raise(
                Kind::Input,
                format!("`term_ids` holds {v}, outside 0..2^{l}"),
            ));
        }
        Ok(n)
    }

    /// N, as [`Self::check`], and a `ShapeError` unless `x` is `[N, T, d_in]` of the model.
    ///
    /// # Errors
    /// As [`Self::check`]; `x` shaped unlike the model's input.
    pub fn check_for(&self, cfg: &hyperlens_model::Config) -> PyResult<usize> {
        let (_, t, d) = self.x.dim();
        if t != cfg.n_tokens || d != cfg.d_in {
            return Err(shape_error(
                "x",
                &format!("[N >= 1, {}, {}] (float32)", cfg.n_tokens, cfg.d_in),
                self.x.shape(),
            ));
        }
        self.check()
    }

    /// Sequences `a..b` as an owned batch.
    pub fn batch(&self, a: usize, b: usize) -> LogicBatch {
        LogicBatch {
            x: self.x.slice(s![a..b, .., ..]).to_owned(),
            y: self.y.slice(s![a..b]).to_owned(),
            targets: self.targets.slice(s![a..b, ..]).to_owned(),
            terms: self.terms.slice(s![a..b, .., ..]).to_owned(),
            term_ids: self.term_ids.slice(s![a..b, ..]).mapv(|v| v as u32),
        }
    }
}

/// Checks a logic problem set's arrays (`LogicProblemSet.validate`): their shapes, then their
/// values by the checks `load_logic` applies to a file (`LogicArrays::check_values`: values in
/// [0, 1], term bits that are those of their indices).
#[pyfunction]
fn validate_logic(
    x: In3<'_, f32>,
    y: In1<'_, f32>,
    targets: In2<'_, f32>,
    terms: In3<'_, u8>,
    term_ids: In2<'_, i64>,
) -> PyResult<()> {
    let a = LogicArrays {
        x,
        y,
        targets,
        terms,
        term_ids,
    };
    let a = a.views();
    a.check()?;
    let params = LogicParams {
        variables: a.x.dim().2 - 1,
        terms: a.terms.dim().1,
        samples: a.x.dim().1,
        ..LogicParams::default()
    };
    a.check_values(&params).map_err(to_py)?;
    Ok(())
}

/// Writes a logic problem set as the CLI's problem file, atomically (`save_logic`).
#[pyfunction]
fn save_logic_file(
    py: Python<'_>,
    path: PathBuf,
    x: In3<'_, f32>,
    y: In1<'_, f32>,
    targets: In2<'_, f32>,
    terms: In3<'_, u8>,
    term_ids: In2<'_, i64>,
) -> PyResult<()> {
    let a = LogicArrays {
        x,
        y,
        targets,
        terms,
        term_ids,
    };
    let a = a.views();
    let n = a.check()?;
    let set = a.batch(0, n);
    detached(py, || save_logic(&path, &set).map_err(to_py))
}

/// Reads a logic problem file of the CLI (`load_logic`), checked against the task's sizes.
#[pyfunction]
#[pyo3(signature = (path, variables = 4, terms = 2, samples = 32))]
fn load_logic_file<'py>(
    py: Python<'py>,
    path: PathBuf,
    variables: usize,
    terms: usize,
    samples: usize,
) -> PyResult<Bound<'py, PyDict>> {
    if !path.exists() {
        return Err(raise(
            Kind::NotFound,
            format!("{}: no such file", path.display()),
        ));
    }
    let params = LogicParams {
        variables,
        terms,
        samples,
        ..LogicParams::default()
    };
    let set = detached(py, || load_logic(&path, &params).map_err(to_py))?;
    logic_dict(py, set)
}

/// The batch starts of `n` sequences in batches of `batch`.
fn starts(n: usize, batch: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).step_by(batch).map(move |a| (a, (a + batch).min(n)))
}

/// `hyperlens eval --json` on a logic problem set: mean R² over the sequences whose targets vary,
/// MSE of the last token's prediction, `n` and `n_r2` (`hyperlens_train::logic_eval::evaluate_counted`
/// on chunks of `batch`, checking Ctrl-C between them).
pub fn evaluate<'py>(
    py: Python<'py>,
    ev: &Evaluator,
    a: &LogicArrays<'py>,
    batch: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let a = a.views();
    let n = a.check_for(ev.config())?;
    let (m, n_r2) = detached(py, || {
        let mut interrupted: Option<PyErr> = None;
        let chunks = starts(n, batch).map_while(|(s0, s1)| {
            if interrupted.is_some() {
                return None;
            }
            if s0 > 0 {
                if let Err(e) = check_signals() {
                    interrupted = Some(e);
                    return None;
                }
            }
            Some(Ok(a.batch(s0, s1)))
        });
        let res = hyperlens_train::logic_eval::evaluate_counted(ev, chunks, batch);
        match (res, interrupted) {
            (_, Some(e)) => Err(e),
            (r, None) => r.map_err(to_py),
        }
    })?;
    let d = PyDict::new(py);
    d.set_item("task", "logic")?;
    d.set_item("r2", m.metric)?;
    d.set_item("mse", m.loss)?;
    d.set_item("n", m.n)?;
    d.set_item("n_r2", n_r2)?;
    Ok(d)
}

/// The logic site of a `--site` string: `paper` (the last token's attention to itself) or
/// `query:I;keys:J,K,...`; SRAVEN's sites are refused with the CLI's message.
fn logic_site(site: &str, n_tokens: usize) -> PyResult<CodeSite> {
    let parsed: Site = site.parse().map_err(to_py)?;
    match parsed.logic(n_tokens) {
        Some(site) => Ok(site),
        None => Err(raise(
            Kind::Input,
            format!(
                "site {parsed} is a SRAVEN site; a logic model takes `paper` (the last token's \
                 attention to itself) or `query:I;keys:J,K,...`"
            ),
        )),
    }
}

/// `hyperlens probe` on a logic problem set, in memory: the arrays of its codes file (`codes`
/// float32 `[N, L', H, 1, K]`, `terms` int64 `[N, Kt, Lv]`, `term_ids` int64 `[N, Kt]`, `target`
/// and `prediction` float32 `[N]`, `problem` int64 `[N]`) with `site` and `layers`.
pub fn latent_codes<'py>(
    py: Python<'py>,
    ev: &Evaluator,
    a: &LogicArrays<'py>,
    site: &str,
    layers: Option<Vec<usize>>,
    batch: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let cfg = ev.config().clone();
    let site = logic_site(site, cfg.n_tokens)?;
    let layers = ProbeParams {
        site: Site::Paper,
        layers: Some(layers.unwrap_or_else(|| (0..cfg.n_layers).collect())),
    }
    .check(cfg.n_layers)
    .map_err(to_py)?;
    let a = a.views();
    let n = a.check_for(&cfg)?;
    let (kt, lv) = (a.terms.dim().1, a.terms.dim().2);
    let (h, k) = (cfg.n_heads, site.keys.len());
    let per_row = bytes_of(4, &[layers.len(), h, k + 2]) + bytes_of(8, &[kt * (lv + 1) + 1]);
    check_alloc(
        format!("the latent codes of {n} sequences"),
        per_row.saturating_mul(n as u128),
    )
    .map_err(to_py)?;
    let all = detached(py, || {
        let mut all = LogicRows::default();
        for (s0, s1) in starts(n, batch) {
            let part = a.batch(s0, s1);
            let rows = logic_code_rows(ev, &part, 0..s1 - s0, &layers, &site, s0).map_err(to_py)?;
            all.extend(rows);
            check_signals()?;
        }
        Ok(all)
    })?;
    let d = PyDict::new(py);
    let codes = shaped(all.codes, IxDyn(&[n, layers.len(), h, 1, k]), "codes")?;
    d.set_item("codes", out(py, codes))?;
    d.set_item("terms", out(py, shaped(all.terms, (n, kt, lv), "terms")?))?;
    d.set_item(
        "term_ids",
        out(py, shaped(all.term_ids, (n, kt), "term_ids")?),
    )?;
    d.set_item("target", out(py, Array1::from(all.target)))?;
    d.set_item("prediction", out(py, Array1::from(all.prediction)))?;
    d.set_item("problem", out(py, Array1::from(all.problem)))?;
    d.set_item("layers", layers)?;
    let keys: Vec<String> = site.keys.iter().map(|k| k.to_string()).collect();
    d.set_item(
        "site",
        format!("query:{};keys:{}", site.query, keys.join(",")),
    )?;
    Ok(d)
}

/// Registers the logic task's functions in `hyperlens._core.tasks`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sample_logic, m)?)?;
    m.add_function(wrap_pyfunction!(logic_split, m)?)?;
    m.add_function(wrap_pyfunction!(validate_logic, m)?)?;
    m.add_function(wrap_pyfunction!(save_logic_file, m)?)?;
    m.add_function(wrap_pyfunction!(load_logic_file, m)?)?;
    Ok(())
}
