//! `hyperlens sweep`: a tiny sweep (2 mixers x 2 seeds zipped with their splits) planned, run on
//! this machine, killed and run again (finished jobs are not redone, interrupted ones resume),
//! followed with `status` and aggregated by `report --sweep`; the same sweep as a job array on a
//! real single-node Slurm (started from Debian's packages by `scripts/slurm-local.sh`), which must
//! give the same runs and the same aggregate.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{hyperlens, json, repo_path, s, tempdir, Csv};

/// A tiny SRAVEN sweep: two mixers, two seeds zipped with two splits, `steps` updates.
fn spec(steps: u64) -> String {
    format!(
        "[base]\ntask = \"sraven\"\nlayers = 1\nsteps = {steps}\nbatch = 8\nwarmup = 2\n\
         eval_every = {eval}\neval_n = 32\ncheckpoint_every = 10\nlog_every = 10\n\n\
         [axes]\nmixer = [\"hyla\", \"softmax\"]\nseed = [0, 1]\n\
         split = [\"paper-seed0\", \"paper-seed1\"]\n\n[sweep]\nzip = [[\"seed\", \"split\"]]\n",
        eval = steps / 2
    )
}

const RUNS: [&str; 4] = [
    "mixer-hyla_seed-0_split-paper-seed0",
    "mixer-hyla_seed-1_split-paper-seed1",
    "mixer-softmax_seed-0_split-paper-seed0",
    "mixer-softmax_seed-1_split-paper-seed1",
];

fn plan(root: &Path, name: &str, steps: u64) -> PathBuf {
    let spec_file = root.join(format!("{name}.toml"));
    std::fs::write(&spec_file, spec(steps)).unwrap();
    let dir = root.join(name);
    let out = hyperlens(&["sweep", "plan", s(&spec_file), "--out", s(&dir)]);
    assert!(
        out.success().contains("planned 4 runs in 2 jobs"),
        "{}",
        out.success()
    );
    dir
}

/// `sweep status --json`, one object per run.
fn status(dir: &Path) -> Vec<serde_json::Value> {
    hyperlens(&["sweep", "status", s(dir), "--json"])
        .success()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Mean and standard error (sample sd / sqrt n), computed here for the check.
fn mean_se(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, (var / n).sqrt())
}

/// Checks `aggregate.csv` of a sweep report against the per-run `tables/accuracy.csv`.
fn check_aggregate(report: &Path) {
    let acc = Csv::read(&report.join("tables/accuracy.csv"));
    let agg = Csv::read(&report.join("aggregate.csv"));
    assert_eq!(agg.strings("mixer"), ["hyla", "softmax"]);
    assert_eq!(agg.column("n"), [2.0, 2.0]);
    let names = acc.strings("checkpoint");
    let ood = acc.column("ood_accuracy");
    for (g, mixer) in ["hyla", "softmax"].iter().enumerate() {
        let v: Vec<f64> = names
            .iter()
            .zip(&ood)
            .filter(|(n, _)| n.starts_with(&format!("mixer-{mixer}_")))
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(v.len(), 2);
        let (m, se) = mean_se(&v);
        assert!((agg.column("ood_acc_mean")[g] - m).abs() < 2e-6, "{mixer}");
        assert!((agg.column("ood_acc_se")[g] - se).abs() < 2e-6, "{mixer}");
    }
    let md = std::fs::read_to_string(report.join("index.md")).unwrap();
    assert!(md.contains("## Aggregate over seeds"), "{md}");
    assert!(report.join("figures/aggregate_sraven_mixer.png").is_file());
}

