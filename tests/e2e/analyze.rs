//! `hyperlens analyze` on ID / OOD codes that `probe` writes for the shipped softmax model: the
//! majority baseline, the confusion counts and the PCA recomputed here from the codes and labels,
//! the printed table against `decoding.csv`, and its errors.

use std::collections::BTreeMap;

use hyperlens_model::Mixer;
use ndarray::{Array2, ArrayD, Axis};

use crate::util::{
    array, close, hyperlens, in_range, json, repo_path, s, sraven_checkpoint, tempdir, Csv,
};

const N: usize = 64;

/// The codes of one layer (or all layers) as a matrix [N, features].
fn layer_matrix(codes: &ArrayD<f32>, layer: &str) -> Array2<f64> {
    let c = match layer {
        "all" => codes.view(),
        l => codes.index_axis(Axis(1), l.parse().unwrap()),
    };
    let n = c.shape()[0];
    let flat: Vec<f64> = c.iter().map(|&v| f64::from(v)).collect();
    Array2::from_shape_vec((n, flat.len() / n), flat).unwrap()
}

#[test]
fn analyze_tables_agree_with_the_codes() {
    let tmp = tempdir();
    // The shipped trained softmax model: 4 layers of 16 heads, codes that carry the rule.
    let ckpt = repo_path("data/checkpoints/sraven-softmax");
    let n = N.to_string();
    let (train, test) = (tmp.path().join("id.npz"), tmp.path().join("ood.npz"));
    for (set, path) in [("id", &train), ("ood", &test)] {
        hyperlens(&[
            "probe",
            "--checkpoint",
            s(&ckpt),
            "--split",
            "paper-seed0",
            "--set",
            set,
            "--n",
            &n,
            "--unpermuted",
            "--out",
            s(path),
        ])
        .success();
    }
    let out = tmp.path().join("tables");
    let r = hyperlens(&[
        "analyze",
        "--train",
        s(&train),
        "--test",
        s(&test),
        "--out",
        s(&out),
        "--quiet",
        "--seed",
        "1",
    ]);
    let stdout = r.success().to_string();
    assert_eq!(r.stderr, "");
    let layers = ["0", "1", "2", "3", "all"];
    // In the tables `layer` stays an integer column: all layers are `-1`, marked by `all_layers`.
    let table = |layer: &str| if layer == "all" { "-1" } else { layer }.to_string();

    // Majority baseline: the most frequent training label (the smallest on ties), scored on test.
    let train_y: ArrayD<i64> = array(&train, "label");
    let test_y: ArrayD<i64> = array(&test, "label");
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for &l in &train_y {
        *counts.entry(l).or_default() += 1;
    }
    let best = *counts.values().max().unwrap();
    let majority = *counts.iter().find(|(_, &c)| c == best).unwrap().0;
    let baseline = test_y.iter().filter(|&&l| l == majority).count() as f64 / N as f64;
    let dec = Csv::read(&out.join("decoding.csv"));
    assert_eq!(dec.strings("layer"), ["0", "1", "2", "3", "-1"]);
    assert_eq!(
        dec.strings("all_layers"),
        ["false", "false", "false", "false", "true"]
    );
    assert!(dec
        .finite("majority_class")
        .iter()
        .all(|&c| c == majority as f64));
    assert!(dec
        .finite("majority_baseline")
        .iter()
        .all(|&b| b == baseline));
    assert!(dec
        .finite("n_train")
        .iter()
        .chain(&dec.finite("n_test"))
        .all(|&n| n == N as f64));
    for col in [
        "accuracy",
        "balanced_accuracy",
        "shuffled_control",
        "train_accuracy",
    ] {
        in_range(col, &dec.finite(col), 0.0, 1.0);
    }
    // The last layer's codes decode the rule well above the majority baseline (0.72 against 0.28).
    assert!(dec.finite("accuracy")[3] > baseline + 0.2, "{:?}", dec.rows);

    // Confusion counts: per layer, each true label's row adds up to its count in the test set, and
    // the diagonal over N is the accuracy.
    let conf = Csv::read(&out.join("confusion.csv"));
    let mut test_counts: BTreeMap<i64, f64> = BTreeMap::new();
    for &l in &test_y {
        *test_counts.entry(l).or_default() += 1.0;
    }
    let accuracy = dec.finite("accuracy");
    for (k, layer) in layers.iter().enumerate() {
        let mut rows: BTreeMap<i64, f64> = BTreeMap::new();
        let mut diagonal = 0.0;
        for r in conf.rows.iter().filter(|r| r[0] == table(layer)) {
            let (t, p, c): (i64, i64, f64) = (
                r[2].parse().unwrap(),
                r[3].parse().unwrap(),
                r[4].parse().unwrap(),
            );
            *rows.entry(t).or_default() += c;
            if t == p {
                diagonal += c;
            }
        }
        rows.retain(|_, c| *c > 0.0);
        assert_eq!(rows, test_counts, "layer {layer}");
        close(
            &format!("accuracy of layer {layer}"),
            diagonal / N as f64,
            accuracy[k],
            1e-12,
        );
    }

    // PCA on the test codes: the explained variances add up to the codes' total variance, and the
    // projections in pca.npz are the centred codes times the components.
    let codes: ArrayD<f32> = array(&test, "codes");
    let pca = Csv::read(&out.join("pca.csv"));
    for layer in layers {
        let x = layer_matrix(&codes, layer);
        let mean = x.mean_axis(Axis(0)).unwrap();
        let centred = &x - &mean;
        let total: f64 = centred.map(|v| v * v).sum() / (N as f64 - 1.0);
        let mine: Vec<usize> = (0..pca.rows.len())
            .filter(|&i| pca.rows[i][0] == table(layer))
            .collect();
        assert_eq!(
            mine.len(),
            x.ncols(),
            "layer {layer}: one row per dimension"
        );
        let var: Vec<f64> = mine
            .iter()
            .map(|&i| pca.rows[i][4].parse().unwrap())
            .collect();
        let ratio: Vec<f64> = mine
            .iter()
            .map(|&i| pca.rows[i][3].parse().unwrap())
            .collect();
        close(
            &format!("total variance, layer {layer}"),
            var.iter().sum(),
            total,
            1e-5 * total.max(1.0),
        );
        assert!(var.windows(2).all(|w| w[0] >= w[1]), "{var:?}");
        close("ratios add up to 1", ratio.iter().sum(), 1.0, 1e-6);
        let key = if layer == "all" {
            "all".to_string()
        } else {
            format!("layer{layer}")
        };
        let proj: ArrayD<f64> = array(&out.join("pca.npz"), &key);
        let comps: ArrayD<f64> = array(&out.join("pca.npz"), &format!("components_{key}"));
        assert_eq!(proj.shape(), &[N, 2]);
        assert_eq!(comps.shape(), &[2, x.ncols()]);
        let comps = comps.into_dimensionality::<ndarray::Ix2>().unwrap();
        let expected = centred.dot(&comps.t());
        for (a, b) in proj.iter().zip(expected.iter()) {
            close(&format!("projection, layer {layer}"), *a, *b, 1e-5);
        }
    }
    assert_eq!(array::<i64>(&out.join("pca.npz"), "label"), test_y);

    // The printed table is decoding.csv's.
    let acc = dec.finite("accuracy");
    let bal = dec.finite("balanced_accuracy");
    for (k, layer) in layers.iter().enumerate() {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(layer))
            .unwrap_or_else(|| panic!("no row {layer} in {stdout}"));
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[1], format!("{:.3}", acc[k]), "{line}");
        assert_eq!(f[2], format!("{:.3}", bal[k]), "{line}");
        assert_eq!(f[3], format!("{baseline:.3}"), "{line}");
    }
    let summary = json(&out.join("summary.json"));
    assert_eq!(summary["files"].as_array().unwrap().len(), 7);
    assert!(
        stdout.contains(&format!("wrote 7 files to {}", out.display())),
        "{stdout}"
    );
    // The stage seconds: one object per row group (each layer, then all layers), none negative.
    let timings = json(&out.join("timings.json"));
    let rows = timings["layers"].as_array().unwrap();
    assert_eq!(rows.len(), layers.len());
    assert_eq!(rows.last().unwrap()["all_layers"], true);
    for stage in ["pca", "decoding", "clustering", "similarity"] {
        assert!(
            rows.iter().all(|r| r[stage].as_f64().unwrap() >= 0.0),
            "{stage}"
        );
    }
    assert!(timings["elapsed_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn analyze_failures_name_the_file_and_flag() {
    let tmp = tempdir();
    let ckpt = tmp.path().join("tiny");
    sraven_checkpoint(&ckpt, Mixer::Softmax, 4);
    let codes = tmp.path().join("codes.npz");
    hyperlens(&[
        "probe",
        "--checkpoint",
        s(&ckpt),
        "--split",
        "paper-seed0",
        "--n",
        "16",
        "--out",
        s(&codes),
    ])
    .success();
    let c = s(&codes);
    let out = tmp.path().join("out");
    let o = s(&out);
    let missing = tmp.path().join("missing.npz");
    hyperlens(&[
        "analyze",
        "--train",
        s(&missing),
        "--test",
        c,
        "--out",
        o,
        "--quiet",
    ])
    .failure(&["reading --train", s(&missing)]);
    let problems = tmp.path().join("p.npz");
    hyperlens(&["tasks", "sample", "--n", "4", "--out", s(&problems)]).success();
    hyperlens(&[
        "analyze",
        "--train",
        c,
        "--test",
        s(&problems),
        "--out",
        o,
        "--quiet",
    ])
    .failure(&["reading --test", s(&problems), "`codes` is missing"]);
    // The message names the library's parameter, not the flag (--components).
    hyperlens(&[
        "analyze",
        "--train",
        c,
        "--test",
        c,
        "--out",
        o,
        "--quiet",
        "--components",
        "0",
    ])
    .failure(&["n_components must be >= 1"]);
    assert!(!out.exists());
}

#[test]
fn analyze_usage_errors() {
    let base = [
        "analyze", "--train", "a.npz", "--test", "b.npz", "--out", "o",
    ];
    let with = |extra: &[&'static str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        hyperlens(&a)
    };
    with(&["--unsupervised-on", "both"]).usage_error(&[
        "invalid value 'both' for '--unsupervised-on <UNSUPERVISED_ON>'",
        "`train` or `test`",
    ]);
    with(&["--c", "abc"]).usage_error(&["invalid value 'abc' for '--c <C>'"]);
    with(&["--components", "-1"]).usage_error(&["unexpected argument '-1'"]);
    hyperlens(&["analyze", "--train", "a.npz", "--out", "o"]).usage_error(&["--test <TEST>"]);
}
