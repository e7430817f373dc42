//! `hyperlens.patching`: interventions on a SRAVEN model through its hook points, each a call of
//! the probe crate's function that `hyperlens patch` calls: head ablation
//! ([`hyperlens_probe::head_ablation`], `patch heads`), activation patching
//! ([`hyperlens_probe::activation_patching`] on [`hyperlens_probe::feature_swap_pairs`], `patch
//! acts`), direct logit attribution ([`hyperlens_probe::direct_logit_attribution`], `patch dla`)
//! and the latent-code transplant ([`hyperlens_probe::latent_transplant`], `patch transplant`).
//! The results are plain dicts of numbers and numpy arrays; `python/hyperlens/patching.py` wraps
//! them.

use std::str::FromStr;

use hyperlens_probe::{
    ablation_table, activation_patching, direct_logit_attribution, dla_table, feature_swap_pairs,
    head_ablation, latent_transplant, patching_table, transplant_table, Ablation, ProbeError,
};
use hyperlens_tasks::sraven::ProblemSet;
use ndarray::{Array1, Array2};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::arrays::{out, shaped, In2, In3};
use crate::errors::{detached, raise, to_py, Interrupt, Kind};
use crate::model::PyEvaluator;
use crate::records;
use crate::tasks::problem_set;

/// An `InputError` unless `batch` is positive.
fn check_batch(batch: usize) -> PyResult<()> {
    if batch == 0 {
        return Err(raise(Kind::Input, "`batch` must be at least 1"));
    }
    Ok(())
}

/// The model's metrics as a dict: `accuracy`, `per_feature_accuracy`, `loss`, `n`.
fn metrics_dict<'py>(
    py: Python<'py>,
    m: &hyperlens_model::eval::EvalMetrics,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("accuracy", m.accuracy)?;
    d.set_item("per_feature_accuracy", m.per_feature_accuracy.clone())?;
    d.set_item("loss", m.loss)?;
    d.set_item("n", m.n)?;
    Ok(d)
}

/// `patch heads`: every head ablated in turn (`zero` or `mean` at `blocks.{l}.attn.hook_z`) over
/// the problems in batches of `batch` (the CLI's batches of a problem file): `ablation`, `base`
/// (the metrics without ablation), `accuracy` and `loss` float64 `[L, H]`. Ctrl-C is checked
/// between batches.
#[pyfunction]
#[pyo3(signature = (model, x, y, rules, perms = None, ablation = "mean", batch = 128))]
#[allow(clippy::too_many_arguments)]
fn head_ablation_report<'py>(
    py: Python<'py>,
    model: &PyEvaluator,
    x: In3<'py, f32>,
    y: In2<'py, i64>,
    rules: In2<'py, i64>,
    perms: Option<In3<'py, i64>>,
    ablation: &str,
    batch: usize,
) -> PyResult<Bound<'py, PyDict>> {
    check_batch(batch)?;
    let ablation = Ablation::from_str(ablation).map_err(|e| raise(Kind::Input, e))?;
    let set = problem_set(&x, &y, &rules, perms.as_ref())?;
    model.check_problems(&set)?;
    let ev = model.evaluator();
    let cfg = ev.config().clone();
    let report = detached(py, || {
        let n = set.len();
        let stop = Interrupt::default();
        let r = {
            let (set, stop) = (&set, &stop);
            // Ctrl-C is checked before every batch of every pass, and after every pass
            let mut stream =
                move || -> Box<dyn Iterator<Item = hyperlens_probe::Result<ProblemSet>> + '_> {
                    Box::new((0..n).step_by(batch).map(move |s| {
                        if stop.check().is_break() {
                            return Err(ProbeError::Interrupted);
                        }
                        Ok(set.slice(s, (s + batch).min(n)))
                    }))
                };
            head_ablation(ev, &mut stream, ablation, |_, _| stop.check())
        };
        stop.finish(r)
    })?;
    let (l_n, h_n) = (cfg.n_layers, cfg.n_heads);
    let mut acc = Array2::<f64>::zeros((l_n, h_n));
    let mut loss = Array2::<f64>::zeros((l_n, h_n));
    for h in &report.heads {
        acc[[h.layer, h.head]] = h.accuracy;
        loss[[h.layer, h.head]] = h.loss;
    }
    let d = PyDict::new(py);
    d.set_item("ablation", report.ablation.to_string())?;
    d.set_item(
        "table",
        records::table(py, &ablation_table(&report).map_err(to_py)?)?,
    )?;
    d.set_item("base", metrics_dict(py, &report.base)?)?;
    d.set_item("accuracy", out(py, acc))?;
    d.set_item("loss", out(py, loss))?;
    Ok(d)
}

