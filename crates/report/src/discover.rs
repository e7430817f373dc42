//! Which checkpoints the report analyses (SRAVEN and fuzzy-logic ones), by the task their run
//! files record (the model crate's [`RunRecord`], which also gives the split and length of
//! training), and their training log (`metrics.csv`).

use std::path::{Path, PathBuf};

use hyperlens_model::checkpoint::CONFIG_FILE;
use hyperlens_model::{RunRecord, Task};
use hyperlens_train::metrics::{read_metrics, MetricsRow, METRICS_FILE};

use crate::error::{ReportError, Result};

/// How far a checkpoint was trained (the model crate's, read with its [`RunRecord`]).
pub use hyperlens_model::Steps;

/// Checkpoints left out of the report, each with the task its `train.json` names.
pub type Skipped = Vec<(PathBuf, Task)>;

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
    ///
    /// # Errors
    /// [`ReportError::Unsupported`] for a given checkpoint of another task; the errors of
    /// [`RunRecord::read`] (a run file that cannot be read or parsed, named).
    fn push(&mut self, path: PathBuf, given: bool) -> Result<()> {
        match RunRecord::read(&path)?.task {
            None | Some(Task::Sraven) => self.sraven.push(path),
            Some(Task::Logic) => self.logic.push(path),
            Some(task) if given => {
                return Err(ReportError::Unsupported {
                    dir: path,
                    reason: format!(
                        "a {task} checkpoint (train.json); the report analyses SRAVEN and \
                         fuzzy-logic checkpoints"
                    ),
                })
            }
            Some(task) => self.skipped.push((path, task)),
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
/// [`ReportError::NoCheckpoint`] if `root` cannot be listed or holds no checkpoint of either task;
/// a run file that cannot be read or parsed ([`RunRecord::read`], naming it).
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
pub fn training_of(dir: &Path, info: &RunRecord) -> Result<Training> {
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
                std::fs::write(
                    d.join(hyperlens_model::task::RECORD_FILE),
                    format!(r#"{{"task": "{task}"}}"#),
                )
                .unwrap();
            }
        }
        std::fs::create_dir(root.path().join("not-a-checkpoint")).unwrap();
        let found = checkpoints(&[], root.path()).unwrap();
        let names: Vec<String> = found.sraven.iter().map(|d| name_of(d)).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(found.logic, [root.path().join("d")]);
        assert_eq!(found.skipped, [(root.path().join("a"), Task::Induction)]);
        let e = checkpoints(&[root.path().join("a")], root.path()).unwrap_err();
        assert!(e.to_string().contains("induction checkpoint"), "{e}");
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            checkpoints(&[], empty.path()),
            Err(ReportError::NoCheckpoint { .. })
        ));
        // A run file that names no task of hyperlens: an error naming the file.
        let bad = root.path().join("e");
        std::fs::create_dir(&bad).unwrap();
        std::fs::write(bad.join(CONFIG_FILE), "{}").unwrap();
        let record = bad.join(hyperlens_model::task::RECORD_FILE);
        std::fs::write(&record, r#"{"task": "raven"}"#).unwrap();
        let e = checkpoints(&[], root.path()).unwrap_err();
        assert!(e.to_string().contains(&record.display().to_string()), "{e}");
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
