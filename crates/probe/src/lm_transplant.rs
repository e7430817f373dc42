//! Is a language model's latent code causal? The transplant test of the SRAVEN report
//! (`crate::transplant`) on a prompt set: at the answer position (the site's one query) of a
//! target prompt whose label (the factor `label_factor`, e.g. `operation`) is r, the code of one
//! layer (the attention probabilities at the site's keys, `blocks.{l}.attn.hook_pattern`, across
//! the query heads) is replaced by the mean code of another label value r' over the donor prompts
//! ([`LmTransplantKind::MeanDonor`]), and the model's greedy next token is read
//! ([`hyperlens_model::lm::LanguageModel::last_logits_with_codes`]; the row is not
//! renormalised, as in SRAVEN). Each (target, r') pair is one of:
//!
//! - **to the donor**: the prediction becomes the first token of the answer the prompt would have
//!   under r' (the caller's `answer_under`, e.g. `hyperlens_tasks::prompts::icl_answer_under`;
//!   its first token that is not whitespace alone, read where the prompt's own behaviour is read,
//!   after its answer's leading whitespace tokens: `crate::prompts`);
//! - **elsewhere**: it changes to another token;
//! - **unchanged**.
//!
//! A pair is `excluded` when r' gives no answer (`answer_under` is `None`), when that answer's
//! token equals the model's original prediction or the prompt's own answer token (a move to it
//! could not be seen), or when its leading whitespace tokens differ from the prompt's own answer's
//! (the prediction would be read at another position).
//!
//! Controls, each one pass per target, scored against every r' of the target as the donor
//! transplant is (so that the rates compare): [`LmTransplantKind::Identity`] (its own code: the
//! logits must not change; the largest logit change is recorded, 0 for Llama and GPT-2, whose
//! transplant pass is the lens's pass bit for bit), [`LmTransplantKind::Random`] (a random
//! non-negative code of the own code's norm, seeded per layer and prompt), and
//! [`LmTransplantKind::SameLabel`] (the mean donor code of its own label value r: the answer should
//! stay).

use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;

use hyperlens_model::lm::{CodeForm, CodeRequest, CodeSites, LanguageModel, LmTokenizer};
use hyperlens_tasks::prompts::{Prompt, PromptSet, SiteSpec};
use ndarray::{s, Array4, Axis};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::error::{step, ProbeError, Result};
use crate::extract::{argmax_rows, checked_layers};
use crate::prompts::{answer_target, PromptProbeParams, PromptRows};

mod table;

pub use table::{lm_transplant_table, write_lm_transplant};

/// What a transplant writes at the site, named in files by [`LmTransplantKind::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LmTransplantKind {
    /// `mean_donor`: the mean donor code of another label value r'.
    MeanDonor,
    /// `same_label`: the mean donor code of the target's own label value.
    SameLabel,
    /// `random`: a random non-negative code of the own code's norm.
    Random,
    /// `identity`: the target's own code (the logits must not change).
    Identity,
}

impl LmTransplantKind {
    /// Every kind, in the order of one layer's rows in the result.
    pub const ALL: [LmTransplantKind; 4] = [
        LmTransplantKind::MeanDonor,
        LmTransplantKind::SameLabel,
        LmTransplantKind::Random,
        LmTransplantKind::Identity,
    ];

    /// The name in files: `mean_donor`, `same_label`, `random`, `identity`.
    pub fn as_str(self) -> &'static str {
        match self {
            LmTransplantKind::MeanDonor => "mean_donor",
            LmTransplantKind::SameLabel => "same_label",
            LmTransplantKind::Random => "random",
            LmTransplantKind::Identity => "identity",
        }
    }
}

impl fmt::Display for LmTransplantKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LmTransplantKind {
    type Err = ProbeError;

    /// Parses the name in files ([`LmTransplantKind::as_str`]).
    ///
    /// # Errors
    /// [`ProbeError::InvalidInput`] naming the valid kinds.
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let valid: Vec<&str> = Self::ALL.iter().map(|k| k.as_str()).collect();
                ProbeError::InvalidInput(format!(
                    "unknown transplant kind `{s}` (expected {})",
                    valid.join(", ")
                ))
            })
    }
}

