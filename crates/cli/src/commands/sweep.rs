//! `hyperlens sweep`: many training runs from one TOML spec (`hyperlens_sweep`), planned into a
//! sweep directory, run on this machine (`run`, J processes at a time) or as a Slurm job array
//! (`submit --slurm`, whose tasks call `run-one`), and followed with `status`. The aggregate over
//! seeds is `hyperlens report --sweep DIR`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hyperlens_sweep::slurm::{self, SlurmOptions};
use hyperlens_sweep::{
    available_threads, plan_sweep, sweep_status, threads_per_job, JobEvent, LocalEvent,
    LocalParams, Plan, PlannedRun, StateCounts, StatusRow,
};
use hyperlens_train::TrainSettings;

use super::train::{parse_train_args, settings, train_together};

/// `hyperlens sweep` subcommands.
#[derive(Debug, Subcommand)]
pub enum SweepCommand {
    /// Expand a spec (TOML) into named runs and jobs, checked as `train` would check them, and
    /// write the plan into --out.
    Plan(PlanArgs),
    /// Run the sweep's unfinished jobs on this machine, --jobs processes at a time; finished runs
    /// are skipped, interrupted ones resumed. Kill it and run it again to continue.
    Run(RunArgs),
    /// Run one job of the sweep (what each Slurm array task runs).
    RunOne(RunOneArgs),
    /// Submit the sweep's unfinished jobs as a Slurm job array.
    Submit(SubmitArgs),
    /// Show every run: state, step of planned steps, last evaluation, where it ran.
    Status(StatusArgs),
}

/// Arguments of `sweep plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The spec file (TOML: `[base]`, `[axes]`, `[sweep]`).
    pub spec: PathBuf,
    /// The sweep directory (created; must be new, empty, or hold the same plan).
    #[arg(long)]
    pub out: PathBuf,
}

/// Arguments of `sweep run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The sweep directory.
    pub dir: PathBuf,
    /// Jobs run at once (each a process; the CPU threads are shared out between them).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Also run the jobs of failed runs again.
    #[arg(long)]
    pub retry_failed: bool,
}

/// Arguments of `sweep run-one`.
#[derive(Debug, Args)]
pub struct RunOneArgs {
    /// The sweep directory.
    pub dir: PathBuf,
    /// The job's index (the Slurm array task id).
    #[arg(long)]
    pub index: usize,
}

/// Arguments of `sweep submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The sweep directory (on a file system the compute nodes share).
    pub dir: PathBuf,
    /// Submit to Slurm with sbatch (the only scheduler hyperlens submits to).
    #[arg(long, required = true)]
    pub slurm: bool,
    /// Slurm partition.
    #[arg(long)]
    pub partition: Option<String>,
    /// Generic resources per task, e.g. gpu:1.
    #[arg(long)]
    pub gres: Option<String>,
    /// Time limit per task, e.g. 02:00:00.
    #[arg(long)]
    pub time: Option<String>,
    /// CPUs per task.
    #[arg(long)]
    pub cpus_per_task: Option<u32>,
    /// Memory per task, e.g. 8G.
    #[arg(long)]
    pub mem: Option<String>,
    /// Account to charge.
    #[arg(long)]
    pub account: Option<String>,
    /// Most array tasks running at once.
    #[arg(long)]
    pub max_parallel: Option<u32>,
    /// The hyperlens binary the tasks run (an absolute path on the nodes) [default: this binary].
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Also submit the jobs of failed runs again.
    #[arg(long)]
    pub resubmit_failed: bool,
    /// Print the script instead of submitting it.
    #[arg(long)]
    pub dry_run: bool,
}

/// Arguments of `sweep status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The sweep directory.
    pub dir: PathBuf,
    /// One JSON object per run instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hyperlens sweep`.
///
/// # Errors
/// A bad spec (naming the key), a directory without a plan, a job already running, a failed job,
/// a failed submission.
pub fn run(c: SweepCommand) -> anyhow::Result<()> {
    match c {
        SweepCommand::Plan(a) => plan(a),
        SweepCommand::Run(a) => run_local(a),
        SweepCommand::RunOne(a) => run_one(&a.dir, a.index),
        SweepCommand::Submit(a) => submit(a),
        SweepCommand::Status(a) => status(a),
    }
}

