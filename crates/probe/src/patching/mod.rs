//! Activation patching and direct logit attribution on SRAVEN, with TransformerLens's conventions
//! (`patching.get_act_patch_*`, `ActivationCache.apply_ln_to_stack`; Elhage et al. 2021, Wang et
//! al. 2022 for the normalised logit-difference metric).
//!
//! **Clean and corrupted problems.** A corrupted problem is its clean problem with the answer
//! slot's feature swapped in from another problem whose answer at the slot differs: the slot's
//! tokens in all eight context panels (positions `F p + slot`) come from the donor, every other
//! token stays. SRAVEN's features are independent (each follows its own rule on its own values), so
//! the corrupted problem is a valid problem whose answer at the slot is the donor's, and it differs
//! from the clean one in exactly those eight tokens.
//!
//! **Metric.** The logit difference `LD = logit[clean answer] - logit[corrupted answer]` at the
//! slot's output. A clean activation is patched into the corrupted pass, and the score is
//! `(mean LD_patched - mean LD_corrupted) / (mean LD_clean - mean LD_corrupted)`: 1 when the
//! patch restores the clean behaviour, 0 when it does nothing (means over the problems, as in
//! TransformerLens's patching demo).
//!
//! Direct logit attribution, which reads the clean problems only, is in `dla.rs` (re-exported
//! here).

use std::ops::ControlFlow;

use candle_core::{DType, Tensor};
use hyperlens_model::hooks::{Cache, HookFn};
use hyperlens_model::Evaluator;
use hyperlens_tasks::sraven::ProblemSet;
use ndarray::{s, Array2, Array3};

use crate::error::{step, ProbeError, Result};
use hyperlens_analysis::table::{Column, Table};

mod dla;

pub use dla::{direct_logit_attribution, dla_table, DlaReport};

/// Whether every problem of `set` is unpermuted (slot `f` is feature `f` in every panel).
pub(crate) fn unpermuted(set: &ProblemSet) -> bool {
    set.perms.as_ref().is_none_or(|p| {
        p.outer_iter().all(|pp| {
            pp.outer_iter()
                .all(|r| r.iter().enumerate().all(|(i, &v)| v == i as i64))
        })
    })
}

/// Clean problems and their corrupted twins (module docs).
#[derive(Debug, Clone)]
pub struct PatchPairs {
    /// `[N, T, M]` the clean problems.
    pub clean: Array3<f32>,
    /// `[N, T, M]` the corrupted problems.
    pub corrupted: Array3<f32>,
    /// `[N]` the clean answer value at the slot.
    pub clean_answer: Vec<usize>,
    /// `[N]` the corrupted answer value at the slot (always another value).
    pub corrupted_answer: Vec<usize>,
    /// `[N]` (clean index, donor index) in the set the pairs came from.
    pub source: Vec<(usize, usize)>,
    /// The answer slot whose feature is swapped.
    pub slot: usize,
}

impl PatchPairs {
    /// Number of pairs N.
    pub fn len(&self) -> usize {
        self.clean_answer.len()
    }

    /// Whether there is no pair.
    pub fn is_empty(&self) -> bool {
        self.clean_answer.is_empty()
    }
}