/// One row of the result: a layer, a kind and (in [`LmTransplant::by_donor`]) a donor label value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmTransplantRow {
    /// The layer whose code was replaced; `None` for all of the run's layers at once
    /// ([`LmTransplantParams::together`]).
    pub layer: Option<usize>,
    /// What was written at the site.
    pub kind: LmTransplantKind,
    /// The label value r' the pairs are scored against; `None` in the rows over all of them.
    pub donor_label: Option<String>,
    /// (target, r') pairs scored.
    pub n: usize,
    /// Pairs whose prediction became r''s answer token.
    pub to_donor: usize,
    /// Pairs whose prediction changed to another token.
    pub elsewhere: usize,
    /// Pairs whose prediction did not change.
    pub unchanged: usize,
    /// Pairs left out (module docs).
    pub excluded: usize,
    /// `to_donor / n` (NaN when `n` is 0).
    pub frac_to_donor: f64,
    /// `(to_donor + elsewhere) / n` (NaN when `n` is 0).
    pub frac_changed: f64,
    /// The largest absolute change of any next-token logit over the row's passes (the identity's
    /// must be 0, or float32 rounding for a token model).
    pub max_logit_change: f64,
}

impl LmTransplantRow {
    fn empty(layer: Option<usize>, kind: LmTransplantKind, donor_label: Option<String>) -> Self {
        LmTransplantRow {
            layer,
            kind,
            donor_label,
            n: 0,
            to_donor: 0,
            elsewhere: 0,
            unchanged: 0,
            excluded: 0,
            frac_to_donor: f64::NAN,
            frac_changed: f64::NAN,
            max_logit_change: 0.0,
        }
    }

    /// Sets the rates from the counts.
    fn finish(&mut self) {
        if self.n > 0 {
            self.frac_to_donor = self.to_donor as f64 / self.n as f64;
            self.frac_changed = (self.to_donor + self.elsewhere) as f64 / self.n as f64;
        }
    }
}

/// What [`lm_transplant`] returns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LmTransplant {
    /// The factor whose values are the labels.
    pub label_factor: String,
    /// The label values with a mean donor code (the values r' transplanted), sorted.
    pub labels: Vec<String>,
    /// Donor prompts per value of `labels`.
    pub n_donors: Vec<usize>,
    /// Target prompts.
    pub n_targets: usize,
    /// Per layer (in the order given, then all of them at once with
    /// [`LmTransplantParams::together`]) and kind ([`LmTransplantKind::ALL`]): the counts over all
    /// donor label values.
    pub rows: Vec<LmTransplantRow>,
    /// Per layer, kind and donor label value (in `labels`' order).
    pub by_donor: Vec<LmTransplantRow>,
}

/// The settings of [`lm_transplant`].
#[derive(Debug, Clone)]
pub struct LmTransplantParams {
    /// The sites, with one query per prompt (`query: last; keys: demo_output, query_input`).
    pub sites: SiteSpec,
    /// The layers whose code is replaced, one at a time.
    pub layers: Vec<usize>,
    /// Whether to also replace the code at all of `layers` in one pass (rows with `layer: None`),
    /// each layer's own, random or mean donor code at once.
    pub together: bool,
    /// The factor whose values are transplanted (`operation`).
    pub label_factor: String,
    /// The donor prompts (indices into the set): their mean code per label value.
    pub donors: Vec<usize>,
    /// The target prompts (indices into the set), each with an answer.
    pub targets: Vec<usize>,
    /// The seed of the random codes.
    pub seed: u64,
    /// Prompts per forward pass.
    pub batch: usize,
    /// Whether to prepend the beginning-of-sequence token (`None`: the tokenizer's default).
    pub prepend_bos: Option<bool>,
}

/// The prompts made ready: inputs, label per prompt, and the expected tokens per (target, label).
struct Prepared {
    rows: PromptRows,
    /// Each prompt's label value index (-1 without the label).
    label: Vec<i64>,
    /// The label values (the factor's values, sorted).
    values: Vec<String>,
}