#[test]
fn a_local_sweep_runs_resumes_after_a_kill_and_aggregates() {
    let tmp = tempdir();
    let dir = plan(tmp.path(), "local", 300);
    let p = json(&dir.join("plan.json"));
    let names: Vec<&str> = p["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, RUNS);
    assert!(status(&dir).iter().all(|r| r["state"] == "pending"));

    // One job at a time; kill the executor and its job once job 1 has a checkpoint.
    let mut child = Command::new(env!("CARGO_BIN_EXE_hyperlens"))
        .args(["sweep", "run", s(&dir), "--jobs", "1"])
        .env("RAYON_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let job1_state = dir.join("runs").join(RUNS[2]).join("train_state.json");
    let t0 = Instant::now();
    while !job1_state.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "job 1 never checkpointed"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sweep ended before the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-9", "--", &format!("-{}", child.id())])
        .status()
        .unwrap();
    assert!(killed.success());
    let _ = child.wait();
    // SIGKILL reaches the job process asynchronously: it holds its lock until the kernel has
    // torn it down, which can be a moment after the executor is reaped.
    let t0 = Instant::now();
    let mut st = status(&dir);
    while st.iter().any(|r| r["state"] == "running") && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
        st = status(&dir);
    }
    let states: Vec<&str> = st.iter().map(|r| r["state"].as_str().unwrap()).collect();
    assert_eq!(states[..2], ["finished", "finished"], "{st:?}");
    // The killed job's lock went with its process.
    assert_eq!(states[2..], ["interrupted", "interrupted"], "{st:?}");
    let finished = dir.join("runs").join(RUNS[0]).join("train.json");
    let before = std::fs::metadata(&finished).unwrap().modified().unwrap();

    // Run again: job 0 is not redone, job 1 resumes from its checkpoint.
    let again = hyperlens(&["sweep", "run", s(&dir), "--jobs", "2"]);
    let out = again.success();
    assert!(out.contains("1 of 2 jobs to run"), "{out}");
    assert!(out.contains("4 of 4 runs finished"), "{out}");
    assert_eq!(
        std::fs::metadata(&finished).unwrap().modified().unwrap(),
        before
    );
    let log = std::fs::read_to_string(dir.join("logs/job-1.log")).unwrap();
    assert!(log.contains("resuming at steps"), "{log}");
    let st = status(&dir);
    for r in &st {
        assert_eq!(
            (r["state"].as_str(), r["step"].as_u64()),
            (Some("finished"), Some(300))
        );
        assert!(r["ran"].as_str().unwrap().starts_with("local pid"), "{r}");
    }
    let table = hyperlens(&["sweep", "status", s(&dir)])
        .success()
        .to_owned();
    assert!(table.contains("4 runs: 4 finished"), "{table}");
    // Nothing left to do.
    assert!(hyperlens(&["sweep", "run", s(&dir)])
        .success()
        .contains("0 of 2 jobs to run"));

    let report = dir.join("report");
    let r = hyperlens(&["report", "--sweep", s(&dir), "--n", "32", "--batch", "16"]);
    assert!(r.success().contains("4 checkpoints"), "{}", r.success());
    check_aggregate(&report);
}

#[test]
fn sweep_errors_name_the_key_the_job_or_the_directory() {
    let tmp = tempdir();
    let root = tmp.path();
    let bad = root.join("bad.toml");
    std::fs::write(&bad, "[base]\nbogus_flag = 3\n[axes]\nseed = [0, 1]\n").unwrap();
    let out = root.join("bad");
    hyperlens(&["sweep", "plan", s(&bad), "--out", s(&out)])
        .failure(&["run `seed-0`", "--bogus-flag"]);
    assert!(!out.exists());
    std::fs::write(&bad, "[base]\nout = \"x\"\n").unwrap();
    hyperlens(&["sweep", "plan", s(&bad), "--out", s(&out)])
        .failure(&["`out` is set by the sweep"]);
    std::fs::write(&bad, "[axes]\nlr = [0.001, -1.0]\n").unwrap();
    hyperlens(&["sweep", "plan", s(&bad), "--out", s(&out)]).failure(&["run `lr--1`", "lr"]);
    hyperlens(&["sweep", "status", s(root)]).failure(&["no plan.json"]);
    let dir = plan(root, "ok", 4);
    hyperlens(&["sweep", "run-one", s(&dir), "--index", "7"]).failure(&["--index 7", "2 jobs"]);
    hyperlens(&["sweep", "run", s(&dir), "--jobs", "0"]).failure(&["--jobs"]);
    hyperlens(&["report", "--sweep", s(&dir)])
        .failure_after_notes("report: ", &["no run is finished"]);
    // A different spec into the same directory is refused; the same one is a no-op.
    let other = root.join("other.toml");
    std::fs::write(&other, spec(8)).unwrap();
    hyperlens(&["sweep", "plan", s(&other), "--out", s(&dir)]).failure(&["different plan"]);
    hyperlens(&["sweep", "plan", s(&root.join("ok.toml")), "--out", s(&dir)]).success();
    hyperlens(&["sweep", "submit", s(&dir)]).usage_error(&["--slurm"]);
}

/// A single-node Slurm started for one test and stopped when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
}

