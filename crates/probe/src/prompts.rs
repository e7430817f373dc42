//! The latent codes of a language model over a prompt file (`hyperlens probe --prompts`,
//! `LanguageModel.probe` in Python): the use case that joins the prompt format
//! (`hyperlens_tasks::prompts`), the tokenizer (`hyperlens_model::lm::LmTokenizer`) and the lens
//! (`LanguageModel::latent_codes`), streamed to a code file of `hyperlens_io::keys::lm_codes` with
//! its sidecar `hyperlens_io::sidecars::LmCodesSidecar`.
//!
//! Each prompt is tokenized segment by segment (`LmTokenizer::encode_segments`) and its sites are
//! resolved from the segments' token ranges (`SiteSpec::resolve_set`). Its behaviour is the model's
//! greedy next token after the prompt against the answer's first token; when the answer starts
//! with tokens that are whitespace alone (SmolLM2 writes ` 4` as a space token and a digit token),
//! those tokens are appended to the prompt and the prediction is read after them, against the
//! answer's first token that is not whitespace. Appending cannot change the codes: the sites lie in
//! the prompt and the models are causal. Prompts go through the model in batches of `batch`, in
//! file order; the lens pads each batch to the positions it needs, and the codes do not depend on
//! the batching.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use hyperlens_io::keys::lm_codes as keys;
use hyperlens_io::sidecars::{LmCodesSidecar, LmFactor};
use hyperlens_model::lm::{CodeForm, CodeRequest, LanguageModel, LmTokenizer};
use hyperlens_tasks::prompts::{PromptSet, PromptSplit, ResolvedSites, SiteSpec};
use ndarray::{s, Array2};

use crate::error::{step, ProbeError, Result};
use crate::extract::{argmax_rows, checked_layers};
use crate::npz_stream::{ArrayId, NpyDtype, NpzStream};

/// The settings of a prompt file's extraction.
#[derive(Debug, Clone)]
pub struct PromptProbeParams {
    /// The query and key sites, by role (`query: last; keys: demo_output, query_input`).
    pub sites: SiteSpec,
    /// The layers to keep, in the order of the codes' layer axis (default: all).
    pub layers: Option<Vec<usize>>,
    /// The form of the code.
    pub form: CodeForm,
    /// Prompts per forward pass; memory is bounded by it, not by the number of prompts.
    pub batch: usize,
    /// Whether to prepend the beginning-of-sequence token (`None`: the tokenizer's default, as
    /// Hugging Face's).
    pub prepend_bos: Option<bool>,
    /// The factor whose value indices become the `label` array (default: the first factor).
    pub label_factor: Option<String>,
    /// Whether to keep the residual stream at the queries (`resid`, `[N, L, Q, D]`).
    pub resid: bool,
    /// With a seed, the codes of the model with its weights shuffled within each tensor by it
    /// (the lens's control, `LanguageModel::with_shuffled_weights`).
    pub shuffle_weights: Option<u64>,
}

/// What an extraction reports.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptProbeSummary {
    /// Rows written (= prompts).
    pub n_prompts: usize,
    /// Prompts with an answer.
    pub n_answered: usize,
    /// The model's accuracy on the prompts with an answer (module docs); `None` when no prompt
    /// has one.
    pub accuracy: Option<f64>,
    /// The codes' shape per row: layers, heads, queries, keys.
    pub code_shape: [usize; 4],
}

/// Where the codes come from, for the sidecar.
#[derive(Debug, Clone)]
pub struct PromptProbeSources {
    /// The model's checkpoint path, as given.
    pub model: String,
    /// The model's kind (`hyperlens_model::lm::detect`).
    pub model_kind: String,
    /// The prompt file's path, as given (or where the prompts came from).
    pub prompts: String,
}

/// A prompt set tokenized and its sites resolved: the model's input.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptInputs {
    /// Each prompt's token ids (special tokens included), then its answer's leading whitespace
    /// tokens (module docs).
    pub tokens: Vec<Vec<u32>>,
    /// Each prompt's length in tokens, without the appended answer tokens, `[N]`.
    pub lengths: Vec<usize>,
    /// Each prompt's query and key positions, int64 `[N, Q]` and `[N, K]`.
    pub sites: ResolvedSites,
    /// Each prompt's answer's first token that is not whitespace alone (-1 when it has no answer),
    /// `[N]`.
    pub target: Vec<i64>,
}

