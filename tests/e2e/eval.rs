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