/// Runs the transplant test (module docs) of `model` on `prompts`: the donors' mean codes per
/// label value at each of `params.layers`, then per batch of targets one plain pass and, per
/// layer (and with `params.together` for all of them at once), one pass per control and per
/// donor label value. `answer_under(prompt, r')` gives the answer a
/// prompt would have under label value r' (`None`: not defined). `progress(done, total)` counts
/// donor batches and (target batch, layer or all layers) steps; its `ControlFlow::Break` stops the work.
///
/// # Shapes
/// Codes `[H, K]` per prompt and layer (the site's one query).
///
/// # Errors
/// [`ProbeError::InvalidInput`] for a zero batch, no layer or a bad one, no donor or no target,
/// an index out of range, sites with another number of queries than one, an unknown label
/// factor, a donor or target without the label or longer than the model's context, or a target
/// without an answer (naming the prompt); the
/// errors of [`PromptRows::new`] and of the model; [`ProbeError::Interrupted`] when `progress`
/// breaks.
pub fn lm_transplant<A, P>(
    model: &LanguageModel,
    tok: &LmTokenizer,
    prompts: &PromptSet,
    params: &LmTransplantParams,
    answer_under: A,
    mut progress: P,
) -> Result<LmTransplant>
where
    A: Fn(&Prompt, &str) -> Option<String>,
    P: FnMut(usize, usize) -> ControlFlow<()>,
{
    let prep = prepare(model, tok, prompts, params)?;
    let n_donor_batches = params.donors.len().div_ceil(params.batch);
    let groups = groups(params);
    let total = n_donor_batches + params.targets.len().div_ceil(params.batch) * groups.len();
    let mut done = 0;
    let mut tick = || {
        done += 1;
        step(&mut progress, done, total)
    };
    let means = donor_means(model, &prep, params, &mut tick)?;
    let expected = expected_tokens(tok, prompts, &prep, params, &answer_under)?;
    let labels: Vec<usize> = (0..prep.values.len())
        .filter(|&v| means.counts[v] > 0)
        .collect();
    let mut acc = Tally::new(&groups, &labels, &prep.values);
    for (bi, chunk) in params.targets.chunks(params.batch).enumerate() {
        let on = Receivers::new(model, &prep, params, chunk, bi * params.batch, &expected)?;
        for (group, (_, slots)) in groups.iter().enumerate() {
            let ctx = Written {
                group,
                slots,
                layers: slots.iter().map(|&s| params.layers[s]).collect(),
                means: &means,
                labels: &labels,
                seed: params.seed,
            };
            ctx.run(model, &on, &mut acc)?;
            tick()?;
        }
    }
    Ok(acc.finish(params, &prep, &means, &labels))
}

/// The passes' groups of written layers: each layer alone (its slot in `params.layers`), then with
/// `params.together` all of them (`None`).
fn groups(params: &LmTransplantParams) -> Vec<(Option<usize>, Vec<usize>)> {
    let mut g: Vec<(Option<usize>, Vec<usize>)> = params
        .layers
        .iter()
        .enumerate()
        .map(|(s, &l)| (Some(l), vec![s]))
        .collect();
    if params.together {
        g.push((None, (0..params.layers.len()).collect()));
    }
    g
}