/// `patch acts`: clean problems paired with corrupted twins (the slot's feature swapped in from
/// the next problem whose answer there differs), every activation patched alone from the clean
/// into the corrupted pass: `n`, `slot`, `clean_logit_diff`, `corrupted_logit_diff`,
/// `resid_pre` / `attn_out` / `mlp_out` float64 `[L, T]` (`mlp_out` None without MLPs),
/// `head_out` float64 `[L, H]`, and the pairs: `source` int64 `[N, 2]`, `clean_answer`,
/// `corrupted_answer` int64 `[N]`. Ctrl-C is checked after every forward pass.
#[pyfunction]
#[pyo3(signature = (model, x, y, rules, perms = None, slot = 3, batch = 128))]
#[allow(clippy::too_many_arguments)]
fn activation_patching_report<'py>(
    py: Python<'py>,
    model: &PyEvaluator,
    x: In3<'py, f32>,
    y: In2<'py, i64>,
    rules: In2<'py, i64>,
    perms: Option<In3<'py, i64>>,
    slot: usize,
    batch: usize,
) -> PyResult<Bound<'py, PyDict>> {
    check_batch(batch)?;
    let set = problem_set(&x, &y, &rules, perms.as_ref())?;
    model.check_problems(&set)?;
    let ev = model.evaluator();
    let (pairs, r) = detached(py, || {
        let pairs = feature_swap_pairs(&set, slot).map_err(to_py)?;
        let stop = Interrupt::default();
        let r = activation_patching(ev, &pairs, batch, |_, _| stop.check());
        Ok((pairs, stop.finish(r)?))
    })?;
    let d = PyDict::new(py);
    d.set_item(
        "table",
        records::table(py, &patching_table(&r).map_err(to_py)?)?,
    )?;
    d.set_item("n", r.n)?;
    d.set_item("slot", r.slot)?;
    d.set_item("clean_logit_diff", r.clean_logit_diff)?;
    d.set_item("corrupted_logit_diff", r.corrupted_logit_diff)?;
    d.set_item("resid_pre", out(py, r.resid_pre))?;
    d.set_item("attn_out", out(py, r.attn_out))?;
    match r.mlp_out {
        Some(m) => d.set_item("mlp_out", out(py, m))?,
        None => d.set_item("mlp_out", py.None())?,
    }
    d.set_item("head_out", out(py, r.head_out))?;
    let src: Vec<i64> = pairs
        .source
        .iter()
        .flat_map(|&(i, j)| [i as i64, j as i64])
        .collect();
    d.set_item("source", out(py, shaped(src, (pairs.len(), 2), "source")?))?;
    let ans = |v: &[usize]| Array1::from_iter(v.iter().map(|&a| a as i64));
    d.set_item("clean_answer", out(py, ans(&pairs.clean_answer)))?;
    d.set_item("corrupted_answer", out(py, ans(&pairs.corrupted_answer)))?;
    Ok(d)
}

