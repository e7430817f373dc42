//! The crate's one error type.

use std::path::PathBuf;

use plotters::drawing::DrawingAreaErrorKind;

/// Everything that can go wrong while checking figure data, drawing it or writing it to disk.
///
/// Input problems (empty data, mismatched lengths, non-finite values, bad options) are reported
/// before anything is drawn or written, and name the offending array or option.
#[derive(Debug, thiserror::Error)]
pub enum VizError {
    /// An input array or list that must hold data is empty.
    #[error("{what} is empty")]
    Empty {
        /// Name of the array or list.
        what: String,
    },
    /// Two inputs that must agree in length (or shape) do not.
    #[error("{what}: expected length {expected}, got {got}")]
    Length {
        /// Which input and what it must agree with.
        what: String,
        /// Required length.
        expected: usize,
        /// Length that was given.
        got: usize,
    },
    /// A NaN or infinite value where a finite one is required.
    #[error("{what}: non-finite value {value} at {at}")]
    NonFinite {
        /// Name of the array.
        what: String,
        /// Position of the value (index or multi-index).
        at: String,
        /// The offending value.
        value: f64,
    },
    /// A value outside the range a figure requires (e.g. an accuracy above 1).
    #[error("{what}: value {value} at {at} is outside [{lo}, {hi}]")]
    OutOfRange {
        /// Name of the array.
        what: String,
        /// Position of the value.
        at: String,
        /// The offending value.
        value: f64,
        /// Lower bound of the allowed range.
        lo: f64,
        /// Upper bound of the allowed range.
        hi: f64,
    },
    /// An option or argument that cannot be used (a reversed range, a zero size, ...).
    #[error("invalid option `{name}`: {reason}")]
    InvalidOption {
        /// Name of the option or argument.
        name: String,
        /// Why it is rejected.
        reason: String,
    },
    /// The embedded font could not be registered with plotters.
    #[error("font registration failed: {0}")]
    Font(String),
    /// The plotters backend reported an error while drawing.
    #[error("drawing failed: {0}")]
    Draw(String),
    /// Writing, renaming or encoding an output file failed.
    #[error("cannot write {path}: {message}")]
    Write {
        /// The file that was being written.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for VizError {
    fn from(e: DrawingAreaErrorKind<E>) -> Self {
        VizError::Draw(e.to_string())
    }
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, VizError>;
