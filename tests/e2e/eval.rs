//! `hyperlens eval` on the shipped trained softmax checkpoint: accuracy, per-feature accuracy and
//! loss recomputed here from the logits it saves, the same numbers from a problem file written by
//! `tasks sample`, and its errors.

use ndarray::ArrayD;
use serde_json::Value;

use crate::util::{array, close, entries, hyperlens, repo_path, s, tempdir};

const N: usize = 64;

#[test]
fn eval_metrics_agree_with_its_saved_logits_and_with_a_sampled_file() {
    let tmp = tempdir();
    let ckpt = repo_path("data/checkpoints/sraven-softmax");
    let logits_path = tmp.path().join("logits.npz");
    let n = N.to_string();
    let sampled = [
        "--split",
        "paper-seed0",
        "--set",
        "ood",
        "--n",
        &n,
        "--seed",
        "5",
    ];
    let mut args = vec!["eval", "--checkpoint", s(&ckpt), "--batch", "24", "--json"];
    args.extend(sampled);
    args.extend(["--save-logits", s(&logits_path)]);
    let m: Value = serde_json::from_str(hyperlens(&args).success()).unwrap();
    assert_eq!(m["n"].as_u64(), Some(N as u64));

    let logits: ArrayD<f32> = array(&logits_path, "logits");
    let pred: ArrayD<i64> = array(&logits_path, "pred");
    let y: ArrayD<i64> = array(&logits_path, "y");
    assert_eq!(logits.shape(), &[N, 4, 8]);
    assert_eq!((pred.shape(), y.shape()), (&[N, 4][..], &[N, 4][..]));
    let (mut right, mut per_feature, mut loss) = (0usize, [0usize; 4], 0.0f64);
    for i in 0..N {
        for f in 0..4 {
            let row: Vec<f64> = (0..8).map(|m| f64::from(logits[[i, f, m]])).collect();
            let argmax = (0..8).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            assert_eq!(pred[[i, f]], argmax as i64, "problem {i}, feature {f}");
            let max = row[argmax];
            let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            loss += lse - row[y[[i, f]] as usize];
            per_feature[f] += usize::from(pred[[i, f]] == y[[i, f]]);
        }
        right += usize::from((0..4).all(|f| pred[[i, f]] == y[[i, f]]));
    }
    let acc = m["accuracy"].as_f64().unwrap();
    assert_eq!(acc, right as f64 / N as f64);
    // A trained model (about 55 % on the paper's OOD tasks); chance is 8^-4.
    assert!(acc > 0.25, "accuracy {acc}");
    for (f, c) in per_feature.iter().enumerate() {
        assert_eq!(
            m["per_feature_accuracy"][f].as_f64(),
            Some(*c as f64 / N as f64)
        );
    }
    close(
        "loss",
        m["loss"].as_f64().unwrap(),
        loss / (4 * N) as f64,
        1e-5,
    );

    // The same problems written by `tasks sample` give the same numbers, in one batch of 256.
    let problems = tmp.path().join("p.npz");
    let mut args = vec!["tasks", "sample", "--out", s(&problems)];
    args.extend(sampled);
    hyperlens(&args).success();
    assert_eq!(array::<i64>(&problems, "y"), y);
    let r = hyperlens(&[
        "eval",
        "--checkpoint",
        s(&ckpt),
        "--problems",
        s(&problems),
        "--json",
    ]);
    let m2: Value = serde_json::from_str(r.success()).unwrap();
    assert_eq!(m2["accuracy"], m["accuracy"]);
    assert_eq!(m2["per_feature_accuracy"], m["per_feature_accuracy"]);
    close(
        "loss, one batch",
        m2["loss"].as_f64().unwrap(),
        m["loss"].as_f64().unwrap(),
        1e-6,
    );

    // The text form says the same.
    let text = hyperlens(&["eval", "--checkpoint", s(&ckpt), "--problems", s(&problems)])
        .success()
        .to_string();
    assert!(
        text.contains(&format!(
            "accuracy     {:.2} % (all 4 features right)",
            100.0 * acc
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}: {N}\n", problems.display())),
        "{text}"
    );
}

#[test]
fn eval_failures_name_the_flag_or_file() {
    let tmp = tempdir();
    let ckpt = repo_path("data/checkpoints/sraven-softmax");
    let c = s(&ckpt);
    hyperlens(&[
        "eval",
        "--checkpoint",
        c,
        "--split",
        "paper-seed0",
        "--n",
        "4",
        "--batch",
        "0",
    ])
    .failure(&["--batch must be positive"]);
    hyperlens(&[
        "eval",
        "--checkpoint",
        c,
        "--split",
        "paper-seed0",
        "--n",
        "0",
    ])
    .failure(&["--n must be positive"]);
    hyperlens(&["eval", "--checkpoint", c, "--split", "bogus"]).failure(&["bogus", "paper-seed0"]);
    let missing = tmp.path().join("missing.npz");
    hyperlens(&["eval", "--checkpoint", c, "--problems", s(&missing)]).failure(&[s(&missing)]);
    // A file without the problem arrays names the missing array.
    let logits = tmp.path().join("logits.npz");
    hyperlens(&[
        "eval",
        "--checkpoint",
        c,
        "--split",
        "paper-seed0",
        "--n",
        "2",
        "--save-logits",
        s(&logits),
    ])
    .success();
    hyperlens(&["eval", "--checkpoint", c, "--problems", s(&logits)])
        .failure(&[s(&logits), "array `x`: missing"]);
    let no_ckpt = tmp.path().join("no-checkpoint");
    hyperlens(&[
        "eval",
        "--checkpoint",
        s(&no_ckpt),
        "--split",
        "paper-seed0",
    ])
    .failure(&[s(&no_ckpt)]);
    // Without CUDA compiled in, a CUDA device is refused by the command, with the fix.
    if !cfg!(feature = "cuda") {
        hyperlens(&[
            "eval",
            "--checkpoint",
            c,
            "--split",
            "paper-seed0",
            "--device",
            "cuda",
        ])
        .failure(&["cuda", "--features cuda"]);
    }
    assert_eq!(entries(tmp.path()), ["logits.npz"]);
}

#[test]
fn eval_usage_errors() {
    let ckpt = repo_path("data/checkpoints/sraven-softmax");
    let c = s(&ckpt);
    hyperlens(&[
        "eval",
        "--checkpoint",
        c,
        "--split",
        "paper-seed0",
        "--device",
        "foo",
    ])
    .usage_error(&[
        "invalid value 'foo' for '--device <DEVICE>'",
        "cpu, cuda or metal",
    ]);
    hyperlens(&[
        "eval",
        "--checkpoint",
        c,
        "--split",
        "paper-seed0",
        "--set",
        "both",
    ])
    .usage_error(&["invalid value 'both' for '--set <SET>'"]);
    hyperlens(&[
        "eval",
        "--checkpoint",
        c,
        "--problems",
        "p.npz",
        "--split",
        "paper-seed0",
    ])
    .usage_error(&["'--problems <PROBLEMS>' cannot be used with '--split <SPLIT>'"]);
    // No --split: the checkpoint's recorded split is the default; a shipped run records one.
    let out = hyperlens(&["eval", "--checkpoint", c, "--n", "8"]);
    let recorded = crate::util::json(&std::path::Path::new(c).join("train.json"))["split"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        out.success()
            .contains(&format!("problems     {recorded} ood")),
        "{}",
        out.stdout
    );
    // Another split is refused unless asked for.
    let other = if recorded == "paper-seed1" {
        "paper-seed0"
    } else {
        "paper-seed1"
    };
    hyperlens(&["eval", "--checkpoint", c, "--split", other, "--n", "8"]).failure(&[
        "--split",
        other,
        &recorded,
        "--other-split",
    ]);
    hyperlens(&[
        "eval",
        "--checkpoint",
        c,
        "--split",
        other,
        "--other-split",
        "--n",
        "8",
    ])
    .success();
}

/// A fuzzy-logic checkpoint: `tasks sample --task logic` writes sets whose arrays follow the task's
/// definition (checked here independently: the last target is the fuzzy value of the last token's
/// inputs under the task's terms, and every token but the last carries the previous target), and
/// `eval` gives the same R² and MSE on that file as on the same sequences sampled directly, for any
/// `--batch`. A split other than the recorded one is refused.
#[test]
fn logic_checkpoints_are_evaluated_by_r2_and_mse() {
    let tmp = tempdir();
    let run = tmp.path().join("logic");
    let args = [
        "train",
        "--task",
        "logic",
        "--mixer",
        "hyla",
        "--split",
        "seed0",
        "--steps",
        "20",
        "--batch",
        "16",
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "4",
        "--d-head",
        "2",
        "--d-mlp",
        "32",
        "--eval-every",
        "0",
        "--eval-n",
        "64",
        "--out",
        s(&run),
    ];
    hyperlens(&args).success();
    let file = tmp.path().join("sets/ood.npz");
    let out = hyperlens(&[
        "tasks",
        "sample",
        "--task",
        "logic",
        "--set",
        "ood",
        "--n",
        "300",
        "--out",
        s(&file),
    ]);
    assert!(
        out.success().contains("wrote 300 logic problems"),
        "{}",
        out.stdout
    );
    let x: ArrayD<f32> = array(&file, "x");
    let y: ArrayD<f32> = array(&file, "y");
    let targets: ArrayD<f32> = array(&file, "targets");
    let terms: ArrayD<u8> = array(&file, "terms");
    let ids: ArrayD<i64> = array(&file, "term_ids");
    let (n, t, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let (k, l) = (terms.shape()[1], terms.shape()[2]);
    assert_eq!((n, t, d, k, l), (300, 32, 5, 2, 4));
    for i in 0..n {
        let f = (0..k)
            .map(|j| {
                (0..l)
                    .map(|v| {
                        let xv = x[[i, t - 1, v]];
                        if terms[[i, j, v]] == 1 {
                            xv
                        } else {
                            1.0 - xv
                        }
                    })
                    .fold(f32::INFINITY, f32::min)
            })
            .fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(
            f,
            y[[i]],
            "sequence {i}: y is not the fuzzy value of its last token"
        );
        assert_eq!(targets[[i, t - 1]], y[[i]]);
        for s_ in 0..t - 1 {
            assert_eq!(x[[i, s_, l]], targets[[i, s_]], "sequence {i}, token {s_}");
        }
        assert_eq!(x[[i, t - 1, l]], 0.0);
        for j in 0..k {
            let bits: i64 = (0..l)
                .map(|v| (terms[[i, j, v]] as i64) << (l - 1 - v))
                .sum();
            let lsb: i64 = (0..l).map(|v| (terms[[i, j, v]] as i64) << v).sum();
            assert!(
                ids[[i, j]] == bits || ids[[i, j]] == lsb,
                "term index {i} {j}"
            );
        }
    }
    let parse = |stdout: &str| -> (f64, f64, u64) {
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        (
            v["r2"].as_f64().unwrap(),
            v["mse"].as_f64().unwrap(),
            v["n"].as_u64().unwrap(),
        )
    };
    let c = s(&run);
    let from_file = hyperlens(&["eval", "--checkpoint", c, "--problems", s(&file), "--json"]);
    let (r2_file, mse_file, n_file) = parse(from_file.success());
    assert_eq!(n_file, 300);
    for batch in ["256", "7"] {
        let sampled = hyperlens(&[
            "eval",
            "--checkpoint",
            c,
            "--set",
            "ood",
            "--n",
            "300",
            "--batch",
            batch,
            "--json",
        ]);
        let (r2, mse, _) = parse(sampled.success());
        close("R² file vs sampled", r2, r2_file, 1e-9);
        close("MSE file vs sampled", mse, mse_file, 1e-9);
    }
    // MSE is the mean squared error of something in [0, 1]; R² of an untrained model is below 1.
    assert!(
        mse_file > 0.0 && mse_file < 1.0 && r2_file < 1.0,
        "{mse_file} {r2_file}"
    );
    // All three sets by default, one JSON line each.
    let all = hyperlens(&["eval", "--checkpoint", c, "--n", "64", "--json"]);
    let sets: Vec<String> = all
        .success()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["set"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(sets, ["id", "ood", "unknown"]);
    hyperlens(&["eval", "--checkpoint", c, "--split", "seed4", "--n", "8"]).failure(&[
        "--split seed4",
        "seed0",
        "--other-split",
    ]);
}

/// `eval` of `ckpt` prints the same on `problems` and on `noted`, its copy with unread arrays.
fn same_eval(ckpt: &std::path::Path, problems: &std::path::Path, noted: &std::path::Path) {
    let printed = |file: &std::path::Path| {
        hyperlens(&["eval", "--checkpoint", s(ckpt), "--problems", s(file)])
            .success()
            .replace(s(file), "FILE")
    };
    assert_eq!(printed(problems), printed(noted));
}

/// `analyze` succeeds on the ID and OOD code files `codes`, writing into `out`.
fn analyze_ok(codes: &[std::path::PathBuf], out: &std::path::Path) {
    hyperlens(&[
        "analyze",
        "--train",
        s(&codes[0]),
        "--test",
        s(&codes[1]),
        "--out",
        s(out),
        "--quiet",
    ])
    .success();
}

/// Arrays hyperlens never reads, of dtypes it does not read (a numpy unicode `<U5` array and an
/// object array), are ignored in problem files and code files, as `numpy.load` ignores them: the
/// commands print the same as on the files without them.
#[test]
fn arrays_that_are_not_read_are_ignored_whatever_their_dtype() {
    use crate::corpus_values::{append_unread_arrays, logic_checkpoint};
    let tmp = tempdir();
    let dir = tmp.path();
    let with_notes = |path: &std::path::Path| {
        let copy = path.with_extension("notes.npz");
        std::fs::copy(path, &copy).unwrap();
        append_unread_arrays(&copy);
        copy
    };
    // SRAVEN: a problem file (eval) and code files (analyze).
    let ckpt = repo_path("data/checkpoints/sraven-softmax");
    let problems = dir.join("p.npz");
    hyperlens(&[
        "tasks",
        "sample",
        "--split",
        "paper-seed0",
        "--n",
        "16",
        "--out",
        s(&problems),
    ])
    .success();
    same_eval(&ckpt, &problems, &with_notes(&problems));
    let mut codes = Vec::new();
    for set in ["id", "ood"] {
        let path = dir.join(format!("codes-{set}.npz"));
        hyperlens(&[
            "probe",
            "--checkpoint",
            s(&ckpt),
            "--split",
            "paper-seed0",
            "--set",
            set,
            "--n",
            "64",
            "--unpermuted",
            "--out",
            s(&path),
        ])
        .success();
        codes.push(with_notes(&path));
    }
    analyze_ok(&codes, &dir.join("sraven-analysis"));
    // Fuzzy logic: a problem file (eval, probe) and code files (analyze).
    let run = dir.join("logic-run");
    logic_checkpoint(&run);
    let problems = dir.join("logic.npz");
    hyperlens(&[
        "tasks",
        "sample",
        "--task",
        "logic",
        "--n",
        "12",
        "--out",
        s(&problems),
    ])
    .success();
    let noted = with_notes(&problems);
    same_eval(&run, &problems, &noted);
    let from_file = dir.join("logic-codes-file.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&run),
        "--problems",
        s(&noted),
        "--out",
        s(&from_file),
    ])
    .success();
    let mut codes = Vec::new();
    for set in ["id", "ood"] {
        let path = dir.join(format!("logic-codes-{set}.npz"));
        hyperlens(&[
            "probe",
            "--checkpoint",
            s(&run),
            "--set",
            set,
            "--n",
            "100",
            "--out",
            s(&path),
        ])
        .success();
        codes.push(with_notes(&path));
    }
    analyze_ok(&codes, &dir.join("logic-analysis"));
}

/// A logic problem file whose targets are all equal in some sequences: those have no R² (the
/// variance it divides by is 0), and eval says over how many sequences its R² is taken.
#[test]
fn logic_eval_counts_the_sequences_its_r2_scores() {
    use crate::corpus_values::{logic_checkpoint, write_arrays, Arr};
    let tmp = tempdir();
    let run = tmp.path().join("logic-run");
    logic_checkpoint(&run);
    let problems = tmp.path().join("logic.npz");
    hyperlens(&[
        "tasks",
        "sample",
        "--task",
        "logic",
        "--n",
        "10",
        "--out",
        s(&problems),
    ])
    .success();
    let mut targets: ArrayD<f32> = array(&problems, "targets");
    let mut x: ArrayD<f32> = array(&problems, "x");
    let mut y: ArrayD<f32> = array(&problems, "y");
    let (t, l) = (x.shape()[1], x.shape()[2] - 1);
    // Sequences 0 and 4: every target 0.5 (the context tokens carry it, the answer too).
    for i in [0, 4] {
        for j in 0..t {
            targets[[i, j]] = 0.5;
            if j + 1 < t {
                x[[i, j, l]] = 0.5;
            }
        }
        y[[i]] = 0.5;
    }
    let edited = tmp.path().join("constant.npz");
    write_arrays(
        &edited,
        &[
            ("x", Arr::F32(x)),
            ("y", Arr::F32(y)),
            ("targets", Arr::F32(targets)),
            ("terms", Arr::U8(array(&problems, "terms"))),
            ("term_ids", Arr::I64(array(&problems, "term_ids"))),
        ],
    );
    let out = hyperlens(&[
        "eval",
        "--checkpoint",
        s(&run),
        "--problems",
        s(&edited),
        "--json",
    ])
    .success()
    .to_owned();
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["n"].as_u64(), Some(10), "{out}");
    assert_eq!(v["n_r2"].as_u64(), Some(8), "{out}");
    assert!(v["r2"].as_f64().unwrap().is_finite(), "{out}");
    assert!(v["mse"].as_f64().unwrap().is_finite(), "{out}");
    let text = hyperlens(&["eval", "--checkpoint", s(&run), "--problems", s(&edited)])
        .success()
        .to_owned();
    assert!(text.contains("10 sequences; R² over the 8"), "{text}");
}
