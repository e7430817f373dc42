//! `hyperlens report` on two tiny SRAVEN checkpoints (one with a training log, one without) into a
//! temporary directory: every output exists, parses (JSON, CSV, npz, PNG, SVG, HTML) and holds
//! values in range; the attention sample agrees with the probe codes of the same problem.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use hyperlens_model::candle_core::Device;
use hyperlens_model::{Config, Mixer, Transformer};
use hyperlens_train::metrics::{MetricsRow, METRICS_FILE, METRICS_HEADER};
use ndarray::{Array1, Array4, Array5, ArrayD};
use ndarray_npy::NpzReader;
use serde_json::Value;

const N: usize = 48;
const LAYERS: usize = 2;
const HEADS: usize = 3;

/// A tiny SRAVEN model: 36 tokens of 8 values, 4 outputs, D 12, 3 heads of width 4, 2 layers.
fn tiny_config(mixer: Mixer) -> Config {
    Config {
        d_in: 8,
        n_tokens: 36,
        n_outputs: 4,
        d_model: 12,
        n_heads: HEADS,
        d_head: 4,
        n_layers: LAYERS,
        d_mlp: 16,
        d_out: 8,
        n_buckets: 36,
        causal: false,
        mixer,
    }
}

/// Writes a seeded checkpoint with a `train.json` naming its split; with `log`, a `metrics.csv` of
/// four rows written with the train crate's row format.
fn make_checkpoint(dir: &Path, mixer: Mixer, split: &str, seed: u64, log: bool) {
    let (model, _vars) = Transformer::init(&tiny_config(mixer), seed, &Device::Cpu).unwrap();
    model.save(dir).unwrap();
    let train = serde_json::json!({
        "trained_by": "the e2e test (random initialisation, never trained)",
        "split": split,
        "steps": 300,
    });
    std::fs::write(dir.join("train.json"), train.to_string()).unwrap();
    if log {
        let row = |step: u64, tl: Option<f64>, id: Option<f64>, ood: Option<f64>| MetricsRow {
            step,
            lr: 1e-3,
            train_loss: tl,
            train_acc: tl.map(|_| 0.05),
            id_loss: id.map(|a| 2.5 - a),
            id_acc: id,
            ood_loss: ood.map(|a| 2.6 - a),
            ood_acc: ood,
            wall_time_s: step as f64 * 0.1,
            steps_per_s: tl.map(|_| 10.0),
        };
        let rows = [
            row(0, None, Some(0.0), Some(0.0)),
            row(100, Some(2.1), None, None),
            row(200, Some(1.4), Some(0.30), Some(0.25)),
            row(300, Some(0.9), Some(0.55), Some(0.20)),
        ];
        let mut text = format!("{METRICS_HEADER}\n");
        for r in &rows {
            text.push_str(&r.to_csv());
            text.push('\n');
        }
        std::fs::write(dir.join(METRICS_FILE), text).unwrap();
    }
}

/// Header and rows of a CSV file; every row has as many fields as the header.
fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines().filter(|l| !l.is_empty());
    let header: Vec<String> = lines
        .next()
        .unwrap_or_else(|| panic!("{}: empty", path.display()))
        .split(',')
        .map(str::to_string)
        .collect();
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_string).collect::<Vec<_>>())
        .collect();
    for r in &rows {
        assert_eq!(r.len(), header.len(), "{}: row {r:?}", path.display());
    }
    assert!(!rows.is_empty(), "{}: no rows", path.display());
    (header, rows)
}

/// The values of column `name` parsed as numbers ("NaN" allowed only if `nan_ok`).
fn column(path: &Path, name: &str, nan_ok: bool) -> Vec<f64> {
    let (header, rows) = read_csv(path);
    let i = header
        .iter()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("{}: no column {name} in {header:?}", path.display()));
    rows.iter()
        .map(|r| {
            let v: f64 = r[i]
                .parse()
                .unwrap_or_else(|_| panic!("{}: {name} = {:?}", path.display(), r[i]));
            assert!(nan_ok || v.is_finite(), "{}: {name} = {v}", path.display());
            v
        })
        .collect()
}

fn in_unit(what: &str, values: &[f64]) {
    for v in values {
        assert!((0.0..=1.0).contains(v), "{what}: {v} not in [0, 1]");
    }
}

