//! `hyperlens train` on a tiny SRAVEN model (a few updates): the periodic evaluation lines of a
//! redirected run against `metrics.csv` and against `hyperlens eval` of the run directory, the
//! warning for a run shorter than its warm-up, exact resumption, and the errors for bad settings.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::util::{close, entries, hyperlens, json, s, safetensors, tempdir, values, Csv};

/// A tiny model and a short schedule: D 8, 2 heads of width 4, 2 layers, batch 8, evaluations of
/// 32 problems every 3 updates, `steps` updates after a warm-up of `warmup`; `extra` adds flags.
fn tiny_run(out: &Path, steps: &str, warmup: &str, extra: &[&str]) -> crate::util::Run {
    let mut args = vec![
        "train",
        "--out",
        s(out),
        "--steps",
        steps,
        "--warmup",
        warmup,
        "--batch",
        "8",
        "--eval-every",
        "3",
        "--eval-n",
        "32",
        "--log-every",
        "3",
        "--layers",
        "2",
        "--d-model",
        "8",
        "--heads",
        "2",
        "--d-head",
        "4",
        "--d-mlp",
        "16",
    ];
    args.extend_from_slice(extra);
    hyperlens(&args)
}

/// The `key value` pairs of a periodic line (`step 3/6  loss 2.1  id_acc 0.0 ...  9.9 steps/s`).
fn fields(line: &str) -> BTreeMap<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = BTreeMap::new();
    for pair in words.chunks(2) {
        let (a, b) = (pair[0], pair.get(1).copied().unwrap_or_default());
        if b == "steps/s" {
            out.insert("steps/s".to_string(), a.to_string());
        } else {
            out.insert(a.to_string(), b.to_string());
        }
    }
    out
}

fn num(f: &BTreeMap<String, String>, key: &str) -> f64 {
    f.get(key)
        .unwrap_or_else(|| panic!("no {key} in {f:?}"))
        .parse()
        .unwrap()
}

#[test]
fn a_redirected_run_prints_one_line_per_evaluation() {
    let tmp = tempdir();
    let out = tmp.path().join("run");
    let r = tiny_run(&out, "6", "2", &[]);
    let stdout = r.success();
    // Neither a progress bar nor a warning: stderr is not a terminal, and 6 steps >= warm-up 2.
    assert_eq!(r.stderr, "", "{r:?}");
    let record = json(&out.join("train.json"));
    let n_params: usize = safetensors(&out.join("model.safetensors"))
        .values()
        .map(|t| t.elem_count())
        .sum();
    assert_eq!(record["n_params"].as_u64(), Some(n_params as u64));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "training hyla ({n_params} params) on sraven: paper-seed0 from steps 0..6 -> {}",
            out.display()
        )
    );

    // One line per evaluation (steps 0, 3 and 6), each agreeing with its row of metrics.csv.
    let periodic: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("step "))
        .collect();
    assert_eq!(periodic.len(), 3, "{stdout}");
    let csv = Csv::read(&out.join("metrics.csv"));
    let steps = csv.column("step");
    for (line, step) in periodic.iter().zip(["0/6", "3/6", "6/6"]) {
        let f = fields(line);
        assert_eq!(f["step"], step, "{line}");
        let done: f64 = step.split('/').next().unwrap().parse().unwrap();
        let k = steps
            .iter()
            .position(|&s| s == done)
            .expect("a row of the evaluation");
        for (key, col) in [
            ("id_acc", "id_acc"),
            ("ood_acc", "ood_acc"),
            ("id_loss", "id_loss"),
            ("ood_loss", "ood_loss"),
        ] {
            close(
                &format!("{line}: {key}"),
                num(&f, key),
                csv.column(col)[k],
                5e-5,
            );
        }
        if step == "0/6" {
            // Before any update: no training loss and no speed.
            assert!(
                !f.contains_key("loss") && !f.contains_key("steps/s"),
                "{line}"
            );
        } else {
            let train_loss: f64 = csv.strings("train_loss")[k].parse().unwrap();
            close(&format!("{line}: loss"), num(&f, "loss"), train_loss, 5e-5);
            assert!(num(&f, "steps/s") > 0.0, "{line}");
        }
    }
    let last = fields(periodic[2]);
    let done = lines
        .iter()
        .find(|l| l.starts_with("done: 6 steps in "))
        .expect(stdout);
    assert!(
        done.ends_with(&format!(
            "final ID acc {}, OOD acc {}",
            last["id_acc"], last["ood_acc"]
        )),
        "{done}"
    );
    assert_eq!(
        *lines.last().unwrap(),
        format!(
            "wrote {} (checkpoint: config.json, model.safetensors; train.json, metrics.csv)",
            out.display()
        )
    );

    // The run directory is a checkpoint: `eval` on the training run's evaluation sets (seed 0,
    // 32 permuted problems) gives its final evaluation.
    for set in ["id", "ood"] {
        let e = hyperlens(&[
            "eval",
            "--checkpoint",
            s(&out),
            "--split",
            "paper-seed0",
            "--set",
            set,
            "--n",
            "32",
            "--seed",
            "0",
            "--json",
        ]);
        let m: Value = serde_json::from_str(e.success()).unwrap();
        let fin = &record["final_eval"][set];
        assert_eq!(m["accuracy"], fin["metric"], "{set}");
        assert_eq!(m["per_feature_accuracy"], fin["per_feature"], "{set}");
        close(
            set,
            m["loss"].as_f64().unwrap(),
            fin["loss"].as_f64().unwrap(),
            1e-6,
        );
        close(
            set,
            num(&last, &format!("{set}_loss")),
            fin["loss"].as_f64().unwrap(),
            5e-5,
        );
    }
}

