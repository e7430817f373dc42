//! SRAVEN training: the paper's base task (`docs/spec/sraven.md`, `docs/spec/models.md` "Training recipe").

use std::path::Path;

use candle_core::{Device, Tensor, Var};
use candle_nn::VarMap;
use hyperlens_model::eval::batch_tensor;
use hyperlens_model::{evaluate, Config, EvalMetrics, Transformer};
use hyperlens_tasks::sraven::{sample, ProblemSet, Set, Split, TrainStream};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::error::{Result, TrainError};
use crate::job::{varmap_vars, BatchLoss, Job};
use crate::loss::{count_correct, cross_entropy};
use crate::metrics::{Evaluation, SetMetrics};
use crate::settings::TrainSettings;

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
    let loss = cross_entropy(&out.logits, &y)?;
    let metric_sum = count_correct(&out.logits, &y, true)?;
    Ok(BatchLoss {
        loss,
        metric_sum,
        metric_count: problems.len() as f64,
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

/// A SRAVEN run.
pub(crate) struct SravenJob {
    model: Transformer,
    varmap: VarMap,
    split: Split,
    seed: u64,
    batch: usize,
    dropout: f64,
    id_set: ProblemSet,
    ood_set: ProblemSet,
}

impl SravenJob {
    /// A job from settings and a trainable model (fresh or resumed).
    pub(crate) fn new(
        settings: &TrainSettings,
        model: Transformer,
        varmap: VarMap,
    ) -> Result<SravenJob> {
        let split = Split::named_with(&settings.split, settings.sraven.params())?;
        let id_set = sample(&split, Set::Id, settings.eval_n, settings.eval_seed, false)?;
        let ood_set = sample(&split, Set::Ood, settings.eval_n, settings.eval_seed, false)?;
        Ok(SravenJob {
            model,
            varmap,
            split,
            seed: settings.seed,
            batch: settings.batch,
            dropout: settings.dropout,
            id_set,
            ood_set,
        })
    }

    /// A freshly initialised job (the paper's initialisation, seeded by the run seed).
    pub(crate) fn fresh(settings: &TrainSettings, device: &Device) -> Result<SravenJob> {
        let (model, varmap) = Transformer::init(&model_config(settings)?, settings.seed, device)?;
        SravenJob::new(settings, model, varmap)
    }

    /// A job continuing from the checkpoint in `dir`.
    pub(crate) fn resume(
        settings: &TrainSettings,
        dir: &Path,
        device: &Device,
    ) -> Result<SravenJob> {
        let (model, varmap) =
            crate::job::resume_transformer(dir, &model_config(settings)?, device)?;
        SravenJob::new(settings, model, varmap)
    }
}

impl Job for SravenJob {
    fn vars(&self) -> Result<Vec<(String, Var)>> {
        varmap_vars(&self.varmap)
    }

    fn batch_loss(&mut self, step: u64, rng: &mut ChaCha8Rng) -> Result<BatchLoss> {
        let problems = TrainStream::at(&self.split, self.seed, step).next_batch(self.batch);
        if problems.is_empty() {
            return Err(TrainError::InvalidParam(format!(
                "split `{}` produced an empty training batch",
                self.split.name
            )));
        }
        batch_loss(&self.model, &problems, self.dropout, rng)
    }

    fn evaluate(&mut self, step: u64) -> Result<Evaluation> {
        let batch = self.batch.max(256);
        let id = evaluate(&self.model, &self.id_set, batch)?;
        let ood = evaluate(&self.model, &self.ood_set, batch)?;
        Ok(Evaluation {
            step,
            id: set_metrics(&id),
            ood: set_metrics(&ood),
            extra: Default::default(),
        })
    }

    fn save(&self, dir: &Path) -> Result<()> {
        Ok(self.model.save(dir)?)
    }

    fn model_config(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self.model.config()).map_err(|source| TrainError::Json {
            path: "model config".into(),
            source,
        })
    }

    fn n_params(&self) -> usize {
        self.model.n_params()
    }
}
