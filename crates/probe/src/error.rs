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
    /// The analyses (of the circuits run) reported an error.
    #[error(transparent)]
    Analysis(#[from] hyperlens_analysis::AnalysisError),
    /// The task generators reported an error.
    #[error(transparent)]
    Tasks(#[from] hyperlens_tasks::error::TasksError),
    /// A size over the memory budget (hyperlens-io), naming what asked for it.
    #[error(transparent)]
    Budget(#[from] hyperlens_io::budget::BudgetError),
    /// The caller's progress callback asked to stop (returned `ControlFlow::Break`, e.g. on
    /// Ctrl-C in Python); nothing was written.
    #[error("interrupted")]
    Interrupted,
}

/// One step of a long function's progress: calls `progress(done, total)` and turns its
/// `ControlFlow::Break` into [`ProbeError::Interrupted`], so the function stops there with `?`.
///
/// # Errors
/// [`ProbeError::Interrupted`] when the callback breaks.
pub fn step(
    progress: &mut impl FnMut(usize, usize) -> std::ops::ControlFlow<()>,
    done: usize,
    total: usize,
) -> Result<()> {
    match progress(done, total) {
        std::ops::ControlFlow::Continue(()) => Ok(()),
        std::ops::ControlFlow::Break(()) => Err(ProbeError::Interrupted),
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ProbeError>;