#[test]
fn a_run_shorter_than_its_warm_up_is_warned_about() {
    let tmp = tempdir();
    let out = tmp.path().join("short");
    let r = tiny_run(&out, "3", "10", &["--quiet"]);
    let stdout = r.success();
    assert_eq!(
        r.stderr,
        "warning: --steps 3 is shorter than the warm-up (10 steps): the learning rate never reaches its peak\n"
    );
    // --quiet drops only the progress bar: the evaluation lines are still printed.
    assert!(
        stdout.lines().any(|l| l.starts_with("step 3/3  loss ")),
        "{stdout}"
    );
    // The claim: the learning rate stays below the peak (1e-3) for the whole run.
    let lr = Csv::read(&out.join("metrics.csv")).finite("lr");
    assert!(lr.iter().all(|&v| v < 0.3e-3), "{lr:?}");

    // The default warm-up of SRAVEN (1000 steps).
    let out = tmp.path().join("default");
    let r = hyperlens(&[
        "train",
        "--out",
        s(&out),
        "--steps",
        "1",
        "--batch",
        "2",
        "--eval-every",
        "0",
        "--eval-n",
        "2",
        "--layers",
        "1",
        "--d-model",
        "8",
        "--heads",
        "2",
        "--d-head",
        "4",
        "--d-mlp",
        "8",
    ]);
    r.success();
    assert!(
        r.stderr
            .contains("warning: --steps 1 is shorter than the warm-up (1000 steps)"),
        "{r:?}"
    );
}

#[test]
fn a_stopped_and_resumed_run_ends_with_the_weights_of_an_uninterrupted_one() {
    let tmp = tempdir();
    let whole = tmp.path().join("whole");
    tiny_run(&whole, "6", "2", &[]).success();
    let parts = tmp.path().join("parts");
    let r = tiny_run(&parts, "6", "2", &["--stop-after", "3"]);
    assert_eq!(
        r.success().lines().last().unwrap(),
        format!(
            "stopped at step 3 of 6; continue with: hyperlens train --out {} --resume",
            parts.display()
        )
    );
    assert!(!parts.join("train.json").exists());
    let r = hyperlens(&["train", "--out", s(&parts), "--resume"]);
    let stdout = r.success();
    assert!(stdout.contains(" resuming at steps 3..6 -> "), "{stdout}");
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("step 6/6  loss "))
            .count(),
        1,
        "{stdout}"
    );
    assert!(
        stdout.contains("done: 6 steps in ") && stdout.contains("2 sessions"),
        "{stdout}"
    );
    // The tensors, not the file's bytes: the order of the header's metadata varies between runs.
    let (a, b) = (
        safetensors(&whole.join("model.safetensors")),
        safetensors(&parts.join("model.safetensors")),
    );
    assert_eq!(a.len(), b.len());
    for (name, t) in &a {
        assert!(
            values(t) == values(&b[name]),
            "resumed weights differ: {name}"
        );
    }
    // The logs agree too, except for the times.
    let (a, b) = (
        Csv::read(&whole.join("metrics.csv")),
        Csv::read(&parts.join("metrics.csv")),
    );
    for col in [
        "step",
        "lr",
        "train_loss",
        "id_acc",
        "ood_acc",
        "id_loss",
        "ood_loss",
    ] {
        assert_eq!(a.strings(col), b.strings(col), "{col}");
    }
    // A finished run cannot be resumed.
    hyperlens(&["train", "--out", s(&parts), "--resume"])
        .failure(&[s(&parts), "already complete (6 of 6 steps)"]);
}

