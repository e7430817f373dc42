//! `hyperlens.Model`'s engine: one loaded SRAVEN / fuzzy-logic checkpoint behind
//! [`hyperlens_model::Evaluator`], with logits, evaluation, latent codes, attention patterns and
//! the hooked pass (cache and Python hooks with TransformerLens names).
//!
//! Every long call releases the GIL and checks for Ctrl-C between batches.

use std::path::PathBuf;
use std::str::FromStr;

use candle_core::{DType, Tensor};
use hyperlens_io::budget::{bytes_of, check_alloc};
use hyperlens_model::eval::evaluate_stream;
use hyperlens_model::hooks::{hook_names, select_hooks, HookFn};
use hyperlens_model::{Evaluator, ModelError};
use hyperlens_probe::extract::{code_rows, selections_of, CodeRows};
use hyperlens_probe::{ProbeParams, Site};
use hyperlens_tasks::sraven::ProblemSetView;
use ndarray::{s, Array1, Array2, ArrayD, ArrayView3, IxDyn};
use numpy::PyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::arrays::{check_finite, out, shape_error, shaped, In1, In2, In3, InDyn};
use crate::errors::{check_signals, detached, raise, to_py, Kind};
use crate::logic::LogicArrays;

/// Activations by hook name, in pass order.
pub(crate) type Activations = Vec<(String, ArrayD<f32>)>;

/// One loaded SRAVEN / fuzzy-logic model and its evaluation engine.
#[pyclass(name = "Evaluator", module = "hyperlens._core", frozen)]
pub struct PyEvaluator {
    ev: Evaluator,
}

/// An `InputError` unless `batch` is positive.
fn check_batch(batch: usize) -> PyResult<()> {
    if batch == 0 {
        return Err(raise(Kind::Input, "`batch` must be at least 1"));
    }
    Ok(())
}

/// The logits and the cached activations of a hooked pass as host arrays (shapes as the tensors').
///
/// # Errors
/// A tensor that cannot be read as float32.
pub(crate) fn cache_arrays(
    logits: &Tensor,
    cache: &[(String, Tensor)],
) -> Result<(ArrayD<f32>, Activations), ModelError> {
    let acts = cache
        .iter()
        .map(|(n, t)| Ok((n.clone(), tensor_array(t)?)))
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok((tensor_array(logits)?, acts))
}

/// [`cache_arrays`]'s result handed to Python without a copy: the logits and a list of
/// (hook name, float32 array).
///
/// # Errors
/// A failed list append.
pub(crate) fn cache_out<'py>(
    py: Python<'py>,
    logits: ArrayD<f32>,
    acts: Activations,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyList>)> {
    let list = PyList::empty(py);
    for (name, a) in acts {
        list.append((name, out(py, a)))?;
    }
    Ok((out(py, logits), list))
}

/// A candle tensor as an owned float32 array of its shape.
pub(crate) fn tensor_array(t: &Tensor) -> Result<ArrayD<f32>, ModelError> {
    let dims = t.dims().to_vec();
    let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    ArrayD::from_shape_vec(IxDyn(&dims), v)
        .map_err(|e| ModelError::Input(format!("activation shape: {e}")))
}

impl PyEvaluator {
    /// The engine.
    pub(crate) fn evaluator(&self) -> &Evaluator {
        &self.ev
    }

    /// `ShapeError` unless a SRAVEN problem set fits the model: `x [N >= 1, T, d_in]`,
    /// `y [N, F]`.
    pub(crate) fn check_problems(&self, set: &hyperlens_tasks::sraven::ProblemSet) -> PyResult<()> {
        self.check_x(&set.x.view())?;
        let (n, f) = (set.x.dim().0, self.ev.config().n_outputs);
        if set.y.dim() != (n, f) {
            return Err(shape_error(
                "y",
                &format!("[{n}, {f}] (int64)"),
                set.y.shape(),
            ));
        }
        Ok(())
    }

    /// `ShapeError` / `InputError` unless `x` is `[N >= 1, T, d_in]` and finite.
    fn check_x(&self, x: &ArrayView3<'_, f32>) -> PyResult<()> {
        let cfg = self.ev.config();
        let (n, t, m) = x.dim();
        if n == 0 || t != cfg.n_tokens || m != cfg.d_in {
            return Err(shape_error(
                "x",
                &format!("[N >= 1, {}, {}] (float32)", cfg.n_tokens, cfg.d_in),
                x.shape(),
            ));
        }
        check_finite("x", x)
    }