/// Pairs every problem of `set` with the next problem (cyclically) whose answer at `slot` differs,
/// and swaps that feature in (module docs). Problems without such a partner are left out.
///
/// # Shapes
/// `set.x [N, T, M]` with `T = F (P + 1)` (P context panels, F features and query tokens).
///
/// # Errors
/// [`ProbeError::InvalidInput`] for permuted problems, a slot outside the answer, or no pair.
pub fn feature_swap_pairs(set: &ProblemSet, slot: usize) -> Result<PatchPairs> {
    let (n, t, _) = set.x.dim();
    let f = set.y.ncols();
    if slot >= f {
        return Err(ProbeError::InvalidInput(format!(
            "--slot {slot}: the problems have {f} answer slots"
        )));
    }
    if !unpermuted(set) {
        return Err(ProbeError::InvalidInput(
            "patching by feature swap needs unpermuted problems (slot f is feature f in every panel)"
                .into(),
        ));
    }
    let panels = t / f - 1;
    let mut pairs = PatchPairs {
        clean: Array3::zeros((0, t, set.x.dim().2)),
        corrupted: Array3::zeros((0, t, set.x.dim().2)),
        clean_answer: Vec::new(),
        corrupted_answer: Vec::new(),
        source: Vec::new(),
        slot,
    };
    let mut clean = Vec::new();
    let mut corrupted = Vec::new();
    for i in 0..n {
        let Some(j) = (1..n)
            .map(|k| (i + k) % n)
            .find(|&j| set.y[[j, slot]] != set.y[[i, slot]])
        else {
            continue;
        };
        let mut c = set.x.slice(s![i, .., ..]).to_owned();
        for p in 0..panels {
            c.slice_mut(s![f * p + slot, ..])
                .assign(&set.x.slice(s![j, f * p + slot, ..]));
        }
        clean.push(set.x.slice(s![i, .., ..]).to_owned());
        corrupted.push(c);
        pairs.clean_answer.push(set.y[[i, slot]] as usize);
        pairs.corrupted_answer.push(set.y[[j, slot]] as usize);
        pairs.source.push((i, j));
    }
    if clean.is_empty() {
        return Err(ProbeError::InvalidInput(format!(
            "no two of the {n} problems differ in their answer at slot {slot}: nothing to patch"
        )));
    }
    let stack = |v: &[ndarray::Array2<f32>]| -> Result<Array3<f32>> {
        let views: Vec<_> = v.iter().map(|a| a.view()).collect();
        ndarray::stack(ndarray::Axis(0), &views)
            .map_err(|e| ProbeError::InvalidInput(format!("stacking problems: {e}")))
    };
    pairs.clean = stack(&clean)?;
    pairs.corrupted = stack(&corrupted)?;
    Ok(pairs)
}

/// `value` with index `index` of axis `dim` taken from `source` (same shape).
fn replace_index(value: &Tensor, source: &Tensor, dim: usize, index: usize) -> Result<Tensor> {
    let n = value.dim(dim)?;
    let mut parts = Vec::with_capacity(3);
    if index > 0 {
        parts.push(value.narrow(dim, 0, index)?);
    }
    parts.push(source.narrow(dim, index, 1)?);
    if index + 1 < n {
        parts.push(value.narrow(dim, index + 1, n - index - 1)?);
    }
    Ok(Tensor::cat(&parts, dim)?)
}

/// Puts index `index` of axis `dim` of the clean activation `name` into the pass.
struct PatchIndex<'a> {
    name: &'a str,
    dim: usize,
    index: usize,
    clean: &'a Tensor,
}

impl HookFn for PatchIndex<'_> {
    fn wants(&self, name: &str) -> bool {
        name == self.name
    }

    fn call(&mut self, _: &str, value: &Tensor) -> hyperlens_model::Result<Option<Tensor>> {
        replace_index(value, self.clean, self.dim, self.index)
            .map(Some)
            .map_err(|e| hyperlens_model::ModelError::Input(e.to_string()))
    }
}

/// The result of [`activation_patching`]: normalised scores (module docs) per patched activation.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchingReport {
    /// Pairs patched.
    pub n: usize,
    /// The answer slot.
    pub slot: usize,
    /// Mean logit difference of the clean problems (nats).
    pub clean_logit_diff: f64,
    /// Mean logit difference of the corrupted problems (nats).
    pub corrupted_logit_diff: f64,
    /// `[L, T]` patching `blocks.{l}.hook_resid_pre` at one position (TransformerLens
    /// `get_act_patch_resid_pre`).
    pub resid_pre: Array2<f64>,
    /// `[L, T]` patching `blocks.{l}.hook_attn_out` at one position (`get_act_patch_attn_out`).
    pub attn_out: Array2<f64>,
    /// `[L, T]` patching `blocks.{l}.hook_mlp_out` at one position (`get_act_patch_mlp_out`);
    /// `None` for models without MLPs.
    pub mlp_out: Option<Array2<f64>>,
    /// `[L, H]` patching one head's `blocks.{l}.attn.hook_z` at every position
    /// (`get_act_patch_attn_head_out_all_pos`).
    pub head_out: Array2<f64>,
}

