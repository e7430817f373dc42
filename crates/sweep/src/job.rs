//! One job of a sweep, executed: which of its runs still train and from where, in which training
//! sessions (together in one batched model, or one after the other), and the job's record around
//! them (`sweep run-one`, what each process of `sweep run` and each Slurm array task runs).
//!
//! The crate never trains and never parses a run's arguments: the caller hands in both, as
//! closures (`hyperlens sweep run-one` parses them exactly as `hyperlens train` does).

use std::fmt::Display;
use std::path::{Path, PathBuf};

use hyperlens_model::Device;
use hyperlens_train::state::{TrainState, RECORD_FILE};
use hyperlens_train::{GroupRun, RunOptions, TrainSettings, FAILED_FILE};

use crate::error::{Result, SweepError};
use crate::plan::{Plan, PlannedRun, RUNS_DIR};
use crate::state::{now_unix, Executor, JobLock, JobRecord, JobStatus};

/// A run of a job that still trains.
#[derive(Debug, Clone)]
pub struct PendingRun {
    /// Its settings and directory.
    pub run: GroupRun,
    /// The step of its committed checkpoint when it resumes; `None` when it starts afresh.
    pub resume_from: Option<u64>,
    /// The device its arguments name.
    pub device: Device,
}

/// One training session of a job: runs trained together in one batched model.
#[derive(Debug, Clone)]
pub struct Session {
    /// The runs.
    pub runs: Vec<GroupRun>,
    /// The device and whether they resume.
    pub options: RunOptions,
    /// The directory that names the session in messages (the sweep's `runs/` for a whole job,
    /// the run's own directory for a run trained alone).
    pub label: PathBuf,
}

/// What [`run_one`] reports before it trains.
#[derive(Debug, Clone, Copy)]
pub enum JobEvent<'a> {
    /// The job is taken and its attempt recorded.
    Started {
        /// The sweep's name.
        sweep: &'a str,
        /// The job's index.
        index: usize,
        /// Its attempt (1 for the first).
        attempt: u32,
        /// Where it runs.
        executor: &'a Executor,
        /// Its runs' names.
        runs: &'a [String],
    },
    /// Every run of the job is finished: nothing trains.
    AllFinished {
        /// The job's index.
        index: usize,
    },
}

/// The step of the committed checkpoint of the run in `dir`, if it has one: from its
/// `train_state.json` (when its settings can be read back), else from its checkpoint manifest (a
/// run whose state file is damaged still has its checkpoint, and `train --resume` repairs the run
/// directory from it).
///
/// # Errors
/// [`SweepError::Plan`] for a manifest that is present but cannot be read: the run is neither
/// cleared nor trained afresh.
pub fn resumable(dir: &Path) -> Result<Option<u64>> {
    let from_state = || -> Option<u64> {
        hyperlens_train::read_settings(dir).ok()?;
        Some(TrainState::read(dir).ok()?.step)
    };
    if let Some(step) = from_state() {
        return Ok(Some(step));
    }
    let manifest = dir.join(hyperlens_train::checkpoint::MANIFEST_FILE);
    if std::fs::symlink_metadata(&manifest).is_err() {
        return Ok(None);
    }
    match hyperlens_train::checkpoint::read_manifest(dir) {
        Ok(Some((m, _))) => Ok(Some(m.step)),
        Ok(None) => Ok(None),
        Err(e) => Err(SweepError::Plan(format!(
            "{}: the run has a checkpoint manifest that cannot be read ({e}); its work is kept: \
             repair or remove the run's directory",
            dir.display()
        ))),
    }
}

/// The runs of a job of the sweep in `dir` still to train, with whether each resumes: a finished
/// run is left out, a run directory left without a committed checkpoint (killed before its first)
/// is cleared, and a resumed run's stale `failed.json` goes. `settings_of(run, run_dir, resume)`
/// gives a run's settings and device from its arguments.
///
/// # Errors
/// A run directory that is a link or not a directory; the errors of [`resumable`], of clearing a
/// directory and of `settings_of`.
pub fn pending_runs<E, S>(
    dir: &Path,
    runs: &[&PlannedRun],
    mut settings_of: S,
) -> std::result::Result<Vec<PendingRun>, E>
where
    E: From<SweepError>,
    S: FnMut(&PlannedRun, &Path, bool) -> std::result::Result<(TrainSettings, Device), E>,
{
    let mut out = Vec::new();
    for run in runs {
        // The plan's names and `runs/` were checked when it was read (one directory inside
        // `runs/`); a run directory that is a link could still lead out of the sweep.
        let rd = Plan::run_dir(dir, &run.name);
        hyperlens_io::real_dir_or_absent(&rd).map_err(|e| SweepError::Plan(e.to_string()))?;
        if rd.join(RECORD_FILE).exists() {
            continue;
        }
        let step = resumable(&rd)?;
        if step.is_none() && rd.exists() {
            std::fs::remove_dir_all(&rd).map_err(|source| SweepError::Process {
                what: format!("clearing the unstarted run {}", rd.display()),
                source,
            })?;
        }
        if step.is_some() {
            // A retried run that diverged: its failed.json is stale once it resumes.
            let _ = std::fs::remove_file(rd.join(FAILED_FILE));
        }
        let (settings, device) = settings_of(run, &rd, step.is_some())?;
        out.push(PendingRun {
            run: GroupRun { settings, out: rd },
            resume_from: step,
            device,
        });
    }
    Ok(out)
}

