//! The state of a sweep on disk: where and how each job ran (`jobs/<index>.json`), the lock a
//! running job holds (`jobs/<index>.lock`), and each run's state read from its run directory.
//!
//! A run is `finished` when its `train.json` exists, `failed` when its `failed.json` exists (it
//! diverged) or its job's last record says the job failed before the run finished, `running` while
//! a process holds its job's lock, `interrupted` when it has a checkpoint (or a job record) but no
//! process runs it, and `pending` otherwise. Locks are advisory file locks
//! ([`std::fs::File::try_lock`]), released by the operating system when the holder dies, so a
//! killed job never looks like a running one.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use hyperlens_model::RunRecord;
use hyperlens_train::metrics::{read_metrics, METRICS_FILE};
use hyperlens_train::state::{FailedRecord, RECORD_FILE};
use serde::{Deserialize, Serialize};

use crate::error::{Result, SweepError};
use crate::plan::{Plan, PlannedRun};

/// Directory of the job records and locks in a sweep directory.
pub const JOBS_DIR: &str = "jobs";
/// Directory of the jobs' output in a sweep directory.
pub const LOGS_DIR: &str = "logs";

/// Where a job ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "executor", rename_all = "snake_case")]
pub enum Executor {
    /// On a machine by `hyperlens sweep run` (or `run-one` by hand).
    Local {
        /// Host name.
        host: String,
        /// Process id of the job's process.
        pid: u32,
    },
    /// As a task of a Slurm job array.
    Slurm {
        /// The array's job id (`SLURM_ARRAY_JOB_ID`).
        job_id: String,
        /// The task id (`SLURM_ARRAY_TASK_ID`).
        task_id: String,
        /// The node it ran on.
        host: String,
    },
}

impl Executor {
    /// This process: a Slurm array task when the Slurm variables say so, else local.
    pub fn current() -> Executor {
        let host = hostname();
        match (
            std::env::var("SLURM_ARRAY_JOB_ID").or_else(|_| std::env::var("SLURM_JOB_ID")),
            std::env::var("SLURM_ARRAY_TASK_ID"),
        ) {
            (Ok(job_id), Ok(task_id)) => Executor::Slurm {
                job_id,
                task_id,
                host,
            },
            _ => Executor::Local {
                host,
                pid: std::process::id(),
            },
        }
    }

    /// `local pid 123 on host` or `slurm 45_2 on node`.
    pub fn describe(&self) -> String {
        match self {
            Executor::Local { host, pid } => format!("local pid {pid} on {host}"),
            Executor::Slurm {
                job_id,
                task_id,
                host,
            } => format!("slurm {job_id}_{task_id} on {host}"),
        }
    }
}

/// The machine's host name (`/proc/sys/kernel/hostname`, else `HOSTNAME`, else `unknown`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// How a job's last attempt went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Started and not ended (or killed: then its lock is free).
    Running,
    /// Every run of the job finished.
    Finished,
    /// The job ended with an error (see `error`).
    Failed,
}

/// The record of a job's last attempt, `jobs/<index>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's index.
    pub index: usize,
    /// Where it ran.
    #[serde(flatten)]
    pub executor: Executor,
    /// How it went.
    pub status: JobStatus,
    /// Start, seconds since the Unix epoch.
    pub started_unix: u64,
    /// End, if it ended.
    pub ended_unix: Option<u64>,
    /// The error that ended it, if it failed.
    pub error: Option<String>,
    /// Attempts so far (1 for the first).
    pub attempt: u32,
}

impl JobRecord {
    /// The record file of job `index` in the sweep directory `dir`.
    pub fn path(dir: &Path, index: usize) -> PathBuf {
        dir.join(JOBS_DIR).join(format!("{index}.json"))
    }

    /// Reads the record of job `index`, if there is one.
    ///
    /// # Errors
    /// [`SweepError::Plan`] naming the file if it is not a regular file (a FIFO is refused, not
    /// waited on), is not a job record, or is the record of another job.
    pub fn read(dir: &Path, index: usize) -> Result<Option<JobRecord>> {
        let path = JobRecord::path(dir, index);
        let bytes = match hyperlens_io::read_regular(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(SweepError::Plan(format!(
                    "{}: cannot be read: {e}",
                    path.display()
                )))
            }
        };
        let record: JobRecord = serde_json::from_slice(&bytes).map_err(|e| {
            SweepError::Plan(format!(
                "{}: not a job record ({e}); remove it to start the job's record afresh",
                path.display()
            ))
        })?;
        if record.index != index {
            return Err(SweepError::Plan(format!(
                "{}: the record of job {} in the file of job {index}; remove it to start the \
                 job's record afresh",
                path.display(),
                record.index
            )));
        }
        Ok(Some(record))
    }

    /// Writes the record atomically.
    ///
    /// # Errors
    /// Write errors, naming the file.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir.join(JOBS_DIR)).map_err(SweepError::io(dir))?;
        hyperlens_io::write_json(&JobRecord::path(dir, self.index), self)?;
        Ok(())
    }
}

/// The lock of a job, held while a process runs it (released when dropped or when the process
/// dies).
#[derive(Debug)]
pub struct JobLock {
    _file: File,
}