/// The answer-logit difference `logits[b, slot, clean] - logits[b, slot, corrupted]` per problem.
///
/// # Shapes
/// `logits [B, F, C]`, `clean` and `corrupted` `[B]`; returns `[B]`.
fn logit_diffs(
    logits: &Tensor,
    slot: usize,
    clean: &[usize],
    corrupted: &[usize],
) -> Result<Vec<f64>> {
    let v: Vec<Vec<f32>> = logits.narrow(1, slot, 1)?.squeeze(1)?.to_vec2()?;
    Ok(v.iter()
        .zip(clean.iter().zip(corrupted))
        .map(|(l, (&c, &k))| f64::from(l[c]) - f64::from(l[k]))
        .collect())
}

/// The activation `name` of `cache`, or an error naming it.
pub(super) fn cached<'a>(cache: &'a Cache, name: &str) -> Result<&'a Tensor> {
    cache
        .get(name)
        .ok_or_else(|| ProbeError::InvalidInput(format!("no {name} in the cache")))
}

/// Activation patching (module docs) of the model of `ev` on `pairs`, in batches of `batch`, by
/// its hooked pass ([`Evaluator::run_with_hooks`]): every position of the residual stream entering
/// each layer, of each attention output and MLP output, and every head's output at all positions,
/// each patched alone from the clean into the corrupted pass.
/// `progress(done, total)` counts forward passes; its `ControlFlow::Break` stops the work. A patch
/// whose clean and corrupted values are equal for the whole batch changes nothing and is not run.
///
/// # Shapes
/// `pairs.clean`, `pairs.corrupted` `[N, T, M]` as the model reads them. Outputs in
/// [`PatchingReport`].
///
/// # Errors
/// [`ProbeError::InvalidInput`] for no pair, a zero batch, a slot outside the model's outputs, or a
/// model that does not separate the clean from the corrupted answer (equal mean logit differences);
/// [`ProbeError::Interrupted`] when `progress` breaks; model errors.
pub fn activation_patching(
    ev: &Evaluator,
    pairs: &PatchPairs,
    batch: usize,
    mut progress: impl FnMut(usize, usize) -> ControlFlow<()>,
) -> Result<PatchingReport> {
    check_patching_input(ev, pairs, batch)?;
    let kinds = patch_kinds(ev);
    let names = patching_hook_names(ev, &kinds);
    let cfg = ev.config();
    let n = pairs.len();
    let per_batch = 2 + cfg.n_layers * (kinds.len() * cfg.n_tokens + cfg.n_heads);
    let total = n.div_ceil(batch) * per_batch;
    let mut done = 0;
    let mut sums = PatchSums::zeros(ev, kinds.len());
    for s in (0..n).step_by(batch) {
        let passes = clean_and_corrupted_passes(ev, pairs, &names, s, (s + batch).min(n))?;
        sums.clean += passes.clean_ld;
        sums.corrupted += passes.corrupted_ld;
        done += 2;
        step(&mut progress, done, total)?;
        patch_batch(ev, &passes, &kinds, &mut sums, &mut || {
            done += 1;
            step(&mut progress, done, total)
        })?;
    }
    normalised_patching_report(pairs, kinds.contains(&"hook_mlp_out"), &sums)
}

/// Checks that there are pairs, a positive batch and a slot among the model's outputs.
fn check_patching_input(ev: &Evaluator, pairs: &PatchPairs, batch: usize) -> Result<()> {
    let n_outputs = ev.config().n_outputs;
    let n = pairs.len();
    if n == 0 || batch == 0 || pairs.slot >= n_outputs {
        return Err(ProbeError::InvalidInput(format!(
            "{n} pairs, batch {batch}, slot {} of {}: give pairs, a positive batch and a slot of the model",
            pairs.slot, n_outputs
        )));
    }
    Ok(())
}

/// The per-position activations patched in each layer: `hook_resid_pre`, `hook_attn_out` and,
/// when any block has an MLP, `hook_mlp_out`.
fn patch_kinds(ev: &Evaluator) -> Vec<&'static str> {
    let mut kinds = vec!["hook_resid_pre", "hook_attn_out"];
    if ev.transformer().blocks.iter().any(|b| b.mlp.is_some()) {
        kinds.push("hook_mlp_out");
    }
    kinds
}

