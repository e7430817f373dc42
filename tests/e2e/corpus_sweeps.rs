//! Bad-input corpus cases (see [`crate::corpus`]) on the surfaces that write and delete: damaged
//! sweep directories (`plan.json` with hostile run names, job records, locks that are FIFOs,
//! submission logs, links out of the sweep), hostile Slurm script values, grids and groups too
//! large for the memory budget, damaged `group.json` files, and spec files with TOML errors.
//! Every sweep command is tried on every damaged sweep: none may succeed, hang or write outside
//! the sweep (the last is the test `no_sweep_command_touches_anything_outside_its_directory` in
//! `sweep.rs`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::corpus::{case, edit_json, Case};
use crate::util::{hyperlens, s};

/// A tiny spec: two SRAVEN runs (seeds 0 and 1), one job each.
pub(crate) const SPEC: &str = "[base]\ntask = \"sraven\"\nlayers = 1\nsteps = 2\nbatch = 4\n\
     warmup = 1\neval_every = 2\neval_n = 16\ncheckpoint_every = 2\nlog_every = 2\n\
     [axes]\nseed = [0, 1]\n[sweep]\nbatch = false\n";

/// Plans [`SPEC`] into `dir`.
pub(crate) fn plan_sweep(root: &Path, dir: &Path) {
    let spec = root.join("corpus-sweep.toml");
    std::fs::write(&spec, SPEC).unwrap();
    hyperlens(&["sweep", "plan", s(&spec), "--out", s(dir)]).success();
}

/// Copies the directory tree `from` to `to` (regular files and directories).
pub(crate) fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// Makes a FIFO at `path` (replacing what is there).
pub(crate) fn fifo(path: &Path) {
    if path.is_dir() {
        std::fs::remove_dir_all(path).unwrap();
    } else {
        let _ = std::fs::remove_file(path);
    }
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(ok.success());
}

