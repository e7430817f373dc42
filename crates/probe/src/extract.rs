//! Streaming extraction of latent codes with their labels.
//!
//! For each batch of problems the model runs once on the device with attention capture; the
//! normalised attention of the selected layers is indexed at the site's query and keys on the device,
//! and only those `[B, L, H, Q, K]` values, the labels and the predictions travel to the host, where
//! they are appended to the streaming `.npz` ([`crate::npz_stream`]). Peak memory is bounded by the
//! batch size, not by the number of problems (docs/spec/latent-codes.md, "Outputs users expect").

use std::path::Path;

use candle_core::{IndexOp, Tensor};
use hyperlens_io::keys::codes as keys;
use hyperlens_model::eval::batch_tensor;
use hyperlens_model::infer::TakeCodesFrom;
use hyperlens_model::{Inference, Transformer};
use hyperlens_tasks::sraven::ProblemSet;
use serde::{Deserialize, Serialize};

use crate::error::{ProbeError, Result};
use crate::npz_stream::{NpyDtype, NpzStream};
use crate::site::{Selection, Site};

/// What a probe run extracts.
#[derive(Debug, Clone)]
pub struct ProbeParams {
    /// The site (query/key selection and label).
    pub site: Site,
    /// Layers to keep, in output order; `None` = all layers.
    pub layers: Option<Vec<usize>>,
}

impl ProbeParams {
    /// Checks the layer selection against the model.
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] for an empty, repeated or out-of-range layer list.
    pub fn check(&self, n_layers: usize) -> Result<Vec<usize>> {
        let layers = match &self.layers {
            None => (0..n_layers).collect::<Vec<_>>(),
            Some(l) => l.clone(),
        };
        if layers.is_empty() {
            return Err(ProbeError::InvalidInput(
                "the layer selection is empty".into(),
            ));
        }
        for (i, &l) in layers.iter().enumerate() {
            if l >= n_layers {
                return Err(ProbeError::InvalidInput(format!(
                    "layer {l} out of range: the model has {n_layers} layers"
                )));
            }
            if layers[..i].contains(&l) {
                return Err(ProbeError::InvalidInput(format!(
                    "layer {l} selected twice"
                )));
            }
        }
        Ok(layers)
    }
}

/// The JSON sidecar written next to the codes (`codes.npz` -> `codes.json`,
/// `hyperlens_io::sidecar_path`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProbeMeta {
    /// Checkpoint directory the model came from.
    pub checkpoint: String,
    /// The model's mixer (CLI name).
    pub mixer: String,
    /// The normalisation that produced the codes (softmax, none, rms_head).
    pub normalisation: String,
    /// Where the problems came from: a file path or `generated`.
    pub problems: String,
    /// Split name, if generated.
    pub split: Option<String>,
    /// `id` or `ood`, if generated.
    pub set: Option<String>,
    /// Problem seed, if generated.
    pub seed: Option<u64>,
    /// Whether the problems are unpermuted, if known.
    pub unpermuted: Option<bool>,
    /// Site in CLI form.
    pub site: String,
    /// Per stacked row: query, keys and answer slot.
    pub selections: Vec<SelectionMeta>,
    /// Layers kept, in the order of the `codes` layer axis.
    pub layers: Vec<usize>,
    /// Number of heads.
    pub heads: usize,
    /// Number of problems.
    pub n_problems: usize,
    /// Number of rows (problems x selections).
    pub n_rows: usize,
    /// Array shapes, e.g. `codes: [N, L, H, Q, K]`.
    pub shapes: std::collections::BTreeMap<String, Vec<usize>>,
    /// hyperlens version that wrote the file.
    pub version: String,
}

/// A [`Selection`] in the sidecar.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SelectionMeta {
    /// Query position.
    pub query: usize,
    /// Key positions.
    pub keys: Vec<usize>,
    /// Answer slot labelling the row.
    pub slot: usize,
}

/// Summary of a finished probe run.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSummary {
    /// Rows written.
    pub n_rows: usize,
    /// Fraction of rows whose answer slot the model predicts correctly.
    pub slot_accuracy: f64,
}

