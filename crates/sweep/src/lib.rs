//! hyperlens-sweep: many training runs from one spec, on this machine or a Slurm cluster.
//!
//! - [`spec`]: the TOML spec (`[base]` train arguments, `[axes]` swept ones, `[sweep]` zip groups
//!   and batching).
//! - [`plan`]: the spec expanded into named runs, grouped into jobs (runs that differ only in
//!   seed, split, lr or weight decay share one batched process), written as `plan.json`.
//! - [`state`]: where each job ran (`jobs/<index>.json`), the lock a running job holds, and every
//!   run's state (pending, running, interrupted, finished, failed) read from its run directory.
//! - [`job`]: one job executed (`hyperlens sweep run-one`, what a Slurm array task runs): its
//!   pending runs, their training sessions, its record around them.
//! - [`local`]: the local executor (`hyperlens sweep run`): the unfinished jobs as child
//!   processes, J at a time.
//! - [`slurm`]: the sbatch job-array script (one task per job), its submission and the queue.
//!
//! The crate never trains and never parses a run's arguments: [`job::run_one`] takes both from its
//! caller (the binary parses them exactly as `hyperlens train` does). The aggregate over seeds is
//! the report's (`hyperlens report --sweep`).

pub mod error;
pub mod job;
pub mod local;
pub mod plan;
pub mod planning;
pub mod slurm;
pub mod spec;
pub mod state;
pub mod status_table;

pub use error::{Result, SweepError};
pub use job::{pending_runs, resumable, run_one, sessions, JobEvent, PendingRun, Session};
pub use local::{run_local, threads_per_job, LocalEvent, LocalOutcome, LocalParams};
pub use plan::{Job, Plan, PlannedRun, PLAN_FILE, RUNS_DIR, SPEC_FILE};
pub use planning::{available_threads, plan_sweep};
pub use slurm::{SlurmOptions, Submission};
pub use spec::{Axis, Scalar, SweepSpec, BATCHABLE_KEYS, RESERVED_KEYS};
pub use state::{
    jobs_to_run, run_status, sweep_status, Executor, JobLock, JobRecord, JobStatus, RunState,
    RunStatus,
};
pub use status_table::{StateCounts, StatusRow};
