//! The one error type of `hyperlens-train`.

use thiserror::Error;

/// Errors of training: bad parameters, a run directory that cannot be resumed, tensor failures.
#[derive(Debug, Error)]
pub enum TrainError {
    /// A training parameter is out of range; names the parameter.
    #[error("invalid training parameter: {0}")]
    InvalidParam(String),
    /// Settings given as JSON (the form of the run files, which the Python front hands over) are
    /// not JSON or not settings; names the first field that fails.
    #[error("{0}")]
    SettingsJson(String),
    /// A run directory cannot be resumed (missing or inconsistent state); names the file.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// The caller's callback stopped a checkpoint write part-way (`Event::CheckpointWrite`), as a
    /// kill would; the run directory still holds its previous complete checkpoint.
    #[error("interrupted: {0}")]
    Interrupted(String),
    /// The loss became NaN or infinite at a step: training diverged.
    #[error("training diverged at step {step}: loss {loss}")]
    Diverged {
        /// The step (0-based) at which the loss was not finite.
        step: u64,
        /// The loss value.
        loss: f32,
    },
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model crate reported an error (checkpoint, config, forward).
    #[error(transparent)]
    Model(#[from] hyperlens_model::ModelError),
    /// The task generators reported an error.
    #[error(transparent)]
    Tasks(#[from] hyperlens_tasks::error::TasksError),
    /// Reading or writing a file failed; names the path. The operating system's reason is the
    /// error's `source()` (shown by `{:#}` and error reporters), not repeated in its message.
    #[error("i/o error on {path}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A JSON file could not be parsed or written; names the path. The parser's reason is the
    /// error's `source()`, not repeated in its message.
    #[error("json error on {path}")]
    Json {
        /// The file.
        path: String,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// The directory given for a new group cannot hold it ([`crate::launch::new_group`]); the
    /// fronts name it by their own flag or argument.
    #[error("{} {}", path.display(), match problem {
        crate::launch::OutProblem::File => "is a file, not a directory".to_string(),
        crate::launch::OutProblem::NotEmpty => "is not empty".to_string(),
        crate::launch::OutProblem::Unreadable(e) => format!("cannot be listed: {e}"),
    })]
    GroupOut {
        /// The directory.
        path: std::path::PathBuf,
        /// What is wrong with it.
        problem: crate::launch::OutProblem,
    },
    /// Evaluating one sampled logic set failed ([`crate::logic_eval::evaluate_logic`]); names
    /// the set as `hyperlens eval --set` does, the cause being the error's `source()`.
    #[error("--set {set}")]
    InSet {
        /// The set's name.
        set: String,
        /// What failed.
        #[source]
        source: Box<TrainError>,
    },
    /// Writing an output file failed (hyperlens-io); names the path.
    #[error(transparent)]
    File(#[from] hyperlens_io::IoError),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;
