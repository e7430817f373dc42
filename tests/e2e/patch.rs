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
fn the_transplant_table_has_four_kinds_per_layer_and_an_exact_identity() {
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
    assert_eq!(kinds.len(), 4 * crate::util::TINY_LAYERS);
    assert_eq!(kinds[..4], ["mean_id", "off_row", "random", "identity"]);
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
