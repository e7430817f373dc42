//! The task a model is trained on ([`Task`]), and what a checkpoint's run files say about its
//! training ([`RunRecord`]): the record of a finished run or of an imported checkpoint
//! (`train.json`) and the saved state of a run (`train_state.json`). They are read here, beside
//! checkpoint loading, so that every crate and the binary ask one reader which task a checkpoint
//! has, on which split and for how long it was trained.
//!
//! The train crate writes both files (its `TrainRecord` and `TrainState`, whose `task` is this
//! [`Task`]); this reader takes from them only the fields that describe any checkpoint, and reads
//! the records of imported checkpoints too, which hold fewer fields (`trained_by`, `split`,
//! `steps`, no `task`).

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use hyperlens_tasks::sraven::SplitName;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};

/// File name of the training record: how a model was trained, written by a training run when it
/// finishes (or shipped with an imported checkpoint).
pub const RECORD_FILE: &str = "train.json";

/// File name of the saved state of a training run, written with every checkpoint.
pub const STATE_FILE: &str = "train_state.json";

/// The task a model is trained on. Its name (`sraven`, `logic`, `induction`) is the `task` of
/// `train.json` and `train_state.json` and the value of the CLI's `--task`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum Task {
    /// SRAVEN (`docs/spec/sraven.md`): 4-way softmax cross-entropy at the last 4 positions.
    Sraven,
    /// The fuzzy-logic task (`docs/spec/sraven.md`, last section): MSE at the last position, R².
    Logic,
    /// Next-token prediction on the tasks crate's induction corpus with a causal token model
    /// (`docs/spec/circuits.md`).
    Induction,
}

impl Task {
    /// Every task, in CLI order.
    pub const ALL: [Task; 3] = [Task::Sraven, Task::Logic, Task::Induction];

    /// The name (`sraven`, `logic`, `induction`), as in the run files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Task::Sraven => "sraven",
            Task::Logic => "logic",
            Task::Induction => "induction",
        }
    }

    /// The short name of the task's metric in column names of `metrics.csv` (`id_acc`,
    /// `ood_r2`): `r2` for logic, `acc` otherwise.
    pub fn metric_label(self) -> &'static str {
        match self {
            Task::Logic => "r2",
            Task::Sraven | Task::Induction => "acc",
        }
    }

    /// What the task's metric holds (the `metric` of `train.json`, and what the metric columns of
    /// `metrics.csv` hold).
    pub fn metric_name(self) -> &'static str {
        match self {
            Task::Sraven => "accuracy (all features right)",
            Task::Logic => "R^2 (mean over sequences)",
            Task::Induction => "next-token accuracy",
        }
    }

    /// The task's evaluation sets beyond ID and OOD, as `(key, prefix)`: the key of the set in a
    /// training evaluation's `extra` (in `train.json`) and the prefix of its columns in
    /// `metrics.csv` (logic: the pairs of unknown terms; induction: the corpus positions only
    /// induction predicts).
    pub fn extra_sets(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Task::Sraven => &[],
            Task::Logic => &[("unknown_terms", "unknown")],
            Task::Induction => &[("induction_positions", "induction")],
        }
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Task {
    type Err = ModelError;

    /// Parses `sraven`, `logic` or `induction`.
    ///
    /// # Errors
    /// [`ModelError::UnknownTask`] for anything else.
    fn from_str(s: &str) -> Result<Self> {
        Task::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| ModelError::UnknownTask(s.to_string()))
    }
}

impl TryFrom<String> for Task {
    type Error = ModelError;

    /// As [`Task::from_str`] (how the run files' `task` is read).
    ///
    /// # Errors
    /// [`ModelError::UnknownTask`] for a name that is not a task's.
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

/// How far a checkpoint was trained, in optimiser updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    /// Updates done.
    pub done: u64,
    /// The length of the run's schedule, when known: `settings.steps` of `train_state.json`,
    /// else `planned_steps` of `train.json`, else its `steps` (a `train.json` is the record of a
    /// run that finished its schedule); never less than `done`.
    pub planned: Option<u64>,
}

