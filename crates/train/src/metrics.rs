//! Evaluation results and the `metrics.csv` log.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// Metrics of a model on one evaluation set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetMetrics {
    /// Number of problems (sequences) evaluated.
    pub n: usize,
    /// The task's metric: SRAVEN accuracy (all features right), logic mean R², induction next-token
    /// accuracy; in [0, 1] except R² (at most 1).
    pub metric: f64,
    /// The training loss on this set: SRAVEN / induction cross-entropy (nats), logic MSE.
    pub loss: f64,
    /// SRAVEN: the fraction right per output position (feature); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_feature: Vec<f64>,
}

/// The result of one evaluation: the in-distribution set, the OOD set, and task-specific extras.
///
/// SRAVEN: ID = in-distribution tasks, OOD = held-out tasks (permuted problems, `docs/spec/sraven.md`).
/// Logic: ID = training term pairs, OOD = held-out term pairs, extra `unknown` = pairs of never-trained
/// terms. Induction: ID = held-out corpus sequences, OOD = repeated random tokens (second half),
/// extra `induction_positions` = corpus positions predictable only by induction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Step (updates done) at which the model was evaluated.
    pub step: u64,
    /// In-distribution metrics.
    pub id: SetMetrics,
    /// Out-of-distribution metrics.
    pub ood: SetMetrics,
    /// Further sets by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, SetMetrics>,
}

/// One row of `metrics.csv`: a logging interval, an evaluation, or both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    /// Updates done.
    pub step: u64,
    /// Learning rate of the last update (of update 0 for the row at step 0).
    pub lr: f64,
    /// Mean training loss over the interval (with dropout), if any step was trained in it.
    pub train_loss: Option<f64>,
    /// Mean training metric over the interval (SRAVEN accuracy, logic R², token accuracy).
    pub train_acc: Option<f64>,
    /// In-distribution loss, at evaluations.
    pub id_loss: Option<f64>,
    /// In-distribution metric, at evaluations.
    pub id_acc: Option<f64>,
    /// OOD loss, at evaluations.
    pub ood_loss: Option<f64>,
    /// OOD metric, at evaluations.
    pub ood_acc: Option<f64>,
    /// Wall-clock seconds since the run started (summed over resumed sessions).
    pub wall_time_s: f64,
    /// Training steps per second over the interval (excluding evaluation and checkpoint time).
    pub steps_per_s: Option<f64>,
    /// The task's further evaluation sets at evaluations, by column prefix
    /// ([`crate::Task::extra_sets`]; logic `unknown`, induction `induction`): (loss, metric).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, (Option<f64>, Option<f64>)>,
}

/// The header of `metrics.csv` as written before 2026-11-24 by every task (the metric columns
/// named `*_acc` also for the R² of the logic task, no extra sets). [`read_metrics`] reads it.
pub const METRICS_HEADER: &str =
    "step,lr,train_loss,train_acc,id_loss,id_acc,ood_loss,ood_acc,wall_time_s,steps_per_s";

/// The columns of a task's `metrics.csv`: `step,lr,train_loss,train_M,id_loss,id_M,ood_loss,ood_M,
/// wall_time_s,steps_per_s`, then `X_loss,X_M` for each extra set `X`, where `M` is the task's
/// metric label (`acc`; `r2` for logic).
pub fn metrics_header(task: crate::Task) -> String {
    let m = task.metric_label();
    let mut h = format!(
        "step,lr,train_loss,train_{m},id_loss,id_{m},ood_loss,ood_{m},wall_time_s,steps_per_s"
    );
    for (_, prefix) in task.extra_sets() {
        let _ = write!(h, ",{prefix}_loss,{prefix}_{m}");
    }
    h
}

/// File name of the metrics log in a run directory.
pub const METRICS_FILE: &str = "metrics.csv";

impl MetricsRow {
    /// The CSV line of the columns of [`metrics_header`] for `task` (no newline); missing values
    /// are empty fields.
    pub fn to_csv_for(&self, task: crate::Task) -> String {
        let opt = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
        let mut s = self.to_csv();
        for (_, prefix) in task.extra_sets() {
            let (loss, metric) = self.extra.get(*prefix).copied().unwrap_or((None, None));
            let _ = write!(s, ",{},{}", opt(loss), opt(metric));
        }
        s
    }

    /// The CSV line of the first ten columns (no newline); missing values are empty fields.
    pub fn to_csv(&self) -> String {
        let opt = |v: Option<f64>| v.map(|x| format!("{x}")).unwrap_or_default();
        let mut s = String::new();
        let _ = write!(
            s,
            "{},{},{},{},{},{},{},{},{:.3},{}",
            self.step,
            self.lr,
            opt(self.train_loss),
            opt(self.train_acc),
            opt(self.id_loss),
            opt(self.id_acc),
            opt(self.ood_loss),
            opt(self.ood_acc),
            self.wall_time_s,
            self.steps_per_s
                .map(|x| format!("{x:.4}"))
                .unwrap_or_default()
        );
        s
    }

