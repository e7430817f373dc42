//! The two ways a group of runs is set up, shared by `hyperlens train` and `hl.train`: a new group
//! from lists ([`new_group`]: the lists expanded, the directory checked and laid out) and the
//! unfinished runs of an existing group ([`resume_group`]: finished and diverged runs set aside).

use std::path::{Path, PathBuf};

use crate::error::{Result, TrainError};
use crate::group::{Combine, GroupFile, Variation};
use crate::run::{GroupRun, FAILED_FILE};
use crate::settings::TrainSettings;
use crate::state::RECORD_FILE;

/// Why the directory given for a new group cannot hold it ([`TrainError::GroupOut`]).
#[derive(Debug)]
pub enum OutProblem {
    /// It is a file, not a directory.
    File,
    /// It is a directory that already holds something.
    NotEmpty,
    /// Listing it failed.
    Unreadable(std::io::Error),
}

/// Lays out a new group in `out`: `base` with the values of `variation` combined as `combine`
/// ([`Variation::expand`]), then `out` checked to be absent or an empty directory, then created
/// with its `group.json` ([`GroupFile::create`]). Nothing is made before every run checks. Returns
/// the runs, each in `out/<name>`.
///
/// # Errors
/// [`TrainError::InvalidParam`] from the expansion or [`crate::check_group`];
/// [`TrainError::GroupOut`] for an `out` that is a file, not empty, or cannot be listed; I/O
/// errors naming the directory or file.
pub fn new_group(
    out: &Path,
    base: &TrainSettings,
    variation: &Variation,
    combine: Combine,
) -> Result<Vec<GroupRun>> {
    let members = variation.expand(base, combine)?;
    let problem = |problem| TrainError::GroupOut {
        path: out.to_path_buf(),
        problem,
    };
    if out.is_file() {
        return Err(problem(OutProblem::File));
    }
    if out.exists() {
        let mut entries = std::fs::read_dir(out).map_err(|e| problem(OutProblem::Unreadable(e)))?;
        if entries.next().is_some() {
            return Err(problem(OutProblem::NotEmpty));
        }
    }
    GroupFile::create(out, combine, members)
}

/// A run of a group that ended before the group was resumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndedRun {
    /// The run finished: `record` is its `train.json`.
    Complete {
        /// The run's directory name.
        name: String,
        /// Its record file.
        record: PathBuf,
    },
    /// The run diverged: `failed` is its divergence record; it is resumed only alone.
    Diverged {
        /// The run's directory name.
        name: String,
        /// Its divergence record file.
        failed: PathBuf,
    },
}