    /// The batch starts of `n` problems in batches of `batch`.
    fn starts(n: usize, batch: usize) -> impl Iterator<Item = (usize, usize)> {
        (0..n).step_by(batch).map(move |a| (a, (a + batch).min(n)))
    }
}

#[pymethods]
impl PyEvaluator {
    /// Loads a checkpoint directory on `device` (`cpu`, `cuda[:N]`, `metal`).
    #[staticmethod]
    #[pyo3(signature = (path, device = "cpu"))]
    fn load(py: Python<'_>, path: PathBuf, device: &str) -> PyResult<PyEvaluator> {
        let device = hyperlens_model::Device::from_str(device).map_err(to_py)?;
        if !path.join("config.json").is_file() {
            let kind = if path.exists() {
                Kind::Checkpoint
            } else {
                Kind::NotFound
            };
            return Err(raise(
                kind,
                format!(
                    "{}: not a checkpoint directory (no config.json)",
                    path.display()
                ),
            ));
        }
        let ev = detached(py, || {
            let dev = device.to_candle().map_err(to_py)?;
            Evaluator::load(&path, &dev).map_err(to_py)
        })?;
        Ok(PyEvaluator { ev })
    }

    /// Imports a `.npz` export of the paper's JAX/Flax code (`hyperlens import jax`): the model
    /// of `mixer` (a CLI name or the paper's method string) with `n_outputs` answer positions, on
    /// `device`. With `out`, the checkpoint directory is written there first (it must not exist
    /// unless `force`) and loaded from it.
    ///
    /// Errors: `CheckpointError` naming the key for a malformed export; `InputError` for an
    /// unknown mixer or an existing `out`.
    #[staticmethod]
    #[pyo3(signature = (params, mixer, n_outputs = 4, out = None, force = false, device = "cpu"))]
    fn import_jax(
        py: Python<'_>,
        params: PathBuf,
        mixer: &str,
        n_outputs: usize,
        out: Option<PathBuf>,
        force: bool,
        device: &str,
    ) -> PyResult<PyEvaluator> {
        let device = hyperlens_model::Device::from_str(device).map_err(to_py)?;
        let mixer = hyperlens_model::Mixer::from_str(mixer).map_err(to_py)?;
        if !params.is_file() {
            return Err(raise(
                Kind::NotFound,
                format!("{}: no such parameter file", params.display()),
            ));
        }
        if let Some(out) = &out {
            if out.exists() && !force {
                return Err(raise(
                    Kind::Input,
                    format!(
                        "{} already exists (pass force=True to overwrite)",
                        out.display()
                    ),
                ));
            }
        }
        let ev = detached(py, || {
            let (config, tensors) =
                hyperlens_model::import::import_jax_npz(&params, mixer, n_outputs)
                    .map_err(to_py)?;
            let dev = device.to_candle().map_err(to_py)?;
            match &out {
                Some(out) => {
                    hyperlens_model::checkpoint::save(out, &config, &tensors).map_err(to_py)?;
                    Evaluator::load(out, &dev).map_err(to_py)
                }
                None => {
                    let model = hyperlens_model::Transformer::from_tensors(
                        &config,
                        tensors.into_iter().collect(),
                        &dev,
                    )
                    .map_err(to_py)?;
                    Evaluator::new(model).map_err(to_py)
                }
            }
        })?;
        Ok(PyEvaluator { ev })
    }