    /// Parses a line written by [`MetricsRow::to_csv`].
    ///
    /// # Errors
    /// [`TrainError::Resume`] naming the line if a field is missing or not a number.
    pub fn from_csv(line: &str) -> Result<MetricsRow> {
        let bad = || TrainError::Resume(format!("{METRICS_FILE}: malformed row `{line}`"));
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 10 {
            return Err(bad());
        }
        let opt = |s: &str| -> Result<Option<f64>> {
            if s.is_empty() {
                Ok(None)
            } else {
                s.parse::<f64>().map(Some).map_err(|_| bad())
            }
        };
        Ok(MetricsRow {
            step: f[0].parse().map_err(|_| bad())?,
            lr: f[1].parse().map_err(|_| bad())?,
            train_loss: opt(f[2])?,
            train_acc: opt(f[3])?,
            id_loss: opt(f[4])?,
            id_acc: opt(f[5])?,
            ood_loss: opt(f[6])?,
            ood_acc: opt(f[7])?,
            wall_time_s: f[8].parse().map_err(|_| bad())?,
            steps_per_s: opt(f[9])?,
            extra: BTreeMap::new(),
        })
    }
}

/// Reads every row of a `metrics.csv`. A last line without its newline (a row cut short by a kill
/// while it was appended) is ignored.
///
/// # Errors
/// [`TrainError::Io`] if unreadable; [`TrainError::Resume`] for a wrong header or a malformed row.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsRow>> {
    let text = hyperlens_io::read_regular_string(path).map_err(|source| TrainError::Io {
        path: path.display().to_string(),
        source,
    })?;
    // Every row is written with its newline; a last line without one was cut short by a kill
    // while it was being appended, and is not a row.
    let complete = match text.rfind('\n') {
        Some(i) if !text.ends_with('\n') => &text[..=i],
        _ => text.as_str(),
    };
    let mut lines = complete.lines();
    let header = lines.next().unwrap_or_default();
    let unexpected = || TrainError::Resume(format!("{}: unexpected header", path.display()));
    // The first ten columns are fixed (their metric label `acc` or `r2`); extra sets follow in
    // pairs `X_loss,X_M`.
    let cols: Vec<&str> = header.split(',').collect();
    let label = cols
        .get(3)
        .and_then(|c| c.strip_prefix("train_"))
        .unwrap_or("");
    let fixed: Vec<String> = METRICS_HEADER
        .split(',')
        .map(|c| {
            c.strip_suffix("_acc")
                .map_or(c.to_string(), |s| format!("{s}_{label}"))
        })
        .collect();
    if cols.len() < 10 || cols[..10] != fixed || !(cols.len() - 10).is_multiple_of(2) {
        return Err(unexpected());
    }
    let mut extras = Vec::new();
    for pair in cols[10..].chunks(2) {
        match (
            pair[0].strip_suffix("_loss"),
            pair[1].strip_suffix(&format!("_{label}")),
        ) {
            (Some(a), Some(b)) if a == b && !a.is_empty() => extras.push(a.to_string()),
            _ => return Err(unexpected()),
        }
    }
    lines
        .filter(|l| !l.is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            let bad = || TrainError::Resume(format!("{METRICS_FILE}: malformed row `{line}`"));
            if f.len() != cols.len() {
                return Err(bad());
            }
            let mut row = MetricsRow::from_csv(&f[..10].join(","))?;
            let opt = |s: &str| -> Result<Option<f64>> {
                if s.is_empty() {
                    Ok(None)
                } else {
                    s.parse::<f64>().map(Some).map_err(|_| bad())
                }
            };
            for (i, name) in extras.iter().enumerate() {
                let (loss, metric) = (opt(f[10 + 2 * i])?, opt(f[11 + 2 * i])?);
                if loss.is_some() || metric.is_some() {
                    row.extra.insert(name.clone(), (loss, metric));
                }
            }
            Ok(row)
        })
        .collect()
}

/// Appends rows to `metrics.csv`, one flushed line per row.
#[derive(Debug)]
pub(crate) struct MetricsLog {
    path: PathBuf,
    file: std::fs::File,
    last_step: Option<u64>,
    task: crate::Task,
}

