//! `hyperlens sweep status`'s table: one row of display strings per run (its step of the planned
//! steps, its last evaluation, where it ran and why it failed) and the count of runs per state.

use crate::state::{LastEval, RunState, RunStatus};

/// One run's line of the status table, every cell as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRow {
    /// The run's name.
    pub name: String,
    /// Its job.
    pub job: usize,
    /// Its state (`finished`, `running`, ...).
    pub state: String,
    /// `done/planned`, `done`, `0/planned` or `-`.
    pub step: String,
    /// `step S: ID / OOD` (four decimals, `-` for a missing metric) or `-`.
    pub eval: String,
    /// Where its job ran (`-` if it has not), with `; error: E` when it failed.
    pub place: String,
}

impl StatusRow {
    /// The row of `s`.
    pub fn of(s: &RunStatus) -> StatusRow {
        let step = match (s.step, s.planned) {
            (Some(d), Some(p)) => format!("{d}/{p}"),
            (Some(d), None) => d.to_string(),
            (None, Some(p)) => format!("0/{p}"),
            (None, None) => "-".into(),
        };
        let eval = s.last_eval.map_or_else(|| "-".to_string(), eval_cell);
        let mut place = s.ran.clone().unwrap_or_else(|| "-".into());
        if let Some(err) = &s.error {
            place = format!("{place}; error: {err}");
        }
        StatusRow {
            name: s.name.clone(),
            job: s.job,
            state: s.state.to_string(),
            step,
            eval,
            place,
        }
    }
}

/// `step S: ID / OOD`, each metric with four decimals or `-`.
fn eval_cell(e: LastEval) -> String {
    let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.4}"));
    format!("step {}: {} / {}", e.step, f(e.id), f(e.ood))
}

/// How many runs are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// All runs.
    pub total: usize,
    /// Finished runs.
    pub finished: usize,
    /// Running runs.
    pub running: usize,
    /// Interrupted runs.
    pub interrupted: usize,
    /// Pending runs.
    pub pending: usize,
    /// Failed runs.
    pub failed: usize,
}

impl StateCounts {
    /// The counts of `status`.
    pub fn of(status: &[RunStatus]) -> StateCounts {
        let count = |st: RunState| status.iter().filter(|r| r.state == st).count();
        StateCounts {
            total: status.len(),
            finished: count(RunState::Finished),
            running: count(RunState::Running),
            interrupted: count(RunState::Interrupted),
            pending: count(RunState::Pending),
            failed: count(RunState::Failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: RunState, step: Option<u64>, planned: Option<u64>) -> RunStatus {
        RunStatus {
            name: "seed-0".into(),
            job: 2,
            state,
            step,
            planned,
            last_eval: None,
            ran: None,
            error: None,
        }
    }

    #[test]
    fn cells_show_steps_evaluation_and_failure() {
        let mut s = status(RunState::Failed, Some(3), Some(8));
        s.last_eval = Some(LastEval {
            step: 3,
            id: Some(0.123456),
            ood: None,
        });
        s.ran = Some("local pid 7 on vm".into());
        s.error = Some("loss NaN".into());
        let r = StatusRow::of(&s);
        assert_eq!(r.step, "3/8");
        assert_eq!(r.eval, "step 3: 0.1235 / -");
        assert_eq!(r.place, "local pid 7 on vm; error: loss NaN");
        assert_eq!(r.state, "failed");
        assert_eq!(r.job, 2);
        assert_eq!(
            StatusRow::of(&status(RunState::Pending, None, Some(8))).step,
            "0/8"
        );
        assert_eq!(
            StatusRow::of(&status(RunState::Running, Some(5), None)).step,
            "5"
        );
        let p = StatusRow::of(&status(RunState::Pending, None, None));
        assert_eq!(
            (p.step.as_str(), p.eval.as_str(), p.place.as_str()),
            ("-", "-", "-")
        );
    }

    #[test]
    fn counts_add_up_per_state() {
        let all = [
            status(RunState::Finished, None, None),
            status(RunState::Finished, None, None),
            status(RunState::Failed, None, None),
            status(RunState::Pending, None, None),
        ];
        let c = StateCounts::of(&all);
        assert_eq!(
            c,
            StateCounts {
                total: 4,
                finished: 2,
                running: 0,
                interrupted: 0,
                pending: 1,
                failed: 1
            }
        );
    }
}
