//! `hyperlens sweep`: many training runs from one TOML spec (`hyperlens_sweep`), planned into a
//! sweep directory, run on this machine (`run`, J processes at a time) or as a Slurm job array
//! (`submit --slurm`, whose tasks call `run-one`), and followed with `status`. The aggregate over
//! seeds is `hyperlens report --sweep DIR`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hyperlens_sweep::slurm::{self, SlurmOptions};
use hyperlens_sweep::state::LOGS_DIR;
use hyperlens_sweep::{
    jobs_to_run, sweep_status, Executor, JobLock, JobRecord, JobStatus, Plan, PlannedRun, RunState,
    SweepSpec,
};
use hyperlens_train::state::RECORD_FILE;
use hyperlens_train::{GroupRun, RunOptions, FAILED_FILE};

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
    let spec = SweepSpec::parse(&text, &a.spec.display().to_string())?;
    let plan = Plan::expand(&sweep_name(&a.out), &spec)?;
    // Every run's arguments as `train` checks them, and every job's models (the runs it trains
    // together) against the memory budget, before the sweep directory is made.
    let mut firsts: Vec<Option<hyperlens_train::TrainSettings>> = vec![None; plan.jobs.len()];
    for run in &plan.runs {
        let dir = Plan::run_dir(&a.out, &run.name);
        let args = parse_train_args(&run.train_args(), &dir, false)
            .with_context(|| format!("{}: run `{}`", a.spec.display(), run.name))?;
        let s = settings(&args, &dir)
            .with_context(|| format!("{}: run `{}`", a.spec.display(), run.name))?;
        if firsts[run.job].is_none() {
            firsts[run.job] = Some(s);
        }
    }
    for (job, first) in plan.jobs.iter().zip(&firsts) {
        if let Some(s) = first {
            hyperlens_train::check_memory(s, job.runs.len()).with_context(|| {
                format!(
                    "{}: job {} ({} runs trained together)",
                    a.spec.display(),
                    job.index,
                    job.runs.len()
                )
            })?;
        }
    }
    plan.write(&a.out, &text)?;
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

/// The sweep's name from its directory's name: letters, digits, `_`, `-`, `+` and `.` kept,
/// anything else (white space, quotes, control characters) as `-`, so that it can stand in a
/// Slurm script's `#SBATCH --job-name`.
fn sweep_name(out: &Path) -> String {
    let name: String = out
        .file_name()
        .map_or_else(|| "sweep".into(), |n| n.to_string_lossy().into_owned())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(200)
        .collect();
    if name.is_empty() {
        "sweep".into()
    } else {
        name
    }
}

/// The step of the committed checkpoint of the run in `dir`, if it has one: from its
/// `train_state.json`, else from its checkpoint manifest (a run whose state file is damaged still
/// has its checkpoint, and `train --resume` repairs the run directory from it).
///
/// # Errors
/// A manifest that is present but cannot be read: the run is neither cleared nor trained afresh.
fn resumable(dir: &Path) -> anyhow::Result<Option<u64>> {
    let from_state = || -> Option<u64> {
        hyperlens_train::read_settings(dir).ok()?;
        let state =
            hyperlens_io::read_regular(&dir.join(hyperlens_train::state::STATE_FILE)).ok()?;
        serde_json::from_slice::<serde_json::Value>(&state)
            .ok()?
            .get("step")?
            .as_u64()
    };
    if let Some(step) = from_state() {
        return Ok(Some(step));
    }
    let manifest = dir.join(hyperlens_train::checkpoint::MANIFEST_FILE);
    if std::fs::symlink_metadata(&manifest).is_err() {
        return Ok(None);
    }
    match hyperlens_train::checkpoint::read_manifest(dir) {
        Ok(Some((m, _))) => Ok(Some(m.step)),
        Ok(None) => Ok(None),
        Err(e) => bail!(
            "{}: the run has a checkpoint manifest that cannot be read ({e}); its work is kept: \
             repair or remove the run's directory",
            dir.display()
        ),
    }
}

/// The runs of a job still to train, as [`GroupRun`]s with whether each resumes; a run directory
/// left without a committed checkpoint (killed before its first) is cleared first.
fn job_runs(
    dir: &Path,
    runs: &[&PlannedRun],
) -> anyhow::Result<Vec<(GroupRun, Option<u64>, hyperlens_model::Device)>> {
    let mut out = Vec::new();
    for run in runs {
        // The plan's names and `runs/` were checked when it was read (one directory inside
        // `runs/`); a run directory that is a link could still lead out of the sweep.
        let rd = Plan::run_dir(dir, &run.name);
        super::common::real_dir_or_absent(&rd)?;
        if rd.join(RECORD_FILE).exists() {
            continue;
        }
        let step = resumable(&rd)?;
        if step.is_none() && rd.exists() {
            std::fs::remove_dir_all(&rd)
                .with_context(|| format!("clearing the unstarted run {}", rd.display()))?;
        }
        if step.is_some() {
            // A retried run that diverged: its failed.json is stale once it resumes.
            let _ = std::fs::remove_file(rd.join(FAILED_FILE));
        }
        let args = parse_train_args(&run.train_args(), &rd, step.is_some())
            .with_context(|| format!("run `{}`", run.name))?;
        let device = args.device;
        out.push((
            GroupRun {
                settings: settings(&args, &rd).with_context(|| format!("run `{}`", run.name))?,
                out: rd,
            },
            step,
            device,
        ));
    }
    Ok(out)
}