/// Checks `params` and makes the prompts ready.
///
/// # Errors
/// As [`lm_transplant`].
fn prepare(
    model: &LanguageModel,
    tok: &LmTokenizer,
    prompts: &PromptSet,
    params: &LmTransplantParams,
) -> Result<Prepared> {
    let bad = |m: String| Err(ProbeError::InvalidInput(m));
    if params.batch == 0 {
        return bad("transplant: the batch must be positive".into());
    }
    if params.layers.is_empty() {
        return bad("transplant: no layer given".into());
    }
    checked_layers(Some(&params.layers), model.n_layers())?;
    if params.donors.is_empty() || params.targets.is_empty() {
        return bad(format!(
            "transplant: {} donor and {} target prompts: both are needed",
            params.donors.len(),
            params.targets.len()
        ));
    }
    let n = prompts.len();
    for (what, idx) in [("donor", &params.donors), ("target", &params.targets)] {
        if let Some(&i) = idx.iter().find(|&&i| i >= n) {
            return bad(format!(
                "transplant: {what} prompt {i} is out of range ({n} prompts)"
            ));
        }
    }
    let probe = PromptProbeParams {
        sites: params.sites.clone(),
        layers: Some(params.layers.clone()),
        form: CodeForm::Pattern,
        batch: params.batch,
        prepend_bos: params.prepend_bos,
        label_factor: Some(params.label_factor.clone()),
        resid: false,
        shuffle_weights: None,
    };
    let rows = PromptRows::new(tok, prompts, &probe)?;
    let q = rows.inputs.sites.query.ncols();
    if q != 1 {
        return bad(format!(
            "transplant: the sites `{}` give {q} queries per prompt; the transplant writes one",
            params.sites
        ));
    }
    let col = rows.label.ok_or_else(|| {
        ProbeError::InvalidInput(format!("transplant: no factor `{}`", params.label_factor))
    })?;
    let label: Vec<i64> = rows.factor_matrix.column(col).to_vec();
    for (what, idx) in [("donor", &params.donors), ("target", &params.targets)] {
        if let Some(&i) = idx.iter().find(|&&i| label[i] < 0) {
            return bad(format!(
                "transplant: {what} prompt {i} has no `{}` label",
                params.label_factor
            ));
        }
        let ctx = model.max_seq_len();
        if let Some(&i) = idx.iter().find(|&&i| rows.inputs.tokens[i].len() > ctx) {
            return bad(format!(
                "transplant: {what} prompt {i} has {} tokens, more than the model's context of {ctx}",
                rows.inputs.tokens[i].len()
            ));
        }
    }
    if let Some(&i) = params.targets.iter().find(|&&i| rows.inputs.target[i] < 0) {
        return bad(format!("transplant: target prompt {i} has no answer"));
    }
    let values = rows.factors[col].values.clone();
    Ok(Prepared {
        rows,
        label,
        values,
    })
}

/// The tokens, query and keys of the prompts `idx`.
struct Gathered {
    tokens: Vec<Vec<u32>>,
    query: Vec<usize>,
    keys: Vec<Vec<usize>>,
}

impl Gathered {
    fn new(prep: &Prepared, idx: &[usize]) -> Self {
        let s = &prep.rows.inputs;
        Gathered {
            tokens: idx.iter().map(|&i| s.tokens[i].clone()).collect(),
            query: idx
                .iter()
                .map(|&i| s.sites.query[[i, 0]] as usize)
                .collect(),
            keys: idx
                .iter()
                .map(|&i| s.sites.keys.row(i).iter().map(|&k| k as usize).collect())
                .collect(),
        }
    }

    /// The lens's pass over these prompts at `layers`: codes `[B, L, H, K]` and, with `logits`,
    /// the next-token logits `[B, V]`.
    fn read(
        &self,
        model: &LanguageModel,
        layers: &[usize],
        logits: bool,
        first: usize,
    ) -> Result<(ndarray::Array4<f32>, Option<ndarray::Array2<f32>>)> {
        let query: Vec<Vec<usize>> = self.query.iter().map(|&q| vec![q]).collect();
        let out = model.latent_codes(&CodeRequest {
            tokens: &self.tokens,
            query: &query,
            keys: &self.keys,
            layers: Some(layers),
            form: CodeForm::Pattern,
            last_logits: logits,
            resid: false,
            first_index: first,
        })?;
        Ok((
            out.codes.slice(s![.., .., .., 0, ..]).to_owned(),
            out.last_logits,
        ))
    }

    fn sites(&self, first: usize) -> CodeSites<'_> {
        CodeSites {
            tokens: &self.tokens,
            query: &self.query,
            keys: &self.keys,
            first_index: first,
        }
    }
}