/// Extracts the codes of `model` over `batches` (which must yield `n_problems` problems in total)
/// and writes them to `out` (`.npz`) with the sidecar `meta` completed and written beside it.
///
/// Arrays written (row = `problem * S + selection` for `S` stacked selections):
/// `codes` f32 `[N, L, H, 1, K]`, `label` i64 `[N]` (rule of the feature shown in the row's answer
/// slot), `rules` i64 `[N, F]` (the task's rule per unpermuted slot), `inputs` i64 `[N, K]` (values of
/// the key tokens; -1 for a query token), `target` i64 `[N]`, `prediction` i64 `[N]`, `correct` bool
/// `[N]` (prediction == target for the row's slot), `slot` i64 `[N]`, `problem` i64 `[N]`.
///
/// # Shapes
/// Each batch: `x [B, T, M]`, `y [B, F]`, `rules [B, F]`, optional `perms [B, 3, F]`.
///
/// # Errors
/// Invalid site/layers, batches that do not fit the model or do not add up to `n_problems`, candle
/// and I/O errors. On error no output file is left behind.
pub fn extract<I, P>(
    model: &Transformer,
    batches: I,
    n_problems: usize,
    params: &ProbeParams,
    out: &Path,
    mut meta: ProbeMeta,
    mut progress: P,
) -> Result<ProbeSummary>
where
    I: IntoIterator<Item = Result<ProblemSet>>,
    P: FnMut(usize),
{
    let cfg = model.config().clone();
    let layers = params.check(cfg.n_layers)?;
    let task_params = hyperlens_tasks::sraven::SravenParams {
        features: cfg.n_outputs,
        values: cfg.d_in,
        ..Default::default()
    };
    let selections: Vec<Selection> = params.site.resolve(&task_params)?;
    if task_params.n_tokens() != cfg.n_tokens {
        return Err(ProbeError::InvalidInput(format!(
            "the model reads {} tokens; SRAVEN problems with {} features have {}",
            cfg.n_tokens,
            cfg.n_outputs,
            task_params.n_tokens()
        )));
    }
    let n_keys = selections[0].keys.len();
    let (h, f, s) = (cfg.n_heads, cfg.n_outputs, selections.len());
    let n_rows = n_problems * s;
    // On the CPU, the evaluation-mode pass without candle (`hyperlens_model::infer`).
    let inference = model
        .device()
        .is_cpu()
        .then(|| Inference::new(model))
        .transpose()?;

    let mut w = NpzStream::create(out)?;
    let codes_id = w.add_array(
        keys::CODES,
        NpyDtype::F32,
        &[n_rows, layers.len(), h, 1, n_keys],
    )?;
    let label_id = w.add_array(keys::LABEL, NpyDtype::I64, &[n_rows])?;
    let rules_id = w.add_array(keys::RULES, NpyDtype::I64, &[n_rows, f])?;
    let inputs_id = w.add_array(keys::INPUTS, NpyDtype::I64, &[n_rows, n_keys])?;
    let target_id = w.add_array(keys::TARGET, NpyDtype::I64, &[n_rows])?;
    let pred_id = w.add_array(keys::PREDICTION, NpyDtype::I64, &[n_rows])?;
    let correct_id = w.add_array(keys::CORRECT, NpyDtype::Bool, &[n_rows])?;
    let slot_id = w.add_array(keys::SLOT, NpyDtype::I64, &[n_rows])?;
    let problem_id = w.add_array(keys::PROBLEM, NpyDtype::I64, &[n_rows])?;

    let mut done = 0usize;
    let mut n_correct = 0usize;
    for batch in batches {
        let batch = batch?;
        let b = batch.len();
        if b == 0 {
            continue;
        }
        if done + b > n_problems {
            return Err(ProbeError::InvalidInput(format!(
                "the problem batches hold more than the announced {n_problems} problems"
            )));
        }
        let (_, t, m) = batch.x.dim();
        if t != cfg.n_tokens
            || m != cfg.d_in
            || batch.y.dim() != (b, f)
            || batch.rules.dim() != (b, f)
        {
            return Err(ProbeError::InvalidInput(format!(
                "problem batch x {:?}, y {:?}, rules {:?} does not fit the model (T {}, M {}, F {})",
                batch.x.shape(),
                batch.y.shape(),
                batch.rules.shape(),
                cfg.n_tokens,
                cfg.d_in,
                f
            )));
        }
        // Codes [B, S, L', H, K] and the predicted class per slot [B, F].
        let (batch_codes, logits) = batch_codes(
            model,
            inference.as_ref(),
            batch.x.view(),
            &selections,
            &layers,
        )?;
        let pred = argmax_rows(&logits, cfg.d_out);
        let row_len = layers.len() * h * n_keys;
        let mut codes = Vec::with_capacity(b * s * layers.len() * h * n_keys);
        let (
            mut label,
            mut rules,
            mut inputs,
            mut target,
            mut prediction,
            mut correct,
            mut slot,
            mut problem,
        ) = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        for i in 0..b {
            for (si, sel) in selections.iter().enumerate() {
                codes.extend_from_slice(&batch_codes[(i * s + si) * row_len..][..row_len]);
                // The feature shown in answer slot `sel.slot` (column 2's permutation).
                let feature = match &batch.perms {
                    Some(p) => {
                        let v = p[[i, 2, sel.slot]];
                        usize::try_from(v).ok().filter(|&v| v < f).ok_or_else(|| {
                            ProbeError::InvalidInput(format!(
                                "perms[{i}, 2, {}] = {v} is not a slot",
                                sel.slot
                            ))
                        })?
                    }
                    None => sel.slot,
                };
                label.push(batch.rules[[i, feature]]);
                rules.extend(batch.rules.row(i).iter().copied());
                for &k in &sel.keys {
                    let row = batch.x.slice(ndarray::s![i, k, ..]);
                    let v = row.iter().position(|&v| v > 0.5).map_or(-1, |p| p as i64);
                    inputs.push(v);
                }
                let tgt = batch.y[[i, sel.slot]];
                let p = pred[i * f + sel.slot] as i64;
                target.push(tgt);
                prediction.push(p);
                correct.push(p == tgt);
                n_correct += usize::from(p == tgt);
                slot.push(sel.slot as i64);
                problem.push((done + i) as i64);
            }
        }
        w.append_f32(codes_id, &codes)?;
        w.append_i64(label_id, &label)?;
        w.append_i64(rules_id, &rules)?;
        w.append_i64(inputs_id, &inputs)?;
        w.append_i64(target_id, &target)?;
        w.append_i64(pred_id, &prediction)?;
        w.append_bool(correct_id, &correct)?;
        w.append_i64(slot_id, &slot)?;
        w.append_i64(problem_id, &problem)?;
        done += b;
        progress(done);
    }
    if done != n_problems {
        return Err(ProbeError::InvalidInput(format!(
            "the problem batches held {done} problems, {n_problems} were announced"
        )));
    }

    meta.site = params.site.to_string();
    meta.selections = selections
        .iter()
        .map(|s| SelectionMeta {
            query: s.query,
            keys: s.keys.clone(),
            slot: s.slot,
        })
        .collect();
    meta.layers = layers.clone();
    meta.heads = h;
    meta.n_problems = n_problems;
    meta.n_rows = n_rows;
    meta.mixer = cfg.mixer.to_string();
    meta.normalisation = cfg.mixer.normalisation().name().to_string();
    meta.shapes = [
        (keys::CODES, vec![n_rows, layers.len(), h, 1, n_keys]),
        (keys::LABEL, vec![n_rows]),
        (keys::RULES, vec![n_rows, f]),
        (keys::INPUTS, vec![n_rows, n_keys]),
        (keys::TARGET, vec![n_rows]),
        (keys::PREDICTION, vec![n_rows]),
        (keys::CORRECT, vec![n_rows]),
        (keys::SLOT, vec![n_rows]),
        (keys::PROBLEM, vec![n_rows]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    meta.version = env!("CARGO_PKG_VERSION").to_string();
    w.finish()?;
    hyperlens_io::write_sidecar(out, &meta)?;
    Ok(ProbeSummary {
        n_rows,
        slot_accuracy: if n_rows == 0 {
            0.0
        } else {
            n_correct as f64 / n_rows as f64
        },
    })
}

/// The codes of one batch at `selections` and `layers`, `[B, S, L', H, K]` (problem-major, then
/// selection, layer, head, key), and the logits `[B, F, C]`: by the CPU pass of [`Inference`] when
/// one is given, else by the candle forward pass on the model's device.
///
/// # Shapes
/// `x [B, T, d_in]`.
///
/// # Errors
/// Input errors of [`Inference::run`]; candle errors.
pub(crate) fn batch_codes(
    model: &Transformer,
    inference: Option<&Inference>,
    x: ndarray::ArrayView3<f32>,
    selections: &[Selection],
    layers: &[usize],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let cfg = model.config();
    let (t, h) = (cfg.n_tokens, cfg.n_heads);
    let n_keys = selections.first().map_or(0, |s| s.keys.len());
    let n_layers = layers.len();
    let Some(inf) = inference else {
        let xt = batch_tensor(&x.to_owned(), model.device())?;
        let fwd = model.forward(&xt, true)?;
        let attention = fwd
            .attention
            .ok_or_else(|| ProbeError::InvalidInput("the model returned no attention".into()))?;
        // Per selection and layer: [B, 1, H, K] on the device, stacked to [B, S, L', H, K].
        let mut parts = Vec::with_capacity(selections.len() * n_layers);
        for sel in selections {
            let keys: Vec<u32> = sel.keys.iter().map(|&k| k as u32).collect();
            let keys = Tensor::from_vec(keys, n_keys, model.device())?;
            for &l in layers {
                let a = attention[l].i((.., .., sel.query, ..))?.contiguous()?; // [B, H, T]
                parts.push(a.index_select(&keys, 2)?.unsqueeze(1)?);
            }
        }
        let codes = Tensor::cat(&parts, 1)?.flatten_all()?.to_vec1::<f32>()?;
        return Ok((codes, fwd.logits.flatten_all()?.to_vec1()?));
    };
    // Where each model layer goes among the kept ones.
    let mut slot_of = vec![None; cfg.n_layers];
    for (li, &l) in layers.iter().enumerate() {
        slot_of[l] = Some(li);
    }
    let width = selections.len() * n_layers * h * n_keys;
    // At the last block the pass computes only the queries read there (and the logits' rows).
    let first_query = match slot_of.last() {
        Some(Some(_)) => selections
            .iter()
            .map(|s| s.query)
            .min()
            .unwrap_or(usize::MAX),
        _ => usize::MAX,
    };
    let take = TakeCodesFrom {
        first_query,
        take: |l, att: &[f32], row: &mut [f32]| {
            let Some(li) = slot_of[l] else { return };
            for (si, sel) in selections.iter().enumerate() {
                for hh in 0..h {
                    let dst = &mut row[((si * n_layers + li) * h + hh) * n_keys..][..n_keys];
                    let src = &att[(hh * t + sel.query) * t..][..t];
                    for (d, &k) in dst.iter_mut().zip(&sel.keys) {
                        *d = src[k];
                    }
                }
            }
        },
    };
    let out = inf.run_problems(x, width, &take)?;
    Ok((out.taken, out.logits))
}

/// The index of the largest entry of each row of `n` entries (the first of equal ones, as
/// candle's `argmax`).
fn argmax_rows(v: &[f32], n: usize) -> Vec<u32> {
    v.chunks_exact(n)
        .map(|row| {
            let mut best = 0;
            for (j, &x) in row.iter().enumerate() {
                if x > row[best] {
                    best = j;
                }
            }
            best as u32
        })
        .collect()
}
