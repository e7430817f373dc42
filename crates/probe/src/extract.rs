//! Streaming extraction of latent codes with their labels.
//!
//! For each batch of problems the model's evaluator ([`Evaluator::read`]) runs once and keeps only
//! the codes of the selected layers at the site's query and keys (on a GPU they are gathered on the
//! device, so only those `[B, L, H, Q, K]` values travel to the host). [`code_rows`] turns a batch
//! into the rows of a codes file (codes, labels, predictions), and [`extract()`] appends them to the
//! streaming `.npz` ([`crate::npz_stream`]). Peak memory is bounded by the batch size, not by the
//! number of problems (docs/spec/latent-codes.md, "Outputs users expect").

use std::ops::ControlFlow;
use std::path::Path;

use hyperlens_io::keys::codes as keys;
use hyperlens_model::{CodeSite, Evaluator, Mixer, Normalisation, Reads};
use hyperlens_tasks::logic::LogicSet;
use hyperlens_tasks::sraven::{AsProblemSet, ProblemSet, ProblemSetView, Set, SplitName};
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
        checked_layers(self.layers.as_deref(), n_layers)
    }
}

/// The layers to read: `layers` (non-empty, each below `n_layers`, none twice) or all
/// `n_layers`, in the order given (the codes' layer axis).
///
/// # Errors
/// [`ProbeError::InvalidInput`] naming the layer out of range or selected twice, or an empty
/// selection.
pub fn checked_layers(layers: Option<&[usize]>, n_layers: usize) -> Result<Vec<usize>> {
    let layers = match layers {
        None => (0..n_layers).collect::<Vec<_>>(),
        Some(l) => l.to_vec(),
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

/// The JSON sidecar written next to the codes (`codes.npz` -> `codes.json`,
/// `hyperlens_io::sidecar_path`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProbeMeta {
    /// Checkpoint directory the model came from.
    pub checkpoint: String,
    /// The model's mixer (written as its CLI name; `None` only before [`extract`] sets it).
    pub mixer: Option<Mixer>,
    /// The normalisation that produced the codes (written as its name: `softmax`, `none`,
    /// `rms_head`; `None` only before [`extract`] sets it).
    pub normalisation: Option<Normalisation>,
    /// Where the problems came from: a file path or `generated`.
    pub problems: String,
    /// The split, if generated (written as its name).
    pub split: Option<SplitName>,
    /// The set, if generated (written as its name: `id` or `ood`, and `unknown` for a logic
    /// model's; a SRAVEN [`Set`] converts with `into`).
    pub set: Option<LogicSet>,
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

impl ProbeMeta {
    /// The sidecar's start for codes of the checkpoint `checkpoint` (the rest is filled in by the
    /// extraction, and for a logic model's sampled set by [`crate::extract_logic_set`]).
    pub fn for_checkpoint(checkpoint: &Path) -> ProbeMeta {
        ProbeMeta {
            checkpoint: checkpoint.display().to_string(),
            ..ProbeMeta::default()
        }
    }

    /// The sidecar's start for codes of a SRAVEN checkpoint over the problem file `problems`.
    pub fn for_sraven_file(checkpoint: &Path, problems: &Path) -> ProbeMeta {
        ProbeMeta {
            problems: problems.display().to_string(),
            ..ProbeMeta::for_checkpoint(checkpoint)
        }
    }

    /// The sidecar's start for codes of a SRAVEN checkpoint over problems generated from `split`'s
    /// set `set` with the seed `seed` (`problems: generated`).
    pub fn for_sraven_sampled(
        checkpoint: &Path,
        split: SplitName,
        set: Set,
        seed: u64,
        unpermuted: bool,
    ) -> ProbeMeta {
        ProbeMeta {
            problems: "generated".into(),
            split: Some(split),
            set: Some(set.into()),
            seed: Some(seed),
            unpermuted: Some(unpermuted),
            ..ProbeMeta::for_checkpoint(checkpoint)
        }
    }

    /// The sidecar of the code file `codes`, read as this type (`codes.json`, or the older
    /// `codes.npz.json`: [`hyperlens_io::read_sidecar`]); `None` when the file has none.
    ///
    /// # Errors
    /// [`ProbeError::File`] naming the sidecar when it cannot be read, is not JSON or is not a
    /// code file's sidecar.
    pub fn read_beside(codes: &Path) -> Result<Option<ProbeMeta>> {
        Ok(hyperlens_io::read_sidecar(codes)?)
    }
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

/// The rows of a codes file for one batch of problems (row = `problem * S + selection` for `S`
/// stacked selections), as [`extract()`] writes them and the Python front returns them.
///
/// # Shapes
/// `codes [R, L', H, 1, K]` flat, and per row `label`, `target`, `prediction`, `correct`, `slot`,
/// `problem` `[R]`, `rules [R, F]`, `inputs [R, K]`, for `R = B * S` rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CodeRows {
    /// The latent codes, float32.
    pub codes: Vec<f32>,
    /// The rule of the feature shown in the row's answer slot (the decoding target).
    pub label: Vec<i64>,
    /// The task's rule per unpermuted slot.
    pub rules: Vec<i64>,
    /// The values of the key tokens (-1 for a query token).
    pub inputs: Vec<i64>,
    /// The answer's value in the row's slot.
    pub target: Vec<i64>,
    /// The model's predicted value in the row's slot.
    pub prediction: Vec<i64>,
    /// `prediction == target`.
    pub correct: Vec<bool>,
    /// The row's answer slot.
    pub slot: Vec<i64>,
    /// The problem's index in the whole set.
    pub problem: Vec<i64>,
}

/// The model's shape checked against SRAVEN problems and the site resolved into its selections.
///
/// # Errors
/// [`ProbeError::InvalidInput`] for a site that does not fit the task or a model that does not
/// read SRAVEN problems of its shape.
pub fn selections_of(cfg: &hyperlens_model::Config, site: &Site) -> Result<Vec<Selection>> {
    let task_params = hyperlens_tasks::sraven::SravenParams {
        features: cfg.n_outputs,
        values: cfg.d_in,
        ..Default::default()
    };
    let selections: Vec<Selection> = site.resolve(&task_params)?;
    if task_params.n_tokens() != cfg.n_tokens {
        return Err(ProbeError::InvalidInput(format!(
            "the model reads {} tokens; SRAVEN problems with {} features have {}",
            cfg.n_tokens,
            cfg.n_outputs,
            task_params.n_tokens()
        )));
    }
    Ok(selections)
}

/// [`ProbeError::InvalidInput`] unless `batch` holds SRAVEN problems of the model's shape.
fn check_batch(cfg: &hyperlens_model::Config, batch: &ProblemSetView<'_>) -> Result<()> {
    let (b, t, m) = batch.x.dim();
    let f = cfg.n_outputs;
    if t != cfg.n_tokens || m != cfg.d_in || batch.y.dim() != (b, f) || batch.rules.dim() != (b, f)
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
    Ok(())
}

/// The codes of one batch at `selections` and `layers` ([`Evaluator::read`]) with their labels:
/// the rows of a codes file, the first problem numbered `first_problem`. The batch is a set held
/// or borrowed ([`AsProblemSet`]; e.g. views of numpy arrays), read without a copy.
///
/// # Shapes
/// `batch.x [B, T, M]`, `y [B, F]`, `rules [B, F]`, optional `perms [B, 3, F]`; see [`CodeRows`].
///
/// # Errors
/// [`ProbeError::InvalidInput`] for a batch that does not fit the model or a `perms` entry that is
/// not a slot; the evaluator's errors.
pub fn code_rows<B: AsProblemSet + ?Sized>(
    ev: &Evaluator,
    batch: &B,
    selections: &[Selection],
    layers: &[usize],
    first_problem: usize,
) -> Result<CodeRows> {
    let cfg = ev.config();
    let batch = batch.problems();
    check_batch(cfg, &batch)?;
    let b = batch.len();
    let f = cfg.n_outputs;
    let sites: Vec<CodeSite> = selections.iter().map(|sel| sel.site.clone()).collect();
    let reads = Reads {
        sites: &sites,
        layers,
        resid_pre: false,
    };
    // Codes [B, S, L', H, K] and the predicted class per slot [B, F].
    let read = ev.read(batch.x.view(), &reads)?;
    let pred = argmax_rows(&read.logits, cfg.d_out);
    // The readings' codes [B, S, L', H, K] are already the rows' codes, in row order.
    let mut rows = CodeRows {
        codes: read.codes,
        ..CodeRows::default()
    };
    for i in 0..b {
        for sel in selections {
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
            rows.label.push(batch.rules[[i, feature]]);
            rows.rules.extend(batch.rules.row(i).iter().copied());
            for &k in &sel.site.keys {
                let row = batch.x.slice(ndarray::s![i, k, ..]);
                let v = row.iter().position(|&v| v > 0.5).map_or(-1, |p| p as i64);
                rows.inputs.push(v);
            }
            let tgt = batch.y[[i, sel.slot]];
            let p = pred[i * f + sel.slot] as i64;
            rows.target.push(tgt);
            rows.prediction.push(p);
            rows.correct.push(p == tgt);
            rows.slot.push(sel.slot as i64);
            rows.problem.push((first_problem + i) as i64);
        }
    }
    Ok(rows)
}

/// The arrays of a SRAVEN codes file in the stream, in file order.
struct CodeArrays {
    ids: [crate::npz_stream::ArrayId; 9],
}

impl CodeArrays {
    /// Declares the arrays of `n_rows` rows with `shape` = `[L', H, 1, K]` codes and `F` slots.
    fn declare(w: &mut NpzStream, n_rows: usize, codes: &[usize], f: usize) -> Result<CodeArrays> {
        let n_keys = codes[codes.len() - 1];
        let mut codes_shape = vec![n_rows];
        codes_shape.extend_from_slice(codes);
        Ok(CodeArrays {
            ids: [
                w.add_array(keys::CODES, NpyDtype::F32, &codes_shape)?,
                w.add_array(keys::LABEL, NpyDtype::I64, &[n_rows])?,
                w.add_array(keys::RULES, NpyDtype::I64, &[n_rows, f])?,
                w.add_array(keys::INPUTS, NpyDtype::I64, &[n_rows, n_keys])?,
                w.add_array(keys::TARGET, NpyDtype::I64, &[n_rows])?,
                w.add_array(keys::PREDICTION, NpyDtype::I64, &[n_rows])?,
                w.add_array(keys::CORRECT, NpyDtype::Bool, &[n_rows])?,
                w.add_array(keys::SLOT, NpyDtype::I64, &[n_rows])?,
                w.add_array(keys::PROBLEM, NpyDtype::I64, &[n_rows])?,
            ],
        })
    }

    /// Appends one batch's rows.
    fn append(&self, w: &mut NpzStream, rows: &CodeRows) -> Result<()> {
        let [codes, label, rules, inputs, target, pred, correct, slot, problem] = self.ids;
        w.append_f32(codes, &rows.codes)?;
        w.append_i64(label, &rows.label)?;
        w.append_i64(rules, &rows.rules)?;
        w.append_i64(inputs, &rows.inputs)?;
        w.append_i64(target, &rows.target)?;
        w.append_i64(pred, &rows.prediction)?;
        w.append_bool(correct, &rows.correct)?;
        w.append_i64(slot, &rows.slot)?;
        w.append_i64(problem, &rows.problem)?;
        Ok(())
    }
}

/// Extracts the codes of the model of `ev` over `batches` (which must yield `n_problems` problems
/// in total) and writes them to `out` (`.npz`) with the sidecar `meta` completed and written
/// beside it.
///
/// Arrays written (row = `problem * S + selection` for `S` stacked selections, [`CodeRows`]):
/// `codes` f32 `[N, L, H, 1, K]`, `label` i64 `[N]` (rule of the feature shown in the row's answer
/// slot), `rules` i64 `[N, F]` (the task's rule per unpermuted slot), `inputs` i64 `[N, K]` (values of
/// the key tokens; -1 for a query token), `target` i64 `[N]`, `prediction` i64 `[N]`, `correct` bool
/// `[N]` (prediction == target for the row's slot), `slot` i64 `[N]`, `problem` i64 `[N]`.
/// `progress(done)` after each batch; its `ControlFlow::Break` stops the extraction.
///
/// # Shapes
/// Each batch: `x [B, T, M]`, `y [B, F]`, `rules [B, F]`, optional `perms [B, 3, F]`.
///
/// # Errors
/// Invalid site/layers, batches that do not fit the model or do not add up to `n_problems`, candle
/// and I/O errors; [`ProbeError::Interrupted`] when `progress` breaks. On error no output file is
/// left behind.
pub fn extract<I, P>(
    ev: &Evaluator,
    batches: I,
    n_problems: usize,
    params: &ProbeParams,
    out: &Path,
    mut meta: ProbeMeta,
    mut progress: P,
) -> Result<ProbeSummary>
where
    I: IntoIterator<Item = Result<ProblemSet>>,
    P: FnMut(usize) -> ControlFlow<()>,
{
    let cfg = ev.config().clone();
    let layers = params.check(cfg.n_layers)?;
    let selections = selections_of(&cfg, &params.site)?;
    let n_keys = selections[0].site.keys.len();
    let (h, f, s) = (cfg.n_heads, cfg.n_outputs, selections.len());
    let n_rows = n_problems * s;

    let mut w = NpzStream::create(out)?;
    let arrays = CodeArrays::declare(&mut w, n_rows, &[layers.len(), h, 1, n_keys], f)?;
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
        let rows = code_rows(ev, &batch, &selections, &layers, done)?;
        n_correct += rows.correct.iter().filter(|&&c| c).count();
        arrays.append(&mut w, &rows)?;
        done += b;
        if progress(done).is_break() {
            return Err(ProbeError::Interrupted);
        }
    }
    if done != n_problems {
        return Err(ProbeError::InvalidInput(format!(
            "the problem batches held {done} problems, {n_problems} were announced"
        )));
    }
    complete_meta(&mut meta, params, &cfg, &selections, &layers, n_problems);
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

/// Fills the sidecar's description of a SRAVEN codes file: site, selections, layers, sizes, mixer
/// and array shapes.
fn complete_meta(
    meta: &mut ProbeMeta,
    params: &ProbeParams,
    cfg: &hyperlens_model::Config,
    selections: &[Selection],
    layers: &[usize],
    n_problems: usize,
) {
    let n_keys = selections[0].site.keys.len();
    let (h, f) = (cfg.n_heads, cfg.n_outputs);
    let n_rows = n_problems * selections.len();
    meta.site = params.site.to_string();
    meta.selections = selections
        .iter()
        .map(|s| SelectionMeta {
            query: s.site.query,
            keys: s.site.keys.clone(),
            slot: s.slot,
        })
        .collect();
    meta.layers = layers.to_vec();
    meta.heads = h;
    meta.n_problems = n_problems;
    meta.n_rows = n_rows;
    meta.mixer = Some(cfg.mixer);
    meta.normalisation = Some(cfg.mixer.normalisation());
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
}

/// The index of the largest entry of each row of `n` entries (the first of equal ones, as
/// candle's `argmax`): the predicted class of each row of logits.
///
/// # Shapes
/// `v [R, n]` row-major -> `[R]`.
pub fn argmax_rows(v: &[f32], n: usize) -> Vec<u32> {
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