/// The donors' mean codes: per layer slot and label value, `[H, K]`, and the donors per value.
struct Means {
    /// `[L][V]` of `[H, K]` (zeros where a value has no donor).
    codes: Vec<Vec<ndarray::Array2<f32>>>,
    counts: Vec<usize>,
}

/// Reads the donors' codes in batches and averages them per label value, `tick()` per batch.
///
/// # Errors
/// Model errors; `tick`'s.
fn donor_means(
    model: &LanguageModel,
    prep: &Prepared,
    params: &LmTransplantParams,
    tick: &mut dyn FnMut() -> Result<()>,
) -> Result<Means> {
    let (h, k) = (model.n_heads(), prep.rows.inputs.sites.keys.ncols());
    let n_values = prep.values.len();
    let zero = ndarray::Array2::<f64>::zeros((h, k));
    let mut sums = vec![vec![zero; n_values]; params.layers.len()];
    let mut counts = vec![0usize; n_values];
    for (bi, chunk) in params.donors.chunks(params.batch).enumerate() {
        let (codes, _) =
            Gathered::new(prep, chunk).read(model, &params.layers, false, bi * params.batch)?;
        for (b, &i) in chunk.iter().enumerate() {
            let v = prep.label[i] as usize;
            counts[v] += 1;
            for (slot, sum) in sums.iter_mut().enumerate() {
                sum[v] += &codes.slice(s![b, slot, .., ..]).mapv(f64::from);
            }
        }
        tick()?;
    }
    let codes = sums
        .into_iter()
        .map(|per| {
            per.into_iter()
                .zip(&counts)
                .map(|(s, &c)| s.mapv(|x| (x / c.max(1) as f64) as f32))
                .collect()
        })
        .collect();
    Ok(Means { codes, counts })
}

/// Per target (in `params.targets`' order) and label value, the token a move to that value's
/// answer gives, or `None` where the pair is excluded for its answer (module docs; the exclusion
/// against the prediction is made after the plain pass).
///
/// # Errors
/// Tokenizer errors.
fn expected_tokens<A>(
    tok: &LmTokenizer,
    prompts: &PromptSet,
    prep: &Prepared,
    params: &LmTransplantParams,
    answer_under: &A,
) -> Result<Vec<Vec<Option<u32>>>>
where
    A: Fn(&Prompt, &str) -> Option<String>,
{
    let inputs = &prep.rows.inputs;
    params
        .targets
        .iter()
        .map(|&i| {
            let lead = &inputs.tokens[i][inputs.lengths[i]..];
            prep.values
                .iter()
                .map(|value| {
                    let Some(answer) = answer_under(&prompts.prompts[i], value) else {
                        return Ok(None);
                    };
                    Ok(match answer_target(tok, i, &answer) {
                        Ok((t, l)) if l == lead && t != inputs.target[i] => Some(t as u32),
                        Ok(_) | Err(ProbeError::InvalidInput(_)) => None,
                        Err(e) => return Err(e),
                    })
                })
                .collect()
        })
        .collect()
}

/// One batch of targets after its plain pass.
struct Receivers<'a> {
    /// The targets' indices into the set.
    idx: &'a [usize],
    /// Their position in `params.targets` of the first.
    start: usize,
    inputs: Gathered,
    /// Own codes `[B, L, H, K]`.
    own: ndarray::Array4<f32>,
    /// Plain next-token logits `[B, V]` and the predictions `[B]`.
    base: ndarray::Array2<f32>,
    pred: Vec<u32>,
    /// Each target's label value index.
    label: Vec<usize>,
    /// Per target and label value, the token of that value's answer when the pair is scored.
    expected: Vec<Vec<Option<u32>>>,
}

