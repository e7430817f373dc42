//! Which checkpoints the report analyses (SRAVEN and fuzzy-logic ones), and what their run files
//! say about them: the task, split and length of training (`train.json`, `train_state.json`) and
//! the training log (`metrics.csv`).

use std::path::{Path, PathBuf};

use hyperlens_model::checkpoint::CONFIG_FILE;
use hyperlens_train::metrics::{read_metrics, MetricsRow, METRICS_FILE};
use hyperlens_train::state::{RECORD_FILE, STATE_FILE};

use crate::error::{ReportError, Result};

/// Checkpoints left out of the report, each with the task its `train.json` names.
pub type Skipped = Vec<(PathBuf, String)>;

/// The checkpoints the report analyses, by task.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovered {
    /// SRAVEN checkpoints (and checkpoints whose run files name no task: imported ones).
    pub sraven: Vec<PathBuf>,
    /// Fuzzy-logic checkpoints.
    pub logic: Vec<PathBuf>,
    /// Checkpoints of other tasks (the induction token models), with their task.
    pub skipped: Skipped,
}

impl Discovered {
    /// Checkpoints analysed, of both tasks.
    pub fn len(&self) -> usize {
        self.sraven.len() + self.logic.len()
    }

    /// Whether no checkpoint is analysed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Files `path` under the task its run files name.
    fn push(&mut self, path: PathBuf, given: bool) -> Result<()> {
        match RunInfo::read(&path).task.as_deref() {
            None | Some("sraven") => self.sraven.push(path),
            Some("logic") => self.logic.push(path),
            Some(task) if given => {
                return Err(ReportError::Unsupported {
                    dir: path,
                    reason: format!(
                        "a {task} checkpoint (train.json); the report analyses SRAVEN and \
                         fuzzy-logic checkpoints"
                    ),
                })
            }
            Some(task) => self.skipped.push((path, task.to_string())),
        }
        Ok(())
    }
}

