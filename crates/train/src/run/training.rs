//! One session of a group's training, phase by phase ([`Training`]): the phases that
//! [`train_group`](super::train_group) runs in order (the first checkpoints, the start events,
//! the evaluation of the untrained models, each update, the rows and evaluations that end a
//! logging interval, the checkpoints, the final records), and the clock that tells the seconds in
//! training steps from those spent writing checkpoints.

use std::ops::ControlFlow;
use std::time::Instant;

use crate::error::Result;
use crate::metrics::MetricsRow;
use crate::settings::TrainSettings;

use super::members::{eval_row, train_row, Member};
use super::{Event, TrainOutcome, Updates};

/// What is due after an update ([`Due::after`]).
pub(super) struct Due {
    /// An evaluation of every run.
    pub(super) eval: bool,
    /// The end of the logging interval: a row per run ([`Training::log_interval`]).
    pub(super) log: bool,
    /// A checkpoint of every run ([`Training::checkpoint`]).
    pub(super) checkpoint: bool,
}

impl Due {
    /// What is due after `done` updates of runs with `settings` (the group's cadence), `stop`
    /// saying whether the caller asked to stop: an evaluation every `eval_every` updates and after
    /// the last; a row at those and every `log_every` updates, and before stopping; a checkpoint
    /// every `checkpoint_every` updates, after the last, and before stopping.
    pub(super) fn after(settings: &TrainSettings, done: u64, stop: bool) -> Due {
        let every = |k: u64| k > 0 && done.is_multiple_of(k);
        let last = done == settings.steps;
        let eval = every(settings.eval_every) || last;
        Due {
            eval,
            log: every(settings.log_every) || eval || stop,
            checkpoint: every(settings.checkpoint_every) || last || stop,
        }
    }
}

/// The current logging interval: when it began, its updates, and the seconds in it spent writing
/// checkpoints (which are not training time).
struct Interval {
    /// When the interval began.
    start: Instant,
    /// Updates applied in the interval.
    steps: u64,
    /// Seconds of the interval spent writing checkpoints.
    excluded_s: f64,
}

impl Interval {
    /// An interval beginning now.
    fn new() -> Interval {
        Interval {
            start: Instant::now(),
            steps: 0,
            excluded_s: 0.0,
        }
    }

    /// The seconds in training steps of the interval so far.
    fn train_s(&self) -> f64 {
        (self.start.elapsed().as_secs_f64() - self.excluded_s).max(0.0)
    }
}

/// One session of a group's training: its runs' books, their updates, the caller's callback,
/// whether it asked to stop, and the session's clock.
pub(super) struct Training<'a, F> {
    /// The group's settings (those of its first run: the cadence and the total are the group's).
    settings: &'a TrainSettings,
    /// Each run's books, in the order of the runs.
    members: Vec<Member<'a>>,
    /// The batched model and its optimiser.
    updates: Updates,
    /// `on_event(i, event)` reports the events of run `i`.
    on_event: F,
    /// Whether the callback asked to stop (once set, it stays).
    pub(super) stop: bool,
    /// When the session began.
    session_start: Instant,
    /// Seconds in training steps of the session's finished intervals.
    train_s: f64,
    /// The current logging interval.
    interval: Interval,
}