impl JobLock {
    /// Takes the lock of job `index` without waiting.
    ///
    /// # Errors
    /// [`SweepError::Busy`] if another process holds it; [`SweepError::Plan`] if the lock's path
    /// is not a regular file (a FIFO, a directory); I/O errors naming the lock file.
    pub fn acquire(dir: &Path, index: usize) -> Result<JobLock> {
        let jobs = dir.join(JOBS_DIR);
        std::fs::create_dir_all(&jobs).map_err(SweepError::io(&jobs))?;
        let path = jobs.join(format!("{index}.lock"));
        // Opening a FIFO for writing waits for a reader: refuse anything but a regular file.
        if hyperlens_io::is_special(&path) {
            return Err(not_a_lock(&path));
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(SweepError::io(&path))?;
        match file.try_lock() {
            Ok(()) => Ok(JobLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(SweepError::Busy(format!(
                "job {index} is running in another process (it holds {})",
                path.display()
            ))),
            Err(std::fs::TryLockError::Error(e)) => Err(SweepError::Io {
                path: path.display().to_string(),
                source: e,
            }),
        }
    }

    /// Whether some process holds the lock of job `index` now.
    ///
    /// # Errors
    /// [`SweepError::Plan`] if the lock's path is not a regular file (opening a FIFO would wait
    /// for ever).
    pub fn is_held(dir: &Path, index: usize) -> Result<bool> {
        let path = dir.join(JOBS_DIR).join(format!("{index}.lock"));
        if hyperlens_io::is_special(&path) {
            return Err(not_a_lock(&path));
        }
        let Ok(file) = File::open(&path) else {
            return Ok(false);
        };
        Ok(matches!(
            file.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ))
    }
}

/// The error for a lock path that holds something other than a regular file.
fn not_a_lock(path: &Path) -> SweepError {
    SweepError::Plan(format!(
        "{}: a job lock must be a regular file, this is not (remove it)",
        path.display()
    ))
}

/// The state of one run (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Not started.
    Pending,
    /// A process runs its job now.
    Running,
    /// Started, not finished, and no process runs it: the next `sweep run` resumes it.
    Interrupted,
    /// Its `train.json` exists.
    Finished,
    /// It diverged, or its job failed before it finished.
    Failed,
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RunState::Pending => "pending",
            RunState::Running => "running",
            RunState::Interrupted => "interrupted",
            RunState::Finished => "finished",
            RunState::Failed => "failed",
        })
    }
}

/// The last evaluation of a run, from its `metrics.csv`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LastEval {
    /// The step of the evaluation.
    pub step: u64,
    /// The ID metric (accuracy, or R² for the logic task).
    pub id: Option<f64>,
    /// The OOD metric.
    pub ood: Option<f64>,
}

/// What `sweep status` shows of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    /// The run's name.
    pub name: String,
    /// Its job.
    pub job: usize,
    /// Its state.
    pub state: RunState,
    /// Updates done (of its last checkpoint), if any.
    pub step: Option<u64>,
    /// Updates planned, if known (its settings).
    pub planned: Option<u64>,
    /// Its last evaluation, if any.
    pub last_eval: Option<LastEval>,
    /// Where its job ran last, if it ran.
    pub ran: Option<String>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// Whether `path` is a regular file (not a link, a FIFO or a directory).
