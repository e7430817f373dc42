//! A sweep's plan: the spec expanded into named runs, and the runs grouped into jobs (one process
//! each). Written once by `hyperlens sweep plan` as `plan.json` in the sweep directory; everything
//! after (executors, status, report) reads it.
//!
//! Layout of a sweep directory:
//! ```text
//! plan.json          the runs and jobs (this module)
//! spec.toml          the spec it was planned from
//! runs/<name>/       one ordinary run directory (checkpoint) per run
//! jobs/<index>.json  where and how each job ran (crate::state)
//! jobs/<index>.lock  held while a process runs the job
//! logs/              the jobs' output (local: job-<index>.log; Slurm: slurm-<job>_<task>.out)
//! slurm/             the sbatch scripts and submissions.json (crate::slurm)
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Result, SweepError};
use crate::spec::{Scalar, SweepSpec, BATCHABLE_KEYS};

/// File name of the plan in a sweep directory.
pub const PLAN_FILE: &str = "plan.json";
/// File name of the spec's copy in a sweep directory.
pub const SPEC_FILE: &str = "spec.toml";
/// Directory of the run directories.
pub const RUNS_DIR: &str = "runs";

/// One run of a sweep: its name and the `train` arguments that make it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedRun {
    /// Deterministic name from the swept values that differ (`mixer-hyla_seed-0`); `run` when
    /// nothing varies.
    pub name: String,
    /// Every argument of the run: the base, then its axis values, in the spec's order.
    pub args: Vec<(String, Scalar)>,
    /// Its values of the swept axes only, in the spec's order.
    pub point: Vec<(String, Scalar)>,
    /// The job (index into [`Plan::jobs`]) that trains it.
    pub job: usize,
}

impl PlannedRun {
    /// The value of argument `key`, if the run sets it.
    pub fn arg(&self, key: &str) -> Option<&Scalar> {
        self.args.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The run's command-line arguments for `hyperlens train` (without `--out`): `--key value`,
    /// `--flag` for `true`, nothing for `false`.
    pub fn train_args(&self) -> Vec<String> {
        let mut out = Vec::with_capacity(2 * self.args.len());
        for (k, v) in &self.args {
            let flag = format!("--{}", k.replace('_', "-"));
            match (v, v.arg()) {
                (Scalar::Bool(true), _) => out.push(flag),
                (Scalar::Bool(false), _) => {}
                (_, Some(a)) => {
                    out.push(flag);
                    out.push(a);
                }
                (_, None) => {}
            }
        }
        out
    }
}

/// One job: the runs one process trains (together in one batched model when there are several).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its index (the Slurm array task id).
    pub index: usize,
    /// The names of its runs.
    pub runs: Vec<String>,
}

/// A planned sweep (module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The sweep's name (its directory's name when planned).
    pub name: String,
    /// The spec it was expanded from.
    pub spec: SweepSpec,
    /// The runs, in grid order (the first axis varies slowest).
    pub runs: Vec<PlannedRun>,
    /// The jobs, in the order of their first run.
    pub jobs: Vec<Job>,
    /// hyperlens version that planned it.
    pub version: String,
}

