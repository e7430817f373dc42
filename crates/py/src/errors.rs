//! The one mapping from the crates' error enums to Python's exceptions.
//!
//! The exception classes live in `hyperlens/_errors.py` (so that they can derive from two bases,
//! such as `HyperlensError` and `MemoryError`); this module picks the class for each Rust error and
//! raises it with the error's one-line message (the CLI's `error: ...` line without `error: `).

use std::cell::RefCell;
use std::error::Error as StdError;
use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;

use hyperlens_analysis::AnalysisError;
use hyperlens_io::budget::BudgetError;
use hyperlens_io::IoError;
use hyperlens_model::ModelError;
use hyperlens_probe::ProbeError;
use hyperlens_tasks::error::TasksError;
use hyperlens_train::TrainError;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// The Python exception class of an error (`hyperlens._errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `HyperlensError`: anything else (tensor maths, an unavailable device).
    Other,
    /// `InputError(HyperlensError, ValueError)`: a bad argument value, dtype, NaN or index.
    Input,
    /// `ShapeError(InputError)`: an argument of the wrong shape.
    Shape,
    /// `HookError(InputError)`: a Python hook returned an unusable array.
    Hook,
    /// `CheckpointError(HyperlensError, ValueError)`: a malformed or inconsistent checkpoint.
    Checkpoint,
    /// `FileFormatError(HyperlensError, ValueError)`: a malformed `.npz` or JSON file.
    FileFormat,
    /// `NotFoundError(HyperlensError, FileNotFoundError)`: a missing file or checkpoint.
    NotFound,
    /// `BudgetError(HyperlensError, MemoryError)`: a request over the memory budget, refused
    /// before anything was allocated.
    Budget,
    /// `NumericalError(HyperlensError, ArithmeticError)`: a numerical routine failed.
    Numerical,
}

impl Kind {
    /// The class name in `hyperlens._errors`.
    fn class_name(self) -> &'static str {
        match self {
            Kind::Other => "HyperlensError",
            Kind::Input => "InputError",
            Kind::Shape => "ShapeError",
            Kind::Hook => "HookError",
            Kind::Checkpoint => "CheckpointError",
            Kind::FileFormat => "FileFormatError",
            Kind::NotFound => "NotFoundError",
            Kind::Budget => "BudgetError",
            Kind::Numerical => "NumericalError",
        }
    }
}

/// A Python exception of class `kind` with `msg`.
pub fn raise(kind: Kind, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| {
        let class = py
            .import("hyperlens._errors")
            .and_then(|m| m.getattr(kind.class_name()));
        match class {
            Ok(class) => match class.call1((msg.as_str(),)) {
                Ok(obj) => PyErr::from_value(obj),
                Err(e) => e,
            },
            Err(_) => match kind {
                Kind::Other => PyRuntimeError::new_err(msg),
                _ => PyValueError::new_err(msg),
            },
        }
    })
}

/// The error's message and its causes on one line, as the CLI prints them (`a: b: c`); a cause
/// already part of the message is not repeated.
pub fn one_line(e: &(dyn StdError + 'static)) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !text.is_empty() && !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        cur = s.source();
    }
    msg
}

/// The class that a cause deep in the chain forces: a refusal of the memory budget, or a file
/// that is not there.
fn chain_kind(e: &(dyn StdError + 'static)) -> Option<Kind> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(c) = cur {
        if c.downcast_ref::<BudgetError>().is_some() {
            return Some(Kind::Budget);
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::NotFound {
                return Some(Kind::NotFound);
            }
        }
        if c.to_string().contains("over the memory budget") {
            return Some(Kind::Budget);
        }
        cur = c.source();
    }
    None
}

/// The exception class of each crate's errors.
pub trait Classify: StdError + 'static {
    /// The class of this error, its causes aside.
    fn kind(&self) -> Kind;
}

impl Classify for ModelError {
    fn kind(&self) -> Kind {
        match self {
            ModelError::Config(_)
            | ModelError::Checkpoint { .. }
            | ModelError::Tensor { .. }
            | ModelError::Import { .. }
            | ModelError::Io { .. }
            | ModelError::Json { .. } => Kind::Checkpoint,
            ModelError::UnknownMixer(_)
            | ModelError::UnknownTask(_)
            | ModelError::UnknownDevice(_)
            | ModelError::Input(_) => Kind::Input,
            ModelError::Tasks(e) => e.kind(),
            ModelError::Budget(_) => Kind::Budget,
            _ => Kind::Other,
        }
    }
}

impl Classify for TasksError {
    fn kind(&self) -> Kind {
        match self {
            TasksError::NpzArray { .. } | TasksError::NpzFile { .. } | TasksError::Io { .. } => {
                Kind::FileFormat
            }
            TasksError::File(e) => e.kind(),
            TasksError::Budget(_) => Kind::Budget,
            _ => Kind::Input,
        }
    }
}

impl Classify for IoError {
    fn kind(&self) -> Kind {
        match self {
            IoError::Invalid { .. } | IoError::Json { .. } => Kind::FileFormat,
            _ => Kind::Other,
        }
    }
}

impl Classify for ProbeError {
    fn kind(&self) -> Kind {
        match self {
            ProbeError::InvalidInput(_) => Kind::Input,
            ProbeError::Io { .. } | ProbeError::Npz(_) => Kind::FileFormat,
            ProbeError::File(e) => e.kind(),
            ProbeError::Model(e) => e.kind(),
            ProbeError::Tasks(e) => e.kind(),
            ProbeError::Analysis(e) => e.kind(),
            _ => Kind::Other,
        }
    }
}

