//! The unit tests of the sweep plan: expansion, job batching, the written plan and its checks.

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

/// Writes `plan` into a fresh directory with `edit` applied to its JSON and reads it back.
fn read_edited(plan: &Plan, edit: impl FnOnce(&mut serde_json::Value)) -> Result<Plan> {
    let dir = tempfile::tempdir().unwrap();
    let mut v = serde_json::to_value(plan).unwrap();
    edit(&mut v);
    std::fs::write(dir.path().join(PLAN_FILE), v.to_string()).unwrap();
    Plan::read(dir.path())
}

#[test]
fn a_damaged_plan_is_refused_with_the_entry_at_fault() {
    let p = Plan::expand(
        "t",
        &spec("[axes]\nseed = [0, 1]\n[sweep]\nbatch = false\n"),
    )
    .unwrap();
    assert_eq!(read_edited(&p, |_| {}).unwrap(), p);
    let rename = |name: &str| {
        let name = name.to_string();
        move |v: &mut serde_json::Value| {
            v["runs"][0]["name"] = name.clone().into();
            v["jobs"][0]["runs"][0] = name.into();
        }
    };
    for name in [
        "../../x", "/abs", "", ".", "..", "a/b", "a\nb", "a b", ".hidden",
    ] {
        let e = read_edited(&p, rename(name)).unwrap_err().to_string();
        assert!(e.contains("runs[0].name"), "{name:?}: {e}");
    }
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "used twice",
            Box::new(|v| {
                v["runs"][1]["name"] = "seed-0".into();
                v["jobs"][1]["runs"][0] = "seed-0".into();
            }),
        ),
        ("names job 9", Box::new(|v| v["runs"][0]["job"] = 9.into())),
        (
            "not among `runs`",
            Box::new(|v| v["jobs"][0]["runs"][0] = "seed-7".into()),
        ),
        (
            "has index 0",
            Box::new(|v| v["jobs"][1]["index"] = 0.into()),
        ),
        (
            "lists no run",
            Box::new(|v| v["jobs"][1]["runs"] = serde_json::json!([])),
        ),
        (
            "belongs to job 1",
            Box::new(|v| v["jobs"][0]["runs"][0] = "seed-1".into()),
        ),
        (
            "`runs` is empty",
            Box::new(|v| {
                v["runs"] = serde_json::json!([]);
                v["jobs"] = serde_json::json!([]);
            }),
        ),
        (
            "which a sweep may not set",
            Box::new(|v| {
                v["runs"][0]["args"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!(["out", "/x"]));
            }),
        ),
        ("`name`", Box::new(|v| v["name"] = "a\nb".into())),
    ];
    for (needle, edit) in cases {
        let e = read_edited(&p, edit).unwrap_err().to_string();
        assert!(
            e.contains(needle) && e.contains("plan.json"),
            "{needle}: {e}"
        );
    }
}

#[test]
fn planning_is_linear_and_bounded_by_the_budget() {
    // 200 x 200 runs: the old linear searches made this quadratic (40,000^2 / 2 name
    // comparisons); the jobs still fill up to max_batch in grid order.
    let steps: Vec<String> = (1..=200).map(|i| i.to_string()).collect();
    let lrs: Vec<String> = (1..=200).map(|i| format!("{i}e-6")).collect();
    let text = format!(
        "[axes]\nsteps = [{}]\nlr = [{}]\n[sweep]\nmax_batch = 7\n",
        steps.join(","),
        lrs.join(",")
    );
    let p = Plan::expand("t", &spec(&text)).unwrap();
    assert_eq!(p.runs.len(), 40_000);
    assert_eq!(run_count(&spec(&text)), 40_000);
    // Each steps value has 200 runs (the learning rate batches): ceil(200 / 7) = 29 jobs.
    assert_eq!(p.jobs.len(), 200 * 29);
    let by_name: HashMap<&str, &PlannedRun> = p.runs.iter().map(|r| (r.name.as_str(), r)).collect();
    for (j, job) in p.jobs.iter().enumerate() {
        assert_eq!(job.index, j);
        assert!(!job.runs.is_empty() && job.runs.len() <= 7);
        let steps = by_name[job.runs[0].as_str()].arg("steps");
        for name in &job.runs {
            assert_eq!(by_name[name.as_str()].job, j);
            assert_eq!(by_name[name.as_str()].arg("steps"), steps);
        }
    }
    // The runs of one steps value fill their jobs in grid order: 7, 7, ..., 4.
    assert_eq!(p.jobs[28].runs.len(), 200 - 28 * 7);
    assert_eq!(p.runs[7].job, 1);
    // The plan reads back (every check passes on 40,000 runs).
    let dir = tempfile::tempdir().unwrap();
    p.write(&dir.path().join("sw"), &text).unwrap();
    assert_eq!(Plan::read(&dir.path().join("sw")).unwrap(), p);
    // Zipped axes count once.
    let z = spec("[axes]\nseed = [0, 1, 2]\nsplit = [\"a\", \"b\", \"c\"]\nlr = [1, 2]\n[sweep]\nzip = [[\"seed\", \"split\"]]\n");
    assert_eq!(run_count(&z), 6);
    assert_eq!(Plan::expand("z", &z).unwrap().runs.len(), 6);
    // A grid of 10^12 runs is refused by the memory budget before anything is built.
    let big: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
    let text = format!(
        "[axes]\nseed = [{0}]\nsteps = [{0}]\nbatch = [{0}]\nwarmup = [{0}]\n",
        big.join(",")
    );
    let e = Plan::expand("big", &spec(&text)).unwrap_err().to_string();
    assert!(
        e.contains("1000000000000 runs") && e.contains("memory budget"),
        "{e}"
    );
}