/// Trains the unfinished runs of one job: together when they all start fresh or all resume from
/// the same step, else one after the other.
fn train_job(dir: &Path, plan: &Plan, index: usize) -> anyhow::Result<()> {
    let runs = plan.job_runs(index)?;
    let todo = job_runs(dir, &runs)?;
    if todo.is_empty() {
        outln!("job {index}: every run is finished")?;
        return Ok(());
    }
    let steps: Vec<Option<u64>> = todo.iter().map(|(_, s, _)| *s).collect();
    let device = todo[0].2;
    let together = steps.iter().all(|s| *s == steps[0]);
    let label = dir.join(hyperlens_sweep::RUNS_DIR);
    if together {
        let options = RunOptions {
            device,
            resume: steps[0].is_some(),
        };
        let runs: Vec<GroupRun> = todo.into_iter().map(|(r, _, _)| r).collect();
        return train_together(&runs, &options, true, None, &label);
    }
    for (run, step, device) in todo {
        let options = RunOptions {
            device,
            resume: step.is_some(),
        };
        train_together(std::slice::from_ref(&run), &options, true, None, &run.out)?;
    }
    Ok(())
}

/// `sweep run-one`: takes the job's lock, records the attempt, trains the job, records how it
/// ended.
fn run_one(dir: &Path, index: usize) -> anyhow::Result<()> {
    let plan = Plan::read(dir)?;
    plan.job_runs(index)?;
    let _lock = JobLock::acquire(dir, index)?;
    let attempt = JobRecord::read(dir, index)?.map_or(1, |r| r.attempt + 1);
    let mut record = JobRecord {
        index,
        executor: Executor::current(),
        status: JobStatus::Running,
        started_unix: hyperlens_sweep::state::now_unix(),
        ended_unix: None,
        error: None,
        attempt,
    };
    record.write(dir)?;
    outln!(
        "sweep {} job {index} (attempt {attempt}, {}): {}",
        plan.name,
        record.executor.describe(),
        plan.jobs[index].runs.join(", ")
    )?;
    let result = train_job(dir, &plan, index);
    record.ended_unix = Some(hyperlens_sweep::state::now_unix());
    match &result {
        Ok(()) => record.status = JobStatus::Finished,
        Err(e) => {
            record.status = JobStatus::Failed;
            record.error = Some(format!("{e:#}"));
        }
    }
    record.write(dir)?;
    result
}

/// The threads each of `jobs` child processes gets: this process's share of `RAYON_NUM_THREADS`
/// (set by `main` when the user did not), at least 1.
fn threads_per_job(jobs: usize) -> usize {
    let total = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (total / jobs.max(1)).max(1)
}