impl<'a> Receivers<'a> {
    fn new(
        model: &LanguageModel,
        prep: &Prepared,
        params: &LmTransplantParams,
        idx: &'a [usize],
        start: usize,
        expected: &[Vec<Option<u32>>],
    ) -> Result<Self> {
        let inputs = Gathered::new(prep, idx);
        let (own, base) = inputs.read(model, &params.layers, true, start)?;
        let base = base.ok_or_else(|| {
            ProbeError::InvalidInput("the lens returned no next-token logits".into())
        })?;
        let base = base.as_standard_layout().into_owned();
        let pred = argmax_rows(base.as_slice().unwrap_or_default(), base.ncols());
        let expected = expected[start..start + idx.len()]
            .iter()
            .zip(&pred)
            .map(|(row, &p)| row.iter().map(|e| e.filter(|&t| t != p)).collect())
            .collect();
        Ok(Receivers {
            idx,
            start,
            inputs,
            own,
            base,
            pred,
            label: idx.iter().map(|&i| prep.label[i].max(0) as usize).collect(),
            expected,
        })
    }
}

/// The counts being gathered: per group of written layers ([`groups`]), kind and donor label
/// value (position in the labels with a mean code).
struct Tally {
    rows: Vec<[Vec<LmTransplantRow>; 4]>,
    layers: Vec<Option<usize>>,
}

impl Tally {
    fn new(groups: &[(Option<usize>, Vec<usize>)], labels: &[usize], values: &[String]) -> Self {
        Tally {
            layers: groups.iter().map(|g| g.0).collect(),
            rows: groups
                .iter()
                .map(|&(l, _)| {
                    LmTransplantKind::ALL.map(|k| {
                        labels
                            .iter()
                            .map(|&v| LmTransplantRow::empty(l, k, Some(values[v].clone())))
                            .collect()
                    })
                })
                .collect(),
        }
    }

    /// The result: the per-donor rows and their sums over the donor values.
    fn finish(
        self,
        params: &LmTransplantParams,
        prep: &Prepared,
        means: &Means,
        labels: &[usize],
    ) -> LmTransplant {
        let (mut rows, mut by_donor) = (Vec::new(), Vec::new());
        for (layer, kinds) in self.layers.into_iter().zip(self.rows) {
            for (kind, per) in LmTransplantKind::ALL.into_iter().zip(kinds) {
                let mut all = LmTransplantRow::empty(layer, kind, None);
                for mut r in per {
                    all.n += r.n;
                    all.to_donor += r.to_donor;
                    all.elsewhere += r.elsewhere;
                    all.unchanged += r.unchanged;
                    all.excluded += r.excluded;
                    all.max_logit_change = all.max_logit_change.max(r.max_logit_change);
                    r.finish();
                    by_donor.push(r);
                }
                all.finish();
                rows.push(all);
            }
        }
        LmTransplant {
            label_factor: params.label_factor.clone(),
            labels: labels.iter().map(|&v| prep.values[v].clone()).collect(),
            n_donors: labels.iter().map(|&v| means.counts[v]).collect(),
            n_targets: params.targets.len(),
            rows,
            by_donor,
        }
    }
}

/// One group of written layers ([`groups`]) of one batch of targets: the passes of every kind and
/// their scores.
struct Written<'a> {
    /// The group's position in the tally.
    group: usize,
    /// The written layers' slots in the run's layers, and the layers.
    slots: &'a [usize],
    layers: Vec<usize>,
    means: &'a Means,
    /// The label values with a mean code.
    labels: &'a [usize],
    seed: u64,
}