/// Checks that the directories a sweep writes into (`runs/`, `jobs/`, `logs/`, `slurm/`) are,
/// where they exist, real directories inside `dir`: a symbolic link there would lead the runs'
/// training, the job records or the logs out of the sweep.
///
/// # Errors
/// [`SweepError::Plan`] naming the path.
pub fn check_layout(dir: &Path) -> Result<()> {
    for sub in [
        RUNS_DIR,
        crate::state::JOBS_DIR,
        crate::state::LOGS_DIR,
        crate::slurm::SLURM_DIR,
    ] {
        let path = dir.join(sub);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(SweepError::Plan(format!(
                    "{} is a symbolic link; a sweep writes only into directories inside it",
                    path.display()
                )))
            }
            Ok(m) if !m.is_dir() => {
                return Err(SweepError::Plan(format!(
                    "{} is not a directory",
                    path.display()
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The number of runs `spec` expands into (saturating at `usize::MAX`): the product of the
/// lengths of its factors (a zip group counts once).
pub fn run_count(spec: &SweepSpec) -> usize {
    let mut seen_groups: Vec<usize> = Vec::new();
    let mut n = 1usize;
    for axis in &spec.axes {
        if let Some(g) = spec.zip.iter().position(|g| g.contains(&axis.key)) {
            if seen_groups.contains(&g) {
                continue;
            }
            seen_groups.push(g);
        }
        n = n.saturating_mul(axis.values.len());
    }
    n
}

/// An estimate of the bytes one planned run takes at the peak of `sweep plan`: its name, its
/// arguments and its point with the strings' and vectors' overheads, the expanded combination,
/// the name index and its share of `plan.json`'s text (calibrated on `sweep plan` of 10^5 runs of
/// two axes: about 1.5 KiB of peak resident memory per run).
fn run_bytes(spec: &SweepSpec) -> u128 {
    let keys = (spec.base.len() + 2 * spec.axes.len()) as u128;
    1024 + 128 * keys
}

/// The longest sweep name, in bytes.
const MAX_SWEEP_NAME: usize = 255;

/// Checks a sweep's name (its directory's name when planned), which the Slurm script writes into
/// `#SBATCH --job-name` and a comment: 1 to 255 bytes, no control character (a newline would end
/// the `#SBATCH` block), no `/`, and none of `"`, `'`, `\`, `#` or white space, which Slurm's
/// parsing of `#SBATCH` lines treats specially.
///
/// # Errors
/// The reason, in words.
pub fn check_sweep_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > MAX_SWEEP_NAME {
        return Err(format!(
            "a sweep name of {} bytes (1 to {MAX_SWEEP_NAME})",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_control() || c.is_whitespace() || matches!(c, '/' | '"' | '\'' | '\\' | '#'))
    {
        return Err(format!(
            "{} holds {c:?}, which a Slurm script cannot hold; name the sweep's directory with \
             letters, digits, `_`, `-`, `+` and `.`",
            hyperlens_train::shown_name(name)
        ));
    }
    Ok(())
}

/// The combinations of a spec's axes: zipped groups vary together, the rest form a grid; the
/// first factor (by its first key's position) varies slowest. Each combination lists the axis
/// values in the spec's order.
fn combinations(spec: &SweepSpec) -> Vec<Vec<(String, Scalar)>> {
    // Factors: a zip group or a single axis, in the order of their first axis.
    let mut factors: Vec<Vec<usize>> = Vec::new();
    for (i, axis) in spec.axes.iter().enumerate() {
        if let Some(g) = spec.zip.iter().find(|g| g.contains(&axis.key)) {
            let placed = factors
                .iter()
                .any(|f| f.iter().any(|&j| g.contains(&spec.axes[j].key)));
            if !placed {
                factors.push(
                    spec.axes
                        .iter()
                        .enumerate()
                        .filter(|(_, a)| g.contains(&a.key))
                        .map(|(j, _)| j)
                        .collect(),
                );
            }
        } else {
            factors.push(vec![i]);
        }
    }
    let mut combos: Vec<Vec<(usize, usize)>> = vec![Vec::new()];
    for f in &factors {
        let len = spec.axes[f[0]].values.len();
        let mut next = Vec::with_capacity(combos.len() * len);
        for c in &combos {
            for v in 0..len {
                let mut c = c.clone();
                c.extend(f.iter().map(|&a| (a, v)));
                next.push(c);
            }
        }
        combos = next;
    }
    combos
        .into_iter()
        .map(|mut c| {
            c.sort_unstable();
            c.into_iter()
                .map(|(a, v)| (spec.axes[a].key.clone(), spec.axes[a].values[v].clone()))
                .collect()
        })
        .collect()
}

impl Plan {
    /// The name of the sweep planned into the directory `out`: the directory's name with letters,
    /// digits, `_`, `-`, `+` and `.` kept and anything else (white space, quotes, control
    /// characters) as `-`, at most 200 characters, so that it can stand in a Slurm script's
    /// `#SBATCH --job-name`; `sweep` when nothing is left.
    pub fn name_for(out: &Path) -> String {
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

    /// Checks every run of the plan, to be written into `out`, as `train` would check it, and
    /// every job's models (the runs it trains together) against the memory budget, before the
    /// sweep directory is made: `settings_of(run, run_dir)` gives a run's checked settings from
    /// its arguments.
    ///
    /// # Errors
    /// The first error of `settings_of`; [`hyperlens_train::check_memory`]'s for a job over the
    /// budget, naming the job and its runs (`job_error(job, runs, error)` words it).
    pub fn check_runs<E, S, J>(
        &self,
        out: &Path,
        mut settings_of: S,
        job_error: J,
    ) -> std::result::Result<(), E>
    where
        S: FnMut(&PlannedRun, &Path) -> std::result::Result<hyperlens_train::TrainSettings, E>,
        J: Fn(usize, usize, hyperlens_train::TrainError) -> E,
    {
        let mut firsts: Vec<Option<hyperlens_train::TrainSettings>> = vec![None; self.jobs.len()];
        for run in &self.runs {
            let s = settings_of(run, &Plan::run_dir(out, &run.name))?;
            if firsts[run.job].is_none() {
                firsts[run.job] = Some(s);
            }
        }
        for (job, first) in self.jobs.iter().zip(&firsts) {
            if let Some(s) = first {
                hyperlens_train::check_memory(s, job.runs.len())
                    .map_err(|e| job_error(job.index, job.runs.len(), e))?;
            }
        }
        Ok(())
    }

    /// Expands `spec` into runs and jobs. Run names list `key-value` for every axis with more than
    /// one value (`_` between them, `-` for `_` in keys). With `spec.batch`, runs whose arguments
    /// differ only in [`BATCHABLE_KEYS`] share a job, at most `spec.max_batch` per job, except
    /// runs of the induction task (the token model is not batched).
    ///
    /// # Errors
    /// [`SweepError::Budget`] if the plan of that many runs ([`run_count`]) would exceed the
    /// memory budget, checked before anything is built; [`SweepError::Plan`] for a `name` that
    /// [`check_sweep_name`] refuses; [`SweepError::Spec`] if two runs get the same name (values
    /// that differ only in characters a name cannot hold) or a name is not a valid run name
    /// (longer than 255 bytes).
    ///
    /// # Complexity
    /// Linear in the number of runs (hash maps for the names and the open jobs).
    pub fn expand(name: &str, spec: &SweepSpec) -> Result<Plan> {
        check_sweep_name(name)
            .map_err(|why| SweepError::Plan(format!("the sweep's name: {why}")))?;
        let n_runs = run_count(spec);
        hyperlens_io::budget::check_alloc(
            format!("the sweep's {n_runs} runs (its plan)"),
            (n_runs as u128).saturating_mul(run_bytes(spec)),
        )?;
        let varying: Vec<&str> = spec
            .axes
            .iter()
            .filter(|a| a.values.len() > 1)
            .map(|a| a.key.as_str())
            .collect();
        let mut runs: Vec<PlannedRun> = Vec::with_capacity(n_runs);
        let mut names: HashMap<String, usize> = HashMap::with_capacity(n_runs);
        for point in combinations(spec) {
            let parts: Vec<String> = point
                .iter()
                .filter(|(k, _)| varying.contains(&k.as_str()))
                .map(|(k, v)| format!("{}-{}", k.replace('_', "-"), v.label()))
                .collect();
            let run_name = if parts.is_empty() {
                "run".to_string()
            } else {
                parts.join("_")
            };
            if let Some(&other) = names.get(&run_name) {
                let show = |p: &[(String, Scalar)]| {
                    p.iter()
                        .map(|(k, v)| format!("{k} = {}", v.arg().unwrap_or_else(|| v.label())))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(SweepError::Spec(format!(
                    "two runs would be named `{run_name}` ({} and {}): make the values differ \
                     in letters or digits",
                    show(&runs[other].point),
                    show(&point)
                )));
            }
            hyperlens_train::check_run_name(&run_name).map_err(|why| {
                SweepError::Spec(format!(
                    "the run {}: {why}",
                    hyperlens_train::shown_name(&run_name)
                ))
            })?;
            names.insert(run_name.clone(), runs.len());
            let mut args = spec.base.clone();
            args.extend(point.iter().cloned());
            runs.push(PlannedRun {
                name: run_name,
                args,
                point,
                job: 0,
            });
        }
        // The job still open for runs with the same non-batchable arguments (keyed by their
        // JSON text, since floats do not hash).
        let mut jobs: Vec<Job> = Vec::new();
        let mut open: HashMap<String, usize> = HashMap::new();
        for run in &mut runs {
            let key: Vec<&(String, Scalar)> = run
                .args
                .iter()
                .filter(|(k, _)| !BATCHABLE_KEYS.contains(&k.as_str()))
                .collect();
            let key = serde_json::to_string(&key).map_err(|e| SweepError::Spec(e.to_string()))?;
            let induction = matches!(run.arg("task"), Some(Scalar::Str(t)) if t == "induction");
            let batched = spec.batch && !induction;
            let index = match open.get(&key).copied().filter(|_| batched) {
                Some(index) => {
                    jobs[index].runs.push(run.name.clone());
                    index
                }
                None => {
                    let index = jobs.len();
                    jobs.push(Job {
                        index,
                        runs: vec![run.name.clone()],
                    });
                    if batched {
                        open.insert(key.clone(), index);
                    }
                    index
                }
            };
            if jobs[index].runs.len() >= spec.max_batch {
                open.remove(&key);
            }
            run.job = index;
        }
        Ok(Plan {
            name: name.to_string(),
            spec: spec.clone(),
            runs,
            jobs,
            version: env!("CARGO_PKG_VERSION").to_string(),
        })
    }

    /// Checks a plan read from a file: everything that is later joined to a path or written into
    /// a script (module docs). One pass over the runs and jobs, with hash maps.
    ///
    /// # Errors
    /// [`SweepError::Plan`] naming `path` and the entry: a sweep name that cannot be written into
    /// a Slurm script, no runs, a run name that breaks [`hyperlens_train::check_run_name`] (a path
    /// that would leave the sweep), a name used twice, an argument given twice, not a train flag,
    /// or set by the sweep itself ([`crate::RESERVED_KEYS`]), a run naming a job that does not exist
    /// or does not list it, a job with the wrong index, an empty job, or a job listing an unknown
    /// run or a run twice.
    fn check(&self, path: &Path) -> Result<()> {
        let bad = |what: String| SweepError::Plan(format!("{}: {what}", path.display()));
        check_sweep_name(&self.name).map_err(|why| bad(format!("`name`: {why}")))?;
        if self.runs.is_empty() {
            return Err(bad(
                "`runs` is empty; a sweep has at least one run (the file is damaged)".into(),
            ));
        }
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(self.runs.len());
        for (i, run) in self.runs.iter().enumerate() {
            hyperlens_train::check_run_name(&run.name).map_err(|why| {
                bad(format!(
                    "runs[{i}].name {}: {why}",
                    hyperlens_train::shown_name(&run.name)
                ))
            })?;
            if index.insert(&run.name, i).is_some() {
                return Err(bad(format!("runs[{i}].name `{}` is used twice", run.name)));
            }
            let mut keys = std::collections::HashSet::with_capacity(run.args.len());
            for (key, _) in &run.args {
                if !keys.insert(key.as_str()) {
                    return Err(bad(format!(
                        "runs[{i}] (`{}`) sets `{key}` twice",
                        run.name
                    )));
                }
                if !crate::spec::valid_key(key) || crate::RESERVED_KEYS.contains(&key.as_str()) {
                    return Err(bad(format!(
                        "runs[{i}] (`{}`) sets {}, which a sweep may not set",
                        run.name,
                        hyperlens_train::shown_name(key)
                    )));
                }
            }
            if run.job >= self.jobs.len() {
                return Err(bad(format!(
                    "runs[{i}] (`{}`) names job {}, but the plan has {} jobs",
                    run.name,
                    run.job,
                    self.jobs.len()
                )));
            }
        }
        let mut listed = vec![false; self.runs.len()];
        for (j, job) in self.jobs.iter().enumerate() {
            if job.index != j {
                return Err(bad(format!("jobs[{j}] has index {}", job.index)));
            }
            if job.runs.is_empty() {
                return Err(bad(format!("jobs[{j}] lists no run")));
            }
            for name in &job.runs {
                let Some(&r) = index.get(name.as_str()) else {
                    return Err(bad(format!(
                        "jobs[{j}] lists the run {}, which is not among `runs`",
                        hyperlens_train::shown_name(name)
                    )));
                };
                if listed[r] || self.runs[r].job != j {
                    return Err(bad(format!(
                        "jobs[{j}] lists the run `{name}`, which belongs to job {} (or is listed twice)",
                        self.runs[r].job
                    )));
                }
                listed[r] = true;
            }
        }
        if let Some(r) = listed.iter().position(|l| !l) {
            return Err(bad(format!(
                "runs[{r}] (`{}`) is in no job's list",
                self.runs[r].name
            )));
        }
        Ok(())
    }

    /// Reads `plan.json` of the sweep directory `dir`.
    ///
    /// # Errors
    /// [`SweepError::Plan`] naming the file if it is missing, not a regular file, malformed, or
    /// damaged (as `Plan::check` says: every name is checked before it is joined to a path), or
    /// naming the directory where the sweep's layout is broken ([`check_layout`]).
    pub fn read(dir: &Path) -> Result<Plan> {
        let path = dir.join(PLAN_FILE);
        let bytes = hyperlens_io::read_regular(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => SweepError::Plan(format!(
                "{}: not a sweep directory (no {PLAN_FILE}; make one with `hyperlens sweep plan \
                 SPEC --out {}`)",
                dir.display(),
                dir.display()
            )),
            _ => SweepError::Plan(format!("{}: cannot be read: {e}", path.display())),
        })?;
        let plan: Plan = serde_json::from_slice(&bytes)
            .map_err(|e| SweepError::Plan(format!("{}: {e}", path.display())))?;
        plan.check(&path)?;
        check_layout(dir)?;
        Ok(plan)
    }

    /// Writes `plan.json` and `spec.toml` (the spec's text) into `dir` (created), atomically.
    /// Planning again into a directory that holds the same plan does nothing.
    ///
    /// # Errors
    /// [`SweepError::Plan`] if `dir` holds a different plan or other files; write errors.
    pub fn write(&self, dir: &Path, spec_text: &str) -> Result<()> {
        if dir.join(PLAN_FILE).exists() {
            let old = Plan::read(dir)?;
            let same = Plan {
                version: self.version.clone(),
                ..old
            } == *self;
            if same {
                return Ok(());
            }
            return Err(SweepError::Plan(format!(
                "{} already holds a different plan; choose another --out, or remove it",
                dir.display()
            )));
        }
        if dir.is_file() {
            return Err(SweepError::Plan(format!(
                "--out {} is a file, not a directory",
                dir.display()
            )));
        }
        if dir.exists()
            && std::fs::read_dir(dir)
                .map_err(SweepError::io(dir))?
                .next()
                .is_some()
        {
            return Err(SweepError::Plan(format!(
                "--out {} is not empty and holds no plan",
                dir.display()
            )));
        }
        std::fs::create_dir_all(dir.join(RUNS_DIR)).map_err(SweepError::io(dir))?;
        hyperlens_io::write_atomic(&dir.join(SPEC_FILE), spec_text.as_bytes())?;
        hyperlens_io::write_json(&dir.join(PLAN_FILE), self)?;
        Ok(())
    }

    /// The run directory of `run` in the sweep directory `dir`.
    pub fn run_dir(dir: &Path, run: &str) -> PathBuf {
        dir.join(RUNS_DIR).join(run)
    }

    /// The runs of job `index`.
    ///
    /// # Errors
    /// [`SweepError::Plan`] for an index outside the plan.
    pub fn job_runs(&self, index: usize) -> Result<Vec<&PlannedRun>> {
        let job = self.jobs.get(index).ok_or_else(|| {
            SweepError::Plan(format!(
                "--index {index}: the sweep `{}` has {} jobs (0..{})",
                self.name,
                self.jobs.len(),
                self.jobs.len().saturating_sub(1)
            ))
        })?;
        let wanted: std::collections::HashSet<&str> = job.runs.iter().map(String::as_str).collect();
        Ok(self
            .runs
            .iter()
            .filter(|r| wanted.contains(r.name.as_str()))
            .collect())
    }
}

#[cfg(test)]
mod tests;