impl Classify for AnalysisError {
    fn kind(&self) -> Kind {
        match self {
            AnalysisError::InvalidInput(_) | AnalysisError::NonFinite(_) => Kind::Input,
            AnalysisError::Shape(_) => Kind::Shape,
            AnalysisError::Numerical(_) => Kind::Numerical,
            AnalysisError::Io { .. } | AnalysisError::Npz(_) => Kind::FileFormat,
            AnalysisError::File(e) => e.kind(),
            AnalysisError::Interrupted => Kind::Other,
        }
    }
}

impl Classify for TrainError {
    fn kind(&self) -> Kind {
        match self {
            TrainError::InvalidParam(_) | TrainError::SettingsJson(_) => Kind::Input,
            TrainError::Resume(_) => Kind::Checkpoint,
            TrainError::Interrupted(_) => Kind::Other,
            TrainError::Diverged { .. } => Kind::Numerical,
            TrainError::Model(e) => e.kind(),
            TrainError::Tasks(e) => e.kind(),
            TrainError::File(e) => e.kind(),
            TrainError::Io { .. } | TrainError::Json { .. } => Kind::FileFormat,
            _ => Kind::Other,
        }
    }
}

impl Classify for BudgetError {
    fn kind(&self) -> Kind {
        Kind::Budget
    }
}

impl Classify for candle_core::Error {
    fn kind(&self) -> Kind {
        Kind::Other
    }
}

/// The Python exception of a crate error: its class from the error and its causes, its message
/// on one line.
pub fn to_py<E: Classify>(e: E) -> PyErr {
    let kind = chain_kind(&e).unwrap_or_else(|| e.kind());
    raise(kind, one_line(&e))
}

/// Runs `f` with the GIL released; a panic inside becomes a `HyperlensError` naming it (no
/// `PanicException` reaches Python).
pub fn detached<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: FnOnce() -> PyResult<T> + Send,
    T: Send,
{
    py.detach(|| match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(raise(
                Kind::Other,
                format!("internal error (please report it): {what}"),
            ))
        }
    })
}

/// Raises a pending Ctrl-C (`KeyboardInterrupt`) or other signal's exception: called between
/// batches of a long call that runs with the GIL released.
pub fn check_signals() -> PyResult<()> {
    Python::attach(|py| py.check_signals())
}

/// Ctrl-C for a long library call run with the GIL released: [`Interrupt::check`] is the call's
/// progress step; it checks for a pending signal and, on its exception, keeps it and breaks, so
/// the library stops at that step ([`ControlFlow::Break`] becomes the crate's `Interrupted`
/// error) and [`Interrupt::finish`] raises the kept exception (`KeyboardInterrupt`) instead.
#[derive(Default)]
pub struct Interrupt {
    pending: RefCell<Option<PyErr>>,
}

impl Interrupt {
    /// Checks for a pending signal (taking the GIL for a moment): `Continue`, or `Break` once a
    /// signal handler has raised.
    pub fn check(&self) -> ControlFlow<()> {
        if self.pending.borrow().is_some() {
            return ControlFlow::Break(());
        }
        match check_signals() {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                *self.pending.borrow_mut() = Some(e);
                ControlFlow::Break(())
            }
        }
    }

    /// Whether a signal stopped the call.
    pub fn stopped(&self) -> bool {
        self.pending.borrow().is_some()
    }

    /// The call's result as Python sees it: the kept signal exception if there is one, else the
    /// result with its error converted ([`to_py`]).
    ///
    /// # Errors
    /// The signal's exception; the call's error.
    pub fn finish<T, E: Classify>(self, r: std::result::Result<T, E>) -> PyResult<T> {
        match self.pending.into_inner() {
            Some(e) => Err(e),
            None => r.map_err(to_py),
        }
    }
}

/// A long library call's progress step with a Python callback, run with the GIL released: each
/// [`Callback::step`] checks Ctrl-C ([`Interrupt`]) and then calls the callback (taking the GIL
/// for it); an exception of either breaks the call there, and [`Callback::finish`] raises it
/// instead of the library's `Interrupted` error.
pub struct Callback<'a> {
    stop: Interrupt,
    callback: Option<&'a Py<PyAny>>,
    failed: Option<PyErr>,
}

impl<'a> Callback<'a> {
    /// The step of a call with `callback` (or none: then Ctrl-C only).
    pub fn new(callback: Option<&'a Py<PyAny>>) -> Self {
        Self {
            stop: Interrupt::default(),
            callback,
            failed: None,
        }
    }

    /// One progress step: `Break` after a signal or a callback's exception (then and at every
    /// later step), else `call(py, callback)` and `Continue`.
    pub fn step(
        &mut self,
        call: impl FnOnce(Python<'_>, &Py<PyAny>) -> PyResult<()>,
    ) -> ControlFlow<()> {
        if self.failed.is_some() || self.stop.check().is_break() {
            return ControlFlow::Break(());
        }
        if let Some(f) = self.callback {
            if let Err(e) = Python::attach(|py| call(py, f)) {
                self.failed = Some(e);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// The call's result as Python sees it: the callback's exception, else as
    /// [`Interrupt::finish`].
    ///
    /// # Errors
    /// The callback's or the signal's exception; the call's error.
    pub fn finish<T, E: Classify>(self, r: std::result::Result<T, E>) -> PyResult<T> {
        match self.failed {
            Some(e) => Err(e),
            None => self.stop.finish(r),
        }
    }
}