/// The first token of `answer` that is not whitespace alone, and the whitespace tokens before it.
///
/// # Errors
/// [`ProbeError::InvalidInput`] naming prompt `i` when the answer has no token that is not
/// whitespace; tokenizer errors.
pub(crate) fn answer_target(tok: &LmTokenizer, i: usize, answer: &str) -> Result<(i64, Vec<u32>)> {
    let ids = tok.encode(answer, Some(false))?;
    let mut lead = Vec::new();
    for &id in &ids {
        if tok.decode(&[id])?.trim().is_empty() {
            lead.push(id);
        } else {
            return Ok((i64::from(id), lead));
        }
    }
    Err(ProbeError::InvalidInput(format!(
        "prompt {i}: its answer {answer:?} has no token that is not whitespace"
    )))
}

/// Tokenizes every prompt of `prompts` segment by segment (`LmTokenizer::encode_segments`), resolves
/// `sites` in it (`SiteSpec::resolve_set`) and finds its answer's target token (module docs).
///
/// # Shapes
/// `N` prompts -> `tokens` `N` id lists, `lengths` `[N]`, `sites` `[N, Q]` and `[N, K]` (the same Q
/// and K for every prompt), `target` `[N]`.
///
/// # Errors
/// The tokenizer's errors; the sites' (naming the prompt: an unknown role, a position past the
/// end, a prompt whose number of sites differs from prompt 0's); an answer with no token that is
/// not whitespace (naming the prompt).
pub fn prompt_inputs(
    tok: &LmTokenizer,
    prompts: &PromptSet,
    sites: &SiteSpec,
    prepend_bos: Option<bool>,
) -> Result<PromptInputs> {
    let n = prompts.len();
    let mut tokens = Vec::with_capacity(n);
    let mut spans = Vec::with_capacity(n);
    let mut lengths = Vec::with_capacity(n);
    let mut target = Vec::with_capacity(n);
    for (i, p) in prompts.prompts.iter().enumerate() {
        let texts: Vec<&str> = p.segments.iter().map(|s| s.text.as_str()).collect();
        let (mut ids, ranges) = tok.encode_segments(&texts, prepend_bos)?;
        lengths.push(ids.len());
        spans.push(ranges);
        let t = match &p.answer {
            None => -1,
            Some(a) => {
                let (t, lead) = answer_target(tok, i, a)?;
                ids.extend(lead);
                t
            }
        };
        tokens.push(ids);
        target.push(t);
    }
    let sites = sites.resolve_set(prompts, &spans, &lengths)?;
    Ok(PromptInputs {
        tokens,
        lengths,
        sites,
        target,
    })
}

/// A prompt set made ready for the model: its inputs ([`PromptInputs`]), its factors, each
/// prompt's factor values and split, and the label column. It holds no prompt text, so the set
/// can be dropped before the model is loaded (what [`run_prompt_file`] does: the memory of a long
/// prompt file then does not add to the model's).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRows {
    /// The tokens, sites and targets.
    pub inputs: PromptInputs,
    /// The prompts' factors, values sorted (the sidecar's `factors`).
    pub factors: Vec<LmFactor>,
    /// Each prompt's value index per factor, int64 `[N, F]` (-1 where it has none).
    pub factor_matrix: Array2<i64>,
    /// Each prompt's split, 1 for `test`, 0 otherwise, `[N]`.
    pub split: Vec<i64>,
    /// The column of `factors` whose values are the `label` array (`None` without factors).
    pub label: Option<usize>,
}

impl PromptRows {
    /// Tokenizes `prompts` and resolves their sites ([`prompt_inputs`]) with `params`' sites and
    /// BOS setting, and picks `params.label_factor`.
    ///
    /// # Shapes
    /// `N` prompts -> `factor_matrix` `[N, F]`, `split` `[N]`, `inputs` as [`prompt_inputs`].
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] for an empty set or an unknown label factor (listing the
    /// factors); the errors of [`prompt_inputs`].
    pub fn new(tok: &LmTokenizer, prompts: &PromptSet, params: &PromptProbeParams) -> Result<Self> {
        if prompts.is_empty() {
            return Err(ProbeError::InvalidInput("the prompt set is empty".into()));
        }
        let factors = prompts.factors();
        let label = label_column(&factors, params.label_factor.as_deref())?;
        let split = prompts
            .splits()
            .iter()
            .map(|s| i64::from(*s == Some(PromptSplit::Test)))
            .collect();
        Ok(PromptRows {
            inputs: prompt_inputs(tok, prompts, &params.sites, params.prepend_bos)?,
            factor_matrix: prompts.factor_matrix(),
            factors,
            split,
            label,
        })
    }

    /// Number of prompts.
    pub fn len(&self) -> usize {
        self.split.len()
    }

    /// Whether there is no prompt (never, for a set made by [`PromptRows::new`]).
    pub fn is_empty(&self) -> bool {
        self.split.is_empty()
    }
}