fn json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn npz(path: &Path) -> NpzReader<File> {
    NpzReader::new(File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Checks the PNG signature and header, decodes it, and checks that it is not blank: returns
/// (width, height).
fn check_png(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    assert_eq!(&bytes[12..16], b"IHDR", "{}", path.display());
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert!(
        (300..=4000).contains(&w) && (200..=4000).contains(&h),
        "{}: {w} x {h}",
        path.display()
    );
    let img = image::load_from_memory(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_rgb8();
    assert_eq!(img.dimensions(), (w, h));
    let inked = img.pixels().filter(|p| p.0 != [255, 255, 255]).count();
    let frac = inked as f64 / (w as f64 * h as f64);
    assert!(
        (0.01..0.95).contains(&frac),
        "{}: {:.1} % of the pixels are not white",
        path.display(),
        100.0 * frac
    );
    (w, h)
}

fn run_report(cwd: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hyperlens"))
        .current_dir(cwd)
        .env("CANDLE_NUM_THREADS", "1")
        .arg("report")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn report_on_tiny_checkpoints_writes_every_file_with_values_in_range() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let logged = root.join("tiny-softmax");
    let unlogged = root.join("tiny-hyla");
    make_checkpoint(&logged, Mixer::Softmax, "paper-seed1", 1, true);
    make_checkpoint(&unlogged, Mixer::Hyla, "paper-seed0", 2, false);
    let out = root.join("out");
    let n = N.to_string();
    let output = run_report(
        root,
        &[
            "--checkpoint",
            logged.to_str().unwrap(),
            "--checkpoint",
            unlogged.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--n",
            &n,
            "--batch",
            "20",
            "--seed",
            "3",
        ],
    );
    assert!(
        output.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let names = ["tiny-softmax", "tiny-hyla"];

    // Every expected file, and nothing left half-written.
    let mut expected: Vec<PathBuf> = [
        "index.md",
        "index.html",
        "summary.json",
        "figures/accuracy.png",
        "figures/accuracy.svg",
        "figures/decoding_comparison.png",
        "tables/accuracy.csv",
    ]
    .iter()
    .map(|p| out.join(p))
    .collect();
    for name in names {
        for f in [
            "pca_rule.png",
            "pca_rule.svg",
            "pca_target.png",
            "decoding.png",
            "confusion.png",
            "similarity.png",
            "attention.png",
        ] {
            expected.push(out.join(format!("figures/{name}_{f}")));
        }
        for f in ["id.npz", "id.json", "ood.npz", "ood.json", "attention.npz"] {
            expected.push(out.join(format!("codes/{name}_{f}")));
        }
        for f in [
            "decoding.csv",
            "pca.csv",
            "clusters.csv",
            "similarity.csv",
            "confusion.csv",
            "pca.npz",
            "summary.json",
        ] {
            expected.push(out.join(format!("tables/{name}/{f}")));
        }
    }
    expected.push(out.join("figures/tiny-softmax_training.png"));
    for p in &expected {
        assert!(p.is_file(), "missing {}", p.display());
    }
    assert!(
        !out.join("figures/tiny-hyla_training.png").exists(),
        "a training figure for a checkpoint without metrics.csv"
    );
    for dir in ["", "figures", "codes", "tables"] {
        for e in std::fs::read_dir(out.join(dir)).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                !name.ends_with(".tmp") && !name.starts_with(".hyperlens-npz-"),
                "leftover temporary file {dir}/{name}"
            );
        }
    }

    // PNGs decode and are not blank; SVGs are SVG.
    for p in expected
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
    {
        check_png(p);
    }
    for p in expected
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "svg"))
    {
        let s = std::fs::read_to_string(p).unwrap();
        assert!(
            s.contains("<svg") && s.trim_end().ends_with("</svg>"),
            "{}",
            p.display()
        );
    }

    // Accuracy table: one row per checkpoint, accuracies in [0, 1], n = N.
    let acc_csv = out.join("tables/accuracy.csv");
    let (_, rows) = read_csv(&acc_csv);
    let listed: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(listed, names);
    let id_acc = column(&acc_csv, "id_accuracy", false);
    let ood_acc = column(&acc_csv, "ood_accuracy", false);
    // Every checkpoint here records 300 updates in its train.json, none of a longer schedule.
    assert!(column(&acc_csv, "steps", false).iter().all(|&s| s == 300.0));
    let md_text = std::fs::read_to_string(out.join("index.md")).unwrap();
    assert!(md_text.contains("| updates trained |"), "{md_text}");
    assert!(
        md_text.contains("trained for fewer updates than the paper's 156,250"),
        "{md_text}"
    );
    in_unit("id_accuracy", &id_acc);
    in_unit("ood_accuracy", &ood_acc);
    for l in column(&acc_csv, "id_loss", false)
        .into_iter()
        .chain(column(&acc_csv, "ood_loss", false))
    {
        // Cross-entropy over 8 classes of a random model: positive, near ln 8 = 2.08.
        assert!(l > 0.5 && l < 10.0, "loss {l}");
    }
    assert_eq!(column(&acc_csv, "n", false), vec![N as f64; 2]);

    // summary.json agrees with the table and describes every checkpoint.
    let summary = json(&out.join("summary.json"));
    assert_eq!(summary["n"], N);
    assert_eq!(summary["seed"], 3);
    assert_eq!(summary["comparison_figures"].as_array().unwrap().len(), 1);
    let cps = summary["checkpoints"].as_array().unwrap();
    assert_eq!(cps.len(), 2);
    for (k, cp) in cps.iter().enumerate() {
        assert_eq!(cp["name"], names[k]);
        let a = cp["ood"]["accuracy"].as_f64().unwrap();
        assert!((a - ood_acc[k]).abs() < 1e-5, "{a} vs {}", ood_acc[k]);
        let pf = cp["ood"]["per_feature_accuracy"].as_array().unwrap();
        assert_eq!(pf.len(), 4);
        for v in pf {
            in_unit("per-feature accuracy", &[v.as_f64().unwrap()]);
        }
        assert_eq!(cp["training_log"], k == 0);
        assert_eq!(
            cp["attention"]["shape"],
            serde_json::json!([LAYERS, HEADS, 36, 36])
        );
        let figs = cp["figures"].as_array().unwrap();
        assert_eq!(figs.len(), if k == 0 { 7 } else { 6 });
        for f in figs {
            assert!(out.join(f["file"].as_str().unwrap()).is_file());
            let text = f["text"].as_str().unwrap();
            assert!(
                text.len() > 40 && text.chars().any(|c| c.is_ascii_digit()),
                "figure text without numbers: {text:?}"
            );
        }
    }
    assert_eq!(cps[0]["mixer"], "softmax");
    assert_eq!(cps[0]["split"], "paper-seed1");
    assert_eq!(cps[1]["mixer"], "hyla");
    assert_eq!(cps[1]["split"], "paper-seed0");

    for (k, name) in names.iter().enumerate() {
        // Codes: [N, L, H, 1, 2] of the paper site; labels are rules, inputs are values or -1.
        let mut ood_codes = None;
        for set in ["id", "ood"] {
            let path = out.join(format!("codes/{name}_{set}.npz"));
            let mut r = npz(&path);
            let codes: Array5<f32> = r.by_name("codes.npy").unwrap();
            assert_eq!(
                codes.shape(),
                &[N, LAYERS, HEADS, 1, 2],
                "{}",
                path.display()
            );
            assert!(codes.iter().all(|v| v.is_finite()));
            let label: Array1<i64> = r.by_name("label.npy").unwrap();
            assert_eq!(label.len(), N);
            assert!(label.iter().all(|l| (0..8).contains(l)));
            let inputs: ArrayD<i64> = r.by_name("inputs.npy").unwrap();
            assert_eq!(inputs.shape(), &[N, 2]);
            assert!(
                inputs.iter().all(|v| (0..8).contains(v)),
                "keys 27, 31 are context tokens"
            );
            let target: Array1<i64> = r.by_name("target.npy").unwrap();
            let pred: Array1<i64> = r.by_name("prediction.npy").unwrap();
            let correct: Array1<bool> = r.by_name("correct.npy").unwrap();
            for i in 0..N {
                assert!((0..8).contains(&target[i]) && (0..8).contains(&pred[i]));
                assert_eq!(correct[i], target[i] == pred[i]);
            }
            let side = json(&path.with_extension("json"));
            assert_eq!(side["n_problems"], N);
            assert_eq!(side["set"], set);
            assert_eq!(side["site"], "paper");
            if set == "ood" {
                ood_codes = Some(codes);
            }
        }
        let ood_codes = ood_codes.unwrap();

        // Attention of the first OOD problem: its paper-site entries are row 0 of the OOD codes.
        let mut r = npz(&out.join(format!("codes/{name}_attention.npz")));
        let pattern: Array4<f32> = r.by_name("pattern.npy").unwrap();
        assert_eq!(pattern.shape(), &[LAYERS, HEADS, 36, 36]);
        for l in 0..LAYERS {
            for h in 0..HEADS {
                for (j, key) in [27, 31].into_iter().enumerate() {
                    let a = pattern[[l, h, 35, key]];
                    let c = ood_codes[[0, l, h, 0, j]];
                    assert!(
                        (a - c).abs() < 1e-5,
                        "{name} L{l}H{h} key {key}: {a} vs {c}"
                    );
                }
            }
        }
        if k == 0 {
            // Softmax attention: every row is a distribution over the keys.
            for row in pattern.lanes(ndarray::Axis(3)) {
                assert!(row.iter().all(|&v| v >= 0.0));
                assert!((row.sum() - 1.0).abs() < 1e-4, "row sum {}", row.sum());
            }
        }
        let tokens: Array1<i64> = r.by_name("tokens.npy").unwrap();
        assert_eq!(tokens.len(), 36);
        assert!(tokens.iter().take(32).all(|v| (0..8).contains(v)));
        assert!(tokens.iter().skip(32).all(|&v| v == -1));
        for a in ["target.npy", "prediction.npy", "rules.npy"] {
            let v: Array1<i64> = r.by_name(a).unwrap();
            assert_eq!(v.len(), 4, "{a}");
            assert!(v.iter().all(|x| (0..8).contains(x)), "{a}: {v}");
        }

        // Analysis tables.
        let t = out.join(format!("tables/{name}"));
        let dec = t.join("decoding.csv");
        let (_, rows) = read_csv(&dec);
        let layers: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
        assert_eq!(layers, ["0", "1", "all"]);
        for col in [
            "accuracy",
            "balanced_accuracy",
            "majority_baseline",
            "shuffled_control",
            "train_accuracy",
        ] {
            in_unit(col, &column(&dec, col, false));
        }
        assert_eq!(column(&dec, "n_test", false), vec![N as f64; 3]);
        let pca = t.join("pca.csv");
        let ratios = column(&pca, "explained_variance_ratio", false);
        in_unit("explained_variance_ratio", &ratios);
        assert!(column(&pca, "explained_variance", false)
            .iter()
            .all(|v| *v >= 0.0));
        let clusters = t.join("clusters.csv");
        for v in column(&clusters, "ari", true) {
            assert!(v.is_nan() || (-1.0..=1.0).contains(&v), "ari {v}");
        }
        for v in column(&clusters, "nmi", true) {
            assert!(v.is_nan() || (0.0..=1.0 + 1e-9).contains(&v), "nmi {v}");
        }
        for v in column(&clusters, "silhouette", true) {
            assert!(v.is_nan() || (-1.0..=1.0).contains(&v), "silhouette {v}");
        }
        for v in column(&t.join("similarity.csv"), "cosine", true) {
            assert!(
                v.is_nan() || (-1.0 - 1e-9..=1.0 + 1e-9).contains(&v),
                "cosine {v}"
            );
        }
        // Confusion counts of each layer add up to the test set.
        let conf = t.join("confusion.csv");
        let (_, rows) = read_csv(&conf);
        let mut per_layer: BTreeMap<String, f64> = BTreeMap::new();
        for r in &rows {
            let c: f64 = r[3].parse().unwrap();
            assert!(c >= 0.0);
            *per_layer.entry(r[0].clone()).or_default() += c;
        }
        assert_eq!(per_layer.len(), 3);
        assert!(per_layer.values().all(|&s| s == N as f64), "{per_layer:?}");
        let mut pr = npz(&t.join("pca.npz"));
        let names_in = pr.names().unwrap();
        assert!(!names_in.is_empty());
        let summary = json(&t.join("summary.json"));
        assert!(summary.is_object());
    }

    // The pages: every figure is referenced and exists; the no-log checkpoint says so in a sentence.
    let md = std::fs::read_to_string(out.join("index.md")).unwrap();
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    for p in expected
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
    {
        let rel = p.strip_prefix(&out).unwrap().to_str().unwrap();
        assert!(md.contains(&format!("]({rel})")), "index.md lacks {rel}");
        assert!(
            html.contains(&format!("src=\"{rel}\"")),
            "index.html lacks {rel}"
        );
    }
    assert_eq!(md.matches("No training curves").count(), 1, "{md}");
    assert!(md.contains("The log covers 300 steps"), "{md}");
    assert!(html.contains("<table>") && html.contains("<h2 id=\"tiny-hyla\">"));
}

#[test]
fn report_errors_name_the_bad_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("not-a-checkpoint");
    std::fs::create_dir(&bad).unwrap();
    let out = tmp.path().join("out");
    let output = run_report(
        tmp.path(),
        &[
            "--checkpoint",
            bad.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--n",
            "16",
        ],
    );
    assert!(!output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("not-a-checkpoint"), "{err}");
    // A checkpoint of another task is refused by name.
    let logic = tmp.path().join("logic-run");
    make_checkpoint(&logic, Mixer::Softmax, "seed0", 0, false);
    std::fs::write(
        logic.join("train.json"),
        serde_json::json!({"task": "logic", "split": "seed0"}).to_string(),
    )
    .unwrap();
    let output = run_report(
        tmp.path(),
        &[
            "--checkpoint",
            logic.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(!output.status.success());
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.contains("logic-run") && err.contains("logic checkpoint"),
        "{err}"
    );
    // A bad --n is refused before any work.
    let output = run_report(
        tmp.path(),
        &["--checkpoint", bad.to_str().unwrap(), "--n", "3"],
    );
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--n"));
}
