//! Each run's side of a group ([`Member`]): its directory, state, `metrics.csv` and running sums,
//! and what the group does to one run: add an update's loss to its sums, read their means, mark
//! it diverged, write its checkpoint, its rows and its `train.json`.

use std::ops::ControlFlow;
use std::path::Path;
use std::time::Instant;

use candle_core::Tensor;

use crate::error::{Result, TrainError};
use crate::job::BatchLoss;
use crate::metrics::{Evaluation, MetricsLog, MetricsRow};
use crate::optim::AdamWParams;
use crate::schedule::WarmupCosine;
use crate::settings::TrainSettings;
use crate::state::{
    file_hash, save_optimizer, write_json, FailedRecord, Session, TrainState, RECORD_FILE,
    STATE_FILE, VERSION,
};
use crate::Task;

use super::{GroupRun, TrainRecord, Updates};

/// One run's side of a group: its files, state and running sums.
pub(super) struct Member<'a> {
    /// The run directory.
    pub(super) out: &'a Path,
    /// The run's settings.
    pub(super) settings: &'a TrainSettings,
    /// The run's learning-rate schedule.
    pub(super) schedule: WarmupCosine,
    /// The state of its latest checkpoint (updated as each checkpoint is written).
    state: TrainState,
    /// Its `metrics.csv`.
    pub(super) log: MetricsLog,
    /// The sum of the losses of the current logging interval, on the device.
    loss_sum: Option<Tensor>,
    /// The sum of the training metric's numerators of the interval, on the device.
    metric_sum: Option<Tensor>,
    /// The sum of the training metric's denominators of the interval.
    metric_count: f64,
    /// The last evaluation of the session, if any.
    pub(super) last_eval: Option<Evaluation>,
    /// Set when the run diverged: it takes no further part in logs, evaluations and checkpoints.
    pub(super) failed: Option<TrainError>,
    /// Wall-clock seconds of the run's earlier sessions.
    pub(super) wall_before: f64,
    /// Seconds in training steps of the run's earlier sessions.
    train_before: f64,
}

