//! The one error type of `hyperlens-sweep`.

use thiserror::Error;

/// Errors of sweeps: a bad spec (naming the key), a sweep directory that does not hold a plan, a
/// job that is already running, files that cannot be read or written.
#[derive(Debug, Error)]
pub enum SweepError {
    /// The spec file is not valid TOML or not a sweep spec; names the file and the key.
    #[error("{0}")]
    Spec(String),
    /// The sweep directory or one of its files is missing or malformed; names the file.
    #[error("{0}")]
    Plan(String),
    /// A job is held by another process (its lock file is locked).
    #[error("{0}")]
    Busy(String),
    /// The scheduler refused or failed a command (sbatch); says which and its output.
    #[error("{0}")]
    Scheduler(String),
    /// Reading or writing a file failed; names the path.
    #[error("i/o error on {path}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Starting, waiting for or logging a job's process failed; says which job and what was done.
    #[error("{what}")]
    Process {
        /// What was being done (`starting job 3`).
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A setting of an executor is out of range; names it.
    #[error("{0}")]
    InvalidParam(String),
    /// Writing a file atomically failed.
    #[error(transparent)]
    File(#[from] hyperlens_io::IoError),
    /// A size (the number of runs of a spec) over the memory budget.
    #[error(transparent)]
    Budget(#[from] hyperlens_io::budget::BudgetError),
    /// Reading a run's training files failed.
    #[error(transparent)]
    Train(#[from] hyperlens_train::TrainError),
}

impl SweepError {
    /// A closure mapping an I/O error on `path` to [`SweepError::Io`].
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> SweepError + '_ {
        move |source| SweepError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, SweepError>;