#[test]
fn train_failures_name_the_flag() {
    let tmp = tempdir();
    let run = tmp.path().join("run");
    tiny_run(&run, "6", "2", &["--stop-after", "3"]).success();
    let before = entries(&run);
    tiny_run(&run, "6", "2", &[])
        .failure(&[&format!("--out {} is not empty", run.display()), "--resume"]);
    hyperlens(&["train", "--out", s(&run), "--resume", "--lr", "0.5"])
        .failure(&["train_state.json", "different settings: lr"]);
    hyperlens(&["train", "--out", s(&run), "--resume", "--task", "logic"])
        .failure(&["--task logic", "trains sraven"]);
    assert_eq!(entries(&run), before);
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    hyperlens(&["train", "--out", s(&empty), "--resume"])
        .failure(&["--resume", "train_state.json"]);
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    tiny_run(&file, "6", "2", &[]).failure(&["is a file, not a run directory"]);
    let new = tmp.path().join("new");
    let n = s(&new);
    hyperlens(&["train", "--out", n, "--width", "3"]).failure(&["--width must be 1, 2 or 4"]);
    hyperlens(&["train", "--out", n, "--split", "seed3", "--holdout", "1.5"])
        .failure(&["--holdout: 1.5 is not in [0, 1)"]);
    hyperlens(&["train", "--out", n, "--task", "induction", "--seq-len", "1"])
        .failure(&["--seq-len: 1"]);
    hyperlens(&["train", "--out", n, "--attn-only"]).failure(&["--attn-only", "sraven"]);
    hyperlens(&["train", "--out", n, "--dropout", "1"]).failure(&["--dropout must be in [0, 1)"]);
    hyperlens(&["train", "--out", n, "--split", "paper-seed9"]).failure(&["paper-seed9"]);
    assert!(!new.exists());
}

#[test]
fn train_usage_errors() {
    hyperlens(&["train", "--out", "x", "--mixer", "nope"])
        .usage_error(&["invalid value 'nope' for '--mixer <MIXER>'"]);
    hyperlens(&["train", "--out", "x", "--device", "foo"])
        .usage_error(&["invalid value 'foo' for '--device <DEVICE>'"]);
    hyperlens(&["train", "--out", "x", "--task", "raven"]).usage_error(&[
        "invalid value 'raven' for '--task <TASK>'",
        "sraven, logic or induction",
    ]);
    hyperlens(&["train", "--out", "x", "--steps", "many"])
        .usage_error(&["invalid value 'many' for '--steps <STEPS>'"]);
    hyperlens(&["train", "--out", "x", "--d-model", "8"]).usage_error(&[
        "--heads <HEADS>",
        "--d-head <D_HEAD>",
        "--d-mlp <D_MLP>",
    ]);
    hyperlens(&["train", "--steps", "3"]).usage_error(&["--out <OUT>"]);
}