/// `sweep plan`: expands the spec, checks every run's arguments with `train`'s parser and
/// settings checks, writes the plan.
fn plan(a: PlanArgs) -> anyhow::Result<()> {
    let text = hyperlens_io::read_regular(&a.spec)
        .with_context(|| format!("reading the spec {}", a.spec.display()))?;
    let text = String::from_utf8(text)
        .with_context(|| format!("the spec {} is not UTF-8 text", a.spec.display()))?;
    let spec_name = a.spec.display();
    let plan = plan_sweep(
        &a.out,
        &text,
        &spec_name.to_string(),
        |run, dir| {
            run_settings(run, dir, false)
                .map(|(s, _)| s)
                .with_context(|| format!("{spec_name}: run `{}`", run.name))
        },
        |job, runs, e| {
            anyhow::Error::new(e).context(format!(
                "{spec_name}: job {job} ({runs} runs trained together)"
            ))
        },
    )?;
    outln!(
        "planned {} runs in {} jobs -> {}",
        plan.runs.len(),
        plan.jobs.len(),
        a.out.display()
    )?;
    for job in &plan.jobs {
        outln!("job {:>3}: {}", job.index, job.runs.join(", "))?;
    }
    outln!(
        "run it here: hyperlens sweep run {0} --jobs J; or on Slurm: hyperlens sweep submit {0} --slurm",
        a.out.display()
    )?;
    Ok(())
}

/// A planned run's settings and device, from its arguments parsed as `hyperlens train` parses
/// them (with `--resume` when it resumes), for the run directory `dir`.
fn run_settings(
    run: &PlannedRun,
    dir: &Path,
    resume: bool,
) -> anyhow::Result<(TrainSettings, hyperlens_model::Device)> {
    let args = parse_train_args(&run.train_args(), dir, resume)?;
    Ok((settings(&args, dir)?, args.device))
}

/// `sweep run-one`: the job's lock and record around its training (`hyperlens_sweep::run_one`),
/// each session trained as `hyperlens train` trains a group.
fn run_one(dir: &Path, index: usize) -> anyhow::Result<()> {
    hyperlens_sweep::run_one(
        dir,
        index,
        |run, rd, resume| {
            run_settings(run, rd, resume).with_context(|| format!("run `{}`", run.name))
        },
        |runs, options, label| train_together(runs, options, true, None, label),
        |event| {
            match event {
                JobEvent::Started {
                    sweep,
                    index,
                    attempt,
                    executor,
                    runs,
                } => outln!(
                    "sweep {sweep} job {index} (attempt {attempt}, {}): {}",
                    executor.describe(),
                    runs.join(", ")
                )?,
                JobEvent::AllFinished { index } => {
                    outln!("job {index}: every run is finished")?;
                }
            }
            Ok(())
        },
    )
}

/// `sweep run`: the local executor (`hyperlens_sweep::run_local`), with its progress printed.
fn run_local(a: RunArgs) -> anyhow::Result<()> {
    if a.jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    let dir = &a.dir;
    let params = LocalParams {
        jobs: a.jobs,
        retry_failed: a.retry_failed,
        exe: std::env::current_exe().context("finding this binary")?,
        threads: threads_per_job(available_threads(), a.jobs),
    };
    let mut bar = indicatif::ProgressBar::hidden();
    let mut done = 0u64;
    let mut name = String::new();
    let outcome = hyperlens_sweep::run_local(dir, &params, |event| {
        if event.ends_a_job() {
            done += 1;
            bar.set_position(done);
        }
        let _ = bar.suspend(|| print_local(&event, &a));
        if let LocalEvent::Found { sweep, todo, .. } = event {
            name = sweep.to_string();
            if std::io::stderr().is_terminal() {
                bar = super::common::progress_bar(todo as u64, "sweep", "jobs");
            }
        }
    })?;
    bar.finish_and_clear();
    outln!(
        "sweep {name}: {} of {} runs finished",
        outcome.finished,
        outcome.runs
    )?;
    if !outcome.failed.is_empty() {
        bail!(
            "{} job(s) failed: {}; see `hyperlens sweep status {}`",
            outcome.failed.len(),
            outcome.failed.join("; "),
            dir.display()
        );
    }
    Ok(())
}

