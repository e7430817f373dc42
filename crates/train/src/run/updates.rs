//! [`Updates`]: the training updates of runs trained together (the batched model, its optimiser,
//! each run's schedule, seed and data stream), and the job and optimiser they start from: fresh,
//! or loaded from the runs' checkpoints.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use crate::error::{Result, TrainError};
use crate::job::{BatchLoss, Job};
use crate::optim::{AdamW, AdamWParams};
use crate::schedule::WarmupCosine;
use crate::settings::TrainSettings;
use crate::state::{dropout_rng, OPTIMIZER_FILE, STATE_FILE};
use crate::Task;

use super::check_settings;

/// The training updates of runs trained together, without their files: the batched model, its
/// optimiser and each run's schedule, seed and data stream.
/// [`train_group`](super::train_group) applies these updates between its evaluations and
/// checkpoints; benchmarks and programs that keep their own books use it directly.
pub struct Updates {
    /// The batched model (one for a single run) and its task.
    pub(super) job: Box<dyn Job>,
    /// One flat AdamW over the job's variables.
    pub(super) opt: AdamW,
    schedules: Vec<WarmupCosine>,
    seeds: Vec<u64>,
    cache_uploads: bool,
}

impl Updates {
    /// Freshly initialised models for `settings` (one run each, as
    /// [`check_group`](super::check_group) allows) on `device`, before update 0.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] for settings that cannot train together; model, task and
    /// device errors.
    pub fn fresh(settings: &[TrainSettings], device: hyperlens_model::Device) -> Result<Updates> {
        check_settings(settings)?;
        let device = device.to_candle()?;
        Updates::start(settings, &device)
    }

    /// Freshly initialised models for `settings` on `device`, before update 0 (the settings
    /// already checked).
    ///
    /// # Errors
    /// Model, task and device errors.
    pub(super) fn start(
        settings: &[TrainSettings],
        device: &candle_core::Device,
    ) -> Result<Updates> {
        let job = make_job(settings, None, device)?;
        let opt = new_optimizer(job.as_ref(), settings)?;
        Updates::from_parts(job, opt, settings)
    }

    /// The models of `settings` and their optimiser as the checkpoints `checkpoints` (one per
    /// run, in order) left them after `step` updates.
    ///
    /// # Errors
    /// [`TrainError::Resume`] if a checkpoint's optimiser state is at another step or does not fit
    /// the models; checkpoint, model, task and device errors.
    pub(super) fn resume(
        settings: &[TrainSettings],
        checkpoints: &[PathBuf],
        step: u64,
        device: &candle_core::Device,
    ) -> Result<Updates> {
        let dirs: Vec<&Path> = checkpoints.iter().map(PathBuf::as_path).collect();
        let job = make_job(settings, Some(&dirs), device)?;
        let mut opt = new_optimizer(job.as_ref(), settings)?;
        load_moments(&mut opt, &dirs, step, device)?;
        Updates::from_parts(job, opt, settings)
    }