fn is_regular(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// The state of `run` of the sweep in `dir`.
///
/// # Errors
/// As [`JobRecord::read`] and [`JobLock::is_held`].
pub fn run_status(dir: &Path, run: &PlannedRun) -> Result<RunStatus> {
    let rd = Plan::run_dir(dir, &run.name);
    let record = JobRecord::read(dir, run.job)?;
    let held = JobLock::is_held(dir, run.job)?;
    Ok(status_of(&rd, run, record, held))
}

/// The state of `run`, whose directory is `rd`, given its job's record and whether its job's
/// lock is held.
fn status_of(rd: &Path, run: &PlannedRun, record: Option<JobRecord>, held: bool) -> RunStatus {
    // The run files, read as their readers read them: a damaged file only shows as missing here
    // (`train` checks a run's own files when it resumes).
    let files = RunRecord::read(rd).ok();
    let finished = files.is_some() && is_regular(&rd.join(RECORD_FILE));
    let failed = FailedRecord::read(rd).ok().flatten();
    let steps = files.and_then(|f| f.steps);
    let step = steps.map(|s| s.done);
    let planned = steps
        .and_then(|s| s.planned)
        .or_else(|| run.arg("steps").and_then(|v| v.as_f64()).map(|v| v as u64));
    let last_eval = read_metrics(&rd.join(METRICS_FILE)).ok().and_then(|rows| {
        rows.iter()
            .rev()
            .find(|r| r.ood_acc.is_some() || r.id_acc.is_some())
            .map(|r| LastEval {
                step: r.step,
                id: r.id_acc,
                ood: r.ood_acc,
            })
    });
    let mut error = None;
    let state = if finished {
        RunState::Finished
    } else if let Some(f) = failed {
        error = Some(f.error);
        RunState::Failed
    } else if held {
        RunState::Running
    } else if let Some(r) = record.as_ref().filter(|r| r.status == JobStatus::Failed) {
        error.clone_from(&r.error);
        RunState::Failed
    } else if step.is_some() || record.is_some() || rd.exists() {
        RunState::Interrupted
    } else {
        RunState::Pending
    };
    RunStatus {
        name: run.name.clone(),
        job: run.job,
        state,
        step,
        planned,
        last_eval,
        ran: record.map(|r| r.executor.describe()),
        error,
    }
}

/// Each job's record and whether its lock is held, read once per job.
///
/// # Errors
/// As [`run_status`].
fn job_states(dir: &Path, plan: &Plan) -> Result<Vec<(Option<JobRecord>, bool)>> {
    plan.jobs
        .iter()
        .map(|j| {
            Ok((
                JobRecord::read(dir, j.index)?,
                JobLock::is_held(dir, j.index)?,
            ))
        })
        .collect()
}

/// The state of every run of `plan` given its jobs' states ([`job_states`]).
fn statuses(dir: &Path, plan: &Plan, jobs: &[(Option<JobRecord>, bool)]) -> Vec<RunStatus> {
    plan.runs
        .iter()
        .map(|r| {
            let (record, held) = &jobs[r.job];
            status_of(&Plan::run_dir(dir, &r.name), r, record.clone(), *held)
        })
        .collect()
}

/// The state of every run of the sweep in `dir`, in plan order (each job's record and lock read
/// once).
///
/// # Errors
/// As [`run_status`].
pub fn sweep_status(dir: &Path, plan: &Plan) -> Result<Vec<RunStatus>> {
    Ok(statuses(dir, plan, &job_states(dir, plan)?))
}

/// The jobs of `plan` that still have work: some run neither finished nor failed (with
/// `retry_failed`, failed runs count as work too), and no process holds the job's lock. Linear
/// in the number of runs; each job's record and lock are read once.
///
/// # Errors
/// As [`run_status`].
pub fn jobs_to_run(dir: &Path, plan: &Plan, retry_failed: bool) -> Result<Vec<usize>> {
    let jobs = job_states(dir, plan)?;
    let mut work = vec![false; plan.jobs.len()];
    for s in statuses(dir, plan, &jobs) {
        let todo = match s.state {
            RunState::Finished | RunState::Running => false,
            RunState::Failed => retry_failed,
            RunState::Pending | RunState::Interrupted => true,
        };
        work[s.job] |= todo;
    }
    Ok(plan
        .jobs
        .iter()
        .filter(|j| work[j.index] && !jobs[j.index].1)
        .map(|j| j.index)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SweepSpec;

    #[test]
    fn run_states_follow_the_run_files_and_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let spec =
            SweepSpec::parse("[axes]\nseed = [0, 1]\n[sweep]\nbatch = false\n", "s").unwrap();
        let plan = Plan::expand("t", &spec).unwrap();
        plan.write(d, "").unwrap();
        let states = |d: &Path| -> Vec<RunState> {
            sweep_status(d, &plan)
                .unwrap()
                .iter()
                .map(|s| s.state)
                .collect()
        };
        assert_eq!(states(d), [RunState::Pending, RunState::Pending]);
        assert_eq!(jobs_to_run(d, &plan, false).unwrap(), [0, 1]);
        // Job 0 runs: its lock is held.
        let lock = JobLock::acquire(d, 0).unwrap();
        assert!(JobLock::acquire(d, 0)
            .unwrap_err()
            .to_string()
            .contains("job 0 is running"));
        JobRecord {
            index: 0,
            executor: Executor::current(),
            status: JobStatus::Running,
            started_unix: now_unix(),
            ended_unix: None,
            error: None,
            attempt: 1,
        }
        .write(d)
        .unwrap();
        assert_eq!(states(d)[0], RunState::Running);
        assert_eq!(jobs_to_run(d, &plan, false).unwrap(), [1]);
        // Killed: the lock is free, the record still says running.
        drop(lock);
        assert_eq!(states(d)[0], RunState::Interrupted);
        // Run 1 finished, run 0 failed.
        let r1 = Plan::run_dir(d, "seed-1");
        std::fs::create_dir_all(&r1).unwrap();
        std::fs::write(r1.join(RECORD_FILE), r#"{"steps": 40}"#).unwrap();
        let r0 = Plan::run_dir(d, "seed-0");
        std::fs::create_dir_all(&r0).unwrap();
        FailedRecord {
            error: "diverged at step 3".into(),
            last_checkpoint_step: 2,
            step: 3,
        }
        .write(&r0)
        .unwrap();
        let s = sweep_status(d, &plan).unwrap();
        assert_eq!(
            (s[0].state, s[1].state),
            (RunState::Failed, RunState::Finished)
        );
        assert_eq!(s[0].error.as_deref(), Some("diverged at step 3"));
        assert_eq!(s[1].step, Some(40));
        assert!(jobs_to_run(d, &plan, false).unwrap().is_empty());
        assert_eq!(jobs_to_run(d, &plan, true).unwrap(), [0]);
    }
}
