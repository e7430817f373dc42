//! Fuzzy-logic training: MSE at the last position, R² per sequence (`docs/spec/sraven.md`, "The fuzzy-logic
//! task"; `docs/spec/models.md`: D 128, H 8, d 2, 2 layers, 50,000 steps, warm-up 100, same optimiser).

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use hyperlens_model::{Config, Evaluator, Transformer};
use hyperlens_tasks::logic::{
    logic_chunks, r2, sample_logic, LogicBatch, LogicSet, LogicSplit, Purpose,
};
use ndarray::Array1;
use rand::Rng;

use crate::error::Result;
use crate::job::BatchLoss;
use crate::loss::mse;
use crate::metrics::{Evaluation, SetMetrics};
use crate::settings::TrainSettings;
use crate::stacked::TransformerTask;

/// The model a logic run trains: `Config::logic(mixer, L, N)` with `layers` layers and D, H, D_mlp
/// multiplied by `width` (d stays 2).
///
/// # Errors
/// [`crate::TrainError::Model`] if the resulting config is invalid.
pub fn model_config(settings: &TrainSettings) -> Result<Config> {
    let base = Config::logic(
        settings.mixer,
        settings.logic.variables,
        settings.logic.samples,
    );
    let cfg = Config {
        n_layers: settings.layers,
        d_model: base.d_model * settings.width,
        n_heads: base.n_heads * settings.width,
        d_mlp: base.d_mlp * settings.width,
        ..base
    };
    crate::settings::apply_size(cfg, settings.size)
}

/// Per-sequence weights of the R² numerator: `1 / var(targets)` where the variance is positive
/// (else 0), and the number of sequences with a defined R².
fn r2_weights(batch: &LogicBatch) -> (Vec<f32>, f64) {
    let mut count = 0.0;
    let w = batch
        .targets
        .outer_iter()
        .map(|t| {
            let n = t.len() as f64;
            let mean = t.iter().map(|&v| v as f64).sum::<f64>() / n;
            let var = t.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
            if var > 0.0 {
                count += 1.0;
                (1.0 / var) as f32
            } else {
                0.0
            }
        })
        .collect();
    (w, count)
}

/// The model's prediction for the last token of every sequence.
///
/// # Shapes
/// `x [B, N, L + 1]` -> `[B]`.
fn predict<R: Rng + ?Sized>(
    model: &Transformer,
    x: ndarray::ArrayView3<'_, f32>,
    dropout: f64,
    rng: &mut R,
) -> Result<Tensor> {
    let dev = model.device();
    let (b, n, d) = x.dim();
    let data: Vec<f32> = x.iter().copied().collect();
    let x = Tensor::from_vec(data, (b, n, d), dev)?;
    let out = if dropout > 0.0 {
        model.forward_train(&x, dropout, rng, false)?
    } else {
        model.forward(&x, false)?
    };
    Ok(out.logits.reshape(b)?)
}

/// The training loss of one logic batch: MSE of the prediction at the last position, with attention
/// dropout. `metric_sum` is the sum of the per-sequence R² (`1 - (pred - y)² / var(targets)`, the
/// tasks crate's definition) over sequences whose targets vary; `metric_count` their number.
///
/// # Shapes
/// `batch.x [B, N, L + 1]`, `batch.y [B]`.
///
/// # Errors
/// Model errors if the batch does not fit the model; candle errors.
pub fn batch_loss<R: Rng + ?Sized>(
    model: &Transformer,
    batch: &LogicBatch,
    dropout: f64,
    rng: &mut R,
) -> Result<BatchLoss> {
    let pred = predict(model, batch.x.view(), dropout, rng)?;
    loss_of(&pred, &LogicTargets::of(batch, model.device())?)
}

/// A logic batch's targets on the device: `y [B]`, the R² weights `1 / var(targets)` `[B]` and
/// the number of sequences with a defined R².
pub(crate) struct LogicTargets {
    y: Tensor,
    w: Tensor,
    count: f64,
}

impl LogicTargets {
    fn of(batch: &LogicBatch, device: &Device) -> Result<LogicTargets> {
        let y = Tensor::from_vec(batch.y.to_vec(), batch.y.len(), device)?;
        let (w, count) = r2_weights(batch);
        let w = Tensor::from_vec(w, batch.y.len(), device)?;
        Ok(LogicTargets { y, w, count })
    }
}