/// `sweep run`: the local executor.
fn run_local(a: RunArgs) -> anyhow::Result<()> {
    if a.jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    let dir = &a.dir;
    let plan = Plan::read(dir)?;
    let todo = jobs_to_run(dir, &plan, a.retry_failed)?;
    let status = sweep_status(dir, &plan)?;
    let count = |s: RunState| status.iter().filter(|r| r.state == s).count();
    outln!(
        "sweep {}: {} runs ({} finished, {} failed, {} running elsewhere); {} of {} jobs to run, {} at a time",
        plan.name,
        plan.runs.len(),
        count(RunState::Finished),
        count(RunState::Failed),
        count(RunState::Running),
        todo.len(),
        plan.jobs.len(),
        a.jobs
    )?;
    if count(RunState::Failed) > 0 && !a.retry_failed {
        outln!("failed runs are not retried without --retry-failed")?;
    }
    let exe = std::env::current_exe().context("finding this binary")?;
    let logs = dir.join(LOGS_DIR);
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let threads = threads_per_job(a.jobs);
    let bar = if std::io::stderr().is_terminal() {
        super::common::progress_bar(todo.len() as u64, "sweep", "jobs")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut queue = todo.into_iter();
    let mut running: Vec<(usize, Child, Instant)> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut done = 0u64;
    loop {
        while running.len() < a.jobs {
            let Some(index) = queue.next() else { break };
            // Another executor may have taken the job since the queue was made.
            if JobLock::is_held(dir, index)? {
                bar.suspend(|| {
                    let _ = outln!("job {index} is running in another process; skipped");
                });
                continue;
            }
            let log = logs.join(format!("job-{index}.log"));
            // Appending to a link would write outside the sweep, and opening a FIFO would wait.
            super::common::regular_file_or_absent(&log)?;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .with_context(|| format!("opening {}", log.display()))?;
            let child = Command::new(&exe)
                .arg("sweep")
                .arg("run-one")
                .arg(dir)
                .arg("--index")
                .arg(index.to_string())
                .env("RAYON_NUM_THREADS", threads.to_string())
                .stdin(Stdio::null())
                .stdout(file.try_clone().context("log file")?)
                .stderr(file)
                .spawn()
                .with_context(|| format!("starting job {index}"))?;
            bar.suspend(|| {
                let _ = outln!(
                    "job {index} started (pid {}): {}; log {}",
                    child.id(),
                    plan.jobs[index].runs.join(", "),
                    log.display()
                );
            });
            running.push((index, child, Instant::now()));
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut i = 0;
        while i < running.len() {
            let exited = running[i]
                .1
                .try_wait()
                .with_context(|| format!("waiting for job {}", running[i].0))?;
            let Some(code) = exited else {
                i += 1;
                continue;
            };
            let (index, _, t0) = running.swap_remove(i);
            done += 1;
            bar.set_position(done);
            let secs = t0.elapsed().as_secs_f64();
            if code.success() {
                bar.suspend(|| {
                    let _ = outln!("job {index} finished in {secs:.1} s");
                });
            } else if JobLock::is_held(dir, index)? {
                // It lost the race for the job's lock: another process runs the job.
                bar.suspend(|| {
                    let _ = outln!("job {index} is running in another process; skipped");
                });
            } else {
                // A job killed before it could record its end still says `running` (unless
                // another process holds the job now: then the record is that process's).
                let stale = JobRecord::read(dir, index)?
                    .filter(|r| r.status == JobStatus::Running)
                    .filter(|_| !JobLock::is_held(dir, index).unwrap_or(true));
                if let Some(mut r) = stale {
                    r.status = JobStatus::Failed;
                    r.ended_unix = Some(hyperlens_sweep::state::now_unix());
                    r.error = Some(format!("the job's process ended with {code}"));
                    r.write(dir)?;
                }
                let why = JobRecord::read(dir, index)?
                    .and_then(|r| r.error)
                    .unwrap_or_else(|| code.to_string());
                bar.suspend(|| {
                    let _ = outln!(
                        "job {index} failed after {secs:.1} s: {why} (log {})",
                        logs.join(format!("job-{index}.log")).display()
                    );
                });
                failed.push(format!("job {index} ({why})"));
            }
        }
    }
    bar.finish_and_clear();
    let status = sweep_status(dir, &plan)?;
    let finished = status
        .iter()
        .filter(|r| r.state == RunState::Finished)
        .count();
    outln!(
        "sweep {}: {finished} of {} runs finished",
        plan.name,
        plan.runs.len()
    )?;
    if !failed.is_empty() {
        bail!(
            "{} job(s) failed: {}; see `hyperlens sweep status {}`",
            failed.len(),
            failed.join("; "),
            dir.display()
        );
    }
    Ok(())
}

/// The array task ids of `job_id` still in Slurm's queue (pending or running); empty when squeue
/// cannot be run.
fn queued_tasks(job_id: &str) -> Vec<usize> {
    let Ok(out) = Command::new("squeue")
        .args(["-h", "-r", "-j", job_id, "-o", "%K"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse::<usize>().ok())
        .collect()
}

/// `sweep submit --slurm`.
fn submit(a: SubmitArgs) -> anyhow::Result<()> {
    let dir = std::fs::canonicalize(&a.dir)
        .with_context(|| format!("the sweep directory {}", a.dir.display()))?;
    let plan = Plan::read(&dir)?;
    let queued: Vec<usize> = slurm::submissions(&dir)?
        .iter()
        .flat_map(|s| queued_tasks(&s.job_id))
        .collect();
    let indices: Vec<usize> = jobs_to_run(&dir, &plan, a.resubmit_failed)?
        .into_iter()
        .filter(|i| !queued.contains(i))
        .collect();
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
    for s in &status {
        let step = match (s.step, s.planned) {
            (Some(d), Some(p)) => format!("{d}/{p}"),
            (Some(d), None) => d.to_string(),
            (None, Some(p)) => format!("0/{p}"),
            (None, None) => "-".into(),
        };
        let eval = s.last_eval.map_or_else(
            || "-".to_string(),
            |e| {
                let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.4}"));
                format!("step {}: {} / {}", e.step, f(e.id), f(e.ood))
            },
        );
        let mut place = s.ran.clone().unwrap_or_else(|| "-".into());
        if let Some(err) = &s.error {
            place = format!("{place}; error: {err}");
        }
        outln!(
            "{:<width$}  {:>3}  {:<11}  {:>15}  {:<28}  {place}",
            s.name,
            s.job,
            s.state.to_string(),
            step,
            eval
        )?;
    }
    let count = |st: RunState| status.iter().filter(|r| r.state == st).count();
    outln!(
        "{} runs: {} finished, {} running, {} interrupted, {} pending, {} failed",
        status.len(),
        count(RunState::Finished),
        count(RunState::Running),
        count(RunState::Interrupted),
        count(RunState::Pending),
        count(RunState::Failed)
    )?;
    Ok(())
}