impl MetricsLog {
    /// Opens the log of a run directory of `task`. A fresh log gets the task's header
    /// ([`metrics_header`]); on resume the rows after `resume_from` (written after the checkpoint
    /// being resumed) are dropped and the log is rewritten under the task's header, atomically
    /// (a log written before 2026-11-24 gets the current column names).
    pub(crate) fn open(
        dir: &Path,
        task: crate::Task,
        resume_from: Option<u64>,
    ) -> Result<MetricsLog> {
        let path = dir.join(METRICS_FILE);
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |source| TrainError::Io { path: p, source }
        };
        let mut text = format!("{}\n", metrics_header(task));
        let mut last_step = None;
        if let Some(step) = resume_from {
            if path.exists() {
                for row in read_metrics(&path)?.into_iter().filter(|r| r.step <= step) {
                    text.push_str(&row.to_csv_for(task));
                    text.push('\n');
                    last_step = Some(row.step);
                }
            }
        }
        hyperlens_io::write_atomic(&path, text.as_bytes())?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        Ok(MetricsLog {
            path,
            file,
            last_step,
            task,
        })
    }

    /// The step of the last row in the log (kept on resume or appended since), if any.
    pub(crate) fn last_step(&self) -> Option<u64> {
        self.last_step
    }

    /// Appends one row.
    pub(crate) fn push(&mut self, row: &MetricsRow) -> Result<()> {
        let p = self.path.display().to_string();
        writeln!(self.file, "{}", row.to_csv_for(self.task))
            .and_then(|_| self.file.flush())
            .map_err(|source| TrainError::Io { path: p, source })?;
        self.last_step = Some(row.step);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_cut_short_by_a_kill_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(METRICS_FILE);
        let row = "3,0.001,2.1,0.1,,,,,1.5,";
        std::fs::write(&p, format!("{METRICS_HEADER}\n{row}\n4,0.00")).unwrap();
        let rows = read_metrics(&p).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].step, 3);
    }

    #[test]
    fn csv_round_trip_with_empty_fields() {
        let row = MetricsRow {
            step: 1300,
            lr: 7.5e-4,
            train_loss: Some(1.25),
            train_acc: Some(0.125),
            id_loss: None,
            id_acc: None,
            ood_loss: Some(2.5),
            ood_acc: Some(0.0625),
            wall_time_s: 12.5,
            steps_per_s: None,
            extra: Default::default(),
        };
        let line = row.to_csv();
        assert_eq!(line, "1300,0.00075,1.25,0.125,,,2.5,0.0625,12.500,");
        assert_eq!(MetricsRow::from_csv(&line).unwrap(), row);
        assert!(MetricsRow::from_csv("1,2,3").is_err());
        assert!(MetricsRow::from_csv("x,0,,,,,,,0,").is_err());
        assert_eq!(METRICS_HEADER.split(',').count(), 10);
    }

    /// A logic run's log names its columns by the metric (`id_r2`) and carries the unknown-term
    /// set (`unknown_loss`, `unknown_r2`); the reader maps them back, reads the header of logs
    /// written before 2026-11-24, and refuses other headers.
    #[test]
    fn honest_column_names_per_task() {
        use crate::Task;
        assert_eq!(
            metrics_header(Task::Logic),
            "step,lr,train_loss,train_r2,id_loss,id_r2,ood_loss,ood_r2,wall_time_s,steps_per_s,\
             unknown_loss,unknown_r2"
        );
        assert_eq!(metrics_header(Task::Sraven), METRICS_HEADER);
        assert!(metrics_header(Task::Induction).ends_with(",induction_loss,induction_acc"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(METRICS_FILE);
        let mut row = MetricsRow::from_csv("100,0.001,0.2,0.5,0.1,0.6,0.12,0.55,3.000,").unwrap();
        row.extra.insert("unknown".into(), (Some(0.3), Some(0.25)));
        let plain = MetricsRow::from_csv("50,0.001,0.2,0.5,,,,,1.000,7.5").unwrap();
        let text = format!(
            "{}\n{}\n{}\n",
            metrics_header(Task::Logic),
            plain.to_csv_for(Task::Logic),
            row.to_csv_for(Task::Logic)
        );
        assert!(
            text.contains("\n50,0.001,0.2,0.5,,,,,1.000,7.5000,,\n"),
            "{text}"
        );
        std::fs::write(&p, text).unwrap();
        assert_eq!(read_metrics(&p).unwrap(), vec![plain.clone(), row]);
        std::fs::write(&p, format!("{METRICS_HEADER}\n{}\n", plain.to_csv())).unwrap();
        assert_eq!(read_metrics(&p).unwrap(), vec![plain]);
        for bad in [
            "step,lr,train_loss,train_r2,id_loss,id_acc,ood_loss,ood_r2,wall_time_s,steps_per_s",
            "step,lr,train_loss,train_r2,id_loss,id_r2,ood_loss,ood_r2,wall_time_s,steps_per_s,x_loss",
            "step,lr",
        ] {
            std::fs::write(&p, format!("{bad}\n")).unwrap();
            assert!(read_metrics(&p).is_err(), "{bad}");
        }
    }
}
