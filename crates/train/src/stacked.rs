//! SRAVEN and fuzzy-logic runs of one architecture trained as one job: the models are a
//! [`StackedTransformer`] (one graph, a leading model axis on every weight), each model with its
//! own training stream, dropout masks and evaluation sets, exactly as its single run would have
//! them. A single run is the job with one model, whose graph is the single model's own.

use std::path::Path;

use candle_core::{Device, Tensor, Var};
use candle_nn::VarMap;
use hyperlens_model::nn::position::dropout_mask;
use hyperlens_model::{Config, StackedTransformer, Transformer};
use rand_chacha::ChaCha8Rng;

use crate::error::{Result, TrainError};
use crate::job::{varmap_vars, BatchLoss, Job};
use crate::metrics::Evaluation;
use crate::settings::TrainSettings;

/// One model's part of a transformer task: its training stream, its loss and its evaluation.
pub(crate) trait TransformerTask {
    /// The targets of one training batch.
    type Targets;
    /// Batch `step` of this model's training stream: the inputs `[B, T, d_in]` row-major, `B`,
    /// and the targets.
    fn batch(&self, step: u64) -> Result<(Vec<f32>, usize, Self::Targets)>;
    /// The loss of the batch from this model's logits `[B, F, d_out]`.
    fn loss(&self, logits: &Tensor, targets: &Self::Targets) -> Result<BatchLoss>;
    /// Evaluates `model` (this run's weights) after `step` updates, in batches of `batch`.
    fn evaluate(&self, model: &Transformer, step: u64, batch: usize) -> Result<Evaluation>;
}

/// M runs of one transformer task (module docs).
pub(crate) struct StackJob<T> {
    model: StackedTransformer,
    varmap: VarMap,
    tasks: Vec<T>,
    dropout: f64,
    eval_batch: usize,
}

impl<T: TransformerTask> StackJob<T> {
    /// The job of `settings` (one per model; they differ only in what a stack allows, checked
    /// by the caller), starting from the paper's initialisation with each model's seed, or from
    /// the checkpoints in `dirs` (one per model).
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] for no settings; [`TrainError::Resume`] for a checkpoint of
    /// another config; model, checkpoint and task errors.
    pub(crate) fn new(
        settings: &[TrainSettings],
        config: Config,
        dirs: Option<&[&Path]>,
        device: &Device,
        task: impl Fn(&TrainSettings) -> Result<T>,
    ) -> Result<Self> {
        let first = settings
            .first()
            .ok_or_else(|| TrainError::InvalidParam("no runs to train".into()))?;
        let (model, varmap) = match dirs {
            None => {
                let seeds: Vec<u64> = settings.iter().map(|s| s.seed).collect();
                StackedTransformer::init(&config, &seeds, device)?
            }
            Some(dirs) => {
                let members = dirs
                    .iter()
                    .map(|d| crate::job::load_transformer(d, &config, device))
                    .collect::<Result<Vec<_>>>()?;
                StackedTransformer::trainable_from_members(&config, members, device)?
            }
        };
        Ok(StackJob {
            model,
            varmap,
            tasks: settings.iter().map(task).collect::<Result<Vec<_>>>()?,
            dropout: first.dropout,
            eval_batch: first.batch.max(256),
        })
    }
}

impl<T: TransformerTask> Job for StackJob<T> {
    fn members(&self) -> usize {
        self.tasks.len()
    }

    fn vars(&self) -> Result<Vec<(String, Var)>> {
        varmap_vars(&self.varmap)
    }

    fn stacked(&self) -> bool {
        true
    }

    fn batch_loss(&mut self, step: u64, rngs: &mut [ChaCha8Rng]) -> Result<Vec<BatchLoss>> {
        let cfg = self.model.config();
        let (t, d_in) = (cfg.n_tokens, cfg.d_in);
        let m = self.tasks.len();
        let mut data = Vec::new();
        let mut targets = Vec::with_capacity(m);
        let mut batch = None;
        for task in &self.tasks {
            let (x, b, y) = task.batch(step)?;
            if *batch.get_or_insert(b) != b || b == 0 || x.len() != b * t * d_in {
                return Err(TrainError::InvalidParam(format!(
                    "update {step}: the models' training batches differ in size or are empty"
                )));
            }
            data.extend(x);
            targets.push(y);
        }
        let b = batch.unwrap_or(0);
        let device = self.model.device().clone();
        let x = Tensor::from_vec(data, (m, b, t, d_in), &device)?;
        let masks = if self.dropout > 0.0 {
            let per_model = rngs
                .iter_mut()
                .map(|rng| {
                    (0..cfg.n_layers)
                        .map(|_| Ok(dropout_mask(t, t, self.dropout, rng, &device)?))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            let layers = (0..cfg.n_layers)
                .map(|l| {
                    let parts: Vec<&Tensor> = per_model.iter().map(|v| &v[l]).collect();
                    Ok(Tensor::cat(&parts, 0)?)
                })
                .collect::<Result<Vec<_>>>()?;
            Some(layers)
        } else {
            None
        };
        let logits = self.model.forward_with(&x, masks.as_deref())?;
        self.tasks
            .iter()
            .zip(&targets)
            .enumerate()
            .map(|(i, (task, y))| task.loss(&logits.get(i)?, y))
            .collect()
    }

    fn evaluate(&mut self, member: usize, step: u64) -> Result<Evaluation> {
        let task = self.tasks.get(member).ok_or_else(|| {
            TrainError::InvalidParam(format!("model {member} of {}", self.tasks.len()))
        })?;
        task.evaluate(&self.model.member(member)?, step, self.eval_batch)
    }

    fn save(&self, member: usize, dir: &Path) -> Result<()> {
        Ok(self.model.member(member)?.save(dir)?)
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
