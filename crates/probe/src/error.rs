//! The one error type of `hyperlens-probe`.

use thiserror::Error;

/// Errors of latent-code extraction.
#[derive(Debug, Error)]
pub enum ProbeError {
    /// A site, layer selection or parameter is invalid; the message names it.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Reading or writing a file failed; names the path.
    #[error("i/o error on {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Writing an `.npz` archive failed; names the file.
    #[error("npz error: {0}")]
    Npz(String),
    /// Writing an output file failed (hyperlens-io); names the path.
    #[error(transparent)]
    File(#[from] hyperlens_io::IoError),
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model crate reported an error.
    #[error(transparent)]
    Model(#[from] hyperlens_model::ModelError),
    /// The task generators reported an error.
    #[error(transparent)]
    Tasks(#[from] hyperlens_tasks::error::TasksError),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ProbeError>;