impl Cluster {
    /// Starts the cluster, or says why it cannot (not root, packages not installable).
    fn start() -> Result<Cluster, String> {
        let script = repo_path("scripts/slurm-local.sh");
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| e.to_string())?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return Err("the test starts Slurm's daemons and must run as root".into());
        }
        let install = Command::new("bash")
            .arg(&script)
            .arg("install")
            .output()
            .map_err(|e| e.to_string())?;
        if !install.status.success() {
            return Err(format!(
                "Slurm could not be installed: {}",
                String::from_utf8_lossy(&install.stderr).trim()
            ));
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let start = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        let cluster = Cluster {
            conf: dir.path().join("slurm.conf"),
            dir,
        };
        if !start.status.success() {
            return Err(format!(
                "Slurm did not start: {}",
                String::from_utf8_lossy(&start.stderr).trim()
            ));
        }
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo_path("scripts/slurm-local.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

#[test]
fn a_sweep_on_a_real_slurm_matches_the_local_executor() {
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("SKIPPED a_sweep_on_a_real_slurm_matches_the_local_executor: {why}");
            return;
        }
    };
    let tmp = tempdir();
    let slurm_dir = plan(tmp.path(), "on-slurm", 20);
    let submit = Command::new(env!("CARGO_BIN_EXE_hyperlens"))
        .args([
            "sweep",
            "submit",
            s(&slurm_dir),
            "--slurm",
            "--time",
            "00:10:00",
        ])
        .env("SLURM_CONF", &cluster.conf)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&submit.stdout).to_string();
    assert!(
        submit.status.success() && stdout.contains("submitted Slurm job array"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&submit.stderr)
    );
    let subs = json(&slurm_dir.join("slurm/submissions.json"));
    let job_id = subs[0]["job_id"].as_str().unwrap().to_string();
    assert_eq!(subs[0]["indices"], serde_json::json!([0, 1]));
    // A second submit while the array is queued or running submits nothing.
    let again = Command::new(env!("CARGO_BIN_EXE_hyperlens"))
        .args(["sweep", "submit", s(&slurm_dir), "--slurm"])
        .env("SLURM_CONF", &cluster.conf)
        .output()
        .unwrap();
    let again = String::from_utf8_lossy(&again.stdout).to_string();
    assert!(
        again.contains("nothing to submit") || again.contains("submitted"),
        "{again}"
    );
    let t0 = Instant::now();
    loop {
        let st = status(&slurm_dir);
        if st.iter().all(|r| r["state"] == "finished") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "the Slurm array did not finish: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    for r in status(&slurm_dir) {
        let ran = r["ran"].as_str().unwrap();
        assert!(ran.starts_with(&format!("slurm {job_id}_")), "{ran}");
    }
    let record = json(&slurm_dir.join("jobs/1.json"));
    assert_eq!(record["executor"], "slurm");
    assert_eq!(record["task_id"], "1");

    // The same sweep on this machine: the same runs, bit for bit, and the same aggregate.
    let local_dir = plan(tmp.path(), "local", 20);
    hyperlens(&["sweep", "run", s(&local_dir), "--jobs", "2"]).success();
    for run in RUNS {
        for file in ["model.safetensors", "metrics.csv"] {
            let a = std::fs::read(slurm_dir.join("runs").join(run).join(file)).unwrap();
            let b = std::fs::read(local_dir.join("runs").join(run).join(file)).unwrap();
            if file == "metrics.csv" {
                // Wall time and speed differ; every value of the training is the same.
                let strip = |t: &[u8]| -> Vec<String> {
                    String::from_utf8_lossy(t)
                        .lines()
                        .map(|l| l.split(',').take(8).collect::<Vec<_>>().join(","))
                        .collect()
                };
                assert_eq!(strip(&a), strip(&b), "{run}/{file}");
            } else {
                assert!(a == b, "{run}/{file} differs between Slurm and local");
            }
        }
    }
    for dir in [&slurm_dir, &local_dir] {
        hyperlens(&["report", "--sweep", s(dir), "--n", "32", "--batch", "16"]).success();
        check_aggregate(&dir.join("report"));
    }
    let agg = |d: &Path| std::fs::read_to_string(d.join("report/aggregate.csv")).unwrap();
    assert_eq!(agg(&slurm_dir), agg(&local_dir));
    drop(cluster);
}