/// `train --seeds` trains a group: `group.json` and one ordinary run directory per run, named by
/// what differs, each equal (weights and logs) to the single run with its settings, with prefixed
/// lines; a group stopped part-way resumes as one from its directory; finished runs are then
/// listed and skipped. A run that diverges stops alone, with `failed.json`, and the command fails
/// naming it after the others finished.
#[test]
fn a_group_of_seeds_trains_as_its_single_runs() {
    let tmp = tempdir();
    let group = tmp.path().join("group");
    let r = tiny_run(
        &group,
        "6",
        "2",
        &[
            "--seeds",
            "0,1",
            "--splits",
            "paper-seed0,paper-seed1",
            "--stop-after",
            "3",
        ],
    );
    let stdout = r.success();
    assert!(
        stdout.contains("[seed-1_split-paper-seed1] step 3/6  loss "),
        "{stdout}"
    );
    assert!(
        stdout.lines().last().unwrap().contains(&format!(
            "continue the group with: hyperlens train --out {} --resume",
            group.display()
        )),
        "{stdout}"
    );
    let file = json(&group.join("group.json"));
    assert_eq!(file["combine"], "zip");
    assert_eq!(
        file["runs"],
        serde_json::json!(["seed-0_split-paper-seed0", "seed-1_split-paper-seed1"])
    );
    let stdout = hyperlens(&["train", "--out", s(&group), "--resume"])
        .success()
        .to_owned();
    assert!(stdout.contains("training 2 runs together"), "{stdout}");
    assert!(stdout.contains("model-steps/s"), "{stdout}");
    for (i, name) in ["seed-0_split-paper-seed0", "seed-1_split-paper-seed1"]
        .iter()
        .enumerate()
    {
        let member = group.join(name);
        let single = tmp.path().join(format!("single-{i}"));
        let seed = i.to_string();
        let split = format!("paper-seed{i}");
        tiny_run(&single, "6", "2", &["--seed", &seed, "--split", &split]).success();
        let (a, b) = (
            safetensors(&member.join("model.safetensors")),
            safetensors(&single.join("model.safetensors")),
        );
        for (n, t) in &a {
            assert!(
                values(t) == values(&b[n]),
                "{name}: {n} differs from the single run"
            );
        }
        let (a, b) = (
            Csv::read(&member.join("metrics.csv")),
            Csv::read(&single.join("metrics.csv")),
        );
        for col in ["step", "lr", "train_loss", "id_acc", "ood_loss"] {
            assert_eq!(a.strings(col), b.strings(col), "{name}: {col}");
        }
        let rec = json(&member.join("train.json"));
        assert_eq!(rec["seed"], i as u64);
        assert_eq!(rec["sessions"][1]["batched"], 2);
        // The member is an ordinary checkpoint for the other commands.
        hyperlens(&["eval", "--checkpoint", s(&member), "--n", "16"]).success();
    }
    let stdout = hyperlens(&["train", "--out", s(&group), "--resume"])
        .success()
        .to_owned();
    assert!(
        stdout.contains("seed-0_split-paper-seed0: complete"),
        "{stdout}"
    );
    assert!(stdout.contains("nothing to resume"), "{stdout}");

    // One diverging run of two.
    let bad = tmp.path().join("bad");
    let r = tiny_run(&bad, "6", "2", &["--seeds", "0,1", "--lr", "1e-3,1e30"]);
    r.failure(&[
        "seed-1_lr-1e30",
        "diverged",
        "failed.json",
        "1 of 2 runs diverged",
    ]);
    assert!(bad.join("seed-0_lr-1e-3/train.json").exists());
    let failed = json(&bad.join("seed-1_lr-1e30/failed.json"));
    assert!(failed["error"].as_str().unwrap().contains("diverged"));
    assert!(!bad.join("seed-1_lr-1e30/train.json").exists());

    // Lists that do not zip, lists with --resume on a single run, a group into a non-empty dir.
    let n = tmp.path().join("n");
    tiny_run(&n, "6", "2", &["--seeds", "0,1,2", "--lr", "1e-3,3e-4"])
        .failure(&["zipped lists", "--grid"]);
    assert!(!n.exists());
    tiny_run(&group, "6", "2", &["--seeds", "5"]).failure(&["is not empty"]);
    let single = tmp.path().join("single-0");
    hyperlens(&["train", "--out", s(&single), "--resume", "--seeds", "0,1"])
        .failure(&["--resume with lists", "group.json"]);
    hyperlens(&["train", "--out", s(&group), "--resume", "--seeds", "0,1"])
        .failure(&["is a group"]);
    hyperlens(&["train", "--out", "x", "--seed", "1", "--seeds", "0,1"])
        .usage_error(&["--seed <SEED>", "cannot be used with"]);
}
