//! The training loop: a run directory, the paper's optimiser and schedule, periodic logging,
//! evaluation and checkpoints, and exact resumption.
//!
//! A run directory holds
//! - `checkpoint.json` and `checkpoints/step-N/`: the manifest and the step directory of the latest
//!   complete checkpoint, written crash-safely ([`crate::checkpoint`]: a kill at any instant leaves
//!   a run that `resume` continues; `Event::CheckpointWrite` reports each file operation); the four
//!   files below are hard links to that step directory's;
//! - `config.json` + `model.safetensors`: the model crate's checkpoint of the latest weights (so the
//!   directory itself is a checkpoint for `hyperlens eval` and the probes);
//! - `optimizer.safetensors`: AdamW moments `m.{name}`, `v.{name}` and the update count `step`;
//! - `train_state.json`: the settings, the step, the data-stream position, the timings and a hash of
//!   the weights saved with them (written last, so a checkpoint interrupted half-way is detected);
//! - `metrics.csv`: one row per logging interval and per evaluation;
//! - `train.json`: at the end, exactly how the model was trained and its final ID / OOD metrics.
//!
//! Exactness: batch `i` depends only on `(seed, i)` (the tasks crate's streams), the dropout masks of
//! update `i` only on `(seed, i)` ([`dropout_rng`]), and the optimiser moments are saved bit for bit, so
//! on the same device a resumed run ends with the same weights as an uninterrupted one.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::job::{BatchLoss, Job};
use crate::metrics::{Evaluation, MetricsLog, MetricsRow};
use crate::optim::{AdamW, AdamWParams};
use crate::schedule::WarmupCosine;
use crate::settings::{TrainSettings, TrainTask};
use crate::state::{
    dropout_rng, file_hash, save_optimizer, write_json, Session, TrainState, RECORD_FILE,
    STATE_FILE, VERSION,
};

/// How to run: the device and whether to continue an existing run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunOptions {
    /// The compute device.
    pub device: hyperlens_model::Device,
    /// Continue the run in the output directory (it must hold `train_state.json`).
    pub resume: bool,
}

/// What the loop reports to its caller's callback (for a progress bar, a log, or to stop early).
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// The run is about to train from update `step` of `total`.
    Start {
        /// First update of this session.
        step: u64,
        /// Total updates of the run.
        total: u64,
        /// Parameters of the model.
        n_params: usize,
    },
    /// Update `step` (0-based) was applied with learning rate `lr`.
    Step {
        /// The update just applied.
        step: u64,
        /// Total updates of the run.
        total: u64,
        /// Its learning rate.
        lr: f64,
    },
    /// A row was appended to `metrics.csv`.
    Row(&'a MetricsRow),
    /// The model was evaluated.
    Evaluated(&'a Evaluation),
    /// A checkpoint was written after `step` updates.
    Checkpoint {
        /// Updates done.
        step: u64,
    },
    /// One file operation of the checkpoint after `step` updates is done (`op` says which; see
    /// [`crate::checkpoint`]). Returning `Break` here stops the write right after it, as a kill
    /// would, and `train` returns [`TrainError::Interrupted`]: the fault-injection tests use it.
    CheckpointWrite {
        /// Updates done.
        step: u64,
        /// The operation just done.
        op: &'static str,
    },
}

/// `train.json`: exactly how a model was trained, and how it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRecord {
    /// hyperlens version.
    pub hyperlens_version: String,
    /// The task.
    pub task: TrainTask,
    /// The mixer.
    pub mixer: hyperlens_model::Mixer,
    /// The split.
    pub split: String,
    /// The run seed.
    pub seed: u64,
    /// Updates done.
    pub steps: u64,
    /// Batch size.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// Warm-up steps.
    pub warmup: u64,
    /// Attention dropout.
    pub dropout: f64,
    /// Device of the last session.
    pub device: String,
    /// Wall-clock seconds over all sessions (including evaluation and checkpoints).
    pub wall_time_s: f64,
    /// Seconds in training steps over all sessions.
    pub train_time_s: f64,
    /// Training updates per second of the last session, on `device` (its steps over its
    /// seconds in training steps, [`Session::steps_per_s`]); `steps / train_time_s` when the last
    /// session did not record its time. A run resumed on another device has each session's rate
    /// in `sessions`: the rate over all of them would mix devices.
    pub steps_per_s: f64,
    /// What the `metric` fields of the evaluation hold.
    pub metric: String,
    /// Final evaluation (ID, OOD, extras).
    pub final_eval: Evaluation,
    /// Number of parameters.
    pub n_params: usize,
    /// The model's `config.json`.
    pub model: serde_json::Value,
    /// The optimiser's hyper-parameters.
    pub optimizer: AdamWParams,
    /// The learning-rate schedule.
    pub schedule: WarmupCosine,
    /// Every setting of the run.
    pub settings: TrainSettings,
    /// Sessions (fresh start and resumes).
    pub sessions: Vec<Session>,
}

