//! `hyperlens.train`: training runs through `hyperlens_train` (one run, or a group trained together
//! in one batched model), as `hyperlens train` runs them. Settings come to Python as dicts of
//! [`TrainSettings`]' fields (the run files' form, converted from the Rust record); the Python side
//! applies the keyword arguments to them and hands them back as their JSON, which Rust parses and
//! checks. Outcomes come back as dicts too.
//! A Python callback receives every event (with the CLI's printed line, if any) and may stop the
//! run; Ctrl-C stops it at the end of the current update with a checkpoint, so that
//! `resume=True` continues it exactly.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::str::FromStr;

use hyperlens_model::Task;
use hyperlens_train::{
    new_group, read_settings, resume_group, train_group, Combine, Event, GroupRun, OutProblem,
    ProgressText, RunOptions, TrainError, TrainSettings, Variation,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{detached, raise, to_py, Kind};
use crate::records;

/// A [`TrainSettings`] from its JSON, checked ([`TrainSettings::from_json`]).
fn parse_settings(json: &str) -> PyResult<TrainSettings> {
    TrainSettings::from_json(json).map_err(to_py)
}

/// The JSON of settings (the form [`parse_settings`] reads back).
fn settings_json(s: &TrainSettings) -> PyResult<String> {
    serde_json::to_string(s).map_err(|e| raise(Kind::Other, format!("training settings: {e}")))
}

/// The default settings of `task` (`sraven`, `logic`, `induction`) as a dict (the fields of
/// [`TrainSettings`]): the paper's recipe, what `hyperlens train --task TASK` starts from.
#[pyfunction]
fn default_settings<'py>(py: Python<'py>, task: &str) -> PyResult<Bound<'py, PyAny>> {
    let task = Task::from_str(task).map_err(to_py)?;
    records::record(py, &TrainSettings::for_task(task))
}

/// The settings of the run in `dir` (its `train_state.json`) as a dict, for `resume`.
#[pyfunction]
fn run_settings(py: Python<'_>, dir: PathBuf) -> PyResult<Bound<'_, PyAny>> {
    let s = read_settings(&dir).map_err(to_py)?;
    records::record(py, &s)
}

/// Checks settings given as JSON; returns the warnings for valid but suspicious ones (a run
/// shorter than its warm-up).
#[pyfunction]
fn check_settings(json: &str) -> PyResult<Vec<String>> {
    Ok(parse_settings(json)?.warnings())
}

/// The runs of a new group in `out` (`hyperlens train --seeds / --splits / --lr a,b /
/// --weight-decay a,b [--grid]`): the lists expanded over `base`, checked, `out` created (it
/// must be new or empty) with its `group.json`. Returns `(run directory, settings JSON)` per run.
#[pyfunction]
#[pyo3(signature = (out, base, seeds, splits, lrs, weight_decays, grid))]
fn plan_group(
    out: PathBuf,
    base: &str,
    seeds: Vec<u64>,
    splits: Vec<String>,
    lrs: Vec<f64>,
    weight_decays: Vec<f64>,
    grid: bool,
) -> PyResult<Vec<(PathBuf, String)>> {
    let base = parse_settings(base)?;
    let combine = if grid { Combine::Grid } else { Combine::Zip };
    let variation = Variation {
        seeds,
        splits,
        lrs,
        weight_decays,
    };
    let runs = match new_group(&out, &base, &variation, combine) {
        Err(TrainError::GroupOut { path, problem }) => {
            let path = path.display();
            let why = match problem {
                OutProblem::File => format!("out {path} is a file, not a directory"),
                OutProblem::NotEmpty => format!(
                    "out {path} is not empty: pass resume=True to continue the group there, or \
                     choose another directory"
                ),
                OutProblem::Unreadable(e) => format!("out {path}: {e}"),
            };
            return Err(raise(Kind::Input, why));
        }
        runs => runs.map_err(to_py)?,
    };
    runs.iter()
        .map(|r| Ok((r.out.clone(), settings_json(&r.settings)?)))
        .collect()
}

/// The unfinished runs of the group in `out` (its `group.json`), for `resume`: `(run directory,
/// settings dict)` per run that has neither `train.json` nor a divergence record; `None` if `out`
/// is not a group.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn group_runs(py: Python<'_>, out: PathBuf) -> PyResult<Option<Vec<(PathBuf, Bound<'_, PyAny>)>>> {
    let runs = resume_group(
        &out,
        |dir| read_settings(dir).map_err(ResumeError::from),
        |_ended| {},
    )
    .map_err(|e| e.0)?;
    runs.map(|runs| {
        runs.iter()
            .map(|r| Ok((r.out.clone(), records::record(py, &r.settings)?)))
            .collect()
    })
    .transpose()
}

/// An error of [`resume_group`] as the Python exception it raises.
struct ResumeError(PyErr);

impl From<TrainError> for ResumeError {
    fn from(e: TrainError) -> Self {
        ResumeError(to_py(e))
    }
}

impl From<std::io::Error> for ResumeError {
    /// A run directory of the group refused (a link, not a directory): bad input.
    fn from(e: std::io::Error) -> Self {
        ResumeError(raise(Kind::Input, e.to_string()))
    }
}

