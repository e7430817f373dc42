//! The text a front end prints while a run trains: a start line, one plain line per evaluation, a
//! short message for a progress bar, and the closing summary. Pure functions of the loop's
//! [`Event`]s and [`TrainOutcome`], so that a terminal (with a progress bar) and a redirected output
//! (plain lines only) print the same evaluation lines.
//!
//! ```text
//! training hyla (1504 params) on sraven: paper-seed0 from steps 0..6 -> runs/demo
//! step 0/6  id_acc 0.0000  ood_acc 0.0000  id_loss 2.6597  ood_loss 2.5063
//! step 3/6  loss 2.7387  id_acc 0.0000  ood_acc 0.0000  id_loss 2.4570  ood_loss 2.3399  241.5 steps/s
//! ```

use std::path::Path;

use crate::metrics::{Evaluation, MetricsRow};
use crate::run::{Event, TrainOutcome};
use crate::settings::TrainSettings;
use crate::Task;

/// Turns the loop's events into lines of text for one run (one session of it).
///
/// An evaluation is reported by [`Event::Evaluated`] and then by the [`Event::Row`] of
/// `metrics.csv` that holds it (with the training loss and speed of the interval); the periodic line
/// is made from both when the row arrives.
#[derive(Debug, Clone)]
pub struct ProgressText {
    settings: TrainSettings,
    out: String,
    resume: bool,
    pending: Option<Evaluation>,
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.4}")).unwrap_or_else(|| "-".into())
}

impl ProgressText {
    /// The text of a run with `settings` into the directory `out`; `resume` when it continues one.
    pub fn new(settings: &TrainSettings, out: &Path, resume: bool) -> Self {
        ProgressText {
            settings: settings.clone(),
            out: out.display().to_string(),
            resume,
            pending: None,
        }
    }

    /// The line to print for `event`, if any: the start line, or the periodic line of an evaluation.
    pub fn line(&mut self, event: &Event<'_>) -> Option<String> {
        match event {
            Event::Start {
                step,
                total,
                n_params,
            } => Some(format!(
                "training {} ({n_params} params) on {}: {} {} steps {step}..{total} -> {}",
                self.settings.mixer,
                self.settings.task,
                self.settings.split,
                if self.resume { "resuming at" } else { "from" },
                self.out
            )),
            Event::Evaluated(ev) => {
                self.pending = Some((*ev).clone());
                None
            }
            Event::Row(row) => {
                let ev = self.pending.take_if(|ev| ev.step == row.step)?;
                Some(self.periodic_line(row, &ev))
            }
            Event::Step { .. } | Event::Checkpoint { .. } | Event::CheckpointWrite { .. } => None,
        }
    }

    /// One evaluation as a plain line: `step 200/1000  loss 1.2340  id_acc 0.4100  ood_acc 0.3700
    /// id_loss 1.5021  ood_loss 1.6010  12.3 steps/s`, with the task's extra sets after the OOD set.
    /// The training loss and the speed are left out where the row has none (the evaluation at step 0).
    pub fn periodic_line(&self, row: &MetricsRow, ev: &Evaluation) -> String {
        let m = self.settings.task.metric_label();
        let mut line = format!("step {}/{}", ev.step, self.settings.steps);
        if let Some(loss) = row.train_loss {
            line += &format!("  loss {loss:.4}");
        }
        line += &format!(
            "  id_{m} {:.4}  ood_{m} {:.4}  id_loss {:.4}  ood_loss {:.4}",
            ev.id.metric, ev.ood.metric, ev.id.loss, ev.ood.loss
        );
        for (name, set) in &ev.extra {
            line += &format!(
                "  {name}_{m} {:.4}  {name}_loss {:.4}",
                set.metric, set.loss
            );
        }
        if let Some(rate) = row.steps_per_s {
            line += &format!("  {rate:.1} steps/s");
        }
        line
    }

    /// The message shown beside a progress bar after a row of `metrics.csv`: learning rate, and the
    /// interval's training loss and metric.
    pub fn bar_message(&self, row: &MetricsRow) -> String {
        format!(
            "lr {:.2e} loss {} {} {}",
            row.lr,
            fmt_opt(row.train_loss),
            self.settings.task.metric_label(),
            fmt_opt(row.train_acc)
        )
    }

