//! The one error type of `hyperlens-analysis`.

use thiserror::Error;

/// Errors of every analysis routine. Inputs are checked before any algorithm runs, because the
/// underlying libraries (linfa, nalgebra) panic on some bad inputs instead of returning an error.
#[derive(Debug, Error)]
pub enum AnalysisError {
    /// An input array or parameter is unusable (empty set, one class, wrong length, bad parameter).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Two inputs that must agree in shape do not; names the arrays and their shapes.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// An input holds NaN or infinite values; names the array.
    #[error("non-finite values in {0}")]
    NonFinite(String),
    /// A numerical routine (eigendecomposition, SVD, optimiser) failed to converge or errored.
    #[error("numerical failure: {0}")]
    Numerical(String),
    /// Reading or writing a file failed; names the path (the cause is the error's `source()`,
    /// printed by error-chain reporters such as anyhow's `{:#}`).
    #[error("i/o error on {path}")]
    Io {
        /// The file that could not be read or written.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Reading or writing an `.npz` archive failed; names the path and array.
    #[error("npz error on {0}")]
    Npz(String),
    /// Writing an output file failed (hyperlens-io); names the path (and the array of an archive).
    #[error(transparent)]
    File(#[from] hyperlens_io::IoError),
    /// The caller's progress callback asked to stop (returned `ControlFlow::Break`, e.g. on
    /// Ctrl-C in Python).
    #[error("interrupted")]
    Interrupted,
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, AnalysisError>;
