//! `hyperlens patch heads`: every head ablated in turn; the table has one row per head, its deltas
//! are the ablated metrics minus the model's own (which `eval` measures on the same problems).

use crate::util::{hyperlens, json, s, sraven_checkpoint, tempdir, Csv};
use hyperlens_model::Mixer;

#[test]
fn head_ablation_writes_one_row_per_head() {
    let tmp = tempdir();
    let ck = tmp.path().join("ck");
    sraven_checkpoint(&ck, Mixer::Softmax, 5);
    let out = tmp.path().join("patch");
    let src = [
        "--split",
        "paper-seed0",
        "--set",
        "ood",
        "--n",
        "24",
        "--seed",
        "1",
    ];
    let mut args = vec![
        "patch",
        "heads",
        "--checkpoint",
        s(&ck),
        "--ablation",
        "zero",
    ];
    args.extend(src);
    args.extend(["--batch", "10", "--out", s(&out)]);
    let r = hyperlens(&args);
    assert!(r.success().contains("without ablation"), "{}", r.success());
    let csv = Csv::read(&out.join("head_ablation.csv"));
    let summary = json(&out.join("head_ablation.json"));
    let base = summary["report"]["base"]["accuracy"].as_f64().unwrap();
    let base_loss = summary["report"]["base"]["loss"].as_f64().unwrap();
    let mut eval = vec!["eval", "--checkpoint", s(&ck), "--json"];
    eval.extend(src);
    let e: serde_json::Value = serde_json::from_str(hyperlens(&eval).success().trim()).unwrap();
    assert!(
        (e["loss"].as_f64().unwrap() - base_loss).abs() < 1e-5,
        "{e}"
    );
    let labels = csv.strings("label");
    let (layers, heads) = (crate::util::TINY_LAYERS, crate::util::TINY_HEADS);
    assert_eq!(labels.len(), layers * heads);
    assert_eq!(labels[heads + 1], "L1H1");
    for ((acc, d), loss) in csv
        .column("accuracy")
        .iter()
        .zip(csv.column("delta_accuracy"))
        .zip(csv.column("delta_loss"))
    {
        assert!((acc - base - d).abs() < 2e-6 && loss.is_finite());
    }
    assert!(out.join("head_ablation.png").is_file());
    let svg = std::fs::read_to_string(out.join("head_ablation.svg")).unwrap();
    assert!(svg.contains("data-hl-kind=\"heatmap\"") && svg.contains("accuracy change"));
    let mut bad = vec![
        "patch",
        "heads",
        "--checkpoint",
        s(&ck),
        "--ablation",
        "half",
    ];
    bad.extend(["--out", s(&out)]);
    hyperlens(&bad).usage_error(&["unknown ablation `half`"]);
}

#[test]
fn the_transplant_table_has_seven_kinds_per_layer_and_an_exact_identity() {
    let tmp = tempdir();
    let ck = tmp.path().join("ck");
    sraven_checkpoint(&ck, Mixer::Hyla, 6);
    let out = tmp.path().join("tp");
    let args = [
        "patch",
        "transplant",
        "--checkpoint",
        s(&ck),
        "--split",
        "paper-seed0",
        "--n",
        "48",
        "--batch",
        "16",
        "--out",
        s(&out),
    ];
    let r = hyperlens(&args);
    assert!(
        r.success()
            .contains("identity transplant: largest logit change 0.0e0"),
        "{}",
        r.success()
    );
    let csv = Csv::read(&out.join("transplant.csv"));
    let kinds = csv.strings("kind");
    assert_eq!(kinds.len(), 7 * crate::util::TINY_LAYERS);
    assert_eq!(
        kinds[..7],
        [
            "mean_id",
            "donor_problem",
            "off_row",
            "random",
            "zero_ablation",
            "mean_ablation",
            "identity"
        ]
    );
    for (i, k) in kinds.iter().enumerate() {
        let n = csv.column("n")[i];
        let sum =
            csv.column("to_donor")[i] + csv.column("elsewhere")[i] + csv.column("unchanged")[i];
        assert_eq!(sum, n, "row {i}");
        if *k == "identity" {
            assert_eq!(csv.column("max_logit_change")[i], 0.0);
            assert_eq!(csv.column("unchanged")[i], 48.0);
        }
    }
    assert_eq!(json(&out.join("transplant.json"))["slot"], 3);
    assert!(out.join("transplant.png").is_file());
    let mut bad = args.to_vec();
    bad.extend(["--slot", "4"]);
    hyperlens(&bad).failure(&["--slot 4"]);
}