    /// The model's config as a dict (`config.json`'s fields, the mixer's name and the parameter
    /// count).
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.ev.config();
        let d = PyDict::new(py);
        d.set_item("d_in", c.d_in)?;
        d.set_item("n_tokens", c.n_tokens)?;
        d.set_item("n_outputs", c.n_outputs)?;
        d.set_item("d_model", c.d_model)?;
        d.set_item("n_heads", c.n_heads)?;
        d.set_item("d_head", c.d_head)?;
        d.set_item("n_layers", c.n_layers)?;
        d.set_item("d_mlp", c.d_mlp)?;
        d.set_item("d_out", c.d_out)?;
        d.set_item("n_buckets", c.n_buckets)?;
        d.set_item("causal", c.causal)?;
        d.set_item("mixer", c.mixer.to_string())?;
        d.set_item("normalisation", c.mixer.normalisation().name())?;
        d.set_item("n_params", c.n_params())?;
        d.set_item("engine", self.ev.engine_name())?;
        Ok(d)
    }

    /// Every hook point's TransformerLens name, in pass order.
    fn hook_names(&self) -> Vec<String> {
        hook_names(self.ev.config())
    }

    /// The hook points matching any of `patterns` (names, or globs as the CLI's `--hooks`).
    fn select_hooks(&self, patterns: Vec<String>) -> PyResult<Vec<String>> {
        select_hooks(self.ev.config(), &patterns).map_err(to_py)
    }

    /// The logits, float32 [N, F, d_out], in batches of `batch`.
    #[pyo3(signature = (x, batch = 256))]
    fn logits<'py>(
        &self,
        py: Python<'py>,
        x: In3<'py, f32>,
        batch: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        check_batch(batch)?;
        let x = x.as_array();
        self.check_x(&x)?;
        let c = self.ev.config();
        let (n, f, k) = (x.dim().0, c.n_outputs, c.d_out);
        check_alloc(
            format!("the logits of {n} problems"),
            bytes_of(4, &[n, f, k]),
        )
        .map_err(to_py)?;
        let v = detached(py, || {
            let mut v = Vec::with_capacity(n * f * k);
            for (a, b) in Self::starts(n, batch) {
                v.extend(self.ev.logits(x.slice(s![a..b, .., ..])).map_err(to_py)?);
                check_signals()?;
            }
            Ok(v)
        })?;
        Ok(out(py, shaped(v, (n, f, k), "logits")?))
    }

    /// The logits [N, F, d_out] and every head's attention pattern float32 [N, L, H, T, T].
    #[pyo3(signature = (x, batch = 64))]
    fn patterns<'py>(
        &self,
        py: Python<'py>,
        x: In3<'py, f32>,
        batch: usize,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        check_batch(batch)?;
        let x = x.as_array();
        self.check_x(&x)?;
        let c = self.ev.config();
        let (n, f, k) = (x.dim().0, c.n_outputs, c.d_out);
        let (l, h, t) = (c.n_layers, c.n_heads, c.n_tokens);
        check_alloc(
            format!("the attention patterns of {n} problems"),
            bytes_of(4, &[n, l, h, t, t]),
        )
        .map_err(to_py)?;
        let (lv, pv) = detached(py, || {
            let (mut lv, mut pv) = (Vec::new(), Vec::with_capacity(n * l * h * t * t));
            for (a, b) in Self::starts(n, batch) {
                let (lo, pa) = self.ev.patterns(x.slice(s![a..b, .., ..])).map_err(to_py)?;
                lv.extend(lo);
                pv.extend(pa);
                check_signals()?;
            }
            Ok((lv, pv))
        })?;
        Ok((
            out(py, shaped(lv, (n, f, k), "logits")?),
            out(py, shaped(pv, IxDyn(&[n, l, h, t, t]), "patterns")?),
        ))
    }

    /// Accuracy (all features right), per-feature accuracy, loss and n: the dict that
    /// `hyperlens eval --json` prints.
    #[pyo3(signature = (x, y, batch = 256))]
    fn evaluate<'py>(
        &self,
        py: Python<'py>,
        x: In3<'py, f32>,
        y: In2<'py, i64>,
        batch: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        check_batch(batch)?;
        let xv = x.as_array();
        self.check_x(&xv)?;
        let yv = y.as_array();
        let c = self.ev.config();
        let n = xv.dim().0;
        if yv.dim() != (n, c.n_outputs) {
            return Err(shape_error(
                "y",
                &format!("[{n}, {}] (int64)", c.n_outputs),
                yv.shape(),
            ));
        }
        if let Some(v) = yv.iter().find(|&&v| v < 0 || v >= c.d_out as i64) {
            return Err(raise(
                Kind::Input,
                format!("`y` holds {v}, outside the classes 0..{}", c.d_out - 1),
            ));
        }
        let params = hyperlens_tasks::sraven::SravenParams {
            features: c.n_outputs,
            values: c.d_in,
            ..Default::default()
        };
        // `evaluate_stream` reads no rules: one batch of zeros, viewed by every batch.
        let no_rules = Array2::<i64>::zeros((batch.min(n), c.n_outputs));
        let m = detached(py, || {
            let mut interrupted: Option<PyErr> = None;
            let batches = Self::starts(n, batch).map_while(|(a, b)| {
                if interrupted.is_some() {
                    return None;
                }
                if a > 0 {
                    if let Err(e) = check_signals() {
                        interrupted = Some(e);
                        return Some(Err(ModelError::Input("interrupted".into())));
                    }
                }
                Some(Ok(ProblemSetView {
                    x: xv.slice(s![a..b, .., ..]),
                    y: yv.slice(s![a..b, ..]),
                    rules: no_rules.slice(s![..b - a, ..]),
                    perms: None,
                    params,
                }))
            });
            let res = evaluate_stream(&self.ev, batches, false, |_| {});
            match (res, interrupted) {
                (_, Some(e)) => Err(e),
                (r, None) => r.map_err(to_py),
            }
        })?;
        let d = PyDict::new(py);
        d.set_item("accuracy", m.metrics.accuracy)?;
        d.set_item(
            "per_feature_accuracy",
            m.metrics.per_feature_accuracy.clone(),
        )?;
        d.set_item("loss", m.metrics.loss)?;
        d.set_item("n", m.metrics.n)?;
        Ok(d)
    }

    /// The latent codes at `site` of `layers` with their labels: the arrays of the CLI's
    /// `codes.npz` (`hyperlens probe`), built in memory batch by batch.
    #[pyo3(signature = (x, y, rules, perms = None, site = "paper", layers = None, batch = 256))]
    #[allow(clippy::too_many_arguments)]
    fn latent_codes<'py>(
        &self,
        py: Python<'py>,
        x: In3<'py, f32>,
        y: In2<'py, i64>,
        rules: In2<'py, i64>,
        perms: Option<In3<'py, i64>>,
        site: &str,
        layers: Option<Vec<usize>>,
        batch: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        check_batch(batch)?;
        let site = Site::from_str(site).map_err(to_py)?;
        let cfg = self.ev.config().clone();
        let params = ProbeParams {
            site: site.clone(),
            layers,
        };
        let layers = params.check(cfg.n_layers).map_err(to_py)?;
        let selections = selections_of(&cfg, &site).map_err(to_py)?;
        let xv = x.as_array();
        self.check_x(&xv)?;
        let n = xv.dim().0;
        let f = cfg.n_outputs;
        let (yv, rv) = (y.as_array(), rules.as_array());
        if yv.dim() != (n, f) {
            return Err(shape_error("y", &format!("[{n}, {f}] (int64)"), yv.shape()));
        }
        if rv.dim() != (n, f) {
            return Err(shape_error(
                "rules",
                &format!("[{n}, {f}] (int64)"),
                rv.shape(),
            ));
        }
        let pv = perms.as_ref().map(|p| p.as_array());
        if let Some(p) = &pv {
            if p.dim() != (n, 3, f) {
                return Err(shape_error(
                    "perms",
                    &format!("[{n}, 3, {f}] (int64)"),
                    p.shape(),
                ));
            }
        }
        let (s_n, h, k) = (selections.len(), cfg.n_heads, selections[0].site.keys.len());
        let rows_n = n * s_n;
        let per_row = bytes_of(4, &[layers.len(), h, k]) + bytes_of(8, &[6 + f + k]) + 1;
        check_alloc(
            format!("the latent codes of {n} problems"),
            per_row.saturating_mul(rows_n as u128),
        )
        .map_err(to_py)?;
        let params_t = hyperlens_tasks::sraven::SravenParams {
            features: f,
            values: cfg.d_in,
            ..Default::default()
        };
        let all = detached(py, || {
            let mut all = CodeRows::default();
            for (a, b) in Self::starts(n, batch) {
                let set = ProblemSetView {
                    x: xv.slice(s![a..b, .., ..]),
                    y: yv.slice(s![a..b, ..]),
                    rules: rv.slice(s![a..b, ..]),
                    perms: pv.as_ref().map(|p| p.slice(s![a..b, .., ..])),
                    params: params_t,
                };
                set.validate().map_err(to_py)?;
                let r = code_rows(&self.ev, &set, &selections, &layers, a).map_err(to_py)?;
                all.codes.extend(r.codes);
                all.label.extend(r.label);
                all.rules.extend(r.rules);
                all.inputs.extend(r.inputs);
                all.target.extend(r.target);
                all.prediction.extend(r.prediction);
                all.correct.extend(r.correct);
                all.slot.extend(r.slot);
                all.problem.extend(r.problem);
                check_signals()?;
            }
            Ok(all)
        })?;
        let d = PyDict::new(py);
        let codes = shaped(all.codes, IxDyn(&[rows_n, layers.len(), h, 1, k]), "codes")?;
        d.set_item("codes", out(py, codes))?;
        d.set_item("label", out(py, Array1::from(all.label)))?;
        d.set_item("rules", out(py, shaped(all.rules, (rows_n, f), "rules")?))?;
        d.set_item(
            "inputs",
            out(py, shaped(all.inputs, (rows_n, k), "inputs")?),
        )?;
        d.set_item("target", out(py, Array1::from(all.target)))?;
        d.set_item("prediction", out(py, Array1::from(all.prediction)))?;
        d.set_item("correct", out(py, Array1::from(all.correct)))?;
        d.set_item("slot", out(py, Array1::from(all.slot)))?;
        d.set_item("problem", out(py, Array1::from(all.problem)))?;
        d.set_item("layers", layers)?;
        d.set_item("site", site.to_string())?;
        Ok(d)
    }

    /// `hyperlens eval --json` on a fuzzy-logic problem set (`x` float32 [N, T, L + 1], `y`
    /// float32 [N], `targets` float32 [N, T], `terms` uint8 [N, K, L], `term_ids` int64 [N, K]):
    /// `task`, `r2`, `mse`, `n`, `n_r2`.
    #[pyo3(signature = (x, y, targets, terms, term_ids, batch = 256))]
    #[allow(clippy::too_many_arguments)]
    fn logic_evaluate<'py>(
        &self,
        py: Python<'py>,
        x: In3<'py, f32>,
        y: In1<'py, f32>,
        targets: In2<'py, f32>,
        terms: In3<'py, u8>,
        term_ids: In2<'py, i64>,
        batch: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        check_batch(batch)?;
        let a = LogicArrays {
            x,
            y,
            targets,
            terms,
            term_ids,
        };
        crate::logic::evaluate(py, &self.ev, &a, batch)
    }

    /// `hyperlens probe` on a fuzzy-logic problem set (arrays as [`Self::logic_evaluate`]), in
    /// memory: the arrays of its codes file with `site` and `layers`.
    #[pyo3(signature = (x, y, targets, terms, term_ids, site = "paper", layers = None, batch = 256))]
    #[allow(clippy::too_many_arguments)]
    fn logic_latent_codes<'py>(
        &self,
        py: Python<'py>,
        x: In3<'py, f32>,
        y: In1<'py, f32>,
        targets: In2<'py, f32>,
        terms: In3<'py, u8>,
        term_ids: In2<'py, i64>,
        site: &str,
        layers: Option<Vec<usize>>,
        batch: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        check_batch(batch)?;
        let a = LogicArrays {
            x,
            y,
            targets,
            terms,
            term_ids,
        };
        crate::logic::latent_codes(py, &self.ev, &a, site, layers, batch)
    }

    /// The hooked pass keeping the activations `names` (exact hook names): the logits float32
    /// [N, F, d_out] and a list of (name, float32 array) in pass order.
    fn run_with_cache<'py>(
        &self,
        py: Python<'py>,
        x: In3<'py, f32>,
        names: Vec<String>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyList>)> {
        let xv = x.as_array();
        self.check_x(&xv)?;
        let known = hook_names(self.ev.config());
        if let Some(bad) = names.iter().find(|n| !known.contains(n)) {
            return Err(raise(
                Kind::Input,
                format!("`{bad}` is not a hook point of this model (see hook_names())"),
            ));
        }
        let (logits, acts) = detached(py, || {
            let run = || -> Result<(ArrayD<f32>, Activations), ModelError> {
                let xt = self.ev.input(xv)?;
                let (logits, cache) = self.ev.run_with_cache(&xt, &names)?;
                cache_arrays(&logits, &cache)
            };
            run().map_err(to_py)
        })?;
        cache_out(py, logits, acts)
    }

    /// The hooked pass with Python hooks: `hooks` is a list of (exact hook name, callable); each
    /// callable gets the activation (float32 numpy array) and the name and may return a float32
    /// array of the same shape to replace it. Returns the logits float32 [N, F, d_out].
    fn run_with_hooks<'py>(
        &self,
        py: Python<'py>,
        x: In3<'py, f32>,
        hooks: Vec<(String, Py<PyAny>)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let xv = x.as_array();
        self.check_x(&xv)?;
        let known = hook_names(self.ev.config());
        if let Some((bad, _)) = hooks.iter().find(|(n, _)| !known.contains(n)) {
            return Err(raise(
                Kind::Input,
                format!("`{bad}` is not a hook point of this model (see hook_names())"),
            ));
        }
        let logits = detached(py, || {
            let xt = self.ev.input(xv).map_err(to_py)?;
            let mut ph = PyHooks {
                hooks: &hooks,
                error: None,
            };
            let res = self.ev.run_with_hooks(&xt, &mut ph);
            if let Some(e) = ph.error {
                return Err(e);
            }
            let logits = res.map_err(to_py)?;
            tensor_array(&logits).map_err(to_py)
        })?;
        Ok(out(py, logits))
    }
}

