//! hyperlens-sweep: many training runs from one spec, on this machine or a Slurm cluster.
//!
//! - [`spec`]: the TOML spec (`[base]` train arguments, `[axes]` swept ones, `[sweep]` zip groups
//!   and batching).
//! - [`plan`]: the spec expanded into named runs, grouped into jobs (runs that differ only in
//!   seed, split, lr or weight decay share one batched process), written as `plan.json`.
//! - [`state`]: where each job ran (`jobs/<index>.json`), the lock a running job holds, and every
//!   run's state (pending, running, interrupted, finished, failed) read from its run directory.
//! - [`slurm`]: the sbatch job-array script (one task per job) and its submission.
//!
//! Executing a job (parsing its arguments as `hyperlens train` does and training) is the binary's
//! part: `hyperlens sweep run` (local, J processes at a time) and `hyperlens sweep run-one` (one
//! job, what a Slurm array task runs). The aggregate over seeds is the report's
//! (`hyperlens report --sweep`).

pub mod error;
pub mod plan;
pub mod slurm;
pub mod spec;
pub mod state;

pub use error::{Result, SweepError};
pub use plan::{Job, Plan, PlannedRun, PLAN_FILE, RUNS_DIR, SPEC_FILE};
pub use slurm::{SlurmOptions, Submission};
pub use spec::{Axis, Scalar, SweepSpec, BATCHABLE_KEYS, RESERVED_KEYS};
pub use state::{
    jobs_to_run, run_status, sweep_status, Executor, JobLock, JobRecord, JobStatus, RunState,
    RunStatus,
};