/// An event as a Python dict: `event` (`start`, `step`, `row`, `evaluated`, `checkpoint`; the
/// checkpoint writer's file operations are not reported), `run`
/// (the run's index), its fields (`step`, `total`, `lr`, `n_params`; a row's or an evaluation's
/// fields as JSON text in `data`) and `line`, the CLI's printed line for it (or None).
fn event_dict<'py>(
    py: Python<'py>,
    run: usize,
    e: &Event<'_>,
    line: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("run", run)?;
    match e {
        Event::Start {
            step,
            total,
            n_params,
        } => {
            d.set_item("event", "start")?;
            d.set_item("step", step)?;
            d.set_item("total", total)?;
            d.set_item("n_params", n_params)?;
        }
        Event::Step { step, total, lr } => {
            d.set_item("event", "step")?;
            d.set_item("step", step)?;
            d.set_item("total", total)?;
            d.set_item("lr", lr)?;
        }
        Event::Row(row) => {
            d.set_item("event", "row")?;
            d.set_item("data", serde_json::to_string(row).unwrap_or_default())?;
        }
        Event::Evaluated(ev) => {
            d.set_item("event", "evaluated")?;
            d.set_item("data", serde_json::to_string(ev).unwrap_or_default())?;
        }
        Event::Checkpoint { step } => {
            d.set_item("event", "checkpoint")?;
            d.set_item("step", step)?;
        }
        Event::CheckpointWrite { step, op } => {
            d.set_item("event", "checkpoint_write")?;
            d.set_item("step", step)?;
            d.set_item("op", *op)?;
        }
    }
    d.set_item("line", line)?;
    Ok(d)
}

/// Trains `runs` (`(run directory, settings JSON)`; several: one batched model, as a group) on
/// `device`, continuing them with `resume`. `on_event(dict)` is called for every event (with the
/// GIL; updates run without it); it returning True, raising, or Ctrl-C stops the runs at the end
/// of the current update with a checkpoint. Returns, per run, `(outcome dict or None, error
/// message or None, the CLI's closing lines)`; the outcome dict has `completed`, `step`,
/// `last_eval` and `record` (`train.json`'s fields, or None).
#[pyfunction]
#[pyo3(signature = (runs, device = "cpu", resume = false, on_event = None))]
#[allow(clippy::type_complexity)]
fn train_runs<'py>(
    py: Python<'py>,
    runs: Vec<(PathBuf, String)>,
    device: &str,
    resume: bool,
    on_event: Option<Py<PyAny>>,
) -> PyResult<Vec<(Option<Bound<'py, PyAny>>, Option<String>, Vec<String>)>> {
    if runs.is_empty() {
        return Err(raise(Kind::Input, "no runs to train"));
    }
    let device = hyperlens_model::Device::from_str(device).map_err(to_py)?;
    let runs: Vec<GroupRun> = runs
        .into_iter()
        .map(|(out, json)| {
            Ok(GroupRun {
                out,
                settings: parse_settings(&json)?,
            })
        })
        .collect::<PyResult<_>>()?;
    let options = RunOptions { device, resume };
    let (results, texts, stopped) = detached(py, || {
        let mut texts: Vec<ProgressText> = runs
            .iter()
            .map(|r| ProgressText::new(&r.settings, &r.out, resume))
            .collect();
        let mut stopped: Option<PyErr> = None;
        let res = train_group(&runs, &options, |i, e| {
            // A stop at a checkpoint file operation would cut the write as a kill does (the
            // fault-injection tests' use): never stop there, and do not report it.
            if matches!(e, Event::CheckpointWrite { .. }) {
                return ControlFlow::Continue(());
            }
            let line = texts.get_mut(i).and_then(|t| t.line(e));
            let r: PyResult<bool> = Python::attach(|py| {
                py.check_signals()?;
                match &on_event {
                    Some(f) => {
                        let ret = f.call1(py, (event_dict(py, i, e, line)?,))?;
                        ret.is_truthy(py)
                    }
                    None => Ok(false),
                }
            });
            match r {
                Ok(false) => ControlFlow::Continue(()),
                Ok(true) => ControlFlow::Break(()),
                Err(err) => {
                    if stopped.is_none() {
                        stopped = Some(err);
                    }
                    ControlFlow::Break(())
                }
            }
        });
        Ok((res, texts, stopped))
    })?;
    let results = results.map_err(to_py)?;
    if let Some(e) = stopped {
        return Err(e);
    }
    results
        .into_iter()
        .zip(texts)
        .map(|(r, text)| match r {
            Ok(outcome) => {
                let dict = records::record(
                    py,
                    &OutcomeRecord {
                        completed: outcome.completed,
                        last_eval: &outcome.last_eval,
                        record: &outcome.record,
                        step: outcome.step,
                    },
                )?;
                Ok((Some(dict), None, text.summary(&outcome)))
            }
            Err(e) => Ok((None, Some(crate::errors::one_line(&e)), Vec::new())),
        })
        .collect()
}

/// A run's outcome as `train_runs` hands it to Python (the fields of `TrainResult`): the
/// train crate's `TrainOutcome` with its evaluation and record as their serde forms.
#[derive(serde::Serialize)]
struct OutcomeRecord<'a> {
    completed: bool,
    last_eval: &'a Option<hyperlens_train::Evaluation>,
    record: &'a Option<hyperlens_train::TrainRecord>,
    step: u64,
}

/// Registers the submodule's functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(default_settings, m)?)?;
    m.add_function(wrap_pyfunction!(run_settings, m)?)?;
    m.add_function(wrap_pyfunction!(check_settings, m)?)?;
    m.add_function(wrap_pyfunction!(plan_group, m)?)?;
    m.add_function(wrap_pyfunction!(group_runs, m)?)?;
    m.add_function(wrap_pyfunction!(train_runs, m)?)?;
    Ok(())
}
