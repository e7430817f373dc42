//! `hyperlens.circuits`: the weights-based circuit analyses of a loaded token language model
//! (Elhage et al. 2021; `docs/spec/circuits.md`): the whole analysis that `hyperlens circuits`
//! runs (`hyperlens_probe::circuits::run`), and one head's factored OV / QK circuit with its
//! eigenvalues (`hyperlens_analysis::circuits`).

use hyperlens_analysis::circuits::{AttnWeights, CircuitParams, CompositionKind, FactoredMatrix};
use hyperlens_model::lm::LanguageModel;
use hyperlens_probe::circuits::{self, CircuitRunParams};
use ndarray::{Array1, Array2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::out;
use crate::errors::{detached, raise, to_py, Interrupt, Kind};
use crate::lm::PyLanguageModel;
use crate::records;

/// The attention weights of `lm` (norm gains folded in when `fold`), with `W_E`, `W_U`, `b_U`.
fn weights(lm: &LanguageModel, fold: bool) -> PyResult<AttnWeights<f32>> {
    let hw = lm.head_weights(fold).map_err(to_py)?;
    AttnWeights::new(hw.w_q, hw.w_k, hw.w_v, hw.w_o)
        .and_then(|w| w.with_embeddings(Some(hw.w_e), Some(hw.w_u), Some(hw.b_u)))
        .map_err(to_py)
}

/// `hyperlens circuits` on the loaded model, in memory (`hyperlens_probe::circuits::run`, the
/// CLI's function): OV and full-OV eigenvalues and copying scores, Q/K/V composition scores of
/// every head pair with the random-matrix baseline, head scores on `n_seqs` repeated random
/// sequences (one at a time, Ctrl-C checked between them), the named heads. Returns a dict of
/// arrays (`ov_re`, `ov_im`, `full_ov_re`, `full_ov_im` float64 `[L, H, d_head]`; `ov_copying`,
/// `full_ov_copying`, `rep_induction`, `rep_previous`, `rep_duplicate` float64 `[L, H]`;
/// `composition_{q,k,v}` float64 `[L, H, L, H]`; `baseline_{q,k,v}` float64 `[samples]` sorted),
/// the tables by file name as dicts of columns (`tables`), the findings of `summary.json` as a
/// dict (`summary`) and the repeated segment's length (`seq_len`).
#[pyfunction]
#[pyo3(signature = (model, seq_len = None, seed = 0, n_seqs = 8, bos = None, threshold = 0.4, baseline_samples = 1000, top = 20, fold_norm = true, threads = 0))]
#[allow(clippy::too_many_arguments)]
fn analyze<'py>(
    py: Python<'py>,
    model: &PyLanguageModel,
    seq_len: Option<usize>,
    seed: u64,
    n_seqs: usize,
    bos: Option<u32>,
    threshold: f64,
    baseline_samples: usize,
    top: usize,
    fold_norm: bool,
    threads: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let params = CircuitRunParams {
        seq_len,
        n_seqs,
        bos,
        fold_norm,
        analysis: CircuitParams {
            threshold,
            baseline_samples,
            seed,
            top,
            threads,
        },
    };
    let lm = model.lm();
    let run = detached(py, || {
        let stop = Interrupt::default();
        let r = circuits::run(lm, &params, &mut |_| stop.check());
        stop.finish(r)
    })?;
    let report = &run.report;
    let d = PyDict::new(py);
    d.set_item("ov_re", out(py, report.ov.re.clone()))?;
    d.set_item("ov_im", out(py, report.ov.im.clone()))?;
    d.set_item("full_ov_re", out(py, report.full_ov.re.clone()))?;
    d.set_item("full_ov_im", out(py, report.full_ov.im.clone()))?;
    d.set_item("ov_copying", out(py, report.ov_copying.clone()))?;
    d.set_item("full_ov_copying", out(py, report.full_ov_copying.clone()))?;
    d.set_item("rep_induction", out(py, report.heads.rep_induction.clone()))?;
    d.set_item("rep_previous", out(py, report.heads.rep_previous.clone()))?;
    d.set_item("rep_duplicate", out(py, report.heads.rep_duplicate.clone()))?;
    for k in CompositionKind::ALL {
        if let Some(s) = report.composition.get(k) {
            d.set_item(format!("composition_{k}"), out(py, s.clone()))?;
        }
        let b = Array1::from(report.baseline.samples(k).to_vec());
        d.set_item(format!("baseline_{k}"), out(py, b))?;
    }
    let tables = PyDict::new(py);
    for (name, t) in report.tables().map_err(to_py)? {
        tables.set_item(name, records::table(py, &t)?)?;
    }
    d.set_item("tables", tables)?;
    d.set_item(
        "summary",
        records::record(py, &report.summary().map_err(to_py)?)?,
    )?;
    d.set_item("seq_len", run.plan.seq_len)?;
    Ok(d)
}