/// The runs of the group in `out` (its `group.json`) to continue: each run directory that has
/// neither `train.json` nor a divergence record, in the file's order, with the settings that
/// `settings_of(run directory)` gives it (the saved ones, with the front's overrides). Every run
/// that already ended is handed to `on_ended` as it is met. `None` when `out` is not a group.
///
/// # Errors
/// `group.json` unreadable or damaged ([`GroupFile::read`]); a run directory that is a link or
/// not a directory ([`hyperlens_io::real_dir_or_absent`]: a name from the file must not lead
/// out of the group); the errors of `settings_of`.
pub fn resume_group<E>(
    out: &Path,
    mut settings_of: impl FnMut(&Path) -> std::result::Result<TrainSettings, E>,
    mut on_ended: impl FnMut(&EndedRun),
) -> std::result::Result<Option<Vec<GroupRun>>, E>
where
    E: From<TrainError> + From<std::io::Error>,
{
    let Some(file) = GroupFile::read(out)? else {
        return Ok(None);
    };
    let mut runs = Vec::new();
    for name in &file.runs {
        // The names were checked when group.json was read; a link could still lead out.
        let dir = out.join(name);
        hyperlens_io::real_dir_or_absent(&dir)?;
        let record = dir.join(RECORD_FILE);
        if record.exists() {
            on_ended(&EndedRun::Complete {
                name: name.clone(),
                record,
            });
            continue;
        }
        let failed = dir.join(FAILED_FILE);
        if failed.exists() {
            on_ended(&EndedRun::Diverged {
                name: name.clone(),
                failed,
            });
            continue;
        }
        runs.push(GroupRun {
            settings: settings_of(&dir)?,
            out: dir,
        });
    }
    Ok(Some(runs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Task;

    fn base() -> TrainSettings {
        let mut s = TrainSettings::for_task(Task::Logic);
        s.steps = 4;
        s
    }

    fn seeds(v: &[u64]) -> Variation {
        Variation {
            seeds: v.to_vec(),
            ..Variation::default()
        }
    }

    #[test]
    fn a_new_group_is_laid_out_only_in_an_empty_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("g");
        let runs = new_group(&out, &base(), &seeds(&[0, 1]), Combine::Zip).unwrap();
        let names: Vec<_> = runs.iter().map(|r| r.out.clone()).collect();
        assert_eq!(names, vec![out.join("seed-0"), out.join("seed-1")]);
        assert_eq!(runs[1].settings.seed, 1);
        let file = GroupFile::read(&out).unwrap().unwrap();
        assert_eq!(file.runs, vec!["seed-0", "seed-1"]);
        // Now not empty (group.json): refused, naming the directory.
        let e = new_group(&out, &base(), &seeds(&[0, 1]), Combine::Zip).unwrap_err();
        assert!(matches!(
            e,
            TrainError::GroupOut { ref path, problem: OutProblem::NotEmpty } if *path == out
        ));
        let f = tmp.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        let e = new_group(&f, &base(), &seeds(&[0]), Combine::Zip).unwrap_err();
        assert!(matches!(
            e,
            TrainError::GroupOut {
                problem: OutProblem::File,
                ..
            }
        ));
        // A bad list is refused before the directory is looked at.
        let e = new_group(&f, &base(), &Variation::default(), Combine::Zip).unwrap_err();
        assert!(matches!(e, TrainError::InvalidParam(_)), "{e}");
    }

    #[test]
    fn resuming_sets_ended_runs_aside_in_the_files_order() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("g");
        assert!(
            resume_group::<anyhow_like::E>(&out, |_| unreachable!(), |_| {})
                .unwrap()
                .is_none()
        );
        let runs = new_group(&out, &base(), &seeds(&[0, 1, 2]), Combine::Zip).unwrap();
        for r in &runs {
            std::fs::create_dir_all(&r.out).unwrap();
        }
        std::fs::write(runs[0].out.join(RECORD_FILE), b"{}").unwrap();
        std::fs::write(runs[2].out.join(FAILED_FILE), b"{}").unwrap();
        let mut ended = Vec::new();
        let mut asked = Vec::new();
        let left = resume_group::<anyhow_like::E>(
            &out,
            |dir| {
                asked.push(dir.to_path_buf());
                Ok(base())
            },
            |e| ended.push(e.clone()),
        )
        .unwrap()
        .unwrap();
        assert_eq!(asked, vec![runs[1].out.clone()]);
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].out, runs[1].out);
        assert_eq!(
            ended,
            vec![
                EndedRun::Complete {
                    name: "seed-0".into(),
                    record: runs[0].out.join(RECORD_FILE)
                },
                EndedRun::Diverged {
                    name: "seed-2".into(),
                    failed: runs[2].out.join(FAILED_FILE)
                },
            ]
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_run_directory_that_is_a_link_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("g");
        new_group(&out, &base(), &seeds(&[0]), Combine::Zip).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, out.join("seed-0")).unwrap();
        let e = resume_group::<anyhow_like::E>(&out, |_| Ok(base()), |_| {}).unwrap_err();
        assert!(e.0.contains("symbolic link"), "{}", e.0);
    }

    /// An error type of a front: anything `resume_group` can fail with, as text.
    mod anyhow_like {
        #[derive(Debug)]
        pub struct E(pub String);
        impl From<crate::TrainError> for E {
            fn from(e: crate::TrainError) -> E {
                E(e.to_string())
            }
        }
        impl From<std::io::Error> for E {
            fn from(e: std::io::Error) -> E {
                E(e.to_string())
            }
        }
    }
}
