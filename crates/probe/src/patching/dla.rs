//! Direct logit attribution on SRAVEN: each component's direct contribution to the answer logit
//! through the final LayerNorm with its scale frozen (TransformerLens's
//! `ActivationCache.apply_ln_to_stack`; Elhage et al. 2021). Part of [`super`], which holds the
//! clean and corrupted problems and activation patching.

use std::ops::ControlFlow;

use candle_core::Tensor;
use hyperlens_model::hooks::Cache;
use hyperlens_model::{Evaluator, Transformer};
use hyperlens_tasks::sraven::ProblemSet;
use ndarray::{Array2, Array3};

use super::cached;
use crate::error::{step, ProbeError, Result};
use hyperlens_analysis::table::{Column, Table};

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

/// Direct logit attribution of the model of `ev` on the SRAVEN problems `set` (batches of `batch`,
/// cached by the hooked pass [`Evaluator::run_with_hooks`]): the final residual stream at each answer slot in `slots` is split into the embedding, each head's
/// output `z W_O[h]`, each attention bias and each MLP output; each part is centred, divided by the
/// final LayerNorm's scale of the whole stream (frozen), multiplied by its weight and projected on
/// the unembedding column of the right answer (TransformerLens `cache.stack_head_results` +
/// `apply_ln_to_stack` + `logit_attrs`). Computed in float64 from the cached float32 activations.
/// `progress(done, total)` counts batches; its `ControlFlow::Break` stops the work.
///
/// # Shapes
/// `set.x [N, T, M]`, `set.y [N, F]` (unpermuted or not: the answer of output `f` is `y[:, f]`).
///
/// # Errors
/// [`ProbeError::InvalidInput`] for an empty set or slot list, a zero batch or a slot outside the
/// model's outputs; [`ProbeError::Interrupted`] when `progress` breaks; model errors.
pub fn direct_logit_attribution(
    ev: &Evaluator,
    set: &ProblemSet,
    slots: &[usize],
    batch: usize,
    mut progress: impl FnMut(usize, usize) -> ControlFlow<()>,
) -> Result<DlaReport> {
    let model = ev.transformer();
    check_dla_input(model, set, slots, batch)?;
    let w = DlaWeights::of(model)?;
    let names = dla_hook_names(model);
    let mut r = DlaReport::zeros(slots, model.config().n_layers, model.config().n_heads);
    let dirs = answer_directions(&w);
    let f_n = model.config().n_outputs;
    let n_batches = set.len().div_ceil(batch);
    for (b, s0) in (0..set.len()).step_by(batch).enumerate() {
        let part = set.slice(s0, s0 + batch);
        let acts = DlaActivations::of(ev, &part, &names)?;
        for bi in 0..part.len() {
            for &f in slots {
                let pos = bi * f_n + f;
                let scale = layer_norm_scale(&acts.resid[pos * w.dm..(pos + 1) * w.dm], w.eps);
                let (a, dir) = answer_direction(&dirs, part.y[[bi, f]], s0 + bi)?;
                let total = attribute_position(&mut r, &w, &acts, dir, scale, pos);
                record_logit(
                    &mut r,
                    &acts.logits[pos * w.c_n..(pos + 1) * w.c_n],
                    a,
                    total,
                );
            }
        }
        step(&mut progress, b + 1, n_batches)?;
    }
    r.divide_by_n();
    Ok(r)
}

/// Checks that there are problems and slots, a positive batch, and slots among the model's outputs.
fn check_dla_input(
    model: &Transformer,
    set: &ProblemSet,
    slots: &[usize],
    batch: usize,
) -> Result<()> {
    let f_n = model.config().n_outputs;
    if set.is_empty() || slots.is_empty() || batch == 0 || slots.iter().any(|&s| s >= f_n) {
        return Err(ProbeError::InvalidInput(format!(
            "{} problems, slots {slots:?} (of {f_n}), batch {batch}: give problems, slots of the model and a positive batch",
            set.len()
        )));
    }
    Ok(())
}

/// A float32 matrix on the host in float64.
///
/// # Shapes
/// `x [A, B]`; returns `[A, B]`.
fn host_matrix(x: &Tensor) -> Result<Array2<f64>> {
    let (a, b) = x.dims2()?;
    let v: Vec<f32> = x.flatten_all()?.to_vec1()?;
    Array2::from_shape_vec((a, b), v.into_iter().map(f64::from).collect())
        .map_err(|e| ProbeError::InvalidInput(e.to_string()))
}

/// A float32 tensor on the host in float64, flattened in row-major order.
///
/// # Shapes
/// `x` any shape; returns its elements `[numel]`.
fn host_flat(x: &Tensor) -> Result<Vec<f64>> {
    Ok(x.flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(f64::from)
        .collect())
}