/// One head's circuit as a factored matrix `A B` (TransformerLens's `FactoredMatrix`): `kind`
/// `ov` (`W_V W_O`, `[D, D]` of rank `d_head`), `qk` (`W_Q W_K^T`), `full_ov`
/// (`W_E W_V W_O W_U`, `[V, V]`) or `full_qk` (`W_E W_Q W_K^T W_E^T`). Returns `a` float64
/// `[rows, m]`, `b` float64 `[m, cols]`, the eigenvalues' `eig_re`, `eig_im` float64 `[m]`
/// (descending modulus; square circuits), the `singular_values` float64 `[m]` and the copying
/// score `Re(sum λ) / sum |λ|`.
#[pyfunction]
#[pyo3(signature = (model, layer, head, kind = "ov", fold_norm = true))]
fn circuit<'py>(
    py: Python<'py>,
    model: &PyLanguageModel,
    layer: usize,
    head: usize,
    kind: &str,
    fold_norm: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let lm = model.lm();
    let (nl, nh) = (lm.n_layers(), lm.n_heads());
    if layer >= nl || head >= nh {
        return Err(raise(
            Kind::Input,
            format!("head L{layer}H{head} is outside the model's {nl} layers x {nh} heads"),
        ));
    }
    let f: fn(&AttnWeights<f32>, usize, usize) -> hyperlens_analysis::Result<FactoredMatrix> =
        match kind {
            "ov" => AttnWeights::ov_circuit,
            "qk" => AttnWeights::qk_circuit,
            "full_ov" => AttnWeights::full_ov_circuit,
            "full_qk" => AttnWeights::full_qk_circuit,
            other => {
                return Err(raise(
                    Kind::Input,
                    format!("`kind` must be ov, qk, full_ov or full_qk, got {other:?}"),
                ))
            }
        };
    let (a, b, eig, sv) = detached(py, || {
        let w = weights(lm, fold_norm)?;
        let m = f(&w, layer, head).map_err(to_py)?;
        let eig = m.eigenvalues().map_err(to_py)?;
        let sv = m.singular_values().map_err(to_py)?;
        Ok((m.a().to_owned(), m.b().to_owned(), eig, sv))
    })?;
    let d = PyDict::new(py);
    d.set_item("copying_score", eig.copying_score())?;
    let (re, im): (Vec<f64>, Vec<f64>) = eig_parts(&eig);
    d.set_item("a", out(py, a))?;
    d.set_item("b", out(py, b))?;
    d.set_item("eig_re", out(py, Array1::from(re)))?;
    d.set_item("eig_im", out(py, Array1::from(im)))?;
    d.set_item("singular_values", out(py, sv))?;
    Ok(d)
}

/// The real and imaginary parts of eigenvalues.
fn eig_parts(e: &hyperlens_analysis::circuits::Eigenvalues) -> (Vec<f64>, Vec<f64>) {
    (e.re.to_vec(), e.im.to_vec())
}

/// The OV and full-OV copying scores of every head, float64 `[L, H]` each (`ov`, `full_ov`).
#[pyfunction]
#[pyo3(signature = (model, fold_norm = true))]
fn copying_scores<'py>(
    py: Python<'py>,
    model: &PyLanguageModel,
    fold_norm: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let lm = model.lm();
    let (ov, full): (Array2<f64>, Array2<f64>) = detached(py, || {
        let w = weights(lm, fold_norm)?;
        Ok((
            w.ov_copying_scores().map_err(to_py)?,
            w.full_ov_copying_scores().map_err(to_py)?,
        ))
    })?;
    Ok((out(py, ov), out(py, full)))
}

/// Registers the submodule's functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(analyze, m)?)?;
    m.add_function(wrap_pyfunction!(circuit, m)?)?;
    m.add_function(wrap_pyfunction!(copying_scores, m)?)?;
    Ok(())
}
