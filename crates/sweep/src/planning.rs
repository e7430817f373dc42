//! `hyperlens sweep plan`'s work in one call: a spec's text expanded into runs and jobs, every run
//! checked as `hyperlens train` checks it, and the plan written; and the threads a local sweep's
//! jobs share out.

use std::path::Path;

use hyperlens_train::{TrainError, TrainSettings};

use crate::error::SweepError;
use crate::plan::{Plan, PlannedRun};
use crate::spec::SweepSpec;

/// Plans the sweep of the spec `spec_text` (read from the file named `spec_name`, for messages)
/// into the sweep directory `out`: parsed ([`SweepSpec::parse`]), expanded under `out`'s name
/// ([`Plan::expand`]), checked before anything is written ([`Plan::check_runs`] with
/// `settings_of` and `job_error`), then written with the spec ([`Plan::write`]).
///
/// # Errors
/// A bad spec (naming the key); the first error of `settings_of`; a job over the memory budget
/// (worded by `job_error`); a directory that holds another plan; I/O errors.
pub fn plan_sweep<E, S, J>(
    out: &Path,
    spec_text: &str,
    spec_name: &str,
    settings_of: S,
    job_error: J,
) -> std::result::Result<Plan, E>
where
    E: From<SweepError>,
    S: FnMut(&PlannedRun, &Path) -> std::result::Result<TrainSettings, E>,
    J: Fn(usize, usize, TrainError) -> E,
{
    let spec = SweepSpec::parse(spec_text, spec_name)?;
    let plan = Plan::expand(&Plan::name_for(out), &spec)?;
    plan.check_runs(out, settings_of, job_error)?;
    plan.write(out, spec_text)?;
    Ok(plan)
}

/// The threads this process may use: `RAYON_NUM_THREADS` when it is a positive number (the
/// binary sets it when the user did not), else the machine's available parallelism (at least 1).
pub fn available_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