/// Every file and directory under `dir` (not following links) with its bytes, leaving out the
/// sweep's own state directories (`jobs`, `logs`, `slurm`, `report`) under `state`.
fn snapshot(dir: &Path, state: &Path) -> std::collections::BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if ["jobs", "logs", "slurm", "report"]
                .iter()
                .any(|s| p == state.join(s))
            {
                continue;
            }
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                out.insert(p.clone(), None);
                stack.push(p);
            } else if meta.is_file() {
                out.insert(p.clone(), Some(std::fs::read(&p).unwrap()));
            } else {
                out.insert(p, Some(b"(special)".to_vec()));
            }
        }
    }
    out
}

#[test]
fn no_sweep_command_touches_anything_outside_its_directory() {
    use crate::corpus_sweeps::{copy_tree, plan_sweep};
    let tmp = tempdir();
    let root = tmp.path();
    let parent = root.join("a").join("b");
    std::fs::create_dir_all(&parent).unwrap();
    let template = root.join("template");
    plan_sweep(root, &template);
    // Where the hostile names lead: `runs/../../x` is `a/b/x` beside the sweep; an absolute name.
    for d in [parent.join("x"), root.join("abs")] {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("keep.txt"), "finished work").unwrap();
    }
    let abs = root.join("abs");
    let hostile = [
        "../../x",
        abs.to_str().unwrap(),
        "",
        ".",
        "..",
        "seed-0/../../../x",
    ];
    for (i, name) in hostile.iter().enumerate() {
        let sw = parent.join(format!("sw{i}"));
        copy_tree(&template, &sw);
        // A finished run that an empty name (`runs/` itself) would have wiped.
        let done = sw.join("runs").join("seed-1");
        std::fs::create_dir_all(&done).unwrap();
        std::fs::write(done.join("train.json"), r#"{"steps": 2}"#).unwrap();
        let plan = sw.join("plan.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&plan).unwrap()).unwrap();
        v["runs"][0]["name"] = (*name).into();
        v["jobs"][0]["runs"][0] = (*name).into();
        std::fs::write(&plan, v.to_string()).unwrap();
        let before = snapshot(root, &sw);
        let d = s(&sw);
        for args in [
            vec!["sweep", "run-one", d, "--index", "0"],
            vec!["sweep", "run", d],
            vec!["sweep", "status", d],
            vec!["sweep", "submit", d, "--slurm", "--dry-run"],
            vec!["report", "--sweep", d, "--n", "16"],
        ] {
            hyperlens(&args).failure(&["plan.json", "runs[0].name"]);
        }
        assert_eq!(
            snapshot(root, &sw),
            before,
            "a sweep command changed files with the run name {name:?}"
        );
    }
    // A group whose group.json names runs outside it: `train --resume` and `report` refuse it.
    for (i, name) in ["../x", "", "..", abs.to_str().unwrap()].iter().enumerate() {
        let g = parent.join(format!("g{i}"));
        std::fs::create_dir_all(&g).unwrap();
        std::fs::write(
            g.join("group.json"),
            serde_json::json!({"combine": "zip", "runs": [name]}).to_string(),
        )
        .unwrap();
        let before = snapshot(root, &g);
        let d = s(&g);
        hyperlens(&["train", "--out", d, "--resume"]).failure(&["group.json", "runs[0]"]);
        let report = g.join("report");
        hyperlens(&[
            "report",
            "--checkpoint",
            d,
            "--n",
            "16",
            "--out",
            s(&report),
        ])
        .failure(&["group.json", "runs[0]"]);
        assert_eq!(snapshot(root, &g), before, "{name:?}");
    }
    // Ten thousand seeds: refused by the memory budget before any directory is made.
    let seeds: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
    let out = parent.join("seeds");
    hyperlens(&[
        "train",
        "--task",
        "sraven",
        "--seeds",
        &seeds.join(","),
        "--memory-budget",
        "2G",
        "--out",
        s(&out),
    ])
    .failure(&["10000 runs trained together", "memory budget"]);
    assert!(!out.exists(), "a refused group made its directory");
}
