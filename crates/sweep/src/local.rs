//! The local executor (`hyperlens sweep run`): the sweep's unfinished jobs, each run as a child
//! process of the binary (`<exe> sweep run-one DIR --index I`, its output appended to
//! `logs/job-I.log`), at most J at a time, with the CPU threads shared out between them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Result, SweepError};
use crate::plan::Plan;
use crate::state::{
    jobs_to_run, now_unix, sweep_status, JobLock, JobRecord, JobStatus, RunState, LOGS_DIR,
};

/// The settings of [`run_local`].
#[derive(Debug, Clone)]
pub struct LocalParams {
    /// Jobs run at once (at least 1).
    pub jobs: usize,
    /// Also run the jobs of failed runs again.
    pub retry_failed: bool,
    /// The hyperlens binary each job's process runs.
    pub exe: PathBuf,
    /// The CPU threads of each job's process (`RAYON_NUM_THREADS`; see [`threads_per_job`]).
    pub threads: usize,
}

/// What [`run_local`] reports as it goes.
#[derive(Debug, Clone, Copy)]
pub enum LocalEvent<'a> {
    /// The sweep as found, before any job starts.
    Found {
        /// The sweep's name.
        sweep: &'a str,
        /// Its runs.
        runs: usize,
        /// Runs finished, failed, and running in another process.
        finished: usize,
        /// Runs that failed.
        failed: usize,
        /// Runs running in another process.
        running: usize,
        /// Jobs to run now.
        todo: usize,
        /// The sweep's jobs.
        jobs: usize,
    },
    /// Job `index` is held by another process and is skipped, before it started.
    Skipped {
        /// The job.
        index: usize,
    },
    /// Job `index`'s process ended having lost the race for the job's lock: another process
    /// runs the job.
    Lost {
        /// The job.
        index: usize,
    },
    /// Job `index` started.
    Started {
        /// The job.
        index: usize,
        /// Its process id.
        pid: u32,
        /// Its runs' names.
        runs: &'a [String],
        /// Its log file.
        log: &'a Path,
    },
    /// Job `index`'s process ended successfully after `secs` seconds.
    Finished {
        /// The job.
        index: usize,
        /// Seconds it ran.
        secs: f64,
    },
    /// Job `index` failed after `secs` seconds, for the reason `why` (its record's error, else
    /// how its process ended).
    Failed {
        /// The job.
        index: usize,
        /// Seconds it ran.
        secs: f64,
        /// Why.
        why: &'a str,
        /// Its log file.
        log: &'a Path,
    },
}

impl LocalEvent<'_> {
    /// Whether the event ends a job's process (a progress count of jobs done moves on).
    pub fn ends_a_job(&self) -> bool {
        matches!(
            self,
            LocalEvent::Finished { .. } | LocalEvent::Lost { .. } | LocalEvent::Failed { .. }
        )
    }
}

/// What [`run_local`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOutcome {
    /// The sweep's runs.
    pub runs: usize,
    /// Its runs finished at the end.
    pub finished: usize,
    /// The jobs that failed, each as `job I (why)`.
    pub failed: Vec<String>,
}

/// The threads each of `jobs` child processes gets: `total` (the process's threads) shared out,
/// at least 1 each.
pub fn threads_per_job(total: usize, jobs: usize) -> usize {
    (total / jobs.max(1)).max(1)
}

/// A running job.
struct Running {
    index: usize,
    child: Child,
    started: Instant,
}