/// The logic loss (MSE) and R² sum of a batch from the predictions `pred [B]`.
fn loss_of(pred: &Tensor, t: &LogicTargets) -> Result<BatchLoss> {
    let loss = mse(pred, &t.y)?;
    let err = (pred.detach() - &t.y)?.sqr()?;
    let metric_sum = ((err * &t.w)?.sum_all()?.neg()? + t.count)?;
    Ok(BatchLoss {
        loss,
        metric_sum,
        metric_count: t.count,
    })
}

/// Evaluates on `n` sequences of `set` (evaluation stream `seed`, drawn and run in batches of
/// `batch`): mean R² over sequences with a defined R², and MSE. The training loop's evaluation;
/// [`evaluate_chunks`] with chunks of `batch` sequences.
///
/// # Errors
/// Task errors (e.g. an empty set); model errors.
pub fn evaluate_set(
    ev: &Evaluator,
    split: &LogicSplit,
    set: LogicSet,
    n: usize,
    batch: usize,
    seed: u64,
) -> Result<SetMetrics> {
    let chunks = logic_chunks(split, set, n, batch, seed).map(|c| c.map_err(Into::into));
    evaluate_chunks(ev, chunks, batch)
}

/// Mean R² (over sequences whose targets vary; NaN if none does) and MSE of the model's
/// last-token prediction over every sequence of `chunks`, each chunk run in batches of at most
/// `batch` sequences: memory is bounded by the chunk and the batch. The paper's R² (Schug et al.
/// 2025, the fuzzy-logic task): per sequence `1 - (pred - y)² / var(targets)`, averaged.
///
/// # Shapes
/// Each chunk: `x [B, T, L + 1]`, `y [B]`, `targets [B, T]`.
///
/// # Errors
/// A chunk's error; [`crate::TrainError::InvalidParam`] for a zero `batch`; model errors for
/// chunks that do not fit the model.
pub fn evaluate_chunks<I>(ev: &Evaluator, chunks: I, batch: usize) -> Result<SetMetrics>
where
    I: IntoIterator<Item = Result<LogicBatch>>,
{
    evaluate_chunks_by(chunks, batch, |x| Ok(ev.logits(x)?))
}

