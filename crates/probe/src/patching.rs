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

use candle_core::{DType, Tensor};
use hyperlens_model::eval::batch_tensor;
use hyperlens_model::hooks::{Cache, HookFn};
use hyperlens_model::Transformer;
use hyperlens_tasks::sraven::ProblemSet;
use ndarray::{s, Array2, Array3};

use crate::error::{ProbeError, Result};

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

/// Activation patching (module docs) of `model` on `pairs`, in batches of `batch`: every position
/// of the residual stream entering each layer, of each attention output and MLP output, and every
/// head's output at all positions, each patched alone from the clean into the corrupted pass.
/// `progress(done, total)` counts forward passes. A patch whose clean and corrupted values are
/// equal for the whole batch changes nothing and is not run.
///
/// # Shapes
/// `pairs.clean`, `pairs.corrupted` `[N, T, M]` as the model reads them. Outputs in
/// [`PatchingReport`].
///
/// # Errors
/// [`ProbeError::InvalidInput`] for no pair, a zero batch, a slot outside the model's outputs, or a
/// model that does not separate the clean from the corrupted answer (equal mean logit differences);
/// model errors.
pub fn activation_patching(
    model: &Transformer,
    pairs: &PatchPairs,
    batch: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<PatchingReport> {
    let cfg = model.config().clone();
    let (l_n, h_n, t) = (cfg.n_layers, cfg.n_heads, cfg.n_tokens);
    let n = pairs.len();
    if n == 0 || batch == 0 || pairs.slot >= cfg.n_outputs {
        return Err(ProbeError::InvalidInput(format!(
            "{n} pairs, batch {batch}, slot {} of {}: give pairs, a positive batch and a slot of the model",
            pairs.slot, cfg.n_outputs
        )));
    }
    let has_mlp = model.blocks.iter().any(|b| b.mlp.is_some());
    let mut kinds = vec!["hook_resid_pre", "hook_attn_out"];
    if has_mlp {
        kinds.push("hook_mlp_out");
    }
    let mut names: Vec<String> = Vec::new();
    for l in 0..l_n {
        for k in &kinds {
            names.push(format!("blocks.{l}.{k}"));
        }
        names.push(format!("blocks.{l}.attn.hook_z"));
    }
    let batches = n.div_ceil(batch);
    let per_batch = 2 + l_n * (kinds.len() * t + h_n);
    let total = batches * per_batch;
    let mut done = 0;
    // Sums over problems of the patched logit differences: [kind, L, T] and [L, H].
    let mut pos_sum = Array3::<f64>::zeros((kinds.len(), l_n, t));
    let mut head_sum = Array2::<f64>::zeros((l_n, h_n));
    let (mut clean_sum, mut corr_sum) = (0.0, 0.0);
    let device = model.device().clone();
    for s in (0..n).step_by(batch) {
        let e = (s + batch).min(n);
        let ca = &pairs.clean_answer[s..e];
        let ka = &pairs.corrupted_answer[s..e];
        let xc = batch_tensor(&pairs.clean.slice(s![s..e, .., ..]).to_owned(), &device)?;
        let xk = batch_tensor(&pairs.corrupted.slice(s![s..e, .., ..]).to_owned(), &device)?;
        let mut clean = Cache::new(names.clone());
        let lc = model.run_with_hooks(&xc, &mut clean)?;
        let mut corr = Cache::new(names.clone());
        let lk = model.run_with_hooks(&xk, &mut corr)?;
        let base: f64 = logit_diffs(&lk, pairs.slot, ca, ka)?.iter().sum();
        clean_sum += logit_diffs(&lc, pairs.slot, ca, ka)?.iter().sum::<f64>();
        corr_sum += base;
        done += 2;
        progress(done, total);
        let mut run = |name: &str, dim: usize, index: usize| -> Result<f64> {
            let cv = clean
                .get(name)
                .ok_or_else(|| ProbeError::InvalidInput(format!("no {name} in the cache")))?;
            let kv = corr
                .get(name)
                .ok_or_else(|| ProbeError::InvalidInput(format!("no {name} in the cache")))?;
            let same = cv
                .narrow(dim, index, 1)?
                .eq(&kv.narrow(dim, index, 1)?)?
                .to_dtype(DType::F32)?
                .min_all()?
                .to_scalar::<f32>()?
                > 0.5;
            let got = if same {
                base
            } else {
                let mut hook = PatchIndex {
                    name,
                    dim,
                    index,
                    clean: cv,
                };
                let logits = model.run_with_hooks(&xk, &mut hook)?;
                logit_diffs(&logits, pairs.slot, ca, ka)?.iter().sum()
            };
            done += 1;
            progress(done, total);
            Ok(got)
        };
        for l in 0..l_n {
            for (ki, k) in kinds.iter().enumerate() {
                let name = format!("blocks.{l}.{k}");
                for p in 0..t {
                    pos_sum[[ki, l, p]] += run(&name, 1, p)?;
                }
            }
            let name = format!("blocks.{l}.attn.hook_z");
            for h in 0..h_n {
                head_sum[[l, h]] += run(&name, 2, h)?;
            }
        }
    }
    let nf = n as f64;
    let (clean_ld, corr_ld) = (clean_sum / nf, corr_sum / nf);
    let span = clean_ld - corr_ld;
    if span.is_nan() || span.abs() <= 1e-9 {
        return Err(ProbeError::InvalidInput(format!(
            "the model's mean logit difference is the same on the clean and the corrupted problems \
             ({clean_ld:.3e} and {corr_ld:.3e} nats): nothing to restore by patching"
        )));
    }
    let norm = |v: f64| (v / nf - corr_ld) / span;
    let pos = pos_sum.mapv(norm);
    Ok(PatchingReport {
        n,
        slot: pairs.slot,
        clean_logit_diff: clean_ld,
        corrupted_logit_diff: corr_ld,
        resid_pre: pos.slice(s![0, .., ..]).to_owned(),
        attn_out: pos.slice(s![1, .., ..]).to_owned(),
        mlp_out: has_mlp.then(|| pos.slice(s![2, .., ..]).to_owned()),
        head_out: head_sum.mapv(norm),
    })
}

/// `activation_patching.csv`: `activation,layer,index,label,score` (index = position for
/// `resid_pre` / `attn_out` / `mlp_out`, head for `head_out`).
pub fn patching_csv(r: &PatchingReport) -> String {
    let mut s = String::from("activation,layer,index,label,score\n");
    let mut grid = |kind: &str, a: &Array2<f64>, label: &dyn Fn(usize, usize) -> String| {
        for ((l, i), v) in a.indexed_iter() {
            s.push_str(&format!("{kind},{l},{i},{},{v:.6}\n", label(l, i)));
        }
    };
    grid("resid_pre", &r.resid_pre, &|_, i| format!("pos{i}"));
    grid("attn_out", &r.attn_out, &|_, i| format!("pos{i}"));
    if let Some(m) = &r.mlp_out {
        grid("mlp_out", m, &|_, i| format!("pos{i}"));
    }
    grid("head_out", &r.head_out, &|l, h| format!("L{l}H{h}"));
    s
}

/// The result of [`direct_logit_attribution`]: each component's mean direct contribution to the
/// answer logit, through the final LayerNorm with its scale frozen (TransformerLens
/// `apply_ln_to_stack`), in nats. `*_centred` attribute the answer logit minus the mean logit over
/// the values (the part that moves the prediction); the others the raw answer logit.
#[derive(Debug, Clone, PartialEq)]
pub struct DlaReport {
    /// (problem, slot) pairs averaged over.
    pub n: usize,
    /// The answer slots attributed.
    pub slots: Vec<usize>,
    /// `[L, H]` each head's output `z W_O[h]`.
    pub heads: Array2<f64>,
    /// `[L, H]` the same, centred logit.
    pub heads_centred: Array2<f64>,
    /// `[L]` each layer's MLP output (zeros for models without MLPs).
    pub mlp: Vec<f64>,
    /// `[L]` the same, centred logit.
    pub mlp_centred: Vec<f64>,
    /// `[L]` each layer's attention output bias `b_O`.
    pub attn_bias: Vec<f64>,
    /// `[L]` the same, centred logit.
    pub attn_bias_centred: Vec<f64>,
    /// The embedding `x W_E + b_E`.
    pub embed: f64,
    /// The same, centred logit.
    pub embed_centred: f64,
    /// What no component writes: the final LayerNorm's bias and the unembedding's bias.
    pub constant: f64,
    /// The same, centred logit.
    pub constant_centred: f64,
    /// The mean answer logit (the sum of all the parts above).
    pub logit: f64,
    /// The mean centred answer logit.
    pub logit_centred: f64,
    /// Largest |sum of the parts - the model's logit| over all problems and slots (float32
    /// rounding of the forward pass; the decomposition itself is exact).
    pub max_error: f64,
}

/// Direct logit attribution of `model` on the SRAVEN problems `set` (batches of `batch`): the
/// final residual stream at each answer slot in `slots` is split into the embedding, each head's
/// output `z W_O[h]`, each attention bias and each MLP output; each part is centred, divided by the
/// final LayerNorm's scale of the whole stream (frozen), multiplied by its weight and projected on
/// the unembedding column of the right answer (TransformerLens `cache.stack_head_results` +
/// `apply_ln_to_stack` + `logit_attrs`). Computed in float64 from the cached float32 activations.
///
/// # Shapes
/// `set.x [N, T, M]`, `set.y [N, F]` (unpermuted or not: the answer of output `f` is `y[:, f]`).
///
/// # Errors
/// [`ProbeError::InvalidInput`] for an empty set or slot list, a zero batch or a slot outside the
/// model's outputs; model errors.
pub fn direct_logit_attribution(
    model: &Transformer,
    set: &ProblemSet,
    slots: &[usize],
    batch: usize,
) -> Result<DlaReport> {
    let cfg = model.config().clone();
    let (l_n, h_n, d, f_n, t) = (
        cfg.n_layers,
        cfg.n_heads,
        cfg.d_head,
        cfg.n_outputs,
        cfg.n_tokens,
    );
    if set.is_empty() || slots.is_empty() || batch == 0 || slots.iter().any(|&s| s >= f_n) {
        return Err(ProbeError::InvalidInput(format!(
            "{} problems, slots {slots:?} (of {f_n}), batch {batch}: give problems, slots of the model and a positive batch",
            set.len()
        )));
    }
    let host2 = |x: &Tensor| -> Result<Array2<f64>> {
        let (a, b) = x.dims2()?;
        let v: Vec<f32> = x.flatten_all()?.to_vec1()?;
        Array2::from_shape_vec((a, b), v.into_iter().map(f64::from).collect())
            .map_err(|e| ProbeError::InvalidInput(e.to_string()))
    };
    let host1 = |x: &Tensor| -> Result<Vec<f64>> {
        Ok(x.flatten_all()?
            .to_vec1::<f32>()?
            .into_iter()
            .map(f64::from)
            .collect())
    };
    let gamma = host1(&model.ln_final.w)?;
    let beta = host1(&model.ln_final.b)?;
    let eps = model.ln_final.eps;
    let w_u = host2(&model.unembed.w)?; // [D, C]
    let b_u = host1(&model.unembed.b)?;
    let (dm, c_n) = w_u.dim();
    let w_o: Vec<Array3<f64>> = model
        .blocks
        .iter()
        .map(|b| {
            let v = host1(&b.attn.w_o)?;
            Array3::from_shape_vec((h_n, d, dm), v)
                .map_err(|e| ProbeError::InvalidInput(format!("W_O: {e}")))
        })
        .collect::<Result<_>>()?;
    let b_o: Vec<Vec<f64>> = model
        .blocks
        .iter()
        .map(|b| host1(&b.attn.b_o))
        .collect::<Result<_>>()?;
    let has_mlp: Vec<bool> = model.blocks.iter().map(|b| b.mlp.is_some()).collect();
    let mut names = vec!["hook_embed".to_string()];
    for (l, &mlp) in has_mlp.iter().enumerate() {
        names.push(format!("blocks.{l}.attn.hook_z"));
        if mlp {
            names.push(format!("blocks.{l}.hook_mlp_out"));
        }
    }
    names.push(format!("blocks.{}.hook_resid_post", l_n - 1));
    let mut r = DlaReport {
        n: 0,
        slots: slots.to_vec(),
        heads: Array2::zeros((l_n, h_n)),
        heads_centred: Array2::zeros((l_n, h_n)),
        mlp: vec![0.0; l_n],
        mlp_centred: vec![0.0; l_n],
        attn_bias: vec![0.0; l_n],
        attn_bias_centred: vec![0.0; l_n],
        embed: 0.0,
        embed_centred: 0.0,
        constant: 0.0,
        constant_centred: 0.0,
        logit: 0.0,
        logit_centred: 0.0,
        max_error: 0.0,
    };
    // The mean unembedding column (the centred answer direction is W_U[:, a] minus it).
    let col_mean: Vec<f64> = (0..dm).map(|j| w_u.row(j).sum() / c_n as f64).collect();
    let bu_mean = b_u.iter().sum::<f64>() / c_n as f64;
    // Per answer value a: g = gamma * W_U[:, a] and its centred form gc, their sums, and the
    // constants (the LayerNorm bias and the unembedding bias projected the same way).
    let dirs: Vec<Direction> = (0..c_n)
        .map(|a| {
            let u = |j: usize| w_u[[j, a]];
            let uc = |j: usize| w_u[[j, a]] - col_mean[j];
            let g: Vec<f64> = (0..dm).map(|j| gamma[j] * u(j)).collect();
            let gc: Vec<f64> = (0..dm).map(|j| gamma[j] * uc(j)).collect();
            Direction {
                gs: g.iter().sum(),
                gcs: gc.iter().sum(),
                g,
                gc,
                k: (0..dm).map(|j| beta[j] * u(j)).sum::<f64>() + b_u[a],
                kc: (0..dm).map(|j| beta[j] * uc(j)).sum::<f64>() + b_u[a] - bu_mean,
            }
        })
        .collect();
    let device = model.device().clone();
    let last = |x: &Tensor| -> Result<Vec<f64>> {
        // The F output positions of an activation [B, T, ...], flattened.
        host1(&x.narrow(1, t - f_n, f_n)?.contiguous()?)
    };
    for s0 in (0..set.len()).step_by(batch) {
        let part = set.slice(s0, s0 + batch);
        let b_n = part.len();
        let x = batch_tensor(&part.x, &device)?;
        let mut cache = Cache::new(names.clone());
        let logits = host1(&model.run_with_hooks(&x, &mut cache)?)?; // [B, F, C]
        let get = |name: &str| -> Result<Vec<f64>> {
            last(
                cache
                    .get(name)
                    .ok_or_else(|| ProbeError::InvalidInput(format!("no {name} in the cache")))?,
            )
        };
        let embed = get("hook_embed")?; // [B, F, D]
        let resid = get(&format!("blocks.{}.hook_resid_post", l_n - 1))?;
        let z: Vec<Vec<f64>> = (0..l_n)
            .map(|l| get(&format!("blocks.{l}.attn.hook_z"))) // [B, F, H, d]
            .collect::<Result<_>>()?;
        let mlp: Vec<Option<Vec<f64>>> = (0..l_n)
            .map(|l| {
                has_mlp[l]
                    .then(|| get(&format!("blocks.{l}.hook_mlp_out")))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        for bi in 0..b_n {
            for &f in slots {
                let o = (bi * f_n + f) * dm;
                let stream = &resid[o..o + dm];
                let mean = stream.iter().sum::<f64>() / dm as f64;
                let var = stream.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / dm as f64;
                let scale = (var + eps).sqrt();
                let y = part.y[[bi, f]];
                let (a, dir) = usize::try_from(y)
                    .ok()
                    .and_then(|a| dirs.get(a).map(|d| (a, d)))
                    .ok_or_else(|| {
                        ProbeError::InvalidInput(format!(
                            "answer value {y} of problem {} is outside the model's {c_n} values",
                            s0 + bi
                        ))
                    })?;
                // Direct effect of a part c: (c·g - mean(c) Σg) / scale.
                let attr = |c: &[f64]| -> (f64, f64) {
                    let m = c.iter().sum::<f64>() / dm as f64;
                    let dot = |w: &[f64]| c.iter().zip(w).map(|(x, y)| x * y).sum::<f64>();
                    (
                        (dot(&dir.g) - m * dir.gs) / scale,
                        (dot(&dir.gc) - m * dir.gcs) / scale,
                    )
                };
                let mut total = (0.0, 0.0);
                let mut add = |dst: &mut f64, dstc: &mut f64, v: (f64, f64)| {
                    *dst += v.0;
                    *dstc += v.1;
                    total.0 += v.0;
                    total.1 += v.1;
                };
                add(&mut r.embed, &mut r.embed_centred, attr(&embed[o..o + dm]));
                for l in 0..l_n {
                    for h in 0..h_n {
                        let zo = ((bi * f_n + f) * h_n + h) * d;
                        let zh = &z[l][zo..zo + d];
                        let out: Vec<f64> = (0..dm)
                            .map(|j| (0..d).map(|i| zh[i] * w_o[l][[h, i, j]]).sum())
                            .collect();
                        let v = attr(&out);
                        add(&mut r.heads[[l, h]], &mut r.heads_centred[[l, h]], v);
                    }
                    add(
                        &mut r.attn_bias[l],
                        &mut r.attn_bias_centred[l],
                        attr(&b_o[l]),
                    );
                    if let Some(m) = &mlp[l] {
                        add(&mut r.mlp[l], &mut r.mlp_centred[l], attr(&m[o..o + dm]));
                    }
                }
                add(&mut r.constant, &mut r.constant_centred, (dir.k, dir.kc));
                let lo = (bi * f_n + f) * c_n;
                let row = &logits[lo..lo + c_n];
                let logit = row[a];
                let centred = logit - row.iter().sum::<f64>() / c_n as f64;
                r.logit += logit;
                r.logit_centred += centred;
                r.max_error = r
                    .max_error
                    .max((total.0 - logit).abs())
                    .max((total.1 - centred).abs());
                r.n += 1;
            }
        }
    }
    let nf = r.n as f64;
    for v in r
        .heads
        .iter_mut()
        .chain(r.heads_centred.iter_mut())
        .chain(r.mlp.iter_mut())
        .chain(r.mlp_centred.iter_mut())
        .chain(r.attn_bias.iter_mut())
        .chain(r.attn_bias_centred.iter_mut())
        .chain([
            &mut r.embed,
            &mut r.embed_centred,
            &mut r.constant,
            &mut r.constant_centred,
            &mut r.logit,
            &mut r.logit_centred,
        ])
    {
        *v /= nf;
    }
    Ok(r)
}

/// An answer value's direction through the final LayerNorm (its scale frozen), raw and centred.
struct Direction {
    /// `gamma * W_U[:, a]` `[D]`.
    g: Vec<f64>,
    /// `gamma * (W_U[:, a] - mean column)` `[D]`.
    gc: Vec<f64>,
    /// `Σ g`.
    gs: f64,
    /// `Σ gc`.
    gcs: f64,
    /// `beta · W_U[:, a] + b_U[a]`.
    k: f64,
    /// The same, centred.
    kc: f64,
}

/// `dla.csv`: `component,layer,head,label,logit_attr,centred_logit_attr` (nats, means over the
/// problems and slots), one row per head, attention bias, MLP, the embedding and the constant.
pub fn dla_csv(r: &DlaReport) -> String {
    let mut s = String::from("component,layer,head,label,logit_attr,centred_logit_attr\n");
    s.push_str(&format!(
        "embed,,,embed,{:.6},{:.6}\n",
        r.embed, r.embed_centred
    ));
    for ((l, h), v) in r.heads.indexed_iter() {
        s.push_str(&format!(
            "head,{l},{h},L{l}H{h},{v:.6},{:.6}\n",
            r.heads_centred[[l, h]]
        ));
    }
    for l in 0..r.mlp.len() {
        s.push_str(&format!(
            "attn_bias,{l},,L{l}.b_O,{:.6},{:.6}\n",
            r.attn_bias[l], r.attn_bias_centred[l]
        ));
        s.push_str(&format!(
            "mlp,{l},,L{l}.mlp,{:.6},{:.6}\n",
            r.mlp[l], r.mlp_centred[l]
        ));
    }
    s.push_str(&format!(
        "constant,,,ln_final.b+b_U,{:.6},{:.6}\n",
        r.constant, r.constant_centred
    ));
    s
}