impl<'a> Member<'a> {
    /// The books of every run of `runs`, in order, from their opened `states`: each run's
    /// schedule, and its `metrics.csv` opened (cut back to step `resume_at` when the group
    /// resumes).
    ///
    /// # Errors
    /// An invalid schedule; the errors of [`MetricsLog::open`].
    pub(super) fn open_all(
        runs: &'a [GroupRun],
        states: Vec<TrainState>,
        resume_at: Option<u64>,
    ) -> Result<Vec<Member<'a>>> {
        let mut members = Vec::with_capacity(runs.len());
        for (run, state) in runs.iter().zip(states) {
            let schedule =
                WarmupCosine::paper(run.settings.lr, run.settings.warmup, run.settings.steps);
            schedule.check()?;
            members.push(Member {
                out: &run.out,
                settings: &run.settings,
                schedule,
                log: MetricsLog::open(&run.out, run.settings.task, resume_at)?,
                wall_before: state.wall_time_s,
                train_before: state.train_time_s,
                state,
                loss_sum: None,
                metric_sum: None,
                metric_count: 0.0,
                last_eval: None,
                failed: None,
            });
        }
        Ok(members)
    }

    /// Adds one update's loss and metric sums to the running sums of the logging interval (on the
    /// device: nothing waits for it).
    ///
    /// # Errors
    /// Tensor errors.
    pub(super) fn add(&mut self, bl: BatchLoss) -> Result<()> {
        let l = bl.loss.detach();
        self.loss_sum = Some(match self.loss_sum.take() {
            Some(s) => (s + l)?,
            None => l,
        });
        self.metric_sum = Some(match self.metric_sum.take() {
            Some(s) => (s + bl.metric_sum)?,
            None => bl.metric_sum,
        });
        self.metric_count += bl.metric_count;
        Ok(())
    }

    /// Reads and clears the running sums of an interval of `steps` updates: the mean loss (NaN
    /// when there is none) and the mean training metric (`None` when it counted nothing). This
    /// waits for the device.
    ///
    /// # Errors
    /// Tensor errors.
    pub(super) fn take_means(&mut self, steps: u64) -> Result<(f64, Option<f64>)> {
        let mean_loss = match self.loss_sum.take() {
            Some(s) => s.to_scalar::<f32>()? as f64 / steps.max(1) as f64,
            None => f64::NAN,
        };
        let mean_metric = match self.metric_sum.take() {
            Some(s) if self.metric_count > 0.0 => {
                Some(s.to_scalar::<f32>()? as f64 / self.metric_count)
            }
            _ => None,
        };
        self.metric_count = 0.0;
        Ok((mean_loss, mean_metric))
    }

    /// Marks the run diverged at update `step`, whose interval's mean loss `loss` is not finite:
    /// it gets [`super::FAILED_FILE`] with the reason and its last checkpoint's step, and takes no
    /// further part.
    ///
    /// # Errors
    /// I/O errors writing the file.
    pub(super) fn diverge(&mut self, step: u64, loss: f64) -> Result<()> {
        let err = TrainError::Diverged {
            step,
            loss: loss as f32,
        };
        FailedRecord {
            error: err.to_string(),
            step,
            last_checkpoint_step: self.state.step,
        }
        .write(self.out)?;
        self.failed = Some(err);
        Ok(())
    }

    /// Writes the checkpoint of this run, model `i` of `updates`, after `done` updates and
    /// `train_s` seconds in training steps in the session that began at `session_start`,
    /// crash-safely ([`crate::checkpoint`]): the four files go to a staging directory, which
    /// becomes a step directory, which the manifest then names. `after` hears of each file
    /// operation.
    ///
    /// # Errors
    /// [`TrainError::Interrupted`] when `after` stopped the write; model and I/O errors.
    pub(super) fn checkpoint(
        &mut self,
        i: usize,
        updates: &Updates,
        done: u64,
        train_s: f64,
        session_start: Instant,
        after: &mut dyn FnMut(&'static str) -> ControlFlow<()>,
    ) -> Result<()> {
        let state = &mut self.state;
        state.step = done;
        state.data_position = done;
        state.train_time_s = self.train_before + train_s;
        state.wall_time_s = self.wall_before + session_start.elapsed().as_secs_f64();
        if let Some(s) = state.sessions.last_mut() {
            s.end_step = done;
            s.train_time_s = Some(train_s);
            s.wall_time_s = Some(session_start.elapsed().as_secs_f64());
        }
        let (job, opt) = (updates.job.as_ref(), &updates.opt);
        crate::checkpoint::write(
            self.out,
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
    }

    /// The `train.json` of this run, model `i` of `updates`, after its last update `step` of the
    /// session that began at `session_start` on `device`, written to the run directory: its
    /// final evaluation is the session's last one when that was at `step`, else a new one.
    ///
    /// # Errors
    /// Evaluation, model and I/O errors.
    pub(super) fn record(
        &self,
        i: usize,
        updates: &mut Updates,
        step: u64,
        device: &hyperlens_model::Device,
        session_start: Instant,
    ) -> Result<TrainRecord> {
        let final_eval = match &self.last_eval {
            Some(ev) if ev.step == step => ev.clone(),
            _ => updates.job.evaluate(i, step)?,
        };
        let s = self.settings;
        let train_time_s = self.state.train_time_s;
        let mut record = TrainRecord {
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
            device: device.to_string(),
            wall_time_s: self.wall_before + session_start.elapsed().as_secs_f64(),
            train_time_s,
            steps_per_s: match self.state.sessions.last().and_then(Session::steps_per_s) {
                Some(rate) => rate,
                None if train_time_s > 0.0 => step as f64 / train_time_s,
                None => 0.0,
            },
            model_steps_per_s: None,
            metric: s.task.metric_name().into(),
            final_eval,
            n_params: updates.job.n_params(),
            model: updates.job.model_config()?,
            optimizer: AdamWParams {
                weight_decay: s.weight_decay,
                ..AdamWParams::default()
            },
            schedule: self.schedule,
            settings: s.clone(),
            sessions: self.state.sessions.clone(),
        };
        record.model_steps_per_s = record
            .sessions
            .last()
            .and_then(|s| s.batched)
            .map(|m| record.steps_per_s * m as f64);
        write_json(&self.out.join(RECORD_FILE), &record)?;
        Ok(record)
    }
}

/// The `metrics.csv` row of the training interval that ended with update `step` (0-based
/// `step - 1`) at learning rate `lr`: its mean loss and metric and its rate, in updates per
/// second (the wall time is set when the row is logged).
pub(super) fn train_row(
    step: u64,
    lr: f64,
    mean_loss: f64,
    mean_metric: Option<f64>,
    rate: Option<f64>,
) -> MetricsRow {
    MetricsRow {
        step,
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
    }
}

/// The `metrics.csv` row of an evaluation of a run of `task` (its extra sets under their column
/// prefixes, [`Task::extra_sets`]).
pub(super) fn eval_row(
    task: Task,
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
