//! `hyperlens report` on two tiny SRAVEN checkpoints (one with a training log, one without) into a
//! temporary directory: every output exists, parses (JSON, CSV, npz, PNG, SVG, HTML) and holds
//! values in range; the attention sample agrees with the probe codes of the same problem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hyperlens_model::Mixer;
use hyperlens_train::metrics::{MetricsRow, METRICS_FILE, METRICS_HEADER};
use ndarray::{Array1, Array4, Array5, ArrayD};

use crate::util::{
    entries, files_under, hyperlens_in, in_range, json, npz, s, sraven_checkpoint, tempdir, Csv,
    Run, TINY_HEADS as HEADS, TINY_LAYERS as LAYERS,
};

const N: usize = 48;

/// Writes a seeded tiny checkpoint with a `train.json` naming its split; with `log`, a `metrics.csv`
/// of four rows written with the train crate's row format.
fn make_checkpoint(dir: &Path, mixer: Mixer, split: &str, seed: u64, log: bool) {
    sraven_checkpoint(dir, mixer, seed);
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
            extra: Default::default(),
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

/// Column `name` of a CSV file, every value finite.
fn column(path: &Path, name: &str) -> Vec<f64> {
    Csv::read(path).finite(name)
}

/// Column `name` of a CSV file, NaN allowed.
fn column_nan(path: &Path, name: &str) -> Vec<f64> {
    Csv::read(path).column(name)
}

fn in_unit(what: &str, values: &[f64]) {
    in_range(what, values, 0.0, 1.0);
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

fn run_report(cwd: &Path, args: &[&str]) -> Run {
    let mut all = vec!["report"];
    all.extend_from_slice(args);
    hyperlens_in(cwd, &all)
}

#[test]
fn report_on_tiny_checkpoints_writes_every_file_with_values_in_range() {
    let tmp = tempdir();
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
    output.success();
    let names = ["tiny-softmax", "tiny-hyla"];

    // Every expected file, and nothing left half-written.
    let mut expected: Vec<PathBuf> = [
        "index.md",
        "index.html",
        "summary.json",
        "figures/accuracy.png",
        "figures/accuracy.svg",
        "figures/decoding_comparison.png",
        "figures/causal_transplant.png",
        "figures/causal_controls.png",
        "tables/accuracy.csv",
        "tables/causal.csv",
    ]
    .iter()
    .map(|p| out.join(p))
    .collect();
    for name in names {
        for f in [
            "pca_rule.png",
            "explorer.svg",
            "attention.svg",
            "pca_target.png",
            "decoding.png",
            "confusion.png",
            "confusion.svg",
            "similarity.png",
            "similarity.svg",
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
    // The transplant test: seven kinds per layer and checkpoint, rows that add up, and an identity
    // transplant that changes no logit.
    let causal = Csv::read(&out.join("tables/causal.csv"));
    let kinds = causal.strings("kind");
    assert_eq!(kinds.len(), 2 * 7 * crate::util::TINY_LAYERS);
    for (i, k) in kinds.iter().enumerate() {
        let col = |c: &str| causal.column(c)[i];
        assert_eq!(
            col("to_donor") + col("elsewhere") + col("unchanged"),
            col("n"),
            "row {i}"
        );
        if *k == "identity" {
            assert_eq!(col("max_logit_change"), 0.0);
        }
    }
    let md = std::fs::read_to_string(out.join("index.md")).unwrap();
    assert!(md.contains("## Is the latent code causal?"), "{md}");
    assert!(md.contains("The identity transplant (each problem's own code) leaves every logit as it was: the largest change is 0.0e0."), "{md}");
    assert!(
        !out.join("figures/tiny-hyla_training.png").exists(),
        "a training figure for a checkpoint without metrics.csv"
    );
    for dir in ["", "figures", "codes", "tables"] {
        for name in entries(&out.join(dir)) {
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
    let rows = Csv::read(&acc_csv).rows;
    let listed: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(listed, names);
    let id_acc = column(&acc_csv, "id_accuracy");
    let ood_acc = column(&acc_csv, "ood_accuracy");
    // Every checkpoint here records 300 updates in its train.json, none of a longer schedule.
    assert!(column(&acc_csv, "steps").iter().all(|&s| s == 300.0));
    let md_text = std::fs::read_to_string(out.join("index.md")).unwrap();
    assert!(md_text.contains("| updates trained |"), "{md_text}");
    assert!(
        md_text.contains("trained for fewer updates than the paper's 156,250"),
        "{md_text}"
    );
    in_unit("id_accuracy", &id_acc);
    in_unit("ood_accuracy", &ood_acc);
    for l in column(&acc_csv, "id_loss")
        .into_iter()
        .chain(column(&acc_csv, "ood_loss"))
    {
        // Cross-entropy over 8 classes of a random model: positive, near ln 8 = 2.08.
        assert!(l > 0.5 && l < 10.0, "loss {l}");
    }
    assert_eq!(column(&acc_csv, "n"), vec![N as f64; 2]);

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
        let rows = Csv::read(&dec).rows;
        let layers: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
        assert_eq!(layers, ["0", "1", "-1"]);
        let all: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
        assert_eq!(all, ["false", "false", "true"]);
        for col in [
            "accuracy",
            "balanced_accuracy",
            "majority_baseline",
            "shuffled_control",
            "train_accuracy",
        ] {
            in_unit(col, &column(&dec, col));
        }
        assert_eq!(column(&dec, "n_test"), vec![N as f64; 3]);
        let pca = t.join("pca.csv");
        let ratios = column(&pca, "explained_variance_ratio");
        in_unit("explained_variance_ratio", &ratios);
        assert!(column(&pca, "explained_variance").iter().all(|v| *v >= 0.0));
        let clusters = t.join("clusters.csv");
        for v in column_nan(&clusters, "ari") {
            assert!(v.is_nan() || (-1.0..=1.0).contains(&v), "ari {v}");
        }
        for v in column_nan(&clusters, "nmi") {
            assert!(v.is_nan() || (0.0..=1.0 + 1e-9).contains(&v), "nmi {v}");
        }
        for v in column_nan(&clusters, "silhouette") {
            assert!(v.is_nan() || (-1.0..=1.0).contains(&v), "silhouette {v}");
        }
        for v in column_nan(&t.join("similarity.csv"), "cosine") {
            assert!(
                v.is_nan() || (-1.0 - 1e-9..=1.0 + 1e-9).contains(&v),
                "cosine {v}"
            );
        }
        // Confusion counts of each layer add up to the test set.
        let conf = t.join("confusion.csv");
        let rows = Csv::read(&conf).rows;
        let mut per_layer: BTreeMap<String, f64> = BTreeMap::new();
        for r in &rows {
            let c: f64 = r[4].parse().unwrap();
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
    // The interactive figures (issue 36): each shown once in the HTML page, in place of its PNG,
    // which stays the fallback; index.md keeps the PNGs only. Each explorer holds both sets.
    for name in names {
        for (svg, png) in [
            ("explorer", "pca_rule"),
            ("attention", "attention"),
            ("confusion", "confusion"),
            ("similarity", "similarity"),
        ] {
            let obj = format!("data=\"figures/{name}_{svg}.svg\" type=\"image/svg+xml\"");
            assert_eq!(html.matches(&obj).count(), 1, "index.html lacks {obj}");
            assert!(html.contains(&format!("<img src=\"figures/{name}_{png}.png\"")));
            assert!(!md.contains(&format!("{name}_{svg}.svg")));
        }
        let svg =
            std::fs::read_to_string(out.join(format!("figures/{name}_explorer.svg"))).unwrap();
        assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("\"name\":\"ID\"") && svg.contains("\"name\":\"OOD\""));
        assert!(
            svg.contains(&format!("--n {N} --seed 3 --unpermuted")),
            "the command"
        );
    }
}

#[test]
fn report_errors_name_the_bad_checkpoint() {
    let tmp = tempdir();
    let bad = tmp.path().join("not-a-checkpoint");
    std::fs::create_dir(&bad).unwrap();
    let out = tmp.path().join("out");
    let (b, o) = (s(&bad), s(&out));
    // The report notes each checkpoint on stderr as it starts it.
    run_report(tmp.path(), &["--checkpoint", b, "--out", o, "--n", "16"])
        .failure_after_notes("report: ", &["not-a-checkpoint", "config.json"]);
    // A checkpoint of another task is refused by name.
    let other = tmp.path().join("induction-run");
    make_checkpoint(&other, Mixer::Softmax, "seed0", 0, false);
    std::fs::write(
        other.join("train.json"),
        serde_json::json!({"task": "induction"}).to_string(),
    )
    .unwrap();
    run_report(tmp.path(), &["--checkpoint", s(&other), "--out", o])
        .failure_after_notes("report: ", &["induction-run", "induction checkpoint"]);
    // A logic checkpoint whose run files lack the settings: the task's terms are unknown.
    let logic = tmp.path().join("logic-run");
    make_checkpoint(&logic, Mixer::Softmax, "seed0", 0, false);
    std::fs::write(
        logic.join("train.json"),
        serde_json::json!({"task": "logic", "split": "seed0"}).to_string(),
    )
    .unwrap();
    run_report(tmp.path(), &["--checkpoint", s(&logic), "--out", o])
        .failure_after_notes("report: ", &["logic-run", "train.json", "settings"]);
    // A bad --n is refused before any work.
    run_report(tmp.path(), &["--checkpoint", b, "--out", o, "--n", "3"]).failure(&["--n"]);
    // No file was written (the report creates its empty folders before it checks the checkpoints).
    assert_eq!(files_under(&out), Vec::<PathBuf>::new());
}

#[test]
fn report_usage_errors() {
    let tmp = tempdir();
    run_report(tmp.path(), &["--checkpoint", "x", "--n", "abc"])
        .usage_error(&["invalid value 'abc' for '--n <N>'"]);
    run_report(tmp.path(), &["--checkpoint", "x", "--device", "foo"])
        .usage_error(&["invalid value 'foo' for '--device <DEVICE>'"]);
    run_report(tmp.path(), &["--checkpoint", "x", "--bogus"])
        .usage_error(&["unexpected argument '--bogus'"]);
}

#[test]
fn report_sets_a_logic_checkpoint_beside_table_a1_in_a_section_of_its_own() {
    let tmp = tempdir();
    let root = tmp.path();
    let logic = root.join("logic-run");
    crate::util::hyperlens(&[
        "train",
        "--task",
        "logic",
        "--layers",
        "2",
        "--steps",
        "4",
        "--batch",
        "8",
        "--warmup",
        "2",
        "--eval-every",
        "2",
        "--eval-n",
        "16",
        "--out",
        s(&logic),
    ])
    .success();
    let sraven = root.join("tiny-softmax");
    make_checkpoint(&sraven, Mixer::Softmax, "paper-seed1", 1, false);
    let out = root.join("out");
    let n = N.to_string();
    let args = [
        "--checkpoint",
        s(&sraven),
        "--checkpoint",
        s(&logic),
        "--out",
        s(&out),
        "--n",
        &n,
        "--batch",
        "20",
        "--seed",
        "3",
    ];
    assert!(run_report(root, &args).success().contains("2 checkpoints"));

    // R² per set: in range, and the same sequences as `eval` draws with the same seed.
    let csv = out.join("tables/logic.csv");
    assert_eq!(
        Csv::read(&csv).header.join(","),
        "checkpoint,mixer,split,id_r2,ood_r2,unknown_r2,id_mse,ood_mse,unknown_mse,n,steps,\
         planned_steps"
    );
    let eval_run = crate::util::hyperlens(&[
        "eval",
        "--checkpoint",
        s(&logic),
        "--json",
        "--n",
        &n,
        "--seed",
        "3",
        "--batch",
        "7",
    ]);
    let evals: Vec<serde_json::Value> = eval_run
        .success()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(evals.len(), 3);
    for e in &evals {
        let set = e["set"].as_str().unwrap();
        let r2 = column(&csv, &format!("{set}_r2"))[0];
        let mse = column(&csv, &format!("{set}_mse"))[0];
        assert!(r2 <= 1.0 && mse >= 0.0, "{set}: R² {r2}, MSE {mse}");
        assert!(
            (r2 - e["r2"].as_f64().unwrap()).abs() < 1e-5,
            "{set}: {r2} vs {e}"
        );
        assert!(
            (mse - e["mse"].as_f64().unwrap()).abs() < 1e-5,
            "{set}: {mse} vs {e}"
        );
    }
    assert_eq!(column(&csv, "n"), [N as f64]);
    assert_eq!(column(&csv, "steps"), [4.0]);

    // Term decoding: one row per layer and `all`, F1 and its controls in [0, 1].
    let td = out.join("tables/logic-run/term_decoding.csv");
    assert_eq!(Csv::read(&td).strings("layer"), ["0", "1", "all"]);
    for c in ["f1_mean", "f1_base_rate", "f1_shuffled"] {
        in_unit(c, &column(&td, c));
    }
    assert!(column(&td, "ridge_r2").iter().all(|&v| v <= 1.0));
    // The codes of the paper's site, [N, L, H, 1, 1], with the task's terms [N, K, L].
    for set in ["id", "ood"] {
        let path = out.join(format!("codes/logic-run_{set}.npz"));
        let codes: ArrayD<f32> = crate::util::array(&path, "codes");
        assert_eq!(codes.shape(), [N, 2, 8, 1, 1], "{set}");
        let terms: ArrayD<i64> = crate::util::array(&path, "terms");
        assert_eq!(terms.shape(), [N, 2, 4], "{set}");
    }
    let tsne: ArrayD<f64> =
        crate::util::array(&out.join("tables/logic-run/projections.npz"), "tsne_all");
    assert_eq!(tsne.shape(), [N, 2]);
    for f in [
        "term_decoding",
        "projections_term",
        "projections_target",
        "training",
    ] {
        check_png(&out.join(format!("figures/logic-run_{f}.png")));
    }
    // The latent-space explorer of the logic codes (issue 36), in the HTML page only: the OOD codes
    // the t-SNE embeds, on the PCA and the t-SNE of projections.npz.
    let svg = std::fs::read_to_string(out.join("figures/logic-run_explorer.svg")).unwrap();
    assert!(svg.contains(&format!("\"n\":{N},")) && svg.contains("\"name\":\"t-SNE\""));
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert_eq!(
        html.matches("data=\"figures/logic-run_explorer.svg\"")
            .count(),
        1
    );
    let summary = json(&out.join("summary.json"));
    let entry = &summary["logic_checkpoints"][0];
    assert_eq!(entry["sets"].as_array().unwrap().len(), 3);
    assert_eq!(entry["tsne_perplexity"].as_f64(), Some(15.0));

    // One page, a section per task; the logic table quotes Table A1.
    let md = std::fs::read_to_string(out.join("index.md")).unwrap();
    let (sraven_part, logic_part) = md
        .split_once("## Fuzzy-logic task")
        .expect("a logic section");
    assert!(sraven_part.contains("## tiny-softmax"), "{md}");
    assert!(
        logic_part.contains("### logic-run") && logic_part.contains("81.1 ± 7.8 %"),
        "{md}"
    );
    assert!(logic_part.contains("The log covers 4 steps"), "{md}");
}