    fn from_parts(job: Box<dyn Job>, opt: AdamW, settings: &[TrainSettings]) -> Result<Updates> {
        if job.members() != settings.len() {
            return Err(TrainError::InvalidParam(format!(
                "a job of {} models for {} runs",
                job.members(),
                settings.len()
            )));
        }
        let schedules = settings
            .iter()
            .map(|s| {
                let sch = WarmupCosine::paper(s.lr, s.warmup, s.steps);
                sch.check()?;
                Ok(sch)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Updates {
            job,
            opt,
            schedules,
            seeds: settings.iter().map(|s| s.seed).collect(),
            cache_uploads: hyperlens_model::device::upload_cache_requested()?,
        })
    }

    /// The number of models.
    pub fn models(&self) -> usize {
        self.seeds.len()
    }

    /// The optimiser of all models (one flat AdamW).
    pub fn optimizer(&self) -> &AdamW {
        &self.opt
    }

    /// The learning rate of each model at update `step`.
    pub fn lrs(&self, step: u64) -> Vec<f64> {
        self.schedules.iter().map(|s| s.lr(step)).collect()
    }

    /// Applies update `step` (0-based) to every model: batch `step` of each run's stream, its
    /// dropout masks ([`dropout_rng`]), the forward and backward pass of the batched model and one
    /// AdamW update. Returns each model's loss and metric sums for the batch.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] if a parameter received no gradient; task, model and tensor
    /// errors.
    pub fn apply(&mut self, step: u64) -> Result<Vec<BatchLoss>> {
        let lrs = self.lrs(step);
        let mut rngs: Vec<_> = self.seeds.iter().map(|&s| dropout_rng(s, step)).collect();
        let losses = self.job.batch_loss(step, &mut rngs)?;
        let total = match losses.as_slice() {
            [one] => one.loss.clone(),
            many => {
                let parts: Vec<&Tensor> = many.iter().map(|l| &l.loss).collect();
                Tensor::stack(&parts, 0)?.sum_all()?
            }
        };
        // The per-model learning rates are uploaded before the scope: inside it, the backward pass
        // and the update upload no per-step data (`UploadCache`).
        let rates = self.opt.rates(&lrs)?;
        let missing = {
            let _cache = hyperlens_model::device::upload_cache(total.device(), self.cache_uploads);
            let grads = total.backward()?;
            self.opt.step_with(&grads, &rates)?
        };
        if !missing.is_empty() {
            return Err(TrainError::InvalidParam(format!(
                "at step {step}, no gradient reached {} parameter(s): {}",
                missing.len(),
                missing.join(", ")
            )));
        }
        Ok(losses)
    }
}

/// The job of the runs `settings` (one model each), fresh or from the checkpoints in `dirs`.
fn make_job(
    settings: &[TrainSettings],
    dirs: Option<&[&Path]>,
    device: &candle_core::Device,
) -> Result<Box<dyn Job>> {
    let first = settings
        .first()
        .ok_or_else(|| TrainError::InvalidParam("no runs to train".into()))?;
    Ok(match first.task {
        Task::Sraven => Box::new(crate::stacked::StackJob::new(
            settings,
            crate::sraven::model_config(first)?,
            dirs,
            device,
            |s| crate::sraven::SravenTask::new(s, device),
        )?),
        Task::Logic => Box::new(crate::stacked::StackJob::new(
            settings,
            crate::logic::model_config(first)?,
            dirs,
            device,
            |s| crate::logic::LogicTask::new(s, device),
        )?),
        Task::Induction => match (settings, dirs) {
            ([s], None) => Box::new(crate::induction::InductionJob::fresh(s, device)?),
            ([s], Some([d])) => Box::new(crate::induction::InductionJob::resume(s, d, device)?),
            _ => {
                return Err(TrainError::InvalidParam(
                    "the induction task trains one model per run (no batched runs)".into(),
                ))
            }
        },
    })
}

/// The optimiser of a job: one flat AdamW over its variables, stacked with each run's weight
/// decay when the job's variables carry a model axis.
fn new_optimizer(job: &dyn Job, runs: &[TrainSettings]) -> Result<AdamW> {
    let params = AdamWParams {
        weight_decay: runs.first().map_or(0.1, |s| s.weight_decay),
        ..AdamWParams::default()
    };
    if job.stacked() {
        let decays: Vec<f64> = runs.iter().map(|s| s.weight_decay).collect();
        AdamW::stacked(job.vars()?, params, &decays)
    } else {
        AdamW::new(job.vars()?, params)
    }
}

/// Loads into `opt` the AdamW moments that the checkpoints `dirs` (one per run, in order) saved
/// after `step` updates.
///
/// # Errors
/// [`TrainError::Resume`] naming the optimiser file that is at another step than its run, or
/// every run's optimiser file when the moments do not fit the models; checkpoint errors.
fn load_moments(
    opt: &mut AdamW,
    dirs: &[&Path],
    step: u64,
    device: &candle_core::Device,
) -> Result<()> {
    let mut states = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let (map, opt_step) = crate::state::read_optimizer(dir, device)?;
        if opt_step != step {
            return Err(TrainError::Resume(format!(
                "{} is at step {opt_step}, {} at step {}",
                dir.join(OPTIMIZER_FILE).display(),
                STATE_FILE,
                step
            )));
        }
        states.push(map);
    }
    let refs: Vec<&HashMap<String, Tensor>> = states.iter().collect();
    opt.load_states(&refs, step).map_err(|e| {
        TrainError::Resume(format!(
            "{}: {e}",
            dirs.iter()
                .map(|d| d.join(OPTIMIZER_FILE).display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}
