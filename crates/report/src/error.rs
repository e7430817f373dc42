//! The one error type of `hyperlens-report`.

use std::ops::ControlFlow;
use std::path::PathBuf;

use thiserror::Error;

/// Errors of the report job. Every variant that concerns a file or checkpoint names it; the
/// errors of the other hyperlens crates pass through unchanged (their messages name the file,
/// array or tensor).
#[derive(Debug, Error)]
pub enum ReportError {
    /// A parameter of the job is unusable (e.g. too few problems); names the parameter.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// No checkpoint was given and none was found under the checkpoint root (or it cannot be
    /// listed).
    #[error(
        "no checkpoint (a directory with config.json) under {} (run from the repository root, or give --checkpoint)",
        root.display()
    )]
    NoCheckpoint {
        /// The directory that was searched.
        root: PathBuf,
    },
    /// A checkpoint that the report cannot analyse (e.g. one trained on another task).
    #[error("{}: {reason}", dir.display())]
    Unsupported {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Why it is refused.
        reason: String,
    },
    /// Analysing one checkpoint failed; names the checkpoint (the cause is the error's source).
    #[error("analysing {}", dir.display())]
    Checkpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<ReportError>,
    },
    /// Reading a directory or file failed.
    #[error("i/o error on {}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model crate reported an error (loading, evaluation).
    #[error(transparent)]
    Model(#[from] hyperlens_model::ModelError),
    /// The task generators reported an error (splits, sampling).
    #[error(transparent)]
    Tasks(#[from] hyperlens_tasks::error::TasksError),
    /// The latent-code extraction failed.
    #[error(transparent)]
    Probe(#[from] hyperlens_probe::ProbeError),
    /// A latent-code analysis failed.
    #[error(transparent)]
    Analysis(#[from] hyperlens_analysis::AnalysisError),
    /// Reading a training log failed.
    #[error(transparent)]
    Train(#[from] hyperlens_train::TrainError),
    /// Drawing or writing a figure failed.
    #[error(transparent)]
    Viz(#[from] hyperlens_viz::VizError),
    /// Writing an output file failed.
    #[error(transparent)]
    File(#[from] hyperlens_io::IoError),
    /// The caller's progress callback asked to stop (returned `ControlFlow::Break`, e.g. on
    /// Ctrl-C in Python); the staging directory was removed, the previous report is untouched.
    #[error("interrupted")]
    Interrupted,
}

impl ReportError {
    /// Wraps `self` as the failure of the checkpoint in `dir` (unless it already names one); an
    /// interruption stays [`ReportError::Interrupted`], whichever crate stopped.
    pub(crate) fn in_checkpoint(self, dir: &std::path::Path) -> Self {
        match self {
            e @ (Self::Checkpoint { .. } | Self::Unsupported { .. } | Self::Interrupted) => e,
            Self::Probe(hyperlens_probe::ProbeError::Interrupted)
            | Self::Analysis(hyperlens_analysis::AnalysisError::Interrupted) => Self::Interrupted,
            other => Self::Checkpoint {
                dir: dir.to_path_buf(),
                source: Box::new(other),
            },
        }
    }
}

/// Tells `progress` of `p`: its `ControlFlow::Break` becomes [`ReportError::Interrupted`], so the
/// report stops there with `?`.
///
/// # Errors
/// [`ReportError::Interrupted`] when `progress` breaks.
pub(crate) fn tell(
    progress: &mut dyn FnMut(crate::Progress<'_>) -> ControlFlow<()>,
    p: crate::Progress<'_>,
) -> Result<()> {
    match progress(p) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(ReportError::Interrupted),
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ReportError>;