/// Runs the unfinished jobs of the sweep in `dir` on this machine, `params.jobs` processes at a
/// time, until none is left; a job taken by another process in the meantime is skipped. A job
/// whose process died before recording its end gets its record marked failed. `on_event` hears
/// of each step.
///
/// # Errors
/// [`SweepError::InvalidParam`] for `jobs` 0; a directory without a valid plan; a log file that
/// is a link or not a regular file; a process that cannot be started or waited for; a job record
/// that cannot be read or written. A job that fails is no error here: it is in the outcome.
pub fn run_local(
    dir: &Path,
    params: &LocalParams,
    mut on_event: impl FnMut(LocalEvent),
) -> Result<LocalOutcome> {
    if params.jobs == 0 {
        return Err(SweepError::InvalidParam("--jobs must be at least 1".into()));
    }
    let plan = Plan::read(dir)?;
    let todo = jobs_to_run(dir, &plan, params.retry_failed)?;
    let status = sweep_status(dir, &plan)?;
    let count = |s: RunState| status.iter().filter(|r| r.state == s).count();
    on_event(LocalEvent::Found {
        sweep: &plan.name,
        runs: plan.runs.len(),
        finished: count(RunState::Finished),
        failed: count(RunState::Failed),
        running: count(RunState::Running),
        todo: todo.len(),
        jobs: plan.jobs.len(),
    });
    let logs = dir.join(LOGS_DIR);
    std::fs::create_dir_all(&logs).map_err(|source| SweepError::Process {
        what: format!("creating {}", logs.display()),
        source,
    })?;
    let mut queue = todo.into_iter();
    let mut running: Vec<Running> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    loop {
        while running.len() < params.jobs {
            let Some(index) = queue.next() else { break };
            // Another executor may have taken the job since the queue was made.
            if JobLock::is_held(dir, index)? {
                on_event(LocalEvent::Skipped { index });
                continue;
            }
            let log = log_path(dir, index);
            let child = start(dir, index, params, &log)?;
            on_event(LocalEvent::Started {
                index,
                pid: child.id(),
                runs: &plan.jobs[index].runs,
                log: &log,
            });
            running.push(Running {
                index,
                child,
                started: Instant::now(),
            });
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut i = 0;
        while i < running.len() {
            let exited = running[i]
                .child
                .try_wait()
                .map_err(|source| SweepError::Process {
                    what: format!("waiting for job {}", running[i].index),
                    source,
                })?;
            let Some(code) = exited else {
                i += 1;
                continue;
            };
            let job = running.swap_remove(i);
            if let Some(why) = ended(dir, job.index, code, job.started, &mut on_event)? {
                failed.push(format!("job {} ({why})", job.index));
            }
        }
    }
    let finished = sweep_status(dir, &plan)?
        .iter()
        .filter(|r| r.state == RunState::Finished)
        .count();
    Ok(LocalOutcome {
        runs: plan.runs.len(),
        finished,
        failed,
    })
}

/// The log file of job `index` of the sweep in `dir`.
pub fn log_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(LOGS_DIR).join(format!("job-{index}.log"))
}

/// Starts job `index`'s process, its output appended to `log`.
///
/// # Errors
/// A log that is a link or not a regular file (appending to a link would write outside the
/// sweep, and opening a FIFO would wait); a log that cannot be opened; a process that cannot
/// start.
fn start(dir: &Path, index: usize, params: &LocalParams, log: &Path) -> Result<Child> {
    hyperlens_io::regular_file_or_absent(log).map_err(|e| SweepError::Plan(e.to_string()))?;
    let opening = |source| SweepError::Process {
        what: format!("opening {}", log.display()),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(opening)?;
    let stdout = file.try_clone().map_err(|source| SweepError::Process {
        what: "log file".into(),
        source,
    })?;
    Command::new(&params.exe)
        .arg("sweep")
        .arg("run-one")
        .arg(dir)
        .arg("--index")
        .arg(index.to_string())
        .env("RAYON_NUM_THREADS", params.threads.to_string())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(file)
        .spawn()
        .map_err(|source| SweepError::Process {
            what: format!("starting job {index}"),
            source,
        })
}

/// Reports how job `index`'s process ended with `code`; returns why it failed, if it did. A job
/// killed before it could record its end still says `running`: its record is marked failed
/// (unless another process holds the job now: then the record is that process's).
///
/// # Errors
/// A job record or lock that cannot be read, a record that cannot be written.
fn ended(
    dir: &Path,
    index: usize,
    code: ExitStatus,
    started: Instant,
    on_event: &mut impl FnMut(LocalEvent),
) -> Result<Option<String>> {
    let secs = started.elapsed().as_secs_f64();
    if code.success() {
        on_event(LocalEvent::Finished { index, secs });
        return Ok(None);
    }
    if JobLock::is_held(dir, index)? {
        on_event(LocalEvent::Lost { index });
        return Ok(None);
    }
    let stale = JobRecord::read(dir, index)?
        .filter(|r| r.status == JobStatus::Running)
        .filter(|_| !JobLock::is_held(dir, index).unwrap_or(true));
    if let Some(mut r) = stale {
        r.status = JobStatus::Failed;
        r.ended_unix = Some(now_unix());
        r.error = Some(format!("the job's process ended with {code}"));
        r.write(dir)?;
    }
    let why = JobRecord::read(dir, index)?
        .and_then(|r| r.error)
        .unwrap_or_else(|| code.to_string());
    on_event(LocalEvent::Failed {
        index,
        secs,
        why: &why,
        log: &log_path(dir, index),
    });
    Ok(Some(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_shared_out_with_at_least_one_each() {
        assert_eq!(threads_per_job(16, 4), 4);
        assert_eq!(threads_per_job(10, 3), 3);
        assert_eq!(threads_per_job(2, 8), 1);
        assert_eq!(threads_per_job(8, 0), 8);
    }

    #[test]
    fn no_jobs_at_a_time_is_refused_before_the_directory_is_read() {
        let params = LocalParams {
            jobs: 0,
            retry_failed: false,
            exe: PathBuf::from("hyperlens"),
            threads: 1,
        };
        let e = run_local(Path::new("/nonexistent"), &params, |_| {}).unwrap_err();
        assert_eq!(e.to_string(), "--jobs must be at least 1");
        assert_eq!(
            log_path(Path::new("s"), 3),
            PathBuf::from("s/logs/job-3.log")
        );
    }
}
