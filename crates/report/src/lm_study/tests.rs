//! The study's verdict logic on hand-made decodings (values that would be wrong if the thresholds
//! were applied otherwise), and the whole study on SmolLM2-135M when `HYPERLENS_SMOLLM2_GGUF`
//! points at its GGUF file (skipped otherwise).

use std::ops::ControlFlow;

use hyperlens_analysis::lm::{
    LmAnalysis, LmAnalysisParams, LmBehaviour, LmDecoding, LmDecodingRow, ProbeScore,
};

use hyperlens_probe::lm_transplant::{LmTransplant, LmTransplantKind, LmTransplantRow};

use super::files::TransplantResult;
use super::measure::{IclResult, IclSplit};
use super::verdict::*;
use super::*;

fn score(accuracy: f64, half_width: f64) -> ProbeScore {
    ProbeScore {
        accuracy,
        ci_low: accuracy - half_width,
        ci_high: accuracy + half_width,
        train_accuracy: 1.0,
        n_features: 9,
        converged: true,
    }
}

/// A decoding row: codes at `acc` ± 0.05, shuffled labels and weights at `control`.
fn row(layer: Option<usize>, acc: f64, control: f64) -> LmDecodingRow {
    LmDecodingRow {
        layer,
        codes: score(acc, 0.05),
        shuffled_labels: score(control, 0.05),
        shuffled_weights: Some(score(control, 0.05)),
        resid: Some(score(0.5, 0.05)),
    }
}

/// An analysis of 3 layers with the codes' accuracies `accs` (then `all`), chance 0.2 and the
/// distance baseline at `distance`.
fn analysis(accs: [f64; 4], control: f64, distance: f64) -> LmAnalysis {
    let rows = accs
        .iter()
        .enumerate()
        .map(|(i, &a)| row((i < 3).then_some(i), a, control))
        .collect();
    LmAnalysis {
        params: LmAnalysisParams::new("codes.npz"),
        factor: "operation".into(),
        form: "pattern".into(),
        model: "m".into(),
        layers: vec![0, 1, 2],
        n_prompts: 100,
        behaviour: LmBehaviour {
            factors: vec!["operation".into()],
            combinations: Vec::new(),
            min_accuracy: None,
            has_correct: false,
            n_dropped_combinations: 0,
            n_dropped_prompts: 0,
            note: String::new(),
            kept: vec![true; 100],
        },
        decoding: LmDecoding {
            factor: "operation".into(),
            values: vec!["a".into(), "b".into()],
            n_train: 50,
            n_test: 50,
            n_unlabelled: 0,
            n_unseen_test: 0,
            unseen_classes: Vec::new(),
            majority_class: "a".into(),
            chance: 0.2,
            chance_max: 0.2,
            distance: score(distance, 0.05),
            rows,
            n_bootstrap: 100,
            ci_level: 0.95,
        },
        structure: Vec::new(),
        projections: Vec::new(),
        structure_prompts: Vec::new(),
        structure_labels: Vec::new(),
    }
}

#[test]
fn a_layer_transfers_only_above_every_control_by_the_margin() {
    let a = analysis([0.5, 0.39, 0.41, 0.6], 0.25, 0.3);
    let d = &a.decoding;
    // strongest control: the distance baseline, 0.3
    assert_eq!(strongest_control(d, &d.rows[0]), 0.3);
    assert!(transfers(d, &d.rows[0]));
    // 0.39 beats 0.3 by less than the margin; its interval reaches below it
    assert!(!transfers(d, &d.rows[1]));
    // 0.41: above by 0.11, but the interval's lower end (0.36) is above 0.3 too: transfers
    assert!(transfers(d, &d.rows[2]));
    // a shuffled-weights probe as strong as the codes removes the finding
    let mut b = analysis([0.5, 0.5, 0.5, 0.5], 0.25, 0.3);
    b.decoding.rows[0].shuffled_weights = Some(score(0.48, 0.05));
    assert!(!transfers(&b.decoding, &b.decoding.rows[0]));
}