/// Python callables at hook points ([`HookFn`]); the first Python error is kept and re-raised.
pub(crate) struct PyHooks<'a> {
    /// The hooks: (exact hook name, callable), in the order they run at one point.
    pub(crate) hooks: &'a [(String, Py<PyAny>)],
    /// The first Python error a hook raised.
    pub(crate) error: Option<PyErr>,
}

impl HookFn for PyHooks<'_> {
    fn wants(&self, name: &str) -> bool {
        self.hooks.iter().any(|(n, _)| n == name)
    }

    fn call(&mut self, name: &str, value: &Tensor) -> hyperlens_model::Result<Option<Tensor>> {
        let mut current = tensor_array(value)?;
        let dims = current.shape().to_vec();
        let mut replaced = false;
        let res: PyResult<()> = Python::attach(|py| {
            for (_, f) in self.hooks.iter().filter(|(n, _)| n == name) {
                let arr = PyArrayDyn::from_owned_array(py, current.clone());
                let ret = f.call1(py, (arr, name))?;
                if ret.is_none(py) {
                    continue;
                }
                let bound = ret.bind(py);
                let a: InDyn<'_, f32> = bound.extract().map_err(|_| {
                    raise(
                        Kind::Hook,
                        format!(
                            "the hook at `{name}` returned {}, not a float32 array of shape {dims:?}",
                            bound
                                .get_type()
                                .name()
                                .map(|n| n.to_string())
                                .unwrap_or_default()
                        ),
                    )
                })?;
                let view = a.as_array();
                if view.shape() != dims.as_slice() {
                    return Err(raise(
                        Kind::Hook,
                        format!(
                            "the hook at `{name}` returned an array of shape {:?}; the activation has shape {dims:?}",
                            view.shape()
                        ),
                    ));
                }
                if view.iter().any(|v| !v.is_finite()) {
                    return Err(raise(
                        Kind::Hook,
                        format!("the hook at `{name}` returned NaN or infinite values"),
                    ));
                }
                current = view.to_owned();
                replaced = true;
            }
            Ok(())
        });
        if let Err(e) = res {
            self.error = Some(e);
            return Err(ModelError::Input(format!("the hook at `{name}` failed")));
        }
        if !replaced {
            return Ok(None);
        }
        let data: Vec<f32> = current.iter().copied().collect();
        let t = Tensor::from_vec(data, dims, value.device())?.to_dtype(value.dtype())?;
        Ok(Some(t))
    }
}

/// What the run files of the checkpoint `dir` record ([`hyperlens_model::RunRecord::read`], the
/// one reader of `train.json` and `train_state.json`): a dict with `task` (`sraven` when none is
/// recorded, as for the imported paper checkpoints), `split`, `trained_by`, `steps` and
/// `planned_steps` (`None` when not recorded). Run files that cannot be read record nothing here:
/// the weights were loaded, and the files only describe how they were trained.
#[pyfunction]
fn run_record(py: Python<'_>, dir: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let r = hyperlens_model::RunRecord::read(&dir).unwrap_or_default();
    let d = PyDict::new(py);
    d.set_item("task", r.task_or_sraven().name())?;
    d.set_item("split", r.split.map(|s| s.to_string()))?;
    d.set_item("trained_by", r.trained_by)?;
    d.set_item("steps", r.steps.map(|s| s.done))?;
    d.set_item("planned_steps", r.steps.and_then(|s| s.planned))?;
    Ok(d)
}

/// Registers the class and the run-record reader.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEvaluator>()?;
    m.add_function(wrap_pyfunction!(run_record, m)?)?;
    Ok(())
}
