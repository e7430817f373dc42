//! The model crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in `hyperlens-model`: configuration, tensor maths, checkpoints,
/// importers and evaluation. Checkpoint errors name the file and the tensor.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A configuration value is invalid (`Config::check`).
    #[error("invalid model config: {0}")]
    Config(String),

    /// An unknown mixer name was given.
    #[error("unknown mixer `{0}` (expected one of: softmax, linear, hyla, linear-rmshead, hyla-no-rmshead, hyla-linear-value, hyla-linear-value-no-rmshead, softmax-hypatt, or a paper name such as linear_hypatt)")]
    UnknownMixer(String),

    /// An unknown task name was given (on the command line or as the `task` of a run file).
    #[error("unknown task `{0}` (expected sraven, logic or induction)")]
    UnknownTask(String),

    /// An unknown device name was given.
    #[error("unknown device `{0}` (expected cpu, cuda or metal)")]
    UnknownDevice(String),

    /// The requested device was not compiled into this build or is unavailable.
    #[error("device `{device}` is not available: {reason}")]
    DeviceUnavailable {
        /// The device name.
        device: String,
        /// Why it is not available.
        reason: String,
    },

    /// An input to a model function has the wrong shape or value.
    #[error("bad input: {0}")]
    Input(String),

    /// A checkpoint file is missing, unreadable or malformed.
    #[error("checkpoint {}: {msg}", path.display())]
    Checkpoint {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },

    /// A tensor in a checkpoint is missing, has the wrong shape or dtype, or holds non-finite values.
    #[error("checkpoint {}: tensor `{name}`: {msg}", path.display())]
    Tensor {
        /// The file concerned.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// What is wrong.
        msg: String,
    },

    /// An importer found a missing or misshapen key in a foreign parameter file.
    #[error("import {}: key `{key}`: {msg}", path.display())]
    Import {
        /// The file concerned.
        path: PathBuf,
        /// The key in that file.
        key: String,
        /// What is wrong.
        msg: String,
    },

    /// An I/O error on a named path (the cause is the error's `source()`, shown by `{:#}` in anyhow).
    #[error("{}", path.display())]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    /// A JSON (de)serialisation error on a named path (the cause is the error's `source()`).
    #[error("{}", path.display())]
    Json {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },

    /// An error from the task crate (problem sets, splits).
    #[error(transparent)]
    Tasks(#[from] hyperlens_tasks::TasksError),

    /// A request over the memory budget, refused before anything was allocated.
    #[error(transparent)]
    Budget(#[from] hyperlens_io::budget::BudgetError),

    /// An error from candle (tensor maths or device).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