/// The weights direct logit attribution reads, on the host in float64.
struct DlaWeights {
    /// `[D]` the final LayerNorm's weight.
    gamma: Vec<f64>,
    /// `[D]` the final LayerNorm's bias.
    beta: Vec<f64>,
    /// The final LayerNorm's epsilon.
    eps: f64,
    /// `[D, C]` the unembedding.
    w_u: Array2<f64>,
    /// `[C]` the unembedding's bias.
    b_u: Vec<f64>,
    /// `[L]` of `[H, d, D]` each layer's `W_O`.
    w_o: Vec<Array3<f64>>,
    /// `[L]` of `[D]` each layer's `b_O`.
    b_o: Vec<Vec<f64>>,
    /// The residual width D.
    dm: usize,
    /// The number of answer values C.
    c_n: usize,
}

impl DlaWeights {
    /// Copies `model`'s final LayerNorm, unembedding, `W_O` and `b_O` to the host.
    fn of(model: &Transformer) -> Result<DlaWeights> {
        let cfg = model.config();
        let gamma = host_flat(&model.ln_final.w)?;
        let beta = host_flat(&model.ln_final.b)?;
        let eps = model.ln_final.eps;
        let w_u = host_matrix(&model.unembed.w)?;
        let b_u = host_flat(&model.unembed.b)?;
        let (dm, c_n) = w_u.dim();
        let w_o: Vec<Array3<f64>> = model
            .blocks
            .iter()
            .map(|b| {
                let v = host_flat(&b.attn.w_o)?;
                Array3::from_shape_vec((cfg.n_heads, cfg.d_head, dm), v)
                    .map_err(|e| ProbeError::InvalidInput(format!("W_O: {e}")))
            })
            .collect::<Result<_>>()?;
        let b_o: Vec<Vec<f64>> = model
            .blocks
            .iter()
            .map(|b| host_flat(&b.attn.b_o))
            .collect::<Result<_>>()?;
        Ok(DlaWeights {
            gamma,
            beta,
            eps,
            w_u,
            b_u,
            w_o,
            b_o,
            dm,
            c_n,
        })
    }
}

/// The hook names to cache: `hook_embed`, each layer's `attn.hook_z` and (with an MLP)
/// `hook_mlp_out`, and the last layer's `hook_resid_post`.
fn dla_hook_names(model: &Transformer) -> Vec<String> {
    let mut names = vec!["hook_embed".to_string()];
    for (l, b) in model.blocks.iter().enumerate() {
        names.push(format!("blocks.{l}.attn.hook_z"));
        if b.mlp.is_some() {
            names.push(format!("blocks.{l}.hook_mlp_out"));
        }
    }
    names.push(format!(
        "blocks.{}.hook_resid_post",
        model.config().n_layers - 1
    ));
    names
}

impl DlaReport {
    /// All zero, for `slots` of a model with `l_n` layers of `h_n` heads.
    fn zeros(slots: &[usize], l_n: usize, h_n: usize) -> DlaReport {
        DlaReport {
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
        }
    }

    /// Turns the sums over the `n` (problem, slot) pairs into means (all but `max_error`).
    fn divide_by_n(&mut self) {
        let nf = self.n as f64;
        for v in self
            .heads
            .iter_mut()
            .chain(self.heads_centred.iter_mut())
            .chain(self.mlp.iter_mut())
            .chain(self.mlp_centred.iter_mut())
            .chain(self.attn_bias.iter_mut())
            .chain(self.attn_bias_centred.iter_mut())
            .chain([
                &mut self.embed,
                &mut self.embed_centred,
                &mut self.constant,
                &mut self.constant_centred,
                &mut self.logit,
                &mut self.logit_centred,
            ])
        {
            *v /= nf;
        }
    }
}

/// Each answer value's [`Direction`]: `gamma * W_U[:, a]`, its centred form (the centred answer
/// direction is `W_U[:, a]` minus the mean column), their sums, and the constants (the LayerNorm
/// bias and the unembedding bias projected the same way).
///
/// # Shapes
/// Returns `[C]`.
fn answer_directions(w: &DlaWeights) -> Vec<Direction> {
    let (dm, c_n) = (w.dm, w.c_n);
    let col_mean: Vec<f64> = (0..dm).map(|j| w.w_u.row(j).sum() / c_n as f64).collect();
    let bu_mean = w.b_u.iter().sum::<f64>() / c_n as f64;
    (0..c_n)
        .map(|a| {
            let u = |j: usize| w.w_u[[j, a]];
            let uc = |j: usize| w.w_u[[j, a]] - col_mean[j];
            let g: Vec<f64> = (0..dm).map(|j| w.gamma[j] * u(j)).collect();
            let gc: Vec<f64> = (0..dm).map(|j| w.gamma[j] * uc(j)).collect();
            Direction {
                gs: g.iter().sum(),
                gcs: gc.iter().sum(),
                g,
                gc,
                k: (0..dm).map(|j| w.beta[j] * u(j)).sum::<f64>() + w.b_u[a],
                kc: (0..dm).map(|j| w.beta[j] * uc(j)).sum::<f64>() + w.b_u[a] - bu_mean,
            }
        })
        .collect()
}

