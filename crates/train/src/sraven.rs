//! SRAVEN training: the paper's base task (`docs/spec/sraven.md`, `docs/spec/models.md` "Training recipe").

use candle_core::{Device, Tensor};
use hyperlens_model::eval::batch_tensor;
use hyperlens_model::{evaluate, Config, EvalMetrics, Evaluator, Transformer};
use hyperlens_tasks::sraven::{sample, ProblemSet, Set, Split, TrainStream};
use rand::Rng;

use crate::error::{Result, TrainError};
use crate::job::BatchLoss;
use crate::loss::{count_correct, cross_entropy};
use crate::metrics::{Evaluation, SetMetrics};
use crate::settings::TrainSettings;
use crate::stacked::TransformerTask;

/// The model a SRAVEN run trains: `Config::sraven(mixer, width, layers)` (`docs/spec/models.md`, "Sizes"),
/// or explicit sizes ([`crate::settings::ModelSize`]), for the task sizes of the settings (F inputs of
/// dimension M per panel, T = 8F + F tokens, F outputs of M classes).
///
/// # Errors
/// [`TrainError::Model`] for a width other than 1, 2, 4 or zero layers.
pub fn model_config(settings: &TrainSettings) -> Result<Config> {
    let base = Config::sraven(settings.mixer, settings.width, settings.layers)?;
    let p = settings.sraven.params();
    let cfg = Config {
        d_in: p.values,
        n_tokens: p.n_tokens(),
        n_outputs: p.features,
        d_out: p.values,
        n_buckets: p.n_tokens(),
        ..base
    };
    crate::settings::apply_size(cfg, settings.size)
}

/// The targets of a problem set as a u32 tensor.
///
/// # Shapes
/// `problems.y [B, F]` -> `[B, F]` u32 on `device`.
///
/// # Errors
/// [`TrainError::InvalidParam`] for a negative target; candle errors.
pub fn targets(problems: &ProblemSet, device: &Device) -> Result<Tensor> {
    let (b, f) = problems.y.dim();
    let y = problems
        .y
        .iter()
        .map(|&v| {
            u32::try_from(v)
                .map_err(|_| TrainError::InvalidParam(format!("SRAVEN target {v} is negative")))
        })
        .collect::<Result<Vec<u32>>>()?;
    Ok(Tensor::from_vec(y, (b, f), device)?)
}

/// The training loss of one SRAVEN batch: softmax cross-entropy over the `F` answer positions, mean
/// over batch and features, with attention dropout `dropout` (masks drawn from `rng`; none when 0).
/// `metric_sum` counts problems with all features right.
///
/// # Shapes
/// `problems.x [B, T, M]`, `problems.y [B, F]` matching the model.
///
/// # Errors
/// Model errors for problems that do not fit the model; candle errors.
pub fn batch_loss<R: Rng + ?Sized>(
    model: &Transformer,
    problems: &ProblemSet,
    dropout: f64,
    rng: &mut R,
) -> Result<BatchLoss> {
    let dev = model.device();
    let x = batch_tensor(&problems.x, dev)?;
    let y = targets(problems, dev)?;
    let out = if dropout > 0.0 {
        model.forward_train(&x, dropout, rng, false)?
    } else {
        model.forward(&x, false)?
    };
    loss_of(&out.logits, &y)
}

/// The SRAVEN loss and metric of a batch from its logits: cross-entropy, problems solved.
///
/// # Shapes
/// `logits [B, F, d_out]`, `y [B, F]` u32.
fn loss_of(logits: &Tensor, y: &Tensor) -> Result<BatchLoss> {
    Ok(BatchLoss {
        loss: cross_entropy(logits, y)?,
        metric_sum: count_correct(logits, y, true)?,
        metric_count: y.dim(0)? as f64,
    })
}

fn set_metrics(m: &EvalMetrics) -> SetMetrics {
    SetMetrics {
        n: m.n,
        metric: m.accuracy,
        loss: m.loss,
        per_feature: m.per_feature_accuracy.clone(),
    }
}

/// One SRAVEN run's part of a training job ([`crate::stacked::StackJob`]): its split, training
/// stream and evaluation sets.
pub(crate) struct SravenTask {
    split: Split,
    seed: u64,
    batch: usize,
    id_set: ProblemSet,
    ood_set: ProblemSet,
    device: Device,
}

impl SravenTask {
    /// The task of a run's settings (its evaluation sets sampled once).
    pub(crate) fn new(settings: &TrainSettings, device: &Device) -> Result<SravenTask> {
        let split = Split::named_with(&settings.split, settings.sraven.params())?;
        let id_set = sample(&split, Set::Id, settings.eval_n, settings.eval_seed, false)?;
        let ood_set = sample(&split, Set::Ood, settings.eval_n, settings.eval_seed, false)?;
        Ok(SravenTask {
            split,
            seed: settings.seed,
            batch: settings.batch,
            id_set,
            ood_set,
            device: device.clone(),
        })
    }
}

impl TransformerTask for SravenTask {
    type Targets = Tensor;

    fn batch(&self, step: u64) -> Result<(Vec<f32>, usize, Tensor)> {
        let problems = TrainStream::at(&self.split, self.seed, step).next_batch(self.batch);
        if problems.is_empty() {
            return Err(TrainError::InvalidParam(format!(
                "split `{}` produced an empty training batch",
                self.split.name
            )));
        }
        let y = targets(&problems, &self.device)?;
        let b = problems.len();
        let x = problems.x.as_standard_layout().iter().copied().collect();
        Ok((x, b, y))
    }

    fn loss(&self, logits: &Tensor, y: &Tensor) -> Result<BatchLoss> {
        loss_of(logits, y)
    }

    fn evaluate(&self, model: &Transformer, step: u64, batch: usize) -> Result<Evaluation> {
        let engine = Evaluator::new(model.clone())?;
        let id = evaluate(&engine, &self.id_set, batch)?;
        let ood = evaluate(&engine, &self.ood_set, batch)?;
        Ok(Evaluation {
            step,
            id: set_metrics(&id),
            ood: set_metrics(&ood),
            extra: Default::default(),
        })
    }
}