/// The checkpoints to analyse: `given` (each refused by name if its `train.json` names a task
/// other than SRAVEN or logic; a group directory of `hyperlens train --seeds`, with its
/// `group.json`, stands for its runs), or, when `given` is empty, every directory with a
/// `config.json` under `root`, sorted by path, leaving out checkpoints of other tasks.
///
/// # Errors
/// [`ReportError::Unsupported`] for a given checkpoint of another task, a malformed `group.json`,
/// or two given checkpoints with one name (their files would collide);
/// [`ReportError::NoCheckpoint`] if `root` cannot be listed or holds no checkpoint of either task.
pub fn checkpoints(given: &[PathBuf], root: &Path) -> Result<Discovered> {
    let mut found = Discovered::default();
    if !given.is_empty() {
        let mut expanded = Vec::with_capacity(given.len());
        for dir in given {
            if dir.join(CONFIG_FILE).is_file() {
                expanded.push(dir.clone());
                continue;
            }
            match hyperlens_train::GroupFile::read(dir) {
                Ok(Some(group)) => expanded.extend(group.runs.iter().map(|n| dir.join(n))),
                Ok(None) => expanded.push(dir.clone()),
                Err(e) => {
                    return Err(ReportError::Unsupported {
                        dir: dir.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
        for (i, dir) in expanded.iter().enumerate() {
            if let Some(other) = expanded[..i].iter().find(|o| name_of(o) == name_of(dir)) {
                return Err(ReportError::Unsupported {
                    dir: dir.clone(),
                    reason: format!(
                        "has the name `{}` of {} too (report files are named by checkpoint)",
                        name_of(dir),
                        other.display()
                    ),
                });
            }
        }
        for dir in expanded {
            found.push(dir, true)?;
        }
        return Ok(found);
    }
    let entries = std::fs::read_dir(root).map_err(|_| ReportError::NoCheckpoint {
        root: root.to_path_buf(),
    })?;
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join(CONFIG_FILE).is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        found.push(dir, false)?;
    }
    if found.is_empty() {
        return Err(ReportError::NoCheckpoint {
            root: root.to_path_buf(),
        });
    }
    Ok(found)
}

/// The name of a checkpoint: its directory name.
pub fn name_of(dir: &Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// How far a checkpoint was trained, in optimiser updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    /// Updates done.
    pub done: u64,
    /// The length of the run's schedule, when known: `settings.steps` of `train_state.json`,
    /// else `planned_steps` of `train.json`, else its `steps` (a `train.json` is the record of a
    /// run that finished its schedule).
    pub planned: Option<u64>,
}

impl Steps {
    /// Whether the run stopped before the end of its schedule.
    pub fn stopped_early(self) -> bool {
        self.planned.is_some_and(|p| p > self.done)
    }
}

/// What a checkpoint's run files say; every field is `None` when not recorded (an imported
/// checkpoint may have no run files at all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunInfo {
    /// `task` of `train.json` (`sraven`, `logic`, ...).
    pub task: Option<String>,
    /// `split` of `train.json` (`train_state.json`'s settings otherwise).
    pub split: Option<String>,
    /// `trained_by` of `train.json` (who trained an imported checkpoint).
    pub trained_by: Option<String>,
    /// Updates done and planned.
    pub steps: Option<Steps>,
}

/// A JSON file of a checkpoint, if present and valid.
fn json_file(dir: &Path, name: &str) -> Option<serde_json::Value> {
    std::fs::read(dir.join(name))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
}

fn str_field(v: Option<&serde_json::Value>, key: &str) -> Option<String> {
    v.and_then(|v| v.get(key))
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
}

fn u64_field(v: Option<&serde_json::Value>, key: &str) -> Option<u64> {
    v.and_then(|v| v.get(key))
        .and_then(serde_json::Value::as_u64)
}

impl RunInfo {
    /// Reads `train.json` and `train_state.json` of `dir`; unreadable or missing files count as
    /// not recorded.
    pub fn read(dir: &Path) -> Self {
        let record = json_file(dir, RECORD_FILE);
        let state = json_file(dir, STATE_FILE);
        let settings = state.as_ref().and_then(|s| s.get("settings"));
        let done =
            u64_field(state.as_ref(), "step").or_else(|| u64_field(record.as_ref(), "steps"));
        let planned = u64_field(settings, "steps")
            .or_else(|| u64_field(record.as_ref(), "planned_steps"))
            .or_else(|| u64_field(record.as_ref(), "steps"));
        Self {
            task: str_field(record.as_ref(), "task").or_else(|| str_field(settings, "task")),
            split: str_field(record.as_ref(), "split").or_else(|| str_field(settings, "split")),
            trained_by: str_field(record.as_ref(), "trained_by"),
            steps: done.map(|done| Steps {
                done,
                planned: planned.map(|p| p.max(done)),
            }),
        }
    }
}

/// Where a checkpoint's training curves come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Training {
    /// The rows of its `metrics.csv` (a hyperlens training run).
    Log(Vec<MetricsRow>),
    /// No `metrics.csv`; `trained_by` from `train.json` if it says.
    Missing {
        /// Who trained the checkpoint.
        trained_by: Option<String>,
    },
}

/// The training log of a checkpoint: its `metrics.csv` read with the train crate's reader.
///
/// # Errors
/// A `metrics.csv` that exists but cannot be read or parsed ([`ReportError::Train`], naming it).
pub fn training_of(dir: &Path, info: &RunInfo) -> Result<Training> {
    let path = dir.join(METRICS_FILE);
    if path.is_file() {
        return Ok(Training::Log(read_metrics(&path)?));
    }
    Ok(Training::Missing {
        trained_by: info.trained_by.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_come_from_the_run_files() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(RunInfo::read(dir.path()), RunInfo::default());
        std::fs::write(
            dir.path().join(RECORD_FILE),
            r#"{"steps": 30000, "planned_steps": 48000, "split": "paper-seed1", "task": "sraven"}"#,
        )
        .unwrap();
        let info = RunInfo::read(dir.path());
        assert_eq!(
            info.steps,
            Some(Steps {
                done: 30_000,
                planned: Some(48_000)
            })
        );
        assert!(info.steps.unwrap().stopped_early());
        assert_eq!(info.split.as_deref(), Some("paper-seed1"));
        // A finished record: the schedule is the steps done.
        std::fs::write(dir.path().join(RECORD_FILE), r#"{"steps": 156250}"#).unwrap();
        let st = RunInfo::read(dir.path()).steps.unwrap();
        assert_eq!(st.planned, Some(156_250));
        assert!(!st.stopped_early());
        // A run in progress: train_state.json has the step and the schedule.
        std::fs::remove_file(dir.path().join(RECORD_FILE)).unwrap();
        std::fs::write(
            dir.path().join(STATE_FILE),
            r#"{"step": 500, "settings": {"steps": 2000, "split": "seed3", "task": "sraven"}}"#,
        )
        .unwrap();
        let info = RunInfo::read(dir.path());
        assert_eq!(
            info.steps,
            Some(Steps {
                done: 500,
                planned: Some(2000)
            })
        );
        assert_eq!(info.split.as_deref(), Some("seed3"));
    }

    #[test]
    fn discovery_skips_other_tasks_and_refuses_them_by_name() {
        let root = tempfile::tempdir().unwrap();
        for (name, task) in [
            ("b", "sraven"),
            ("a", "induction"),
            ("c", ""),
            ("d", "logic"),
        ] {
            let d = root.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join(CONFIG_FILE), "{}").unwrap();
            if !task.is_empty() {
                std::fs::write(d.join(RECORD_FILE), format!(r#"{{"task": "{task}"}}"#)).unwrap();
            }
        }
        std::fs::create_dir(root.path().join("not-a-checkpoint")).unwrap();
        let found = checkpoints(&[], root.path()).unwrap();
        let names: Vec<String> = found.sraven.iter().map(|d| name_of(d)).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(found.logic, [root.path().join("d")]);
        assert_eq!(
            found.skipped,
            [(root.path().join("a"), "induction".to_string())]
        );
        let e = checkpoints(&[root.path().join("a")], root.path()).unwrap_err();
        assert!(e.to_string().contains("induction checkpoint"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            checkpoints(&[], empty.path()),
            Err(ReportError::NoCheckpoint { .. })
        ));
    }

    #[test]
    fn a_group_directory_stands_for_its_runs() {
        let root = tempfile::tempdir().unwrap();
        let group = root.path().join("g");
        for name in ["seed-0", "seed-1"] {
            let d = group.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(CONFIG_FILE), "{}").unwrap();
        }
        hyperlens_train::GroupFile {
            combine: hyperlens_train::Combine::Zip,
            runs: vec!["seed-0".into(), "seed-1".into()],
        }
        .write(&group)
        .unwrap();
        let found = checkpoints(std::slice::from_ref(&group), root.path()).unwrap();
        assert_eq!(found.sraven, [group.join("seed-0"), group.join("seed-1")]);
        // The same group twice: two checkpoints called seed-0.
        let e = checkpoints(&[group.clone(), group.clone()], root.path()).unwrap_err();
        assert!(e.to_string().contains("`seed-0`"), "{e}");
    }
}