#[test]
fn the_positive_control_needs_both_thresholds() {
    let pass = relations_pass(&analysis([0.5, 0.8, 0.6, 0.95], 0.2, 0.3));
    assert!(pass.passed, "{}", pass.sentence);
    assert_eq!(pass.best_layer, (1, 0.8));
    assert!(pass.sentence.contains("passes"));
    let weak_all = relations_pass(&analysis([0.5, 0.8, 0.6, 0.85], 0.2, 0.3));
    assert!(!weak_all.passed);
    assert!(weak_all.sentence.contains("FAILS"));
    let weak_layer = relations_pass(&analysis([0.5, 0.7, 0.6, 0.95], 0.2, 0.3));
    assert!(!weak_layer.passed);
}

fn icl_with(splits: Vec<std::result::Result<LmAnalysis, String>>) -> IclResult {
    IclResult {
        behaviour: analysis([0.0; 4], 0.0, 0.0).behaviour,
        accuracy: 0.4,
        splits: splits
            .into_iter()
            .enumerate()
            .map(|(j, ood)| IclSplit {
                seed: j as u64,
                held_out: Vec::new(),
                ood,
                seen: Err("not run".into()),
                unfiltered: Err("not run".into()),
            })
            .collect(),
        explorer: None,
    }
}

#[test]
fn the_finding_follows_the_splits() {
    let good = || analysis([0.3, 0.3, 0.7, 0.5], 0.25, 0.25);
    let flat = || analysis([0.3, 0.3, 0.3, 0.3], 0.25, 0.25);
    let v = icl_verdict(&icl_with(vec![Ok(good()), Ok(good()), Ok(good())]));
    assert_eq!(v.finding, Finding::Positive);
    assert_eq!(v.best_layer, Some(2));
    assert!(v.sentence.starts_with("Positive") && v.sentence.contains("L2"));
    let v = icl_verdict(&icl_with(vec![Ok(good()), Ok(flat()), Ok(flat())]));
    assert_eq!(v.finding, Finding::Partial);
    assert_eq!(v.layers[2].splits_transferring, 1);
    assert!((v.layers[2].mean_held_out - (0.7 + 0.3 + 0.3) / 3.0).abs() < 1e-12);
    let v = icl_verdict(&icl_with(vec![Ok(flat()), Ok(flat()), Ok(flat())]));
    assert_eq!(v.finding, Finding::Negative);
    // a split that could not be decoded keeps the finding from being positive
    let v = icl_verdict(&icl_with(vec![
        Ok(good()),
        Ok(good()),
        Err("one class".into()),
    ]));
    assert_eq!(v.finding, Finding::Partial);
    assert_eq!(v.n_decoded, 2);
    let v = icl_verdict(&icl_with(vec![Err("one class".into())]));
    assert_eq!(v.finding, Finding::NotTestable);
    assert!(v.sentence.contains("one class"));
}

#[test]
fn the_transplant_moves_the_answer_only_well_above_the_random_code() {
    let row = |kind: LmTransplantKind, to_donor: usize, elsewhere: usize| LmTransplantRow {
        layer: Some(3),
        kind,
        donor_label: None,
        n: 100,
        to_donor,
        elsewhere,
        unchanged: 100 - to_donor - elsewhere,
        excluded: 5,
        frac_to_donor: to_donor as f64 / 100.0,
        frac_changed: (to_donor + elsewhere) as f64 / 100.0,
        max_logit_change: 0.0,
    };
    let t = |donor: usize, random: usize| TransplantResult {
        layer: 3,
        n_targets: 10,
        n_donors: 20,
        transplant: LmTransplant {
            label_factor: "operation".into(),
            labels: vec!["copy".into(), "next".into()],
            n_donors: vec![10, 10],
            n_targets: 10,
            rows: vec![
                row(LmTransplantKind::MeanDonor, donor, 10),
                row(LmTransplantKind::Random, random, 0),
            ],
            by_donor: Vec::new(),
        },
    };
    assert!(transplant_sentence(&t(30, 5)).0);
    assert!(
        !transplant_sentence(&t(30, 11)).0,
        "under 3x the random code"
    );
    assert!(!transplant_sentence(&t(15, 0)).0, "under 20 % of pairs");
    assert_eq!(t(30, 5).rate(LmTransplantKind::MeanDonor), 0.3);
    assert_eq!(t(30, 5).rate(LmTransplantKind::SameLabel), 0.0);
}