/// The arrays of a language model's code file, declared up front (`keys::lm_codes`).
struct LmArrays {
    codes: ArrayId,
    label: ArrayId,
    factors: ArrayId,
    split: ArrayId,
    prompt: ArrayId,
    length: ArrayId,
    query_pos: ArrayId,
    key_pos: ArrayId,
    target: ArrayId,
    prediction: ArrayId,
    correct: ArrayId,
    resid: Option<ArrayId>,
}

impl LmArrays {
    /// Declares the arrays of `n` rows with codes of `code_shape` (`[L, H, Q, K]`), `f` factors
    /// and, with `d_model`, the residual stream.
    fn declare(
        w: &mut NpzStream,
        n: usize,
        code_shape: [usize; 4],
        f: usize,
        d_model: Option<usize>,
    ) -> Result<LmArrays> {
        let [l, h, q, k] = code_shape;
        Ok(LmArrays {
            codes: w.add_array(keys::CODES, NpyDtype::F32, &[n, l, h, q, k])?,
            label: w.add_array(keys::LABEL, NpyDtype::I64, &[n])?,
            factors: w.add_array(keys::FACTORS, NpyDtype::I64, &[n, f])?,
            split: w.add_array(keys::SPLIT, NpyDtype::I64, &[n])?,
            prompt: w.add_array(keys::PROMPT, NpyDtype::I64, &[n])?,
            length: w.add_array(keys::LENGTH, NpyDtype::I64, &[n])?,
            query_pos: w.add_array(keys::QUERY_POS, NpyDtype::I64, &[n, q])?,
            key_pos: w.add_array(keys::KEY_POS, NpyDtype::I64, &[n, k])?,
            target: w.add_array(keys::TARGET, NpyDtype::I64, &[n])?,
            prediction: w.add_array(keys::PREDICTION, NpyDtype::I64, &[n])?,
            correct: w.add_array(keys::CORRECT, NpyDtype::Bool, &[n])?,
            resid: match d_model {
                Some(d) => Some(w.add_array(keys::RESID, NpyDtype::F32, &[n, l, q, d])?),
                None => None,
            },
        })
    }
}