/// The result of [`train`].
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    /// Updates done when the session ended.
    pub step: u64,
    /// Whether the run reached its total (`false` when the callback stopped it; resume it later).
    pub completed: bool,
    /// The last evaluation of the session, if any.
    pub last_eval: Option<Evaluation>,
    /// `train.json`, when completed.
    pub record: Option<TrainRecord>,
}

/// Settings that may change when resuming (they do not change the trajectory of the weights).
fn with_cadence_of(stored: &TrainSettings, given: &TrainSettings) -> TrainSettings {
    TrainSettings {
        eval_every: given.eval_every,
        eval_n: given.eval_n,
        eval_seed: given.eval_seed,
        checkpoint_every: given.checkpoint_every,
        log_every: given.log_every,
        ..stored.clone()
    }
}

/// The first top-level field in which two settings differ.
fn first_difference(a: &TrainSettings, b: &TrainSettings) -> String {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return "settings".into();
    };
    a.iter()
        .find(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, v)| {
            format!(
                "{k} (run: {v}, given: {})",
                b.get(k).cloned().unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "settings".into())
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
        TrainTask::Sraven => Box::new(crate::stacked::StackJob::new(
            settings,
            crate::sraven::model_config(first)?,
            dirs,
            device,
            |s| crate::sraven::SravenTask::new(s, device),
        )?),
        TrainTask::Logic => Box::new(crate::stacked::StackJob::new(
            settings,
            crate::logic::model_config(first)?,
            dirs,
            device,
            |s| crate::logic::LogicTask::new(s, device),
        )?),
        TrainTask::Induction => match (settings, dirs) {
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

/// Checks the memory a run's flags ask for against the budget (`hyperlens_io::budget`) before
/// anything is allocated: the held evaluation sets (`--eval-n` problems of the ID and the OOD set,
/// as float32 one-hot inputs; the induction task streams them) and the activations that the
/// backward pass keeps for one `--batch` (per layer and token: about ten D-wide vectors, the
/// scores of H heads over T keys three times, and two MLP-wide vectors, in float32).
///
/// # Errors
/// [`TrainError::InvalidParam`] naming the flag and what it would have cost.
fn check_memory(settings: &TrainSettings, models: usize) -> Result<()> {
    use hyperlens_io::budget::{bytes_of, check_alloc};
    let dims = match settings.task {
        TrainTask::Sraven => {
            let c = crate::sraven::model_config(settings)?;
            (
                c.n_tokens, c.d_in, c.d_model, c.n_heads, c.d_mlp, c.n_layers, true,
            )
        }
        TrainTask::Logic => {
            let c = crate::logic::model_config(settings)?;
            (
                c.n_tokens, c.d_in, c.d_model, c.n_heads, c.d_mlp, c.n_layers, true,
            )
        }
        TrainTask::Induction => {
            let c = crate::induction::model_config(settings)?;
            let mlp = c.d_mlp.unwrap_or(0);
            (c.n_ctx, 1, c.d_model, c.n_heads, mlp, c.n_layers, false)
        }
    };
    let (t, d_in, dm, h, mlp, layers, held_eval) = dims;
    let refuse = |e: hyperlens_io::budget::BudgetError| TrainError::InvalidParam(e.to_string());
    if held_eval {
        check_alloc(
            format!("--eval-n {} (ID and OOD evaluation sets)", settings.eval_n),
            bytes_of(4, &[models, 2, settings.eval_n, t, d_in]),
        )
        .map_err(refuse)?;
    }
    let per_token = (10 * dm as u128)
        .saturating_add((3 * h as u128).saturating_mul(t as u128))
        .saturating_add(2 * mlp as u128);
    check_alloc(
        format!(
            "--batch {} (activations kept for the backward pass{})",
            settings.batch,
            if models > 1 {
                format!(", for each of {models} runs trained together")
            } else {
                String::new()
            }
        ),
        bytes_of(4, &[models, settings.batch, layers.max(1), t])
            .saturating_mul(per_token)
            .saturating_add(bytes_of(4, &[models, settings.batch, t, d_in])),
    )
    .map_err(refuse)
}

/// The CPU threads candle 0.11 uses: matrix products take `RAYON_NUM_THREADS` (else the number of
/// cores), elementwise operations `CANDLE_NUM_THREADS` (else the same as the products).
fn threads() -> String {
    let matmul = candle_core::utils::get_num_threads();
    let elementwise = std::env::var("CANDLE_NUM_THREADS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(matmul);
    if matmul == elementwise {
        matmul.to_string()
    } else {
        format!("matmul {matmul}, elementwise {elementwise}")
    }
}

/// Trains a model into the run directory `out` (see the module docs for its files), or continues the
/// run there with `options.resume`. `on_event` is called at every update, row, evaluation and
/// checkpoint; returning `ControlFlow::Break` stops the run at the end of the current update after
/// writing a checkpoint (continue it later with `resume`), except for `Event::CheckpointWrite`,
/// where it stops the checkpoint writer right there as a kill would ([`TrainError::Interrupted`]).
///
/// A directory holding only the leftovers of a run killed before its first checkpoint
/// ([`crate::checkpoint::only_leftovers`]) is emptied and the run started from step 0, with or
/// without `resume`; `resume` on a run whose final checkpoint is complete but which has no
/// `train.json` evaluates it and writes the record.
///
/// Recipe (`docs/spec/models.md`, "Training recipe"): [`AdamW`] with decoupled weight decay on parameters
/// of 2 or more dimensions, the [`WarmupCosine`] schedule, attention dropout on the normalised scores,
/// a fresh batch every update, the paper's initialisation. This is [`train_group`] with one run.
///
/// # Errors
/// [`TrainError::InvalidParam`] for bad settings, a non-empty `out` without `resume`, or a parameter
/// that receives no gradient; [`TrainError::Resume`] if the run cannot be continued (missing or
/// inconsistent files, settings that change the trajectory, a finished run with its `train.json`);
/// [`TrainError::Interrupted`] when `on_event` stopped a checkpoint write; [`TrainError::Diverged`]
/// if the loss is not finite; model, task, tensor and I/O errors.
pub fn train<F>(
    out: &Path,
    settings: &TrainSettings,
    options: &RunOptions,
    mut on_event: F,
) -> Result<TrainOutcome>
where
    F: FnMut(&Event<'_>) -> ControlFlow<()>,
{
    let run = GroupRun {
        out: out.to_path_buf(),
        settings: settings.clone(),
    };
    train_group(std::slice::from_ref(&run), options, |_, e| on_event(e))?
        .pop()
        .unwrap_or_else(|| Err(TrainError::InvalidParam("no runs to train".into())))
}

/// One run of a group trained together ([`train_group`]): its run directory and its settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRun {
    /// The run directory.
    pub out: std::path::PathBuf,
    /// The run's settings.
    pub settings: TrainSettings,
}

/// The settings that the runs of one batched group may differ in: the seed, the split, the peak
/// learning rate and the weight decay. Everything else (task, architecture, steps, batch,
/// schedule shape, cadence) must be the same.
pub const BATCHED_SETTINGS: [&str; 4] = ["seed", "split", "lr", "weight_decay"];

/// Checks that `runs` can train as one group: at least one, all valid, distinct directories, and
/// settings equal except in [`BATCHED_SETTINGS`]; more than one only for the SRAVEN and logic
/// tasks.
///
/// # Errors
/// [`TrainError::InvalidParam`] naming the first problem.
pub fn check_group(runs: &[GroupRun]) -> Result<()> {
    for (i, r) in runs.iter().enumerate() {
        if runs[..i].iter().any(|o| o.out == r.out) {
            return Err(TrainError::InvalidParam(format!(
                "two runs of the group write to {}",
                r.out.display()
            )));
        }
    }
    let settings: Vec<TrainSettings> = runs.iter().map(|r| r.settings.clone()).collect();
    check_settings(&settings).map_err(|e| match (e, runs) {
        (TrainError::InvalidParam(msg), [first, ..]) => {
            TrainError::InvalidParam(format!("{} and the other runs: {msg}", first.out.display()))
        }
        (e, _) => e,
    })
}

/// Checks that runs with these settings can train together (as [`check_group`], without the
/// directories).
///
/// # Errors
/// [`TrainError::InvalidParam`] naming the first problem.
fn check_settings(settings: &[TrainSettings]) -> Result<()> {
    let first = settings
        .first()
        .ok_or_else(|| TrainError::InvalidParam("no runs to train".into()))?;
    for s in settings {
        s.check()?;
        let mut same = s.clone();
        same.seed = first.seed;
        same.split.clone_from(&first.split);
        same.lr = first.lr;
        same.weight_decay = first.weight_decay;
        if &same != first {
            return Err(TrainError::InvalidParam(format!(
                "runs trained together may differ only in {}, these differ in {}",
                BATCHED_SETTINGS.join(", "),
                first_difference(first, &same),
            )));
        }
    }
    if settings.len() > 1 && first.task == TrainTask::Induction {
        return Err(TrainError::InvalidParam(
            "the induction task trains one model per run (no batched runs)".into(),
        ));
    }
    Ok(())
}

/// The training updates of runs trained together, without their files: the batched model, its
/// optimiser and each run's schedule, seed and data stream. [`train_group`] applies these
/// updates between its evaluations and checkpoints; benchmarks and programs that keep their
/// own books use it directly.
pub struct Updates {
    job: Box<dyn Job>,
    opt: AdamW,
    schedules: Vec<WarmupCosine>,
    seeds: Vec<u64>,
    cache_uploads: bool,
}

impl Updates {
    /// Freshly initialised models for `settings` (one run each, as [`check_group`] allows) on
    /// `device`, before update 0.
    ///
    /// # Errors
    /// [`TrainError::InvalidParam`] for settings that cannot train together; model, task and
    /// device errors.
    pub fn fresh(settings: &[TrainSettings], device: hyperlens_model::Device) -> Result<Updates> {
        check_settings(settings)?;
        let device = device.to_candle()?;
        let job = make_job(settings, None, &device)?;
        let opt = new_optimizer(job.as_ref(), settings)?;
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
        let missing = {
            // The backward pass and the update upload no per-step data (`UploadCache`).
            let _cache = hyperlens_model::device::upload_cache(total.device(), self.cache_uploads);
            let grads = total.backward()?;
            self.opt.step_each(&grads, &lrs)?
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

/// One run's side of a group: its files, state and running sums.
struct Member<'a> {
    out: &'a Path,
    settings: &'a TrainSettings,
    schedule: WarmupCosine,
    state: TrainState,
    log: MetricsLog,
    loss_sum: Option<Tensor>,
    metric_sum: Option<Tensor>,
    metric_count: f64,
    last_eval: Option<Evaluation>,
    /// Set when the run diverged: it takes no further part in logs, evaluations and checkpoints.
    failed: Option<TrainError>,
}

/// The file a run of a group that diverged gets, with the reason (`failed.json`).
pub const FAILED_FILE: &str = "failed.json";

/// Opens one run for [`train_group`]: checks and prepares its directory (fresh) or reads its
/// latest checkpoint (`resume`); returns the run's state and the checkpoint directory to load
/// (resume). A resumed run whose final checkpoint is complete but which has no record gets no
/// new session: the group only evaluates it and writes the record.
fn open_run(
    run: &GroupRun,
    resume: bool,
    models: usize,
    device: &hyperlens_model::Device,
) -> Result<(TrainState, Option<std::path::PathBuf>)> {
    let (out, settings) = (run.out.as_path(), &run.settings);
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |source| TrainError::Io { path: p, source }
    };
    let session = || Session {
        start_step: 0,
        end_step: 0,
        device: device.to_string(),
        threads: threads(),
        train_time_s: None,
        wall_time_s: None,
        batched: (models > 1).then_some(models),
    };
    // A run killed before its first checkpoint was committed left nothing to resume, only
    // leftovers: it starts again from step 0, which is the same run (every random stream depends
    // only on the seed and the step).
    let restart = crate::checkpoint::only_leftovers(out)?;
    if resume && !restart {
        // Leftovers of a killed checkpoint write go; the latest complete checkpoint is the one the
        // manifest names (or the run directory's own files, in runs that have none).
        crate::checkpoint::sweep(out)?;
        let ckdir = crate::checkpoint::latest_dir(out)?;
        let stored = TrainState::read(&ckdir)?;
        let merged = with_cadence_of(&stored.settings, settings);
        if &merged != settings {
            return Err(TrainError::Resume(format!(
                "{}: the run was started with different settings: {}",
                out.join(STATE_FILE).display(),
                first_difference(&merged, settings)
            )));
        }
        let mut finishing = false;
        if stored.step >= settings.steps {
            if out.join(RECORD_FILE).exists() {
                return Err(TrainError::Resume(format!(
                    "{}: the run is already complete ({} of {} steps)",
                    out.display(),
                    stored.step,
                    settings.steps
                )));
            }
            finishing = true;
        }
        let weights = ckdir.join(hyperlens_model::checkpoint::WEIGHTS_FILE);
        if file_hash(&weights)? != stored.weights_hash {
            return Err(TrainError::Resume(format!(
                "{} does not match {} (a checkpoint was interrupted while being written)",
                weights.display(),
                STATE_FILE
            )));
        }
        // A run that diverged is retried from its last checkpoint: the old verdict goes.
        let failed = out.join(FAILED_FILE);
        if failed.exists() {
            std::fs::remove_file(&failed).map_err(io(&failed))?;
        }
        let mut state = TrainState {
            settings: settings.clone(),
            version: VERSION.into(),
            ..stored
        };
        if !finishing {
            state.sessions.push(Session {
                start_step: state.step,
                end_step: state.step,
                ..session()
            });
        }
        return Ok((state, Some(ckdir)));
    }
    if out.exists() && !out.is_dir() {
        return Err(TrainError::InvalidParam(format!(
            "--out {} is a file, not a run directory",
            out.display()
        )));
    }
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(io(out))?;
        if restart {
            crate::checkpoint::clear_leftovers(out)?;
        } else if entries.next().is_some() {
            return Err(TrainError::InvalidParam(format!(
                "--out {} is not empty: pass --resume to continue the run there, or choose another directory",
                out.display()
            )));
        }
    }
    std::fs::create_dir_all(out).map_err(io(out))?;
    let state = TrainState {
        version: VERSION.into(),
        settings: settings.clone(),
        step: 0,
        data_position: 0,
        dropout_stream: "ChaCha8, key (seed, \"hyperlens/train/dropout\"), stream = step".into(),
        train_time_s: 0.0,
        wall_time_s: 0.0,
        weights_hash: String::new(),
        sessions: vec![session()],
    };
    Ok((state, None))
}

/// Trains the runs `runs` together, as one batched model ([`hyperlens_model::StackedTransformer`]:
/// one graph, a leading model axis on every weight, one flat AdamW update): each run's
/// directory, files, data stream, dropout masks, optimiser state and evaluations are those of
/// its single run ([`train`]), and its weights equal the single run's to float32 rounding (for one
/// run, bitwise). With `options.resume` every run continues from its latest checkpoint; they
/// must all be at the same step.
///
/// `on_event(i, event)` reports the events of run `i`; `Break` stops every run as [`train`]'s
/// does. A run whose loss stops being finite stops alone: it gets [`FAILED_FILE`] with the reason,
/// keeps its last checkpoint, and its result is [`TrainError::Diverged`]; the others go on.
///
/// # Errors
/// As [`train`] for what concerns the whole group (the checks of [`check_group`], a run that
/// cannot start or resume, a runs at different steps on resume, I/O); a run's own divergence is
/// its entry of the returned results.
pub fn train_group<F>(
    runs: &[GroupRun],
    options: &RunOptions,
    mut on_event: F,
) -> Result<Vec<Result<TrainOutcome>>>
where
    F: FnMut(usize, &Event<'_>) -> ControlFlow<()>,
{
    check_group(runs)?;
    let settings = &runs[0].settings;
    check_memory(settings, runs.len())?;
    let session_start = Instant::now();
    let device = options.device.to_candle()?;
    let params = AdamWParams {
        weight_decay: settings.weight_decay,
        ..AdamWParams::default()
    };
    let mut opened = Vec::with_capacity(runs.len());
    for run in runs {
        opened.push(open_run(run, options.resume, runs.len(), &options.device)?);
    }
    let steps: Vec<u64> = opened.iter().map(|o| o.0.step).collect();
    if steps.iter().any(|&s| s != steps[0]) {
        return Err(TrainError::Resume(format!(
            "the runs are at different steps ({}): resume them one by one",
            runs.iter()
                .zip(&steps)
                .map(|(r, s)| format!("{}: {s}", r.out.display()))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let resume = opened.iter().any(|o| o.1.is_some());
    if resume && opened.iter().any(|o| o.1.is_none()) {
        return Err(TrainError::Resume(
            "some runs of the group have a checkpoint and some have none: resume them one by one"
                .into(),
        ));
    }
    let all: Vec<TrainSettings> = runs.iter().map(|r| r.settings.clone()).collect();
    let (job, opt) = if resume {
        let dirs: Vec<&Path> = opened.iter().filter_map(|o| o.1.as_deref()).collect();
        let job = make_job(&all, Some(&dirs), &device)?;
        let mut opt = new_optimizer(job.as_ref(), &all)?;
        let mut states = Vec::with_capacity(dirs.len());
        for (dir, (state, ..)) in dirs.iter().zip(&opened) {
            let (map, opt_step) = crate::state::read_optimizer(dir, &device)?;
            if opt_step != state.step {
                return Err(TrainError::Resume(format!(
                    "{} is at step {opt_step}, {} at step {}",
                    dir.join(crate::state::OPTIMIZER_FILE).display(),
                    STATE_FILE,
                    state.step
                )));
            }
            states.push(map);
        }
        let refs: Vec<&std::collections::HashMap<String, Tensor>> = states.iter().collect();
        opt.load_states(&refs, steps[0]).map_err(|e| {
            TrainError::Resume(format!(
                "{}: {e}",
                dirs.iter()
                    .map(|d| d.join(crate::state::OPTIMIZER_FILE).display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        (job, opt)
    } else {
        let job = make_job(&all, None, &device)?;
        let opt = new_optimizer(job.as_ref(), &all)?;
        (job, opt)
    };
    let mut updates = Updates::from_parts(job, opt, &all)?;
    let start = steps[0];
    let mut members = Vec::with_capacity(runs.len());
    for (run, (state, _)) in runs.iter().zip(opened) {
        let schedule =
            WarmupCosine::paper(run.settings.lr, run.settings.warmup, run.settings.steps);
        schedule.check()?;
        members.push(Member {
            out: &run.out,
            settings: &run.settings,
            schedule,
            log: MetricsLog::open(&run.out, run.settings.task, resume.then_some(start))?,
            state,
            loss_sum: None,
            metric_sum: None,
            metric_count: 0.0,
            last_eval: None,
            failed: None,
        });
    }
    let wall_before: Vec<f64> = members.iter().map(|m| m.state.wall_time_s).collect();
    let train_before: Vec<f64> = members.iter().map(|m| m.state.train_time_s).collect();
    let mut session_train_s = 0.0;
    // One checkpoint of run `i`, written crash-safely (crate::checkpoint): the four files go to a
    // staging directory, which becomes a step directory, which the manifest then names.
    let checkpoint = |i: usize,
                      job: &dyn Job,
                      opt: &AdamW,
                      mem: &mut Member<'_>,
                      done: u64,
                      train_s: f64,
                      after: &mut dyn FnMut(&'static str) -> ControlFlow<()>|
     -> Result<()> {
        let state = &mut mem.state;
        state.step = done;
        state.data_position = done;
        state.train_time_s = train_before[i] + train_s;
        state.wall_time_s = wall_before[i] + session_start.elapsed().as_secs_f64();
        if let Some(s) = state.sessions.last_mut() {
            s.end_step = done;
            s.train_time_s = Some(train_s);
            s.wall_time_s = Some(session_start.elapsed().as_secs_f64());
        }
        crate::checkpoint::write(
            mem.out,
            done,
            |dir, done| {
                job.save(i, dir)?;
                done()?;
                save_optimizer(dir, opt, i)?;
                done()?;
                state.weights_hash =
                    file_hash(&dir.join(hyperlens_model::checkpoint::WEIGHTS_FILE))?;
                write_json(&dir.join(STATE_FILE), state)?;
                done()
            },
            after,
        )
    };
    let mut stop = false;
    if !resume {
        for (i, mem) in members.iter_mut().enumerate() {
            checkpoint(
                i,
                updates.job.as_ref(),
                &updates.opt,
                mem,
                0,
                0.0,
                &mut |op| on_event(i, &Event::CheckpointWrite { step: 0, op }),
            )?;
        }
    }
    for i in 0..members.len() {
        stop |= on_event(
            i,
            &Event::Start {
                step: start,
                total: settings.steps,
                n_params: updates.job.n_params(),
            },
        )
        .is_break();
    }
    // The evaluation of the untrained model (also when a run resumes from its first checkpoint
    // before that row was logged).
    for (i, mem) in members.iter_mut().enumerate() {
        if start == 0 && settings.eval_every > 0 && mem.log.last_step().is_none() {
            let ev = updates.job.evaluate(i, 0)?;
            let row = eval_row(
                mem.settings.task,
                0,
                mem.schedule.lr(0),
                (None, None),
                &ev,
                wall_before[i] + session_start.elapsed().as_secs_f64(),
            );
            mem.log.push(&row)?;
            stop |= on_event(i, &Event::Evaluated(&ev)).is_break();
            stop |= on_event(i, &Event::Row(&row)).is_break();
            mem.last_eval = Some(ev);
        }
    }

    let mut interval_steps = 0u64;
    let mut interval_start = Instant::now();
    let mut interval_excluded_s = 0.0;
    let mut step = start;
    while step < settings.steps && !stop && members.iter().any(|m| m.failed.is_none()) {
        let lrs = updates.lrs(step);
        let losses = updates.apply(step)?;
        for (mem, bl) in members.iter_mut().zip(losses) {
            let l = bl.loss.detach();
            mem.loss_sum = Some(match mem.loss_sum.take() {
                Some(s) => (s + l)?,
                None => l,
            });
            mem.metric_sum = Some(match mem.metric_sum.take() {
                Some(s) => (s + bl.metric_sum)?,
                None => bl.metric_sum,
            });
            mem.metric_count += bl.metric_count;
        }
        interval_steps += 1;
        let done = step + 1;
        step = done;
        for (i, lr) in lrs.iter().enumerate() {
            stop |= on_event(
                i,
                &Event::Step {
                    step: done - 1,
                    total: settings.steps,
                    lr: *lr,
                },
            )
            .is_break();
        }

        let every = |k: u64| k > 0 && done.is_multiple_of(k);
        let last = done == settings.steps;
        let eval_due = every(settings.eval_every) || last;
        let log_due = every(settings.log_every) || eval_due || stop;
        let ckpt_due = every(settings.checkpoint_every) || last || stop;
        if log_due {
            let interval_s =
                (interval_start.elapsed().as_secs_f64() - interval_excluded_s).max(0.0);
            session_train_s += interval_s;
            let rate = (interval_s > 0.0).then(|| interval_steps as f64 / interval_s);
            for (i, mem) in members.iter_mut().enumerate() {
                // Synchronise: read the interval's sums (this waits for the device).
                let mean_loss = match mem.loss_sum.take() {
                    Some(s) => s.to_scalar::<f32>()? as f64 / interval_steps.max(1) as f64,
                    None => f64::NAN,
                };
                let mean_metric = match mem.metric_sum.take() {
                    Some(s) if mem.metric_count > 0.0 => {
                        Some(s.to_scalar::<f32>()? as f64 / mem.metric_count)
                    }
                    _ => None,
                };
                mem.metric_count = 0.0;
                if mem.failed.is_some() {
                    continue;
                }
                if !mean_loss.is_finite() {
                    let err = TrainError::Diverged {
                        step: done - 1,
                        loss: mean_loss as f32,
                    };
                    write_json(
                        &mem.out.join(FAILED_FILE),
                        &serde_json::json!({
                            "error": err.to_string(),
                            "step": done - 1,
                            "last_checkpoint_step": mem.state.step,
                        }),
                    )?;
                    mem.failed = Some(err);
                    continue;
                }
                let lr = lrs[i];
                let mut row = MetricsRow {
                    step: done,
                    lr,
                    train_loss: Some(mean_loss),
                    train_acc: mean_metric,
                    id_loss: None,
                    id_acc: None,
                    ood_loss: None,
                    ood_acc: None,
                    wall_time_s: 0.0,
                    steps_per_s: rate,
                    extra: Default::default(),
                };
                if eval_due {
                    let ev = updates.job.evaluate(i, done)?;
                    row = MetricsRow {
                        steps_per_s: rate,
                        ..eval_row(
                            mem.settings.task,
                            done,
                            lr,
                            (Some(mean_loss), mean_metric),
                            &ev,
                            0.0,
                        )
                    };
                    stop |= on_event(i, &Event::Evaluated(&ev)).is_break();
                    mem.last_eval = Some(ev);
                }
                row.wall_time_s = wall_before[i] + session_start.elapsed().as_secs_f64();
                mem.log.push(&row)?;
                stop |= on_event(i, &Event::Row(&row)).is_break();
            }
            interval_steps = 0;
            interval_excluded_s = 0.0;
            interval_start = Instant::now();
        }
        if ckpt_due || stop {
            let t = Instant::now();
            let pending = (interval_start.elapsed().as_secs_f64() - interval_excluded_s).max(0.0);
            for (i, mem) in members.iter_mut().enumerate() {
                if mem.failed.is_some() {
                    continue;
                }
                checkpoint(
                    i,
                    updates.job.as_ref(),
                    &updates.opt,
                    mem,
                    done,
                    session_train_s + pending,
                    &mut |op| on_event(i, &Event::CheckpointWrite { step: done, op }),
                )?;
                stop |= on_event(i, &Event::Checkpoint { step: done }).is_break();
            }
            interval_excluded_s += t.elapsed().as_secs_f64();
        }
    }

    let completed = step >= settings.steps;
    let mut results = Vec::with_capacity(members.len());
    for (i, mem) in members.into_iter().enumerate() {
        if let Some(err) = mem.failed {
            results.push(Err(err));
            continue;
        }
        let record = if completed {
            let final_eval = match &mem.last_eval {
                Some(ev) if ev.step == step => ev.clone(),
                _ => updates.job.evaluate(i, step)?,
            };
            let s = mem.settings;
            let train_time_s = mem.state.train_time_s;
            let record = TrainRecord {
                hyperlens_version: VERSION.into(),
                task: s.task,
                mixer: s.mixer,
                split: s.split.clone(),
                seed: s.seed,
                steps: step,
                batch: s.batch,
                lr: s.lr,
                weight_decay: s.weight_decay,
                warmup: s.warmup,
                dropout: s.dropout,
                device: options.device.to_string(),
                wall_time_s: wall_before[i] + session_start.elapsed().as_secs_f64(),
                train_time_s,
                steps_per_s: match mem.state.sessions.last().and_then(Session::steps_per_s) {
                    Some(rate) => rate,
                    None if train_time_s > 0.0 => step as f64 / train_time_s,
                    None => 0.0,
                },
                metric: s.task.metric_name().into(),
                final_eval,
                n_params: updates.job.n_params(),
                model: updates.job.model_config()?,
                optimizer: AdamWParams {
                    weight_decay: s.weight_decay,
                    ..params
                },
                schedule: mem.schedule,
                settings: s.clone(),
                sessions: mem.state.sessions.clone(),
            };
            write_json(&mem.out.join(RECORD_FILE), &record)?;
            Some(record)
        } else {
            None
        };
        results.push(Ok(TrainOutcome {
            step,
            completed,
            last_eval: mem.last_eval,
            record,
        }));
    }
    Ok(results)
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

/// The `metrics.csv` row of an evaluation of a run of `task` (its extra sets under their column
/// prefixes, [`TrainTask::extra_sets`]).
fn eval_row(
    task: TrainTask,
    step: u64,
    lr: f64,
    train: (Option<f64>, Option<f64>),
    ev: &Evaluation,
    wall_time_s: f64,
) -> MetricsRow {
    MetricsRow {
        step,
        lr,
        train_loss: train.0,
        train_acc: train.1,
        id_loss: Some(ev.id.loss),
        id_acc: Some(ev.id.metric),
        ood_loss: Some(ev.ood.loss),
        ood_acc: Some(ev.ood.metric),
        wall_time_s,
        steps_per_s: None,
        extra: task
            .extra_sets()
            .iter()
            .filter_map(|(key, prefix)| {
                let set = ev.extra.get(*key)?;
                Some((prefix.to_string(), (Some(set.loss), Some(set.metric))))
            })
            .collect(),
    }
}

/// The settings a checkpoint was trained with: those of [`read_settings`] (its `train_state.json`),
/// else the `settings` of its `train.json` (a shipped checkpoint may keep only the record).
///
/// # Errors
/// [`TrainError::Resume`] naming the checkpoint when it has neither file, or naming `train.json`
/// when its `settings` field is missing or malformed.
pub fn run_settings(dir: &Path) -> Result<TrainSettings> {
    if let Ok(s) = read_settings(dir) {
        return Ok(s);
    }
    let path = dir.join(crate::state::RECORD_FILE);
    let bytes = std::fs::read(&path).map_err(|_| {
        TrainError::Resume(format!(
            "{}: the checkpoint has no run files (train_state.json or train.json) with its \
             training settings",
            dir.display()
        ))
    })?;
    let record: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| TrainError::Resume(format!("{}: {e}", path.display())))?;
    serde_json::from_value(record["settings"].clone())
        .map_err(|e| TrainError::Resume(format!("{}: field `settings`: {e}", path.display())))
}

/// Reads the settings of an existing run directory (for `--resume`): those of its latest complete
/// checkpoint (the one its manifest names, or its own `train_state.json` in runs without one).
///
/// # Errors
/// [`TrainError::Resume`] naming `train_state.json` when no checkpoint was ever committed in `dir`
/// (for a run killed before its first one, saying to start it again without `--resume`); the
/// errors of [`crate::checkpoint::latest_dir`] and [`TrainState::read`].
pub fn read_settings(dir: &Path) -> Result<TrainSettings> {
    if crate::checkpoint::only_leftovers(dir)? {
        return Err(TrainError::Resume(format!(
            "{}: no checkpoint was committed in {} (the run was stopped before its first one): \
             start it again without --resume",
            dir.join(STATE_FILE).display(),
            dir.display()
        )));
    }
    Ok(TrainState::read(&crate::checkpoint::latest_dir(dir)?)?.settings)
}
