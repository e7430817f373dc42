//! Opening the runs of a group before they train: a fresh run's directory is checked and made, a
//! resumed run's latest checkpoint read and checked against its settings, and the group must
//! stand at one step.

use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};
use crate::settings::TrainSettings;
use crate::state::{file_hash, Session, TrainState, RECORD_FILE, STATE_FILE, VERSION};

use super::{first_difference, GroupRun, RunOptions, FAILED_FILE};

/// The runs of a group, opened ([`open_group`]).
pub(super) struct OpenedGroup {
    /// Each run's state, in the order of the runs.
    pub(super) states: Vec<TrainState>,
    /// Each run's checkpoint directory to load, in the order of the runs, when the group
    /// resumes; empty otherwise.
    pub(super) checkpoints: Vec<PathBuf>,
    /// The updates every run has done.
    pub(super) step: u64,
    /// Whether the group resumes from its checkpoints (else every run starts fresh).
    pub(super) resume: bool,
}

/// Opens every run of `runs` in order ([`open_run`]) and checks that they stand together: all at
/// the same step, and all resumed from a checkpoint or all fresh.
///
/// # Errors
/// The first error of [`open_run`]; [`TrainError::Resume`] for runs at different steps, or for
/// some runs with a checkpoint and some without.
pub(super) fn open_group(runs: &[GroupRun], options: &RunOptions) -> Result<OpenedGroup> {
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
    let (states, checkpoints): (Vec<TrainState>, Vec<Option<PathBuf>>) = opened.into_iter().unzip();
    Ok(OpenedGroup {
        states,
        checkpoints: checkpoints.into_iter().flatten().collect(),
        step: steps[0],
        resume,
    })
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

/// Opens one run for [`train_group`](super::train_group): checks and prepares its directory
/// (fresh, [`start_run`]) or reads its latest checkpoint (`resume`, [`resume_run`]); returns the
/// run's state and the checkpoint directory to load (resume). A resumed run whose final checkpoint
/// is complete but which has no record gets no new session: the group only evaluates it and
/// writes the record.
fn open_run(
    run: &GroupRun,
    resume: bool,
    models: usize,
    device: &hyperlens_model::Device,
) -> Result<(TrainState, Option<PathBuf>)> {
    // A run killed before its first checkpoint was committed left nothing to resume, only
    // leftovers: it starts again from step 0, which is the same run (every random stream depends
    // only on the seed and the step).
    let restart = crate::checkpoint::only_leftovers(&run.out)?;
    if resume && !restart {
        let (state, ckdir) = resume_run(run, models, device)?;
        return Ok((state, Some(ckdir)));
    }
    Ok((start_run(run, restart, models, device)?, None))
}

/// Reads the latest complete checkpoint of the run `run` to resume it: checks it against the
/// run's settings (only the cadence may change) and the weights against their hash, removes the
/// verdict of an earlier divergence, and opens a new session unless the run has done all its
/// steps. Returns the run's state and the checkpoint directory.
///
/// # Errors
/// [`TrainError::Resume`] for settings that change the trajectory, a run already complete with
/// its record, or weights that do not match the state; checkpoint and I/O errors.
fn resume_run(
    run: &GroupRun,
    models: usize,
    device: &hyperlens_model::Device,
) -> Result<(TrainState, PathBuf)> {
    let (out, settings) = (run.out.as_path(), &run.settings);
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
            ..new_session(models, device)
        });
    }
    Ok((state, ckdir))
}

/// Prepares the directory of the run `run` to start from step 0: it must be absent, an empty
/// directory, or (`restart`) hold only the leftovers of a run killed before its first
/// checkpoint, which go. Returns the run's state before update 0, with its first session.
///
/// # Errors
/// [`TrainError::InvalidParam`] when `--out` is a file or a directory that is not empty; I/O
/// errors.
fn start_run(
    run: &GroupRun,
    restart: bool,
    models: usize,
    device: &hyperlens_model::Device,
) -> Result<TrainState> {
    let (out, settings) = (run.out.as_path(), &run.settings);
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
    Ok(TrainState {
        version: VERSION.into(),
        settings: settings.clone(),
        step: 0,
        data_position: 0,
        dropout_stream: "ChaCha8, key (seed, \"hyperlens/train/dropout\"), stream = step".into(),
        train_time_s: 0.0,
        wall_time_s: 0.0,
        weights_hash: String::new(),
        sessions: vec![new_session(models, device)],
    })
}

/// A new session of a run trained with `models` models together on `device`, from step 0 (the
/// caller sets the steps of a resumed one).
fn new_session(models: usize, device: &hyperlens_model::Device) -> Session {
    Session {
        start_step: 0,
        end_step: 0,
        device: device.to_string(),
        threads: threads(),
        train_time_s: None,
        wall_time_s: None,
        batched: (models > 1).then_some(models),
    }
}

/// The error of an I/O operation on the file `p`.
fn io(p: &Path) -> impl FnOnce(std::io::Error) -> TrainError {
    let p = p.display().to_string();
    move |source| TrainError::Io { path: p, source }
}
