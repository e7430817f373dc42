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

/// A task's training job: M models trained together (one for a single run).
pub(crate) trait Job {
    /// Models M trained together.
    fn members(&self) -> usize;
    /// The trainable variables by name; with [`Job::stacked`], each with a leading model axis.
    fn vars(&self) -> Result<Vec<(String, Var)>>;
    /// Whether the variables carry a leading model axis (a stacked optimiser updates them).
    fn stacked(&self) -> bool;
    /// The losses of update `step`, one per model: batch `step` of model `m`'s training stream,
    /// dropout from `rngs[m]`.
    fn batch_loss(&mut self, step: u64, rngs: &mut [ChaCha8Rng]) -> Result<Vec<BatchLoss>>;
    /// Evaluates model `member`'s current parameters.
    fn evaluate(&mut self, member: usize, step: u64) -> Result<Evaluation>;
    /// Saves model `member` as a checkpoint directory (`config.json` + `model.safetensors`).
    fn save(&self, member: usize, dir: &Path) -> Result<()>;
    /// The model configuration as JSON (for `train.json`).
    fn model_config(&self) -> Result<serde_json::Value>;
    /// Number of parameters of one model.
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

/// Loads the SRAVEN / logic transformer checkpoint in `dir`, after checking that its config is
/// the run's (`expect`): the resume path of both tasks.
///
/// # Errors
/// [`TrainError::Resume`] if the checkpoint's config differs from `expect`; checkpoint errors
/// (missing, truncated or mismatched files).
pub(crate) fn load_transformer(
    dir: &Path,
    expect: &hyperlens_model::Config,
    device: &candle_core::Device,
) -> Result<std::collections::HashMap<String, Tensor>> {
    let (config, tensors) = hyperlens_model::checkpoint::load(dir, device)?;
    if &config != expect {
        return Err(TrainError::Resume(format!(
            "{}: the checkpoint's model config differs from the run's settings",
            dir.join(hyperlens_model::checkpoint::CONFIG_FILE).display()
        )));
    }
    Ok(tensors)
}