    /// The closing lines: the final metrics, speed and files of a completed run, or how to continue
    /// a run that was stopped early.
    pub fn summary(&self, outcome: &TrainOutcome) -> Vec<String> {
        let m = match self.settings.task {
            Task::Logic => "R2",
            _ => "acc",
        };
        let Some(rec) = &outcome.record else {
            return vec![format!(
                "stopped at step {} of {}; continue with: hyperlens train --out {} --resume",
                outcome.step, self.settings.steps, self.out
            )];
        };
        let ev = &rec.final_eval;
        let rate = match rec.sessions.as_slice() {
            [_, .., last] => format!(
                "{} sessions; the last, steps {}-{}, at {:.2} steps/s on {}",
                rec.sessions.len(),
                last.start_step,
                last.end_step,
                rec.steps_per_s,
                rec.device
            ),
            _ => format!("{:.2} steps/s on {}", rec.steps_per_s, rec.device),
        };
        let rate = match (
            rec.sessions.last().and_then(|s| s.batched),
            rec.model_steps_per_s,
        ) {
            (Some(m), Some(model_rate)) => {
                format!("{rate}, with {m} runs in one batched model: {model_rate:.2} model-steps/s")
            }
            _ => rate,
        };
        let mut lines = vec![format!(
            "done: {} steps in {:.1} s ({rate}); final ID {m} {:.4}, OOD {m} {:.4}",
            rec.steps, rec.wall_time_s, ev.id.metric, ev.ood.metric
        )];
        if !ev.ood.per_feature.is_empty() {
            let pf: Vec<String> = ev
                .ood
                .per_feature
                .iter()
                .map(|v| format!("{v:.3}"))
                .collect();
            lines.push(format!("OOD per-feature accuracy: {}", pf.join(" ")));
        }
        lines.push(format!(
            "wrote {} (checkpoint: config.json, model.safetensors; train.json, metrics.csv)",
            self.out
        ));
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::SetMetrics;
    use std::collections::BTreeMap;

    fn set(metric: f64, loss: f64) -> SetMetrics {
        SetMetrics {
            n: 8,
            metric,
            loss,
            per_feature: Vec::new(),
        }
    }

    fn row(step: u64, train_loss: Option<f64>, rate: Option<f64>) -> MetricsRow {
        MetricsRow {
            step,
            lr: 1e-3,
            train_loss,
            train_acc: train_loss.map(|_| 0.25),
            id_loss: Some(1.5),
            id_acc: Some(0.41),
            ood_loss: Some(1.6),
            ood_acc: Some(0.37),
            wall_time_s: 1.0,
            steps_per_s: rate,
            extra: Default::default(),
        }
    }

    #[test]
    fn an_evaluation_gives_one_line_when_its_row_arrives() {
        let mut s = TrainSettings::for_task(Task::Logic);
        s.steps = 1000;
        let mut text = ProgressText::new(&s, Path::new("runs/x"), false);
        let mut extra = BTreeMap::new();
        extra.insert("unknown".to_string(), set(0.125, 0.5));
        let ev = Evaluation {
            step: 200,
            id: set(0.41, 1.5),
            ood: set(0.37, 1.6),
            extra,
        };
        assert_eq!(text.line(&Event::Evaluated(&ev)), None);
        // A row of another step (a plain logging row) does not take the evaluation.
        assert_eq!(text.line(&Event::Row(&row(100, Some(2.0), None))), None);
        let line = text.line(&Event::Row(&row(200, Some(1.234), Some(12.34))));
        assert_eq!(
            line.as_deref(),
            Some(
                "step 200/1000  loss 1.2340  id_r2 0.4100  ood_r2 0.3700  id_loss 1.5000  \
                 ood_loss 1.6000  unknown_r2 0.1250  unknown_loss 0.5000  12.3 steps/s"
            )
        );
        // Printed once.
        assert_eq!(text.line(&Event::Row(&row(200, Some(1.0), None))), None);
    }

    #[test]
    fn the_first_evaluation_has_no_training_loss_or_speed() {
        let s = TrainSettings::for_task(Task::Sraven);
        let text = ProgressText::new(&s, Path::new("r"), false);
        let ev = Evaluation {
            step: 0,
            id: set(0.0, 2.5),
            ood: set(0.0, 2.75),
            extra: BTreeMap::new(),
        };
        assert_eq!(
            text.periodic_line(&row(0, None, None), &ev),
            "step 0/156250  id_acc 0.0000  ood_acc 0.0000  id_loss 2.5000  ood_loss 2.7500"
        );
        assert_eq!(
            text.bar_message(&row(0, Some(2.0), None)),
            "lr 1.00e-3 loss 2.0000 acc 0.2500"
        );
    }
}