/// [`evaluate_chunks`] with `predict(x [B, N, L + 1]) -> [B]` as the model.
fn evaluate_chunks_by<I, P>(chunks: I, batch: usize, mut predict: P) -> Result<SetMetrics>
where
    I: IntoIterator<Item = Result<LogicBatch>>,
    P: FnMut(ndarray::ArrayView3<'_, f32>) -> Result<Vec<f32>>,
{
    if batch == 0 {
        return Err(crate::TrainError::InvalidParam(
            "the evaluation batch must be positive".into(),
        ));
    }
    let mut r2_sum = 0.0;
    let mut r2_n = 0usize;
    let mut se = 0.0;
    let mut n = 0usize;
    for chunk in chunks {
        let chunk = chunk?;
        let len = chunk.y.len();
        let mut pred = Vec::with_capacity(len);
        let mut start = 0;
        while start < len {
            let end = (start + batch).min(len);
            let x = chunk.x.slice(ndarray::s![start..end, .., ..]);
            let p = predict(x)?;
            if p.len() != end - start {
                return Err(crate::TrainError::InvalidParam(format!(
                    "the model made {} predictions for {} sequences",
                    p.len(),
                    end - start
                )));
            }
            pred.extend(p);
            start = end;
        }
        let pred = Array1::from_vec(pred);
        for (v, (&p, &y)) in r2(pred.view(), &chunk)?
            .iter()
            .zip(pred.iter().zip(chunk.y.iter()))
        {
            if v.is_finite() {
                r2_sum += v;
                r2_n += 1;
            }
            se += (p as f64 - y as f64).powi(2);
        }
        n += len;
    }
    Ok(SetMetrics {
        n,
        metric: if r2_n > 0 {
            r2_sum / r2_n as f64
        } else {
            f64::NAN
        },
        loss: if n > 0 { se / n as f64 } else { f64::NAN },
        per_feature: Vec::new(),
    })
}

/// One fuzzy-logic run's part of a training job ([`crate::stacked::StackJob`]): its split,
/// training stream and evaluation.
pub(crate) struct LogicTask {
    split: LogicSplit,
    seed: u64,
    batch: usize,
    eval_n: usize,
    eval_seed: u64,
    device: Device,
}

impl LogicTask {
    /// The task of a run's settings.
    pub(crate) fn new(settings: &TrainSettings, device: &Device) -> Result<LogicTask> {
        Ok(LogicTask {
            split: LogicSplit::new(settings.logic.params(), settings.split_seed()?)?,
            seed: settings.seed,
            batch: settings.batch,
            eval_n: settings.eval_n,
            eval_seed: settings.eval_seed,
            device: device.clone(),
        })
    }
}

impl TransformerTask for LogicTask {
    type Targets = LogicTargets;

    fn batch(&self, step: u64) -> Result<(Vec<f32>, usize, LogicTargets)> {
        let batch = sample_logic(
            &self.split,
            LogicSet::Id,
            Purpose::Train,
            self.batch,
            self.seed,
            step,
        )?;
        let x = batch.x.as_standard_layout().iter().copied().collect();
        let b = batch.y.len();
        Ok((x, b, LogicTargets::of(&batch, &self.device)?))
    }

    fn loss(&self, logits: &Tensor, t: &LogicTargets) -> Result<BatchLoss> {
        let b = t.y.dim(0)?;
        loss_of(&logits.reshape(b)?, t)
    }

    fn evaluate(&self, model: &Transformer, step: u64, batch: usize) -> Result<Evaluation> {
        let engine = Evaluator::new(model.clone())?;
        let ev = |set| {
            evaluate_set(
                &engine,
                &self.split,
                set,
                self.eval_n,
                batch,
                self.eval_seed,
            )
        };
        let id = ev(LogicSet::Id)?;
        let ood = ev(LogicSet::Ood)?;
        let mut extra = BTreeMap::new();
        if !self.split.unknown.is_empty() {
            extra.insert("unknown_terms".to_string(), ev(LogicSet::Unknown)?);
        }
        Ok(Evaluation {
            step,
            id,
            ood,
            extra,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperlens_tasks::logic::LogicParams;

    #[test]
    fn on_device_r2_matches_the_tasks_crate() {
        let params = LogicParams {
            samples: 7,
            ..LogicParams::default()
        };
        let split = LogicSplit::new(params, 3).unwrap();
        let batch = sample_logic(&split, LogicSet::Id, Purpose::Train, 13, 5, 0).unwrap();
        let cfg = Config {
            n_layers: 1,
            ..Config::logic(hyperlens_model::Mixer::Softmax, 4, 7)
        };
        let (model, _) = Transformer::init(&cfg, 2, &Device::Cpu).unwrap();
        let mut rng = rand::rngs::mock::StepRng::new(0, 0);
        let bl = batch_loss(&model, &batch, 0.0, &mut rng).unwrap();
        let pred: Vec<f32> = predict(&model, batch.x.view(), 0.0, &mut rng)
            .unwrap()
            .to_vec1()
            .unwrap();
        let r = r2(Array1::from_vec(pred.clone()).view(), &batch).unwrap();
        let finite: Vec<f64> = r.iter().copied().filter(|v| v.is_finite()).collect();
        let got = bl.metric_sum.to_scalar::<f32>().unwrap() as f64;
        let want: f64 = finite.iter().sum();
        assert!(
            (got - want).abs() < 1e-3 * want.abs().max(1.0),
            "{got} vs {want}"
        );
        assert_eq!(bl.metric_count as usize, finite.len());
        let mse_ref: f64 = pred
            .iter()
            .zip(batch.y.iter())
            .map(|(&p, &y)| (p as f64 - y as f64).powi(2))
            .sum::<f64>()
            / 13.0;
        let got_mse = bl.loss.to_scalar::<f32>().unwrap() as f64;
        assert!((got_mse - mse_ref).abs() < 1e-6, "{got_mse} vs {mse_ref}");
    }
}