/// The training sessions of a job's pending runs in `dir`: one session with all of them when they
/// all start afresh or all resume from the same step, else one per run, in order. The first run's
/// device serves a whole-job session.
pub fn sessions(dir: &Path, todo: Vec<PendingRun>) -> Vec<Session> {
    let Some(first) = todo.first() else {
        return Vec::new();
    };
    let (from, device) = (first.resume_from, first.device);
    if todo.iter().all(|r| r.resume_from == from) {
        return vec![Session {
            runs: todo.into_iter().map(|r| r.run).collect(),
            options: RunOptions {
                device,
                resume: from.is_some(),
            },
            label: dir.join(RUNS_DIR),
        }];
    }
    todo.into_iter()
        .map(|r| Session {
            label: r.run.out.clone(),
            options: RunOptions {
                device: r.device,
                resume: r.resume_from.is_some(),
            },
            runs: vec![r.run],
        })
        .collect()
}

/// Runs job `index` of the sweep in `dir`: takes the job's lock, records the attempt, trains the
/// job's pending runs ([`pending_runs`], [`sessions`]) with `train(runs, options, label)`, and
/// records how it ended (the error's text, with its causes, when it failed).
///
/// # Errors
/// A directory without a valid plan, an index out of range, a job held by another process
/// ([`SweepError::Busy`]), the job's record that cannot be written; the first error of
/// `settings_of`, `train` or `on_event`, after it is recorded.
pub fn run_one<E, S, T, P>(
    dir: &Path,
    index: usize,
    settings_of: S,
    mut train: T,
    mut on_event: P,
) -> std::result::Result<(), E>
where
    E: From<SweepError> + Display,
    S: FnMut(&PlannedRun, &Path, bool) -> std::result::Result<(TrainSettings, Device), E>,
    T: FnMut(&[GroupRun], &RunOptions, &Path) -> std::result::Result<(), E>,
    P: FnMut(JobEvent) -> std::result::Result<(), E>,
{
    let plan = Plan::read(dir)?;
    plan.job_runs(index)?;
    let _lock = JobLock::acquire(dir, index)?;
    let attempt = JobRecord::read(dir, index)?.map_or(1, |r| r.attempt + 1);
    let mut record = JobRecord {
        index,
        executor: Executor::current(),
        status: JobStatus::Running,
        started_unix: now_unix(),
        ended_unix: None,
        error: None,
        attempt,
    };
    record.write(dir)?;
    on_event(JobEvent::Started {
        sweep: &plan.name,
        index,
        attempt,
        executor: &record.executor,
        runs: &plan.jobs[index].runs,
    })?;
    let result = (|| {
        let todo = pending_runs(dir, &plan.job_runs(index)?, settings_of)?;
        if todo.is_empty() {
            return on_event(JobEvent::AllFinished { index });
        }
        for s in sessions(dir, todo) {
            train(&s.runs, &s.options, &s.label)?;
        }
        Ok(())
    })();
    record.ended_unix = Some(now_unix());
    match &result {
        Ok(()) => record.status = JobStatus::Finished,
        Err(e) => {
            record.status = JobStatus::Failed;
            record.error = Some(format!("{e:#}"));
        }
    }
    record.write(dir)?;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperlens_train::Task;

    fn pending(name: &str, from: Option<u64>) -> PendingRun {
        PendingRun {
            run: GroupRun {
                settings: TrainSettings::for_task(Task::Sraven),
                out: PathBuf::from("s/runs").join(name),
            },
            resume_from: from,
            device: Device::Cpu,
        }
    }

    #[test]
    fn runs_at_one_step_train_together_and_others_one_by_one() {
        let dir = Path::new("s");
        assert!(sessions(dir, Vec::new()).is_empty());
        let one = sessions(dir, vec![pending("a", Some(5)), pending("b", Some(5))]);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].runs.len(), 2);
        assert!(one[0].options.resume);
        assert_eq!(one[0].label, dir.join(RUNS_DIR));
        let fresh = sessions(dir, vec![pending("a", None), pending("b", None)]);
        assert_eq!(fresh.len(), 1);
        assert!(!fresh[0].options.resume);
        let split = sessions(dir, vec![pending("a", Some(5)), pending("b", None)]);
        assert_eq!(split.len(), 2);
        assert!(split[0].options.resume && !split[1].options.resume);
        assert_eq!(split[1].label, PathBuf::from("s/runs/b"));
        assert_eq!(split[1].runs[0].out, PathBuf::from("s/runs/b"));
    }

    #[test]
    fn a_run_without_state_or_manifest_starts_afresh_and_a_bad_manifest_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(resumable(dir.path()).unwrap(), None);
        std::fs::write(
            dir.path().join(hyperlens_train::checkpoint::MANIFEST_FILE),
            "not json",
        )
        .unwrap();
        let e = resumable(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("cannot be read") && e.contains("its work is kept"),
            "{e}"
        );
    }
}