impl Written<'_> {
    /// Runs the four kinds' passes and adds their scores to `acc`.
    ///
    /// # Errors
    /// Model errors.
    fn run(&self, model: &LanguageModel, on: &Receivers<'_>, acc: &mut Tally) -> Result<()> {
        let own = on.own.select(Axis(1), self.slots);
        let rows = &mut acc.rows[self.group];
        let has_mean = |v: usize| self.means.counts[v] > 0;
        // identity, random, same_label: one pass each, scored against every r'.
        let same: Vec<bool> = on.label.iter().map(|&v| has_mean(v)).collect();
        let mut same_codes = own.clone();
        for (b, &v) in on.label.iter().enumerate() {
            if same[b] {
                self.assign_mean(&mut same_codes, b, v);
            }
        }
        let all = vec![true; on.idx.len()];
        let controls = [
            (LmTransplantKind::Identity, own.clone(), all.clone()),
            (LmTransplantKind::Random, self.random(on, &own), all),
            (LmTransplantKind::SameLabel, same_codes, same),
        ];
        for (kind, codes, valid) in controls {
            let logits = self.pass(model, on, &codes)?;
            let k = LmTransplantKind::ALL
                .iter()
                .position(|&x| x == kind)
                .unwrap_or(0);
            for (j, &v) in self.labels.iter().enumerate() {
                score(&mut rows[k][j], on, &logits, v, &valid);
            }
        }
        // mean_donor: one pass per r', its mean code at the targets of another label value.
        for (j, &v) in self.labels.iter().enumerate() {
            let mut codes = own.clone();
            let mut valid = vec![false; on.idx.len()];
            for (b, &lab) in on.label.iter().enumerate() {
                if lab != v {
                    self.assign_mean(&mut codes, b, v);
                    valid[b] = true;
                }
            }
            if !valid.contains(&true) {
                continue;
            }
            let logits = self.pass(model, on, &codes)?;
            score(&mut rows[0][j], on, &logits, v, &valid);
        }
        Ok(())
    }

    /// Writes label value `v`'s mean donor code of each written layer into target `b`'s codes
    /// `[B, S, H, K]`.
    fn assign_mean(&self, codes: &mut Array4<f32>, b: usize, v: usize) {
        for (si, &slot) in self.slots.iter().enumerate() {
            codes
                .slice_mut(s![b, si, .., ..])
                .assign(&self.means.codes[slot][v]);
        }
    }

    /// The logits of the targets' pass with `codes [B, S, H, K]` written at the layers.
    fn pass(
        &self,
        model: &LanguageModel,
        on: &Receivers<'_>,
        codes: &Array4<f32>,
    ) -> Result<ndarray::Array2<f32>> {
        Ok(model.last_logits_with_layer_codes(
            &on.inputs.sites(on.start),
            &self.layers,
            codes.view(),
        )?)
    }

    /// Random codes: per target and written layer, uniform `[0, 1)` entries (a ChaCha8 stream
    /// seeded with the seed, numbered by the layer and the target's prompt index, so independent
    /// of the batching and of the other layers written) scaled to the norm of its own code there.
    fn random(&self, on: &Receivers<'_>, own: &Array4<f32>) -> Array4<f32> {
        let mut out = own.clone();
        for (b, &i) in on.idx.iter().enumerate() {
            for (si, &layer) in self.layers.iter().enumerate() {
                let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
                rng.set_stream(((layer as u64) << 32) | i as u64);
                let mut row = out.slice_mut(s![b, si, .., ..]);
                let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
                row.mapv_inplace(|_| rng.gen::<f32>());
                let rn = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                row.mapv_inplace(|x| x / rn * norm);
            }
        }
        out
    }
}

/// Adds the pass `logits [B, V]` to `row` (donor label value `v`): for each target `b` with
/// `valid[b]` and another label than `v`, the pair (b, v) is excluded without an expected token,
/// and otherwise to the donor, unchanged or elsewhere (module docs).
fn score(
    row: &mut LmTransplantRow,
    on: &Receivers<'_>,
    logits: &ndarray::Array2<f32>,
    v: usize,
    valid: &[bool],
) {
    let got = argmax_rows(
        logits.as_standard_layout().as_slice().unwrap_or_default(),
        logits.ncols(),
    );
    for (b, &p) in got.iter().enumerate() {
        if on.label[b] == v {
            continue;
        }
        let change = logits
            .row(b)
            .iter()
            .zip(on.base.row(b))
            .map(|(x, y)| f64::from((x - y).abs()))
            .fold(0.0, f64::max);
        row.max_logit_change = row.max_logit_change.max(change);
        let Some(expected) = on.expected[b][v].filter(|_| valid[b]) else {
            row.excluded += 1;
            continue;
        };
        row.n += 1;
        if p == expected {
            row.to_donor += 1;
        } else if p == on.pred[b] {
            row.unchanged += 1;
        } else {
            row.elsewhere += 1;
        }
    }
}