#[test]
fn activation_patching_and_dla_write_their_tables_and_figures() {
    let tmp = tempdir();
    let ck = tmp.path().join("ck");
    sraven_checkpoint(&ck, Mixer::Softmax, 7);
    let (layers, heads) = (crate::util::TINY_LAYERS, crate::util::TINY_HEADS);
    let out = tmp.path().join("acts");
    let args = [
        "patch",
        "acts",
        "--checkpoint",
        s(&ck),
        "--split",
        "paper-seed0",
        "--n",
        "12",
        "--batch",
        "6",
        "--slot",
        "1",
        "--out",
        s(&out),
    ];
    let r = hyperlens(&args);
    assert!(
        r.success().contains("12 pairs at slot 1"),
        "{}",
        r.success()
    );
    let csv = Csv::read(&out.join("activation_patching.csv"));
    let kinds = csv.strings("activation");
    assert_eq!(kinds.len(), 3 * layers * 36 + layers * heads);
    // Layer 0's stream differs only at the slot's context tokens (4 p + 1 for p < 8).
    for (i, k) in kinds.iter().enumerate() {
        let (l, p) = (csv.column("layer")[i], csv.column("index")[i] as usize);
        if *k == "resid_pre" && l == 0.0 && (p >= 32 || p % 4 != 1) {
            assert_eq!(csv.column("score")[i], 0.0, "position {p}");
        }
    }
    let meta = json(&out.join("activation_patching.json"));
    assert_eq!(meta["n_pairs"], 12);
    let mut z = ndarray_npy::NpzReader::new(
        std::fs::File::open(out.join("activation_patching.npz")).unwrap(),
    )
    .unwrap();
    let heads_arr: ndarray::Array2<f64> = z.by_name("head_out").unwrap();
    assert_eq!(heads_arr.dim(), (layers, heads));
    for f in ["resid_pre", "attn_out", "mlp_out", "heads"] {
        assert!(out.join(format!("patching_{f}.png")).is_file(), "{f}");
    }
    let mut bad = args.to_vec();
    let at = bad.len() - 3;
    bad[at] = "4";
    hyperlens(&bad).failure(&["--slot 4"]);

    let out = tmp.path().join("dla");
    let r = hyperlens(&[
        "patch",
        "dla",
        "--checkpoint",
        s(&ck),
        "--split",
        "paper-seed0",
        "--n",
        "20",
        "--batch",
        "8",
        "--out",
        s(&out),
    ]);
    assert!(
        r.success().contains("80 (problem, slot) pairs"),
        "{}",
        r.success()
    );
    let d = json(&out.join("dla.json"));
    assert!(d["max_error"].as_f64().unwrap() < 1e-4, "{d}");
    let dla = Csv::read(&out.join("dla.csv"));
    let total: f64 = dla.column("logit_attr").iter().sum();
    // The table's rows add up to the mean answer logit (printed to 6 decimals per row).
    assert!(
        (total - d["logit"].as_f64().unwrap()).abs() < 1e-4,
        "{total} {d}"
    );
    assert!(out.join("dla.png").is_file());
    hyperlens(&[
        "patch",
        "dla",
        "--checkpoint",
        s(&ck),
        "--split",
        "paper-seed0",
        "--slot",
        "9",
        "--out",
        s(&out),
    ])
    .failure(&["--slot 9"]);
}