impl<'a, F> Training<'a, F>
where
    F: FnMut(usize, &Event<'_>) -> ControlFlow<()>,
{
    /// A session of the runs `members`, trained by `updates`, with the group's `settings`; it
    /// began at `session_start`.
    pub(super) fn new(
        settings: &'a TrainSettings,
        members: Vec<Member<'a>>,
        updates: Updates,
        on_event: F,
        session_start: Instant,
    ) -> Self {
        Training {
            settings,
            members,
            updates,
            on_event,
            stop: false,
            session_start,
            train_s: 0.0,
            interval: Interval::new(),
        }
    }

    /// Writes the checkpoint of every run before its first update (step 0), so that a fresh run
    /// killed from here on can resume.
    ///
    /// # Errors
    /// As [`Member::checkpoint`].
    pub(super) fn checkpoint_untrained(&mut self) -> Result<()> {
        for (i, mem) in self.members.iter_mut().enumerate() {
            mem.checkpoint(i, &self.updates, 0, 0.0, self.session_start, &mut |op| {
                (self.on_event)(i, &Event::CheckpointWrite { step: 0, op })
            })?;
        }
        Ok(())
    }

    /// Reports [`Event::Start`] from update `start` to every run.
    pub(super) fn announce(&mut self, start: u64) {
        for i in 0..self.members.len() {
            self.stop |= (self.on_event)(
                i,
                &Event::Start {
                    step: start,
                    total: self.settings.steps,
                    n_params: self.updates.job.n_params(),
                },
            )
            .is_break();
        }
    }

    /// The evaluation of the untrained models, when the session starts from update `start` 0 and
    /// the group evaluates: a row for each run whose `metrics.csv` has none yet (also when a run
    /// resumes from its first checkpoint before that row was logged).
    ///
    /// # Errors
    /// Evaluation and I/O errors.
    pub(super) fn evaluate_untrained(&mut self, start: u64) -> Result<()> {
        for (i, mem) in self.members.iter_mut().enumerate() {
            if start == 0 && self.settings.eval_every > 0 && mem.log.last_step().is_none() {
                let ev = self.updates.job.evaluate(i, 0)?;
                let row = eval_row(
                    mem.settings.task,
                    0,
                    mem.schedule.lr(0),
                    (None, None),
                    &ev,
                    mem.wall_before + self.session_start.elapsed().as_secs_f64(),
                );
                mem.log.push(&row)?;
                self.stop |= (self.on_event)(i, &Event::Evaluated(&ev)).is_break();
                self.stop |= (self.on_event)(i, &Event::Row(&row)).is_break();
                mem.last_eval = Some(ev);
            }
        }
        Ok(())
    }

    /// Begins the first logging interval (the time before it, checkpoints and evaluations of the
    /// untrained models, is not training time).
    pub(super) fn begin_interval(&mut self) {
        self.interval = Interval::new();
    }

    /// Whether some run still trains (has not diverged).
    pub(super) fn any_running(&self) -> bool {
        self.members.iter().any(|m| m.failed.is_none())
    }

    /// Applies update `step` (0-based) to every model ([`Updates::apply`]), adds each run's loss
    /// and metric to its interval's sums, and reports [`Event::Step`] to every run. Returns each
    /// run's learning rate of the update.
    ///
    /// # Errors
    /// As [`Updates::apply`]; tensor errors.
    pub(super) fn update(&mut self, step: u64) -> Result<Vec<f64>> {
        let lrs = self.updates.lrs(step);
        let losses = self.updates.apply(step)?;
        for (mem, bl) in self.members.iter_mut().zip(losses) {
            mem.add(bl)?;
        }
        self.interval.steps += 1;
        for (i, lr) in lrs.iter().enumerate() {
            self.stop |= (self.on_event)(
                i,
                &Event::Step {
                    step,
                    total: self.settings.steps,
                    lr: *lr,
                },
            )
            .is_break();
        }
        Ok(lrs)
    }

    /// Ends the logging interval after `done` updates, the last at learning rates `lrs`: reads
    /// each run's mean loss and metric (this waits for the device); a run whose mean loss is not
    /// finite diverges ([`Member::diverge`]); every other running run is evaluated when
    /// `evaluate` and gets its row in `metrics.csv`. A new interval begins.
    ///
    /// # Errors
    /// Tensor, evaluation and I/O errors.
    pub(super) fn log_interval(&mut self, done: u64, lrs: &[f64], evaluate: bool) -> Result<()> {
        let interval_s = self.interval.train_s();
        self.train_s += interval_s;
        let rate = (interval_s > 0.0).then(|| self.interval.steps as f64 / interval_s);
        for (i, mem) in self.members.iter_mut().enumerate() {
            let (mean_loss, mean_metric) = mem.take_means(self.interval.steps)?;
            if mem.failed.is_some() {
                continue;
            }
            if !mean_loss.is_finite() {
                mem.diverge(done - 1, mean_loss)?;
                continue;
            }
            let lr = lrs[i];
            let mut row = train_row(done, lr, mean_loss, mean_metric, rate);
            if evaluate {
                let ev = self.updates.job.evaluate(i, done)?;
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
                self.stop |= (self.on_event)(i, &Event::Evaluated(&ev)).is_break();
                mem.last_eval = Some(ev);
            }
            row.wall_time_s = mem.wall_before + self.session_start.elapsed().as_secs_f64();
            mem.log.push(&row)?;
            self.stop |= (self.on_event)(i, &Event::Row(&row)).is_break();
        }
        self.interval = Interval::new();
        Ok(())
    }

    /// Writes the checkpoint of every running run after `done` updates and reports
    /// [`Event::Checkpoint`] for each; the seconds it takes are not training time.
    ///
    /// # Errors
    /// As [`Member::checkpoint`].
    pub(super) fn checkpoint(&mut self, done: u64) -> Result<()> {
        let t = Instant::now();
        let pending = self.interval.train_s();
        for (i, mem) in self.members.iter_mut().enumerate() {
            if mem.failed.is_some() {
                continue;
            }
            mem.checkpoint(
                i,
                &self.updates,
                done,
                self.train_s + pending,
                self.session_start,
                &mut |op| (self.on_event)(i, &Event::CheckpointWrite { step: done, op }),
            )?;
            self.stop |= (self.on_event)(i, &Event::Checkpoint { step: done }).is_break();
        }
        self.interval.excluded_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// The results of the session, which ended after `step` updates on `device`: a diverged
    /// run's error; for every other run, its outcome, with its `train.json` ([`Member::record`])
    /// when `step` is the run's total.
    ///
    /// # Errors
    /// As [`Member::record`].
    pub(super) fn finish(
        self,
        step: u64,
        device: &hyperlens_model::Device,
    ) -> Result<Vec<Result<TrainOutcome>>> {
        let completed = step >= self.settings.steps;
        let mut updates = self.updates;
        let mut results = Vec::with_capacity(self.members.len());
        for (i, mut mem) in self.members.into_iter().enumerate() {
            if let Some(err) = mem.failed.take() {
                results.push(Err(err));
                continue;
            }
            let record = if completed {
                Some(mem.record(i, &mut updates, step, device, self.session_start)?)
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
}
