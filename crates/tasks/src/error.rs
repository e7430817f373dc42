//! The one error type of `hyperlens-tasks`.

use std::path::PathBuf;

/// Everything that can go wrong in the task generators, splits and problem-set files.
///
/// Every variant names the offending parameter, split, file or array, so that a message shown to a
/// user says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TasksError {
    /// A parameter struct failed its `check()`.
    #[error("invalid parameter `{name}`: {reason}")]
    InvalidParam {
        /// The parameter (field or flag) name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A split name that is neither a paper split nor `seed{N}`.
    #[error("unknown split `{name}`; valid splits: {valid}")]
    UnknownSplit {
        /// The name that was asked for.
        name: String,
        /// The valid names, comma separated.
        valid: String,
    },
    /// The embedded split data failed validation.
    #[error("invalid split data for `{split}`: {reason}")]
    InvalidSplit {
        /// The split.
        split: String,
        /// What is wrong.
        reason: String,
    },
    /// A string that does not name a variant of an enum (set, rule, task, ...).
    #[error("unknown {what} `{value}`; valid values: {valid}")]
    UnknownVariant {
        /// The kind of value (e.g. "set").
        what: &'static str,
        /// The string that was given.
        value: String,
        /// The valid values, comma separated.
        valid: String,
    },
    /// A problem, batch or array given to a function has the wrong shape or content.
    #[error("invalid input `{name}`: {reason}")]
    InvalidInput {
        /// The argument or array name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An array of a `.npz` problem-set file is missing, of the wrong type or shape, or holds bad values.
    #[error("{path}: array `{array}`: {reason}")]
    NpzArray {
        /// The file.
        path: PathBuf,
        /// The array name inside the archive.
        array: String,
        /// What is wrong.
        reason: String,
    },
    /// The file is not a readable `.npz` (zip) archive, or could not be written.
    #[error("{path}: {reason}")]
    NpzFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A line of a JSONL prompt file ([`crate::prompts`]) that is not a valid prompt, or a file
    /// with no prompt (`line` 0).
    #[error("{path}: line {line}: {reason}")]
    PromptLine {
        /// The file.
        path: PathBuf,
        /// The 1-based line number (0 when the whole file is at fault).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// An I/O error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A problem set too large for the memory budget, refused before it was allocated.
    #[error(transparent)]
    Budget(#[from] hyperlens_io::budget::BudgetError),
    /// Writing an output file failed (hyperlens-io); names the path and array.
    #[error(transparent)]
    File(#[from] hyperlens_io::IoError),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, TasksError>;

impl TasksError {
    /// Shorthand for [`TasksError::InvalidParam`].
    pub(crate) fn param(name: &'static str, reason: impl Into<String>) -> Self {
        TasksError::InvalidParam {
            name,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`TasksError::InvalidInput`].
    pub(crate) fn input(name: impl Into<String>, reason: impl Into<String>) -> Self {
        TasksError::InvalidInput {
            name: name.into(),
            reason: reason.into(),
        }
    }
}