/// The line(s) `sweep run` prints for `event`.
fn print_local(event: &LocalEvent, a: &RunArgs) -> anyhow::Result<()> {
    match *event {
        LocalEvent::Found {
            sweep,
            runs,
            finished,
            failed,
            running,
            todo,
            jobs,
        } => {
            outln!(
                "sweep {sweep}: {runs} runs ({finished} finished, {failed} failed, {running} running elsewhere); {todo} of {jobs} jobs to run, {} at a time",
                a.jobs
            )?;
            if failed > 0 && !a.retry_failed {
                outln!("failed runs are not retried without --retry-failed")?;
            }
        }
        LocalEvent::Skipped { index } | LocalEvent::Lost { index } => {
            outln!("job {index} is running in another process; skipped")?;
        }
        LocalEvent::Started {
            index,
            pid,
            runs,
            log,
        } => outln!(
            "job {index} started (pid {pid}): {}; log {}",
            runs.join(", "),
            log.display()
        )?,
        LocalEvent::Finished { index, secs } => {
            outln!("job {index} finished in {secs:.1} s")?;
        }
        LocalEvent::Failed {
            index,
            secs,
            why,
            log,
        } => outln!(
            "job {index} failed after {secs:.1} s: {why} (log {})",
            log.display()
        )?,
    }
    Ok(())
}

/// `sweep submit --slurm`.
fn submit(a: SubmitArgs) -> anyhow::Result<()> {
    let dir = std::fs::canonicalize(&a.dir)
        .with_context(|| format!("the sweep directory {}", a.dir.display()))?;
    let plan = Plan::read(&dir)?;
    let indices = slurm::to_submit(&dir, &plan, a.resubmit_failed)?;
    if indices.is_empty() {
        outln!(
            "nothing to submit: every job of {} is finished, failed (see --resubmit-failed), running or queued",
            dir.display()
        )?;
        return Ok(());
    }
    let binary = match &a.binary {
        Some(b) => std::fs::canonicalize(b).with_context(|| format!("--binary {}", b.display()))?,
        None => std::env::current_exe().context("finding this binary")?,
    };
    let options = SlurmOptions {
        partition: a.partition,
        gres: a.gres,
        time: a.time,
        cpus_per_task: a.cpus_per_task,
        mem: a.mem,
        account: a.account,
        max_parallel: a.max_parallel,
    };
    if a.dry_run {
        out!(
            "{}",
            slurm::script(&plan, &dir, &binary, &indices, &options)?
        )?;
        return Ok(());
    }
    let sub = slurm::submit(&plan, &dir, &binary, &indices, &options)?;
    outln!(
        "submitted Slurm job array {} ({} tasks: {}), script {}; follow it with: hyperlens sweep status {}",
        sub.job_id,
        indices.len(),
        slurm::array_spec(&indices),
        sub.script,
        a.dir.display()
    )?;
    Ok(())
}

/// `sweep status`.
fn status(a: StatusArgs) -> anyhow::Result<()> {
    let plan = Plan::read(&a.dir)?;
    let status = sweep_status(&a.dir, &plan)?;
    if a.json {
        for s in &status {
            outln!("{}", serde_json::to_string(s)?)?;
        }
        return Ok(());
    }
    let width = status
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    outln!(
        "{:<width$}  {:>3}  {:<11}  {:>15}  {:<28}  where",
        "run",
        "job",
        "state",
        "step",
        "last evaluation (ID / OOD)"
    )?;
    for s in status.iter().map(StatusRow::of) {
        outln!(
            "{:<width$}  {:>3}  {:<11}  {:>15}  {:<28}  {}",
            s.name,
            s.job,
            s.state,
            s.step,
            s.eval,
            s.place
        )?;
    }
    let c = StateCounts::of(&status);
    outln!(
        "{} runs: {} finished, {} running, {} interrupted, {} pending, {} failed",
        c.total,
        c.finished,
        c.running,
        c.interrupted,
        c.pending,
        c.failed
    )?;
    Ok(())
}