impl Steps {
    /// Whether the run stopped before the end of its schedule.
    pub fn stopped_early(self) -> bool {
        self.planned.is_some_and(|p| p > self.done)
    }
}

/// What a checkpoint's run files (`train.json`, else `train_state.json`) record about how it was
/// trained. Every field is `None` when not recorded: an imported checkpoint may have no run files
/// at all, and its `train.json` names no task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunRecord {
    /// The task (`task` of `train.json`, else of the settings in `train_state.json`).
    pub task: Option<Task>,
    /// The split (`split` of `train.json`, else of the settings in `train_state.json`), read
    /// by its one parser ([`SplitName`]'s).
    pub split: Option<SplitName>,
    /// Who trained an imported checkpoint (`trained_by` of `train.json`).
    pub trained_by: Option<String>,
    /// Updates done (`step` of `train_state.json`, else `steps` of `train.json`) and planned.
    pub steps: Option<Steps>,
}

/// The fields of `train.json` that [`RunRecord`] reads (the file holds more).
#[derive(Deserialize)]
struct RecordFields {
    task: Option<Task>,
    split: Option<SplitName>,
    trained_by: Option<String>,
    steps: Option<u64>,
    planned_steps: Option<u64>,
}

/// The fields of `train_state.json` that [`RunRecord`] reads.
#[derive(Deserialize)]
struct StateFields {
    step: Option<u64>,
    settings: Option<SettingsFields>,
}

/// The fields of the settings in `train_state.json` that [`RunRecord`] reads.
#[derive(Deserialize)]
struct SettingsFields {
    task: Option<Task>,
    split: Option<SplitName>,
    steps: Option<u64>,
}

/// Parses the run file `name` of `dir` as `T`; `None` when the file does not exist. The file is
/// read only when it is a regular file (`hyperlens_io::read_regular_string`).
fn run_file<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>> {
    let path = dir.join(name);
    let text = match hyperlens_io::read_regular_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ModelError::Io { path, source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| ModelError::Json { path, source })
}

impl RunRecord {
    /// Reads `train.json` and `train_state.json` of the checkpoint directory `dir`; a missing file
    /// records nothing.
    ///
    /// # Errors
    /// [`ModelError::Io`] naming a run file that exists but is not a regular file or cannot be
    /// read; [`ModelError::Json`] naming a run file that is not JSON, or whose fields have the
    /// wrong type or an unknown task name.
    pub fn read(dir: &Path) -> Result<RunRecord> {
        let record: Option<RecordFields> = run_file(dir, RECORD_FILE)?;
        let state: Option<StateFields> = run_file(dir, STATE_FILE)?;
        let (step, settings) = state.map_or((None, None), |s| (s.step, s.settings));
        let (record_task, record_split, trained_by, record_steps, record_planned) = record
            .map_or((None, None, None, None, None), |r| {
                (r.task, r.split, r.trained_by, r.steps, r.planned_steps)
            });
        let (settings_task, settings_split, settings_steps) =
            settings.map_or((None, None, None), |s| (s.task, s.split, s.steps));
        let done = step.or(record_steps);
        let planned = settings_steps.or(record_planned).or(record_steps);
        Ok(RunRecord {
            task: record_task.or(settings_task),
            split: record_split.or(settings_split),
            trained_by,
            steps: done.map(|done| Steps {
                done,
                planned: planned.map(|p| p.max(done)),
            }),
        })
    }

