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
//! update `i` only on `(seed, i)` ([`dropout_rng`](crate::state::dropout_rng)), and the optimiser
//! moments are saved bit for bit, so on the same device a resumed run ends with the same weights as
//! an uninterrupted one.
//!
//! The files: this one holds the public entry points and types ([`train`], [`train_group`], the
//! checks of a group and the settings readers); `open.rs` opens or resumes the runs of a group;
//! `updates.rs` holds [`Updates`], the batched model and its optimiser; `members.rs` each run's
//! books (sums, rows, checkpoints, record); `training.rs` the phases of one session, which
//! [`train_group`] runs in order.

mod members;
mod open;
mod training;
mod updates;

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::metrics::{Evaluation, MetricsRow};
use crate::optim::AdamWParams;
use crate::schedule::WarmupCosine;
use crate::settings::TrainSettings;
use crate::state::{Session, TrainState, STATE_FILE};
use crate::Task;

use members::Member;
use training::{Due, Training};
pub use updates::Updates;

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
    pub task: Task,
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
    /// For a run of a batched group: `steps_per_s` times the runs trained together in the last
    /// session (the group's throughput in model-steps per second, the figure to set beside M
    /// single runs); absent for a run trained alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_steps_per_s: Option<f64>,
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

impl TrainRecord {
    /// The `settings` of a `train.json`'s text, the one field a checkpoint's settings are read
    /// from when it has no `train_state.json` (a shipped checkpoint may keep only a record, which
    /// may hold fields of its own beside the writer's).
    ///
    /// # Errors
    /// serde's error when the text is not JSON or its `settings` are missing or malformed.
    pub fn settings_of(bytes: &[u8]) -> serde_json::Result<TrainSettings> {
        /// The field of [`TrainRecord`] that is read.
        #[derive(Deserialize)]
        struct Settings {
            settings: TrainSettings,
        }
        serde_json::from_slice::<Settings>(bytes).map(|r| r.settings)
    }
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

/// Checks the memory that `models` runs trained together with `settings` ask for against the
/// budget (`hyperlens_io::budget`) before anything is allocated or any directory is made: the
/// weights, gradients and AdamW's two moments of every model (four float32 copies of the
/// parameters each), the held evaluation sets (`--eval-n` problems of the ID and the OOD set, as
/// float32 one-hot inputs; the induction task streams them) and the activations that the backward
/// pass keeps for one `--batch` (per layer and token: about ten D-wide vectors, the scores of H
/// heads over T keys three times, and two MLP-wide vectors, in float32).
///
/// # Units
/// `models` counts models (runs); sizes are bytes.
///
/// # Errors
/// [`TrainError::InvalidParam`] naming the flag (or the number of runs) and what it would have
/// cost.
pub fn check_memory(settings: &TrainSettings, models: usize) -> Result<()> {
    use hyperlens_io::budget::{bytes_of, check_alloc};
    let dims = match settings.task {
        Task::Sraven | Task::Logic => {
            let c = if settings.task == Task::Sraven {
                crate::sraven::model_config(settings)?
            } else {
                crate::logic::model_config(settings)?
            };
            (
                c.n_tokens,
                c.d_in,
                c.d_model,
                c.n_heads,
                c.d_mlp,
                c.n_layers,
                true,
                c.n_params_saturating(),
            )
        }
        Task::Induction => {
            let c = crate::induction::model_config(settings)?;
            let mlp = c.d_mlp.unwrap_or(0);
            let params = c.weights_bound();
            (
                c.n_ctx, 1, c.d_model, c.n_heads, mlp, c.n_layers, false, params,
            )
        }
    };
    let (t, d_in, dm, h, mlp, layers, held_eval, params) = dims;
    let refuse = |e: hyperlens_io::budget::BudgetError| TrainError::InvalidParam(e.to_string());
    let each = if models > 1 {
        format!(", for each of {models} runs trained together")
    } else {
        String::new()
    };
    check_alloc(
        format!(
            "{models} model(s) of {params} parameters (weights, gradients and AdamW's two \
             moments{each})"
        ),
        params.saturating_mul(16).saturating_mul(models as u128),
    )
    .map_err(refuse)?;
    if held_eval {
        check_alloc(
            format!(
                "--eval-n {} (ID and OOD evaluation sets{each})",
                settings.eval_n
            ),
            bytes_of(4, &[models, 2, settings.eval_n, t, d_in]),
        )
        .map_err(refuse)?;
    }
    let per_token = (10 * dm as u128)
        .saturating_add((3 * h as u128).saturating_mul(t as u128))
        .saturating_add(2 * mlp as u128);
    check_alloc(
        format!(
            "--batch {} (activations kept for the backward pass{each})",
            settings.batch
        ),
        bytes_of(4, &[models, settings.batch, layers.max(1), t])
            .saturating_mul(per_token)
            .saturating_add(bytes_of(4, &[models, settings.batch, t, d_in])),
    )
    .map_err(refuse)
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
/// Recipe (`docs/spec/models.md`, "Training recipe"): [`AdamW`](crate::optim::AdamW) with decoupled
/// weight decay on parameters of 2 or more dimensions, the [`WarmupCosine`] schedule, attention
/// dropout on the normalised scores, a fresh batch every update, the paper's initialisation. This
/// is [`train_group`] with one run.
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
    let mut outs = std::collections::HashSet::with_capacity(runs.len());
    if let Some(r) = runs.iter().find(|r| !outs.insert(&r.out)) {
        return Err(TrainError::InvalidParam(format!(
            "two runs of the group write to {}",
            r.out.display()
        )));
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
    if settings.len() > 1 && first.task == Task::Induction {
        return Err(TrainError::InvalidParam(
            "the induction task trains one model per run (no batched runs)".into(),
        ));
    }
    Ok(())
}

/// The file a run of a group that diverged gets, with the reason (`failed.json`).
pub const FAILED_FILE: &str = "failed.json";

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
/// cannot start or resume, runs at different steps on resume, I/O); a run's own divergence is
/// its entry of the returned results.
pub fn train_group<F>(
    runs: &[GroupRun],
    options: &RunOptions,
    on_event: F,
) -> Result<Vec<Result<TrainOutcome>>>
where
    F: FnMut(usize, &Event<'_>) -> ControlFlow<()>,
{
    check_group(runs)?;
    let settings = &runs[0].settings;
    check_memory(settings, runs.len())?;
    let session_start = Instant::now();
    let device = options.device.to_candle()?;
    let opened = open::open_group(runs, options)?;
    let all: Vec<TrainSettings> = runs.iter().map(|r| r.settings.clone()).collect();
    let updates = if opened.resume {
        Updates::resume(&all, &opened.checkpoints, opened.step, &device)?
    } else {
        Updates::start(&all, &device)?
    };
    let start = opened.step;
    let members = Member::open_all(runs, opened.states, opened.resume.then_some(start))?;
    let mut training = Training::new(settings, members, updates, on_event, session_start);
    if !opened.resume {
        training.checkpoint_untrained()?;
    }
    training.announce(start);
    training.evaluate_untrained(start)?;
    training.begin_interval();
    let mut step = start;
    while step < settings.steps && !training.stop && training.any_running() {
        let lrs = training.update(step)?;
        step += 1;
        let due = Due::after(settings, step, training.stop);
        if due.log {
            training.log_interval(step, &lrs, due.eval)?;
        }
        if due.checkpoint || training.stop {
            training.checkpoint(step)?;
        }
    }
    training.finish(step, &options.device)
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
    let bytes = hyperlens_io::read_regular(&path).map_err(|_| {
        TrainError::Resume(format!(
            "{}: the checkpoint has no run files (train_state.json or train.json) with its \
             training settings",
            dir.display()
        ))
    })?;
    TrainRecord::settings_of(&bytes)
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