/// One batch's logits and cached activations at the F output positions, flattened, in float64.
struct DlaActivations {
    /// `[B, F, C]` the logits.
    logits: Vec<f64>,
    /// `[B, F, D]` `hook_embed`.
    embed: Vec<f64>,
    /// `[B, F, D]` the last layer's `hook_resid_post`.
    resid: Vec<f64>,
    /// `[L]` of `[B, F, H, d]` each layer's `attn.hook_z`.
    z: Vec<Vec<f64>>,
    /// `[L]` of `[B, F, D]` each layer's `hook_mlp_out` (`None` without an MLP).
    mlp: Vec<Option<Vec<f64>>>,
}

impl DlaActivations {
    /// Runs the model of `ev` (its hooked pass) on the problems `part`, caching `names`.
    ///
    /// # Shapes
    /// `part.x [B, T, M]`.
    fn of(ev: &Evaluator, part: &ProblemSet, names: &[String]) -> Result<DlaActivations> {
        let model = ev.transformer();
        let cfg = model.config();
        let (l_n, f_n, t) = (cfg.n_layers, cfg.n_outputs, cfg.n_tokens);
        let x = ev.input(part.x.view())?;
        let mut cache = Cache::new(names.to_vec());
        let logits = host_flat(&ev.run_with_hooks(&x, &mut cache)?)?;
        // The F output positions of an activation [B, T, ...], flattened.
        let get = |name: &str| {
            host_flat(
                &cached(&cache, name)?
                    .narrow(1, t - f_n, f_n)?
                    .contiguous()?,
            )
        };
        let embed = get("hook_embed")?;
        let resid = get(&format!("blocks.{}.hook_resid_post", l_n - 1))?;
        let z: Vec<Vec<f64>> = (0..l_n)
            .map(|l| get(&format!("blocks.{l}.attn.hook_z")))
            .collect::<Result<_>>()?;
        let mlp: Vec<Option<Vec<f64>>> = model
            .blocks
            .iter()
            .enumerate()
            .map(|(l, b)| {
                b.mlp
                    .is_some()
                    .then(|| get(&format!("blocks.{l}.hook_mlp_out")))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        Ok(DlaActivations {
            logits,
            embed,
            resid,
            z,
            mlp,
        })
    }
}

/// The answer value `y` of problem `problem` and its direction, or an error when `y` is not one
/// of the model's values.
fn answer_direction(dirs: &[Direction], y: i64, problem: usize) -> Result<(usize, &Direction)> {
    usize::try_from(y)
        .ok()
        .and_then(|a| dirs.get(a).map(|d| (a, d)))
        .ok_or_else(|| {
            ProbeError::InvalidInput(format!(
                "answer value {y} of problem {problem} is outside the model's {} values",
                dirs.len()
            ))
        })
}

/// The final LayerNorm's scale `sqrt(var + eps)` of a residual stream.
///
/// # Shapes
/// `stream [D]`.
fn layer_norm_scale(stream: &[f64], eps: f64) -> f64 {
    let dm = stream.len();
    let mean = stream.iter().sum::<f64>() / dm as f64;
    let var = stream.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / dm as f64;
    (var + eps).sqrt()
}

/// Direct effect of a part `c` on the answer logit, raw and centred:
/// `(c·g - mean(c) Σg) / scale`.
///
/// # Shapes
/// `c [D]`.
fn direct_effect(c: &[f64], dir: &Direction, scale: f64) -> (f64, f64) {
    let m = c.iter().sum::<f64>() / c.len() as f64;
    let dot = |w: &[f64]| c.iter().zip(w).map(|(x, y)| x * y).sum::<f64>();
    (
        (dot(&dir.g) - m * dir.gs) / scale,
        (dot(&dir.gc) - m * dir.gcs) / scale,
    )
}

/// Head `h`'s output `z W_O[h]` at one position.
///
/// # Shapes
/// `zh [d]`, `w_o [H, d, D]`; returns `[D]`.
fn head_output(zh: &[f64], w_o: &Array3<f64>, h: usize) -> Vec<f64> {
    let (_, d, dm) = w_o.dim();
    (0..dm)
        .map(|j| (0..d).map(|i| zh[i] * w_o[[h, i, j]]).sum())
        .collect()
}

/// Adds every component's direct effect at output position `pos` (problem × F + slot) of the
/// batch to `r`, and returns their sum (raw, centred).
fn attribute_position(
    r: &mut DlaReport,
    w: &DlaWeights,
    acts: &DlaActivations,
    dir: &Direction,
    scale: f64,
    pos: usize,
) -> (f64, f64) {
    let dm = w.dm;
    let o = pos * dm;
    let attr = |c: &[f64]| direct_effect(c, dir, scale);
    let mut total = (0.0, 0.0);
    let mut add = |dst: &mut f64, dstc: &mut f64, v: (f64, f64)| {
        *dst += v.0;
        *dstc += v.1;
        total.0 += v.0;
        total.1 += v.1;
    };
    add(
        &mut r.embed,
        &mut r.embed_centred,
        attr(&acts.embed[o..o + dm]),
    );
    for (l, w_o) in w.w_o.iter().enumerate() {
        let (h_n, d, _) = w_o.dim();
        for h in 0..h_n {
            let zo = (pos * h_n + h) * d;
            let v = attr(&head_output(&acts.z[l][zo..zo + d], w_o, h));
            add(&mut r.heads[[l, h]], &mut r.heads_centred[[l, h]], v);
        }
        add(
            &mut r.attn_bias[l],
            &mut r.attn_bias_centred[l],
            attr(&w.b_o[l]),
        );
        if let Some(m) = &acts.mlp[l] {
            add(&mut r.mlp[l], &mut r.mlp_centred[l], attr(&m[o..o + dm]));
        }
    }
    add(&mut r.constant, &mut r.constant_centred, (dir.k, dir.kc));
    total
}

/// Adds the answer `a`'s logit and centred logit to `r`, counts the pair, and updates
/// `max_error` against the sum of the parts `total` (raw, centred).
///
/// # Shapes
/// `row [C]` the logits at the position.
fn record_logit(r: &mut DlaReport, row: &[f64], a: usize, total: (f64, f64)) {
    let logit = row[a];
    let centred = logit - row.iter().sum::<f64>() / row.len() as f64;
    r.logit += logit;
    r.logit_centred += centred;
    r.max_error = r
        .max_error
        .max((total.0 - logit).abs())
        .max((total.1 - centred).abs());
    r.n += 1;
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

/// One row of `dla.csv`: component, layer, head, label, attribution, centred attribution.
type DlaRow = (&'static str, Option<usize>, Option<usize>, String, f64, f64);

/// `dla.csv`: `component,layer,head,label,logit_attr,centred_logit_attr` (nats, means over the
/// problems and slots, 6 decimals), one row per head, attention bias, MLP, the embedding and the
/// constant (`layer` and `head` empty where they do not apply).
///
/// # Errors
/// None in practice (every column has one value per row).
pub fn dla_table(r: &DlaReport) -> Result<Table> {
    let mut rows: Vec<DlaRow> = Vec::new();
    rows.push((
        "embed",
        None,
        None,
        "embed".into(),
        r.embed,
        r.embed_centred,
    ));
    for ((l, h), &v) in r.heads.indexed_iter() {
        rows.push((
            "head",
            Some(l),
            Some(h),
            format!("L{l}H{h}"),
            v,
            r.heads_centred[[l, h]],
        ));
    }
    for l in 0..r.mlp.len() {
        let (b, bc) = (r.attn_bias[l], r.attn_bias_centred[l]);
        rows.push(("attn_bias", Some(l), None, format!("L{l}.b_O"), b, bc));
        rows.push((
            "mlp",
            Some(l),
            None,
            format!("L{l}.mlp"),
            r.mlp[l],
            r.mlp_centred[l],
        ));
    }
    let label = "ln_final.b+b_U".to_string();
    rows.push((
        "constant",
        None,
        None,
        label,
        r.constant,
        r.constant_centred,
    ));
    let opt = |f: &dyn Fn(&DlaRow) -> Option<usize>| {
        Column::MaybeInt(rows.iter().map(|x| f(x).map(|v| v as i64)).collect())
    };
    let mut t = Table::new();
    t.push(
        "component",
        Column::Text(rows.iter().map(|x| x.0.to_string()).collect()),
    )?;
    t.push("layer", opt(&|x| x.1))?;
    t.push("head", opt(&|x| x.2))?;
    t.push(
        "label",
        Column::Text(rows.iter().map(|x| x.3.clone()).collect()),
    )?;
    t.push(
        "logit_attr",
        Column::float(rows.iter().map(|x| x.4).collect(), 6),
    )?;
    t.push(
        "centred_logit_attr",
        Column::float(rows.iter().map(|x| x.5).collect(), 6),
    )?;
    Ok(t)
}
