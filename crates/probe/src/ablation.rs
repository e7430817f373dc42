//! Head ablation: the model's SRAVEN accuracy and loss with one attention head knocked out at a
//! time, at its output before `W_O` (`blocks.{l}.attn.hook_z`), replaced by zero or by its mean
//! over the problem set at each position (TransformerLens's zero and mean ablation;
//! `hyperlens_model::hooks`).

use std::ops::ControlFlow;

use candle_core::{Device, Tensor};
use hyperlens_model::eval::{EvalMetrics, MetricsAccumulator};
use hyperlens_model::hooks::{Cache, HookFn};
use hyperlens_model::Evaluator;
use hyperlens_tasks::sraven::ProblemSet;
use ndarray::Array3;
use serde::Serialize;

use crate::error::{step, ProbeError, Result};
use hyperlens_analysis::table::{Column, Table};

/// What replaces an ablated head's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ablation {
    /// Zero.
    Zero,
    /// Its mean over the problem set, per position (`[T, d]` for the head).
    Mean,
}

impl std::str::FromStr for Ablation {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "zero" => Ok(Ablation::Zero),
            "mean" => Ok(Ablation::Mean),
            other => Err(format!(
                "unknown ablation `{other}` (expected zero or mean)"
            )),
        }
    }
}

impl std::fmt::Display for Ablation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Ablation::Zero => "zero",
            Ablation::Mean => "mean",
        })
    }
}

/// The model's metrics with one head ablated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeadAblation {
    /// The layer.
    pub layer: usize,
    /// The head.
    pub head: usize,
    /// Accuracy (all features right) with the head ablated.
    pub accuracy: f64,
    /// Cross-entropy (nats) with the head ablated.
    pub loss: f64,
}

/// The result of [`head_ablation`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AblationReport {
    /// Zero or mean ablation.
    pub ablation: Ablation,
    /// The model's metrics without ablation.
    pub base: EvalMetrics,
    /// One entry per (layer, head), layer-major.
    pub heads: Vec<HeadAblation>,
}

/// Replaces head `head`'s slice of `z` `[B, T, H, d]` by `fill` (`[T, d]` broadcast over the
/// batch).
struct AblateHead<'a> {
    name: String,
    head: usize,
    fill: &'a Tensor,
}

impl HookFn for AblateHead<'_> {
    fn wants(&self, name: &str) -> bool {
        name == self.name
    }

    fn call(&mut self, _: &str, z: &Tensor) -> hyperlens_model::Result<Option<Tensor>> {
        let (b, t, h, d) = z.dims4()?;
        let fill = self
            .fill
            .reshape((1, t, 1, d))?
            .broadcast_as((b, t, 1, d))?;
        let mut parts = Vec::with_capacity(3);
        if self.head > 0 {
            parts.push(z.narrow(2, 0, self.head)?);
        }
        parts.push(fill.contiguous()?);
        if self.head + 1 < h {
            parts.push(z.narrow(2, self.head + 1, h - self.head - 1)?);
        }
        Ok(Some(Tensor::cat(&parts, 2)?))
    }
}

/// A source of problem batches that can be streamed again: each call starts a new pass.
pub type Problems<'a> = dyn FnMut() -> Box<dyn Iterator<Item = Result<ProblemSet>> + 'a> + 'a;

/// Accuracy and loss of the model of `ev` over the batches `problems` yields, with `hooks` in the
/// (hooked) pass.
fn metrics<'a>(
    ev: &Evaluator,
    problems: &mut Problems<'a>,
    hooks: &mut dyn HookFn,
) -> Result<EvalMetrics> {
    let cfg = ev.config();
    let mut acc = MetricsAccumulator::new(cfg.n_outputs);
    for b in problems() {
        let b = b?;
        if b.is_empty() {
            continue;
        }
        let x = ev.input(b.x.view())?;
        let logits = ev.run_with_hooks(&x, hooks)?;
        let v: Vec<f32> = logits.flatten_all()?.to_vec1()?;
        let logits = Array3::from_shape_vec((b.len(), cfg.n_outputs, cfg.d_out), v)
            .map_err(|e| ProbeError::InvalidInput(format!("logits shape: {e}")))?;
        acc.add(logits.view(), b.y.view())?;
    }
    Ok(acc.finish())
}

