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
    /// Expands `spec` into runs and jobs. Run names list `key-value` for every axis with more than
    /// one value (`_` between them, `-` for `_` in keys). With `spec.batch`, runs whose arguments
    /// differ only in [`BATCHABLE_KEYS`] share a job, at most `spec.max_batch` per job, except
    /// runs of the induction task (the token model is not batched).
    ///
    /// # Errors
    /// [`SweepError::Spec`] if two runs get the same name (values that differ only in characters
    /// a name cannot hold).
    pub fn expand(name: &str, spec: &SweepSpec) -> Result<Plan> {
        let varying: Vec<&str> = spec
            .axes
            .iter()
            .filter(|a| a.values.len() > 1)
            .map(|a| a.key.as_str())
            .collect();
        let mut runs: Vec<PlannedRun> = Vec::new();
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
            if let Some(other) = runs.iter().find(|r| r.name == run_name) {
                return Err(SweepError::Spec(format!(
                    "two runs would be named `{run_name}` ({:?} and {:?}): make the values differ \
                     in letters or digits",
                    other.point, point
                )));
            }
            let mut args = spec.base.clone();
            args.extend(point.iter().cloned());
            runs.push(PlannedRun {
                name: run_name,
                args,
                point,
                job: 0,
            });
        }
        let mut jobs: Vec<(Vec<(String, Scalar)>, Job)> = Vec::new();
        for run in &mut runs {
            let key: Vec<(String, Scalar)> = run
                .args
                .iter()
                .filter(|(k, _)| !BATCHABLE_KEYS.contains(&k.as_str()))
                .cloned()
                .collect();
            let induction = matches!(run.arg("task"), Some(Scalar::Str(t)) if t == "induction");
            let open = if spec.batch && !induction {
                jobs.iter_mut()
                    .find(|(k, j)| *k == key && j.runs.len() < spec.max_batch)
            } else {
                None
            };
            let index = match open {
                Some((_, job)) => {
                    job.runs.push(run.name.clone());
                    job.index
                }
                None => {
                    let index = jobs.len();
                    jobs.push((
                        key,
                        Job {
                            index,
                            runs: vec![run.name.clone()],
                        },
                    ));
                    index
                }
            };
            run.job = index;
        }
        Ok(Plan {
            name: name.to_string(),
            spec: spec.clone(),
            runs,
            jobs: jobs.into_iter().map(|(_, j)| j).collect(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        })
    }

    /// Reads `plan.json` of the sweep directory `dir`.
    ///
    /// # Errors
    /// [`SweepError::Plan`] naming the file if it is missing or malformed.
    pub fn read(dir: &Path) -> Result<Plan> {
        let path = dir.join(PLAN_FILE);
        let bytes = std::fs::read(&path).map_err(|_| {
            SweepError::Plan(format!(
                "{}: not a sweep directory (no {PLAN_FILE}; make one with `hyperlens sweep plan \
                 SPEC --out {}`)",
                dir.display(),
                dir.display()
            ))
        })?;
        let plan: Plan = serde_json::from_slice(&bytes)
            .map_err(|e| SweepError::Plan(format!("{}: {e}", path.display())))?;
        if plan.runs.iter().any(|r| r.job >= plan.jobs.len()) {
            return Err(SweepError::Plan(format!(
                "{}: a run names a job that does not exist",
                path.display()
            )));
        }
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
        Ok(job
            .runs
            .iter()
            .filter_map(|n| self.runs.iter().find(|r| &r.name == n))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> SweepSpec {
        SweepSpec::parse(text, "s.toml").unwrap()
    }

    #[test]
    fn axes_form_a_grid_and_zipped_axes_vary_together() {
        let s = spec(
            "[base]\ntask = \"sraven\"\nsteps = 40\n[axes]\nmixer = [\"hyla\", \"softmax\"]\n\
             seed = [0, 1, 2]\nsplit = [\"paper-seed0\", \"paper-seed1\", \"paper-seed2\"]\n\
             [sweep]\nzip = [[\"seed\", \"split\"]]\n",
        );
        let p = Plan::expand("t", &s).unwrap();
        let names: Vec<&str> = p.runs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "mixer-hyla_seed-0_split-paper-seed0",
                "mixer-hyla_seed-1_split-paper-seed1",
                "mixer-hyla_seed-2_split-paper-seed2",
                "mixer-softmax_seed-0_split-paper-seed0",
                "mixer-softmax_seed-1_split-paper-seed1",
                "mixer-softmax_seed-2_split-paper-seed2",
            ]
        );
        // Seeds and splits batch; mixers do not.
        assert_eq!(p.jobs.len(), 2);
        assert_eq!(p.jobs[1].runs.len(), 3);
        assert!(p.runs[3..].iter().all(|r| r.job == 1));
        assert_eq!(
            p.runs[4].train_args(),
            [
                "--task",
                "sraven",
                "--steps",
                "40",
                "--mixer",
                "softmax",
                "--seed",
                "1",
                "--split",
                "paper-seed1"
            ]
        );
        // Without zip: a 2 x 3 x 3 grid.
        let g = spec(
            "[axes]\nmixer = [\"hyla\", \"softmax\"]\nseed = [0, 1, 2]\nsplit = [\"a\", \"b\", \"c\"]\n",
        );
        assert_eq!(Plan::expand("g", &g).unwrap().runs.len(), 18);
    }

    #[test]
    fn jobs_respect_batching_limits() {
        let s = spec("[axes]\nseed = [0, 1, 2]\n[sweep]\nbatch = false\n");
        assert_eq!(Plan::expand("t", &s).unwrap().jobs.len(), 3);
        let s = spec("[axes]\nseed = [0, 1, 2]\n[sweep]\nmax_batch = 2\n");
        let p = Plan::expand("t", &s).unwrap();
        assert_eq!(
            p.jobs.iter().map(|j| j.runs.len()).collect::<Vec<_>>(),
            [2, 1]
        );
        let s = spec("[base]\ntask = \"induction\"\n[axes]\nseed = [0, 1]\n");
        assert_eq!(Plan::expand("t", &s).unwrap().jobs.len(), 2);
        // Different step counts never share a job.
        let s = spec("[axes]\nsteps = [10, 20]\nseed = [0, 1]\n");
        let p = Plan::expand("t", &s).unwrap();
        assert_eq!(p.jobs.len(), 2);
        assert_eq!(p.runs[0].name, "steps-10_seed-0");
        // One run: named `run`.
        let s = spec("[base]\nsteps = 5\n");
        assert_eq!(Plan::expand("t", &s).unwrap().runs[0].name, "run");
        // Labels that collide are refused.
        let s = spec("[axes]\nsplit = [\"a b\", \"a-b\"]\n");
        assert!(Plan::expand("t", &s)
            .unwrap_err()
            .to_string()
            .contains("`split-a-b`"));
    }

    #[test]
    fn a_plan_is_written_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec("[axes]\nseed = [0, 1]\n");
        let p = Plan::expand("t", &s).unwrap();
        let d = dir.path().join("sw");
        p.write(&d, "[axes]\nseed = [0, 1]\n").unwrap();
        assert_eq!(Plan::read(&d).unwrap(), p);
        p.write(&d, "").unwrap();
        let other = Plan::expand("t", &spec("[axes]\nseed = [0, 2]\n")).unwrap();
        assert!(other
            .write(&d, "")
            .unwrap_err()
            .to_string()
            .contains("different plan"));
        assert!(Plan::read(dir.path())
            .unwrap_err()
            .to_string()
            .contains("plan.json"));
        assert!(p.job_runs(5).unwrap_err().to_string().contains("--index 5"));
    }
}