/// `patch dla`: direct logit attribution of the answer logit at `slots` (all by default) to the
/// embedding, each head, each attention bias and each MLP, with the final LayerNorm's scale
/// frozen: the fields of `dla.json` (`heads` and `heads_centred` float64 `[L, H]`, `mlp`,
/// `mlp_centred`, `attn_bias`, `attn_bias_centred` float64 `[L]`, and the scalars). Ctrl-C is
/// checked after every batch.
#[pyfunction]
#[pyo3(signature = (model, x, y, rules, perms = None, slots = None, batch = 128))]
#[allow(clippy::too_many_arguments)]
fn dla_report<'py>(
    py: Python<'py>,
    model: &PyEvaluator,
    x: In3<'py, f32>,
    y: In2<'py, i64>,
    rules: In2<'py, i64>,
    perms: Option<In3<'py, i64>>,
    slots: Option<Vec<usize>>,
    batch: usize,
) -> PyResult<Bound<'py, PyDict>> {
    check_batch(batch)?;
    let set = problem_set(&x, &y, &rules, perms.as_ref())?;
    model.check_problems(&set)?;
    let ev = model.evaluator();
    let f = ev.config().n_outputs;
    let slots = slots.unwrap_or_else(|| (0..f).collect());
    if let Some(s) = slots.iter().find(|&&s| s >= f) {
        return Err(raise(
            Kind::Input,
            format!("slot {s}: the model has {f} answer slots"),
        ));
    }
    let r = detached(py, || {
        let stop = Interrupt::default();
        let r = direct_logit_attribution(ev, &set, &slots, batch, |_, _| stop.check());
        stop.finish(r)
    })?;
    let d = PyDict::new(py);
    d.set_item("table", records::table(py, &dla_table(&r).map_err(to_py)?)?)?;
    d.set_item("n", r.n)?;
    d.set_item("slots", r.slots)?;
    d.set_item("logit", r.logit)?;
    d.set_item("logit_centred", r.logit_centred)?;
    d.set_item("embed", r.embed)?;
    d.set_item("embed_centred", r.embed_centred)?;
    d.set_item("constant", r.constant)?;
    d.set_item("constant_centred", r.constant_centred)?;
    d.set_item("heads", out(py, r.heads))?;
    d.set_item("heads_centred", out(py, r.heads_centred))?;
    d.set_item("mlp", out(py, Array1::from(r.mlp)))?;
    d.set_item("mlp_centred", out(py, Array1::from(r.mlp_centred)))?;
    d.set_item("attn_bias", out(py, Array1::from(r.attn_bias)))?;
    d.set_item(
        "attn_bias_centred",
        out(py, Array1::from(r.attn_bias_centred)),
    )?;
    d.set_item("max_error", r.max_error)?;
    Ok(d)
}

/// `patch transplant`: the mean ID code of another rule transplanted into OOD problems at the
/// slot's site, layer by layer, with the controls: one dict per row of `transplant.csv` (`layer`,
/// `kind`, `n`, `to_donor`, `elsewhere`, `unchanged`, `excluded`, `max_logit_change`), and the
/// table as a dict of its columns. Ctrl-C is checked after every batch (every layer of an OOD batch).
#[pyfunction]
#[pyo3(signature = (model, id_x, id_y, id_rules, ood_x, ood_y, ood_rules, slot = 3, batch = 128, seed = 0))]
#[allow(clippy::too_many_arguments)]
fn transplant_rows<'py>(
    py: Python<'py>,
    model: &PyEvaluator,
    id_x: In3<'py, f32>,
    id_y: In2<'py, i64>,
    id_rules: In2<'py, i64>,
    ood_x: In3<'py, f32>,
    ood_y: In2<'py, i64>,
    ood_rules: In2<'py, i64>,
    slot: usize,
    batch: usize,
    seed: u64,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyDict>)> {
    check_batch(batch)?;
    let id = problem_set(&id_x, &id_y, &id_rules, None)?;
    let ood = problem_set(&ood_x, &ood_y, &ood_rules, None)?;
    model.check_problems(&id)?;
    model.check_problems(&ood)?;
    let ev = model.evaluator();
    let rows = detached(py, || {
        let stop = Interrupt::default();
        let r = latent_transplant(ev, &id, &ood, slot, batch, seed, |_, _| stop.check());
        stop.finish(r)
    })?;
    let list = PyList::empty(py);
    let table = records::table(py, &transplant_table(&rows).map_err(to_py)?)?;
    for r in rows {
        let d = PyDict::new(py);
        d.set_item("layer", r.layer)?;
        d.set_item("kind", r.kind.as_str())?;
        d.set_item("n", r.n)?;
        d.set_item("to_donor", r.to_donor)?;
        d.set_item("elsewhere", r.elsewhere)?;
        d.set_item("unchanged", r.unchanged)?;
        d.set_item("excluded", r.excluded)?;
        d.set_item("max_logit_change", r.max_logit_change)?;
        list.append(d)?;
    }
    Ok((list, table))
}

/// Registers the submodule's functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(head_ablation_report, m)?)?;
    m.add_function(wrap_pyfunction!(activation_patching_report, m)?)?;
    m.add_function(wrap_pyfunction!(dla_report, m)?)?;
    m.add_function(wrap_pyfunction!(transplant_rows, m)?)?;
    Ok(())
}