    /// The task, [`Task::Sraven`] when the run files name none (the imported paper checkpoints,
    /// which are SRAVEN models).
    pub fn task_or_sraven(&self) -> Task {
        self.task.unwrap_or(Task::Sraven)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for t in Task::ALL {
            assert_eq!(t.name().parse::<Task>().unwrap(), t);
            assert_eq!(t.to_string(), t.name());
            assert_eq!(
                serde_json::to_string(&t).unwrap(),
                format!("\"{}\"", t.name())
            );
            assert_eq!(
                serde_json::from_str::<Task>(&format!("\"{t}\"")).unwrap(),
                t
            );
        }
        let e = "raven".parse::<Task>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown task `raven` (expected sraven, logic or induction)"
        );
        assert!(serde_json::from_str::<Task>("\"Logic\"").is_err());
    }

    #[test]
    fn steps_come_from_the_run_files() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(RunRecord::read(dir.path()).unwrap(), RunRecord::default());
        std::fs::write(
            dir.path().join(RECORD_FILE),
            r#"{"steps": 30000, "planned_steps": 48000, "split": "paper-seed1", "task": "sraven"}"#,
        )
        .unwrap();
        let info = RunRecord::read(dir.path()).unwrap();
        assert_eq!(
            info.steps,
            Some(Steps {
                done: 30_000,
                planned: Some(48_000)
            })
        );
        assert!(info.steps.unwrap().stopped_early());
        assert_eq!(info.split, Some(SplitName::Paper(1)));
        assert_eq!(info.task, Some(Task::Sraven));
        // A finished record: the schedule is the steps done.
        std::fs::write(dir.path().join(RECORD_FILE), r#"{"steps": 156250}"#).unwrap();
        let info = RunRecord::read(dir.path()).unwrap();
        let st = info.steps.unwrap();
        assert_eq!(st.planned, Some(156_250));
        assert!(!st.stopped_early());
        assert_eq!(info.task, None);
        assert_eq!(info.task_or_sraven(), Task::Sraven);
        // A run in progress: train_state.json has the step and the schedule.
        std::fs::remove_file(dir.path().join(RECORD_FILE)).unwrap();
        std::fs::write(
            dir.path().join(STATE_FILE),
            r#"{"step": 500, "settings": {"steps": 2000, "split": "seed3", "task": "logic"}}"#,
        )
        .unwrap();
        let info = RunRecord::read(dir.path()).unwrap();
        assert_eq!(
            info,
            RunRecord {
                task: Some(Task::Logic),
                split: Some(SplitName::Seed(3)),
                trained_by: None,
                steps: Some(Steps {
                    done: 500,
                    planned: Some(2000)
                }),
            }
        );
    }

    #[test]
    fn imported_records_name_who_trained_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(RECORD_FILE),
            r#"{"trained_by": "the paper's JAX code", "method": "linear_hypatt",
                "split": "paper-seed2", "steps": 156250, "batch": 128}"#,
        )
        .unwrap();
        let info = RunRecord::read(dir.path()).unwrap();
        assert_eq!(info.trained_by.as_deref(), Some("the paper's JAX code"));
        assert_eq!(
            info.split.map(|s| s.to_string()).as_deref(),
            Some("paper-seed2")
        );
        assert_eq!(info.task, None);
    }

    #[test]
    fn bad_run_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join(RECORD_FILE);
        std::fs::write(&record, r#"{"task": "raven", "steps": 3}"#).unwrap();
        let e = RunRecord::read(dir.path()).unwrap_err();
        assert!(
            matches!(&e, ModelError::Json { path, .. } if *path == record),
            "{e}"
        );
        let cause = std::error::Error::source(&e).unwrap().to_string();
        assert!(cause.contains("unknown task `raven`"), "{cause}");
        std::fs::write(&record, r#"{"split": "paper-seed7", "steps": 3}"#).unwrap();
        let e = RunRecord::read(dir.path()).unwrap_err();
        assert!(
            matches!(&e, ModelError::Json { path, .. } if *path == record),
            "{e}"
        );
        std::fs::write(&record, "{not json").unwrap();
        assert!(matches!(
            RunRecord::read(dir.path()),
            Err(ModelError::Json { path, .. }) if path == record
        ));
        std::fs::write(&record, r#"{"steps": "many"}"#).unwrap();
        assert!(matches!(
            RunRecord::read(dir.path()),
            Err(ModelError::Json { path, .. }) if path == record
        ));
        // A state file that is not a regular file is not read.
        std::fs::remove_file(&record).unwrap();
        let state = dir.path().join(STATE_FILE);
        std::fs::create_dir(&state).unwrap();
        assert!(matches!(
            RunRecord::read(dir.path()),
            Err(ModelError::Io { path, .. }) if path == state
        ));
    }
}
