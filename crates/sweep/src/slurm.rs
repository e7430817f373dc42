//! Running a sweep's jobs as a Slurm job array: one array task per job, each running
//! `hyperlens sweep run-one DIR --index $SLURM_ARRAY_TASK_ID`.
//!
//! The cluster must share the sweep directory's file system between the submitting host and the
//! compute nodes, and the nodes must be able to run the binary at the path the script names
//! (`docs/sweeps.md`). hyperlens writes the script, submits it with `sbatch --parsable`, and
//! records each submission in `slurm/submissions.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::{Result, SweepError};
use crate::plan::Plan;
use crate::state::{now_unix, LOGS_DIR};

/// Directory of the scripts and the submission log in a sweep directory.
pub const SLURM_DIR: &str = "slurm";
/// The submission log.
pub const SUBMISSIONS_FILE: &str = "submissions.json";

/// The `#SBATCH` options of a submission.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmOptions {
    /// `--partition`.
    pub partition: Option<String>,
    /// `--gres` (e.g. `gpu:1`).
    pub gres: Option<String>,
    /// `--time` (e.g. `02:00:00`).
    pub time: Option<String>,
    /// `--cpus-per-task`.
    pub cpus_per_task: Option<u32>,
    /// `--mem` (e.g. `8G`).
    pub mem: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// Most array tasks running at once (`--array=...%N`).
    pub max_parallel: Option<u32>,
}

/// One submission, as recorded in `slurm/submissions.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submission {
    /// The array's job id.
    pub job_id: String,
    /// The script submitted.
    pub script: String,
    /// The job indices (array task ids) it runs.
    pub indices: Vec<usize>,
    /// When, seconds since the Unix epoch.
    pub submitted_unix: u64,
}

/// `0-3` or `0,2,5-7`: Slurm's array syntax for sorted `indices`.
pub fn array_spec(indices: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let start = indices[i];
        let mut end = start;
        while i + 1 < indices.len() && indices[i + 1] == end + 1 {
            i += 1;
            end = indices[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// Quotes `s` for a POSIX shell (single quotes).
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Checks that `value` (named `what` in the error) can stand in a script: not empty, and no
/// control character (a newline would end an `#SBATCH` block or a shell command).
fn check_script_value(what: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(SweepError::Plan(format!("{what}: an empty value")));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(SweepError::Plan(format!(
            "{what} {}: holds the control character {c:?}, which a Slurm script cannot hold",
            hyperlens_train::shown_name(value)
        )));
    }
    Ok(())
}

/// `value` as the value of an `#SBATCH --flag=` line: as it is when it holds only characters that
/// sbatch's directive parser takes literally, else in double quotes (white space, `'`, `#`).
///
/// # Errors
/// [`SweepError::Plan`] naming `what` for a value with a control character, `"` or `\`, which
/// the directive parser would read as the end of a quote or an escape.
fn sbatch_value(what: &str, value: &str) -> Result<String> {
    check_script_value(what, value)?;
    if value.contains(['"', '\\']) {
        return Err(SweepError::Plan(format!(
            "{what} {}: holds `\"` or `\\`, which an #SBATCH line cannot hold",
            hyperlens_train::shown_name(value)
        )));
    }
    if value
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '\'' | '#'))
    {
        Ok(format!("\"{value}\""))
    } else {
        Ok(value.to_string())
    }
}