/// The hook names to cache: each layer's `kinds`, then its `attn.hook_z`.
fn patching_hook_names(ev: &Evaluator, kinds: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for l in 0..ev.config().n_layers {
        for k in kinds {
            names.push(format!("blocks.{l}.{k}"));
        }
        names.push(format!("blocks.{l}.attn.hook_z"));
    }
    names
}

/// Sums over problems of the logit differences: unpatched, and patched per activation.
struct PatchSums {
    /// `[kind, L, T]` patching one position of one per-position activation.
    pos: Array3<f64>,
    /// `[L, H]` patching one head at every position.
    head: Array2<f64>,
    /// The clean problems.
    clean: f64,
    /// The corrupted problems.
    corrupted: f64,
}

impl PatchSums {
    /// All zero, for `n_kinds` per-position activations of the model of `ev`.
    fn zeros(ev: &Evaluator, n_kinds: usize) -> PatchSums {
        let cfg = ev.config();
        PatchSums {
            pos: Array3::zeros((n_kinds, cfg.n_layers, cfg.n_tokens)),
            head: Array2::zeros((cfg.n_layers, cfg.n_heads)),
            clean: 0.0,
            corrupted: 0.0,
        }
    }
}

/// One batch's clean and corrupted passes.
struct BatchPasses<'a> {
    /// `[B, T, M]` the corrupted input.
    xk: Tensor,
    /// The clean pass's activations.
    clean: Cache,
    /// The corrupted pass's activations.
    corrupted: Cache,
    /// `[B]` the clean answers.
    clean_answer: &'a [usize],
    /// `[B]` the corrupted answers.
    corrupted_answer: &'a [usize],
    /// The answer slot.
    slot: usize,
    /// Sum of the clean logit differences.
    clean_ld: f64,
    /// Sum of the corrupted logit differences.
    corrupted_ld: f64,
}

/// Runs the clean and the corrupted problems `s..e` of `pairs`, caching `names`.
///
/// # Shapes
/// `pairs.clean`, `pairs.corrupted` `[N, T, M]`; the batch is `B = e - s` of them.
fn clean_and_corrupted_passes<'a>(
    ev: &Evaluator,
    pairs: &'a PatchPairs,
    names: &[String],
    s: usize,
    e: usize,
) -> Result<BatchPasses<'a>> {
    let ca = &pairs.clean_answer[s..e];
    let ka = &pairs.corrupted_answer[s..e];
    let xc = ev.input(pairs.clean.slice(s![s..e, .., ..]))?;
    let xk = ev.input(pairs.corrupted.slice(s![s..e, .., ..]))?;
    let mut clean = Cache::new(names.to_vec());
    let lc = ev.run_with_hooks(&xc, &mut clean)?;
    let mut corrupted = Cache::new(names.to_vec());
    let lk = ev.run_with_hooks(&xk, &mut corrupted)?;
    let corrupted_ld: f64 = logit_diffs(&lk, pairs.slot, ca, ka)?.iter().sum();
    let clean_ld = logit_diffs(&lc, pairs.slot, ca, ka)?.iter().sum::<f64>();
    Ok(BatchPasses {
        xk,
        clean,
        corrupted,
        clean_answer: ca,
        corrupted_answer: ka,
        slot: pairs.slot,
        clean_ld,
        corrupted_ld,
    })
}

/// Patches every position of each of `kinds` and every head of each layer in one batch, adding the
/// summed logit differences to `sums`; `tick()` after each patch (its error stops the batch).
fn patch_batch(
    ev: &Evaluator,
    passes: &BatchPasses,
    kinds: &[&str],
    sums: &mut PatchSums,
    tick: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let cfg = ev.config();
    for l in 0..cfg.n_layers {
        for (ki, k) in kinds.iter().enumerate() {
            let name = format!("blocks.{l}.{k}");
            for p in 0..cfg.n_tokens {
                sums.pos[[ki, l, p]] += patched_logit_diff(ev, passes, &name, 1, p)?;
                tick()?;
            }
        }
        let name = format!("blocks.{l}.attn.hook_z");
        for h in 0..cfg.n_heads {
            sums.head[[l, h]] += patched_logit_diff(ev, passes, &name, 2, h)?;
            tick()?;
        }
    }
    Ok(())
}