/// The hostile edits of a sweep's `plan.json`: name, edit, the words every error must hold.
type PlanEdit = (&'static str, fn(&mut Value), &'static [&'static str]);

/// A damaged file of a sweep: name, edit of the file, the words every error must hold.
type FileEdit = (&'static str, fn(&Path), &'static [&'static str]);

/// A damaged state file of a sweep: name, edit of the directory, the error's words, the commands.
type StateEdit = (
    &'static str,
    fn(&Path),
    &'static [&'static str],
    &'static [&'static str],
);

/// Renames run 0 (in `runs` and in its job's list) to `name`.
fn rename_run0(v: &mut Value, name: Value) {
    v["runs"][0]["name"] = name.clone();
    v["jobs"][0]["runs"][0] = name;
}

const PLAN_EDITS: &[PlanEdit] = &[
    (
        "up-two",
        |v| rename_run0(v, "../../x".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "absolute",
        |v| rename_run0(v, "/tmp/hyperlens-corpus-abs".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "empty-name",
        |v| rename_run0(v, "".into()),
        &["plan.json", "runs[0].name", "empty"],
    ),
    (
        "dot",
        |v| rename_run0(v, ".".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "dot-dot",
        |v| rename_run0(v, "..".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "slash",
        |v| rename_run0(v, "a/b".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "backslash",
        |v| rename_run0(v, "a\\b".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "newline",
        |v| rename_run0(v, "a\nb".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "space",
        |v| rename_run0(v, "a b".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "hidden",
        |v| rename_run0(v, ".git".into()),
        &["plan.json", "runs[0].name"],
    ),
    (
        "long",
        |v| rename_run0(v, "a".repeat(300).into()),
        &["plan.json", "runs[0].name", "300 bytes"],
    ),
    (
        "unicode",
        |v| rename_run0(v, "s\u{e9}ed".into()),
        &["plan.json", "runs[0].name"],
    ),
    ("name-number", |v| rename_run0(v, 7.into()), &["plan.json"]),
    (
        "twice",
        |v| {
            v["runs"][1]["name"] = "seed-0".into();
            v["jobs"][1]["runs"][0] = "seed-0".into();
        },
        &["plan.json", "used twice"],
    ),
    (
        "job-out-of-range",
        |v| v["runs"][0]["job"] = 99.into(),
        &["plan.json", "runs[0]", "job 99"],
    ),
    (
        "job-huge",
        |v| v["runs"][0]["job"] = u64::MAX.into(),
        &["plan.json", "runs[0]"],
    ),
    (
        "job-negative",
        |v| v["runs"][0]["job"] = (-1).into(),
        &["plan.json"],
    ),
    (
        "job-unknown-run",
        |v| v["jobs"][0]["runs"][0] = "seed-9".into(),
        &["plan.json", "jobs[0]", "seed-9"],
    ),
    (
        "job-outside-run",
        |v| v["jobs"][0]["runs"][0] = "../../x".into(),
        &["plan.json", "jobs[0]"],
    ),
    (
        "job-index",
        |v| v["jobs"][1]["index"] = 0.into(),
        &["plan.json", "jobs[1]", "index"],
    ),
    (
        "job-empty",
        |v| v["jobs"][1]["runs"] = Value::Array(vec![]),
        &["plan.json", "jobs[1]", "no run"],
    ),
    (
        "run-in-two-jobs",
        |v| v["jobs"][1]["runs"] = serde_json::json!(["seed-0"]),
        &["plan.json", "jobs[1]"],
    ),
    (
        "job-lists-other-run",
        |v| v["jobs"][0]["runs"] = serde_json::json!(["seed-1"]),
        &["plan.json", "jobs[0]", "seed-1"],
    ),
    (
        "no-runs",
        |v| {
            v["runs"] = Value::Array(vec![]);
            v["jobs"] = Value::Array(vec![]);
        },
        &["plan.json", "`runs` is empty"],
    ),
    (
        "no-jobs",
        |v| v["jobs"] = Value::Array(vec![]),
        &["plan.json", "runs[0]"],
    ),
    (
        "runs-not-list",
        |v| v["runs"] = "seed-0".into(),
        &["plan.json"],
    ),
    (
        "arg-out",
        |v| {
            v["runs"][0]["args"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!(["out", "/tmp/hyperlens-corpus-out"]));
        },
        &["plan.json", "runs[0]", "\"out\""],
    ),
    (
        "arg-resume",
        |v| {
            v["runs"][0]["args"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!(["resume", true]));
        },
        &["plan.json", "runs[0]", "\"resume\""],
    ),
    (
        "arg-twice",
        |v| {
            v["runs"][0]["args"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!(["steps", 3]));
        },
        &["plan.json", "runs[0]", "`steps` twice"],
    ),
    (
        "arg-bad-key",
        |v| {
            v["runs"][0]["args"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!(["-x; rm", 1]));
        },
        &["plan.json", "runs[0]"],
    ),
    (
        "name-newline",
        |v| v["name"] = "a\n#SBATCH --wrap=x".into(),
        &["plan.json", "`name`"],
    ),
    (
        "name-empty",
        |v| v["name"] = "".into(),
        &["plan.json", "`name`"],
    ),
];

/// Every sweep command on the damaged sweep `dir`.
fn sweep_commands(dir: &Path) -> Vec<(&'static str, Vec<String>)> {
    let d = s(dir).to_string();
    vec![
        (
            "run-one",
            vec![
                "sweep".into(),
                "run-one".into(),
                d.clone(),
                "--index".into(),
                "0".into(),
            ],
        ),
        ("run", vec!["sweep".into(), "run".into(), d.clone()]),
        ("status", vec!["sweep".into(), "status".into(), d.clone()]),
        (
            "submit",
            vec![
                "sweep".into(),
                "submit".into(),
                d.clone(),
                "--slurm".into(),
                "--dry-run".into(),
            ],
        ),
        (
            "report",
            vec![
                "report".into(),
                "--sweep".into(),
                d.clone(),
                "--n".into(),
                "16".into(),
            ],
        ),
    ]
}

fn push(cases: &mut Vec<Case>, name: String, args: &[String], needles: &[&str]) {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    cases.push(case(&name, &a, needles));
}

/// Adds this file's cases to `cases`; inputs are written under `root`.
pub(crate) fn sweep_cases(root: &Path, cases: &mut Vec<Case>) {
    let sweeps = root.join("sweeps");
    std::fs::create_dir_all(&sweeps).unwrap();
    let base = sweeps.join("base");
    plan_sweep(root, &base);
    let copy = |name: &str| -> PathBuf {
        let d = sweeps.join(name);
        copy_tree(&base, &d);
        d
    };
    // Damaged plans: every command, each on its own copy (a command that wrongly went ahead
    // would change the copy for the next).
    for (name, edit, needles) in PLAN_EDITS {
        for (cmd, _) in sweep_commands(&base) {
            let dir = copy(&format!("plan-{name}-{cmd}"));
            edit_json(&dir.join("plan.json"), edit);
            let args = sweep_commands(&dir)
                .into_iter()
                .find(|(c, _)| *c == cmd)
                .unwrap()
                .1;
            push(cases, format!("sweep/plan-{name}/{cmd}"), &args, needles);
        }
    }
    // A value `train` refuses, caught when the job parses its arguments.
    let dir = copy("plan-arg-bad-value");
    edit_json(&dir.join("plan.json"), |v| {
        for arg in v["runs"][0]["args"].as_array_mut().unwrap() {
            if arg[0] == "steps" {
                arg[1] = "many".into();
            }
        }
    });
    let args = sweep_commands(&dir).remove(0).1;
    push(
        cases,
        "sweep/plan-arg-bad-value/run-one".into(),
        &args,
        &["seed-0", "many", "--steps"],
    );
    // plan.json itself broken.
    let broken: [FileEdit; 5] = [
        (
            "plan-garbage",
            |p| std::fs::write(p, "{not json").unwrap(),
            &["plan.json"],
        ),
        (
            "plan-empty",
            |p| std::fs::write(p, "").unwrap(),
            &["plan.json"],
        ),
        (
            "plan-truncated",
            |p| {
                let b = std::fs::read(p).unwrap();
                std::fs::write(p, &b[..b.len() / 2]).unwrap();
            },
            &["plan.json"],
        ),
        (
            "plan-dir",
            |p| {
                std::fs::remove_file(p).unwrap();
                std::fs::create_dir(p).unwrap();
            },
            &["plan.json", "not a regular file"],
        ),
        (
            "plan-fifo",
            |p| fifo(p),
            &["plan.json", "not a regular file"],
        ),
    ];
    for (name, edit, needles) in broken {
        for (cmd, _) in sweep_commands(&base) {
            let dir = copy(&format!("{name}-{cmd}"));
            edit(&dir.join("plan.json"));
            let args = sweep_commands(&dir)
                .into_iter()
                .find(|(c, _)| *c == cmd)
                .unwrap()
                .1;
            push(cases, format!("sweep/{name}/{cmd}"), &args, needles);
        }
    }
    // Job records, locks and the submission log.
    let state: [StateEdit; 7] = [
        (
            "record-garbage",
            |d| {
                std::fs::create_dir_all(d.join("jobs")).unwrap();
                std::fs::write(d.join("jobs/0.json"), "{oops").unwrap();
            },
            &["jobs/0.json", "not a job record"],
            &["run-one", "run", "status", "submit", "report"],
        ),
        (
            "record-fifo",
            |d| {
                std::fs::create_dir_all(d.join("jobs")).unwrap();
                fifo(&d.join("jobs/0.json"));
            },
            &["jobs/0.json", "not a regular file"],
            &["run-one", "run", "status", "submit", "report"],
        ),
        (
            "record-other-job",
            |d| {
                std::fs::create_dir_all(d.join("jobs")).unwrap();
                std::fs::write(
                d.join("jobs/0.json"),
                r#"{"index":5,"executor":"local","host":"h","pid":1,"status":"failed","started_unix":0,"ended_unix":1,"error":"x","attempt":1}"#,
            )
            .unwrap();
            },
            &["jobs/0.json", "job 5"],
            &["run-one", "status"],
        ),
        (
            "lock-fifo",
            |d| {
                std::fs::create_dir_all(d.join("jobs")).unwrap();
                fifo(&d.join("jobs/0.lock"));
            },
            &["jobs/0.lock", "regular file"],
            &["run-one", "run", "status", "submit", "report"],
        ),
        (
            "lock-dir",
            |d| {
                std::fs::create_dir_all(d.join("jobs/0.lock")).unwrap();
            },
            &["jobs/0.lock", "regular file"],
            &["run-one", "status"],
        ),
        (
            "submissions-garbage",
            |d| {
                std::fs::create_dir_all(d.join("slurm")).unwrap();
                std::fs::write(d.join("slurm/submissions.json"), "[{]").unwrap();
            },
            &["submissions.json"],
            &["submit"],
        ),
        (
            "submissions-fifo",
            |d| {
                std::fs::create_dir_all(d.join("slurm")).unwrap();
                fifo(&d.join("slurm/submissions.json"));
            },
            &["submissions.json", "not a regular file"],
            &["submit"],
        ),
    ];
    for (name, edit, needles, cmds) in state {
        for cmd in cmds {
            let dir = copy(&format!("{name}-{cmd}"));
            edit(&dir);
            let args = sweep_commands(&dir)
                .into_iter()
                .find(|(c, _)| c == cmd)
                .unwrap()
                .1;
            push(cases, format!("sweep/{name}/{cmd}"), &args, needles);
        }
    }
    // Links that lead out of the sweep.
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    for (name, link) in [("runs-link", "runs"), ("run-link", "runs/seed-0")] {
        let dir = copy(name);
        let at = dir.join(link);
        if at.is_dir() {
            std::fs::remove_dir_all(&at).unwrap();
        }
        std::os::unix::fs::symlink(&outside, &at).unwrap();
        let args = sweep_commands(&dir).remove(0).1;
        push(
            cases,
            format!("sweep/{name}/run-one"),
            &args,
            &["symbolic link"],
        );
    }
    // A run whose checkpoint manifest is a FIFO: neither cleared nor waited on.
    let dir = copy("run-manifest-fifo");
    std::fs::create_dir_all(dir.join("runs/seed-0")).unwrap();
    fifo(&dir.join("runs/seed-0/checkpoint.json"));
    let args = sweep_commands(&dir).remove(0).1;
    push(
        cases,
        "sweep/run-manifest-fifo/run-one".into(),
        &args,
        &["checkpoint manifest", "its work is kept"],
    );
    // Slurm script values: a directory whose name holds a newline, and every option.
    let nl = sweeps.join("with\nnewline");
    copy_tree(&base, &nl);
    push(
        cases,
        "sweep/dir-newline/submit".into(),
        &[
            "sweep".into(),
            "submit".into(),
            s(&nl).into(),
            "--slurm".into(),
            "--dry-run".into(),
        ],
        &["control character"],
    );
    for flag in ["--partition", "--gres", "--time", "--mem", "--account"] {
        for (what, value) in [
            ("newline", "x\n#SBATCH --wrap=id"),
            ("quote", "x\"y"),
            ("cr", "x\ry"),
        ] {
            push(
                cases,
                format!("sweep/option-{what}{flag}"),
                &[
                    "sweep".into(),
                    "submit".into(),
                    s(&base).into(),
                    "--slurm".into(),
                    "--dry-run".into(),
                    flag.into(),
                    value.into(),
                ],
                &[flag],
            );
        }
    }
    let binary = sweeps.join("bin\nary");
    std::fs::write(&binary, "").unwrap();
    push(
        cases,
        "sweep/binary-newline/submit".into(),
        &[
            "sweep".into(),
            "submit".into(),
            s(&base).into(),
            "--slurm".into(),
            "--dry-run".into(),
            "--binary".into(),
            s(&binary).into(),
        ],
        &["the binary", "control character"],
    );
    // Specs: huge grids, duplicate values in a long axis, TOML errors.
    let spec_cases: [(&str, String, &[&str]); 6] = [
        (
            "grid-1e9",
            "[axes]\nseed = [0,1,2,3,4,5,6,7,8,9]\nlr = [1,2,3,4,5,6,7,8,9,10]\n\
             weight_decay = [1,2,3,4,5,6,7,8,9,10]\nwarmup = [1,2,3,4,5,6,7,8,9,10]\n\
             steps = [1,2,3,4,5,6,7,8,9,10]\nbatch = [1,2,3,4,5,6,7,8,9,10]\n\
             eval_n = [1,2,3,4,5,6,7,8,9,10]\nlog_every = [1,2,3,4,5,6,7,8,9,10]\n\
             eval_every = [1,2,3,4,5,6,7,8,9,10]\n"
                .to_string(),
            &["1000000000 runs", "memory budget"],
        ),
        (
            "grid-1e7",
            format!(
                "[axes]\nseed = [{}]\nlr = [{}]\n",
                (0..10_000)
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                (1..=1000)
                    .map(|i| format!("{i}e-6"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            &["10000000 runs", "memory budget"],
        ),
        (
            "batched-job-too-large",
            format!(
                "[base]\ntask = \"sraven\"\n[axes]\nseed = [{}]\n[sweep]\nmax_batch = 100000\n",
                (0..2000)
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            &["job 0", "2000 runs", "memory budget"],
        ),
        (
            "axis-twice",
            format!(
                "[axes]\nseed = [{},5]\n",
                (0..100_000)
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            &["seed", "lists 5 twice"],
        ),
        (
            "toml-syntax",
            "[base]\ntask = \"sraven\"\nsteps = = 3\n".to_string(),
            &["line 3, column", "TOML"],
        ),
        (
            "toml-type",
            "[sweep]\nbatch = \"yes\"\n".to_string(),
            &["line 2", "TOML"],
        ),
    ];
    for (name, text, needles) in spec_cases {
        let spec = sweeps.join(format!("{name}.toml"));
        std::fs::write(&spec, text).unwrap();
        let out = sweeps.join(format!("planned-{name}"));
        push(
            cases,
            format!("sweep/spec-{name}/plan"),
            &[
                "sweep".into(),
                "plan".into(),
                s(&spec).into(),
                "--out".into(),
                s(&out).into(),
            ],
            needles,
        );
    }
    group_cases(root, cases);
}

/// `train --seeds` groups: too many models for the budget, grids too large, damaged
/// `group.json` files (resume and report).
fn group_cases(root: &Path, cases: &mut Vec<Case>) {
    let groups = root.join("groups");
    std::fs::create_dir_all(&groups).unwrap();
    let seeds: String = (0..10_000)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let hundred = |scale: &str| -> String {
        (1..=100)
            .map(|i| format!("{i}{scale}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let tiny = [
        "--task", "sraven", "--layers", "1", "--steps", "2", "--batch", "4", "--warmup", "1",
    ];
    let train = |out: &Path, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = vec!["train".into()];
        a.extend(tiny.iter().map(|x| x.to_string()));
        a.extend(extra.iter().map(|x| x.to_string()));
        a.push("--out".into());
        a.push(s(out).into());
        a
    };
    push(
        cases,
        "group/seeds-1e4".into(),
        &train(&groups.join("seeds"), &["--seeds", &seeds]),
        &["10000 runs trained together", "memory budget"],
    );
    push(
        cases,
        "group/grid-1e6".into(),
        &train(
            &groups.join("grid"),
            &[
                "--grid",
                "--seeds",
                &hundred(""),
                "--lr",
                &hundred("e-5"),
                "--weight-decay",
                &hundred("e-3"),
            ],
        ),
        &["1000000 runs trained together", "memory budget"],
    );
    push(
        cases,
        "group/seeds-twice".into(),
        &train(&groups.join("twice"), &["--seeds", &format!("{seeds},17")]),
        &["seed 17 is listed twice"],
    );
    // Damaged group.json: resumed, and reported.
    let group_edits: [(&str, &str, &[&str]); 7] = [
        (
            "empty-list",
            r#"{"combine":"zip","runs":[]}"#,
            &["group.json", "`runs` is empty"],
        ),
        (
            "up",
            r#"{"combine":"zip","runs":["../x"]}"#,
            &["group.json", "runs[0]"],
        ),
        (
            "absolute",
            r#"{"combine":"zip","runs":["/tmp/x"]}"#,
            &["group.json", "runs[0]"],
        ),
        (
            "empty-name",
            r#"{"combine":"zip","runs":[""]}"#,
            &["group.json", "runs[0]", "empty"],
        ),
        (
            "twice",
            r#"{"combine":"zip","runs":["seed-0","seed-0"]}"#,
            &["group.json", "runs[1]", "twice"],
        ),
        (
            "newline",
            r#"{"combine":"zip","runs":["seed-0\nx"]}"#,
            &["group.json", "runs[0]"],
        ),
        ("garbage", "{\"combine\": ", &["group.json"]),
    ];
    for (name, text, needles) in group_edits {
        for cmd in ["resume", "report"] {
            let dir = groups.join(format!("{name}-{cmd}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("group.json"), text).unwrap();
            let args: Vec<String> = match cmd {
                "resume" => vec![
                    "train".into(),
                    "--out".into(),
                    s(&dir).into(),
                    "--resume".into(),
                ],
                _ => vec![
                    "report".into(),
                    "--checkpoint".into(),
                    s(&dir).into(),
                    "--n".into(),
                    "16".into(),
                ],
            };
            push(cases, format!("group/{name}/{cmd}"), &args, needles);
        }
    }
    let dir = groups.join("fifo");
    std::fs::create_dir_all(&dir).unwrap();
    fifo(&dir.join("group.json"));
    push(
        cases,
        "group/fifo/resume".into(),
        &[
            "train".into(),
            "--out".into(),
            s(&dir).into(),
            "--resume".into(),
        ],
        &["group.json"],
    );
}