/// The sbatch script of an array over `indices` of the sweep in `dir` (an absolute path), running
/// `binary` (an absolute path the compute nodes can run).
///
/// # Errors
/// [`SweepError::Plan`] for an empty `indices`, a relative path, a path, sweep name or option
/// holding a control character (a newline would end the `#SBATCH` block and run the rest as a
/// command), or an `#SBATCH` value holding `"` or `\`. Every other value is quoted: single quotes
/// in the shell command, double quotes on an `#SBATCH` line where it holds white space.
pub fn script(
    plan: &Plan,
    dir: &Path,
    binary: &Path,
    indices: &[usize],
    options: &SlurmOptions,
) -> Result<String> {
    if indices.is_empty() {
        return Err(SweepError::Plan("no job to submit".into()));
    }
    for (what, p) in [("the sweep directory", dir), ("the binary", binary)] {
        if !p.is_absolute() {
            return Err(SweepError::Plan(format!(
                "{what} {} must be an absolute path in a Slurm script",
                p.display()
            )));
        }
        let text = p.to_str().ok_or_else(|| {
            SweepError::Plan(format!(
                "{what} {} is not valid UTF-8, which a Slurm script cannot hold",
                p.display()
            ))
        })?;
        check_script_value(what, text)?;
    }
    crate::plan::check_sweep_name(&plan.name)
        .map_err(|why| SweepError::Plan(format!("the sweep's name: {why}")))?;
    let log = dir.join(LOGS_DIR).join("slurm-%A_%a.out");
    let mut lines = vec![
        "#!/bin/bash".to_string(),
        format!("#SBATCH --job-name=hyperlens-{}", plan.name),
        format!(
            "#SBATCH --array={}{}",
            array_spec(indices),
            options
                .max_parallel
                .map_or(String::new(), |n| format!("%{n}"))
        ),
        format!(
            "#SBATCH --output={}",
            sbatch_value("the sweep directory", &log.display().to_string())?
        ),
        format!(
            "#SBATCH --chdir={}",
            sbatch_value("the sweep directory", &dir.display().to_string())?
        ),
    ];
    let opts: [(&str, Option<String>); 6] = [
        ("partition", options.partition.clone()),
        ("gres", options.gres.clone()),
        ("time", options.time.clone()),
        (
            "cpus-per-task",
            options.cpus_per_task.map(|n| n.to_string()),
        ),
        ("mem", options.mem.clone()),
        ("account", options.account.clone()),
    ];
    for (flag, value) in opts {
        if let Some(v) = value {
            lines.push(format!(
                "#SBATCH --{flag}={}",
                sbatch_value(&format!("--{flag}"), &v)?
            ));
        }
    }
    lines.push(String::new());
    lines.push(format!(
        "# hyperlens sweep `{}`: one array task per job of {}",
        plan.name,
        dir.join(crate::plan::PLAN_FILE).display()
    ));
    lines.push("set -euo pipefail".into());
    lines.push(format!(
        "exec {} sweep run-one {} --index \"$SLURM_ARRAY_TASK_ID\"",
        shell_quote(&binary.display().to_string()),
        shell_quote(&dir.display().to_string())
    ));
    lines.push(String::new());
    Ok(lines.join("\n"))
}

/// The submissions of the sweep in `dir` so far (none if the log is missing).
///
/// # Errors
/// [`SweepError::Plan`] naming the file if it is not a regular file or not a list of
/// submissions (a damaged log could make jobs be submitted twice).
pub fn submissions(dir: &Path) -> Result<Vec<Submission>> {
    let path = dir.join(SLURM_DIR).join(SUBMISSIONS_FILE);
    let bytes = match hyperlens_io::read_regular(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(SweepError::Plan(format!(
                "{}: cannot be read: {e}",
                path.display()
            )))
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        SweepError::Plan(format!(
            "{}: not a list of submissions ({e})",
            path.display()
        ))
    })
}

