//! What the training loop needs from a task: trainable variables, the loss of update `i`, an
//! evaluation, and a checkpoint writer. One implementation per task (`sraven`, `logic`, `induction`).

use std::path::Path;

use candle_core::{Tensor, Var};
use candle_nn::VarMap;
use rand_chacha::ChaCha8Rng;

use crate::error::{Result, TrainError};
use crate::metrics::Evaluation;

/// The loss of one batch and an on-device running metric.
#[derive(Debug, Clone)]
pub struct BatchLoss {
    /// Scalar loss, differentiable in the parameters.
    pub loss: Tensor,
    /// Scalar f32 (detached): the numerator of the task's training metric over this batch (problems
    /// solved, sum of R², tokens right).
    pub metric_sum: Tensor,
    /// The denominator of the metric (problems, sequences with a defined R², tokens).
    pub metric_count: f64,
}

/// A task's training job.
pub(crate) trait Job {
    /// The trainable variables by name.
    fn vars(&self) -> Result<Vec<(String, Var)>>;
    /// The loss of update `step` (batch `step` of the training stream; dropout from `rng`).
    fn batch_loss(&mut self, step: u64, rng: &mut ChaCha8Rng) -> Result<BatchLoss>;
    /// Evaluates the current parameters.
    fn evaluate(&mut self, step: u64) -> Result<Evaluation>;
    /// Saves a checkpoint directory (`config.json` + `model.safetensors`).
    fn save(&self, dir: &Path) -> Result<()>;
    /// The model configuration as JSON (for `train.json`).
    fn model_config(&self) -> Result<serde_json::Value>;
    /// Number of parameters.
    fn n_params(&self) -> usize;
}

/// The named `Var`s of a `VarMap`, sorted by name.
///
/// # Errors
/// [`TrainError::InvalidParam`] if the map's lock is poisoned.
pub(crate) fn varmap_vars(varmap: &VarMap) -> Result<Vec<(String, Var)>> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| TrainError::InvalidParam("the parameter map's lock is poisoned".into()))?;
    let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

/// Loads the SRAVEN / logic transformer checkpoint in `dir` as trainable variables, after checking
/// that its config is the run's (`expect`): the resume path of both tasks.
///
/// # Errors
/// [`TrainError::Resume`] if the checkpoint's config differs from `expect`; checkpoint errors
/// (missing, truncated or mismatched files).
pub(crate) fn resume_transformer(
    dir: &Path,
    expect: &hyperlens_model::Config,
    device: &candle_core::Device,
) -> Result<(hyperlens_model::Transformer, VarMap)> {
    let (config, tensors) = hyperlens_model::checkpoint::load(dir, device)?;
    if &config != expect {
        return Err(TrainError::Resume(format!(
            "{}: the checkpoint's model config differs from the run's settings",
            dir.join(hyperlens_model::checkpoint::CONFIG_FILE).display()
        )));
    }
    Ok(hyperlens_model::Transformer::trainable_from_tensors(
        &config, tensors, device,
    )?)
}