/// The column of `name` among `factors` (the first one by default); `None` when the prompts have
/// no factor and none is asked for.
///
/// # Errors
/// [`ProbeError::InvalidInput`] for an unknown factor, listing the prompts' factors.
fn label_column(factors: &[LmFactor], name: Option<&str>) -> Result<Option<usize>> {
    match name {
        None => Ok((!factors.is_empty()).then_some(0)),
        Some(name) => match factors.iter().position(|f| f.name == name) {
            Some(c) => Ok(Some(c)),
            None => Err(ProbeError::InvalidInput(format!(
                "label factor `{name}`: the prompts' factors are [{}]",
                factors
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        },
    }
}

/// The rows `rows` of an int64 `[N, C]` array as `usize` position lists.
fn positions(a: &Array2<i64>, rows: std::ops::Range<usize>) -> Vec<Vec<usize>> {
    a.slice(s![rows, ..])
        .rows()
        .into_iter()
        .map(|r| r.iter().map(|&p| p as usize).collect())
        .collect()
}

/// The elements of an array in standard (C) layout, in order: a view of its buffer, no copy.
fn standard<'a, D: ndarray::Dimension>(a: &'a ndarray::CowArray<'_, f32, D>) -> &'a [f32] {
    a.as_slice().unwrap_or_default()
}

/// One batch of rows as the file's arrays hold them, appended to `w`.
///
/// # Errors
/// I/O errors of the stream.
#[allow(clippy::too_many_arguments)]
fn append_batch(
    w: &mut NpzStream,
    arrays: &LmArrays,
    prepared: &PromptRows,
    rows: std::ops::Range<usize>,
    batch: &hyperlens_model::lm::CodeBatch,
    prediction: &[u32],
) -> Result<usize> {
    let (a, b) = (rows.start, rows.end);
    let (inputs, factors, label) = (&prepared.inputs, &prepared.factor_matrix, prepared.label);
    w.append_f32(arrays.codes, standard(&batch.codes.as_standard_layout()))?;
    let lab: Vec<i64> = rows
        .clone()
        .map(|i| label.map_or(-1, |c| factors[[i, c]]))
        .collect();
    w.append_i64(arrays.label, &lab)?;
    let f: Vec<i64> = factors.slice(s![a..b, ..]).iter().copied().collect();
    w.append_i64(arrays.factors, &f)?;
    w.append_i64(arrays.split, &prepared.split[a..b])?;
    let ids: Vec<i64> = rows.clone().map(|i| i as i64).collect();
    w.append_i64(arrays.prompt, &ids)?;
    let len: Vec<i64> = inputs.lengths[a..b].iter().map(|&l| l as i64).collect();
    w.append_i64(arrays.length, &len)?;
    let qp: Vec<i64> = inputs
        .sites
        .query
        .slice(s![a..b, ..])
        .iter()
        .copied()
        .collect();
    w.append_i64(arrays.query_pos, &qp)?;
    let kp: Vec<i64> = inputs
        .sites
        .keys
        .slice(s![a..b, ..])
        .iter()
        .copied()
        .collect();
    w.append_i64(arrays.key_pos, &kp)?;
    let target = &inputs.target[a..b];
    w.append_i64(arrays.target, target)?;
    let pred: Vec<i64> = prediction.iter().map(|&p| i64::from(p)).collect();
    w.append_i64(arrays.prediction, &pred)?;
    let correct: Vec<bool> = target
        .iter()
        .zip(&pred)
        .map(|(&t, &p)| t >= 0 && t == p)
        .collect();
    w.append_bool(arrays.correct, &correct)?;
    if let (Some(id), Some(r)) = (arrays.resid, batch.resid.as_ref()) {
        w.append_f32(id, standard(&r.as_standard_layout()))?;
    }
    Ok(correct.iter().filter(|&&c| c).count())
}

/// Extracts the latent codes of `model` over `prompts` at `params.sites` and writes them to `out`
/// (`.npz`, `hyperlens_io::keys::lm_codes`) with the sidecar `codes.json` beside it
/// (`LmCodesSidecar`). `progress(done, total)` after each batch; its `ControlFlow::Break` stops the
/// extraction and leaves no file. With `params.shuffle_weights`, the model's weights are shuffled
/// within each tensor first (the lens's control).
///
/// Rows are the prompts in file order; `label` is the value index of `params.label_factor` (the
/// first factor by default; -1 without factors); `split` is 1 for prompts marked `test`, 0
/// otherwise (a file without splits is all train); `prediction` and `correct` are the behaviour of
/// the module docs (`correct` false without an answer).
///
/// # Shapes
/// `codes` `[N, L, H, Q, K]` float32, `resid` `[N, L, Q, D]` float32 (with `params.resid`).
///
/// # Errors
/// [`ProbeError::InvalidInput`] for an empty prompt set, a zero batch, an unknown label factor, bad
/// layers, or sites that do not resolve (naming the prompt); model, tokenizer and I/O errors;
/// [`ProbeError::Interrupted`] when `progress` breaks. On error no output file is left behind.
pub fn extract_prompts<P>(
    model: &LanguageModel,
    tok: &LmTokenizer,
    prompts: &PromptSet,
    params: &PromptProbeParams,
    sources: &PromptProbeSources,
    out: &Path,
    progress: P,
) -> Result<PromptProbeSummary>
where
    P: FnMut(usize, usize) -> ControlFlow<()>,
{
    let rows = PromptRows::new(tok, prompts, params)?;
    extract_rows(model, tok, &rows, params, sources, out, progress)
}

/// [`extract_prompts`] on prompts made ready ([`PromptRows::new`] with the same `params`).
///
/// # Shapes
/// As [`extract_prompts`].
///
/// # Errors
/// As [`extract_prompts`].
pub fn extract_rows<P>(
    model: &LanguageModel,
    tok: &LmTokenizer,
    prepared: &PromptRows,
    params: &PromptProbeParams,
    sources: &PromptProbeSources,
    out: &Path,
    mut progress: P,
) -> Result<PromptProbeSummary>
where
    P: FnMut(usize, usize) -> ControlFlow<()>,
{
    let n = prepared.len();
    if params.batch == 0 {
        return Err(ProbeError::InvalidInput(
            "the batch must be positive".into(),
        ));
    }
    let layers = checked_layers(params.layers.as_deref(), model.n_layers())?;
    let shuffled;
    let model = match params.shuffle_weights {
        Some(seed) => {
            shuffled = model.with_shuffled_weights(seed)?;
            &shuffled
        }
        None => model,
    };
    let inputs = &prepared.inputs;
    let (q, k) = (inputs.sites.query.ncols(), inputs.sites.keys.ncols());
    let code_shape = [layers.len(), model.n_heads(), q, k];
    let mut w = NpzStream::create(out)?;
    let d_model = params.resid.then(|| model.d_model());
    let arrays = LmArrays::declare(&mut w, n, code_shape, prepared.factors.len(), d_model)?;
    let mut n_correct = 0usize;
    step(&mut progress, 0, n)?;
    for start in (0..n).step_by(params.batch) {
        let end = (start + params.batch).min(n);
        let (query, keys) = (
            positions(&inputs.sites.query, start..end),
            positions(&inputs.sites.keys, start..end),
        );
        let req = CodeRequest {
            tokens: &inputs.tokens[start..end],
            query: &query,
            keys: &keys,
            layers: Some(&layers),
            form: params.form,
            last_logits: true,
            resid: params.resid,
            first_index: start,
        };
        let batch = model.latent_codes(&req)?;
        let logits = batch.last_logits.as_ref().ok_or_else(|| {
            ProbeError::InvalidInput("the lens returned no next-token logits".into())
        })?;
        let logits = logits.as_standard_layout();
        let flat = logits.as_slice().unwrap_or_default();
        let prediction = argmax_rows(flat, logits.ncols());
        n_correct += append_batch(&mut w, &arrays, prepared, start..end, &batch, &prediction)?;
        step(&mut progress, end, n)?;
    }
    let n_answered = inputs.target.iter().filter(|&&t| t >= 0).count();
    let sidecar = LmCodesSidecar {
        label_factor: prepared
            .label
            .map(|c| prepared.factors[c].name.clone())
            .unwrap_or_default(),
        factors: prepared.factors.clone(),
        form: params.form.to_string(),
        has_resid: params.resid,
        kv_group: model.kv_groups(),
        layers,
        model: sources.model.clone(),
        model_kind: sources.model_kind.clone(),
        n_heads: model.n_heads(),
        n_prompts: n,
        prepend_bos: params
            .prepend_bos
            .unwrap_or_else(|| tok.adds_bos_by_default()),
        prompts: sources.prompts.clone(),
        shuffled_weights_seed: params.shuffle_weights,
        sites: params.sites.to_string(),
        tokenizer: tok.source(),
    };
    w.finish()?;
    hyperlens_io::write_sidecar(out, &sidecar)?;
    Ok(PromptProbeSummary {
        n_prompts: n,
        n_answered,
        accuracy: (n_answered > 0).then(|| n_correct as f64 / n_answered as f64),
        code_shape,
    })
}

/// A prompt file's extraction from paths: what `hyperlens probe --prompts` runs.
#[derive(Debug, Clone)]
pub struct PromptFileRun {
    /// The language model: a GGUF file, or a Hugging Face or hyperlens token-model directory.
    pub checkpoint: PathBuf,
    /// The prompt file (JSONL, `hyperlens_tasks::prompts`).
    pub prompts: PathBuf,
    /// The extraction's settings.
    pub params: PromptProbeParams,
    /// The output `.npz`; the sidecar goes beside it.
    pub out: PathBuf,
}

/// Loads the tokenizer and the prompt file of `run`, makes the prompts ready ([`PromptRows`]) and
/// drops their text, then loads the model and runs [`extract_rows`].
///
/// # Errors
/// A bad prompt file (naming its line), a checkpoint that is not a language model or has no
/// tokenizer (one line), and the errors of [`extract_prompts`].
pub fn run_prompt_file<P>(
    run: &PromptFileRun,
    device: &candle_core::Device,
    progress: P,
) -> Result<PromptProbeSummary>
where
    P: FnMut(usize, usize) -> ControlFlow<()>,
{
    let kind = hyperlens_model::lm::detect(&run.checkpoint)?;
    let tok = hyperlens_model::lm::require_tokenizer(&run.checkpoint)?;
    let rows = PromptRows::new(&tok, &PromptSet::load(&run.prompts)?, &run.params)?;
    let model = hyperlens_model::lm::load(&run.checkpoint, device)?;
    let sources = PromptProbeSources {
        model: run.checkpoint.display().to_string(),
        model_kind: kind.to_string(),
        prompts: run.prompts.display().to_string(),
    };
    extract_rows(
        &model,
        &tok,
        &rows,
        &run.params,
        &sources,
        &run.out,
        progress,
    )
}