/// The array task ids of `job_id` still in Slurm's queue (pending or running), as `squeue`
/// lists them; empty when squeue cannot be run.
pub fn queued_tasks(job_id: &str) -> Vec<usize> {
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

/// The jobs of the sweep in `dir` to submit: those with work ([`crate::jobs_to_run`]; with
/// `resubmit_failed`, failed runs count as work) that none of the sweep's earlier submissions
/// still has in Slurm's queue ([`queued_tasks`]).
///
/// # Errors
/// As [`submissions`] and [`crate::jobs_to_run`].
pub fn to_submit(dir: &Path, plan: &Plan, resubmit_failed: bool) -> Result<Vec<usize>> {
    let queued: Vec<usize> = submissions(dir)?
        .iter()
        .flat_map(|s| queued_tasks(&s.job_id))
        .collect();
    Ok(crate::jobs_to_run(dir, plan, resubmit_failed)?
        .into_iter()
        .filter(|i| !queued.contains(i))
        .collect())
}

/// Writes the script of `indices` as `slurm/array-<n>.sbatch` and submits it with
/// `sbatch --parsable` (the `sbatch` on PATH); records the submission and returns it.
///
/// # Errors
/// As [`script`]; [`SweepError::Scheduler`] if `sbatch` cannot be run, fails (with its output) or
/// prints no job id; write errors.
pub fn submit(
    plan: &Plan,
    dir: &Path,
    binary: &Path,
    indices: &[usize],
    options: &SlurmOptions,
) -> Result<Submission> {
    let text = script(plan, dir, binary, indices, options)?;
    let sdir = dir.join(SLURM_DIR);
    std::fs::create_dir_all(&sdir).map_err(SweepError::io(&sdir))?;
    std::fs::create_dir_all(dir.join(LOGS_DIR)).map_err(SweepError::io(dir))?;
    let mut past = submissions(dir)?;
    let path: PathBuf = sdir.join(format!("array-{}.sbatch", past.len()));
    hyperlens_io::write_atomic(&path, text.as_bytes())?;
    let out = Command::new("sbatch")
        .arg("--parsable")
        .arg(&path)
        .output()
        .map_err(|e| {
            SweepError::Scheduler(format!(
                "cannot run sbatch ({e}): is Slurm installed and on PATH? The script is {}",
                path.display()
            ))
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(SweepError::Scheduler(format!(
            "sbatch {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    // `--parsable` prints `jobid` or `jobid;cluster`.
    let job_id = stdout
        .trim()
        .split(';')
        .next()
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()))
        .ok_or_else(|| {
            SweepError::Scheduler(format!(
                "sbatch {} printed no job id: {:?}",
                path.display(),
                stdout.trim()
            ))
        })?
        .to_string();
    let sub = Submission {
        job_id,
        script: path.display().to_string(),
        indices: indices.to_vec(),
        submitted_unix: now_unix(),
    };
    past.push(sub.clone());
    hyperlens_io::write_json(&sdir.join(SUBMISSIONS_FILE), &past)?;
    Ok(sub)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SweepSpec;

    #[test]
    fn array_specs_compress_runs_of_indices() {
        assert_eq!(array_spec(&[0, 1, 2, 3]), "0-3");
        assert_eq!(array_spec(&[0, 2, 5, 6, 7]), "0,2,5-7");
        assert_eq!(array_spec(&[4]), "4");
    }

    #[test]
    fn the_script_runs_one_job_per_array_task() {
        let spec = SweepSpec::parse("[axes]\nmixer = [\"hyla\", \"softmax\"]\n", "s").unwrap();
        let plan = Plan::expand("demo", &spec).unwrap();
        let opts = SlurmOptions {
            partition: Some("gpu".into()),
            gres: Some("gpu:1".into()),
            time: Some("01:00:00".into()),
            max_parallel: Some(4),
            ..SlurmOptions::default()
        };
        let s = script(
            &plan,
            Path::new("/data/sweeps/demo"),
            Path::new("/opt/hyper lens/hyperlens"),
            &[0, 1],
            &opts,
        )
        .unwrap();
        for line in [
            "#SBATCH --array=0-1%4",
            "#SBATCH --partition=gpu",
            "#SBATCH --gres=gpu:1",
            "#SBATCH --time=01:00:00",
            "#SBATCH --output=/data/sweeps/demo/logs/slurm-%A_%a.out",
            "exec '/opt/hyper lens/hyperlens' sweep run-one '/data/sweeps/demo' --index \"$SLURM_ARRAY_TASK_ID\"",
        ] {
            assert!(s.lines().any(|l| l == line), "{line}\n{s}");
        }
        assert!(script(&plan, Path::new("rel"), Path::new("/b"), &[0], &opts).is_err());
        // A directory with a space is quoted on the #SBATCH lines and in the command.
        let s = script(
            &plan,
            Path::new("/data/my sweeps/demo"),
            Path::new("/b"),
            &[0],
            &opts,
        )
        .unwrap();
        assert!(
            s.contains("#SBATCH --chdir=\"/data/my sweeps/demo\"\n"),
            "{s}"
        );
        assert!(
            s.contains("sweep run-one '/data/my sweeps/demo' --index"),
            "{s}"
        );
        assert!(script(&plan, Path::new("/d"), Path::new("/b"), &[], &opts).is_err());
    }

    #[test]
    fn every_script_field_refuses_control_characters() {
        let spec = SweepSpec::parse("[axes]\nseed = [0, 1]\n", "s").unwrap();
        let plan = Plan::expand("demo", &spec).unwrap();
        let ok = SlurmOptions::default();
        let err = |plan: &Plan, dir: &str, bin: &str, o: &SlurmOptions| {
            script(plan, Path::new(dir), Path::new(bin), &[0], o)
                .unwrap_err()
                .to_string()
        };
        // The directory and the binary: a newline would end the #SBATCH block.
        for bad in ["/d\n#SBATCH --x", "/d\rx", "/d\u{7}", "/d\tx"] {
            assert!(
                err(&plan, bad, "/b", &ok).contains("control character"),
                "{bad:?}"
            );
            assert!(
                err(&plan, "/d", bad, &ok).contains("control character"),
                "{bad:?}"
            );
        }
        assert!(err(&plan, "/d\"x", "/b", &ok).contains("cannot hold"));
        // The plan's name.
        for bad in ["a\nb", "a b", "a\"b", "a/b", "", "a#b"] {
            let mut p = plan.clone();
            p.name = bad.into();
            assert!(
                err(&p, "/d", "/b", &ok).contains("the sweep's name"),
                "{bad:?}"
            );
        }
        // Every option.
        let fields: [fn(&mut SlurmOptions, String); 5] = [
            |o, v| o.partition = Some(v),
            |o, v| o.gres = Some(v),
            |o, v| o.time = Some(v),
            |o, v| o.mem = Some(v),
            |o, v| o.account = Some(v),
        ];
        for (i, set) in fields.iter().enumerate() {
            for bad in ["x\nrm -rf /", "x\ry", "", "x\"y", "x\\y"] {
                let mut o = ok.clone();
                set(&mut o, bad.to_string());
                let e = err(&plan, "/d", "/b", &o);
                assert!(e.starts_with("--"), "field {i} {bad:?}: {e}");
            }
            let mut o = ok.clone();
            set(&mut o, "a b".to_string());
            let s = script(&plan, Path::new("/d"), Path::new("/b"), &[0], &o).unwrap();
            assert!(s.contains("=\"a b\"\n"), "field {i}: {s}");
        }
    }
}