#[test]
fn bad_settings_and_a_model_that_is_not_a_language_model_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = LmStudyParams::new(dir.path().join("m.gguf"), dir.path().join("out"));
    p.n_icl = 10;
    let err = run(&p, &mut |_| ControlFlow::Continue(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("n_icl"), "{err}");
    let not_a_model = dir.path().join("m.txt");
    std::fs::write(&not_a_model, "hello").unwrap();
    let p = LmStudyParams::new(&not_a_model, dir.path().join("out"));
    let err = run(&p, &mut |_| ControlFlow::Continue(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("m.txt"), "{err}");
    assert!(!dir.path().join("out").exists());
    // an --out that holds other files is refused before any work
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "keep me").unwrap();
    let p = LmStudyParams::new(&not_a_model, &other);
    let err = run(&p, &mut |_| ControlFlow::Continue(()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("summary.json"), "{err}");
    assert!(other.join("notes.txt").exists());
}

/// The study end to end on SmolLM2-135M, small: every file written, the positive control's
/// decoding above its controls, the transplant's counts adding up and its identity exact, and a
/// second run writing the same bytes (but `timings.json`); an interrupted third run leaves the
/// report whole.
#[test]
fn the_study_runs_on_smollm2_and_is_reproducible() {
    let Ok(path) = std::env::var("HYPERLENS_SMOLLM2_GGUF") else {
        println!("skipped: set HYPERLENS_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("study");
    let mut p = LmStudyParams::new(&path, &out);
    p.n_relations = 60;
    p.n_icl = 90;
    p.split_seeds = vec![0];
    p.n_bootstrap = 20;
    p.transplant_n = 8;
    let mut stages = Vec::new();
    let outcome = run(&p, &mut |s| {
        if stages.last() != Some(&s.stage.to_string()) {
            stages.push(s.stage.to_string());
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert!(
        stages.iter().any(|s| s.starts_with("relations")),
        "{stages:?}"
    );
    for f in [
        "index.md",
        "index.html",
        "summary.json",
        "timings.json",
        "tables/relations/decoding.csv",
        "figures/relations_decoding.png",
        "figures/relations_explorer.svg",
        "prompts/icl.jsonl",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    assert!(!out.join(".work").exists());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert!(summary["relations_all_layers"].as_f64().unwrap() > 0.5);
    assert_eq!(summary["verdict"].as_str().unwrap(), outcome.verdict);
    if let Some(t) = summary["transplant"].as_object() {
        for row in t["transplant"]["rows"].as_array().unwrap() {
            let n = row["n"].as_u64().unwrap();
            let sum: u64 = ["to_donor", "elsewhere", "unchanged"]
                .iter()
                .map(|k| row[k].as_u64().unwrap())
                .sum();
            assert_eq!(sum, n, "{row}");
        }
        let identity = t["transplant"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == "identity")
            .unwrap();
        assert_eq!(identity["max_logit_change"].as_f64(), Some(0.0));
    }
    let first: Vec<(String, Vec<u8>)> = files(&out);
    run(&p, &mut |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(files(&out), first, "a second run wrote other bytes");
    // an interrupted run leaves the report as it was
    let mut calls = 0;
    let err = run(&p, &mut |_| {
        calls += 1;
        if calls > 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    assert!(err.is_err());
    assert_eq!(files(&out), first);
}

/// Every file under `dir` but `timings.json`, with its bytes, sorted.
fn files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n != "timings.json") {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                v.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    v.sort();
    v
}
