//! The one error type of `hyperlens-io`.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Errors of writing (or reading back) an output file. Every variant names the file; the cause is
/// the error's `source()`.
#[derive(Debug, Error)]
pub enum IoError {
    /// Creating, writing, syncing or renaming the file (or syncing its directory) failed.
    #[error("i/o error on {}", path.display())]
    Io {
        /// The file (or directory) the operation was on.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Adding an array to an `.npz` archive, or finishing the archive, failed.
    #[error("npz error on {}: array `{array}`", path.display())]
    Npz {
        /// The archive.
        path: PathBuf,
        /// The array being written (`(archive)` when finishing the archive).
        array: String,
        /// The underlying error.
        #[source]
        source: ndarray_npy::WriteNpzError,
    },
    /// A file being read is malformed, or claims sizes it does not hold or the memory budget does
    /// not allow (see [`crate::inspect_npz`]).
    #[error("{}: array `{array}`: {msg}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The array (or `(archive)` for the file as a whole).
        array: String,
        /// What is wrong.
        msg: String,
    },
    /// Serialising or parsing JSON failed.
    #[error("json error on {}", path.display())]
    Json {
        /// The JSON file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
}

impl IoError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Io { path, .. }
            | Self::Npz { path, .. }
            | Self::Invalid { path, .. }
            | Self::Json { path, .. } => path,
        }
    }

    pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Converts to a plain [`std::io::Error`] (for crates whose error type has an I/O variant that
/// takes one): an I/O failure keeps its kind, the other failures become
/// [`std::io::ErrorKind::Other`]; the message keeps the file name.
impl From<IoError> for std::io::Error {
    fn from(e: IoError) -> Self {
        match e {
            IoError::Io { path, source } => {
                std::io::Error::new(source.kind(), format!("{}: {source}", path.display()))
            }
            other => std::io::Error::other(format!(
                "{other}: {}",
                std::error::Error::source(&other)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            )),
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, IoError>;