/// Sum of the logit differences of the corrupted pass with index `index` of axis `dim` of `name`
/// patched from the clean pass (the unpatched sum when the two are equal there).
fn patched_logit_diff(
    ev: &Evaluator,
    passes: &BatchPasses,
    name: &str,
    dim: usize,
    index: usize,
) -> Result<f64> {
    let cv = cached(&passes.clean, name)?;
    let kv = cached(&passes.corrupted, name)?;
    let same = cv
        .narrow(dim, index, 1)?
        .eq(&kv.narrow(dim, index, 1)?)?
        .to_dtype(DType::F32)?
        .min_all()?
        .to_scalar::<f32>()?
        > 0.5;
    if same {
        return Ok(passes.corrupted_ld);
    }
    let mut hook = PatchIndex {
        name,
        dim,
        index,
        clean: cv,
    };
    let logits = ev.run_with_hooks(&passes.xk, &mut hook)?;
    Ok(logit_diffs(
        &logits,
        passes.slot,
        passes.clean_answer,
        passes.corrupted_answer,
    )?
    .iter()
    .sum())
}

/// Means over the pairs and the normalised scores (module docs); fails when the clean and the
/// corrupted mean logit differences are (nearly) equal.
fn normalised_patching_report(
    pairs: &PatchPairs,
    has_mlp: bool,
    sums: &PatchSums,
) -> Result<PatchingReport> {
    let n = pairs.len();
    let nf = n as f64;
    let (clean_ld, corr_ld) = (sums.clean / nf, sums.corrupted / nf);
    let span = clean_ld - corr_ld;
    if span.is_nan() || span.abs() <= 1e-9 {
        return Err(ProbeError::InvalidInput(format!(
            "the model's mean logit difference is the same on the clean and the corrupted problems \
             ({clean_ld:.3e} and {corr_ld:.3e} nats): nothing to restore by patching"
        )));
    }
    let norm = |v: f64| (v / nf - corr_ld) / span;
    let pos = sums.pos.mapv(norm);
    Ok(PatchingReport {
        n,
        slot: pairs.slot,
        clean_logit_diff: clean_ld,
        corrupted_logit_diff: corr_ld,
        resid_pre: pos.slice(s![0, .., ..]).to_owned(),
        attn_out: pos.slice(s![1, .., ..]).to_owned(),
        mlp_out: has_mlp.then(|| pos.slice(s![2, .., ..]).to_owned()),
        head_out: sums.head.mapv(norm),
    })
}

/// `activation_patching.csv`: `activation,layer,index,label,score` (index = position for
/// `resid_pre` / `attn_out` / `mlp_out`, head for `head_out`; scores with 6 decimals).
///
/// # Errors
/// None in practice (every column has one value per row).
pub fn patching_table(r: &PatchingReport) -> Result<Table> {
    let (mut kind, mut layer, mut index, mut label, mut score) =
        (vec![], vec![], vec![], vec![], vec![]);
    let mut grid = |k: &str, a: &Array2<f64>, name: &dyn Fn(usize, usize) -> String| {
        for ((l, i), &v) in a.indexed_iter() {
            kind.push(k.to_string());
            layer.push(l as i64);
            index.push(i as i64);
            label.push(name(l, i));
            score.push(v);
        }
    };
    grid("resid_pre", &r.resid_pre, &|_, i| format!("pos{i}"));
    grid("attn_out", &r.attn_out, &|_, i| format!("pos{i}"));
    if let Some(m) = &r.mlp_out {
        grid("mlp_out", m, &|_, i| format!("pos{i}"));
    }
    grid("head_out", &r.head_out, &|l, h| format!("L{l}H{h}"));
    let mut t = Table::new();
    t.push("activation", Column::Text(kind))?;
    t.push("layer", Column::Int(layer))?;
    t.push("index", Column::Int(index))?;
    t.push("label", Column::Text(label))?;
    t.push("score", Column::float(score, 6))?;
    Ok(t)
}