/// Ablates every head of the model of `ev` in turn (`ablation` at `blocks.{l}.attn.hook_z`, in
/// the hooked pass [`Evaluator::run_with_hooks`]) and measures accuracy and loss over the SRAVEN
/// problems that `problems()` streams (called once per pass: the baseline, the mean for mean
/// ablation, then one pass per head), so memory is bounded by the batch. `progress(done, total)`
/// counts the passes; its `ControlFlow::Break` stops the work (a stream may also stop it between
/// batches by yielding [`ProbeError::Interrupted`]).
///
/// # Shapes
/// Each batch: `x [B, T, M]`, `y [B, F]`, matching the model.
///
/// # Errors
/// The stream's errors; an empty stream; [`ProbeError::Interrupted`] when `progress` breaks; model
/// errors.
pub fn head_ablation<'a>(
    ev: &Evaluator,
    problems: &mut Problems<'a>,
    ablation: Ablation,
    mut progress: impl FnMut(usize, usize) -> ControlFlow<()>,
) -> Result<AblationReport> {
    let cfg = ev.config().clone();
    let (l_n, h_n) = (cfg.n_layers, cfg.n_heads);
    let total = 1 + usize::from(ablation == Ablation::Mean) + l_n * h_n;
    let mut done = 0;
    let base = metrics(ev, problems, &mut Cache::default())?;
    if base.n == 0 {
        return Err(ProbeError::InvalidInput(
            "no problem to ablate heads on".into(),
        ));
    }
    done += 1;
    step(&mut progress, done, total)?;
    let fills = match ablation {
        Ablation::Zero => zero_fills(ev)?,
        Ablation::Mean => {
            let fills = mean_fills(ev, problems)?;
            done += 1;
            step(&mut progress, done, total)?;
            fills
        }
    };
    let mut heads = Vec::with_capacity(l_n * h_n);
    for (l, fill) in fills.iter().enumerate() {
        for h in 0..h_n {
            let head_fill = fill.get(h)?; // [T, d]
            let mut hook = AblateHead {
                name: format!("blocks.{l}.attn.hook_z"),
                head: h,
                fill: &head_fill,
            };
            let m = metrics(ev, problems, &mut hook)?;
            heads.push(HeadAblation {
                layer: l,
                head: h,
                accuracy: m.accuracy,
                loss: m.loss,
            });
            done += 1;
            step(&mut progress, done, total)?;
        }
    }
    Ok(AblationReport {
        ablation,
        base,
        heads,
    })
}

/// Zero ablation's fill of every layer: zeros.
///
/// # Shapes
/// Returns `L` tensors `[H, T, d]`.
fn zero_fills(ev: &Evaluator) -> Result<Vec<Tensor>> {
    let cfg = ev.config();
    let device: &Device = ev.device();
    Ok((0..cfg.n_layers)
        .map(|_| {
            Tensor::zeros(
                (cfg.n_heads, cfg.n_tokens, cfg.d_head),
                candle_core::DType::F32,
                device,
            )
        })
        .collect::<candle_core::Result<_>>()?)
}

/// Mean ablation's fill of every layer: the mean of `blocks.{l}.attn.hook_z` over the problems
/// that `problems()` streams (one pass), per position.
///
/// # Shapes
/// Returns `L` tensors `[H, T, d]`.
fn mean_fills<'a>(ev: &Evaluator, problems: &mut Problems<'a>) -> Result<Vec<Tensor>> {
    let l_n = ev.config().n_layers;
    let names: Vec<String> = (0..l_n)
        .map(|l| format!("blocks.{l}.attn.hook_z"))
        .collect();
    let mut sums: Vec<Option<Tensor>> = vec![None; l_n];
    let mut n = 0usize;
    for b in problems() {
        let b = b?;
        if b.is_empty() {
            continue;
        }
        let x = ev.input(b.x.view())?;
        let mut cache = Cache::new(names.clone());
        ev.run_with_hooks(&x, &mut cache)?;
        for (l, (_, z)) in cache.values.iter().enumerate() {
            let s = z.sum(0)?; // [T, H, d]
            sums[l] = Some(match sums[l].take() {
                Some(acc) => (acc + s)?,
                None => s,
            });
        }
        n += b.len();
    }
    sums.into_iter()
        .map(|s| {
            let s =
                s.ok_or_else(|| ProbeError::InvalidInput("no problem to average over".into()))?;
            Ok((s / n as f64)?.transpose(0, 1)?.contiguous()?) // [H, T, d]
        })
        .collect()
}

/// `head_ablation.csv`: `layer,head,label,accuracy,loss,delta_accuracy,delta_loss` (deltas: ablated
/// minus the model's own; floats with 6 decimals), one row per head.
///
/// # Errors
/// None in practice (every column has one value per head).
pub fn ablation_table(r: &AblationReport) -> Result<Table> {
    let hs = &r.heads;
    let f = |g: &dyn Fn(&HeadAblation) -> f64| Column::float(hs.iter().map(g).collect(), 6);
    let mut t = Table::new();
    t.push(
        "layer",
        Column::Int(hs.iter().map(|h| h.layer as i64).collect()),
    )?;
    t.push(
        "head",
        Column::Int(hs.iter().map(|h| h.head as i64).collect()),
    )?;
    t.push(
        "label",
        Column::Text(
            hs.iter()
                .map(|h| format!("L{}H{}", h.layer, h.head))
                .collect(),
        ),
    )?;
    t.push("accuracy", f(&|h| h.accuracy))?;
    t.push("loss", f(&|h| h.loss))?;
    t.push("delta_accuracy", f(&|h| h.accuracy - r.base.accuracy))?;
    t.push("delta_loss", f(&|h| h.loss - r.base.loss))?;
    Ok(t)
}
